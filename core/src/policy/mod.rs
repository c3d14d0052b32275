//! Memory policies: how to train a batch whose plain plan does not fit the budget, without changing the
//! maths. Micro-batching (Sage's gradient accumulation; only for sample-separable graphs), Melon's
//! memory-calibrated progressive recomputation, and Sage's hybrid; the search picks the fastest feasible
//! plan under a [`CostModel`], or reports the smallest budget any plan needs.
pub mod cost;
pub mod half;
pub mod ladder;
pub mod mixed;
#[cfg(test)]
mod oracle_tests;
pub mod placement;
pub mod spaces;
pub mod sparse;
pub mod swap;
#[cfg(test)]
mod tests;

use alloc::vec;
use alloc::vec::Vec;
use core::fmt;

pub use cost::CostModel;

use crate::budget::{Budget, BudgetError};
use crate::graph::{Graph, GraphError, GraphOptions, NodeOp, TensorId, TensorKind};
use crate::model::{LayerKind, ModelSpec};
use crate::plan::{Eo, GroupId, IdVec, Instr, Phase, Plan, PlanShape, Schedule, StorageId, ALIGN};
use crate::sort::heap_sort_by_key;

/// Which policy (or ordering of policies) to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyKind {
    /// The fastest feasible plan among all below (by the cost model).
    Auto,
    /// The plain plan only.
    Plain,
    /// Split the batch only.
    MicroBatch,
    /// Recompute only (whole batch).
    Recompute,
    /// Sage: shrink the micro-batch down to the efficient size, then recompute.
    Hybrid,
    /// Sage's "checkpointing prioritised" ordering: recompute at the whole batch first, then shrink.
    RecomputeFirst,
}

impl PolicyKind {
    /// Every policy, in declaration order.
    pub const ALL: [PolicyKind; 6] = [
        PolicyKind::Auto,
        PolicyKind::Plain,
        PolicyKind::MicroBatch,
        PolicyKind::Recompute,
        PolicyKind::Hybrid,
        PolicyKind::RecomputeFirst,
    ];

    /// Name for tables.
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Auto => "auto",
            PolicyKind::Plain => "plain",
            PolicyKind::MicroBatch => "micro-batch",
            PolicyKind::Recompute => "recompute",
            PolicyKind::Hybrid => "hybrid",
            PolicyKind::RecomputeFirst => "recompute-first",
        }
    }
    /// Parses a name.
    pub fn parse(s: &str) -> Option<PolicyKind> {
        [
            Self::Auto,
            Self::Plain,
            Self::MicroBatch,
            Self::Recompute,
            Self::Hybrid,
            Self::RecomputeFirst,
        ]
        .into_iter()
        .find(|k| k.name() == s)
    }
}

/// A plan chosen for a budget, with what it costs.
#[derive(Clone, Debug)]
pub struct Chosen {
    /// The plan.
    pub plan: Plan,
    /// The policy that produced it.
    pub policy: PolicyKind,
    /// Recompute instructions in one step.
    pub recomputes: usize,
    /// FLOPs those recomputations add per step.
    pub extra_flops: u64,
    /// Predicted milliseconds per step.
    pub predicted_ms: f64,
}

impl Chosen {
    fn new(plan: Plan, policy: PolicyKind, cost: &CostModel) -> Self {
        let recomputes = plan
            .program
            .iter()
            .filter(|i| i.phase == Phase::Recompute)
            .count();
        let extra_flops = plan
            .program
            .iter()
            .filter(|i| i.phase == Phase::Recompute)
            .map(|i| {
                cost::flops_per_sample(&plan.graph, i.node as usize, Phase::Forward)
                    * plan.graph.batch as u64
            })
            .sum();
        let predicted_ms = cost.step_ms(&plan);
        Chosen {
            plan,
            policy,
            recomputes,
            extra_flops,
            predicted_ms,
        }
    }
    /// Micro-batch size.
    pub fn micro_batch(&self) -> usize {
        self.plan.graph.batch
    }
}

/// Why no plan was made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanError {
    /// The model does not realise.
    Graph(GraphError),
    /// No policy fits; `needed` is the smallest budget a plan was found for.
    Budget(BudgetError),
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::Graph(e) => write!(f, "{e}"),
            PlanError::Budget(e) => write!(f, "{e}"),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for PlanError {}

impl From<GraphError> for PlanError {
    fn from(e: GraphError) -> Self {
        PlanError::Graph(e)
    }
}

/// Whether samples are independent in the graph (no BatchNorm in training mode), so micro-batching
/// gives the whole batch's gradients.
pub fn sample_separable(g: &Graph) -> bool {
    !g.nodes
        .iter()
        .any(|n| matches!(n.op, NodeOp::BatchNorm { train: true, .. }))
}

/// Whether `spec` has an attention layer, so its graph has two modes ([`GraphOptions::attn_recompute`]).
pub fn has_attention(spec: &ModelSpec) -> bool {
    spec.layers
        .iter()
        .any(|l| matches!(l.kind, LayerKind::Attention { .. }))
}

/// `spec` realised for batches of `batch`, its attention in recompute mode when `attn_recompute`.
pub fn graph_in_mode(
    spec: &ModelSpec,
    batch: usize,
    attn_recompute: bool,
) -> Result<Graph, GraphError> {
    Graph::with_options(
        spec,
        batch,
        GraphOptions {
            attn_recompute,
            ..GraphOptions::default()
        },
    )
}

/// The attention modes the policies try, in order: saving the probabilities (no extra work), then,
/// for a model with attention, recomputing them tile by tile in the backward (its plans need less:
/// `[n, heads, seq, seq]` saved probabilities become `[n, heads, seq, 2]` row statistics).
fn attn_modes(spec: &ModelSpec) -> &'static [bool] {
    if has_attention(spec) {
        &[false, true]
    } else {
        &[false]
    }
}

fn arena_budget(budget: usize) -> usize {
    budget.saturating_sub(ALIGN - 1)
}

