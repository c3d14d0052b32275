//! Policies never change the maths and never exceed the budget.
use alloc::vec::Vec;

use proptest::prelude::*;

use super::*;
use crate::model::LayerKind;
use crate::plan::tests::{random_model, run_steps};

/// Norm-wise relative difference of two result vectors (losses then weights).
fn rel(a: &[f32], b: &[f32]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        num += (*x as f64 - *y as f64).powi(2);
        den += (*y as f64).powi(2);
    }
    (num / den.max(1e-30)).sqrt()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Micro-batching equals the whole batch within 1e-5 relative (only the summation order changes).
    #[test]
    fn micro_batching_matches_the_whole_batch(
        choices in proptest::collection::vec((any::<u8>(), any::<u8>(), any::<bool>()), 1..8),
        c0 in 1u32..3, hw in 2u32..6, batch in 2usize..7, mb in 1usize..6, opt in any::<u8>(),
    ) {
        let mut spec = random_model(&choices, c0, hw, opt);
        spec.layers.retain(|l| !matches!(l.kind, LayerKind::BatchNorm2d { .. }));
        // Removing layers may break references; skip specs that no longer realise.
        let Ok(g) = Graph::new(&spec, batch) else { return Ok(()) };
        let mb = mb.min(batch);
        let whole = Plan::new(g);
        let split = micro_plan(&spec, mb, batch.div_ceil(mb)).unwrap();
        prop_assert_eq!(split.batch() >= batch, true);
        // Run both on exactly `batch` samples.
        let a = run_steps(&whole, 3);
        let b = crate::plan::tests::run_steps_n(&split, 3, batch);
        let e = rel(&b, &a);
        // 1e-5: f32 sums in another order differ by a few ulps per step; 3 SGD/Adam steps stay far below.
        prop_assert!(e <= 1e-5, "relative difference {e:.2e}");
    }

    /// Many micro-batches: recomputation searched on three micro-batches and repeated for the others
    /// trains bit-identically to the plain plan with the same micro-batches, and a plan it reports as
    /// fitting fits; with nothing to discard it is the plain micro-batched plan's program.
    #[test]
    fn recompute_over_many_micro_batches_is_bit_identical_and_fits(
        choices in proptest::collection::vec((any::<u8>(), any::<u8>(), any::<bool>()), 1..8),
        c0 in 1u32..3, hw in 2u32..6, b in 1usize..3, m in 4u16..9, opt in any::<u8>(),
        frac in 0.0f64..1.0,
    ) {
        let mut spec = random_model(&choices, c0, hw, opt);
        spec.layers.retain(|l| !matches!(l.kind, LayerKind::BatchNorm2d { .. }));
        let Ok(g) = Graph::new(&spec, b) else { return Ok(()) };
        let plain = micro_plan(&spec, b, m as usize).unwrap();
        let cost = CostModel::estimate(&g);
        let min = match recompute(&g, m, 0, &cost) { Ok(p) | Err(p) => p.needed_bytes() };
        let top = plain.needed_bytes();
        let budget = min + ((top - min.min(top)) as f64 * frac) as usize;
        let p = match recompute(&g, m, budget, &cost) { Ok(p) => p, Err(_) => return Ok(()) };
        prop_assert!(p.needed_bytes() <= budget);
        prop_assert_eq!(p.micro_batches, m);
        // Every micro-batch runs: its forward, loss and backward instructions, in order.
        for k in 0..m {
            prop_assert!(p.program.iter().any(|i| i.mb == k && i.phase == Phase::Loss));
        }
        let a = run_steps(&plain, 2);
        let c = run_steps(&p, 2);
        prop_assert_eq!(a.len(), c.len());
        for (x, y) in a.iter().zip(&c) {
            prop_assert_eq!(x.to_bits(), y.to_bits());
        }
    }

    /// Recomputation is bit-identical, and the plan fits the budget it was made for.
    #[test]
    fn recompute_is_bit_identical_and_fits(
        choices in proptest::collection::vec((any::<u8>(), any::<u8>(), any::<bool>()), 1..10),
        c0 in 1u32..3, hw in 2u32..7, batch in 2usize..6, opt in any::<u8>(), frac in 0.0f64..1.0,
    ) {
        let spec = random_model(&choices, c0, hw, opt);
        let Ok(g) = Graph::new(&spec, batch) else { return Ok(()) };
        let plain = Plan::new(g.clone());
        let cost = CostModel::estimate(&g);
        let min = match recompute(&g, 1, 0, &cost) { Ok(p) | Err(p) => p.needed_bytes() };
        let budget = min + ((plain.needed_bytes() - min.min(plain.needed_bytes())) as f64 * frac) as usize;
        let p = match recompute(&g, 1, budget, &cost) { Ok(p) => p, Err(_) => return Ok(()) };
        prop_assert!(p.needed_bytes() <= budget);
        let a = run_steps(&plain, 2);
        let b = run_steps(&p, 2);
        prop_assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(&b) {
            prop_assert_eq!(x.to_bits(), y.to_bits());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// A recomputation that gives up at the first point it cannot bring under the budget succeeds
    /// exactly where the exhaustive one does (with the same plan before pruning), and the floor search
    /// built on it: its budget plans (the plan fits, trains bit-identically to the plain plan), the
    /// budget it reports refused is refused, and the working-set bound is below every plan the
    /// exhaustive search reaches (the floor's, the deepest one) and refused itself.
    #[test]
    fn giving_up_early_loses_no_plan_and_the_floor_is_bracketed(
        choices in proptest::collection::vec((any::<u8>(), any::<u8>(), any::<bool>()), 1..10),
        c0 in 1u32..3, hw in 2u32..7, batch in 2usize..6, opt in any::<u8>(), frac in 0.0f64..1.0,
    ) {
        let spec = random_model(&choices, c0, hw, opt);
        let Ok(g) = Graph::new(&spec, batch) else { return Ok(()) };
        let plain = Plan::new(g.clone());
        let cost = CostModel::estimate(&g);
        let (Ok(deepest) | Err(deepest)) = recompute(&g, 1, 0, &cost);
        let min = deepest.needed_bytes();
        let budget = min.saturating_sub(64)
            + ((plain.needed_bytes() - min.min(plain.needed_bytes())) as f64 * frac) as usize;
        let full = recompute_greedy(&g, 1, budget, &cost, Search::Exhaustive, usize::MAX);
        let quick = recompute_greedy(&g, 1, budget, &cost, Search::GiveUpWhenStuck, usize::MAX);
        prop_assert_eq!(full.is_ok(), quick.is_ok(), "budget {}", budget);
        if let (Ok(f), Ok(q)) = (&full, &quick) {
            // The same discards; the exhaustive search then prunes.
            prop_assert_eq!(&prune(q.clone(), arena_budget(budget)).program, &f.program);
        }
        let fl = floor(&spec, batch, PolicyKind::Auto, &cost, 0.01).unwrap();
        prop_assert!(fl.chosen.plan.needed_bytes() <= fl.budget);
        prop_assert!(fl.refused_below < fl.budget);
        let at = |b: usize| plan_for_budget(&spec, batch, Budget::new(b), PolicyKind::Auto, &cost);
        prop_assert!(at(fl.budget).is_ok());
        prop_assert!(at(fl.refused_below).is_err());
        prop_assert!(at(fl.lower_bound - 1).is_err());
        prop_assert!(fl.lower_bound <= min);
        prop_assert!(fl.lower_bound <= fl.chosen.plan.needed_bytes());
        // Bit for bit against the plain plan of the same micro-batches (micro-batching itself changes
        // the summation order; `micro_batching_matches_the_whole_batch` bounds that).
        let fp = &fl.chosen.plan;
        let same_split = micro_plan(&spec, fp.graph.batch, fp.micro_batches as usize).unwrap();
        let a = crate::plan::tests::run_steps_n(&same_split, 2, batch);
        let b = crate::plan::tests::run_steps_n(fp, 2, batch);
        prop_assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(&b) {
            prop_assert_eq!(x.to_bits(), y.to_bits());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// No plan goes under [`arena_lower_bound`]: not the plain plan, not a micro-batched one, not the
    /// greedy's smallest recomputation; so `plan_for_budget` may skip a search it rules out.
    #[test]
    fn no_plan_goes_under_the_lower_bound(
        choices in proptest::collection::vec((any::<u8>(), any::<u8>(), any::<bool>()), 1..8),
        c0 in 1u32..3, hw in 2u32..6, batch in 1usize..5, m in 1u16..4, opt in any::<u8>(),
    ) {
        let spec = random_model(&choices, c0, hw, opt);
        let Ok(g) = Graph::new(&spec, batch) else { return Ok(()) };
        let cost = CostModel::estimate(&g);
        let plain = micro_plan(&spec, batch, m as usize).unwrap();
        let lb = arena_lower_bound(&g, m);
        prop_assert!(lb <= plain.arena_bytes, "plain {} < bound {lb}", plain.arena_bytes);
        let (Ok(p) | Err(p)) = recompute(&g, m, 0, &cost);
        prop_assert!(lb <= p.arena_bytes, "recompute {} < bound {lb}", p.arena_bytes);
    }
}

/// conv-BatchNorm-activation, conv-BatchNorm on 8×8: a network that is not sample-separable.
fn bn_net() -> ModelSpec {
    random_model(
        &[
            (0, 2, true),
            (2, 0, true),
            (3, 0, true),
            (0, 2, true),
            (2, 0, true),
        ],
        1,
        8,
        2,
    )
}

/// conv-relu-pool ×2 + linear on 16×16: the small CNN shape.
fn small_cnn() -> ModelSpec {
    random_model(
        &[
            (0, 2, true),
            (3, 0, true),
            (4, 0, true),
            (0, 2, true),
            (3, 0, true),
            (4, 0, true),
        ],
        1,
        16,
        2,
    )
}

#[test]
fn recompute_goes_well_below_the_plain_arena() {
    let spec = small_cnn();
    let g = Graph::new(&spec, 32).unwrap();
    let plain = Plan::new(g.clone());
    let cost = CostModel::estimate(&g);
    let p = match recompute(&g, 1, 0, &cost) {
        Ok(p) | Err(p) => p,
    };
    assert!(
        p.arena_bytes < plain.arena_bytes,
        "{} !< {}",
        p.arena_bytes,
        plain.arena_bytes
    );
    assert!(p.program.iter().any(|i| i.phase == Phase::Recompute));
}

#[test]
fn too_small_budget_reports_a_budget_that_works() {
    let spec = random_model(
        &[(0, 2, true), (3, 0, true), (4, 0, true), (0, 2, true)],
        1,
        8,
        0,
    );
    let g = Graph::new(&spec, 8).unwrap();
    let cost = CostModel::estimate(&g);
    let e = plan_for_budget(&spec, 8, Budget::new(64), PolicyKind::Auto, &cost).unwrap_err();
    let PlanError::Budget(BudgetError::TooSmall { needed, .. }) = e else {
        panic!("{e:?}")
    };
    let ok = plan_for_budget(&spec, 8, Budget::new(needed), PolicyKind::Auto, &cost).unwrap();
    assert!(ok.plan.needed_bytes() <= needed);
    let _ = Vec::<u8>::new();
}

/// A BatchNorm network (never micro-batched unless asked): in every policy and with each opt-in
/// approximation, a refusal names one figure whatever the budget refused, and that figure plans.
#[test]
fn a_batch_norm_refusal_names_a_figure_that_plans() {
    let spec = bn_net();
    let batch = 16;
    let cost = CostModel::estimate(&Graph::new(&spec, batch).unwrap());
    let approxes = [
        Approximations::default(),
        Approximations {
            ghost_batch_norm: true,
            ..Default::default()
        },
        Approximations {
            f16_storage: true,
            ..Default::default()
        },
    ];
    for approx in approxes {
        for kind in PolicyKind::ALL {
            let plan =
                |b: usize| plan_for_budget_with(&spec, batch, Budget::new(b), kind, &cost, approx);
            let needed_at = |b: usize| match plan(b) {
                Err(PlanError::Budget(BudgetError::TooSmall { needed, .. })) => needed,
                other => panic!("{kind:?} {approx:?} at {b}: {:?}", other.map(|c| c.policy)),
            };
            let n = needed_at(0);
            assert_eq!(needed_at(n / 3), n, "{kind:?} {approx:?}");
            let c =
                plan(n).unwrap_or_else(|e| panic!("{kind:?} {approx:?}: {n} B does not plan: {e}"));
            assert!(c.plan.needed_bytes() <= n, "{kind:?} {approx:?}");
        }
    }
}

#[test]
fn residual_bn_recompute_halves_the_arena_bit_exactly() {
    // stem conv-bn-relu, dw conv-bn-relu, pw conv-bn, add, relu, gap, fc on 8x8 ×16 channels
    use crate::model::{Dims, LayerSpec, LossKind, OptimizerSpec, Src};
    let l = |name: &str, kind: LayerKind, inputs: alloc::vec::Vec<Src>| LayerSpec {
        name: name.into(),
        kind,
        inputs,
        trainable: true,
        update: crate::model::Update::All,
    };
    let conv = |out, k, p, groups| LayerKind::Conv2d {
        out,
        kernel: [k, k],
        stride: [1, 1],
        padding: [p, p],
        groups,
        bias: false,
    };
    let bn = || LayerKind::BatchNorm2d {
        eps: 1e-5,
        momentum: 0.1,
    };
    let s = |i: u32| alloc::vec![Src::Layer(i)];
    let spec = crate::model::ModelSpec {
        input: Dims::new(1, 8, 8),
        layers: alloc::vec![
            l("stem", conv(16, 3, 1, 1), alloc::vec![Src::Input]),
            l("bn0", bn(), s(0)),
            l("r0", LayerKind::Relu, s(1)),
            l("dw", conv(16, 3, 1, 16), s(2)),
            l("bn1", bn(), s(3)),
            l("r1", LayerKind::Relu, s(4)),
            l("pw", conv(16, 1, 0, 1), s(5)),
            l("bn2", bn(), s(6)),
            l(
                "add",
                LayerKind::Add,
                alloc::vec![Src::Layer(2), Src::Layer(7)]
            ),
            l("r2", LayerKind::Relu, s(8)),
            l("gap", LayerKind::GlobalAvgPool, s(9)),
            l("flat", LayerKind::Flatten, s(10)),
            l(
                "fc",
                LayerKind::Linear {
                    out: 10,
                    bias: true
                },
                s(11)
            ),
        ],
        loss: LossKind::SoftmaxCrossEntropy,
        optimizer: OptimizerSpec::Adam {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        },
        seed: 1,
    };
    let g = Graph::new(&spec, 128).unwrap();
    let plain = Plan::new(g.clone());
    let cost = CostModel::estimate(&g);
    let r = match recompute(&g, 1, 0, &cost) {
        Ok(p) | Err(p) => p,
    };
    // A BatchNorm model cannot micro-batch; recompute alone must get it down to the structural floor:
    // four batch-sized tensors (recomputing a BatchNorm output needs its input and output while the
    // residual derivative and the branch derivative are alive). 16×8×8 f32 × 128 samples = 512 KiB each.
    let t = 16 * 8 * 8 * 4 * 128;
    assert!(
        r.arena_bytes <= 4 * t + t / 8,
        "{} vs floor {}",
        r.arena_bytes,
        4 * t
    );
    assert!(
        r.arena_bytes * 100 <= plain.arena_bytes * 60,
        "{} vs {}",
        r.arena_bytes,
        plain.arena_bytes
    );
    let g4 = Graph::new(&spec, 4).unwrap();
    let small_plain = Plan::new(g4.clone());
    let small = match recompute(&g4, 1, 0, &CostModel::estimate(&g4)) {
        Ok(p) | Err(p) => p,
    };
    let (a, b) = (run_steps(&small_plain, 2), run_steps(&small, 2));
    assert!(
        a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
        "recompute changed the result"
    );
}

#[test]
fn ghost_batch_norm_is_used_only_when_asked() {
    let spec = bn_net();
    let g = Graph::new(&spec, 64).unwrap();
    let cost = CostModel::estimate(&g);
    let plain = Plan::new(g);
    let budget = Budget::new(plain.needed_bytes() / 3);
    // Without the opt-in a BatchNorm model is never micro-batched, whatever the budget.
    if let Ok(c) = plan_for_budget(&spec, 64, budget, PolicyKind::Auto, &cost) {
        assert_eq!(c.plan.micro_batches, 1);
    }
    let c = plan_for_budget_with(
        &spec,
        64,
        budget,
        PolicyKind::MicroBatch,
        &cost,
        Approximations {
            ghost_batch_norm: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(c.plan.micro_batches > 1);
}

#[test]
fn micro_batches_split_the_batch_evenly() {
    let spec = small_cnn();
    let batch = 128;
    let g = Graph::new(&spec, batch).unwrap();
    let cost = CostModel::estimate(&g);
    assert_eq!(balanced_micro_batch(128, 60), 43);
    assert_eq!(balanced_micro_batch(128, 64), 64);
    assert_eq!(balanced_micro_batch(128, 127), 64);
    assert_eq!(balanced_micro_batch(7, 1), 1);
    // A budget the plain plan of micro-batch 60 fits but 64 does not: three micro-batches, as even as
    // possible (43 + 43 + 42), in less memory than 60 + 60 + 8 would take.
    let at = |b: usize| {
        micro_plan(&spec, b, batch.div_ceil(b))
            .unwrap()
            .needed_bytes()
    };
    assert!(at(60) < at(64));
    let budget = Budget::new(at(60));
    let c = plan_for_budget(&spec, batch, budget, PolicyKind::MicroBatch, &cost).unwrap();
    assert_eq!((c.plan.graph.batch, c.plan.micro_batches), (43, 3));
    assert!(c.plan.needed_bytes() < at(60));
    for kind in [
        PolicyKind::Auto,
        PolicyKind::Hybrid,
        PolicyKind::RecomputeFirst,
    ] {
        let c = plan_for_budget(&spec, batch, budget, kind, &cost).unwrap();
        let b = c.plan.graph.batch;
        assert_eq!(
            balanced_micro_batch(batch, b),
            b,
            "{kind:?}: micro-batch {b}"
        );
    }
}
