//! Conformance suite: the same tests for every kernel family (skipped at run time when the CPU lacks
//! it), against [`gemm_reference`].
//!
//! Tolerance. Any order of summing k products (blocked, FMA-fused or not) has, by the standard bound for
//! floating-point dot products, `|ŝ - s| ≤ γ_k · Σ|a_ip·b_pj|` with `γ_k = k·ε/(1 - k·ε)`, ε = 2⁻²⁴;
//! adding the old C (accumulate) costs one more rounding, so both the kernel and the reference are within
//! `γ_{k+1}·S` of the exact value, where `S = Σ_p|a_ip||b_pj| + |c_ij|`, hence of each other within
//! `2·γ_{k+1}·S`. We allow `2.01·(k+1)·ε·S + MIN_POSITIVE` (k ≤ 1100 here, so 1/(1 - kε) < 1.0001). A
//! wrong index or a missed/extra term is off by O(|a||b|), far above this, and the integer-valued cases
//! (all sums exact in f32) are compared for exact equality.
use super::*;
use proptest::prelude::*;

/// How an operand is laid out in memory.
#[derive(Clone, Copy, Debug)]
enum Layout {
    /// Row-major, rows padded by `pad`.
    Row(usize),
    /// Column-major (the transpose of a row-major matrix), columns padded by `pad`.
    Col(usize),
    /// Neither stride is 1: element (i, j) at `i·(2·cols + 1) + 2·j`.
    Strided,
}

fn layout_strategy() -> impl Strategy<Value = Layout> {
    prop_oneof![
        (0usize..3).prop_map(Layout::Row),
        (0usize..3).prop_map(Layout::Col),
        Just(Layout::Strided),
    ]
}

/// Tiny deterministic generator for operand values (keeps proptest's inputs small).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }
    /// Uniform in [-1, 1), or an integer in -2..=2 when `ints`.
    fn value(&mut self, ints: bool) -> f32 {
        if ints {
            (self.next() % 5) as f32 - 2.0
        } else {
            (self.next() as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
        }
    }
}

/// An operand of `rows×cols` in `layout`, with `data` holding only what the layout addresses (plus the
/// padding between rows/columns, filled with NaN so a stray read shows).
fn operand(
    rows: usize,
    cols: usize,
    layout: Layout,
    rng: &mut Lcg,
    ints: bool,
) -> (Vec<f32>, usize, usize) {
    let (rs, cs) = match layout {
        Layout::Row(pad) => (cols + pad, 1),
        Layout::Col(pad) => (1, rows + pad),
        Layout::Strided => (2 * cols + 1, 2),
    };
    let len = if rows == 0 || cols == 0 {
        0
    } else {
        (rows - 1) * rs + (cols - 1) * cs + 1
    };
    let mut data = vec![f32::NAN; len];
    for i in 0..rows {
        for j in 0..cols {
            data[i * rs + j * cs] = rng.value(ints);
        }
    }
    (data, rs, cs)
}

/// One conformance case; `scratch_len = None` means exactly [`gemm_scratch_len`].
#[derive(Clone, Copy, Debug)]
struct Case {
    m: usize,
    n: usize,
    k: usize,
    la: Layout,
    lb: Layout,
    ldc_pad: usize,
    accumulate: bool,
    ints: bool,
    scratch_len: Option<usize>,
    seed: u64,
}

