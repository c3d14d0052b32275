//! Elementwise loops compiled twice: for the build's baseline ISA and, on x86-64, for AVX2 (256-bit
//! vectors), chosen at run time where `std` can detect the CPU (elsewhere by the build's target
//! features). A release build for x86-64 targets SSE2 only, so without this the activations, the
//! softmax exponentials and the optimizer step run 4 lanes wide (or, where f32 widens to f64, 2).
//!
//! The loops take the element function as a closure. It is inlined into both copies, and the
//! vectoriser widens it; vectorising an elementwise map changes no result (every lane computes the
//! IEEE operations the scalar code does, and Rust never contracts `a·b + c` into an FMA), so both
//! copies return the same bits. Only maps live here, never reductions, whose order would change.

/// Whether the AVX2 copies may run: AVX2 detected at run time (with `std`), or enabled for the build.
#[inline]
pub fn avx2() -> bool {
    #[cfg(all(target_arch = "x86_64", any(feature = "std", test)))]
    {
        std::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(all(target_arch = "x86_64", any(feature = "std", test))))]
    {
        cfg!(all(target_arch = "x86_64", target_feature = "avx2"))
    }
}

/// Defines `pub fn $name` running `$body` (an `#[inline(always)]` function of the same arguments)
/// in its AVX2 copy when [`avx2`] says so, else in the baseline one.
macro_rules! twice {
    ($(#[$m:meta])* fn $name:ident<$($g:ident: $b:path),*>($($arg:ident: $ty:ty),*) via $body:ident) => {
        $(#[$m])*
        pub fn $name<$($g: $b),*>($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2")]
                fn wide<$($g: $b),*>($($arg: $ty),*) {
                    $body($($arg),*)
                }
                if avx2() {
                    // SAFETY: `wide` only needs AVX2, which `avx2()` detected (or the build enables).
                    return unsafe { wide($($arg),*) };
                }
            }
            $body($($arg),*)
        }
    };
}

#[inline(always)]
fn map_body<T: Copy, F: Fn(T) -> T>(x: &[T], y: &mut [T], f: F) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y = f(x);
    }
}

#[inline(always)]
fn map_inplace_body<T: Copy, F: Fn(T) -> T>(y: &mut [T], f: F) {
    for y in y.iter_mut() {
        *y = f(*y);
    }
}

#[inline(always)]
fn zip_inplace_body<T: Copy, F: Fn(T, T) -> T>(x: &[T], y: &mut [T], f: F) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y = f(x, *y);
    }
}

twice! {
    /// `y[i] = f(x[i])` over the shorter of the two.
    fn map<T: Copy, F: Fn(T) -> T>(x: &[T], y: &mut [T], f: F) via map_body
}

twice! {
    /// `y[i] = f(y[i])`.
    fn map_inplace<T: Copy, F: Fn(T) -> T>(y: &mut [T], f: F) via map_inplace_body
}

twice! {
    /// `y[i] = f(x[i], y[i])` over the shorter of the two.
    fn zip_inplace<T: Copy, F: Fn(T, T) -> T>(x: &[T], y: &mut [T], f: F) via zip_inplace_body
}

/// The scalars of one Adam or AdamW update, as `optim` computes them (PyTorch's order and
/// precision).
#[derive(Clone, Copy, Debug)]
pub struct AdamStep {
    /// AdamW's decoupled decay factor `1 − lr·wd`, `None` without it.
    pub shrink: Option<f32>,
    /// Adam's L2 decay added to the gradient, `None` without it.
    pub weight_decay: Option<f32>,
    /// `1 − β₁`, the weight of `exp_avg.lerp_(grad, 1 − β₁)`.
    pub w1: f32,
    /// β₂.
    pub beta2: f32,
    /// `1 − β₂`.
    pub w2: f32,
    /// `√(1 − β₂ᵗ)`.
    pub bc2_sqrt: f32,
    /// ε, added to the denominator.
    pub eps: f32,
    /// `lr / (1 − β₁ᵗ)`.
    pub step_size: f32,
}

