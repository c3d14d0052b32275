//! NEON [`igemm_pairs`](crate::kernels::int8::igemm_pairs) (4×16 register tiles: a depth-pair word of A
//! narrowed to the bytes `[lo, hi] ×4`, times 8 pairs of B with `smull`/`smull2`, pairs summed into i32
//! by `sadalp`), [`igemm_dot`](crate::kernels::int8::igemm_dot) (4×2 blocks of outputs, lanes along the
//! depth: `sdot` with `dotprod`, else `smull` + `sadalp`; lanes summed by `addv` at the end) and the
//! flat-convolution im2col writers (`and` with the column masks; `st2` interleaves the pair rows). All
//! give the portable result bit for bit: every product of two i8 is exact in i16, every partial sum is
//! exact modulo 2^32 and the additions wrap in every version.
//!
//! Every `unsafe` block reads and writes only inside slices whose lengths were asserted in the same
//! function (the block says which assertion); NEON is baseline on aarch64, and the `sdot` functions are
//! reachable only through a [`Dot`](super::Dot) value, made after the feature check.
use core::arch::aarch64::*;

use super::super::pairs::{dot_portable, pairs_portable, seg_addressable, Dot, FlatTaps, Pairs};

/// Rows of a register tile (both products).
const MR: usize = 4;

pub(in crate::kernels::int8) fn pairs(p: &Pairs, a: &[i32], b: &[i8], c: &mut [i32]) {
    // SAFETY: NEON is part of the aarch64 baseline.
    unsafe { pairs_neon(p, a, b, c) }
}

#[target_feature(enable = "neon")]
fn pairs_neon(p: &Pairs, a: &[i32], b: &[i8], c: &mut [i32]) {
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
/// column's pair, `c` at its first element. `t` = (kp ≥ 1, lda, ldb, ldc, accumulate). Four pairs at a
/// time, each row's four words are loaded once and narrowed (`xtn`) to the bytes `[lo, hi]` of each pair;
/// per pair, `dup` (by 16-bit lane) spreads a row's `[lo, hi]` over a register, and per 16 bytes of B
/// (8 columns) `smull` and `smull2` multiply it, `sadalp` adding each column's two products to its i32
/// lane. The last `kp % 4` pairs load their word with `ld1r`.
#[inline]
#[target_feature(enable = "neon")]
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
    // acc[r][2v + h]: row r, columns 8v + 4h .. 8v + 4h + 4.
    let mut s = [[vdupq_n_s32(0); 4]; R];
    let (ap, bp) = (a.as_ptr(), b.as_ptr());
    let k4 = kp / 4 * 4;
    for q in (0..k4).step_by(4) {
        // Row r's words q .. q + 4 narrowed to bytes: [lo, hi] of pair q + u in 16-bit lane u.
        let w: [int16x4_t; R] = core::array::from_fn(|r| {
            // SAFETY: the 4 i32 at r·lda + q end by r·lda + k4 ≤ (R−1)·lda + kp ≤ a.len() (asserted).
            let v = unsafe { vld1q_s32(ap.add(r * lda + q)) };
            vreinterpret_s16_s8(vmovn_s16(vreinterpretq_s16_s32(v)))
        });
        // SAFETY (each): pair q + u < kp, so `pair_step`'s B reads end by (kp−1)·ldb + 16·NV ≤ b.len().
        unsafe {
            pair_step::<R, NV>(&mut s, bp.add(q * ldb), |r| vdupq_lane_s16::<0>(w[r]));
            pair_step::<R, NV>(&mut s, bp.add((q + 1) * ldb), |r| vdupq_lane_s16::<1>(w[r]));
            pair_step::<R, NV>(&mut s, bp.add((q + 2) * ldb), |r| vdupq_lane_s16::<2>(w[r]));
            pair_step::<R, NV>(&mut s, bp.add((q + 3) * ldb), |r| vdupq_lane_s16::<3>(w[r]));
        }
    }
    for q in k4..kp {
        // SAFETY: the i32 at r·lda + q < (R−1)·lda + kp ≤ a.len(), and B as in the loop above.
        unsafe {
            pair_step::<R, NV>(&mut s, bp.add(q * ldb), |r| {
                let v = vld1q_dup_s32(ap.add(r * lda + q));
                vreinterpretq_s16_s8(vcombine_s8(
                    vmovn_s16(vreinterpretq_s16_s32(v)),
                    vmovn_s16(vreinterpretq_s16_s32(v)),
                ))
            });
        }
    }
    for (r, row) in s.iter().enumerate() {
        for (h, &x) in row.iter().enumerate().take(2 * NV) {
            // SAFETY: 4 i32 at r·ldc + 4h, which end by (R−1)·ldc + 8·NV ≤ c.len() (asserted above).
            unsafe {
                let pc = c.as_mut_ptr().add(r * ldc + 4 * h);
                let x = if accumulate {
                    vaddq_s32(x, vld1q_s32(pc))
                } else {
                    x
                };
                vst1q_s32(pc, x);
            }
        }
    }
}

