//! A step that produces NaN/Inf is rejected with a typed error and leaves the weights, the optimizer
//! state and the statistics as they were.
//!
//! What is guaranteed, exactly: the loss is checked when the loss instruction runs, which in every plan
//! precedes every weight-gradient, input-derivative and optimizer instruction of its micro-batch, and every
//! micro-batch's loss precedes all optimizer instructions when there is more than one. So a step whose
//! forward pass overflows (the loss is NaN or ±Inf) is rejected before any byte of persistent state is
//! written. Gradients and updates themselves are not scanned: an update that overflows from a finite
//! loss writes non-finite weights, and the *next* step's loss check rejects that step (the state it
//! leaves is the overflowed one). The test drives an extreme learning rate until a step is rejected and
//! checks the rejected step's claim, for SGD with momentum and Adam, plain and micro-batched.
use alloc::vec::Vec;

use super::*;
use crate::graph::Graph;
use crate::model::{Dims, LayerKind, LayerSpec, LossKind, ModelSpec, OptimizerSpec, Src};

fn spec(optimizer: OptimizerSpec) -> ModelSpec {
    let layer = |name: &str, kind, input| LayerSpec {
        name: name.into(),
        kind,
        inputs: alloc::vec![input],
        trainable: true,
        update: crate::model::Update::All,
    };
    ModelSpec {
        input: Dims::flat(6),
        layers: alloc::vec![
            layer("fc1", LayerKind::Linear { out: 8, bias: true }, Src::Input),
            layer("act", LayerKind::Relu, Src::Layer(0)),
            layer(
                "fc2",
                LayerKind::Linear { out: 3, bias: true },
                Src::Layer(1)
            ),
        ],
        loss: LossKind::SoftmaxCrossEntropy,
        optimizer,
        seed: 7,
    }
}

/// Every byte of every persistent tensor (parameters, optimizer state, statistics), in a fixed order.
fn state(ex: &Executor<'_>, plan: &Plan, arena: &mut [u8]) -> Vec<Vec<u32>> {
    let mut out = Vec::new();
    for n in &plan.graph.nodes {
        for p in &n.params {
            for t in core::iter::once(p.value).chain(p.state.iter().copied()) {
                out.push(
                    ex.read(arena, t)
                        .unwrap()
                        .iter()
                        .map(|v| v.to_bits())
                        .collect(),
                );
            }
        }
        for &t in &n.stats {
            out.push(
                ex.read(arena, t)
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect(),
            );
        }
    }
    out
}

fn rejected_step_leaves_state_unchanged(optimizer: OptimizerSpec, micro_batches: bool) {
    let s = spec(optimizer);
    let plan = if micro_batches {
        let shape = crate::plan::PlanShape {
            micro_batches: 3,
            ..Default::default()
        };
        Plan::shaped(Graph::new(&s, 2).unwrap(), shape)
    } else {
        Plan::new(Graph::new(&s, 6).unwrap())
    };
    let mut arena = alloc::vec![0u8; plan.needed_bytes()];
    let mut ex = Executor::new(&plan, &arena).unwrap();
    ex.init_params(&mut arena, 1).unwrap();
    let x: Vec<f32> = (0..36).map(|i| ((i * 7 % 11) as f32 - 5.0) * 3.0).collect();
    let y = [0u32, 1, 2, 2, 1, 0];
    for step in 0..50 {
        let before = state(&ex, &plan, &mut arena);
        match ex.train_step(&mut arena, &x, Target::Classes(&y)) {
            Ok(_) => continue,
            Err(e) => {
                assert_eq!(e, ExecError::NonFinite("the loss"), "step {step}");
                assert!(e.to_string().contains("the loss"));
                assert!(step > 0, "the first step's loss is finite");
                assert_eq!(
                    state(&ex, &plan, &mut arena),
                    before,
                    "step {step} was rejected but changed persistent state"
                );
                // Rejected again, and still nothing moves.
                assert!(ex.train_step(&mut arena, &x, Target::Classes(&y)).is_err());
                assert_eq!(state(&ex, &plan, &mut arena), before);
                return;
            }
        }
    }
    panic!("lr = 1e30 never produced a non-finite loss in 50 steps");
}

#[test]
fn sgd_step_with_a_nonfinite_loss_is_rejected_and_changes_nothing() {
    let sgd = OptimizerSpec::Sgd {
        lr: 1e30,
        momentum: 0.9,
        weight_decay: 0.0,
    };
    rejected_step_leaves_state_unchanged(sgd, false);
    rejected_step_leaves_state_unchanged(sgd, true);
}

#[test]
fn adam_step_with_a_nonfinite_loss_is_rejected_and_changes_nothing() {
    let adam = OptimizerSpec::Adam {
        lr: 1e30,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
    };
    rejected_step_leaves_state_unchanged(adam, false);
    rejected_step_leaves_state_unchanged(adam, true);
}
