//! `Trainer`: model, plan table, arena and samples behind one handle — the same surface as the browser's
//! `Session` (create, add a sample, train steps, predict, set the budget, plan info, export weights),
//! with one difference: the budget is *live*. The trainer plans a ladder of plans for its batch once
//! (`policy::ladder`: Melon's progressive recomputation at one micro-batch, from the smallest plan
//! that exists up to the plain one), and every step runs through `Executor::train_step_adaptive`,
//! which reads the budget from an atomic before every instruction. Another thread that stores a
//! smaller budget there (`set_budget` while a `train_steps` call runs) makes the step switch plans
//! before its next instruction; when that step ends the arena is shrunk to the new plan, so the bytes
//! above it go back to the system within one step. Nothing here decides maths or memory: the plans
//! are the core's, the switches are the core's.
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};

use frugal_core::budget::{Budget, BudgetError};
use frugal_core::exec::{ExecError, Executor, StepStats, Target};
use frugal_core::format::decode_model;
use frugal_core::graph::Graph;
use frugal_core::model::{Dims, LayerKind, LossKind, ModelSpec};
use frugal_core::plan::table::PlanTable;
use frugal_core::plan::{Phase, Plan};
use frugal_core::policy::ladder::{ladder, pick};
use frugal_core::policy::{recompute, CostModel};

use crate::arena::Arena;
use crate::error::Error;
use crate::weights::{self, NamedTensor};
use frugal_host::{check_tensors, load, persistent, SampleError, Samples};

/// Largest batch a trainer accepts (samples per step).
pub const MAX_BATCH: usize = 4096;
/// Most classes a resized head may have.
pub const MAX_CLASSES: u32 = 4096;
/// Most steps one `train_steps` call runs.
pub const MAX_STEPS_PER_CALL: u32 = 1 << 20;
/// Rungs of the plan ladder: budgets evenly spaced from the smallest plan to the plain one.
pub const RUNGS: usize = 9;
/// The live budget's value for "no limit".
pub const UNLIMITED: u64 = u64::MAX;

/// Where a step reads the budget from before every instruction: the live budget a host shares with
/// other threads (an [`AtomicU64`]), or a test's script.
pub trait LiveBudget {
    /// The budget in force now, in bytes (`UNLIMITED`: none).
    fn bytes(&self) -> u64;
}

impl LiveBudget for AtomicU64 {
    fn bytes(&self) -> u64 {
        self.load(Ordering::Acquire)
    }
}

/// How to build a [`Trainer`].
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    /// Samples per step. Default 32.
    pub batch: usize,
    /// Seed of the weight initialisation (before loading weights); `None`: the model's seed.
    pub seed: Option<u64>,
    /// Resize the last layer (a linear layer) to this many classes: a fresh head for transfer learning.
    pub classes: Option<u32>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            batch: 32,
            seed: None,
            classes: None,
        }
    }
}

/// What the trainer runs now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlanInfo {
    /// Bytes of the plan's arena.
    pub arena_bytes: usize,
    /// Bytes allocated for it (arena plus alignment slack); never above the budget.
    pub allocated_bytes: usize,
    /// Most bytes live at any one moment of a step: no layout of this plan can use less.
    pub lower_bound: usize,
    /// The smallest budget any plan of the ladder fits: budgets below it are refused.
    pub floor_bytes: usize,
    /// The budget in force (`None`: unlimited).
    pub budget: Option<usize>,
    /// Samples per micro-batch.
    pub micro_batch: usize,
    /// Micro-batches per step.
    pub micro_batches: usize,
    /// Forward instructions re-run during backward, per step.
    pub recomputes: usize,
    /// This plan's rung in the ladder (0: the smallest) and the number of rungs.
    pub rung: usize,
    /// Rungs in the ladder.
    pub rungs: usize,
    /// Training steps taken.
    pub steps: u32,
    /// Plan switches so far (mid-step, at a step's start or end, and between calls).
    pub switches: u64,
    /// Of those, switches made while a step was in flight (after its first instruction).
    pub mid_step_switches: u64,
}

/// A trainer: model, plan ladder, arena, samples.
pub struct Trainer {
    /// The training executor, kept across steps and calls with its switch scratch sized once (making
    /// them per step costs a quarter of a digits-MLP step). It borrows `table`: declared first, so it
    /// is dropped first; `None` until the first step and after a switch between steps.
    ex: Option<Executor<'static>>,
    spec: ModelSpec,
    /// Boxed: its address never changes while `ex` borrows it, and it is never mutated.
    table: Box<PlanTable>,
    /// Index of the plan in force in `table.entries`.
    current: usize,
    arena: Arena,
    /// Budget applied at the last step or call (`UNLIMITED`: none).
    budget: u64,
    batch: usize,
    per: usize,
    classes: usize,
    /// The samples and each step's batch (shared with the browser host).
    samples: Samples,
    /// The smallest plan's bytes, and each rung's recompute instructions per step (fixed at creation).
    floor: usize,
    recomputes: Vec<usize>,
    /// What [`Trainer::plan_info_if_changed`] reported last: rung, allocated bytes, switches,
    /// mid-step switches, budget.
    published: Option<(usize, usize, u64, u64, u64)>,
    loaded: usize,
    /// Optimizer steps taken (Adam's t).
    steps: u32,
    switches: u64,
    mid_step_switches: u64,
}

