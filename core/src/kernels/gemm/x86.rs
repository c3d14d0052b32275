//! x86-64 micro-kernels (AVX-512F 8×48 and AVX2+FMA 6×16) and their packing routines.
//!
//! Soundness rests on two things, restated at each `unsafe` block:
//! * a kernel value ([`Avx512`], [`Avx2`]) can only be made by `new()`, which checks the CPU features its
//!   `#[target_feature]` functions are compiled with;
//! * every raw-pointer access is inside a slice whose length was checked (by `assert!` or by slicing) in the
//!   same function, so the pointer arithmetic stays in bounds.
use core::arch::x86_64::*;

use super::{pack_b_panels, Kernel, Spec, Tile, SPEC_AVX2, SPEC_AVX512};

// ---------------------------------------------------------------------------------------------------------
// Kernel tokens
// ---------------------------------------------------------------------------------------------------------

/// Proof that the CPU has AVX-512F, AVX2 and FMA.
#[derive(Clone, Copy, Debug)]
pub(super) struct Avx512(());

/// Proof that the CPU has AVX2 and FMA.
#[derive(Clone, Copy, Debug)]
pub(super) struct Avx2(());

impl Avx512 {
    pub(super) fn new() -> Option<Self> {
        #[cfg(any(feature = "std", test))]
        let ok = std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma");
        #[cfg(not(any(feature = "std", test)))]
        let ok = cfg!(all(
            target_feature = "avx512f",
            target_feature = "avx2",
            target_feature = "fma"
        ));
        ok.then_some(Self(()))
    }
}

impl Avx2 {
    pub(super) fn new() -> Option<Self> {
        #[cfg(any(feature = "std", test))]
        let ok = std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma");
        #[cfg(not(any(feature = "std", test)))]
        let ok = cfg!(all(target_feature = "avx2", target_feature = "fma"));
        ok.then_some(Self(()))
    }
}

// ---------------------------------------------------------------------------------------------------------
// Packing (8×4 register transposes where the depth is the contiguous direction)
// ---------------------------------------------------------------------------------------------------------

/// Transposes 8 lanes × `kc` depth, lane `i` being the contiguous `src[start + i·ls..][..kc]`, into
/// `dst[p·w + i]`, for the depth steps `p < kc` rounded down to a multiple of 4, which it returns. Per 8×4
/// block: 8 half-vector loads, 4 of them inserts (which place lanes i and i+4 side by side for free), and
/// 8 in-lane shuffles.
#[target_feature(enable = "avx2")]
fn transpose_lanes8(
    src: &[f32],
    start: usize,
    ls: usize,
    kc: usize,
    dst: &mut [f32],
    w: usize,
) -> usize {
    let kc4 = kc / 4 * 4;
    if kc4 == 0 {
        return 0;
    }
    assert!(w >= 8 && start + 7 * ls + kc <= src.len() && (kc4 - 1) * w + 8 <= dst.len());
    let s = src[start..].as_ptr();
    let d = dst.as_mut_ptr();
    // SAFETY: every load below reads `src[start + i·ls + p..][..4]` with i < 8, p + 4 ≤ kc4 ≤ kc, inside
    // `src` as start + 7·ls + kc ≤ src.len() (asserted); every store writes `dst[p·w..][..8]` with
    // p < kc4, inside `dst` as (kc4-1)·w + 8 ≤ dst.len() (asserted). AVX2 is enabled on this function.
    unsafe {
        macro_rules! halves {
            ($lo:expr, $hi:expr, $off:expr) => {
                _mm256_insertf128_ps::<1>(
                    _mm256_castps128_ps256(_mm_loadu_ps(s.add($lo * ls + $off))),
                    _mm_loadu_ps(s.add($hi * ls + $off)),
                )
            };
        }
        for p0 in (0..kc4).step_by(4) {
            // a_i = lanes i and i+4 at depths p0..p0+4.
            let a0 = halves!(0, 4, p0);
            let a1 = halves!(1, 5, p0);
            let a2 = halves!(2, 6, p0);
            let a3 = halves!(3, 7, p0);
            let t0 = _mm256_unpacklo_ps(a0, a1);
            let t1 = _mm256_unpackhi_ps(a0, a1);
            let t2 = _mm256_unpacklo_ps(a2, a3);
            let t3 = _mm256_unpackhi_ps(a2, a3);
            _mm256_storeu_ps(d.add(p0 * w), _mm256_shuffle_ps::<0x44>(t0, t2));
            _mm256_storeu_ps(d.add((p0 + 1) * w), _mm256_shuffle_ps::<0xEE>(t0, t2));
            _mm256_storeu_ps(d.add((p0 + 2) * w), _mm256_shuffle_ps::<0x44>(t1, t3));
            _mm256_storeu_ps(d.add((p0 + 3) * w), _mm256_shuffle_ps::<0xEE>(t1, t3));
        }
    }
    kc4
}

