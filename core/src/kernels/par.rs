//! Handing disjoint pieces of one mutable slice to the tasks of a [`WorkerPool`] run.
//!
//! A pool runs `task(i)` for every `i` through one shared `Fn(usize) + Sync` closure, so a task cannot be
//! given its own `&mut` piece by moving it in. [`Shards`] holds the slice and a fixed partition of it
//! (checked to be monotone when built); task `i` takes piece `i` once. A second take of the same piece
//! panics (a pool that ran a task twice would otherwise alias it), so safety does not rest on the pool
//! keeping its contract.
use core::marker::PhantomData;
use core::ops::Range;
use core::sync::atomic::{AtomicBool, Ordering};

use crate::pool::WorkerPool;

/// Most pieces one [`Shards`] splits a slice into (and so most tasks a kernel hands a pool at once).
pub const MAX_TASKS: usize = 64;

/// A mutable slice split at fixed, increasing boundaries into at most [`MAX_TASKS`] pieces, each of
/// which can be taken once, from any thread.
pub struct Shards<'a, T> {
    ptr: *mut T,
    /// Piece `i` is `bounds[i]..bounds[i + 1]`.
    bounds: [usize; MAX_TASKS + 1],
    parts: usize,
    taken: [AtomicBool; MAX_TASKS],
    _slice: PhantomData<&'a mut [T]>,
}

// SAFETY: a `Shards` hands out disjoint `&mut [T]` pieces (each at most once, enforced by `taken`), so
// sharing it between threads is sharing `&mut [T]`s of distinct elements: sound when `T: Send`.
unsafe impl<T: Send> Sync for Shards<'_, T> {}
// SAFETY: as above; it owns the exclusive borrow of the slice.
unsafe impl<T: Send> Send for Shards<'_, T> {}

impl<'a, T> Shards<'a, T> {
    /// Splits `slice` into `parts ≤ MAX_TASKS` pieces, piece `i` being `range(i)`.
    ///
    /// # Panics
    /// When `parts` is 0 or above [`MAX_TASKS`], or the ranges are not contiguous, increasing and inside
    /// `slice` (an empty range is allowed anywhere its start equals the previous end).
    pub fn new(slice: &'a mut [T], parts: usize, range: impl Fn(usize) -> Range<usize>) -> Self {
        assert!(
            (1..=MAX_TASKS).contains(&parts),
            "Shards: bad part count {parts}"
        );
        let mut bounds = [0usize; MAX_TASKS + 1];
        let first = range(0);
        bounds[0] = first.start;
        for i in 0..parts {
            let r = range(i);
            assert!(
                r.start == bounds[i] && r.start <= r.end && r.end <= slice.len(),
                "Shards: ranges must be contiguous and inside the slice"
            );
            bounds[i + 1] = r.end;
        }
        Self {
            ptr: slice.as_mut_ptr(),
            bounds,
            parts,
            taken: core::array::from_fn(|_| AtomicBool::new(false)),
            _slice: PhantomData,
        }
    }

    /// Takes piece `i` (its range is [`Shards::range`]).
    ///
    /// # Panics
    /// When `i ≥` the part count, or piece `i` was taken before.
    #[allow(clippy::mut_from_ref)]
    pub fn take(&self, i: usize) -> &'a mut [T] {
        assert!(i < self.parts, "Shards: no piece {i}");
        assert!(!take_flag(&self.taken[i]), "Shards: piece {i} taken twice");
        let r = self.range(i);
        // SAFETY: `bounds` is increasing and inside the slice (checked in `new`), so pieces are disjoint
        // sub-slices of the exclusively borrowed slice (alive for 'a); `taken` makes each piece handed out
        // at most once, so no two live `&mut` overlap.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.add(r.start), r.end - r.start) }
    }

    /// The range of piece `i` in the original slice.
    pub fn range(&self, i: usize) -> Range<usize> {
        self.bounds[i]..self.bounds[i + 1]
    }
}

/// Sets `flag`, returning its old value: atomically where the target has compare-and-swap.
#[cfg(target_has_atomic = "8")]
fn take_flag(flag: &AtomicBool) -> bool {
    flag.swap(true, Ordering::AcqRel)
}

/// Sets `flag`, returning its old value. Targets without compare-and-swap (Cortex-M0) never split work
/// into more than one piece ([`tasks_for`]), so the one piece is only ever taken by one task; a pool
/// running it twice in a row still panics here.
#[cfg(not(target_has_atomic = "8"))]
fn take_flag(flag: &AtomicBool) -> bool {
    let was = flag.load(Ordering::Acquire);
    flag.store(true, Ordering::Release);
    was
}

/// Whether this target can run tasks on several threads at once: not without compare-and-swap
/// (Cortex-M0), and not on wasm32 without the `atomics` feature (no shared memory, so no threads; the
/// constant lets the compiler drop the split paths from the browser's `.wasm`).
pub(crate) const SPLITS: bool = cfg!(target_has_atomic = "8")
    && !cfg!(all(target_family = "wasm", not(target_feature = "atomics")));

/// Tasks to split `work` units into on `pool`: one per `min_per_task` units, at most the pool's
/// threads and [`MAX_TASKS`], at least 1 (always 1 where the target cannot run threads).
pub fn tasks_for(pool: &dyn WorkerPool, work: usize, min_per_task: usize) -> usize {
    if !SPLITS {
        return 1;
    }
    pool.threads()
        .min(MAX_TASKS)
        .min(work / min_per_task.max(1))
        .max(1)
}

/// Pools for tests: real threads (scoped, spawned per run) pulling tasks in a racy order.
#[cfg(test)]
pub(crate) mod testing {
    use crate::pool::WorkerPool;
    use core::sync::atomic::{AtomicUsize, Ordering};

    /// `0` threads in all (the caller included), each run spawning `0 - 1` scoped threads that take task
    /// indices from a shared counter, from the last task down (so the order differs from one thread's).
    /// On wasm (no threads) the calling thread runs every task, from the last down.
    pub struct Scoped(pub usize);

    impl WorkerPool for Scoped {
        fn threads(&self) -> usize {
            self.0
        }
        fn run(&self, tasks: usize, task: &(dyn Fn(usize) + Sync)) {
            let next = AtomicUsize::new(0);
            let work = || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= tasks {
                    break;
                }
                task(tasks - 1 - i);
            };
            // wasm32-wasip1 under Node has no threads: there the tasks run on the calling thread (still
            // from the last down), so the split and its bit-exactness are checked, not the concurrency.
            #[cfg(target_family = "wasm")]
            work();
            #[cfg(not(target_family = "wasm"))]
            std::thread::scope(|s| {
                for _ in 1..self.0 {
                    s.spawn(work);
                }
                work();
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_are_the_ranges_and_taken_once() {
        let mut v: [u32; 10] = core::array::from_fn(|i| i as u32);
        let s = Shards::new(&mut v, 3, |i| [0..3, 3..3, 3..10][i].clone());
        assert_eq!(s.take(2), &[3, 4, 5, 6, 7, 8, 9]);
        assert!(s.take(1).is_empty());
        let p = s.take(0);
        p[0] = 7;
        assert!(std::panic::catch_unwind(core::panic::AssertUnwindSafe(|| s.take(0))).is_err());
        assert_eq!(v[0], 7);
    }

    #[test]
    #[should_panic(expected = "contiguous")]
    fn overlapping_ranges_are_refused() {
        let mut v = [0u8; 4];
        let _ = Shards::new(&mut v, 2, |i| [0..3, 2..4][i].clone());
    }
}
