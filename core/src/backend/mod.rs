//! Backends: what runs each instruction of a plan.
//!
//! A [`Plan`] is a flat program; the executor's one step loop ([`crate::exec`]) walks it and hands every
//! instruction to the backend its [`Placement`] names, through the op-family traits below — it never calls
//! a kernel itself. The families follow the plan's phases, so a backend implements exactly what a plan can
//! ask of it:
//!
//! | trait | instructions |
//! |---|---|
//! | [`LayerOps`] | forward, recompute (a forward with [`Mode::Recompute`]), weight gradient (micro-batches after the first accumulate), input derivative |
//! | [`LossOps`] | the fused loss and its derivative |
//! | [`OptimOps`] | the optimizer update |
//! | [`MoveOps`] | moves of bytes: spill out/in, fp16 pack/unpack, moves between memory spaces |
//! | [`Backend`] | the whole: its name, which placements it serves, per-plan preparation (placement check, state such as int8 rescale sites), per-step start, parameter initialisation |
//!
//! Every method borrows the host arena (`&mut [u8]`, the plan's aligned arena) and an instruction
//! context [`Cx`]; nothing is allocated per call. Operands in another memory space (a GPU buffer, DSP
//! memory) belong to the backend that owns that space: it lays them out from the plan's
//! [`SpaceLayout`](crate::plan::SpaceLayout) in [`Backend::prepare`], once per plan.
//!
//! Implementations: [`CpuBackend`] (f32, optionally over a host's [`WorkerPool`](crate::pool::WorkerPool))
//! and [`CpuInt8`] (integer training with shift rescaling). Decorators wrap any backend (the recording
//! backend of the tests proves every instruction goes through these traits).

#[cfg(feature = "alloc")]
pub mod arena;
#[cfg(feature = "alloc")]
mod cpu;
#[cfg(feature = "alloc")]
mod error;
#[cfg(feature = "alloc")]
pub mod int8;

#[cfg(feature = "alloc")]
pub use cpu::CpuBackend;
#[cfg(feature = "alloc")]
pub(crate) use cpu::{spill_region as cpu_spill_region, tensor_mut as cpu_tensor_mut};
#[cfg(feature = "alloc")]
pub use error::{ExecError, Target};
#[cfg(feature = "alloc")]
pub use int8::{CpuInt8, Int8State};

#[cfg(feature = "alloc")]
use crate::{
    graph::TensorId,
    plan::{Eo, Instr, Phase, Plan, SpaceId, StorageId},
    spill::Spill,
};

/// Where an instruction runs. Part of every plan instruction; an executor whose backend cannot serve an
/// instruction's placement refuses the plan when it is created ([`ExecError::Placement`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Placement {
    /// The portable CPU backend in this crate.
    #[default]
    Cpu = 0,
    /// A GPU through wgpu/WebGPU (host-provided).
    Gpu = 1,
    /// A DSP such as Hexagon (host-provided).
    Dsp = 2,
}

impl Placement {
    /// The placement with this code (plan decoding).
    pub fn from_u8(v: u8) -> Option<Placement> {
        match v {
            0 => Some(Placement::Cpu),
            1 => Some(Placement::Gpu),
            2 => Some(Placement::Dsp),
            _ => None,
        }
    }
}

/// How a forward instruction runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Training: batch statistics, dropout, running-statistics updates, rescale learning.
    Train,
    /// Evaluation: running statistics, no dropout, no state change.
    Eval,
    /// A forward re-run during backward: identical outputs, no side effects (running statistics).
    Recompute,
}

