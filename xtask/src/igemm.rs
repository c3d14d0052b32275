//! `cargo xtask bench igemm [--reps R]`: int8 GEMM (`igemm_with`, exact i8×i8→i32) throughput in GOPS
//! (multiply and add counted as 2) per available kernel, for a square product and the int8 training
//! shapes of an FC layer and an im2col convolution; the best of `R` runs (default 10), one thread.
//! For comparing kernels and driver changes on one machine, in one sitting.
use std::time::Instant;

use frugal_core::kernels::int8::{igemm_scratch_len, igemm_with, IgemmKernel};
use frugal_core::kernels::MatRef;

pub fn main(args: &[String]) -> Result<(), String> {
    let mut reps = 10usize;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--reps" => reps = it.next().and_then(|v| v.parse().ok()).ok_or("--reps R")?,
            other => return Err(format!("bench igemm: unknown argument {other}")),
        }
    }
    // (m, n, k, B transposed, label)
    let shapes: &[(usize, usize, usize, bool, &str)] = &[
        (512, 512, 512, false, "512³"),
        (256, 1024, 784, true, "fc fwd  x·Wᵀ, batch 256"),
        (1024, 784, 256, false, "fc dW  dYᵀ·X"),
        (64, 784, 288, false, "conv 32→64 3×3 as im2col, 28×28"),
        (64, 10, 1024, true, "small fc, batch 64"),
    ];
    for kern in IgemmKernel::ALL {
        if !kern.is_available() {
            continue;
        }
        println!("kernel {}:", kern.name());
        for &(m, n, k, bt, label) in shapes {
            let g = gops(kern, m, n, k, reps, bt);
            println!("  {label:<36} {m:>5}×{n:>5}×{k:>5}: {g:7.1} GOPS");
        }
    }
    Ok(())
}

fn gops(kern: IgemmKernel, m: usize, n: usize, k: usize, reps: usize, bt: bool) -> f64 {
    let a: Vec<i8> = (0..m * k).map(|i| (i * 7 % 255) as i8).collect();
    let b: Vec<i8> = (0..k * n).map(|i| (i * 5 % 251) as i8).collect();
    let mut c = vec![0i32; m * n];
    let mut s = vec![0i8; igemm_scratch_len(m, n, k)];
    let bm = if bt {
        MatRef::row_major_t(&b, k)
    } else {
        MatRef::row_major(&b, n)
    };
    let mut best = f64::MAX;
    for _ in 0..reps {
        let t = Instant::now();
        igemm_with(
            kern,
            m,
            n,
            k,
            MatRef::row_major(&a, k),
            bm,
            &mut c,
            n,
            false,
            &mut s,
        );
        best = best.min(t.elapsed().as_secs_f64());
    }
    std::hint::black_box(&c);
    2.0 * (m * n * k) as f64 / best / 1e9
}
