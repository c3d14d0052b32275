//! MobileNetV2 (BatchNorm after every convolution, exact): the memory policies' plans train
//! bit-identically to the plain plan at several budgets, and fit them. The golden case's tiny
//! MobileNetV2 (`tests/golden/mobilenetv2.toml`: every kind of block the example has, 5 of its 17
//! blocks, 8×8) at batch 16, so that a plan takes a moment to make on CI's two cores (the greedy lays
//! the program out again after every discard; the example's 515-instruction program takes tens of
//! seconds per plan, which `cargo xtask bench budget` spends).
use std::path::Path;

use frugal_cli::spec_toml::load_model;
use frugal_core::backend::CpuBackend;
use frugal_core::budget::Budget;
use frugal_core::exec::{Executor, Target};
use frugal_core::graph::{Graph, NodeOp};
use frugal_core::model::ModelSpec;
use frugal_core::plan::{Phase, Plan};
use frugal_core::policy::{self, CostModel, PolicyKind};
use frugal_core::rng::Rng;

const BATCH: usize = 16;

fn spec() -> ModelSpec {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("golden/mobilenetv2.toml");
    load_model(&path).expect("the golden model parses").spec
}

/// Losses of 2 steps on fixed samples, then every persistent tensor (weights, optimizer state,
/// BatchNorm running statistics).
fn train(p: &Plan) -> Vec<f32> {
    train_on(p, CpuBackend::new(), &mut |_, _| {}).0
}

/// [`train`] on `backend`, calling `after(eo, aligned arena)` after every instruction of the first step;
/// also the number of fused BatchNorm backwards the backend ran ([`CpuBackend::fused_backward`]).
fn train_on(p: &Plan, backend: CpuBackend, after: &mut dyn FnMut(usize, &[u8])) -> (Vec<f32>, u64) {
    let mut arena = vec![0xA5u8; p.needed_bytes()];
    let mut ex = Executor::with_backend(p, &arena, backend).unwrap();
    ex.init_params(&mut arena, 5).unwrap();
    let mut rng = Rng::new(11);
    let x: Vec<f32> = (0..BATCH * p.graph.input_dims.numel())
        .map(|_| rng.uniform(-1.0, 1.0))
        .collect();
    let y: Vec<u32> = (0..BATCH as u32).map(|i| i % 10).collect();
    let mut out = Vec::new();
    let mut obs = |eo: usize, _: &frugal_core::plan::Instr, a: &[u8]| after(eo, a);
    out.push(
        ex.train_step_observed(&mut arena, &x, Target::Classes(&y), &mut obs)
            .unwrap()
            .loss,
    );
    out.push(
        ex.train_step(&mut arena, &x, Target::Classes(&y))
            .unwrap()
            .loss,
    );
    for (_, _, t) in ex.state_tensors().collect::<Vec<_>>() {
        out.extend_from_slice(ex.read(&mut arena, t).unwrap());
    }
    (out, ex.backend().fused_backward())
}

#[test]
fn policy_plans_are_bit_exact_with_the_plain_plan_and_fit() {
    let spec = spec();
    let g = Graph::new(&spec, BATCH).unwrap();
    let convs = spec
        .layers
        .iter()
        .filter(|l| l.name.ends_with("_dw"))
        .count();
    assert_eq!(convs, 5, "five inverted-residual blocks");
    let plain = Plan::new(g.clone());
    let want = train(&plain);
    let cost = CostModel::estimate(&g);
    let arena = plain.needed_bytes();
    // Three quarters and half of the arena (the policy search), and the deepest plan the greedy
    // reaches (recompute with nothing left to discard: the smallest budget).
    let mut plans = Vec::new();
    for budget in [arena * 3 / 4, arena / 2] {
        let frac = budget as f64 / arena as f64;
        let c = policy::plan_for_budget(&spec, BATCH, Budget::new(budget), PolicyKind::Auto, &cost)
            .unwrap_or_else(|e| panic!("no plan at {frac:.3} of the arena: {e}"));
        assert!(c.plan.needed_bytes() <= budget, "over budget at {frac:.3}");
        plans.push(c.plan);
    }
    let (Ok(floor) | Err(floor)) = policy::recompute(&g, 1, 0, &cost);
    assert!(
        floor.needed_bytes() < arena / 2,
        "floor {} vs arena {arena}",
        floor.needed_bytes()
    );
    // The bisection's floor (what `cargo xtask bench budget` reports): its budget plans, it lies
    // between the proven working-set bound and the ½-arena budget, and the bound itself is refused.
    let bisected = policy::floor(&spec, BATCH, PolicyKind::Auto, &cost, 0.01).unwrap();
    assert!(bisected.chosen.plan.needed_bytes() <= bisected.budget);
    assert!(bisected.lower_bound <= floor.needed_bytes());
    assert!(bisected.lower_bound < bisected.budget && bisected.budget <= arena / 2);
    assert!(policy::plan_for_budget(
        &spec,
        BATCH,
        Budget::new(bisected.lower_bound - 1),
        PolicyKind::Auto,
        &cost
    )
    .is_err());
    plans.push(floor);
    plans.push(bisected.chosen.plan);
    let mut recomputing = 0;
    for c in &plans {
        let frac = c.needed_bytes() as f64 / arena as f64;
        // Exact BatchNorm: never split the batch.
        assert_eq!((c.graph.batch, c.micro_batches), (BATCH, 1));
        let rc = c
            .program
            .iter()
            .filter(|i| i.phase == Phase::Recompute)
            .count();
        recomputing += usize::from(rc > 0);
        let got = train(c);
        assert_eq!(got.len(), want.len());
        let same = got
            .iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(
            same,
            "the plan at {frac:.3} of the arena ({rc} recomputes) changed the result"
        );
        println!("{frac:.3} of the arena: {rc} recomputes, bit-identical");
    }
    assert_eq!(
        recomputing, 4,
        "every budget below the arena needs recomputation"
    );
}