/// One element of [`adam`].
#[inline(always)]
fn adam_one(s: &AdamStep, w: &mut f32, g: f32, m: &mut f32, v: &mut f32) {
    if let Some(k) = s.shrink {
        *w *= k;
    }
    let g = match s.weight_decay {
        Some(wd) => g + wd * *w,
        None => g,
    };
    // exp_avg.lerp_(grad, 1-β1): weight < 0.5 uses self + w·(end − self).
    *m = if s.w1 < 0.5 {
        *m + s.w1 * (g - *m)
    } else {
        g - (g - *m) * (1.0 - s.w1)
    };
    *v = *v * s.beta2 + s.w2 * g * g;
    let denom = libm::sqrtf(*v) / s.bc2_sqrt + s.eps;
    // addcdiv_(m, denom, value=-step_size) computes (value·m)/denom.
    *w += (-s.step_size * *m) / denom;
}

/// Adam's update of the weights `w`, first moments `m` and second moments `v` from the gradient
/// `g`, over the shortest of the four. With AVX2 eight elements at a time (the square root as
/// `vsqrtps`, which a loop over libm's scalar `sqrtf` cannot become), each by the same IEEE
/// operations in the same order as the scalar element, so the bits are the same.
pub fn adam(s: &AdamStep, w: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]) {
    let n = w.len().min(g.len()).min(m.len()).min(v.len());
    let (w, g, m, v) = (&mut w[..n], &g[..n], &mut m[..n], &mut v[..n]);
    #[allow(unused_mut)]
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: `adam_avx2` only needs AVX2, which `avx2()` detected (or the build enables).
        done = unsafe { adam_avx2(s, w, g, m, v) };
    }
    for i in done..n {
        adam_one(s, &mut w[i], g[i], &mut m[i], &mut v[i]);
    }
}

