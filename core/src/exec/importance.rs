//! The importance scores a sparse-update selection ([`crate::policy::sparse`]) ranks layers and
//! channels by: the gradient-norm proxy, Σ over a few batches of the squared gradient of each output
//! channel's parameters, at the current (pretrained) weights.
use alloc::vec::Vec;

use super::{view, ExecError, Executor, Target};
use crate::backend::Backend;
use crate::model::{ModelSpec, OptimizerSpec, Update};
use crate::plan::{Instr, Phase};
use crate::policy::sparse::Importance;

/// `spec` made to score importance: every layer with parameters computes its whole gradient, and the
/// optimizer (SGD, learning rate 0) leaves the weights as they are. BatchNorm's running statistics do
/// move during scoring steps: score in an arena of its own.
pub fn scoring_spec(spec: &ModelSpec) -> ModelSpec {
    let mut s = spec.clone();
    for l in &mut s.layers {
        l.trainable = true;
        l.update = Update::All;
    }
    s.optimizer = OptimizerSpec::Sgd {
        lr: 0.0,
        momentum: 0.0,
        weight_decay: 0.0,
    };
    s
}

/// Runs one scoring step per batch of `batches` on an executor of a plan of [`scoring_spec`] (one
/// micro-batch) and returns the summed squared gradients per layer and output channel.
pub fn gradient_importance<B: Backend>(
    ex: &mut Executor<'_, B>,
    arena: &mut [u8],
    batches: &[(&[f32], &[u32])],
) -> Result<Importance, ExecError> {
    let plan = ex.plan;
    let g = &plan.graph;
    if !matches!(
        g.optimizer,
        OptimizerSpec::Sgd { lr, momentum, weight_decay } if lr == 0.0 && momentum == 0.0 && weight_decay == 0.0
    ) || plan.program.iter().any(|i| i.mb > 0)
    {
        return Err(ExecError::Unsupported(
            "importance scoring needs a one-micro-batch plan of policy::sparse's scoring_spec",
        ));
    }
    let n = g.nodes.len();
    let mut rows: Vec<Vec<f64>> = g
        .nodes
        .iter()
        .map(|nd| alloc::vec![0.0; nd.params.first().map_or(0, |p| p.shape[0])])
        .collect();
    let mut bias = alloc::vec![0.0f64; n];
    for &(x, y) in batches {
        let mut obs = |eo: usize, ins: &Instr, a: &[u8]| {
            if ins.phase != Phase::GradW {
                return;
            }
            let i = ins.node as usize;
            for (k, p) in g.nodes[i].params.iter().enumerate() {
                let Some(gv) = p.grad.and_then(|t| view(plan, a, t, eo)) else {
                    continue;
                };
                let c = p.shape[0].max(1);
                let per = p.updated / c;
                for (r, row) in gv[..p.updated].chunks_exact(per.max(1)).enumerate() {
                    let s: f64 = row.iter().map(|&v| v as f64 * v as f64).sum();
                    rows[i][r] += s;
                    if k == 1 {
                        bias[i] += s;
                    }
                }
            }
        };
        ex.train_step_observed(arena, x, Target::Classes(y), &mut obs)?;
    }
    Ok(Importance { rows, bias })
}
