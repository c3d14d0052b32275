//! Single-precision GEMM: `C[m×n] = A[m×k]·B[k×n]` (+ `C`), operands addressed by (row, column) strides so
//! transposes cost nothing. The fast path packs panels of A and B into caller-provided scratch (from the
//! arena), so a GEMM never allocates.
//!
//! # Design (BLIS-style, loops mirrored so the broadcast operand A is the L1-resident one)
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

fn round_up(a: usize, b: usize) -> usize {
    a.div_ceil(b) * b
}
/// Splits `len` into `ceil(len / cap)` near-equal blocks and returns the block size.
fn balanced(len: usize, cap: usize) -> usize {
    len.div_ceil(len.div_ceil(cap))
}

/// The block sizes used for one product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Blocking {
    /// Depth block (every k block but the last has exactly this size).
    kc: usize,
    /// Column block, a multiple of NR (every n block but the last has exactly this size).
    nc: usize,
    /// Elements of the packed A region (`mr·kc` rounded up to [`ALIGN`]).
    a_len: usize,
    /// Elements of the packed B region.
    b_len: usize,
}

impl Blocking {
    /// Block sizes for `n×k` with caps `kc_cap`, `nc_cap` (`nc_cap` a multiple of `spec.nr`).
    fn new(spec: Spec, n: usize, k: usize, kc_cap: usize, nc_cap: usize) -> Self {
        let kc = balanced(k, kc_cap);
        let nc = round_up(balanced(n, nc_cap), spec.nr);
        // The widest block is min(nc, n) columns: full panels of nr, then one panel rounded up to vl.
        let b_len = kc * round_up(nc.min(n), spec.vl);
        let a_len = round_up(spec.mr * kc, ALIGN);
        Self {
            kc,
            nc,
            a_len,
            b_len,
        }
    }
    fn len(&self) -> usize {
        self.a_len + self.b_len
    }
}

/// Scratch elements one kernel needs for `m×n×k` (0 when there is nothing to multiply).
fn spec_scratch_len(spec: Spec, m: usize, n: usize, k: usize) -> usize {
    if m == 0 || n == 0 || k == 0 {
        return 0;
    }
    (ALIGN - 1) + Blocking::new(spec, n, k, KC, NC).len()
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
        .map(|&s| Blocking::new(s, n, k, KC, NC).a_len)
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
    if m == 0 || n == 0 {
        return;
    }
    assert!(m == 1 || ldc >= n, "sgemm: ldc ({ldc}) < n ({n})");
    let c_need = (m - 1).checked_mul(ldc).and_then(|x| x.checked_add(n));
    assert!(
        c_need.is_some_and(|need| c.len() >= need),
        "sgemm: C too short"
    );
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                c[i * ldc..i * ldc + n].fill(0.0);
            }
        }
        return;
    }
    // These two checks are what makes every packing read below in bounds: any element (i, p) with
    // i < m, p < k has index ≤ (m-1)·rs + (k-1)·cs < len, and that sum does not overflow.
    assert!(addressable(a, m, k), "sgemm: A too short for its strides");
    assert!(addressable(b, k, n), "sgemm: B too short for its strides");
    let p = Problem {
        m,
        n,
        k,
        a,
        b,
        ldc,
        accumulate,
    };
    match kernel {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        SgemmKernel::Avx512 => {
            if let Some(kern) = x86::Avx512::new() {
                return drive(kern, &p, c, scratch, pool);
            }
        }
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        SgemmKernel::Avx2 => {
            if let Some(kern) = x86::Avx2::new() {
                return drive(kern, &p, c, scratch, pool);
            }
        }
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128", not(miri)))]
        SgemmKernel::Simd128 => return drive(wasm::Simd128, &p, c, scratch, pool),
        #[cfg(all(target_arch = "aarch64", not(miri)))]
        SgemmKernel::Neon => return drive(aarch64::Neon, &p, c, scratch, pool),
        _ => {}
    }
    drive(Portable, &p, c, scratch, pool)
}

/// Whether every element (i < rows, j < cols) of `x` is inside `x.data` (rows, cols ≥ 1).
fn addressable(x: MatRef<'_, f32>, rows: usize, cols: usize) -> bool {
    (rows - 1)
        .checked_mul(x.rs)
        .and_then(|r| (cols - 1).checked_mul(x.cs).and_then(|c| r.checked_add(c)))
        .is_some_and(|last| last < x.data.len())
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

/// One validated product (`m, n, k ≥ 1`, operands addressable, `C` long enough, `ldc ≥ n` if `m > 1`).
struct Problem<'a> {
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<'a, f32>,
    b: MatRef<'a, f32>,
    ldc: usize,
    accumulate: bool,
}