/// Packs a B block whose depth is contiguous (`ps == 1`, B column-major: the transpose of a row-major
/// n×k matrix) into panels of `nr` columns, the last one `round_up(cols, vl)` wide (zero-filled when
/// `pad`). Column-group-outer order: 8 columns are transposed over the whole depth before the next 8, so
/// only 8 source streams (pages) are live at a time; a depth-outer order touches all `nc` columns per
/// step and thrashes the TLB when the columns are far apart (k = 150 528: 40 % slower overall).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2")]
fn pack_b_transposed(
    src: &[f32],
    base: usize,
    ls: usize,
    nc: usize,
    kc: usize,
    nr: usize,
    vl: usize,
    pad: bool,
    dst: &mut [f32],
) {
    let full = nc / nr;
    let tail = nc - full * nr;
    let tail_w = nr.min(tail.div_ceil(vl) * vl);
    let dst = &mut dst[..(full * nr + tail_w) * kc];
    // Column j lives in the panel starting at `pan`, at offset j % nr of its rows of `w` elements.
    let panel_of = |j: usize| (j / nr * nr * kc, if j / nr < full { nr } else { tail_w });
    let kc4 = kc / 4 * 4;
    let groups = nc / 8;
    if kc4 > 0 && groups > 0 {
        assert!(nr.is_multiple_of(8) && base + (groups * 8 - 1) * ls + kc <= src.len());
        let s0 = src[base..].as_ptr();
        for g in 0..groups {
            let j = 8 * g;
            let (pan, w) = panel_of(j);
            for p0 in (0..kc4).step_by(4) {
                let d0 = pan + p0 * w + j % nr;
                let d = &mut dst[d0..d0 + 3 * w + 8];
                // SAFETY: the loads read `src[base + (j+i)·ls + p0..][..4]` for i < 8, inside `src` as
                // j + 7 < 8·groups, p0 + 4 ≤ kc4 ≤ kc and base + (8·groups - 1)·ls + kc ≤ src.len()
                // (asserted); the stores write `d[q·w..][..8]` for q < 4, inside `d` (3·w + 8 elements,
                // checked by the slicing). AVX2 is enabled on this function.
                unsafe {
                    let s = s0.add(j * ls + p0);
                    macro_rules! halves {
                        ($lo:expr, $hi:expr) => {
                            _mm256_insertf128_ps::<1>(
                                _mm256_castps128_ps256(_mm_loadu_ps(s.add($lo * ls))),
                                _mm_loadu_ps(s.add($hi * ls)),
                            )
                        };
                    }
                    // a_i = columns j+i and j+i+4 at depths p0..p0+4.
                    let a0 = halves!(0, 4);
                    let a1 = halves!(1, 5);
                    let a2 = halves!(2, 6);
                    let a3 = halves!(3, 7);
                    let t0 = _mm256_unpacklo_ps(a0, a1);
                    let t1 = _mm256_unpackhi_ps(a0, a1);
                    let t2 = _mm256_unpacklo_ps(a2, a3);
                    let t3 = _mm256_unpackhi_ps(a2, a3);
                    let d = d.as_mut_ptr();
                    _mm256_storeu_ps(d, _mm256_shuffle_ps::<0x44>(t0, t2));
                    _mm256_storeu_ps(d.add(w), _mm256_shuffle_ps::<0xEE>(t0, t2));
                    _mm256_storeu_ps(d.add(2 * w), _mm256_shuffle_ps::<0x44>(t1, t3));
                    _mm256_storeu_ps(d.add(3 * w), _mm256_shuffle_ps::<0xEE>(t1, t3));
                }
            }
        }
    }
    // Leftovers: the last depth steps of the transposed columns, then the columns past 8·groups.
    let done = if groups > 0 { kc4 } else { 0 };
    for j in 0..nc {
        let (pan, w) = panel_of(j);
        let from = if j < 8 * groups { done } else { 0 };
        for p in from..kc {
            dst[pan + p * w + j % nr] = src[base + j * ls + p];
        }
    }
    if pad && tail < tail_w {
        let pan = full * nr * kc;
        for row in dst[pan..pan + tail_w * kc].chunks_exact_mut(tail_w) {
            row[tail..].fill(0.0);
        }
    }
}

