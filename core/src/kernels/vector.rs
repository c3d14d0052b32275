//! Elementwise loops compiled three times: for the build's baseline ISA and, on x86-64, for AVX2
//! (256-bit vectors) and AVX-512F (512-bit), the widest the CPU has chosen at run time where `std`
//! can detect it (elsewhere by the build's target features). A release build for x86-64 targets
//! SSE2 only, so without this the activations, the softmax exponentials and the optimizer step run
//! 4 lanes wide (or, where f32 widens to f64, 2).
//!
//! The loops take the element function as a closure. It is inlined into every copy, and the
//! vectoriser widens it; vectorising an elementwise map changes no result (every lane computes the
//! IEEE operations the scalar code does, and Rust never contracts `a·b + c` into an FMA), so every
//! copy returns the same bits. The maps are compiled per width; the sums ([`sum_map`] and its
//! kin) are not, and fix their own order: eight partial sums, element `i` into partial `i mod 8`,
//! combined by a fixed tree, so their bits do not depend on the ISA either.

use super::real::Real;

/// The widest copy of these loops the CPU can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Width {
    /// The build's baseline ISA (SSE2 on x86-64).
    Base,
    /// AVX2: 256-bit vectors.
    Avx2,
    /// AVX-512F (with AVX2): 512-bit vectors, where f64 intermediates (GELU's erf) run 8 lanes wide.
    Avx512,
}

/// The widest [`Width`] this CPU runs: detected at run time (with `std`), else the build's target
/// features.
#[inline]
pub fn width() -> Width {
    #[cfg(all(target_arch = "x86_64", any(feature = "std", test)))]
    {
        if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx2") {
            Width::Avx512
        } else if std::is_x86_feature_detected!("avx2") {
            Width::Avx2
        } else {
            Width::Base
        }
    }
    #[cfg(not(all(target_arch = "x86_64", any(feature = "std", test))))]
    {
        if cfg!(all(
            target_arch = "x86_64",
            target_feature = "avx512f",
            target_feature = "avx2"
        )) {
            Width::Avx512
        } else if cfg!(all(target_arch = "x86_64", target_feature = "avx2")) {
            Width::Avx2
        } else {
            Width::Base
        }
    }
}

/// Whether the AVX2 copies may run (see [`width`]).
#[inline]
pub fn avx2() -> bool {
    width() >= Width::Avx2
}

