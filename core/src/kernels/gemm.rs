//! Single-precision GEMM: `C[m×n] = A[m×k]·B[k×n]` (+ `C`), operands addressed by (row, column) strides so
//! transposes cost nothing. The fast path packs panels of A and B into caller-provided scratch (from the
//! arena), so a GEMM never allocates.
//!
//! # Design (BLIS-style, loops mirrored so the broadcast operand A is the L1-resident one)
//!
//! The loops, edges, packing and threading are `kernels::blocked`'s driver, shared with the int8 GEMM;
//! this module supplies the f32 layouts, block sizes, in-place rules and micro-kernels (`F32<K>`).
//!
//! ```text
//! for jc in n by NC:                      B block (KC×NC, packed once per (jc, pc)) lives in L2
//!   for pc in k by KC:
//!     pack B[pc.., jc..] into column panels of NR (last panel only as wide as needed)
//!     for ir in m by MR:
//!       pack A[ir.., pc..] into one MR×KC panel (stays in L1)
//!       for jr in NC by NR:
//!         micro-kernel: C[ir.., jc+jr..] (+)= Apanel · Bpanel   (register tile MR×NR, FMA)
//! ```
//!
//! C is row-major, so the SIMD direction is along `n`: the micro-kernels load NR-wide rows of B and
//! broadcast single elements of A. Edge tiles use exact-height kernel variants (monomorphised for every
//! row count ≤ MR) and masked (AVX2: mask-moved) loads and stores for partial columns: no temporary tile,
//! no wasted rows.
//!
//! | kernel    | MR × NR | register tile                     | selected when                          |
//! |-----------|---------|-----------------------------------|----------------------------------------|
//! | `avx512`  | 8 × 48  | 24 zmm accumulators, 3 zmm of B   | x86-64 with AVX-512F (+AVX2, FMA)      |
//! | `avx2`    | 6 × 16  | 12 ymm accumulators, 2 ymm of B   | x86-64 with AVX2 + FMA                 |
//! | `simd128` | 4 × 8   | 8 v128 accumulators, 2 v128 of B  | wasm32 with `simd128` (compile time)   |
//! | `neon`    | 8 × 12  | 24 q accumulators, 3 q of B, 2 of A | aarch64 (NEON is baseline)           |
//! | `portable`| 4 × 8   | plain Rust arrays, autovectorised | everything else, and always under Miri |
//!
//! (`portable` is 4 × 4 on 32-bit Arm, whose FPU has 32 single registers; on aarch64 LLVM turns it into
//! 128-bit vector code without fusing the multiply and the add, hence the explicit `neon` kernel, whose
//! `fmla` by lane does 8 FLOPs per instruction. On wasm32 it is not vectorised at the opt-level "s" of the browser build, hence
//! the explicit `simd128` kernel, which has no FMA: `f32x4.mul` + `f32x4.add`.)
//!
//! Packing is skipped where it cannot pay for itself (the SIMD kernels read the operand in place):
//! * a row-major B when it is small (k·n ≤ 8192, it stays in L1), or when m ≤ 64 and either m ≤ 8 or
//!   B's row stride is ≤ 512 (each B element feeds few FMAs; large, power-of-two strides defeat the
//!   prefetchers, so there B is still packed);
//! * A (row- or column-major) when n ≤ 96: each A panel would feed at most two tiles.
//!
//! Kernel choice: with the crate feature `std` the CPU is probed once (`is_x86_feature_detected!`) and the
//! choice cached in an atomic; without `std` it is fixed at compile time by `cfg(target_feature)`. On
//! aarch64 `neon` is always chosen (`FRUGAL_SGEMM=portable` forces the portable kernel with `std`).
//! [`sgemm_with`] runs a chosen family (tests, benchmarks).
//!
//! Blocking: `KC = 256`, `NC = 1008` (a multiple of every NR); both are balanced so the blocks are
//! near-equal (k = 784 → 4 blocks of 196, not 3 of 256 and one of 16). See [`gemm_scratch_len`].
//!
//! Safety: `unsafe` is confined to the x86, aarch64 and wasm modules (intrinsics on raw pointers, and calls into
//! `#[target_feature]` functions, allowed only through kernel values that exist after detection); every
//! block states why its accesses are in bounds. Operand extents are checked once per call
//! ([`sgemm_with`] panics on short operands), slices are re-checked per tile.
use super::blocked::{self, balanced, round_up, Blocking, Micro, Problem};
use super::par;
use super::Real;
use crate::pool::{SingleThread, WorkerPool};