/// One instruction as the step loop hands it to a backend.
#[cfg(feature = "alloc")]
#[derive(Clone, Copy)]
pub struct Cx<'a> {
    /// The plan the instruction belongs to.
    pub plan: &'a Plan,
    /// Its execution order (index into `plan.program`).
    pub eo: Eo,
    /// The instruction.
    pub ins: &'a Instr,
    /// Samples it covers (its micro-batch; the whole batch for an update).
    pub n: usize,
    /// Its slice of the host's input batch (`n` samples).
    pub x: &'a [f32],
    /// Train, eval or recompute.
    pub mode: Mode,
    /// The step's random seed (dropout masks, stochastic rounding).
    pub seed: u64,
    /// Index in the batch of its first sample (counter-based dropout masks).
    pub start: usize,
    /// The optimizer step this update makes (1-based: Adam's t).
    pub t: u32,
    /// The body of the read-only parameter image the executor was given (empty when the plan keeps
    /// every parameter in the arena; see [`crate::plan::params`]). Behind a reference, so the context
    /// of every instruction stays one word larger on a microcontroller's stack, not two.
    pub params: &'a &'a [u8],
}

/// What a loss instruction measured on its micro-batch.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LossOut {
    /// The micro-batch's contribution to the step's summed loss.
    pub sum: f64,
    /// The micro-batch's mean loss as the backend computed it (evaluation reports this).
    pub mean: f32,
    /// Samples whose arg-max prediction equals the class (cross-entropy only).
    pub correct: usize,
}

