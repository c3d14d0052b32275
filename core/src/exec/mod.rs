//! Executor: runs a [`Plan`] over a caller-owned `&mut [u8]` arena. A training step is a loop over the
//! plan's instructions; every tensor is a slice of the arena at its planned offset, so a step allocates
//! nothing. Hosts never reach inside: they hand in a batch and read back a loss.
pub mod adapt;
#[cfg(test)]
mod adapt_tests;
mod arena;
pub mod int8;

use core::fmt;

pub use adapt::{ladder, pick, AdaptObserver, Adapted};
pub use arena::carve;
use arena::{f32s, f32s_ro, u32s};

use crate::backend::{Backend, CpuBackend, Placement};
use crate::budget::BudgetError;
use crate::graph::{scratch_slot, Graph, Node, NodeOp, TensorId, TensorKind};
use crate::model::LossKind;
use crate::ops;
use crate::optim::{self, StepCtx};
use crate::plan::{Eo, Instr, Phase, Plan, ALIGN, LOSS_NODE};
use crate::rng::{hash2, Rng};
pub use crate::spill::{Spill, SpillError};

/// The targets of a batch.
#[derive(Clone, Copy, Debug)]
pub enum Target<'a> {
    /// Class indices (softmax cross-entropy).
    Classes(&'a [u32]),
    /// Regression targets with the prediction's shape (MSE).
    Values(&'a [f32]),
}

/// What one step measured.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepStats {
    /// Mean loss over the batch.
    pub loss: f32,
    /// Samples whose arg-max prediction equals the class (cross-entropy only).
    pub correct: usize,
    /// Samples in the batch.
    pub samples: usize,
}

/// Why a step could not run. A rejected step leaves the weights untouched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExecError {
    /// The arena is smaller than the plan.
    Budget(BudgetError),
    /// The batch does not match the plan (wrong length, too many samples, bad label).
    BadBatch(&'static str, usize),
    /// The input or the loss is NaN or infinite; the step was rejected before any update.
    NonFinite(&'static str),
    /// A plan instruction is inconsistent (overlapping regions, unknown node): a planner bug or a corrupt plan.
    BadPlan(&'static str),
    /// An instruction is placed on a backend this executor does not have.
    Placement(Placement),
    /// A named tensor does not exist or has another size.
    Tensor(&'static str),
    /// The host's spill store failed a swap. A failed swap-out rejects the step before any update (all
    /// swap-outs precede the first update); a failed swap-in aborts the step mid-backward.
    Spill(SpillError),
}

impl fmt::Display for ExecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExecError::Budget(b) => write!(f, "{b}"),
            ExecError::BadBatch(what, v) => write!(f, "bad batch: {what} ({v})"),
            ExecError::NonFinite(what) => write!(
                f,
                "{what} is NaN or infinite; the step was rejected and the weights are unchanged"
            ),
            ExecError::BadPlan(what) => write!(f, "inconsistent plan: {what}"),
            ExecError::Placement(p) => write!(f, "no backend for placement {p:?}"),
            ExecError::Tensor(what) => write!(f, "tensor access: {what}"),
            ExecError::Spill(e) => write!(f, "{e}"),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for ExecError {}

impl From<SpillError> for ExecError {
    fn from(e: SpillError) -> Self {
        ExecError::Spill(e)
    }
}

impl From<BudgetError> for ExecError {
    fn from(b: BudgetError) -> Self {
        ExecError::Budget(b)
    }
}

/// Sees the arena after every instruction of a step (tests, tracing, memory instrumentation). The
/// arena slice is the aligned arena, so [`Plan::region`] offsets index it directly.
pub trait Observer {
    /// Called after instruction `eo` ran.
    fn after(&mut self, eo: usize, ins: &Instr, arena: &[u8]);
}

impl Observer for () {
    #[inline]
    fn after(&mut self, _: usize, _: &Instr, _: &[u8]) {}
}

impl<F: FnMut(usize, &Instr, &[u8])> Observer for F {
    fn after(&mut self, eo: usize, ins: &Instr, arena: &[u8]) {
        self(eo, ins, arena)
    }
}

/// Tensor `t` (whole) at execution order `eo`, from an aligned arena slice as handed to an [`Observer`].
pub fn view<'a>(plan: &Plan, arena: &'a [u8], t: TensorId, eo: usize) -> Option<&'a [f32]> {
    let (off, len) = plan.region_at(t, eo as Eo)?;
    f32s_ro(arena.get(off..off + len)?).ok()
}

/// Randomness of one instruction: the step's seed and the batch index of its first sample.
#[derive(Clone, Copy)]
struct RunSeed {
    seed: u64,
    start: usize,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Train,
    Eval,
    /// A forward re-run during backward: identical outputs, no side effects (running statistics).
    Recompute,
}

/// Runs a plan. Holds only counters; the arena is passed to every call.
pub struct Executor<'p, B: Backend = CpuBackend> {
    plan: &'p Plan,
    backend: B,
    /// Optimizer steps taken (Adam's t).
    steps: u32,
}

impl<'p> Executor<'p, CpuBackend> {
    /// An executor on the CPU backend. Checks that `arena` can hold the plan.
    pub fn new(plan: &'p Plan, arena: &[u8]) -> Result<Self, ExecError> {
        Self::with_backend(plan, arena, CpuBackend)
    }
}

fn base_of(arena: &[u8]) -> usize {
    arena.as_ptr().align_offset(ALIGN).min(ALIGN)
}

impl<'p, B: Backend> Executor<'p, B> {
    /// An executor on `backend`.
    pub fn with_backend(plan: &'p Plan, arena: &[u8], backend: B) -> Result<Self, ExecError> {
        let needed = plan.arena_bytes + base_of(arena);
        if arena.len() < needed {
            return Err(ExecError::Budget(BudgetError::TooSmall {
                needed: plan.needed_bytes(),
                given: arena.len(),
            }));
        }
        Ok(Self {
            plan,
            backend,
            steps: 0,
        })
    }

