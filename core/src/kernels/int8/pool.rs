//! 2×2, stride-2 max pooling of int8 rows: the forward keeps each window's maximum and its index, the
//! backward adds the output derivative at that index. Row pairs lie back to back (`[top w][bottom w]`
//! per pair, `w` even), as in a plane of even height or a whole tensor of such planes. The AVX2 and
//! NEON versions (pair widths 2, 4, 8 and multiples of 16) give the portable result bit for bit.
/// Forward over `pairs` row pairs of width `w` (even): `y[k·w/2 + x]` is the maximum of window `x` of
/// pair `k` and `idx` its index (0 top-left, 1 top-right, 2 bottom-left, 3 bottom-right; the first of
/// equal values in that order).
///
/// # Panics
/// When `w` is odd or a slice is too short.
pub fn maxpool2x2(x: &[i8], w: usize, pairs: usize, y: &mut [i8], idx: &mut [u8]) {
    let ow = w / 2;
    assert!(
        w.is_multiple_of(2)
            && x.len() >= pairs * 2 * w
            && y.len() >= pairs * ow
            && idx.len() >= pairs * ow,
        "maxpool2x2: bad shape"
    );
    #[cfg(any(test, feature = "std"))]
    if super::offload::with(|o| o.maxpool2x2(x, w, pairs, y, idx)) == Some(true) {
        return;
    }
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if super::has_simd_pairs(super::IgemmKernel::selected()) {
        if let Some(k) = super::x86::Avx2::new() {
            return k.maxpool2x2(x, w, pairs, y, idx);
        }
    }
    #[cfg(all(target_arch = "aarch64", not(miri)))]
    if super::has_simd_pairs(super::IgemmKernel::selected()) {
        return super::aarch64::pool::maxpool2x2(x, w, pairs, y, idx);
    }
    maxpool2x2_portable(x, w, 0, pairs, y, idx)
}

/// Backward over `pairs` row pairs of width `w` (even): at each window's index `idx`, `dx ←
/// clamp(dx + dy, −127, 127)`; the other elements of `dx` are left as they are.
///
/// # Panics
/// When `w` is odd or a slice is too short.
pub fn maxpool2x2_grad(dy: &[i8], idx: &[u8], w: usize, pairs: usize, dx: &mut [i8]) {
    let ow = w / 2;
    assert!(
        w.is_multiple_of(2)
            && dx.len() >= pairs * 2 * w
            && dy.len() >= pairs * ow
            && idx.len() >= pairs * ow,
        "maxpool2x2_grad: bad shape"
    );
    #[cfg(any(test, feature = "std"))]
    if super::offload::with(|o| o.maxpool2x2_grad(dy, idx, w, pairs, dx)) == Some(true) {
        return;
    }
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if super::has_simd_pairs(super::IgemmKernel::selected()) {
        if let Some(k) = super::x86::Avx2::new() {
            return k.maxpool2x2_grad(dy, idx, w, pairs, dx);
        }
    }
    #[cfg(all(target_arch = "aarch64", not(miri)))]
    if super::has_simd_pairs(super::IgemmKernel::selected()) {
        return super::aarch64::pool::maxpool2x2_grad(dy, idx, w, pairs, dx);
    }
    maxpool2x2_grad_portable(dy, idx, w, 0, pairs, dx)
}

/// The portable forward for pairs `from..pairs` (the SIMD versions' tail).
pub(super) fn maxpool2x2_portable(
    x: &[i8],
    w: usize,
    from: usize,
    pairs: usize,
    y: &mut [i8],
    idx: &mut [u8],
) {
    let ow = w / 2;
    for k in from..pairs {
        let (top, bottom) = x[k * 2 * w..(k + 1) * 2 * w].split_at(w);
        for o in 0..ow {
            let (mut best, mut bi) = (top[2 * o], 0u8);
            for (v, i) in [
                (top[2 * o + 1], 1u8),
                (bottom[2 * o], 2),
                (bottom[2 * o + 1], 3),
            ] {
                if v > best {
                    best = v;
                    bi = i;
                }
            }
            y[k * ow + o] = best;
            idx[k * ow + o] = bi;
        }
    }
}

/// The portable backward for pairs `from..pairs` (the SIMD versions' tail).
pub(super) fn maxpool2x2_grad_portable(
    dy: &[i8],
    idx: &[u8],
    w: usize,
    from: usize,
    pairs: usize,
    dx: &mut [i8],
) {
    let ow = w / 2;
    for k in from..pairs {
        for o in 0..ow {
            let i = idx[k * ow + o] as usize;
            let at = k * 2 * w + (i / 2) * w + 2 * o + i % 2;
            dx[at] = (dx[at] as i32 + dy[k * ow + o] as i32).clamp(-127, 127) as i8;
        }
    }
}
