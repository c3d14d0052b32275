//! Packing-free int8 products for small convolutions, where packing an operand costs more than the
//! multiply (a few output channels reuse each im2col element only a few times):
//!
//! * [`igemm_pairs`]: `C = A·B` with B already in the layout one SIMD dot-product step consumes —
//!   depth-pair interleaved bytes, `(B[2q][j], B[2q+1][j])` side by side — and A as depth-pair words
//!   ([`pair_word`]), so the micro-kernel broadcasts a word of A and multiplies it with a row of pairs
//!   read straight from B, for any row stride. The im2col of a convolution writes B in this layout.
//! * [`igemm_dot`]: `C = Σ_s A_s·B_sᵀ` with both operands depth-contiguous, the depth optionally split
//!   into segments: a weight gradient `dY·colsᵀ` or a dense layer's `X·Wᵀ` with no packing; lanes run
//!   along the depth and are summed once per output.
//! * [`RowWriter`]: the im2col of a flat convolution ([`FlatTaps`]) from zero-padded planes, written
//!   straight in either layout (one masked copy per row and sample).
//!
//! Both are exact like [`igemm`](super::igemm): products of i8 accumulate in i32, wrapping, so the result
//! is exact whenever the true one fits (total depth at most [`MAX_K`]). Every kernel gives the portable
//! result bit for bit; x86-64 with AVX2 has SIMD versions (chosen for the `Avx2` and `Avx512Vnni`
//! kernels, see [`has_simd_pairs`]), aarch64 NEON ones (for `Neon` and `NeonDot`; [`igemm_dot`] with
//! `sdot` for `NeonDot`), other targets run the portable loops.
use super::{IgemmKernel, MAX_K};

/// The depth-pair word of A: `lo` in the low 16 bits and `hi` in the high 16, each sign-extended to
/// i16 (the operand of one `vpmaddwd` lane).
#[inline]
pub fn pair_word(lo: i8, hi: i8) -> i32 {
    (i32::from(lo) & 0xffff) | (i32::from(hi) << 16)
}

/// The two int8 values of a [`pair_word`].
#[inline]
fn unpair(w: i32) -> (i32, i32) {
    (i32::from(w as i16), w >> 16)
}

/// Whether [`igemm_pairs`] and [`igemm_dot`] run SIMD code for `kernel` on this CPU (otherwise they are
/// portable loops, correct but slower than [`igemm`](super::igemm)).
pub fn has_simd_pairs(kernel: IgemmKernel) -> bool {
    match kernel {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        IgemmKernel::Avx2 | IgemmKernel::Avx512Vnni => super::x86::Avx2::new().is_some(),
        #[cfg(all(target_arch = "aarch64", not(miri)))]
        IgemmKernel::Neon => true,
        #[cfg(all(target_arch = "aarch64", not(miri)))]
        IgemmKernel::NeonDot => super::aarch64::Dot::new().is_some(),
        _ => false,
    }
}

/// `C[m×n] = (accumulate ? C : 0) + A·B` over `kp` depth pairs: A's word for row `i`, pair `q` is
/// `a[i·lda + q]` ([`pair_word`] of `A[i][2q]`, `A[i][2q+1]`), and B's pair for pair `q`, column `j` is
/// the bytes `b[q·ldb + 2j]` (`B[2q][j]`) and `b[q·ldb + 2j + 1]` (`B[2q+1][j]`). `C` is row-major with
/// row stride `ldc`. With the best kernel for this CPU; never allocates.
///
/// # Panics
/// When an operand is too short for the addressed elements, `lda < kp`, `ldb < 2n` or `ldc < n` with
/// more than one row, or `2·kp > MAX_K`.
#[allow(clippy::too_many_arguments)]
pub fn igemm_pairs(
    m: usize,
    n: usize,
    kp: usize,
    a: &[i32],
    lda: usize,
    b: &[i8],
    ldb: usize,
    c: &mut [i32],
    ldc: usize,
    accumulate: bool,
) {
    igemm_pairs_with(
        IgemmKernel::selected(),
        m,
        n,
        kp,
        a,
        lda,
        b,
        ldb,
        c,
        ldc,
        accumulate,
    )
}

