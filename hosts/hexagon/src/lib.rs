//! frugal's Hexagon DSP backend.
//!
//! * `dsp/` (C, HVX intrinsics, built by `build.rs` with clang): the DSP side — int8×int8→int32
//!   products in 128-byte vectors (`vrmpy`, any strides, so the backward pass's transposed GEMMs too;
//!   depth split in VTCM-sized tiles), the CPU's shift rescale and rounding, im2col, max-pool and
//!   quantisation, bit-exact with `frugal_core::kernels::int8` — and a command loop (the "skel")
//!   serving a framed pipe protocol ([`proto`]).
//! * [`Transport`]: how requests reach it — [`QemuHexagon`] (the skel under `qemu-hexagon`, here) and
//!   [`fastrpc::FastRpc`] (a phone's `libcdsprpc.so`, opened at run time).
//! * [`Dsp`]: the kernels as typed calls; [`DspBackend`]: a frugal [`Backend`](frugal_core::backend::Backend)
//!   serving `Placement::Dsp` (and `Cpu`) for int8 plans — with a planned DSP memory space
//!   ([`DspPlan`], [`DSP_SPACE`]: mapped once per plan by the skel, the DSP nodes' tensors resident
//!   there across calls and steps) or copying each call's operands.
//! * [`cost`]: per-op DSP and CPU costs for the co-scheduling DP (`cargo xtask bench dsp`).
pub mod backend;
pub mod cost;
mod dsp;
mod error;
pub mod fastrpc;
pub mod proto;
mod space;
mod transport;

pub use backend::{DspBackend, DspPlan, DSP_ALIGN, DSP_SPACE};
pub use dsp::{Calls, Dsp};
pub use error::{status_name, DspError};
pub use transport::{skel_path, QemuHexagon, Transport, DEFAULT_TIMEOUT};

/// The shared DSP for tests: `Ok(Some)` when the skel and qemu-hexagon are here, `Ok(None)` when not
/// (the caller reports *skipped*), `Err` when `FRUGAL_REQUIRE_DSP=1` and they are not.
pub fn qemu_or_skip() -> Result<Option<QemuHexagon>, String> {
    match QemuHexagon::new() {
        Ok(q) => Ok(Some(q)),
        Err(e) if std::env::var("FRUGAL_REQUIRE_DSP").is_ok_and(|v| v == "1") => {
            Err(format!("FRUGAL_REQUIRE_DSP=1 but {e}"))
        }
        Err(e) => {
            // Straight to stderr (not the test harness's captured `eprintln!`): the skip is seen.
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "skipped: the DSP suites: {e}");
            Ok(None)
        }
    }
}
