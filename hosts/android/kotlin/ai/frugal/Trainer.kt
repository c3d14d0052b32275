// Kotlin wrapper over libfrugal's JNI binding (the same native methods as java/ai/frugal/Trainer.java).
// NOT compiled in CI: there is no kotlinc on these machines and Debian has no package for it; the Java
// wrapper is the tested one (cargo xtask android). Same surface and semantics.
package ai.frugal

/** A frugal trainer: a model trained on the device inside a memory budget. See Trainer.java. */
class Trainer private constructor(private val handle: Long) : AutoCloseable {
    /** How to create a trainer. */
    data class Options(val batch: Int = 32, val classes: Int = 0, val seed: Long? = null)

    /** The plan the trainer runs now. Sizes in bytes; budget -1 is unlimited. */
    data class PlanInfo(
        val arenaBytes: Long, val allocatedBytes: Long, val lowerBound: Long, val floorBytes: Long,
        val budget: Long, val switches: Long, val midStepSwitches: Long, val microBatch: Int,
        val microBatches: Int, val recomputes: Int, val rung: Int, val rungs: Int, val steps: Int,
    )

    fun addSample(x: FloatArray, label: Int) = nativeAddSample(handle, x, label)
    /** Runs [steps] steps (on any thread); [setBudget] from another thread takes effect mid-step. */
    fun trainSteps(steps: Int): FloatArray = nativeTrainSteps(handle, steps)
    fun predict(x: FloatArray): FloatArray = nativePredict(handle, x)
    fun setBudget(bytes: Long) = nativeSetBudget(handle, bytes)
    fun planInfo(): PlanInfo = nativePlanInfo(handle).let {
        PlanInfo(it[0], it[1], it[2], it[3], it[4], it[5], it[6], it[7].toInt(), it[8].toInt(),
            it[9].toInt(), it[10].toInt(), it[11].toInt(), it[12].toInt())
    }
    fun exportWeights(): ByteArray = nativeExportWeights(handle)
    override fun close() = nativeDestroy(handle)

    companion object {
        init { System.loadLibrary("frugal") }

        /** The budget meaning "no limit". */
        const val UNLIMITED = -1L

        fun create(model: ByteArray, weights: ByteArray?, budget: Long, options: Options = Options()) =
            Trainer(nativeCreate(model, weights, budget, options.batch, options.classes,
                options.seed ?: 0, options.seed != null))

        fun liveTrainers(): Int = nativeLiveTrainers()

        // The JNI symbols are Java_ai_frugal_Trainer_*: static natives of class ai.frugal.Trainer.
        @JvmStatic private external fun nativeCreate(model: ByteArray, weights: ByteArray?, budget: Long,
            batch: Int, classes: Int, seed: Long, hasSeed: Boolean): Long
        @JvmStatic private external fun nativeAddSample(handle: Long, x: FloatArray, label: Int)
        @JvmStatic private external fun nativeTrainSteps(handle: Long, steps: Int): FloatArray
        @JvmStatic private external fun nativePredict(handle: Long, x: FloatArray): FloatArray
        @JvmStatic private external fun nativeSetBudget(handle: Long, budget: Long)
        @JvmStatic private external fun nativePlanInfo(handle: Long): LongArray
        @JvmStatic private external fun nativeExportWeights(handle: Long): ByteArray
        @JvmStatic private external fun nativeDestroy(handle: Long)
        @JvmStatic private external fun nativeLiveTrainers(): Int
    }
}
