//! Convolution on the GPU — stride, zero padding, groups (depthwise included) — forward, weight (and
//! bias) gradient, input gradient: per sample and channel group, im2col (`conv.wgsl`) then the tiled GEMM
//! with the group's weights, and for the input gradient the GEMM then col2im. The layouts are those of
//! the CPU's `ops::conv` (`x[n, cin, h, w]`, `w[cout, cin/groups, kh, kw]`, `y[n, cout, oh, ow]`).
//!
//! Like the other kernels here, each call moves its operands (and here the columns) through the host:
//! these check the kernels against the CPU; the GPU backend's step will chain them on the device.
use frugal_core::ops::ConvGeom;

use crate::elementwise::Pipelines;
use crate::{check_len, start_values, u32_of, GemmOpts, Gpu, GpuError};

pub(crate) const ENTRIES: [&str; 6] = [
    "im2col",
    "col2im",
    "direct_fwd",
    "direct_dx",
    "direct_dw",
    "direct_db",
];

/// Indices into [`ENTRIES`]: the direct kernels of the GPU step.
pub(crate) mod entry {
    pub const FWD: usize = 2;
    pub const DX: usize = 3;
    pub const DW: usize = 4;
    pub const DB: usize = 5;
}

pub(crate) fn pipelines(device: &wgpu::Device) -> Pipelines {
    Pipelines::from_source(device, "conv", include_str!("conv.wgsl"), &ENTRIES)
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct Params {
    cin_g: u32,
    h: u32,
    w: u32,
    kh: u32,
    kw: u32,
    sh: u32,
    sw: u32,
    ph: u32,
    pw: u32,
    oh: u32,
    ow: u32,
    group: u32,
    accumulate: u32,
    pad: [u32; 3],
}

/// The direct kernels' parameters: `n` samples, a bias or not, accumulate or not (see `conv.wgsl`).
pub(crate) fn direct_params(
    g: &ConvGeom,
    n: usize,
    bias: bool,
    accumulate: bool,
) -> Result<Params, GpuError> {
    let mut p = params(g, bias as usize, accumulate)?;
    p.pad = [u32_of(g.cout / g.groups)?, u32_of(g.groups)?, u32_of(n)?];
    Ok(p)
}

/// Per-group sizes: (cin_g, cout_g, K_g = cin_g·kh·kw, P = oh·ow).
fn dims(g: &ConvGeom) -> (usize, usize, usize, usize) {
    let (cin_g, cout_g) = (g.cin / g.groups, g.cout / g.groups);
    (cin_g, cout_g, cin_g * g.kh * g.kw, g.oh * g.ow)
}

fn params(g: &ConvGeom, group: usize, accumulate: bool) -> Result<Params, GpuError> {
    let u = u32_of;
    Ok(Params {
        cin_g: u(g.cin / g.groups)?,
        h: u(g.h)?,
        w: u(g.w)?,
        kh: u(g.kh)?,
        kw: u(g.kw)?,
        sh: u(g.sh)?,
        sw: u(g.sw)?,
        ph: u(g.ph)?,
        pw: u(g.pw)?,
        oh: u(g.oh)?,
        ow: u(g.ow)?,
        group: u(group)?,
        accumulate: accumulate as u32,
        pad: [0; 3],
    })
}

impl Gpu {
    /// The columns of sample `xs` (one sample, `cin·h·w`) for channel group `group`: `K_g × oh·ow`.
    fn im2col(&self, g: &ConvGeom, xs: &[f32], group: usize) -> Result<Vec<f32>, GpuError> {
        let (_, _, kg, pp) = dims(g);
        let p = params(g, group, false)?;
        let cols = vec![0f32; kg * pp];
        let [cols, _] = self.run_set(
            &self.conv,
            0,
            bytemuck::bytes_of(&p),
            kg * pp,
            [xs, &[], &cols, &[]],
        )?;
        Ok(cols)
    }

    /// `y = conv(x, w) + b` for `n` samples.
    pub fn conv_fwd(
        &self,
        g: &ConvGeom,
        n: usize,
        x: &[f32],
        w: &[f32],
        b: Option<&[f32]>,
    ) -> Result<Vec<f32>, GpuError> {
        let (_, cout_g, kg, pp) = dims(g);
        check_len("x", x.len(), n * g.in_len())?;
        check_len("w", w.len(), g.weight_len())?;
        if let Some(b) = b {
            check_len("b", b.len(), g.cout)?;
        }
        let mut y = vec![0f32; n * g.out_len()];
        for s in 0..n {
            let xs = &x[s * g.in_len()..(s + 1) * g.in_len()];
            for gr in 0..g.groups {
                let cols = self.im2col(g, xs, gr)?;
                let wg = &w[gr * cout_g * kg..(gr + 1) * cout_g * kg];
                // As the CPU: the bias first, the product accumulated onto it.
                let start: Vec<f32> = match b {
                    Some(b) => (0..cout_g * pp).map(|i| b[gr * cout_g + i / pp]).collect(),
                    None => Vec::new(),
                };
                let opts = GemmOpts {
                    accumulate: b.is_some(),
                    ..Default::default()
                };
                let yg = self.sgemm_with(cout_g, pp, kg, wg, &cols, opts, &start)?;
                let at = s * g.out_len() + gr * cout_g * pp;
                y[at..at + cout_g * pp].copy_from_slice(&yg);
            }
        }
        Ok(y)
    }

    /// `(dW, db)`: `dW (+)= Σ_samples dY·colsᵀ` per group, `db (+)= Σ dY`; `old` holds their previous
    /// values when accumulating.
    pub fn conv_grad_w(
        &self,
        g: &ConvGeom,
        n: usize,
        x: &[f32],
        dy: &[f32],
        old: Option<(&[f32], &[f32])>,
        with_bias: bool,
    ) -> Result<(Vec<f32>, Vec<f32>), GpuError> {
        let (_, cout_g, kg, pp) = dims(g);
        check_len("x", x.len(), n * g.in_len())?;
        check_len("dy", dy.len(), n * g.out_len())?;
        let (mut dw, mut db) = match old {
            Some((w, b)) => {
                check_len("dW", w.len(), g.weight_len())?;
                check_len("db", b.len(), g.cout)?;
                (w.to_vec(), b.to_vec())
            }
            None => (vec![0f32; g.weight_len()], vec![0f32; g.cout]),
        };
        let acc = GemmOpts {
            trans_b: true,
            accumulate: true,
            ..Default::default()
        };
        for s in 0..n {
            let xs = &x[s * g.in_len()..(s + 1) * g.in_len()];
            for gr in 0..g.groups {
                let cols = self.im2col(g, xs, gr)?;
                let at = s * g.out_len() + gr * cout_g * pp;
                let dyg = &dy[at..at + cout_g * pp];
                let wr = gr * cout_g * kg..(gr + 1) * cout_g * kg;
                let new = self.sgemm_with(cout_g, kg, pp, dyg, &cols, acc, &dw[wr.clone()])?;
                dw[wr].copy_from_slice(&new);
            }
        }
        if with_bias {
            // Σ over samples and positions: a row of ones times dY seen as [n·cout, P] per channel.
            for s in 0..n {
                let dys = &dy[s * g.out_len()..(s + 1) * g.out_len()];
                let ones = vec![1f32; pp];
                let opts = GemmOpts {
                    trans_b: true,
                    accumulate: true,
                    ..Default::default()
                };
                db = self.sgemm_with(1, g.cout, pp, &ones, dys, opts, &db)?;
            }
        } else {
            db.clear();
        }
        Ok((dw, db))
    }

    /// `dx (+)= conv_transpose(dy, w)`; `old` is dx's previous value when accumulating.
    pub fn conv_grad_x(
        &self,
        g: &ConvGeom,
        n: usize,
        dy: &[f32],
        w: &[f32],
        old: Option<&[f32]>,
    ) -> Result<Vec<f32>, GpuError> {
        let (cin_g, cout_g, kg, pp) = dims(g);
        check_len("dy", dy.len(), n * g.out_len())?;
        check_len("w", w.len(), g.weight_len())?;
        let mut dx = start_values("dx", old, n * g.in_len())?;
        let ta = GemmOpts {
            trans_a: true,
            ..Default::default()
        };
        for s in 0..n {
            let r = s * g.in_len()..(s + 1) * g.in_len();
            for gr in 0..g.groups {
                let at = s * g.out_len() + gr * cout_g * pp;
                let dyg = &dy[at..at + cout_g * pp];
                let wg = &w[gr * cout_g * kg..(gr + 1) * cout_g * kg];
                let dcols = self.sgemm_with(kg, pp, cout_g, wg, dyg, ta, &[])?;
                let p = params(g, gr, old.is_some())?;
                let [new, _] = self.run_set(
                    &self.conv,
                    1,
                    bytemuck::bytes_of(&p),
                    cin_g * g.h * g.w,
                    [&dcols, &[], &dx[r.clone()], &[]],
                )?;
                dx[r.clone()].copy_from_slice(&new);
            }
        }
        Ok(dx)
    }
}
