//! x86-64 int8 kernels: AVX2 (`vpmaddwd` on sign-extended pairs, 6×16) and AVX-512 VNNI (`vpdpbusd`
//! with the +128 offset, 8×48), plus AVX2 `max_abs` and rescaling.
//!
//! Soundness rests on two things, restated at each `unsafe` block:
//! * a kernel value ([`Avx2`], [`Vnni`]) can only be made by `new()`, which checks the CPU features its
//!   `#[target_feature]` functions are compiled with;
//! * every raw-pointer access is inside a slice whose length was checked (by `assert!` or by slicing) in
//!   the same function.
use core::arch::x86_64::*;

mod pairs;
mod pool;

use super::{
    pack_panel_g, quantize_portable, rescale_portable, store_tile, Kernel, Piece, Rounding, Spec,
    Tile, SPEC_AVX2, SPEC_VNNI,
};

/// Proof that the CPU has AVX2.
#[derive(Clone, Copy, Debug)]
pub(super) struct Avx2(());

/// Proof that the CPU has AVX-512F, AVX-512BW, AVX-512 VNNI and AVX2.
#[derive(Clone, Copy, Debug)]
pub(super) struct Vnni(());

impl Avx2 {
    pub(super) fn new() -> Option<Self> {
        #[cfg(any(feature = "std", test))]
        let ok = std::is_x86_feature_detected!("avx2");
        #[cfg(not(any(feature = "std", test)))]
        let ok = cfg!(target_feature = "avx2");
        ok.then_some(Self(()))
    }
}

impl Vnni {
    pub(super) fn new() -> Option<Self> {
        #[cfg(any(feature = "std", test))]
        let ok = std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vnni")
            && std::is_x86_feature_detected!("avx2");
        #[cfg(not(any(feature = "std", test)))]
        let ok = cfg!(all(
            target_feature = "avx512f",
            target_feature = "avx512bw",
            target_feature = "avx512vnni",
            target_feature = "avx2"
        ));
        ok.then_some(Self(()))
    }
}

// ---------------------------------------------------------------------------------------------------------
// AVX2 GEMM: B and A packed as sign-extended i16 pairs; `vpmaddwd` of a broadcast A pair with 8 B column
// pairs gives 8 exact i32 partial sums (|a0·b0 + a1·b1| ≤ 2^15), added with `vpaddd`.
// ---------------------------------------------------------------------------------------------------------

const A2_MR: usize = SPEC_AVX2.mr;
const A2_NR: usize = SPEC_AVX2.nr;

#[target_feature(enable = "avx2")]
fn tile_avx2(t: &Tile<'_>, c: &mut [i32]) {
    let spec = SPEC_AVX2;
    let groups = spec.groups(t.kc);
    // Per group: A holds MR i16 pairs (4 bytes each), B holds NR i16 pairs (2 ymm).
    let a = &t.a[..groups * A2_MR * 4];
    let b = &t.b[..groups * A2_NR * 4];
    let mut acc = [[_mm256_setzero_si256(); 2]; A2_MR];
    let (ap, bp) = (a.as_ptr(), b.as_ptr());
    for q in 0..groups {
        // SAFETY: the B loads read bytes q·64 .. q·64 + 64 < groups·64 = b.len(); the A reads are the
        // 4 bytes at q·24 + 4r + 4 ≤ groups·24 = a.len() (both lengths checked by the slicing above).
        // Unaligned loads are allowed; AVX2 is enabled on this function.
        unsafe {
            let b0 = _mm256_loadu_si256(bp.add(q * 64).cast());
            let b1 = _mm256_loadu_si256(bp.add(q * 64 + 32).cast());
            for (r, row) in acc.iter_mut().enumerate() {
                let x =
                    _mm256_set1_epi32(ap.add(q * A2_MR * 4 + 4 * r).cast::<i32>().read_unaligned());
                row[0] = _mm256_add_epi32(row[0], _mm256_madd_epi16(x, b0));
                row[1] = _mm256_add_epi32(row[1], _mm256_madd_epi16(x, b1));
            }
        }
    }
    let mut tmp = [0i32; A2_MR * A2_NR];
    for (r, row) in acc.iter().enumerate() {
        for (v, &x) in row.iter().enumerate() {
            // SAFETY: writes 8 i32 at r·16 + 8v + 8 ≤ 96 = tmp.len().
            unsafe { _mm256_storeu_si256(tmp.as_mut_ptr().add(r * A2_NR + 8 * v).cast(), x) };
        }
    }
    store_tile(t, A2_NR, &tmp, c);
}