/// One depth pair of [`pairs_tile`]: `s[r] += [lo, hi] of row r · the 8·NV pairs at `bp``, with
/// `pair(r)` row r's `[lo, hi]` spread over 16-bit lanes.
///
/// # Safety
/// `bp` readable for `16·NV` bytes.
#[inline(always)]
unsafe fn pair_step<const R: usize, const NV: usize>(
    s: &mut [[int32x4_t; 4]; R],
    bp: *const i8,
    pair: impl Fn(usize) -> int16x8_t,
) {
    // SAFETY: NEON is part of the aarch64 baseline (this helper is always inlined into `pairs_tile`,
    // which enables it); the loads read the caller's 16·NV bytes at `bp`, the rest is registers only.
    unsafe {
        let bv: [int8x16_t; NV] = core::array::from_fn(|v| vld1q_s8(bp.add(16 * v)));
        for (r, row) in s.iter_mut().enumerate() {
            let x = vreinterpretq_s8_s16(pair(r));
            for (v, &y) in bv.iter().enumerate() {
                row[2 * v] = vpadalq_s16(row[2 * v], vmull_s8(vget_low_s8(x), vget_low_s8(y)));
                row[2 * v + 1] = vpadalq_s16(row[2 * v + 1], vmull_high_s8(x, y));
            }
        }
    }
}

/// Columns of a dot block.
const NC: usize = 2;

/// [`igemm_dot`](crate::kernels::int8::igemm_dot) with `smull` + `sadalp` (`SDOT` false) or `sdot`
/// (`SDOT` true: the caller guarantees the `dotprod` extension).
#[inline]
#[target_feature(enable = "neon")]
fn dot_neon<const SDOT: bool>(p: &Dot, a: &[i8], b: &[i8], c: &mut [i32]) {
    if p.segs == 0 || p.len == 0 {
        return dot_portable(p, a, b, c);
    }
    for i0 in (0..p.m).step_by(MR) {
        let rows = MR.min(p.m - i0);
        for j0 in (0..p.n).step_by(NC) {
            let (at, bt) = (&a[i0 * p.a_rs..], &b[j0 * p.b_rs..]);
            let ct = &mut c[i0 * p.ldc + j0..];
            match (rows, NC.min(p.n - j0)) {
                (4, 2) => dot_block::<4, 2, SDOT>(p, at, bt, ct),
                (3, 2) => dot_block::<3, 2, SDOT>(p, at, bt, ct),
                (2, 2) => dot_block::<2, 2, SDOT>(p, at, bt, ct),
                (1, 2) => dot_block::<1, 2, SDOT>(p, at, bt, ct),
                (4, _) => dot_block::<4, 1, SDOT>(p, at, bt, ct),
                (3, _) => dot_block::<3, 1, SDOT>(p, at, bt, ct),
                (2, _) => dot_block::<2, 1, SDOT>(p, at, bt, ct),
                (_, _) => dot_block::<1, 1, SDOT>(p, at, bt, ct),
            }
        }
    }
}