#[cfg(all(target_arch = "aarch64", not(miri)))]
mod aarch64;
#[cfg(test)]
mod tests;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128", not(miri)))]
mod wasm;
#[cfg(all(target_arch = "x86_64", not(miri)))]
mod x86;

/// A read-only matrix view: element (i, j) is `data[i * rs + j * cs]`.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a, T> {
    /// Backing slice; must hold every addressed element.
    pub data: &'a [T],
    /// Row stride in elements.
    pub rs: usize,
    /// Column stride in elements.
    pub cs: usize,
}

impl<'a, T> MatRef<'a, T> {
    /// Row-major matrix with `cols` columns.
    pub fn row_major(data: &'a [T], cols: usize) -> Self {
        Self {
            data,
            rs: cols,
            cs: 1,
        }
    }
    /// The transpose of a row-major matrix with `cols` columns (i.e. column-major view).
    pub fn row_major_t(data: &'a [T], cols: usize) -> Self {
        Self {
            data,
            rs: 1,
            cs: cols,
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// Blocking and the scratch formula
// ---------------------------------------------------------------------------------------------------------

/// Depth (k) block cap: an MR×KC panel of A (8 KiB for the AVX-512 kernel) stays in L1.
const KC: usize = 256;
/// Column (n) block cap: a KC×NC block of B (≤ 1 MiB) stays in L2. Multiple of every kernel's NR.
const NC: usize = 1008;
/// Packed regions start on a 64-byte boundary when the scratch has room for it (≤ 15 elements of slack).
const ALIGN: usize = 16;

/// Register-tile geometry of one micro-kernel.
#[derive(Clone, Copy, Debug)]
struct Spec {
    /// Rows of the register tile (height of a packed A panel).
    mr: usize,
    /// Columns of the register tile (width of a full packed B panel).
    nr: usize,
    /// Granularity of the last, partial B panel's width (the SIMD width; `nr` for the portable kernel).
    vl: usize,
}

#[cfg(target_arch = "arm")]
const PORTABLE_NR: usize = 4;
#[cfg(not(target_arch = "arm"))]
const PORTABLE_NR: usize = 8;
const PORTABLE_MR: usize = 4;

const SPEC_PORTABLE: Spec = Spec {
    mr: PORTABLE_MR,
    nr: PORTABLE_NR,
    vl: PORTABLE_NR,
};
const SPEC_AVX2: Spec = Spec {
    mr: 6,
    nr: 16,
    vl: 8,
};
const SPEC_AVX512: Spec = Spec {
    mr: 8,
    nr: 48,
    vl: 16,
};
const SPEC_SIMD128: Spec = Spec {
    mr: 4,
    nr: 8,
    vl: 4,
};
const SPEC_NEON: Spec = Spec {
    mr: 8,
    nr: 12,
    vl: 4,
};
/// Every kernel this crate has on any target: the scratch formula is the maximum over them, so a plan
/// sized on one machine is valid (fast path included) on every other.
const ALL_SPECS: [Spec; 5] = [
    SPEC_PORTABLE,
    SPEC_AVX2,
    SPEC_AVX512,
    SPEC_SIMD128,
    SPEC_NEON,
];

/// Block sizes for `n×k` with caps `kc_cap`, `nc_cap` (`nc_cap` a multiple of `spec.nr`).
fn blocking(spec: Spec, n: usize, k: usize, kc_cap: usize, nc_cap: usize) -> Blocking {
    let kc = balanced(k, kc_cap);
    let nc = round_up(balanced(n, nc_cap), spec.nr);
    // The widest block is min(nc, n) columns: full panels of nr, then one panel rounded up to vl.
    let b_len = kc * round_up(nc.min(n), spec.vl);
    let a_len = round_up(spec.mr * kc, ALIGN);
    Blocking {
        kc,
        nc,
        a_len,
        b_len,
    }
}

/// Scratch elements one kernel needs for `m×n×k` (0 when there is nothing to multiply).
fn spec_scratch_len(spec: Spec, m: usize, n: usize, k: usize) -> usize {
    if m == 0 || n == 0 || k == 0 {
        return 0;
    }
    (ALIGN - 1) + blocking(spec, n, k, KC, NC).len()
}

/// Scratch elements (f32) that [`gemm`] needs for an `m×n×k` product; the plan reserves this much.
///
/// With `kc = ceil(k / ceil(k/256))` (≤ 256, ≤ k) and `nc = min(n, ceil(n / ceil(n/1008)) rounded up to
/// 48)` (≤ 1008), this is the maximum over all kernels of
/// `15 + round_up(MR·kc, 16) + kc·round_up(nc, VL)`, i.e. for the AVX-512 kernel (the largest)
/// `15 + round_up(8·kc, 16) + kc·round_up(nc, 16)`: at most 15 + 2048 + 258 048 elements (≈ 1 MiB)
/// however large the product, and proportional to the operands when they are small (8×9×784 → 4 719
/// elements, 18 KiB). It does not depend on the CPU, so a plan made on one machine holds on another.
/// It is 0 when `m`, `n` or `k` is 0. A shorter scratch still works (smaller blocks, or an unpacked loop).
pub fn gemm_scratch_len(m: usize, n: usize, k: usize) -> usize {
    ALL_SPECS
        .iter()
        .map(|&s| spec_scratch_len(s, m, n, k))
        .max()
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------------------
// Public entry points
// ---------------------------------------------------------------------------------------------------------

/// Scratch elements (f32) that [`sgemm_par`] needs so that each of `threads` workers packs its own A
/// panels: [`gemm_scratch_len`] plus, per worker beyond the first, one A panel region
/// (`round_up(MR·kc, 16)`, at most 2 048 elements). With less (down to [`gemm_scratch_len`]) the
/// extra workers read A in place (same result); `threads ≤ 1` gives exactly [`gemm_scratch_len`].
pub fn gemm_scratch_len_threads(m: usize, n: usize, k: usize, threads: usize) -> usize {
    let base = gemm_scratch_len(m, n, k);
    if base == 0 || threads <= 1 {
        return base;
    }
    let a_len = ALL_SPECS
        .iter()
        .map(|&s| blocking(s, n, k, KC, NC).a_len)
        .max()
        .unwrap_or(0);
    base + (threads.min(par::MAX_TASKS) - 1) * a_len
}

/// [`gemm`] on the workers of `pool` (f32: [`sgemm_par`]; other types run on the calling thread).
#[allow(clippy::too_many_arguments)]
pub fn gemm_par<T: Real>(
    pool: &dyn WorkerPool,
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<'_, T>,
    b: MatRef<'_, T>,
    c: &mut [T],
    ldc: usize,
    accumulate: bool,
    scratch: &mut [T],
) {
    T::gemm_par(pool, m, n, k, a, b, c, ldc, accumulate, scratch)
}

/// `C = A·B` (or `C += A·B` when `accumulate`) for any [`Real`]; `C` is row-major with row stride `ldc`.
#[allow(clippy::too_many_arguments)]
pub fn gemm<T: Real>(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<'_, T>,
    b: MatRef<'_, T>,
    c: &mut [T],
    ldc: usize,
    accumulate: bool,
    scratch: &mut [T],
) {
    T::gemm(m, n, k, a, b, c, ldc, accumulate, scratch)
}

/// The f32 micro-kernel families. [`sgemm`] uses [`SgemmKernel::selected`]; [`sgemm_with`] forces one
/// (benchmarks, tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SgemmKernel {
    /// Plain Rust (autovectorised), every target.
    Portable,
    /// x86-64 AVX2 + FMA, 6×16 register tile.
    Avx2,
    /// x86-64 AVX-512F, 8×48 register tile.
    Avx512,
    /// wasm32 `simd128` (chosen at compile time, `-C target-feature=+simd128`), 4×8 register tile.
    Simd128,
    /// aarch64 NEON (baseline), 8×12 register tile, `fmla` by lane.
    Neon,
}

impl SgemmKernel {
    /// Short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Portable => "portable",
            Self::Avx2 => "avx2+fma",
            Self::Avx512 => "avx512f",
            Self::Simd128 => "simd128",
            Self::Neon => "neon",
        }
    }

    /// Whether this kernel can run on this CPU (and build).
    pub fn is_available(self) -> bool {
        match self {
            Self::Portable => true,
            #[cfg(all(target_arch = "x86_64", not(miri)))]
            Self::Avx2 => x86::Avx2::new().is_some(),
            #[cfg(all(target_arch = "x86_64", not(miri)))]
            Self::Avx512 => x86::Avx512::new().is_some(),
            #[cfg(all(target_arch = "wasm32", target_feature = "simd128", not(miri)))]
            Self::Simd128 => true,
            #[cfg(all(target_arch = "aarch64", not(miri)))]
            Self::Neon => true,
            _ => false,
        }
    }

    /// The fastest available kernel (probed once and cached with `std`; fixed at compile time without).
    pub fn selected() -> Self {
        #[cfg(all(
            any(feature = "std", test),
            any(target_arch = "x86_64", target_arch = "aarch64"),
            not(miri)
        ))]
        {
            use core::sync::atomic::{AtomicU8, Ordering};
            static CHOICE: AtomicU8 = AtomicU8::new(0);
            match CHOICE.load(Ordering::Relaxed) {
                1 => Self::Portable,
                2 => Self::Avx2,
                3 => Self::Avx512,
                4 => Self::Neon,
                _ => {
                    // FRUGAL_SGEMM=portable|avx2|avx512|neon forces a family (when available) for a whole
                    // process: benchmarks measure an older CPU's kernel on a newer one.
                    let forced = std::env::var("FRUGAL_SGEMM").ok().and_then(|v| {
                        let k = [Self::Portable, Self::Avx2, Self::Avx512, Self::Neon]
                            .into_iter()
                            .find(|k| k.name().starts_with(v.as_str()) && k.is_available());
                        if k.is_none() {
                            // Said, not silent: the run would otherwise measure another kernel.
                            std::eprintln!(
                                "FRUGAL_SGEMM={v}: no such kernel available on this CPU; using {}",
                                Self::best().name()
                            );
                        }
                        k
                    });
                    let best = forced.unwrap_or_else(Self::best);
                    // Races are benign: every thread computes the same answer.
                    let code = match best {
                        Self::Portable => 1,
                        Self::Avx2 => 2,
                        Self::Avx512 => 3,
                        Self::Neon => 4,
                        // Not an x86-64 or aarch64 kernel: never the best here.
                        Self::Simd128 => 1,
                    };
                    CHOICE.store(code, Ordering::Relaxed);
                    best
                }
            }
        }
        #[cfg(not(all(
            any(feature = "std", test),
            any(target_arch = "x86_64", target_arch = "aarch64"),
            not(miri)
        )))]
        {
            Self::best()
        }
    }

    fn best() -> Self {
        if Self::Simd128.is_available() {
            Self::Simd128
        } else if Self::Neon.is_available() {
            Self::Neon
        } else if Self::Avx512.is_available() {
            Self::Avx512
        } else if Self::Avx2.is_available() {
            Self::Avx2
        } else {
            Self::Portable
        }
    }
}

