//! Why a step could not run, and what a batch is trained against.
use core::fmt;

use super::Placement;
use crate::budget::BudgetError;
use crate::plan::params::ParamsError;
use crate::spill::SpillError;

/// The targets of a batch.
#[derive(Clone, Copy, Debug)]
pub enum Target<'a> {
    /// Class indices (softmax cross-entropy).
    Classes(&'a [u32]),
    /// Regression targets with the prediction's shape (MSE).
    Values(&'a [f32]),
}

/// Why a step could not run. A rejected step leaves the weights untouched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExecError {
    /// The arena is smaller than the plan.
    Budget(BudgetError),
    /// The batch does not match the plan (wrong length, too many samples, bad label).
    BadBatch(&'static str, usize),
    /// The input or the loss is NaN or infinite; the step was rejected before any update.
    NonFinite(&'static str),
    /// A plan instruction is inconsistent (overlapping regions, unknown node): a planner bug or a corrupt plan.
    BadPlan(&'static str),
    /// An instruction is placed on a backend this executor does not have.
    Placement(Placement),
    /// The plan puts storages in a memory space no backend of this executor owns.
    Space(u8),
    /// A named tensor does not exist or has another size.
    Tensor(&'static str),
    /// The backend cannot run this plan (a layer it has no kernel for, a tensor larger than it can
    /// address); said when the executor is created, never mid-step.
    Unsupported(&'static str),
    /// The host's spill store failed a swap. A failed swap-out rejects the step before any update (all
    /// swap-outs precede the first update); a failed swap-in aborts the step mid-backward.
    Spill(SpillError),
    /// A device the backend drives failed mid-step (a DSP process that died or answered garbage); the
    /// backend rejected the step and put the weights back as they were before it. The backend says
    /// more (`frugal-hexagon`'s `DspBackend::last_error`).
    Device(&'static str),
    /// The read-only parameter image does not fit the plan (too short, misaligned, made for another
    /// plan), said when the executor is created; or the plan needs one and none was given.
    Params(ParamsError),
}

impl fmt::Display for ExecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExecError::Budget(b) => write!(f, "{b}"),
            ExecError::BadBatch(what, v) => write!(f, "bad batch: {what} ({v})"),
            ExecError::NonFinite(what) => write!(
                f,
                "{what} is NaN or infinite; the step was rejected and the weights are unchanged"
            ),
            ExecError::BadPlan(what) => write!(f, "inconsistent plan: {what}"),
            ExecError::Placement(p) => write!(f, "no backend for placement {p:?}"),
            ExecError::Space(s) => write!(f, "no backend owns memory space {s} of the plan"),
            ExecError::Tensor(what) => write!(f, "tensor access: {what}"),
            ExecError::Unsupported(what) => write!(f, "this backend cannot run the plan: {what}"),
            ExecError::Spill(e) => write!(f, "{e}"),
            ExecError::Params(e) => write!(f, "{e}"),
            ExecError::Device(what) => write!(
                f,
                "device failure: {what}; the step was rejected and the weights are unchanged"
            ),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for ExecError {}

impl From<SpillError> for ExecError {
    fn from(e: SpillError) -> Self {
        ExecError::Spill(e)
    }
}

impl From<ParamsError> for ExecError {
    fn from(e: ParamsError) -> Self {
        ExecError::Params(e)
    }
}

impl From<BudgetError> for ExecError {
    fn from(b: BudgetError) -> Self {
        ExecError::Budget(b)
    }
}