impl Kernel for Avx2 {
    const SPEC: Spec = SPEC_AVX2;
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
        // SAFETY: `self` proves AVX2 is available.
        unsafe { pack_g2_avx2(src, base, ls, ps, lanes, w, kc, xor, dst) }
    }
    fn tile(self, t: &Tile<'_>, c: &mut [i32]) {
        // SAFETY: `self` proves AVX2 is available.
        unsafe { tile_avx2(t, c) }
    }
}

// ---------------------------------------------------------------------------------------------------------
// AVX-512 VNNI GEMM: `vpdpbusd` multiplies u8 by i8 in groups of 4 and adds to i32 without saturation.
// A is packed as the u8 `a + 128`, so the tile accumulates `Σ (a+128)·b = A·B + 128·Σ_p b`; the packed B
// panel carries `Σ_p b` per column and the kernel subtracts `128·Σ_p b` at the end. Every step wraps
// modulo 2^32 and the true result fits in i32, so the result is exact.
// ---------------------------------------------------------------------------------------------------------

const V_MR: usize = SPEC_VNNI.mr;
const V_NR: usize = SPEC_VNNI.nr;
const V_NV: usize = V_NR / 16;

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2")]
fn tile_vnni(t: &Tile<'_>, c: &mut [i32]) {
    let spec = SPEC_VNNI;
    let groups = spec.groups(t.kc);
    let a = &t.a[..groups * V_MR * 4];
    let b = &t.b[..spec.b_panel(t.kc)];
    let sums = &b[spec.b_data(t.kc)..][..4 * V_NR];
    let mut acc = [[_mm512_setzero_si512(); V_NV]; V_MR];
    let (ap, bp) = (a.as_ptr(), b.as_ptr());
    for q in 0..groups {
        // SAFETY: B loads read bytes q·192 + 64v .. + 64 ≤ groups·192 = b_data ≤ b.len(); A reads are the
        // 4 bytes at q·32 + 4r, + 4 ≤ groups·32 = a.len() (lengths checked by the slicing above). The
        // enabled features cover every intrinsic.
        unsafe {
            let bv: [__m512i; V_NV] =
                core::array::from_fn(|v| _mm512_loadu_si512(bp.add(q * V_NR * 4 + 64 * v).cast()));
            for (r, row) in acc.iter_mut().enumerate() {
                let x =
                    _mm512_set1_epi32(ap.add(q * V_MR * 4 + 4 * r).cast::<i32>().read_unaligned());
                for (s, &y) in row.iter_mut().zip(&bv) {
                    *s = _mm512_dpbusd_epi32(*s, x, y);
                }
            }
        }
    }
    // SAFETY: `sums` holds exactly 4·NR bytes = NV vectors of 16 i32 (checked by the slicing).
    let corr: [__m512i; V_NV] = core::array::from_fn(|v| unsafe {
        _mm512_slli_epi32::<7>(_mm512_loadu_si512(sums.as_ptr().add(64 * v).cast()))
    });
    for row in acc.iter_mut() {
        for (s, &k) in row.iter_mut().zip(&corr) {
            *s = _mm512_sub_epi32(*s, k);
        }
    }
    if t.rows == V_MR && t.cols == V_NR {
        let c = &mut c[..(V_MR - 1) * t.ldc + V_NR];
        for (r, row) in acc.iter().enumerate() {
            for (v, &x) in row.iter().enumerate() {
                // SAFETY: 16 i32 at r·ldc + 16v, + 16 ≤ (MR-1)·ldc + NR = c.len() (checked by slicing).
                unsafe {
                    let p = c.as_mut_ptr().add(r * t.ldc + 16 * v);
                    let x = if t.acc {
                        _mm512_add_epi32(x, _mm512_loadu_si512(p.cast()))
                    } else {
                        x
                    };
                    _mm512_storeu_si512(p.cast(), x);
                }
            }
        }
        return;
    }
    let mut tmp = [0i32; V_MR * V_NR];
    for (r, row) in acc.iter().enumerate() {
        for (v, &x) in row.iter().enumerate() {
            // SAFETY: 16 i32 at r·48 + 16v, + 16 ≤ 384 = tmp.len().
            unsafe { _mm512_storeu_si512(tmp.as_mut_ptr().add(r * V_NR + 16 * v).cast(), x) };
        }
    }
    store_tile(t, V_NR, &tmp, c);
}

