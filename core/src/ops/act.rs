//! Point-wise activations. The backward pass is computed from the OUTPUT `y` (every supported
//! activation's derivative is a function of its output), so the forward may overwrite its input.
//!
//! Derivative conventions follow PyTorch: ReLU'(0) = 0; ReLU6 passes the gradient only where
//! `0 < y < 6` (hardtanh backward: `min < x < max`).
//!
//! Slices of different lengths are processed over their common prefix (callers pass equal lengths).
use crate::kernels::Real;

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

#[inline(always)]
fn relu<T: Real>(x: T) -> T {
    // `x < 0 → 0` keeps NaN as NaN, like PyTorch.
    if x < T::ZERO {
        T::ZERO
    } else {
        x
    }
}

#[inline(always)]
fn relu6<T: Real>(x: T) -> T {
    let six = T::from_f32(6.0);
    if x < T::ZERO {
        T::ZERO
    } else if x > six {
        six
    } else {
        x
    }
}

#[inline(always)]
fn sigmoid<T: Real>(x: T) -> T {
    // e^-x overflows to +inf for very negative x, giving 1/inf = 0: no NaN.
    T::ONE / (T::ONE + (-x).exp())
}

fn map<T: Real>(a: Act, x: &[T], y: &mut [T]) {
    match a {
        Act::Relu => y.iter_mut().zip(x).for_each(|(y, &x)| *y = relu(x)),
        Act::Relu6 => y.iter_mut().zip(x).for_each(|(y, &x)| *y = relu6(x)),
        Act::Sigmoid => y.iter_mut().zip(x).for_each(|(y, &x)| *y = sigmoid(x)),
        Act::Tanh => y.iter_mut().zip(x).for_each(|(y, &x)| *y = x.tanh()),
    }
}

/// `y = a(x)`.
pub fn act_fwd<T: Real>(a: Act, x: &[T], y: &mut [T]) {
    map(a, x, y)
}

/// `y = a(y)` in place.
pub fn act_fwd_inplace<T: Real>(a: Act, y: &mut [T]) {
    match a {
        Act::Relu => y.iter_mut().for_each(|v| *v = relu(*v)),
        Act::Relu6 => y.iter_mut().for_each(|v| *v = relu6(*v)),
        Act::Sigmoid => y.iter_mut().for_each(|v| *v = sigmoid(*v)),
        Act::Tanh => y.iter_mut().for_each(|v| *v = v.tanh()),
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
            assert_close(&format!("{a:?} dx acc"), &sub(&dacc, &pre), &fd, FD_TOL, FD_FLOOR);
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
            assert_close(&format!("{a:?} dx"), &widen(&dx32), &dx, 1e-5, 1e-3);
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