pub(in crate::kernels::int8) fn dot(p: &Dot, a: &[i8], b: &[i8], c: &mut [i32]) {
    // SAFETY: NEON is part of the aarch64 baseline.
    unsafe { dot_neon::<false>(p, a, b, c) }
}

/// `dot` with `sdot`.
#[target_feature(enable = "neon,dotprod")]
fn dot_sdot(p: &Dot, a: &[i8], b: &[i8], c: &mut [i32]) {
    dot_neon::<true>(p, a, b, c)
}

impl super::Dot {
    pub(in crate::kernels::int8) fn dot(self, p: &Dot, a: &[i8], b: &[i8], c: &mut [i32]) {
        // SAFETY: `self` proves the CPU has `dotprod`.
        unsafe { dot_sdot(p, a, b, c) }
    }
}

/// `acc += Σ_{4 bytes} a·b` per i32 lane (`sdot`, vector form). Inline assembly because the
/// `vdotq_s32` intrinsic is still unstable in Rust 1.95; only reached from `dotprod` code.
#[inline]
#[target_feature(enable = "neon")]
fn sdot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: register-only instruction; callers run only where `dotprod` was detected (`dot_sdot`,
    // reachable through `super::Dot` alone).
    unsafe {
        core::arch::asm!(
            // The directive lets the assembler accept `sdot` whatever function this is inlined into.
            ".arch_extension dotprod",
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags),
        )
    };
    acc
}

/// `R × C` outputs of [`igemm_dot`](crate::kernels::int8::igemm_dot) over every segment: `a` starts at
/// the block's first row, `b` at its first column, `c` at its first element. 16 depth steps per
/// instruction group, then 8, then a scalar tail; the lanes are summed once per output.
#[inline]
#[target_feature(enable = "neon")]
fn dot_block<const R: usize, const C: usize, const SDOT: bool>(
    p: &Dot,
    a: &[i8],
    b: &[i8],
    c: &mut [i32],
) {
    let (len, segs) = (p.len, p.segs);
    assert!(
        seg_addressable(a.len(), segs, p.a_ss, R, p.a_rs, len)
            && seg_addressable(b.len(), segs, p.b_ss, C, p.b_rs, len)
            && c.len() >= (R - 1) * p.ldc + C,
        "dot block out of bounds"
    );
    let mut s = [[vdupq_n_s32(0); C]; R];
    let mut tail = [[0i32; C]; R];
    let (ap, bp) = (a.as_ptr(), b.as_ptr());
    let (l16, l8) = (len / 16 * 16, len / 8 * 8);
    for seg in 0..segs {
        // Row r of segment seg starts at seg·a_ss + r·a_rs and holds `len` bytes, inside `a` by the
        // assertion above (likewise for `b`); the loads below read [d, d + 16) or [d, d + 8) of them,
        // d + 16 ≤ l16 ≤ len or d + 8 ≤ l8 ≤ len.
        let oa: [usize; R] = core::array::from_fn(|r| seg * p.a_ss + r * p.a_rs);
        let ob: [usize; C] = core::array::from_fn(|j| seg * p.b_ss + j * p.b_rs);
        for d in (0..l16).step_by(16) {
            // SAFETY: see the comment above the loop.
            let av: [int8x16_t; R] =
                core::array::from_fn(|r| unsafe { vld1q_s8(ap.add(oa[r] + d)) });
            for (j, &o) in ob.iter().enumerate() {
                // SAFETY: see the comment above the loop.
                let y = unsafe { vld1q_s8(bp.add(o + d)) };
                for (row, &x) in s.iter_mut().zip(&av) {
                    row[j] = if SDOT {
                        sdot(row[j], x, y)
                    } else {
                        let lo = vmull_s8(vget_low_s8(x), vget_low_s8(y));
                        vpadalq_s16(vpadalq_s16(row[j], lo), vmull_high_s8(x, y))
                    };
                }
            }
        }
        if l16 < l8 {
            // SAFETY: see the comment above the loop (8 bytes at l16, l16 + 8 = l8 ≤ len).
            let av: [int8x8_t; R] =
                core::array::from_fn(|r| unsafe { vld1_s8(ap.add(oa[r] + l16)) });
            for (j, &o) in ob.iter().enumerate() {
                // SAFETY: as above.
                let y = unsafe { vld1_s8(bp.add(o + l16)) };
                for (row, &x) in s.iter_mut().zip(&av) {
                    row[j] = vpadalq_s16(row[j], vmull_s8(x, y));
                }
            }
        }
        if l8 < len {
            for (trow, &o) in tail.iter_mut().zip(&oa) {
                let ar = &a[o + l8..o + len];
                for (t, &q) in trow.iter_mut().zip(&ob) {
                    for (&x, &y) in ar.iter().zip(&b[q + l8..q + len]) {
                        *t = t.wrapping_add(i32::from(x) * i32::from(y));
                    }
                }
            }
        }
    }
    for (r, (row, trow)) in s.iter().zip(&tail).enumerate() {
        let dst = &mut c[r * p.ldc..r * p.ldc + C];
        for ((o, &x), &t) in dst.iter_mut().zip(row).zip(trow) {
            // `addv` wraps like the portable sum.
            let v = vaddvq_s32(x).wrapping_add(t);
            *o = if p.accumulate { o.wrapping_add(v) } else { v };
        }
    }
}

