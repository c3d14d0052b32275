"""frugal: train neural networks inside a memory budget.

``frugal.Trainer(model_toml, budget="512KiB")`` plans every way the model can train (from the smallest
plan, recomputing activations, to the plain one) and trains with the one the budget allows; the budget
can change at any time (``set_budget``), between steps or, from another thread, in the middle of one.
Training is exact across budgets: a plan changes when things are computed and where they are kept,
never the arithmetic, so the weights after a step do not depend on the budget.

``frugal.fl`` maps a trainer's named tensors to Flower's parameter arrays and back.
"""

from ._frugal import (
    BudgetError,
    FrugalError,
    ModelError,
    StepError,
    Trainer,
    WeightsError,
    digits,
    parse_budget,
)

__all__ = [
    "BudgetError",
    "FrugalError",
    "ModelError",
    "StepError",
    "Trainer",
    "WeightsError",
    "digits",
    "parse_budget",
]
