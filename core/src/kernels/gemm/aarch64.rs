//! aarch64 NEON f32 micro-kernel: an 8 × 12 register tile (24 accumulators of 4 lanes, 3 vectors of B,
//! 2 of A: 29 of the 32 vector registers), one `fmla v.4s, b.4s, a.s[lane]` (`vfmaq_laneq_f32`) per
//! accumulator and depth step, so 8 FLOPs per instruction with the loads of A (2 vectors) and B (3) on top.
//! NEON is part of the aarch64 baseline: the kernel needs no CPU check.
//!
//! Both operands are always packed (A into 8-row panels, zero-filled past the edge; B into 12-column
//! panels, the last one 4, 8 or 12 wide and zero-filled): the kernel then loads whole vectors only, and
//! rows past the tile's height are computed on zeros and not stored. A row-major A (depth contiguous) is
//! packed by 4×4 register transposes, contiguous rows of B by 4-element vector copies.
//!
//! Fused multiply-add rounds once per product where the portable kernel rounds twice; both are within
//! the conformance suite's `γ_{k+1}` bound of the reference (see the tests), not bit-identical to each
//! other.
//!
//! Soundness: every raw-pointer access is inside a slice whose length was asserted (or fixed by
//! `chunks_exact`) in the same function; each `unsafe` block says which check covers it.
use core::arch::aarch64::*;

use super::{pack_b_panels, Kernel, Spec, Tile, SPEC_NEON};

/// Rows of the register tile (height of a packed A panel).
const MR: usize = SPEC_NEON.mr;
/// Columns of the register tile (width of a full packed B panel).
const NR: usize = SPEC_NEON.nr;

/// The NEON kernel family (a unit value: NEON is baseline on aarch64).
#[derive(Clone, Copy, Debug)]
pub(super) struct Neon;

/// Packs `lanes` lanes (stride `ls`) × `kc` depth (stride `ps`) from `src[base..]` into `dst` with lane
/// stride 1 and depth stride `w` (a multiple of 4, ≥ `lanes`), zero-filling lanes `lanes..w`. Contiguous
/// lanes are copied 4 at a time as fixed-size arrays (vector moves, no `memcpy` call per depth step);
/// anything else is gathered element by element. Safe code: every index is bounds-checked.
#[allow(clippy::too_many_arguments)]
fn pack_panel(
    src: &[f32],
    base: usize,
    ls: usize,
    ps: usize,
    lanes: usize,
    w: usize,
    kc: usize,
    dst: &mut [f32],
) {
    debug_assert!(w.is_multiple_of(4) && lanes <= w);
    for (p, d) in dst.chunks_exact_mut(w).take(kc).enumerate() {
        let s0 = base + p * ps;
        if ls == 1 {
            let s = &src[s0..s0 + lanes];
            let (d4, _) = d.as_chunks_mut::<4>();
            let (s4, tail) = s.as_chunks::<4>();
            for (x, y) in d4.iter_mut().zip(s4) {
                *x = *y;
            }
            let done = 4 * s4.len();
            d[done..done + tail.len()].copy_from_slice(tail);
            d[lanes..].fill(0.0);
        } else {
            for (l, x) in d[..lanes].iter_mut().enumerate() {
                *x = src[s0 + l * ls];
            }
            d[lanes..].fill(0.0);
        }
    }
}

/// Packs a full A panel whose depth is contiguous (`ps == 1`, A row-major): 8 rows (stride `ls`) ×
/// `kc` depth from `src[base..]` into `dst[p·8 + r]`, by 4×4 register transposes (`trn1`/`trn2`) for
/// the depth steps that are a multiple of 4 and element by element for the rest.
#[target_feature(enable = "neon")]
fn pack_a_rows(src: &[f32], base: usize, ls: usize, kc: usize, dst: &mut [f32]) {
    let dst = &mut dst[..MR * kc];
    let rows: [&[f32]; MR] = core::array::from_fn(|r| &src[base + r * ls..base + r * ls + kc]);
    let kc4 = kc / 4 * 4;
    for (q, d) in dst[..MR * kc4].chunks_exact_mut(4 * MR).enumerate() {
        let p = 4 * q;
        // SAFETY: every row slice holds `kc` elements (checked by the slicing above) and p + 4 ≤ kc4 ≤ kc,
        // so each load reads 4 elements of its row; `d` holds 4·MR = 32 elements (chunks_exact) and the
        // stores write d[8j + 4h..][..4] for j < 4, h < 2. Unaligned accesses are allowed.
        unsafe {
            for h in 0..2 {
                let r: [float32x4_t; 4] =
                    core::array::from_fn(|i| vld1q_f32(rows[4 * h + i].as_ptr().add(p)));
                let t0 = vreinterpretq_f64_f32(vtrn1q_f32(r[0], r[1]));
                let t1 = vreinterpretq_f64_f32(vtrn2q_f32(r[0], r[1]));
                let t2 = vreinterpretq_f64_f32(vtrn1q_f32(r[2], r[3]));
                let t3 = vreinterpretq_f64_f32(vtrn2q_f32(r[2], r[3]));
                let cols = [
                    vtrn1q_f64(t0, t2),
                    vtrn1q_f64(t1, t3),
                    vtrn2q_f64(t0, t2),
                    vtrn2q_f64(t1, t3),
                ];
                for (j, &c) in cols.iter().enumerate() {
                    vst1q_f32(d.as_mut_ptr().add(MR * j + 4 * h), vreinterpretq_f32_f64(c));
                }
            }
        }
    }
    for p in kc4..kc {
        for (r, row) in rows.iter().enumerate() {
            dst[p * MR + r] = row[p];
        }
    }
}