/// Runs `case` through `kernel` and checks it against the reference; `Err` describes the first mismatch.
fn check(kernel: SgemmKernel, case: Case) -> Result<(), String> {
    let Case {
        m,
        n,
        k,
        la,
        lb,
        ldc_pad,
        accumulate,
        ints,
        scratch_len,
        seed,
    } = case;
    let mut rng = Lcg(seed);
    let (a, ars, acs) = operand(m, k, la, &mut rng, ints);
    let (b, brs, bcs) = operand(k, n, lb, &mut rng, ints);
    let a = MatRef {
        data: &a,
        rs: ars,
        cs: acs,
    };
    let b = MatRef {
        data: &b,
        rs: brs,
        cs: bcs,
    };
    let ldc = n + ldc_pad;
    // C has one extra row's worth of sentinel after the last row, and sentinels in the row padding.
    let sentinel = -1234.5f32;
    let mut c: Vec<f32> = (0..m * ldc + 3).map(|_| sentinel).collect();
    for i in 0..m {
        for j in 0..n {
            c[i * ldc + j] = rng.value(ints);
        }
    }
    let c0 = c.clone();
    let mut want = c.clone();
    gemm_reference(m, n, k, a, b, &mut want, ldc, accumulate);
    let full = gemm_scratch_len(m, n, k);
    let mut scratch = vec![f32::NAN; scratch_len.unwrap_or(full).min(full)];
    sgemm_with(kernel, m, n, k, a, b, &mut c, ldc, accumulate, &mut scratch);
    for i in 0..m {
        for j in 0..n {
            let (got, exp) = (c[i * ldc + j], want[i * ldc + j]);
            let s: f32 = (0..k)
                .map(|p| (a.data[i * ars + p * acs] * b.data[p * brs + j * bcs]).abs())
                .sum::<f32>()
                + if accumulate {
                    c0[i * ldc + j].abs()
                } else {
                    0.0
                };
            let tol = if ints {
                0.0
            } else {
                2.01 * (k + 1) as f32 * f32::EPSILON / 2.0 * s + f32::MIN_POSITIVE
            };
            let within = (got - exp).abs() <= tol; // false for NaN too
            if !within {
                return Err(format!(
                    "C[{i},{j}] = {got}, reference {exp}, tolerance {tol}"
                ));
            }
        }
    }
    for (idx, (&got, &orig)) in c.iter().zip(&c0).enumerate() {
        let (i, j) = (idx / ldc.max(1), idx % ldc.max(1));
        if (i >= m || j >= n) && got.to_bits() != orig.to_bits() {
            return Err(format!("wrote outside C at element {idx}"));
        }
    }
    Ok(())
}

fn case_strategy(max_dim: usize) -> impl Strategy<Value = Case> {
    (
        (0..=max_dim, 0..=max_dim, 0..=max_dim),
        (layout_strategy(), layout_strategy(), 0usize..4),
        (any::<bool>(), prop::bool::weighted(0.25)),
        prop_oneof![3 => Just(None), 1 => (0usize..4000).prop_map(Some)],
        any::<u64>(),
    )
        .prop_map(
            |((m, n, k), (la, lb, ldc_pad), (accumulate, ints), scratch_len, seed)| Case {
                m,
                n,
                k,
                la,
                lb,
                ldc_pad,
                accumulate,
                ints,
                scratch_len,
                seed,
            },
        )
}

/// Larger fixed shapes: several k blocks (k > 256), several n blocks (n > 1008), every edge.
const LARGE: &[(usize, usize, usize)] = &[
    (32, 256, 784),
    (9, 784, 8),
    (16, 100, 150),
    (13, 1100, 300),
    (130, 97, 513),
    (1, 2100, 3),
    (75, 1, 260),
];

/// Whether the comma-separated kernel names in `FRUGAL_REQUIRE_KERNELS` include `k`: `cargo xtask cross`
/// sets it (e.g. `simd128` on wasm32) so a kernel that should run there cannot be skipped silently.
fn required(k: SgemmKernel) -> bool {
    std::env::var("FRUGAL_REQUIRE_KERNELS")
        .is_ok_and(|v| v.split(',').any(|n| n.trim() == k.name()))
}