/// Melon's memory-calibrated progressive recomputation (Algorithm 1 of the Melon paper), on the real
/// layout: lay the program out; at the first execution order where the arena's high-water mark exceeds
/// the budget, discard the live activation with the highest TPS = bytes × freed lifetime / recompute
/// time (never one the current instruction uses, nor one the next instruction needs), insert its
/// recomputation (recursively from live sources) before its next use, and lay out again. Returns the
/// fitting plan, or `Err` with the smallest plan reached when nothing more can be discarded.
///
/// Micro-batches repeat: with more than [`TEMPLATE_MICRO_BATCHES`] of them, the search runs on that many
/// (the first, a middle and the last micro-batch) and the middle one's program — its recomputations
/// included — is repeated for the others (`unroll`). The greedy would discard the same tensors in
/// every middle micro-batch, one iteration each, over a program `m` times longer: at batch 128 in
/// micro-batches of one that took 47 s, cubic in `m`.
#[allow(clippy::result_large_err)] // the Err plan is the best effort, returned by value on purpose
pub fn recompute(
    g: &Graph,
    micro_batches: u16,
    budget: usize,
    cost: &CostModel,
) -> Result<Plan, Plan> {
    recompute_with(
        g,
        micro_batches,
        budget,
        cost,
        Search::Exhaustive,
        usize::MAX,
    )
}

/// [`recompute`] that gives up (returning its best effort as `Err`) after `max_discards` discards.
#[allow(clippy::result_large_err)]
pub fn recompute_bounded(
    g: &Graph,
    micro_batches: u16,
    budget: usize,
    cost: &CostModel,
    max_discards: usize,
) -> Result<Plan, Plan> {
    recompute_with(
        g,
        micro_batches,
        budget,
        cost,
        Search::Exhaustive,
        max_discards,
    )
}

/// How far a failing recomputation search goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Search {
    /// Discard until nothing more can go anywhere, and prune the fitting plan: the `Err` plan is the
    /// smallest one there is to reach ([`recompute`]).
    Exhaustive,
    /// Give up as soon as the first execution order whose live bytes exceed the budget has nothing
    /// left to discard, and leave a fitting plan unpruned: only whether the budget can be met counts
    /// ([`floor`]'s probes). Giving up there loses no plan: the bytes live at that point are then
    /// all operands of its instruction, values nothing regenerates or values no chain can rebuild, and
    /// a discard elsewhere frees a storage there only if discarding it there was possible too (the
    /// same gap between its uses, the same chain), so no later discard brings that point under the
    /// budget.
    GiveUpWhenStuck,
}

/// The recomputation search, giving up as `search` says or after `max_discards` discards.
#[allow(clippy::result_large_err)]
fn recompute_with(
    g: &Graph,
    micro_batches: u16,
    budget: usize,
    cost: &CostModel,
    search: Search,
    max_discards: usize,
) -> Result<Plan, Plan> {
    if micro_batches > TEMPLATE_MICRO_BATCHES {
        let limit = arena_budget(budget);
        let (Ok(t) | Err(t)) = recompute_greedy(
            g,
            TEMPLATE_MICRO_BATCHES,
            budget,
            cost,
            search,
            max_discards,
        );
        if let Some(program) = unroll(&t.program, micro_batches) {
            let p = Schedule {
                graph: g,
                micro_batches,
                roots: t.roots,
                program,
            }
            .plan();
            return if p.arena_bytes <= limit {
                Ok(p)
            } else {
                Err(p)
            };
        }
    }
    recompute_greedy(g, micro_batches, budget, cost, search, max_discards)
}

/// Micro-batches [`recompute`] searches on before repeating the middle one.
pub const TEMPLATE_MICRO_BATCHES: u16 = 3;

/// The program of `m` micro-batches from a three-micro-batch one: the first micro-batch as it is, the
/// middle one `m - 2` times, the last one (with the updates) last, micro-batch numbers renumbered. None
/// when the template's instructions are not in micro-batch order.
fn unroll(template: &[Instr], m: u16) -> Option<Vec<Instr>> {
    if template.windows(2).any(|w| w[1].mb < w[0].mb)
        || template
            .last()
            .is_none_or(|i| i.mb != TEMPLATE_MICRO_BATCHES - 1)
    {
        return None;
    }
    let seg = |k: u16| template.iter().filter(move |i| i.mb == k);
    let mut out = Vec::with_capacity(template.len() * m as usize / 2);
    out.extend(seg(0).copied());
    for k in 1..m - 1 {
        out.extend(seg(1).map(|&i| Instr { mb: k, ..i }));
    }
    out.extend(seg(2).map(|&i| Instr { mb: m - 1, ..i }));
    Some(out)
}

#[allow(clippy::result_large_err)]
fn recompute_greedy(
    g: &Graph,
    micro_batches: u16,
    budget: usize,
    cost: &CostModel,
    search: Search,
    max_discards: usize,
) -> Result<Plan, Plan> {
    let mut s = Schedule::shaped(
        g,
        PlanShape {
            micro_batches,
            in_place: true,
        },
    );
    let limit = arena_budget(budget);
    let mut best: Option<Plan> = None;
    let mut plan = s.plan();
    for _ in 0..(4 * s.program.len() + 64).min(max_discards.saturating_add(1)) {
        if plan.arena_bytes <= limit {
            return Ok(match search {
                Search::Exhaustive => prune(plan, limit),
                Search::GiveUpWhenStuck => plan,
            });
        }
        if best
            .as_ref()
            .is_none_or(|b| plan.arena_bytes < b.arena_bytes)
        {
            best = Some(plan.clone());
        }
        // Where memory overflows: first by bytes live at once (what discarding reduces directly), then by
        // the layout's high-water mark (fragmentation), each at its first overflowing execution order.
        let live = live_profile(&plan);
        let pool = plan.pool_profile();
        let mut points: Vec<Eo> = Vec::new();
        let first_live = live.iter().position(|&b| b > limit);
        if let Some(t) = first_live {
            points.push(t as Eo);
        }
        if let Some(t) = pool.iter().position(|&b| b > limit) {
            points.push(t as Eo);
        }
        // Then every overflowing point, fullest first.
        let mut rest: Vec<Eo> = (0..live.len() as Eo)
            .filter(|&t| live[t as usize] > limit || pool[t as usize] > limit)
            .collect();
        heap_sort_by_key(&mut rest, |&t| (core::cmp::Reverse(live[t as usize]), t));
        points.extend(rest);
        let mut found = None;
        for (k, t) in points.into_iter().enumerate() {
            found = best_discard(&plan, t, cost);
            if found.is_some()
                || (k == 0 && first_live.is_some() && search == Search::GiveUpWhenStuck)
            {
                break;
            }
        }
        let Some((at, chain)) = found else {
            break; // nothing more to discard: `plan` is the last program's
        };
        s.program.splice(at..at, chain);
        plan = s.plan();
    }
    let b = match best {
        Some(b) if b.arena_bytes <= plan.arena_bytes => b,
        _ => plan,
    };
    Err(b)
}