/// Every row of the taps, 16 columns at a time for every sample (the mask loaded once per 16).
pub(in crate::kernels::int8) fn im2col(
    t: &FlatTaps,
    samples: usize,
    src: &[i8],
    masks: &[i8],
    dst: &mut [i8],
    ld: usize,
) {
    // SAFETY: NEON is part of the aarch64 baseline.
    unsafe { im2col_neon(t, samples, src, masks, dst, ld) }
}

#[target_feature(enable = "neon")]
fn im2col_neon(t: &FlatTaps, samples: usize, src: &[i8], masks: &[i8], dst: &mut [i8], ld: usize) {
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
            let k = unsafe { vld1q_s8(mp.add(m + i)) };
            for s in 0..samples {
                // SAFETY: the read ends by a + s·sample + p ≤ src.len() (`fits` bounds every row of
                // every sample); the write ends by r·ld + s·p + p ≤ (rows−1)·ld + samples·p ≤ dst.len().
                unsafe {
                    let v = vld1q_s8(sp.add(a + s * t.sample + i));
                    vst1q_s8(dp.add(r * ld + s * p + i), vandq_s8(v, k));
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

/// Every pair of rows of the taps, interleaved (`st2`) 16 columns at a time for every sample.
pub(in crate::kernels::int8) fn im2col_pairs(
    t: &FlatTaps,
    samples: usize,
    src: &[i8],
    masks: &[i8],
    dst: &mut [i8],
    ld2: usize,
) {
    // SAFETY: NEON is part of the aarch64 baseline.
    unsafe { im2col_pairs_neon(t, samples, src, masks, dst, ld2) }
}

#[target_feature(enable = "neon")]
fn im2col_pairs_neon(
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
                let kb = if second {
                    vld1q_s8(mp.add(mb + i))
                } else {
                    vdupq_n_s8(0)
                };
                (vld1q_s8(mp.add(ma + i)), kb)
            };
            let (mut xa, mut xb, mut d) = (a + i, b + i, row + 2 * i);
            for _ in 0..samples {
                // SAFETY: reads end by a + s·sample + p and b + s·sample + p ≤ src.len() (`fits`);
                // the 32-byte write ends by q·ld2 + 2·s·p + 2p ≤ (kp−1)·ld2 + 2·samples·p ≤ dst.len().
                unsafe {
                    let x = vandq_s8(vld1q_s8(sp.add(xa)), ka);
                    let y = vandq_s8(vld1q_s8(sp.add(xb)), kb);
                    vst2q_s8(dp.add(d), int8x16x2_t(x, y));
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
