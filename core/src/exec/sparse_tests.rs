//! Sparse updates ([`Update`]): the plan holds no tensor the update does not need, what it does not
//! train stays bit-identical, and what it trains moves exactly as the full update moves it.
use alloc::collections::BTreeSet;
use alloc::vec::Vec;

use super::*;
use crate::graph::{Graph, GraphError, NodeOp, TensorId, TensorKind};
use crate::model::{Dims, LayerKind, LayerSpec, LossKind, ModelSpec, OptimizerSpec, Src, Update};
use crate::plan::{Phase, Plan, StorageId};

/// A MobileNetV2-style stack: conv-BN-ReLU6, an inverted residual (1×1 expand, depthwise 3×3 with
/// max-pool-free stride 1, 1×1 project without activation, BN after each), add, pool, classifier.
/// `upd[i]`: layer `i`'s update (`None`: frozen).
pub(crate) fn mbv2_like(upd: &[Option<Update>]) -> ModelSpec {
    let mut layers: Vec<LayerSpec> = Vec::new();
    let mut push = |name: &str, kind: LayerKind, inputs: Vec<Src>| {
        let i = layers.len();
        let u = upd.get(i).copied().unwrap_or(Some(Update::All));
        layers.push(LayerSpec {
            name: name.into(),
            kind,
            inputs,
            trainable: u.is_some(),
            update: u.unwrap_or_default(),
        });
        Src::Layer(i as u32)
    };
    let conv = |out, k: u32, groups, bias| LayerKind::Conv2d {
        out,
        kernel: [k, k],
        stride: [1, 1],
        padding: [k / 2, k / 2],
        groups,
        bias,
    };
    let bn = || LayerKind::BatchNorm2d {
        eps: 1e-5,
        momentum: 0.1,
    };
    let s0 = push("stem", conv(8, 3, 1, false), alloc::vec![Src::Input]); // 0
    let s1 = push("stem_bn", bn(), alloc::vec![s0]); // 1
    let stem = push("stem_act", LayerKind::Relu6, alloc::vec![s1]); // 2
    let e = push("expand", conv(16, 1, 1, false), alloc::vec![stem]); // 3
    let e = push("expand_bn", bn(), alloc::vec![e]); // 4
    let e = push("expand_act", LayerKind::Relu6, alloc::vec![e]); // 5
    let d = push("dw", conv(16, 3, 16, false), alloc::vec![e]); // 6
    let d = push("dw_bn", bn(), alloc::vec![d]); // 7
    let d = push("dw_act", LayerKind::Relu6, alloc::vec![d]); // 8
    let p = push("project", conv(8, 1, 1, true), alloc::vec![d]); // 9
    let p = push("project_bn", bn(), alloc::vec![p]); // 10
    let a = push("add", LayerKind::Add, alloc::vec![stem, p]); // 11
    let g = push("gap", LayerKind::GlobalAvgPool, alloc::vec![a]); // 12
    let f = push("flat", LayerKind::Flatten, alloc::vec![g]); // 13
    push(
        "fc",
        LayerKind::Linear { out: 4, bias: true },
        alloc::vec![f],
    ); // 14
    ModelSpec {
        input: Dims::new(3, 6, 6),
        layers,
        loss: LossKind::SoftmaxCrossEntropy,
        optimizer: OptimizerSpec::Sgd {
            lr: 0.05,
            momentum: 0.9,
            weight_decay: 0.0,
        },
        seed: 3,
    }
}

const LAYERS: usize = 15;

/// The layers with parameters.
const PARAM_LAYERS: [usize; 9] = [0, 1, 3, 4, 6, 7, 9, 10, 14];

/// Layers with parameters frozen up to (not including) `from`, updated by `rest` from there.
fn from_layer(from: usize, rest: Update) -> Vec<Option<Update>> {
    (0..LAYERS)
        .map(|i| {
            if PARAM_LAYERS.contains(&i) {
                (i >= from).then_some(rest)
            } else {
                Some(Update::All)
            }
        })
        .collect()
}

