//! Executor: runs a [`Plan`] over a caller-owned `&mut [u8]` arena. A training step is one loop over the
//! plan's instructions ([`Executor`]'s step loop, shared by plain, spilled, adaptive and integer steps,
//! evaluation and prediction); each instruction goes to the [`Backend`] its placement names, with its
//! tensors as slices of the arena at their planned offsets, so a step allocates nothing. Hosts never reach
//! inside: they hand in a batch and read back a loss.
pub mod adapt;
#[cfg(test)]
mod adapt_tests;
pub mod importance;
pub mod int8;
#[cfg(test)]
mod mixed_tests;
#[cfg(test)]
mod nonfinite_tests;
#[cfg(test)]
mod params_tests;
mod permute;
#[cfg(test)]
mod record_tests;
#[cfg(all(test, feature = "seq"))]
pub(crate) mod rnn_tests;
#[cfg(all(test, feature = "seq"))]
pub(crate) mod seq_tests;
#[cfg(test)]
mod space_tests;
#[cfg(test)]
pub(crate) mod sparse_tests;

pub use crate::backend::arena::carve;
use crate::backend::arena::f32s_ro;
pub use crate::backend::{ExecError, Target};
pub use crate::policy::ladder::{ladder, pick};
pub use adapt::{AdaptObserver, Adapted};

use crate::backend::cpu_tensor_mut as tensor_mut;
use crate::backend::{dispatch, Backend, CpuBackend, Cx, Mode, StepStart};
use crate::budget::BudgetError;
use crate::graph::{Graph, NodeOp, TensorId};
use crate::kernels::rows::dequantize_rows;
use crate::plan::params::{self, ParamEncoding, ReadOnly};
use crate::plan::{Eo, Instr, Phase, Plan, ALIGN};
use crate::rng::hash2;
pub use crate::spill::{Spill, SpillError};

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

/// Runs a plan on a backend. Holds the plan, the backend and the step counter; the arena is passed to
/// every call.
pub struct Executor<'p, B: Backend = CpuBackend> {
    plan: &'p Plan,
    backend: B,
    /// Optimizer steps taken (Adam's t).
    steps: u32,
    /// The working memory of adaptive steps' plan switches, sized once per table
    /// ([`Executor::prepare_adaptive`]); boxed so an executor that never adapts stays small (the
    /// firmware keeps its executor on a 16 KiB stack).
    adapt: Option<alloc::boxed::Box<adapt::AdaptScratch<'p>>>,
    /// The body of the read-only parameter image (empty: every parameter is in the arena).
    params: &'p [u8],
}

impl<'p> Executor<'p, CpuBackend> {
    /// An executor on the CPU backend. Checks that `arena` can hold the plan.
    pub fn new(plan: &'p Plan, arena: &[u8]) -> Result<Self, ExecError> {
        Self::with_backend(plan, arena, CpuBackend::new())
    }
}

pub(crate) fn base_of(arena: &[u8]) -> usize {
    arena.as_ptr().align_offset(ALIGN).min(ALIGN)
}

/// One step in flight: what the step loop carries from instruction to instruction.
pub(crate) struct StepRun<'x, 't, 's> {
    pub(crate) x: &'x [f32],
    /// None for prediction (the loss is not run).
    pub(crate) target: Option<Target<'t>>,
    pub(crate) n: usize,
    pub(crate) mode: Mode,
    pub(crate) seed: u64,
    pub(crate) t: u32,
    pub(crate) loss: f64,
    pub(crate) mean: f32,
    pub(crate) correct: usize,
    pub(crate) spill: Option<&'s mut dyn Spill>,
    /// Swap-ins are announced this many instructions ahead (spilled steps).
    pub(crate) ahead: Eo,
}