/// The tensors a Forward/Recompute of `node` writes into group `gid`'s storage.
fn writes_group(p: &Plan, node: usize, gid: GroupId) -> bool {
    let n = &p.graph.nodes[node];
    let in_g = |t: TensorId| p.group_of[t as usize] == Some(gid);
    in_g(n.out) || (n.op.saved_recomputable() && n.saved.iter().any(|&s| in_g(s)))
}

/// Picks the storage to discard at `t` and returns (insert position, recompute chain).
fn best_discard(p: &Plan, t: Eo, cost: &CostModel) -> Option<(usize, Vec<Instr>)> {
    // Melon's rule first: never the next instruction's inputs. Only when nothing else can go, a tensor
    // the next instruction needs may be regenerated just in time (right before it), which still frees
    // it at `t`.
    discard_candidate(p, t, cost, false).or_else(|| discard_candidate(p, t, cost, true))
}

fn discard_candidate(
    p: &Plan,
    t: Eo,
    cost: &CostModel,
    just_in_time: bool,
) -> Option<(usize, Vec<Instr>)> {
    let mut best: Option<(f64, usize, Vec<Instr>)> = None;
    let gid_of_storage = storage_groups(p);
    for (s, life) in p.lives.iter_enumerated() {
        if life.first > t || life.last <= t || life.kind != TensorKind::Activation {
            continue;
        }
        let touches = &p.touches[s];
        if touches.binary_search(&t).is_ok() {
            continue; // the current instruction uses it
        }
        let Some(&u) = touches.iter().find(|&&e| e > t) else {
            continue;
        };
        if u == t + 1 && !just_in_time {
            continue; // the next instruction needs it
        }
        let gid = gid_of_storage[s];
        // Producers of this value: Forward/Recompute instructions in the segment writing the group.
        let producers: Vec<usize> = touches
            .iter()
            .filter(|&&e| e < t)
            .filter_map(|&e| {
                let ins = &p.program[e as usize];
                matches!(ins.phase, Phase::Forward | Phase::Recompute).then_some(ins.node as usize)
            })
            .filter(|&node| writes_group(p, node, gid))
            .collect();
        if producers.is_empty() || !group_recomputable(p, gid) {
            continue;
        }
        let mb = p.program[u as usize].mb;
        let mut chain = Vec::new();
        if !build_chain(p, &producers, u, mb, &mut chain, 0) {
            continue;
        }
        let ns = cost.chain_ns(&chain, p.graph.batch).max(1.0);
        let tps = life.bytes as f64 * (u - t) as f64 / ns;
        if best.as_ref().is_none_or(|b| tps > b.0) {
            best = Some((tps, u as usize, chain));
        }
    }
    best.map(|(_, u, c)| (u, c))
}

/// Bytes of the host arena live at each execution order (the lower bound's profile).
pub fn live_profile(p: &Plan) -> Vec<usize> {
    let mut d = vec![0i64; p.program.len() + 1];
    for l in p
        .lives
        .iter()
        .filter(|l| l.space == crate::plan::SpaceId::HOST)
    {
        d[l.first as usize] += l.bytes as i64;
        d[(l.last as usize + 1).min(p.program.len())] -= l.bytes as i64;
    }
    let mut acc = 0i64;
    let mut v: Vec<usize> = d
        .iter()
        .map(|x| {
            acc += x;
            acc.max(0) as usize
        })
        .collect();
    v.pop();
    v
}

fn storage_groups(p: &Plan) -> IdVec<StorageId, GroupId> {
    let mut v: IdVec<StorageId, GroupId> = vec![GroupId(u32::MAX); p.lives.len()].into();
    for (gid, segs) in p.segments.iter_enumerated() {
        for &(_, s) in segs {
            v[s] = gid;
        }
    }
    v
}

/// A group can be regenerated by re-running forwards: its tensors are node outputs (or what a forward
/// saves from its inputs alone: max-pool indices, norm statistics, attention probabilities), not
/// BatchNorm's saved statistics.
fn group_recomputable(p: &Plan, gid: GroupId) -> bool {
    p.group_of
        .iter()
        .enumerate()
        .filter(|(_, g)| **g == Some(gid))
        .all(|(t, _)| {
            let t = t as TensorId;
            p.graph
                .nodes
                .iter()
                .any(|n| n.out == t || (n.op.saved_recomputable() && n.saved.contains(&t)))
        })
}

/// Appends to `chain` the recompute instructions that regenerate the outputs of `producers` (in order)
/// before execution order `u`, recursively regenerating inputs that are not live then. False when an
/// input was overwritten in place and cannot be regenerated without clobbering a live value.
fn build_chain(
    p: &Plan,
    producers: &[usize],
    u: Eo,
    mb: u16,
    chain: &mut Vec<Instr>,
    depth: usize,
) -> bool {
    if depth > 64 {
        return false;
    }
    for &node in producers {
        if chain.iter().any(|i| i.node as usize == node) {
            continue;
        }
        // A recurrent layer runs as time steps, never as one recomputed forward: a value that needs
        // it regenerated is not discarded.
        if p.graph.nodes[node].bptt.is_some() {
            return false;
        }
        for &x in &p.graph.nodes[node].inputs {
            if p.graph.tensors[x as usize].kind == TensorKind::External {
                continue;
            }
            // Produced earlier in this chain: valid by construction.
            if chain
                .iter()
                .any(|i| p.graph.nodes[i.node as usize].out == x)
            {
                continue;
            }
            match value_at(p, x, u) {
                Value::Valid => {}
                Value::Clobbered => return false,
                Value::Dead => {
                    // Regenerate x: its group's producers up to x's own producer, in forward order.
                    let Some(gid) = p.group_of[x as usize] else {
                        return false;
                    };
                    let Some(xn) = p.graph.nodes.iter().position(|n| n.out == x) else {
                        return false;
                    };
                    let mut pre: Vec<usize> =
                        (0..=xn).filter(|&k| writes_group(p, k, gid)).collect();
                    // Only the in-place chain that ends in x (earlier writers of other values are not needed).
                    pre.retain(|&k| {
                        k == xn || p.roots[p.graph.nodes[k].out as usize] == p.roots[x as usize]
                    });
                    if !build_chain(p, &pre, u, mb, chain, depth + 1) {
                        return false;
                    }
                }
            }
        }
        chain.push(Instr {
            node: node as u16,
            phase: Phase::Recompute,
            mb,
            placement: Default::default(),
            step: 0,
        });
    }
    true
}

