//! The stand-in sensor stream: which training sample arrives k-th, and how a pixel becomes an input.
//! Shared with `cargo xtask firmware` (included by path) so its native run sees the same batches.

/// A prime larger than any training slice, so `p ↦ p·STRIDE mod n` is a permutation of the slice.
pub const STRIDE: usize = 7919;
/// How far each epoch's order is rotated (so batches differ between epochs).
pub const SHIFT: usize = 97;
/// Pixels per sample (8×8 digits).
pub const PIXELS: usize = 64;

/// Index into the training slice of `n` samples of the `k`-th sample the stream delivers.
pub fn sample_at(k: usize, n: usize) -> usize {
    let (epoch, p) = (k / n, k % n);
    (p * STRIDE + epoch * SHIFT) % n
}

/// A pixel (0..=16) as the model's input.
pub fn pixel(v: u8) -> f32 {
    v as f32 / 16.0
}

/// Training steps per epoch (the stream delivers `batch` samples per step).
pub fn steps_per_epoch(n: usize, batch: usize) -> usize {
    n.div_ceil(batch)
}

/// Indices (into the bundled split's `labels`) of the samples a board with `classes = (lo, n)` keeps:
/// labels `lo..lo + n`, in file order. Its label becomes `label - lo`. (Used by `build.rs` and xtask.)
#[allow(dead_code)]
pub fn kept(labels: &[u8], (lo, n): (u8, u8)) -> impl Iterator<Item = usize> + '_ {
    labels
        .iter()
        .enumerate()
        .filter(move |&(_, &l)| l >= lo && l - lo < n)
        .map(|(i, _)| i)
}

/// One 8×8 digit (`PIXELS` values) as the model's input: scaled by [`pixel`] and upscaled by `scale`
/// (nearest: each pixel becomes a `scale`×`scale` square) into `out`, `PIXELS · scale²` values.
pub fn input(pixels: &[u8], scale: usize, out: &mut [f32]) {
    let side = 8 * scale;
    for (k, o) in out.iter_mut().enumerate().take(side * side) {
        let (r, c) = (k / side, k % side);
        *o = pixel(pixels[(r / scale) * 8 + c / scale]);
    }
}
