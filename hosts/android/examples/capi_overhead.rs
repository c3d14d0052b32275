//! The C ABI's cost per `frugal_train_steps(h, 1)` call against the same step through the Rust
//! executor (`Executor::train_step_adaptive` on the same ladder, executor and scratch made once):
//! digits MLP at batch 32, both in one process. Run by `cargo xtask android --bench` (release).
//!
//! ```text
//! capi_overhead                  # time: ROUNDS alternating rounds (C ABI then Rust, then Rust then C ABI, …)
//! capi_overhead count capi|rust N  # N steps of one path inside `counted_steps` (for callgrind)
//! ```
//!
//! The time mode prints the median µs/step of each path and the overhead per round (the C-ABI block over
//! the Rust block of the same round, so a slower or faster stretch of a shared machine moves both):
//! its median, quartiles and extremes. Times are the thread's CPU time on Linux (`CLOCK_THREAD_CPUTIME_ID`:
//! time the thread waits for a core on a busy machine is not counted), wall-clock time elsewhere. The count mode is for `valgrind --tool=callgrind
//! --toggle-collect=*counted_steps*`: the instructions executed inside `counted_steps` (N steps, after
//! two warm-up steps outside it) do not depend on the machine's load.
use std::hint::black_box;

use frugal::capi::*;
use frugal::trainer::{Options, Trainer, UNLIMITED};
use frugal::FrugalStatus;
use frugal_core::budget::Budget;
use frugal_core::exec::{Executor, Target};
use frugal_core::format::decode_model;
use frugal_core::plan::table::PlanTable;
use frugal_core::plan::Plan;

const MLP: &[u8] = include_bytes!("../../../examples/digits-mlp.frgm");
const X: &[u8] = include_bytes!("../../../data/digits/digits-train-images.idx");
const Y: &[u8] = include_bytes!("../../../data/digits/digits-train-labels.idx");

/// Alternating rounds (after one warm-up round) and steps per path per round.
const ROUNDS: usize = 101;
const PER_ROUND: usize = 50;

/// This thread's CPU time in µs.
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
fn now_us() -> f64 {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    }
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: glibc's and bionic's clock_gettime with a valid clock id writes one timespec (two 64-bit
    // fields on the 64-bit targets this runs on) through a valid pointer.
    let r = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(r, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    ts.sec as f64 * 1e6 + ts.nsec as f64 * 1e-3
}

/// Wall-clock µs since the first call.
#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
fn now_us() -> f64 {
    use std::sync::OnceLock;
    use std::time::Instant;
    static T0: OnceLock<Instant> = OnceLock::new();
    T0.get_or_init(Instant::now).elapsed().as_secs_f64() * 1e6
}

/// The C-ABI trainer: 32 samples, so every step trains the same batch.
fn capi_trainer(x: &[f32], y: &[u32]) -> u64 {
    let mut h = 0u64;
    let o = frugal_options_default();
    // SAFETY: valid pointers and lengths.
    let s = unsafe {
        frugal_create(
            MLP.as_ptr(),
            MLP.len(),
            std::ptr::null(),
            0,
            UNLIMITED,
            &o,
            &mut h,
        )
    };
    assert_eq!(s, FrugalStatus::Ok);
    for i in 0..32 {
        // SAFETY: 64 floats.
        let s = unsafe { frugal_add_sample(h, x[i * 64..].as_ptr(), 64, y[i]) };
        assert_eq!(s, FrugalStatus::Ok);
    }
    h
}

fn capi_steps(h: u64, n: usize) {
    for _ in 0..n {
        let mut loss = 0f32;
        // SAFETY: one float.
        let s = unsafe { frugal_train_steps(h, 1, &mut loss, 1, std::ptr::null_mut()) };
        assert_eq!(s, FrugalStatus::Ok);
        black_box(loss);
    }
}

/// The same step through the executor: the largest plan of the same ladder, executor and switch scratch
/// made once, the budget reported once per step (as the trainer does when it does not change).
struct Direct<'t> {
    table: &'t PlanTable,
    arena: Vec<u8>,
    ex: Executor<'t>,
}

impl<'t> Direct<'t> {
    fn new(table: &'t PlanTable) -> Self {
        let plan = &table.entries.last().unwrap().plan;
        let mut arena = vec![0u8; plan.needed_bytes()];
        let mut ex = Executor::new(plan, &arena).unwrap();
        // The model's seed, as the C-ABI trainer: both paths train the same weights on the same batch,
        // so even data-dependent instruction counts (libm's square root in Adam) are the same.
        let seed = decode_model(MLP).unwrap().seed;
        ex.init_params(&mut arena, seed).unwrap();
        ex.prepare_adaptive(table);
        Direct { table, arena, ex }
    }