    /// The plan.
    pub fn plan(&self) -> &'p Plan {
        self.plan
    }

    /// Optimizer steps taken so far.
    pub fn steps(&self) -> u32 {
        self.steps
    }

    /// Sets the step counter (when resuming from a checkpoint).
    pub fn set_steps(&mut self, steps: u32) {
        self.steps = steps;
    }

    fn arena<'a>(&self, arena: &'a mut [u8]) -> Result<&'a mut [u8], ExecError> {
        let b = base_of(arena);
        let end = b + self.plan.arena_bytes;
        if arena.len() < end {
            return Err(ExecError::Budget(BudgetError::TooSmall {
                needed: self.plan.needed_bytes(),
                given: arena.len(),
            }));
        }
        Ok(&mut arena[b..end])
    }

    /// Initialises every parameter like PyTorch's defaults (uniform ±1/√fan_in for weights and biases;
    /// BatchNorm γ=1, β=0, running mean 0, running var 1) and zeroes the optimizer state.
    pub fn init_params(&mut self, arena: &mut [u8], seed: u64) -> Result<(), ExecError> {
        let plan = self.plan;
        let arena = self.arena(arena)?;
        let mut rng = Rng::new(seed);
        for node in &plan.graph.nodes {
            let fan_in = match &node.op {
                NodeOp::Linear { fin, .. } => *fin,
                NodeOp::Conv(g) => g.cin / g.groups * g.kh * g.kw,
                _ => 0,
            };
            for (k, p) in node.params.iter().enumerate() {
                let v = tensor_mut(plan, arena, p.value)?;
                if let NodeOp::BatchNorm { .. } = node.op {
                    v.fill(if k == 0 { 1.0 } else { 0.0 });
                } else {
                    let bound = 1.0 / libm::sqrtf(fan_in.max(1) as f32);
                    for x in v.iter_mut() {
                        *x = rng.uniform(-bound, bound);
                    }
                }
                for &s in &p.state {
                    tensor_mut(plan, arena, s)?.fill(0.0);
                }
            }
            for (k, &s) in node.stats.iter().enumerate() {
                tensor_mut(plan, arena, s)?.fill(if k == 0 { 0.0 } else { 1.0 });
            }
        }
        self.steps = 0;
        Ok(())
    }

    /// The persistent tensors a checkpoint holds: parameters and BatchNorm statistics, with their
    /// `state_dict` names and shapes.
    pub fn state_tensors(
        &self,
    ) -> impl Iterator<Item = (alloc::string::String, alloc::vec::Vec<usize>, TensorId)> + 'p {
        let g: &'p Graph = &self.plan.graph;
        g.nodes.iter().flat_map(move |n| {
            let params = n
                .params
                .iter()
                .map(|p| (p.name.clone(), p.shape.clone(), p.value));
            let stats = n.stats.iter().map(move |&s| {
                let name = g.tensors[s as usize].name.clone();
                let c = g.tensors[s as usize].bytes / 4;
                (name, alloc::vec![c], s)
            });
            params.chain(stats)
        })
    }

    /// Reads a persistent tensor.
    pub fn read<'a>(&self, arena: &'a mut [u8], t: TensorId) -> Result<&'a [f32], ExecError> {
        let plan = self.plan;
        let a = self.arena(arena)?;
        tensor_mut(plan, a, t).map(|s| &*s)
    }

    /// Overwrites a persistent tensor (loading weights); `data` must have its exact length.
    pub fn write(&mut self, arena: &mut [u8], t: TensorId, data: &[f32]) -> Result<(), ExecError> {
        let plan = self.plan;
        let a = self.arena(arena)?;
        let dst = tensor_mut(plan, a, t)?;
        if dst.len() != data.len() {
            return Err(ExecError::Tensor("length differs from the planned tensor"));
        }
        dst.copy_from_slice(data);
        Ok(())
    }

    fn check_batch(
        &self,
        x: &[f32],
        target: Option<Target<'_>>,
        max: usize,
    ) -> Result<usize, ExecError> {
        let g = &self.plan.graph;
        let per = g.input_dims.numel();
        if x.is_empty() || !x.len().is_multiple_of(per) {
            return Err(ExecError::BadBatch(
                "input length is not a multiple of the sample size",
                x.len(),
            ));
        }
        let n = x.len() / per;
        if n > max {
            return Err(ExecError::BadBatch(
                "more samples than the planned batch",
                n,
            ));
        }
        if x.iter().any(|v| !v.is_finite()) {
            return Err(ExecError::NonFinite("the input batch"));
        }
        let classes = g.pred_dims().numel();
        match (g.loss, target) {
            (_, None) => {}
            (LossKind::SoftmaxCrossEntropy, Some(Target::Classes(y))) => {
                if y.len() != n {
                    return Err(ExecError::BadBatch(
                        "label count differs from the sample count",
                        y.len(),
                    ));
                }
                if let Some(&bad) = y.iter().find(|&&c| c as usize >= classes) {
                    return Err(ExecError::BadBatch(
                        "label is not below the number of classes",
                        bad as usize,
                    ));
                }
            }
            (LossKind::Mse, Some(Target::Values(t))) => {
                if t.len() != n * classes {
                    return Err(ExecError::BadBatch(
                        "target length differs from the prediction size",
                        t.len(),
                    ));
                }
                if t.iter().any(|v| !v.is_finite()) {
                    return Err(ExecError::NonFinite("the targets"));
                }
            }
            _ => {
                return Err(ExecError::BadBatch(
                    "target kind does not match the loss",
                    0,
                ))
            }
        }
        if n < 2
            && g.nodes.iter().any(|nd| {
                matches!(
                    nd.op,
                    NodeOp::BatchNorm {
                        train: true,
                        hw: 1,
                        ..
                    }
                )
            })
        {
            return Err(ExecError::BadBatch(
                "batch norm in training mode needs more than one value per channel",
                n,
            ));
        }
        Ok(n)
    }

    /// One training step (forward, loss, backward, update) on `n = x.len() / sample_size` samples.
    /// Non-finite input or loss rejects the step before any weight changes.
    pub fn train_step(
        &mut self,
        arena: &mut [u8],
        x: &[f32],
        target: Target<'_>,
    ) -> Result<StepStats, ExecError> {
        self.train_step_observed(arena, x, target, &mut ())
    }

    /// [`Executor::train_step`] calling `obs` after every instruction.
    pub fn train_step_observed(
        &mut self,
        arena: &mut [u8],
        x: &[f32],
        target: Target<'_>,
        obs: &mut impl Observer,
    ) -> Result<StepStats, ExecError> {
        let n = self.check_batch(x, Some(target), self.plan.batch())?;
        let plan = self.plan;
        let a = self.arena(arena)?;
        let mut stats = StepStats {
            samples: n,
            ..StepStats::default()
        };
        let ctx = StepCtx { t: self.steps + 1 };
        let step_seed = hash2(plan.graph.seed, self.steps as u64);
        let per = plan.graph.input_dims.numel();
        let outs = plan.graph.pred_dims().numel();
        let mb_size = plan.graph.batch;
        let mut loss = 0f64;
        for (eo, ins) in plan.program.iter().enumerate() {
            if ins.placement != Placement::Cpu && ins.placement != self.backend.placement() {
                return Err(ExecError::Placement(ins.placement));
            }
            // This instruction's micro-batch: samples [start, start + n_mb).
            let start = ins.mb as usize * mb_size;
            let n_mb = if ins.phase == Phase::Apply {
                n
            } else {
                n.saturating_sub(start).min(mb_size)
            };
            if n_mb == 0 {
                continue; // a partial batch leaves the last micro-batches empty
            }
            let xs = if ins.phase == Phase::Apply {
                x
            } else {
                &x[start * per..(start + n_mb) * per]
            };
            let eo = eo as Eo;
            if ins.phase == Phase::Loss {
                let t = match target {
                    Target::Classes(y) => Target::Classes(&y[start..start + n_mb]),
                    Target::Values(v) => Target::Values(&v[start * outs..(start + n_mb) * outs]),
                };
                let (l, correct) = run_loss(plan, eo, a, n_mb, t, true, n)?;
                if !l.is_finite() {
                    return Err(ExecError::NonFinite("the loss"));
                }
                loss += l as f64 * n_mb as f64;
                stats.correct += correct;
            } else {
                run_instr(
                    plan,
                    eo,
                    a,
                    ins,
                    n_mb,
                    xs,
                    Mode::Train,
                    RunSeed {
                        seed: step_seed,
                        start,
                    },
                    ctx,
                )?;
            }
            obs.after(eo as usize, ins, a);
        }
        stats.loss = (loss / n as f64) as f32;
        self.steps += 1;
        Ok(stats)
    }

    /// [`Executor::train_step`] for plans with swap instructions ([`Phase::SpillOut`], [`Phase::SpillIn`],
    /// see [`crate::policy::swap`]): their bytes go to and come back from `spill`, keyed by tensor id.
    /// Each swap-in is announced with [`Spill::prefetch`] [`Spill::lookahead`] instructions before it
    /// (at most [`MAX_PREFETCH_LEAD`], never before its swap-out), so a host can read it in the
    /// background. Results are bit-identical to the plain plan's.
    pub fn train_step_spilled(
        &mut self,
        arena: &mut [u8],
        x: &[f32],
        target: Target<'_>,
        spill: &mut dyn Spill,
    ) -> Result<StepStats, ExecError> {
        self.train_step_spilled_observed(arena, x, target, spill, &mut ())
    }

    /// [`Executor::train_step_spilled`] calling `obs` after every instruction.
    pub fn train_step_spilled_observed(
        &mut self,
        arena: &mut [u8],
        x: &[f32],
        target: Target<'_>,
        spill: &mut dyn Spill,
        obs: &mut impl Observer,
    ) -> Result<StepStats, ExecError> {
        let n = self.check_batch(x, Some(target), self.plan.batch())?;
        let plan = self.plan;
        let a = self.arena(arena)?;
        let mut stats = StepStats {
            samples: n,
            ..StepStats::default()
        };
        let ctx = StepCtx { t: self.steps + 1 };
        let step_seed = hash2(plan.graph.seed, self.steps as u64);
        let per = plan.graph.input_dims.numel();
        let outs = plan.graph.pred_dims().numel();
        let mb_size = plan.graph.batch;
        let mb_samples = |mb: u16| n.saturating_sub(mb as usize * mb_size).min(mb_size);
        let ahead = spill.lookahead().min(MAX_PREFETCH_LEAD as usize) as Eo;
        let mut loss = 0f64;
        for (eo, ins) in plan.program.iter().enumerate() {
            let eo = eo as Eo;
            // Announce the swap-ins whose prefetch point is here.
            for j in eo + 1..plan.n_eo().min(eo + 1 + ahead) {
                let next = &plan.program[j as usize];
                if next.phase == Phase::SpillIn
                    && mb_samples(next.mb) > 0
                    && prefetch_point(plan, j, ahead) == Some(eo)
                {
                    let (_, len) = spill_region(plan, j)?;
                    spill.prefetch(next.node as u32, len);
                }
            }
            if ins.placement != Placement::Cpu && ins.placement != self.backend.placement() {
                return Err(ExecError::Placement(ins.placement));
            }
            // This instruction's micro-batch: samples [start, start + n_mb).
            let start = ins.mb as usize * mb_size;
            let n_mb = if ins.phase == Phase::Apply {
                n
            } else {
                mb_samples(ins.mb)
            };
            if n_mb == 0 {
                continue; // a partial batch leaves the last micro-batches empty
            }
            let xs = if ins.phase == Phase::Apply {
                x
            } else {
                &x[start * per..(start + n_mb) * per]
            };
            match ins.phase {
                Phase::SpillOut => {
                    let (off, len) = spill_region(plan, eo)?;
                    spill.write(ins.node as u32, &a[off..off + len])?;
                }
                Phase::SpillIn => {
                    let (off, len) = spill_region(plan, eo)?;
                    spill.read(ins.node as u32, &mut a[off..off + len])?;
                }
                Phase::Loss => {
                    let t = match target {
                        Target::Classes(y) => Target::Classes(&y[start..start + n_mb]),
                        Target::Values(v) => {
                            Target::Values(&v[start * outs..(start + n_mb) * outs])
                        }
                    };
                    let (l, correct) = run_loss(plan, eo, a, n_mb, t, true, n)?;
                    if !l.is_finite() {
                        return Err(ExecError::NonFinite("the loss"));
                    }
                    loss += l as f64 * n_mb as f64;
                    stats.correct += correct;
                }
                _ => run_instr(
                    plan,
                    eo,
                    a,
                    ins,
                    n_mb,
                    xs,
                    Mode::Train,
                    RunSeed {
                        seed: step_seed,
                        start,
                    },
                    ctx,
                )?,
            }
            obs.after(eo as usize, ins, a);
        }
        stats.loss = (loss / n as f64) as f32;
        self.steps += 1;
        Ok(stats)
    }

    /// Forward pass in evaluation mode (BatchNorm uses running statistics, no dropout) and the loss
    /// without derivatives, on at most one micro-batch of samples. Returns the mean loss and the correct
    /// count.
    pub fn evaluate(
        &mut self,
        arena: &mut [u8],
        x: &[f32],
        target: Target<'_>,
    ) -> Result<StepStats, ExecError> {
        let n = self.check_batch(x, Some(target), self.plan.graph.batch)?;
        let plan = self.plan;
        let a = self.arena(arena)?;
        let loss_eo = self.forward(a, x, n)?;
        let (loss, correct) = run_loss(plan, loss_eo, a, n, target, false, n)?;
        Ok(StepStats {
            loss,
            correct,
            samples: n,
        })
    }

    /// Forward pass in evaluation mode on at most one micro-batch; returns the prediction
    /// (`n × outputs`), a slice of the arena.
    pub fn predict<'a>(&mut self, arena: &'a mut [u8], x: &[f32]) -> Result<&'a [f32], ExecError> {
        let n = self.check_batch(x, None, self.plan.graph.batch)?;
        let plan = self.plan;
        let a = self.arena(arena)?;
        let loss_eo = self.forward(a, x, n)?;
        let pred = plan.graph.pred();
        let len = n * plan.graph.pred_dims().numel();
        match plan.region_at(pred, loss_eo) {
            Some((off, _)) => f32s_ro(&a[off..off + 4 * len]),
            None => Err(ExecError::BadPlan("the prediction is not in the arena")),
        }
    }

    /// Runs the first micro-batch's forward instructions in eval mode; returns the loss instruction's
    /// execution order (where the prediction is read).
    fn forward(&mut self, a: &mut [u8], x: &[f32], n: usize) -> Result<Eo, ExecError> {
        let plan = self.plan;
        let ctx = StepCtx {
            t: self.steps.max(1),
        };
        for (eo, ins) in plan.program.iter().enumerate() {
            match (ins.phase, ins.mb) {
                (Phase::Forward, 0) => run_instr(
                    plan,
                    eo as Eo,
                    a,
                    ins,
                    n,
                    x,
                    Mode::Eval,
                    RunSeed { seed: 0, start: 0 },
                    ctx,
                )?,
                (Phase::Loss, 0) => return Ok(eo as Eo),
                // Swap plans only swap in after the loss; earlier, the forward would read stale bytes.
                (Phase::SpillIn, 0) => {
                    return Err(ExecError::BadPlan("a swap-in before the loss"));
                }
                _ => {}
            }
        }
        Err(ExecError::BadPlan("the plan has no loss instruction"))
    }
}

