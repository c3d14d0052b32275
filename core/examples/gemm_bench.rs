//! Single-thread f32 GEMM throughput on the training workloads' shapes.
//!
//! ```text
//! cargo run --release -p frugal-core --features std --example gemm_bench [-- --kernel all|avx512|avx2|portable] [--quick]
//! ```
//!
//! Layouts: `NN` = A and B row-major; `NT` = B is the transpose of a row-major n×k matrix (e.g. a dense
//! layer's `X·Wᵀ`); `TN` = A is the transpose of a row-major k×m matrix (weight gradient `dYᵀ·X`).
use std::time::{Duration, Instant};

use frugal_core::kernels::gemm::{gemm_scratch_len, sgemm_with, MatRef, SgemmKernel};

const SHAPES: &[(&str, usize, usize, usize, &str)] = &[
    // MLP, batch 32
    ("mlp32 fc1 fwd", 32, 256, 784, "NT"),
    ("mlp32 fc1 fwd", 32, 256, 784, "NN"),
    ("mlp32 fc2 fwd", 32, 128, 256, "NT"),
    ("mlp32 fc3 fwd", 32, 10, 128, "NT"),
    ("mlp32 fc1 dW", 256, 784, 32, "TN"),
    ("mlp32 fc2 dW", 128, 256, 32, "TN"),
    ("mlp32 fc3 dW", 10, 128, 32, "TN"),
    ("mlp32 fc2 dX", 32, 256, 128, "NN"),
    // batch 128 / 512
    ("mlp128 fc1 fwd", 128, 256, 784, "NT"),
    ("mlp128 fc1 dW", 256, 784, 128, "TN"),
    ("mlp128 fc2 dX", 128, 256, 128, "NN"),
    ("mlp512 fc1 fwd", 512, 256, 784, "NT"),
    ("mlp512 fc1 dW", 256, 784, 512, "TN"),
    ("mlp512 fc2 dX", 512, 256, 128, "NN"),
    // conv per-sample GEMMs
    ("conv1 fwd", 8, 784, 9, "NN"),
    ("conv1 dW", 9, 784, 8, "TN"),
    ("conv2 fwd", 16, 196, 72, "NN"),
    ("conv2 dcol", 72, 196, 16, "TN"),
    ("conv2 dW", 16, 72, 196, "NT"),
    ("lenet c1 fwd", 6, 784, 25, "NN"),
    ("lenet c2 fwd", 16, 100, 150, "NN"),
    // big
    ("big fc 224²·3", 64, 300, 150528, "NN"),
    ("big fc 224²·3", 64, 300, 150528, "NT"),
    ("big square-ish", 2048, 1024, 784, "NN"),
    ("big square-ish", 1024, 784, 2048, "NN"),
    ("big square-ish", 1024, 784, 2048, "TN"),
];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let which = args
        .iter()
        .position(|a| a == "--kernel")
        .and_then(|i| args.get(i + 1))
        .map(String::as_str);
    let all = [
        SgemmKernel::Avx512,
        SgemmKernel::Avx2,
        SgemmKernel::Portable,
    ];
    let kernels: Vec<SgemmKernel> = match which {
        None => vec![SgemmKernel::selected()],
        Some("all") => all.into_iter().filter(|k| k.is_available()).collect(),
        Some(name) => all
            .into_iter()
            .filter(|k| k.name().starts_with(name) && k.is_available())
            .collect(),
    };
    let budget = Duration::from_millis(if quick { 60 } else { 400 });
    println!("selected kernel: {}", SgemmKernel::selected().name());
    println!(
        "{:<16} {:>22} {:>3}  {:<9} {:>9} {:>11}",
        "workload", "m × n × k", "lay", "kernel", "GFLOP/s", "scratch KiB"
    );
    for &(name, m, n, k, lay) in SHAPES {
        for &kern in &kernels {
            let g = bench(kern, m, n, k, lay, budget);
            let kib = gemm_scratch_len(m, n, k) as f64 * 4.0 / 1024.0;
            println!(
                "{name:<16} {:>22} {lay:>3}  {:<9} {g:>9.1} {kib:>11.1}",
                format!("{m} × {n} × {k}"),
                kern.name()
            );
        }
    }
}

/// Best GFLOP/s over repeated timed runs (each ≈ 2 ms of back-to-back calls, after a warm-up call) within
/// `budget`, at least 5 runs: the minimum filters out preemption on a shared machine.
fn bench(kern: SgemmKernel, m: usize, n: usize, k: usize, lay: &str, budget: Duration) -> f64 {
    let fill = |len: usize, seed: u32| -> Vec<f32> {
        (0..len)
            .map(|i| {
                ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 9) as f32
                    / (1 << 23) as f32
                    - 0.5
            })
            .collect()
    };
    let a = fill(m * k, 1);
    let b = fill(k * n, 2);
    let mut c = vec![0.0f32; m * n];
    let mut scratch = vec![0.0f32; gemm_scratch_len(m, n, k)];
    let am = if lay.starts_with('T') {
        MatRef::row_major_t(&a, m)
    } else {
        MatRef::row_major(&a, k)
    };
    let bm = if lay.ends_with('T') {
        MatRef::row_major_t(&b, k)
    } else {
        MatRef::row_major(&b, n)
    };
    let flops = 2.0 * (m * n * k) as f64;
    let mut call = |c: &mut [f32]| sgemm_with(kern, m, n, k, am, bm, c, n, false, &mut scratch);
    let t = Instant::now();
    call(&mut c);
    let once = t.elapsed().as_secs_f64().max(1e-7);
    let reps = ((2e-3 / once).ceil() as usize).max(1);
    let mut best = f64::INFINITY;
    let start = Instant::now();
    let mut runs = 0;
    while runs < 5 || start.elapsed() < budget {
        let t = Instant::now();
        for _ in 0..reps {
            call(&mut c);
        }
        best = best.min(t.elapsed().as_secs_f64() / reps as f64);
        std::hint::black_box(&mut c);
        runs += 1;
    }
    flops / best / 1e9
}
