//! Conformance suite: the same tests for every kernel (skipped at run time when unavailable), all exact:
//! the GEMM suite shared with f32 (`kernels/testkit.rs`) against the naive i64 [`igemm_reference`], the rescaling and `max_abs` of every SIMD flavour
//! against the portable code bit for bit, and the portable rescaling against an i64/f64-free reference
//! written from the definition.
use super::*;
use crate::kernels::testkit::{gemm_conformance, Case, GemmUnderTest, Lcg};
use proptest::prelude::*;
use std::{format, string::String, vec, vec::Vec};

/// int8 operand values.
trait I8Values {
    /// Any i8, with the extremes −128, −127 and 127 over-represented (they stress exactness).
    fn value(&mut self, extremes: bool) -> i8;
}
impl I8Values for Lcg {
    fn value(&mut self, extremes: bool) -> i8 {
        let r = self.next();
        if extremes {
            [-128, -127, 127, -128][(r % 4) as usize]
        } else if r.is_multiple_of(8) {
            [-128i8, 127, -127, 0][(r / 8 % 4) as usize]
        } else {
            (r >> 8) as u8 as i8
        }
    }
}

impl GemmUnderTest for IgemmKernel {
    type E = i8;
    type C = i32;
    // Padding and scratch filled with values whose products would show.
    const PAD: i8 = 99;
    const SCRATCH_FILL: i8 = 77;
    const C_SENTINEL: i32 = -123_456_789;
    fn name(self) -> &'static str {
        IgemmKernel::name(self)
    }
    fn is_available(self) -> bool {
        IgemmKernel::is_available(self)
    }
    fn value(rng: &mut Lcg, extremes: bool) -> i8 {
        rng.value(extremes)
    }
    fn c_value(rng: &mut Lcg, _: bool) -> i32 {
        (rng.next() as i32) >> 8
    }
    fn c_of(v: i8) -> i32 {
        i32::from(v)
    }
    fn scratch_len(m: usize, n: usize, k: usize) -> usize {
        igemm_scratch_len(m, n, k)
    }
    fn gemm(
        self,
        m: usize,
        n: usize,
        k: usize,
        a: MatRef<'_, i8>,
        b: MatRef<'_, i8>,
        c: &mut [i32],
        ldc: usize,
        accumulate: bool,
        scratch: &mut [i8],
    ) {
        igemm_with(self, m, n, k, a, b, c, ldc, accumulate, scratch)
    }
    fn reference(
        m: usize,
        n: usize,
        k: usize,
        a: MatRef<'_, i8>,
        b: MatRef<'_, i8>,
        c: &mut [i32],
        ldc: usize,
        accumulate: bool,
    ) {
        igemm_reference(m, n, k, a, b, c, ldc, accumulate)
    }
    /// Bit-exact.
    fn agrees(
        _: &Case,
        _: MatRef<'_, i8>,
        _: MatRef<'_, i8>,
        i: usize,
        j: usize,
        c0: i32,
        got: i32,
        exp: i32,
    ) -> Result<(), String> {
        if got == exp {
            Ok(())
        } else {
            Err(format!("C[{i},{j}] = {got}, reference {exp} (was {c0})"))
        }
    }
}

/// Shapes with several k blocks (k > 512), several n blocks (n > 768), every edge, vectors.
const LARGE: &[(usize, usize, usize)] = &[
    (32, 256, 784),
    (9, 784, 8),
    (16, 100, 150),
    (13, 800, 530),
    (70, 97, 1027),
    (1, 1600, 3),
    (75, 1, 260),
    (1, 1, 1),
];