impl Kernel for Vnni {
    const SPEC: Spec = SPEC_VNNI;
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
        // SAFETY: `self` proves AVX2 (all `pack_g4_avx2` needs) is available.
        unsafe { pack_g4_avx2(src, base, ls, ps, lanes, w, kc, xor, dst) }
    }
    fn col_sums(self, data: &[i8], sums: &mut [i8]) {
        // SAFETY: `self` proves AVX-512F/BW/VNNI are available.
        unsafe { col_sums_vnni(data, sums) }
    }
    fn tile(self, t: &Tile<'_>, c: &mut [i32]) {
        // SAFETY: `self` proves AVX-512F/BW/VNNI and AVX2 are available.
        unsafe { tile_vnni(t, c) }
    }
}

// ---------------------------------------------------------------------------------------------------------
// Packing: 8 lanes at a time, for the two layouts that matter (the depth or the lanes contiguous); other
// strides, the last partial depth group and lanes past the last multiple of 8 go through the portable
// packer, which this code matches byte for byte.
// ---------------------------------------------------------------------------------------------------------

/// The in-bounds condition shared by the SIMD packers: every element (lane < lanes, depth < kc) is inside
/// `src`, the panel fits `dst`, and all lane offsets fit the i32 gather indices.
fn pack_bounds(src: &[i8], base: usize, ls: usize, ps: usize, lanes: usize, kc: usize) -> bool {
    lanes >= 1
        && kc >= 1
        && (lanes - 1)
            .checked_mul(ls)
            .and_then(|x| x.checked_add((kc - 1).checked_mul(ps)?))
            .and_then(|x| x.checked_add(base))
            .is_some_and(|last| last < src.len())
        && (lanes - 1)
            .checked_mul(ls)
            .is_some_and(|x| x <= i32::MAX as usize)
}

/// G = 4, i8 (the VNNI layout): element (lane l, depth p) at `((p/4)·w + l)·4 + p%4`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2")]
fn pack_g4_avx2(
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
    // Gathers need whole groups; row loads cover the partial last group too (missing rows are zero).
    let full = if ps == 1 { kc / 4 } else { kc.div_ceil(4) };
    let l8 = lanes / 8 * 8;
    if l8 == 0 || full == 0 || !(ps == 1 || ls == 1) || !pack_bounds(src, base, ls, ps, lanes, kc) {
        return pack_panel_g::<4, 1>(src, base, ls, ps, lanes, w, kc, xor, dst);
    }
    let dst = &mut dst[..kc.div_ceil(4) * w * 4];
    if l8 < w || full * 4 < kc {
        dst.fill(0);
    }
    let x = _mm256_set1_epi8(xor);
    let s = src.as_ptr();
    for l0 in (0..l8).step_by(8) {
        for q in 0..full {
            let d = &mut dst[(q * w + l0) * 4..][..32];
            // SAFETY: every byte read is element (l0 + i, 4q + g) with i < 8, l0 + i < lanes, g < 4,
            // 4q + g < kc (whole groups for the gathers, checked per row for the row loads), at base + (l0+i)·ls + (4q+g)·ps ≤ the last element, inside `src` by
            // `pack_bounds`; gather indices (l0+i)·ls ≤ (lanes-1)·ls fit i32 (also checked there). The
            // store writes `d`, 32 bytes by the slicing. AVX2 is enabled on this function.
            unsafe {
                let v = if ps == 1 {
                    // Depth-contiguous: lane l's 4 bytes are one u32; gather 8 of them.
                    let idx = _mm256_mullo_epi32(
                        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                        _mm256_set1_epi32(ls as i32),
                    );
                    let p = s.add(base + l0 * ls + 4 * q);
                    _mm256_i32gather_epi32::<1>(p.cast(), idx)
                } else {
                    // Lane-contiguous: interleave 4 rows of 8 bytes.
                    let p = s.add(base + l0 + 4 * q * ps);
                    let row = |g: usize| {
                        if 4 * q + g < kc {
                            _mm_loadl_epi64(p.add(g * ps).cast())
                        } else {
                            _mm_setzero_si128()
                        }
                    };
                    let (r0, r1, r2, r3) = (row(0), row(1), row(2), row(3));
                    let t01 = _mm_unpacklo_epi8(r0, r1);
                    let t23 = _mm_unpacklo_epi8(r2, r3);
                    _mm256_setr_m128i(_mm_unpacklo_epi16(t01, t23), _mm_unpackhi_epi16(t01, t23))
                };
                _mm256_storeu_si256(d.as_mut_ptr().cast(), _mm256_xor_si256(v, x));
            }
        }
    }
    // Lanes past l8 and the partial last group: scalar, as the portable packer writes them.
    for l in 0..lanes {
        let from = if l < l8 { full * 4 } else { 0 };
        for p in from..kc {
            dst[((p / 4) * w + l) * 4 + p % 4] = src[base + l * ls + p * ps] ^ xor;
        }
    }
}