enum Value {
    Valid,
    Dead,
    Clobbered,
}

/// Whether tensor `x` holds its own value just before `u`: its group has a segment live across `u` whose
/// last forward writer before `u` is `x`'s producer.
/// Takes recomputations back: greedy discards can leave a recompute that later decisions made
/// redundant. Removes Recompute instructions, last first, while the plan still fits and every reader still
/// sees the value it needs; repeats until nothing changes.
///
/// A candidate is only measured ([`Schedule::arena_bytes`]); the plan is laid out once, at the end.
fn prune(plan: Plan, limit: usize) -> Plan {
    let mut s = Schedule::of(&plan);
    let mut attempts = 0;
    let mut pruned = false;
    'rounds: loop {
        let mut changed = false;
        let mut i = s.program.len();
        while i > 0 {
            i -= 1;
            if s.program[i].phase != Phase::Recompute {
                continue;
            }
            attempts += 1;
            if attempts > 4096 {
                break 'rounds;
            }
            let ins = s.program.remove(i);
            if values_consistent(s.graph, &s.roots, &s.program) && s.arena_bytes() <= limit {
                changed = true;
                pruned = true;
            } else {
                s.program.insert(i, ins);
            }
        }
        if !changed {
            break;
        }
    }
    if !pruned {
        return plan;
    }
    let program = s.program;
    Plan::from_program(plan.graph, plan.micro_batches, program, plan.roots)
}

/// Every activation an instruction reads was last written (within its micro-batch) by the node that
/// produces it — no reader sees a value overwritten in place or never produced. `roots`: the sharing
/// roots with in-place merging ([`share_groups`](crate::plan::share_groups)`(g, true)`).
fn values_consistent(g: &Graph, roots: &[TensorId], program: &[Instr]) -> bool {
    let producer: Vec<Option<usize>> = {
        let mut v = vec![None; g.tensors.len()];
        for (k, n) in g.nodes.iter().enumerate() {
            v[n.out as usize] = Some(k);
        }
        v
    };
    // Last forward writer of each storage group (by root), per micro-batch: reset at each micro-batch's
    // first forward.
    let mut last: Vec<Option<usize>> = vec![None; g.tensors.len()];
    let mut mb = u16::MAX;
    for ins in program {
        if ins.mb != mb && matches!(ins.phase, Phase::Forward | Phase::StepFwd) {
            mb = ins.mb;
            last.iter_mut().for_each(|v| *v = None);
        }
        let Some(n) = g.nodes.get(ins.node as usize) else {
            continue;
        };
        let mut reads: Vec<TensorId> = Vec::new();
        match ins.phase {
            Phase::GradW | Phase::GradX | Phase::StepBwd if matches!(n.op, NodeOp::Rnn(_)) => {
                reads.push(n.out)
            }
            Phase::Forward | Phase::Recompute | Phase::StepFwd => {
                reads.extend(n.inputs.iter().copied())
            }
            Phase::GradW => reads.extend(crate::plan::grad_w_inputs(n).iter().copied()),
            Phase::GradX => match n.op {
                NodeOp::Act(_) => reads.push(n.out),
                NodeOp::BatchNorm { train: true, .. }
                | NodeOp::Norm { .. }
                | NodeOp::Smooth(_)
                | NodeOp::Attention(_) => reads.extend(n.inputs.iter().copied()),
                _ => {}
            },
            _ => {}
        }
        for x in reads {
            if g.tensors[x as usize].kind != TensorKind::Activation {
                continue;
            }
            let Some(px) = producer[x as usize] else {
                continue;
            };
            if last[roots[x as usize] as usize] != Some(px) {
                return false;
            }
        }
        if matches!(
            ins.phase,
            Phase::Forward | Phase::Recompute | Phase::StepFwd
        ) {
            last[roots[n.out as usize] as usize] = Some(ins.node as usize);
        }
    }
    true
}

fn value_at(p: &Plan, x: TensorId, u: Eo) -> Value {
    let Some(gid) = p.group_of[x as usize] else {
        return Value::Valid;
    };
    let Some(s) = p.storage_at(x, u) else {
        return Value::Dead;
    };
    let life = &p.lives[s];
    if !(life.first < u && life.last >= u) {
        return Value::Dead;
    }
    let Some(xn) = p.graph.nodes.iter().position(|n| n.out == x) else {
        return Value::Valid;
    };
    let last_writer = p.touches[s]
        .iter()
        .filter(|&&e| e < u)
        .filter_map(|&e| {
            let ins = &p.program[e as usize];
            (matches!(ins.phase, Phase::Forward | Phase::Recompute)
                && writes_group(p, ins.node as usize, gid))
            .then_some(ins.node as usize)
        })
        .next_back();
    if last_writer == Some(xn) {
        Value::Valid
    } else {
        Value::Clobbered
    }
}