/// The checked shape of one [`igemm_pairs`] call.
#[derive(Clone, Copy, Debug)]
pub(super) struct Pairs {
    pub m: usize,
    pub n: usize,
    pub kp: usize,
    pub lda: usize,
    pub ldb: usize,
    pub ldc: usize,
    pub accumulate: bool,
}

/// [`igemm_pairs`] with a chosen kernel (portable where it has no SIMD version).
///
/// # Panics
/// As [`igemm_pairs`].
#[allow(clippy::too_many_arguments)]
pub fn igemm_pairs_with(
    kernel: IgemmKernel,
    m: usize,
    n: usize,
    kp: usize,
    a: &[i32],
    lda: usize,
    b: &[i8],
    ldb: usize,
    c: &mut [i32],
    ldc: usize,
    accumulate: bool,
) {
    assert!(
        kp.checked_mul(2).is_some_and(|k| k <= MAX_K),
        "igemm_pairs: depth above MAX_K"
    );
    if m == 0 || n == 0 {
        return;
    }
    assert!(m == 1 || ldc >= n, "igemm_pairs: ldc ({ldc}) < n ({n})");
    assert!(
        (m - 1)
            .checked_mul(ldc)
            .and_then(|x| x.checked_add(n))
            .is_some_and(|need| c.len() >= need),
        "igemm_pairs: C too short"
    );
    if kp > 0 {
        assert!(m == 1 || lda >= kp, "igemm_pairs: lda ({lda}) < kp ({kp})");
        assert!(kp == 1 || ldb >= 2 * n, "igemm_pairs: ldb ({ldb}) < 2n");
        assert!(
            (m - 1)
                .checked_mul(lda)
                .and_then(|x| x.checked_add(kp))
                .is_some_and(|need| a.len() >= need),
            "igemm_pairs: A too short"
        );
        assert!(
            (kp - 1)
                .checked_mul(ldb)
                .and_then(|x| x.checked_add(2 * n))
                .is_some_and(|need| b.len() >= need),
            "igemm_pairs: B too short"
        );
    }
    let p = Pairs {
        m,
        n,
        kp,
        lda,
        ldb,
        ldc,
        accumulate,
    };
    if has_simd_pairs(kernel) {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        if let Some(k) = super::x86::Avx2::new() {
            return k.pairs(&p, a, b, c);
        }
        #[cfg(all(target_arch = "aarch64", not(miri)))]
        return super::aarch64::pairs::pairs(&p, a, b, c);
    }
    pairs_portable(&p, a, b, c)
}

/// The portable [`igemm_pairs`] (also the SIMD versions' column tail): row by row, the depth pairs in
/// order, each pair's products added to the whole row.
pub(super) fn pairs_portable(p: &Pairs, a: &[i32], b: &[i8], c: &mut [i32]) {
    for i in 0..p.m {
        let row = &mut c[i * p.ldc..i * p.ldc + p.n];
        if !p.accumulate {
            row.fill(0);
        }
        for q in 0..p.kp {
            let (lo, hi) = unpair(a[i * p.lda + q]);
            let bq = &b[q * p.ldb..q * p.ldb + 2 * p.n];
            for (d, pair) in row.iter_mut().zip(bq.chunks_exact(2)) {
                let s = lo * i32::from(pair[0]) + hi * i32::from(pair[1]);
                *d = d.wrapping_add(s);
            }
        }
    }
}

/// `C[m×n] = (accumulate ? C : 0) + Σ_{s<segs} A_s·B_sᵀ` where `A_s[i][p] = a[s·a_ss + i·a_rs + p]`
/// and `B_s[j][p] = b[s·b_ss + j·b_rs + p]` for `p < len`: both operands are read along their
/// contiguous depth. `C` is row-major with row stride `ldc`. With the best kernel for this CPU; never
/// allocates.
///
/// # Panics
/// When an operand is too short for the addressed elements, `ldc < n` with more than one row, or
/// `segs·len > MAX_K`.
#[allow(clippy::too_many_arguments)]
pub fn igemm_dot(
    m: usize,
    n: usize,
    segs: usize,
    len: usize,
    a: &[i8],
    a_rs: usize,
    a_ss: usize,
    b: &[i8],
    b_rs: usize,
    b_ss: usize,
    c: &mut [i32],
    ldc: usize,
    accumulate: bool,
) {
    igemm_dot_with(
        IgemmKernel::selected(),
        m,
        n,
        segs,
        len,
        a,
        a_rs,
        a_ss,
        b,
        b_rs,
        b_ss,
        c,
        ldc,
        accumulate,
    )
}