/// Loads 8 floats from the start of `s` (which must hold at least 8).
#[inline]
#[target_feature(enable = "avx2")]
fn load8(s: &[f32]) -> __m256 {
    let s = &s[..8];
    // SAFETY: `s` has exactly 8 elements (the slicing above checked it); unaligned load is allowed.
    unsafe { _mm256_loadu_ps(s.as_ptr()) }
}

/// Loads 4 floats from the start of `s` (which must hold at least 4).
#[inline]
#[target_feature(enable = "avx2")]
fn load4(s: &[f32]) -> __m128 {
    let s = &s[..4];
    // SAFETY: `s` has exactly 4 elements (the slicing above checked it); unaligned load is allowed.
    unsafe { _mm_loadu_ps(s.as_ptr()) }
}

/// Stores 4 floats to the start of `d` (which must hold at least 4).
#[inline]
#[target_feature(enable = "avx2")]
fn store4(d: &mut [f32], x: __m128) {
    let d = &mut d[..4];
    // SAFETY: `d` has exactly 4 elements (the slicing above checked it); unaligned store is allowed.
    unsafe { _mm_storeu_ps(d.as_mut_ptr(), x) }
}

/// Stores 8 floats to the start of `d` (which must hold at least 8).
#[inline]
#[target_feature(enable = "avx2")]
fn store8(d: &mut [f32], x: __m256) {
    let d = &mut d[..8];
    // SAFETY: `d` has exactly 8 elements (the slicing above checked it); unaligned store is allowed.
    unsafe { _mm256_storeu_ps(d.as_mut_ptr(), x) }
}