/// A zeroed vector, or an out-of-memory error instead of an abort.
fn zeroed<T: Clone + Default>(n: usize) -> Result<Vec<T>, Error> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| Error::OutOfMemory(n.saturating_mul(std::mem::size_of::<T>())))?;
    v.resize(n, T::default());
    Ok(v)
}

/// The ladder for `spec` at `batch`: [`RUNGS`] budgets evenly spaced from the smallest plan
/// progressive recomputation reaches to the plain plan.
fn plan_ladder(spec: &ModelSpec, batch: usize) -> Result<PlanTable, Error> {
    let g = Graph::new(spec, batch)?;
    let cost = CostModel::estimate(&g);
    let plain = Plan::new(g.clone()).needed_bytes();
    let (Ok(least) | Err(least)) = recompute(&g, 1, 0, &cost);
    let least = least.needed_bytes().min(plain);
    let budgets: Vec<usize> = (0..RUNGS)
        .map(|k| least + (plain - least) * k / (RUNGS - 1))
        .collect();
    Ok(ladder(spec, batch, &budgets, &cost)?)
}

/// A budget as the core's `usize` (`UNLIMITED` and anything above `usize::MAX`: no limit).
fn bytes(b: u64) -> usize {
    usize::try_from(b).unwrap_or(usize::MAX)
}

/// The index of `table`'s plan for `budget`, or the budget error naming the smallest feasible one.
pub fn rung_for(table: &PlanTable, budget: u64) -> Result<usize, Error> {
    let e = pick(table, bytes(budget)).ok_or_else(|| {
        Error::Budget(BudgetError::TooSmall {
            needed: floor(table),
            given: bytes(budget),
        })
    })?;
    Ok(index_of(table, &e.plan))
}

fn floor(table: &PlanTable) -> usize {
    table
        .entries
        .iter()
        .map(|e| e.plan.needed_bytes())
        .min()
        .unwrap_or(usize::MAX)
}

fn index_of(table: &PlanTable, plan: &Plan) -> usize {
    table
        .entries
        .iter()
        .position(|e| ptr::eq(&e.plan, plan))
        .expect("the plan is one of the table's")
}

/// Checks a batch a caller gives a trainer: `y.len()` samples (1 to `max`), `x` holding that many
/// inputs of `input`, every input finite, every label below `classes`.
pub fn check_batch(
    x: &[f32],
    y: &[u32],
    max: usize,
    input: Dims,
    classes: usize,
) -> Result<(), Error> {
    let per = input.numel();
    if y.is_empty() || y.len() > max {
        return Err(Error::Argument(
            "labels",
            format!("has {} samples; must be from 1 to {max}", y.len()),
        ));
    }
    if x.len() != y.len().saturating_mul(per) {
        return Err(Error::Argument(
            "input",
            format!(
                "has {} values but {} samples of the model's input {input} need {}",
                x.len(),
                y.len(),
                y.len().saturating_mul(per)
            ),
        ));
    }
    if let Some(i) = x.iter().position(|v| !v.is_finite()) {
        return Err(Error::Argument(
            "input",
            format!("value {i} is {} (must be finite)", x[i]),
        ));
    }
    if let Some(i) = y.iter().position(|&l| l as usize >= classes) {
        return Err(Error::Argument(
            "labels",
            format!(
                "label {i} is {}; must be from 0 to {}",
                y[i],
                classes.saturating_sub(1)
            ),
        ));
    }
    Ok(())
}

