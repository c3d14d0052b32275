//! Integer kernels for int8 training (NITI / Mandheling): an exact int8 × int8 → int32 GEMM, and the
//! power-of-two rescaling that brings int32 results back to int8.
//!
//! # Number format
//!
//! Tensors are int8 with a power-of-two scale held by the caller. Every int8 value this module *produces*
//! lies in the **symmetric range `[-127, 127]`** (so negation is exact and `-x` never saturates); the GEMM
//! *accepts* the full `i8` range, `-128` included. Products accumulate in `i32` with no saturation anywhere:
//! [`igemm`] is exact as long as the true result fits in `i32`, which [`MAX_K`] guarantees for `C = A·B`
//! (with `accumulate`, the caller keeps `C + A·B` in range; an out-of-range sum wraps modulo 2³²).
//!
//! # Rescaling (Mandheling Listing 1, NITI "round and shift")
//!
//! [`max_abs_i32`] → [`shift_for`] (`bit_width(max) − 7`, with `bit_width(v) = 32 − clz(v)`) →
//! [`rescale_i32_to_i8`] (divide by `2^shift`, round, clamp to ±127 and count the clamped values).
//! Stochastic rounding draws its noise from a counter-based hash of `(seed, element index)`, so the result
//! does not depend on how a tensor is split into calls nor on which SIMD kernel ran.
//!
//! # GEMM design
//!
//! The f32 [`sgemm`](super::gemm::sgemm)'s blocked driver (`kernels::blocked`, shared: the loops, edges,
//! packing into scratch; always single-threaded here), with this module's block caps: `k` blocks of at most
//! [`KC`] and `n` blocks of at most [`NC`] are packed into caller scratch ([`igemm_scratch_len`]), then a
//! register-tile micro-kernel runs over `MR × NR` tiles. Packed panels group `G` consecutive depth steps
//! per lane (the unit one SIMD dot-product instruction consumes), zero-padded in `k`, rows and columns:
//!
//! | kernel        | MR × NR | G, element | inner instruction                                        |
//! |---------------|---------|------------|----------------------------------------------------------|
//! | `portable`    | 4 × 8   | 4, i8      | plain Rust                                               |
//! | `avx2`        | 6 × 16  | 2, i16     | `vpmaddwd` on sign-extended pairs (exact; no `vpmaddubsw`, it saturates) |
//! | `avx512-vnni` | 8 × 48  | 4, i8      | `vpdpbusd` with A offset by +128 (u8), minus 128·colsum(B) |
//! | `neon`        | 4 × 16  | 2, i8      | `smull` + `sadalp` (pairs summed in i32: exact)          |
//! | `neon-dot`    | 4 × 16  | 4, i8      | `sdot`                                                   |
//! | `simd128`     | 4 × 8   | 2, i16     | `i32x4.dot_i16x8_s`                                      |
//!
//! Small convolutions, where packing costs more than the multiply, use the packing-free products of
//! [`pairs`] instead ([`igemm_pairs`], [`igemm_dot`], and the im2col row helpers that write their operands);
//! they have AVX2 and NEON (`sdot` where the CPU has it) versions and portable loops elsewhere.
//!
//! Kernel choice follows the f32 GEMM: with the crate feature `std` the CPU is probed once and the choice
//! cached; without it the choice is fixed at compile time by `cfg(target_feature)`. [`igemm_with`] forces
//! a kernel (tests, benchmarks). `unsafe` lives only in the per-architecture modules, each block with the
//! reason its accesses are in bounds.
#[cfg(all(target_arch = "aarch64", not(miri)))]
mod aarch64;
#[cfg(any(test, feature = "std"))]
pub mod offload;
pub mod pairs;
pub mod pool;
#[cfg(test)]
mod tests;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128", not(miri)))]
mod wasm;
#[cfg(all(target_arch = "x86_64", not(miri)))]
mod x86;

pub use pairs::{
    has_simd_pairs, igemm_dot, igemm_dot_with, igemm_pairs, igemm_pairs_with, pair_word, FlatTaps,
    RowWriter,
};

pub use pool::{maxpool2x2, maxpool2x2_grad};

/// Strided read-only matrix view (the f32 GEMM's, generic over the element type).
pub use super::gemm::MatRef;

use super::blocked::{self, balanced, round_up, Blocking, Micro, Problem};
use crate::pool::SingleThread;

/// Largest `k` for which `A·B` is exact in `i32` whatever the int8 values: `k · 128 · 128 ≤ i32::MAX`.
pub const MAX_K: usize = (i32::MAX as usize) / (128 * 128);

/// Depth (k) block cap, in elements.
const KC: usize = 512;
/// Column (n) block cap: a multiple of every kernel's NR (8, 16, 48).
const NC: usize = 768;
/// Packed regions start on a 64-byte boundary when the scratch has room for it.
const ALIGN: usize = 64;

// ---------------------------------------------------------------------------------------------------------
// Kernel geometry and the scratch formula
// ---------------------------------------------------------------------------------------------------------

/// Register tile and packed layout of one micro-kernel family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Spec {
    /// Rows of the register tile (height of a packed A panel).
    mr: usize,
    /// Columns of the register tile (width of a packed B panel).
    nr: usize,
    /// Depth steps grouped per lane in the packed layouts.
    g: usize,
    /// Bytes per packed element: 1 (i8) or 2 (sign-extended i16, little-endian).
    ew: usize,
    /// A is packed offset by +128 (as u8), and each B panel carries its column sums (i32 LE, after the
    /// panel's data) for the correction `−128·Σ_p B[p][j]`.
    offset_a: bool,
}

