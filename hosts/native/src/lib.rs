//! frugal native host library: everything the `frugal` binary needs that is not training itself.
//!
//! - [`spec_toml`] (feature `toml`, on by default): the TOML model description
//!   (`docs/model-format.md`) → [`frugal_core::model::ModelSpec`] + a [`spec_toml::TrainConfig`].
//! - [`data`]: data sets — the bundled UCI digits, MNIST-style IDX files, numeric CSV — and batching.
//! - [`devmem`]: the memory this device can give (the default budget) and arenas allocated without
//!   aborting.
//! - [`checkpoint`]: safetensors weights in and out (atomic writes).
//! - [`svg`]: pictures — the arena layout over execution order, training curves.
//! - [`progress`]: per-epoch progress bars that stay quiet in CI logs.
//! - [`fsutil`]: crash-safe file writes.
//! - [`generate`]: sampling text from a trained sequence model.
//! - [`lora`]: LoRA adapters merged into the base weights or exported alone (PEFT names).
//! - [`spill`]: the file-backed store for swapped-out tensors, with background prefetch.
//! - [`text`]: text data for sequence models (byte tokenizer, next-token windows).
//!
//! Library errors are typed enums whose messages name the file, the field or place, and the reason.
#![warn(missing_docs)]

pub mod checkpoint;
pub mod data;
pub mod devmem;
pub mod fsutil;
#[cfg(feature = "toml")]
pub mod generate;
pub mod lora;
pub mod measure;
pub mod progress;
pub mod report;
#[cfg(feature = "toml")]
pub mod spec_toml;
pub mod spill;
pub mod svg;
pub mod text;
#[cfg(feature = "toml")]
pub mod train;
pub mod workloads;

#[cfg(test)]
mod testutil;
