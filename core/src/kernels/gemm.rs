//! Single-precision GEMM: `C[m×n] = A[m×k]·B[k×n]` (+ `C`), operands addressed by (row, column) strides so
//! transposes cost nothing. The fast path packs panels of A and B into caller-provided scratch (from the
//! arena), so a GEMM never allocates.
//!
//! PLACEHOLDER: reference loop; the packed SIMD implementation replaces `sgemm` keeping this signature.
use super::Real;

/// A read-only matrix view: element (i, j) is `data[i * rs + j * cs]`.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a, T> {
    /// Backing slice; must hold every addressed element.
    pub data: &'a [T],
    /// Row stride in elements.
    pub rs: usize,
    /// Column stride in elements.
    pub cs: usize,
}

impl<'a, T> MatRef<'a, T> {
    /// Row-major matrix with `cols` columns.
    pub fn row_major(data: &'a [T], cols: usize) -> Self {
        Self { data, rs: cols, cs: 1 }
    }
    /// The transpose of a row-major matrix with `cols` columns (i.e. column-major view).
    pub fn row_major_t(data: &'a [T], cols: usize) -> Self {
        Self { data, rs: 1, cs: cols }
    }
}

/// Scratch elements (f32) that [`gemm`] needs for an `m×n×k` product; the plan reserves this much.
pub fn gemm_scratch_len(_m: usize, _n: usize, _k: usize) -> usize {
    0
}

/// `C = A·B` (or `C += A·B` when `accumulate`) for any [`Real`]; `C` is row-major with row stride `ldc`.
#[allow(clippy::too_many_arguments)]
pub fn gemm<T: Real>(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<'_, T>,
    b: MatRef<'_, T>,
    c: &mut [T],
    ldc: usize,
    accumulate: bool,
    scratch: &mut [T],
) {
    T::gemm(m, n, k, a, b, c, ldc, accumulate, scratch)
}

/// f32 GEMM (fast path).
#[allow(clippy::too_many_arguments)]
pub fn sgemm(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<'_, f32>,
    b: MatRef<'_, f32>,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
    _scratch: &mut [f32],
) {
    gemm_reference(m, n, k, a, b, c, ldc, accumulate)
}

/// Plain triple loop, the oracle for every fast kernel and the f64 path.
#[allow(clippy::too_many_arguments)]
pub fn gemm_reference<T: Real>(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<'_, T>,
    b: MatRef<'_, T>,
    c: &mut [T],
    ldc: usize,
    accumulate: bool,
) {
    for i in 0..m {
        for j in 0..n {
            let mut s = T::ZERO;
            for p in 0..k {
                s += a.data[i * a.rs + p * a.cs] * b.data[p * b.rs + j * b.cs];
            }
            let dst = &mut c[i * ldc + j];
            *dst = if accumulate { *dst + s } else { s };
        }
    }
}