/// f32 GEMM (fast path): packs into `scratch` (see [`gemm_scratch_len`]) and runs the best micro-kernel
/// for this CPU. Never allocates. A `scratch` shorter than [`gemm_scratch_len`] is allowed: smaller blocks
/// are used, and with (almost) none an unpacked loop.
///
/// # Panics
/// When an operand is too short for the addressed elements, or `ldc < n` with `m > 1` (rows of C overlap).
#[allow(clippy::too_many_arguments)]
pub fn sgemm(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<'_, f32>,
    b: MatRef<'_, f32>,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
    scratch: &mut [f32],
) {
    sgemm_with(
        SgemmKernel::selected(),
        m,
        n,
        k,
        a,
        b,
        c,
        ldc,
        accumulate,
        scratch,
    )
}

/// [`sgemm`] with a chosen kernel family; falls back to [`SgemmKernel::Portable`] when `kernel` is not
/// available on this CPU.
///
/// # Panics
/// As [`sgemm`].
#[allow(clippy::too_many_arguments)]
pub fn sgemm_with(
    kernel: SgemmKernel,
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<'_, f32>,
    b: MatRef<'_, f32>,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
    scratch: &mut [f32],
) {
    sgemm_with_pool(
        kernel,
        &SingleThread,
        m,
        n,
        k,
        a,
        b,
        c,
        ldc,
        accumulate,
        scratch,
    )
}