/// Decides, before each instruction, which instruction the step loop runs next: the plain step runs them
/// in order; evaluation skips to the forward of the first micro-batch; the adaptive step may switch plans.
pub(crate) trait Steer<'p, B: Backend> {
    /// The instruction to run next (≥ the program's length: the step is over); may switch `ex`'s plan.
    fn before(
        &mut self,
        ex: &mut Executor<'p, B>,
        whole: &mut [u8],
        eo: usize,
        run: &mut StepRun<'_, '_, '_>,
        obs: &mut dyn AdaptObserver,
    ) -> Result<usize, ExecError>;
}

/// Every instruction in order.
pub(crate) struct InOrder;

impl<'p, B: Backend> Steer<'p, B> for InOrder {
    fn before(
        &mut self,
        _: &mut Executor<'p, B>,
        _: &mut [u8],
        eo: usize,
        _: &mut StepRun<'_, '_, '_>,
        _: &mut dyn AdaptObserver,
    ) -> Result<usize, ExecError> {
        Ok(eo)
    }
}

/// Evaluation and prediction: the forward instructions of the first micro-batch, then the loss (when there
/// is a target); records where the loss is (the prediction is read there).
struct ForwardOnly {
    loss_eo: Option<usize>,
}

impl<'p, B: Backend> Steer<'p, B> for ForwardOnly {
    fn before(
        &mut self,
        ex: &mut Executor<'p, B>,
        _: &mut [u8],
        mut eo: usize,
        run: &mut StepRun<'_, '_, '_>,
        _: &mut dyn AdaptObserver,
    ) -> Result<usize, ExecError> {
        let program = &ex.plan.program;
        if self.loss_eo.is_some() {
            return Ok(program.len());
        }
        while let Some(ins) = program.get(eo) {
            match (ins.phase, ins.mb) {
                (Phase::Forward | Phase::StepFwd, 0) => return Ok(eo),
                (Phase::Loss, 0) => {
                    self.loss_eo = Some(eo);
                    return Ok(if run.target.is_some() {
                        eo
                    } else {
                        program.len()
                    });
                }
                // Swap plans only swap in after the loss; earlier, the forward would read stale bytes.
                (Phase::SpillIn, 0) => return Err(ExecError::BadPlan("a swap-in before the loss")),
                // A move before the loss carries a value to the device of a later forward (a mixed
                // plan) or parks a saved activation (offloading, harmless here): both run.
                (Phase::Move, 0) => return Ok(eo),
                _ => eo += 1,
            }
        }
        Err(ExecError::BadPlan("the plan has no loss instruction"))
    }
}

impl<'p, B: Backend> Executor<'p, B> {
    /// An executor on `backend`: checks that `arena` can hold the plan and prepares the backend for it
    /// (an instruction placed where the backend cannot run it is [`ExecError::Placement`] here, before
    /// any step).
    pub fn with_backend(plan: &'p Plan, arena: &[u8], backend: B) -> Result<Self, ExecError> {
        Self::with_params(plan, arena, backend, &[])
    }

    /// An executor on `backend` whose plan reads its frozen parameters from `image`, a read-only
    /// parameter image ([`crate::plan::params`]: flash on a microcontroller, a host's bytes) made for
    /// this plan by [`split_state`](crate::plan::params::split_state). The image must start at a
    /// 4-byte aligned address; one that is too short, misaligned or made for another plan is
    /// [`ExecError::Params`] here, and so is a plan with a parameter space given no image. A plan
    /// without one takes an empty image ([`Executor::with_backend`]).
    pub fn with_params(
        plan: &'p Plan,
        arena: &[u8],
        mut backend: B,
        image: &'p [u8],
    ) -> Result<Self, ExecError> {
        let params = plan.check_params_image(image)?;
        let needed = plan.arena_bytes + base_of(arena);
        if arena.len() < needed {
            return Err(ExecError::Budget(BudgetError::TooSmall {
                needed: plan.needed_bytes(),
                given: arena.len(),
            }));
        }
        backend.prepare(plan)?;
        Ok(Self {
            plan,
            backend,
            steps: 0,
            adapt: None,
            params,
        })
    }

