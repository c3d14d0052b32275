//! Mixed CPU/GPU plans: [`MixedBackend`] serves both placements of one plan built by
//! [`frugal_core::policy::mixed::mixed`] (see [`mixed_plan`]).
//!
//! - GPU-placed instructions are prepared and recorded by the [`GpuBackend`] as in a whole-GPU step
//!   (buffers, uniform slots and bind groups made once per plan, for its GPU instructions only); its
//!   buffer holds the plan's GPU space.
//! - CPU-placed instructions run on the [`CpuBackend`] over the host arena, as in a CPU step; the
//!   loss is among them (a mixed plan's loss runs on the CPU), so a non-finite loss rejects the step
//!   before any update on either device.
//! - A [`Phase::Move`](frugal_core::plan::Phase::Move) between the arena and the GPU space first
//!   submits the GPU work recorded so far (with its uniform slots); host to GPU is then a queue write
//!   (ordered after that work and before anything recorded later), GPU to host a copy into a landing
//!   buffer made at prepare time, mapped and waited for. A step thus submits once per such move, plus
//!   once at its end; no buffer, bind group or pipeline is made during a step.
//!
//! Natively only: a move to the host waits for the GPU, which a browser page cannot do.
use frugal_core::backend::CpuBackend;
use frugal_core::backend::{
    Backend, Cx, ExecError, LayerOps, LossOps, LossOut, MoveOps, OptimOps, Placement, Region,
    StepStart, Target,
};
use frugal_core::graph::TensorId;
use frugal_core::plan::{Plan, SpaceId};
use frugal_core::policy::mixed::{mixed, MixedError};
use frugal_core::pool::{SingleThread, WorkerPool};

use crate::{GpuBackend, GpuError, GPU_ALIGN, GPU_SPACE};

/// `plan` with node `i` on `devices[i]` (`Placement::Cpu` or `Placement::Gpu`), the GPU's storages in
/// [`GPU_SPACE`] at [`GPU_ALIGN`], and the moves between them (see `policy::mixed`).
pub fn mixed_plan(plan: Plan, devices: &[Placement]) -> Result<Plan, MixedError> {
    mixed(plan, devices, |d| {
        (d == Placement::Gpu).then_some((GPU_SPACE, GPU_ALIGN))
    })
}

/// The CPU and the GPU backends serving one mixed plan (see the [module](self) docs).
pub struct MixedBackend<P: WorkerPool = SingleThread> {
    cpu: CpuBackend<P>,
    gpu: GpuBackend,
}

impl MixedBackend {
    /// The single-threaded CPU backend beside `gpu`.
    pub fn new(gpu: GpuBackend) -> MixedBackend {
        MixedBackend::with_cpu(CpuBackend::new(), gpu)
    }

    /// Opens the first adapter (see [`crate::Gpu::open`]).
    pub fn open() -> Result<MixedBackend, GpuError> {
        GpuBackend::open().map(MixedBackend::new)
    }
}

impl<P: WorkerPool> MixedBackend<P> {
    /// `cpu` (a host's worker pool) beside `gpu`.
    pub fn with_cpu(cpu: CpuBackend<P>, mut gpu: GpuBackend) -> MixedBackend<P> {
        gpu.beside_cpu = true;
        MixedBackend { cpu, gpu }
    }

    /// The GPU backend (its counters, bytes, submissions).
    pub fn gpu(&self) -> &GpuBackend {
        &self.gpu
    }
}

impl<P: WorkerPool> LayerOps for MixedBackend<P> {
    fn forward(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError> {
        match cx.ins.placement {
            Placement::Cpu => self.cpu.forward(cx, host),
            Placement::Gpu => self.gpu.forward(cx, host),
            p => Err(ExecError::Placement(p)),
        }
    }
    fn grad_w(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError> {
        match cx.ins.placement {
            Placement::Cpu => self.cpu.grad_w(cx, host),
            Placement::Gpu => self.gpu.grad_w(cx, host),
            p => Err(ExecError::Placement(p)),
        }
    }
    fn grad_x(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError> {
        match cx.ins.placement {
            Placement::Cpu => self.cpu.grad_x(cx, host),
            Placement::Gpu => self.gpu.grad_x(cx, host),
            p => Err(ExecError::Placement(p)),
        }
    }
}

impl<P: WorkerPool> LossOps for MixedBackend<P> {
    fn loss(
        &mut self,
        cx: &Cx<'_>,
        host: &mut [u8],
        target: Target<'_>,
        norm: usize,
    ) -> Result<LossOut, ExecError> {
        match cx.ins.placement {
            Placement::Cpu => self.cpu.loss(cx, host, target, norm),
            // A whole-GPU plan's loss (a mixed plan's is refused on the GPU when prepared).
            Placement::Gpu => LossOps::loss(&mut self.gpu, cx, host, target, norm),
            p => Err(ExecError::Placement(p)),
        }
    }
}

impl<P: WorkerPool> OptimOps for MixedBackend<P> {
    fn apply(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError> {
        match cx.ins.placement {
            Placement::Cpu => self.cpu.apply(cx, host),
            Placement::Gpu => self.gpu.apply(cx, host),
            p => Err(ExecError::Placement(p)),
        }
    }
}

impl<P: WorkerPool> MoveOps for MixedBackend<P> {
    fn convert_half(&mut self, cx: &Cx<'_>, host: &mut [u8]) -> Result<(), ExecError> {
        match cx.ins.placement {
            Placement::Cpu => self.cpu.convert_half(cx, host),
            Placement::Gpu => self.gpu.convert_half(cx, host),
            p => Err(ExecError::Placement(p)),
        }
    }
    fn move_between(
        &mut self,
        cx: &Cx<'_>,
        host: &mut [u8],
        from: Region,
        to: Region,
    ) -> Result<(), ExecError> {
        if from.space == SpaceId::HOST && to.space == SpaceId::HOST {
            self.cpu.move_between(cx, host, from, to)
        } else {
            self.gpu.move_between(cx, host, from, to)
        }
    }
}

impl<P: WorkerPool> Backend for MixedBackend<P> {
    fn name(&self) -> &'static str {
        "cpu + gpu (wgpu)"
    }
    fn serves(&self, p: Placement) -> bool {
        matches!(p, Placement::Cpu | Placement::Gpu)
    }
    /// The GPU prepares its instructions and checks the whole plan (placements, spaces, the loss on
    /// the CPU); the CPU needs nothing per plan.
    fn prepare(&mut self, plan: &Plan) -> Result<(), ExecError> {
        self.gpu.prepare(plan)
    }
    fn begin_step(&mut self, plan: &Plan, step: &StepStart<'_>) -> Result<(), ExecError> {
        self.cpu.begin_step(plan, step)?;
        self.gpu.begin_step(plan, step)
    }
    fn end_step(&mut self, plan: &Plan) -> Result<Option<LossOut>, ExecError> {
        self.gpu.end_step(plan)
    }
    fn read_tensor(&mut self, plan: &Plan, t: TensorId, out: &mut [f32]) -> Result<(), ExecError> {
        self.gpu.read_tensor(plan, t, out)
    }
    fn write_tensor(&mut self, plan: &Plan, t: TensorId, data: &[f32]) -> Result<(), ExecError> {
        self.gpu.write_tensor(plan, t, data)
    }
    fn init_params(&mut self, plan: &Plan, host: &mut [u8], seed: u64) -> Result<(), ExecError> {
        self.gpu.init_params(plan, host, seed)
    }
}