impl Spec {
    /// Depth groups of a `kc`-deep block.
    fn groups(self, kc: usize) -> usize {
        kc.div_ceil(self.g)
    }
    /// Bytes of one packed A panel.
    fn a_panel(self, kc: usize) -> usize {
        self.groups(kc) * self.mr * self.g * self.ew
    }
    /// Bytes of one packed B panel's data (without the column sums).
    fn b_data(self, kc: usize) -> usize {
        self.groups(kc) * self.nr * self.g * self.ew
    }
    /// Bytes of one packed B panel, column sums included.
    fn b_panel(self, kc: usize) -> usize {
        self.b_data(kc) + if self.offset_a { 4 * self.nr } else { 0 }
    }
}

const SPEC_PORTABLE: Spec = Spec {
    mr: 4,
    nr: 8,
    g: 4,
    ew: 1,
    offset_a: false,
};
const SPEC_AVX2: Spec = Spec {
    mr: 6,
    nr: 16,
    g: 2,
    ew: 2,
    offset_a: false,
};
const SPEC_VNNI: Spec = Spec {
    mr: 8,
    nr: 48,
    g: 4,
    ew: 1,
    offset_a: true,
};
const SPEC_NEON: Spec = Spec {
    mr: 4,
    nr: 16,
    g: 2,
    ew: 1,
    offset_a: false,
};
const SPEC_NEON_DOT: Spec = Spec {
    mr: 4,
    nr: 16,
    g: 4,
    ew: 1,
    offset_a: false,
};
const SPEC_SIMD128: Spec = Spec {
    mr: 4,
    nr: 8,
    g: 2,
    ew: 2,
    offset_a: false,
};
/// Every kernel on every target: the scratch formula is the maximum over them, so a plan sized on one
/// machine holds on every other.
const ALL_SPECS: [Spec; 6] = [
    SPEC_PORTABLE,
    SPEC_AVX2,
    SPEC_VNNI,
    SPEC_NEON,
    SPEC_NEON_DOT,
    SPEC_SIMD128,
];

/// Block sizes for `n×k` with caps `kc_cap`, `nc_cap` (`nc_cap` a multiple of `spec.nr`): `kc` a
/// multiple of 4 unless it is all of `k`, `a_len` one A panel rounded up to [`ALIGN`] bytes.
fn blocking(spec: Spec, n: usize, k: usize, kc_cap: usize, nc_cap: usize) -> Blocking {
    let kc = round_up(balanced(k, kc_cap), 4).min(k);
    let nc = round_up(balanced(n, nc_cap), spec.nr);
    let panels = nc.min(n).div_ceil(spec.nr);
    Blocking {
        kc,
        nc,
        a_len: round_up(spec.a_panel(kc), ALIGN),
        b_len: panels * spec.b_panel(kc),
    }
}

fn spec_scratch_len(spec: Spec, m: usize, n: usize, k: usize) -> usize {
    if m == 0 || n == 0 || k == 0 {
        return 0;
    }
    (ALIGN - 1) + blocking(spec, n, k, KC, NC).len()
}

/// Which int8 GEMM kernels a packing scratch is sized for: a plan records it, because its arena holds
/// the scratch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KernelFamily {
    /// Every kernel of every target (the largest packing, AVX2's i16 panels): a plan made on one machine
    /// runs with the fastest kernel of every other. What hosts plan with.
    #[default]
    Any,
    /// The portable kernel only (4×8 tiles of i8): targets without int8 SIMD, such as Cortex-M, whose
    /// RAM is too short to reserve room for kernels they cannot run. A SIMD kernel still runs such a
    /// plan exactly, in smaller blocks.
    Portable,
}

impl KernelFamily {
    /// Both families.
    pub const ALL: [KernelFamily; 2] = [KernelFamily::Any, KernelFamily::Portable];

    /// Name for reports.
    pub fn name(self) -> &'static str {
        match self {
            KernelFamily::Any => "any",
            KernelFamily::Portable => "portable",
        }
    }

    fn specs(self) -> &'static [Spec] {
        match self {
            KernelFamily::Any => &ALL_SPECS,
            KernelFamily::Portable => &[SPEC_PORTABLE],
        }
    }
}

/// Bytes (i8 elements) of packing scratch that [`igemm`] needs for an `m×n×k` product with any kernel
/// ([`KernelFamily::Any`]; see [`igemm_scratch_len_for`]).
///
/// With `kc = min(k, round_up(ceil(k / ceil(k/512)), 4))` (≤ 512) and `nc = min(n, …)` (≤ 768), this is
/// the maximum over all kernels of `63 + round_up(MR·G'·EW, 64) + ceil(nc/NR)·(NR·G'·EW + colsums)` where
/// `G' = ceil(kc/G)·G`; the largest is the AVX2 kernel's i16 panels: at most about 63 + 6 KiB + 768 KiB
/// however large the product, and proportional to the operands when they are small. It does not depend
/// on the CPU. It is 0 when `m`, `n` or `k` is 0. A shorter scratch still works (smaller blocks, or an
/// unpacked loop).
pub fn igemm_scratch_len(m: usize, n: usize, k: usize) -> usize {
    igemm_scratch_len_for(KernelFamily::Any, m, n, k)
}

/// Bytes of packing scratch that lets every kernel of `family` run an `m×n×k` product in its ideal
/// blocks (for [`KernelFamily::Portable`]: `63 + round_up(4·G', 64) + ceil(nc/8)·8·G'`, about a quarter
/// of [`igemm_scratch_len`] for small products). Any kernel runs with it, a kernel outside the family
/// in smaller blocks.
pub fn igemm_scratch_len_for(family: KernelFamily, m: usize, n: usize, k: usize) -> usize {
    family
        .specs()
        .iter()
        .map(|&s| spec_scratch_len(s, m, n, k))
        .max()
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------------------
// Kernel choice
// ---------------------------------------------------------------------------------------------------------

/// The int8 micro-kernel families (also used to pick the SIMD flavour of the rescaling helpers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IgemmKernel {
    /// Plain Rust, every target.
    Portable,
    /// x86-64 AVX2: `vpmaddwd` on sign-extended int16 pairs.
    Avx2,
    /// x86-64 AVX-512 VNNI (+F, BW): `vpdpbusd` with the +128 offset trick.
    Avx512Vnni,
    /// aarch64 NEON: `smull` + `sadalp`.
    Neon,
    /// aarch64 NEON with the `dotprod` extension: `sdot`.
    NeonDot,
    /// wasm32 `simd128` (compile-time only): `i32x4.dot_i16x8_s`.
    Simd128,
}

