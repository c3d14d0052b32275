//! The scalar type ops are generic over: `f32` for training, `f64` for the gradient-check reference path.
use core::fmt::Debug;
use core::ops::{Add, AddAssign, Div, Mul, MulAssign, Neg, Sub, SubAssign};

use super::gemm::MatRef;
use crate::pool::WorkerPool;

/// A floating-point scalar the ops can compute with.
pub trait Real:
    Copy
    + Debug
    + Default
    + PartialOrd
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + SubAssign
    + MulAssign
    + Send
    + Sync
    + 'static
{
    /// 0.
    const ZERO: Self;
    /// 1.
    const ONE: Self;
    /// Converts from f32 (exact for f64).
    fn from_f32(v: f32) -> Self;
    /// Converts to f32 (rounds for f64).
    fn to_f32(self) -> f32;
    /// Converts a count.
    fn from_usize(v: usize) -> Self;
    /// Square root.
    fn sqrt(self) -> Self;
    /// e^x.
    fn exp(self) -> Self;
    /// Natural logarithm.
    fn ln(self) -> Self;
    /// Hyperbolic tangent.
    fn tanh(self) -> Self;
    /// The error function. For f32, [`erf_f32`]: branch-free so that loops over it vectorise.
    fn erf(self) -> Self;
    /// `e^x` for `x ≤ 0` (the Gaussian's `e^(−x²/2)`). For f32, [`exp_nonpos_f32`] (branch-free);
    /// otherwise [`Real::exp`].
    fn exp_nonpos(self) -> Self {
        self.exp()
    }
    /// `self` is finite.
    fn is_finite(self) -> bool;
    /// Larger of two (NaN-propagation unspecified).
    fn max(self, o: Self) -> Self {
        if o > self {
            o
        } else {
            self
        }
    }
    /// Smaller of two.
    fn min(self, o: Self) -> Self {
        if o < self {
            o
        } else {
            self
        }
    }
    /// C = A·B (+ C when `accumulate`), see [`gemm`](super::gemm). f32 uses the packed SIMD kernel, f64 a
    /// plain reference loop.
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        m: usize,
        n: usize,
        k: usize,
        a: MatRef<'_, Self>,
        b: MatRef<'_, Self>,
        c: &mut [Self],
        ldc: usize,
        accumulate: bool,
        scratch: &mut [Self],
    );
    /// [`Real::gemm`] on the workers of `pool`, bit-identical to it; the default ignores the pool.
    #[allow(clippy::too_many_arguments)]
    fn gemm_par(
        _pool: &dyn WorkerPool,
        m: usize,
        n: usize,
        k: usize,
        a: MatRef<'_, Self>,
        b: MatRef<'_, Self>,
        c: &mut [Self],
        ldc: usize,
        accumulate: bool,
        scratch: &mut [Self],
    ) {
        Self::gemm(m, n, k, a, b, c, ldc, accumulate, scratch)
    }
}

impl Real for f32 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    fn from_f32(v: f32) -> Self {
        v
    }
    fn to_f32(self) -> f32 {
        self
    }
    fn from_usize(v: usize) -> Self {
        v as f32
    }
    fn sqrt(self) -> Self {
        libm::sqrtf(self)
    }
    fn exp(self) -> Self {
        libm::expf(self)
    }
    fn ln(self) -> Self {
        libm::logf(self)
    }
    fn tanh(self) -> Self {
        libm::tanhf(self)
    }
    #[inline]
    fn erf(self) -> Self {
        erf_f32(self)
    }
    #[inline]
    fn exp_nonpos(self) -> Self {
        exp_nonpos_f32(self)
    }
    fn is_finite(self) -> bool {
        f32::is_finite(self)
    }
    fn gemm(
        m: usize,
        n: usize,
        k: usize,
        a: MatRef<'_, Self>,
        b: MatRef<'_, Self>,
        c: &mut [Self],
        ldc: usize,
        accumulate: bool,
        scratch: &mut [Self],
    ) {
        super::gemm::sgemm(m, n, k, a, b, c, ldc, accumulate, scratch)
    }
    fn gemm_par(
        pool: &dyn WorkerPool,
        m: usize,
        n: usize,
        k: usize,
        a: MatRef<'_, Self>,
        b: MatRef<'_, Self>,
        c: &mut [Self],
        ldc: usize,
        accumulate: bool,
        scratch: &mut [Self],
    ) {
        super::gemm::sgemm_par(pool, m, n, k, a, b, c, ldc, accumulate, scratch)
    }
}

