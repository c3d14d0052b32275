//! The budget policy for Android's memory signals: what a trainer may use, given the app's ceiling,
//! the trainer's floor, the last `ComponentCallbacks2.onTrimMemory` level and the last
//! `ActivityManager.MemoryInfo`. A pure function ([`budget_for`]); the Java and Kotlin
//! `MemoryBudget` classes call it through JNI (`MemoryBudget.budgetFor`) and C callers through
//! `frugal_budget_for_memory`, so every host applies the same policy.
//!
//! # The policy
//!
//! 1. Start from the **ceiling**: the most the app lets the trainer use.
//! 2. **Headroom.** When `MemoryInfo` is known (`avail_mem > 0`), take at most
//!    [`FRUGAL_HEADROOM_SHARE`] (a half) of the memory available above the system's low-memory
//!    `threshold` (below it the system starts killing processes); `low_memory` means no headroom.
//! 3. **Trim level.** Divide by the level's divisor ([`trim_divisor`]): the *running* levels
//!    (the app in the foreground while the system runs short) `RUNNING_MODERATE` (5) ÷2,
//!    `RUNNING_LOW` (10) ÷4, `RUNNING_CRITICAL` (15) ÷8; `UI_HIDDEN` (20) ÷1 (training in the
//!    background is the point); the *cached* levels (the app in the background, on the kill list)
//!    `BACKGROUND` (40) ÷2, `MODERATE` (60) ÷4, and `COMPLETE` (80, next to be killed): the floor.
//!    A level between two named ones counts as the lower named one.
//! 4. **Clamp** to `[floor, ceiling]`: never below the trainer's smallest plan, so the budget is
//!    always one the trainer can run (training goes on in the smallest plan; an app that wants to
//!    stop at `COMPLETE` pauses its loop), never above what the app allowed.
//!    (When the ceiling is below the floor, the floor wins.)

/// `ComponentCallbacks2.TRIM_MEMORY_RUNNING_MODERATE`.
pub const FRUGAL_TRIM_RUNNING_MODERATE: i32 = 5;
/// `ComponentCallbacks2.TRIM_MEMORY_RUNNING_LOW`.
pub const FRUGAL_TRIM_RUNNING_LOW: i32 = 10;
/// `ComponentCallbacks2.TRIM_MEMORY_RUNNING_CRITICAL`.
pub const FRUGAL_TRIM_RUNNING_CRITICAL: i32 = 15;
/// `ComponentCallbacks2.TRIM_MEMORY_UI_HIDDEN`.
pub const FRUGAL_TRIM_UI_HIDDEN: i32 = 20;
/// `ComponentCallbacks2.TRIM_MEMORY_BACKGROUND`.
pub const FRUGAL_TRIM_BACKGROUND: i32 = 40;
/// `ComponentCallbacks2.TRIM_MEMORY_MODERATE`.
pub const FRUGAL_TRIM_MODERATE: i32 = 60;
/// `ComponentCallbacks2.TRIM_MEMORY_COMPLETE`.
pub const FRUGAL_TRIM_COMPLETE: i32 = 80;

/// The share of the headroom above the low-memory threshold a trainer may take: 1 / this.
pub const FRUGAL_HEADROOM_SHARE: u64 = 2;

/// What the system said about memory, for `frugal_budget_for_memory`. The budget is: the ceiling,
/// capped at half the memory available above the low-memory threshold (when `avail_mem` is known;
/// `low_memory`: nothing), divided by the trim level's divisor (RUNNING_MODERATE 2, RUNNING_LOW 4,
/// RUNNING_CRITICAL 8, UI_HIDDEN 1, BACKGROUND 2, MODERATE 4, COMPLETE: down to the floor; a level
/// between two named ones counts as the lower), clamped to `[floor, ceiling]` (the floor wins).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrugalMemorySignal {
    /// The most the app lets the trainer use, in bytes (`FRUGAL_BUDGET_UNLIMITED`: no limit of its own).
    pub ceiling: u64,
    /// The trainer's smallest plan (`FrugalPlanInfo.floor_bytes`).
    pub floor: u64,
    /// The last `onTrimMemory` level (0: none since the app last cleared it).
    pub trim_level: i32,
    /// 1 when `MemoryInfo.lowMemory`, else 0.
    pub low_memory: u32,
    /// `MemoryInfo.availMem` (0: unknown; the headroom cap is skipped).
    pub avail_mem: u64,
    /// `MemoryInfo.threshold`.
    pub threshold: u64,
}

/// The divisor of trim level `level` (0: the budget drops to the floor).
pub fn trim_divisor(level: i32) -> u64 {
    match level {
        l if l >= FRUGAL_TRIM_COMPLETE => 0,
        l if l >= FRUGAL_TRIM_MODERATE => 4,
        l if l >= FRUGAL_TRIM_BACKGROUND => 2,
        l if l >= FRUGAL_TRIM_UI_HIDDEN => 1,
        l if l >= FRUGAL_TRIM_RUNNING_CRITICAL => 8,
        l if l >= FRUGAL_TRIM_RUNNING_LOW => 4,
        l if l >= FRUGAL_TRIM_RUNNING_MODERATE => 2,
        _ => 1,
    }
}

