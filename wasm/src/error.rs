//! `WebError`: everything a [`Session`](crate::Session) call can reject, as one sentence a user can act
//! on. The JS layer turns it into a thrown `Error` (with `neededBytes` for budget errors).
use alloc::string::String;
use core::fmt;

use frugal_core::budget::BudgetError;
use frugal_core::exec::ExecError;
use frugal_core::format::FormatError;
use frugal_core::graph::GraphError;

/// Why a call was rejected. A rejected call leaves the trainer as it was.
#[derive(Clone, Debug, PartialEq)]
pub enum WebError {
    /// The model bytes are not a valid frugal model.
    Model(FormatError),
    /// The model does not realise (shapes, option values).
    Graph(GraphError),
    /// The weights bytes are not valid safetensors or do not fit the model.
    Weights(String),
    /// No plan fits the budget; `needed` is the smallest budget that works.
    Budget(BudgetError),
    /// An argument is out of range or malformed: (argument, what is wrong).
    Argument(&'static str, String),
    /// The browser could not give the memory the plan or the samples need.
    OutOfMemory(usize),
    /// A training or prediction step failed (non-finite loss, …); the weights are unchanged.
    Exec(ExecError),
    /// WebGPU failed (no adapter, a lost device): what the browser said.
    Gpu(String),
}

impl WebError {
    /// The smallest feasible budget in bytes, for a budget error.
    pub fn needed_bytes(&self) -> Option<usize> {
        match self {
            WebError::Budget(BudgetError::TooSmall { needed, .. }) => Some(*needed),
            WebError::Exec(ExecError::Budget(BudgetError::TooSmall { needed, .. })) => {
                Some(*needed)
            }
            _ => None,
        }
    }
    /// A short name of the kind, set as the JS error's `name`.
    pub fn kind(&self) -> &'static str {
        match self {
            WebError::Model(_) => "ModelError",
            WebError::Graph(_) => "ModelError",
            WebError::Weights(_) => "WeightsError",
            WebError::Budget(_) => "BudgetError",
            WebError::Argument(..) => "ArgumentError",
            WebError::OutOfMemory(_) => "OutOfMemoryError",
            WebError::Exec(_) => "StepError",
            WebError::Gpu(_) => "GpuError",
        }
    }
}

impl fmt::Display for WebError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WebError::Model(e) => write!(f, "model bytes: {e}"),
            WebError::Graph(e) => write!(f, "model: {e}"),
            WebError::Weights(e) => write!(f, "weights: {e}"),
            WebError::Budget(e) => write!(f, "{e}"),
            WebError::Argument(arg, why) => write!(f, "{arg}: {why}"),
            WebError::OutOfMemory(n) => {
                write!(f, "out of memory: could not allocate {n} bytes")
            }
            WebError::Exec(e) => write!(f, "{e}"),
            WebError::Gpu(e) => write!(f, "WebGPU: {e}"),
        }
    }
}

impl From<frugal_host::LoadError> for WebError {
    fn from(e: frugal_host::LoadError) -> Self {
        match e {
            frugal_host::LoadError::Weights(w) => WebError::Weights(w),
            frugal_host::LoadError::Exec(e) => WebError::Exec(e),
        }
    }
}

impl From<FormatError> for WebError {
    fn from(e: FormatError) -> Self {
        WebError::Model(e)
    }
}

impl From<GraphError> for WebError {
    fn from(e: GraphError) -> Self {
        WebError::Graph(e)
    }
}

impl From<ExecError> for WebError {
    fn from(e: ExecError) -> Self {
        WebError::Exec(e)
    }
}

impl From<frugal_core::policy::PlanError> for WebError {
    fn from(e: frugal_core::policy::PlanError) -> Self {
        match e {
            frugal_core::policy::PlanError::Graph(g) => WebError::Graph(g),
            frugal_core::policy::PlanError::Budget(b) => WebError::Budget(b),
        }
    }
}
