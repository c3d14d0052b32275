//! # frugal-wasm
//!
//! frugal in the browser: a small, typed JS API over the `no_std` core, built with wasm-bindgen for
//! `wasm32-unknown-unknown`. The host is thin: it moves bytes (model, weights, samples, budgets) in and
//! losses, predictions and plans out; planning and training are the core's.
//!
//! ```js
//! import init, { Trainer } from "./frugal_wasm.js";
//! await init();
//! const t = Trainer.create(modelBytes, weightsBytes, { batch: 16, classes: 3, budget: 256 * 1024 });
//! t.addSample(pixels /* Float32Array(64) */, 0);
//! const losses = t.trainSteps(100);      // Float32Array
//! const probs = t.predict(pixels);       // Float32Array of class probabilities
//! t.setBudget(64 * 1024);                // re-plans; throws a BudgetError with `neededBytes`
//! console.log(t.planInfo());             // { arenaBytes, lowerBound, microBatch, recomputes, … }
//! ```
//!
//! Layers: [`weights`] (safetensors in and out) and [`session`] (the trainer in plain Rust, tested
//! natively) below [`js`] (the wasm-bindgen bindings: argument checks, JS errors). Bad arguments are
//! thrown as `Error`s with a message; no input traps the module.
#![deny(unsafe_code)]
#![warn(missing_docs)]

extern crate alloc;

pub mod error;
#[cfg(feature = "webgpu")]
pub mod gpu;
pub mod js;
#[cfg(feature = "webgpu")]
pub mod js_gpu;
#[cfg(feature = "seq")]
pub mod js_text;
pub mod session;
pub use frugal_host::weights;

pub use error::WebError;
pub use session::{Options, PlanInfo, Session};
