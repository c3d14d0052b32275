//! AVX2 [`maxpool2x2`](crate::kernels::int8::pool::maxpool2x2) and its backward: 8 windows per step.
//! Pair widths 2, 4 and 8 load 32 bytes (whole pairs) and sort each 16-byte lane into the windows' four
//! elements with one `pshufb`; widths that are multiples of 16 load 16 columns of both rows. The
//! maximum is `vpmaxsb` of the four, its index the first element equal to it.
use core::arch::x86_64::*;

use super::super::pool::{maxpool2x2_grad_portable, maxpool2x2_portable};
use super::Avx2;

impl Avx2 {
    pub(in crate::kernels::int8) fn maxpool2x2(
        self,
        x: &[i8],
        w: usize,
        pairs: usize,
        y: &mut [i8],
        idx: &mut [u8],
    ) {
        // SAFETY: `self` proves AVX2 is available.
        unsafe { fwd(x, w, pairs, y, idx) }
    }
    pub(in crate::kernels::int8) fn maxpool2x2_grad(
        self,
        dy: &[i8],
        idx: &[u8],
        w: usize,
        pairs: usize,
        dx: &mut [i8],
    ) {
        // SAFETY: `self` proves AVX2 is available.
        unsafe { grad(dy, idx, w, pairs, dx) }
    }
}

/// The `pshufb` mask that sorts a 16-byte lane of pairs of width `w` (2, 4 or 8) into
/// `[top-left ×4, top-right ×4, bottom-left ×4, bottom-right ×4]` of its four windows.
fn lane_mask(w: usize) -> [i8; 16] {
    let mut m = [0i8; 16];
    let ow = w / 2;
    for o in 0..4 {
        let base = (o / ow) * 2 * w + 2 * (o % ow);
        for (e, off) in [0, 1, w, w + 1].into_iter().enumerate() {
            m[4 * e + o] = (base + off) as i8;
        }
    }
    m
}

/// Maximum and index (as bytes) of 8 windows given their four elements.
#[inline]
#[target_feature(enable = "avx2")]
fn window_max(a0: __m128i, a1: __m128i, b0: __m128i, b1: __m128i) -> (__m128i, __m128i) {
    let m = _mm_max_epi8(_mm_max_epi8(a0, a1), _mm_max_epi8(b0, b1));
    let mut i = _mm_set1_epi8(3);
    i = _mm_blendv_epi8(i, _mm_set1_epi8(2), _mm_cmpeq_epi8(b0, m));
    i = _mm_blendv_epi8(i, _mm_set1_epi8(1), _mm_cmpeq_epi8(a1, m));
    i = _mm_blendv_epi8(i, _mm_setzero_si128(), _mm_cmpeq_epi8(a0, m));
    (m, i)
}

#[target_feature(enable = "avx2")]
fn fwd(x: &[i8], w: usize, pairs: usize, y: &mut [i8], idx: &mut [u8]) {
    let ow = w / 2;
    assert!(
        w.is_multiple_of(2)
            && x.len() >= pairs * 2 * w
            && y.len() >= pairs * ow
            && idx.len() >= pairs * ow,
        "maxpool2x2: bad shape"
    );
    let (xp, yp, ip) = (x.as_ptr(), y.as_mut_ptr(), idx.as_mut_ptr());
    let done = if matches!(w, 2 | 4 | 8) {
        // 32 bytes hold 32 / 2w pairs = 8 windows.
        let per = 32 / (2 * w);
        let full = pairs / per;
        let lm = lane_mask(w);
        // SAFETY: reads the 16 bytes of `lm`.
        let m = unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(lm.as_ptr().cast())) };
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for g in 0..full {
            // SAFETY: reads x[32g..32g + 32], within pairs·2w = full·32 + … ≤ x.len(); writes 8 bytes
            // at 8g of y and idx, within pairs·ow ≥ full·8 (asserted above).
            unsafe {
                let v = _mm256_loadu_si256(xp.add(32 * g).cast());
                // [l0.A0 l1.A0 l0.A1 l1.A1 | l0.B0 l1.B0 l0.B1 l1.B1] (dwords of four windows).
                let s = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(v, m), order);
                let (a, b) = (_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
                let (mx, ix) = window_max(a, _mm_srli_si128::<8>(a), b, _mm_srli_si128::<8>(b));
                _mm_storel_epi64(yp.add(8 * g).cast(), mx);
                _mm_storel_epi64(ip.add(8 * g).cast(), ix);
            }
        }
        full * per
    } else if w.is_multiple_of(16) {
        let eo = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
        for k in 0..pairs {
            for c in (0..w).step_by(16) {
                // SAFETY: reads 16 bytes at k·2w + c and at k·2w + w + c (c + 16 ≤ w), inside
                // pairs·2w ≤ x.len(); writes 8 bytes at k·ow + c/2 (c/2 + 8 ≤ ow) of y and idx.
                unsafe {
                    let t = _mm_shuffle_epi8(_mm_loadu_si128(xp.add(k * 2 * w + c).cast()), eo);
                    let b = _mm_shuffle_epi8(_mm_loadu_si128(xp.add(k * 2 * w + w + c).cast()), eo);
                    let (mx, ix) = window_max(t, _mm_srli_si128::<8>(t), b, _mm_srli_si128::<8>(b));
                    _mm_storel_epi64(yp.add(k * ow + c / 2).cast(), mx);
                    _mm_storel_epi64(ip.add(k * ow + c / 2).cast(), ix);
                }
            }
        }
        pairs
    } else {
        0
    };
    maxpool2x2_portable(x, w, done, pairs, y, idx);
}