impl Real for f64 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    fn from_f32(v: f32) -> Self {
        v as f64
    }
    fn to_f32(self) -> f32 {
        self as f32
    }
    fn from_usize(v: usize) -> Self {
        v as f64
    }
    fn sqrt(self) -> Self {
        libm::sqrt(self)
    }
    fn exp(self) -> Self {
        libm::exp(self)
    }
    fn ln(self) -> Self {
        libm::log(self)
    }
    fn tanh(self) -> Self {
        libm::tanh(self)
    }
    fn erf(self) -> Self {
        libm::erf(self)
    }
    fn is_finite(self) -> bool {
        f64::is_finite(self)
    }
    fn gemm(
        m: usize,
        n: usize,
        k: usize,
        a: MatRef<'_, Self>,
        b: MatRef<'_, Self>,
        c: &mut [Self],
        ldc: usize,
        accumulate: bool,
        _scratch: &mut [Self],
    ) {
        super::gemm::gemm_reference(m, n, k, a, b, c, ldc, accumulate)
    }
}

/// The error function for f32 without branches or calls, so that an elementwise loop over it
/// auto-vectorises (GELU's forward, its derivative and a Linear's recompute of it all use this one
/// function, so a recompute is bit-identical to the forward).
///
/// The rational minimax form `erf(x) ≈ x·P(x²)/Q(x²)` on `x` clamped to `[−4, 4]` (beyond it erf
/// is ±1 within 2e-8, below f32's half ulp at 1) with the coefficients of Eigen's
/// `generic_fast_erf_float` (`Eigen/src/Core/MathFunctionsImpl.h`, the same as XLA's
/// `EmitErfF32`). It is evaluated in f64: in f32 arithmetic the cancellation in `x·P/Q` costs up to
/// 5.7e-7 absolute near |x| = 4; in f64 the error against f64 `libm::erf` is ≤ 1.2e-7 absolute
/// (≈ 2 f32 ulps at 1, the coefficients' own error plus the final rounding; tested in
/// `erf_f32_error`). libm's `erff` is ≤ 1 ulp but branches on the argument's range.
#[inline(always)]
pub fn erf_f32(x: f32) -> f32 {
    // `clamp` keeps a NaN, so the result is NaN, as libm's is.
    let x = f64::from(x.clamp(-4.0, 4.0));
    let x2 = x * x;
    let mut p = -2.726_142_258_013_06e-10_f64;
    p = p * x2 + 2.770_681_424_959_02e-8;
    p = p * x2 - 2.101_024_020_825_08e-6;
    p = p * x2 - 5.692_506_394_623_46e-5;
    p = p * x2 - 7.349_906_303_268_55e-4;
    p = p * x2 - 2.954_599_808_540_25e-3;
    p = p * x2 - 1.609_603_332_624_15e-2;
    let mut q = -1.456_607_184_649_96e-5_f64;
    q = q * x2 - 2.133_740_552_789_05e-4;
    q = q * x2 - 1.682_826_974_382_03e-3;
    q = q * x2 - 7.373_329_167_204_68e-3;
    q = q * x2 - 1.426_473_905_141_89e-2;
    (x * p / q) as f32
}