/// A lower bound on the arena of any plan of `g` (its micro-batch) run as `micro_batches`
/// micro-batches, whatever is recomputed (plans of [`plan_for_budget`]: nothing swapped out or packed):
/// the tensors that live through the whole step (weights, optimizer state, statistics; with several
/// micro-batches the gradients too, which accumulate from the first micro-batch's backward to the
/// update, so they are all live during the last micro-batch) plus, at the instruction touching the
/// most, the other tensors it reads or writes — counted once per storage-sharing group, so in-place
/// writes are not counted twice. One pass over one micro-batch's program (every micro-batch touches the
/// same tensors): what lets [`plan_for_budget`] skip a recomputation search that cannot fit, and
/// [`search_min_budget`] bracket its bisection.
pub fn arena_lower_bound(g: &Graph, micro_batches: u16) -> usize {
    let persistent = |k: TensorKind| {
        matches!(
            k,
            TensorKind::Weight | TensorKind::OptState | TensorKind::Stat
        ) || (micro_batches > 1 && k == TensorKind::Gradient)
    };
    let always: usize = g
        .tensors
        .iter()
        .filter(|t| persistent(t.kind))
        .map(|t| t.bytes)
        .sum();
    let roots = crate::plan::share_groups(g, true);
    let (mut touched, mut seen) = (Vec::new(), Vec::new());
    let mut worst = 0;
    for ins in crate::plan::step_program(g, 1) {
        crate::plan::touches(g, &ins, &mut touched);
        seen.clear();
        let mut bytes = 0;
        for &t in &touched {
            let tensor = &g.tensors[t as usize];
            if tensor.kind == TensorKind::External || persistent(tensor.kind) {
                continue;
            }
            let r = roots[t as usize];
            if !seen.contains(&r) {
                seen.push(r);
                bytes += tensor.bytes;
            }
        }
        worst = worst.max(bytes);
    }
    always + worst
}

/// What [`search_min_budget`] found.
#[derive(Clone, Debug)]
pub struct MinSearch {
    /// The smallest plan found (its `needed_bytes` is the budget it fits).
    pub plan: Plan,
    /// No plan of this micro-batching needs fewer bytes ([`arena_lower_bound`] plus the arena's
    /// alignment slack).
    pub lower_bound: usize,
    /// Plannings the bisection ran.
    pub plannings: usize,
}

/// Recompute instructions a probe of [`search_min_budget`] may insert before it counts as not
/// fitting.
pub const MIN_SEARCH_DISCARDS: usize = 256;

/// The smallest budget the policies reach for `spec` at `batch`, found in a bounded time: the
/// smallest micro-batch (1 where the graph is sample-separable, else the whole batch) and, between the
/// [`arena_lower_bound`] of that micro-batching and its plain plan, a bisection over the budget with at
/// most `plannings` recomputation searches of at most [`MIN_SEARCH_DISCARDS`] discards each, stopping
/// within 5% of the bracket's lower end (a probe that does not fit within its discards counts as
/// infeasible: the result is the smallest plan found, never below the lower bound, so the true
/// minimum lies between the two figures). [`min_budget`] runs the unbounded
/// greedy (minutes on a 44-layer transformer).
pub fn search_min_budget(
    spec: &ModelSpec,
    batch: usize,
    cost: &CostModel,
    plannings: usize,
) -> Result<MinSearch, GraphError> {
    let whole = Graph::new(spec, batch)?;
    let (b, m) = if sample_separable(&whole) {
        (1, batch)
    } else {
        (batch, 1)
    };
    let m = m as u16;
    // Each attention mode's graph; the bound is the smallest of theirs (recompute mode's, unless its
    // extra tile of scratch outweighs the probabilities it does not keep).
    let modes = attn_modes(spec);
    let graphs: Vec<Graph> = modes
        .iter()
        .map(|&a| graph_in_mode(spec, b, a))
        .collect::<Result<_, _>>()?;
    let lower_bound = graphs
        .iter()
        .map(|g| arena_lower_bound(g, m))
        .min()
        .unwrap_or(0)
        + ALIGN
        - 1;
    let mut best = micro_plan(spec, b, m as usize)?;
    for &a in &modes[1..] {
        let p = micro_plan_in_mode(spec, b, m as usize, a)?;
        if p.needed_bytes() < best.needed_bytes() {
            best = p;
        }
    }
    let (mut lo, mut n) = (lower_bound, 0);
    // Stop within 5% of the bracket's lower end: the probes below that are the ones that do not fit,
    // and each of those runs all its discards (the slow case).
    while n < plannings && best.needed_bytes() > lo + lo / 20 {
        let mid = lo + (best.needed_bytes() - lo) / 2;
        n += 1;
        let limit = arena_budget(mid);
        // The saving mode first (no extra work where it fits), then the recompute mode.
        let found = graphs.iter().find_map(|g| {
            match recompute_bounded(g, m, mid, cost, MIN_SEARCH_DISCARDS) {
                Ok(p) if p.arena_bytes <= limit => Some(p),
                _ => None,
            }
        });
        match found {
            Some(p) => best = p,
            None => lo = mid,
        }
    }
    Ok(MinSearch {
        plan: best,
        lower_bound,
        plannings: n,
    })
}

/// The micro-batch size that splits `batch` as evenly as possible into as many micro-batches as size `b`
/// needs: the same number of micro-batches (the same per-micro-batch overheads) with the smallest
/// micro-batch, so the least memory and no short last micro-batch (60 × 3 for 128 becomes 43 + 43 + 42).
/// Any other size with that count is larger and fits only if this one does.
pub fn balanced_micro_batch(batch: usize, b: usize) -> usize {
    batch.div_ceil(batch.div_ceil(b.max(1)))
}

/// The plain plan of `spec` at micro-batch `b` with `m` micro-batches.
fn micro_plan(spec: &ModelSpec, b: usize, m: usize) -> Result<Plan, GraphError> {
    micro_plan_in_mode(spec, b, m, false)
}

/// [`micro_plan`] with attention in recompute mode when `attn`.
fn micro_plan_in_mode(
    spec: &ModelSpec,
    b: usize,
    m: usize,
    attn: bool,
) -> Result<Plan, GraphError> {
    Ok(micro_plan_of(graph_in_mode(spec, b, attn)?, m))
}

/// The plain plan of `g` (a micro-batch's graph) run as `m` micro-batches.
fn micro_plan_of(g: Graph, m: usize) -> Plan {
    Plan::shaped(
        g,
        PlanShape {
            micro_batches: m as u16,
            in_place: true,
        },
    )
}

