//! Element-wise helpers: the `Add` layer (forward and backward), copies that optionally accumulate into
//! a gradient with several consumers, scaling, and the sum and dot product (in `kernels::vector`'s lane
//! order) used by the other ops.
//!
//! Slices of different lengths are processed over their common prefix (callers pass equal lengths).
use core::ops::Range;

use crate::kernels::par::{tasks_for, Shards};
use crate::kernels::{vector, Real};
use crate::pool::{chunk, WorkerPool};

/// `y = a + b` (the `Add` layer; `y` does not alias either input).
pub fn add_fwd<T: Real>(a: &[T], b: &[T], y: &mut [T]) {
    for ((y, &a), &b) in y.iter_mut().zip(a).zip(b) {
        *y = a + b;
    }
}

/// `y += b` where `y` holds the first operand on entry (the `Add` layer computed in place).
pub fn add_fwd_inplace<T: Real>(y: &mut [T], b: &[T]) {
    for (y, &b) in y.iter_mut().zip(b) {
        *y += b;
    }
}

/// `dst = src`, or `dst += src` when `accumulate` (how an op hands a gradient to an input that has
/// several consumers, e.g. both operands of `Add` receive `dy`).
pub fn copy_or_acc<T: Real>(src: &[T], dst: &mut [T], accumulate: bool) {
    if accumulate {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d += s;
        }
    } else {
        let len = src.len().min(dst.len());
        dst[..len].copy_from_slice(&src[..len]);
    }
}

/// `x *= s` in place.
pub fn scale<T: Real>(s: T, x: &mut [T]) {
    for v in x.iter_mut() {
        *v *= s;
    }
}

/// `y = s·x`, or `y += s·x` when `accumulate`.
pub fn scale_into<T: Real>(s: T, x: &[T], y: &mut [T], accumulate: bool) {
    if accumulate {
        for (y, &x) in y.iter_mut().zip(x) {
            *y += s * x;
        }
    } else {
        for (y, &x) in y.iter_mut().zip(x) {
            *y = s * x;
        }
    }
}

/// `y += alpha·x`.
pub fn axpy<T: Real>(alpha: T, x: &[T], y: &mut [T]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y += alpha * x;
    }
}

/// Sets every element to `v`.
pub fn fill<T: Real>(x: &mut [T], v: T) {
    for e in x.iter_mut() {
        *e = v;
    }
}

/// Sum of the elements, in [`vector::sum_map`]'s lane order.
pub fn sum<T: Real>(x: &[T]) -> T {
    vector::sum_map(x, |v| v)
}

/// Dot product `Σ a_i·b_i` over the common length, in [`vector::sum_map`]'s lane order.
pub fn dot<T: Real>(a: &[T], b: &[T]) -> T {
    vector::sum_zip(a, b, |x, y| x * y)
}

/// Elements per task below which an element-wise op is not split (tiny in tests, so that they split).
const PAR_MIN_ELEMS: usize = if cfg!(test) { 16 } else { 1 << 15 };

/// Runs an element-wise op over the output `y` on the workers of `pool`: `y` is cut into contiguous
/// pieces (64-byte multiples) and `f(range, piece)` called for each, `range` being the piece's place in
/// `y` (to slice the inputs alike). Each element is computed alone, so the result is the same bits for
/// any pool; short outputs run on the calling thread.
pub fn par_map<T: Real>(
    pool: &dyn WorkerPool,
    y: &mut [T],
    f: &(dyn Fn(Range<usize>, &mut [T]) + Sync),
) {
    let len = y.len();
    let tasks = tasks_for(pool, len, PAR_MIN_ELEMS);
    if tasks == 1 {
        return f(0..len, y);
    }
    let sh = Shards::new(y, tasks, |t| chunk(len, tasks, 16, t));
    pool.run(tasks, &|t| f(sh.range(t), sh.take(t)));
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)]
mod tests {
    use super::*;
    use crate::ops::testutil::*;

    #[test]
    fn par_map_covers_every_element_once() {
        use crate::kernels::par::testing::Scoped;
        for len in [0usize, 5, 16, 17, 100, 1000] {
            for t in [1usize, 2, 3, 4] {
                let mut y = vec![0.0f32; len];
                par_map(&Scoped(t), &mut y, &|r, y| {
                    for (v, i) in y.iter_mut().zip(r) {
                        *v += i as f32;
                    }
                });
                assert!(y.iter().enumerate().all(|(i, &v)| v == i as f32));
            }
        }
    }

    #[test]
    fn add_and_inplace_agree() {
        let mut rng = crate::rng::Rng::new(1);
        let a = rand_vec(&mut rng, 37, -1.0, 1.0);
        let b = rand_vec(&mut rng, 37, -1.0, 1.0);
        let mut y = vec![0.0; 37];
        add_fwd(&a, &b, &mut y);
        let mut y2 = a.clone();
        add_fwd_inplace(&mut y2, &b);
        assert_eq!(y, y2);
        for i in 0..37 {
            assert_eq!(y[i], a[i] + b[i]);
        }
        // f32 vs f64: one rounding of an exact sum, ≤ 2^-24 relative.
        let (a32, b32) = (to_f32(&a), to_f32(&b));
        let mut y32 = vec![0.0f32; 37];
        add_fwd(&a32, &b32, &mut y32);
        assert_close("add f32", &widen(&y32), &y, 1e-7, 1e-3);
    }

    #[test]
    fn add_grad_fd() {
        // The Add layer's backward is copy_or_acc(dy) into both operands; check against finite
        // differences of L = Σ (a+b)·r (linear, so central differences are exact up to rounding).
        let mut rng = crate::rng::Rng::new(2);
        let a = rand_vec(&mut rng, 23, -1.0, 1.0);
        let b = rand_vec(&mut rng, 23, -1.0, 1.0);
        let r = rand_vec(&mut rng, 23, -1.0, 1.0);
        let loss = |a: &[f64], b: &[f64]| {
            let mut y = vec![0.0; a.len()];
            add_fwd(a, b, &mut y);
            dot(&y, &r)
        };
        let mut da = vec![0.0; 23];
        copy_or_acc(&r, &mut da, false);
        let pre = rand_vec(&mut rng, 23, -1.0, 1.0);
        let mut db = pre.clone();
        copy_or_acc(&r, &mut db, true);
        let db: Vec<f64> = db.iter().zip(&pre).map(|(d, p)| d - p).collect();
        let fa = fd_grad(&a, |x| loss(x, &b));
        let fb = fd_grad(&b, |x| loss(&a, x));
        assert_close("add da", &da, &fa, FD_TOL, FD_FLOOR);
        assert_close("add db", &db, &fb, FD_TOL, FD_FLOOR);
    }

    #[test]
    fn reductions() {
        let x: Vec<f64> = (1..=21).map(|v| v as f64).collect();
        assert_eq!(sum(&x), 231.0);
        assert_eq!(dot(&x, &x), (21 * 22 * 43 / 6) as f64);
        let mut y = x.clone();
        scale(2.0, &mut y);
        assert_eq!(y[20], 42.0);
        axpy(-2.0, &x, &mut y);
        assert!(y.iter().all(|&v| v == 0.0));
        scale_into(3.0, &x, &mut y, false);
        scale_into(1.0, &x, &mut y, true);
        assert_eq!(y[3], 16.0);
        fill(&mut y, 5.0);
        assert_eq!(sum(&y), 105.0);
    }
}