/// k near [`MAX_K`] with all-extreme values: the largest exact sums (|C| up to 2^31 − 2^14) in both signs.
fn near_max_k(kernel: IgemmKernel) {
    for (k, av, bv) in [
        (MAX_K, -128i8, -128i8),
        (MAX_K, -128, 127),
        (MAX_K - 5, 127, 127),
    ] {
        let (m, n) = (3, 17);
        let a = vec![av; m * k];
        let mut b = vec![bv; k * n];
        b[5 * n + 16] = 0; // one column differs, so a wrong column order shows
        let mut c = vec![0i32; m * n];
        let mut want = c.clone();
        let mut scratch = vec![0i8; igemm_scratch_len(m, n, k)];
        let (a, b) = (MatRef::row_major(&a, k), MatRef::row_major(&b, n));
        igemm_with(kernel, m, n, k, a, b, &mut c, n, false, &mut scratch);
        igemm_reference(m, n, k, a, b, &mut want, n, false);
        assert_eq!(c, want, "k = {k}, a = {av}, b = {bv}");
        let exact = i64::from(av) * i64::from(bv) * k as i64;
        assert_eq!(i64::from(c[0]), exact, "no wrap-around at k = {k}");
    }
}

/// One [`igemm_pairs`] case: shapes, padding of the strides, accumulate, extremes, seed.
#[derive(Clone, Copy, Debug)]
struct PairsCase {
    m: usize,
    n: usize,
    kp: usize,
    pads: (usize, usize, usize),
    accumulate: bool,
    extremes: bool,
    seed: u64,
}

fn pairs_case_strategy(max_dim: usize) -> impl Strategy<Value = PairsCase> {
    (
        (1..=max_dim, 1..=max_dim, 0..=max_dim),
        (0usize..3, 0usize..5, 0usize..3),
        (any::<bool>(), prop::bool::weighted(0.2)),
        any::<u64>(),
    )
        .prop_map(
            |((m, n, kp), pads, (accumulate, extremes), seed)| PairsCase {
                m,
                n,
                kp,
                pads,
                accumulate,
                extremes,
                seed,
            },
        )
}

/// [`igemm_pairs_with`] against an i64 sum over the int8 values the words and pairs hold.
fn check_pairs(kernel: IgemmKernel, t: PairsCase) -> Result<(), String> {
    let mut rng = Lcg(t.seed);
    let (lda, ldb, ldc) = (t.kp + t.pads.0, 2 * t.n + t.pads.1, t.n + t.pads.2);
    let av: Vec<i8> = (0..t.m * 2 * t.kp).map(|_| rng.value(t.extremes)).collect();
    let mut a = vec![0x5a5a_5a5a; t.m * lda];
    for i in 0..t.m {
        for q in 0..t.kp {
            a[i * lda + q] = pair_word(av[(i * t.kp + q) * 2], av[(i * t.kp + q) * 2 + 1]);
        }
    }
    let mut b = vec![99i8; t.kp * ldb];
    for q in 0..t.kp {
        for e in 0..2 * t.n {
            b[q * ldb + e] = rng.value(t.extremes);
        }
    }
    let mut c = vec![-123_456_789i32; t.m * ldc + 3];
    for i in 0..t.m {
        for j in 0..t.n {
            c[i * ldc + j] = (rng.next() as i32) >> 8;
        }
    }
    let mut want = c.clone();
    for i in 0..t.m {
        for j in 0..t.n {
            let mut s = 0i64;
            for q in 0..t.kp {
                for h in 0..2 {
                    s += i64::from(av[(i * t.kp + q) * 2 + h]) * i64::from(b[q * ldb + 2 * j + h]);
                }
            }
            let d = &mut want[i * ldc + j];
            *d = (if t.accumulate { i64::from(*d) } else { 0 } + s) as i32;
        }
    }
    igemm_pairs_with(
        kernel,
        t.m,
        t.n,
        t.kp,
        &a,
        lda,
        &b,
        ldb,
        &mut c,
        ldc,
        t.accumulate,
    );
    match c.iter().zip(&want).position(|(g, w)| g != w) {
        None => Ok(()),
        Some(idx) => Err(format!(
            "C[{idx}] = {}, reference {} ({t:?})",
            c[idx], want[idx]
        )),
    }
}

