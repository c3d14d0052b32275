//! Shared test helpers: random data, central finite differences, tolerance checks.
//!
//! Tolerance rationale (used by every gradient check): inputs are O(1) and the objective is
//! `L = Σ y·r` with `r ∈ [-1, 1)`, so `|L| ≲ 10²`. A central difference with step `h` has a rounding
//! error of about `ε₆₄·|L|/h ≈ 1.1e-16·10²/1e-6 ≈ 1e-8` and a truncation error of `h²·|L'''|/6 ≈ 1e-13`
//! (and exactly zero truncation error for the ops that are linear or piecewise linear in the perturbed
//! variable away from kinks, which the tests avoid). Gradients are O(1e-2..1), so `1e-6` relative
//! leaves a margin of ≥ 10× above the expected error. Elements whose gradient is tiny compared with the
//! largest one are judged relative to `FD_FLOOR ×` that largest magnitude, since their own relative
//! error is dominated by the absolute rounding error above.
use crate::rng::Rng;

/// Relative tolerance of finite-difference checks (see the module docs).
pub const FD_TOL: f64 = 1e-6;
/// Floor for the denominator, as a fraction of the largest reference magnitude.
pub const FD_FLOOR: f64 = 1e-2;
/// Central-difference step.
pub const FD_H: f64 = 1e-6;

/// `len` values uniform in `[lo, hi)`, each exactly representable in f32 (so the f32 and f64 paths
/// see identical inputs).
pub fn rand_vec(rng: &mut Rng, len: usize, lo: f32, hi: f32) -> Vec<f64> {
    (0..len).map(|_| rng.uniform(lo, hi) as f64).collect()
}

/// A random permutation of `0..len` scaled to distinct values in `[-1, 1)` with gaps ≥ `2/len`:
/// no ties (max pooling) and no argmax flips under a `1e-6` perturbation.
pub fn distinct_vec(rng: &mut Rng, len: usize) -> Vec<f64> {
    let mut p: Vec<usize> = (0..len).collect();
    for i in (1..len).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        p.swap(i, j);
    }
    p.iter()
        .map(|&v| ((2 * v) as f64 / len as f64 - 1.0) as f32 as f64)
        .collect()
}

/// f64 → f32.
pub fn to_f32(x: &[f64]) -> Vec<f32> {
    x.iter().map(|&v| v as f32).collect()
}

/// f32 → f64.
pub fn widen(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

/// Central finite differences of `f` at `x`, step [`FD_H`].
pub fn fd_grad(x: &[f64], mut f: impl FnMut(&[f64]) -> f64) -> Vec<f64> {
    let mut xp = x.to_vec();
    (0..x.len())
        .map(|i| {
            let v = x[i];
            xp[i] = v + FD_H;
            let lp = f(&xp);
            xp[i] = v - FD_H;
            let lm = f(&xp);
            xp[i] = v;
            (lp - lm) / (2.0 * FD_H)
        })
        .collect()
}

/// Largest relative error of `got` against `want`: `|got−want| / max(|got|, |want|, floor·max|want|)`.
pub fn rel_err(got: &[f64], want: &[f64], floor_frac: f64) -> f64 {
    assert_eq!(got.len(), want.len(), "length mismatch");
    let m = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let floor = (floor_frac * m).max(f64::MIN_POSITIVE);
    got.iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs() / g.abs().max(w.abs()).max(floor))
        .fold(0.0, f64::max)
}

/// Asserts [`rel_err`] ≤ `tol`.
pub fn assert_close(what: &str, got: &[f64], want: &[f64], tol: f64, floor_frac: f64) {
    let e = rel_err(got, want, floor_frac);
    assert!(
        e <= tol,
        "{what}: relative error {e:e} > {tol:e}\n got  {:?}\n want {:?}",
        &got[..got.len().min(12)],
        &want[..want.len().min(12)]
    );
}

/// `Σ a·b` in f64.
pub fn dotf(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `a − b` element-wise.
pub fn sub(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(x, y)| x - y).collect()
}
