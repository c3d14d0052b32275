//! AVX2 [`igemm_pairs`](crate::kernels::int8::igemm_pairs) (4×16 register tiles: a broadcast word of A
//! times 8 depth pairs of B sign-extended from 16 bytes, `vpmaddwd`) and
//! [`igemm_dot`](crate::kernels::int8::igemm_dot) (4×2 blocks of outputs, lanes along the depth, summed
//! by a `vphaddd` tree at the end). Both give the portable result bit for bit: every partial sum is exact
//! modulo 2^32 and the additions wrap in every version.
use core::arch::x86_64::*;

use super::super::pairs::{dot_portable, pairs_portable, seg_addressable, Dot, FlatTaps, Pairs};
use super::Avx2;

impl Avx2 {
    pub(in crate::kernels::int8) fn pairs(self, p: &Pairs, a: &[i32], b: &[i8], c: &mut [i32]) {
        // SAFETY: `self` proves AVX2 is available.
        unsafe { pairs_avx2(p, a, b, c) }
    }
    pub(in crate::kernels::int8) fn dot(self, p: &Dot, a: &[i8], b: &[i8], c: &mut [i32]) {
        // SAFETY: `self` proves AVX2 is available.
        unsafe { dot_avx2(p, a, b, c) }
    }
}

/// Rows of a register tile (both products).
const MR: usize = 4;

#[target_feature(enable = "avx2")]
fn pairs_avx2(p: &Pairs, a: &[i32], b: &[i8], c: &mut [i32]) {
    if p.kp == 0 {
        return pairs_portable(p, a, b, c);
    }
    let n16 = p.n / 16 * 16;
    let n8 = p.n / 8 * 8;
    for i0 in (0..p.m).step_by(MR) {
        let rows = MR.min(p.m - i0);
        let at = &a[i0 * p.lda..];
        for j0 in (0..n8).step_by(16) {
            let (bt, ct) = (&b[2 * j0..], &mut c[i0 * p.ldc + j0..]);
            let t = (p.kp, p.lda, p.ldb, p.ldc, p.accumulate);
            match (rows, j0 < n16) {
                (4, true) => pairs_tile::<4, 2>(t, at, bt, ct),
                (3, true) => pairs_tile::<3, 2>(t, at, bt, ct),
                (2, true) => pairs_tile::<2, 2>(t, at, bt, ct),
                (_, true) => pairs_tile::<1, 2>(t, at, bt, ct),
                (4, false) => pairs_tile::<4, 1>(t, at, bt, ct),
                (3, false) => pairs_tile::<3, 1>(t, at, bt, ct),
                (2, false) => pairs_tile::<2, 1>(t, at, bt, ct),
                (_, false) => pairs_tile::<1, 1>(t, at, bt, ct),
            }
        }
        if n8 < p.n {
            // The last n % 8 columns.
            let tail = Pairs {
                m: rows,
                n: p.n - n8,
                ..*p
            };
            pairs_portable(&tail, at, &b[2 * n8..], &mut c[i0 * p.ldc + n8..]);
        }
    }
}

/// One `R × 8·NV` tile over all `kp` pairs: `a` starts at the tile's first row, `b` at its first
/// column's pair, `c` at its first element. `t` = (kp ≥ 1, lda, ldb, ldc, accumulate).
#[inline]
#[target_feature(enable = "avx2")]
fn pairs_tile<const R: usize, const NV: usize>(
    t: (usize, usize, usize, usize, bool),
    a: &[i32],
    b: &[i8],
    c: &mut [i32],
) {
    let (kp, lda, ldb, ldc, accumulate) = t;
    assert!(
        kp >= 1
            && a.len() >= (R - 1) * lda + kp
            && b.len() >= (kp - 1) * ldb + 16 * NV
            && c.len() >= (R - 1) * ldc + 8 * NV,
        "pairs tile out of bounds"
    );
    let mut s = [[_mm256_setzero_si256(); NV]; R];
    let (ap, bp) = (a.as_ptr(), b.as_ptr());
    for q in 0..kp {
        let mut bv = [_mm256_setzero_si256(); NV];
        for (v, x) in bv.iter_mut().enumerate() {
            // SAFETY: reads the 16 bytes at q·ldb + 16v, which end by (kp−1)·ldb + 16·NV ≤ b.len()
            // (asserted above). AVX2 is enabled on this function.
            *x = unsafe { _mm256_cvtepi8_epi16(_mm_loadu_si128(bp.add(q * ldb + 16 * v).cast())) };
        }
        for (r, row) in s.iter_mut().enumerate() {
            // SAFETY: the i32 at r·lda + q < (R−1)·lda + kp ≤ a.len() (asserted above).
            let w = _mm256_set1_epi32(unsafe { ap.add(r * lda + q).read() });
            for (acc, &x) in row.iter_mut().zip(&bv) {
                *acc = _mm256_add_epi32(*acc, _mm256_madd_epi16(w, x));
            }
        }
    }
    for (r, row) in s.iter().enumerate() {
        for (v, &x) in row.iter().enumerate() {
            // SAFETY: 8 i32 at r·ldc + 8v, which end by (R−1)·ldc + 8·NV ≤ c.len() (asserted above).
            unsafe {
                let pc = c.as_mut_ptr().add(r * ldc + 8 * v);
                let x = if accumulate {
                    _mm256_add_epi32(x, _mm256_loadu_si256(pc.cast()))
                } else {
                    x
                };
                _mm256_storeu_si256(pc.cast(), x);
            }
        }
    }
}