/// The sparse updates the tests run: last layer only, the last block, biases only, a channel fraction
/// everywhere, and a mix.
pub(crate) fn configs() -> Vec<(&'static str, Vec<Option<Update>>)> {
    let mut mix = from_layer(3, Update::All);
    mix[3] = Some(Update::Channels(0.25));
    mix[4] = Some(Update::Bias);
    mix[6] = Some(Update::Channels(0.5));
    mix[7] = None;
    mix[9] = Some(Update::Bias);
    mix[10] = Some(Update::Channels(0.5));
    alloc::vec![
        ("classifier only", from_layer(14, Update::All)),
        ("last block", from_layer(9, Update::All)),
        ("biases only", {
            // Every layer with a bias (BatchNorm β, the projection, the classifier); the
            // convolutions without one frozen.
            let mut u = from_layer(0, Update::Bias);
            for i in [0, 3, 6] {
                u[i] = None;
            }
            u
        }),
        (
            "quarter of every layer's channels",
            from_layer(0, Update::Channels(0.25))
        ),
        ("mix", mix),
    ]
}

fn is_param_layer(op: &NodeOp) -> bool {
    matches!(
        op,
        NodeOp::Linear { .. } | NodeOp::Conv(_) | NodeOp::BatchNorm { .. }
    )
}

/// The activations an update needs kept from the forward pass to the backward one, by the rule of
/// backpropagation, independently of the planner: a layer's input when it computes a weight gradient
/// from it (Linear/Conv weight, BatchNorm in training mode), BatchNorm's batch statistics, an
/// activation's output when its derivative is needed, the prediction for the loss.
fn needed_across_loss(g: &Graph) -> BTreeSet<TensorId> {
    let mut need = BTreeSet::new();
    need.insert(g.pred());
    for n in &g.nodes {
        let wants_dx = n.d_in.iter().any(|d| d.is_some());
        match n.op {
            NodeOp::Linear { .. } | NodeOp::Conv(_) if n.params[0].grad.is_some() => {
                need.insert(n.inputs[0]);
            }
            NodeOp::BatchNorm { train: true, .. } if n.d_out.is_some() => {
                need.insert(n.inputs[0]);
                need.extend(n.saved.iter().copied());
            }
            NodeOp::Act(_) if wants_dx => {
                need.insert(n.out);
            }
            NodeOp::MaxPool(_) if wants_dx => need.extend(n.saved.iter().copied()),
            _ => {}
        }
    }
    need
}

#[test]
fn a_sparse_plan_holds_only_what_the_update_needs() {
    let batch = 4;
    let full = Plan::new(Graph::new(&mbv2_like(&from_layer(0, Update::All)), batch).unwrap());
    for (what, upd) in configs() {
        let spec = mbv2_like(&upd);
        let g = Graph::new(&spec, batch).unwrap();
        let lowest = (0..LAYERS)
            .find(|&i| upd[i].is_some() && is_param_layer(&g.nodes[i].op))
            .unwrap();
        let slots = spec.optimizer.state_slots();
        // Gradients and optimizer state: exactly the updated rows of the updated parameters.
        let mut grads = 0;
        for n in &g.nodes {
            for (k, p) in n.params.iter().enumerate() {
                let elems: usize = p.shape.iter().product();
                let rows = p.shape[0];
                let want = match upd[n.layer as usize] {
                    None => 0,
                    Some(Update::All) => elems,
                    Some(Update::Bias) => (k == 1) as usize * elems,
                    Some(Update::Channels(f)) => {
                        elems / rows * (libm::ceilf(f * rows as f32) as usize).max(1)
                    }
                };
                assert_eq!(p.updated, want, "{what}: {} updated elements", p.name);
                assert_eq!(p.grad.is_some(), want > 0, "{what}: {} gradient", p.name);
                assert_eq!(p.state.len(), if want > 0 { slots } else { 0 });
                for t in p.grad.iter().chain(&p.state) {
                    assert_eq!(g.tensors[*t as usize].bytes, want * 4, "{what}: {}", p.name);
                }
                grads += p.grad.is_some() as usize;
            }
        }
        let n_grad = g.tensors.iter().filter(|t| t.kind == TensorKind::Gradient);
        assert_eq!(n_grad.count(), grads, "{what}: stray gradient tensors");
        let n_state = g.tensors.iter().filter(|t| t.kind == TensorKind::OptState);
        assert_eq!(
            n_state.count(),
            grads * slots,
            "{what}: stray optimizer state"
        );
        // No input derivative below the lowest updated layer.
        for n in &g.nodes[..=lowest] {
            assert!(
                n.d_in.iter().all(|d| d.is_none()),
                "{what}: {} has an input derivative below the lowest update",
                n.name
            );
        }
        let plan = Plan::new(g);
        let g = &plan.graph;
        for ins in &plan.program {
            if ins.phase == Phase::GradX {
                assert!(ins.node as usize > lowest, "{what}: a derivative below");
            }
        }
        // Saved activations: the storages live across the loss are exactly those of the tensors the
        // update needs (a tensor merged in place shares its storage with another of them).
        let loss = plan
            .program
            .iter()
            .position(|i| i.phase == Phase::Loss)
            .unwrap() as u32;
        let live: BTreeSet<StorageId> = (0..g.tensors.len() as TensorId)
            .filter(|&t| g.tensors[t as usize].kind == TensorKind::Activation)
            .filter_map(|t| plan.storage_at(t, loss))
            .filter(|&s| plan.lives[s].first < loss && plan.lives[s].last > loss)
            .collect();
        let need: BTreeSet<StorageId> = needed_across_loss(g)
            .into_iter()
            .filter_map(|t| plan.storage_at(t, loss))
            .filter(|&s| plan.lives[s].last > loss)
            .collect();
        assert_eq!(live, need, "{what}: activations kept across the loss");
        assert!(
            plan.needed_bytes() < full.needed_bytes(),
            "{what}: {} B, the full update {} B",
            plan.needed_bytes(),
            full.needed_bytes()
        );
    }
}

