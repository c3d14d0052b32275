//! x86-64 micro-kernels (AVX-512F 8×48 and AVX2+FMA 6×16) and their packing routines.
//!
//! Soundness rests on two things, restated at each `unsafe` block:
//! * a kernel value ([`Avx512`], [`Avx2`]) can only be made by `new()`, which checks the CPU features its
//!   `#[target_feature]` functions are compiled with;
//! * every raw-pointer access is inside a slice whose length was checked (by `assert!` or by slicing) in the
//!   same function, so the pointer arithmetic stays in bounds.
use core::arch::x86_64::*;

use super::{pack_b_panels, Kernel, Spec, SPEC_AVX2, SPEC_AVX512};

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
        #[cfg(feature = "std")]
        let ok = std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma");
        #[cfg(not(feature = "std"))]
        let ok = cfg!(all(target_feature = "avx512f", target_feature = "avx2", target_feature = "fma"));
        ok.then_some(Self(()))
    }
}

impl Avx2 {
    pub(super) fn new() -> Option<Self> {
        #[cfg(feature = "std")]
        let ok = std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma");
        #[cfg(not(feature = "std"))]
        let ok = cfg!(all(target_feature = "avx2", target_feature = "fma"));
        ok.then_some(Self(()))
    }
}

// ---------------------------------------------------------------------------------------------------------
// Packing (AVX2: 8×8 register transposes for the strided-depth case)
// ---------------------------------------------------------------------------------------------------------

/// Transposes the 8×8 block `r[l][p]` into `o[p][l]`.
#[inline]
#[target_feature(enable = "avx2")]
fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(u0, u4),
        _mm256_permute2f128_ps::<0x20>(u1, u5),
        _mm256_permute2f128_ps::<0x20>(u2, u6),
        _mm256_permute2f128_ps::<0x20>(u3, u7),
        _mm256_permute2f128_ps::<0x31>(u0, u4),
        _mm256_permute2f128_ps::<0x31>(u1, u5),
        _mm256_permute2f128_ps::<0x31>(u2, u6),
        _mm256_permute2f128_ps::<0x31>(u3, u7),
    ]
}

/// Loads 8 floats from the start of `s` (which must hold at least 8).
#[inline]
#[target_feature(enable = "avx2")]
fn load8(s: &[f32]) -> __m256 {
    let s = &s[..8];
    // SAFETY: `s` has exactly 8 elements (the slicing above checked it); unaligned load is allowed.
    unsafe { _mm256_loadu_ps(s.as_ptr()) }
}

/// Stores 8 floats to the start of `d` (which must hold at least 8).
#[inline]
#[target_feature(enable = "avx2")]
fn store8(d: &mut [f32], x: __m256) {
    let d = &mut d[..8];
    // SAFETY: `d` has exactly 8 elements (the slicing above checked it); unaligned store is allowed.
    unsafe { _mm256_storeu_ps(d.as_mut_ptr(), x) }
}