/// Packs `lanes` lanes (stride `ls`) × `kc` depth (stride `ps`) from `src[base..]` into `dst` (lane
/// stride 1, depth stride `w`), zero-filling lanes `lanes..w` when `pad` (the kernel reads them). Fast
/// paths: contiguous lanes (`ls == 1`, a row copy per depth step) and contiguous depth (`ps == 1`, 8×4
/// register transposes); anything else is gathered element by element.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2")]
fn pack_panel(
    pad: bool,
    src: &[f32],
    base: usize,
    ls: usize,
    ps: usize,
    lanes: usize,
    w: usize,
    kc: usize,
    dst: &mut [f32],
) {
    let dst = &mut dst[..w * kc];
    if ls == 1 {
        for (p, d) in dst.chunks_exact_mut(w).enumerate() {
            let s = &src[base + p * ps..base + p * ps + lanes];
            let mut l = 0;
            while l + 8 <= lanes {
                store8(&mut d[l..], load8(&s[l..]));
                l += 8;
            }
            // The ragged end without a libc call per depth step (a column-major A panel is 6 lanes):
            // one overlapping vector after full ones, two overlapping halves from 4 lanes, element
            // copies below that.
            if l < lanes {
                if lanes >= 8 {
                    store8(&mut d[lanes - 8..], load8(&s[lanes - 8..]));
                } else if lanes >= 4 {
                    store4(&mut d[..], load4(s));
                    store4(&mut d[lanes - 4..], load4(&s[lanes - 4..]));
                } else {
                    for (d, &x) in d[..lanes].iter_mut().zip(s) {
                        *d = x;
                    }
                }
            }
            if pad && lanes < w {
                d[lanes..].fill(0.0);
            }
        }
    } else if ps == 1 {
        let mut l0 = 0;
        while l0 + 8 <= lanes {
            let start = base + l0 * ls;
            let done = transpose_lanes8(src, start, ls, kc, &mut dst[l0..], w);
            for p in done..kc {
                for i in 0..8 {
                    dst[p * w + l0 + i] = src[start + i * ls + p];
                }
            }
            l0 += 8;
        }
        for l in l0..lanes {
            let s = &src[base + l * ls..base + l * ls + kc];
            for (p, &x) in s.iter().enumerate() {
                dst[p * w + l] = x;
            }
        }
        if pad && lanes < w {
            for d in dst.chunks_exact_mut(w) {
                d[lanes..].fill(0.0);
            }
        }
    } else {
        for (p, d) in dst.chunks_exact_mut(w).enumerate() {
            let s0 = base + p * ps;
            for (l, x) in d[..lanes].iter_mut().enumerate() {
                *x = src[s0 + l * ls];
            }
            if pad && lanes < w {
                d[lanes..].fill(0.0);
            }
        }
    }
}

