"""Type stubs of the extension module (the classes and functions ``frugal`` re-exports)."""

from typing import Optional, TypedDict, Union

import numpy as np
import numpy.typing as npt

Budget = Union[None, int, str]
ArrayLike = npt.ArrayLike

class FrugalError(Exception):
    """Every error frugal reports (its message is the CLI's)."""

class ModelError(FrugalError):
    """The model description is not valid (the message names the line, column and field)."""

class WeightsError(FrugalError):
    """Weights that do not fit the model (a name, a shape, a non-finite value)."""

class BudgetError(FrugalError):
    """No plan fits the memory budget."""

    needed_bytes: int
    """The smallest budget that works."""

class StepError(FrugalError):
    """A training or evaluation step failed (a non-finite loss, out of memory, ...)."""

class PlanInfo(TypedDict):
    arena_bytes: int
    allocated_bytes: int
    lower_bound: int
    floor_bytes: int
    budget: Optional[int]
    micro_batch: int
    micro_batches: int
    recomputes: int
    rung: int
    rungs: int
    steps: int
    switches: int
    mid_step_switches: int
    batch: int
    precision: str

class Evaluation(TypedDict):
    loss: float
    accuracy: float
    correct: int
    samples: int

class Trainer:
    """A trainer that fits a memory budget.

    ``model`` is TOML text (docs/model-format.md) or the path of a ``.toml`` model file (its ``[train]
    weights`` checkpoint, when it names one, is loaded; relative paths are relative to the file); ``budget`` a
    size such as ``"512KiB"`` or a number of bytes (None: no limit); ``precision`` ``"f32"`` (a ladder
    of plans: the budget picks one, recomputing when small), ``"int8"`` (pure integer training, NITI
    update) or ``"int8-master"`` (int8 compute, f32 master weights) — int8 runs its one plain plan, which
    the budget must fit; ``batch`` samples
    per step (None: the model file's ``[train] batch``, else 32); ``seed`` the weight initialisation's
    seed (None: the model's).

    Raises ``ModelError`` (bad model), ``BudgetError`` (no plan fits), ``ValueError`` (bad argument).
    """

    def __init__(
        self,
        model: str,
        budget: Budget = None,
        precision: str = "f32",
        batch: Optional[int] = None,
        seed: Optional[int] = None,
    ) -> None: ...
    def train_step(self, x: npt.NDArray[np.float32], y: ArrayLike) -> float:
        """One step on ``x`` (float32, ``(n, *input_shape)`` or ``(n, features)``, 1 <= n <= batch) and
        integer labels ``y`` of shape ``(n,)``; returns the mean loss. A C-contiguous ``x`` is read in
        place. ``TypeError`` for another dtype, ``ValueError`` for a wrong shape, a non-finite input or a
        label out of range, ``StepError`` for a non-finite loss (the weights are then unchanged)."""
    def fit(
        self,
        x: npt.NDArray[np.float32],
        y: ArrayLike,
        epochs: int = 1,
        shuffle: bool = True,
        seed: int = 0,
    ) -> list[float]:
        """``epochs`` passes over ``x``, ``y`` in batches of ``batch`` (the last one may be smaller);
        returns each epoch's mean loss. The order is shuffled per epoch by ``(seed, epoch)``."""
    def evaluate(self, x: npt.NDArray[np.float32], y: ArrayLike) -> Evaluation:
        """Mean loss and accuracy over any number of samples (no update)."""
    def predict(self, x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Class probabilities (softmax of the model's logits), ``(n, classes)`` float32, ``batch``
        samples at a time; changes nothing. In int8 the logits are the integer output dequantised by
        its exponent, which is shared by a batch: a sample's values can depend on its batch-mates.
        ``ValueError`` for a wrong shape or a non-finite input, ``TypeError`` for another dtype."""
    def get_weights(self) -> dict[str, npt.NDArray[np.float32]]:
        """Parameters and statistics (PyTorch ``state_dict`` names, the model's order)."""
    def set_weights(self, weights: dict[str, npt.NDArray[np.float32]]) -> int:
        """Loads any subset of ``get_weights()``'s tensors; returns how many. All are checked
        (name, shape, float32, finite) before any is written: a refused call changes nothing."""
    def plan_info(self) -> PlanInfo:
        """The plan in force (arena, lower bound, micro-batching, recomputation, rung) and the budget."""
    def set_budget(self, budget: Budget) -> None:
        """Changes the budget: at once between steps; from another thread during a step, before the
        step's next instruction. ``BudgetError`` (nothing changes) below the smallest plan."""
    @property
    def batch(self) -> int:
        """Samples per step."""
    @property
    def input_shape(self) -> tuple[int, int, int]:
        """One sample's shape (channels, height, width)."""
    @property
    def classes(self) -> int:
        """Classes the model predicts."""

def digits() -> tuple[
    npt.NDArray[np.float32], npt.NDArray[np.uint32], npt.NDArray[np.float32], npt.NDArray[np.uint32]
]:
    """The bundled UCI digits: ``(x_train, y_train, x_test, y_test)``, 1437 + 360 samples of 1x8x8."""

def parse_budget(size: str) -> int:
    """Bytes in a size string such as ``"512KiB"``, ``"2MiB"``, ``"1.5MB"`` or ``"4096"``."""
