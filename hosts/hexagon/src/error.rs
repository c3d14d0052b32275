//! What goes wrong with a DSP: typed, with the operation it happened in.
use std::fmt;

/// Why a DSP call failed. None of these panic; a backend turns them into
/// [`ExecError::Device`](frugal_core::backend::ExecError::Device) and restores the step's weights.
#[derive(Debug)]
pub enum DspError {
    /// No DSP here: the skel was not built, `qemu-hexagon` or `libcdsprpc.so` is missing.
    Unavailable(String),
    /// The DSP process could not be started.
    Spawn(std::io::Error),
    /// The DSP stopped answering during `op` (its process died, the pipe broke).
    Died {
        /// The operation.
        op: &'static str,
        /// What the host saw.
        detail: String,
    },
    /// The DSP's answer to `op` is not a valid reply frame.
    BadReply {
        /// The operation.
        op: &'static str,
        /// What is wrong with it.
        what: &'static str,
    },
    /// The DSP refused `op` with a status code (see `dsp/proto.h`).
    Refused {
        /// The operation.
        op: &'static str,
        /// Its status.
        status: u32,
    },
    /// The DSP did not answer `op` within the transport's time-out (a hung DSP); its process was
    /// killed.
    TimedOut {
        /// The operation.
        op: &'static str,
        /// The time-out.
        after: std::time::Duration,
    },
    /// An operand is larger than the protocol or the DSP's memory takes.
    TooLarge {
        /// The operation.
        op: &'static str,
        /// Bytes asked for.
        bytes: u64,
    },
}

impl DspError {
    /// A fixed description, for [`ExecError::Device`](frugal_core::backend::ExecError::Device).
    pub fn summary(&self) -> &'static str {
        match self {
            DspError::Unavailable(_) => "no DSP is available",
            DspError::Spawn(_) => "the DSP process could not be started",
            DspError::Died { .. } => "the DSP died mid-step",
            DspError::BadReply { .. } => "the DSP answered garbage",
            DspError::Refused { .. } => "the DSP refused a request",
            DspError::TimedOut { .. } => "the DSP did not answer in time",
            DspError::TooLarge { .. } => "an operand is too large for the DSP",
        }
    }
}

impl fmt::Display for DspError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DspError::Unavailable(why) => write!(f, "no DSP: {why}"),
            DspError::Spawn(e) => write!(f, "starting the DSP: {e}"),
            DspError::Died { op, detail } => write!(f, "the DSP died during {op}: {detail}"),
            DspError::BadReply { op, what } => write!(f, "bad DSP reply to {op}: {what}"),
            DspError::Refused { op, status } => {
                write!(
                    f,
                    "the DSP refused {op} (status {status}: {})",
                    status_name(*status)
                )
            }
            DspError::TimedOut { op, after } => {
                write!(f, "the DSP did not answer {op} within {after:?}; killed")
            }
            DspError::TooLarge { op, bytes } => {
                write!(f, "{op}: {bytes} bytes exceed what the DSP takes")
            }
        }
    }
}

impl std::error::Error for DspError {}

/// The name of a skel status (`dsp/proto.h`).
pub fn status_name(s: u32) -> &'static str {
    match s {
        0 => "ok",
        1 => "bad magic",
        2 => "bad checksum",
        3 => "unknown operation",
        4 => "bad parameters",
        5 => "too large",
        _ => "unknown status",
    }
}
