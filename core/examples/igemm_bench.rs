//! Single-thread int8 GEMM (exact, i32 accumulation) against the f32 SGEMM on the same shapes, plus the
//! rescaling helpers' throughput.
//!
//! ```text
//! cargo run --release -p frugal-core --features std --example igemm_bench [-- --kernel all|avx2|…] [--quick]
//! ```
//!
//! For each shape: the best time of the f32 SGEMM (its selected kernel) and of each int8 kernel, in
//! GOP/s (2·m·n·k per call), and the speed-up of int8 over f32. Layouts as in `gemm_bench`: `NN` both
//! row-major, `NT` B transposed (a dense layer's `X·Wᵀ`), `TN` A transposed (weight gradient `dYᵀ·X`).
use std::time::{Duration, Instant};

use frugal_core::kernels::gemm::{gemm_scratch_len, sgemm_with, MatRef, SgemmKernel};
use frugal_core::kernels::int8::{
    igemm_scratch_len, igemm_with, max_abs_i32_with, rescale_i32_to_i8_with, IgemmKernel, Rounding,
};

const SHAPES: &[(&str, usize, usize, usize, &str)] = &[
    // MLP, batch 32
    ("mlp32 fc1 fwd", 32, 256, 784, "NT"),
    ("mlp32 fc2 fwd", 32, 128, 256, "NT"),
    ("mlp32 fc3 fwd", 32, 10, 128, "NT"),
    ("mlp32 fc1 dW", 256, 784, 32, "TN"),
    ("mlp32 fc2 dX", 32, 256, 128, "NN"),
    // batch 128
    ("mlp128 fc1 fwd", 128, 256, 784, "NT"),
    ("mlp128 fc1 dW", 256, 784, 128, "TN"),
    // conv per-sample GEMMs (small CNN)
    ("conv1 fwd", 8, 784, 9, "NN"),
    ("conv1 dW", 9, 784, 8, "TN"),
    ("conv2 fwd", 16, 196, 72, "NN"),
    ("conv2 dcol", 72, 196, 16, "TN"),
    ("conv2 dW", 16, 72, 196, "NT"),
    ("lenet c2 fwd", 16, 100, 150, "NN"),
    // digits CNN (8×8 input, `cargo xtask bench int8` speed row): per-sample conv GEMMs, fc at batch 64
    ("dig conv1 fwd", 8, 64, 9, "NN"),
    ("dig conv1 dW", 8, 9, 64, "NT"),
    ("dig conv2 fwd", 16, 16, 72, "NN"),
    ("dig conv2 dW", 16, 72, 16, "NT"),
    ("dig conv2 dcol", 72, 16, 16, "TN"),
    ("dig c2 fwd x64", 16, 1024, 72, "NN"),
    ("dig fc fwd", 64, 10, 64, "NT"),
    ("dig fc dW", 10, 64, 64, "TN"),
    // big
    ("big square-ish", 1024, 784, 2048, "NN"),
];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let which = args
        .iter()
        .position(|a| a == "--kernel")
        .and_then(|i| args.get(i + 1))
        .map(String::as_str);
    let kernels: Vec<IgemmKernel> = match which {
        None => vec![IgemmKernel::selected()],
        Some("all") => IgemmKernel::ALL
            .into_iter()
            .filter(|k| k.is_available())
            .collect(),
        Some(name) => IgemmKernel::ALL
            .into_iter()
            .filter(|k| k.name().starts_with(name) && k.is_available())
            .collect(),
    };
    let budget = Duration::from_millis(if quick { 60 } else { 400 });
    let fk = SgemmKernel::selected();
    println!(
        "selected: int8 {}, f32 {}",
        IgemmKernel::selected().name(),
        fk.name()
    );
    println!(
        "{:<16} {:>18} {:>3}  {:>9}  {:<12} {:>9} {:>8} {:>10}",
        "workload", "m × n × k", "lay", "f32 GOP/s", "int8 kernel", "GOP/s", "vs f32", "int8 ns"
    );
    for &(name, m, n, k, lay) in SHAPES {
        let f = time_f32(fk, m, n, k, lay, budget);
        for &kern in &kernels {
            let t = time_i8(kern, m, n, k, lay, budget);
            let ops = 2.0 * (m * n * k) as f64 / 1e9;
            println!(
                "{name:<16} {:>18} {lay:>3}  {:>9.1}  {:<12} {:>9.1} {:>7.2}× {:>10.0}",
                format!("{m} × {n} × {k}"),
                ops / f,
                kern.name(),
                ops / t,
                f / t,
                t * 1e9
            );
        }
    }
    println!();
    println!(
        "{:<12} {:<22} {:>12}",
        "kernel", "helper (64 Ki i32)", "Gelem/s"
    );
    let src: Vec<i32> = (0..65536u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) as i32) >> 12)
        .collect();
    let mut dst = vec![0i8; src.len()];
    let mut kernels = kernels;
    if !kernels.contains(&IgemmKernel::Portable) {
        kernels.push(IgemmKernel::Portable);
    }
    for &kern in &kernels {
        let rates = [
            best_of(budget, || {
                std::hint::black_box(max_abs_i32_with(kern, std::hint::black_box(&src)));
            }),
            best_of(budget, || {
                rescale_i32_to_i8_with(kern, &src, 12, Rounding::Nearest, 0, &mut dst);
            }),
            best_of(budget, || {
                rescale_i32_to_i8_with(kern, &src, 12, Rounding::Stochastic(7), 0, &mut dst);
            }),
        ];
        let labels = ["max_abs_i32", "rescale nearest", "rescale stochastic"];
        for (label, secs) in labels.iter().zip(rates) {
            println!(
                "{:<12} {label:<22} {:>12.2}",
                kern.name(),
                src.len() as f64 / secs / 1e9
            );
        }
    }
}