/// G = 2, sign-extended i16 (the AVX2 layout): element (lane l, depth p) at bytes
/// `2·(((p/2)·w + l)·2 + p%2)`, little-endian.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2")]
fn pack_g2_avx2(
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
    // Gathers read 4 bytes per lane (2 depth steps past the pair): only groups q with 2q + 4 ≤ kc. Row
    // loads cover the partial last group too (a missing row is zero).
    let full = if ps == 1 {
        kc.saturating_sub(2) / 2
    } else {
        kc.div_ceil(2)
    };
    let l8 = lanes / 8 * 8;
    if xor != 0
        || l8 == 0
        || full == 0
        || !(ps == 1 || ls == 1)
        || !pack_bounds(src, base, ls, ps, lanes, kc)
    {
        return pack_panel_g::<2, 2>(src, base, ls, ps, lanes, w, kc, xor, dst);
    }
    let dst = &mut dst[..kc.div_ceil(2) * w * 4];
    if l8 < w || kc % 2 == 1 {
        dst.fill(0);
    }
    let s = src.as_ptr();
    // Per 32-bit lane [b0 b1 _ _] → [0 b0 0 b1], then an arithmetic shift by 8 sign-extends each byte.
    let spread = _mm256_setr_epi8(
        -128, 0, -128, 1, -128, 4, -128, 5, -128, 8, -128, 9, -128, 12, -128, 13, -128, 0, -128, 1,
        -128, 4, -128, 5, -128, 8, -128, 9, -128, 12, -128, 13,
    );
    for l0 in (0..l8).step_by(8) {
        for q in 0..full {
            let d = &mut dst[(q * w + l0) * 4..][..32];
            // SAFETY: as in `pack_g4_avx2`: reads are elements (l0 + i, 2q + g), g < 2 for the row
            // loads and g < 4 for the gathers, with 2q + g < kc by the choice of `full` (and the check
            // on the second row), all inside `src`
            // by `pack_bounds`; the store writes the 32 bytes of `d`. AVX2 is enabled on this function.
            unsafe {
                let v = if ps == 1 {
                    let idx = _mm256_mullo_epi32(
                        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                        _mm256_set1_epi32(ls as i32),
                    );
                    let p = s.add(base + l0 * ls + 2 * q);
                    let g = _mm256_i32gather_epi32::<1>(p.cast(), idx);
                    _mm256_srai_epi16::<8>(_mm256_shuffle_epi8(g, spread))
                } else {
                    let p = s.add(base + l0 + 2 * q * ps);
                    let r0 = _mm_loadl_epi64(p.cast());
                    let r1 = if 2 * q + 1 < kc {
                        _mm_loadl_epi64(p.add(ps).cast())
                    } else {
                        _mm_setzero_si128()
                    };
                    _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(r0, r1))
                };
                _mm256_storeu_si256(d.as_mut_ptr().cast(), v);
            }
        }
    }
    for l in 0..lanes {
        let from = if l < l8 { full * 2 } else { 0 };
        for p in from..kc {
            let e = 2 * (((p / 2) * w + l) * 2 + p % 2);
            let [lo, hi] = i16::from(src[base + l * ls + p * ps]).to_le_bytes();
            dst[e] = lo as i8;
            dst[e + 1] = hi as i8;
        }
    }
}