/// `C[rows×cols] (+)= A·B` for one tile over a packed A panel (`MR` rows, zero-filled) and a packed B
/// panel of width `4·NV` (zero-filled past `cols`); `4·(NV-1) < cols ≤ 4·NV`. All `MR` rows are computed,
/// `rows` stored.
#[inline(never)]
#[target_feature(enable = "neon")]
fn ukr<const NV: usize>(t: &Tile<'_>, c: &mut [f32]) {
    let (kc, ldc, rows, cols) = (t.kc, t.ldc, t.rows, t.cols);
    let w = 4 * NV;
    assert!(t.a_rs == 1 && t.a_ps == MR && t.ldb == w && t.b_padded);
    assert!((1..=MR).contains(&rows) && cols <= w && cols + 4 > w && kc >= 1);
    assert!(c.len() >= (rows - 1) * ldc + cols);
    let a = &t.a[..MR * kc];
    let b = &t.b[..w * kc];
    let z = vdupq_n_f32(0.0);
    let mut acc = [[z; NV]; MR];
    // One depth step from `$ap` (exactly MR = 8 elements of A) and `$bp` (exactly 4·NV of B). A macro,
    // not a closure: a closure borrowing `acc` keeps the accumulators in memory.
    macro_rules! step {
        ($ap:expr, $bp:expr) => {{
            let (ap, bp): (&[f32; MR], &[f32]) = ($ap, $bp);
            let bp = &bp[..w];
            // SAFETY: `ap` holds 8 elements (its type) and `bp` 4·NV (the slicing): the loads read
            // ap[0..4], ap[4..8] and bp[4v..4v + 4] for v < NV. Unaligned loads are allowed.
            let (a0, a1, bv) = unsafe {
                let a0 = vld1q_f32(ap.as_ptr());
                let a1 = vld1q_f32(ap.as_ptr().add(4));
                let bv: [float32x4_t; NV] =
                    core::array::from_fn(|v| vld1q_f32(bp.as_ptr().add(4 * v)));
                (a0, a1, bv)
            };
            macro_rules! row {
                ($r:literal, $a:ident, $lane:literal) => {
                    for (x, &y) in acc[$r].iter_mut().zip(&bv) {
                        *x = vfmaq_laneq_f32::<$lane>(*x, y, $a);
                    }
                };
            }
            row!(0, a0, 0);
            row!(1, a0, 1);
            row!(2, a0, 2);
            row!(3, a0, 3);
            row!(4, a1, 0);
            row!(5, a1, 1);
            row!(6, a1, 2);
            row!(7, a1, 3);
        }};
    }
    // Four depth steps per iteration: the loop's counter and pointer updates are paid once per 4·8·NV
    // `fmla`s.
    let (a4, _) = a.as_chunks::<{ 4 * MR }>();
    let b4 = b.chunks_exact(4 * w);
    let full = a4.len();
    for (ap, bp) in a4.iter().zip(b4) {
        let (ap, _) = ap.as_chunks::<MR>();
        for u in 0..4 {
            step!(&ap[u], &bp[u * w..]);
        }
    }
    let (ar, _) = a[full * 4 * MR..].as_chunks::<MR>();
    for (ap, bp) in ar.iter().zip(b[full * 4 * w..].chunks_exact(w)) {
        step!(ap, bp);
    }
    for (r, row) in acc.iter().enumerate().take(rows) {
        let d = &mut c[r * ldc..r * ldc + cols];
        for (v, &x) in row.iter().enumerate() {
            let d = &mut d[4 * v..];
            if d.len() >= 4 {
                // SAFETY: `d` holds at least 4 elements (checked just above); unaligned access is allowed.
                unsafe {
                    let p = d.as_mut_ptr();
                    let y = if t.acc { vaddq_f32(vld1q_f32(p), x) } else { x };
                    vst1q_f32(p, y);
                }
            } else {
                let mut tmp = [0.0f32; 4];
                // SAFETY: `tmp` holds 4 elements.
                unsafe { vst1q_f32(tmp.as_mut_ptr(), x) };
                for (o, &s) in d.iter_mut().zip(&tmp) {
                    *o = if t.acc { *o + s } else { s };
                }
            }
        }
    }
}

impl Kernel for Neon {
    const SPEC: Spec = SPEC_NEON;
    const B_IN_PLACE: bool = false;
    const A_IN_PLACE: bool = false;
    fn pack_a(
        self,
        src: &[f32],
        base: usize,
        ls: usize,
        ps: usize,
        rows: usize,
        kc: usize,
        dst: &mut [f32],
    ) {
        if ps == 1 && rows == MR {
            // SAFETY: NEON is part of the aarch64 baseline.
            return unsafe { pack_a_rows(src, base, ls, kc, dst) };
        }
        pack_panel(src, base, ls, ps, rows, MR, kc, dst)
    }
    fn pack_b(
        self,
        src: &[f32],
        base: usize,
        ls: usize,
        ps: usize,
        nc: usize,
        kc: usize,
        dst: &mut [f32],
    ) {
        pack_b_panels(Self::SPEC, src, base, ls, ps, nc, kc, dst, pack_panel)
    }
    fn tile(self, t: &Tile<'_>, c: &mut [f32]) {
        // SAFETY: NEON is part of the aarch64 baseline (every aarch64 CPU has it).
        unsafe {
            match t.ldb {
                4 => ukr::<1>(t, c),
                8 => ukr::<2>(t, c),
                NR => ukr::<3>(t, c),
                w => unreachable!("B panel width {w} is not 4, 8 or {NR}"),
            }
        }
    }
}
