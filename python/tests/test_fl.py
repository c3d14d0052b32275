"""frugal.fl: Flower's arrays <-> frugal's named tensors (order and names stable)."""

import numpy as np
import pytest

import frugal
from frugal import fl


def test_ndarrays_follow_the_models_order_and_round_trip(mlp_path):
    t = frugal.Trainer(mlp_path)
    w = t.get_weights()
    arrays = fl.to_ndarrays(w)
    assert fl.names(w) == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"]
    assert [a.shape for a in arrays] == [(128, 64), (128,), (64, 128), (64,), (10, 64), (10,)]
    back = fl.from_ndarrays(arrays, template=w)
    assert list(back) == list(w)
    for k in w:
        np.testing.assert_array_equal(back[k], w[k])
    # The order is the model's every time (a new trainer of the same model lists the same names).
    assert fl.names(frugal.Trainer(mlp_path, seed=5).get_weights()) == fl.names(w)


def test_mismatched_arrays_are_refused(mlp_path):
    w = frugal.Trainer(mlp_path).get_weights()
    arrays = fl.to_ndarrays(w)
    with pytest.raises(ValueError, match="5 arrays for a model of 6 tensors"):
        fl.from_ndarrays(arrays[:5], template=w)
    swapped = [arrays[1], arrays[0]] + arrays[2:]
    with pytest.raises(ValueError, match=r"fc1.weight: shape \(128,\)"):
        fl.from_ndarrays(swapped, template=w)
    arrays[3] = arrays[3].copy()
    arrays[3][5] = np.inf
    with pytest.raises(ValueError, match="fc2.bias: value 5 is inf"):
        fl.from_ndarrays(arrays, template=w)
    with pytest.raises(ValueError, match="dtype int64"):
        fl.from_ndarrays([np.zeros((128, 64), np.int64)] + arrays[1:], template=w)


def test_arrayrecords_keep_names_and_order(mlp_path, flower):
    t = frugal.Trainer(mlp_path)
    w = t.get_weights()
    rec = fl.to_arrayrecord(w)
    assert list(rec.keys()) == list(w)
    back = fl.from_arrayrecord(rec, template=w)
    for k in w:
        np.testing.assert_array_equal(back[k], w[k])
    # A record from another model is refused by name.
    other = dict(w)
    other["head.bias"] = other.pop("fc3.bias")
    with pytest.raises(ValueError, match=r"missing \['fc3.bias'\], unknown \['head.bias'\]"):
        fl.from_arrayrecord(fl.to_arrayrecord(other), template=w)
    # Flower's NDArrays view of the record is the same list in the same order.
    for a, b in zip(rec.to_numpy_ndarrays(), fl.to_ndarrays(w)):
        np.testing.assert_array_equal(a, b)
