//! Budget adaptation in the middle of a step: bit-exact results, never over budget.
use alloc::format;
use alloc::rc::Rc;
use alloc::vec;
use alloc::vec::Vec;
use core::cell::Cell;
use core::ptr;

use super::*;
use crate::budget::Budget;
use crate::format::plan::PlanTable;
use crate::graph::Graph;
use crate::model::{Dims, LayerKind, LayerSpec, ModelSpec, OptimizerSpec, Src};
use crate::plan::tests::random_model;
use crate::policy::{recompute, CostModel};
use crate::rng::Rng;

fn layer(kind: LayerKind, inputs: Vec<Src>) -> LayerSpec {
    LayerSpec {
        name: String::new(),
        kind,
        inputs,
        trainable: true,
    }
}

fn conv(out: u32, k: u32, groups: u32, from: u32) -> LayerSpec {
    layer(
        LayerKind::Conv2d {
            out,
            kernel: [k, k],
            stride: [1, 1],
            padding: [k / 2, k / 2],
            groups,
            bias: false,
        },
        vec![Src::Layer(from)],
    )
}

fn bn(from: u32) -> LayerSpec {
    layer(
        LayerKind::BatchNorm2d {
            eps: 1e-5,
            momentum: 0.1,
        },
        vec![Src::Layer(from)],
    )
}

/// conv-bn-relu, depthwise conv-bn-relu, pointwise conv-bn, residual add, relu, global average pool,
/// flatten, linear on 1×8×8.
fn bn_cnn() -> ModelSpec {
    let mut layers = vec![layer(
        LayerKind::Conv2d {
            out: 4,
            kernel: [3, 3],
            stride: [1, 1],
            padding: [1, 1],
            groups: 1,
            bias: false,
        },
        vec![Src::Input],
    )];
    layers.push(bn(0)); // 1
    layers.push(layer(LayerKind::Relu, vec![Src::Layer(1)])); // 2
    layers.push(conv(4, 3, 4, 2)); // 3: depthwise
    layers.push(bn(3)); // 4
    layers.push(layer(LayerKind::Relu, vec![Src::Layer(4)])); // 5
    layers.push(conv(4, 1, 1, 5)); // 6: pointwise
    layers.push(bn(6)); // 7
    layers.push(layer(LayerKind::Add, vec![Src::Layer(2), Src::Layer(7)])); // 8
    layers.push(layer(LayerKind::Relu, vec![Src::Layer(8)])); // 9
    layers.push(layer(LayerKind::GlobalAvgPool, vec![Src::Layer(9)])); // 10
    layers.push(layer(LayerKind::Flatten, vec![Src::Layer(10)])); // 11
    layers.push(layer(
        LayerKind::Linear { out: 3, bias: true },
        vec![Src::Layer(11)],
    ));
    for (i, l) in layers.iter_mut().enumerate() {
        l.name = format!("l{i}");
    }
    ModelSpec {
        input: Dims::new(1, 8, 8),
        layers,
        loss: crate::model::LossKind::SoftmaxCrossEntropy,
        optimizer: OptimizerSpec::Adam {
            lr: 1e-2,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        },
        seed: 5,
    }
}

fn batch_of(g: &Graph, n: usize, seed: u64) -> (Vec<f32>, Vec<u32>) {
    let per = g.input_dims.numel();
    let mut rng = Rng::new(seed);
    let x = (0..n * per).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let y = (0..n).map(|i| (i % 3) as u32).collect();
    (x, y)
}