/// A bias-only Linear/Conv2d keeps no input for its gradient: in "biases only" nothing but the
/// activations' outputs (for their derivatives) and BatchNorm's inputs is live across the loss.
#[test]
fn a_bias_only_layer_keeps_no_input() {
    let mut upd = from_layer(14, Update::All);
    upd[14] = Some(Update::Bias);
    let plan = Plan::new(Graph::new(&mbv2_like(&upd), 4).unwrap());
    let loss = plan
        .program
        .iter()
        .position(|i| i.phase == Phase::Loss)
        .unwrap() as u32;
    let fc_in = plan.graph.nodes[14].inputs[0];
    let s = plan.storage_at(fc_in, loss);
    assert!(
        s.is_none_or(|s| plan.lives[s].last <= loss),
        "the classifier's input outlives the loss though only its bias trains"
    );
    // Its full update does keep it.
    let plan = Plan::new(Graph::new(&mbv2_like(&from_layer(14, Update::All)), 4).unwrap());
    let s = plan.storage_at(fc_in, loss).unwrap();
    assert!(plan.lives[s].last > loss);
}

pub(crate) fn data(batch: usize) -> (Vec<f32>, Vec<u32>) {
    let x = (0..batch * 108)
        .map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0)
        .collect();
    let y = (0..batch as u32).map(|i| i % 4).collect();
    (x, y)
}

fn params_bits(ex: &Executor<'_>, plan: &Plan, arena: &mut [u8]) -> Vec<Vec<u32>> {
    let mut out = Vec::new();
    for (_, p) in plan.graph.params() {
        let v = ex.read(arena, p.value).unwrap();
        out.push(v.iter().map(|x| x.to_bits()).collect());
    }
    out
}

/// Trains `steps` steps from the same initial weights; returns the parameters' bits before and after.
fn train(spec: &ModelSpec, steps: usize) -> (Vec<Vec<u32>>, Vec<Vec<u32>>, Plan) {
    let batch = 4;
    let plan = Plan::new(Graph::new(spec, batch).unwrap());
    let mut arena = alloc::vec![0u8; plan.needed_bytes()];
    let (x, y) = data(batch);
    let (before, after) = {
        let mut ex = Executor::new(&plan, &arena).unwrap();
        ex.init_params(&mut arena, 5).unwrap();
        let before = params_bits(&ex, &plan, &mut arena);
        for _ in 0..steps {
            ex.train_step(&mut arena, &x, Target::Classes(&y)).unwrap();
        }
        (before, params_bits(&ex, &plan, &mut arena))
    };
    (before, after, plan)
}

