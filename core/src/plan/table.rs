//! A ladder of plans for several budgets (Melon's plans for many budgets): a device loads one beside
//! the model and switches rungs when its budget changes. Its file encoding is in
//! [`format::plan`](crate::format::plan).
use alloc::vec::Vec;

use super::Plan;

/// Plans for a ladder of budgets, sorted by budget ascending.
#[derive(Clone, Debug)]
pub struct PlanTable {
    /// Entries, budget ascending.
    pub entries: Vec<PlanEntry>,
}

/// One rung of a [`PlanTable`].
#[derive(Clone, Debug)]
pub struct PlanEntry {
    /// The budget (bytes) this plan was made for.
    pub budget: usize,
    /// The plan.
    pub plan: Plan,
}

impl PlanTable {
    /// The entry with the largest budget ≤ `budget` whose plan fits `budget` (as
    /// [`Plan::needed_bytes`]); None when no entry fits.
    pub fn for_budget(&self, budget: usize) -> Option<&PlanEntry> {
        self.entries
            .iter()
            .filter(|e| e.budget <= budget && e.plan.needed_bytes() <= budget)
            .max_by_key(|e| e.budget)
    }
}