/// Mean loss and samples classified correctly over `x`, `y` (checked), evaluated `batch` samples at a
/// time by `eval` (an executor's `evaluate`), the loss weighted by each chunk's samples.
pub fn evaluate_in_batches(
    x: &[f32],
    y: &[u32],
    per: usize,
    batch: usize,
    mut eval: impl FnMut(&[f32], Target<'_>) -> Result<StepStats, ExecError>,
) -> Result<(f32, usize), Error> {
    let (mut loss, mut correct, mut i) = (0f64, 0usize, 0usize);
    while i < y.len() {
        let k = batch.max(1).min(y.len() - i);
        let s = eval(&x[i * per..(i + k) * per], Target::Classes(&y[i..i + k]))?;
        loss += f64::from(s.loss) * k as f64;
        correct += s.correct;
        i += k;
    }
    Ok(((loss / y.len().max(1) as f64) as f32, correct))
}

/// Numerically stable softmax of the logits `z`, in place.
fn softmax(z: &mut [f32]) {
    let max = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for v in z.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in z.iter_mut() {
        *v /= sum;
    }
}

/// Class probabilities for `n` samples of `per` values laid end to end in `x`, written to `out`
/// (`n × classes` values): checks the input (length, finiteness) and the output's length, then asks
/// `logits` for `batch` samples at a time (it writes their logits into the slice it is given) and
/// takes each row's softmax. The f32 and the int8 trainers' `predict_into`.
pub fn predict_in_batches(
    x: &[f32],
    per: usize,
    classes: usize,
    batch: usize,
    out: &mut [f32],
    mut logits: impl FnMut(&[f32], &mut [f32]) -> Result<(), ExecError>,
) -> Result<(), Error> {
    if x.is_empty() || per == 0 || !x.len().is_multiple_of(per) {
        return Err(Error::Argument(
            "input",
            format!(
                "has {} values, not a positive multiple of the model's input size {per}",
                x.len(),
            ),
        ));
    }
    if let Some(i) = x.iter().position(|v| !v.is_finite()) {
        return Err(Error::Argument(
            "input",
            format!("value {i} is {} (must be finite)", x[i]),
        ));
    }
    let n = x.len() / per;
    let want = n.saturating_mul(classes);
    if out.len() != want {
        return Err(Error::Argument(
            "output",
            format!(
                "has {} values but {n} samples × {classes} classes need {want}",
                out.len(),
            ),
        ));
    }
    let mut i = 0;
    while i < n {
        let k = batch.max(1).min(n - i);
        let dst = &mut out[i * classes..(i + k) * classes];
        logits(&x[i * per..(i + k) * per], dst)?;
        for row in dst.chunks_exact_mut(classes.max(1)) {
            softmax(row);
        }
        i += k;
    }
    Ok(())
}

impl Trainer {
    /// A trainer for the binary model `model` (a `.frgm` file) within `budget` bytes (`UNLIMITED`: no
    /// limit). `weights` are safetensors bytes loaded by name over the seeded initialisation (empty:
    /// initialisation only); tensors the model does not have are ignored, a tensor with another shape
    /// is an error.
    pub fn new(model: &[u8], weights: &[u8], budget: u64, opts: Options) -> Result<Trainer, Error> {
        let spec = decode_model(model)?;
        let tensors = if weights.is_empty() {
            Vec::new()
        } else {
            weights::parse(weights).map_err(Error::Weights)?
        };
        Trainer::from_spec(spec, &tensors, budget, opts)
    }

    /// [`Trainer::new`] for a model already decoded (the Python binding parses TOML) and weights
    /// already parsed (`tensors`: loaded by name, as for [`Trainer::new`]).
    pub fn from_spec(
        mut spec: ModelSpec,
        tensors: &[NamedTensor],
        budget: u64,
        opts: Options,
    ) -> Result<Trainer, Error> {
        if spec.loss != LossKind::SoftmaxCrossEntropy {
            return Err(Error::Argument(
                "model",
                "the trainer trains classifiers: the model's loss must be cross_entropy".into(),
            ));
        }
        if opts.batch == 0 || opts.batch > MAX_BATCH {
            return Err(Error::Argument(
                "options.batch",
                format!("must be from 1 to {MAX_BATCH}, got {}", opts.batch),
            ));
        }
        if let Some(c) = opts.classes {
            if c == 0 || c > MAX_CLASSES {
                return Err(Error::Argument(
                    "options.classes",
                    format!("must be from 1 to {MAX_CLASSES}, got {c}"),
                ));
            }
            match spec.layers.last_mut().map(|l| &mut l.kind) {
                Some(LayerKind::Linear { out, .. }) => *out = c,
                _ => {
                    return Err(Error::Argument(
                        "options.classes",
                        "the model's last layer must be linear to resize it".into(),
                    ))
                }
            }
        }
        let table = Box::new(plan_ladder(&spec, opts.batch)?);
        let current = rung_for(&table, budget)?;
        let plan = &table.entries[current].plan;
        let per = spec.input.numel();
        let classes = plan.graph.pred_dims().numel();
        let need = plan.needed_bytes();
        let mut arena = Arena::zeroed(need).map_err(Error::OutOfMemory)?;
        let seed = opts.seed.unwrap_or(spec.seed);
        let mut ex = Executor::new(plan, arena.as_slice())?;
        ex.init_params(arena.as_mut_slice(), seed)?;
        let loaded = load(&mut ex, arena.as_mut_slice(), tensors)?;
        drop(ex);
        let recomputes = table
            .entries
            .iter()
            .map(|e| {
                e.plan
                    .program
                    .iter()
                    .filter(|i| i.phase == Phase::Recompute)
                    .count()
            })
            .collect();
        Ok(Trainer {
            ex: None,
            samples: Samples::new(per, classes, opts.batch),
            floor: floor(&table),
            recomputes,
            published: None,
            spec,
            table,
            current,
            arena,
            budget,
            batch: opts.batch,
            per,
            classes,
            loaded,
            steps: 0,
            switches: 0,
            mid_step_switches: 0,
        })
    }

    /// The ladder of plans (fixed at creation).
    pub fn table(&self) -> &PlanTable {
        &self.table
    }

    /// Adds one training sample: `x` of the model's input size, finite, and a class label.
    pub fn add_sample(&mut self, x: &[f32], label: u32) -> Result<(), Error> {
        self.samples.add(x, label).map_err(|e| match e {
            SampleError::Length { got, per } => Error::Argument(
                "input",
                format!(
                    "has {got} values but the model's input {} has {per}",
                    self.spec.input
                ),
            ),
            SampleError::NonFinite { index, value } => Error::Argument(
                "input",
                format!("value {index} is {value} (must be finite)"),
            ),
            SampleError::Label { label, classes } => Error::Argument(
                "label",
                format!("must be from 0 to {}, got {label}", classes - 1),
            ),
            SampleError::OutOfMemory(n) => Error::OutOfMemory(n),
        })
    }

    /// Forgets all samples (the weights stay).
    pub fn clear_samples(&mut self) {
        self.samples.clear();
    }

    /// Runs `n` training steps, appending their losses to `losses` (see [`Trainer::train_step`]). A
    /// failing step ends the call; earlier steps stand.
    pub fn train_steps(
        &mut self,
        n: u32,
        live: &impl LiveBudget,
        losses: &mut Vec<f32>,
    ) -> Result<(), Error> {
        if n > MAX_STEPS_PER_CALL {
            return Err(Error::Argument(
                "steps",
                format!("at most {MAX_STEPS_PER_CALL} steps per call, got {n}"),
            ));
        }
        self.ready()?;
        losses
            .try_reserve(n as usize)
            .map_err(|_| Error::OutOfMemory(n as usize * 4))?;
        for _ in 0..n {
            losses.push(self.train_step(live)?);
        }
        Ok(())
    }

    /// One training step under the budget `live` holds (`UNLIMITED`: none), read before every
    /// instruction, so a store from another thread takes effect in the step in flight; returns its
    /// mean loss. Sample order as the browser's `Session::train_steps`: with at most `batch` samples
    /// every step trains on all of them; with more, each step trains on the `batch` samples after the
    /// previous step's (wrapping around). A budget below every plan fails the step
    /// (`Error::Budget`); callers check budgets with [`rung_for`] before storing them.
    pub fn train_step(&mut self, live: &impl LiveBudget) -> Result<f32, Error> {
        self.ready()?;
        self.step(live, None)
    }

    /// One training step on the batch `x` (`n` samples laid end to end, 1 ≤ `n` ≤ the trainer's
    /// batch) with labels `y`, read in place (the sample store is not touched); otherwise as
    /// [`Trainer::train_step`]. Inputs must be finite and labels below the number of classes.
    pub fn train_batch(
        &mut self,
        x: &[f32],
        y: &[u32],
        live: &impl LiveBudget,
    ) -> Result<f32, Error> {
        self.check_batch(x, y, self.batch)?;
        self.step(live, Some((x, y)))
    }

    /// Mean loss and samples classified correctly over `x` (any number of samples ≥ 1, laid end to
    /// end) with labels `y`, in the plan in force (no update).
    pub fn evaluate(&mut self, x: &[f32], y: &[u32]) -> Result<(f32, usize), Error> {
        self.check_batch(x, y, usize::MAX)?;
        let plan = &self.table.entries[self.current].plan;
        let mb = plan.graph.batch;
        let mut ex = Executor::new(plan, self.arena.as_slice())?;
        ex.set_steps(self.steps);
        let arena = self.arena.as_mut_slice();
        evaluate_in_batches(x, y, self.per, mb, |x, t| ex.evaluate(arena, x, t))
    }

    /// Checks a batch given by the caller (see [`check_batch`]).
    fn check_batch(&self, x: &[f32], y: &[u32], max: usize) -> Result<(), Error> {
        check_batch(x, y, max, self.spec.input, self.classes)
    }

    /// Whether the trainer can train: it has samples.
    pub fn ready(&self) -> Result<(), Error> {
        if self.samples.is_empty() {
            return Err(Error::Argument(
                "train_steps",
                "there are no samples: add some with add_sample first".into(),
            ));
        }
        Ok(())
    }

    /// One adaptive step: grows the arena first when the budget now allows a larger plan, runs the
    /// step reading `live` before every instruction, then shrinks the arena to the plan in force.
    /// `batch`: the caller's batch, else the sample store's next one.
    fn step(
        &mut self,
        live: &impl LiveBudget,
        batch: Option<(&[f32], &[u32])>,
    ) -> Result<f32, Error> {
        let b = live.bytes();
        let want = rung_for(&self.table, b)?;
        let want_bytes = self.table.entries[want].plan.needed_bytes();
        if want_bytes > self.arena.len() {
            // A rise: room for the larger plan, which the step switches to before its first
            // instruction (only the persistent tensors are live there).
            self.arena.resize(want_bytes).map_err(Error::OutOfMemory)?;
        }
        // Borrowed from the sample store (copied only when the window wraps past its end).
        let (x, y) = match batch {
            Some(b) => b,
            None => self.samples.next_batch(),
        };
        // SAFETY: `table` is a Box that is never mutated, moved out of or replaced after `new`, so the
        // PlanTable stays at this address and unchanged for the trainer's life; the only references
        // made from this one live in `self.ex` (and locals of this call), which is declared before
        // `table` and so dropped before it. The 'static lifetime never leaves the trainer.
        let table: &'static PlanTable = unsafe { &*(self.table.as_ref() as *const PlanTable) };
        let mut ex = match self.ex.take() {
            Some(ex) => ex,
            None => {
                let mut ex =
                    Executor::new(&table.entries[self.current].plan, self.arena.as_slice())?;
                ex.set_steps(self.steps);
                ex.prepare_adaptive(table);
                ex
            }
        };
        let start = ex.plan();
        // The budget as last reported, the plan seen at the last instruction and where the last
        // report was made: a plan change seen after a report made at eo > 0 is a mid-step switch.
        let mut reported: Option<u64> = None;
        let mut report_eo = 0usize;
        let mut seen: *const Plan = start;
        let mut mid = 0u64;
        let mut budget_at = |eo: usize, p: &Plan| {
            if !ptr::eq(p, seen) {
                mid += u64::from(report_eo > 0);
                seen = p;
            }
            let now = live.bytes();
            if reported == Some(now) {
                return None;
            }
            reported = Some(now);
            report_eo = eo;
            Some(Budget::new(bytes(now)))
        };
        let r = ex.train_step_adaptive(
            self.arena.as_mut_slice(),
            x,
            Target::Classes(y),
            table,
            &mut budget_at,
            &mut (),
        );
        let end = index_of(table, ex.plan());
        let end_changed = !ptr::eq(ex.plan(), seen);
        self.steps = ex.steps();
        self.current = end;
        self.ex = Some(ex);
        let (stats, ad) = r?; // a failed step stopped where it was: its plan is the one in force
        if end_changed && !ad.switched_after {
            mid += u64::from(report_eo > 0);
        }
        self.switches += u64::from(ad.switches) + u64::from(ad.switched_after);
        self.mid_step_switches += mid;
        self.budget = reported.unwrap_or(b);
        self.shrink_to_plan();
        Ok(stats.loss)
    }

    /// Gives back the arena bytes above the plan in force. Shrinking keeps the bytes below the new
    /// length where they are, so the plan's tensors stay valid; a failed shrink keeps the larger
    /// block, which is still correct.
    fn shrink_to_plan(&mut self) {
        let need = self.table.entries[self.current].plan.needed_bytes();
        if self.arena.len() > need {
            let _ = self.arena.resize(need);
        }
    }

    /// Class probabilities (softmax of the model's output) for `n` samples laid end to end, written to
    /// `out` (`n × classes` values).
    pub fn predict_into(&mut self, x: &[f32], out: &mut [f32]) -> Result<(), Error> {
        let plan = &self.table.entries[self.current].plan;
        let mut ex = Executor::new(plan, self.arena.as_slice())?;
        ex.set_steps(self.steps);
        let arena = self.arena.as_mut_slice();
        predict_in_batches(
            x,
            self.per,
            self.classes,
            plan.graph.batch,
            out,
            |x, dst| {
                for (d, &z) in dst.iter_mut().zip(ex.predict(arena, x)?) {
                    *d = z;
                }
                Ok(())
            },
        )
    }

    /// [`Trainer::predict_into`] into a new vector.
    pub fn predict(&mut self, x: &[f32]) -> Result<Vec<f32>, Error> {
        let n = x.len() / self.per.max(1);
        let mut out = zeroed::<f32>(n.saturating_mul(self.classes))?;
        self.predict_into(x, &mut out)?;
        Ok(out)
    }

    /// Applies `budget` now, between steps: switches to the ladder's plan for it (moving the
    /// persistent tensors) and resizes the arena to that plan. A budget below every plan is refused
    /// with the smallest one that works, and the trainer keeps its plan.
    pub fn set_budget(&mut self, budget: u64) -> Result<(), Error> {
        let to = rung_for(&self.table, budget)?;
        self.switch_at_rest(to)?;
        self.budget = budget;
        Ok(())
    }

    /// Moves to plan `to` between steps (only the persistent tensors are live). Every plan of the
    /// ladder has the same graph, so a tensor id names the same tensor in both.
    fn switch_at_rest(&mut self, to: usize) -> Result<(), Error> {
        let need = self.table.entries[to].plan.needed_bytes();
        if to == self.current {
            self.shrink_to_plan();
            return Ok(());
        }
        let from = &self.table.entries[self.current].plan;
        let ids = persistent(&from.graph);
        let total: usize = ids
            .iter()
            .map(|&t| from.graph.tensors[t as usize].bytes / 4)
            .sum();
        let mut saved: Vec<f32> = Vec::new();
        saved
            .try_reserve_exact(total)
            .map_err(|_| Error::OutOfMemory(total * 4))?;
        let ex = Executor::new(from, self.arena.as_slice())?;
        for &t in &ids {
            saved.extend_from_slice(ex.read(self.arena.as_mut_slice(), t)?);
        }
        self.arena.resize(need).map_err(Error::OutOfMemory)?;
        let plan = &self.table.entries[to].plan;
        let mut ex = Executor::new(plan, self.arena.as_slice())?;
        let mut at = 0;
        for &t in &ids {
            let len = plan.graph.tensors[t as usize].bytes / 4;
            let src = saved
                .get(at..at + len)
                .ok_or(Error::Exec(ExecError::Tensor("saved state is short")))?;
            ex.write(self.arena.as_mut_slice(), t, src)?;
            at += len;
        }
        self.current = to;
        self.switches += 1;
        self.ex = None; // its plan was the old one
        Ok(())
    }

    /// The plan in force.
    pub fn plan_info(&self) -> PlanInfo {
        let p = &self.table.entries[self.current].plan;
        PlanInfo {
            arena_bytes: p.arena_bytes,
            allocated_bytes: self.arena.len(),
            lower_bound: p.lower_bound,
            floor_bytes: self.floor,
            budget: (self.budget != UNLIMITED).then(|| bytes(self.budget)),
            micro_batch: p.graph.batch,
            micro_batches: p.micro_batches as usize,
            recomputes: self.recomputes[self.current],
            rung: self.current,
            rungs: self.table.entries.len(),
            steps: self.steps,
            switches: self.switches,
            mid_step_switches: self.mid_step_switches,
        }
    }

    /// [`Trainer::plan_info`] when anything in it but `steps` changed since the last call that
    /// returned one (the first call always does): the plan, the arena's size, the switches or the
    /// budget. Lets a host republish the snapshot only when the plan changes.
    pub fn plan_info_if_changed(&mut self) -> Option<PlanInfo> {
        let key = (
            self.current,
            self.arena.len(),
            self.switches,
            self.mid_step_switches,
            self.budget,
        );
        if self.published == Some(key) {
            return None;
        }
        self.published = Some(key);
        Some(self.plan_info())
    }

    /// The parameters and statistics as F32 safetensors bytes (PyTorch `state_dict` names).
    pub fn export_weights(&mut self) -> Result<Vec<u8>, Error> {
        weights::serialize(&self.state()?).map_err(Error::Weights)
    }

    /// The parameters and statistics (PyTorch `state_dict` names, the model's order: layer by layer,
    /// parameters then statistics) with their shapes and values.
    pub fn state(&mut self) -> Result<Vec<NamedTensor>, Error> {
        let plan = &self.table.entries[self.current].plan;
        let ex = Executor::new(plan, self.arena.as_slice())?;
        let mut tensors: Vec<NamedTensor> = Vec::new();
        for (name, shape, t) in ex.state_tensors() {
            let v = ex.read(self.arena.as_mut_slice(), t)?.to_vec();
            tensors.push((name, shape, v));
        }
        Ok(tensors)
    }

    /// Writes `tensors` (as [`Trainer::state`] names them) into the model's parameters and
    /// statistics; returns how many. Every tensor is checked (a name the model lacks, a shape that
    /// differs, a value that is not finite) before any is written, so a refused call changes nothing.
    pub fn load_state(&mut self, tensors: &[NamedTensor]) -> Result<usize, Error> {
        let plan = &self.table.entries[self.current].plan;
        let mut ex = Executor::new(plan, self.arena.as_slice())?;
        let known: Vec<(String, Vec<usize>)> = ex.state_tensors().map(|(n, s, _)| (n, s)).collect();
        check_tensors(&known, tensors).map_err(Error::Weights)?;
        Ok(load(&mut ex, self.arena.as_mut_slice(), tensors)?)
    }

    /// The model the trainer trains.
    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// The budget the trainer applied last (`UNLIMITED`: none).
    pub fn budget(&self) -> u64 {
        self.budget
    }
    /// Samples added so far.
    pub fn sample_count(&self) -> usize {
        self.samples.len()
    }
    /// Classes the model predicts.
    pub fn classes(&self) -> usize {
        self.classes
    }
    /// Values per input sample.
    pub fn input_size(&self) -> usize {
        self.per
    }
    /// Tensors loaded from the weights bytes at creation.
    pub fn loaded_tensors(&self) -> usize {
        self.loaded
    }
    /// Training steps taken.
    pub fn steps(&self) -> u32 {
        self.steps
    }
    /// Samples per step.
    pub fn batch(&self) -> usize {
        self.batch
    }
}

impl std::fmt::Debug for Trainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer")
            .field("batch", &self.batch)
            .field("samples", &self.samples.len())
            .field("plan", &self.plan_info())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    const MLP: &[u8] = include_bytes!("../../../examples/digits-mlp.frgm");
    const TRAIN_X: &[u8] = include_bytes!("../../../data/digits/digits-train-images.idx");
    const TRAIN_Y: &[u8] = include_bytes!("../../../data/digits/digits-train-labels.idx");
    const TEST_X: &[u8] = include_bytes!("../../../data/digits/digits-test-images.idx");
    const TEST_Y: &[u8] = include_bytes!("../../../data/digits/digits-test-labels.idx");

    /// IDX digits scaled 0..16 → [0, 1] (16-byte image header, 8-byte label header).
    fn digits(x: &[u8], y: &[u8]) -> (Vec<f32>, Vec<u32>) {
        let n = y.len() - 8;
        let xs = x[16..16 + n * 64]
            .iter()
            .map(|&p| p as f32 / 16.0)
            .collect();
        (xs, y[8..].iter().map(|&l| l as u32).collect())
    }

    fn mlp(budget: u64) -> Trainer {
        let opts = Options {
            batch: 32,
            seed: Some(7),
            ..Options::default()
        };
        let mut t = Trainer::new(MLP, &[], budget, opts).unwrap();
        let (x, y) = digits(TRAIN_X, TRAIN_Y);
        for (i, &l) in y.iter().enumerate() {
            t.add_sample(&x[i * 64..(i + 1) * 64], l).unwrap();
        }
        t
    }

    /// A budget script: `high` for the first `at` reads of each step, then `low` (as if another
    /// thread stored `low` while instruction `at - 1` ran).
    struct DropAt {
        at: usize,
        reads: Cell<usize>,
        high: u64,
        low: u64,
    }

    impl LiveBudget for DropAt {
        fn bytes(&self) -> u64 {
            let r = self.reads.get();
            self.reads.set(r + 1);
            if r < self.at {
                self.high
            } else {
                self.low
            }
        }
    }

    fn accuracy(t: &mut Trainer) -> f64 {
        let (x, y) = digits(TEST_X, TEST_Y);
        let p = t.predict(&x).unwrap();
        let right = p
            .chunks(10)
            .zip(&y)
            .filter(|(p, &l)| {
                let best = (0..10).max_by(|&a, &b| p[a].total_cmp(&p[b])).unwrap();
                best == l as usize
            })
            .count();
        right as f64 / y.len() as f64
    }

    #[test]
    fn the_ladder_spans_the_smallest_plan_to_the_plain_one() {
        let t = mlp(UNLIMITED);
        let info = t.plan_info();
        assert!(info.rungs >= 2, "{info:?}");
        assert_eq!(info.rung, info.rungs - 1, "no budget: the largest plan");
        assert_eq!(info.recomputes, 0);
        let e = &t.table().entries;
        assert_eq!(info.floor_bytes, e[0].plan.needed_bytes());
        assert!(e[0]
            .plan
            .program
            .iter()
            .any(|i| i.phase == Phase::Recompute));
        assert_eq!(info.allocated_bytes, e[e.len() - 1].plan.needed_bytes());
    }

    #[test]
    fn a_drop_mid_step_switches_before_the_next_instruction_bit_identically() {
        let floor = mlp(UNLIMITED).plan_info().floor_bytes as u64;
        let big = 4 * floor;
        let mut plain = mlp(big);
        let mut dropped = mlp(big);
        let prog = plain.table().entries.last().unwrap().plan.program.len();
        let live = AtomicU64::new(big);
        for _ in 0..3 {
            plain.train_step(&live).unwrap();
            dropped.train_step(&live).unwrap();
        }
        assert_eq!(dropped.plan_info().rung, 1);
        // The quarter arrives while instruction `prog / 2 - 1` runs.
        let script = DropAt {
            at: prog / 2,
            reads: Cell::new(0),
            high: big,
            low: big / 4,
        };
        let la = plain.train_step(&live).unwrap();
        let lb = dropped.train_step(&script).unwrap();
        let info = dropped.plan_info();
        assert_eq!(info.mid_step_switches, 1, "{info:?}");
        assert_eq!(info.switches, 1);
        assert_eq!(info.rung, 0);
        assert_eq!(info.budget, Some(big as usize / 4));
        assert!(info.recomputes > 0);
        assert_eq!(info.allocated_bytes, info.floor_bytes, "the arena shrank");
        assert!(info.allocated_bytes as u64 <= big / 4);
        // Recomputation is bit-exact: the step and the weights are those of the undisturbed step.
        assert_eq!(la.to_bits(), lb.to_bits());
        assert_eq!(
            plain.export_weights().unwrap(),
            dropped.export_weights().unwrap()
        );
        // Training goes on inside the quarter.
        let quarter = AtomicU64::new(big / 4);
        let lc = dropped.train_step(&quarter).unwrap();
        let ld = plain.train_step(&live).unwrap();
        assert_eq!(lc.to_bits(), ld.to_bits());
        assert_eq!(dropped.plan_info().rung, 0);
    }

    #[test]
    fn trains_the_digits_mlp_past_95_percent_with_the_budget_quartered_midway() {
        let floor = mlp(UNLIMITED).plan_info().floor_bytes as u64;
        let mut t = mlp(4 * floor);
        let live = AtomicU64::new(4 * floor);
        let steps_per_epoch = 1437u32.div_ceil(32);
        let mut losses = Vec::new();
        t.train_steps(5 * steps_per_epoch, &live, &mut losses)
            .unwrap();
        live.store(floor, Ordering::Release);
        t.train_steps(5 * steps_per_epoch, &live, &mut losses)
            .unwrap();
        let info = t.plan_info();
        assert_eq!(info.rung, 0);
        assert!(info.allocated_bytes as u64 <= floor);
        let acc = accuracy(&mut t);
        assert!(acc >= 0.95, "held-out accuracy {acc}");
        assert!(losses.last().unwrap() < &losses[0]);
    }

    #[test]
    fn set_budget_between_steps_moves_the_weights_and_refuses_budgets_below_the_floor() {
        let mut t = mlp(UNLIMITED);
        let live = AtomicU64::new(UNLIMITED);
        t.train_steps(3, &live, &mut Vec::new()).unwrap();
        let (x, _) = digits(TEST_X, TEST_Y);
        let before = t.predict(&x[..640]).unwrap();
        let info = t.plan_info();
        let e = t.set_budget(info.floor_bytes as u64 - 1).unwrap_err();
        assert_eq!(e.needed_bytes(), Some(info.floor_bytes));
        assert_eq!(t.plan_info(), info, "a refused budget changes nothing");
        t.set_budget(info.floor_bytes as u64).unwrap();
        assert_eq!(t.plan_info().rung, 0);
        assert_eq!(t.plan_info().allocated_bytes, info.floor_bytes);
        assert_eq!(t.predict(&x[..640]).unwrap(), before);
        t.set_budget(UNLIMITED).unwrap();
        assert_eq!(t.plan_info().rung, info.rung);
        assert_eq!(t.predict(&x[..640]).unwrap(), before);
        assert_eq!(t.plan_info().switches, 2);
    }

    #[test]
    fn a_rise_between_steps_grows_the_arena_and_takes_the_larger_plan() {
        let floor = mlp(UNLIMITED).plan_info().floor_bytes as u64;
        let mut t = mlp(floor);
        assert_eq!(t.plan_info().rung, 0);
        t.train_step(&AtomicU64::new(UNLIMITED)).unwrap();
        let info = t.plan_info();
        assert_eq!(info.rung, info.rungs - 1);
        assert_eq!(info.recomputes, 0);
        assert_eq!(info.mid_step_switches, 0);
    }

    #[test]
    fn exported_weights_load_back_with_the_same_predictions() {
        let mut a = mlp(UNLIMITED);
        a.train_steps(5, &AtomicU64::new(UNLIMITED), &mut Vec::new())
            .unwrap();
        let w = a.export_weights().unwrap();
        let mut b = Trainer::new(MLP, &w, UNLIMITED, Options::default()).unwrap();
        assert_eq!(b.loaded_tensors(), 6);
        let (x, _) = digits(TEST_X, TEST_Y);
        assert_eq!(a.predict(&x[..320]).unwrap(), b.predict(&x[..320]).unwrap());
    }

    #[test]
    fn a_given_batch_trains_as_the_same_samples_from_the_store() {
        let mut stored = mlp(UNLIMITED);
        let (x, y) = digits(TRAIN_X, TRAIN_Y);
        let mut given = Trainer::new(
            MLP,
            &[],
            UNLIMITED,
            Options {
                batch: 32,
                seed: Some(7),
                ..Options::default()
            },
        )
        .unwrap();
        let live = AtomicU64::new(UNLIMITED);
        for k in 0..3 {
            let a = stored.train_step(&live).unwrap();
            let b = given
                .train_batch(
                    &x[k * 32 * 64..(k + 1) * 32 * 64],
                    &y[k * 32..(k + 1) * 32],
                    &live,
                )
                .unwrap();
            assert_eq!(a.to_bits(), b.to_bits());
        }
        // A partial batch trains too.
        given.train_batch(&x[..5 * 64], &y[..5], &live).unwrap();
        // evaluate counts what predict's arg-max gets right.
        let (tx, ty) = digits(TEST_X, TEST_Y);
        let (loss, correct) = given.evaluate(&tx, &ty).unwrap();
        assert!(loss.is_finite() && loss > 0.0);
        let acc = accuracy(&mut given);
        assert_eq!(correct, (acc * ty.len() as f64).round() as usize);
    }

    #[test]
    fn state_loads_back_and_a_bad_tensor_changes_nothing() {
        let mut a = mlp(UNLIMITED);
        a.train_steps(3, &AtomicU64::new(UNLIMITED), &mut Vec::new())
            .unwrap();
        let w = a.state().unwrap();
        let mut b = Trainer::new(MLP, &[], UNLIMITED, Options::default()).unwrap();
        let before = b.state().unwrap();
        let mut bad = w.clone();
        bad[1].2[3] = f32::INFINITY;
        let e = b.load_state(&bad).unwrap_err().to_string();
        assert!(e.contains("value 3 is inf"), "{e}");
        let mut bad = w.clone();
        bad[2].1 = vec![1, 2];
        assert!(b
            .load_state(&bad)
            .unwrap_err()
            .to_string()
            .contains("shape [1, 2]"));
        let mut bad = w.clone();
        bad[0].0 = "nope.weight".into();
        assert!(b
            .load_state(&bad)
            .unwrap_err()
            .to_string()
            .contains("nope.weight"));
        assert_eq!(b.state().unwrap(), before, "refused loads wrote nothing");
        assert_eq!(b.load_state(&w).unwrap(), w.len());
        assert_eq!(b.state().unwrap(), w);
    }

    #[test]
    fn bad_arguments_are_errors() {
        let mut t = Trainer::new(MLP, &[], UNLIMITED, Options::default()).unwrap();
        let arg = |r: Result<(), Error>| match r {
            Err(Error::Argument(a, why)) => format!("{a}: {why}"),
            other => panic!("expected an argument error, got {other:?}"),
        };
        assert!(arg(t.add_sample(&[0.0; 63], 0)).contains("has 63 values"));
        let mut nan = [0.0f32; 64];
        nan[7] = f32::NAN;
        assert!(arg(t.add_sample(&nan, 0)).contains("value 7 is NaN"));
        assert!(arg(t.add_sample(&[0.0; 64], 10)).contains("from 0 to 9, got 10"));
        let live = AtomicU64::new(UNLIMITED);
        assert!(arg(t.train_step(&live).map(|_| ())).contains("no samples"));
        assert!(arg(t.predict(&[0.0; 65]).map(|_| ())).contains("65 values"));
        assert!(arg(t.predict(&[]).map(|_| ())).contains("0 values"));
        assert!(arg(t.predict_into(&[0.0; 64], &mut [0.0; 9])).contains("need 10"));
        assert_eq!(t.sample_count(), 0, "rejected samples are not kept");
        assert!(arg(t.train_batch(&[0.0; 64], &[], &live).map(|_| ())).contains("from 1 to 32"));
        assert!(arg(t.train_batch(&[0.0; 63], &[1], &live).map(|_| ())).contains("63 values"));
        assert!(arg(t.train_batch(&nan, &[1], &live).map(|_| ())).contains("value 7 is NaN"));
        assert!(arg(t.train_batch(&[0.0; 64], &[10], &live).map(|_| ())).contains("0 to 9"));
        assert!(arg(t.evaluate(&[0.0; 64], &[10]).map(|_| ())).contains("0 to 9"));
        let bad = |o: Options| Trainer::new(MLP, &[], UNLIMITED, o).unwrap_err();
        assert!(matches!(
            bad(Options {
                batch: 0,
                ..Options::default()
            }),
            Error::Argument("options.batch", _)
        ));
        assert!(matches!(
            bad(Options {
                classes: Some(0),
                ..Options::default()
            }),
            Error::Argument("options.classes", _)
        ));
        assert!(matches!(
            Trainer::new(MLP, &[], 1000, Options::default()),
            Err(Error::Budget(_))
        ));
        assert!(matches!(
            Trainer::new(&MLP[..MLP.len() - 1], &[], UNLIMITED, Options::default()),
            Err(Error::Model(_))
        ));
        assert!(matches!(
            Trainer::new(MLP, b"junk", UNLIMITED, Options::default()),
            Err(Error::Weights(_))
        ));
    }
}
