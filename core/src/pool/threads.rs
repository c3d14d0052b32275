//! A fork-join pool of OS threads for `std` hosts: spawned once, then every [`WorkerPool::run`] wakes
//! them with atomics (and `unpark` for a worker that went to sleep) — no allocation, no channel, no lock
//! per call. Between calls a worker spins briefly (a training step issues its kernels back to back), then
//! parks.
extern crate std;

use super::WorkerPool;
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::{JoinHandle, Thread};
use std::vec::Vec;

/// How long an idle worker polls for the next job before it parks (iterations of `spin_loop`).
const SPIN: usize = if cfg!(miri) { 8 } else { 1 << 14 };

type Task = *const (dyn Fn(usize) + Sync);
const NOOP: &(dyn Fn(usize) + Sync) = &|_| {};

struct Shared {
    /// Bumped (by the caller) to publish a job; workers run a job once per epoch.
    epoch: AtomicUsize,
    /// The job: written by the caller only while no worker is inside one (see `run`).
    job: UnsafeCell<(Task, usize)>,
    /// Next task index to hand out.
    next: AtomicUsize,
    /// Workers that have not yet finished the current epoch.
    pending: AtomicUsize,
    /// Workers asleep (or about to be), one flag each.
    sleeping: Vec<AtomicBool>,
    /// A task panicked on a worker (re-raised on the caller).
    panicked: AtomicBool,
    stop: AtomicBool,
    /// Workers that have started running their loop (`new` waits for all of them).
    ready: AtomicUsize,
}

// SAFETY: `job` is written only by the thread inside `run` while `pending == 0` (no worker reads it) and
// read by workers only between observing a new epoch and decrementing `pending`; every other field is
// atomic or immutable after construction.
unsafe impl Sync for Shared {}
// SAFETY: the raw task pointer is only dereferenced under the protocol above, while the borrowed closure
// is alive (the caller of `run` waits for every worker).
unsafe impl Send for Shared {}

/// `threads - 1` OS threads plus the calling thread. Results never depend on the thread count: kernels
/// split output ranges, not reductions ([`super::chunk`]).
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<(Thread, JoinHandle<()>)>,
    /// Serialises concurrent callers (a pool is shared by reference; one job at a time).
    busy: AtomicBool,
}

impl ThreadPool {
    /// A pool of `threads` workers in all (the caller counts as one; `threads ≤ 1` spawns none).
    ///
    /// # Errors
    /// When the OS refuses to spawn a thread.
    pub fn new(threads: usize) -> std::io::Result<Self> {
        let extra = threads.max(1) - 1;
        let shared = Arc::new(Shared {
            epoch: AtomicUsize::new(0),
            job: UnsafeCell::new((NOOP as Task, 0)),
            next: AtomicUsize::new(0),
            pending: AtomicUsize::new(0),
            sleeping: (0..extra).map(|_| AtomicBool::new(false)).collect(),
            panicked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            ready: AtomicUsize::new(0),
        });
        let mut workers = Vec::with_capacity(extra);
        for w in 0..extra {
            let s = Arc::clone(&shared);
            let h = std::thread::Builder::new()
                .name(std::format!("frugal-worker-{}", w + 1))
                .spawn(move || worker(&s, w));
            match h {
                Ok(h) => workers.push((h.thread().clone(), h)),
                Err(e) => {
                    // Stop the ones already started (Drop joins them).
                    drop(Self {
                        shared,
                        workers,
                        busy: AtomicBool::new(false),
                    });
                    return Err(e);
                }
            }
        }
        // The pool is ready when `new` returns: whatever a thread's start-up does (the runtime's own
        // allocations included) is over before the first step, so no step ever pays for it or sees it
        // (the no-allocation tests count every thread's allocations).
        while shared.ready.load(Ordering::Acquire) < extra {
            std::thread::yield_now();
        }
        Ok(Self {
            shared,
            workers,
            busy: AtomicBool::new(false),
        })
    }

