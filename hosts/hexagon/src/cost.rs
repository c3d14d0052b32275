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
//!   [`COPY_BYTES_PER_SECOND`] (what a move between the host arena and a planned DSP space would copy;
//!   today's transport copies each call's operands instead).
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

/// Packets per request from the plugin's log: the counts printed at each request's mark, in order.
/// Request `k` costs `marks[k + 1] - marks[k]`.
pub fn packets_per_request(log: &str) -> Vec<u64> {
    let marks: Vec<u64> = log
        .lines()
        .filter_map(|l| l.strip_prefix("fhx-mark "))
        .filter_map(|v| v.trim().parse().ok())
        .collect();
    marks.windows(2).map(|w| w[1].saturating_sub(w[0])).collect()
}
