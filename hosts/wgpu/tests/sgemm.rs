//! The tiled GEMM against an f64 reference on every adapter the machine has (lavapipe in CI). Without an
//! adapter the suite says *skipped* (on stderr and in `cargo xtask test`'s kernel table); with
//! `FRUGAL_REQUIRE_GPU=1` (set by `cargo xtask test` where setup installed lavapipe) a missing adapter
//! fails it.
#![cfg(not(target_arch = "wasm32"))] // natively; the browser suite is tests/web.rs
mod common;
use common::gpu;

fn data(len: usize, seed: u64) -> Vec<f32> {
    common::data(len, seed, 1.0)
}
use frugal_wgpu::{GemmOpts, GemmVariant, Gpu, GpuError};
use proptest::prelude::*;

/// C against the f64 product: each element within 2·k·2⁻²⁴·Σ|a·b| (+1e-30). A sum of k f32 products in
/// any order is within γ_k·Σ|a·b| ≈ k·u·Σ|a·b| of the exact value (u = 2⁻²⁴, one rounding per fused
/// multiply-add); a driver that does not fuse (lavapipe may split `fma`) rounds twice per term: 2·k·u.
fn check(gpu: &Gpu, m: usize, n: usize, k: usize, seed: u64) -> Result<(), String> {
    check_with(gpu, m, n, k, seed, GemmOpts::default())
}

/// [`check`] with transposed operands and accumulation into old values of C.
fn check_with(
    gpu: &Gpu,
    m: usize,
    n: usize,
    k: usize,
    seed: u64,
    opts: GemmOpts,
) -> Result<(), String> {
    check_run(m, n, k, seed, opts, |a, b, old| {
        gpu.sgemm_with(m, n, k, a, b, opts, old)
    })
    .map(|_| ())
}

/// [`check_with`] of the product `run` computes from A, B and C's old values; returns C.
fn check_run(
    m: usize,
    n: usize,
    k: usize,
    seed: u64,
    opts: GemmOpts,
    run: impl FnOnce(&[f32], &[f32], &[f32]) -> Result<Vec<f32>, GpuError>,
) -> Result<Vec<f32>, String> {
    let a = data(m * k, seed);
    let b = data(k * n, seed + 1);
    let old = if opts.accumulate {
        data(m * n, seed + 2)
    } else {
        Vec::new()
    };
    let c = run(&a, &b, &old).map_err(|e| e.to_string())?;
    if c.len() != m * n {
        return Err(format!("C has {} elements, not {}", c.len(), m * n));
    }
    let at = |i: usize, l: usize| {
        if opts.trans_a {
            a[l * m + i]
        } else {
            a[i * k + l]
        }
    };
    let bt = |l: usize, j: usize| {
        if opts.trans_b {
            b[j * k + l]
        } else {
            b[l * n + j]
        }
    };
    let u = 2f64.powi(-24);
    for i in 0..m {
        for j in 0..n {
            let (mut exact, mut mag) = (0f64, 0f64);
            for l in 0..k {
                let p = at(i, l) as f64 * bt(l, j) as f64;
                exact += p;
                mag += p.abs();
            }
            if opts.accumulate {
                // One more rounding: adding the old value.
                exact += old[i * n + j] as f64;
                mag += old[i * n + j].abs() as f64;
            }
            let got = c[i * n + j] as f64;
            let bound = 2.0 * (k + 1) as f64 * u * mag + 1e-30;
            if (got - exact).abs() > bound {
                return Err(format!(
                    "{m}×{n}×{k} {opts:?}: C[{i},{j}] = {got}, exact {exact}, bound {bound:e}"
                ));
            }
        }
    }
    Ok(c)
}

#[test]
fn tile_edges_and_layer_shapes_match_the_f64_product() {
    let Some(g) = gpu() else { return };
    eprintln!("adapter: {}", g.adapter());
    for &(m, n, k) in &[
        (1, 1, 1),
        (2, 3, 0),
        (63, 64, 65),
        (64, 64, 64),
        (65, 129, 17),
        (130, 97, 513),
        (32, 256, 784), // digits MLP, first layer
        (1, 2100, 3),
        (75, 1, 260),
    ] {
        check(g, m, n, k, (m * 31 + n * 7 + k) as u64).unwrap();
    }
}

/// The layouts a linear layer's backward pass needs: dX = dY·Wᵀ (B transposed), dW (+)= dYᵀ·X (A
/// transposed, accumulated over micro-batches), and both at once.
#[test]
fn transposed_operands_and_accumulation_match_the_f64_product() {
    let Some(g) = gpu() else { return };
    for (ta, tb, acc) in [
        (false, true, false),
        (true, false, false),
        (true, true, false),
        (true, false, true),
        (false, false, true),
    ] {
        let opts = GemmOpts {
            trans_a: ta,
            trans_b: tb,
            accumulate: acc,
        };
        for &(m, n, k) in &[(1, 1, 1), (65, 33, 70), (10, 784, 32), (130, 97, 64)] {
            check_with(g, m, n, k, (m + n + k) as u64, opts).unwrap();
        }
    }
}

#[test]
fn operands_that_do_not_match_their_dimensions_are_errors() {
    let Some(g) = gpu() else { return };
    assert!(matches!(
        g.sgemm(2, 2, 2, &[1.0; 3], &[1.0; 4]),
        Err(GpuError::Shape(_))
    ));
    assert!(matches!(
        g.sgemm(usize::MAX, 2, 2, &[], &[1.0; 4]),
        Err(GpuError::Shape(_))
    ));
    let acc = GemmOpts {
        accumulate: true,
        ..Default::default()
    };
    assert!(matches!(
        g.sgemm_with(2, 2, 2, &[1.0; 4], &[1.0; 4], acc, &[0.0; 3]),
        Err(GpuError::Shape(_))
    ));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn random_shapes_match_the_f64_product(m in 1usize..150, n in 1usize..150, k in 0usize..150, seed in any::<u64>()) {
        if let Some(g) = gpu() {
            prop_assert_eq!(check(g, m, n, k, seed), Ok(()));
        }
    }
}