/// The checked shape of one [`igemm_dot`] call.
#[derive(Clone, Copy, Debug)]
pub(super) struct Dot {
    pub m: usize,
    pub n: usize,
    pub segs: usize,
    pub len: usize,
    pub a_rs: usize,
    pub a_ss: usize,
    pub b_rs: usize,
    pub b_ss: usize,
    pub ldc: usize,
    pub accumulate: bool,
}

/// Whether element `(s, r, p)` of a segmented operand is inside `len` for every `s < segs`,
/// `r < rows`, `p < depth` (all at least 1).
pub(super) fn seg_addressable(
    len: usize,
    segs: usize,
    ss: usize,
    rows: usize,
    rs: usize,
    depth: usize,
) -> bool {
    (segs - 1)
        .checked_mul(ss)
        .and_then(|x| x.checked_add((rows - 1).checked_mul(rs)?))
        .and_then(|x| x.checked_add(depth))
        .is_some_and(|need| len >= need)
}

/// [`igemm_dot`] with a chosen kernel (portable where it has no SIMD version).
///
/// # Panics
/// As [`igemm_dot`].
#[allow(clippy::too_many_arguments)]
pub fn igemm_dot_with(
    kernel: IgemmKernel,
    m: usize,
    n: usize,
    segs: usize,
    len: usize,
    a: &[i8],
    a_rs: usize,
    a_ss: usize,
    b: &[i8],
    b_rs: usize,
    b_ss: usize,
    c: &mut [i32],
    ldc: usize,
    accumulate: bool,
) {
    assert!(
        segs.checked_mul(len).is_some_and(|k| k <= MAX_K),
        "igemm_dot: depth above MAX_K"
    );
    if m == 0 || n == 0 {
        return;
    }
    assert!(m == 1 || ldc >= n, "igemm_dot: ldc ({ldc}) < n ({n})");
    assert!(
        (m - 1)
            .checked_mul(ldc)
            .and_then(|x| x.checked_add(n))
            .is_some_and(|need| c.len() >= need),
        "igemm_dot: C too short"
    );
    let (segs, len) = if segs == 0 || len == 0 {
        (0, 0)
    } else {
        assert!(
            seg_addressable(a.len(), segs, a_ss, m, a_rs, len),
            "igemm_dot: A too short for its strides"
        );
        assert!(
            seg_addressable(b.len(), segs, b_ss, n, b_rs, len),
            "igemm_dot: B too short for its strides"
        );
        (segs, len)
    };
    let p = Dot {
        m,
        n,
        segs,
        len,
        a_rs,
        a_ss,
        b_rs,
        b_ss,
        ldc,
        accumulate,
    };
    if has_simd_pairs(kernel) && len > 0 {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        if let Some(k) = super::x86::Avx2::new() {
            return k.dot(&p, a, b, c);
        }
        #[cfg(all(target_arch = "aarch64", not(miri)))]
        {
            if kernel == IgemmKernel::NeonDot {
                if let Some(k) = super::aarch64::Dot::new() {
                    return k.dot(&p, a, b, c);
                }
            }
            return super::aarch64::pairs::dot(&p, a, b, c);
        }
    }
    dot_portable(&p, a, b, c)
}

/// The portable [`igemm_dot`]: one sum per output, segments in order.
pub(super) fn dot_portable(p: &Dot, a: &[i8], b: &[i8], c: &mut [i32]) {
    for i in 0..p.m {
        for j in 0..p.n {
            let mut sum = 0i32;
            for s in 0..p.segs {
                let ar = &a[s * p.a_ss + i * p.a_rs..][..p.len];
                let br = &b[s * p.b_ss + j * p.b_rs..][..p.len];
                for (&x, &y) in ar.iter().zip(br) {
                    sum = sum.wrapping_add(i32::from(x) * i32::from(y));
                }
            }
            let d = &mut c[i * p.ldc + j];
            *d = if p.accumulate {
                d.wrapping_add(sum)
            } else {
                sum
            };
        }
    }
}