/// [`sgemm`] on the workers of `pool` (rows of C split into bands; see [`gemm_scratch_len_threads`] for
/// the scratch that lets every worker pack its own A panels). The result is bit-identical to
/// [`sgemm`] with the same `scratch` length, for any pool.
///
/// # Panics
/// As [`sgemm`].
#[allow(clippy::too_many_arguments)]
pub fn sgemm_par(
    pool: &dyn WorkerPool,
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<'_, f32>,
    b: MatRef<'_, f32>,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
    scratch: &mut [f32],
) {
    let kernel = SgemmKernel::selected();
    sgemm_with_pool(kernel, pool, m, n, k, a, b, c, ldc, accumulate, scratch)
}

/// [`sgemm_with`] on the workers of `pool` (see [`sgemm_par`]).
///
/// # Panics
/// As [`sgemm`].
#[allow(clippy::too_many_arguments)]
pub fn sgemm_with_pool(
    kernel: SgemmKernel,
    pool: &dyn WorkerPool,
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<'_, f32>,
    b: MatRef<'_, f32>,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
    scratch: &mut [f32],
) {
    let Some(p) = blocked::validate("sgemm", m, n, k, a, b, c, ldc, accumulate) else {
        return;
    };
    match kernel {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        SgemmKernel::Avx512 => {
            if let Some(kern) = x86::Avx512::new() {
                return blocked::drive(F32(kern), &p, c, scratch, pool);
            }
        }
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        SgemmKernel::Avx2 => {
            if let Some(kern) = x86::Avx2::new() {
                return blocked::drive(F32(kern), &p, c, scratch, pool);
            }
        }
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128", not(miri)))]
        SgemmKernel::Simd128 => return blocked::drive(F32(wasm::Simd128), &p, c, scratch, pool),
        #[cfg(all(target_arch = "aarch64", not(miri)))]
        SgemmKernel::Neon => return blocked::drive(F32(aarch64::Neon), &p, c, scratch, pool),
        _ => {}
    }
    blocked::drive(F32(Portable), &p, c, scratch, pool)
}