/// Plans `spec` for steps of `batch` samples within `budget` using `kind`. `cost` ranks candidates
/// (it is evaluated per plan; pass [`CostModel::estimate`] of the whole-batch graph or a measured one).
pub fn plan_for_budget(
    spec: &ModelSpec,
    batch: usize,
    budget: Budget,
    kind: PolicyKind,
    cost: &CostModel,
) -> Result<Chosen, PlanError> {
    plan_for_budget_with(spec, batch, budget, kind, cost, Approximations::default())
}

/// Approximations a user may opt into; none is ever chosen silently.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Approximations {
    /// Ghost batch normalisation: let BatchNorm models micro-batch, normalising each micro-batch with its
    /// own statistics (and updating the running statistics once per micro-batch). Changes the maths
    /// (Hoffer et al. 2017); frugal never does it unless asked.
    pub ghost_batch_norm: bool,
    /// fp16 storage ([`half::f16_storage`]): activations saved for the backward pass are kept as IEEE
    /// half between forward and backward (compute stays f32). Applies to the single-micro-batch plan;
    /// when that does not fit, the budget error names what it needs.
    pub f16_storage: bool,
}

/// [`plan_for_budget`] with opt-in approximations.
pub fn plan_for_budget_with(
    spec: &ModelSpec,
    batch: usize,
    budget: Budget,
    kind: PolicyKind,
    cost: &CostModel,
    approx: Approximations,
) -> Result<Chosen, PlanError> {
    plan_searching(spec, batch, budget, kind, cost, approx, Search::Exhaustive)
}

/// The policy search in each attention mode in turn ([`attn_modes`]): the saving mode's plan when one
/// fits, else the recompute mode's. When neither fits, the error's `needed` is [`refusal_floor`]'s
/// budget under [`Search::Exhaustive`] (what [`plan_for_budget`] reports), and `usize::MAX` otherwise
/// ([`floor`]'s probes only ask whether a budget plans).
fn plan_searching(
    spec: &ModelSpec,
    batch: usize,
    budget: Budget,
    kind: PolicyKind,
    cost: &CostModel,
    approx: Approximations,
    search: Search,
) -> Result<Chosen, PlanError> {
    for &attn in attn_modes(spec) {
        if let Some(c) = plan_searching_mode(spec, batch, budget, kind, cost, approx, search, attn)?
        {
            return Ok(c);
        }
    }
    let needed = if search == Search::Exhaustive {
        refusal_floor(spec, batch, kind, cost, approx)?
    } else {
        usize::MAX // a probe's refusal: only whether it planned counts
    };
    Err(PlanError::Budget(BudgetError::TooSmall {
        needed,
        given: budget.bytes,
    }))
}

/// Relative width of the bracket at which [`refusal_floor`] stops: its figure is within 1/128 of the
/// smallest budget that plans (or of a budget refused below it, the greedy not being monotonic).
pub const REFUSAL_TOLERANCE: usize = 128;

/// The budget a refusal names: the smallest budget [`plan_for_budget`] plans `spec` at `batch` for.
/// Policies that never recompute need exactly their smallest plain plan: fp16 storage's (in either
/// attention mode), the whole batch's, and for micro-batching the smallest of every even split. The
/// others' figure is found by bisection as [`floor`] finds it (probes that give up where stuck),
/// between the proven [`working_set_bound`] and the smallest of those plain plans, to within
/// [`REFUSAL_TOLERANCE`]. It depends on neither the budget refused nor anything the refused search
/// did, so every refusal of one model, batch and policy names the same figure, and that figure plans.
/// The sizing runs a few searches that end early: sizing by the exhaustive search at a zero budget
/// (discard until nothing more can go, everywhere; what frugal did before) took 27 s on the small
/// character transformer at batch 32 (`cargo xtask bench planning --refusals`).
fn refusal_floor(
    spec: &ModelSpec,
    batch: usize,
    kind: PolicyKind,
    cost: &CostModel,
    approx: Approximations,
) -> Result<usize, PlanError> {
    let modes = attn_modes(spec);
    if approx.f16_storage {
        let mut needed = usize::MAX;
        for &attn in modes {
            needed =
                needed.min(half::f16_storage(&graph_in_mode(spec, batch, attn)?).needed_bytes());
        }
        return Ok(needed);
    }
    let whole = Graph::new(spec, batch)?;
    let separable = sample_separable(&whole) || approx.ghost_batch_norm;
    if kind == PolicyKind::Plain {
        return Ok(Plan::new(whole).needed_bytes());
    }
    // The micro-batch sizes the policy may split into: every even split but for recomputation alone.
    let splits = separable && kind != PolicyKind::Recompute;
    let sizes: Vec<usize> = if splits {
        (1..=batch)
            .filter(|&b| balanced_micro_batch(batch, b) == b)
            .collect()
    } else {
        vec![batch]
    };
    // The smallest plain plan of those sizes in either attention mode plans by itself: micro-batching's
    // figure, and the top of the others' bracket.
    let mut plain = usize::MAX;
    for &attn in modes {
        for &b in &sizes {
            plain = plain.min(micro_plan_in_mode(spec, b, batch.div_ceil(b), attn)?.needed_bytes());
        }
    }
    if kind == PolicyKind::MicroBatch {
        return Ok(plain);
    }
    let lo = working_set_floor(spec, if splits { 1 } else { batch })?
        .saturating_sub(1)
        .min(plain);
    // The first probe goes an eighth above the bound, where the floor usually lies (the character
    // transformer's is 9% above it): one probe more where it does not, five fewer where it does.
    let b = bisect_budget(
        spec,
        batch,
        kind,
        cost,
        approx,
        (lo, plain),
        Some(lo + lo / 8),
        |lo, hi| hi - lo > (hi / REFUSAL_TOLERANCE).max(1),
    )?;
    Ok(b.hi)
}

/// The smallest [`working_set_bound`] of `spec`'s graph at micro-batch `b` in any attention mode the
/// search tries: no plan of any micro-batching down to `b` needs less.
fn working_set_floor(spec: &ModelSpec, b: usize) -> Result<usize, GraphError> {
    let mut bound = usize::MAX;
    for &attn in attn_modes(spec) {
        bound = bound.min(working_set_bound(&graph_in_mode(spec, b, attn)?));
    }
    Ok(bound)
}