/// One [`igemm_dot`] case: shapes, segment count and length, stride padding, accumulate, extremes.
#[derive(Clone, Copy, Debug)]
struct DotCase {
    m: usize,
    n: usize,
    segs: usize,
    len: usize,
    pads: (usize, usize, usize, usize, usize),
    accumulate: bool,
    extremes: bool,
    seed: u64,
}

fn dot_case_strategy() -> impl Strategy<Value = DotCase> {
    (
        (1usize..=11, 1usize..=11, 0usize..=5, 0usize..=70),
        (0usize..3, 0usize..40, 0usize..3, 0usize..40, 0usize..3),
        (any::<bool>(), prop::bool::weighted(0.2)),
        any::<u64>(),
    )
        .prop_map(
            |((m, n, segs, len), pads, (accumulate, extremes), seed)| DotCase {
                m,
                n,
                segs,
                len,
                pads,
                accumulate,
                extremes,
                seed,
            },
        )
}

/// [`igemm_dot_with`] against an i64 sum, segments laid out one after another with padding between
/// rows and between segments (filled with values too: a read past a row would show).
fn check_dot(kernel: IgemmKernel, t: DotCase) -> Result<(), String> {
    let mut rng = Lcg(t.seed);
    let (a_rs, b_rs) = (t.len + t.pads.0, t.len + t.pads.2);
    let (a_ss, b_ss) = (t.m * a_rs + t.pads.1, t.n * b_rs + t.pads.3);
    let ldc = t.n + t.pads.4;
    let a: Vec<i8> = (0..t.segs * a_ss + 5)
        .map(|_| rng.value(t.extremes))
        .collect();
    let b: Vec<i8> = (0..t.segs * b_ss + 5)
        .map(|_| rng.value(t.extremes))
        .collect();
    let mut c: Vec<i32> = (0..t.m * ldc + 2)
        .map(|_| (rng.next() as i32) >> 4)
        .collect();
    let mut want = c.clone();
    for i in 0..t.m {
        for j in 0..t.n {
            let mut s = 0i64;
            for g in 0..t.segs {
                for p in 0..t.len {
                    s += i64::from(a[g * a_ss + i * a_rs + p])
                        * i64::from(b[g * b_ss + j * b_rs + p]);
                }
            }
            let d = &mut want[i * ldc + j];
            *d = (if t.accumulate { i64::from(*d) } else { 0 } + s) as i32;
        }
    }
    igemm_dot_with(
        kernel,
        t.m,
        t.n,
        t.segs,
        t.len,
        &a,
        a_rs,
        a_ss,
        &b,
        b_rs,
        b_ss,
        &mut c,
        ldc,
        t.accumulate,
    );
    match c.iter().zip(&want).position(|(g, w)| g != w) {
        None => Ok(()),
        Some(idx) => Err(format!(
            "C[{idx}] = {}, reference {} ({t:?})",
            c[idx], want[idx]
        )),
    }
}

/// [`RowWriter::im2col`] and [`RowWriter::im2col_pairs`] of `kernel` over random padded planes and
/// masks: every output byte (and the untouched ones after them).
fn im2col_outputs(kernel: IgemmKernel, t: FlatTaps, samples: usize, seed: u64) -> Vec<i8> {
    let mut rng = Lcg(seed);
    let src: Vec<i8> = (0..t.first
        + samples * t.sample
        + (t.rows / (t.kh * t.kw)) * t.plane
        + t.kh * t.w
        + t.kw
        + t.p)
        .map(|_| rng.value(false))
        .collect();
    let masks: Vec<i8> = (0..t.kw * t.p)
        .map(|_| [0, -1, rng.value(false)][(rng.next() % 3) as usize])
        .collect();
    let w = RowWriter::with(kernel);
    let ld = samples * t.p + 3;
    let mut one = vec![55i8; t.rows * ld];
    w.im2col(&t, samples, &src, &masks, &mut one, ld);
    let kp = t.rows.div_ceil(2);
    let mut two = vec![55i8; kp * 2 * ld];
    w.im2col_pairs(&t, samples, &src, &masks, &mut two, 2 * ld);
    one.extend(two);
    one
}