    /// The plan.
    pub fn plan(&self) -> &'p Plan {
        self.plan
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The executor's backend, handed back (a host that keeps a prepared backend between calls).
    pub fn into_backend(self) -> B {
        self.backend
    }

    /// The backend, mutably (its settings, e.g. integer rescaling).
    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    /// Optimizer steps taken so far.
    pub fn steps(&self) -> u32 {
        self.steps
    }

    /// Sets the step counter (when resuming from a checkpoint).
    pub fn set_steps(&mut self, steps: u32) {
        self.steps = steps;
    }

    /// Makes `next` the plan (a switch has moved its tensors into place).
    pub(crate) fn set_plan(&mut self, next: &'p Plan) -> Result<(), ExecError> {
        if !self.params.is_empty() || next.params_space().is_some() {
            return Err(ExecError::Unsupported(
                "switching plans that read parameters from an image",
            ));
        }
        self.backend.prepare(next)?;
        self.plan = next;
        Ok(())
    }

    pub(crate) fn arena<'a>(&self, arena: &'a mut [u8]) -> Result<&'a mut [u8], ExecError> {
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

    /// Initialises every parameter (the backend's layout: PyTorch's defaults in f32) and zeroes the
    /// optimizer state and running statistics; resets the step counter.
    pub fn init_params(&mut self, arena: &mut [u8], seed: u64) -> Result<(), ExecError> {
        let plan = self.plan;
        let a = self.arena(arena)?;
        self.backend.init_params(plan, a, seed)?;
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

    /// The persistent tensors of [`Executor::state_tensors`] in its order, without names: what
    /// [`Executor::write_state`] fills.
    pub fn state_ids(&self) -> impl Iterator<Item = TensorId> + 'p {
        let g: &'p Graph = &self.plan.graph;
        g.nodes.iter().flat_map(|n| {
            n.params
                .iter()
                .map(|p| p.value)
                .chain(n.stats.iter().copied())
        })
    }

    /// Writes every persistent tensor (parameters, then BatchNorm statistics, node by node: the order
    /// of [`Executor::state_tensors`]) from `bytes`, their little-endian f32 values back to back, into
    /// the host arena. Allocates nothing, so a microcontroller can load pretrained weights from flash.
    /// `bytes` must hold exactly the state's elements — but for the tensors the plan reads from its
    /// parameter image ([`crate::plan::params`]), which are skipped: the image holds them, and
    /// [`split_state`](crate::plan::params::split_state) gives the rest.
    pub fn write_state(&mut self, arena: &mut [u8], bytes: &[u8]) -> Result<(), ExecError> {
        let plan = self.plan;
        let mut at = 0usize;
        for t in self.state_ids() {
            match self.space_of(t) {
                Some(s) if ParamEncoding::of_space(s).is_some() => continue,
                Some(s) if s != crate::plan::SpaceId::HOST => {
                    return Err(ExecError::Tensor("state tensor outside the host arena"))
                }
                _ => {}
            }
            let a = self.arena(arena)?;
            let dst = tensor_mut(plan, a, t)?;
            let src = bytes
                .get(at..at + dst.len() * 4)
                .ok_or(ExecError::Tensor("fewer state values than the plan holds"))?;
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
            at += src.len();
        }
        if at != bytes.len() {
            return Err(ExecError::Tensor("more state values than the plan holds"));
        }
        Ok(())
    }

    /// Reads a persistent f32 tensor in the host arena (see [`Executor::read_vec`] for any space).
    pub fn read<'a>(&self, arena: &'a mut [u8], t: TensorId) -> Result<&'a [f32], ExecError> {
        let plan = self.plan;
        let a = self.arena(arena)?;
        tensor_mut(plan, a, t).map(|s| &*s)
    }

    /// Bytes of tensor `t` of the plan's graph.
    fn tensor_bytes(&self, t: TensorId) -> Result<usize, ExecError> {
        self.plan
            .graph
            .tensors
            .get(t as usize)
            .map(|x| x.bytes)
            .ok_or(ExecError::Tensor("no such tensor"))
    }

    /// The memory space persistent tensor `t` lives in.
    fn space_of(&self, t: TensorId) -> Option<crate::plan::SpaceId> {
        let s = self.plan.storage_at(t, 0)?;
        self.plan.lives.get(s).map(|l| l.space)
    }

    /// A copy of a persistent f32 tensor, wherever it lives: the host arena, the read-only parameter
    /// image (int8 and fp16 weights converted to f32), or a memory space of the backend (read back through
    /// [`Backend::read_tensor`], e.g. from the GPU).
    pub fn read_vec(
        &mut self,
        arena: &mut [u8],
        t: TensorId,
    ) -> Result<alloc::vec::Vec<f32>, ExecError> {
        match self.space_of(t) {
            Some(s) if ParamEncoding::of_space(s).is_some() => {
                match params::read_only(self.plan, self.params, t)? {
                    Some(ReadOnly::F32(v)) => Ok(v.to_vec()),
                    Some(ReadOnly::I8 { scales, q }) => {
                        let mut out = alloc::vec![0f32; q.len()];
                        dequantize_rows(q, scales, &mut out);
                        Ok(out)
                    }
                    Some(ReadOnly::F16(h)) => {
                        let mut out = alloc::vec![0f32; h.len()];
                        params::f16_to_f32(h, &mut out);
                        Ok(out)
                    }
                    None => Err(ExecError::Tensor("not in the parameter image")),
                }
            }
            Some(s) if s != crate::plan::SpaceId::HOST => {
                let mut out = alloc::vec![0f32; self.tensor_bytes(t)? / 4];
                self.backend.read_tensor(self.plan, t, &mut out)?;
                Ok(out)
            }
            _ => self.read(arena, t).map(|v| v.to_vec()),
        }
    }

    /// Overwrites a persistent f32 tensor (loading weights); `data` must have its exact length. A tensor
    /// in a backend's own memory space is written through [`Backend::write_tensor`].
    pub fn write(&mut self, arena: &mut [u8], t: TensorId, data: &[f32]) -> Result<(), ExecError> {
        let plan = self.plan;
        if self
            .space_of(t)
            .is_some_and(|s| s != crate::plan::SpaceId::HOST)
        {
            if data.len() * 4 != self.tensor_bytes(t)? {
                return Err(ExecError::Tensor("length differs from the planned tensor"));
            }
            return self.backend.write_tensor(plan, t, data);
        }
        let a = self.arena(arena)?;
        let dst = tensor_mut(plan, a, t)?;
        if dst.len() != data.len() {
            return Err(ExecError::Tensor("length differs from the planned tensor"));
        }
        dst.copy_from_slice(data);
        Ok(())
    }

    pub(crate) fn check_batch(
        &self,
        x: &[f32],
        target: Option<Target<'_>>,
        max: usize,
    ) -> Result<usize, ExecError> {
        check_batch(&self.plan.graph, x, target, max)
    }

    /// Starts a step: the run state, and the backend told.
    pub(crate) fn start<'x, 't, 's>(
        &mut self,
        x: &'x [f32],
        target: Option<Target<'t>>,
        n: usize,
        mode: Mode,
        spill: Option<&'s mut dyn Spill>,
    ) -> Result<StepRun<'x, 't, 's>, ExecError> {
        self.start_with(x, target, n, mode, spill, false)
    }

    /// [`Executor::start`] telling the backend whether the step may switch plans between two
    /// instructions ([`StepStart::switchable`]).
    pub(crate) fn start_with<'x, 't, 's>(
        &mut self,
        x: &'x [f32],
        target: Option<Target<'t>>,
        n: usize,
        mode: Mode,
        spill: Option<&'s mut dyn Spill>,
        switchable: bool,
    ) -> Result<StepRun<'x, 't, 's>, ExecError> {
        let train = mode == Mode::Train;
        let seed = if train {
            hash2(self.plan.graph.seed, self.steps as u64)
        } else {
            0
        };
        let t = if train {
            self.steps + 1
        } else {
            self.steps.max(1)
        };
        self.backend.begin_step(
            self.plan,
            &StepStart {
                x: &x[..n * self.plan.graph.input_dims.numel()],
                seed,
                t,
                train,
                switchable,
            },
        )?;
        let ahead = spill
            .as_ref()
            .map_or(0, |s| s.lookahead().min(MAX_PREFETCH_LEAD as usize) as Eo);
        Ok(StepRun {
            x,
            target,
            n,
            mode,
            seed,
            t,
            loss: 0.0,
            mean: 0.0,
            correct: 0,
            spill,
            ahead,
        })
    }

    /// The step loop: from instruction `eo` of the current plan until `stop` (or the end), each
    /// instruction chosen by `steer`, run by [`Executor::instr`] and shown to `obs`. `whole` is the
    /// aligned arena (the plan's arena at its start; adaptive steps pass all of the caller's bytes).
    pub(crate) fn run_loop(
        &mut self,
        whole: &mut [u8],
        run: &mut StepRun<'_, '_, '_>,
        mut eo: usize,
        stop: Option<usize>,
        steer: &mut impl Steer<'p, B>,
        obs: &mut impl AdaptObserver,
    ) -> Result<(), ExecError> {
        loop {
            if stop.is_some_and(|s| eo >= s) {
                return Ok(());
            }
            eo = steer.before(self, whole, eo, run, obs)?;
            let plan = self.plan;
            let Some(ins) = plan.program.get(eo) else {
                return Ok(());
            };
            if stop.is_some_and(|s| eo >= s) {
                return Ok(());
            }
            if run.spill.is_some() {
                announce(plan, eo as Eo, run);
            }
            let host = whole
                .get_mut(..plan.arena_bytes)
                .ok_or(ExecError::BadPlan("tensor outside the arena"))?;
            self.instr(plan, host, eo as Eo, run)?;
            obs.observe(plan, eo, ins, whole);
            eo += 1;
        }
    }

    /// Runs instruction `eo` of `plan` on the backend: its micro-batch's samples, the loss here (summed
    /// into the run), everything else through [`dispatch`].
    pub(crate) fn instr(
        &mut self,
        plan: &Plan,
        host: &mut [u8],
        eo: Eo,
        run: &mut StepRun<'_, '_, '_>,
    ) -> Result<(), ExecError> {
        let ins = &plan.program[eo as usize];
        let mb_size = plan.graph.batch;
        let per = plan.graph.input_dims.numel();
        // This instruction's micro-batch: samples [start, start + n_mb).
        let start = ins.mb as usize * mb_size;
        let n_mb = if ins.phase == Phase::Apply {
            run.n
        } else {
            run.n.saturating_sub(start).min(mb_size)
        };
        if n_mb == 0 {
            return Ok(()); // a partial batch leaves the last micro-batches empty
        }
        let x = if ins.phase == Phase::Apply {
            run.x
        } else {
            &run.x[start * per..(start + n_mb) * per]
        };
        let mode = match (run.mode, ins.phase) {
            (Mode::Train, Phase::Recompute) => Mode::Recompute,
            (m, _) => m,
        };
        let cx = Cx {
            plan,
            eo,
            ins,
            n: n_mb,
            x,
            mode,
            seed: run.seed,
            start,
            t: run.t,
            params: &self.params,
        };
        if ins.phase != Phase::Loss {
            let spill = run.spill.as_mut().map(|s| &mut **s as &mut dyn Spill);
            return dispatch(&mut self.backend, &cx, host, spill);
        }
        if !self.backend.serves(ins.placement) {
            return Err(ExecError::Placement(ins.placement));
        }
        let Some(target) = run.target else {
            return Err(ExecError::BadPlan("a loss without targets"));
        };
        let outs = plan.graph.pred_dims().numel();
        let tk = plan.graph.tokens;
        let t = match target {
            Target::Classes(y) => Target::Classes(&y[start * tk..(start + n_mb) * tk]),
            Target::Values(v) => Target::Values(&v[start * outs..(start + n_mb) * outs]),
        };
        let out = self.backend.loss(&cx, host, t, run.n)?;
        if run.mode == Mode::Train && !(out.sum.is_finite() && out.mean.is_finite()) {
            return Err(ExecError::NonFinite("the loss"));
        }
        run.loss += out.sum;
        run.mean = out.mean;
        run.correct += out.correct;
        Ok(())
    }

    /// Ends a run: the backend's [`Backend::end_step`] (a backend that defers its loss, like a GPU
    /// reading back once per step, gives the totals here; they replace what its loss instructions
    /// returned), and a non-finite training loss rejected.
    pub(crate) fn finish(&mut self, run: &mut StepRun<'_, '_, '_>) -> Result<(), ExecError> {
        if let Some(t) = self.backend.end_step(self.plan)? {
            run.loss = t.sum;
            run.mean = t.mean;
            run.correct = t.correct;
            if run.mode == Mode::Train && !(t.sum.is_finite() && t.mean.is_finite()) {
                return Err(ExecError::NonFinite("the loss"));
            }
        }
        Ok(())
    }

    /// Ends a training step ([`Executor::finish`]) and counts it.
    pub(crate) fn finish_train(
        &mut self,
        run: &mut StepRun<'_, '_, '_>,
    ) -> Result<StepStats, ExecError> {
        self.finish(run)?;
        self.steps += 1;
        Ok(StepStats {
            loss: (run.loss / run.n as f64) as f32,
            correct: run.correct,
            samples: run.n,
        })
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
        let a = self.arena(arena)?;
        let mut run = self.start(x, Some(target), n, Mode::Train, None)?;
        self.run_loop(a, &mut run, 0, None, &mut InOrder, obs)?;
        self.finish_train(&mut run)
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
        let a = self.arena(arena)?;
        let mut run = self.start(x, Some(target), n, Mode::Train, Some(spill))?;
        self.run_loop(a, &mut run, 0, None, &mut InOrder, obs)?;
        self.finish_train(&mut run)
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
        let a = self.arena(arena)?;
        let mut run = self.start(x, Some(target), n, Mode::Eval, None)?;
        let mut steer = ForwardOnly { loss_eo: None };
        self.run_loop(a, &mut run, 0, None, &mut steer, &mut ())?;
        self.finish(&mut run)?;
        Ok(StepStats {
            loss: run.mean,
            correct: run.correct,
            samples: n,
        })
    }

    /// Forward pass in evaluation mode on at most one micro-batch; returns the prediction
    /// (`n × outputs`), a slice of the arena: the last layer's output, which for a cross-entropy
    /// model is the logits (the softmax lives in the loss, which prediction does not run).
    pub fn predict<'a>(&mut self, arena: &'a mut [u8], x: &[f32]) -> Result<&'a [f32], ExecError> {
        let (_, bytes) = self.predict_bytes(arena, x, 4)?;
        f32s_ro(bytes)
    }

    /// The forward pass of [`Executor::predict`]: the sample count and the prediction's bytes in the
    /// arena (`n × outputs` elements of `elem` bytes: 4 in f32, 1 in int8).
    fn predict_bytes<'a>(
        &mut self,
        arena: &'a mut [u8],
        x: &[f32],
        elem: usize,
    ) -> Result<(usize, &'a [u8]), ExecError> {
        let n = self.check_batch(x, None, self.plan.graph.batch)?;
        let plan = self.plan;
        let a = self.arena(arena)?;
        let mut run = self.start(x, None, n, Mode::Eval, None)?;
        let mut steer = ForwardOnly { loss_eo: None };
        self.run_loop(a, &mut run, 0, None, &mut steer, &mut ())?;
        self.finish(&mut run)?;
        let loss_eo = steer
            .loss_eo
            .ok_or(ExecError::BadPlan("the plan has no loss instruction"))?;
        let pred = plan.graph.pred();
        let len = n * plan.graph.pred_dims().numel();
        match plan.storage_at(pred, loss_eo as Eo) {
            Some(s) if plan.lives[s].space != crate::plan::SpaceId::HOST => {
                // The backend that owns the space reads it (e.g. the GPU backend's `read`).
                Err(ExecError::Space(plan.lives[s].space.0))
            }
            Some(s) => {
                let off = plan.offsets[s];
                let bytes = a
                    .get(off..off.saturating_add(elem * len))
                    .ok_or(ExecError::BadPlan("the prediction is outside the arena"))?;
                Ok((n, bytes))
            }
            None => Err(ExecError::BadPlan("the prediction is not in the arena")),
        }
    }
}

