//! Packing-free int8 products for small convolutions, where packing an operand costs more than the
//! multiply (a few output channels reuse each im2col element only a few times):
//!
//! * [`igemm_pairs`]: `C = A·B` with B already in the layout one SIMD dot-product step consumes —
//!   depth-pair interleaved bytes, `(B[2q][j], B[2q+1][j])` side by side — and A as depth-pair words
//!   ([`pair_word`]), so the micro-kernel broadcasts a word of A and multiplies it with a row of pairs
//!   read straight from B, for any row stride. The im2col of a convolution writes B in this layout.
//! * [`igemm_dot`]: `C = Σ_s A_s·B_sᵀ` with both operands depth-contiguous and the depth split into
//!   segments (one per sample): a weight gradient `dY·colsᵀ` read from the arena's `dY` and the im2col
//!   rows with no gather or packing; lanes run along the depth and are summed once per output.
//!
//! Both are exact like [`igemm`](super::igemm): products of i8 accumulate in i32, wrapping, so the result
//! is exact whenever the true one fits (total depth at most [`MAX_K`]). Every kernel gives the portable
//! result bit for bit; x86-64 with AVX2 has SIMD versions (chosen for the `Avx2` and `Avx512Vnni`
//! kernels, see [`has_simd_pairs`]), other targets run the portable loops.
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

/// An im2col row for [`igemm_dot`] over `samples` samples: `dst[s·p + i] = src[off + s·stride + i] &
/// m[i]` for `i < p = m.len()` (the mask zeroes the columns a kernel tap reads outside the image).
///
/// # Panics
/// When `src` or `dst` is too short.
pub fn rows_masked(
    src: &[i8],
    off: usize,
    stride: usize,
    samples: usize,
    m: &[i8],
    dst: &mut [i8],
) {
    let p = m.len();
    if samples == 0 || p == 0 {
        return;
    }
    assert!(
        rows_fit(src.len(), off, stride, samples, p) && dst.len() >= samples * p,
        "rows_masked: out of bounds"
    );
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if has_simd_pairs(IgemmKernel::selected()) {
        if let Some(k) = super::x86::Avx2::new() {
            return k.rows_masked(src, off, stride, samples, m, dst);
        }
    }
    rows_masked_portable(src, off, stride, samples, m, dst, 0)
}

/// Two im2col rows interleaved for [`igemm_pairs`] over `samples` samples: `dst[s·2p + 2i] =
/// src[a + s·stride + i] & ma[i]` and `dst[s·2p + 2i + 1] = src[b + s·stride + i] & mb[i]` for
/// `i < p = ma.len()`.
///
/// # Panics
/// When `src` or `dst` is too short or the masks differ in length.
#[allow(clippy::too_many_arguments)]
pub fn rows_interleaved(
    src: &[i8],
    a: usize,
    b: usize,
    stride: usize,
    samples: usize,
    ma: &[i8],
    mb: &[i8],
    dst: &mut [i8],
) {
    let p = ma.len();
    assert_eq!(p, mb.len(), "rows_interleaved: mask lengths differ");
    if samples == 0 || p == 0 {
        return;
    }
    assert!(
        rows_fit(src.len(), a, stride, samples, p)
            && rows_fit(src.len(), b, stride, samples, p)
            && dst.len() >= samples * 2 * p,
        "rows_interleaved: out of bounds"
    );
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if has_simd_pairs(IgemmKernel::selected()) {
        if let Some(k) = super::x86::Avx2::new() {
            return k.rows_interleaved(src, (a, b), stride, samples, (ma, mb), dst);
        }
    }
    rows_interleaved_portable(src, (a, b), stride, samples, (ma, mb), dst, 0)
}

/// Whether `samples` rows of `p` bytes at `off + s·stride` lie inside `len` bytes.
pub(super) fn rows_fit(len: usize, off: usize, stride: usize, samples: usize, p: usize) -> bool {
    (samples - 1)
        .checked_mul(stride)
        .and_then(|x| x.checked_add(off)?.checked_add(p))
        .is_some_and(|end| end <= len)
}

/// [`rows_masked`] for columns `from..p` (the SIMD version's tail).
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

/// [`rows_interleaved`] for columns `from..p` (the SIMD version's tail).
pub(super) fn rows_interleaved_portable(
    src: &[i8],
    (a, b): (usize, usize),
    stride: usize,
    samples: usize,
    (ma, mb): (&[i8], &[i8]),
    dst: &mut [i8],
    from: usize,
) {
    let p = ma.len();
    for s in 0..samples {
        let (ra, rb) = (&src[a + s * stride..][..p], &src[b + s * stride..][..p]);
        let d = &mut dst[s * 2 * p..(s + 1) * 2 * p];
        for i in from..p {
            d[2 * i] = ra[i] & ma[i];
            d[2 * i + 1] = rb[i] & mb[i];
        }
    }
}