/// [`adam`] over the leading multiple of 8 elements of four equally long slices; returns it.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn adam_avx2(s: &AdamStep, w: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]) -> usize {
    use core::arch::x86_64::*;
    let n = w.len();
    assert!(g.len() == n && m.len() == n && v.len() == n);
    let n8 = n / 8 * 8;
    let k = |x: f32| _mm256_set1_ps(x);
    let (w1, one_w1, beta2, w2) = (k(s.w1), k(1.0 - s.w1), k(s.beta2), k(s.w2));
    let (bc2, eps, neg_step) = (k(s.bc2_sqrt), k(s.eps), k(-s.step_size));
    let (wp, gp, mp, vp) = (w.as_mut_ptr(), g.as_ptr(), m.as_mut_ptr(), v.as_mut_ptr());
    for i in (0..n8).step_by(8) {
        // SAFETY: each access is `x[i..i + 8]` of a slice of `n` elements with i + 8 ≤ n8 ≤ n
        // (the four lengths are asserted equal); unaligned loads and stores are allowed. AVX2 is
        // enabled on this function.
        unsafe {
            let mut wv = _mm256_loadu_ps(wp.add(i));
            let mut gv = _mm256_loadu_ps(gp.add(i));
            if let Some(f) = s.shrink {
                wv = _mm256_mul_ps(wv, k(f));
            }
            if let Some(wd) = s.weight_decay {
                gv = _mm256_add_ps(gv, _mm256_mul_ps(k(wd), wv));
            }
            let mv = _mm256_loadu_ps(mp.add(i));
            let diff = _mm256_sub_ps(gv, mv);
            let mv = if s.w1 < 0.5 {
                _mm256_add_ps(mv, _mm256_mul_ps(w1, diff))
            } else {
                _mm256_sub_ps(gv, _mm256_mul_ps(diff, one_w1))
            };
            let vv = _mm256_add_ps(
                _mm256_mul_ps(_mm256_loadu_ps(vp.add(i)), beta2),
                _mm256_mul_ps(_mm256_mul_ps(w2, gv), gv),
            );
            let denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vv), bc2), eps);
            wv = _mm256_add_ps(wv, _mm256_div_ps(_mm256_mul_ps(neg_step, mv), denom));
            _mm256_storeu_ps(wp.add(i), wv);
            _mm256_storeu_ps(mp.add(i), mv);
            _mm256_storeu_ps(vp.add(i), vv);
        }
    }
    n8
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::real::{erf_f32, exp_nonpos_f32};
    use std::vec::Vec;

    /// Whether these tests run the AVX2 copies. Where they cannot, only the baseline copies run, and
    /// the AVX2 half says *skipped* on stderr (or fails where `FRUGAL_REQUIRE_KERNELS` requires
    /// AVX2, as the native test leg does on a CPU that has it).
    fn wide_runs() -> bool {
        static SAID: std::sync::Once = std::sync::Once::new();
        let wide = avx2();
        if !wide {
            crate::kernels::testkit::skipped(
                "avx2+fma",
                "the AVX2 copies of kernels::vector (their baseline copies ran)",
                &SAID,
            );
        }
        wide
    }

    /// Both copies give the scalar loop's bits, for the functions the ops map (the AVX2 copy where
    /// this CPU has it, see [`wide_runs`]; the baseline copy always).
    #[test]
    fn both_copies_give_the_scalar_bits() {
        wide_runs();
        let x: Vec<f32> = (0..1003).map(|i| (i as f32 - 500.0) * 0.0173).collect();
        let f = |v: f32| 0.5 * v * (1.0 + erf_f32(v * core::f32::consts::FRAC_1_SQRT_2));
        let g = |v: f32| exp_nonpos_f32(v * 0.3 - 2.0);
        let scalar: Vec<f32> = x.iter().map(|&v| f(v) + g(v)).collect();
        let mut y = std::vec![0.0; x.len()];
        map(&x, &mut y, f);
        zip_inplace(&x, &mut y, |v, y| y + g(v));
        assert!(y
            .iter()
            .zip(&scalar)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
        let mut z = y.clone();
        zip_inplace(&x, &mut z, |a, b| a * b);
        map_inplace(&mut z, |v| v - 1.0);
        for i in 0..x.len() {
            assert_eq!(z[i].to_bits(), (x[i] * scalar[i] - 1.0).to_bits());
        }
        let mut base = std::vec![0.0; x.len()];
        map_body(&x, &mut base, f);
        map(&x, &mut y, f);
        assert!(y.iter().zip(&base).all(|(a, b)| a.to_bits() == b.to_bits()));
    }

    /// The AVX2 update (where it runs, see [`wide_runs`]) gives the scalar element's bits, with and without either decay and on
    /// both sides of the lerp's 0.5 switch.
    #[test]
    fn adam_gives_the_scalar_bits() {
        wide_runs();
        // Values over six decades, so that a reordered operation would round differently somewhere.
        let n = 1003;
        let mk = |seed: u64| -> Vec<f32> {
            let mut x = seed;
            (0..n)
                .map(|_| {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let u = (x >> 40) as f32 / (1u64 << 24) as f32;
                    (u - 0.5) * libm::powf(10.0, ((x >> 20) % 6) as f32 - 4.0)
                })
                .collect()
        };
        for (shrink, weight_decay, w1) in [
            (None, None, 0.1),
            (Some(0.9997), None, 0.1),
            (None, Some(0.01), 0.7),
            (Some(0.99), Some(0.02), 0.5),
        ] {
            let s = AdamStep {
                shrink,
                weight_decay,
                w1,
                beta2: 0.999,
                w2: 0.001,
                bc2_sqrt: 0.0447,
                eps: 1e-8,
                step_size: 0.03,
            };
            let (g, w0) = (mk(1), mk(2));
            let (m0, v0): (Vec<f32>, Vec<f32>) = (mk(3), mk(4).iter().map(|x| x * x).collect());
            let (mut w, mut m, mut v) = (w0.clone(), m0.clone(), v0.clone());
            adam(&s, &mut w, &g, &mut m, &mut v);
            for i in 0..n {
                let (mut we, mut me, mut ve) = (w0[i], m0[i], v0[i]);
                adam_one(&s, &mut we, g[i], &mut me, &mut ve);
                assert_eq!(
                    (w[i].to_bits(), m[i].to_bits(), v[i].to_bits()),
                    (we.to_bits(), me.to_bits(), ve.to_bits()),
                    "element {i} of {s:?}"
                );
            }
        }
    }
}