/// Losses of `steps` plain steps on `plan`, then every persistent tensor.
fn plain_run(plan: &Plan, steps: usize, x: &[f32], y: &[u32]) -> Vec<f32> {
    let mut arena = vec![0xA5u8; plan.needed_bytes()];
    let mut ex = Executor::new(plan, &arena).unwrap();
    ex.init_params(&mut arena, 9).unwrap();
    let mut out = Vec::new();
    for _ in 0..steps {
        out.push(
            ex.train_step(&mut arena, x, Target::Classes(y))
                .unwrap()
                .loss,
        );
    }
    for (_, _, t) in ex.state_tensors().collect::<Vec<_>>() {
        out.extend_from_slice(ex.read(&mut arena, t).unwrap());
    }
    out
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn largest(table: &PlanTable) -> &Plan {
    &table.entries.last().unwrap().plan
}

/// Checks, after every instruction, that the plan in force fits the budget in force, that every storage
/// live there ends below it, and that nothing above the plan's arena changed since the plan took over.
struct Check {
    budget: Rc<Cell<usize>>,
    plan: usize,
    above: Vec<u8>,
    instrs: usize,
    log: Vec<(usize, usize)>,
}

impl Check {
    fn new(budget: Rc<Cell<usize>>) -> Self {
        Check {
            budget,
            plan: 0,
            above: Vec::new(),
            instrs: 0,
            log: Vec::new(),
        }
    }
}

impl AdaptObserver for Check {
    fn observe(&mut self, plan: &Plan, eo: usize, _ins: &Instr, arena: &[u8]) {
        let b = self.budget.get();
        assert!(
            plan.needed_bytes() <= b,
            "plan needs {} > budget {b}",
            plan.needed_bytes()
        );
        for (s, l) in plan.lives.iter().enumerate() {
            if (l.first as usize) <= eo && eo <= l.last as usize {
                assert!(
                    plan.offsets[s] + l.bytes <= b,
                    "{} ends above the budget",
                    l.name
                );
            }
        }
        let id = ptr::from_ref(plan) as usize;
        let rest = &arena[plan.arena_bytes.min(arena.len())..];
        if id != self.plan {
            self.plan = id;
            self.above = rest.to_vec();
        } else {
            assert!(self.above == rest, "bytes above the arena changed at {eo}");
        }
        self.instrs += 1;
        self.log.push((id, eo));
    }
}

/// Runs `steps` adaptive steps starting on `table.entries[start]`; `sched(call, eo, plan)` is the budget
/// the host reports before the `call`-th instruction (counting over all steps), instruction `eo` of
/// `plan`. Returns the results as
/// [`plain_run`] does, each step's [`Adapted`], and the observer.
fn adaptive_run(
    table: &PlanTable,
    start: usize,
    steps: usize,
    x: &[f32],
    y: &[u32],
    mut sched: impl FnMut(usize, usize, &Plan) -> Option<usize>,
) -> Result<(Vec<f32>, Vec<Adapted>, Check), ExecError> {
    let cap = table
        .entries
        .iter()
        .map(|e| e.plan.needed_bytes())
        .max()
        .unwrap();
    let mut arena = vec![0xA5u8; cap];
    let p0 = &table.entries[start].plan;
    let mut ex = Executor::new(p0, &arena)?;
    ex.init_params(&mut arena, 9)?;
    let budget = Rc::new(Cell::new(usize::MAX));
    let mut check = Check::new(budget.clone());
    let mut calls = 0usize;
    let mut out = Vec::new();
    let mut ads = Vec::new();
    for _ in 0..steps {
        let mut at = |eo: usize, p: &Plan| {
            let b = sched(calls, eo, p);
            calls += 1;
            if let Some(b) = b {
                budget.set(b);
            }
            b.map(Budget::new)
        };
        let (st, ad) = ex.train_step_adaptive(
            &mut arena,
            x,
            Target::Classes(y),
            table,
            &mut at,
            &mut check,
        )?;
        out.push(st.loss);
        ads.push(ad);
    }
    for (_, _, t) in ex.state_tensors().collect::<Vec<_>>() {
        out.extend_from_slice(ex.read(&mut arena, t)?);
    }
    Ok((out, ads, check))
}

fn bn_table() -> (Graph, PlanTable) {
    let spec = bn_cnn();
    let g = Graph::new(&spec, 16).unwrap();
    let cost = CostModel::estimate(&g);
    let plain = Plan::new(g.clone()).needed_bytes();
    let min = match recompute(&g, 1, 0, &cost) {
        Ok(p) | Err(p) => p.needed_bytes(),
    };
    assert!(min <= plain / 2, "recompute reaches {min} of {plain}");
    let mut budgets: Vec<usize> = (0..=8).map(|k| min + (plain - min) * k / 8).collect();
    budgets.push(plain / 2);
    let table = ladder(&spec, 16, &budgets, &cost).unwrap();
    assert!(table.entries.len() >= 3);
    (g, table)
}

#[test]
fn halving_the_budget_mid_step_is_bit_exact() {
    let (g, table) = bn_table();
    let (x, y) = batch_of(&g, 16, 3);
    let top = largest(&table);
    let want = plain_run(&Plan::new(g.clone()), 3, &x, &y);
    assert_eq!(bits(&plain_run(top, 3, &x, &y)), bits(&want));
    let len = top.program.len();
    for frac in [0.25, 0.5, 0.75] {
        // Every step starts on the largest plan and halves the budget at `frac` of its instructions.
        let at = (len as f64 * frac) as usize;
        let full = top.needed_bytes();
        let top_id = ptr::from_ref(top) as usize;
        let (got, ads, check) = adaptive_run(&table, 0, 3, &x, &y, |_, eo, p| {
            if eo == 0 {
                Some(full)
            } else if eo == at && ptr::from_ref(p) as usize == top_id {
                Some(full / 2)
            } else {
                None
            }
        })
        .unwrap_or_else(|e| panic!("{frac}: {e}"));
        assert_eq!(bits(&got), bits(&want), "halving at {frac}");
        for ad in &ads {
            // Up to the top plan before the first instruction, down to half at `frac`.
            assert_eq!(ad.switches, 2, "{frac}: {ad:?}");
            assert!(!ad.restarted, "{frac}: {ad:?}");
        }
        assert!(check.instrs > 0);
    }
}

#[test]
fn halving_at_fixed_points_switches_once_per_step() {
    let (g, table) = bn_table();
    let (x, y) = batch_of(&g, 16, 4);
    let top_i = table.entries.len() - 1;
    let top = &table.entries[top_i].plan;
    let full = top.needed_bytes();
    let half = table.for_budget(full / 2).unwrap();
    let want = plain_run(&Plan::new(g.clone()), 3, &x, &y);
    for frac in [0.25, 0.5, 0.75] {
        // One step only: start on the top plan, halve at frac; then two steps on the small plan.
        let at = (top.program.len() as f64 * frac) as usize;
        let (got, ads, check) = adaptive_run(&table, top_i, 3, &x, &y, |c, _, _| {
            (c == at).then_some(full / 2)
        })
        .unwrap_or_else(|e| panic!("{frac}: {e}"));
        assert_eq!(bits(&got), bits(&want), "halving at {frac}");
        assert_eq!(ads[0].switches, 1);
        assert!(ads[0].bytes_moved > 0);
        assert_eq!(ads[1].switches, 0);
        // The step ran `at` instructions on the top plan, then the rest on the half plan.
        let first_half = check
            .log
            .iter()
            .take_while(|l| l.0 == ptr::from_ref(top) as usize);
        assert_eq!(first_half.count(), at);
        assert!(check.log[at..]
            .iter()
            .all(|l| l.0 == ptr::from_ref(&half.plan) as usize));
    }
}

#[test]
fn a_rise_mid_step_switches_after_the_step() {
    let (g, table) = bn_table();
    let (x, y) = batch_of(&g, 16, 5);
    let small = &table.entries[0].plan;
    let top = largest(&table);
    let want = plain_run(&Plan::new(g.clone()), 2, &x, &y);
    let mid = small.program.len() / 2;
    let (got, ads, check) = adaptive_run(&table, 0, 2, &x, &y, |c, _, _| {
        (c == mid).then_some(top.needed_bytes())
    })
    .unwrap();
    assert_eq!(bits(&got), bits(&want));
    assert_eq!(ads[0].switches, 0);
    assert!(ads[0].switched_after);
    let small_id = ptr::from_ref(small) as usize;
    let top_id = ptr::from_ref(top) as usize;
    // Step 1 ran entirely on the small plan, step 2 entirely on the top plan.
    let n1 = small.program.len();
    assert!(check.log[..n1].iter().all(|l| l.0 == small_id));
    assert!(check.log[n1..].iter().all(|l| l.0 == top_id));
    assert_eq!(check.log.len(), n1 + top.program.len());
}

#[test]
fn restart_baseline_is_bit_exact() {
    let (g, table) = bn_table();
    let (x, y) = batch_of(&g, 16, 6);
    let top = largest(&table);
    let small = &table.entries[0].plan;
    let want = plain_run(&Plan::new(g.clone()), 2, &x, &y);
    for frac in [0.25, 0.5, 0.75] {
        let mut arena = vec![0u8; top.needed_bytes()];
        let mut ex = Executor::new(top, &arena).unwrap();
        ex.init_params(&mut arena, 9).unwrap();
        let at = (top.program.len() as f64 * frac) as usize;
        let mut out = Vec::new();
        let s = ex
            .train_step_restart_at(&mut arena, &x, Target::Classes(&y), at, small, &mut ())
            .unwrap();
        out.push(s.loss);
        out.push(
            ex.train_step(&mut arena, &x, Target::Classes(&y))
                .unwrap()
                .loss,
        );
        for (_, _, t) in ex.state_tensors().collect::<Vec<_>>() {
            out.extend_from_slice(ex.read(&mut arena, t).unwrap());
        }
        assert_eq!(bits(&out), bits(&want), "restart at {frac}");
    }
}

#[test]
fn a_budget_below_every_plan_is_an_error() {
    let (g, table) = bn_table();
    let (x, y) = batch_of(&g, 16, 7);
    let r = adaptive_run(&table, table.entries.len() - 1, 1, &x, &y, |c, _, _| {
        (c == 5).then_some(64)
    });
    assert!(matches!(r, Err(ExecError::Budget(_))));
}

/// ≥ 1,000 random budget schedules (drops and rises, mid-step and between steps) over random models:
/// never over budget, bit-identical to the unconstrained run.
#[test]
fn random_schedules_never_exceed_the_budget_and_are_bit_exact() {
    let mut rng = Rng::new(0x5eed);
    let mut schedules = 0usize;
    let mut totals = Adapted::default();
    let mut models = 0usize;
    let next = |rng: &mut Rng, n: u32| (rng.uniform(0.0, 1.0) * n as f32) as u32 % n.max(1);
    while schedules < 1000 {
        let k = 1 + next(&mut rng, 9) as usize;
        let choices: Vec<(u8, u8, bool)> = (0..k)
            .map(|_| {
                (
                    next(&mut rng, 256) as u8,
                    next(&mut rng, 256) as u8,
                    next(&mut rng, 4) != 0,
                )
            })
            .collect();
        let c0 = 1 + next(&mut rng, 2);
        let hw = 2 + next(&mut rng, 4);
        let batch = 2 + next(&mut rng, 5) as usize;
        let spec = random_model(&choices, c0, hw, next(&mut rng, 3) as u8);
        let Ok(g) = Graph::new(&spec, batch) else {
            continue;
        };
        let cost = CostModel::estimate(&g);
        let plain = Plan::new(g.clone()).needed_bytes();
        let min = match recompute(&g, 1, 0, &cost) {
            Ok(p) | Err(p) => p.needed_bytes(),
        };
        let budgets: Vec<usize> = (0..=6).map(|i| min + (plain - min) * i / 6).collect();
        let table = ladder(&spec, batch, &budgets, &cost).unwrap();
        models += 1;
        let (x, y) = batch_of(&g, batch, 11);
        let steps = 2;
        let want = plain_run(&Plan::new(g.clone()), steps, &x, &y);
        let lo = table.entries[0].plan.needed_bytes();
        let hi = largest(&table).needed_bytes();
        let len = largest(&table).program.len();
        for _ in 0..8 {
            let start = next(&mut rng, table.entries.len() as u32) as usize;
            // Budget events at random instruction calls over both steps.
            let n_events = 1 + next(&mut rng, 5);
            let events: Vec<(usize, usize)> = (0..n_events)
                .map(|_| {
                    let at = next(&mut rng, (2 * len + 4) as u32) as usize;
                    let b = lo + next(&mut rng, (hi - lo + 64) as u32) as usize;
                    (at, b)
                })
                .collect();
            let start_budget = table.entries[start].plan.needed_bytes();
            let (got, ads, check) = adaptive_run(&table, start, steps, &x, &y, |c, _, _| {
                if c == 0 {
                    return Some(
                        start_budget.max(events.iter().find(|e| e.0 == 0).map_or(0, |e| e.1)),
                    );
                }
                events.iter().rev().find(|e| e.0 == c).map(|e| e.1)
            })
            .unwrap_or_else(|e| panic!("model {choices:?} c0 {c0} hw {hw} batch {batch}: {e}"));
            assert_eq!(
                bits(&got),
                bits(&want),
                "model {choices:?} c0 {c0} hw {hw} batch {batch} events {events:?}"
            );
            assert!(check.instrs > 0);
            for ad in ads {
                totals.switches += ad.switches;
                totals.bytes_moved += ad.bytes_moved;
                totals.recomputed += ad.recomputed;
                totals.restarted |= ad.restarted;
                totals.above |= ad.above;
            }
            schedules += 1;
        }
    }
    std::eprintln!("{schedules} schedules over {models} models: {totals:?}");
    assert!(totals.switches > 500);
}