/// Forward, recompute, weight gradient and input derivative of a layer.
#[cfg(feature = "alloc")]
pub trait LayerOps {
    /// [`Phase::Forward`] and [`Phase::Recompute`] (`cx.mode` says which, and whether it trains); a
    /// recurrent layer's forward time step [`Phase::StepFwd`] (`cx.ins.step`).
    fn forward(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError>;
    /// [`Phase::GradW`]: dL/dW; micro-batches after the first (`cx.ins.mb > 0`) add to it.
    fn grad_w(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError>;
    /// [`Phase::GradX`]: dL/dX; a recurrent layer's backward time step [`Phase::StepBwd`].
    fn grad_x(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError>;
}

/// The fused loss.
#[cfg(feature = "alloc")]
pub trait LossOps {
    /// [`Phase::Loss`] on `cx.n` samples; in training (`cx.mode == Train`) also dL/d(prediction),
    /// normalised by `norm` samples (the whole batch when micro-batching).
    fn loss(
        &mut self,
        cx: &Cx<'_>,
        host: &mut [u8],
        target: Target<'_>,
        norm: usize,
    ) -> Result<LossOut, ExecError>;
}

/// Optimizer updates.
#[cfg(feature = "alloc")]
pub trait OptimOps {
    /// [`Phase::Apply`]: updates the node's parameters and optimizer state from their gradients.
    fn apply(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError>;
}

/// Moves of bytes the plan schedules: spilling to the host's store and fp16 storage.
#[cfg(feature = "alloc")]
pub trait MoveOps {
    /// [`Phase::SpillOut`]: hands the spilled storage's bytes to `spill`.
    fn spill_out(
        &mut self,
        cx: &Cx<'_>,
        host: &mut [u8],
        spill: &mut dyn Spill,
    ) -> Result<(), ExecError> {
        let (off, len) = cpu::spill_region(cx.plan, cx.eo)?;
        spill.write(cx.ins.node as u32, &host[off..off + len])?;
        Ok(())
    }
    /// [`Phase::SpillIn`]: reads the spilled storage back from `spill`.
    fn spill_in(
        &mut self,
        cx: &Cx<'_>,
        host: &mut [u8],
        spill: &mut dyn Spill,
    ) -> Result<(), ExecError> {
        let (off, len) = cpu::spill_region(cx.plan, cx.eo)?;
        spill.read(cx.ins.node as u32, &mut host[off..off + len])?;
        Ok(())
    }
    /// [`Phase::Pack`] (f32 → its IEEE-half copy) and [`Phase::Unpack`] (back).
    fn convert_half(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError>;
    /// [`Phase::Move`]: copies `from.bytes` bytes of storage `from` into storage `to` (as many bytes),
    /// either in the host arena or in a memory space the backend owns. The default moves within the host
    /// arena and refuses any other space ([`ExecError::Space`]); a backend that owns a space overrides it.
    fn move_between(
        &mut self,
        _cx: &Cx<'_>,
        host: &mut [u8],
        from: Region,
        to: Region,
    ) -> Result<(), ExecError> {
        if from.space != SpaceId::HOST {
            return Err(ExecError::Space(from.space.0));
        }
        if to.space != SpaceId::HOST {
            return Err(ExecError::Space(to.space.0));
        }
        let bad = ExecError::BadPlan("a move outside the arena");
        let end = from.offset.checked_add(from.bytes).ok_or(bad.clone())?;
        if end > host.len() || to.end().is_none_or(|e| e > host.len()) {
            return Err(bad);
        }
        host.copy_within(from.offset..end, to.offset);
        Ok(())
    }
}

/// Bytes of one storage in its memory space, as a [`Phase::Move`] hands them to
/// [`MoveOps::move_between`].
#[cfg(feature = "alloc")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    /// The space ([`SpaceId::HOST`]: the host arena).
    pub space: SpaceId,
    /// Offset within the space.
    pub offset: usize,
    /// Length in bytes.
    pub bytes: usize,
}

#[cfg(feature = "alloc")]
impl Region {
    /// One past its last byte (None on overflow).
    pub fn end(&self) -> Option<usize> {
        self.offset.checked_add(self.bytes)
    }

    /// The (from, to) regions of the move at `eo` of `plan` ([`Plan::move_storages`]): whole storages,
    /// equally long.
    pub fn of_move(plan: &Plan, eo: Eo) -> Result<(Region, Region), ExecError> {
        let (from, to) = plan.move_storages(eo).ok_or(ExecError::BadPlan(
            "a move of a tensor that holds no value before it",
        ))?;
        let region = |s: StorageId| {
            let l = &plan.lives[s];
            Region {
                space: l.space,
                offset: plan.offsets[s],
                // Both segments of a group have the group's bytes.
                bytes: l.bytes,
            }
        };
        Ok((region(from), region(to)))
    }
}

/// What a step starts with (see [`Backend::begin_step`]).
#[cfg(feature = "alloc")]
#[derive(Clone, Copy)]
pub struct StepStart<'a> {
    /// The whole input batch.
    pub x: &'a [f32],
    /// The step's random seed.
    pub seed: u64,
    /// The optimizer step it makes (1-based).
    pub t: u32,
    /// Training (true) or evaluation/prediction.
    pub train: bool,
    /// The step may switch plans between two instructions ([`Executor::train_step_adaptive`]): then
    /// after every instruction the arena must hold what the plan says, and a backend must not carry
    /// one instruction's work into the next (the CPU backend's fused BatchNorm backward).
    ///
    /// [`Executor::train_step_adaptive`]: crate::exec::Executor::train_step_adaptive
    pub switchable: bool,
}

/// A compute backend: the op families plus what it needs per plan and per step.
#[cfg(feature = "alloc")]
pub trait Backend: LayerOps + LossOps + OptimOps + MoveOps {
    /// Short name for reports.
    fn name(&self) -> &'static str;
    /// Whether it runs instructions placed on `p`.
    fn serves(&self, p: Placement) -> bool;
    /// Readies the backend for `plan`, once, when an executor is created or switches plans: checks that
    /// it serves every placement, and sets up per-plan state (buffers of its own memory spaces, int8
    /// rescale sites). May allocate; steps may not.
    fn prepare(&mut self, plan: &Plan) -> Result<(), ExecError> {
        check_placements(self, plan)
    }
    /// Called before the first instruction of every step, evaluation and prediction.
    fn begin_step(&mut self, _plan: &Plan, _step: &StepStart<'_>) -> Result<(), ExecError> {
        Ok(())
    }
    /// Called after the last instruction of every step, evaluation and prediction. A backend that
    /// defers its work (a GPU recording the whole step into one submission) runs it here; one that also
    /// defers its loss (reading it back once per step) returns zeros from [`LossOps::loss`] and the
    /// step's totals here, which replace them. A training step whose totals are not finite is rejected
    /// ([`ExecError::NonFinite`]); such a backend must then leave the weights unchanged (the GPU's
    /// optimizer kernels skip their update when the step's loss is not finite).
    fn end_step(&mut self, _plan: &Plan) -> Result<Option<LossOut>, ExecError> {
        Ok(None)
    }
    /// Reads persistent tensor `t` of `plan`, held in a memory space this backend owns, into `out` (its
    /// exact length). Backends without a space of their own refuse.
    fn read_tensor(
        &mut self,
        _plan: &Plan,
        _t: TensorId,
        _out: &mut [f32],
    ) -> Result<(), ExecError> {
        Err(ExecError::Tensor(
            "the tensor is in a memory space this backend does not own",
        ))
    }
    /// Overwrites persistent tensor `t` of `plan` in a memory space this backend owns (loading weights);
    /// `data` has its exact length.
    fn write_tensor(&mut self, _plan: &Plan, _t: TensorId, _data: &[f32]) -> Result<(), ExecError> {
        Err(ExecError::Tensor(
            "the tensor is in a memory space this backend does not own",
        ))
    }
    /// Initialises every parameter like PyTorch's defaults and zeroes optimizer state and running
    /// statistics (f32 layout; integer backends override).
    fn init_params(&mut self, plan: &Plan, host: &mut [u8], seed: u64) -> Result<(), ExecError> {
        cpu::init_params_f32(plan, host, seed)
    }
}

/// [`ExecError::Placement`] for the first instruction of `plan` that `b` does not serve,
#[cfg(feature = "alloc")]
/// and [`ExecError::Space`] when the plan has a memory space other than the host arena (a backend that
/// owns another space checks its own placements and spaces).
pub fn check_placements<B: Backend + ?Sized>(b: &B, plan: &Plan) -> Result<(), ExecError> {
    if let Some(i) = plan.program.iter().find(|i| !b.serves(i.placement)) {
        return Err(ExecError::Placement(i.placement));
    }
    match plan.spaces.first() {
        Some(s) => Err(ExecError::Space(s.space.0)),
        None => Ok(()),
    }
}

/// Runs one instruction (not the loss) on `b`: the dispatch of the step loop.
#[cfg(feature = "alloc")]
pub fn dispatch<B: Backend + ?Sized>(
    b: &mut B,
    cx: &Cx<'_>,
    host: &mut [u8],
    spill: Option<&mut dyn Spill>,
) -> Result<(), ExecError> {
    if !b.serves(cx.ins.placement) {
        return Err(ExecError::Placement(cx.ins.placement));
    }
    match cx.ins.phase {
        // A recurrent layer's time steps go to the same methods (`cx.ins.step` says which step).
        Phase::Forward | Phase::Recompute | Phase::StepFwd => b.forward(cx, host),
        Phase::GradW => b.grad_w(cx, host),
        Phase::GradX | Phase::StepBwd => b.grad_x(cx, host),
        Phase::Apply => b.apply(cx, host),
        Phase::Pack | Phase::Unpack => b.convert_half(cx, host),
        Phase::Move => {
            let (from, to) = Region::of_move(cx.plan, cx.eo)?;
            b.move_between(cx, host, from, to)
        }
        Phase::SpillOut | Phase::SpillIn => {
            let spill = spill.ok_or(ExecError::BadPlan(
                "a swap instruction needs a spill store (Executor::train_step_spilled)",
            ))?;
            if cx.ins.phase == Phase::SpillOut {
                b.spill_out(cx, host, spill)
            } else {
                b.spill_in(cx, host, spill)
            }
        }
        Phase::Loss => Err(ExecError::BadPlan("loss instruction in the wrong place")),
    }
}
