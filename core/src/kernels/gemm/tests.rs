//! Conformance suite: the GEMM suite shared with int8 (`kernels/testkit.rs`) for every f32 kernel family
//! (skipped at run time when the CPU lacks it), against [`gemm_reference`], plus the f32-only tests.
//!
//! Tolerance. Any order of summing k products (blocked, FMA-fused or not) has, by the standard bound for
//! floating-point dot products, `|ŝ - s| ≤ γ_k · Σ|a_ip·b_pj|` with `γ_k = k·ε/(1 - k·ε)`, ε = 2⁻²⁴;
//! adding the old C (accumulate) costs one more rounding, so both the kernel and the reference are within
//! `γ_{k+1}·S` of the exact value, where `S = Σ_p|a_ip||b_pj| + |c_ij|`, hence of each other within
//! `2·γ_{k+1}·S`. We allow `2.01·(k+1)·ε·S + MIN_POSITIVE` (k ≤ 1100 here, so 1/(1 - kε) < 1.0001). A
//! wrong index or a missed/extra term is off by O(|a||b|), far above this, and the integer-valued cases
//! (all sums exact in f32) are compared for exact equality.
use super::*;
use crate::kernels::testkit::{gemm_conformance, operand, Case, GemmUnderTest, Layout, Lcg};

/// f32 operand values.
trait F32Values {
    /// Uniform in [-1, 1), or an integer in -2..=2 when `ints`.
    fn value(&mut self, ints: bool) -> f32;
}
impl F32Values for Lcg {
    fn value(&mut self, ints: bool) -> f32 {
        if ints {
            (self.next() % 5) as f32 - 2.0
        } else {
            (self.next() as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
        }
    }
}

impl GemmUnderTest for SgemmKernel {
    type E = f32;
    type C = f32;
    // NaN padding and scratch: a stray read shows.
    const PAD: f32 = f32::NAN;
    const SCRATCH_FILL: f32 = f32::NAN;
    const C_SENTINEL: f32 = -1234.5;
    fn name(self) -> &'static str {
        SgemmKernel::name(self)
    }
    fn is_available(self) -> bool {
        SgemmKernel::is_available(self)
    }
    fn value(rng: &mut Lcg, ints: bool) -> f32 {
        rng.value(ints)
    }
    fn c_value(rng: &mut Lcg, ints: bool) -> f32 {
        rng.value(ints)
    }
    fn c_of(v: i8) -> f32 {
        f32::from(v)
    }
    fn scratch_len(m: usize, n: usize, k: usize) -> usize {
        gemm_scratch_len(m, n, k)
    }
    fn gemm(
        self,
        m: usize,
        n: usize,
        k: usize,
        a: MatRef<'_, f32>,
        b: MatRef<'_, f32>,
        c: &mut [f32],
        ldc: usize,
        accumulate: bool,
        scratch: &mut [f32],
    ) {
        sgemm_with(self, m, n, k, a, b, c, ldc, accumulate, scratch)
    }
    fn reference(
        m: usize,
        n: usize,
        k: usize,
        a: MatRef<'_, f32>,
        b: MatRef<'_, f32>,
        c: &mut [f32],
        ldc: usize,
        accumulate: bool,
    ) {
        gemm_reference(m, n, k, a, b, c, ldc, accumulate)
    }
    /// Within the tolerance of the module doc (exact for the integer-valued cases).
    fn agrees(
        case: &Case,
        a: MatRef<'_, f32>,
        b: MatRef<'_, f32>,
        i: usize,
        j: usize,
        c0: f32,
        got: f32,
        exp: f32,
    ) -> Result<(), String> {
        let k = case.k;
        let s: f32 = (0..k)
            .map(|p| (a.data[i * a.rs + p * a.cs] * b.data[p * b.rs + j * b.cs]).abs())
            .sum::<f32>()
            + if case.accumulate { c0.abs() } else { 0.0 };
        let tol = if case.special {
            0.0
        } else {
            2.01 * (k + 1) as f32 * f32::EPSILON / 2.0 * s + f32::MIN_POSITIVE
        };
        let within = (got - exp).abs() <= tol; // false for NaN too
        if within {
            Ok(())
        } else {
            Err(format!(
                "C[{i},{j}] = {got}, reference {exp}, tolerance {tol}"
            ))
        }
    }
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
    // A column-major A more than 512 rows apart per depth step, wider than 96: packed, with the ragged
    // last panels of 5 and 3 rows.
    (605, 100, 40),
    (603, 100, 9),
];

gemm_conformance! {
    cases: 200,
    // m, n from 0; k up to 70; integer-valued (exact) cases a quarter of the time; scratch < 4000.
    random: (0, 70, 0.25, 4000),
    large: LARGE,
    small_scratch: 100,
    kind: SgemmKernel,
    extra: {
        #[test]
        fn threads_give_identical_bits() {
            let Some(kern) = kernel() else { return };
            threads_match_one_thread(kern);
        }
    },
    kernels: {
        portable => SgemmKernel::Portable;
        avx2 => SgemmKernel::Avx2;
        avx512 => SgemmKernel::Avx512;
        simd128 => SgemmKernel::Simd128;
        neon => SgemmKernel::Neon;
    }
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
            let (a, ars, acs) = operand(m, k, la, f32::NAN, || rng.value(false));
            let (b, brs, bcs) = operand(k, n, lb, f32::NAN, || rng.value(false));
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
