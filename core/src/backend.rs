//! The `Backend` trait: the op families a host may accelerate (GEMM today; convolution, element-wise,
//! int8 GEMM with rescale as backends arrive). The CPU implementation lives here; `frugal-wgpu` and the
//! Hexagon path implement the same trait. Every method borrows slices of the arena: no ownership, no
//! allocation.
use crate::kernels::{self, MatRef};

/// Where an instruction runs. Part of every plan instruction so accelerators slot in without a format change.
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

/// Dense f32 matrix products.
pub trait GemmOps {
    /// `C = A·B` (or `+=` when `accumulate`); `C` row-major with row stride `ldc`; `scratch` from the arena.
    #[allow(clippy::too_many_arguments)]
    fn sgemm(
        &mut self,
        m: usize,
        n: usize,
        k: usize,
        a: MatRef<'_, f32>,
        b: MatRef<'_, f32>,
        c: &mut [f32],
        ldc: usize,
        accumulate: bool,
        scratch: &mut [f32],
    );
}

/// A compute backend: a name plus the op families it implements.
pub trait Backend: GemmOps {
    /// Short name for reports.
    fn name(&self) -> &'static str;
    /// Placement instructions for this backend carry.
    fn placement(&self) -> Placement;
}

/// The portable CPU backend (SIMD where the target has it).
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuBackend;

impl GemmOps for CpuBackend {
    fn sgemm(
        &mut self,
        m: usize,
        n: usize,
        k: usize,
        a: MatRef<'_, f32>,
        b: MatRef<'_, f32>,
        c: &mut [f32],
        ldc: usize,
        accumulate: bool,
        scratch: &mut [f32],
    ) {
        kernels::gemm::sgemm(m, n, k, a, b, c, ldc, accumulate, scratch)
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }
    fn placement(&self) -> Placement {
        Placement::Cpu
    }
}
