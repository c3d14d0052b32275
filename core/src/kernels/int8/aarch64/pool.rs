//! NEON [`maxpool2x2`](crate::kernels::int8::pool::maxpool2x2) and its backward, 8 windows per step.
//! Pair widths 2, 4 and 8 load 32 bytes (whole pairs) and sort them into the windows' four elements with
//! two `tbl` lookups; widths that are multiples of 16 load 16 columns of both rows with `ld2` (even and
//! odd columns apart). The maximum is `smax` of the four, its index the first element equal to it; the
//! backward adds (saturating, then clamped to −127) where the index says, like the portable loops.
//!
//! Every `unsafe` block reads and writes only inside slices whose lengths were asserted in the same
//! function (the block says which assertion); NEON is baseline on aarch64.
use core::arch::aarch64::*;

use super::super::pool::{maxpool2x2_grad_portable, maxpool2x2_portable};

/// For a 32-byte group of pairs of width `w` (2, 4 or 8; 8 windows): the byte offsets of the windows'
/// elements, `[top-left ×8, top-right ×8]` and `[bottom-left ×8, bottom-right ×8]`.
fn sort_tables(w: usize) -> ([u8; 16], [u8; 16]) {
    let ow = w / 2;
    let (mut top, mut bottom) = ([0u8; 16], [0u8; 16]);
    for o in 0..8 {
        let base = (o / ow) * 2 * w + 2 * (o % ow);
        top[o] = base as u8;
        top[8 + o] = (base + 1) as u8;
        bottom[o] = (base + w) as u8;
        bottom[8 + o] = (base + w + 1) as u8;
    }
    (top, bottom)
}

/// For a 32-byte group of pairs of width `w` (2, 4 or 8): each byte's window (0..8) and its element in
/// the window (0 top-left, 1 top-right, 2 bottom-left, 3 bottom-right).
fn spread_tables(w: usize) -> ([u8; 32], [u8; 32]) {
    let ow = w / 2;
    let (mut win, mut elem) = ([0u8; 32], [0u8; 32]);
    for pos in 0..32 {
        let (pair, within) = (pos / (2 * w), pos % (2 * w));
        let (row, col) = (within / w, within % w);
        win[pos] = (pair * ow + col / 2) as u8;
        elem[pos] = (2 * row + col % 2) as u8;
    }
    (win, elem)
}

/// Maximum and index of 8 windows given their four elements.
#[inline]
#[target_feature(enable = "neon")]
fn window_max(a0: int8x8_t, a1: int8x8_t, b0: int8x8_t, b1: int8x8_t) -> (int8x8_t, uint8x8_t) {
    let m = vmax_s8(vmax_s8(a0, a1), vmax_s8(b0, b1));
    let mut i = vdup_n_u8(3);
    i = vbsl_u8(vceq_s8(b0, m), vdup_n_u8(2), i);
    i = vbsl_u8(vceq_s8(a1, m), vdup_n_u8(1), i);
    i = vbsl_u8(vceq_s8(a0, m), vdup_n_u8(0), i);
    (m, i)
}

/// `clamp(dx + v, −127, 127)` where `hit`, `dx` elsewhere (`dx`, `v` in −128..=127: the saturating sum
/// is the true sum clamped to −128..=127).
#[inline]
#[target_feature(enable = "neon")]
fn add_at(dx: int8x16_t, v: int8x16_t, hit: uint8x16_t) -> int8x16_t {
    let sum = vmaxq_s8(vqaddq_s8(dx, v), vdupq_n_s8(-127));
    vbslq_s8(hit, sum, dx)
}

pub(in crate::kernels::int8) fn maxpool2x2(
    x: &[i8],
    w: usize,
    pairs: usize,
    y: &mut [i8],
    idx: &mut [u8],
) {
    // SAFETY: NEON is part of the aarch64 baseline.
    unsafe { fwd(x, w, pairs, y, idx) }
}

