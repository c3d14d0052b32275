//! `cargo xtask bench sgemm [--threads N] [--reps R]`: SGEMM GFLOPS for 1024³, the FC-FC-FC b2048
//! shapes and those of the char transformer and LSTM steps, per micro-kernel family, against one
//! core's FMA peak.
//!
//! Peak: Zen 4 issues two 256-bit FMAs per cycle (AVX-512 is double-pumped), i.e. 2 × 8 lanes × 2 FLOP
//! = 32 f32 FLOP per cycle per core; the clock is measured with a chain of dependent integer adds (one
//! cycle each) timed against the wall clock, and `/proc/cpuinfo`'s MHz is printed beside it.
use std::time::Instant;

use frugal_core::kernels::gemm::{gemm_scratch_len_threads, sgemm_with_pool, SgemmKernel};
use frugal_core::kernels::MatRef;
use frugal_core::pool::ThreadPool;

/// FLOP per cycle per core (f32, FMA counted as 2).
const FLOP_PER_CYCLE: f64 = 32.0;

/// Core clock in GHz from a dependent-add chain (x86-64), else `None`.
fn measured_ghz() -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    {
        let iters: u64 = 50_000_000;
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t = Instant::now();
            let mut x: u64 = 0;
            // SAFETY: register-only arithmetic; no memory is touched.
            unsafe {
                std::arch::asm!(
                    "2:",
                    "add {x}, 1", "add {x}, 1", "add {x}, 1", "add {x}, 1",
                    "add {x}, 1", "add {x}, 1", "add {x}, 1", "add {x}, 1",
                    "dec {n}",
                    "jnz 2b",
                    x = inout(reg) x,
                    n = inout(reg) iters => _,
                    options(nomem, nostack),
                );
            }
            std::hint::black_box(x);
            best = best.min(t.elapsed().as_secs_f64());
        }
        Some(8.0 * iters as f64 / best / 1e9)
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// Measured single-core FMA throughput in GFLOPS: 16 independent AVX-512 accumulators (more than FMA
/// latency × pipes, so the loop is throughput-bound), `None` without AVX-512F.
fn measured_fma_peak() -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            return None;
        }
        #[target_feature(enable = "avx512f")]
        fn run(iters: usize) -> f32 {
            use std::arch::x86_64::*;
            let mut acc = [_mm512_set1_ps(0.0); 16];
            let (x, y) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
            for _ in 0..iters {
                for a in acc.iter_mut() {
                    *a = _mm512_fmadd_ps(*a, x, y);
                }
            }
            let mut s = _mm512_set1_ps(0.0);
            for a in acc {
                s = _mm512_add_ps(s, a);
            }
            _mm512_reduce_add_ps(s)
        }
        let iters = 20_000_000;
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t = Instant::now();
            // SAFETY: AVX-512F was detected above.
            std::hint::black_box(unsafe { run(std::hint::black_box(iters)) });
            best = best.min(t.elapsed().as_secs_f64());
        }
        Some((iters * 16 * 16 * 2) as f64 / best / 1e9)
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

fn cpu_family() -> Option<u32> {
    let s = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    s.lines()
        .find(|l| l.starts_with("cpu family"))
        .and_then(|l| l.split(':').nth(1))
        .and_then(|v| v.trim().parse().ok())
}

fn cpuinfo_mhz() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    s.lines()
        .find(|l| l.starts_with("cpu MHz"))
        .and_then(|l| l.split(':').nth(1))
        .and_then(|v| v.trim().parse().ok())
}

/// How the bench lays out A: row-major with a leading dimension of at least k (a row of a wider
/// tensor, such as one time step of an RNN's outputs), or column-major (the transpose of a row-major
/// k×lda matrix, such as a weight gradient's `dYᵀ`).
#[derive(Clone, Copy)]
enum ALayout {
    Rows(usize),
    Cols(usize),
}

#[allow(clippy::too_many_arguments)]
fn gflops(
    kern: SgemmKernel,
    pool: &ThreadPool,
    m: usize,
    n: usize,
    k: usize,
    reps: usize,
    al: ALayout,
    bt: bool,
) -> f64 {
    let a_len = match al {
        ALayout::Rows(ld) => (m - 1) * ld.max(k) + k,
        ALayout::Cols(ld) => (k - 1) * ld.max(m) + m,
    };
    let a: Vec<f32> = (0..a_len)
        .map(|i| ((i * 7 % 13) as f32 - 6.0) / 8.0)
        .collect();
    let b: Vec<f32> = (0..k * n)
        .map(|i| ((i * 5 % 11) as f32 - 5.0) / 8.0)
        .collect();
    let mut c = vec![0.0f32; m * n];
    let mut s = vec![0.0f32; gemm_scratch_len_threads(m, n, k, pool_threads(pool))];
    let am = match al {
        ALayout::Rows(ld) => MatRef::row_major(&a, ld.max(k)),
        ALayout::Cols(ld) => MatRef::row_major_t(&a, ld.max(m)),
    };
    let bm = if bt {
        MatRef::row_major_t(&b, k)
    } else {
        MatRef::row_major(&b, n)
    };
    let mut best = f64::MAX;
    for _ in 0..reps {
        let t = Instant::now();
        sgemm_with_pool(kern, pool, m, n, k, am, bm, &mut c, n, false, &mut s);
        best = best.min(t.elapsed().as_secs_f64());
    }
    std::hint::black_box(&c);
    2.0 * (m * n * k) as f64 / best / 1e9
}