    /// The cores this process may use (`available_parallelism`, 1 when unknown).
    pub fn available() -> usize {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
}

fn worker(s: &Shared, me: usize) {
    s.ready.fetch_add(1, Ordering::Release);
    let mut seen = 0usize;
    loop {
        // Wait for a new epoch: spin, then park.
        let mut spins = 0;
        let epoch = loop {
            let e = s.epoch.load(Ordering::Acquire);
            if e != seen {
                break e;
            }
            if s.stop.load(Ordering::Acquire) {
                return;
            }
            if spins < SPIN {
                spins += 1;
                core::hint::spin_loop();
            } else {
                s.sleeping[me].store(true, Ordering::SeqCst);
                if s.epoch.load(Ordering::SeqCst) == seen && !s.stop.load(Ordering::SeqCst) {
                    std::thread::park();
                }
                s.sleeping[me].store(false, Ordering::SeqCst);
            }
        };
        seen = epoch;
        if s.stop.load(Ordering::Acquire) {
            return;
        }
        // SAFETY: the caller wrote the job before bumping the epoch (Release, observed above with
        // Acquire) and does not touch it again until this worker decrements `pending`.
        let (task, tasks) = unsafe { *s.job.get() };
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| loop {
            let i = s.next.fetch_add(1, Ordering::Relaxed);
            if i >= tasks {
                break;
            }
            // SAFETY: the closure behind `task` outlives this job: `run` returns only after `pending`
            // reaches 0, i.e. after this worker stops using it.
            unsafe { (*task)(i) };
        }));
        if ok.is_err() {
            s.panicked.store(true, Ordering::Release);
        }
        s.pending.fetch_sub(1, Ordering::AcqRel);
    }
}

impl WorkerPool for ThreadPool {
    fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    fn run(&self, tasks: usize, task: &(dyn Fn(usize) + Sync)) {
        if tasks <= 1
            || self.workers.is_empty()
            || self
                .busy
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            // One task, no workers, or a nested/concurrent call: the calling thread does it all.
            for i in 0..tasks {
                task(i);
            }
            return;
        }
        let s = &*self.shared;
        // SAFETY: erasing the closure's lifetime; it is used only until every worker has decremented
        // `pending` below, before this function returns.
        let erased: Task = unsafe { core::mem::transmute::<&(dyn Fn(usize) + Sync), Task>(task) };
        // SAFETY: `pending == 0` here (the previous job was waited for and `busy` excludes other
        // callers), so no worker reads `job` now.
        unsafe { *s.job.get() = (erased, tasks) };
        s.next.store(0, Ordering::Relaxed);
        s.pending.store(self.workers.len(), Ordering::Relaxed);
        s.epoch.fetch_add(1, Ordering::SeqCst);
        for (w, (t, _)) in self.workers.iter().enumerate() {
            if s.sleeping[w].load(Ordering::SeqCst) {
                t.unpark();
            }
        }
        let mine = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| loop {
            let i = s.next.fetch_add(1, Ordering::Relaxed);
            if i >= tasks {
                break;
            }
            task(i);
        }));
        while s.pending.load(Ordering::Acquire) != 0 {
            core::hint::spin_loop();
        }
        self.busy.store(false, Ordering::Release);
        if let Err(p) = mine {
            std::panic::resume_unwind(p);
        }
        if s.panicked.swap(false, Ordering::AcqRel) {
            panic!("a task panicked on a worker thread");
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.epoch.fetch_add(1, Ordering::SeqCst);
        for (t, _) in &self.workers {
            t.unpark();
        }
        for (_, h) in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

impl core::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ThreadPool")
            .field("threads", &self.threads())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn every_task_runs_once_on_any_pool_size() {
        // Miri (which checks the pool's unsafe hand-off) runs a smaller matrix.
        let (sizes, rounds) = if cfg!(miri) { (3, 3) } else { (4, 50) };
        for threads in 1..=sizes {
            let pool = ThreadPool::new(threads).unwrap();
            assert_eq!(pool.threads(), threads);
            for tasks in [0usize, 1, 2, 3, 17, 200] {
                let hits: Vec<AtomicU64> = (0..tasks).map(|_| AtomicU64::new(0)).collect();
                for _ in 0..rounds {
                    pool.run(tasks, &|i| {
                        hits[i].fetch_add(1, Ordering::Relaxed);
                    });
                }
                assert!(hits
                    .iter()
                    .all(|h| h.load(Ordering::Relaxed) == rounds as u64));
            }
        }
    }

    #[test]
    fn workers_wake_after_parking() {
        let pool = ThreadPool::new(2).unwrap();
        let sum = AtomicU64::new(0);
        for _ in 0..3 {
            std::thread::sleep(std::time::Duration::from_millis(30)); // long enough to park
            pool.run(8, &|i| {
                sum.fetch_add(i as u64, Ordering::Relaxed);
            });
        }
        assert_eq!(sum.load(Ordering::Relaxed), 3 * 28);
    }

    #[test]
    fn a_panicking_task_panics_the_caller_and_the_pool_survives() {
        let pool = ThreadPool::new(2).unwrap();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run(4, &|i| assert!(i != 3, "task 3 fails"));
        }));
        assert!(r.is_err());
        let n = AtomicU64::new(0);
        pool.run(4, &|_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 4);
    }
}