/// Where [`bisect_budget`] stopped.
struct Bracket {
    /// The largest budget refused (or the starting lower end).
    lo: usize,
    /// The smallest budget that planned (or the starting upper end).
    hi: usize,
    /// Probes run.
    probes: usize,
}

/// Bisects the budget between `lo` (refused) and `hi` (plans) while `open(lo, hi)`, each probe the
/// policy search with give-up recomputation ([`Search::GiveUpWhenStuck`]): [`floor`] and
/// [`refusal_floor`]. `first`: the first probe, where it lies inside the bracket (else the middle).
#[allow(clippy::too_many_arguments)]
fn bisect_budget(
    spec: &ModelSpec,
    batch: usize,
    kind: PolicyKind,
    cost: &CostModel,
    approx: Approximations,
    (mut lo, mut hi): (usize, usize),
    mut first: Option<usize>,
    open: impl Fn(usize, usize) -> bool,
) -> Result<Bracket, PlanError> {
    let mut probes = 0;
    while open(lo, hi) {
        let mid = match first.take() {
            Some(g) if lo < g && g < hi => g,
            _ => lo + (hi - lo) / 2,
        };
        probes += 1;
        let budget = Budget::new(mid);
        match plan_searching(
            spec,
            batch,
            budget,
            kind,
            cost,
            approx,
            Search::GiveUpWhenStuck,
        ) {
            Ok(_) => hi = mid,
            Err(PlanError::Budget(_)) => lo = mid,
            Err(e) => return Err(e),
        }
    }
    Ok(Bracket { lo, hi, probes })
}

/// [`plan_searching`] in one attention mode (`attn`: recompute): the chosen plan, or None when no plan
/// fits. A plan (plain or recomputing) is only made where [`arena_lower_bound`] lets it fit, so a
/// budget far too small is refused after a pass over each micro-batching's program, without a layout.
#[allow(clippy::too_many_arguments)]
fn plan_searching_mode(
    spec: &ModelSpec,
    batch: usize,
    budget: Budget,
    kind: PolicyKind,
    cost: &CostModel,
    approx: Approximations,
    search: Search,
    attn: bool,
) -> Result<Option<Chosen>, PlanError> {
    let g = graph_in_mode(spec, batch, attn)?;
    let fits = |p: &Plan| p.needed_bytes() <= budget.bytes;
    if approx.f16_storage {
        let p = half::f16_storage(&g);
        return Ok(fits(&p).then(|| Chosen::new(p, PolicyKind::Plain, cost)));
    }
    // Plans that cannot fit ([`arena_lower_bound`] of their micro-batching above the limit) are not
    // made: they cannot add a candidate.
    let limit = arena_budget(budget.bytes);
    let whole_bound = arena_lower_bound(&g, 1);
    // Micro-batch sizes whose plain plan was made and does not fit (the hybrid does not remake them).
    let mut plain_refused: Vec<usize> = Vec::new();
    if whole_bound <= limit {
        let plain = Plan::new(g.clone());
        if fits(&plain) {
            return Ok(Some(Chosen::new(plain, PolicyKind::Plain, cost)));
        }
        plain_refused.push(batch);
    }
    let separable = sample_separable(&g) || approx.ghost_batch_norm;
    let mut candidates: Vec<Chosen> = Vec::new();
    let kinds: &[PolicyKind] = match kind {
        PolicyKind::Auto => &[
            PolicyKind::MicroBatch,
            PolicyKind::Recompute,
            PolicyKind::Hybrid,
        ],
        PolicyKind::Plain => &[],
        k => core::slice::from_ref(match k {
            PolicyKind::MicroBatch => &PolicyKind::MicroBatch,
            PolicyKind::Recompute => &PolicyKind::Recompute,
            PolicyKind::Hybrid => &PolicyKind::Hybrid,
            _ => &PolicyKind::RecomputeFirst,
        }),
    };
    for &k in kinds {
        match k {
            PolicyKind::MicroBatch if separable => {
                // Largest micro-batch whose plain plan fits (arena grows with the micro-batch), among
                // the even splits.
                for b in (1..batch)
                    .rev()
                    .filter(|&b| balanced_micro_batch(batch, b) == b)
                {
                    let m = batch.div_ceil(b);
                    let gb = graph_in_mode(spec, b, attn)?;
                    if arena_lower_bound(&gb, m as u16) > limit {
                        continue;
                    }
                    let p = micro_plan_of(gb, m);
                    if fits(&p) {
                        candidates.push(Chosen::new(p, k, cost));
                        break;
                    }
                    plain_refused.push(b);
                }
            }
            PolicyKind::Recompute if whole_bound > limit => {}
            PolicyKind::Recompute => {
                if let Ok(p) = recompute_with(&g, 1, budget.bytes, cost, search, usize::MAX) {
                    candidates.push(Chosen::new(p, k, cost));
                }
            }
            // Without micro-batching the hybrid's one candidate is the whole batch's recomputation,
            // which the search has just made (the same plan: min_by keeps the first of equals).
            PolicyKind::Hybrid if !separable && kinds.contains(&PolicyKind::Recompute) => {}
            PolicyKind::Hybrid | PolicyKind::RecomputeFirst => {
                let sizes: Vec<usize> = if separable {
                    let eff = cost.efficient_micro_batch(&g, batch, 0.9).max(1);
                    // Hybrid: micro-batch down to the efficient size, then recompute (and only below
                    // that, smaller micro-batches with recompute). RecomputeFirst: recompute at each
                    // size, largest first.
                    let mut v: Vec<usize> = (1..=batch)
                        .rev()
                        .filter(|&b| balanced_micro_batch(batch, b) == b)
                        .collect();
                    if k == PolicyKind::Hybrid {
                        heap_sort_by_key(&mut v, |&b| (b < eff, core::cmp::Reverse(b)));
                    }
                    v
                } else {
                    vec![batch]
                };
                // Predicted ms of each size's plain plan: no plan of that micro-batching is predicted
                // faster (recomputation only adds instructions), so once every size left is predicted
                // no faster than a candidate in hand, no search left can change the choice.
                let mut plain_ms: Vec<Option<f64>> = vec![None; sizes.len()];
                for (i, &b) in sizes.iter().enumerate() {
                    let m = batch.div_ceil(b);
                    if let Some(best) = candidates
                        .iter()
                        .map(|c| c.predicted_ms)
                        .min_by(f64::total_cmp)
                    {
                        let mut beaten = true;
                        for (j, &b2) in sizes.iter().enumerate().skip(i) {
                            let ms = match plain_ms[j] {
                                Some(ms) => ms,
                                None => {
                                    let ms = cost.step_ms(&micro_plan_in_mode(
                                        spec,
                                        b2,
                                        batch.div_ceil(b2),
                                        attn,
                                    )?);
                                    plain_ms[j] = Some(ms);
                                    ms
                                }
                            };
                            if ms < best {
                                beaten = false;
                                break;
                            }
                        }
                        if beaten {
                            break;
                        }
                    }
                    let gb = graph_in_mode(spec, b, attn)?;
                    if arena_lower_bound(&gb, m as u16) > limit {
                        continue;
                    }
                    if k == PolicyKind::Hybrid {
                        if !plain_refused.contains(&b) {
                            let p = micro_plan_of(gb.clone(), m);
                            if fits(&p) {
                                candidates.push(Chosen::new(p, k, cost));
                                break;
                            }
                        }
                        if separable && b > cost.efficient_micro_batch(&g, batch, 0.9).max(1) {
                            continue;
                        }
                    }
                    if let Ok(p) =
                        recompute_with(&gb, m as u16, budget.bytes, cost, search, usize::MAX)
                    {
                        candidates.push(Chosen::new(p, k, cost));
                        break;
                    }
                }
            }
            _ => {}
        }
    }
    Ok(candidates
        .into_iter()
        .min_by(|a, b| a.predicted_ms.total_cmp(&b.predicted_ms)))
}