/// Whole tensor `t` as a mutable f32 slice.
fn tensor_mut<'a>(
    plan: &Plan,
    arena: &'a mut [u8],
    t: TensorId,
) -> Result<&'a mut [f32], ExecError> {
    let (off, len) = plan
        .region(t)
        .ok_or(ExecError::Tensor("tensor is not in the arena"))?;
    let s = arena
        .get_mut(off..off + len)
        .ok_or(ExecError::BadPlan("tensor outside the arena"))?;
    f32s(s)
}

/// Farthest ahead of a swap-in that [`Executor::train_step_spilled`] announces it to the spill store.
pub const MAX_PREFETCH_LEAD: Eo = 64;

/// Arena range (offset, bytes) of the whole storage a swap instruction at `eo` moves.
fn spill_region(plan: &Plan, eo: Eo) -> Result<(usize, usize), ExecError> {
    let bad = ExecError::BadPlan("a swap names a tensor that is not in the arena");
    let t = plan.program[eo as usize].spilled().ok_or(bad.clone())?;
    let s = plan.storage_at(t, eo).ok_or(bad.clone())? as usize;
    let (off, len) = (plan.offsets[s], plan.lives[s].bytes);
    if off.checked_add(len).is_none_or(|e| e > plan.arena_bytes) {
        return Err(bad);
    }
    Ok((off, len))
}

