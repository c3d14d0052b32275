//! Inverted dropout. Element `i` of the tensor is kept iff
//! `(hash2(seed, i) >> 40) as f32 / 2^24 >= p`; kept values are scaled by `1/(1−p)`. The mask is a pure
//! function of `(seed, i)`, so the backward pass regenerates it instead of storing it (`i` counts from
//! the start of the given slice, so the forward and backward must be handed the same tensor extent).
//!
//! Slices of different lengths are processed over their common prefix (callers pass equal lengths).
use crate::kernels::Real;
use crate::rng::hash2;

/// Whether element `i` survives with drop probability `p` (exact: the 24-bit integer and the scale by
/// 2^-24 are both exact in f32).
#[inline(always)]
pub fn dropout_keep(p: f32, seed: u64, i: usize) -> bool {
    (hash2(seed, i as u64) >> 40) as f32 * (1.0 / (1u64 << 24) as f32) >= p
}

/// The scale applied to kept elements, `1/(1−p)`, computed in `T`.
#[inline]
fn keep_scale<T: Real>(p: f32) -> T {
    T::ONE / (T::ONE - T::from_f32(p))
}

/// `y = mask·x/(1−p)`.
pub fn dropout_fwd<T: Real>(p: f32, seed: u64, x: &[T], y: &mut [T]) {
    let s = keep_scale::<T>(p);
    for (i, (y, &x)) in y.iter_mut().zip(x).enumerate() {
        *y = if dropout_keep(p, seed, i) {
            x * s
        } else {
            T::ZERO
        };
    }
}

/// `y = mask·y/(1−p)` in place.
pub fn dropout_fwd_inplace<T: Real>(p: f32, seed: u64, y: &mut [T]) {
    let s = keep_scale::<T>(p);
    for (i, y) in y.iter_mut().enumerate() {
        *y = if dropout_keep(p, seed, i) {
            *y * s
        } else {
            T::ZERO
        };
    }
}

/// `dx = mask·dy/(1−p)` (or `dx += …` when `accumulate`), same `(p, seed)` as the forward.
pub fn dropout_grad<T: Real>(p: f32, seed: u64, dy: &[T], dx: &mut [T], accumulate: bool) {
    let s = keep_scale::<T>(p);
    if accumulate {
        for (i, (dx, &dy)) in dx.iter_mut().zip(dy).enumerate() {
            if dropout_keep(p, seed, i) {
                *dx += dy * s;
            }
        }
    } else {
        for (i, (dx, &dy)) in dx.iter_mut().zip(dy).enumerate() {
            *dx = if dropout_keep(p, seed, i) {
                dy * s
            } else {
                T::ZERO
            };
        }
    }
}

/// `d = mask·d/(1−p)` in place (`d` holds `dy` on entry, `dx` on return).
pub fn dropout_grad_inplace<T: Real>(p: f32, seed: u64, d: &mut [T]) {
    dropout_fwd_inplace(p, seed, d)
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)]
mod tests {
    use super::*;
    use crate::ops::testutil::*;
    use crate::rng::Rng;

    #[test]
    fn mask_rule_and_scale() {
        let (p, seed) = (0.3f32, 77u64);
        let x: Vec<f64> = (0..1000).map(|i| i as f64 + 1.0).collect();
        let mut y = vec![0.0; 1000];
        dropout_fwd(p, seed, &x, &mut y);
        let mut kept = 0;
        for i in 0..1000 {
            let u = (hash2(seed, i as u64) >> 40) as f32 / 16_777_216.0;
            if u >= p {
                kept += 1;
                assert_eq!(y[i], x[i] * (1.0 / (1.0 - p as f64)));
            } else {
                assert_eq!(y[i], 0.0);
            }
        }
        // Binomial(1000, 0.7): mean 700, sd ≈ 14.5; ±80 is > 5 sd.
        assert!((620..=780).contains(&kept), "kept {kept}");
        // p = 0 keeps everything unscaled.
        let mut z = vec![0.0; 1000];
        dropout_fwd(0.0, seed, &x, &mut z);
        assert_eq!(z, x);
    }

    #[test]
    fn fd_inplace_accumulate_f32() {
        let mut rng = Rng::new(20);
        let (p, seed) = (0.4f32, 5u64);
        let x = rand_vec(&mut rng, 97, -1.0, 1.0);
        let r = rand_vec(&mut rng, 97, -1.0, 1.0);
        let mut y = vec![0.0; 97];
        dropout_fwd(p, seed, &x, &mut y);
        let mut y2 = x.clone();
        dropout_fwd_inplace(p, seed, &mut y2);
        assert_eq!(y, y2);
        let mut dx = vec![0.0; 97];
        dropout_grad(p, seed, &r, &mut dx, false);
        let mut d2 = r.clone();
        dropout_grad_inplace(p, seed, &mut d2);
        assert_eq!(dx, d2);
        let pre = rand_vec(&mut rng, 97, -1.0, 1.0);
        let mut dacc = pre.clone();
        dropout_grad(p, seed, &r, &mut dacc, true);
        let fd = fd_grad(&x, |x| {
            let mut y = vec![0.0; x.len()];
            dropout_fwd(p, seed, x, &mut y);
            dotf(&y, &r)
        });
        assert_close("dropout dx", &dx, &fd, FD_TOL, FD_FLOOR);
        assert_close("dropout dx acc", &sub(&dacc, &pre), &fd, FD_TOL, FD_FLOOR);
        // f32: same mask, one rounding of the scale and one of the product: ≤ 2 ulps.
        let mut y32 = vec![0.0f32; 97];
        dropout_fwd(p, seed, &to_f32(&x), &mut y32);
        assert_close("dropout f32", &widen(&y32), &y, 2.5e-7, 1e-3);
        let mut dx32 = vec![0.0f32; 97];
        dropout_grad(p, seed, &to_f32(&r), &mut dx32, false);
        assert_close("dropout grad f32", &widen(&dx32), &dx, 2.5e-7, 1e-3);
    }
}
