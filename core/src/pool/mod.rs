//! Worker pools: how a host lends the CPU backend more than one core.
//!
//! The core never spawns a thread. A host that has threads implements [`WorkerPool`] (a `std` host can use
//! [`ThreadPool`](crate::pool::ThreadPool) under the `std` feature); `no_std` targets use [`SingleThread`].
//! A kernel splits its work into `tasks` independent pieces — disjoint output ranges, never a split of a
//! reduction — so the result is bit-identical for any number of workers, and hands the pool one borrowed
//! closure: nothing is allocated per call.

/// A set of workers that runs `task(0) … task(tasks - 1)`, each exactly once, and returns when all are
/// done. Tasks may run in any order and on any worker; they must not depend on each other.
pub trait WorkerPool: Sync {
    /// Workers that can run at once (1 = the calling thread only).
    fn threads(&self) -> usize;
    /// Runs every task; the calling thread takes part. Must not allocate.
    fn run(&self, tasks: usize, task: &(dyn Fn(usize) + Sync));
}

/// The calling thread only: every task in order.
#[derive(Clone, Copy, Debug, Default)]
pub struct SingleThread;

impl WorkerPool for SingleThread {
    fn threads(&self) -> usize {
        1
    }
    fn run(&self, tasks: usize, task: &(dyn Fn(usize) + Sync)) {
        for i in 0..tasks {
            task(i);
        }
    }
}

impl<P: WorkerPool + ?Sized> WorkerPool for &P {
    fn threads(&self) -> usize {
        (**self).threads()
    }
    fn run(&self, tasks: usize, task: &(dyn Fn(usize) + Sync)) {
        (**self).run(tasks, task)
    }
}

/// Splits `0..len` into at most `parts` contiguous ranges whose starts are multiples of `align` (the last
/// range takes the rest); range `i` of the split. Used by kernels to divide output rows or columns.
pub fn chunk(len: usize, parts: usize, align: usize, i: usize) -> core::ops::Range<usize> {
    let align = align.max(1);
    let parts = parts.max(1);
    let blocks = len.div_ceil(align);
    let per = blocks.div_ceil(parts);
    let start = (i * per * align).min(len);
    let end = ((i + 1) * per * align).min(len);
    start..end
}

#[cfg(any(test, feature = "std"))]
mod threads;
#[cfg(any(test, feature = "std"))]
pub use threads::ThreadPool;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_range_once_with_aligned_starts() {
        for len in [0usize, 1, 7, 8, 63, 64, 1000] {
            for parts in 1..6 {
                for align in [1usize, 4, 16] {
                    let mut next = 0;
                    for i in 0..parts {
                        let r = chunk(len, parts, align, i);
                        if r.is_empty() {
                            next = next.max(r.end);
                            continue;
                        }
                        assert_eq!(r.start, next, "ranges are contiguous");
                        assert!(r.start.is_multiple_of(align) || r.start == len);
                        next = r.end.max(next);
                    }
                    assert_eq!(next, len);
                }
            }
        }
    }

    #[test]
    fn single_thread_runs_every_task_once_in_order() {
        let order = core::sync::atomic::AtomicUsize::new(0);
        let counts: [core::sync::atomic::AtomicUsize; 5] = Default::default();
        SingleThread.run(5, &|i| {
            assert_eq!(order.fetch_add(1, core::sync::atomic::Ordering::Relaxed), i);
            counts[i].fetch_add(1, core::sync::atomic::Ordering::Relaxed);
        });
        for c in &counts {
            assert_eq!(c.load(core::sync::atomic::Ordering::Relaxed), 1);
        }
    }
}