/// Column sums of a packed VNNI B panel: `vpdpbusd` of the bytes with all-ones (u8 1 × i8 b).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2")]
fn col_sums_vnni(data: &[i8], sums: &mut [i8]) {
    let sums = &mut sums[..4 * V_NR];
    let groups = data.len() / (4 * V_NR);
    let data = &data[..groups * 4 * V_NR];
    let ones = _mm512_set1_epi8(1);
    let mut acc = [_mm512_setzero_si512(); V_NV];
    for q in 0..groups {
        for (v, a) in acc.iter_mut().enumerate() {
            // SAFETY: reads 64 bytes at q·192 + 64v, + 64 ≤ groups·192 = data.len() (sliced above).
            let b = unsafe { _mm512_loadu_si512(data.as_ptr().add(q * 4 * V_NR + 64 * v).cast()) };
            *a = _mm512_dpbusd_epi32(*a, ones, b);
        }
    }
    for (v, a) in acc.iter().enumerate() {
        // SAFETY: writes 64 bytes at 64v, + 64 ≤ 4·NR = sums.len() (sliced above).
        unsafe { _mm512_storeu_si512(sums.as_mut_ptr().add(64 * v).cast(), *a) };
    }
}

// ---------------------------------------------------------------------------------------------------------
// AVX2 max |x| and rescaling
// ---------------------------------------------------------------------------------------------------------

impl Avx2 {
    pub(super) fn max_abs(self, x: &[i32]) -> u32 {
        // SAFETY: `self` proves AVX2 is available.
        unsafe { max_abs_avx2(x) }
    }
    pub(super) fn rescale(self, p: Piece, src: &[i32], dst: &mut [i8]) -> usize {
        // SAFETY: `self` proves AVX2 is available.
        unsafe { rescale_avx2(p, src, dst) }
    }
    pub(super) fn quantize(self, src: &[f32], k: f32, dst: &mut [i8]) {
        // SAFETY: `self` proves AVX2 is available.
        unsafe { quantize_avx2(src, k, dst) }
    }
    pub(super) fn rescale_blocks_nearest(
        self,
        src: &[i32],
        rows: usize,
        inner: usize,
        shift: u32,
        dst: &mut [i8],
    ) -> usize {
        // SAFETY: `self` proves AVX2 is available.
        unsafe { rescale_blocks_nearest_avx2(src, rows, inner, shift, dst) }
    }
}

#[target_feature(enable = "avx2")]
fn max_abs_avx2(x: &[i32]) -> u32 {
    let (chunks, tail) = x.as_chunks::<8>();
    let mut m = _mm256_setzero_si256();
    for ch in chunks {
        // SAFETY: `ch` is 8 i32; unaligned load. |i32::MIN| is 0x8000_0000, right as u32.
        m = _mm256_max_epu32(
            m,
            _mm256_abs_epi32(unsafe { _mm256_loadu_si256(ch.as_ptr().cast()) }),
        );
    }
    let mut lanes = [0u32; 8];
    // SAFETY: `lanes` holds 8 u32.
    unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), m) };
    let simd = lanes.iter().copied().max().unwrap_or(0);
    tail.iter().fold(simd, |a, &v| a.max(v.unsigned_abs()))
}

/// Rounds 8 lanes of `x` (before clamping) as the portable code does; `lo` holds the lanes' low index
/// halves.
#[inline]
#[target_feature(enable = "avx2")]
fn round8(p: &Piece, x: __m256i, lo: __m256i) -> __m256i {
    let s = _mm_cvtsi32_si128(p.shift as i32);
    match p.rounding {
        Rounding::Nearest => {
            // (|x| + half) >> s in u32 (no overflow: |x| ≤ 2^31, half ≤ 2^30), then the sign of x.
            let half = _mm256_set1_epi32(((1u32 << p.shift) >> 1) as i32);
            let q = _mm256_srl_epi32(_mm256_add_epi32(_mm256_abs_epi32(x), half), s);
            _mm256_sign_epi32(q, x)
        }
        Rounding::Stochastic(_) => {
            // super::mix32(lo ^ key) >> (32 - s), spelled out; a shift by 32 gives 0, the noise for s = 0.
            let mut h = _mm256_xor_si256(lo, _mm256_set1_epi32(p.key as i32));
            h = _mm256_xor_si256(h, _mm256_srli_epi32::<16>(h));
            h = _mm256_mullo_epi32(h, _mm256_set1_epi32(0x7feb_352d));
            h = _mm256_xor_si256(h, _mm256_srli_epi32::<15>(h));
            h = _mm256_mullo_epi32(h, _mm256_set1_epi32(0x846c_a68b_u32 as i32));
            h = _mm256_xor_si256(h, _mm256_srli_epi32::<16>(h));
            let r = _mm256_srl_epi32(h, _mm_cvtsi32_si128(32 - p.shift as i32));
            let mask = _mm256_set1_epi32(((1u64 << p.shift) - 1) as u32 as i32);
            let low = _mm256_and_si256(x, mask);
            let carry = _mm256_srl_epi32(_mm256_add_epi32(low, r), s);
            _mm256_add_epi32(_mm256_sra_epi32(x, s), carry)
        }
    }
}