#[test]
fn frozen_parameters_and_channels_stay_bit_identical_and_updated_ones_move() {
    for (what, upd) in configs() {
        let (before, after, plan) = train(&mbv2_like(&upd), 5);
        for (i, (ni, p)) in plan.graph.params().enumerate() {
            let u = p.updated;
            // A bias feeding a BatchNorm in training mode has a true gradient of zero (the batch
            // mean removes it): whether rounding noise moves it is no test of the update.
            let before_train_bn = plan.graph.nodes.get(ni + 1).is_some_and(|n| {
                matches!(n.op, NodeOp::BatchNorm { train: true, .. })
                    && n.inputs[0] == plan.graph.nodes[ni].out
                    && !matches!(plan.graph.nodes[ni].op, NodeOp::BatchNorm { .. })
            }) && p.shape.len() == 1;
            assert_eq!(
                before[i][u..],
                after[i][u..],
                "{what}: frozen part of {} changed",
                p.name
            );
            if u > 0 && !before_train_bn {
                assert_ne!(
                    before[i][..u],
                    after[i][..u],
                    "{what}: updated part of {} did not move",
                    p.name
                );
            }
        }
    }
}

/// One step of a channel or bias update moves the updated rows exactly as the full update does (the
/// gradient of a row does not depend on which other rows train; the kernels sum each row in the same
/// order however many rows they compute).
#[test]
fn one_sparse_step_moves_updated_rows_as_the_full_step_does() {
    let (_, full, _) = train(&mbv2_like(&from_layer(0, Update::All)), 1);
    let mut compared = 0;
    for (what, upd) in configs() {
        let (_, after, plan) = train(&mbv2_like(&upd), 1);
        // A frozen BatchNorm runs in evaluation mode: the layers above it see other values.
        if plan
            .graph
            .nodes
            .iter()
            .any(|n| matches!(n.op, NodeOp::BatchNorm { train: false, .. }))
        {
            continue;
        }
        compared += 1;
        for (i, (_, p)) in plan.graph.params().enumerate() {
            let u = p.updated;
            assert_eq!(
                after[i][..u],
                full[i][..u],
                "{what}: updated rows of {} differ from the full update's",
                p.name
            );
        }
    }
    assert!(
        compared >= 2,
        "too few configurations without a frozen BatchNorm"
    );
}

#[test]
fn a_sparse_update_that_does_not_fit_its_layer_is_a_typed_error() {
    let layer_err = |upd: Vec<Option<Update>>, needle: &str| {
        let e = Graph::new(&mbv2_like(&upd), 2).unwrap_err();
        assert!(
            matches!(&e, GraphError::Layer { .. }) && e.to_string().contains(needle),
            "{e}"
        );
    };
    let mut u = from_layer(0, Update::All);
    u[0] = Some(Update::Bias); // stem has no bias
    layer_err(u, "needs a layer with a bias");
    let mut u = from_layer(0, Update::All);
    u[2] = Some(Update::Channels(0.5)); // relu6 has no parameters
    layer_err(u, "needs a layer with parameters");
    for f in [0.0, -0.5, 1.5, f32::NAN] {
        let mut u = from_layer(0, Update::All);
        u[3] = Some(Update::Channels(f));
        layer_err(u, "fraction");
    }
    // int8 training has no sparse update.
    let s = ModelSpec {
        input: Dims::flat(6),
        layers: alloc::vec![LayerSpec {
            name: "fc".into(),
            kind: LayerKind::Linear { out: 3, bias: true },
            inputs: alloc::vec![Src::Input],
            trainable: true,
            update: Update::Bias,
        }],
        ..mbv2_like(&[])
    };
    assert!(Graph::new(&s, 2).is_ok());
    let e = Graph::with_precision(
        &s,
        2,
        crate::model::Precision::Int8(crate::model::Int8Update::FloatMaster),
    )
    .unwrap_err();
    assert!(e.to_string().contains("sparse update"), "{e}");
}