/// Defines `pub fn $name`, running `$body` (an `#[inline(always)]` function of the same arguments)
/// in the copy [`width`] picks, and `$at`, which runs the copy for a given width (at most
/// [`width`]: the tests compare every copy the CPU can run).
macro_rules! widths {
    ($(#[$m:meta])* fn $name:ident / $at:ident<$($g:ident: $b:path),*>($($arg:ident: $ty:ty),*) via $body:ident) => {
        $(#[$m])*
        pub fn $name<$($g: $b),*>($($arg: $ty),*) {
            $at(width(), $($arg),*)
        }

        #[inline]
        fn $at<$($g: $b),*>(w: Width, $($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2")]
                fn avx2<$($g: $b),*>($($arg: $ty),*) {
                    $body($($arg),*)
                }
                #[target_feature(enable = "avx512f,avx2")]
                fn avx512<$($g: $b),*>($($arg: $ty),*) {
                    $body($($arg),*)
                }
                assert!(w <= width(), "{w:?} copy asked for on a CPU without it");
                match w {
                    // SAFETY: this copy needs AVX-512F and AVX2, which `width()` found (asserted).
                    Width::Avx512 => return unsafe { avx512($($arg),*) },
                    // SAFETY: this copy needs AVX2, which `width()` found (asserted).
                    Width::Avx2 => return unsafe { avx2($($arg),*) },
                    Width::Base => {}
                }
            }
            let _ = w;
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

widths! {
    /// `y[i] = f(x[i])` over the shorter of the two.
    fn map / map_at<T: Copy, F: Fn(T) -> T>(x: &[T], y: &mut [T], f: F) via map_body
}

widths! {
    /// `y[i] = f(y[i])`.
    fn map_inplace / map_inplace_at<T: Copy, F: Fn(T) -> T>(y: &mut [T], f: F) via map_inplace_body
}

widths! {
    /// `y[i] = f(x[i], y[i])` over the shorter of the two.
    fn zip_inplace / zip_inplace_at<T: Copy, F: Fn(T, T) -> T>(x: &[T], y: &mut [T], f: F) via zip_inplace_body
}

/// Partial sums of the lane-ordered reductions ([`sum_map`], [`sum_zip`], [`sum2_zip3`], and the
/// blocked channel sums of `ops::bn`): independent accumulators break the addition's dependency
/// chain (and let LLVM vectorise, since it never reassociates float additions on its own), and
/// shorten the rounding chains by the same factor.
pub const LANES: usize = 8;

/// The partial sums added in a fixed tree: `((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7))`.
#[inline(always)]
pub fn combine<T: Real>(s: [T; LANES]) -> T {
    ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]))
}

/// `Σ f(x[i])` in [`LANES`] partial sums: element `i` is added, in order, into partial `i mod 8`,
/// and the partials are combined by a fixed tree. The order is the code's, not the vector
/// width's, so every ISA and every copy gives the same bits; and a row's sum runs as eight
/// independent chains instead of one that waits on each addition's latency (a strictly ordered
/// sum cannot vectorise).
#[inline]
pub fn sum_map<T: Real, F: Fn(T) -> T>(x: &[T], f: F) -> T {
    let mut s = [T::ZERO; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for l in 0..LANES {
            s[l] += f(c[l]);
        }
    }
    for (l, &v) in rest.iter().enumerate() {
        s[l] += f(v);
    }
    combine(s)
}

/// `Σ f(x[i], y[i])` over the shorter of the two, in [`sum_map`]'s order.
#[inline]
pub fn sum_zip<T: Real, F: Fn(T, T) -> T>(x: &[T], y: &[T], f: F) -> T {
    let n = x.len().min(y.len());
    let (x, y) = (&x[..n], &y[..n]);
    let mut s = [T::ZERO; LANES];
    let (xc, yc) = (x.chunks_exact(LANES), y.chunks_exact(LANES));
    let (xr, yr) = (xc.remainder(), yc.remainder());
    for (a, b) in xc.zip(yc) {
        for l in 0..LANES {
            s[l] += f(a[l], b[l]);
        }
    }
    for (l, (&a, &b)) in xr.iter().zip(yr).enumerate() {
        s[l] += f(a, b);
    }
    combine(s)
}

/// The two sums `(Σ f(x, y, z).0, Σ f(x, y, z).1)` over the shortest of the three, each in
/// [`sum_map`]'s order, in one pass.
#[inline]
pub fn sum2_zip3<T: Real, F: Fn(T, T, T) -> (T, T)>(x: &[T], y: &[T], z: &[T], f: F) -> (T, T) {
    let n = x.len().min(y.len()).min(z.len());
    let (x, y, z) = (&x[..n], &y[..n], &z[..n]);
    let (mut s, mut t) = ([T::ZERO; LANES], [T::ZERO; LANES]);
    let (xc, yc, zc) = (
        x.chunks_exact(LANES),
        y.chunks_exact(LANES),
        z.chunks_exact(LANES),
    );
    let (xr, yr, zr) = (xc.remainder(), yc.remainder(), zc.remainder());
    for ((a, b), c) in xc.zip(yc).zip(zc) {
        for l in 0..LANES {
            let (u, v) = f(a[l], b[l], c[l]);
            s[l] += u;
            t[l] += v;
        }
    }
    for (l, ((&a, &b), &c)) in xr.iter().zip(yr).zip(zr).enumerate() {
        let (u, v) = f(a, b, c);
        s[l] += u;
        t[l] += v;
    }
    (combine(s), combine(t))
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

    /// The copies these tests run: every [`Width`] this CPU has. Each one it lacks says *skipped* on
    /// stderr (or fails where `FRUGAL_REQUIRE_KERNELS` requires the GEMM kernel of that width, as
    /// the native test leg does on a CPU that has it).
    fn widths_run() -> Vec<Width> {
        static SAID: [std::sync::Once; 2] = [std::sync::Once::new(), std::sync::Once::new()];
        let wide = [
            (
                Width::Avx2,
                "avx2+fma",
                "the AVX2 copies of kernels::vector",
            ),
            (
                Width::Avx512,
                "avx512f",
                "the AVX-512 copies of kernels::vector",
            ),
        ];
        for (i, (w, name, what)) in wide.into_iter().enumerate() {
            if width() < w {
                crate::kernels::testkit::skipped(name, what, &SAID[i]);
            }
        }
        [Width::Base, Width::Avx2, Width::Avx512]
            .into_iter()
            .filter(|&w| w <= width())
            .collect()
    }

    /// Every copy gives the scalar loop's bits, for the functions the ops map (each copy this CPU
    /// runs, see [`widths_run`]).
    #[test]
    fn every_copy_gives_the_scalar_bits() {
        let x: Vec<f32> = (0..1003).map(|i| (i as f32 - 500.0) * 0.0173).collect();
        let f = |v: f32| 0.5 * v * (1.0 + erf_f32(v * core::f32::consts::FRAC_1_SQRT_2));
        let g = |v: f32| exp_nonpos_f32(v * 0.3 - 2.0);
        let scalar: Vec<f32> = x.iter().map(|&v| f(v) + g(v)).collect();
        let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits());
        for w in widths_run() {
            let mut y = std::vec![0.0; x.len()];
            map_at(w, &x, &mut y, f);
            zip_inplace_at(w, &x, &mut y, |v, y| y + g(v));
            assert!(same(&y, &scalar), "{w:?}");
            let mut z = y.clone();
            zip_inplace_at(w, &x, &mut z, |a, b| a * b);
            map_inplace_at(w, &mut z, |v| v - 1.0);
            for i in 0..x.len() {
                assert_eq!(z[i].to_bits(), (x[i] * scalar[i] - 1.0).to_bits(), "{w:?}");
            }
            // f64 intermediates (GELU's erf) are where the widths differ most in lanes.
            let mut base = std::vec![0.0; x.len()];
            map_body(&x, &mut base, f);
            map_at(w, &x, &mut y, f);
            assert!(same(&y, &base), "{w:?}");
        }
        // The public entry points run the widest copy.
        let mut y = std::vec![0.0; x.len()];
        map(&x, &mut y, f);
        zip_inplace(&x, &mut y, |v, y| y + g(v));
        assert!(same(&y, &scalar));
    }

    /// The sums add element `i` into partial `i mod 8` in order and combine the partials by the
    /// fixed tree, at every length (full chunks, a ragged end, shorter than one chunk, empty);
    /// values over eight decades, so that any other order would round differently somewhere.
    #[test]
    fn sums_follow_the_lane_order() {
        let v = |i: usize| {
            let u = ((i * 2_654_435_761) % 1000) as f32 / 1000.0 - 0.5;
            u * libm::powf(10.0, (i % 8) as f32 - 4.0)
        };
        for n in 0..=43 {
            let x: Vec<f32> = (0..n).map(v).collect();
            let y: Vec<f32> = (0..n).map(|i| v(i + 7)).collect();
            let z: Vec<f32> = (0..n).map(|i| v(i + 13)).collect();
            let lanes = |f: &dyn Fn(usize) -> f32| {
                let mut p = [0.0f32; LANES];
                for i in 0..n {
                    p[i % LANES] += f(i);
                }
                ((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7]))
            };
            let want = lanes(&|i| x[i] * 3.0);
            assert_eq!(sum_map(&x, |a| a * 3.0).to_bits(), want.to_bits(), "{n}");
            let want = lanes(&|i| x[i] * y[i]);
            // The longer operand's extra elements are ignored.
            let mut y1 = y.clone();
            y1.push(1e9);
            assert_eq!(sum_zip(&x, &y1, |a, b| a * b).to_bits(), want.to_bits());
            let (s, t) = sum2_zip3(&x, &y, &z, |a, b, c| (a - b, a * c));
            assert_eq!(s.to_bits(), lanes(&|i| x[i] - y[i]).to_bits());
            assert_eq!(t.to_bits(), lanes(&|i| x[i] * z[i]).to_bits());
        }
        assert_eq!(sum_map::<f32, _>(&[], |a| a), 0.0);
    }

    /// The AVX2 update (where it runs, see [`widths_run`]) gives the scalar element's bits, with and without either decay and on
    /// both sides of the lerp's 0.5 switch.
    #[test]
    fn adam_gives_the_scalar_bits() {
        widths_run();
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
