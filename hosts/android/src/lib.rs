//! # frugal-android
//!
//! frugal for Android and for C/C++ programs: a C ABI (`include/frugal.h`) and a JNI binding
//! (`ai.frugal.Trainer`, Java and Kotlin sources beside this crate) over the `no_std` core. The host
//! is thin: it moves bytes (model, weights, samples, budgets) in and losses, predictions, plans and
//! weights out, and chooses the CPU backend; planning and training are the core's.
//!
//! Layers, bottom to top:
//! - [`arena`]: the arena, one aligned heap block that grows and shrinks with the plan in force;
//! - [`weights`]: safetensors in and out (`frugal-host`'s; see below);
//! - [`trainer`]: the trainer in plain Rust — the browser `Session`'s surface over a ladder of plans and
//!   the adaptive executor, so a budget stored by another thread takes effect in the step in flight;
//! - [`memory`]: the documented policy mapping Android's memory signals (`onTrimMemory` levels,
//!   `ActivityManager.MemoryInfo`) to budgets, a pure function;
//! - [`registry`]: live trainers behind generation-checked handles with a per-handle lock;
//! - [`capi`] (`frugal_*`, the C ABI) and [`jni`] (`Java_ai_frugal_*`): argument checks, error codes,
//!   `catch_unwind` at every entry. No panic crosses the boundary; no argument causes undefined
//!   behaviour short of a pointer that lies about its length.
//!
//! What the browser host (`frugal-wasm`) does the same way lives in `frugal-host` (`hosts/common`),
//! which both use: the weights' safetensors reader and writer and their loading, the persistent
//! tensors' list, and the sample store with each step's batch (`frugal_host::Samples`). The softmax
//! of `predict` is still a copy in each (`frugal-host` is `no_std`, without `exp`).
#![warn(missing_docs)]

pub mod arena;
pub mod capi;
pub mod error;
pub mod jni;
pub mod memory;
pub mod registry;
pub mod trainer;
pub use frugal_host::weights;

pub use error::{Error, FrugalStatus};
pub use trainer::{Options, PlanInfo, Trainer};
