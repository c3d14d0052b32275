//! The tiled GEMM against an f64 reference on every adapter the machine has (lavapipe in CI). Without an
//! adapter the suite says *skipped* (on stderr and in `cargo xtask test`'s kernel table); with
//! `FRUGAL_REQUIRE_GPU=1` (set by `cargo xtask test` where setup installed lavapipe) a missing adapter
//! fails it.
use frugal_wgpu::{Gpu, GpuError};
use proptest::prelude::*;

fn gpu() -> Option<&'static Gpu> {
    static GPU: std::sync::OnceLock<Result<Gpu, GpuError>> = std::sync::OnceLock::new();
    match GPU.get_or_init(Gpu::open) {
        Ok(g) => Some(g),
        Err(e) => {
            let required = std::env::var("FRUGAL_REQUIRE_GPU").is_ok_and(|v| v == "1");
            assert!(!required, "FRUGAL_REQUIRE_GPU=1 but: {e}");
            eprintln!("skipped: {e}");
            None
        }
    }
}

fn data(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        })
        .collect()
}

/// C against the f64 product: each element within 2·k·2⁻²⁴·Σ|a·b| (+1e-30). A sum of k f32 products in
/// any order is within γ_k·Σ|a·b| ≈ k·u·Σ|a·b| of the exact value (u = 2⁻²⁴, one rounding per fused
/// multiply-add); a driver that does not fuse (lavapipe may split `fma`) rounds twice per term: 2·k·u.
fn check(gpu: &Gpu, m: usize, n: usize, k: usize, seed: u64) -> Result<(), String> {
    let a = data(m * k, seed);
    let b = data(k * n, seed + 1);
    let c = gpu.sgemm(m, n, k, &a, &b).map_err(|e| e.to_string())?;
    if c.len() != m * n {
        return Err(format!("C has {} elements, not {}", c.len(), m * n));
    }
    let u = 2f64.powi(-24);
    for i in 0..m {
        for j in 0..n {
            let (mut exact, mut mag) = (0f64, 0f64);
            for l in 0..k {
                let p = a[i * k + l] as f64 * b[l * n + j] as f64;
                exact += p;
                mag += p.abs();
            }
            let got = c[i * n + j] as f64;
            let bound = 2.0 * k as f64 * u * mag + 1e-30;
            if (got - exact).abs() > bound {
                return Err(format!(
                    "{m}×{n}×{k}: C[{i},{j}] = {got}, exact {exact}, bound {bound:e}"
                ));
            }
        }
    }
    Ok(())
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
