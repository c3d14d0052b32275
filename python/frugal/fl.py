"""``frugal-fl``: a trainer's named tensors <-> Flower's parameter arrays.

Flower moves a model as a list of NumPy arrays (``NDArrays``) or as an ``ArrayRecord`` (named arrays);
frugal names every tensor with PyTorch's ``state_dict`` names (``fc1.weight``, ``fc1.bias``, ...) in the
model's order (layer by layer, parameters then statistics). This module maps one to the other with that
order and those names, and refuses (``ValueError``, naming the tensor) an array list or record that does
not match the model: a missing or extra tensor, another shape, a non-finite value.

    weights = trainer.get_weights()
    record = fl.to_arrayrecord(weights)          # server <-> client message
    trainer.set_weights(fl.from_arrayrecord(record, template=weights))
    arrays = fl.to_ndarrays(weights)             # the NDArrays form, names from the template
    weights = fl.from_ndarrays(arrays, template=trainer.get_weights())

Flower itself is imported only by the ``ArrayRecord`` functions.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import numpy as np

__all__ = ["names", "to_ndarrays", "from_ndarrays", "to_arrayrecord", "from_arrayrecord"]

Weights = Mapping[str, np.ndarray]


def names(weights: Weights) -> list[str]:
    """The tensor names in the model's order (the order ``Trainer.get_weights`` gives)."""
    return list(weights.keys())


def to_ndarrays(weights: Weights) -> list[np.ndarray]:
    """The tensors as a list of float32 arrays, in the model's order."""
    return [np.asarray(v, dtype=np.float32) for v in weights.values()]


def _checked(name: str, a: Any, shape: Optional[tuple[int, ...]]) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype.kind != "f":
        raise ValueError(f"tensor {name}: dtype {a.dtype}; weights are floating point")
    a = a.astype(np.float32, copy=False)
    if shape is not None and tuple(a.shape) != tuple(shape):
        raise ValueError(f"tensor {name}: shape {tuple(a.shape)}, the model needs {tuple(shape)}")
    if not np.all(np.isfinite(a)):
        i = int(np.flatnonzero(~np.isfinite(a.ravel()))[0])
        raise ValueError(f"tensor {name}: value {i} is {a.ravel()[i]} (must be finite)")
    return a


def from_ndarrays(arrays: Sequence[Any], template: Weights) -> dict[str, np.ndarray]:
    """Names ``arrays`` (Flower's ``NDArrays``) after ``template`` (``get_weights()`` of the same
    model): same count, same order, same shapes."""
    if len(arrays) != len(template):
        raise ValueError(
            f"{len(arrays)} arrays for a model of {len(template)} tensors ({', '.join(template)})"
        )
    return {
        name: _checked(name, a, np.shape(t)) for (name, t), a in zip(template.items(), arrays)
    }


def to_arrayrecord(weights: Weights) -> Any:
    """A Flower ``ArrayRecord`` holding the tensors under their names, in the model's order."""
    from flwr.app import Array, ArrayRecord

    return ArrayRecord({k: Array(np.ascontiguousarray(v, dtype=np.float32)) for k, v in weights.items()})


def from_arrayrecord(record: Any, template: Optional[Weights] = None) -> dict[str, np.ndarray]:
    """The tensors of a Flower ``ArrayRecord`` by name, as float32. With ``template``, the record must
    hold exactly the template's tensors with its shapes, and the result follows its order."""
    got = {k: v.numpy() for k, v in record.items()}
    if template is None:
        return {k: _checked(k, v, None) for k, v in got.items()}
    missing = [k for k in template if k not in got]
    extra = [k for k in got if k not in template]
    if missing or extra:
        raise ValueError(
            f"the record's tensors do not match the model: missing {missing}, unknown {extra}"
        )
    return {k: _checked(k, got[k], np.shape(t)) for k, t in template.items()}