/// Best seconds per call over repeated timed runs (each ≈ 2 ms of back-to-back calls after a warm-up
/// call) within `budget`, at least 5 runs: the minimum filters out preemption on a shared machine.
fn best_of(budget: Duration, mut call: impl FnMut()) -> f64 {
    let t = Instant::now();
    call();
    let once = t.elapsed().as_secs_f64().max(1e-7);
    let reps = ((2e-3 / once).ceil() as usize).max(1);
    let mut best = f64::INFINITY;
    let start = Instant::now();
    let mut runs = 0;
    while runs < 5 || start.elapsed() < budget {
        let t = Instant::now();
        for _ in 0..reps {
            call();
        }
        best = best.min(t.elapsed().as_secs_f64() / reps as f64);
        runs += 1;
    }
    best
}

fn fill(len: usize, seed: u32) -> impl Iterator<Item = u32> {
    (0..len).map(move |i| (i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 9)
}

fn views<'a, T>(
    a: &'a [T],
    b: &'a [T],
    m: usize,
    n: usize,
    k: usize,
    lay: &str,
) -> (MatRef<'a, T>, MatRef<'a, T>) {
    let am = if lay.starts_with('T') {
        MatRef::row_major_t(a, m)
    } else {
        MatRef::row_major(a, k)
    };
    let bm = if lay.ends_with('T') {
        MatRef::row_major_t(b, k)
    } else {
        MatRef::row_major(b, n)
    };
    (am, bm)
}

fn time_f32(kern: SgemmKernel, m: usize, n: usize, k: usize, lay: &str, budget: Duration) -> f64 {
    let a: Vec<f32> = fill(m * k, 1)
        .map(|x| x as f32 / (1 << 23) as f32 - 0.5)
        .collect();
    let b: Vec<f32> = fill(k * n, 2)
        .map(|x| x as f32 / (1 << 23) as f32 - 0.5)
        .collect();
    let mut c = vec![0.0f32; m * n];
    let mut scratch = vec![0.0f32; gemm_scratch_len(m, n, k)];
    let (am, bm) = views(&a, &b, m, n, k, lay);
    best_of(budget, || {
        sgemm_with(kern, m, n, k, am, bm, &mut c, n, false, &mut scratch);
        std::hint::black_box(&mut c);
    })
}

fn time_i8(kern: IgemmKernel, m: usize, n: usize, k: usize, lay: &str, budget: Duration) -> f64 {
    let a: Vec<i8> = fill(m * k, 1).map(|x| x as u8 as i8).collect();
    let b: Vec<i8> = fill(k * n, 2).map(|x| x as u8 as i8).collect();
    let mut c = vec![0i32; m * n];
    let mut scratch = vec![0i8; igemm_scratch_len(m, n, k)];
    let (am, bm) = views(&a, &b, m, n, k, lay);
    best_of(budget, || {
        igemm_with(kern, m, n, k, am, bm, &mut c, n, false, &mut scratch);
        std::hint::black_box(&mut c);
    })
}