/// Packs `lanes` lanes (stride `ls`) × `kc` depth (stride `ps`) from `src[base..]` into `dst` (lane stride
/// 1, depth stride `w`), zero-filling lanes `lanes..w`. Fast paths: contiguous lanes (`ls == 1`, a row
/// copy per depth step) and contiguous depth (`ps == 1`, 8×8 register transposes).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2")]
fn pack_panel(src: &[f32], base: usize, ls: usize, ps: usize, lanes: usize, w: usize, kc: usize, dst: &mut [f32]) {
    let dst = &mut dst[..w * kc];
    if ls == 1 {
        for (p, d) in dst.chunks_exact_mut(w).enumerate() {
            let s = &src[base + p * ps..base + p * ps + lanes];
            let mut l = 0;
            while l + 8 <= lanes {
                store8(&mut d[l..], load8(&s[l..]));
                l += 8;
            }
            d[l..lanes].copy_from_slice(&s[l..]);
            d[lanes..].fill(0.0);
        }
    } else if ps == 1 && kc >= 8 {
        let mut l0 = 0;
        while l0 + 8 <= lanes {
            let rows: [&[f32]; 8] = core::array::from_fn(|i| {
                let s = base + (l0 + i) * ls;
                &src[s..s + kc]
            });
            let mut p0 = 0;
            while p0 + 8 <= kc {
                let r = [
                    load8(&rows[0][p0..]),
                    load8(&rows[1][p0..]),
                    load8(&rows[2][p0..]),
                    load8(&rows[3][p0..]),
                    load8(&rows[4][p0..]),
                    load8(&rows[5][p0..]),
                    load8(&rows[6][p0..]),
                    load8(&rows[7][p0..]),
                ];
                let o = transpose8(r);
                for (q, &x) in o.iter().enumerate() {
                    store8(&mut dst[(p0 + q) * w + l0..], x);
                }
                p0 += 8;
            }
            for p in p0..kc {
                for (i, row) in rows.iter().enumerate() {
                    dst[p * w + l0 + i] = row[p];
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
        for d in dst.chunks_exact_mut(w) {
            d[lanes..].fill(0.0);
        }
    } else {
        for (p, d) in dst.chunks_exact_mut(w).enumerate() {
            let s0 = base + p * ps;
            for (l, x) in d[..lanes].iter_mut().enumerate() {
                *x = src[s0 + l * ls];
            }
            d[lanes..].fill(0.0);
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
    (@nv $f:ident, $r:literal, $nv:expr, [$($v:literal)*], ($($arg:expr),*)) => {
        match $nv {
            $( $v => $f::<$r, $v>($($arg),*), )*
            _ => unreachable!(),
        }
    };
}

// ---------------------------------------------------------------------------------------------------------
// AVX-512F: 8 × 48 (3 zmm per row)
// ---------------------------------------------------------------------------------------------------------

const MR512: usize = SPEC_AVX512.mr;

/// `C[R×cols] (+)= A·B` for one tile: `a` an A panel (stride MR512 per depth step), `b` a panel of width
/// `16·NV`, `c` the tile's first element with row stride `ldc`; `16·(NV-1) < cols ≤ 16·NV`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx2,fma")]
fn ukr512<const R: usize, const NV: usize>(kc: usize, a: &[f32], b: &[f32], c: &mut [f32], ldc: usize, cols: usize, acc: bool) {
    assert!(R <= MR512 && cols <= 16 * NV && cols + 16 > 16 * NV);
    assert!(a.len() >= MR512 * kc && b.len() >= 16 * NV * kc);
    assert!(c.len() >= (R - 1) * ldc + cols);
    let mut ab = [[_mm512_setzero_ps(); NV]; R];
    let (mut ap, mut bp) = (a.as_ptr(), b.as_ptr());
    for _ in 0..kc {
        let mut bv = [_mm512_setzero_ps(); NV];
        for (v, x) in bv.iter_mut().enumerate() {
            // SAFETY: `bp` points at depth step p < kc of `b`, which holds 16·NV·kc elements (asserted);
            // 16·v + 16 ≤ 16·NV, so the load reads elements of `b`.
            *x = unsafe { _mm512_loadu_ps(bp.add(16 * v)) };
        }
        for (r, row) in ab.iter_mut().enumerate() {
            // SAFETY: `ap` points at depth step p < kc of `a` (MR512·kc elements, asserted) and r < R ≤ MR512.
            let x = _mm512_set1_ps(unsafe { *ap.add(r) });
            for (acc, &y) in row.iter_mut().zip(bv.iter()) {
                *acc = _mm512_fmadd_ps(x, y, *acc);
            }
        }
        // SAFETY: advancing by one depth step stays within (or one past the end of) `a` and `b`.
        unsafe {
            ap = ap.add(MR512);
            bp = bp.add(16 * NV);
        }
    }
    let masks: [__mmask16; NV] = core::array::from_fn(|v| {
        let lanes = (cols - 16 * v).min(16);
        ((1u32 << lanes) - 1) as __mmask16
    });
    for (r, row) in ab.iter().enumerate() {
        for (v, &x) in row.iter().enumerate() {
            // SAFETY: element (r, 16·v + l) of the tile is `c[r·ldc + 16·v + l]`; the mask enables only
            // l with 16·v + l < cols, all < (R-1)·ldc + cols ≤ c.len() (asserted). 16·v < cols, so the base
            // pointer is in bounds too. Masked-off lanes are neither read nor written (no fault).
            unsafe {
                let p = c.as_mut_ptr().add(r * ldc + 16 * v);
                let y = if acc { _mm512_add_ps(x, _mm512_maskz_loadu_ps(masks[v], p)) } else { x };
                _mm512_mask_storeu_ps(p, masks[v], y);
            }
        }
    }
}

impl Kernel for Avx512 {
    const SPEC: Spec = SPEC_AVX512;
    fn pack_a(self, src: &[f32], base: usize, ls: usize, ps: usize, rows: usize, kc: usize, dst: &mut [f32]) {
        // SAFETY: `self` exists only if AVX-512F, AVX2 and FMA were detected (`Avx512::new`).
        unsafe { pack_panel(src, base, ls, ps, rows, MR512, kc, dst) }
    }
    fn pack_b(self, src: &[f32], base: usize, ls: usize, ps: usize, nc: usize, kc: usize, dst: &mut [f32]) {
        pack_b_panels(Self::SPEC, src, base, ls, ps, nc, kc, dst, |s, b, l, p, n, w, k, d| {
            // SAFETY: `self` exists only if AVX-512F, AVX2 and FMA were detected (`Avx512::new`).
            unsafe { pack_panel(s, b, l, p, n, w, k, d) }
        })
    }
    fn tile(self, kc: usize, a: &[f32], b: &[f32], w: usize, c: &mut [f32], ldc: usize, rows: usize, cols: usize, acc: bool) {
        // SAFETY: `self` exists only if AVX-512F, AVX2 and FMA were detected (`Avx512::new`).
        unsafe { dispatch!(ukr512, rows, w / 16, [1 2 3 4 5 6 7 8], [1 2 3], (kc, a, b, c, ldc, cols, acc)) }
    }
}

// ---------------------------------------------------------------------------------------------------------
// AVX2 + FMA: 6 × 16 (2 ymm per row)
// ---------------------------------------------------------------------------------------------------------

const MR256: usize = SPEC_AVX2.mr;

/// As [`ukr512`] with 8-lane vectors: `b` a panel of width `8·NV`, `8·(NV-1) < cols ≤ 8·NV`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
fn ukr256<const R: usize, const NV: usize>(kc: usize, a: &[f32], b: &[f32], c: &mut [f32], ldc: usize, cols: usize, acc: bool) {
    assert!(R <= MR256 && cols <= 8 * NV && cols + 8 > 8 * NV);
    assert!(a.len() >= MR256 * kc && b.len() >= 8 * NV * kc);
    assert!(c.len() >= (R - 1) * ldc + cols);
    let mut ab = [[_mm256_setzero_ps(); NV]; R];
    let (mut ap, mut bp) = (a.as_ptr(), b.as_ptr());
    for _ in 0..kc {
        let mut bv = [_mm256_setzero_ps(); NV];
        for (v, x) in bv.iter_mut().enumerate() {
            // SAFETY: `bp` points at depth step p < kc of `b` (8·NV·kc elements, asserted); 8·v + 8 ≤ 8·NV.
            *x = unsafe { _mm256_loadu_ps(bp.add(8 * v)) };
        }
        for (r, row) in ab.iter_mut().enumerate() {
            // SAFETY: `ap` points at depth step p < kc of `a` (MR256·kc elements, asserted) and r < R ≤ MR256.
            let x = _mm256_set1_ps(unsafe { *ap.add(r) });
            for (acc, &y) in row.iter_mut().zip(bv.iter()) {
                *acc = _mm256_fmadd_ps(x, y, *acc);
            }
        }
        // SAFETY: advancing by one depth step stays within (or one past the end of) `a` and `b`.
        unsafe {
            ap = ap.add(MR256);
            bp = bp.add(8 * NV);
        }
    }
    let lane_ids = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (r, row) in ab.iter().enumerate() {
        for (v, &x) in row.iter().enumerate() {
            let lanes = (cols - 8 * v).min(8);
            // SAFETY: element (r, 8·v + l) of the tile is `c[r·ldc + 8·v + l]` and is in bounds for
            // 8·v + l < cols, since ·ldc + cols ≤ c.len() (asserted); 8·v < cols so the base pointer
            // is in bounds. A full vector (lanes == 8) touches exactly those elements; a partial one uses
            // vmaskmov, which neither reads nor writes (nor faults on) masked-off lanes.
            unsafe {
                let p = c.as_mut_ptr().add(r * ldc + 8 * v);
                if lanes == 8 {
                    let y = if acc { _mm256_add_ps(x, _mm256_loadu_ps(p)) } else { x };
                    _mm256_storeu_ps(p, y);
                } else {
                    let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(lanes as i32), lane_ids);
                    let y = if acc { _mm256_add_ps(x, _mm256_maskload_ps(p, mask)) } else { x };
                    _mm256_maskstore_ps(p, mask, y);
                }
            }
        }
    }
}

impl Kernel for Avx2 {
    const SPEC: Spec = SPEC_AVX2;
    fn pack_a(self, src: &[f32], base: usize, ls: usize, ps: usize, rows: usize, kc: usize, dst: &mut [f32]) {
        // SAFETY: `self` exists only if AVX2 and FMA were detected (`Avx2::new`).
        unsafe { pack_panel(src, base, ls, ps, rows, MR256, kc, dst) }
    }
    fn pack_b(self, src: &[f32], base: usize, ls: usize, ps: usize, nc: usize, kc: usize, dst: &mut [f32]) {
        pack_b_panels(Self::SPEC, src, base, ls, ps, nc, kc, dst, |s, b, l, p, n, w, k, d| {
            // SAFETY: `self` exists only if AVX2 and FMA were detected (`Avx2::new`).
            unsafe { pack_panel(s, b, l, p, n, w, k, d) }
        })
    }
    fn tile(self, kc: usize, a: &[f32], b: &[f32], w: usize, c: &mut [f32], ldc: usize, rows: usize, cols: usize, acc: bool) {
        // SAFETY: `self` exists only if AVX2 and FMA were detected (`Avx2::new`).
        unsafe { dispatch!(ukr256, rows, w / 8, [1 2 3 4 5 6], [1 2], (kc, a, b, c, ldc, cols, acc)) }
    }
}
