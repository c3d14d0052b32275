//! Why a sandboxed run failed: one typed error for everything the guest or wasmtime can report.
use std::fmt;

/// Why a sandboxed session could not be made or a call into it failed. A failed call never takes the
/// host down; after a trap the session is unusable (further calls return [`SandboxError::Poisoned`])
/// but the [`crate::Sandbox`] can start new sessions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SandboxError {
    /// wasmtime could not compile or instantiate the guest.
    Wasmtime(String),
    /// No plan fits the budget. `needed` is the smallest total linear memory (guest code data, stack,
    /// heap and arena) with which the guest can train this model at this batch size.
    BudgetTooSmall {
        /// Smallest feasible budget in bytes.
        needed: usize,
        /// The budget given.
        given: usize,
    },
    /// The guest tried to grow its linear memory past its limit (the budget) and was stopped.
    MemoryLimit {
        /// The limit in bytes.
        limit: usize,
        /// The size it asked to grow to.
        requested: usize,
    },
    /// The guest used up its fuel (its bound on executed instructions) and was stopped.
    OutOfFuel {
        /// The fuel it was given.
        fuel: u64,
    },
    /// The guest trapped for another reason; the message is its panic message or the trap.
    Trap(String),
    /// The guest rejected the model bytes (the core's decoder says what and where).
    Model(String),
    /// The model does not realise, or uses something the sandbox does not train.
    Graph(String),
    /// A training or evaluation step failed inside the guest.
    Exec(String),
    /// The data does not fit the model, or the data source misbehaved.
    Data(String),
    /// An argument is out of range.
    BadArgument(String),
    /// The guest broke its ABI contract (a missing export, an unknown status).
    Guest(String),
    /// An earlier call trapped; this session cannot be used any more.
    Poisoned,
}

impl fmt::Display for SandboxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SandboxError::Wasmtime(m) => write!(f, "wasmtime: {m}"),
            SandboxError::BudgetTooSmall { needed, given } => write!(
                f,
                "sandbox budget too small: the guest needs at least {needed} bytes of linear memory \
                 for this model and batch, {given} bytes were given"
            ),
            SandboxError::MemoryLimit { limit, requested } => write!(
                f,
                "the guest tried to grow its memory to {requested} bytes, past its limit of {limit} \
                 bytes, and was stopped"
            ),
            SandboxError::OutOfFuel { fuel } => {
                write!(f, "the guest ran out of fuel ({fuel} units) and was stopped")
            }
            SandboxError::Trap(m) => write!(f, "the guest trapped: {m}"),
            SandboxError::Model(m) => write!(f, "the guest rejected the model: {m}"),
            SandboxError::Graph(m) => write!(f, "{m}"),
            SandboxError::Exec(m) => write!(f, "training step in the guest: {m}"),
            SandboxError::Data(m) => write!(f, "data: {m}"),
            SandboxError::BadArgument(m) => write!(f, "bad argument: {m}"),
            SandboxError::Guest(m) => write!(f, "guest ABI violation: {m}"),
            SandboxError::Poisoned => {
                write!(f, "this session trapped earlier and cannot be used; start a new one")
            }
        }
    }
}

impl std::error::Error for SandboxError {}
