//! # frugal-host
//!
//! What frugal's embedding hosts share — the browser (`frugal-wasm`) and Android (`frugal-android`) —
//! beside the core: weights as safetensors bytes in and out ([`weights`]), loading them into a plan's
//! persistent tensors ([`load`]), the tensors that live across steps ([`persistent`]) and the training
//! samples with each step's batch ([`samples`]). Like the hosts, it decides no maths and no memory.
#![cfg_attr(not(test), no_std)]

extern crate alloc;

pub mod samples;
pub mod weights;

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use frugal_core::backend::Backend;
use frugal_core::exec::{ExecError, Executor};
use frugal_core::graph::{Graph, TensorId};
pub use samples::{SampleError, Samples};
pub use weights::NamedTensor;

/// Why loading weights failed.
#[derive(Clone, Debug, PartialEq)]
pub enum LoadError {
    /// A tensor the model has, with another shape or a non-finite value.
    Weights(String),
    /// Writing it failed.
    Exec(ExecError),
}

impl From<ExecError> for LoadError {
    fn from(e: ExecError) -> Self {
        LoadError::Exec(e)
    }
}

/// Writes the tensors of `file` the model has into the executor's persistent tensors (by `state_dict`
/// name; tensors the model does not have are ignored); returns how many.
pub fn load<B: Backend>(
    ex: &mut Executor<'_, B>,
    arena: &mut [u8],
    file: &[NamedTensor],
) -> Result<usize, LoadError> {
    let state: Vec<_> = ex.state_tensors().collect();
    let mut loaded = 0;
    for (name, shape, t) in state {
        if let Some((_, s, v)) = file.iter().find(|(n, _, _)| *n == name) {
            if *s != shape {
                return Err(LoadError::Weights(format!(
                    "tensor {name} has shape {s:?}, the model needs {shape:?}"
                )));
            }
            if let Some(i) = v.iter().position(|x| !x.is_finite()) {
                return Err(LoadError::Weights(format!(
                    "tensor {name}: value {i} is {} (must be finite)",
                    v[i]
                )));
            }
            ex.write(arena, t, v)?;
            loaded += 1;
        }
    }
    Ok(loaded)
}

/// Checks `file` against the model's tensors `known` (name, shape) before anything is written: every
/// tensor of `file` must be one of the model's, with its shape and finite values (a strict load; [`load`]
/// ignores tensors the model lacks). The error names the tensor and what is wrong.
pub fn check_tensors(known: &[(String, Vec<usize>)], file: &[NamedTensor]) -> Result<(), String> {
    for (name, shape, v) in file {
        match known.iter().find(|(n, _)| n == name) {
            None => {
                let names: Vec<&str> = known.iter().map(|(n, _)| n.as_str()).collect();
                return Err(format!(
                    "tensor {name}: the model has no such tensor (it has {})",
                    names.join(", ")
                ));
            }
            Some((_, s)) if s != shape => {
                return Err(format!(
                    "tensor {name} has shape {shape:?}, the model needs {s:?}"
                ))
            }
            Some(_) => {}
        }
        if let Some(i) = v.iter().position(|x| !x.is_finite()) {
            return Err(format!(
                "tensor {name}: value {i} is {} (must be finite)",
                v[i]
            ));
        }
    }
    Ok(())
}

/// The tensors that live across steps, in a fixed order: parameters with their optimizer state, then
/// statistics, node by node. Two plans of one model list corresponding tensors at the same positions.
pub fn persistent(g: &Graph) -> Vec<TensorId> {
    let mut out = Vec::new();
    for n in &g.nodes {
        for p in &n.params {
            out.push(p.value);
            out.extend_from_slice(&p.state);
        }
        out.extend_from_slice(&n.stats);
    }
    out
}