/// [`maxpool2x2`] and [`maxpool2x2_grad`] with `kernel` forced: outputs, indices and the updated
/// derivative (values drawn from a few levels, so windows often tie).
fn maxpool_outputs(kernel: IgemmKernel, w: usize, pairs: usize, seed: u64) -> Vec<i8> {
    let mut rng = Lcg(seed);
    let level = |rng: &mut Lcg| [-128i8, -127, -3, 0, 0, 5, 126, 127][(rng.next() % 8) as usize];
    let x: Vec<i8> = (0..pairs * 2 * w + 3).map(|_| level(&mut rng)).collect();
    let ow = w / 2;
    let dy: Vec<i8> = (0..pairs * ow + 3).map(|_| rng.value(true)).collect();
    let idx_in: Vec<u8> = (0..pairs * ow + 3)
        .map(|_| (rng.next() % 4) as u8)
        .collect();
    let mut dx: Vec<i8> = (0..pairs * 2 * w + 3).map(|_| rng.value(true)).collect();
    IgemmKernel::force(Some(kernel));
    let mut y = vec![9i8; pairs * ow + 3];
    let mut idx = vec![9u8; pairs * ow + 3];
    maxpool2x2(&x, w, pairs, &mut y, &mut idx);
    maxpool2x2_grad(&dy, &idx_in, w, pairs, &mut dx);
    IgemmKernel::force(None);
    y.extend(idx.iter().map(|&i| i as i8));
    y.extend(dx);
    y
}

fn rescale_case_strategy() -> impl Strategy<Value = (Vec<i32>, u32, Rounding, u64)> {
    (
        prop::collection::vec(
            prop_oneof![
                4 => any::<i32>(),
                2 => -70_000i32..70_000,
                1 => prop::sample::select(vec![i32::MIN, i32::MIN + 1, i32::MAX, -1, 0, 1, 127, -127, 128, -128, 191, -191, 192, -192]),
            ],
            0..300,
        ),
        0u32..=31,
        prop_oneof![
            Just(Rounding::Nearest),
            any::<u64>().prop_map(Rounding::Stochastic)
        ],
        prop_oneof![
            any::<u64>(),
            (0u64..100).prop_map(|x| (1u64 << 32) - x),
            (0u64..100).prop_map(|x| u64::MAX - x)
        ],
    )
}