macro_rules! conformance {
    ($($name:ident => $kernel:expr;)*) => {$(
        mod $name {
            use super::*;

            fn kernel() -> Option<SgemmKernel> {
                let k = $kernel;
                if k.is_available() {
                    Some(k)
                } else {
                    assert!(!required(k), "{} is required here (FRUGAL_REQUIRE_KERNELS) but not available", k.name());
                    // Straight to stderr, past the test harness's capture, once per suite: a skip shows
                    // in every `cargo test` run, not only with --nocapture.
                    static SAID: std::sync::Once = std::sync::Once::new();
                    SAID.call_once(|| {
                        use std::io::Write;
                        let _ = writeln!(std::io::stderr(), "skipped: {:?} kernel suite (not available on this CPU)", k);
                    });
                    None
                }
            }

            proptest! {
                #![proptest_config(ProptestConfig { cases: 200, failure_persistence: None, ..ProptestConfig::default() })]
                #[test]
                fn matches_reference(case in case_strategy(70)) {
                    if let Some(kern) = kernel() {
                        prop_assert_eq!(check(kern, case), Ok(()));
                    }
                }
            }

            #[test]
            fn large_shapes_all_layouts() {
                let Some(kern) = kernel() else { return };
                let layouts = [Layout::Row(0), Layout::Col(1), Layout::Strided];
                for (s, &(m, n, k)) in LARGE.iter().enumerate() {
                    for (t, (&la, &lb)) in layouts.iter().zip(layouts.iter().rev()).enumerate() {
                        for (accumulate, scratch_len) in [(false, None), (true, None), (false, Some(100))] {
                            let case = Case {
                                m, n, k, la, lb, ldc_pad: t, accumulate, ints: t == 1, scratch_len,
                                seed: (s * 7 + t) as u64,
                            };
                            assert_eq!(check(kern, case), Ok(()), "{case:?}");
                        }
                    }
                }
            }

            #[test]
            fn threads_give_identical_bits() {
                let Some(kern) = kernel() else { return };
                threads_match_one_thread(kern);
            }

            #[test]
            fn k_zero_zeroes_or_keeps() {
                let Some(kern) = kernel() else { return };
                let mut c = [5.0f32; 12];
                let e: [f32; 0] = [];
                sgemm_with(kern, 3, 3, 0, MatRef::row_major(&e, 0), MatRef::row_major(&e, 3), &mut c, 4, true, &mut []);
                assert_eq!(c, [5.0; 12]);
                sgemm_with(kern, 3, 3, 0, MatRef::row_major(&e, 0), MatRef::row_major(&e, 3), &mut c, 4, false, &mut []);
                assert_eq!(c, [0.0, 0.0, 0.0, 5.0, 0.0, 0.0, 0.0, 5.0, 0.0, 0.0, 0.0, 5.0]);
            }

            #[test]
            fn empty_m_or_n_touches_nothing() {
                let Some(kern) = kernel() else { return };
                let a = [1.0f32; 6];
                let mut c: [f32; 0] = [];
                sgemm_with(kern, 0, 3, 2, MatRef::row_major(&a, 2), MatRef::row_major(&a, 3), &mut c, 3, false, &mut []);
                sgemm_with(kern, 3, 0, 2, MatRef::row_major(&a, 2), MatRef::row_major(&a, 0), &mut c, 0, false, &mut []);
            }
        }
    )*};
}

conformance! {
    portable => SgemmKernel::Portable;
    avx2 => SgemmKernel::Avx2;
    avx512 => SgemmKernel::Avx512;
    simd128 => SgemmKernel::Simd128;
    neon => SgemmKernel::Neon;
}

#[test]
fn scratch_len_is_bounded_and_proportional() {
    assert_eq!(gemm_scratch_len(0, 5, 5), 0);
    assert_eq!(gemm_scratch_len(5, 5, 0), 0);
    // Small conv GEMM: far below 256 KiB (the value documented on `gemm_scratch_len`).
    assert_eq!(gemm_scratch_len(8, 9, 784), 4719);
    assert!(
        gemm_scratch_len(8, 9, 784) * 4 < 24 * 1024,
        "{}",
        gemm_scratch_len(8, 9, 784)
    );
    // Capped however large the product.
    let cap = 15 + 8 * 256 + 256 * 1008;
    for &(m, n, k) in &[
        (2048, 1024, 784),
        (64, 300, 150528),
        (100_000, 100_000, 100_000),
    ] {
        assert!(gemm_scratch_len(m, n, k) <= cap);
    }
    assert_eq!(gemm_scratch_len(100_000, 100_000, 100_000), cap);
}

#[test]
fn selected_kernel_is_available() {
    let k = SgemmKernel::selected();
    assert!(k.is_available());
    // With simd128 compiled in, the explicit kernel is the one used (the portable one does not vectorise
    // at the browser build's opt-level).
    if cfg!(all(
        target_arch = "wasm32",
        target_feature = "simd128",
        not(miri)
    )) {
        assert_eq!(k, SgemmKernel::Simd128);
    } else {
        assert_ne!(k, SgemmKernel::Simd128);
    }
    // On aarch64 the NEON kernel is the one used, unless FRUGAL_SGEMM forces another.
    if cfg!(all(target_arch = "aarch64", not(miri))) && std::env::var_os("FRUGAL_SGEMM").is_none() {
        assert_eq!(k, SgemmKernel::Neon);
    }
    assert_eq!(k, SgemmKernel::selected());
}