/// The im2col writers ([`RowWriter::im2col`], [`RowWriter::im2col_pairs`]) of one kernel, resolved once
/// (a convolution calls them for every tile).
#[derive(Clone, Copy, Debug)]
pub struct RowWriter(Rows);

#[derive(Clone, Copy, Debug)]
enum Rows {
    Portable,
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    Avx2(super::x86::Avx2),
    #[cfg(all(target_arch = "aarch64", not(miri)))]
    Neon,
}

impl RowWriter {
    /// The writers of the selected kernel.
    pub fn selected() -> Self {
        Self::with(IgemmKernel::selected())
    }

    /// The writers of `kernel` (portable where it has no SIMD version).
    pub fn with(kernel: IgemmKernel) -> Self {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        if has_simd_pairs(kernel) {
            if let Some(k) = super::x86::Avx2::new() {
                return Self(Rows::Avx2(k));
            }
        }
        #[cfg(all(target_arch = "aarch64", not(miri)))]
        if has_simd_pairs(kernel) {
            return Self(Rows::Neon);
        }
        let _ = kernel;
        Self(Rows::Portable)
    }
}

/// The im2col of a *flat* convolution (stride 1, output rows as wide as the input rows) read from
/// zero-padded planes: row `r = (c·kh + ki)·kw + kj` of sample `s` is the `p` bytes at
/// `first + s·sample + c·plane + ki·w + kj`, ANDed with row `kj` of `masks` (`kw` rows of `p` bytes
/// that zero the columns a tap reads outside the image).
#[derive(Clone, Copy, Debug)]
pub struct FlatTaps {
    /// Rows (`channels·kh·kw`).
    pub rows: usize,
    /// Kernel height.
    pub kh: usize,
    /// Kernel width.
    pub kw: usize,
    /// Input row width (the shift of one kernel row).
    pub w: usize,
    /// Bytes between a sample's channels.
    pub plane: usize,
    /// Bytes between samples.
    pub sample: usize,
    /// Offset of row 0 of sample 0.
    pub first: usize,
    /// Bytes per row and sample (output positions).
    pub p: usize,
}

impl FlatTaps {
    /// Offset of row `(c, ki, kj)` of sample 0.
    #[inline]
    pub(super) fn at(&self, (c, ki, kj): (usize, usize, usize)) -> usize {
        self.first + c * self.plane + ki * self.w + kj
    }
    /// The next row's `(c, ki, kj)`.
    #[inline]
    pub(super) fn next(&self, (c, ki, kj): (usize, usize, usize)) -> (usize, usize, usize) {
        if kj + 1 < self.kw {
            (c, ki, kj + 1)
        } else if ki + 1 < self.kh {
            (c, ki + 1, 0)
        } else {
            (c + 1, 0, 0)
        }
    }
    /// Whether every byte the rows of `samples` samples read lies in `src_len`, and the masks in
    /// `masks_len`.
    pub(super) fn fits(&self, samples: usize, src_len: usize, masks_len: usize) -> bool {
        let kk = self.kh * self.kw;
        if samples == 0 || self.rows == 0 || kk == 0 || !self.rows.is_multiple_of(kk) {
            return false;
        }
        let last = (self.rows / kk - 1, self.kh - 1, self.kw - 1);
        let end = (samples - 1)
            .checked_mul(self.sample)
            .and_then(|x| x.checked_add(last.0.checked_mul(self.plane)?))
            .and_then(|x| x.checked_add(last.1.checked_mul(self.w)?))
            .and_then(|x| {
                x.checked_add(self.first)?
                    .checked_add(last.2)?
                    .checked_add(self.p)
            });
        end.is_some_and(|e| e <= src_len)
            && self.kw.checked_mul(self.p).is_some_and(|m| m <= masks_len)
    }
}