gemm_conformance! {
    cases: 256,
    // m, n from 1; k up to 60; all-extreme values a fifth of the time; scratch < 3000 bytes.
    random: (1, 60, 0.2, 3000),
    large: LARGE,
    small_scratch: 300,
    kind: IgemmKernel,
    extra: {
            proptest! {
                #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]
                #[test]
                fn pairs_match_reference(case in pairs_case_strategy(40)) {
                    if let Some(kern) = kernel() {
                        prop_assert_eq!(check_pairs(kern, case), Ok(()));
                    }
                }

                #[test]
                fn dot_matches_reference(case in dot_case_strategy()) {
                    if let Some(kern) = kernel() {
                        prop_assert_eq!(check_dot(kern, case), Ok(()));
                    }
                }

                #[test]
                fn im2col_matches_portable(
                    (c, kh, kw, w) in (1usize..4, 1usize..4, 1usize..4, 1usize..9),
                    (p, samples, first, gap) in (1usize..70, 1usize..5, 0usize..9, 0usize..9),
                    seed in any::<u64>(),
                ) {
                    if let Some(kern) = kernel() {
                        let plane = p + gap;
                        let t = FlatTaps { rows: c * kh * kw, kh, kw, w, plane, sample: c * plane + gap, first, p };
                        prop_assert_eq!(im2col_outputs(kern, t, samples, seed), im2col_outputs(IgemmKernel::Portable, t, samples, seed));
                    }
                }

                #[test]
                fn maxpool_matches_portable(w in prop::sample::select(vec![2usize, 4, 6, 8, 10, 16, 32, 48]), pairs in 0usize..40, seed in any::<u64>()) {
                    if let Some(kern) = kernel() {
                        prop_assert_eq!(maxpool_outputs(kern, w, pairs, seed), maxpool_outputs(IgemmKernel::Portable, w, pairs, seed));
                    }
                }

                #[test]
                fn quantize_matches_portable(
                    vals in prop::collection::vec(prop_oneof![
                        4 => -300f32..300.0,
                        2 => (-260i32..260).prop_map(|i| i as f32 * 0.5),
                        1 => prop::sample::select(vec![f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.49999997, -0.49999997, 127.5, -127.5, 128.0, -128.5, 1e30, -0.0]),
                    ], 0..100),
                    k in prop::sample::select(vec![1f32, 0.5, 0.25, 2.0, 1.0 / 1024.0, 64.0]),
                ) {
                    if let Some(kern) = kernel() {
                        let mut want = vec![0i8; vals.len()];
                        quantize_portable(&vals, k, &mut want);
                        IgemmKernel::force(Some(kern));
                        let mut got = vec![1i8; vals.len()];
                        quantize_f32(&vals, k, &mut got);
                        IgemmKernel::force(None);
                        prop_assert_eq!(got, want);
                    }
                }

                #[test]
                fn rescale_matches_portable((src, shift, rounding, offset) in rescale_case_strategy()) {
                    if let Some(kern) = kernel() {
                        let mut want = vec![0i8; src.len()];
                        let mut got = vec![1i8; src.len()];
                        let n_want = rescale_i32_to_i8_with(IgemmKernel::Portable, &src, shift, rounding, offset, &mut want);
                        let n_got = rescale_i32_to_i8_with(kern, &src, shift, rounding, offset, &mut got);
                        prop_assert_eq!(&got, &want);
                        prop_assert_eq!(n_got, n_want);
                    }
                }

                #[test]
                fn max_abs_matches_portable(x in prop::collection::vec(any::<i32>(), 0..100), extreme in prop::sample::select(vec![0i32, i32::MIN, i32::MAX, -1])) {
                    if let Some(kern) = kernel() {
                        let mut x = x;
                        x.push(extreme);
                        for len in [x.len(), x.len() / 2, 0] {
                            prop_assert_eq!(max_abs_i32_with(kern, &x[..len]), max_abs_portable(&x[..len]));
                        }
                    }
                }
            }

            #[test]
            fn pairs_and_dot_conv_shapes_and_max_depth() {
                let Some(kern) = kernel() else { return };
                // The digits CNN's shapes (4×16 tiles with 8- and 16-column edges, 16-, 64- and odd-length
                // segments), then the largest exact depth with all-extreme values.
                for (s, &(m, n, kp)) in [(16, 112, 36), (8, 384, 5), (8, 48, 72), (5, 27, 3), (1, 1, 1)].iter().enumerate() {
                    let case = PairsCase { m, n, kp, pads: (1, 2, 1), accumulate: s % 2 == 1, extremes: s == 2, seed: s as u64 };
                    assert_eq!(check_pairs(kern, case), Ok(()));
                }
                for (s, &(m, n, segs, len)) in [(16, 72, 11, 16), (8, 9, 14, 64), (10, 64, 1, 64), (7, 5, 3, 37)].iter().enumerate() {
                    let case = DotCase { m, n, segs, len, pads: (0, 3, 1, 0, 2), accumulate: s % 2 == 0, extremes: s == 3, seed: s as u64 };
                    assert_eq!(check_dot(kern, case), Ok(()));
                }
                for (x, y) in [(-128i8, -128i8), (-128, 127), (127, 127)] {
                    let kp = MAX_K / 2;
                    let a = vec![pair_word(x, x); 2 * kp];
                    let b = vec![y; kp * 2 * 9];
                    let mut c = vec![0i32; 2 * 9];
                    igemm_pairs_with(kern, 2, 9, kp, &a, kp, &b, 18, &mut c, 9, false);
                    assert!(c.iter().all(|&v| i64::from(v) == i64::from(x) * i64::from(y) * 2 * kp as i64));
                    let a = vec![x; MAX_K * 2];
                    let b = vec![y; MAX_K * 3];
                    igemm_dot_with(kern, 2, 3, 1, MAX_K, &a, MAX_K, 0, &b, MAX_K, 0, &mut c, 3, false);
                    assert!(c[..6].iter().all(|&v| i64::from(v) == i64::from(x) * i64::from(y) * MAX_K as i64));
                }
            }

            #[test]
            fn igemm_near_max_k_is_exact() {
                if let Some(kern) = kernel() {
                    near_max_k(kern);
                }
            }

            #[test]
            fn rescale_blocks_like_one_call_per_block() {
                let Some(kern) = kernel() else { return };
                let src: Vec<i32> = (0..7 * 3 * 19).map(|i: i32| i.wrapping_mul(2_654_435_761u32 as i32) >> 11).collect();
                for (rows, inner) in [(7, 19), (21, 19), (1, 399), (7, 57)] {
                    for offset in [0u64, 5, (1 << 32) - 100, u64::MAX - 200] {
                        for r in [Rounding::Nearest, Rounding::Stochastic(9)] {
                            let b = src.len() / (rows * inner);
                            let mut want = vec![0i8; src.len()];
                            let mut n_want = 0;
                            for (ri, sr) in src.chunks_exact(b * inner).enumerate() {
                                for (j, blk) in sr.chunks_exact(inner).enumerate() {
                                    let d0 = (j * rows + ri) * inner;
                                    n_want += rescale_i32_to_i8_with(IgemmKernel::Portable, blk, 12, r, offset.wrapping_add(d0 as u64), &mut want[d0..d0 + inner]);
                                }
                            }
                            IgemmKernel::force(Some(kern));
                            let mut got = vec![1i8; src.len()];
                            let n_got = rescale_i32_to_i8_blocks(&src, rows, inner, 12, r, offset, &mut got);
                            IgemmKernel::force(None);
                            assert_eq!(got, want, "{rows}×{inner} at {offset}");
                            assert_eq!(n_got, n_want);
                        }
                    }
                }
            }

            #[test]
            fn rescale_tiles_like_one_call() {
                let Some(kern) = kernel() else { return };
                let src: Vec<i32> = (0..1000).map(|i: i32| i.wrapping_mul(2_654_435_761u32 as i32) >> 9).collect();
                for offset in [0u64, 5, (1 << 32) - 300, u64::MAX - 400] {
                    let r = Rounding::Stochastic(42);
                    let mut whole = vec![0i8; src.len()];
                    let n_whole = rescale_i32_to_i8_with(kern, &src, 13, r, offset, &mut whole);
                    let mut pieces = vec![0i8; src.len()];
                    let mut n_pieces = 0;
                    for (lo, hi) in [(0, 1), (1, 40), (40, 41), (41, 333), (333, 1000)] {
                        n_pieces += rescale_i32_to_i8_with(kern, &src[lo..hi], 13, r, offset.wrapping_add(lo as u64), &mut pieces[lo..hi]);
                    }
                    assert_eq!(whole, pieces, "offset {offset}");
                    assert_eq!(n_whole, n_pieces);
                    assert!(n_whole > 0, "the data has values beyond 127·2^13");
                }
            }
    },
    kernels: {
        portable => IgemmKernel::Portable;
        avx2 => IgemmKernel::Avx2;
        avx512_vnni => IgemmKernel::Avx512Vnni;
        neon => IgemmKernel::Neon;
        neon_dot => IgemmKernel::NeonDot;
        simd128 => IgemmKernel::Simd128;
    }
}

