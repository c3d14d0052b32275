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