/// The CPU backend runs a training BatchNorm and the ReLU6 in place right after it as one pass (the
/// activation applied as the BatchNorm writes; the ReLU6 instruction then does nothing), forward and
/// recompute: the same bits as the two in turn, and it does happen — right after such a BatchNorm
/// instruction its output already lies in [0, 6]. Backward, the ReLU6's derivative and the
/// BatchNorm's gradient and input derivative after it run as one kernel: for every such pair.
#[test]
fn batchnorm_and_relu6_as_one_pass_train_bit_identically() {
    let spec = spec();
    let g = Graph::new(&spec, BATCH).unwrap();
    let plain = Plan::new(g.clone());
    let cost = CostModel::estimate(&g);
    let budget = Budget::new(plain.needed_bytes() / 2);
    let half = policy::plan_for_budget(&spec, BATCH, budget, PolicyKind::Auto, &cost)
        .unwrap()
        .plan;
    for (name, p) in [("plain", &plain), ("½ arena", &half)] {
        // The BatchNorm instructions (forward or recompute) a ReLU6 over their output follows.
        let pairs: Vec<usize> = (0..p.program.len() - 1)
            .filter(|&eo| {
                let (a, b) = (&p.program[eo], &p.program[eo + 1]);
                let (Some(na), Some(nb)) = (
                    p.graph.nodes.get(a.node as usize),
                    p.graph.nodes.get(b.node as usize),
                ) else {
                    return false;
                };
                matches!(a.phase, Phase::Forward | Phase::Recompute)
                    && a.phase == b.phase
                    && matches!(na.op, NodeOp::BatchNorm { .. })
                    && matches!(nb.op, NodeOp::Act(_))
                    && nb.inputs[0] == na.out
            })
            .collect();
        let recomputed = pairs
            .iter()
            .filter(|&&eo| p.program[eo].phase == Phase::Recompute)
            .count();
        assert!(pairs.len() >= 10, "{name}: {} pairs", pairs.len());
        if name != "plain" {
            assert!(recomputed > 0, "{name}: no recomputed BatchNorm + ReLU6");
        }
        let mut clamped = 0;
        let mut seen = |eo: usize, a: &[u8]| {
            if pairs.contains(&eo) {
                let out = p.graph.nodes[p.program[eo].node as usize].out;
                let v = frugal_core::exec::view(p, a, out, eo).unwrap();
                assert!(
                    v.iter().all(|&x| (0.0..=6.0).contains(&x)),
                    "{name}: eo {eo} not clamped"
                );
                clamped += 1;
            }
        };
        // The backward pairs: a ReLU6's derivative right before its BatchNorm's gradient and input
        // derivative.
        let backward: Vec<usize> = (0..p.program.len() - 2)
            .filter(|&eo| {
                let (a, b, c) = (&p.program[eo], &p.program[eo + 1], &p.program[eo + 2]);
                let (Some(na), Some(nb)) = (
                    p.graph.nodes.get(a.node as usize),
                    p.graph.nodes.get(b.node as usize),
                ) else {
                    return false;
                };
                a.phase == Phase::GradX
                    && matches!(na.op, NodeOp::Act(_))
                    && matches!(nb.op, NodeOp::BatchNorm { .. })
                    && na.inputs[0] == nb.out
                    && (b.phase, c.phase, c.node) == (Phase::GradW, Phase::GradX, b.node)
            })
            .collect();
        let (fused, fused_bwd) = train_on(p, CpuBackend::new(), &mut seen);
        assert_eq!(clamped, pairs.len());
        // Every BatchNorm + ReLU6 pair of the model (11) in the plain plan; a recomputing plan puts
        // some recomputations between an activation's derivative and its BatchNorm's (7 of 11 left).
        if name == "plain" {
            assert_eq!(backward.len(), 11, "{name}: backward pairs");
        } else {
            assert!(!backward.is_empty(), "{name}: no backward pair");
        }
        // All of them fused, in both steps.
        assert_eq!(
            fused_bwd,
            2 * backward.len() as u64,
            "{name}: fused backwards"
        );
        let (apart, none) = train_on(p, CpuBackend::new().unfused(), &mut |_, _| {});
        assert_eq!(none, 0);
        assert!(
            fused
                .iter()
                .zip(&apart)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{name}: the fused step differs"
        );
        println!("{name}: {} BatchNorm + ReLU6 pairs ({recomputed} recomputed) in one pass, {} backward in one kernel, bit-identical", pairs.len(), backward.len());
    }
}