// ---------------------------------------------------------------------------------------------------------
// The portable rescaling against its definition, computed independently in i128 / exact rationals
// ---------------------------------------------------------------------------------------------------------

/// `round(x / 2^s)` from the definition: exact integer arithmetic in i128, halves away from zero.
fn nearest_def(x: i32, s: u32) -> i128 {
    let (x, d) = (i128::from(x), 1i128 << s);
    let q = x.abs() / d;
    let r = x.abs() % d;
    let q = if 2 * r >= d && s > 0 { q + 1 } else { q };
    if x < 0 {
        -q
    } else {
        q
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn nearest_matches_definition((src, shift, _, offset) in rescale_case_strategy()) {
        let mut got = vec![0i8; src.len()];
        let n = rescale_i32_to_i8_with(IgemmKernel::Portable, &src, shift, Rounding::Nearest, offset, &mut got);
        let mut clamped = 0;
        for (&x, &y) in src.iter().zip(&got) {
            let q = nearest_def(x, shift);
            clamped += usize::from(!(-127..=127).contains(&q));
            prop_assert_eq!(i128::from(y), q.clamp(-127, 127), "x = {}, shift = {}", x, shift);
        }
        prop_assert_eq!(n, clamped);
    }

    #[test]
    fn stochastic_is_floor_or_ceil((src, shift, _, offset) in rescale_case_strategy(), seed in any::<u64>()) {
        let mut got = vec![0i8; src.len()];
        let n = rescale_i32_to_i8_with(IgemmKernel::Portable, &src, shift, Rounding::Stochastic(seed), offset, &mut got);
        let mut clamped = 0;
        for (i, (&x, &y)) in src.iter().zip(&got).enumerate() {
            let d = 1i128 << shift;
            let fl = i128::from(x).div_euclid(d);
            let exact = i128::from(x) % d == 0;
            // Recompute this element's choice from the documented noise to check the value, not just the range.
            let idx = offset.wrapping_add(i as u64);
            let r = noise(stream_key(seed, (idx >> 32) as u32), idx as u32, shift);
            let q = (i128::from(x) + i128::from(r)).div_euclid(d);
            prop_assert!(q == fl || (!exact && q == fl + 1));
            clamped += usize::from(!(-127..=127).contains(&q));
            prop_assert_eq!(i128::from(y), q.clamp(-127, 127));
        }
        prop_assert_eq!(n, clamped);
    }
}

/// Stochastic rounding is unbiased: over many elements of the same value, the mean result is x / 2^s.
#[test]
fn stochastic_rounding_is_unbiased() {
    // 3.3 in units of 2^10: P(4) = 0.3. With N = 100 000 independent draws the standard deviation of the
    // mean is sqrt(0.3·0.7/N) ≈ 0.00145; 0.01 is ~7 sigma, so a fair hash passes and a biased one
    // (e.g. always floor: mean 3.0, or nearest: 3.0) fails by far.
    let x = (3.3f64 * 1024.0) as i32; // 3379 = 3·1024 + 307
    let want = f64::from(x) / 1024.0;
    let src = vec![x; 100_000];
    let mut dst = vec![0i8; src.len()];
    for seed in [1u64, 0xdead_beef, u64::MAX] {
        rescale_i32_to_i8(&src, 10, Rounding::Stochastic(seed), 12345, &mut dst);
        let mean = dst.iter().map(|&v| f64::from(v)).sum::<f64>() / dst.len() as f64;
        assert!(
            (mean - want).abs() < 0.01,
            "seed {seed}: mean {mean}, want {want}"
        );
        assert!(dst.iter().all(|&v| v == 3 || v == 4));
    }
    // Different seeds give different noise.
    let mut other = vec![0i8; src.len()];
    rescale_i32_to_i8(&src, 10, Rounding::Stochastic(2), 12345, &mut other);
    assert_ne!(dst, other);
}

#[test]
fn bit_width_and_shift_follow_listing_1() {
    assert_eq!(bit_width(0), 0);
    assert_eq!(bit_width(1), 1);
    assert_eq!(bit_width(127), 7);
    assert_eq!(bit_width(128), 8);
    assert_eq!(bit_width(u32::MAX), 32);
    assert_eq!(shift_for(0), 0);
    assert_eq!(shift_for(127), 0);
    assert_eq!(shift_for(128), 1);
    assert_eq!(shift_for(255), 1);
    assert_eq!(shift_for(256), 2);
    assert_eq!(shift_for(1 << 31), 25);
    // The shift is the smallest that brings max_abs into ±127 under floor (nearest may still clamp one
    // step, which the saturation count reports).
    for v in [
        1u32,
        100,
        127,
        128,
        1000,
        65535,
        1 << 20,
        (1 << 31) - 1,
        1 << 31,
    ] {
        let s = shift_for(v);
        assert!(v >> s <= 127, "{v}");
        assert!(s == 0 || v >> (s - 1) > 127, "{v}");
    }
    assert_eq!(max_abs_i32(&[3, -7, 5]), 7);
    assert_eq!(max_abs_i32(&[i32::MIN, 5]), 1 << 31);
    assert_eq!(max_abs_i32(&[]), 0);
}

#[test]
fn rescale_examples() {
    let src = [
        0,
        1,
        -1,
        2,
        -2,
        3,
        -3,
        1000,
        -1000,
        255,
        -255,
        254,
        i32::MIN,
        i32::MAX,
    ];
    let mut dst = [0i8; 14];
    let n = rescale_i32_to_i8(&src, 1, Rounding::Nearest, 0, &mut dst);
    // 1/2 = 0.5 → 1, -0.5 → -1, 1.5 → 2, 127.5 → 128 → clamped, 127 exact.
    assert_eq!(
        dst,
        [0, 1, -1, 1, -1, 2, -2, 127, -127, 127, -127, 127, -127, 127]
    );
    assert_eq!(n, 6);
    let n = rescale_i32_to_i8(&src, 0, Rounding::Nearest, 0, &mut dst);
    assert_eq!(n, 7);
    assert_eq!(dst[..7], [0, 1, -1, 2, -2, 3, -3]);
}

#[test]
#[should_panic(expected = "MAX_K")]
// wasm32-wasip1 aborts on panic, so libtest cannot catch one there; the native runs check this.
#[cfg_attr(target_family = "wasm", ignore = "panics abort on wasm")]
fn k_above_max_panics() {
    let a = [0i8; 1];
    igemm(
        1,
        1,
        MAX_K + 1,
        MatRef {
            data: &a,
            rs: 0,
            cs: 0,
        },
        MatRef {
            data: &a,
            rs: 0,
            cs: 0,
        },
        &mut [0],
        1,
        false,
        &mut [],
    );
}

#[test]
fn max_k_is_the_exact_bound() {
    assert!((MAX_K as i64) * 128 * 128 <= i64::from(i32::MAX));
    assert!((MAX_K as i64 + 1) * 128 * 128 > i64::from(i32::MAX));
}

#[test]
fn selected_kernel_is_available() {
    let k = IgemmKernel::selected();
    assert!(k.is_available());
    assert_eq!(k, IgemmKernel::selected());
    std::eprintln!("selected int8 kernel: {}", k.name());
}

#[test]
fn scratch_len_is_bounded_and_fits_every_kernel() {
    assert_eq!(igemm_scratch_len(0, 5, 5), 0);
    assert_eq!(igemm_scratch_len(5, 5, 0), 0);
    let cap = igemm_scratch_len(100_000, 100_000, 100_000);
    assert!(cap < 800 * 1024, "{cap}");
    let buf = vec![0i8; cap + 64];
    for &(m, n, k) in &[
        (32, 256, 784),
        (8, 9, 784),
        (2048, 1024, 784),
        (1, 1, 1),
        (70, 1100, 300),
    ] {
        let len = igemm_scratch_len(m, n, k);
        assert!(len <= cap);
        for shift in 0..64 {
            for spec in ALL_SPECS {
                let ideal = blocking(spec, n, k, KC, NC);
                let got = fit(spec, n, k, &buf[shift..shift + len]).map(|(b, _)| b);
                assert_eq!(got, Some(ideal), "{m}×{n}×{k}, shift {shift}, {spec:?}");
            }
        }
    }
}
