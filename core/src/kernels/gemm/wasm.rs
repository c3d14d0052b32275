//! wasm32 `simd128` f32 micro-kernel (4 × 8: 8 accumulators of 4 lanes, 2 vectors of B). Compiled only
//! with `-C target-feature=+simd128` (wasm has no run-time feature detection: a module with SIMD
//! instructions does not even validate on an engine without them), so the choice is made at compile time.
//!
//! simd128 has no fused multiply-add (that is relaxed-simd), so every step is `f32x4.mul` then
//! `f32x4.add`: two roundings per product, which the conformance tolerance (`γ_{k+1}`, see the tests)
//! already covers. The tile is small on purpose: engines map `v128` to the 16 xmm registers of an x86-64
//! host (V8 keeps one for itself), and 8 accumulators + 2 B vectors + a broadcast + a product temporary
//! leave room, where 6 × 8 or 4 × 12 would spill inside the depth loop.
//!
//! Soundness: every raw-pointer access is inside a slice whose length was asserted (or checked by
//! slicing) in the same function; each `unsafe` block says which check covers it. wasm loads and stores
//! have no alignment requirement (the alignment immediate is only a hint).
use core::arch::wasm32::*;

use super::{pack_b_panels, Kernel, Spec, Tile, SPEC_SIMD128};

/// Rows of the register tile.
const MR: usize = SPEC_SIMD128.mr;

/// The simd128 kernel family (a unit value: its existence needs no run-time proof, the module would not
/// have loaded without simd128).
#[derive(Clone, Copy, Debug)]
pub(super) struct Simd128;

/// Loads `n` (1..=4) floats from `p`, the other lanes 0.
///
/// # Safety
/// `p` must be valid for reading `n` floats.
#[inline(always)]
unsafe fn load_n(p: *const f32, n: usize) -> v128 {
    // SAFETY (all arms): each reads exactly the first `n` floats at `p`, valid by the caller's contract;
    // wasm loads may be unaligned.
    unsafe {
        match n {
            1 => v128_load32_zero(p.cast::<u32>()),
            2 => v128_load64_zero(p.cast::<u64>()),
            3 => f32x4_replace_lane::<2>(v128_load64_zero(p.cast::<u64>()), *p.add(2)),
            _ => v128_load(p.cast::<v128>()),
        }
    }
}

/// Stores the first `n` (1..=4) lanes of `x` to `p`.
///
/// # Safety
/// `p` must be valid for writing `n` floats.
#[inline(always)]
unsafe fn store_n(p: *mut f32, n: usize, x: v128) {
    // SAFETY (all arms): each writes exactly the first `n` floats at `p`, valid by the caller's contract;
    // wasm stores may be unaligned.
    unsafe {
        match n {
            1 => v128_store32_lane::<0>(x, p.cast::<u32>()),
            2 => v128_store64_lane::<0>(x, p.cast::<u64>()),
            3 => {
                v128_store64_lane::<0>(x, p.cast::<u64>());
                v128_store32_lane::<2>(x, p.add(2).cast::<u32>());
            }
            _ => v128_store(p.cast::<v128>(), x),
        }
    }
}

/// `C[R×cols] (+)= A·B` for one tile (see [`Tile`]); `4·(NV-1) < cols ≤ 4·NV`, `NV ≤ 2`. A is addressed
/// with its strides (`a_rs`, `a_ps`: a packed panel or A in place). Without `PART` every B row holds
/// `4·NV` readable elements (a zero-padded panel, or `cols` a multiple of 4); with it the last vector of
/// each B row is partial (B read in place) and only `cols % 4` elements of it are read.
///
/// The accumulators are eight named locals, not an array, and the rows are written out (guarded by the
/// constant `R`): at the browser build's opt-level "s" LLVM would neither unroll the row loop nor keep an
/// accumulator array in registers (each step would load and store every accumulator through memory).
#[inline(never)]
fn ukr<const R: usize, const NV: usize, const PART: bool>(t: &Tile<'_>, c: &mut [f32]) {
    let (kc, a, a_rs, a_ps, b, ldb, ldc, cols) =
        (t.kc, t.a, t.a_rs, t.a_ps, t.b, t.ldb, t.ldc, t.cols);
    let tail = cols - 4 * (NV - 1);
    let b_row = if PART { cols } else { 4 * NV };
    // Lanes of B's last vector that are read (4 unless PART).
    let b_last = if PART { tail } else { 4 };
    assert!((1..=MR).contains(&R) && (1..=2).contains(&NV) && cols <= 4 * NV && tail >= 1);
    assert!(kc >= 1 && (!PART || tail < 4));
    assert!(a.len() > (R - 1) * a_rs + (kc - 1) * a_ps && b.len() >= (kc - 1) * ldb + b_row);
    assert!(c.len() >= (R - 1) * ldc + cols);
    let z = f32x4_splat(0.0);
    let (mut c00, mut c01, mut c10, mut c11) = (z, z, z, z);
    let (mut c20, mut c21, mut c30, mut c31) = (z, z, z, z);
    let (mut ap, mut bp) = (a.as_ptr(), b.as_ptr());
    for _ in 0..kc {
        // SAFETY: `bp` is `b[p·ldb..]` for the depth step p < kc. With NV = 1 this reads `b_last` ≤ b_row
        // elements; with NV = 2, 4 then `b_last` more (4 + b_last = b_row). (kc-1)·ldb + b_row ≤ b.len()
        // (asserted), so every read is inside `b`.
        let (b0, b1) = unsafe {
            if NV == 1 {
                (load_n(bp, b_last), z)
            } else {
                (v128_load(bp.cast::<v128>()), load_n(bp.add(4), b_last))
            }
        };
        macro_rules! row {
            ($r:literal, $x0:ident, $x1:ident) => {
                if R > $r {
                    // SAFETY: `ap` is `a[p·a_ps..]` for p < kc and $r < R, so this reads
                    // a[$r·a_rs + p·a_ps], inside `a` as ·a_rs + (kc-1)·a_ps < a.len() (asserted).
                    let x = f32x4_splat(unsafe { *ap.add($r * a_rs) });
                    $x0 = f32x4_add($x0, f32x4_mul(x, b0));
                    if NV > 1 {
                        $x1 = f32x4_add($x1, f32x4_mul(x, b1));
                    }
                }
            };
        }
        row!(0, c00, c01);
        row!(1, c10, c11);
        row!(2, c20, c21);
        row!(3, c30, c31);
        // Wrapping: after the last step these may point past the operands; they are not dereferenced then.
        ap = ap.wrapping_add(a_ps);
        bp = bp.wrapping_add(ldb);
    }
    let rows = [(c00, c01), (c10, c11), (c20, c21), (c30, c31)];
    for (r, &(x0, x1)) in rows.iter().enumerate().take(R) {
        let d = &mut c[r * ldc..r * ldc + cols];
        let d = d.as_mut_ptr();
        // SAFETY: `d` is row r of the tile, `cols` = 4·(NV-1) + tail elements (checked by the slicing);
        // vector 0 covers elements 0..4 (NV = 2) or 0..tail (NV = 1), vector 1 covers 4..4 + tail.
        unsafe {
            let (d0, n0) = if NV == 1 { (x0, tail) } else { (x0, 4) };
            let y0 = if t.acc {
                f32x4_add(load_n(d, n0), d0)
            } else {
                d0
            };
            store_n(d, n0, y0);
            if NV > 1 {
                let d1 = d.add(4);
                let y1 = if t.acc {
                    f32x4_add(load_n(d1, tail), x1)
                } else {
                    x1
                };
                store_n(d1, tail, y1);
            }
        }
    }
}