/// Checks a batch against the graph: sample size, count (at most `max`), finiteness, labels or targets
/// matching the loss. Returns the sample count.
fn check_batch(
    g: &Graph,
    x: &[f32],
    target: Option<Target<'_>>,
    max: usize,
) -> Result<usize, ExecError> {
    use crate::model::LossKind;
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
    // A graph has embeddings only with the `seq` feature (constant-folded away without it).
    if let Some(NodeOp::Embedding { vocab, .. }) = g.nodes.first().map(|nd| &nd.op) {
        if let Err((i, _)) = cfg!(feature = "seq")
            .then(|| crate::ops::seq::check_ids(x, *vocab))
            .unwrap_or(Ok(()))
        {
            return Err(ExecError::BadBatch(
                "token id is not an integer below the vocabulary size",
                i,
            ));
        }
    }
    match (g.loss, target) {
        (_, None) => {}
        (LossKind::SoftmaxCrossEntropy, Some(Target::Classes(y))) => {
            // A sequence prediction has a label per token.
            let classes = classes / g.tokens.max(1);
            if y.len() != n * g.tokens.max(1) {
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

/// Announces to the spill store the swap-ins whose prefetch point is instruction `eo`.
fn announce(plan: &Plan, eo: Eo, run: &mut StepRun<'_, '_, '_>) {
    let n = run.n;
    let mb_size = plan.graph.batch;
    let ahead = run.ahead;
    let Some(spill) = run.spill.as_deref_mut() else {
        return;
    };
    for j in eo + 1..plan.n_eo().min(eo + 1 + ahead) {
        let next = &plan.program[j as usize];
        let samples = n.saturating_sub(next.mb as usize * mb_size).min(mb_size);
        if next.phase == Phase::SpillIn && samples > 0 && prefetch_point(plan, j, ahead) == Some(eo)
        {
            if let Ok((_, len)) = crate::backend::cpu_spill_region(plan, j) {
                spill.prefetch(next.node as u32, len);
            }
        }
    }
}

/// Farthest ahead of a swap-in that [`Executor::train_step_spilled`] announces it to the spill store.
pub const MAX_PREFETCH_LEAD: Eo = 64;

/// Where the swap-in at `j` is announced: `ahead` instructions before it, but never before its swap-out
/// (the bytes exist only after it); None when that leaves no instruction in between.
fn prefetch_point(plan: &Plan, j: Eo, ahead: Eo) -> Option<Eo> {
    let t = plan.program[j as usize].spilled()?;
    let segs = &plan.segments[plan.group(t)?];
    let k = segs.iter().position(|&(start, _)| start == j)?;
    // The swap-out is the last use of the previous segment.
    let out = k
        .checked_sub(1)
        .map_or(0, |p| plan.lives[segs[p].1].last + 1);
    let p = j.saturating_sub(ahead).max(out);
    (p < j).then_some(p)
}
