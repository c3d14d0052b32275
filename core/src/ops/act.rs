//! Point-wise activations. The backward pass is computed from the OUTPUT `y` (every supported
//! activation's derivative is a function of its output), so the forward may overwrite its input.
//!
//! Derivative conventions follow PyTorch: ReLU'(0) = 0; ReLU6 passes the gradient only where
//! `0 < y < 6` (hardtanh backward: `min < x < max`).
//!
//! Slices of different lengths are processed over their common prefix (callers pass equal lengths).
use crate::kernels::{vector, Real};

/// An activation function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    /// max(0, x).
    Relu,
    /// min(max(0, x), 6).
    Relu6,
    /// 1 / (1 + e^-x).
    Sigmoid,
    /// tanh(x).
    Tanh,
}

/// ReLU of one element (a kernel that applies it as it writes, [`crate::ops::bn_fwd_train_then`],
/// gives the same bits as [`act_fwd`]).
#[inline(always)]
pub fn relu<T: Real>(x: T) -> T {
    // `x < 0 → 0` keeps NaN as NaN, like PyTorch.
    if x < T::ZERO {
        T::ZERO
    } else {
        x
    }
}

/// ReLU6 of one element (see [`relu`]).
#[inline(always)]
pub fn relu6<T: Real>(x: T) -> T {
    let six = T::from_f32(6.0);
    if x < T::ZERO {
        T::ZERO
    } else if x > six {
        six
    } else {
        x
    }
}

/// Whether `T` has single precision (a 24-bit significand: 2^24 + 1 rounds to 2^24). Then sigmoid and
/// tanh use the branch-free, vectorisable [`exp_f32`] (libm's scalar `expf`/`tanhf` calls cost ~10×
/// more per element); `f64`, the reference path, keeps libm.
#[inline(always)]
fn single<T: Real>() -> bool {
    T::from_usize(16_777_217) == T::from_usize(16_777_216)
}

/// e^x in f32: Cody–Waite reduction `x = n·ln2 + r`, `|r| ≤ ln2/2`, and the Cephes `expf` polynomial
/// (≤ 2e-7 relative error), scaled by 2·2^(n−1) built from exponent bits. The input is clamped to
/// [-86, 89]: above, the result overflows to +inf as it should; below, it saturates at e^-86 ≈ 4e-38
/// instead of decaying to 0 (harmless for sigmoid/tanh, which are then 0/1 to f32 precision anyway).
/// NaN propagates.
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    let x = if x > 89.0 { 89.0 } else { x };
    let x = if x < -86.0 { -86.0 } else { x };
    // Adding and subtracting 1.5·2^23 rounds to the nearest integer (|x·log2e| < 2^22).
    const MAGIC: f32 = 12_582_912.0;
    let t = x * core::f32::consts::LOG2_E + MAGIC;
    let n = t - MAGIC;
    // ln2 split so that n·C1 is exact for |n| ≤ 127.
    let r = x - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let z = r * r;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 0.5;
    let e = p * z + r + 1.0;
    // n sits in the low significand bits of t (exactly: t = 1.5·2^23 + n), so the biased exponent of
    // 2^(n−1) is integer arithmetic on the bits — no float→int conversion, which vectorises badly.
    // n ∈ [-124, 129] after the clamp, so n − 1 + 127 ∈ [2, 255]; 255 (n = 129) is +inf. A NaN input
    // gives a NaN `e`, which any scale keeps NaN.
    let bits = t.to_bits().wrapping_sub(MAGIC.to_bits()).wrapping_add(126) << 23;
    (e * 2.0) * f32::from_bits(bits)
}

#[inline(always)]
fn sigmoid_f32(x: f32) -> f32 {
    1.0 / (1.0 + exp_f32(-x))
}

/// tanh in f32: `(1 − e^{-2|x|})/(1 + e^{-2|x|})` with the sign restored, and for `|x| < 0.4` (where
/// `1 − e^{-2|x|}` would cancel) its Taylor series to x¹¹ (truncation ≤ 6e-8 relative there).
#[inline(always)]
fn tanh_f32(x: f32) -> f32 {
    let a = if x < 0.0 { -x } else { x };
    let e = exp_f32(-2.0 * a);
    let big = (1.0 - e) / (1.0 + e);
    let z = x * x;
    let small = x + x
        * z
        * (-1.0 / 3.0
            + z * (2.0 / 15.0
                + z * (-17.0 / 315.0 + z * (62.0 / 2835.0 + z * (-1382.0 / 155_925.0)))));
    if a < 0.4 {
        small
    } else if x < 0.0 {
        -big
    } else {
        big
    }
}