/// Packs `lanes` lanes (stride `ls`) × `kc` depth (stride `ps`) from `src[base..]` into `dst` with lane
/// stride 1 and depth stride `w` (a multiple of 4, ≥ lanes), zero-filling lanes `lanes..w`. Contiguous
/// lanes are copied with vector moves (a `copy_from_slice` of a few elements becomes a `memory.copy`,
/// which engines run out of line), anything else is gathered element by element.
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
    if lanes == 0 || kc == 0 {
        return;
    }
    assert!(lanes <= w && w.is_multiple_of(4) && dst.len() >= w * kc);
    let last = (lanes - 1)
        .checked_mul(ls)
        .and_then(|l| (kc - 1).checked_mul(ps).and_then(|p| l.checked_add(p)))
        .and_then(|o| o.checked_add(base));
    assert!(
        last.is_some_and(|i| i < src.len()),
        "pack: source too short"
    );
    let (s0, d0) = (src.as_ptr(), dst.as_mut_ptr());
    for p in 0..kc {
        // SAFETY: lane l < lanes at depth p < kc is src[base + l·ls + p·ps], at most the `last` index,
        // which is inside `src` (asserted); the destination row is dst[p·w..][..w], inside `dst` as
        // w·kc ≤ dst.len() (asserted). Vector stores cover dst[p·w + 4·v..][..4] with 4·v + 4 ≤ w.
        unsafe {
            let s = s0.add(base + p * ps);
            let d = d0.add(p * w);
            if ls == 1 {
                let mut l = 0;
                while l < w {
                    let x = if l + 4 <= lanes {
                        v128_load(s.add(l).cast::<v128>())
                    } else if l < lanes {
                        load_n(s.add(l), lanes - l)
                    } else {
                        f32x4_splat(0.0)
                    };
                    v128_store(d.add(l).cast::<v128>(), x);
                    l += 4;
                }
            } else {
                for l in 0..lanes {
                    *d.add(l) = *s.add(l * ls);
                }
                for l in lanes..w {
                    *d.add(l) = 0.0;
                }
            }
        }
    }
}

impl Kernel for Simd128 {
    const SPEC: Spec = SPEC_SIMD128;
    const B_IN_PLACE: bool = true;
    const A_IN_PLACE: bool = true;
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
        // Rows past `rows` are never read (exact-height kernels); zeroing them costs a store per step.
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
        let nv = t.cols.div_ceil(4);
        let part = !t.b_padded && !t.cols.is_multiple_of(4);
        macro_rules! go {
            ($part:literal) => {
                match (t.rows, nv) {
                    (1, 1) => ukr::<1, 1, $part>(t, c),
                    (1, _) => ukr::<1, 2, $part>(t, c),
                    (2, 1) => ukr::<2, 1, $part>(t, c),
                    (2, _) => ukr::<2, 2, $part>(t, c),
                    (3, 1) => ukr::<3, 1, $part>(t, c),
                    (3, _) => ukr::<3, 2, $part>(t, c),
                    (4, 1) => ukr::<4, 1, $part>(t, c),
                    (4, _) => ukr::<4, 2, $part>(t, c),
                    _ => unreachable!("tile rows {} outside 1..={MR}", t.rows),
                }
            };
        }
        if part {
            go!(true)
        } else {
            go!(false)
        }
    }
}