/// Where the swap-in at `j` is announced: `ahead` instructions before it, but never before its swap-out
/// (the bytes exist only after it); None when that leaves no instruction in between.
fn prefetch_point(plan: &Plan, j: Eo, ahead: Eo) -> Option<Eo> {
    let t = plan.program[j as usize].spilled()?;
    let gid = plan.group_of.get(t as usize).copied().flatten()? as usize;
    let segs = &plan.segments[gid];
    let k = segs.iter().position(|&(start, _)| start == j)?;
    // The swap-out is the last use of the previous segment.
    let out = k
        .checked_sub(1)
        .map_or(0, |p| plan.lives[segs[p].1 as usize].last + 1);
    let p = j.saturating_sub(ahead).max(out);
    (p < j).then_some(p)
}

/// (offset, bytes) of the first `elems` elements of `t` at `eo`, or (0, 0) for none/external.
fn reg(plan: &Plan, eo: Eo, t: Option<TensorId>, elems: usize) -> (usize, usize) {
    match t.and_then(|t| plan.region_at(t, eo)) {
        Some((off, bytes)) => (off, (elems * 4).min(bytes)),
        None => (0, 0),
    }
}

fn whole(plan: &Plan, eo: Eo, t: Option<TensorId>) -> (usize, usize) {
    t.and_then(|t| plan.region_at(t, eo)).unwrap_or((0, 0))
}

fn same(plan: &Plan, eo: Eo, a: TensorId, b: TensorId) -> bool {
    matches!((plan.region_at(a, eo), plan.region_at(b, eo)), (Some(x), Some(y)) if x.0 == y.0)
}

fn is_ext(plan: &Plan, t: TensorId) -> bool {
    plan.graph.tensors[t as usize].kind == TensorKind::External
}

fn opt_f32(s: &mut [u8]) -> Result<Option<&mut [f32]>, ExecError> {
    if s.is_empty() {
        Ok(None)
    } else {
        f32s(s).map(Some)
    }
}

