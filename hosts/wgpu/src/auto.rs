//! Placement by measured cost (`--device auto`): each node's time on the CPU and on the GPU, the
//! host↔GPU link's latency and bandwidth, all measured on this machine, then
//! [`frugal_core::policy::mixed::place_by_cost`] (the DP of `policy::placement` over the nodes in
//! execution order, transfers at each boundary) and the mixed plan it chose.
//!
//! - CPU: a few training steps of the all-CPU plan with an observer that reads the clock after every
//!   instruction; an instruction's time goes to its node.
//! - GPU: the same steps of the all-GPU plan with the backend profiling ([`GpuBackend::set_profiling`]:
//!   each instruction submitted alone and waited for, less an empty submission's time).
//! - Link: [`Gpu::measure_link`] — a small and a large move each way, best of a few; latency from the
//!   small one, bandwidth from the difference.
//!
//! One warm-up step each, then the mean of `steps` steps. The loss runs on the CPU in a mixed plan, so
//! it is no node's cost. Times are wall-clock seconds: a loaded machine skews them.
use std::time::Instant;

use frugal_core::backend::{CpuBackend, ExecError, Placement, Target};
use frugal_core::exec::Executor;
use frugal_core::plan::{Instr, Phase, Plan};
use frugal_core::policy::mixed::{place_by_cost, Link};
use frugal_core::pool::WorkerPool;

use crate::{gpu_plan, mixed_plan, Gpu, GpuBackend, GpuError};

/// What [`measure`] found.
#[derive(Clone, Debug)]
pub struct Measured {
    /// Per node: seconds per step on the CPU and on the GPU.
    pub node: Vec<[f64; 2]>,
    /// The host↔GPU link.
    pub link: Link,
}

/// The placement [`auto_plan`] chose.
#[derive(Clone, Debug)]
pub struct Auto {
    /// The mixed plan.
    pub plan: Plan,
    /// Device per node.
    pub devices: Vec<Placement>,
    /// The DP's predicted seconds per step (node costs and transfers).
    pub predicted: f64,
    /// All-CPU total by the measured costs (no transfers).
    pub all_cpu: f64,
    /// What was measured.
    pub measured: Measured,
}

/// Seconds per execution order, summed into each instruction's node (loss and moves aside).
fn per_node(plan: &Plan, per_eo: &[f64], steps: f64) -> Vec<f64> {
    let mut out = vec![0.0; plan.graph.nodes.len()];
    for (eo, ins) in plan.program.iter().enumerate() {
        if matches!(ins.phase, Phase::Loss | Phase::Move) {
            continue;
        }
        if let (Some(o), Some(t)) = (out.get_mut(ins.node as usize), per_eo.get(eo)) {
            *o += t / steps;
        }
    }
    out
}

/// Measures `plan`'s nodes on the CPU (on `cpu`, with the worker pool the mixed plan's CPU side will
/// run on) and on `gpu`, and the link, training `steps` steps (after one warm-up) on `x`/`target` in
/// throwaway memory.
pub fn measure<P: WorkerPool + Clone>(
    plan: &Plan,
    cpu: &CpuBackend<P>,
    gpu: GpuBackend,
    x: &[f32],
    target: Target<'_>,
    steps: usize,
) -> Result<(Measured, GpuBackend), ExecError> {
    let steps = steps.max(1);
    // CPU: the clock after every instruction.
    let mut cpu_eo = vec![0.0f64; plan.program.len()];
    {
        let mut arena = vec![0u8; plan.needed_bytes()];
        let mut ex = Executor::with_backend(plan, &arena, cpu.clone())?;
        ex.init_params(&mut arena, 1)?;
        ex.train_step(&mut arena, x, target)?;
        for _ in 0..steps {
            let mut last = Instant::now();
            let mut obs = |eo: usize, _: &Instr, _: &[u8]| {
                let now = Instant::now();
                cpu_eo[eo] += (now - last).as_secs_f64();
                last = now;
            };
            ex.train_step_observed(&mut arena, x, target, &mut obs)?;
        }
    }
    // GPU: each instruction submitted alone.
    let gp = gpu_plan(plan.clone());
    let mut arena = vec![0u8; gp.needed_bytes()];
    let mut ex = Executor::with_backend(&gp, &arena, gpu)?;
    ex.init_params(&mut arena, 1)?;
    ex.backend_mut().set_profiling(true);
    ex.train_step(&mut arena, x, target)?;
    ex.backend_mut().set_profiling(true); // the warm-up step does not count
    for _ in 0..steps {
        ex.train_step(&mut arena, x, target)?;
    }
    let gpu_eo = ex.backend().profile().to_vec();
    let mut gpu = ex.into_backend();
    gpu.set_profiling(false);
    let link = gpu
        .gpu()
        .measure_link(plan_move_bytes(plan), 5)
        .map_err(|e| {
            eprintln!("frugal-wgpu: {e}");
            ExecError::Unsupported("measuring the host-GPU link failed")
        })?;
    let cpu = per_node(plan, &cpu_eo, steps as f64);
    let gpu_n = per_node(plan, &gpu_eo, steps as f64);
    Ok((
        Measured {
            node: cpu.into_iter().zip(gpu_n).map(|(c, g)| [c, g]).collect(),
            link,
        },
        gpu,
    ))
}

