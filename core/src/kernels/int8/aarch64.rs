//! aarch64 int8 kernels: NEON `smull`/`sadalp` (4×16, pairs summed straight into i32: exact) and, with the
//! `dotprod` extension, `sdot` (4×16); plus NEON `max_abs`, rescaling and input quantisation, and (in
//! [`pairs`], [`pool`]) the packing-free products, the flat-convolution im2col writers and 2×2 max
//! pooling. NEON is part of the aarch64 baseline, so only `Dot` needs a CPU check.
//!
//! Every `unsafe` block reads and writes only inside slices whose lengths were checked (by slicing) in the
//! same function; the `dotprod` functions are only reachable through a [`Dot`] value, made by `new()`
//! after the feature check.
use core::arch::aarch64::*;

pub(super) mod pairs;
pub(super) mod pool;

use super::{
    quantize_portable, rescale_portable, store_tile, Kernel, Piece, Rounding, Spec, Tile,
    SPEC_NEON, SPEC_NEON_DOT,
};

/// NEON (always present on aarch64).
#[derive(Clone, Copy, Debug)]
pub(super) struct Neon;

/// Proof that the CPU has the `dotprod` extension.
#[derive(Clone, Copy, Debug)]
pub(super) struct Dot(());

impl Dot {
    pub(super) fn new() -> Option<Self> {
        #[cfg(any(feature = "std", test))]
        let ok = std::arch::is_aarch64_feature_detected!("dotprod");
        #[cfg(not(any(feature = "std", test)))]
        let ok = cfg!(target_feature = "dotprod");
        ok.then_some(Self(()))
    }
}

const N_MR: usize = SPEC_NEON.mr;
const N_NR: usize = SPEC_NEON.nr;

impl Kernel for Neon {
    const SPEC: Spec = SPEC_NEON;
    fn tile(self, t: &Tile<'_>, c: &mut [i32]) {
        let groups = Self::SPEC.groups(t.kc);
        // Per group: A holds MR pairs (8 bytes), B holds NR pairs (32 bytes).
        let a = &t.a[..groups * N_MR * 2];
        let b = &t.b[..groups * N_NR * 2];
        // SAFETY: NEON is baseline on aarch64; all intrinsics are register-only except the loads, whose
        // addresses are in bounds below.
        let mut acc = [[unsafe { vdupq_n_s32(0) }; 4]; N_MR];
        for q in 0..groups {
            // SAFETY: B loads read bytes q·32 .. q·32 + 32 ≤ groups·32 = b.len(); the A pair is 2 bytes
            // at q·8 + 2r, + 2 ≤ groups·8 = a.len() (lengths fixed by the slicing above).
            unsafe {
                let bp = b.as_ptr().add(q * 32);
                let b0 = vld1q_s8(bp);
                let b1 = vld1q_s8(bp.add(16));
                for (r, row) in acc.iter_mut().enumerate() {
                    let pair = a.as_ptr().add(q * 8 + 2 * r).cast::<i16>().read_unaligned();
                    let x = vreinterpretq_s8_s16(vdupq_n_s16(pair));
                    row[0] = vpadalq_s16(row[0], vmull_s8(vget_low_s8(x), vget_low_s8(b0)));
                    row[1] = vpadalq_s16(row[1], vmull_high_s8(x, b0));
                    row[2] = vpadalq_s16(row[2], vmull_s8(vget_low_s8(x), vget_low_s8(b1)));
                    row[3] = vpadalq_s16(row[3], vmull_high_s8(x, b1));
                }
            }
        }
        let mut tmp = [0i32; N_MR * N_NR];
        for (r, row) in acc.iter().enumerate() {
            for (v, &x) in row.iter().enumerate() {
                // SAFETY: 4 i32 at r·16 + 4v, + 4 ≤ 64 = tmp.len().
                unsafe { vst1q_s32(tmp.as_mut_ptr().add(r * N_NR + 4 * v), x) };
            }
        }
        store_tile(t, N_NR, &tmp, c);
    }
}