/// The fused loss on `n` samples; the derivative is normalised by `norm` samples (the whole batch when
/// micro-batching, so the accumulated gradient equals the whole batch's). Returns the micro-batch's mean
/// loss and correct count.
#[allow(clippy::too_many_arguments)]
fn run_loss(
    plan: &Plan,
    eo: Eo,
    a: &mut [u8],
    n: usize,
    target: Target<'_>,
    train: bool,
    norm: usize,
) -> Result<(f32, usize), ExecError> {
    let g = &plan.graph;
    let per = g.pred_dims().numel();
    let pred = g.pred();
    let mismatch = ExecError::BadBatch("target kind does not match the loss", 0);
    if !train {
        let [p] = carve(a, [reg(plan, eo, Some(pred), n * per)])?;
        let p = f32s(p)?;
        return match (g.loss, target) {
            (LossKind::SoftmaxCrossEntropy, Target::Classes(y)) => {
                let (sum, c) = ops::softmax_ce_eval(n, per, p, y);
                Ok((sum / n as f32, c))
            }
            (LossKind::Mse, Target::Values(t)) => Ok((ops::mse_eval(p, t), 0)),
            _ => Err(mismatch),
        };
    }
    let (result, d) = if same(plan, eo, pred, g.d_pred) {
        let [p] = carve(a, [reg(plan, eo, Some(pred), n * per)])?;
        let p = f32s(p)?;
        let r = match (g.loss, target) {
            (LossKind::SoftmaxCrossEntropy, Target::Classes(y)) => {
                ops::softmax_ce_inplace(n, per, p, y)
            }
            (LossKind::Mse, Target::Values(t)) => (ops::mse_inplace(p, t), 0),
            _ => return Err(mismatch),
        };
        (r, p)
    } else {
        let [p, d] = carve(
            a,
            [
                reg(plan, eo, Some(pred), n * per),
                reg(plan, eo, Some(g.d_pred), n * per),
            ],
        )?;
        let (p, d) = (f32s(p)?, f32s(d)?);
        let r = match (g.loss, target) {
            (LossKind::SoftmaxCrossEntropy, Target::Classes(y)) => ops::softmax_ce(n, per, p, y, d),
            (LossKind::Mse, Target::Values(t)) => (ops::mse(p, t, d), 0),
            _ => return Err(mismatch),
        };
        (r, d)
    };
    if norm != n {
        ops::scale(n as f32 / norm as f32, d);
    }
    Ok(result)
}

#[allow(clippy::too_many_arguments)]
fn run_instr(
    plan: &Plan,
    eo: Eo,
    a: &mut [u8],
    ins: &Instr,
    n: usize,
    xext: &[f32],
    mode: Mode,
    rs: RunSeed,
    ctx: StepCtx,
) -> Result<(), ExecError> {
    if ins.node == LOSS_NODE {
        return Err(ExecError::BadPlan("loss instruction in the wrong place"));
    }
    if ins.packed().is_some() {
        return convert_half(plan, eo, a, ins); // `node` is a tensor id
    }
    let node: &Node = plan
        .graph
        .nodes
        .get(ins.node as usize)
        .ok_or(ExecError::BadPlan("node index out of range"))?;
    match ins.phase {
        Phase::Forward => forward(plan, eo, a, node, n, xext, mode, rs),
        Phase::Recompute => forward(plan, eo, a, node, n, xext, Mode::Recompute, rs),
        // Micro-batches after the first add to the gradient of the first.
        Phase::GradW => grad_w(plan, eo, a, node, n, xext, ins.mb > 0),
        Phase::GradX => grad_x(plan, eo, a, node, n, rs),
        Phase::Apply => apply(plan, eo, a, node, ctx),
        Phase::Loss => Err(ExecError::BadPlan("loss instruction in the wrong place")),
        Phase::SpillOut | Phase::SpillIn => Err(ExecError::BadPlan(
            "a swap instruction needs a spill store (Executor::train_step_spilled)",
        )),
        Phase::Pack | Phase::Unpack => Err(ExecError::BadPlan("pack/unpack dispatched as an op")),
    }
}

/// fp16 storage: [`Phase::Pack`] rounds the f32 tensor to IEEE half (nearest-even, saturating at ±65504
/// so a large activation never turns into infinity) into its half copy; [`Phase::Unpack`] widens it back.
fn convert_half(plan: &Plan, eo: Eo, a: &mut [u8], ins: &Instr) -> Result<(), ExecError> {
    let bad = ExecError::BadPlan("a pack/unpack names a tensor without a half copy in the arena");
    let x = ins.packed().ok_or(bad.clone())?;
    let h = plan.graph.half_of(x).ok_or(bad.clone())?;
    let (xr, hr) = (
        plan.region_at(x, eo).ok_or(bad.clone())?,
        plan.region_at(h, eo).ok_or(bad)?,
    );
    let elems = (xr.1 / 4).min(hr.1 / 2);
    let [xb, hb] = carve(a, [(xr.0, elems * 4), (hr.0, elems * 2)])?;
    if ins.phase == Phase::Pack {
        for (v, o) in xb.chunks_exact(4).zip(hb.chunks_exact_mut(2)) {
            let v = f32::from_le_bytes([v[0], v[1], v[2], v[3]]).clamp(-65504.0, 65504.0);
            o.copy_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes());
        }
    } else {
        for (v, o) in hb.chunks_exact(2).zip(xb.chunks_exact_mut(4)) {
            let v = half::f16::from_bits(u16::from_le_bytes([v[0], v[1]])).to_f32();
            o.copy_from_slice(&v.to_le_bytes());
        }
    }
    Ok(())
}

/// The input slice of a node: from the arena, or the host's batch for the model input.
fn input<'a>(
    plan: &Plan,
    t: TensorId,
    buf: &'a mut [u8],
    xext: &'a [f32],
    elems: usize,
) -> Result<&'a [f32], ExecError> {
    if is_ext(plan, t) {
        xext.get(..elems).ok_or(ExecError::BadBatch(
            "input shorter than the model input",
            xext.len(),
        ))
    } else {
        Ok(f32s(buf)?)
    }
}