impl RowWriter {
    /// Every row of [`FlatTaps`] for `samples` samples into `dst`: row `r` at `r·ld`, sample `s` at
    /// `s·p` within it (the operand `B` of [`igemm_dot`] as `Bᵀ`).
    ///
    /// # Panics
    /// When the taps read outside `src` or `masks`, `ld < samples·p`, or `dst` is too short.
    pub fn im2col(
        self,
        t: &FlatTaps,
        samples: usize,
        src: &[i8],
        masks: &[i8],
        dst: &mut [i8],
        ld: usize,
    ) {
        if t.rows == 0 || samples == 0 || t.p == 0 {
            return;
        }
        assert!(
            t.fits(samples, src.len(), masks.len())
                && ld >= samples * t.p
                && dst.len() >= (t.rows - 1) * ld + samples * t.p,
            "im2col: out of bounds"
        );
        match self.0 {
            #[cfg(all(target_arch = "x86_64", not(miri)))]
            Rows::Avx2(k) => k.im2col(t, samples, src, masks, dst, ld),
            #[cfg(all(target_arch = "aarch64", not(miri)))]
            Rows::Neon => super::aarch64::pairs::im2col(t, samples, src, masks, dst, ld),
            Rows::Portable => {
                let mut tap = (0, 0, 0);
                for r in 0..t.rows {
                    let m = &masks[tap.2 * t.p..(tap.2 + 1) * t.p];
                    let d = &mut dst[r * ld..r * ld + samples * t.p];
                    rows_masked_portable(src, t.at(tap), t.sample, samples, m, d, 0);
                    tap = t.next(tap);
                }
            }
        }
    }

    /// Every row of [`FlatTaps`] for `samples` samples, interleaved by pairs (the operand `B` of
    /// [`igemm_pairs`]): rows `2q` and `2q + 1` at `q·ld2`, sample `s` at `2·s·p` within it; an odd last
    /// row is paired with zeros.
    ///
    /// # Panics
    /// When the taps read outside `src` or `masks`, `ld2 < 2·samples·p`, or `dst` is too short.
    pub fn im2col_pairs(
        self,
        t: &FlatTaps,
        samples: usize,
        src: &[i8],
        masks: &[i8],
        dst: &mut [i8],
        ld2: usize,
    ) {
        if t.rows == 0 || samples == 0 || t.p == 0 {
            return;
        }
        let kp = t.rows.div_ceil(2);
        assert!(
            t.fits(samples, src.len(), masks.len())
                && ld2 >= 2 * samples * t.p
                && dst.len() >= (kp - 1) * ld2 + 2 * samples * t.p,
            "im2col_pairs: out of bounds"
        );
        match self.0 {
            #[cfg(all(target_arch = "x86_64", not(miri)))]
            Rows::Avx2(k) => k.im2col_pairs(t, samples, src, masks, dst, ld2),
            #[cfg(all(target_arch = "aarch64", not(miri)))]
            Rows::Neon => super::aarch64::pairs::im2col_pairs(t, samples, src, masks, dst, ld2),
            Rows::Portable => {
                let mut tap = (0, 0, 0);
                for q in 0..kp {
                    let (a, ka) = (t.at(tap), tap.2 * t.p);
                    tap = t.next(tap);
                    let b = (2 * q + 1 < t.rows).then(|| (t.at(tap), tap.2 * t.p));
                    tap = t.next(tap);
                    let d = &mut dst[q * ld2..q * ld2 + 2 * samples * t.p];
                    for s in 0..samples {
                        for i in 0..t.p {
                            d[s * 2 * t.p + 2 * i] = src[a + s * t.sample + i] & masks[ka + i];
                            d[s * 2 * t.p + 2 * i + 1] = match b {
                                Some((b, kb)) => src[b + s * t.sample + i] & masks[kb + i],
                                None => 0,
                            };
                        }
                    }
                }
            }
        }
    }
}

/// One masked im2col row over `samples` samples, columns `from..p`: `dst[s·p + i] = src[off +
/// s·stride + i] & m[i]`.
pub(super) fn rows_masked_portable(
    src: &[i8],
    off: usize,
    stride: usize,
    samples: usize,
    m: &[i8],
    dst: &mut [i8],
    from: usize,
) {
    let p = m.len();
    for s in 0..samples {
        let row = &src[off + s * stride + from..off + s * stride + p];
        for ((d, &v), &k) in dst[s * p + from..(s + 1) * p]
            .iter_mut()
            .zip(row)
            .zip(&m[from..])
        {
            *d = v & k;
        }
    }
}