/// `acc += sdot(b, a[lane])`: each i32 lane of `acc` gains the dot product of its 4 bytes of `b` with the
/// 4 bytes of `a`'s 32-bit lane `lane`. Inline assembly because the `vdotq_laneq_s32` intrinsic is still
/// unstable in Rust 1.95; callers enable `dotprod`.
macro_rules! sdot_lane {
    ($acc:expr, $b:expr, $a:expr, $lane:literal) => {
        core::arch::asm!(
            concat!("sdot {acc:v}.4s, {b:v}.16b, {a:v}.4b[", $lane, "]"),
            acc = inout(vreg) $acc,
            b = in(vreg) $b,
            a = in(vreg) $a,
            options(pure, nomem, nostack, preserves_flags),
        )
    };
}

#[target_feature(enable = "neon,dotprod")]
fn tile_dot(t: &Tile<'_>, c: &mut [i32]) {
    let groups = SPEC_NEON_DOT.groups(t.kc);
    // Per group: A holds 4 rows × 4 bytes (one q register), B holds 16 columns × 4 bytes (four).
    let a = &t.a[..groups * 16];
    let b = &t.b[..groups * 64];
    let mut acc = [[vdupq_n_s32(0); 4]; 4];
    for q in 0..groups {
        // SAFETY: reads 16 bytes of A at q·16 (≤ a.len()) and 4×16 bytes of B at q·64 (≤ b.len()),
        // lengths fixed by the slicing above; the `sdot` assembly touches only registers, and
        // `dotprod` is enabled on this function.
        unsafe {
            let x = vld1q_s8(a.as_ptr().add(q * 16));
            let bp = b.as_ptr().add(q * 64);
            let bv = [
                vld1q_s8(bp),
                vld1q_s8(bp.add(16)),
                vld1q_s8(bp.add(32)),
                vld1q_s8(bp.add(48)),
            ];
            for v in 0..4 {
                sdot_lane!(acc[0][v], bv[v], x, "0");
                sdot_lane!(acc[1][v], bv[v], x, "1");
                sdot_lane!(acc[2][v], bv[v], x, "2");
                sdot_lane!(acc[3][v], bv[v], x, "3");
            }
        }
    }
    let mut tmp = [0i32; 64];
    for (r, row) in acc.iter().enumerate() {
        for (v, &x) in row.iter().enumerate() {
            // SAFETY: 4 i32 at r·16 + 4v, + 4 ≤ 64 = tmp.len().
            unsafe { vst1q_s32(tmp.as_mut_ptr().add(r * 16 + 4 * v), x) };
        }
    }
    store_tile(t, 16, &tmp, c);
}

impl Kernel for Dot {
    const SPEC: Spec = SPEC_NEON_DOT;
    fn tile(self, t: &Tile<'_>, c: &mut [i32]) {
        // SAFETY: `self` proves the CPU has `dotprod`.
        unsafe { tile_dot(t, c) }
    }
}

pub(super) fn max_abs(x: &[i32]) -> u32 {
    let (chunks, tail) = x.as_chunks::<4>();
    // SAFETY: NEON is baseline; each load reads one 4-element chunk.
    let simd = unsafe {
        let mut m = vdupq_n_u32(0);
        for ch in chunks {
            // |i32::MIN| stays 0x8000_0000, right as u32.
            m = vmaxq_u32(m, vreinterpretq_u32_s32(vabsq_s32(vld1q_s32(ch.as_ptr()))));
        }
        vmaxvq_u32(m)
    };
    tail.iter().fold(simd, |a, &v| a.max(v.unsigned_abs()))
}

