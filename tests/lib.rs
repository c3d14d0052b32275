//! Shared helpers for the cross-crate test suites.

pub mod counting {
    //! One counting global allocator for every no-allocation suite. A suite declares
    //! `#[global_allocator] static A: Counting = Counting;` and wraps the code under test in
    //! [`allocations`]. Every thread's allocations count (a threaded step's workers included), so the
    //! suites run without libtest's harness (`harness = false`): its main thread would otherwise be
    //! counted while it waits for the test thread.
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    static COUNTING: AtomicBool = AtomicBool::new(false);
    static ALLOCS: AtomicUsize = AtomicUsize::new(0);

    /// The system allocator, counting allocations and reallocations while [`allocations`] runs.
    pub struct Counting;

    // SAFETY: defers to the system allocator; only counts.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, l: Layout) -> *mut u8 {
            if COUNTING.load(Ordering::Relaxed) {
                ALLOCS.fetch_add(1, Ordering::Relaxed);
            }
            // SAFETY: same contract as the caller's.
            unsafe { System.alloc(l) }
        }
        unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
            // SAFETY: same contract as the caller's.
            unsafe { System.dealloc(p, l) }
        }
        unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
            if COUNTING.load(Ordering::Relaxed) {
                ALLOCS.fetch_add(1, Ordering::Relaxed);
            }
            // SAFETY: same contract as the caller's.
            unsafe { System.realloc(p, l, n) }
        }
    }

    /// Runs `f` and returns its result with the number of heap allocations made meanwhile, on any thread.
    pub fn allocations<R>(f: impl FnOnce() -> R) -> (R, usize) {
        ALLOCS.store(0, Ordering::SeqCst);
        COUNTING.store(true, Ordering::SeqCst);
        let r = f();
        COUNTING.store(false, Ordering::SeqCst);
        (r, ALLOCS.load(Ordering::SeqCst))
    }

    /// A minimal harness for `harness = false` suites: runs each named test, reports like libtest and
    /// exits non-zero when one panics. An argument filters by name, as with libtest.
    pub fn run(tests: &[(&str, fn())]) {
        let filter: Vec<String> = std::env::args()
            .skip(1)
            .filter(|a| !a.starts_with('-'))
            .collect();
        let chosen: Vec<_> = tests
            .iter()
            .filter(|(n, _)| filter.is_empty() || filter.iter().any(|f| n.contains(f.as_str())))
            .collect();
        println!("\nrunning {} tests", chosen.len());
        let mut failed = Vec::new();
        for (name, t) in &chosen {
            let ok = std::panic::catch_unwind(t).is_ok();
            println!("test {name} ... {}", if ok { "ok" } else { "FAILED" });
            if !ok {
                failed.push(*name);
            }
        }
        let verdict = if failed.is_empty() { "ok" } else { "FAILED" };
        println!(
            "\ntest result: {verdict}. {} passed; {} failed; 0 ignored; 0 measured; {} filtered out\n",
            chosen.len() - failed.len(),
            failed.len(),
            tests.len() - chosen.len()
        );
        if !failed.is_empty() {
            std::process::exit(101);
        }
    }
}