#[inline(always)]
fn sigmoid<T: Real>(x: T) -> T {
    // e^-x overflows to +inf for very negative x, giving 1/inf = 0: no NaN.
    T::ONE / (T::ONE + (-x).exp())
}

/// `y = a(x)`.
pub fn act_fwd<T: Real>(a: Act, x: &[T], y: &mut [T]) {
    // One loop per activation, each in its AVX2 copy where the CPU has it.
    match a {
        Act::Relu => vector::map(x, y, relu),
        Act::Relu6 => vector::map(x, y, relu6),
        Act::Sigmoid if single::<T>() => {
            vector::map(x, y, |x| T::from_f32(sigmoid_f32(x.to_f32())))
        }
        Act::Sigmoid => vector::map(x, y, sigmoid),
        Act::Tanh if single::<T>() => vector::map(x, y, |x| T::from_f32(tanh_f32(x.to_f32()))),
        Act::Tanh => vector::map(x, y, |x| x.tanh()),
    }
}

/// `y = a(y)` in place.
pub fn act_fwd_inplace<T: Real>(a: Act, y: &mut [T]) {
    match a {
        Act::Relu => vector::map_inplace(y, relu),
        Act::Relu6 => vector::map_inplace(y, relu6),
        Act::Sigmoid if single::<T>() => {
            vector::map_inplace(y, |v| T::from_f32(sigmoid_f32(v.to_f32())))
        }
        Act::Sigmoid => vector::map_inplace(y, sigmoid),
        Act::Tanh if single::<T>() => vector::map_inplace(y, |v| T::from_f32(tanh_f32(v.to_f32()))),
        Act::Tanh => vector::map_inplace(y, |v| v.tanh()),
    }
}

/// a'(x) expressed through the output `y = a(x)`.
#[inline(always)]
fn deriv<T: Real>(a: Act, y: T) -> T {
    match a {
        Act::Relu => {
            if y > T::ZERO {
                T::ONE
            } else {
                T::ZERO
            }
        }
        Act::Relu6 => {
            if y > T::ZERO && y < T::from_f32(6.0) {
                T::ONE
            } else {
                T::ZERO
            }
        }
        Act::Sigmoid => y * (T::ONE - y),
        Act::Tanh => T::ONE - y * y,
    }
}

/// `a'(x)·dy` of one element, from the output `y` (a kernel that applies it as it reads its
/// gradient, [`crate::ops::bn_grad_inplace_then`], gives the same bits as [`act_grad`]).
#[inline(always)]
pub fn act_grad_one<T: Real>(a: Act, y: T, dy: T) -> T {
    grad_one(a, y, dy)
}

#[inline(always)]
fn grad_one<T: Real>(a: Act, y: T, dy: T) -> T {
    match a {
        // Select instead of multiply, so an infinite dy on a dead unit yields 0 like PyTorch.
        Act::Relu => {
            if y > T::ZERO {
                dy
            } else {
                T::ZERO
            }
        }
        Act::Relu6 => {
            if y > T::ZERO && y < T::from_f32(6.0) {
                dy
            } else {
                T::ZERO
            }
        }
        _ => dy * deriv(a, y),
    }
}

/// `dx = a'(x)·dy` (or `dx += …` when `accumulate`), computed from the output `y`.
pub fn act_grad<T: Real>(a: Act, y: &[T], dy: &[T], dx: &mut [T], accumulate: bool) {
    // One monomorphised loop per (activation, accumulate) keeps the inner loops branch-free.
    macro_rules! run {
        ($act:expr) => {
            if accumulate {
                for ((dx, &y), &dy) in dx.iter_mut().zip(y).zip(dy) {
                    *dx += grad_one($act, y, dy);
                }
            } else {
                for ((dx, &y), &dy) in dx.iter_mut().zip(y).zip(dy) {
                    *dx = grad_one($act, y, dy);
                }
            }
        };
    }
    match a {
        Act::Relu => run!(Act::Relu),
        Act::Relu6 => run!(Act::Relu6),
        Act::Sigmoid => run!(Act::Sigmoid),
        Act::Tanh => run!(Act::Tanh),
    }
}