#[target_feature(enable = "neon")]
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
        let (top, bottom) = sort_tables(w);
        // SAFETY: reads the 16 bytes of each table.
        let (tt, tb) = unsafe { (vld1q_u8(top.as_ptr()), vld1q_u8(bottom.as_ptr())) };
        for g in 0..full {
            // SAFETY: reads x[32g..32g + 32], within pairs·2w ≥ full·32 ≤ x.len(); writes 8 bytes at
            // 8g of y and idx, within pairs·ow ≥ full·8 (asserted above).
            unsafe {
                let v = vld1q_s8_x2(xp.add(32 * g));
                let s = vqtbl2q_s8(v, tt);
                let b = vqtbl2q_s8(v, tb);
                let (mx, ix) = window_max(
                    vget_low_s8(s),
                    vget_high_s8(s),
                    vget_low_s8(b),
                    vget_high_s8(b),
                );
                vst1_s8(yp.add(8 * g), mx);
                vst1_u8(ip.add(8 * g), ix);
            }
        }
        full * per
    } else if w.is_multiple_of(16) {
        for k in 0..pairs {
            for c in (0..w).step_by(16) {
                // SAFETY: reads 16 bytes at k·2w + c and at k·2w + w + c (c + 16 ≤ w), inside
                // pairs·2w ≤ x.len(); writes 8 bytes at k·ow + c/2 (c/2 + 8 ≤ ow) of y and idx.
                unsafe {
                    let t = vld2_s8(xp.add(k * 2 * w + c));
                    let b = vld2_s8(xp.add(k * 2 * w + w + c));
                    let (mx, ix) = window_max(t.0, t.1, b.0, b.1);
                    vst1_s8(yp.add(k * ow + c / 2), mx);
                    vst1_u8(ip.add(k * ow + c / 2), ix);
                }
            }
        }
        pairs
    } else {
        0
    };
    maxpool2x2_portable(x, w, done, pairs, y, idx);
}

pub(in crate::kernels::int8) fn maxpool2x2_grad(
    dy: &[i8],
    idx: &[u8],
    w: usize,
    pairs: usize,
    dx: &mut [i8],
) {
    // SAFETY: NEON is part of the aarch64 baseline.
    unsafe { grad(dy, idx, w, pairs, dx) }
}

#[target_feature(enable = "neon")]
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
        let (win, elem) = spread_tables(w);
        // SAFETY: reads the 32 bytes of each table.
        let (wt, et) = unsafe { (vld1q_u8_x2(win.as_ptr()), vld1q_u8_x2(elem.as_ptr())) };
        for g in 0..full {
            // SAFETY: reads 8 bytes at 8g of dy and idx (within pairs·ow ≥ full·8) and reads and
            // writes dx[32g..32g + 32] (within pairs·2w ≥ full·32), asserted above.
            unsafe {
                let d = vcombine_s8(vld1_s8(dp.add(8 * g)), vdup_n_s8(0));
                let i = vcombine_u8(vld1_u8(ip.add(8 * g)), vdup_n_u8(0));
                let p = xp.add(32 * g);
                let x = vld1q_s8_x2(p);
                let half = |x: int8x16_t, win: uint8x16_t, elem: uint8x16_t| {
                    let v = vqtbl1q_s8(d, win);
                    let hit = vceqq_u8(vqtbl1q_u8(i, win), elem);
                    add_at(x, v, hit)
                };
                let r = int8x16x2_t(half(x.0, wt.0, et.0), half(x.1, wt.1, et.1));
                vst1q_s8_x2(p, r);
            }
        }
        full * per
    } else if w.is_multiple_of(16) {
        // Columns 0, 1, 0, 1, …: the element a column is in its window's row.
        let parity: [u8; 16] = core::array::from_fn(|j| (j % 2) as u8);
        // SAFETY: reads the 16 bytes of `parity`.
        let top_e = unsafe { vld1q_u8(parity.as_ptr()) };
        let bottom_e = vaddq_u8(top_e, vdupq_n_u8(2));
        for k in 0..pairs {
            for c in (0..w).step_by(16) {
                // SAFETY: reads 8 bytes at k·ow + c/2 of dy and idx (c/2 + 8 ≤ ow), reads and writes
                // 16 bytes at k·2w + c and k·2w + w + c of dx (c + 16 ≤ w), all within the asserted
                // lengths.
                unsafe {
                    // Each window's value and index for both of its columns: d0 d0 d1 d1 …
                    let d = vld1_s8(dp.add(k * ow + c / 2));
                    let i = vld1_u8(ip.add(k * ow + c / 2));
                    let (d, i) = (vcombine_s8(d, d), vcombine_u8(i, i));
                    let (d, i) = (vzip1q_s8(d, d), vzip1q_u8(i, i));
                    for (off, e) in [(c, top_e), (w + c, bottom_e)] {
                        let p = xp.add(k * 2 * w + off);
                        vst1q_s8(p, add_at(vld1q_s8(p), d, vceqq_u8(i, e)));
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
