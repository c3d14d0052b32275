//! # frugal-core
//!
//! The portable heart of frugal: it trains neural networks inside one caller-owned byte arena whose size
//! is known before the first step.
//!
//! Data flow (see `docs/design.md` in the repository):
//! [`ModelSpec`](model::ModelSpec) → [`Graph`](graph::Graph) (ops, tensors, in-place/view sharing) →
//! [`Schedule`](plan::Schedule) (execution orders) → [`TensorLife`](plan::TensorLife) →
//! [`Layout`](plan::Layout) (offsets, per memory space) → [`Plan`](plan::Plan) →
//! [`Executor`](exec::Executor) (one step loop) → [`Backend`](backend::Backend) (runs each instruction).
//!
//! Layers of the crate, bottom to top: `kernels` (slices in, slices out) → `ops` (one layer kind,
//! forward and backward) → `model`/`optim` → `graph` → `quant` → `plan` (what runs when, where each
//! tensor lives) → `backend` (how an instruction runs) → `policy`/`format` (which plan for a budget;
//! plans as files) → `exec` (the step loop). A test (`layering_tests.rs`) fails when a module imports
//! one above it or two import each other; the one allowed exception (`plan` → `backend::Placement`) is
//! listed there and in `docs/design.md`.
//!
//! The crate is `#![no_std]`; `alloc` (default) enables the planner, `std` enables run-time SIMD
//! detection on hosts.
#![cfg_attr(not(any(test, feature = "std")), no_std)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

#[cfg(feature = "alloc")]
extern crate alloc;

pub mod backend;
pub mod budget;
pub mod kernels;
pub mod ops;
pub mod pool;
pub mod rng;
#[cfg(feature = "alloc")]
mod sort;
pub mod spill;

#[cfg(feature = "alloc")]
pub mod exec;
#[cfg(feature = "alloc")]
pub mod format;
#[cfg(feature = "alloc")]
pub mod graph;
#[cfg(feature = "alloc")]
pub mod model;
#[cfg(feature = "alloc")]
pub mod optim;
#[cfg(feature = "alloc")]
pub mod plan;
#[cfg(feature = "alloc")]
pub mod policy;
#[cfg(feature = "alloc")]
pub mod quant;

pub use budget::{Budget, BudgetError};

#[cfg(test)]
mod layering_tests;