#[allow(clippy::too_many_arguments)]
fn forward(
    plan: &Plan,
    eo: Eo,
    a: &mut [u8],
    node: &Node,
    n: usize,
    xext: &[f32],
    mode: Mode,
    rs: RunSeed,
) -> Result<(), ExecError> {
    let xin = node.inputs[0];
    let in_elems = n * node.in_dims[0].numel();
    let out_elems = n * node.out_dims.numel();
    let w = node.params.first().map(|p| p.value);
    let b = node.params.get(1).map(|p| p.value);
    let s = node.scratch[scratch_slot::FWD];
    match &node.op {
        NodeOp::Linear { .. } | NodeOp::Conv(_) => {
            let [xb, wb, bb, yb, sb] = carve(
                a,
                [
                    reg(plan, eo, Some(xin), in_elems),
                    whole(plan, eo, w),
                    whole(plan, eo, b),
                    reg(plan, eo, Some(node.out), out_elems),
                    whole(plan, eo, s),
                ],
            )?;
            let x = input(plan, xin, xb, xext, in_elems)?;
            let (w, b, y, s) = (f32s(wb)?, opt_f32(bb)?.map(|b| &*b), f32s(yb)?, f32s(sb)?);
            match &node.op {
                NodeOp::Linear { fin, fout } => ops::linear_fwd(n, *fin, *fout, x, w, b, y, s),
                NodeOp::Conv(g) => ops::conv_fwd(g, n, x, w, b, y, s),
                _ => return Err(ExecError::BadPlan("not a linear or convolution layer")),
            }
        }
        NodeOp::MaxPool(g) => {
            let [xb, yb, ib] = carve(
                a,
                [
                    reg(plan, eo, Some(xin), in_elems),
                    reg(plan, eo, Some(node.out), out_elems),
                    reg(plan, eo, node.saved.first().copied(), out_elems),
                ],
            )?;
            let x = input(plan, xin, xb, xext, in_elems)?;
            ops::maxpool_fwd(g, n, x, f32s(yb)?, u32s(ib)?);
        }
        NodeOp::AvgPool(g) => {
            let [xb, yb] = carve(
                a,
                [
                    reg(plan, eo, Some(xin), in_elems),
                    reg(plan, eo, Some(node.out), out_elems),
                ],
            )?;
            let x = input(plan, xin, xb, xext, in_elems)?;
            ops::avgpool_fwd(g, n, x, f32s(yb)?);
        }
        NodeOp::GlobalAvgPool { c, hw } => {
            let [xb, yb] = carve(
                a,
                [
                    reg(plan, eo, Some(xin), in_elems),
                    reg(plan, eo, Some(node.out), out_elems),
                ],
            )?;
            let x = input(plan, xin, xb, xext, in_elems)?;
            ops::global_avgpool_fwd(n, *c, *hw, x, f32s(yb)?);
        }
        NodeOp::Act(act) => {
            if same(plan, eo, xin, node.out) {
                let [yb] = carve(a, [reg(plan, eo, Some(node.out), out_elems)])?;
                ops::act_fwd_inplace(*act, f32s(yb)?);
            } else {
                let [xb, yb] = carve(
                    a,
                    [
                        reg(plan, eo, Some(xin), in_elems),
                        reg(plan, eo, Some(node.out), out_elems),
                    ],
                )?;
                let x = input(plan, xin, xb, xext, in_elems)?;
                ops::act_fwd(*act, x, f32s(yb)?);
            }
        }
        NodeOp::Dropout { p } => {
            let seed = hash2(rs.seed, node.layer as u64);
            let p = if mode == Mode::Eval { 0.0 } else { *p };
            let per = node.out_dims.numel();
            if same(plan, eo, xin, node.out) {
                let [yb] = carve(a, [reg(plan, eo, Some(node.out), out_elems)])?;
                // One mask per sample, keyed by its index in the whole batch: micro-batching draws the
                // same masks as the whole batch.
                for (s, y) in f32s(yb)?.chunks_exact_mut(per).enumerate() {
                    ops::dropout_fwd_inplace(p, hash2(seed, (rs.start + s) as u64), y);
                }
            } else {
                let [xb, yb] = carve(
                    a,
                    [
                        reg(plan, eo, Some(xin), in_elems),
                        reg(plan, eo, Some(node.out), out_elems),
                    ],
                )?;
                let x = input(plan, xin, xb, xext, in_elems)?;
                for (s, (x, y)) in x
                    .chunks_exact(per)
                    .zip(f32s(yb)?.chunks_exact_mut(per))
                    .enumerate()
                {
                    ops::dropout_fwd(p, hash2(seed, (rs.start + s) as u64), x, y);
                }
            }
        }
        NodeOp::View => {
            // Same bytes as the input: either merged (nothing to do) or the input is external and the
            // output is external too. A view that could not merge would be a planner bug.
            if !is_ext(plan, node.out) && !same(plan, eo, xin, node.out) {
                return Err(ExecError::BadPlan("a view is not merged with its input"));
            }
        }
        NodeOp::Add => {
            let bin = node.inputs[1];
            if same(plan, eo, xin, node.out) {
                let [yb, bb] = carve(
                    a,
                    [
                        reg(plan, eo, Some(node.out), out_elems),
                        reg(plan, eo, Some(bin), in_elems),
                    ],
                )?;
                let bx = input(plan, bin, bb, xext, in_elems)?;
                ops::add_fwd_inplace(f32s(yb)?, bx);
            } else {
                let [ab, bb, yb] = carve(
                    a,
                    [
                        reg(plan, eo, Some(xin), in_elems),
                        reg(plan, eo, Some(bin), in_elems),
                        reg(plan, eo, Some(node.out), out_elems),
                    ],
                )?;
                let ax = input(plan, xin, ab, xext, in_elems)?;
                // Only one input can be the external batch, so a second borrow of `xext` is fine.
                let bx = input(plan, bin, bb, xext, in_elems)?;
                ops::add_fwd(ax, bx, f32s(yb)?);
            }
        }
        NodeOp::BatchNorm {
            c,
            hw,
            eps,
            momentum,
            train,
        } => {
            let [xb, gb, bb, rmb, rvb, yb, mb, ib] = carve(
                a,
                [
                    reg(plan, eo, Some(xin), in_elems),
                    whole(plan, eo, w),
                    whole(plan, eo, b),
                    whole(plan, eo, node.stats.first().copied()),
                    whole(plan, eo, node.stats.get(1).copied()),
                    reg(plan, eo, Some(node.out), out_elems),
                    whole(plan, eo, node.saved.first().copied()),
                    whole(plan, eo, node.saved.get(1).copied()),
                ],
            )?;
            let x = input(plan, xin, xb, xext, in_elems)?;
            if *train && mode == Mode::Recompute {
                ops::bn_fwd_recompute(
                    n,
                    *c,
                    *hw,
                    x,
                    f32s(gb)?,
                    f32s(bb)?,
                    f32s(mb)?,
                    f32s(ib)?,
                    f32s(yb)?,
                );
            } else if *train && mode == Mode::Train {
                ops::bn_fwd_train(
                    n,
                    *c,
                    *hw,
                    x,
                    f32s(gb)?,
                    f32s(bb)?,
                    f32s(yb)?,
                    f32s(mb)?,
                    f32s(ib)?,
                    f32s(rmb)?,
                    f32s(rvb)?,
                    *momentum,
                    *eps,
                );
            } else {
                ops::bn_fwd_eval(
                    n,
                    *c,
                    *hw,
                    x,
                    f32s(gb)?,
                    f32s(bb)?,
                    f32s(rmb)?,
                    f32s(rvb)?,
                    *eps,
                    f32s(yb)?,
                );
            }
        }
    }
    Ok(())
}