/// The scores are the gradients' squared norms per output channel: checked against the gradients read
/// directly, and the weights do not move while scoring.
#[test]
fn importance_is_the_summed_squared_gradient_per_channel() {
    use crate::exec::importance::{gradient_importance, scoring_spec};
    let spec = scoring_spec(&mbv2_like(&from_layer(14, Update::All)));
    let plan = Plan::new(Graph::new(&spec, 4).unwrap());
    let mut arena = alloc::vec![0u8; plan.needed_bytes()];
    let mut ex = Executor::new(&plan, &arena).unwrap();
    ex.init_params(&mut arena, 5).unwrap();
    let before = params_bits(&ex, &plan, &mut arena);
    let (x, y) = data(4);
    let imp = gradient_importance(&mut ex, &mut arena, &[(&x, &y), (&x, &y)]).unwrap();
    assert_eq!(
        params_bits(&ex, &plan, &mut arena),
        before,
        "scoring moved weights"
    );
    // One more step, gradients read by hand: the scores of two identical batches are twice its.
    let mut want: Vec<Vec<f64>> = plan
        .graph
        .nodes
        .iter()
        .map(|n| alloc::vec![0.0; n.params.first().map_or(0, |p| p.shape[0])])
        .collect();
    let mut obs = |eo: usize, ins: &crate::plan::Instr, a: &[u8]| {
        if ins.phase == Phase::GradW {
            for p in &plan.graph.nodes[ins.node as usize].params {
                let g = view(&plan, a, p.grad.unwrap(), eo).unwrap();
                let per = p.updated / p.shape[0];
                for (r, w) in want[ins.node as usize].iter_mut().enumerate() {
                    *w += g[r * per..(r + 1) * per]
                        .iter()
                        .map(|&v| (v as f64).powi(2))
                        .sum::<f64>();
                }
            }
        }
    };
    ex.train_step_observed(&mut arena, &x, Target::Classes(&y), &mut obs)
        .unwrap();
    for (i, (got, want)) in imp.rows.iter().zip(&want).enumerate() {
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            // The BatchNorm statistics moved between the scoring steps and this one: 1e-3 relative.
            assert!(
                (g - 2.0 * w).abs() <= 1e-3 * (2.0 * w).max(1e-12),
                "layer {i}: {g} vs 2×{w}"
            );
        }
    }
    assert!(imp.rows[14].iter().all(|&v| v > 0.0));
    assert!(imp.bias[14] > 0.0 && imp.bias[14] < imp.rows[14].iter().sum::<f64>());
    // A plan that would move the weights is refused.
    let plan = Plan::new(Graph::new(&mbv2_like(&[]), 4).unwrap());
    let mut arena = alloc::vec![0u8; plan.needed_bytes()];
    let mut ex = Executor::new(&plan, &arena).unwrap();
    assert!(gradient_importance(&mut ex, &mut arena, &[(&x, &y)]).is_err());
}

/// `write_state` (pretrained weights from flash on a microcontroller) fills every persistent tensor in
/// `state_tensors` order, bit for bit, and refuses a payload of the wrong length.
#[test]
fn write_state_loads_every_persistent_tensor_in_order() {
    let spec = mbv2_like(&from_layer(9, Update::All));
    let plan = Plan::new(Graph::new(&spec, 2).unwrap());
    let mut arena = alloc::vec![0u8; plan.needed_bytes()];
    let mut ex = Executor::new(&plan, &arena).unwrap();
    ex.init_params(&mut arena, 1).unwrap();
    let ids: Vec<TensorId> = ex.state_ids().collect();
    let named: Vec<TensorId> = ex.state_tensors().map(|(_, _, t)| t).collect();
    assert_eq!(ids, named);
    // Distinct values everywhere: element k of the state is k + 0.5.
    let total: usize = ids
        .iter()
        .map(|&t| plan.graph.tensors[t as usize].bytes / 4)
        .sum();
    let bytes: Vec<u8> = (0..total)
        .flat_map(|k| (k as f32 + 0.5).to_le_bytes())
        .collect();
    ex.write_state(&mut arena, &bytes).unwrap();
    let mut k = 0usize;
    for &t in &ids {
        for &v in ex.read(&mut arena, t).unwrap() {
            assert_eq!(v.to_bits(), (k as f32 + 0.5).to_bits(), "element {k}");
            k += 1;
        }
    }
    assert_eq!(k, total);
    assert!(ex
        .write_state(&mut arena, &bytes[..bytes.len() - 4])
        .is_err());
    let mut longer = bytes.clone();
    longer.extend_from_slice(&[0; 4]);
    assert!(ex.write_state(&mut arena, &longer).is_err());
}