/// `e^z` for `z ≤ 0` in f32 without branches or calls (so that it vectorises): `z` clamped to
/// `[−87, 0]` (e^−87 ≈ 1.6e-38, still normal; below it the result is that, not 0: at most 1.6e-38
/// absolute off), `z = n·ln2 + r` with `n` rounded by the 1.5·2²³ trick and `ln2` split in two
/// (Cody–Waite), `e^r` by Cephes' `expf` polynomial (degree 5 after `1 + r`), `2^n` built in the
/// exponent bits. Relative error ≤ 1e-7 against f64 (tested in `exp_nonpos_f32_error`).
#[inline(always)]
pub fn exp_nonpos_f32(z: f32) -> f32 {
    let z = z.clamp(-87.0, 0.0);
    // t = 1.5·2²³ + round(z·log₂e): its low mantissa bits hold n as an integer.
    let t = z * core::f32::consts::LOG2_E + 12_582_912.0;
    let n = t - 12_582_912.0;
    let r = z - n * 0.693_359_4 + n * 2.121_944_4e-4;
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5; // Cephes: 5.0000001201e-1, which rounds to 0.5 in f32
    let e = p * r * r + r + 1.0;
    // n ∈ [−126, 0], so the biased exponent n + 127 is in [1, 127]; it is read from t's bits (t's
    // are 0x4B40_0000 + n) rather than by `n as i32`, whose saturating conversion does not vectorise.
    e * f32::from_bits(t.to_bits().wrapping_sub(0x4B40_0000 - 127) << 23)
}

#[cfg(test)]
mod tests {
    use super::{erf_f32, exp_nonpos_f32};

    /// Against f64 `libm::erf` on a 1e-5 grid over [−6, 6] (both tails beyond the clamp) plus ±∞ and
    /// NaN. Bound 1.5e-7: the measured maximum is 1.2e-7 (the minimax fit's error plus the final
    /// rounding to f32, half an ulp = 3e-8 near 1); libm's `erff` (the previous function) is within
    /// 6e-8 there, and in f32 arithmetic (not f64) this form reaches 5.7e-7, so the test fails if
    /// the evaluation loses precision or a coefficient is wrong.
    #[test]
    fn erf_f32_error() {
        let mut worst = 0.0f64;
        for i in -600_000..=600_000 {
            let x = i as f32 * 1e-5;
            let e = (f64::from(erf_f32(x)) - libm::erf(f64::from(x))).abs();
            worst = worst.max(e);
        }
        assert!(worst <= 1.5e-7, "max abs error {worst:e}");
        assert_eq!(erf_f32(0.0), 0.0);
        assert_eq!(erf_f32(f32::INFINITY), 1.0);
        assert_eq!(erf_f32(f32::NEG_INFINITY), -1.0);
        assert_eq!(erf_f32(1e30), 1.0);
        assert!(erf_f32(f32::NAN).is_nan());
        // Odd.
        for i in 0..1000 {
            let x = i as f32 * 3.7e-3;
            assert_eq!(erf_f32(-x), -erf_f32(x));
        }
    }

    /// Relative error against f64 `exp` on a 1e-4 grid over [−87, 0] ≤ 2e-7 (measured 8.3e-8; f32's
    /// half ulp is 6e-8, Cephes' polynomial adds about 1 ulp); the ends and below the clamp.
    #[test]
    fn exp_nonpos_f32_error() {
        let mut worst = 0.0f64;
        for i in 0..=870_000 {
            let z = -(i as f32) * 1e-4;
            let r = libm::exp(f64::from(z));
            let e = ((f64::from(exp_nonpos_f32(z)) - r) / r).abs();
            worst = worst.max(e);
        }
        assert!(worst <= 2e-7, "max rel error {worst:e}");
        assert_eq!(exp_nonpos_f32(0.0), 1.0);
        assert!(exp_nonpos_f32(-1e4) <= 1.7e-38);
        assert!(exp_nonpos_f32(f32::NAN).is_nan());
    }
}
