"""What the server and the clients share: the model, the device classes, the data split, local training.

Each client is a device of one class (``DEVICE_CLASSES``: a microcontroller-like 64 KiB client up to a
phone-like one) and trains under that class's memory budget: frugal picks the plan that fits (plain,
or recomputing activations when the budget is small). Plans change the schedule, never the arithmetic,
so a client's update does not depend on its budget (``tests/test_flower.py`` checks the aggregate).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

import frugal
from frugal import fl

# A small CNN on the 8x8 digits (no BatchNorm), SGD with momentum. At batch 14 its plain plan needs
# 69,120 bytes and its smallest (recomputing) plan 62,015: a 64 KiB client trains, recomputing.
MODEL = """
[model]
input = [1, 8, 8]
loss = "cross_entropy"
seed = 1

[optimizer]
type = "sgd"
lr = 0.02
momentum = 0.9

[[layers]]
name = "conv1"
type = "conv2d"
out = 6
kernel = 3
padding = 1

[[layers]]
name = "relu1"
type = "relu"

[[layers]]
name = "pool1"
type = "maxpool2d"
kernel = 2

[[layers]]
name = "conv2"
type = "conv2d"
out = 12
kernel = 3
padding = 1

[[layers]]
name = "relu2"
type = "relu"

[[layers]]
name = "pool2"
type = "maxpool2d"
kernel = 2

[[layers]]
name = "flat"
type = "flatten"

[[layers]]
name = "fc"
type = "linear"
out = 10
"""

BATCH = 14

# The run config's defaults (pyproject.toml's [tool.flwr.app.config] says the same).
DEFAULTS = {
    "num-server-rounds": 3,
    "min-nodes": 10,
    "local-epochs": 10,
    "budget-mode": "classes",
    "results-path": "",
}

# Device classes, smallest first: (name, memory budget for training). Client i is of class
# i mod len(DEVICE_CLASSES).
DEVICE_CLASSES: list[tuple[str, str]] = [
    ("mcu", "64KiB"),
    ("wearable", "96KiB"),
    ("phone", "8MiB"),
]


def device_class(partition_id: int) -> tuple[str, int]:
    """The device class of client ``partition_id`` and its budget in bytes."""
    name, budget = DEVICE_CLASSES[partition_id % len(DEVICE_CLASSES)]
    return name, frugal.parse_budget(budget)


def new_trainer(budget: Optional[int] = None) -> frugal.Trainer:
    """A trainer of the model within ``budget`` bytes (None: no limit)."""
    return frugal.Trainer(MODEL, budget=budget, batch=BATCH)


def partition(partition_id: int, num_partitions: int, alpha: float = 1.0, seed: int = 0):
    """Client ``partition_id``'s share of the digits' training set: a non-IID split where each class
    is divided among the clients in Dirichlet(``alpha``) proportions (smaller: more skewed), fixed by
    ``seed``. Every training sample belongs to exactly one client. Returns ``(x, y)``."""
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition {partition_id} of {num_partitions}")
    x, y, _, _ = frugal.digits()
    rng = np.random.default_rng(seed)
    owner = np.empty(len(y), dtype=np.int64)
    for c in range(10):
        idx = np.flatnonzero(y == c)
        rng.shuffle(idx)
        p = rng.dirichlet(np.full(num_partitions, alpha))
        cuts = (np.cumsum(p)[:-1] * len(idx)).round().astype(int)
        for k, part in enumerate(np.split(idx, cuts)):
            owner[part] = k
    mine = np.flatnonzero(owner == partition_id)
    return np.ascontiguousarray(x[mine]), y[mine]


def train_client(
    weights: dict[str, np.ndarray],
    partition_id: int,
    num_partitions: int,
    budget: Optional[int],
    epochs: int = 10,
    seed: int = 0,
):
    """One client's round: load the global ``weights``, train ``epochs`` local epochs on its partition
    within ``budget``. Returns ``(weights, metrics)``; metrics include the plan the budget allowed."""
    x, y = partition(partition_id, num_partitions)
    t = new_trainer(budget)
    t.set_weights(weights)
    losses = t.fit(x, y, epochs=epochs, seed=seed) if len(y) else [0.0]
    info = t.plan_info()
    metrics = {
        "train-loss": float(losses[-1]),
        "num-examples": int(len(y)),
        "budget": int(budget if budget is not None else 0),
        "arena-bytes": int(info["arena_bytes"]),
        "allocated-bytes": int(info["allocated_bytes"]),
        "recomputes": int(info["recomputes"]),
        "rung": int(info["rung"]),
        "partition-id": int(partition_id),
    }
    return t.get_weights(), metrics


def evaluate_global(weights: dict[str, np.ndarray]) -> dict[str, float]:
    """Held-out loss and accuracy of ``weights`` on the digits' test set (360 samples)."""
    _, _, xte, yte = frugal.digits()
    t = new_trainer()
    t.set_weights(weights)
    r = t.evaluate(xte, yte)
    return {"loss": float(r["loss"]), "accuracy": float(r["accuracy"])}


def initial_weights() -> dict[str, np.ndarray]:
    """The model's seeded initial weights (every run starts from the same)."""
    return new_trainer().get_weights()


def centralised(epochs: int, seed: int = 0) -> dict[str, float]:
    """The baseline: one trainer on the whole training set for ``epochs`` passes (the same number of
    sample-passes as R rounds of E local epochs on every client when ``epochs`` = R x E)."""
    x, y, _, _ = frugal.digits()
    t = new_trainer()
    t.fit(x, y, epochs=epochs, seed=seed)
    return evaluate_global(t.get_weights())


__all__ = [
    "MODEL",
    "DEVICE_CLASSES",
    "device_class",
    "partition",
    "train_client",
    "evaluate_global",
    "initial_weights",
    "centralised",
    "fl",
]
