package ai.frugal;

/**
 * Makes a trainer's budget follow Android's memory signals. Forward the system's callbacks to it:
 *
 * <pre>{@code
 * MemoryBudget mb = new MemoryBudget(trainer, 64L << 20);       // the most the app allows
 * context.registerComponentCallbacks(new ComponentCallbacks2() {
 *     public void onTrimMemory(int level) { mb.onTrimMemory(level); }
 *     public void onLowMemory() { mb.onTrimMemory(TRIM_MEMORY_COMPLETE); }
 *     public void onConfigurationChanged(Configuration c) {}
 * });
 * ActivityManager.MemoryInfo mi = new ActivityManager.MemoryInfo();
 * activityManager.getMemoryInfo(mi);                              // e.g. in onResume
 * mb.onMemoryInfo(mi.availMem, mi.threshold, mi.lowMemory);
 * mb.clearTrim();                                                 // when the pressure is over
 * }</pre>
 *
 * <p>The policy (one implementation, in Rust: {@code frugal_android::memory::budget_for}): start
 * from the ceiling; cap at half the memory available above the low-memory threshold (nothing when
 * lowMemory); divide by the trim level's divisor (RUNNING_MODERATE 2, RUNNING_LOW 4,
 * RUNNING_CRITICAL 8, UI_HIDDEN 1, BACKGROUND 2, MODERATE 4, COMPLETE: the floor); clamp to
 * [the trainer's smallest plan, the ceiling]. Training goes on in the smallest plan at worst; an app
 * that must stop at COMPLETE pauses its loop.
 *
 * <p>This class uses no android.* type, so it runs (and is tested) on any JVM.
 */
public final class MemoryBudget {
    static {
        System.loadLibrary("frugal");
    }

    /** {@code ComponentCallbacks2} trim levels. */
    public static final int TRIM_MEMORY_RUNNING_MODERATE = 5, TRIM_MEMORY_RUNNING_LOW = 10,
            TRIM_MEMORY_RUNNING_CRITICAL = 15, TRIM_MEMORY_UI_HIDDEN = 20,
            TRIM_MEMORY_BACKGROUND = 40, TRIM_MEMORY_MODERATE = 60, TRIM_MEMORY_COMPLETE = 80;

    private final Trainer trainer;
    private final long ceiling;
    private int level;
    private long availMem, threshold;
    private boolean lowMemory;

    /** Follows the signals for {@code trainer}, never above {@code ceiling} bytes. */
    public MemoryBudget(Trainer trainer, long ceiling) {
        this.trainer = trainer;
        this.ceiling = ceiling;
    }

    /** A {@code ComponentCallbacks2.onTrimMemory} level: applies the budget; returns it. */
    public synchronized long onTrimMemory(int level) {
        this.level = level;
        return apply();
    }

    /** An {@code ActivityManager.MemoryInfo} reading: applies the budget; returns it. */
    public synchronized long onMemoryInfo(long availMem, long threshold, boolean lowMemory) {
        this.availMem = availMem;
        this.threshold = threshold;
        this.lowMemory = lowMemory;
        return apply();
    }

    /** The memory pressure is over (no trim level): applies the budget; returns it. */
    public synchronized long clearTrim() {
        level = 0;
        return apply();
    }

    private long apply() {
        long b = budgetFor(ceiling, trainer.planInfo().floorBytes, level, availMem, threshold, lowMemory);
        trainer.setBudget(b);
        return b;
    }

    /** The policy as a pure function ({@code -1}: unlimited). */
    public static long budgetFor(long ceiling, long floor, int trimLevel, long availMem,
            long threshold, boolean lowMemory) {
        return nativeBudgetFor(ceiling, floor, trimLevel, availMem, threshold, lowMemory);
    }

    private static native long nativeBudgetFor(long ceiling, long floor, int trimLevel,
            long availMem, long threshold, boolean lowMemory);
}