/// Columns of a dot block.
const NC: usize = 2;

#[target_feature(enable = "avx2")]
fn dot_avx2(p: &Dot, a: &[i8], b: &[i8], c: &mut [i32]) {
    if p.segs == 0 || p.len == 0 {
        return dot_portable(p, a, b, c);
    }
    for i0 in (0..p.m).step_by(MR) {
        let rows = MR.min(p.m - i0);
        for j0 in (0..p.n).step_by(NC) {
            let (at, bt) = (&a[i0 * p.a_rs..], &b[j0 * p.b_rs..]);
            let ct = &mut c[i0 * p.ldc + j0..];
            match (rows, NC.min(p.n - j0)) {
                (4, 2) => dot_block::<4, 2>(p, at, bt, ct),
                (3, 2) => dot_block::<3, 2>(p, at, bt, ct),
                (2, 2) => dot_block::<2, 2>(p, at, bt, ct),
                (1, 2) => dot_block::<1, 2>(p, at, bt, ct),
                (4, _) => dot_block::<4, 1>(p, at, bt, ct),
                (3, _) => dot_block::<3, 1>(p, at, bt, ct),
                (2, _) => dot_block::<2, 1>(p, at, bt, ct),
                (_, _) => dot_block::<1, 1>(p, at, bt, ct),
            }
        }
    }
}