#[target_feature(enable = "avx2")]
fn rescale_avx2(p: Piece, src: &[i32], dst: &mut [i8]) -> usize {
    let n32 = src.len() / 32 * 32;
    let (s32, d32) = (&src[..n32], &mut dst[..n32]);
    let lo_step = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let (lim_hi, lim_lo) = (_mm256_set1_epi32(127), _mm256_set1_epi32(-127));
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let mut kept = 0usize;
    for (blk, (s, d)) in s32
        .chunks_exact(32)
        .zip(d32.chunks_exact_mut(32))
        .enumerate()
    {
        let base = p.lo.wrapping_add((blk * 32) as u32);
        let mut v = [_mm256_setzero_si256(); 4];
        for (i, out) in v.iter_mut().enumerate() {
            // SAFETY: `s` holds 32 i32; this reads s[8i..8i+8].
            let x = unsafe { _mm256_loadu_si256(s.as_ptr().add(8 * i).cast()) };
            let lo = _mm256_add_epi32(
                _mm256_set1_epi32(base.wrapping_add(8 * i as u32) as i32),
                lo_step,
            );
            let q = round8(&p, x, lo);
            let y = _mm256_min_epi32(_mm256_max_epi32(q, lim_lo), lim_hi);
            let same = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(y, q)));
            kept += (same as u32).count_ones() as usize;
            *out = y;
        }
        // Pack 4×8 i32 (all in ±127, so no saturation) to 32 i8, then undo the per-lane interleave.
        let w01 = _mm256_packs_epi32(v[0], v[1]);
        let w23 = _mm256_packs_epi32(v[2], v[3]);
        let bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w01, w23), order);
        // SAFETY: `d` holds 32 bytes.
        unsafe { _mm256_storeu_si256(d.as_mut_ptr().cast(), bytes) };
    }
    // Then 8 at a time (the short rows of small convolutions), the same rounding per lane.
    let n8 = src.len() / 8 * 8;
    for (blk, (s, d)) in src[n32..n8]
        .chunks_exact(8)
        .zip(dst[n32..n8].chunks_exact_mut(8))
        .enumerate()
    {
        let base = p.lo.wrapping_add((n32 + blk * 8) as u32);
        // SAFETY: `s` holds 8 i32.
        let x = unsafe { _mm256_loadu_si256(s.as_ptr().cast()) };
        let lo = _mm256_add_epi32(_mm256_set1_epi32(base as i32), lo_step);
        let q = round8(&p, x, lo);
        let y = _mm256_min_epi32(_mm256_max_epi32(q, lim_lo), lim_hi);
        let same = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(y, q)));
        kept += (same as u32).count_ones() as usize;
        // Bytes 0..4 of each 128-bit lane hold lanes 0..4 and 4..8; dwords 0 and 4 → the low 8 bytes.
        let w = _mm256_packs_epi16(_mm256_packs_epi32(y, y), _mm256_setzero_si256());
        let bytes = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(w, order));
        // SAFETY: `d` holds 8 bytes; the store writes exactly 8.
        unsafe { _mm_storel_epi64(d.as_mut_ptr().cast(), bytes) };
    }
    let clamped = n8 - kept;
    let tail = Piece {
        lo: p.lo.wrapping_add(n8 as u32),
        ..p
    };
    clamped + rescale_portable(tail, &src[n8..], &mut dst[n8..])
}