fn grad_w(
    plan: &Plan,
    eo: Eo,
    a: &mut [u8],
    node: &Node,
    n: usize,
    xext: &[f32],
    acc_w: bool,
) -> Result<(), ExecError> {
    let xin = node.inputs[0];
    let in_elems = n * node.in_dims[0].numel();
    let out_elems = n * node.out_dims.numel();
    let dw = node.params.first().and_then(|p| p.grad);
    let db = node.params.get(1).and_then(|p| p.grad);
    let s = node.scratch[scratch_slot::GRAD_W];
    let dy = node
        .d_out
        .ok_or(ExecError::BadPlan("gradient without an output derivative"))?;
    match &node.op {
        NodeOp::Linear { .. } | NodeOp::Conv(_) => {
            let [xb, dyb, dwb, dbb, sb] = carve(
                a,
                [
                    reg(plan, eo, Some(xin), in_elems),
                    reg(plan, eo, Some(dy), out_elems),
                    whole(plan, eo, dw),
                    whole(plan, eo, db),
                    whole(plan, eo, s),
                ],
            )?;
            let x = input(plan, xin, xb, xext, in_elems)?;
            let (dy, dw, db, s) = (f32s(dyb)?, f32s(dwb)?, opt_f32(dbb)?, f32s(sb)?);
            match &node.op {
                NodeOp::Linear { fin, fout } => {
                    ops::linear_grad_w(n, *fin, *fout, x, dy, dw, db, acc_w, s)
                }
                NodeOp::Conv(g) => ops::conv_grad_w(g, n, x, dy, dw, db, acc_w, s),
                _ => return Err(ExecError::BadPlan("not a linear or convolution layer")),
            }
        }
        NodeOp::BatchNorm { c, hw, .. } => {
            let [xb, dyb, mb, ib, dgb, dbb] = carve(
                a,
                [
                    reg(plan, eo, Some(xin), in_elems),
                    reg(plan, eo, Some(dy), out_elems),
                    whole(plan, eo, node.saved.first().copied()),
                    whole(plan, eo, node.saved.get(1).copied()),
                    whole(plan, eo, dw),
                    whole(plan, eo, db),
                ],
            )?;
            let x = input(plan, xin, xb, xext, in_elems)?;
            ops::bn_grad_w(
                n,
                *c,
                *hw,
                x,
                f32s(dyb)?,
                f32s(mb)?,
                f32s(ib)?,
                f32s(dgb)?,
                f32s(dbb)?,
                acc_w,
            );
        }
        _ => {
            return Err(ExecError::BadPlan(
                "gradient phase on a layer without parameters",
            ))
        }
    }
    Ok(())
}