/// `R × C` outputs of [`igemm_dot`] over every segment: `a` starts at the block's first row, `b` at its
/// first column, `c` at its first element.
#[inline]
#[target_feature(enable = "avx2")]
fn dot_block<const R: usize, const C: usize>(p: &Dot, a: &[i8], b: &[i8], c: &mut [i32]) {
    let (len, segs) = (p.len, p.segs);
    assert!(
        seg_addressable(a.len(), segs, p.a_ss, R, p.a_rs, len)
            && seg_addressable(b.len(), segs, p.b_ss, C, p.b_rs, len)
            && c.len() >= (R - 1) * p.ldc + C,
        "dot block out of bounds"
    );
    let mut s = [[_mm256_setzero_si256(); C]; R];
    let mut tail = [[0i32; C]; R];
    let (ap, bp) = (a.as_ptr(), b.as_ptr());
    let (l16, l8) = (len / 16 * 16, len / 8 * 8);
    // 16 (`wide`) or 8 depth steps of every row and column from the offsets `oa[r]`, `ob[j]`.
    let step = |s: &mut [[__m256i; C]; R], oa: &[usize; R], ob: &[usize; C], wide: bool| {
        let load = |p: *const i8| {
            // SAFETY: callers pass offsets whose 16 (`wide`) or 8 bytes end within the operand (see
            // the loops below). AVX2 is enabled on this function.
            unsafe {
                if wide {
                    _mm256_cvtepi8_epi16(_mm_loadu_si128(p.cast()))
                } else {
                    _mm256_cvtepi8_epi16(_mm_loadl_epi64(p.cast()))
                }
            }
        };
        let mut av = [_mm256_setzero_si256(); R];
        for (x, &o) in av.iter_mut().zip(oa) {
            // SAFETY: (pointer arithmetic) o < a.len(), see `load`.
            *x = load(unsafe { ap.add(o) });
        }
        for (j, &o) in ob.iter().enumerate() {
            // SAFETY: o < b.len(), see `load`.
            let y = load(unsafe { bp.add(o) });
            for (row, &x) in s.iter_mut().zip(&av) {
                row[j] = _mm256_add_epi32(row[j], _mm256_madd_epi16(x, y));
            }
        }
    };
    for seg in 0..segs {
        // Row r of segment seg starts at seg·a_ss + r·a_rs and holds `len` bytes, inside `a` by the
        // assertion above (likewise for `b`); the loads below read [d, d + 16) or [d, d + 8) of them.
        let mut oa: [usize; R] = core::array::from_fn(|r| seg * p.a_ss + r * p.a_rs);
        let mut ob: [usize; C] = core::array::from_fn(|j| seg * p.b_ss + j * p.b_rs);
        for _ in (0..l16).step_by(16) {
            step(&mut s, &oa, &ob, true);
            oa.iter_mut().for_each(|o| *o += 16);
            ob.iter_mut().for_each(|o| *o += 16);
        }
        if l16 < l8 {
            step(&mut s, &oa, &ob, false);
            oa.iter_mut().for_each(|o| *o += 8);
            ob.iter_mut().for_each(|o| *o += 8);
        }
        if l8 < len {
            for (trow, &o) in tail.iter_mut().zip(&oa) {
                let ar = &a[o..o + len - l8];
                for (t, &q) in trow.iter_mut().zip(&ob) {
                    for (&x, &y) in ar.iter().zip(&b[q..q + len - l8]) {
                        *t = t.wrapping_add(i32::from(x) * i32::from(y));
                    }
                }
            }
        }
    }
    let mut sums = [[0i32; C]; R];
    if R == 4 && C == 2 {
        // vphaddd tree: the 8 accumulators (row-major) → one vector of their 8 sums.
        let h = |x: __m256i, y: __m256i| _mm256_hadd_epi32(x, y);
        let u0 = h(h(s[0][0], s[0][1]), h(s[1][0], s[1][1]));
        let u1 = h(h(s[2][0], s[2][1]), h(s[3][0], s[3][1]));
        let v = _mm256_add_epi32(
            _mm256_permute2x128_si256::<0x20>(u0, u1),
            _mm256_permute2x128_si256::<0x31>(u0, u1),
        );
        let mut flat = [0i32; 8];
        // SAFETY: `flat` holds 8 i32.
        unsafe { _mm256_storeu_si256(flat.as_mut_ptr().cast(), v) };
        for (r, row) in sums.iter_mut().enumerate() {
            row.copy_from_slice(&flat[r * C..r * C + C]);
        }
    } else {
        for (row, srow) in sums.iter_mut().zip(&s) {
            for (o, &x) in row.iter_mut().zip(srow) {
                let q = _mm_add_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256::<1>(x));
                let q = _mm_hadd_epi32(q, q);
                *o = _mm_cvtsi128_si32(_mm_hadd_epi32(q, q));
            }
        }
    }
    for (r, (row, trow)) in sums.iter().zip(&tail).enumerate() {
        let dst = &mut c[r * p.ldc..r * p.ldc + C];
        for ((o, &x), &t) in dst.iter_mut().zip(row).zip(trow) {
            let v = x.wrapping_add(t);
            *o = if p.accumulate { o.wrapping_add(v) } else { v };
        }
    }
}

impl Avx2 {
    pub(in crate::kernels::int8) fn im2col(
        self,
        t: &FlatTaps,
        samples: usize,
        src: &[i8],
        masks: &[i8],
        dst: &mut [i8],
        ld: usize,
    ) {
        // SAFETY: `self` proves AVX2 is available.
        unsafe { im2col_avx2(t, samples, src, masks, dst, ld) }
    }
    pub(in crate::kernels::int8) fn im2col_pairs(
        self,
        t: &FlatTaps,
        samples: usize,
        src: &[i8],
        masks: &[i8],
        dst: &mut [i8],
        ld2: usize,
    ) {
        // SAFETY: `self` proves AVX2 is available.
        unsafe { im2col_pairs_avx2(t, samples, src, masks, dst, ld2) }
    }
}

