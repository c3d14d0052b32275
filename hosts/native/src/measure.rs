//! Measuring plans on this device: ms/step on synthetic data, per-instruction times, and the profiled
//! [`CostModel`] the policy search uses (fitted from instruction times at two batch sizes).
use std::time::Instant;

use frugal_core::exec::{ExecError, Executor, Target};
use frugal_core::graph::{Graph, GraphError};
use frugal_core::model::{LossKind, ModelSpec};
use frugal_core::plan::{Instr, Plan};
use frugal_core::policy::CostModel;
use frugal_core::rng::Rng;

/// Synthetic batch for `plan`: inputs uniform in [-1, 1), labels cycling through the classes.
pub struct Batch {
    /// Inputs.
    pub x: Vec<f32>,
    /// Class labels (cross-entropy).
    pub classes: Vec<u32>,
    /// Regression targets (MSE).
    pub values: Vec<f32>,
    loss: LossKind,
}

impl Batch {
    /// A batch of `n` samples for `plan`.
    pub fn new(plan: &Plan, n: usize) -> Batch {
        let per = plan.graph.input_dims.numel();
        let outs = plan.graph.pred_dims().numel();
        let mut rng = Rng::new(7);
        let x = (0..n * per).map(|_| rng.uniform(-1.0, 1.0)).collect();
        let loss = plan.graph.loss;
        let values = if loss == LossKind::Mse {
            (0..n * outs).map(|_| rng.uniform(-1.0, 1.0)).collect()
        } else {
            Vec::new()
        };
        Batch {
            x,
            classes: (0..n).map(|i| (i % outs) as u32).collect(),
            values,
            loss,
        }
    }
    /// The targets.
    pub fn target(&self) -> Target<'_> {
        if self.loss == LossKind::Mse {
            Target::Values(&self.values)
        } else {
            Target::Classes(&self.classes)
        }
    }
}

/// Median milliseconds per training step of `plan` over `steps` steps (after one warm-up).
pub fn step_ms(plan: &Plan, steps: usize) -> Result<f64, ExecError> {
    let mut arena = vec![0u8; plan.needed_bytes()];
    let mut ex = Executor::new(plan, &arena)?;
    ex.init_params(&mut arena, 1)?;
    let b = Batch::new(plan, plan.batch());
    ex.train_step(&mut arena, &b.x, b.target())?;
    let mut t: Vec<f64> = Vec::with_capacity(steps);
    for _ in 0..steps.max(1) {
        let s = Instant::now();
        ex.train_step(&mut arena, &b.x, b.target())?;
        t.push(s.elapsed().as_secs_f64() * 1e3);
    }
    t.sort_by(|a, b| a.total_cmp(b));
    Ok(t[t.len() / 2])
}

/// Nanoseconds of each instruction of `plan` (median over `steps` steps).
pub fn instr_ns(plan: &Plan, steps: usize) -> Result<Vec<f64>, ExecError> {
    let mut arena = vec![0u8; plan.needed_bytes()];
    let mut ex = Executor::new(plan, &arena)?;
    ex.init_params(&mut arena, 1)?;
    let b = Batch::new(plan, plan.batch());
    let n = plan.program.len();
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); n];
    for step in 0..steps + 1 {
        let mut last = Instant::now();
        let mut obs = |eo: usize, _: &Instr, _: &[u8]| {
            let now = Instant::now();
            if step > 0 {
                samples[eo].push((now - last).as_secs_f64() * 1e9);
            }
            last = now;
        };
        ex.train_step_observed(&mut arena, &b.x, b.target(), &mut obs)?;
    }
    Ok(samples
        .into_iter()
        .map(|mut v| {
            v.sort_by(|a, b| a.total_cmp(b));
            v.get(v.len() / 2).copied().unwrap_or(0.0)
        })
        .collect())
}

/// Why profiling failed.
#[derive(Debug)]
pub enum ProfileError {
    /// The model does not realise.
    Graph(GraphError),
    /// A step failed.
    Exec(ExecError),
}

impl std::fmt::Display for ProfileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProfileError::Graph(e) => write!(f, "{e}"),
            ProfileError::Exec(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ProfileError {}

/// Profiles `spec` on this device: instruction times of the plain plan at `batch` and at a quarter of it,
/// fitted per node and phase as `fixed + per_sample × n`.
pub fn profile(spec: &ModelSpec, batch: usize) -> Result<CostModel, ProfileError> {
    let small = (batch / 4).max(1);
    let g = Graph::new(spec, batch).map_err(ProfileError::Graph)?;
    let pa = Plan::new(g.clone());
    let pb = Plan::new(Graph::new(spec, small).map_err(ProfileError::Graph)?);
    let ta = instr_ns(&pa, 3).map_err(ProfileError::Exec)?;
    let tb = instr_ns(&pb, 3).map_err(ProfileError::Exec)?;
    Ok(CostModel::fit(&g, (&pa, batch, &ta), (&pb, small, &tb)))
}