fn grad_x(
    plan: &Plan,
    eo: Eo,
    a: &mut [u8],
    node: &Node,
    n: usize,
    rs: RunSeed,
) -> Result<(), ExecError> {
    let in_elems = n * node.in_dims[0].numel();
    let out_elems = n * node.out_dims.numel();
    let dy = node.d_out.ok_or(ExecError::BadPlan(
        "derivative without an output derivative",
    ))?;
    let (dx, acc) = match node.d_in.first().copied().flatten() {
        Some(d) => (Some(d.0), d.1),
        None => (None, false),
    };
    let w = node.params.first().map(|p| p.value);
    let s = node.scratch[scratch_slot::GRAD_X];
    match &node.op {
        NodeOp::Linear { .. } | NodeOp::Conv(_) => {
            let [dyb, wb, dxb, sb] = carve(
                a,
                [
                    reg(plan, eo, Some(dy), out_elems),
                    whole(plan, eo, w),
                    reg(plan, eo, dx, in_elems),
                    whole(plan, eo, s),
                ],
            )?;
            let (dy, w, dx, s) = (f32s(dyb)?, f32s(wb)?, f32s(dxb)?, f32s(sb)?);
            match &node.op {
                NodeOp::Linear { fin, fout } => {
                    ops::linear_grad_x(n, *fin, *fout, dy, w, dx, acc, s)
                }
                NodeOp::Conv(g) => ops::conv_grad_x(g, n, dy, w, dx, acc, s),
                _ => return Err(ExecError::BadPlan("not a linear or convolution layer")),
            }
        }
        NodeOp::MaxPool(g) => {
            let [dyb, ib, dxb] = carve(
                a,
                [
                    reg(plan, eo, Some(dy), out_elems),
                    reg(plan, eo, node.saved.first().copied(), out_elems),
                    reg(plan, eo, dx, in_elems),
                ],
            )?;
            ops::maxpool_grad_x(g, n, f32s(dyb)?, u32s(ib)?, f32s(dxb)?, acc);
        }
        NodeOp::AvgPool(g) => {
            let [dyb, dxb] = carve(
                a,
                [
                    reg(plan, eo, Some(dy), out_elems),
                    reg(plan, eo, dx, in_elems),
                ],
            )?;
            ops::avgpool_grad_x(g, n, f32s(dyb)?, f32s(dxb)?, acc);
        }
        NodeOp::GlobalAvgPool { c, hw } => {
            let [dyb, dxb] = carve(
                a,
                [
                    reg(plan, eo, Some(dy), out_elems),
                    reg(plan, eo, dx, in_elems),
                ],
            )?;
            ops::global_avgpool_grad_x(n, *c, *hw, f32s(dyb)?, f32s(dxb)?, acc);
        }
        NodeOp::Act(act) => {
            let dx = dx.ok_or(ExecError::BadPlan("activation derivative without a target"))?;
            if same(plan, eo, dy, dx) {
                let [yb, db] = carve(
                    a,
                    [
                        reg(plan, eo, Some(node.out), out_elems),
                        reg(plan, eo, Some(dx), in_elems),
                    ],
                )?;
                ops::act_grad_inplace(*act, f32s(yb)?, f32s(db)?);
            } else {
                let [yb, dyb, dxb] = carve(
                    a,
                    [
                        reg(plan, eo, Some(node.out), out_elems),
                        reg(plan, eo, Some(dy), out_elems),
                        reg(plan, eo, Some(dx), in_elems),
                    ],
                )?;
                ops::act_grad(*act, f32s(yb)?, f32s(dyb)?, f32s(dxb)?, acc);
            }
        }
        NodeOp::Dropout { p } => {
            let dx = dx.ok_or(ExecError::BadPlan("dropout derivative without a target"))?;
            let seed = hash2(rs.seed, node.layer as u64);
            let per = node.out_dims.numel();
            if same(plan, eo, dy, dx) {
                let [db] = carve(a, [reg(plan, eo, Some(dx), in_elems)])?;
                for (s, d) in f32s(db)?.chunks_exact_mut(per).enumerate() {
                    ops::dropout_grad_inplace(*p, hash2(seed, (rs.start + s) as u64), d);
                }
            } else {
                let [dyb, dxb] = carve(
                    a,
                    [
                        reg(plan, eo, Some(dy), out_elems),
                        reg(plan, eo, Some(dx), in_elems),
                    ],
                )?;
                for (s, (dy, dx)) in f32s(dyb)?
                    .chunks_exact(per)
                    .zip(f32s(dxb)?.chunks_exact_mut(per))
                    .enumerate()
                {
                    ops::dropout_grad(*p, hash2(seed, (rs.start + s) as u64), dy, dx, acc);
                }
            }
        }
        NodeOp::View => {
            let dx = dx.ok_or(ExecError::BadPlan("view derivative without a target"))?;
            if !same(plan, eo, dy, dx) {
                let [dyb, dxb] = carve(
                    a,
                    [
                        reg(plan, eo, Some(dy), out_elems),
                        reg(plan, eo, Some(dx), in_elems),
                    ],
                )?;
                ops::copy_or_acc(f32s(dyb)?, f32s(dxb)?, acc);
            }
        }
        NodeOp::Add => {
            let (db_t, acc_b) = match node.d_in.get(1).copied().flatten() {
                Some(d) => (Some(d.0), d.1),
                None => (None, false),
            };
            // Second input first: the first one may be the output derivative itself (in place).
            if let Some(dbt) = db_t {
                let [dyb, dbb] = carve(
                    a,
                    [
                        reg(plan, eo, Some(dy), out_elems),
                        reg(plan, eo, Some(dbt), in_elems),
                    ],
                )?;
                ops::copy_or_acc(f32s(dyb)?, f32s(dbb)?, acc_b);
            }
            if let Some(dat) = dx {
                if !same(plan, eo, dy, dat) {
                    let [dyb, dab] = carve(
                        a,
                        [
                            reg(plan, eo, Some(dy), out_elems),
                            reg(plan, eo, Some(dat), in_elems),
                        ],
                    )?;
                    ops::copy_or_acc(f32s(dyb)?, f32s(dab)?, acc);
                }
            }
        }
        NodeOp::BatchNorm {
            c, hw, eps, train, ..
        } => {
            let xin = node.inputs[0];
            if *train && dx.is_some_and(|d| same(plan, eo, dy, d)) {
                let [xb, db, mb, ib, gb] = carve(
                    a,
                    [
                        reg(plan, eo, Some(xin), in_elems),
                        reg(plan, eo, Some(dy), out_elems),
                        whole(plan, eo, node.saved.first().copied()),
                        whole(plan, eo, node.saved.get(1).copied()),
                        whole(plan, eo, w),
                    ],
                )?;
                ops::bn_grad_x_inplace(
                    n,
                    *c,
                    *hw,
                    f32s(xb)?,
                    f32s(db)?,
                    f32s(mb)?,
                    f32s(ib)?,
                    f32s(gb)?,
                );
            } else if *train {
                let [xb, dyb, mb, ib, gb, dxb] = carve(
                    a,
                    [
                        reg(plan, eo, Some(xin), in_elems),
                        reg(plan, eo, Some(dy), out_elems),
                        whole(plan, eo, node.saved.first().copied()),
                        whole(plan, eo, node.saved.get(1).copied()),
                        whole(plan, eo, w),
                        reg(plan, eo, dx, in_elems),
                    ],
                )?;
                ops::bn_grad_x(
                    n,
                    *c,
                    *hw,
                    f32s(xb)?,
                    f32s(dyb)?,
                    f32s(mb)?,
                    f32s(ib)?,
                    f32s(gb)?,
                    f32s(dxb)?,
                    acc,
                );
            } else {
                let [dyb, gb, rvb, dxb] = carve(
                    a,
                    [
                        reg(plan, eo, Some(dy), out_elems),
                        whole(plan, eo, w),
                        whole(plan, eo, node.stats.get(1).copied()),
                        reg(plan, eo, dx, in_elems),
                    ],
                )?;
                ops::bn_grad_x_eval(
                    n,
                    *c,
                    *hw,
                    f32s(dyb)?,
                    f32s(gb)?,
                    f32s(rvb)?,
                    *eps,
                    f32s(dxb)?,
                    acc,
                );
            }
        }
    }
    Ok(())
}

fn apply(plan: &Plan, eo: Eo, a: &mut [u8], node: &Node, ctx: StepCtx) -> Result<(), ExecError> {
    let opt = &plan.graph.optimizer;
    for p in &node.params {
        let Some(g) = p.grad else { continue };
        match p.state.as_slice() {
            [] => {
                let [wb, gb] = carve(
                    a,
                    [whole(plan, eo, Some(p.value)), whole(plan, eo, Some(g))],
                )?;
                optim::apply(opt, ctx, f32s(wb)?, f32s(gb)?, &mut []);
            }
            [s0] => {
                let [wb, gb, s0b] = carve(
                    a,
                    [
                        whole(plan, eo, Some(p.value)),
                        whole(plan, eo, Some(g)),
                        whole(plan, eo, Some(*s0)),
                    ],
                )?;
                optim::apply(opt, ctx, f32s(wb)?, f32s(gb)?, &mut [f32s(s0b)?]);
            }
            [s0, s1] => {
                let [wb, gb, s0b, s1b] = carve(
                    a,
                    [
                        whole(plan, eo, Some(p.value)),
                        whole(plan, eo, Some(g)),
                        whole(plan, eo, Some(*s0)),
                        whole(plan, eo, Some(*s1)),
                    ],
                )?;
                optim::apply(
                    opt,
                    ctx,
                    f32s(wb)?,
                    f32s(gb)?,
                    &mut [f32s(s0b)?, f32s(s1b)?],
                );
            }
            _ => {
                return Err(ExecError::BadPlan(
                    "more optimizer state slots than any optimizer uses",
                ))
            }
        }
    }
    Ok(())
}