pub(super) fn rescale(p: Piece, src: &[i32], dst: &mut [i8]) -> usize {
    let n8 = src.len() / 8 * 8;
    let sh = p.shift as i32;
    let mut kept = 0usize;
    for (blk, (s, d)) in src[..n8]
        .chunks_exact(8)
        .zip(dst[..n8].chunks_exact_mut(8))
        .enumerate()
    {
        // SAFETY: NEON is baseline; loads read the 8 i32 of `s`, the store writes the 8 bytes of `d`.
        unsafe {
            let mut halves = [vdupq_n_s32(0); 2];
            for (h, out) in halves.iter_mut().enumerate() {
                let x = vld1q_s32(s.as_ptr().add(4 * h));
                let q = match p.rounding {
                    Rounding::Nearest => {
                        let half = vdupq_n_u32((1u32 << p.shift) >> 1);
                        let a = vaddq_u32(vreinterpretq_u32_s32(vabsq_s32(x)), half);
                        let q = vreinterpretq_s32_u32(vshlq_u32(a, vdupq_n_s32(-sh)));
                        vbslq_s32(vcltzq_s32(x), vnegq_s32(q), q)
                    }
                    Rounding::Stochastic(_) => {
                        let base = p.lo.wrapping_add((blk * 8 + 4 * h) as u32);
                        let steps = [0u32, 1, 2, 3];
                        let lo = vaddq_u32(vdupq_n_u32(base), vld1q_u32(steps.as_ptr()));
                        // super::mix32(lo ^ key), spelled out.
                        let mut v = veorq_u32(lo, vdupq_n_u32(p.key));
                        v = veorq_u32(v, vshrq_n_u32::<16>(v));
                        v = vmulq_u32(v, vdupq_n_u32(0x7feb_352d));
                        v = veorq_u32(v, vshrq_n_u32::<15>(v));
                        v = vmulq_u32(v, vdupq_n_u32(0x846c_a68b));
                        v = veorq_u32(v, vshrq_n_u32::<16>(v));
                        // USHL by −32 gives 0: the noise for shift 0.
                        let r = vshlq_u32(v, vdupq_n_s32(sh - 32));
                        let mask = vdupq_n_u32(((1u64 << p.shift) - 1) as u32);
                        let low = vandq_u32(vreinterpretq_u32_s32(x), mask);
                        let carry = vshlq_u32(vaddq_u32(low, r), vdupq_n_s32(-sh));
                        vaddq_s32(vshlq_s32(x, vdupq_n_s32(-sh)), vreinterpretq_s32_u32(carry))
                    }
                };
                let y = vminq_s32(vmaxq_s32(q, vdupq_n_s32(-127)), vdupq_n_s32(127));
                // Each equal lane is all ones: its top bit counts it.
                kept += vaddvq_u32(vshrq_n_u32::<31>(vceqq_s32(y, q))) as usize;
                *out = y;
            }
            let w = vcombine_s16(vmovn_s32(halves[0]), vmovn_s32(halves[1]));
            vst1_s8(d.as_mut_ptr(), vmovn_s16(w));
        }
    }
    let tail = Piece {
        lo: p.lo.wrapping_add(n8 as u32),
        ..p
    };
    (n8 - kept) + rescale_portable(tail, &src[n8..], &mut dst[n8..])
}

/// [`super::quantize_f32`], 16 values at a time: clamp to ±128 (NaN stays NaN and converts to 0),
/// truncate (exact for |t| ≤ 128), add ±1 where the fraction reaches ±0.5, clamp to ±127 and narrow.
pub(super) fn quantize(src: &[f32], k: f32, dst: &mut [i8]) {
    // SAFETY: NEON is part of the aarch64 baseline.
    unsafe { quantize_neon(src, k, dst) }
}

#[target_feature(enable = "neon")]
fn quantize_neon(src: &[f32], k: f32, dst: &mut [i8]) {
    assert!(dst.len() >= src.len(), "quantize: dst too short");
    let n16 = src.len() / 16 * 16;
    let (sp, dp) = (src.as_ptr(), dst.as_mut_ptr());
    let (kv, lo, hi) = (vdupq_n_f32(k), vdupq_n_f32(-128.0), vdupq_n_f32(128.0));
    let (half, mhalf) = (vdupq_n_f32(0.5), vdupq_n_f32(-0.5));
    let (l, h) = (vdupq_n_s32(-127), vdupq_n_s32(127));
    for b in (0..n16).step_by(16) {
        let q: [int32x4_t; 4] = core::array::from_fn(|j| {
            // SAFETY: reads src[b + 4j..][..4], b + 16 ≤ n16 ≤ src.len().
            let v = unsafe { vld1q_f32(sp.add(b + 4 * j)) };
            // `fmax`/`fmin` keep a NaN, `fcvtzs` turns it into 0 and the comparisons below are false.
            let t = vminq_f32(vmaxq_f32(vmulq_f32(v, kv), lo), hi);
            let i = vcvtq_s32_f32(t);
            let f = vsubq_f32(t, vcvtq_f32_s32(i));
            // Masks are −1 where true: i + [f ≥ ½] − [f ≤ −½].
            let up = vreinterpretq_s32_u32(vcgeq_f32(f, half));
            let down = vreinterpretq_s32_u32(vcleq_f32(f, mhalf));
            vminq_s32(vmaxq_s32(vaddq_s32(vsubq_s32(i, up), down), l), h)
        });
        // All lanes are in ±127: plain narrowing is exact.
        let w01 = vcombine_s16(vmovn_s32(q[0]), vmovn_s32(q[1]));
        let w23 = vcombine_s16(vmovn_s32(q[2]), vmovn_s32(q[3]));
        // SAFETY: writes dst[b..b + 16], b + 16 ≤ n16 ≤ src.len() ≤ dst.len().
        unsafe { vst1q_s8(dp.add(b), vcombine_s8(vmovn_s16(w01), vmovn_s16(w23))) };
    }
    quantize_portable(&src[n16..], k, &mut dst[n16..src.len()]);
}

