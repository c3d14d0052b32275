//! Max and average pooling on the GPU (`pool.wgsl`), forward and backward, bit for bit with the CPU's
//! `ops::pool` (the same order of comparisons and additions).
use frugal_core::ops::PoolGeom;

use crate::elementwise::Pipelines;
use crate::{check_len, start_values, u32_of, Gpu, GpuError};

pub(crate) const ENTRIES: [&str; 6] = [
    "max_fwd", "max_grad", "avg_fwd", "avg_grad", "gap_fwd", "gap_grad",
];

pub(crate) fn pipelines(device: &wgpu::Device) -> Pipelines {
    Pipelines::from_source(device, "pool", include_str!("pool.wgsl"), &ENTRIES)
}

/// The uniform block of `pool.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct Params {
    planes: u32,
    h: u32,
    w: u32,
    kh: u32,
    kw: u32,
    sh: u32,
    sw: u32,
    oh: u32,
    ow: u32,
    accumulate: u32,
    /// `1/(window size)`: average pools multiply by it, as the CPU does (`ops::pool`): WGSL's `/`
    /// may be off by ulps on real GPUs.
    inv: f32,
    /// Always 0: `pool.wgsl`'s `rounded` ORs products with it so that no driver fuses them into an FMA.
    zero: u32,
}

pub(crate) fn params(g: &PoolGeom, n: usize, accumulate: bool) -> Result<Params, GpuError> {
    let u = u32_of;
    Ok(Params {
        planes: u(n
            .checked_mul(g.c)
            .ok_or(GpuError::Shape("too many planes".into()))?)?,
        h: u(g.h)?,
        w: u(g.w)?,
        kh: u(g.kh)?,
        kw: u(g.kw)?,
        sh: u(g.sh)?,
        sw: u(g.sw)?,
        oh: u(g.oh)?,
        ow: u(g.ow)?,
        accumulate: accumulate as u32,
        inv: 1.0 / (g.kh * g.kw) as f32,
        zero: 0,
    })
}

fn lens(g: &PoolGeom, n: usize) -> (usize, usize) {
    (n * g.c * g.h * g.w, n * g.c * g.oh * g.ow)
}

impl Gpu {
    /// Max pooling of `n` samples: `(y, argmax)` (plane-local indices of each window's first maximum).
    pub fn maxpool_fwd(
        &self,
        g: &PoolGeom,
        n: usize,
        x: &[f32],
    ) -> Result<(Vec<f32>, Vec<u32>), GpuError> {
        let (xl, yl) = lens(g, n);
        check_len("x", x.len(), xl)?;
        let p = params(g, n, false)?;
        let zeros = vec![0f32; yl];
        let [y, arg] = self.run_set(
            &self.pool,
            0,
            bytemuck::bytes_of(&p),
            yl,
            [x, &[], &zeros, &zeros],
        )?;
        Ok((y, arg.iter().map(|v| v.to_bits()).collect()))
    }

    /// Max pooling backward: `dx (+)= dy` at each window's argmax; `old` is dx's previous value when
    /// accumulating.
    pub fn maxpool_grad_x(
        &self,
        g: &PoolGeom,
        n: usize,
        dy: &[f32],
        argmax: &[u32],
        old: Option<&[f32]>,
    ) -> Result<Vec<f32>, GpuError> {
        let (xl, yl) = lens(g, n);
        check_len("dy", dy.len(), yl)?;
        check_len("argmax", argmax.len(), yl)?;
        let bits: Vec<f32> = argmax.iter().map(|&i| f32::from_bits(i)).collect();
        let dx = start_values("dx", old, xl)?;
        let p = params(g, n, old.is_some())?;
        let [dx, _] = self.run_set(
            &self.pool,
            1,
            bytemuck::bytes_of(&p),
            xl,
            [dy, &bits, &dx, &[]],
        )?;
        Ok(dx)
    }

    /// Average pooling of `n` samples.
    pub fn avgpool_fwd(&self, g: &PoolGeom, n: usize, x: &[f32]) -> Result<Vec<f32>, GpuError> {
        let (xl, yl) = lens(g, n);
        check_len("x", x.len(), xl)?;
        let p = params(g, n, false)?;
        let zeros = vec![0f32; yl];
        let [y, _] = self.run_set(
            &self.pool,
            2,
            bytemuck::bytes_of(&p),
            yl,
            [x, &[], &zeros, &[]],
        )?;
        Ok(y)
    }

    /// Average pooling backward: `dx (+)= dy/(kh·kw)` over each window.
    pub fn avgpool_grad_x(
        &self,
        g: &PoolGeom,
        n: usize,
        dy: &[f32],
        old: Option<&[f32]>,
    ) -> Result<Vec<f32>, GpuError> {
        let (xl, yl) = lens(g, n);
        check_len("dy", dy.len(), yl)?;
        let dx = start_values("dx", old, xl)?;
        let p = params(g, n, old.is_some())?;
        let [dx, _] = self.run_set(
            &self.pool,
            3,
            bytemuck::bytes_of(&p),
            xl,
            [dy, &[], &dx, &[]],
        )?;
        Ok(dx)
    }

    /// Global average pooling of `n` samples of `c` planes of `hw` values: one mean per plane.
    pub fn global_avgpool_fwd(
        &self,
        n: usize,
        c: usize,
        hw: usize,
        x: &[f32],
    ) -> Result<Vec<f32>, GpuError> {
        check_len("x", x.len(), n * c * hw)?;
        let p = gap_params(n * c, hw, false)?;
        let y = vec![0f32; n * c];
        let [y, _] = self.run_set(
            &self.pool,
            4,
            bytemuck::bytes_of(&p),
            n * c,
            [x, &[], &y, &[]],
        )?;
        Ok(y)
    }

    /// Global average pooling backward: `dx (+)= dy/hw` over each plane.
    pub fn global_avgpool_grad_x(
        &self,
        n: usize,
        c: usize,
        hw: usize,
        dy: &[f32],
        old: Option<&[f32]>,
    ) -> Result<Vec<f32>, GpuError> {
        check_len("dy", dy.len(), n * c)?;
        let dx = start_values("dx", old, n * c * hw)?;
        let p = gap_params(n * c, hw, old.is_some())?;
        let [dx, _] = self.run_set(
            &self.pool,
            5,
            bytemuck::bytes_of(&p),
            dx.len(),
            [dy, &[], &dx, &[]],
        )?;
        Ok(dx)
    }
}

/// Parameters for the global pools: planes of `hw` values (as h = hw, w = 1).
pub(crate) fn gap_params(planes: usize, hw: usize, accumulate: bool) -> Result<Params, GpuError> {
    let u = u32_of;
    Ok(Params {
        planes: u(planes)?,
        h: u(hw)?,
        w: 1,
        kh: 1,
        kw: 1,
        sh: 1,
        sw: 1,
        oh: 1,
        ow: 1,
        accumulate: accumulate as u32,
        inv: 1.0 / hw as f32,
        zero: 0,
    })
}
