//! `Error`: everything a trainer call can reject, as one sentence a user can act on, and
//! [`FrugalStatus`], the integer code the C ABI returns for it (the JNI layer throws
//! `ai.frugal.FrugalException` carrying the same code).
use std::fmt;

use frugal_core::budget::BudgetError;
use frugal_core::exec::ExecError;
use frugal_core::format::FormatError;
use frugal_core::graph::GraphError;
use frugal_core::policy::PlanError;

/// The result of every C-ABI call: `FRUGAL_STATUS_OK` (0) or why it failed. The message of the last failure
/// on the calling thread is `frugal_last_error()`.
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrugalStatus {
    /// Success.
    Ok = 0,
    /// A required pointer argument was NULL.
    NullPointer = 1,
    /// An argument is out of range or malformed (a length, a label, a shape, a non-finite value).
    Argument = 2,
    /// The model bytes are not a valid frugal model, or it does not realise.
    Model = 3,
    /// The weights bytes are not valid safetensors or do not fit the model.
    Weights = 4,
    /// No plan fits the budget; `frugal_last_error_needed_bytes()` is the smallest budget that works.
    Budget = 5,
    /// The process could not allocate the memory a plan or the samples need.
    OutOfMemory = 6,
    /// A training or prediction step failed (a non-finite loss, …).
    Step = 7,
    /// The handle is not a live trainer (never created, or destroyed).
    Handle = 8,
    /// Another thread is using this trainer right now; nothing was done.
    Busy = 9,
    /// The output buffer is too small; the size it needs was written to the size argument.
    BufferTooSmall = 10,
    /// A bug: the library panicked. The trainer involved is poisoned (every later call says so).
    Panic = 11,
}

/// Why a call was rejected. A rejected call leaves the trainer as it was, except where said
/// (a failing step ends `train_steps`; the earlier steps of the call stand).
#[derive(Clone, Debug, PartialEq)]
pub enum Error {
    /// A required pointer was NULL: the argument's name.
    Null(&'static str),
    /// The model bytes are not a valid frugal model.
    Model(FormatError),
    /// The model does not realise (shapes, option values).
    Graph(GraphError),
    /// The weights bytes are not valid safetensors or do not fit the model.
    Weights(String),
    /// No plan fits the budget.
    Budget(BudgetError),
    /// An argument is out of range or malformed: (argument, what is wrong).
    Argument(&'static str, String),
    /// An allocation of this many bytes failed.
    OutOfMemory(usize),
    /// A training or prediction step failed.
    Exec(ExecError),
    /// The handle names no live trainer.
    Handle(u64),
    /// Another thread holds the trainer.
    Busy,
    /// The output buffer holds `given` elements; `needed` are required.
    BufferTooSmall {
        /// Elements (bytes or floats) required.
        needed: usize,
        /// Elements the caller provided.
        given: usize,
    },
    /// The library panicked (a bug); the message of the panic.
    Panic(String),
}

impl Error {
    /// The code the C ABI returns.
    pub fn status(&self) -> FrugalStatus {
        match self {
            Error::Null(_) => FrugalStatus::NullPointer,
            Error::Model(_) | Error::Graph(_) => FrugalStatus::Model,
            Error::Weights(_) => FrugalStatus::Weights,
            Error::Budget(_) | Error::Exec(ExecError::Budget(_)) => FrugalStatus::Budget,
            Error::Argument(..) => FrugalStatus::Argument,
            Error::OutOfMemory(_) => FrugalStatus::OutOfMemory,
            Error::Exec(_) => FrugalStatus::Step,
            Error::Handle(_) => FrugalStatus::Handle,
            Error::Busy => FrugalStatus::Busy,
            Error::BufferTooSmall { .. } => FrugalStatus::BufferTooSmall,
            Error::Panic(_) => FrugalStatus::Panic,
        }
    }

    /// The smallest feasible budget in bytes, for a budget error.
    pub fn needed_bytes(&self) -> Option<usize> {
        match self {
            Error::Budget(BudgetError::TooSmall { needed, .. })
            | Error::Exec(ExecError::Budget(BudgetError::TooSmall { needed, .. })) => Some(*needed),
            _ => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Null(arg) => write!(f, "{arg} is NULL"),
            Error::Model(e) => write!(f, "model bytes: {e}"),
            Error::Graph(e) => write!(f, "model: {e}"),
            Error::Weights(e) => write!(f, "weights: {e}"),
            Error::Budget(e) => write!(f, "{e}"),
            Error::Argument(arg, why) => write!(f, "{arg}: {why}"),
            Error::OutOfMemory(n) => write!(f, "out of memory: could not allocate {n} bytes"),
            Error::Exec(e) => write!(f, "{e}"),
            Error::Handle(h) => write!(
                f,
                "handle {h:#x} is not a live trainer (never created, or already destroyed)"
            ),
            Error::Busy => write!(
                f,
                "the trainer is in use by another thread; call again when that call has returned"
            ),
            Error::BufferTooSmall { needed, given } => write!(
                f,
                "the output buffer holds {given} elements but {needed} are needed"
            ),
            Error::Panic(m) => write!(f, "internal error (a bug in frugal): {m}"),
        }
    }
}

impl From<FormatError> for Error {
    fn from(e: FormatError) -> Self {
        Error::Model(e)
    }
}

impl From<GraphError> for Error {
    fn from(e: GraphError) -> Self {
        Error::Graph(e)
    }
}

impl From<ExecError> for Error {
    fn from(e: ExecError) -> Self {
        Error::Exec(e)
    }
}

impl From<PlanError> for Error {
    fn from(e: PlanError) -> Self {
        match e {
            PlanError::Graph(g) => Error::Graph(g),
            PlanError::Budget(b) => Error::Budget(b),
        }
    }
}

impl From<frugal_host::LoadError> for Error {
    fn from(e: frugal_host::LoadError) -> Self {
        match e {
            frugal_host::LoadError::Weights(w) => Error::Weights(w),
            frugal_host::LoadError::Exec(e) => Error::Exec(e),
        }
    }
}
