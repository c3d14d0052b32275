package ai.frugal;

/**
 * A frugal trainer: a model trained on the device inside a memory budget (libfrugal, the JNI
 * binding of hosts/android). The same surface as the browser's {@code Trainer} and frugal.h.
 *
 * <p>{@link #trainSteps} may run on a background thread; {@link #setBudget} (from any thread, e.g. a
 * {@code ComponentCallbacks2.onTrimMemory} callback through {@link MemoryBudget}) then takes effect
 * in the step in flight: the step switches to a smaller plan before its next instruction and the
 * memory above it is given back when that step ends. {@link #planInfo} and {@link #setBudget} never
 * wait; any other call while another thread is inside the trainer throws {@link FrugalException}
 * with code {@link FrugalException#BUSY}. After {@link #close} every call throws code
 * {@link FrugalException#HANDLE}.
 */
public final class Trainer implements AutoCloseable {
    static {
        System.loadLibrary("frugal");
    }

    /** The budget meaning "no limit". */
    public static final long UNLIMITED = -1L;

    /** How to create a trainer. */
    public static final class Options {
        /** Samples per training step, 1 to 4096. */
        public int batch = 32;
        /** Resize the model's last (linear) layer to this many classes; 0 keeps the model's. */
        public int classes = 0;
        /** The initialisation seed; null: the model's. */
        public Long seed = null;
    }

    /** The plan the trainer runs now. Sizes in bytes. */
    public static final class PlanInfo {
        public final long arenaBytes, allocatedBytes, lowerBound, floorBytes, budget, switches,
                midStepSwitches;
        public final int microBatch, microBatches, recomputes, rung, rungs, steps;

        PlanInfo(long[] v) {
            arenaBytes = v[0];
            allocatedBytes = v[1];
            lowerBound = v[2];
            floorBytes = v[3];
            budget = v[4];
            switches = v[5];
            midStepSwitches = v[6];
            microBatch = (int) v[7];
            microBatches = (int) v[8];
            recomputes = (int) v[9];
            rung = (int) v[10];
            rungs = (int) v[11];
            steps = (int) v[12];
        }
    }

    private final long handle;

    private Trainer(long handle) {
        this.handle = handle;
    }

    /**
     * A trainer for the binary model {@code model} (a .frgm file's bytes) within {@code budget} bytes
     * ({@link #UNLIMITED}: none), loading the safetensors {@code weights} (null: none) by name.
     */
    public static Trainer create(byte[] model, byte[] weights, long budget, Options options) {
        Options o = options == null ? new Options() : options;
        long seed = o.seed == null ? 0 : o.seed;
        return new Trainer(nativeCreate(model, weights, budget, o.batch, o.classes, seed, o.seed != null));
    }

    /** Adds one sample: the model's input size of finite values, and a class label. */
    public void addSample(float[] x, int label) {
        nativeAddSample(handle, x, label);
    }

    /** Runs {@code steps} training steps; returns their mean losses. */
    public float[] trainSteps(int steps) {
        return nativeTrainSteps(handle, steps);
    }

    /** Class probabilities for samples laid end to end (samples × classes values). */
    public float[] predict(float[] x) {
        return nativePredict(handle, x);
    }

    /** Sets the budget in bytes ({@link #UNLIMITED}: none); below the smallest plan it throws BUDGET. */
    public void setBudget(long bytes) {
        nativeSetBudget(handle, bytes);
    }

    /** The plan in force (a snapshot refreshed after every step). */
    public PlanInfo planInfo() {
        return new PlanInfo(nativePlanInfo(handle));
    }

    /** The weights as F32 safetensors bytes (PyTorch state_dict names). */
    public byte[] exportWeights() {
        return nativeExportWeights(handle);
    }

    /** Frees the trainer (a call running on another thread finishes first). */
    @Override
    public void close() {
        nativeDestroy(handle);
    }

    /** Trainers alive in this process. */
    public static int liveTrainers() {
        return nativeLiveTrainers();
    }

    private static native long nativeCreate(byte[] model, byte[] weights, long budget, int batch,
            int classes, long seed, boolean hasSeed);
    private static native void nativeAddSample(long handle, float[] x, int label);
    private static native float[] nativeTrainSteps(long handle, int steps);
    private static native float[] nativePredict(long handle, float[] x);
    private static native void nativeSetBudget(long handle, long budget);
    private static native long[] nativePlanInfo(long handle);
    private static native byte[] nativeExportWeights(long handle);
    private static native void nativeDestroy(long handle);
    private static native int nativeLiveTrainers();
}