/// `d = a'(x)·d` in place: `d` holds `dy` on entry and `dx` on return.
pub fn act_grad_inplace<T: Real>(a: Act, y: &[T], d: &mut [T]) {
    macro_rules! run {
        ($act:expr) => {
            for (d, &y) in d.iter_mut().zip(y) {
                *d = grad_one($act, y, *d);
            }
        };
    }
    match a {
        Act::Relu => run!(Act::Relu),
        Act::Relu6 => run!(Act::Relu6),
        Act::Sigmoid => run!(Act::Sigmoid),
        Act::Tanh => run!(Act::Tanh),
    }
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)]
mod tests {
    use super::*;
    use crate::ops::testutil::*;
    use crate::rng::Rng;

    const ALL: [Act; 4] = [Act::Relu, Act::Relu6, Act::Sigmoid, Act::Tanh];

    /// Inputs in [-8, 8) kept ≥ 1e-3 away from the kinks at 0 and 6 (the FD step is 1e-6).
    fn inputs(rng: &mut Rng, len: usize) -> Vec<f64> {
        let mut v = rand_vec(rng, len, -8.0, 8.0);
        for x in v.iter_mut() {
            if x.abs() < 1e-3 || (*x - 6.0).abs() < 1e-3 {
                *x += 0.01;
            }
        }
        v
    }

    #[test]
    fn fd_and_inplace() {
        let mut rng = Rng::new(10);
        for a in ALL {
            let x = inputs(&mut rng, 64);
            let r = rand_vec(&mut rng, 64, -1.0, 1.0);
            let mut y = vec![0.0; 64];
            act_fwd(a, &x, &mut y);
            let mut y2 = x.clone();
            act_fwd_inplace(a, &mut y2);
            assert_eq!(y, y2, "{a:?} in-place forward");

            let mut dx = vec![0.0; 64];
            act_grad(a, &y, &r, &mut dx, false);
            let mut d2 = r.clone();
            act_grad_inplace(a, &y, &mut d2);
            assert_eq!(dx, d2, "{a:?} in-place backward");

            let pre = rand_vec(&mut rng, 64, -1.0, 1.0);
            let mut dacc = pre.clone();
            act_grad(a, &y, &r, &mut dacc, true);

            let fd = fd_grad(&x, |x| {
                let mut y = vec![0.0; x.len()];
                act_fwd(a, x, &mut y);
                dotf(&y, &r)
            });
            assert_close(&format!("{a:?} dx"), &dx, &fd, FD_TOL, FD_FLOOR);
            assert_close(
                &format!("{a:?} dx acc"),
                &sub(&dacc, &pre),
                &fd,
                FD_TOL,
                FD_FLOOR,
            );
        }
    }

    #[test]
    fn f32_matches_f64() {
        // libm's f32 exp/tanh are accurate to ~1 ulp; sigmoid adds two roundings, the backward one more
        // product: a few ulps of 2^-24 ≈ 6e-8 each, so 1e-6 relative is a loose, safe bound. For
        // outputs near 0 (sigmoid(-8) ≈ 3e-4) the floor (1e-3 of the max) absorbs the absolute error.
        let mut rng = Rng::new(11);
        for a in ALL {
            let x = inputs(&mut rng, 200);
            let dy = rand_vec(&mut rng, 200, -1.0, 1.0);
            let (mut y, mut dx) = (vec![0.0; 200], vec![0.0; 200]);
            act_fwd(a, &x, &mut y);
            act_grad(a, &y, &dy, &mut dx, false);
            let (x32, dy32) = (to_f32(&x), to_f32(&dy));
            let (mut y32, mut dx32) = (vec![0.0f32; 200], vec![0.0f32; 200]);
            act_fwd(a, &x32, &mut y32);
            act_grad(a, &y32, &dy32, &mut dx32, false);
            assert_close(&format!("{a:?} y"), &widen(&y32), &y, 1e-6, 1e-3);
            // The backward is a function of the f32 output: y carries ≤ 2u relative error (u = 2^-24),
            // which 1 − y (sigmoid near 1) or 1 − y² (tanh near ±1) turns into an ABSOLUTE error of
            // ≤ 4u in the derivative (whose values are ≤ 1) — large relative to a tiny derivative,
            // inherent to output-based backward (PyTorch's too). Bound: |Δdx| ≤ 8u·|dy|.
            let u = 1.0 / (1u64 << 24) as f64;
            for i in 0..200 {
                let err = (dx32[i] as f64 - dx[i]).abs();
                assert!(err <= 8.0 * u * dy[i].abs(), "{a:?} dx[{i}] err {err:e}");
            }
        }
    }

