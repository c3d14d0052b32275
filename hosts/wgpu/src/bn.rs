//! BatchNorm in training mode on the GPU (`bn.wgsl`): forward (batch statistics, running statistics)
//! and backward (γ, β and input gradients), with the CPU's `ops::bn` formulas.
use crate::elementwise::{per_workgroup, Pipelines};
use crate::{check_len, start_values, u32_of, Gpu, GpuError};

pub(crate) const ENTRIES: [&str; 7] = [
    "stats", "affine", "sums", "dparams", "dx", "eval_fwd", "eval_dx",
];

/// Indices into [`ENTRIES`].
pub(crate) mod entry {
    pub const STATS: usize = 0;
    pub const AFFINE: usize = 1;
    pub const SUMS: usize = 2;
    pub const DPARAMS: usize = 3;
    pub const DX: usize = 4;
    pub const EVAL_FWD: usize = 5;
    pub const EVAL_DX: usize = 6;
}

pub(crate) fn pipelines(device: &wgpu::Device) -> Pipelines {
    Pipelines::from_source(device, "bn", include_str!("bn.wgsl"), &ENTRIES)
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct Params {
    n: u32,
    c: u32,
    hw: u32,
    accumulate: u32,
    momentum: f32,
    eps: f32,
    pad: [f32; 2],
}

/// What a training-mode forward produces.
#[derive(Clone, Debug, PartialEq)]
pub struct BnForward {
    /// The output.
    pub y: Vec<f32>,
    /// Batch mean per channel.
    pub mean: Vec<f32>,
    /// `1/√(var + eps)` per channel.
    pub invstd: Vec<f32>,
    /// The updated running mean.
    pub run_mean: Vec<f32>,
    /// The updated running variance (unbiased).
    pub run_var: Vec<f32>,
}

/// The gradients of a training-mode BatchNorm.
#[derive(Clone, Debug, PartialEq)]
pub struct BnGrads {
    /// dL/dγ.
    pub dgamma: Vec<f32>,
    /// dL/dβ.
    pub dbeta: Vec<f32>,
    /// dL/dx.
    pub dx: Vec<f32>,
}

pub(crate) fn params(
    n: usize,
    c: usize,
    hw: usize,
    acc: bool,
    momentum: f32,
    eps: f32,
) -> Result<Params, GpuError> {
    let u = u32_of;
    Ok(Params {
        n: u(n)?,
        c: u(c)?,
        hw: u(hw)?,
        accumulate: acc as u32,
        momentum,
        eps,
        pad: [0.0; 2],
    })
}

impl Gpu {
    /// Training-mode forward of `n` samples of `c` channels of `hw` positions.
    #[allow(clippy::too_many_arguments)]
    pub fn bn_fwd_train(
        &self,
        (n, c, hw): (usize, usize, usize),
        x: &[f32],
        gamma: &[f32],
        beta: &[f32],
        run_mean: &[f32],
        run_var: &[f32],
        momentum: f32,
        eps: f32,
    ) -> Result<BnForward, GpuError> {
        check_len("x", x.len(), n * c * hw)?;
        for (what, v) in [
            ("gamma", gamma),
            ("beta", beta),
            ("run_mean", run_mean),
            ("run_var", run_var),
        ] {
            check_len(what, v.len(), c)?;
        }
        let p = params(n, c, hw, false, momentum, eps)?;
        let mut s = vec![0f32; 8 * c];
        s[2 * c..3 * c].copy_from_slice(gamma);
        s[3 * c..4 * c].copy_from_slice(beta);
        s[4 * c..5 * c].copy_from_slice(run_mean);
        s[5 * c..6 * c].copy_from_slice(run_var);
        let bytes = bytemuck::bytes_of(&p);
        let [_, s] = self.run_set(&self.bn, 0, bytes, per_workgroup(c), [x, &[], &[], &s])?;
        let y = vec![0f32; x.len()];
        let [y, _] = self.run_set(&self.bn, 1, bytes, x.len(), [x, &[], &y, &s])?;
        Ok(BnForward {
            y,
            mean: s[..c].to_vec(),
            invstd: s[c..2 * c].to_vec(),
            run_mean: s[4 * c..5 * c].to_vec(),
            run_var: s[5 * c..6 * c].to_vec(),
        })
    }

    /// Training-mode backward from the forward's `mean` and `invstd`; `old` holds (dγ, dβ, dx) to add
    /// to when accumulating.
    #[allow(clippy::too_many_arguments)]
    pub fn bn_grad(
        &self,
        (n, c, hw): (usize, usize, usize),
        x: &[f32],
        dy: &[f32],
        mean: &[f32],
        invstd: &[f32],
        gamma: &[f32],
        old: Option<(&[f32], &[f32], &[f32])>,
    ) -> Result<BnGrads, GpuError> {
        check_len("x", x.len(), n * c * hw)?;
        check_len("dy", dy.len(), n * c * hw)?;
        for (what, v) in [("mean", mean), ("invstd", invstd), ("gamma", gamma)] {
            check_len(what, v.len(), c)?;
        }
        let p = params(n, c, hw, old.is_some(), 0.0, 0.0)?;
        let mut s = vec![0f32; 8 * c];
        s[..c].copy_from_slice(mean);
        s[c..2 * c].copy_from_slice(invstd);
        s[2 * c..3 * c].copy_from_slice(gamma);
        let bytes = bytemuck::bytes_of(&p);
        let [_, s] = self.run_set(&self.bn, 2, bytes, per_workgroup(c), [x, dy, &[], &s])?;
        let (mut params_old, dx_old) = match old {
            Some((dg, db, dx)) => {
                check_len("dgamma", dg.len(), c)?;
                check_len("dbeta", db.len(), c)?;
                check_len("dx", dx.len(), x.len())?;
                ([dg, db].concat(), dx.to_vec())
            }
            None => (vec![0f32; 2 * c], vec![0f32; x.len()]),
        };
        let [pg, _] = self.run_set(&self.bn, 3, bytes, c, [&[], &[], &params_old, &s])?;
        params_old = pg;
        let [dx, _] = self.run_set(&self.bn, 4, bytes, x.len(), [x, dy, &dx_old, &s])?;
        Ok(BnGrads {
            dgamma: params_old[..c].to_vec(),
            dbeta: params_old[c..].to_vec(),
            dx,
        })
    }

    /// Evaluation-mode forward from the running statistics.
    #[allow(clippy::too_many_arguments)]
    pub fn bn_fwd_eval(
        &self,
        (n, c, hw): (usize, usize, usize),
        x: &[f32],
        gamma: &[f32],
        beta: &[f32],
        run_mean: &[f32],
        run_var: &[f32],
        eps: f32,
    ) -> Result<Vec<f32>, GpuError> {
        check_len("x", x.len(), n * c * hw)?;
        let s = eval_stats(c, gamma, beta, run_mean, run_var)?;
        let p = params(n, c, hw, false, 0.0, eps)?;
        let y = vec![0f32; x.len()];
        let [y, _] = self.run_set(
            &self.bn,
            5,
            bytemuck::bytes_of(&p),
            x.len(),
            [x, &[], &y, &s],
        )?;
        Ok(y)
    }

    /// Evaluation-mode input gradient; `old` is dx's previous value when accumulating.
    #[allow(clippy::too_many_arguments)]
    pub fn bn_grad_x_eval(
        &self,
        (n, c, hw): (usize, usize, usize),
        dy: &[f32],
        gamma: &[f32],
        run_var: &[f32],
        eps: f32,
        old: Option<&[f32]>,
    ) -> Result<Vec<f32>, GpuError> {
        check_len("dy", dy.len(), n * c * hw)?;
        let zeros = vec![0f32; c];
        let s = eval_stats(c, gamma, &zeros, &zeros, run_var)?;
        let dx = start_values("dx", old, dy.len())?;
        let p = params(n, c, hw, old.is_some(), 0.0, eps)?;
        let [dx, _] = self.run_set(
            &self.bn,
            6,
            bytemuck::bytes_of(&p),
            dy.len(),
            [dy, &[], &dx, &s],
        )?;
        Ok(dx)
    }
}

/// The statistics buffer for evaluation mode: γ, β, running mean and variance in their rows.
fn eval_stats(
    c: usize,
    gamma: &[f32],
    beta: &[f32],
    run_mean: &[f32],
    run_var: &[f32],
) -> Result<Vec<f32>, GpuError> {
    let mut s = vec![0f32; 8 * c];
    for (row, (what, v)) in [
        (2, ("gamma", gamma)),
        (3, ("beta", beta)),
        (4, ("run_mean", run_mean)),
        (5, ("run_var", run_var)),
    ] {
        check_len(what, v.len(), c)?;
        s[row * c..(row + 1) * c].copy_from_slice(v);
    }
    Ok(s)
}
