//! Integer training from Python (`precision="int8"` or `"int8-master"`): the int8 graph's plain plan
//! and `Int8Executor`, as `frugal train --precision int8` runs it. The memory policies plan f32 graphs,
//! so there is one plan: a budget below it is refused, never met by recomputation.
use frugal_android::arena::Arena;
use frugal_android::trainer::{check_batch, evaluate_in_batches, predict_in_batches, UNLIMITED};
use frugal_android::{Error, PlanInfo};
use frugal_core::budget::BudgetError;
use frugal_core::exec::int8::Int8Executor;
use frugal_core::exec::Target;
use frugal_core::graph::Graph;
use frugal_core::model::{ModelSpec, Precision};
use frugal_core::plan::Plan;
use frugal_host::{check_tensors, NamedTensor};

/// An int8 trainer: the plan, its arena and the executor with its integer state (exponents, rescale
/// counters), kept across calls.
pub struct Int8Trainer {
    /// Borrows `plan`: declared first, so dropped first.
    ex: Int8Executor<'static>,
    /// Boxed: its address never changes while `ex` borrows it, and it is never mutated.
    plan: Box<Plan>,
    arena: Arena,
    budget: u64,
    batch: usize,
    spec: ModelSpec,
}

fn too_small(needed: usize, given: u64) -> Error {
    Error::Budget(BudgetError::TooSmall {
        needed,
        given: usize::try_from(given).unwrap_or(usize::MAX),
    })
}

impl Int8Trainer {
    /// The int8 plan of `spec` at `batch`, within `budget` bytes, with `tensors` loaded by name over
    /// the seeded initialisation.
    pub fn new(
        spec: ModelSpec,
        tensors: &[NamedTensor],
        budget: u64,
        batch: usize,
        seed: Option<u64>,
        precision: Precision,
    ) -> Result<Int8Trainer, Error> {
        if batch == 0 || batch > frugal_android::trainer::MAX_BATCH {
            return Err(Error::Argument(
                "options.batch",
                format!(
                    "must be from 1 to {}, got {batch}",
                    frugal_android::trainer::MAX_BATCH
                ),
            ));
        }
        let plan = Box::new(Plan::new(Graph::with_precision(&spec, batch, precision)?));
        let need = plan.needed_bytes();
        if need as u64 > budget {
            return Err(too_small(need, budget));
        }
        let mut arena = Arena::zeroed(need).map_err(Error::OutOfMemory)?;
        // SAFETY: `plan` is a Box that is never mutated, moved out of or replaced after this, so the
        // Plan stays at this address and unchanged for the trainer's life; the only reference made
        // from this one lives in `ex`, which is declared before `plan` and so dropped before it.
        let p: &'static Plan = unsafe { &*(plan.as_ref() as *const Plan) };
        let mut ex = Int8Executor::new(p, arena.as_slice())?;
        ex.init_params(arena.as_mut_slice(), seed.unwrap_or(spec.seed))?;
        let mut t = Int8Trainer {
            ex,
            plan,
            arena,
            budget,
            batch,
            spec,
        };
        t.load_state(tensors)?;
        Ok(t)
    }

    /// One integer training step on the caller's batch; its mean loss.
    pub fn train_batch(&mut self, x: &[f32], y: &[u32]) -> Result<f32, Error> {
        check_batch(x, y, self.batch, self.spec.input, self.classes())?;
        let s = self
            .ex
            .train_step(self.arena.as_mut_slice(), x, Target::Classes(y))?;
        Ok(s.loss)
    }

    /// Mean loss and samples classified correctly over `x`, `y`, one batch at a time (no update).
    pub fn evaluate(&mut self, x: &[f32], y: &[u32]) -> Result<(f32, usize), Error> {
        check_batch(x, y, usize::MAX, self.spec.input, self.classes())?;
        let arena = self.arena.as_mut_slice();
        let ex = &mut self.ex;
        evaluate_in_batches(x, y, self.spec.input.numel(), self.batch, |x, t| {
            ex.evaluate(arena, x, t)
        })
    }

    /// The parameters as f32 (dequantised), `state_dict` names, the model's order.
    pub fn state(&mut self) -> Result<Vec<NamedTensor>, Error> {
        let mut out = Vec::new();
        for (name, shape, t) in self.ex.state_tensors() {
            let v = self.ex.read_f32(self.arena.as_mut_slice(), t)?;
            out.push((name, shape, v));
        }
        Ok(out)
    }

    /// Writes `tensors` into the parameters (quantised); every tensor is checked before any is
    /// written. Returns how many.
    pub fn load_state(&mut self, tensors: &[NamedTensor]) -> Result<usize, Error> {
        let known: Vec<_> = self.ex.state_tensors().collect();
        let shapes: Vec<(String, Vec<usize>)> = known
            .iter()
            .map(|(n, s, _)| (n.clone(), s.clone()))
            .collect();
        check_tensors(&shapes, tensors).map_err(Error::Weights)?;
        let mut writes = Vec::with_capacity(tensors.len());
        for (name, _, v) in tensors {
            if let Some((_, _, t)) = known.iter().find(|(n, _, _)| n == name) {
                writes.push((*t, v));
            }
        }
        for (t, v) in &writes {
            self.ex.write_f32(self.arena.as_mut_slice(), *t, v)?;
        }
        Ok(writes.len())
    }

    /// The plan: one rung, no recomputation.
    pub fn plan_info(&self) -> PlanInfo {
        PlanInfo {
            arena_bytes: self.plan.arena_bytes,
            allocated_bytes: self.arena.len(),
            lower_bound: self.plan.lower_bound,
            floor_bytes: self.plan.needed_bytes(),
            budget: (self.budget != UNLIMITED)
                .then(|| usize::try_from(self.budget).unwrap_or(usize::MAX)),
            micro_batch: self.plan.graph.batch,
            micro_batches: self.plan.micro_batches as usize,
            recomputes: 0,
            rung: 0,
            rungs: 1,
            steps: self.ex.steps(),
            switches: 0,
            mid_step_switches: 0,
        }
    }

    /// Accepts a budget the plan fits; refuses a smaller one (nothing changes).
    pub fn set_budget(&mut self, budget: u64) -> Result<(), Error> {
        let need = self.plan.needed_bytes();
        if need as u64 > budget {
            return Err(too_small(need, budget));
        }
        self.budget = budget;
        Ok(())
    }

    /// Classes the model predicts.
    pub fn classes(&self) -> usize {
        self.plan.graph.pred_dims().numel()
    }

    /// Class probabilities (softmax of the dequantised logits `Int8Executor::predict_into` gives),
    /// `n × classes` values, one batch at a time; no state changes.
    pub fn predict(&mut self, x: &[f32]) -> Result<Vec<f32>, Error> {
        let classes = self.classes();
        let per = self.spec.input.numel();
        let mut out = vec![0f32; (x.len() / per.max(1)).saturating_mul(classes)];
        let arena = self.arena.as_mut_slice();
        let ex = &mut self.ex;
        predict_in_batches(x, per, classes, self.batch, &mut out, |x, dst| {
            ex.predict_into(arena, x, dst).map(|_| ())
        })?;
        Ok(out)
    }
}