/// One register tile's operands: `C[rows×cols] (+)= A·B` over `kc` depth steps, where `C` (passed
/// alongside) starts at the tile's first element with row stride `ldc`.
#[derive(Clone, Copy, Debug)]
struct Tile<'a> {
    kc: usize,
    /// A rows: element (r, p) at `r·a_rs + p·a_ps`; a packed panel (`a_rs = 1`, `a_ps = mr`) or A in place.
    a: &'a [f32],
    a_rs: usize,
    a_ps: usize,
    /// B rows: element (p, j) at `p·ldb + j`; either a packed panel (`ldb` its width) or B in place.
    b: &'a [f32],
    ldb: usize,
    /// Whether every B row holds `round_up(cols, vl)` readable elements (a zero-padded packed panel).
    b_padded: bool,
    ldc: usize,
    rows: usize,
    cols: usize,
    /// Add to C instead of overwriting it.
    acc: bool,
}

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
/// A panel then feeds at most two register tiles, too few to pay for copying it.
const A_IN_PLACE_MAX_N: usize = 96;

/// Products with fewer multiply-adds than this per task are not split across workers (the fork-join
/// costs a few microseconds).
const PAR_MIN_FMAS: usize = if cfg!(test) { 16 } else { 1 << 18 };

/// The blocked product. With a pool of more than one worker, each (jc, pc) block is two fork-joins:
/// the B block is packed panel range by panel range, then the register-tile rows of C are split into
/// contiguous bands, one per task. Every tile is computed exactly as with one worker (same blocks, same
/// kernel, same depth order), so the result does not depend on the worker count. Task 0 packs A into
/// the block's A region; task `w ≥ 1` into the `w`-th extra A region after the block when the scratch
/// has it, else it reads A in place (the SIMD kernels compute the same values either way).
fn drive<K: Kernel>(
    kern: K,
    p: &Problem<'_>,
    c: &mut [f32],
    scratch: &mut [f32],
    pool: &dyn WorkerPool,
) {
    let spec = K::SPEC;
    let (m, n, k, a, b, ldc) = (p.m, p.n, p.k, p.a, p.b, p.ldc);
    let b_in_place = K::B_IN_PLACE
        && b.cs == 1
        && (k.saturating_mul(n) <= B_IN_PLACE_L1
            || (m <= B_IN_PLACE_MAX_M && (m <= 8 || b.rs <= B_IN_PLACE_MAX_RS)));
    let a_in_place = K::A_IN_PLACE && (a.rs == 1 || a.cs == 1) && n <= A_IN_PLACE_MAX_N;
    let Some((blk, off)) = fit(spec, n, k, !a_in_place, !b_in_place, scratch) else {
        return unpacked(p, c);
    };
    let mr = spec.mr;
    let mt = m.div_ceil(mr);
    // Layout: [B block | A region of task 0 | extra A regions …]; B first keeps it 64-byte aligned.
    let (bpack, a_all) = scratch[off..].split_at_mut(blk.b_len);
    let extra_a = a_all
        .len()
        .checked_div(blk.a_len)
        .map_or(usize::MAX, |r| r - 1);
    let mut tasks =
        par::tasks_for(pool, m.saturating_mul(n).saturating_mul(k), PAR_MIN_FMAS).min(mt);
    if !K::A_IN_PLACE {
        tasks = tasks.min(extra_a.saturating_add(1));
    }
    let a_regions = if blk.a_len == 0 {
        0
    } else {
        tasks.min(extra_a.saturating_add(1))
    };
    let c_end = (m - 1) * ldc + n;
    let rows_of = |w: usize| {
        let t = crate::pool::chunk(mt, tasks, 1, w);
        (t.start * mr).min(m)..(t.end * mr).min(m)
    };
    for jc in (0..n).step_by(blk.nc) {
        let nc = blk.nc.min(n - jc);
        let npanels = nc.div_ceil(spec.nr);
        for (pi, pc) in (0..k).step_by(blk.kc).enumerate() {
            let kc = blk.kc.min(k - pc);
            if !b_in_place {
                let ptasks = tasks.min(npanels);
                // Panel q starts at element q·nr·kc of the block; the last one may be narrower.
                let width =
                    (npanels - 1) * spec.nr + panel_width(spec, nc, (npanels - 1) * spec.nr);
                let at = |q: usize| kc * if q < npanels { q * spec.nr } else { width };
                let span = |w: usize| {
                    let q = crate::pool::chunk(npanels, ptasks, 1, w);
                    let j0 = (q.start * spec.nr).min(nc);
                    let j1 = (q.end * spec.nr).min(nc);
                    (j0, j1, at(q.start)..at(q.end))
                };
                let pack = |w: usize, dst: &mut [f32]| {
                    let (j0, j1, _) = span(w);
                    if j1 > j0 {
                        let base = pc * b.rs + (jc + j0) * b.cs;
                        kern.pack_b(b.data, base, b.cs, b.rs, j1 - j0, kc, dst);
                    }
                };
                if ptasks == 1 {
                    pack(0, &mut bpack[..]);
                } else {
                    let sh = par::Shards::new(&mut bpack[..], ptasks, |w| span(w).2);
                    pool.run(ptasks, &|w| pack(w, sh.take(w)));
                }
            }
            let bpack = &*bpack;
            let acc = p.accumulate || pi > 0;
            // Rows `rows` of C (its band `cb` starts at row `rows.start`), A packed into `ap` if given.
            let body =
                |rows: core::ops::Range<usize>, cb: &mut [f32], mut ap: Option<&mut [f32]>| {
                    for ir in rows.clone().step_by(mr) {
                        let rows_t = mr.min(m - ir);
                        let a0 = ir * a.rs + pc * a.cs;
                        let (at, a_rs, a_ps) = match ap.as_deref_mut() {
                            Some(ap) if !a_in_place => {
                                let ap = &mut ap[..spec.mr * kc];
                                kern.pack_a(a.data, a0, a.rs, a.cs, rows_t, kc, ap);
                                (&*ap, 1, spec.mr)
                            }
                            _ => (
                                &a.data[a0..a0 + (rows_t - 1) * a.rs + (kc - 1) * a.cs + 1],
                                a.rs,
                                a.cs,
                            ),
                        };
                        for jr in (0..nc).step_by(spec.nr) {
                            let cols = spec.nr.min(nc - jr);
                            let (bt, ldb) = if b_in_place {
                                let b0 = pc * b.rs + jc + jr;
                                (&b.data[b0..b0 + (kc - 1) * b.rs + cols], b.rs)
                            } else {
                                let w = panel_width(spec, nc, jr);
                                (&bpack[jr * kc..jr * kc + w * kc], w)
                            };
                            let t = Tile {
                                kc,
                                a: at,
                                a_rs,
                                a_ps,
                                b: bt,
                                ldb,
                                b_padded: !b_in_place,
                                ldc,
                                rows: rows_t,
                                cols,
                                acc,
                            };
                            let c0 = (ir - rows.start) * ldc + jc + jr;
                            kern.tile(&t, &mut cb[c0..c0 + (rows_t - 1) * ldc + cols]);
                        }
                    }
                };
            if tasks == 1 {
                body(0..m, &mut c[..c_end], Some(&mut a_all[..blk.a_len]));
            } else {
                let cs = par::Shards::new(&mut c[..c_end], tasks, |w| {
                    let r = rows_of(w);
                    let start = (r.start * ldc).min(c_end);
                    start..if r.end == m { c_end } else { r.end * ldc }
                });
                let asl =
                    par::Shards::new(&mut a_all[..a_regions * blk.a_len], a_regions.max(1), |w| {
                        if a_regions == 0 {
                            0..0
                        } else {
                            w * blk.a_len..(w + 1) * blk.a_len
                        }
                    });
                pool.run(tasks, &|w| {
                    let ap = (w < a_regions).then(|| asl.take(w));
                    body(rows_of(w), cs.take(w), ap);
                });
            }
        }
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
    let ideal = strip(Blocking::new(spec, n, k, KC, NC));
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
    let blk = strip(Blocking::new(spec, n, k, kc_cap, spec.nr));
    (blk.len() <= len).then_some((blk, 0))
}

/// Correct, slower product without packing, for a scratch too short to hold even one panel pair.
fn unpacked(p: &Problem<'_>, c: &mut [f32]) {
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
