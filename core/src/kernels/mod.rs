//! Portable numeric kernels over slices: GEMM (with packing in caller scratch), and the `Real` trait that
//! lets every op run in f32 (production) and f64 (the finite-difference reference path).
//! Kernels know nothing of graphs or plans.

mod blocked;
pub mod gemm;
pub mod int8;
pub mod par;
mod real;
pub mod rows;
#[cfg(test)]
mod testkit;
pub mod vector;

pub use gemm::{gemm, gemm_par, gemm_scratch_len, gemm_scratch_len_threads, MatRef};
pub use real::Real;
