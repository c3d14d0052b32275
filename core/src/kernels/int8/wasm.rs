//! wasm32 `simd128` int8 kernel (`i32x4.dot_i16x8_s` on sign-extended pairs, 4×8), `max_abs` and
//! rescaling. Compiled only with `-C target-feature=+simd128` (wasm has no run-time feature detection: a
//! module with SIMD instructions does not validate on an engine without them).
//!
//! The loads are `v128_load` on pointers into slices whose lengths are checked (by slicing) in the same
//! function, which is what every `unsafe` block relies on.
use core::arch::wasm32::*;

use super::{rescale_portable, store_tile, Kernel, Piece, Rounding, Spec, Tile, SPEC_SIMD128};

/// `simd128` (checked at compile time).
#[derive(Clone, Copy, Debug)]
pub(super) struct Simd128;

const MR: usize = SPEC_SIMD128.mr;
const NR: usize = SPEC_SIMD128.nr;

impl Kernel for Simd128 {
    const SPEC: Spec = SPEC_SIMD128;
    fn tile(self, t: &Tile<'_>, c: &mut [i32]) {
        let groups = Self::SPEC.groups(t.kc);
        // Per group: A holds MR i16 pairs (16 bytes), B holds NR i16 pairs (32 bytes).
        let a = &t.a[..groups * MR * 4];
        let b = &t.b[..groups * NR * 4];
        let mut acc = [[i32x4_splat(0); 2]; MR];
        for q in 0..groups {
            // SAFETY: B loads read bytes q·32 .. q·32 + 32 ≤ b.len(); the A pair is 4 bytes at q·16 + 4r,
            // + 4 ≤ groups·16 = a.len() (lengths fixed by the slicing above).
            unsafe {
                let bp = b.as_ptr().add(q * 32);
                let b0 = v128_load(bp.cast());
                let b1 = v128_load(bp.add(16).cast());
                for (r, row) in acc.iter_mut().enumerate() {
                    let pair = a
                        .as_ptr()
                        .add(q * 16 + 4 * r)
                        .cast::<i32>()
                        .read_unaligned();
                    let x = i32x4_splat(pair);
                    row[0] = i32x4_add(row[0], i32x4_dot_i16x8(x, b0));
                    row[1] = i32x4_add(row[1], i32x4_dot_i16x8(x, b1));
                }
            }
        }
        let mut tmp = [0i32; MR * NR];
        for (r, row) in acc.iter().enumerate() {
            for (v, &x) in row.iter().enumerate() {
                let o = r * NR + 4 * v;
                let lanes = [
                    i32x4_extract_lane::<0>(x),
                    i32x4_extract_lane::<1>(x),
                    i32x4_extract_lane::<2>(x),
                    i32x4_extract_lane::<3>(x),
                ];
                tmp[o..o + 4].copy_from_slice(&lanes);
            }
        }
        store_tile(t, NR, &tmp, c);
    }
}

pub(super) fn max_abs(x: &[i32]) -> u32 {
    let (chunks, tail) = x.as_chunks::<4>();
    let mut m = u32x4_splat(0);
    for ch in chunks {
        // SAFETY: reads the 16 bytes of one 4-element chunk.
        let v = unsafe { v128_load(ch.as_ptr().cast()) };
        // |i32::MIN| stays 0x8000_0000, right as u32.
        m = u32x4_max(m, i32x4_abs(v));
    }
    let simd = [
        u32x4_extract_lane::<0>(m),
        u32x4_extract_lane::<1>(m),
        u32x4_extract_lane::<2>(m),
        u32x4_extract_lane::<3>(m),
    ]
    .into_iter()
    .max()
    .unwrap_or(0);
    tail.iter().fold(simd, |a, &v| a.max(v.unsigned_abs()))
}

pub(super) fn rescale(p: Piece, src: &[i32], dst: &mut [i8]) -> usize {
    let n16 = src.len() / 16 * 16;
    let sh = p.shift;
    let half = u32x4_splat((1u32 << sh) >> 1);
    let mask = u32x4_splat(((1u64 << sh) - 1) as u32);
    let (lim_lo, lim_hi) = (i32x4_splat(-127), i32x4_splat(127));
    let mut kept = 0usize;
    for (blk, (s, d)) in src[..n16]
        .chunks_exact(16)
        .zip(dst[..n16].chunks_exact_mut(16))
        .enumerate()
    {
        let mut v = [i32x4_splat(0); 4];
        for (i, out) in v.iter_mut().enumerate() {
            // SAFETY: reads 4 i32 at 4i, + 4 ≤ 16 = s.len().
            let x = unsafe { v128_load(s.as_ptr().add(4 * i).cast()) };
            let q = match p.rounding {
                Rounding::Nearest => {
                    let q = u32x4_shr(i32x4_add(i32x4_abs(x), half), sh);
                    v128_bitselect(i32x4_neg(q), q, i32x4_lt(x, i32x4_splat(0)))
                }
                Rounding::Stochastic(_) => {
                    // wasm shifts count modulo 32, so the shift-0 noise (0) is special-cased.
                    let r = if sh == 0 {
                        u32x4_splat(0)
                    } else {
                        let base = p.lo.wrapping_add((blk * 16 + 4 * i) as u32);
                        let lo = i32x4_add(u32x4_splat(base), u32x4(0, 1, 2, 3));
                        // super::mix32(lo ^ key), spelled out.
                        let mut h = v128_xor(lo, u32x4_splat(p.key));
                        h = v128_xor(h, u32x4_shr(h, 16));
                        h = i32x4_mul(h, u32x4_splat(0x7feb_352d));
                        h = v128_xor(h, u32x4_shr(h, 15));
                        h = i32x4_mul(h, u32x4_splat(0x846c_a68b));
                        h = v128_xor(h, u32x4_shr(h, 16));
                        u32x4_shr(h, 32 - sh)
                    };
                    let low = v128_and(x, mask);
                    let carry = u32x4_shr(i32x4_add(low, r), sh);
                    i32x4_add(i32x4_shr(x, sh), carry)
                }
            };
            let y = i32x4_min(i32x4_max(q, lim_lo), lim_hi);
            kept += i32x4_bitmask(i32x4_eq(y, q)).count_ones() as usize;
            *out = y;
        }
        let bytes = i8x16_narrow_i16x8(
            i16x8_narrow_i32x4(v[0], v[1]),
            i16x8_narrow_i32x4(v[2], v[3]),
        );
        // SAFETY: writes the 16 bytes of `d`.
        unsafe { v128_store(d.as_mut_ptr().cast(), bytes) };
    }
    let tail = Piece {
        lo: p.lo.wrapping_add(n16 as u32),
        ..p
    };
    (n16 - kept) + rescale_portable(tail, &src[n16..], &mut dst[n16..])
}