    #[test]
    fn fast_f32_sigmoid_tanh_accuracy() {
        // Dense sweep plus the branch points, against f64 libm. The Cephes polynomial is ≤ 2e-7
        // relative; sigmoid adds two roundings (1 + e, 1/·) and tanh three plus the (1−e) cancellation
        // amplified by e/(1−e) ≤ 0.82 at |x| = 0.4: ≤ ~4e-7 for both, asserted at 5e-7 relative
        // (outputs below 1e-30 are compared absolutely: they are f32-subnormal territory).
        assert!(single::<f32>() && !single::<f64>());
        let mut xs: Vec<f32> = (-40_000..=40_000).map(|i| i as f32 * 1e-3).collect();
        xs.extend([
            0.4,
            -0.4,
            0.399_999_98,
            1e-8,
            -1e-30,
            87.0,
            -87.0,
            88.5,
            -100.0,
            100.0,
            1e5,
            -1e5,
        ]);
        for &x in &xs {
            let (s, t) = (sigmoid_f32(x) as f64, tanh_f32(x) as f64);
            let xd = x as f64;
            let (sw, tw) = (1.0 / (1.0 + (-xd).exp()), xd.tanh());
            assert!(
                (s - sw).abs() <= 5e-7 * sw.abs().max(1e-30),
                "sigmoid({x}) = {s} vs {sw}"
            );
            assert!(
                (t - tw).abs() <= 5e-7 * tw.abs().max(1e-30),
                "tanh({x}) = {t} vs {tw}"
            );
        }
        assert!(
            exp_f32(f32::NAN).is_nan()
                && sigmoid_f32(f32::NAN).is_nan()
                && tanh_f32(f32::NAN).is_nan()
        );
        assert_eq!(
            (sigmoid_f32(f32::INFINITY), sigmoid_f32(f32::NEG_INFINITY)),
            (1.0, 0.0)
        );
        assert_eq!(
            (tanh_f32(f32::INFINITY), tanh_f32(f32::NEG_INFINITY)),
            (1.0, -1.0)
        );
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(
            (exp_f32(89.0), exp_f32(88.8)),
            (f32::INFINITY, f32::INFINITY)
        );
        for x in [-85.9f32, -40.0, -1.0, 0.5, 10.0, 88.0, 88.7] {
            let (g, w) = (exp_f32(x) as f64, (x as f64).exp());
            assert!((g - w).abs() <= 3e-7 * w, "exp({x}) = {g} vs {w}");
        }
    }

    #[test]
    fn exact_values_and_conventions() {
        let x = [-1.0f32, 0.0, 3.0, 6.0, 7.0];
        let mut y = [0.0f32; 5];
        act_fwd(Act::Relu, &x, &mut y);
        assert_eq!(y, [0.0, 0.0, 3.0, 6.0, 7.0]);
        let mut d = [1.0f32; 5];
        act_grad_inplace(Act::Relu, &y, &mut d);
        assert_eq!(d, [0.0, 0.0, 1.0, 1.0, 1.0], "ReLU'(0) = 0");
        act_fwd(Act::Relu6, &x, &mut y);
        assert_eq!(y, [0.0, 0.0, 3.0, 6.0, 6.0]);
        let mut d = [1.0f32; 5];
        act_grad_inplace(Act::Relu6, &y, &mut d);
        assert_eq!(d, [0.0, 0.0, 1.0, 0.0, 0.0], "ReLU6' is 1 only for 0<y<6");
        let mut s = [0.0f64, -1000.0, 1000.0];
        act_fwd_inplace(Act::Sigmoid, &mut s);
        assert_eq!(s, [0.5, 0.0, 1.0]);
        let mut t = [0.0f64; 1];
        act_grad(Act::Tanh, &[0.5], &[2.0], &mut t, false);
        assert_eq!(t[0], 1.5);
    }
}
