//! An accelerator's hand in the int8 kernels (`std` only): while a host's [`Offload`] is installed on
//! the calling thread ([`install`]), [`igemm`](super::igemm), [`rescale_i32_to_i8`](super::rescale_i32_to_i8),
//! [`maxpool2x2`](super::maxpool2x2), [`maxpool2x2_grad`](super::maxpool2x2_grad) and
//! [`quantize_f32`](super::quantize_f32) ask it first, and [`IgemmKernel::selected`](super::IgemmKernel::selected)
//! answers `Portable`, so the int8 layer ops take their plain GEMM paths (no packing-free CPU
//! products) — the same integers, since every product is exact. A method that returns `false`
//! (declined, or its device failed: the offload remembers why) leaves the work to the CPU kernel.
//!
//! This is how the Hexagon DSP backend (`frugal-hexagon`) runs an int8 plan's heavy ops on the DSP
//! while the integer bookkeeping (exponents, rescale sites) stays in [`CpuInt8`](crate::backend::CpuInt8).
use std::boxed::Box;
use std::cell::RefCell;

use super::{MatRef, Rounding};

/// Kernels a device runs in place of the CPU's; each returns whether it did (the results are then
/// bit-identical to the CPU kernel's).
pub trait Offload {
    /// [`igemm`](super::igemm)'s `C = (accumulate ? C : 0) + A·B` (shapes already checked).
    #[allow(clippy::too_many_arguments)]
    fn igemm(
        &mut self,
        m: usize,
        n: usize,
        k: usize,
        a: MatRef<'_, i8>,
        b: MatRef<'_, i8>,
        c: &mut [i32],
        ldc: usize,
        accumulate: bool,
    ) -> bool;
    /// [`rescale_i32_to_i8`](super::rescale_i32_to_i8); `Some(clamped)` when done.
    fn rescale(
        &mut self,
        src: &[i32],
        shift: u32,
        rounding: Rounding,
        offset: u64,
        dst: &mut [i8],
    ) -> Option<usize>;
    /// [`maxpool2x2`](super::maxpool2x2) (shapes already checked).
    fn maxpool2x2(
        &mut self,
        x: &[i8],
        w: usize,
        pairs: usize,
        y: &mut [i8],
        idx: &mut [u8],
    ) -> bool;
    /// [`maxpool2x2_grad`](super::maxpool2x2_grad) (shapes already checked).
    fn maxpool2x2_grad(
        &mut self,
        dy: &[i8],
        idx: &[u8],
        w: usize,
        pairs: usize,
        dx: &mut [i8],
    ) -> bool;
    /// [`quantize_f32`](super::quantize_f32) (`dst` at least as long as `src`).
    fn quantize(&mut self, src: &[f32], k: f32, dst: &mut [i8]) -> bool;
}

std::thread_local! {
    static HOOK: RefCell<Option<Box<dyn Offload>>> = const { RefCell::new(None) };
}

/// Installs `o` on this thread; returns the one it replaces. No allocation: the box moves in.
pub fn install(o: Box<dyn Offload>) -> Option<Box<dyn Offload>> {
    HOOK.with(|h| h.borrow_mut().replace(o))
}

/// Removes this thread's offload and returns it.
pub fn take() -> Option<Box<dyn Offload>> {
    HOOK.with(|h| h.borrow_mut().take())
}

/// Whether an offload is installed on this thread.
pub fn active() -> bool {
    HOOK.with(|h| h.try_borrow().map(|o| o.is_some()).unwrap_or(true))
}

/// Runs `f` on the installed offload; `None` when there is none (or it is busy: a kernel it calls).
pub(super) fn with<R>(f: impl FnOnce(&mut dyn Offload) -> R) -> Option<R> {
    HOOK.with(|h| {
        let mut g = h.try_borrow_mut().ok()?;
        match g.as_mut() {
            Some(o) => Some(f(&mut **o)),
            None => None,
        }
    })
}