/// The largest activation of `plan` (the largest value a move would carry), at least 4 KiB.
fn plan_move_bytes(plan: &Plan) -> usize {
    plan.graph
        .nodes
        .iter()
        .map(|n| plan.graph.tensors[n.out as usize].bytes)
        .max()
        .unwrap_or(0)
        .max(4096)
}

/// Measures (see [`measure`]), places by the DP and builds the mixed plan; gives the GPU backend back
/// for the caller to wrap in a [`crate::MixedBackend`] beside `cpu`.
pub fn auto_plan<P: WorkerPool + Clone>(
    plan: &Plan,
    cpu: &CpuBackend<P>,
    gpu: GpuBackend,
    x: &[f32],
    target: Target<'_>,
    steps: usize,
) -> Result<(Auto, GpuBackend), ExecError> {
    let (measured, gpu) = measure(plan, cpu, gpu, x, target, steps)?;
    let (predicted, devices) = place_by_cost(plan, &measured.node, &measured.link)
        .map_err(|_| ExecError::Unsupported("no finite placement (a node neither device runs)"))?;
    let mixed = mixed_plan(plan.clone(), &devices).map_err(|e| {
        eprintln!("frugal-wgpu: {e}");
        ExecError::Unsupported("the chosen placement does not make a mixed plan")
    })?;
    let all_cpu = measured.node.iter().map(|c| c[0]).sum();
    Ok((
        Auto {
            plan: mixed,
            devices,
            predicted,
            all_cpu,
            measured,
        },
        gpu,
    ))
}

impl Gpu {
    /// The host↔GPU link: a 256-byte and a `bytes`-byte move each way (queue write + submit + wait up;
    /// copy + map + wait down), best of `reps`; latency is the small move's time, bandwidth the extra
    /// bytes over the extra time.
    pub fn measure_link(&self, bytes: usize, reps: usize) -> Result<Link, GpuError> {
        let big = bytes.max(4096).div_ceil(256) * 256;
        let buf = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("link"),
            size: big as u64,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_DST
                | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let data = vec![0x3Cu8; big];
        let best = |f: &dyn Fn() -> Result<(), GpuError>| -> Result<f64, GpuError> {
            let mut b = f64::INFINITY;
            for _ in 0..reps.max(1) {
                let t = Instant::now();
                f()?;
                b = b.min(t.elapsed().as_secs_f64());
            }
            Ok(b)
        };
        let up = |n: usize| {
            best(&|| {
                self.queue.write_buffer(&buf, 0, &data[..n]);
                self.queue.submit([]);
                self.wait()
            })
        };
        let down = |n: usize| best(&|| self.read_range(&buf, 0, n / 4).map(|_| ()));
        let fit = |small: f64, large: f64| {
            let extra = (large - small).max(1e-9);
            (small, (big - 256) as f64 / extra)
        };
        let (up_latency, up_bandwidth) = fit(up(256)?, up(big)?);
        let (down_latency, down_bandwidth) = fit(down(256)?, down(big)?);
        Ok(Link {
            up_latency,
            up_bandwidth,
            down_latency,
            down_bandwidth,
        })
    }
}
