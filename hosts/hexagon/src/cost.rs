//! The co-scheduling cost model (Mandheling §3.3) behind `cargo xtask bench dsp`:
//!
//! * **DSP cost** of an instruction: the Hexagon packets the skel executes for its requests, counted
//!   under `qemu-hexagon` by a TCG plugin (QEMU's Hexagon front end translates one *packet* per guest
//!   instruction, so the plugin's instruction count is a packet count); the skel marks the start of
//!   every request with a `getpid` syscall, where the plugin prints its running count, so each
//!   request's packets are the difference of consecutive marks (reading and checking the frame
//!   included). Cycle model: one packet per cycle on one hardware thread (VLIW: up to four
//!   instructions, HVX ones included, issue together), no stalls (operands in VTCM/L2), at
//!   [`DSP_HZ`]. It is a model, not a measurement of a phone.
//! * **CPU cost**: the instruction's wall time on this machine's CPU int8 backend (the fastest of
//!   several steps).
//! * Instructions with no DSP kernel (activations, views, adds, the loss, the updates) cannot go to
//!   the DSP (infinite cost there), as Mandheling keeps its DSP-unfriendly operators on the CPU.
//! * **Switch cost** at a boundary between a CPU and a DSP instruction: one FastRPC invocation
//!   ([`RPC_SECONDS`]) plus the bytes of the activations and derivatives live across the boundary at
//!   [`COPY_BYTES_PER_SECOND`] (what the moves of a planned DSP space copy there,
//!   [`DspPlan`](crate::DspPlan); the bytes the host's integer bookkeeping exchanges with the DSP
//!   inside an instruction are not modelled — `cargo xtask bench dsp` measures the total per step).
//!
//! * Not charged: the calls *within* a DSP instruction (one per GEMM tile, per convolution group, per
//!   rescale…) — one FastRPC round trip each on a phone; the bench prints what they would add.
//!
//! The placement is `frugal_core::policy::placement::place` (the DP the GPU placement shares).
use frugal_core::graph::TensorKind;
use frugal_core::plan::Plan;

/// The modelled DSP clock (a Snapdragon 8-series cDSP runs at about 1–1.5 GHz).
pub const DSP_HZ: f64 = 1.0e9;
/// One FastRPC round trip (invocation and return, no data), seconds.
pub const RPC_SECONDS: f64 = 100e-6;
/// Host ↔ DSP copy bandwidth, bytes per second.
pub const COPY_BYTES_PER_SECOND: f64 = 2.0e9;

/// Bytes of activations and derivatives live across boundary `b` of `plan` (between instructions
/// `b - 1` and `b`): what a switch of device there moves.
pub fn crossing_bytes(plan: &Plan, b: usize) -> usize {
    plan.lives
        .iter()
        .filter(|l| {
            matches!(l.kind, TensorKind::Activation | TensorKind::Derivative)
                && (l.first as usize) < b
                && b <= l.last as usize
        })
        .map(|l| l.bytes)
        .sum()
}

/// The `(n + 1) × 2 × 2` transfer table for devices 0 = CPU, 1 = DSP.
pub fn transfers(plan: &Plan) -> Vec<f64> {
    let n = plan.program.len();
    let mut t = vec![0.0; (n + 1) * 4];
    for b in 0..=n {
        let s = RPC_SECONDS + crossing_bytes(plan, b) as f64 / COPY_BYTES_PER_SECOND;
        t[b * 4 + 1] = s; // CPU → DSP
        t[b * 4 + 2] = s; // DSP → CPU
    }
    t
}

/// Seconds for `packets` under the cycle model.
pub fn dsp_seconds(packets: u64) -> f64 {
    packets as f64 / DSP_HZ
}

/// What one request cost on the DSP, in packets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestPackets {
    /// From its start mark to the next request's (reading, checking and answering the frame
    /// included).
    pub total: u64,
    /// The kernel alone (between the two marks around `serve` in `dsp/skel.c`).
    pub kernel: u64,
}

/// Packets per request from the plugin's log: `fhx-mark N` at the start of every request,
/// `fhx-kernel N` before and after its kernel. Request `k` (0-based) spans marks `k` and `k + 1`.
pub fn packets_per_request(log: &str) -> Vec<RequestPackets> {
    let mut out: Vec<RequestPackets> = Vec::new();
    let mut start: Option<u64> = None;
    let mut kernel_from: Option<u64> = None;
    let mut kernel = 0;
    for l in log.lines() {
        if let Some(v) = l
            .strip_prefix("fhx-mark ")
            .and_then(|v| v.trim().parse().ok())
        {
            if let Some(s) = start {
                out.push(RequestPackets {
                    total: v - s.min(v),
                    kernel,
                });
            }
            start = Some(v);
            kernel = 0;
            kernel_from = None;
        } else if let Some(v) = l
            .strip_prefix("fhx-kernel ")
            .and_then(|v| v.trim().parse::<u64>().ok())
        {
            match kernel_from.take() {
                None => kernel_from = Some(v),
                Some(f) => kernel += v.saturating_sub(f),
            }
        }
    }
    out
}
