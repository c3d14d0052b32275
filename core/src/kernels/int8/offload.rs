//! An accelerator's hand in the int8 kernels (`std` only; tests too): while a host's [`Offload`] is installed on
//! the calling thread ([`install`]), [`igemm`](super::igemm), [`rescale_i32_to_i8`](super::rescale_i32_to_i8),
//! [`maxpool2x2`](super::maxpool2x2), [`maxpool2x2_grad`](super::maxpool2x2_grad),
//! [`quantize_f32`](super::quantize_f32) and the int8 convolutions' im2col (`quant::ops::im2col`) ask it first, and [`IgemmKernel::selected`](super::IgemmKernel::selected)
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
    /// `quant::ops::im2col` of group `grp` of `samples` samples `x`: `cols[kg × ld]`, sample `s` in
    /// columns `[s·P, (s+1)·P)` of each row, zero padding, the columns from `samples·P` to `ld`
    /// untouched. `geom` = `[cin, h, w, cout, kh, kw, sh, sw, ph, pw, groups, oh, ow]` (a checked
    /// convolution geometry). Declined by default.
    #[allow(clippy::too_many_arguments)]
    fn im2col(
        &mut self,
        _geom: [usize; 13],
        _x: &[i8],
        _samples: usize,
        _grp: usize,
        _cols: &mut [i8],
        _ld: usize,
    ) -> bool {
        false
    }
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

/// Asks the installed offload to do an im2col ([`Offload::im2col`]); whether it did.
pub fn im2col(
    geom: [usize; 13],
    x: &[i8],
    samples: usize,
    grp: usize,
    cols: &mut [i8],
    ld: usize,
) -> bool {
    with(|o| o.im2col(geom, x, samples, grp, cols, ld)) == Some(true)
}

/// Whether an offload is installed on this thread.
pub fn active() -> bool {
    HOOK.with(|h| h.try_borrow().map(|o| o.is_some()).unwrap_or(true))
}

/// Runs `f` on the installed offload; `None` when there is none (or it is busy: a kernel it calls).
pub(super) fn with<R>(f: impl FnOnce(&mut dyn Offload) -> R) -> Option<R> {
    HOOK.with(|h| {
        let mut g = h.try_borrow_mut().ok()?;
        g.as_mut().map(|o| f(&mut **o))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::int8::{igemm, igemm_reference, maxpool2x2, IgemmKernel};

    /// Does every GEMM as the reference plus one (so its hand shows), declines the rest.
    struct PlusOne(usize);

    impl Offload for PlusOne {
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
        ) -> bool {
            self.0 += 1;
            igemm_reference(m, n, k, a, b, c, ldc, accumulate);
            for i in 0..m {
                for v in &mut c[i * ldc..i * ldc + n] {
                    *v += 1;
                }
            }
            true
        }
        fn rescale(
            &mut self,
            _: &[i32],
            _: u32,
            _: Rounding,
            _: u64,
            _: &mut [i8],
        ) -> Option<usize> {
            None
        }
        fn maxpool2x2(&mut self, _: &[i8], _: usize, _: usize, _: &mut [i8], _: &mut [u8]) -> bool {
            false
        }
        fn maxpool2x2_grad(
            &mut self,
            _: &[i8],
            _: &[u8],
            _: usize,
            _: usize,
            _: &mut [i8],
        ) -> bool {
            false
        }
        fn quantize(&mut self, _: &[f32], _: f32, _: &mut [i8]) -> bool {
            false
        }
    }

    #[test]
    fn an_installed_offload_takes_the_gemms_and_only_while_installed() {
        let a: std::vec::Vec<i8> = (0..12).map(|v| v as i8 - 6).collect();
        let b: std::vec::Vec<i8> = (0..12).map(|v| 3 - v as i8).collect();
        let (am, bm) = (
            MatRef {
                data: &a,
                rs: 4,
                cs: 1,
            },
            MatRef {
                data: &b,
                rs: 3,
                cs: 1,
            },
        );
        let mut want = [0i32; 9];
        igemm_reference(3, 3, 4, am, bm, &mut want, 3, false);
        let mut scratch = [0i8; 4096];
        assert!(!active());
        assert!(install(Box::new(PlusOne(0))).is_none());
        assert!(active());
        assert_eq!(IgemmKernel::selected(), IgemmKernel::Portable);
        let mut c = [0i32; 9];
        igemm(3, 3, 4, am, bm, &mut c, 3, false, &mut scratch);
        let plus: std::vec::Vec<i32> = want.iter().map(|v| v + 1).collect();
        assert_eq!(&c[..], &plus[..], "the offload's result");
        // Declined work runs on the CPU.
        let (mut y, mut idx) = ([0i8; 2], [0u8; 2]);
        maxpool2x2(&[1, 2, 3, 4, 5, 6, 7, 8], 4, 1, &mut y, &mut idx);
        assert_eq!(y, [6, 8]);
        assert!(take().is_some());
        assert!(!active());
        igemm(3, 3, 4, am, bm, &mut c, 3, false, &mut scratch);
        assert_eq!(c, want, "the CPU's result once taken back");
    }
}