/// The budget for `s` under the policy of the module docs.
pub fn budget_for(s: &FrugalMemorySignal) -> u64 {
    let mut b = s.ceiling;
    if s.avail_mem > 0 {
        let headroom = if s.low_memory != 0 {
            0
        } else {
            s.avail_mem.saturating_sub(s.threshold)
        };
        b = b.min(headroom / FRUGAL_HEADROOM_SHARE);
    }
    b = match trim_divisor(s.trim_level) {
        0 => 0,
        d => b / d,
    };
    b.min(s.ceiling).max(s.floor)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn sig(level: i32) -> FrugalMemorySignal {
        FrugalMemorySignal {
            ceiling: 64 * MIB,
            floor: 2 * MIB,
            trim_level: level,
            ..Default::default()
        }
    }

    #[test]
    fn without_signals_the_budget_is_the_ceiling() {
        assert_eq!(budget_for(&sig(0)), 64 * MIB);
        assert_eq!(budget_for(&sig(FRUGAL_TRIM_UI_HIDDEN)), 64 * MIB);
    }

    #[test]
    fn each_trim_level_divides_the_budget_as_documented() {
        let want = [
            (FRUGAL_TRIM_RUNNING_MODERATE, 32 * MIB),
            (FRUGAL_TRIM_RUNNING_LOW, 16 * MIB),
            (FRUGAL_TRIM_RUNNING_CRITICAL, 8 * MIB),
            (FRUGAL_TRIM_UI_HIDDEN, 64 * MIB),
            (FRUGAL_TRIM_BACKGROUND, 32 * MIB),
            (FRUGAL_TRIM_MODERATE, 16 * MIB),
            (FRUGAL_TRIM_COMPLETE, 2 * MIB),
            // Between named levels: the lower named one.
            (12, 16 * MIB),
            (70, 16 * MIB),
            (100, 2 * MIB),
            (-3, 64 * MIB),
        ];
        for (level, b) in want {
            assert_eq!(budget_for(&sig(level)), b, "level {level}");
        }
    }

    #[test]
    fn more_pressure_never_raises_the_budget_within_a_class() {
        for class in [
            [
                FRUGAL_TRIM_RUNNING_MODERATE,
                FRUGAL_TRIM_RUNNING_LOW,
                FRUGAL_TRIM_RUNNING_CRITICAL,
            ],
            [
                FRUGAL_TRIM_BACKGROUND,
                FRUGAL_TRIM_MODERATE,
                FRUGAL_TRIM_COMPLETE,
            ],
        ] {
            let b: Vec<u64> = class.iter().map(|&l| budget_for(&sig(l))).collect();
            assert!(b.windows(2).all(|w| w[0] > w[1]), "{class:?}: {b:?}");
        }
    }

    #[test]
    fn memory_info_caps_the_budget_at_half_the_headroom() {
        let mut s = sig(0);
        s.avail_mem = 300 * MIB;
        s.threshold = 200 * MIB;
        assert_eq!(budget_for(&s), 50 * MIB);
        s.trim_level = FRUGAL_TRIM_RUNNING_LOW;
        assert_eq!(budget_for(&s), 50 * MIB / 4);
        // Plenty of headroom: the ceiling still bounds it.
        s.trim_level = 0;
        s.avail_mem = 8 << 30;
        assert_eq!(budget_for(&s), 64 * MIB);
        // Below the threshold, or lowMemory: the floor.
        s.avail_mem = 100 * MIB;
        assert_eq!(budget_for(&s), 2 * MIB);
        s.avail_mem = 8 << 30;
        s.low_memory = 1;
        assert_eq!(budget_for(&s), 2 * MIB);
    }

    #[test]
    fn the_budget_stays_within_floor_and_ceiling() {
        for level in [0, 5, 10, 15, 20, 40, 60, 80] {
            for avail in [0, MIB, 100 * MIB, 1 << 40] {
                for ceiling in [MIB, 3 * MIB, 64 * MIB, u64::MAX] {
                    let s = FrugalMemorySignal {
                        ceiling,
                        floor: 2 * MIB,
                        trim_level: level,
                        low_memory: 0,
                        avail_mem: avail,
                        threshold: 50 * MIB,
                    };
                    let b = budget_for(&s);
                    assert!(b >= 2 * MIB, "{s:?} → {b}");
                    assert!(b <= ceiling.max(2 * MIB), "{s:?} → {b}");
                }
            }
        }
    }

    #[test]
    fn an_unlimited_ceiling_follows_the_headroom() {
        let s = FrugalMemorySignal {
            ceiling: u64::MAX,
            floor: MIB,
            trim_level: FRUGAL_TRIM_BACKGROUND,
            low_memory: 0,
            avail_mem: 1000 * MIB,
            threshold: 200 * MIB,
        };
        assert_eq!(budget_for(&s), 200 * MIB);
    }
}
