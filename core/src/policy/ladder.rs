//! Melon's plans for many budgets: a ladder of plans made with progressive recomputation at one
//! micro-batch, so that any two rungs can be lined up in the middle of a step (the adaptive executor,
//! `exec::adapt`, switches between them), and the rule that picks a rung for a budget.
use alloc::vec::Vec;

use super::{recompute, CostModel, PlanError};
use crate::budget::BudgetError;
use crate::graph::Graph;
use crate::model::ModelSpec;
use crate::plan::table::{PlanEntry, PlanTable};
use crate::plan::Plan;

/// Plans `spec` at `batch` for each of `budgets` with Melon's progressive recomputation at one
/// micro-batch ([`recompute`]), so any two entries can be lined up in the middle of a step. Budgets no
/// plan fits are skipped; a budget whose plan is identical to a smaller budget's is merged into it (the
/// smaller budget is kept). Entries are sorted by budget. Errors when no budget is feasible (`needed`:
/// the smallest plan reached).
pub fn ladder(
    spec: &ModelSpec,
    batch: usize,
    budgets: &[usize],
    cost: &CostModel,
) -> Result<PlanTable, PlanError> {
    let g = Graph::new(spec, batch)?;
    let mut bs = budgets.to_vec();
    bs.sort_unstable();
    bs.dedup();
    let mut entries: Vec<PlanEntry> = Vec::new();
    let mut smallest = usize::MAX;
    for &b in &bs {
        match recompute(&g, 1, b, cost) {
            Ok(plan) => {
                if !entries.iter().any(|e| same_plan(&e.plan, &plan)) {
                    entries.push(PlanEntry { budget: b, plan });
                }
            }
            Err(p) => smallest = smallest.min(p.needed_bytes()),
        }
    }
    if entries.is_empty() {
        return Err(PlanError::Budget(BudgetError::TooSmall {
            needed: smallest,
            given: bs.last().copied().unwrap_or(0),
        }));
    }
    Ok(PlanTable { entries })
}

/// The plan a step adapts to under `budget`: [`PlanTable::for_budget`], or, when the budget lies between
/// an entry's plan size and the budget it was made for, the entry whose plan needs the most bytes that
/// fit.
pub fn pick(table: &PlanTable, budget: usize) -> Option<&PlanEntry> {
    table.for_budget(budget).or_else(|| {
        table
            .entries
            .iter()
            .filter(|e| e.plan.needed_bytes() <= budget)
            .max_by_key(|e| (e.plan.needed_bytes(), e.budget))
    })
}

fn same_plan(a: &Plan, b: &Plan) -> bool {
    a.arena_bytes == b.arena_bytes
        && a.micro_batches == b.micro_batches
        && a.program == b.program
        && a.offsets == b.offsets
}