fn pool_threads(p: &ThreadPool) -> usize {
    use frugal_core::pool::WorkerPool;
    p.threads()
}

pub fn main(args: &[String]) -> Result<(), String> {
    let mut threads = 1usize;
    let mut reps = 10usize;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--threads" => {
                threads = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or("--threads N")?
            }
            "--reps" => reps = it.next().and_then(|v| v.parse().ok()).ok_or("--reps R")?,
            other => return Err(format!("bench sgemm: unknown argument {other}")),
        }
    }
    let pool = ThreadPool::new(threads).map_err(|e| e.to_string())?;
    let ghz = measured_ghz();
    let mhz = cpuinfo_mhz();
    let clock = ghz.or(mhz.map(|m| m / 1e3)).unwrap_or(0.0);
    println!(
        "clock: {} GHz measured (8 dependent adds per loop iteration, 1 cycle each), /proc/cpuinfo {} MHz",
        ghz.map_or("n/a".into(), |g| format!("{g:.3}")),
        mhz.map_or("n/a".into(), |m| format!("{m:.0}"))
    );
    // AMD family 0x1a (Zen 5) has full-width 512-bit FMA pipes: twice Zen 4's FLOP per cycle.
    let fpc = if cpu_family() == Some(26) {
        2.0 * FLOP_PER_CYCLE
    } else {
        FLOP_PER_CYCLE
    };
    let derived = fpc * clock;
    println!(
        "cpu family {:?}: {fpc} FLOP/cycle (2 FMA pipes × {} f32 lanes × 2) × {clock:.3} GHz = {derived:.1} GFLOPS per core",
        cpu_family(),
        fpc / 4.0
    );
    let fma = measured_fma_peak();
    if let Some(f) = fma {
        println!(
            "measured FMA throughput (16 independent zmm FMA chains), one core: {f:.1} GFLOPS"
        );
    }
    // The larger of the two: a percentage of a peak the core demonstrably reaches is the honest one.
    let peak = fma.map_or(derived, |f| f.max(derived));
    println!(
        "peak used: {peak:.1} GFLOPS per core; {threads} thread(s): {:.1}",
        peak * threads as f64
    );
    use ALayout::{Cols, Rows};
    // (m, n, k, A's layout, B transposed, label); A's leading dimension 0 = k (rows) or m (columns).
    let shapes: &[(usize, usize, usize, ALayout, bool, &str)] = &[
        (1024, 1024, 1024, Rows(0), false, "1024³"),
        (2048, 1024, 784, Rows(0), true, "fc1 fwd  x·Wᵀ"),
        (2048, 1024, 1024, Rows(0), true, "fc2 fwd  x·Wᵀ"),
        (2048, 100, 1024, Rows(0), true, "fc3 fwd  x·Wᵀ"),
        (2048, 784, 1024, Rows(0), false, "fc2 dX  dY·W"),
        (
            1024,
            1024,
            2048,
            Rows(0),
            false,
            "fc2 dW  (dYᵀ·X, A row-major here)",
        ),
        // The char transformer (examples/char-gpt.toml: 32 × 64 tokens, width 128, MLP 512).
        (2048, 384, 128, Rows(0), true, "gpt qkv fwd  x·Wᵀ"),
        (2048, 128, 512, Rows(0), true, "gpt fc2 fwd  x·Wᵀ"),
        (2048, 128, 512, Rows(0), false, "gpt fc1 dX  dY·W"),
        (512, 128, 2048, Cols(0), false, "gpt fc1 dW  dYᵀ·X"),
        // The char LSTM (examples/char-lstm.toml: batch 32, 64 steps, 384 units, gates 1536):
        // one time step's rows of the outputs (stride 64·384) and of the gates (64·1536).
        (32, 1536, 384, Rows(64 * 384), true, "lstm step  h·W_hhᵀ"),
        // The same product transposed, as the forward step computes it: `W_hh·hᵀ`, W_hh in place.
        (1536, 32, 384, Rows(0), true, "lstm step  W_hh·hᵀ"),
        (
            32,
            384,
            1536,
            Rows(64 * 1536),
            false,
            "lstm step dH  dG·W_hh",
        ),
        (1536, 384, 2048, Cols(0), false, "lstm dW_hh  dGᵀ·H"),
    ];
    for kern in [SgemmKernel::Avx512, SgemmKernel::Avx2] {
        if !kern.is_available() {
            continue;
        }
        println!("kernel {}:", kern.name());
        for &(m, n, k, al, bt, label) in shapes {
            let g = gflops(kern, &pool, m, n, k, reps, al, bt);
            println!(
                "  {label:<36} {m:>5}×{n:>5}×{k:>5}: {g:7.1} GFLOPS = {:5.1} % of {threads}-core peak",
                100.0 * g / (peak * threads as f64)
            );
        }
    }
    Ok(())
}
