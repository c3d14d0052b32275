// Kotlin MemoryBudget: the trainer's budget follows onTrimMemory and ActivityManager.MemoryInfo.
// NOT compiled in CI (no kotlinc here; Debian has no package for it): the Java MemoryBudget is the
// tested one. The policy itself is one Rust function (frugal_android::memory::budget_for), called
// through JNI by both.
package ai.frugal

import android.app.ActivityManager
import android.content.ComponentCallbacks2
import android.content.Context
import android.content.res.Configuration

/**
 * Registers itself for the app's trim-memory callbacks and sets [trainer]'s budget from them and from
 * [refresh]'s MemoryInfo readings, never above [ceiling] bytes nor below the trainer's smallest plan.
 * Policy: the ceiling, capped at half the memory available above the low-memory threshold, divided
 * by the trim level's divisor (RUNNING_MODERATE 2, RUNNING_LOW 4, RUNNING_CRITICAL 8, UI_HIDDEN 1,
 * BACKGROUND 2, MODERATE 4, COMPLETE: the floor), clamped to [floor, ceiling].
 */
class MemoryBudget(private val trainer: Trainer, private val ceiling: Long) : ComponentCallbacks2 {
    private var level = 0
    private var availMem = 0L
    private var threshold = 0L
    private var lowMemory = false

    /** Starts following [context]'s signals. */
    fun register(context: Context) {
        context.registerComponentCallbacks(this)
        refresh(context)
    }

    /** Reads ActivityManager.MemoryInfo (e.g. in onResume) and applies the budget. */
    @Synchronized fun refresh(context: Context): Long {
        val am = context.getSystemService(Context.ACTIVITY_SERVICE) as ActivityManager
        val mi = ActivityManager.MemoryInfo()
        am.getMemoryInfo(mi)
        availMem = mi.availMem
        threshold = mi.threshold
        lowMemory = mi.lowMemory
        return apply()
    }

    /** The memory pressure is over. */
    @Synchronized fun clearTrim(): Long { level = 0; return apply() }

    @Synchronized override fun onTrimMemory(level: Int) { this.level = level; apply() }
    @Synchronized override fun onLowMemory() { level = ComponentCallbacks2.TRIM_MEMORY_COMPLETE; apply() }
    override fun onConfigurationChanged(newConfig: Configuration) {}

    private fun apply(): Long {
        val b = budgetFor(ceiling, trainer.planInfo().floorBytes, level, availMem, threshold, lowMemory)
        trainer.setBudget(b)
        return b
    }

    companion object {
        init { System.loadLibrary("frugal") }

        /** The policy as a pure function (-1: unlimited). */
        fun budgetFor(ceiling: Long, floor: Long, trimLevel: Int, availMem: Long, threshold: Long,
                      lowMemory: Boolean): Long =
            nativeBudgetFor(ceiling, floor, trimLevel, availMem, threshold, lowMemory)

        @JvmStatic private external fun nativeBudgetFor(ceiling: Long, floor: Long, trimLevel: Int,
            availMem: Long, threshold: Long, lowMemory: Boolean): Long
    }
}