/// [`super::rescale_i32_to_i8_blocks`] with nearest rounding: 8 values at a time straight from each
/// block to its place (the same rounding, clamp and count as [`rescale`]), the rest of each block by
/// the portable loop.
pub(super) fn rescale_blocks_nearest(
    src: &[i32],
    rows: usize,
    inner: usize,
    shift: u32,
    dst: &mut [i8],
) -> usize {
    // SAFETY: NEON is part of the aarch64 baseline.
    unsafe { rescale_blocks_nearest_neon(src, rows, inner, shift, dst) }
}

#[target_feature(enable = "neon")]
fn rescale_blocks_nearest_neon(
    src: &[i32],
    rows: usize,
    inner: usize,
    shift: u32,
    dst: &mut [i8],
) -> usize {
    assert!(
        shift <= 31
            && rows >= 1
            && inner >= 1
            && src.len().is_multiple_of(rows * inner)
            && dst.len() >= src.len(),
        "rescale_blocks: bad shape"
    );
    let b = src.len() / (rows * inner);
    let i8n = inner / 8 * 8;
    let p = Piece {
        shift,
        rounding: Rounding::Nearest,
        key: 0,
        lo: 0,
    };
    let half = vdupq_n_u32((1u32 << shift) >> 1);
    let right = vdupq_n_s32(-(shift as i32));
    let (lim_lo, lim_hi) = (vdupq_n_s32(-127), vdupq_n_s32(127));
    let (sp, dp) = (src.as_ptr(), dst.as_mut_ptr());
    let (mut kept, mut clamped) = (0usize, 0usize);
    for r in 0..rows {
        for j in 0..b {
            let (s0, d0) = ((r * b + j) * inner, (j * rows + r) * inner);
            for i in (0..i8n).step_by(8) {
                // SAFETY: reads src[s0 + i..][..8] and writes dst[d0 + i..][..8] with i + 8 ≤ inner,
                // inside the block (s0 + inner ≤ src.len() ≤ dst.len(), d0 + inner ≤ src.len()).
                unsafe {
                    let y: [int32x4_t; 2] = core::array::from_fn(|h| {
                        let x = vld1q_s32(sp.add(s0 + i + 4 * h));
                        // (|x| + half) >> shift in u32, then the sign of x (as `round_nearest`).
                        let a = vaddq_u32(vreinterpretq_u32_s32(vabsq_s32(x)), half);
                        let q = vreinterpretq_s32_u32(vshlq_u32(a, right));
                        let q = vbslq_s32(vcltzq_s32(x), vnegq_s32(q), q);
                        let y = vminq_s32(vmaxq_s32(q, lim_lo), lim_hi);
                        // Each equal lane is all ones: its top bit counts it.
                        kept += vaddvq_u32(vshrq_n_u32::<31>(vceqq_s32(y, q))) as usize;
                        y
                    });
                    let w = vcombine_s16(vmovn_s32(y[0]), vmovn_s32(y[1]));
                    vst1_s8(dp.add(d0 + i), vmovn_s16(w));
                }
            }
            if i8n < inner {
                clamped += rescale_portable(
                    p,
                    &src[s0 + i8n..s0 + inner],
                    &mut dst[d0 + i8n..d0 + inner],
                );
            }
        }
    }
    clamped + (rows * b * i8n - kept)
}