/// Plain triple loop, the oracle for every fast kernel and the f64 path.
#[allow(clippy::too_many_arguments)]
pub fn gemm_reference<T: Real>(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<'_, T>,
    b: MatRef<'_, T>,
    c: &mut [T],
    ldc: usize,
    accumulate: bool,
) {
    for i in 0..m {
        for j in 0..n {
            let mut s = T::ZERO;
            for p in 0..k {
                s += a.data[i * a.rs + p * a.cs] * b.data[p * b.rs + j * b.cs];
            }
            let dst = &mut c[i * ldc + j];
            *dst = if accumulate { *dst + s } else { s };
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// The blocked driver, generic over the micro-kernel family
// ---------------------------------------------------------------------------------------------------------

/// One register tile (see [`blocked::Tile`]).
type Tile<'a> = blocked::Tile<'a, f32>;

/// A micro-kernel family: packing routines plus the register-tile kernel.
///
/// Packed layouts: an A panel holds `mr` rows: element (r, p) at `p·mr + r`. A B panel of width `w`
/// (`nr`, or less for the last panel, a multiple of `vl`) holds element (p, j) at `p·w + j`. Panel `q`
/// of a B block starts at `q·nr·kc`. Rows/columns past the edge are zero where a kernel reads them
/// (portable: both; AVX2: B columns), else left as they were (exact-height kernels, masked loads).
trait Kernel: Copy + Sync {
    const SPEC: Spec;
    /// Whether [`Kernel::tile`] can read a row-major B in place (`b_padded == false`).
    const B_IN_PLACE: bool;
    /// Whether [`Kernel::tile`] can read A in place (any `a_rs`, `a_ps`).
    const A_IN_PLACE: bool;
    /// A row-major A is read in place rather than packed when C has at most this many columns.
    const A_ROWS_IN_PLACE_MAX_N: usize = A_IN_PLACE_MAX_N;
    /// A column-major A is read in place at any width when its depth stride is at most this.
    const A_COLS_IN_PLACE_MAX_LD: usize = 0;
    /// Packs one A panel: `rows ≤ mr` lanes with stride `ls`, `kc` deep with stride `ps`, starting at
    /// `base` in `src`, into `dst[..mr·kc]`.
    #[allow(clippy::too_many_arguments)]
    fn pack_a(
        self,
        src: &[f32],
        base: usize,
        ls: usize,
        ps: usize,
        rows: usize,
        kc: usize,
        dst: &mut [f32],
    );
    /// Packs a B block of `nc` columns (stride `ls`), `kc` deep (stride `ps`), into consecutive panels.
    #[allow(clippy::too_many_arguments)]
    fn pack_b(
        self,
        src: &[f32],
        base: usize,
        ls: usize,
        ps: usize,
        nc: usize,
        kc: usize,
        dst: &mut [f32],
    );
    /// Runs one register tile.
    fn tile(self, t: &Tile<'_>, c: &mut [f32]);
}

/// Width of the B panel starting at column `j` of a block of `nc` columns.
fn panel_width(spec: Spec, nc: usize, j: usize) -> usize {
    spec.nr.min(round_up(nc - j, spec.vl))
}

/// Packs the B block panel by panel with `pack_panel(src, base, ls, ps, lanes, w, kc, dst)`.
#[allow(clippy::too_many_arguments)]
fn pack_b_panels(
    spec: Spec,
    src: &[f32],
    base: usize,
    ls: usize,
    ps: usize,
    nc: usize,
    kc: usize,
    dst: &mut [f32],
    mut pack_panel: impl FnMut(&[f32], usize, usize, usize, usize, usize, usize, &mut [f32]),
) {
    for j in (0..nc).step_by(spec.nr) {
        let w = panel_width(spec, nc, j);
        let lanes = spec.nr.min(nc - j);
        pack_panel(
            src,
            base + j * ls,
            ls,
            ps,
            lanes,
            w,
            kc,
            &mut dst[j * kc..j * kc + w * kc],
        );
    }
}

/// A row-major B is read in place instead of packed when A has at most this many rows (so each B element
/// feeds at most 64 FMAs, too few to pay for copying it) and either A has at most 8 rows (one panel: B is
/// read exactly once) or B's row stride is at most [`B_IN_PLACE_MAX_RS`] elements (larger strides, above
/// all powers of two ≥ 1024, defeat the caches and prefetchers; packing wins there).
const B_IN_PLACE_MAX_M: usize = 64;
/// See [`B_IN_PLACE_MAX_M`].
const B_IN_PLACE_MAX_RS: usize = 512;
/// A row-major B of at most this many elements (32 KiB, small k) is always read in place: it stays in L1.
const B_IN_PLACE_L1: usize = 8192;
/// A (row- or column-major) is read in place instead of packed when C has at most this many columns: each
/// A panel then feeds at most two register tiles, too few to pay for copying it. The AVX2 kernel reads a
/// row-major A in place at any width ([`Kernel::A_ROWS_IN_PLACE_MAX_N`]).
const A_IN_PLACE_MAX_N: usize = 96;

/// An f32 kernel family as the shared driver ([`blocked::drive`]) sees it.
#[derive(Clone, Copy)]
struct F32<K>(K);

impl<K: Kernel> Micro for F32<K> {
    type E = f32;
    type C = f32;
    const MR: usize = K::SPEC.mr;
    const NR: usize = K::SPEC.nr;
    const A_IN_PLACE: bool = K::A_IN_PLACE;
    const B_FIRST: bool = true;
    fn a_in_place(p: &Problem<'_, f32>) -> bool {
        K::A_IN_PLACE
            && ((p.a.cs == 1 && p.n <= K::A_ROWS_IN_PLACE_MAX_N)
                || (p.a.rs == 1
                    && (p.n <= A_IN_PLACE_MAX_N || p.a.cs <= K::A_COLS_IN_PLACE_MAX_LD)))
    }
    fn b_in_place(p: &Problem<'_, f32>) -> bool {
        K::B_IN_PLACE
            && p.b.cs == 1
            && (p.k.saturating_mul(p.n) <= B_IN_PLACE_L1
                || (p.m <= B_IN_PLACE_MAX_M && (p.m <= 8 || p.b.rs <= B_IN_PLACE_MAX_RS)))
    }
    fn fit(
        n: usize,
        k: usize,
        pack_a: bool,
        pack_b: bool,
        scratch: &[f32],
    ) -> Option<(Blocking, usize)> {
        fit(K::SPEC, n, k, pack_a, pack_b, scratch)
    }
    fn a_panel(kc: usize) -> usize {
        K::SPEC.mr * kc
    }
    fn b_panel(nc: usize, j: usize, kc: usize) -> (core::ops::Range<usize>, usize) {
        // Panel q starts at element q·nr·kc of the block; the last one may be narrower.
        let w = panel_width(K::SPEC, nc, j);
        (j * kc..j * kc + w * kc, w)
    }
    fn pack_a(
        self,
        a: MatRef<'_, f32>,
        i0: usize,
        p0: usize,
        rows: usize,
        kc: usize,
        dst: &mut [f32],
    ) {
        let base = i0 * a.rs + p0 * a.cs;
        self.0.pack_a(a.data, base, a.rs, a.cs, rows, kc, dst)
    }
    fn pack_b(
        self,
        b: MatRef<'_, f32>,
        p0: usize,
        j0: usize,
        cols: usize,
        kc: usize,
        dst: &mut [f32],
    ) {
        let base = p0 * b.rs + j0 * b.cs;
        self.0.pack_b(b.data, base, b.cs, b.rs, cols, kc, dst)
    }
    fn tile(self, t: &Tile<'_>, c: &mut [f32]) {
        self.0.tile(t, c)
    }
    fn unpacked(p: &Problem<'_, f32>, c: &mut [f32]) {
        unpacked(p, c)
    }
}

/// Block sizes that fit `scratch`, and the offset of the (64-byte aligned when possible) packed region.
/// Regions not packed (`pack_a`, `pack_b` false) get no room. `None` when not even a one-deep panel pair
/// fits.
fn fit(
    spec: Spec,
    n: usize,
    k: usize,
    pack_a: bool,
    pack_b: bool,
    scratch: &[f32],
) -> Option<(Blocking, usize)> {
    let len = scratch.len();
    let off = match scratch.as_ptr().align_offset(64) {
        o if o < ALIGN => o,
        _ => 0,
    };
    let strip = |mut blk: Blocking| {
        if !pack_a {
            blk.a_len = 0;
        }
        if !pack_b {
            blk.b_len = 0;
        }
        blk
    };
    let ideal = strip(blocking(spec, n, k, KC, NC));
    for o in [off, 0] {
        if o + ideal.len() <= len {
            return Some((ideal, o));
        }
    }
    // Degrade: one B panel per block and as deep a k block as fits.
    let per_k = if pack_a { round_up(spec.mr, ALIGN) } else { 0 } // generous: a_len rounds up to ALIGN
        + if pack_b { spec.nr.min(round_up(n, spec.vl)) } else { 0 };
    let kc_cap = (len / per_k).min(KC);
    if kc_cap == 0 {
        return None;
    }
    let blk = strip(blocking(spec, n, k, kc_cap, spec.nr));
    (blk.len() <= len).then_some((blk, 0))
}

/// Correct, slower product without packing, for a scratch too short to hold even one panel pair.
fn unpacked(p: &Problem<'_, f32>, c: &mut [f32]) {
    let (a, b) = (p.a, p.b);
    for i in 0..p.m {
        let row = &mut c[i * p.ldc..i * p.ldc + p.n];
        if b.cs == 1 {
            // Row of C as a sum of scaled rows of B: contiguous, vectorisable.
            let mut t = [0.0f32; 64];
            for j0 in (0..p.n).step_by(64) {
                let cols = 64.min(p.n - j0);
                let t = &mut t[..cols];
                t.fill(0.0);
                for q in 0..p.k {
                    let x = a.data[i * a.rs + q * a.cs];
                    let br = &b.data[q * b.rs + j0..q * b.rs + j0 + cols];
                    for (t, &y) in t.iter_mut().zip(br) {
                        *t += x * y;
                    }
                }
                let dst = &mut row[j0..j0 + cols];
                for (d, &s) in dst.iter_mut().zip(t.iter()) {
                    *d = if p.accumulate { *d + s } else { s };
                }
            }
        } else {
            for (j, d) in row.iter_mut().enumerate() {
                let mut s = 0.0f32;
                for q in 0..p.k {
                    s += a.data[i * a.rs + q * a.cs] * b.data[q * b.rs + j * b.cs];
                }
                *d = if p.accumulate { *d + s } else { s };
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// Portable kernel (safe Rust; LLVM vectorises the fixed-size tile loops)
// ---------------------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
struct Portable;

/// Packs `lanes` lanes (stride `ls`) × `kc` depth (stride `ps`) from `src[base..]` into `dst` with lane
/// stride 1 and depth stride `w`, zero-filling lanes `lanes..w`. Safe, bounds-checked, any strides.
#[allow(clippy::too_many_arguments)]
fn pack_panel_generic(
    src: &[f32],
    base: usize,
    ls: usize,
    ps: usize,
    lanes: usize,
    w: usize,
    kc: usize,
    dst: &mut [f32],
) {
    for (p, d) in dst.chunks_exact_mut(w).take(kc).enumerate() {
        let s0 = base + p * ps;
        if ls == 1 {
            d[..lanes].copy_from_slice(&src[s0..s0 + lanes]);
        } else {
            for (l, x) in d[..lanes].iter_mut().enumerate() {
                *x = src[s0 + l * ls];
            }
        }
        if lanes < w {
            d[lanes..].fill(0.0);
        }
    }
}

/// The register tile `Σ_p a[p] ⊗ b[p]`. Fixed-size rows and a separate function (so nothing around it
/// keeps the accumulators in memory) let LLVM unroll it completely and keep the tile in vector registers.
#[inline(never)]
fn portable_product(
    a: &[[f32; PORTABLE_MR]],
    b: &[[f32; PORTABLE_NR]],
) -> [[f32; PORTABLE_NR]; PORTABLE_MR] {
    let mut acc = [[0.0f32; PORTABLE_NR]; PORTABLE_MR];
    for (ap, bp) in a.iter().zip(b) {
        for (row, &x) in acc.iter_mut().zip(ap) {
            for (s, &y) in row.iter_mut().zip(bp) {
                *s += x * y;
            }
        }
    }
    acc
}

impl Kernel for Portable {
    const SPEC: Spec = SPEC_PORTABLE;
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
        pack_panel_generic(src, base, ls, ps, rows, PORTABLE_MR, kc, dst)
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
        pack_b_panels(
            Self::SPEC,
            src,
            base,
            ls,
            ps,
            nc,
            kc,
            dst,
            pack_panel_generic,
        )
    }
    fn tile(self, t: &Tile<'_>, c: &mut [f32]) {
        debug_assert!(t.b_padded && t.ldb == PORTABLE_NR && t.a_rs == 1 && t.a_ps == PORTABLE_MR);
        let (a, _) = t.a.as_chunks::<PORTABLE_MR>();
        let (b, _) = t.b.as_chunks::<PORTABLE_NR>();
        let acc = portable_product(&a[..t.kc], &b[..t.kc]);
        for (r, row) in acc.iter().enumerate().take(t.rows) {
            let dst = &mut c[r * t.ldc..r * t.ldc + t.cols];
            for (d, &s) in dst.iter_mut().zip(row) {
                *d = if t.acc { *d + s } else { s };
            }
        }
    }
}