/// [`super::rescale_i32_to_i8_blocks`] with nearest rounding: 8 values at a time straight from each
/// block to its place (the same rounding, clamp and count as [`rescale_avx2`]).
#[target_feature(enable = "avx2")]
fn rescale_blocks_nearest_avx2(
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
    let (lim_hi, lim_lo) = (_mm256_set1_epi32(127), _mm256_set1_epi32(-127));
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let zero = _mm256_setzero_si256();
    let (sp, dp) = (src.as_ptr(), dst.as_mut_ptr());
    let (mut kept, mut clamped) = (0usize, 0usize);
    for r in 0..rows {
        for j in 0..b {
            let (s0, d0) = ((r * b + j) * inner, (j * rows + r) * inner);
            for i in (0..i8n).step_by(8) {
                // SAFETY: reads src[s0 + i..][..8] and writes dst[d0 + i..][..8] with i + 8 ≤ inner,
                // inside the block (s0 + inner ≤ src.len() ≤ dst.len(), d0 + inner ≤ src.len()).
                unsafe {
                    let x = _mm256_loadu_si256(sp.add(s0 + i).cast());
                    let q = round8(&p, x, zero);
                    let y = _mm256_min_epi32(_mm256_max_epi32(q, lim_lo), lim_hi);
                    let same = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(y, q)));
                    kept += (same as u32).count_ones() as usize;
                    let w = _mm256_packs_epi16(_mm256_packs_epi32(y, y), zero);
                    let bytes = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(w, order));
                    _mm_storel_epi64(dp.add(d0 + i).cast(), bytes);
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

/// [`super::quantize_f32`], 32 values at a time: NaN lanes to 0, clamp to ±128, truncate (exact for
/// |t| ≤ 128), add ±1 where the fraction reaches ±0.5, clamp to ±127 and pack.
#[target_feature(enable = "avx2")]
fn quantize_avx2(src: &[f32], k: f32, dst: &mut [i8]) {
    assert!(dst.len() >= src.len(), "quantize: dst too short");
    let n32 = src.len() / 32 * 32;
    let (kv, lo, hi) = (
        _mm256_set1_ps(k),
        _mm256_set1_ps(-128.0),
        _mm256_set1_ps(128.0),
    );
    let (half, mhalf) = (_mm256_set1_ps(0.5), _mm256_set1_ps(-0.5));
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let (sp, dp) = (src.as_ptr(), dst.as_mut_ptr());
    for b in (0..n32).step_by(32) {
        let mut q = [_mm256_setzero_si256(); 4];
        for (j, out) in q.iter_mut().enumerate() {
            // SAFETY: reads src[b + 8j..][..8], b + 32 ≤ n32 ≤ src.len().
            let v = unsafe { _mm256_loadu_ps(sp.add(b + 8 * j)) };
            let t = _mm256_mul_ps(v, kv);
            // NaN → 0, then the clamp (neither operand of min/max is NaN any more).
            let t = _mm256_and_ps(t, _mm256_cmp_ps::<_CMP_ORD_Q>(t, t));
            let t = _mm256_min_ps(_mm256_max_ps(t, lo), hi);
            let i = _mm256_cvttps_epi32(t);
            let f = _mm256_sub_ps(t, _mm256_cvtepi32_ps(i));
            let up = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GE_OQ>(f, half));
            let down = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LE_OQ>(f, mhalf));
            // Masks are −1 where true: i + [f ≥ ½] − [f ≤ −½].
            *out = _mm256_add_epi32(_mm256_sub_epi32(i, up), down);
        }
        // ±128 saturate to ±127 after the packs' own saturation to i8 keeps −128: clamp first.
        let (l, h) = (_mm256_set1_epi32(-127), _mm256_set1_epi32(127));
        let c = q.map(|x| _mm256_min_epi32(_mm256_max_epi32(x, l), h));
        let w01 = _mm256_packs_epi32(c[0], c[1]);
        let w23 = _mm256_packs_epi32(c[2], c[3]);
        let bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w01, w23), order);
        // SAFETY: writes dst[b..b + 32], b + 32 ≤ n32 ≤ src.len() ≤ dst.len().
        unsafe { _mm256_storeu_si256(dp.add(b).cast(), bytes) };
    }
    quantize_portable(&src[n32..], k, &mut dst[n32..src.len()]);
}