/// The smallest budget any policy reaches for `spec` at `batch` (micro-batch 1 where separable, maximal
/// recomputation).
pub fn min_budget(spec: &ModelSpec, batch: usize, cost: &CostModel) -> Result<usize, GraphError> {
    let mut best = usize::MAX;
    for &attn in attn_modes(spec) {
        let g = graph_in_mode(spec, batch, attn)?;
        let (Ok(p) | Err(p)) = recompute(&g, 1, 0, cost);
        best = best.min(p.needed_bytes());
        if sample_separable(&g) {
            let g1 = graph_in_mode(spec, 1, attn)?;
            let (Ok(p) | Err(p)) = recompute(&g1, batch as u16, 0, cost);
            best = best.min(p.needed_bytes());
        }
    }
    Ok(best)
}

/// The smallest budget the policies plan for, found by bisection ([`floor`]), and how far it can be
/// from the true minimum.
#[derive(Clone, Debug)]
pub struct Floor {
    /// The smallest budget that planned: the floor.
    pub budget: usize,
    /// [`plan_for_budget`]'s plan for it (which may need a little less).
    pub chosen: Chosen,
    /// The largest budget below the floor at which the search was refused (the bisection's bracket;
    /// the greedy is not monotonic in the budget, so a budget in between may still plan).
    pub refused_below: usize,
    /// A proven lower bound on the budget of any plan of these policies ([`working_set_bound`]).
    pub lower_bound: usize,
    /// Budgets tried.
    pub probes: usize,
}

/// Bytes no plan of `g`'s graph can do without, whatever it recomputes: every persistent storage
/// (weights, optimizer state, running statistics) plus the largest working set of one instruction of
/// the plain program — the storages it reads or writes, which are live together while it runs. A
/// recomputation touches what the forward it repeats touches, and every other instruction of a
/// recomputing plan is the plain program's, with the same storage groups (the sharing roots do not
/// depend on the program). In the units of [`Plan::needed_bytes`].
pub fn working_set_bound(g: &Graph) -> usize {
    let plain = Plan::new(g.clone());
    let mut per_eo = vec![0usize; plain.program.len()];
    let mut persistent = 0;
    for (s, life) in plain.lives.iter_enumerated() {
        if life.kind.persistent() {
            persistent += life.bytes;
        } else {
            for &e in &plain.touches[s] {
                per_eo[e as usize] += life.bytes;
            }
        }
    }
    persistent + per_eo.into_iter().max().unwrap_or(0) + ALIGN - 1
}

/// The smallest budget [`plan_for_budget`] (policy `kind`) plans `spec` at `batch` for, found by
/// bisection between [`working_set_bound`] and the plain plan: each probe runs the policy search with
/// a recomputation that stops at the first point it cannot bring under the budget and leaves the plan
/// unpruned, and the bracket closes to `tolerance` (a fraction of the floor). The floor's plan is then
/// made (and pruned) by [`plan_for_budget`] itself, so the floor is a budget the policies really plan
/// for. Unlike [`min_budget`], which discards until nothing more can go (minutes on MobileNetV2), the
/// probes that fail end early.
pub fn floor(
    spec: &ModelSpec,
    batch: usize,
    kind: PolicyKind,
    cost: &CostModel,
    tolerance: f64,
) -> Result<Floor, PlanError> {
    let g = Graph::new(spec, batch)?;
    // Micro-batching (where the graph allows it) goes down to one sample.
    let lower_bound = working_set_floor(spec, if sample_separable(&g) { 1 } else { batch })?;
    let Bracket { lo, hi, probes } = bisect_budget(
        spec,
        batch,
        kind,
        cost,
        Approximations::default(),
        // The bound minus one is refused (or provably so); the plain plan plans.
        (lower_bound.saturating_sub(1), Plan::new(g).needed_bytes()),
        None,
        |lo, hi| hi > lo + 1 && (hi - lo) as f64 > tolerance * hi as f64,
    )?;
    // The floor's own plan, as the policy search makes it for that budget: a probe that planned gave
    // up nowhere, so it made the exhaustive search's choices up to the fitting plan, and a candidate
    // that gave up cannot fit; the same budget plans again.
    let chosen = plan_for_budget(spec, batch, Budget::new(hi), kind, cost)?;
    Ok(Floor {
        budget: hi,
        chosen,
        refused_below: lo,
        lower_bound,
        probes,
    })
}