/// The cached kernel choice (an index into [`IgemmKernel::ALL`]; `u8::MAX` until probed).
#[cfg(any(feature = "std", test))]
static CHOICE: core::sync::atomic::AtomicU8 = core::sync::atomic::AtomicU8::new(u8::MAX);

#[cfg(test)]
std::thread_local! {
    /// A test's per-thread kernel override ([`IgemmKernel::force`]).
    static FORCED: core::cell::Cell<Option<IgemmKernel>> = const { core::cell::Cell::new(None) };
}

impl IgemmKernel {
    /// Every kernel, for tests and reports.
    pub const ALL: [IgemmKernel; 6] = [
        Self::Portable,
        Self::Avx2,
        Self::Avx512Vnni,
        Self::Neon,
        Self::NeonDot,
        Self::Simd128,
    ];

    /// Short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Portable => "portable",
            Self::Avx2 => "avx2",
            Self::Avx512Vnni => "avx512-vnni",
            Self::Neon => "neon",
            Self::NeonDot => "neon-dotprod",
            Self::Simd128 => "simd128",
        }
    }

    /// Whether this kernel can run here (built for this target and supported by this CPU).
    pub fn is_available(self) -> bool {
        match self {
            Self::Portable => true,
            #[cfg(all(target_arch = "x86_64", not(miri)))]
            Self::Avx2 => x86::Avx2::new().is_some(),
            #[cfg(all(target_arch = "x86_64", not(miri)))]
            Self::Avx512Vnni => x86::Vnni::new().is_some(),
            #[cfg(all(target_arch = "aarch64", not(miri)))]
            Self::Neon => true,
            #[cfg(all(target_arch = "aarch64", not(miri)))]
            Self::NeonDot => aarch64::Dot::new().is_some(),
            #[cfg(all(target_arch = "wasm32", target_feature = "simd128", not(miri)))]
            Self::Simd128 => true,
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// Makes [`Self::selected`] return `kernel` (when available; `None` goes back to the probe) on the
    /// calling thread: tests that pin results run with every kernel this way.
    #[cfg(test)]
    pub(crate) fn force(kernel: Option<Self>) {
        FORCED.with(|f| f.set(kernel.filter(|k| k.is_available())));
    }

    /// The fastest available kernel (probed once and cached with `std`; fixed at compile time without).
    pub fn selected() -> Self {
        #[cfg(test)]
        if let Some(k) = FORCED.with(|f| f.get()) {
            return k;
        }
        // An installed accelerator takes the products: the plain GEMM paths that reach it.
        #[cfg(any(test, feature = "std"))]
        if offload::active() {
            return Self::Portable;
        }
        #[cfg(any(feature = "std", test))]
        {
            use core::sync::atomic::Ordering;
            let code = CHOICE.load(Ordering::Relaxed);
            if let Some(&k) = Self::ALL.get(code as usize) {
                return k;
            }
            let best = Self::best();
            // Races are benign: every thread computes the same answer.
            let code = Self::ALL.iter().position(|&k| k == best).unwrap_or(0);
            CHOICE.store(code as u8, Ordering::Relaxed);
            best
        }
        #[cfg(not(any(feature = "std", test)))]
        {
            Self::best()
        }
    }

    fn best() -> Self {
        [
            Self::Avx512Vnni,
            Self::Avx2,
            Self::NeonDot,
            Self::Neon,
            Self::Simd128,
        ]
        .into_iter()
        .find(|k| k.is_available())
        .unwrap_or(Self::Portable)
    }
}

// ---------------------------------------------------------------------------------------------------------
// GEMM entry points
// ---------------------------------------------------------------------------------------------------------

/// `C[m×n] = (accumulate ? C : 0) + A[m×k]·B[k×n]` in exact integer arithmetic, with the best kernel for
/// this CPU. `C` is row-major with row stride `ldc`; A and B are strided views (transposes are free).
/// Packs into `scratch` ([`igemm_scratch_len`] bytes; shorter works, slower). Never allocates.
///
/// # Panics
/// When an operand is too short for the addressed elements, `ldc < n` with `m > 1`, or `k > MAX_K`
/// (callers validate untrusted shapes first).
#[allow(clippy::too_many_arguments)]
pub fn igemm(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<'_, i8>,
    b: MatRef<'_, i8>,
    c: &mut [i32],
    ldc: usize,
    accumulate: bool,
    scratch: &mut [i8],
) {
    igemm_with(
        IgemmKernel::selected(),
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

/// [`igemm`] with a chosen kernel; falls back to [`IgemmKernel::Portable`] when it is not available.
///
/// # Panics
/// As [`igemm`].
#[allow(clippy::too_many_arguments)]
pub fn igemm_with(
    kernel: IgemmKernel,
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<'_, i8>,
    b: MatRef<'_, i8>,
    c: &mut [i32],
    ldc: usize,
    accumulate: bool,
    scratch: &mut [i8],
) {
    assert!(k <= MAX_K, "igemm: k ({k}) > MAX_K ({MAX_K})");
    let Some(p) = blocked::validate("igemm", m, n, k, a, b, c, ldc, accumulate) else {
        return;
    };
    #[cfg(any(test, feature = "std"))]
    if offload::with(|o| o.igemm(m, n, k, a, b, c, ldc, accumulate)) == Some(true) {
        return;
    }
    match kernel {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        IgemmKernel::Avx2 => {
            if let Some(kern) = x86::Avx2::new() {
                return blocked::drive(I8(kern), &p, c, scratch, &SingleThread);
            }
        }
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        IgemmKernel::Avx512Vnni => {
            if let Some(kern) = x86::Vnni::new() {
                return blocked::drive(I8(kern), &p, c, scratch, &SingleThread);
            }
        }
        #[cfg(all(target_arch = "aarch64", not(miri)))]
        IgemmKernel::Neon => {
            return blocked::drive(I8(aarch64::Neon), &p, c, scratch, &SingleThread)
        }
        #[cfg(all(target_arch = "aarch64", not(miri)))]
        IgemmKernel::NeonDot => {
            if let Some(kern) = aarch64::Dot::new() {
                return blocked::drive(I8(kern), &p, c, scratch, &SingleThread);
            }
        }
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128", not(miri)))]
        IgemmKernel::Simd128 => {
            return blocked::drive(I8(wasm::Simd128), &p, c, scratch, &SingleThread)
        }
        _ => {}
    }
    blocked::drive(I8(Portable), &p, c, scratch, &SingleThread)
}

/// Naive oracle: `C = (accumulate ? C : 0) + A·B`, wrapping like [`igemm`]; for tests and references.
#[allow(clippy::too_many_arguments)]
pub fn igemm_reference(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<'_, i8>,
    b: MatRef<'_, i8>,
    c: &mut [i32],
    ldc: usize,
    accumulate: bool,
) {
    for i in 0..m {
        for j in 0..n {
            let mut s = 0i64;
            for p in 0..k {
                s +=
                    i64::from(a.data[i * a.rs + p * a.cs]) * i64::from(b.data[p * b.rs + j * b.cs]);
            }
            let d = &mut c[i * ldc + j];
            let base = if accumulate { i64::from(*d) } else { 0 };
            *d = (base + s) as i32;
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// The blocked driver
// ---------------------------------------------------------------------------------------------------------

/// One register tile (see [`blocked::Tile`]): `a` is a packed A panel (`spec.a_panel(kc)` bytes), `b`
/// a packed B panel (`spec.b_panel(kc)` bytes, column sums included); the in-place fields are unused.
type Tile<'a> = blocked::Tile<'a, i8>;

/// A micro-kernel family. Packing defaults to the generic (scalar) packers of [`Spec`]'s layout:
/// an A panel holds element (r, p) of the block at byte `((p/G)·MR + r)·G + p%G` (times EW); a B panel
/// holds (p, j) at `((p/G)·NR + j)·G + p%G` (times EW), then NR i32 column sums if `offset_a`.
trait Kernel: Copy {
    const SPEC: Spec;
    /// Packs rows `i0..i0+rows` × depth `p0..p0+kc` of A into one panel `dst`.
    fn pack_a(
        self,
        a: MatRef<'_, i8>,
        i0: usize,
        p0: usize,
        rows: usize,
        kc: usize,
        dst: &mut [i8],
    ) {
        let spec = Self::SPEC;
        // With the offset, A is stored as the u8 `v + 128`, i.e. `v ^ 0x80` reinterpreted.
        let xor = if spec.offset_a { i8::MIN } else { 0 };
        let base = i0 * a.rs + p0 * a.cs;
        self.pack_panel(a.data, base, a.rs, a.cs, rows, spec.mr, kc, xor, dst);
    }
    /// Packs depth `p0..p0+kc` × columns `j0..j0+cols` of B into consecutive panels in `dst`, each
    /// followed by its column sums when `offset_a`.
    fn pack_b(
        self,
        b: MatRef<'_, i8>,
        p0: usize,
        j0: usize,
        cols: usize,
        kc: usize,
        dst: &mut [i8],
    ) {
        let spec = Self::SPEC;
        let panel = spec.b_panel(kc);
        for (pi, jp) in (0..cols).step_by(spec.nr).enumerate() {
            let d = &mut dst[pi * panel..(pi + 1) * panel];
            let w = spec.nr.min(cols - jp);
            let base = p0 * b.rs + (j0 + jp) * b.cs;
            self.pack_panel(b.data, base, b.cs, b.rs, w, spec.nr, kc, 0, d);
            if spec.offset_a {
                let (data, sums) = d.split_at_mut(spec.b_data(kc));
                self.col_sums(data, sums);
            }
        }
    }
    /// [`pack_panel`] for this kernel's layout (SIMD kernels override it with faster code).
    #[allow(clippy::too_many_arguments)]
    fn pack_panel(
        self,
        src: &[i8],
        base: usize,
        ls: usize,
        ps: usize,
        lanes: usize,
        w: usize,
        kc: usize,
        xor: i8,
        dst: &mut [i8],
    ) {
        pack_panel(Self::SPEC, src, base, ls, ps, lanes, w, kc, xor, dst)
    }
    /// [`col_sums`] (SIMD kernels override it).
    fn col_sums(self, data: &[i8], sums: &mut [i8]) {
        col_sums(Self::SPEC, data, sums)
    }
    /// Runs one register tile.
    fn tile(self, t: &Tile<'_>, c: &mut [i32]);
}

/// Packs one panel: `lanes` valid lanes (stride `ls`) × `kc` depth steps (stride `ps`) from `src[base..]`
/// into `dst` in the layout of `spec` with panel width `w` (lane `l`, depth `p` at element
/// `((p/G)·w + l)·G + p%G`), each value XORed with `xor` (0x80 turns i8 into the u8 `v + 128`). Lanes
/// `lanes..w` and the depth steps past `kc` in the last group are zero (before the XOR for lanes, which
/// are never stored; exactly zero in depth, so they add nothing).
#[allow(clippy::too_many_arguments)]
fn pack_panel(
    spec: Spec,
    src: &[i8],
    base: usize,
    ls: usize,
    ps: usize,
    lanes: usize,
    w: usize,
    kc: usize,
    xor: i8,
    dst: &mut [i8],
) {
    let dst = &mut dst[..spec.groups(kc) * w * spec.g * spec.ew];
    match (spec.g, spec.ew) {
        (4, 1) => pack_panel_g::<4, 1>(src, base, ls, ps, lanes, w, kc, xor, dst),
        (2, 1) => pack_panel_g::<2, 1>(src, base, ls, ps, lanes, w, kc, xor, dst),
        (2, 2) => pack_panel_g::<2, 2>(src, base, ls, ps, lanes, w, kc, xor, dst),
        _ => unreachable!("no kernel packs groups of {} × {} bytes", spec.g, spec.ew),
    }
}

/// Writes `v` as element `e` of a packed region of `EW`-byte elements (i8, or i16 little-endian).
#[inline(always)]
fn put<const EW: usize>(dst: &mut [i8], e: usize, v: i8) {
    if EW == 1 {
        dst[e] = v;
    } else {
        let [lo, hi] = i16::from(v).to_le_bytes();
        dst[2 * e] = lo as i8;
        dst[2 * e + 1] = hi as i8;
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn pack_panel_g<const G: usize, const EW: usize>(
    src: &[i8],
    base: usize,
    ls: usize,
    ps: usize,
    lanes: usize,
    w: usize,
    kc: usize,
    xor: i8,
    dst: &mut [i8],
) {
    let full = kc / G;
    let row = w * G * EW; // bytes per depth group
    if lanes < w || full * G < kc {
        dst.fill(0);
    }
    for (q, d) in dst.chunks_exact_mut(row).take(full).enumerate() {
        let p = base + q * G * ps;
        if ps == 1 {
            // Depth-contiguous (A row-major, B column-major): copy G consecutive bytes per lane.
            for l in 0..lanes {
                let s: &[i8; G] = src[p + l * ls..][..G].try_into().expect("G bytes");
                let d: &mut [i8] = &mut d[l * G * EW..(l + 1) * G * EW];
                for (gi, &v) in s.iter().enumerate() {
                    put::<EW>(d, gi, v ^ xor);
                }
            }
        } else if ls == 1 {
            // Lane-contiguous (A column-major, B row-major): interleave G rows of `lanes` bytes.
            for gi in 0..G {
                let s = &src[p + gi * ps..][..lanes];
                for (l, &v) in s.iter().enumerate() {
                    put::<EW>(d, l * G + gi, v ^ xor);
                }
            }
        } else {
            for l in 0..lanes {
                for gi in 0..G {
                    put::<EW>(d, l * G + gi, src[p + gi * ps + l * ls] ^ xor);
                }
            }
        }
    }
    // The last, partial group (depth steps full·G..kc; the rest stays zero).
    if full * G < kc {
        let d = &mut dst[full * row..];
        for l in 0..lanes {
            for gi in 0..kc - full * G {
                put::<EW>(
                    d,
                    l * G + gi,
                    src[base + (full * G + gi) * ps + l * ls] ^ xor,
                );
            }
        }
    }
}

/// Column sums of a packed i8 B panel (`G` = 4, EW = 1), as `NR` little-endian i32 in `sums`.
fn col_sums(spec: Spec, data: &[i8], sums: &mut [i8]) {
    let nr = spec.nr;
    let mut acc = [0i32; 64];
    let acc = &mut acc[..nr];
    for grp in data.chunks_exact(nr * spec.g) {
        for (s, lane) in acc.iter_mut().zip(grp.chunks_exact(spec.g)) {
            *s += lane.iter().map(|&v| i32::from(v)).sum::<i32>();
        }
    }
    for (d, s) in sums.chunks_exact_mut(4).zip(acc.iter()) {
        for (x, y) in d.iter_mut().zip(s.to_le_bytes()) {
            *x = y as i8;
        }
    }
}

/// An int8 kernel family as the shared driver ([`blocked::drive`]) sees it: both operands always
/// packed (the grouped layouts are what the dot-product instructions consume).
#[derive(Clone, Copy)]
struct I8<K>(K);

impl<K: Kernel + Sync> Micro for I8<K> {
    type E = i8;
    type C = i32;
    const MR: usize = K::SPEC.mr;
    const NR: usize = K::SPEC.nr;
    const A_IN_PLACE: bool = false;
    const B_FIRST: bool = false;
    fn a_in_place(_: &Problem<'_, i8>) -> bool {
        false
    }
    fn b_in_place(_: &Problem<'_, i8>) -> bool {
        false
    }
    fn fit(n: usize, k: usize, _: bool, _: bool, scratch: &[i8]) -> Option<(Blocking, usize)> {
        fit(K::SPEC, n, k, scratch)
    }
    fn a_panel(kc: usize) -> usize {
        K::SPEC.a_panel(kc)
    }
    fn b_panel(_nc: usize, j: usize, kc: usize) -> (core::ops::Range<usize>, usize) {
        let (panel, q) = (K::SPEC.b_panel(kc), j / K::SPEC.nr);
        (q * panel..(q + 1) * panel, K::SPEC.nr)
    }
    fn pack_a(
        self,
        a: MatRef<'_, i8>,
        i0: usize,
        p0: usize,
        rows: usize,
        kc: usize,
        dst: &mut [i8],
    ) {
        self.0.pack_a(a, i0, p0, rows, kc, dst)
    }
    fn pack_b(
        self,
        b: MatRef<'_, i8>,
        p0: usize,
        j0: usize,
        cols: usize,
        kc: usize,
        dst: &mut [i8],
    ) {
        self.0.pack_b(b, p0, j0, cols, kc, dst)
    }
    fn tile(self, t: &Tile<'_>, c: &mut [i32]) {
        self.0.tile(t, c)
    }
    fn unpacked(p: &Problem<'_, i8>, c: &mut [i32]) {
        unpacked(p, c)
    }
}

/// Block sizes that fit `scratch`, and the offset of the (64-byte aligned when possible) packed region;
/// `None` when not even a 4-deep panel pair fits.
fn fit(spec: Spec, n: usize, k: usize, scratch: &[i8]) -> Option<(Blocking, usize)> {
    let len = scratch.len();
    let off = match scratch.as_ptr().align_offset(ALIGN) {
        o if o < ALIGN => o,
        _ => 0,
    };
    let ideal = blocking(spec, n, k, KC, NC);
    for o in [off, 0] {
        if o + ideal.len() <= len {
            return Some((ideal, o));
        }
    }
    // Degrade: one B panel per block, as deep a k block (multiple of 4) as fits.
    let per4 = 4 * spec.ew * (spec.mr + spec.nr);
    let fixed = ALIGN + if spec.offset_a { 4 * spec.nr } else { 0 };
    let kc_cap = (len.saturating_sub(fixed) / per4 * 4).min(KC);
    if kc_cap == 0 {
        return None;
    }
    let blk = blocking(spec, n, k, kc_cap, spec.nr);
    (blk.len() <= len).then_some((blk, 0))
}

/// Correct, slow product without packing, for a scratch too short to hold a panel pair.
fn unpacked(p: &Problem<'_, i8>, c: &mut [i32]) {
    let (a, b) = (p.a, p.b);
    for i in 0..p.m {
        for j in 0..p.n {
            let mut s = 0i32;
            for q in 0..p.k {
                let x = i32::from(a.data[i * a.rs + q * a.cs]);
                s = s.wrapping_add(x * i32::from(b.data[q * b.rs + j * b.cs]));
            }
            let d = &mut c[i * p.ldc + j];
            *d = if p.accumulate { d.wrapping_add(s) } else { s };
        }
    }
}

/// Writes a computed `MR×NR` tile (row-major, `nr` wide) to C: `rows×cols` of it, added or stored.
#[inline]
fn store_tile(t: &Tile<'_>, nr: usize, tile: &[i32], c: &mut [i32]) {
    for r in 0..t.rows {
        let dst = &mut c[r * t.ldc..r * t.ldc + t.cols];
        let src = &tile[r * nr..r * nr + t.cols];
        if t.acc {
            for (d, &s) in dst.iter_mut().zip(src) {
                *d = d.wrapping_add(s);
            }
        } else {
            dst.copy_from_slice(src);
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// Portable kernel
// ---------------------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
struct Portable;

const P_MR: usize = SPEC_PORTABLE.mr;
const P_NR: usize = SPEC_PORTABLE.nr;
const P_G: usize = SPEC_PORTABLE.g;

/// `Σ_q a[q] ⊗ b[q]` over packed groups; a separate, fully sized function so LLVM keeps the tile in
/// registers. Products of i8 fit i16·i16 → i32; sums wrap (exact when the result fits, see [`MAX_K`]).
#[inline(never)]
fn portable_product(a: &[[i8; P_MR * P_G]], b: &[[i8; P_NR * P_G]]) -> [[i32; P_NR]; P_MR] {
    let mut acc = [[0i32; P_NR]; P_MR];
    for (ap, bp) in a.iter().zip(b) {
        for (r, row) in acc.iter_mut().enumerate() {
            for (j, s) in row.iter_mut().enumerate() {
                let mut d = 0i32;
                for g in 0..P_G {
                    d += i32::from(ap[r * P_G + g]) * i32::from(bp[j * P_G + g]);
                }
                *s = s.wrapping_add(d);
            }
        }
    }
    acc
}

impl Kernel for Portable {
    const SPEC: Spec = SPEC_PORTABLE;
    fn tile(self, t: &Tile<'_>, c: &mut [i32]) {
        let groups = Self::SPEC.groups(t.kc);
        let (a, _) = t.a.as_chunks::<{ P_MR * P_G }>();
        let (b, _) = t.b.as_chunks::<{ P_NR * P_G }>();
        let acc = portable_product(&a[..groups], &b[..groups]);
        store_tile(t, P_NR, acc.as_flattened(), c);
    }
}

// ---------------------------------------------------------------------------------------------------------
// Rescaling
// ---------------------------------------------------------------------------------------------------------

/// How [`rescale_i32_to_i8`] rounds `x / 2^shift`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rounding {
    /// Round to nearest, halves away from zero.
    Nearest,
    /// `floor((x + r) / 2^shift)` with `r` uniform in `[0, 2^shift)`, drawn from a counter-based hash of
    /// `(seed, element index)`: unbiased in expectation (NITI's stochastic rounding).
    Stochastic(u64),
}

/// NITI/Mandheling bit width of a magnitude: `32 − leading_zeros(v)` (0 for 0).
pub fn bit_width(v: u32) -> u32 {
    32 - v.leading_zeros()
}

/// Right shift that brings `max_abs` into int8 range: `bit_width(max_abs).saturating_sub(7)`.
pub fn shift_for(max_abs: u32) -> u32 {
    bit_width(max_abs).saturating_sub(7)
}

/// `max |x|` over the slice, as `u32` (`|i32::MIN| = 2^31`); 0 for an empty slice.
pub fn max_abs_i32(x: &[i32]) -> u32 {
    max_abs_i32_with(IgemmKernel::selected(), x)
}

/// [`max_abs_i32`] with the SIMD flavour of `kernel` (portable when unavailable).
pub fn max_abs_i32_with(kernel: IgemmKernel, x: &[i32]) -> u32 {
    match kernel {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        IgemmKernel::Avx2 | IgemmKernel::Avx512Vnni => {
            if let Some(k) = x86::Avx2::new() {
                return k.max_abs(x);
            }
        }
        #[cfg(all(target_arch = "aarch64", not(miri)))]
        IgemmKernel::Neon | IgemmKernel::NeonDot => return aarch64::max_abs(x),
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128", not(miri)))]
        IgemmKernel::Simd128 => return wasm::max_abs(x),
        _ => {}
    }
    max_abs_portable(x)
}

fn max_abs_portable(x: &[i32]) -> u32 {
    x.iter().fold(0u32, |m, &v| m.max(v.unsigned_abs()))
}

/// 32-bit mixer ("lowbias32", C. Wellons): a bijection with good avalanche, cheap in SIMD (two 32-bit
/// multiplies).
#[inline]
fn mix32(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^= x >> 16;
    x
}

/// Per-(seed, high half of the index) key; the noise of element `idx` is `mix32(lo32(idx) ^ key)`.
#[inline]
fn stream_key(seed: u64, hi: u32) -> u32 {
    mix32(seed as u32 ^ mix32((seed >> 32) as u32 ^ mix32(hi ^ 0x9e37_79b9)))
}

/// The stochastic-rounding noise for element `idx`: uniform in `[0, 2^shift)` (the top `shift` bits of
/// the hash); 0 when `shift == 0`.
#[inline]
fn noise(key: u32, lo: u32, shift: u32) -> u32 {
    if shift == 0 {
        0
    } else {
        mix32(lo ^ key) >> (32 - shift)
    }
}

/// Nearest rounding of `x / 2^shift`, halves away from zero, before clamping (`shift ≤ 31`).
#[inline]
fn round_nearest(x: i32, shift: u32) -> i32 {
    let half = (1u32 << shift) >> 1;
    // |x| ≤ 2^31 and half ≤ 2^30: the sum fits u32. The quotient is ≤ 2^31, and 2^31 only for
    // x = i32::MIN with shift 0, whose negation (wrapping) is i32::MIN again: exact.
    let q = ((x.unsigned_abs() + half) >> shift) as i32;
    if x < 0 {
        q.wrapping_neg()
    } else {
        q
    }
}

/// Stochastic rounding `floor((x + r) / 2^shift)` in 32-bit arithmetic: `(x >> s) + ((x mod 2^s) + r) >> s`.
#[inline]
fn round_stochastic(x: i32, shift: u32, r: u32) -> i32 {
    let mask = ((1u64 << shift) - 1) as u32;
    let low = (x as u32) & mask;
    // low, r < 2^shift ≤ 2^31: the sum fits u32, and the carry is 0 or 1.
    (x >> shift) + ((low + r) >> shift) as i32
}

/// `dst[i] = clamp(round(src[i] / 2^shift), −127, 127)`; returns how many values were clamped
/// (the saturation count, i.e. overflow detection).
///
/// `Nearest` rounds halves away from zero. `Stochastic(seed)` computes `floor((src[i] + r_i) / 2^shift)`
/// with `r_i` uniform in `[0, 2^shift)` from a counter-based hash of `(seed, offset + i)`: splitting a
/// tensor into pieces (each called with its element offset) gives the same result as one call, and every
/// SIMD flavour gives the portable result bit for bit.
///
/// # Panics
/// When `shift > 31` or `dst.len() != src.len()`.
pub fn rescale_i32_to_i8(
    src: &[i32],
    shift: u32,
    rounding: Rounding,
    offset: u64,
    dst: &mut [i8],
) -> usize {
    rescale_i32_to_i8_with(IgemmKernel::selected(), src, shift, rounding, offset, dst)
}

/// [`rescale_i32_to_i8`] with the SIMD flavour of `kernel` (portable when unavailable).
///
/// # Panics
/// As [`rescale_i32_to_i8`].
pub fn rescale_i32_to_i8_with(
    kernel: IgemmKernel,
    src: &[i32],
    shift: u32,
    rounding: Rounding,
    offset: u64,
    dst: &mut [i8],
) -> usize {
    assert!(shift <= 31, "rescale: shift {shift} > 31");
    assert_eq!(src.len(), dst.len(), "rescale: length mismatch");
    #[cfg(feature = "std")]
    if let Some(Some(c)) = offload::with(|o| o.rescale(src, shift, rounding, offset, dst)) {
        return c;
    }
    let mut clamped = 0;
    let mut done = 0;
    // Split where the high half of the element index changes, so each piece has one stream key.
    while done < src.len() {
        let idx = offset.wrapping_add(done as u64);
        let to_boundary = (1u64 << 32) - (idx & 0xffff_ffff);
        let len = (src.len() - done).min(usize::try_from(to_boundary).unwrap_or(usize::MAX));
        let piece = Piece {
            shift,
            rounding,
            key: match rounding {
                Rounding::Nearest => 0,
                Rounding::Stochastic(seed) => stream_key(seed, (idx >> 32) as u32),
            },
            lo: idx as u32,
        };
        let (s, d) = (&src[done..done + len], &mut dst[done..done + len]);
        clamped += rescale_piece(kernel, piece, s, d);
        done += len;
    }
    clamped
}

/// [`rescale_i32_to_i8`] of a tile stored transposed by blocks: `src` is `[rows][b][inner]` and element
/// `(r, j, i)` goes to `dst[(j·rows + r)·inner + i]` with index `offset + (j·rows + r)·inner + i` for the
/// stochastic noise — the result of one [`rescale_i32_to_i8`] call per block, without the per-call
/// choice of kernel (a convolution's tile has a block per output channel and sample). Returns how many
/// values were clamped.
///
/// # Panics
/// When `shift > 31`, `src.len()` is not a multiple of `rows·inner`, or `dst` is shorter than `src`.
pub fn rescale_i32_to_i8_blocks(
    src: &[i32],
    rows: usize,
    inner: usize,
    shift: u32,
    rounding: Rounding,
    offset: u64,
    dst: &mut [i8],
) -> usize {
    assert!(shift <= 31, "rescale: shift {shift} > 31");
    if src.is_empty() {
        return 0;
    }
    assert!(
        rows >= 1 && inner >= 1 && src.len().is_multiple_of(rows * inner) && dst.len() >= src.len(),
        "rescale_blocks: bad shape"
    );
    let kernel = IgemmKernel::selected();
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if matches!(kernel, IgemmKernel::Avx2 | IgemmKernel::Avx512Vnni)
        && rounding == Rounding::Nearest
    {
        if let Some(k) = x86::Avx2::new() {
            return k.rescale_blocks_nearest(src, rows, inner, shift, &mut dst[..src.len()]);
        }
    }
    #[cfg(all(target_arch = "aarch64", not(miri)))]
    if matches!(kernel, IgemmKernel::Neon | IgemmKernel::NeonDot) && rounding == Rounding::Nearest {
        return aarch64::rescale_blocks_nearest(src, rows, inner, shift, &mut dst[..src.len()]);
    }
    let b = src.len() / (rows * inner);
    let mut clamped = 0;
    for (r, src_r) in src.chunks_exact(b * inner).enumerate() {
        for (j, block) in src_r.chunks_exact(inner).enumerate() {
            let d0 = (j * rows + r) * inner;
            let idx = offset.wrapping_add(d0 as u64);
            let d = &mut dst[d0..d0 + inner];
            if (idx & 0xffff_ffff) + inner as u64 > 1 << 32 {
                // The block crosses a change of the index's high half: two stream keys.
                clamped += rescale_i32_to_i8_with(kernel, block, shift, rounding, idx, d);
                continue;
            }
            let piece = Piece {
                shift,
                rounding,
                key: match rounding {
                    Rounding::Nearest => 0,
                    Rounding::Stochastic(seed) => stream_key(seed, (idx >> 32) as u32),
                },
                lo: idx as u32,
            };
            clamped += rescale_piece(kernel, piece, block, d);
        }
    }
    clamped
}

/// `dst[i] = clamp(round(src[i] · k), ±127)` with halves rounded away from zero and NaN to 0 (the
/// quantisation of f32 values by a power-of-two scale `k`; exact in f32 arithmetic, see the portable
/// loop). The AVX2 and NEON versions give the same bytes.
///
/// # Panics
/// When `dst` is shorter than `src`.
pub fn quantize_f32(src: &[f32], k: f32, dst: &mut [i8]) {
    assert!(dst.len() >= src.len(), "quantize: dst too short");
    #[cfg(any(test, feature = "std"))]
    if offload::with(|o| o.quantize(src, k, dst)) == Some(true) {
        return;
    }
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if matches!(
        IgemmKernel::selected(),
        IgemmKernel::Avx2 | IgemmKernel::Avx512Vnni
    ) {
        if let Some(x) = x86::Avx2::new() {
            return x.quantize(src, k, dst);
        }
    }
    #[cfg(all(target_arch = "aarch64", not(miri)))]
    if matches!(
        IgemmKernel::selected(),
        IgemmKernel::Neon | IgemmKernel::NeonDot
    ) {
        return aarch64::quantize(src, k, dst);
    }
    quantize_portable(src, k, dst)
}

/// The portable [`quantize_f32`] (also the SIMD version's tail).
fn quantize_portable(src: &[f32], k: f32, dst: &mut [i8]) {
    for (d, &v) in dst.iter_mut().zip(src) {
        // Clamping to ±128 first changes nothing after the final clamp to ±127, and makes the rounding
        // exact in f32 arithmetic: `t − trunc(t)` is exact for |t| < 2^23, so comparing the fraction
        // with ±0.5 rounds halves away from zero like `roundf` (NaN becomes 0 either way).
        let t = (v * k).clamp(-128.0, 128.0);
        let i = t as i32;
        let f = t - i as f32;
        let r = i + (f >= 0.5) as i32 - (f <= -0.5) as i32;
        *d = r.clamp(-127, 127) as i8;
    }
}

/// One run of [`rescale_i32_to_i8`] whose indices share their high 32 bits (`lo + len ≤ 2^32`).
#[derive(Clone, Copy, Debug)]
struct Piece {
    shift: u32,
    rounding: Rounding,
    /// [`stream_key`] of the piece (0 for `Nearest`).
    key: u32,
    /// Low 32 bits of the first element's index.
    lo: u32,
}

fn rescale_piece(kernel: IgemmKernel, p: Piece, src: &[i32], dst: &mut [i8]) -> usize {
    match kernel {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        IgemmKernel::Avx2 | IgemmKernel::Avx512Vnni => {
            if let Some(k) = x86::Avx2::new() {
                return k.rescale(p, src, dst);
            }
        }
        #[cfg(all(target_arch = "aarch64", not(miri)))]
        IgemmKernel::Neon | IgemmKernel::NeonDot => return aarch64::rescale(p, src, dst),
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128", not(miri)))]
        IgemmKernel::Simd128 => return wasm::rescale(p, src, dst),
        _ => {}
    }
    rescale_portable(p, src, dst)
}

/// Scalar rescaling of elements `src[..]` whose first index has low half `p.lo` (the SIMD versions call
/// it for their tails, with `lo` advanced).
fn rescale_portable(p: Piece, src: &[i32], dst: &mut [i8]) -> usize {
    let mut clamped = 0;
    for (i, (&x, d)) in src.iter().zip(dst.iter_mut()).enumerate() {
        let q = match p.rounding {
            Rounding::Nearest => round_nearest(x, p.shift),
            Rounding::Stochastic(_) => {
                let r = noise(p.key, p.lo.wrapping_add(i as u32), p.shift);
                round_stochastic(x, p.shift, r)
            }
        };
        let v = q.clamp(-127, 127);
        clamped += usize::from(v != q);
        *d = v as i8;
    }
    clamped
}
