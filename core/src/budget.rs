//! The one budget interface every host speaks: "you may use N bytes".
use core::fmt;

/// How many bytes the host allows the arena to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Budget {
    /// Arena bytes the executor may use.
    pub bytes: usize,
}

impl Budget {
    /// A budget of `bytes` bytes.
    pub const fn new(bytes: usize) -> Self {
        Self { bytes }
    }
    /// No limit (plan the unconstrained arena).
    pub const UNLIMITED: Budget = Budget { bytes: usize::MAX };
}

/// Why a plan or an arena does not fit a budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BudgetError {
    /// The budget is smaller than the smallest plan frugal can make; `needed` is that plan's size.
    TooSmall {
        /// Smallest feasible arena in bytes.
        needed: usize,
        /// The budget (or arena length) that was given.
        given: usize,
    },
}

impl fmt::Display for BudgetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BudgetError::TooSmall { needed, given } => write!(
                f,
                "memory budget too small: the smallest plan needs {needed} bytes but {given} bytes were given"
            ),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for BudgetError {}
