//! Budget adaptation in the middle of a step: bit-exact results, never over budget.
use alloc::format;
use alloc::rc::Rc;
use alloc::vec;
use alloc::vec::Vec;
use core::cell::Cell;
use core::ptr;

use super::*;
use crate::budget::Budget;
use crate::graph::Graph;
use crate::model::{Dims, LayerKind, LayerSpec, ModelSpec, OptimizerSpec, Src};
use crate::plan::table::PlanTable;
use crate::plan::tests::random_model;
use crate::policy::{recompute, CostModel};
use crate::rng::Rng;

fn layer(kind: LayerKind, inputs: Vec<Src>) -> LayerSpec {
    LayerSpec {
        name: String::new(),
        kind,
        inputs,
        trainable: true,
        update: crate::model::Update::All,
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

/// conv-bn-relu, then `blocks` residual blocks (depthwise conv-bn-relu, pointwise conv-bn, add, relu),
/// global average pool, flatten, linear on 1×8×8 with 4 channels.
fn bn_cnn(blocks: usize) -> ModelSpec {
    bn_cnn_sized(blocks, 1, 4, 8)
}

/// [`bn_cnn`] on `cin`×`hw`×`hw` with `ch` channels.
fn bn_cnn_sized(blocks: usize, cin: u32, ch: u32, hw: u32) -> ModelSpec {
    let mut layers = vec![layer(
        LayerKind::Conv2d {
            out: ch,
            kernel: [3, 3],
            stride: [1, 1],
            padding: [1, 1],
            groups: 1,
            bias: false,
        },
        vec![Src::Input],
    )];
    layers.push(bn(0));
    layers.push(layer(LayerKind::Relu, vec![Src::Layer(1)]));
    for _ in 0..blocks {
        let x = layers.len() as u32 - 1;
        layers.push(conv(ch, 3, ch, x)); // depthwise
        layers.push(bn(x + 1));
        layers.push(layer(LayerKind::Relu, vec![Src::Layer(x + 2)]));
        layers.push(conv(ch, 1, 1, x + 3)); // pointwise
        layers.push(bn(x + 4));
        layers.push(layer(
            LayerKind::Add,
            vec![Src::Layer(x), Src::Layer(x + 5)],
        ));
        layers.push(layer(LayerKind::Relu, vec![Src::Layer(x + 6)]));
    }
    let x = layers.len() as u32 - 1;
    layers.push(layer(LayerKind::GlobalAvgPool, vec![Src::Layer(x)]));
    layers.push(layer(LayerKind::Flatten, vec![Src::Layer(x + 1)]));
    layers.push(layer(
        LayerKind::Linear { out: 3, bias: true },
        vec![Src::Layer(x + 2)],
    ));
    for (i, l) in layers.iter_mut().enumerate() {
        l.name = format!("l{i}");
    }
    ModelSpec {
        input: Dims::new(cin, hw, hw),
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

/// The budget contract, checked as it runs: after every instruction the plan in force fits the budget
/// in force and every storage live there ends below it; bytes at or beyond the plan's arena never change
/// while it is in force; and while switching from P1 to P2, after every copy and every regenerating
/// instruction, no byte at or beyond `max(P1, P2)` arena bytes has changed.
struct Check {
    budget: Rc<Cell<usize>>,
    /// Bytes at and beyond `from` when the bound was last set (`None`: not yet seen).
    guard: Option<(usize, Vec<u8>)>,
    /// During a switch: the bytes beyond the new plan's arena after the latest move.
    pending: Option<(usize, Vec<u8>)>,
    instrs: usize,
    /// Switch moves checked (copies and regenerating instructions, plus one per switch).
    moves: usize,
    log: Vec<(usize, usize)>,
    /// The plan running over the budget after a deferred drop, until the next switch.
    deferred: Option<usize>,
    /// Instructions it ran so.
    over: usize,
}

impl Check {
    fn new(budget: Rc<Cell<usize>>) -> Self {
        Check {
            budget,
            guard: None,
            pending: None,
            instrs: 0,
            moves: 0,
            log: Vec::new(),
            deferred: None,
            over: 0,
        }
    }

    /// Bytes at and beyond `bound` equal the guard snapshot's.
    fn unchanged(&self, arena: &[u8], bound: usize, when: &dyn core::fmt::Display) {
        if let Some((from, snap)) = &self.guard {
            let at = bound.max(*from);
            assert!(
                arena[at.min(arena.len())..] == snap[(at - from).min(snap.len())..],
                "a byte at or beyond {at} changed {when}"
            );
        }
    }
}

impl AdaptObserver for Check {
    fn observe(&mut self, plan: &Plan, eo: usize, _ins: &Instr, arena: &[u8]) {
        let b = self.budget.get();
        if self.deferred.is_some() && plan.needed_bytes() <= b {
            // A rise reported while a drop was deferred: the plan in force meets the budget again
            // without a switch, and the deferral is over.
            self.deferred = None;
        }
        if self.deferred == Some(ptr::from_ref(plan) as usize) {
            // A deferred drop: the old plan goes on over the budget, inside its own arena (checked
            // below: nothing beyond it changes).
            self.over += 1;
        } else {
            assert!(
                plan.needed_bytes() <= b,
                "plan needs {} > budget {b}",
                plan.needed_bytes()
            );
            for (s, l) in plan.lives.iter_enumerated() {
                if (l.first as usize) <= eo && eo <= l.last as usize {
                    assert!(
                        plan.offsets[s] + l.bytes <= b,
                        "{} ends above the budget",
                        l.name
                    );
                }
            }
        }
        // A switch has ended: its last state is the new plan's guard.
        if let Some(p) = self.pending.take() {
            self.guard = Some(p);
        }
        self.unchanged(
            arena,
            plan.arena_bytes,
            &format_args!("at instruction {eo}"),
        );
        if self.guard.is_none() {
            let from = plan.arena_bytes.min(arena.len());
            self.guard = Some((from, arena[from..].to_vec()));
        }
        self.instrs += 1;
        self.log.push((ptr::from_ref(plan) as usize, eo));
    }

    fn deferring(&mut self, plan: &Plan, _eo: usize, budget: usize) {
        assert!(
            plan.needed_bytes() > budget,
            "deferred a drop the plan meets"
        );
        self.deferred = Some(ptr::from_ref(plan) as usize);
    }

    fn switching(&mut self, from: &Plan, to: &Plan, arena: &[u8]) {
        // A switch ends any deferral: from here the plan in force meets the budget again.
        self.deferred = None;
        let bound = from.arena_bytes.max(to.arena_bytes);
        if let Some(p) = self.pending.take() {
            self.guard = Some(p);
        }
        self.unchanged(arena, bound, &"while switching");
        // A byte of the old arena the new plan does not use may change during the switch only.
        let at = to.arena_bytes.min(arena.len());
        self.pending = Some((at, arena[at..].to_vec()));
        self.moves += 1;
    }
}

/// Bytes beyond the largest plan's arena in the tests' arenas: a guard no instruction or switch may touch.
const GUARD: usize = 4096;

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
    let mut arena = vec![0xA5u8; cap + GUARD];
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

pub(super) fn bn_table() -> (Graph, PlanTable) {
    let spec = bn_cnn(2);
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
    let mut totals = [0usize; 6];
    let mut models = 0usize;
    let next = |rng: &mut Rng, n: u32| (rng.uniform(0.0, 1.0) * n as f32) as u32 % n.max(1);
    // FRUGAL_SCHEDULES raises the count for long local runs (CI: 2,000).
    let want_schedules: usize = std::env::var("FRUGAL_SCHEDULES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    // FRUGAL_SCHEDULE_SECS keeps drawing schedules until that many seconds have passed (the issue's
    // one-hour local run), after at least FRUGAL_SCHEDULES.
    let secs: u64 = std::env::var("FRUGAL_SCHEDULE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let began = std::time::Instant::now();
    let mut moves = 0usize;
    let mut stuck = 0usize;
    let mut over = 0usize;
    while schedules < want_schedules || began.elapsed().as_secs() < secs {
        let Some((_, batch, g, table, name)) = random_table(&mut rng) else {
            continue;
        };
        if table.entries.len() < 3 {
            continue; // too few plans to switch between
        }
        models += 1;
        let (x, y) = batch_of(&g, batch, 11);
        let steps = 2;
        let want = plain_run(&Plan::new(g.clone()), steps, &x, &y);
        let needs = table.entries.iter().map(|e| e.plan.needed_bytes());
        let (lo, hi) = (needs.clone().min().unwrap(), needs.max().unwrap());
        let len = largest(&table).program.len();
        for _ in 0..8 {
            let start = next(&mut rng, table.entries.len() as u32) as usize;
            // Budget events at random instruction calls over both steps: a drop below the plan in
            // force (70%) or a rise above it, by a random fraction of the room left.
            let n_events = 3 + next(&mut rng, 8);
            let events: Vec<(usize, bool, f32)> = (0..n_events)
                .map(|_| {
                    let at = next(&mut rng, (2 * len + 4) as u32) as usize;
                    (at, next(&mut rng, 10) < 7, rng.uniform(0.0, 1.0))
                })
                .collect();
            let start_budget = table.entries[start].plan.needed_bytes();
            let run = adaptive_run(&table, start, steps, &x, &y, |c, _, p| {
                let (_, drop, f) = *events.iter().rev().find(|e| e.0 == c)?;
                let need = p.needed_bytes();
                Some(if drop && need > lo {
                    lo + ((need - 1 - lo) as f32 * f) as usize
                } else if c == 0 {
                    start_budget
                } else {
                    need + ((hi + 64 - need) as f32 * f) as usize
                })
            });
            // Every schedule completes: a drop no switch can meet right after an update is deferred
            // (module docs, step 5), and the observer checks the contract for it too.
            let (got, ads, check) = run.unwrap_or_else(|e| panic!("{name} events {events:?}: {e}"));
            assert_eq!(bits(&got), bits(&want), "{name} events {events:?}");
            assert!(check.instrs > 0);
            moves += check.moves;
            over += check.over;
            let deferred: usize = ads.iter().map(|a| a.deferred as usize).sum();
            assert_eq!(
                deferred, check.over,
                "{name}: deferred instructions as counted"
            );
            stuck += ads.iter().any(|a| a.deferred > 0) as usize;
            for ad in ads {
                totals[0] += ad.switches as usize;
                totals[1] += ad.switched_after as usize;
                totals[2] += ad.recomputed as usize;
                totals[3] += ad.restarted as usize;
                totals[4] += ad.above as usize;
                totals[5] += ad.bytes_moved;
            }
            schedules += 1;
        }
    }
    std::eprintln!(
        "{:.0} s: {schedules} schedules over {models} models: {} switches in steps, {} after steps, {} \
         forwards regenerated, {} restarts, {} switches using the old arena above the new, {} bytes \
         moved; the budget contract held after every instruction and all {moves} switch moves; \
         {stuck} schedules deferred a drop ({over} instructions run in the old arena)",
        began.elapsed().as_secs_f64(),
        totals[0],
        totals[1],
        totals[2],
        totals[3],
        totals[4],
        totals[5]
    );
    assert!(totals[0] > 2000 && totals[1] > 1000 && totals[2] > 0);
}

fn random_table(rng: &mut Rng) -> Option<(ModelSpec, usize, Graph, PlanTable, String)> {
    let next = |rng: &mut Rng, n: u32| (rng.uniform(0.0, 1.0) * n as f32) as u32 % n.max(1);
    let k = 1 + next(rng, 9) as usize;
    let choices: Vec<(u8, u8, bool)> = (0..k)
        .map(|_| {
            (
                next(rng, 256) as u8,
                next(rng, 256) as u8,
                next(rng, 4) != 0,
            )
        })
        .collect();
    let c0 = 1 + next(rng, 2);
    let hw = 2 + next(rng, 4);
    let batch = 2 + next(rng, 5) as usize;
    let spec = random_model(&choices, c0, hw, next(rng, 3) as u8);
    let g = Graph::new(&spec, batch).ok()?;
    let cost = CostModel::estimate(&g);
    let plain = Plan::new(g.clone()).needed_bytes();
    let min = match recompute(&g, 1, 0, &cost) {
        Ok(p) | Err(p) => p.needed_bytes(),
    };
    let budgets: Vec<usize> = (0..=6).map(|i| min + (plain - min) * i / 6).collect();
    let table = ladder(&spec, batch, &budgets, &cost).unwrap();
    let name = format!("model {choices:?} c0 {c0} hw {hw} batch {batch}");
    Some((spec, batch, g, table, name))
}

/// Whether any of the first `e` instructions changes a persistent tensor (no restart after it).
fn mutated(p: &Plan, e: usize) -> bool {
    p.program[..e].iter().any(|i| {
        i.phase == Phase::Apply
            || (i.phase == Phase::Forward
                && matches!(
                    p.graph.nodes[i.node as usize].op,
                    crate::graph::NodeOp::BatchNorm { train: true, .. }
                ))
    })
}

/// Every drop from a ladder plan to a smaller one, before any instruction of the step, lines up within
/// the budget contract (no byte beyond the old arena; with the smaller plans as fallbacks, as the
/// executor tries them) or may restart, but for a bounded few right after an update; almost all of them
/// within the new plan's arena.
#[test]
fn every_drop_between_ladder_plans_lines_up() {
    let mut rng = Rng::new(77);
    let mut stuck = 0usize;
    let (mut drops, mut direct, mut above, mut regen, mut fallback, mut restart) =
        (0, 0, 0, 0, 0, 0);
    let mut tables = 0;
    while tables < 600 {
        let Some((_, _, _, table, name)) = random_table(&mut rng) else {
            continue;
        };
        tables += 1;
        let cap = table
            .entries
            .iter()
            .map(|e| e.plan.arena_bytes)
            .max()
            .unwrap();
        for p1 in table.entries.iter().map(|e| &e.plan) {
            let mut smaller: Vec<&Plan> = table
                .entries
                .iter()
                .map(|e| &e.plan)
                .filter(|p| p.needed_bytes() < p1.needed_bytes())
                .collect();
            smaller.sort_by_key(|p| core::cmp::Reverse(p.needed_bytes()));
            for (k, p2) in smaller.iter().enumerate() {
                for e1 in 1..p1.program.len() {
                    drops += 1;
                    match super::adapt::plan_switch(p1, e1, p2, None, cap) {
                        Ok(sw) => {
                            direct += 1;
                            above += sw.above as usize;
                            regen += sw.synth.is_some() as usize;
                        }
                        Err(why) => {
                            let other = smaller[k + 1..]
                                .iter()
                                .any(|p| super::adapt::plan_switch(p1, e1, p, None, cap).is_ok());
                            // After an update a restart is not allowed: no switch meets the drop
                            // here (the executor defers it).
                            if other || !mutated(p1, e1) {
                                // served
                            } else {
                                stuck += 1;
                                let _ = (&name, why);
                            }
                            if other {
                                fallback += 1;
                            } else {
                                restart += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    std::eprintln!(
        "{drops} drops over {tables} tables: {direct} line up ({regen} regenerating, {above} using \
         the old arena above the new while switching), {fallback} to a smaller plan, {restart} restart \
         ({stuck} after an update: cannot adapt within the old arena)"
    );
    assert!(drops > 10_000);
    assert!(above * 100 <= direct);
    // Holding switches within the old arena (the budget contract) leaves a few drops, all of a single
    // 64-byte step right after an update, with no way on: 11 of 21,171 when this was written. The
    // executor defers them (the deferral test below); more than 0.1 % would mean the switch planner got
    // worse.
    assert!(
        stuck * 1000 <= drops,
        "{stuck} of {drops} drops cannot adapt"
    );
}

// Timing of on-the-fly adaptation against stop-restart lives in `cargo xtask bench budget`.

/// A drop that no switch can meet right after an update (the rare case of module docs, step 5) is
/// deferred, not an error: the step finishes in the old plan inside the old arena (the observer checks
/// that nothing beyond it changes), the switch happens after the step, and the results are bit-identical
/// to the unconstrained run.
#[test]
fn a_drop_no_switch_meets_after_an_update_is_deferred_to_the_step_end() {
    let mut rng = Rng::new(77);
    let mut tables = 0;
    let found = 'search: loop {
        assert!(
            tables < 2000,
            "no drop that no switch meets in {tables} tables"
        );
        let Some((_, batch, g, table, name)) = random_table(&mut rng) else {
            continue;
        };
        tables += 1;
        let cap = table
            .entries
            .iter()
            .map(|e| e.plan.needed_bytes())
            .max()
            .unwrap();
        for (i1, p1) in table.entries.iter().map(|e| &e.plan).enumerate() {
            for e1 in 1..p1.program.len() {
                if !mutated(p1, e1) {
                    continue;
                }
                // The largest plan below p1 for which neither it nor any smaller plan lines up at e1.
                let fits: Vec<&Plan> = table
                    .entries
                    .iter()
                    .map(|e| &e.plan)
                    .filter(|p| p.needed_bytes() < p1.needed_bytes())
                    .collect();
                let Some(budget) = fits.iter().map(|p| p.needed_bytes()).max() else {
                    continue;
                };
                if fits
                    .iter()
                    .all(|p| super::adapt::plan_switch(p1, e1, p, None, cap).is_err())
                {
                    break 'search (batch, g, table, name, i1, e1, budget);
                }
            }
        }
    };
    let (batch, g, table, name, start, e1, budget) = found;
    let (x, y) = batch_of(&g, batch, 11);
    let want = plain_run(&Plan::new(g.clone()), 2, &x, &y);
    let (got, ads, check) = adaptive_run(&table, start, 2, &x, &y, |c, _, _| {
        (c == e1).then_some(budget)
    })
    .unwrap_or_else(|e| panic!("{name}: drop at {e1}: {e}"));
    assert_eq!(bits(&got), bits(&want), "{name}");
    assert!(ads[0].deferred > 0, "{name}: the drop was not deferred");
    assert_eq!(ads[0].deferred as usize, check.over);
    // Met at the latest after the first step: the second step runs within the budget throughout.
    assert!(ads[0].switches > 0 || ads[0].switched_after, "{name}");
    assert_eq!(ads[1].deferred, 0);
    // The same drop taken back by a rise before the next instruction: one instruction ran deferred,
    // and from the rise on the plan in force meets the budget without a switch (the long random run
    // found the observer counting on past such a rise).
    let cap = table
        .entries
        .iter()
        .map(|e| e.plan.needed_bytes())
        .max()
        .unwrap();
    let (got, ads, check) = adaptive_run(&table, start, 2, &x, &y, |c, _, _| {
        (c == e1).then_some(budget).or((c == e1 + 1).then_some(cap))
    })
    .unwrap_or_else(|e| panic!("{name}: drop at {e1}, rise at {}: {e}", e1 + 1));
    assert_eq!(bits(&got), bits(&want), "{name}");
    assert_eq!(ads[0].deferred, 1, "{name}");
    assert_eq!(check.over, 1, "{name}");
}

/// An LSTM language model (its recurrent layers' derivative phase before their gradient phase,
/// reading the input derivative it wrote) switches plans at every point of a step within the budget
/// contract, and trains as the plain plan does: bit-exact on recompute plans, within summation-order
/// rounding where a micro-batched plan ran part of a step.
#[cfg(feature = "seq")]
#[test]
fn an_lstm_switches_plans_at_every_instruction() {
    let spec = crate::exec::rnn_tests::rnn_lm(false, 11, 6, 6, 5, 2);
    let batch = 8;
    let g = Graph::new(&spec, batch).unwrap();
    let cost = CostModel::estimate(&g);
    let plain = Plan::new(g.clone());
    let min = match recompute(&g, 1, 0, &cost) {
        Ok(p) | Err(p) => p.needed_bytes(),
    };
    assert!(min < plain.needed_bytes());
    let budgets: Vec<usize> = (0..=4)
        .map(|k| min + (plain.needed_bytes() - min) * k / 4)
        .collect();
    let table = ladder(&spec, batch, &budgets, &cost).unwrap();
    assert!(table.entries.len() >= 2);
    let (x, y) = crate::exec::seq_tests::tokens(batch, 6, 11);
    let want = plain_run(&plain, 2, &x, &y);
    let top = largest(&table);
    let top_id = ptr::from_ref(top) as usize;
    let full = top.needed_bytes();
    let low = table.entries[0].plan.needed_bytes();
    let micro = table.entries.iter().any(|e| e.plan.micro_batches > 1);
    let mut switched = 0;
    for at in 0..top.program.len() {
        let (got, ads, check) = adaptive_run(&table, 0, 2, &x, &y, |_, eo, p| {
            if eo == 0 {
                Some(full)
            } else if eo == at && ptr::from_ref(p) as usize == top_id {
                Some(low)
            } else {
                None
            }
        })
        .unwrap_or_else(|e| panic!("drop at {at}: {e}"));
        assert!(check.instrs > 0);
        assert!(ads.iter().all(|ad| !ad.restarted), "drop at {at}: {ads:?}");
        switched += ads.iter().map(|ad| ad.switches as usize).sum::<usize>();
        if micro {
            // Micro-batches sum the gradient in another order: a few ulps a step; Adam's normalised
            // step keeps 2 steps far below 1e-5.
            let (mut num, mut den) = (0f64, 0f64);
            for (a, b) in got.iter().zip(&want) {
                num += (*a as f64 - *b as f64).powi(2);
                den += (*b as f64).powi(2);
            }
            assert!((num / den).sqrt() < 1e-5, "drop at {at}");
        } else {
            assert_eq!(bits(&got), bits(&want), "drop at {at}");
        }
    }
    // Each step switches up to the top plan first; most drops switch again.
    assert!(switched > 2 * top.program.len(), "{switched} switches");
}