#[test]
fn sgemm_and_generic_gemm_agree_with_reference() {
    let (m, n, k) = (5, 7, 3);
    let a: Vec<f32> = (0..m * k).map(|x| x as f32).collect();
    let b: Vec<f32> = (0..k * n).map(|x| (x % 5) as f32).collect();
    let mut c = vec![0.0f32; m * n];
    let mut want = c.clone();
    let mut scratch = vec![0.0f32; gemm_scratch_len(m, n, k)];
    gemm(
        m,
        n,
        k,
        MatRef::row_major(&a, k),
        MatRef::row_major(&b, n),
        &mut c,
        n,
        false,
        &mut scratch,
    );
    gemm_reference(
        m,
        n,
        k,
        MatRef::row_major(&a, k),
        MatRef::row_major(&b, n),
        &mut want,
        n,
        false,
    );
    assert_eq!(c, want);
}

/// A scratch of exactly `gemm_scratch_len` elements gets every kernel's full-size blocks, whatever its
/// alignment (the formula's 15 elements of slack cover the 64-byte alignment shift).
#[test]
fn exact_scratch_gets_ideal_blocking() {
    let buf = vec![0.0f32; 300_000];
    for &(m, n, k) in &[
        (32, 256, 784),
        (8, 9, 784),
        (2048, 1024, 784),
        (1, 1, 1),
        (70, 1100, 300),
    ] {
        let len = gemm_scratch_len(m, n, k);
        for shift in 0..16 {
            for spec in ALL_SPECS {
                let ideal = blocking(spec, n, k, KC, NC);
                let got = fit(spec, n, k, true, true, &buf[shift..shift + len]).map(|(b, _)| b);
                assert_eq!(got, Some(ideal), "{m}×{n}×{k}, shift {shift}, {spec:?}");
            }
        }
    }
}

/// Threaded products of `kernel` equal its one-thread product bit for bit (row bands and B panel ranges
/// split across 2, 3, 4 workers; edge tiles, strided and transposed operands, short and extended scratch).
/// Run per kernel by the conformance suite (which reports an unavailable kernel as skipped).
fn threads_match_one_thread(kernel: SgemmKernel) {
    use crate::kernels::par::testing::Scoped;
    let shapes: &[(usize, usize, usize)] = &[
        (1, 1, 1),
        (7, 5, 3),
        (67, 131, 257),
        (100, 1024, 300),
        (129, 49, 513),
        (300, 97, 64),
        (17, 1100, 40),
        (64, 2100, 33),
    ];
    let mut rng = Lcg(7);
    for &(m, n, k) in shapes {
        for (la, lb) in [
            (Layout::Row(0), Layout::Row(1)),
            (Layout::Col(0), Layout::Col(2)),
            (Layout::Strided, Layout::Row(0)),
        ] {
            let (a, ars, acs) = operand(m, k, la, &mut rng, false);
            let (b, brs, bcs) = operand(k, n, lb, &mut rng, false);
            let a = MatRef {
                data: &a,
                rs: ars,
                cs: acs,
            };
            let b = MatRef {
                data: &b,
                rs: brs,
                cs: bcs,
            };
            let ldc = n + 3;
            let c0: Vec<f32> = (0..m * ldc).map(|_| rng.value(false)).collect();
            for accumulate in [false, true] {
                for threads in [2usize, 3, 4] {
                    let base = gemm_scratch_len(m, n, k);
                    for len in [base, gemm_scratch_len_threads(m, n, k, threads), base / 3] {
                        let mut want = c0.clone();
                        let mut s = vec![f32::NAN; len];
                        sgemm_with(kernel, m, n, k, a, b, &mut want, ldc, accumulate, &mut s);
                        let mut got = c0.clone();
                        let mut s = vec![f32::NAN; len];
                        let pool = Scoped(threads);
                        sgemm_with_pool(
                            kernel, &pool, m, n, k, a, b, &mut got, ldc, accumulate, &mut s,
                        );
                        let same = want
                            .iter()
                            .zip(&got)
                            .all(|(x, y)| x.to_bits() == y.to_bits());
                        assert!(same, "{kernel:?} {m}x{n}x{k} {la:?}/{lb:?} acc={accumulate} t={threads} scratch={len}");
                    }
                }
            }
        }
    }
}