/// Packs a B block whose columns are contiguous (`ls == 1`, B row-major) into panels of `NR = 16·NV`
/// columns (the last one `round_up(cols, 16)` wide, zero-filled): one pass over each source row; full
/// panels are plain 16-lane copies, the ragged end uses masked loads.
#[target_feature(enable = "avx512f,avx2,fma")]
fn pack_b_rows512<const NV: usize>(
    src: &[f32],
    base: usize,
    ps: usize,
    nc: usize,
    kc: usize,
    dst: &mut [f32],
) {
    let nr = 16 * NV;
    let full = nc / nr;
    let tail = nc - full * nr;
    let tail_w = tail.div_ceil(16) * 16;
    let dst = &mut dst[..full * nr * kc + tail_w * kc];
    for p in 0..kc {
        let row = &src[base + p * ps..base + p * ps + nc];
        for q in 0..full {
            let s = &row[q * nr..q * nr + nr];
            let d = &mut dst[q * nr * kc + p * nr..q * nr * kc + p * nr + nr];
            for v in 0..NV {
                // SAFETY: `s` and `d` both hold nr = 16·NV elements (slicing checked), v < NV.
                unsafe {
                    _mm512_storeu_ps(
                        d.as_mut_ptr().add(16 * v),
                        _mm512_loadu_ps(s.as_ptr().add(16 * v)),
                    )
                }
            }
        }
        if tail > 0 {
            let s = &row[full * nr..];
            let d0 = full * nr * kc + p * tail_w;
            let d = &mut dst[d0..d0 + tail_w];
            for v in 0..tail_w / 16 {
                let lanes = (tail - 16 * v).min(16);
                let mask = ((1u32 << lanes) - 1) as __mmask16;
                // SAFETY: `s` holds `tail` elements and the mask enables only lanes 16·v + l < tail (others
                // are not read and cannot fault); 16·v < tail keeps the pointer in bounds. `d` holds
                // tail_w ≥ 16·v + 16 elements.
                unsafe {
                    let x = _mm512_maskz_loadu_ps(mask, s.as_ptr().add(16 * v));
                    _mm512_storeu_ps(d.as_mut_ptr().add(16 * v), x);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// Micro-kernel dispatch on (rows, vectors): every height 1..=MR is its own monomorphised kernel
// ---------------------------------------------------------------------------------------------------------

macro_rules! dispatch {
    ($f:ident, $rows:expr, $nv:expr, [$($r:literal)*], $nvs:tt, $args:tt) => {
        match $rows {
            $( $r => dispatch!(@nv $f, $r, $nv, $nvs, $args), )*
            _ => unreachable!(),
        }
    };
    (@nv $f:ident, $r:literal, $nv:expr, [$($v:literal)*], $args:tt) => {
        match $nv {
            $( $v => $f::<$r, $v> $args, )*
            _ => unreachable!(),
        }
    };
}

/// Fixes the trailing const parameters of a micro-kernel, leaving `<R, NV>` for [`dispatch!`].
macro_rules! variants {
    ($($name:ident = $f:ident::<$($g:literal),*>, $feat:literal;)*) => {$(
        #[inline]
        #[target_feature(enable = $feat)]
        fn $name<const R: usize, const NV: usize>(t: &Tile<'_>, c: &mut [f32]) {
            $f::<R, NV, $($g),*>(t, c)
        }
    )*};
}

variants! {
    ukr512_rows = ukr512::<false>, "avx512f,avx2,fma";
    ukr512_strided = ukr512::<true>, "avx512f,avx2,fma";
    ukr256_rows = ukr256::<false, false>, "avx2,fma";
    ukr256_strided = ukr256::<false, true>, "avx2,fma";
    ukr256_rows_maskb = ukr256::<true, false>, "avx2,fma";
    ukr256_strided_maskb = ukr256::<true, true>, "avx2,fma";
}

// ---------------------------------------------------------------------------------------------------------
// AVX-512F: 8 × 48 (3 zmm per row)
// ---------------------------------------------------------------------------------------------------------

const MR512: usize = SPEC_AVX512.mr;
/// Software prefetch distance in B rows (depth steps).
const PF_ROWS: usize = 8;

/// `C[R×cols] (+)= A·B` for one tile (see [`Tile`]); `16·(NV-1) < cols ≤ 16·NV`. B rows are loaded with
/// lane masks, so B may end at `cols` (read in place) or be a panel. Without `AGEN` the rows of A are
/// adjacent (`a_rs == 1`: a packed panel, or a column-major A in place), so the broadcasts address
/// `ap + 4·r` directly; with it any `a_rs` (a row-major A in place).
#[target_feature(enable = "avx512f,avx2,fma")]
fn ukr512<const R: usize, const NV: usize, const AGEN: bool>(t: &Tile<'_>, c: &mut [f32]) {
    let (kc, a, a_ps, b, ldb, ldc, cols, acc) =
        (t.kc, t.a, t.a_ps, t.b, t.ldb, t.ldc, t.cols, t.acc);
    let a_rs = if AGEN { t.a_rs } else { 1 };
    assert!(R <= MR512 && cols <= 16 * NV && cols + 16 > 16 * NV && kc >= 1);
    assert!(a.len() > (R - 1) * a_rs + (kc - 1) * a_ps && b.len() >= (kc - 1) * ldb + cols);
    assert!(c.len() >= (R - 1) * ldc + cols);
    let masks: [__mmask16; NV] = core::array::from_fn(|v| {
        let lanes = (cols - 16 * v).min(16);
        ((1u32 << lanes) - 1) as __mmask16
    });
    let mut ab = [[_mm512_setzero_ps(); NV]; R];
    // B read in place is strided by rows the hardware prefetchers may not follow: fetch PF_ROWS ahead.
    let pf = PF_ROWS * ldb;
    let (mut ap, mut bp) = (a.as_ptr(), b.as_ptr());
    for _ in 0..kc {
        let mut bv = [_mm512_setzero_ps(); NV];
        for (v, x) in bv.iter_mut().enumerate() {
            // SAFETY: `bp` is `b[p·ldb..]` for the depth step p < kc; the mask enables lanes with
            // 16·v + l < cols and (kc-1)·ldb + cols ≤ b.len() (asserted), so only elements of `b` are read
            // (masked-off lanes are not accessed and cannot fault); 16·v < cols keeps the pointer in bounds.
            *x = unsafe { _mm512_maskz_loadu_ps(masks[v], bp.add(16 * v)) };
            // A prefetch is only a hint (never faults), so the address may pass the end of `b`.
            _mm_prefetch::<_MM_HINT_T0>(bp.wrapping_add(pf + 16 * v).cast::<i8>());
        }
        for (r, row) in ab.iter_mut().enumerate() {
            // SAFETY: `ap` is `a[p·a_ps..]` for p < kc and r < R, so this reads a[r·a_rs + p·a_ps], and
            // ·a_rs + (kc-1)·a_ps < a.len() (asserted).
            let x = _mm512_set1_ps(unsafe { *ap.add(r * a_rs) });
            for (acc, &y) in row.iter_mut().zip(bv.iter()) {
                *acc = _mm512_fmadd_ps(x, y, *acc);
            }
        }
        // Wrapping: after the last step these may point past the operands; they are not dereferenced then.
        ap = ap.wrapping_add(a_ps);
        bp = bp.wrapping_add(ldb);
    }
    for (r, row) in ab.iter().enumerate() {
        for (v, &x) in row.iter().enumerate() {
            // SAFETY: element (r, 16·v + l) of the tile is `c[r·ldc + 16·v + l]`; the mask enables only
            // 16·v + l < cols, and ·ldc + cols ≤ c.len() (asserted); 16·v < cols keeps the pointer in
            // bounds. Masked-off lanes are neither read nor written (no fault).
            unsafe {
                let p = c.as_mut_ptr().add(r * ldc + 16 * v);
                let y = if acc {
                    _mm512_add_ps(x, _mm512_maskz_loadu_ps(masks[v], p))
                } else {
                    x
                };
                _mm512_mask_storeu_ps(p, masks[v], y);
            }
        }
    }
}

impl Kernel for Avx512 {
    const SPEC: Spec = SPEC_AVX512;
    const B_IN_PLACE: bool = true;
    const A_IN_PLACE: bool = true;
    const A_ROWS_IN_PLACE_MAX_N: usize = usize::MAX;
    const A_COLS_IN_PLACE_MAX_LD: usize = 512;
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
        // SAFETY: `self` exists only if AVX-512F, AVX2 and FMA were detected (`Avx512::new`).
        unsafe { pack_panel(false, src, base, ls, ps, rows, MR512, kc, dst) }
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
        if ls == 1 {
            // SAFETY: `self` exists only if AVX-512F, AVX2 and FMA were detected (`Avx512::new`).
            return unsafe {
                pack_b_rows512::<{ SPEC_AVX512.nr / 16 }>(src, base, ps, nc, kc, dst)
            };
        }
        if ps == 1 {
            let (nr, vl) = (SPEC_AVX512.nr, SPEC_AVX512.vl);
            // SAFETY: `self` exists only if AVX-512F, AVX2 and FMA were detected (`Avx512::new`).
            return unsafe { pack_b_transposed(src, base, ls, nc, kc, nr, vl, false, dst) };
        }
        pack_b_panels(
            Self::SPEC,
            src,
            base,
            ls,
            ps,
            nc,
            kc,
            dst,
            |s, b, l, p, n, w, k, d| {
                // SAFETY: `self` exists only if AVX-512F, AVX2 and FMA were detected (`Avx512::new`).
                unsafe { pack_panel(false, s, b, l, p, n, w, k, d) }
            },
        )
    }
    fn tile(self, t: &Tile<'_>, c: &mut [f32]) {
        let nv = t.cols.div_ceil(16);
        // SAFETY: `self` exists only if AVX-512F, AVX2 and FMA were detected (`Avx512::new`).
        unsafe {
            if t.a_rs == 1 {
                dispatch!(ukr512_rows, t.rows, nv, [1 2 3 4 5 6 7 8], [1 2 3], (t, c))
            } else {
                dispatch!(ukr512_strided, t.rows, nv, [1 2 3 4 5 6 7 8], [1 2 3], (t, c))
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// AVX2 + FMA: 6 × 16 (2 ymm per row)
// ---------------------------------------------------------------------------------------------------------

const MR256: usize = SPEC_AVX2.mr;

/// As [`ukr512`] with 8-lane vectors, `8·(NV-1) < cols ≤ 8·NV`. Without `MASKB` every B row must hold
/// `8·NV` readable elements (a zero-padded panel); with it the last vector of each B row is loaded with a
/// mask (B read in place, `cols` not a multiple of 8).
#[target_feature(enable = "avx2,fma")]
fn ukr256<const R: usize, const NV: usize, const MASKB: bool, const AGEN: bool>(
    t: &Tile<'_>,
    c: &mut [f32],
) {
    let (kc, a, a_ps, b, ldb, ldc, cols, acc) =
        (t.kc, t.a, t.a_ps, t.b, t.ldb, t.ldc, t.cols, t.acc);
    let a_rs = if AGEN { t.a_rs } else { 1 };
    let b_row = if MASKB { cols } else { 8 * NV };
    assert!(R <= MR256 && cols <= 8 * NV && cols + 8 > 8 * NV && kc >= 1);
    assert!(a.len() > (R - 1) * a_rs + (kc - 1) * a_ps && b.len() >= (kc - 1) * ldb + b_row);
    assert!(c.len() >= (R - 1) * ldc + cols);
    let lane_ids = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let last_mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((cols - 8 * (NV - 1)) as i32), lane_ids);
    let mut ab = [[_mm256_setzero_ps(); NV]; R];
    let (mut ap, mut bp) = (a.as_ptr(), b.as_ptr());
    for _ in 0..kc {
        let mut bv = [_mm256_setzero_ps(); NV];
        for (v, x) in bv.iter_mut().enumerate() {
            // SAFETY: `bp` is `b[p·ldb..]` for the depth step p < kc and (kc-1)·ldb + b_row ≤ b.len()
            // (asserted). A plain load reads 8·v..8·v + 8 ≤ b_row (v < NV-1, or no MASKB); the MASKB last
            // vector is a vmaskmov reading only lanes 8·v + l < cols = b_row (others not accessed, no fault).
            *x = unsafe {
                if MASKB && v == NV - 1 {
                    _mm256_maskload_ps(bp.add(8 * v), last_mask)
                } else {
                    _mm256_loadu_ps(bp.add(8 * v))
                }
            };
        }
        for (r, row) in ab.iter_mut().enumerate() {
            // SAFETY: `ap` is `a[p·a_ps..]` for p < kc and r < R, so this reads a[r·a_rs + p·a_ps], and
            // ·a_rs + (kc-1)·a_ps < a.len() (asserted).
            let x = _mm256_set1_ps(unsafe { *ap.add(r * a_rs) });
            for (acc, &y) in row.iter_mut().zip(bv.iter()) {
                *acc = _mm256_fmadd_ps(x, y, *acc);
            }
        }
        // Wrapping: after the last step these may point past the operands; they are not dereferenced then.
        ap = ap.wrapping_add(a_ps);
        bp = bp.wrapping_add(ldb);
    }
    for (r, row) in ab.iter().enumerate() {
        for (v, &x) in row.iter().enumerate() {
            let lanes = (cols - 8 * v).min(8);
            // SAFETY: element (r, 8·v + l) of the tile is `c[r·ldc + 8·v + l]`, in bounds for 8·v + l < cols
            // as ·ldc + cols ≤ c.len() (asserted); 8·v < cols keeps the pointer in bounds. A full
            // vector touches exactly such elements; a partial one is a vmaskmov, which neither reads nor
            // writes (nor faults on) masked-off lanes.
            unsafe {
                let p = c.as_mut_ptr().add(r * ldc + 8 * v);
                if lanes == 8 {
                    let y = if acc {
                        _mm256_add_ps(x, _mm256_loadu_ps(p))
                    } else {
                        x
                    };
                    _mm256_storeu_ps(p, y);
                } else {
                    let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(lanes as i32), lane_ids);
                    let y = if acc {
                        _mm256_add_ps(x, _mm256_maskload_ps(p, mask))
                    } else {
                        x
                    };
                    _mm256_maskstore_ps(p, mask, y);
                }
            }
        }
    }
}

impl Kernel for Avx2 {
    const SPEC: Spec = SPEC_AVX2;
    const B_IN_PLACE: bool = true;
    const A_IN_PLACE: bool = true;
    /// A row-major A is always read in place: the broadcast loads of a 6-row panel (6 rows of `kc`
    /// contiguous elements, L1-resident) are as fast as from a packed copy, so packing is pure
    /// overhead. On Zen 3 (`cargo xtask bench sgemm`, one sitting) this raised every shape, e.g.
    /// 1024³ from 73.0 to 79.1 GFLOPS and `2048×100×1024` from 53.9 to 77.6.
    const A_ROWS_IN_PLACE_MAX_N: usize = usize::MAX;
    /// A column-major A (a weight gradient's `dYᵀ`) steps to another cache line every depth step;
    /// it is read in place while those lines are at most 2 KiB apart (the transformer's `dYᵀ`, 128
    /// to 512 wide: its step took 0.95× the time, best of 10 alternating runs) and packed when
    /// farther apart (the LSTM's 1536 gates, where each step is nearly a page: packed was the faster
    /// in `bench sgemm`'s `lstm dW_hh` row in two sittings; this host's noise is ±20 % there).
    const A_COLS_IN_PLACE_MAX_LD: usize = 512;
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
        // SAFETY: `self` exists only if AVX2 and FMA were detected (`Avx2::new`).
        unsafe { pack_panel(false, src, base, ls, ps, rows, MR256, kc, dst) }
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
        if ps == 1 {
            let (nr, vl) = (SPEC_AVX2.nr, SPEC_AVX2.vl);
            // SAFETY: `self` exists only if AVX2 and FMA were detected (`Avx2::new`).
            return unsafe { pack_b_transposed(src, base, ls, nc, kc, nr, vl, true, dst) };
        }
        pack_b_panels(
            Self::SPEC,
            src,
            base,
            ls,
            ps,
            nc,
            kc,
            dst,
            |s, b, l, p, n, w, k, d| {
                // SAFETY: `self` exists only if AVX2 and FMA were detected (`Avx2::new`).
                unsafe { pack_panel(true, s, b, l, p, n, w, k, d) }
            },
        )
    }
    fn tile(self, t: &Tile<'_>, c: &mut [f32]) {
        let nv = t.cols.div_ceil(8);
        let mask_b = !t.b_padded && !t.cols.is_multiple_of(8);
        // SAFETY: `self` exists only if AVX2 and FMA were detected (`Avx2::new`).
        unsafe {
            match (mask_b, t.a_rs == 1) {
                (false, true) => dispatch!(ukr256_rows, t.rows, nv, [1 2 3 4 5 6], [1 2], (t, c)),
                (false, false) => {
                    dispatch!(ukr256_strided, t.rows, nv, [1 2 3 4 5 6], [1 2], (t, c))
                }
                (true, true) => {
                    dispatch!(ukr256_rows_maskb, t.rows, nv, [1 2 3 4 5 6], [1 2], (t, c))
                }
                (true, false) => {
                    dispatch!(ukr256_strided_maskb, t.rows, nv, [1 2 3 4 5 6], [1 2], (t, c))
                }
            }
        }
    }
}