    fn steps(&mut self, x: &[f32], y: &[u32], n: usize) {
        for _ in 0..n {
            let mut first = true;
            let mut budget_at =
                |_: usize, _: &Plan| std::mem::take(&mut first).then_some(Budget::new(usize::MAX));
            let (stats, _) = self
                .ex
                .train_step_adaptive(
                    &mut self.arena,
                    x,
                    Target::Classes(y),
                    self.table,
                    &mut budget_at,
                    &mut (),
                )
                .unwrap();
            black_box(stats.loss);
        }
    }
}

/// The steps callgrind counts (`--toggle-collect=*counted_steps*`).
#[inline(never)]
fn counted_steps(f: &mut dyn FnMut(usize), n: usize) {
    f(n)
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn main() {
    let x: Vec<f32> = X[16..16 + 32 * 64]
        .iter()
        .map(|&p| p as f32 / 16.0)
        .collect();
    let y: Vec<u32> = Y[8..8 + 32].iter().map(|&l| l as u32).collect();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let t = Trainer::new(MLP, &[], UNLIMITED, Options::default()).unwrap();
    let table = t.table();

    if let [mode, path, n] = args.as_slice() {
        assert_eq!(mode, "count", "usage: capi_overhead [count capi|rust N]");
        let n: usize = n.parse().expect("N steps");
        match path.as_str() {
            "capi" => {
                let h = capi_trainer(&x, &y);
                capi_steps(h, 2);
                counted_steps(&mut |n| capi_steps(h, n), n);
                assert_eq!(frugal_destroy(h), FrugalStatus::Ok);
            }
            "rust" => {
                let mut d = Direct::new(table);
                d.steps(&x, &y, 2);
                counted_steps(&mut |n| d.steps(&x, &y, n), n);
            }
            p => panic!("unknown path {p}: capi or rust"),
        }
        println!("counted {n} steps of {path}");
        return;
    }
    assert!(args.is_empty(), "usage: capi_overhead [count capi|rust N]");

    let h = capi_trainer(&x, &y);
    let mut d = Direct::new(table);
    let (mut capi, mut rust, mut over) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..=ROUNDS {
        let time = |f: &mut dyn FnMut()| {
            let t0 = now_us();
            f();
            (now_us() - t0) / PER_ROUND as f64
        };
        // Alternate which path goes first, so neither always runs on the warmer cache or clock.
        let (c, rs) = if r % 2 == 0 {
            let c = time(&mut || capi_steps(h, PER_ROUND));
            (c, time(&mut || d.steps(&x, &y, PER_ROUND)))
        } else {
            let rs = time(&mut || d.steps(&x, &y, PER_ROUND));
            (time(&mut || capi_steps(h, PER_ROUND)), rs)
        };
        if r > 0 {
            // Round 0 warms both up.
            capi.push(c);
            rust.push(rs);
            over.push(100.0 * (c - rs) / rs);
        }
    }
    assert_eq!(frugal_destroy(h), FrugalStatus::Ok);
    for v in [&mut capi, &mut rust, &mut over] {
        v.sort_by(f64::total_cmp);
    }
    let m = |v: &[f64]| quantile(v, 0.5);
    let clock = if cfg!(all(target_os = "linux", target_pointer_width = "64")) {
        "thread CPU time"
    } else {
        "wall-clock time"
    };
    println!(
        "\n### C-ABI overhead per train_steps(1) call: digits MLP, batch 32 ({ROUNDS} alternating rounds of {PER_ROUND} steps per path, {clock})\n"
    );
    println!("| path | median µs/step | quartiles |\n|---|---:|---|");
    println!(
        "| Rust executor (train_step_adaptive, executor and scratch made once) | {:.2} | {:.2} – {:.2} |",
        m(&rust),
        quantile(&rust, 0.25),
        quantile(&rust, 0.75)
    );
    println!(
        "| C ABI frugal_train_steps(h, 1) | {:.2} | {:.2} – {:.2} |",
        m(&capi),
        quantile(&capi, 0.25),
        quantile(&capi, 0.75)
    );
    println!(
        "\noverhead per round (C ABI ÷ Rust − 1): median {:.2} %, quartiles {:.2} – {:.2} %, extremes {:.2} – {:.2} % (target ≤ 1 %)",
        m(&over),
        quantile(&over, 0.25),
        quantile(&over, 0.75),
        over[0],
        over[over.len() - 1]
    );
}
