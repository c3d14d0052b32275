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
    /// The error function.
    fn erf(self) -> Self;
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
    fn erf(self) -> Self {
        libm::erff(self)
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
