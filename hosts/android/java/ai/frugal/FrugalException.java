package ai.frugal;

/**
 * A failed frugal call: {@link #code} is the C ABI's {@code FrugalStatus} (frugal.h), the message says
 * what is wrong. Thrown by the native methods; a rejected call leaves the trainer as it was.
 */
public final class FrugalException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    public static final int NULL_POINTER = 1, ARGUMENT = 2, MODEL = 3, WEIGHTS = 4, BUDGET = 5,
            OUT_OF_MEMORY = 6, STEP = 7, HANDLE = 8, BUSY = 9, BUFFER_TOO_SMALL = 10, PANIC = 11;

    /** The status code (see the constants). */
    public final int code;
    /** For {@link #BUDGET}: the smallest budget in bytes that works; else 0. */
    public final long neededBytes;

    public FrugalException(int code, String message, long neededBytes) {
        super(message);
        this.code = code;
        this.neededBytes = neededBytes;
    }
}