/// Every row of the taps, 16 columns at a time for every sample (the mask loaded once per 16).
#[target_feature(enable = "avx2")]
fn im2col_avx2(t: &FlatTaps, samples: usize, src: &[i8], masks: &[i8], dst: &mut [i8], ld: usize) {
    let p = t.p;
    assert!(
        samples >= 1
            && t.rows >= 1
            && t.fits(samples, src.len(), masks.len())
            && ld >= samples * p
            && dst.len() >= (t.rows - 1) * ld + samples * p,
        "im2col out of bounds"
    );
    let p16 = p / 16 * 16;
    let (sp, mp, dp) = (src.as_ptr(), masks.as_ptr(), dst.as_mut_ptr());
    let mut tap = (0, 0, 0);
    for r in 0..t.rows {
        let (a, m) = (t.at(tap), tap.2 * p);
        for i in (0..p16).step_by(16) {
            // SAFETY: mask row kj < kw: bytes kj·p + i + 16 ≤ kw·p ≤ masks.len() (`fits`).
            let k = unsafe { _mm_loadu_si128(mp.add(m + i).cast()) };
            for s in 0..samples {
                // SAFETY: the read ends by a + s·sample + p ≤ src.len() (`fits` bounds every row of
                // every sample); the write ends by r·ld + s·p + p ≤ (rows−1)·ld + samples·p ≤ dst.len().
                unsafe {
                    let v = _mm_loadu_si128(sp.add(a + s * t.sample + i).cast());
                    _mm_storeu_si128(dp.add(r * ld + s * p + i).cast(), _mm_and_si128(v, k));
                }
            }
        }
        for s in 0..samples {
            for i in p16..p {
                dst[r * ld + s * p + i] = src[a + s * t.sample + i] & masks[m + i];
            }
        }
        tap = t.next(tap);
    }
}

/// Every pair of rows of the taps, interleaved (`punpck[lh]bw`) 16 columns at a time for every sample.
#[target_feature(enable = "avx2")]
fn im2col_pairs_avx2(
    t: &FlatTaps,
    samples: usize,
    src: &[i8],
    masks: &[i8],
    dst: &mut [i8],
    ld2: usize,
) {
    let p = t.p;
    let kp = t.rows.div_ceil(2);
    assert!(
        samples >= 1
            && t.rows >= 1
            && t.fits(samples, src.len(), masks.len())
            && ld2 >= 2 * samples * p
            && dst.len() >= (kp - 1) * ld2 + 2 * samples * p,
        "im2col_pairs out of bounds"
    );
    let p16 = p / 16 * 16;
    let (sp, mp, dp) = (src.as_ptr(), masks.as_ptr(), dst.as_mut_ptr());
    let mut tap = (0, 0, 0);
    for q in 0..kp {
        let (a, ma) = (t.at(tap), tap.2 * p);
        tap = t.next(tap);
        // A missing second row (odd depth) reads the first again under an all-zero mask.
        let (b, mb, second) = if 2 * q + 1 < t.rows {
            (t.at(tap), tap.2 * p, true)
        } else {
            (a, ma, false)
        };
        tap = t.next(tap);
        let row = q * ld2;
        for i in (0..p16).step_by(16) {
            // SAFETY: mask rows kj < kw: bytes kj·p + i + 16 ≤ kw·p ≤ masks.len() (`fits`).
            let (ka, kb) = unsafe {
                let kb = _mm_loadu_si128(mp.add(mb + i).cast());
                let kb = if second { kb } else { _mm_setzero_si128() };
                (_mm_loadu_si128(mp.add(ma + i).cast()), kb)
            };
            let (mut xa, mut xb, mut d) = (a + i, b + i, row + 2 * i);
            for _ in 0..samples {
                // SAFETY: reads end by a + s·sample + p and b + s·sample + p ≤ src.len() (`fits`);
                // the writes end by q·ld2 + 2·s·p + 2p ≤ (kp−1)·ld2 + 2·samples·p ≤ dst.len().
                unsafe {
                    let x = _mm_and_si128(_mm_loadu_si128(sp.add(xa).cast()), ka);
                    let y = _mm_and_si128(_mm_loadu_si128(sp.add(xb).cast()), kb);
                    _mm_storeu_si128(dp.add(d).cast(), _mm_unpacklo_epi8(x, y));
                    _mm_storeu_si128(dp.add(d + 16).cast(), _mm_unpackhi_epi8(x, y));
                }
                (xa, xb, d) = (xa + t.sample, xb + t.sample, d + 2 * p);
            }
        }
        if p16 < p {
            for s in 0..samples {
                for i in p16..p {
                    let d = row + s * 2 * p + 2 * i;
                    dst[d] = src[a + s * t.sample + i] & masks[ma + i];
                    dst[d + 1] = if second {
                        src[b + s * t.sample + i] & masks[mb + i]
                    } else {
                        0
                    };
                }
            }
        }
    }
}