/// The derivative values of 8 windows placed at their indices: (values, mask) for the elements
/// top-left, top-right, bottom-left, bottom-right, each 8 bytes in the low half.
#[inline]
#[target_feature(enable = "avx2")]
fn spread(d: __m128i, i: __m128i) -> [(__m128i, __m128i); 4] {
    let mut out = [(_mm_setzero_si128(), _mm_setzero_si128()); 4];
    for (e, o) in out.iter_mut().enumerate() {
        let hit = _mm_cmpeq_epi8(i, _mm_set1_epi8(e as i8));
        *o = (_mm_and_si128(d, hit), hit);
    }
    out
}

/// `clamp(dx + v, −127, 127)` where `hit`, `dx` elsewhere.
#[inline]
#[target_feature(enable = "avx2")]
fn add_at(dx: __m256i, v: __m256i, hit: __m256i) -> __m256i {
    let sum = _mm256_max_epi8(_mm256_adds_epi8(dx, v), _mm256_set1_epi8(-127));
    _mm256_blendv_epi8(dx, sum, hit)
}

#[target_feature(enable = "avx2")]
fn grad(dy: &[i8], idx: &[u8], w: usize, pairs: usize, dx: &mut [i8]) {
    let ow = w / 2;
    assert!(
        w.is_multiple_of(2)
            && dx.len() >= pairs * 2 * w
            && dy.len() >= pairs * ow
            && idx.len() >= pairs * ow,
        "maxpool2x2_grad: bad shape"
    );
    let (dp, ip, xp) = (dy.as_ptr(), idx.as_ptr(), dx.as_mut_ptr());
    let done = if matches!(w, 2 | 4 | 8) {
        let per = 32 / (2 * w);
        let full = pairs / per;
        // The inverse of the forward's sort: lane byte j of the sorted order goes back to lm[j].
        let lm = lane_mask(w);
        let mut inv = [0i8; 16];
        for (j, &src) in lm.iter().enumerate() {
            inv[src as usize] = j as i8;
        }
        // SAFETY: reads the 16 bytes of `inv`.
        let m = unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(inv.as_ptr().cast())) };
        let order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
        let unsort = |a: __m128i, b: __m128i, c: __m128i, d: __m128i| {
            // [A0 (8) A1 (8) | B0 (8) B1 (8)] → lanes of four windows' dwords → pair order.
            let s = _mm256_setr_m128i(_mm_unpacklo_epi64(a, b), _mm_unpacklo_epi64(c, d));
            _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(s, order), m)
        };
        for g in 0..full {
            // SAFETY: reads 8 bytes at 8g of dy and idx (within pairs·ow ≥ full·8) and reads and
            // writes dx[32g..32g + 32] (within pairs·2w ≥ full·32), asserted above.
            unsafe {
                let d = _mm_loadl_epi64(dp.add(8 * g).cast());
                let i = _mm_loadl_epi64(ip.add(8 * g).cast());
                let [(v0, h0), (v1, h1), (v2, h2), (v3, h3)] = spread(d, i);
                let (v, hit) = (unsort(v0, v1, v2, v3), unsort(h0, h1, h2, h3));
                let p = xp.add(32 * g);
                let x = _mm256_loadu_si256(p.cast());
                _mm256_storeu_si256(p.cast(), add_at(x, v, hit));
            }
        }
        full * per
    } else if w.is_multiple_of(16) {
        // Even / odd columns back to their places: [e0..e7 | o0..o7] → e0 o0 e1 o1 …
        for k in 0..pairs {
            for c in (0..w).step_by(16) {
                // SAFETY: reads 8 bytes at k·ow + c/2 of dy and idx (c/2 + 8 ≤ ow), reads and writes
                // 16 bytes at k·2w + c and k·2w + w + c of dx (c + 16 ≤ w), all within the asserted
                // lengths.
                unsafe {
                    let d = _mm_loadl_epi64(dp.add(k * ow + c / 2).cast());
                    let i = _mm_loadl_epi64(ip.add(k * ow + c / 2).cast());
                    let [(v0, h0), (v1, h1), (v2, h2), (v3, h3)] = spread(d, i);
                    let (vt, ht) = (_mm_unpacklo_epi8(v0, v1), _mm_unpacklo_epi8(h0, h1));
                    let (vb, hb) = (_mm_unpacklo_epi8(v2, v3), _mm_unpacklo_epi8(h2, h3));
                    for (off, v, h) in [(c, vt, ht), (w + c, vb, hb)] {
                        let p = xp.add(k * 2 * w + off);
                        let x = _mm256_castsi128_si256(_mm_loadu_si128(p.cast()));
                        let r = add_at(x, _mm256_castsi128_si256(v), _mm256_castsi128_si256(h));
                        _mm_storeu_si128(p.cast(), _mm256_castsi256_si128(r));
                    }
                }
            }
        }
        pairs
    } else {
        0
    };
    maxpool2x2_grad_portable(dy, idx, w, done, pairs, dx);
}