/// Every generated kernel of the sweep, in all four layouts, accumulating and not, against the f64
/// product and bit for bit against `sgemm.wgsl` (each C element is the same in-order `fma` chain): the
/// general ones on ragged shapes (partial tiles in every dimension, k = 0 included), the fast ones on
/// tile multiples — and the fast ones refuse a shape that is not.
#[test]
fn every_gemm_variant_matches_the_f64_product_and_the_tiled_kernel() {
    let Some(g) = gpu() else { return };
    let mut ran = 0;
    for (i, base) in GemmVariant::sweep().into_iter().enumerate() {
        for (l, (ta, tb)) in [(false, false), (true, false), (false, true), (true, true)]
            .into_iter()
            .enumerate()
        {
            let v = base.with_trans(ta, tb);
            let kern = match g.gemm_kernel(v) {
                Ok(k) => k,
                // A tile beyond this adapter's workgroup memory (lavapipe's limits are smaller).
                Err(GpuError::Shape(why)) if why.contains("limits") => {
                    eprintln!("skipped: {why}");
                    continue;
                }
                Err(e) => panic!("{e}"),
            };
            let (bm, bn, tk) = (v.bm as usize, v.bn as usize, v.tk as usize);
            let shapes: Vec<(usize, usize, usize)> = if v.fast {
                vec![(bm, 2 * bn, 3 * tk), (2 * bm, bn, tk)]
            } else {
                vec![(bm + 1, bn - 3, tk + 5), (5, 2 * bn + 7, 3), (3, 7, 0)]
            };
            for (s, &(m, n, k)) in shapes.iter().enumerate() {
                let opts = GemmOpts {
                    trans_a: ta,
                    trans_b: tb,
                    accumulate: (i + l + s) % 2 == 1,
                };
                let seed = (i * 16 + l * 4 + s) as u64;
                let got = check_run(m, n, k, seed, opts, |a, b, old| {
                    g.run_gemm(Some(&kern), &g.gemm_buffers_with(m, n, k, a, b, opts, old)?)
                })
                .unwrap_or_else(|e| panic!("{}: {e}", v.name()));
                let legacy = check_run(m, n, k, seed, opts, |a, b, old| {
                    g.run_gemm(None, &g.gemm_buffers_with(m, n, k, a, b, opts, old)?)
                })
                .unwrap();
                assert!(
                    got.iter()
                        .zip(&legacy)
                        .all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{} {m}×{n}×{k} {opts:?}: not bit-equal to sgemm.wgsl",
                    v.name()
                );
                ran += 1;
            }
            if v.fast {
                let bufs = g
                    .gemm_buffers_with(
                        bm,
                        bn,
                        tk + 1,
                        &data(bm * (tk + 1), 1),
                        &data((tk + 1) * bn, 2),
                        GemmOpts {
                            trans_a: ta,
                            trans_b: tb,
                            accumulate: false,
                        },
                        &[],
                    )
                    .unwrap();
                assert!(matches!(
                    g.run_gemm(Some(&kern), &bufs),
                    Err(GpuError::Shape(_))
                ));
            }
        }
    }
    // Most of the sweep compiles even on lavapipe's limits.
    assert!(ran > 100, "only {ran} products checked");
}

/// `sgemm_with` (and so Linear and the GPU backend's step) runs the generated default kernel where the
/// shape is a tile multiple, `sgemm.wgsl` elsewhere; bit for bit the legacy kernel's results in every
/// layout, accumulating or not.
#[test]
fn the_default_kernel_is_the_fast_one_where_it_fits_and_bit_equal() {
    let Some(g) = gpu() else { return };
    let mut fast = 0;
    for (l, (ta, tb)) in [(false, false), (true, false), (false, true), (true, true)]
        .into_iter()
        .enumerate()
    {
        let best = GemmVariant::defaults(ta, tb)[0];
        for (s, &(m, n, k)) in [(128, 128, 64), (64, 192, 48), (130, 97, 64)]
            .iter()
            .enumerate()
        {
            let opts = GemmOpts {
                trans_a: ta,
                trans_b: tb,
                accumulate: (l + s) % 2 == 1,
            };
            let name = g.gemm_default_name(m as u32, n as u32, k as u32, opts);
            let fits = |v: GemmVariant| v.fits(m as u32, n as u32, k as u32, ta, tb);
            if !GemmVariant::defaults(ta, tb).into_iter().any(fits) {
                assert_eq!(name, "sgemm.wgsl");
            } else if g.gemm_kernel(best).is_ok() && fits(best) {
                assert_eq!(name, best.name());
            }
            fast += usize::from(name != "sgemm.wgsl");
            let seed = (l * 4 + s) as u64;
            let got = check_run(m, n, k, seed, opts, |a, b, old| {
                g.sgemm_with(m, n, k, a, b, opts, old)
            })
            .unwrap_or_else(|e| panic!("{name}: {e}"));
            let legacy = check_run(m, n, k, seed, opts, |a, b, old| {
                g.run_gemm(None, &g.gemm_buffers_with(m, n, k, a, b, opts, old)?)
            })
            .unwrap();
            assert!(
                got.iter()
                    .zip(&legacy)
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                "{name} {m}×{n}×{k} {opts:?}: not bit-equal to sgemm.wgsl"
            );
        }
    }
    // The 64×64 tile fits every adapter's limits: 2 of the 3 shapes run a generated kernel.
    assert_eq!(fast, 8);
}
