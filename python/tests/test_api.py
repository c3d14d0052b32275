"""The binding's API: shapes, dtypes, errors on bad input, weights round trip, a short training run."""

import threading

import numpy as np
import pytest

import frugal


def test_digits_are_bundled(digits):
    xtr, ytr, xte, yte = digits
    assert xtr.shape == (1437, 1, 8, 8) and xtr.dtype == np.float32
    assert xte.shape == (360, 1, 8, 8)
    assert ytr.dtype == np.uint32 and set(np.unique(ytr)) == set(range(10))
    assert 0.0 <= xtr.min() and xtr.max() <= 1.0


def test_shapes_and_plan_info(mlp_path, digits):
    xtr, ytr, xte, _ = digits
    t = frugal.Trainer(mlp_path)
    assert t.batch == 32 and t.classes == 10 and t.input_shape == (1, 8, 8)
    p = t.predict(xte[:7])
    assert p.shape == (7, 10) and p.dtype == np.float32
    # Probabilities: each row sums to 1 within f32 rounding of 10 terms.
    np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-5)
    # (n, features) is the same input as (n, 1, 8, 8).
    np.testing.assert_array_equal(p, t.predict(xte[:7].reshape(7, 64)))
    info = t.plan_info()
    assert info["budget"] is None and info["rung"] == info["rungs"] - 1
    assert info["floor_bytes"] <= info["arena_bytes"] <= info["allocated_bytes"]
    assert info["precision"] == "f32" and info["steps"] == 0
    t.train_step(xtr[:32], ytr[:32])
    assert t.plan_info()["steps"] == 1


def test_a_short_training_run_learns(mlp_path, digits):
    xtr, ytr, xte, yte = digits
    t = frugal.Trainer(mlp_path, budget="512KiB")
    before = t.evaluate(xte, yte)
    losses = t.fit(xtr, ytr, epochs=3)
    after = t.evaluate(xte, yte)
    assert len(losses) == 3 and losses[2] < losses[0]
    assert after["samples"] == 360
    assert after["accuracy"] > 0.85 > before["accuracy"], (before, after)
    # evaluate's accuracy is predict's arg-max.
    assert after["correct"] == int((t.predict(xte).argmax(axis=1) == yte).sum())
    assert t.plan_info()["allocated_bytes"] <= 512 * 1024


def test_int64_and_list_labels_are_accepted(mlp_path, digits):
    xtr, ytr, _, _ = digits
    a = frugal.Trainer(mlp_path, seed=3)
    b = frugal.Trainer(mlp_path, seed=3)
    c = frugal.Trainer(mlp_path, seed=3)
    la = a.train_step(xtr[:32], ytr[:32])
    lb = b.train_step(xtr[:32], ytr[:32].astype(np.int64))
    lc = c.train_step(xtr[:32], [int(v) for v in ytr[:32]])
    assert la == lb == lc


def test_a_strided_input_trains_as_its_contiguous_copy(mlp_path, digits):
    xtr, ytr, _, _ = digits
    a = frugal.Trainer(mlp_path)
    b = frugal.Trainer(mlp_path)
    strided = xtr[:64:2]
    assert not strided.flags["C_CONTIGUOUS"]
    assert a.train_step(strided, ytr[:64:2]) == b.train_step(np.ascontiguousarray(strided), ytr[:64:2])


def test_weights_round_trip(mlp_path, digits):
    xtr, ytr, xte, _ = digits
    a = frugal.Trainer(mlp_path)
    a.fit(xtr[:320], ytr[:320], epochs=1)
    w = a.get_weights()
    assert list(w) == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"]
    assert w["fc1.weight"].shape == (128, 64) and w["fc3.bias"].shape == (10,)
    assert all(v.dtype == np.float32 for v in w.values())
    b = frugal.Trainer(mlp_path, seed=99)
    assert not np.array_equal(b.predict(xte), a.predict(xte))
    assert b.set_weights(w) == 6
    np.testing.assert_array_equal(b.predict(xte), a.predict(xte))
    for k, v in b.get_weights().items():
        np.testing.assert_array_equal(v, w[k])
    # A subset loads too.
    c = frugal.Trainer(mlp_path, seed=99)
    assert c.set_weights({"fc3.bias": w["fc3.bias"]}) == 1
    np.testing.assert_array_equal(c.get_weights()["fc3.bias"], w["fc3.bias"])


def test_bad_weights_raise_and_change_nothing(mlp_path):
    t = frugal.Trainer(mlp_path)
    w = t.get_weights()
    before = {k: v.copy() for k, v in w.items()}
    bad = dict(w, **{"fc1.bias": np.full(128, np.nan, np.float32)})
    with pytest.raises(frugal.WeightsError, match="fc1.bias: value 0 is NaN"):
        t.set_weights(bad)
    with pytest.raises(frugal.WeightsError, match=r"shape \[3\]"):
        t.set_weights({"fc2.bias": np.zeros(3, np.float32)})
    with pytest.raises(frugal.WeightsError, match="nope"):
        t.set_weights({"nope": np.zeros(3, np.float32)})
    with pytest.raises(TypeError, match="float64"):
        t.set_weights({"fc2.bias": np.zeros(64)})
    for k, v in t.get_weights().items():
        np.testing.assert_array_equal(v, before[k])


def test_bad_inputs_raise_python_exceptions(mlp_path, digits):
    xtr, ytr, _, _ = digits
    t = frugal.Trainer(mlp_path)
    with pytest.raises(TypeError, match="float64"):
        t.train_step(xtr[:4].astype(np.float64), ytr[:4])
    with pytest.raises(TypeError, match="labels must be integers"):
        t.train_step(xtr[:4], ytr[:4].astype(np.float32))
    with pytest.raises(ValueError, match=r"shape \(4, 63\)"):
        t.train_step(np.zeros((4, 63), np.float32), ytr[:4])
    with pytest.raises(ValueError, match=r"shape \(4, 1, 7, 9\)"):
        t.train_step(np.zeros((4, 1, 7, 9), np.float32), ytr[:4])
    with pytest.raises(ValueError, match="256 values but 3 samples"):
        t.train_step(xtr[:4], ytr[:3])
    with pytest.raises(ValueError, match="from 1 to 32"):
        t.train_step(xtr[:33], ytr[:33])
    nan = xtr[:4].copy()
    nan[2, 0, 3, 1] = np.nan
    with pytest.raises(ValueError, match="value 153 is NaN"):
        t.train_step(nan, ytr[:4])
    with pytest.raises(ValueError, match="value 153 is NaN"):
        t.predict(nan)
    with pytest.raises(ValueError, match="from 0 to 9"):
        t.train_step(xtr[:4], np.array([0, 1, 2, 10]))
    with pytest.raises(ValueError, match="label 1 is -1"):
        t.train_step(xtr[:4], np.array([0, -1, 2, 3]))
    with pytest.raises(ValueError, match="one-dimensional"):
        t.evaluate(xtr[:4], ytr[:4].reshape(2, 2))
    assert t.plan_info()["steps"] == 0, "nothing trained on a refused call"


def test_bad_models_precisions_and_budgets(mlp_path):
    with pytest.raises(frugal.ModelError, match="line"):
        frugal.Trainer("[model]\ninput = [1, 8, 8\n")
    with pytest.raises(frugal.ModelError):
        frugal.Trainer("/nonexistent/model.toml")
    with pytest.raises(ValueError, match='unknown precision "f33"'):
        frugal.Trainer(mlp_path, precision="f33")
    with pytest.raises(ValueError, match="unknown size unit"):
        frugal.Trainer(mlp_path, budget="2 parsecs")
    with pytest.raises(TypeError, match="budget must be"):
        frugal.Trainer(mlp_path, budget=[1])
    with pytest.raises(frugal.BudgetError) as e:
        frugal.Trainer(mlp_path, budget="1KiB")
    floor = e.value.needed_bytes
    assert floor > 1024 and str(floor) in str(e.value)
    t = frugal.Trainer(mlp_path, budget=floor)
    assert t.plan_info()["rung"] == 0 and t.plan_info()["recomputes"] > 0
    with pytest.raises(frugal.BudgetError) as e:
        t.set_budget(floor - 1)
    assert e.value.needed_bytes == floor
    assert frugal.parse_budget("512KiB") == 512 * 1024


def test_budgets_change_the_plan_never_the_weights(mlp_path, digits):
    xtr, ytr, xte, _ = digits
    plain = frugal.Trainer(mlp_path)
    small = frugal.Trainer(mlp_path)
    floor = small.plan_info()["floor_bytes"]
    small.set_budget(floor)
    info = small.plan_info()
    assert info["rung"] == 0 and info["allocated_bytes"] == floor and info["budget"] == floor
    for k in range(5):
        s = slice(32 * k, 32 * (k + 1))
        assert plain.train_step(xtr[s], ytr[s]) == small.train_step(xtr[s], ytr[s])
    small.set_budget(None)
    assert small.plan_info()["rung"] == info["rungs"] - 1
    np.testing.assert_array_equal(plain.predict(xte), small.predict(xte))


def test_a_budget_set_from_another_thread_applies_mid_training(mlp_path, digits):
    xtr, ytr, _, _ = digits
    t = frugal.Trainer(mlp_path)
    floor = t.plan_info()["floor_bytes"]
    done = threading.Event()

    def lower():
        # While fit runs (the GIL is released during steps): the trainer is busy, so the budget is
        # stored for the step in flight or the next one.
        t.set_budget(floor)
        done.set()

    th = threading.Thread(target=lower)
    th.start()
    t.fit(xtr, ytr, epochs=2)
    th.join()
    assert done.is_set()
    info = t.plan_info()
    assert info["rung"] == 0 and info["allocated_bytes"] <= floor and info["switches"] >= 1


def test_odd_arguments_are_exceptions_not_crashes(mlp_path, digits):
    xtr, ytr, _, _ = digits
    with pytest.raises(ValueError, match="batch"):
        frugal.Trainer(mlp_path, batch=0)
    with pytest.raises(OverflowError):
        frugal.Trainer(mlp_path, batch=-1)
    t = frugal.Trainer(mlp_path)
    with pytest.raises(ValueError, match=r"shape \(\)"):
        t.predict(np.float32(1.0))
    with pytest.raises(ValueError, match=r"shape \(0, 64\): no samples"):
        t.predict(np.zeros((0, 64), np.float32))
    with pytest.raises(TypeError, match="labels must be integers"):
        t.train_step(xtr[:2], np.array(["a", "b"]))
    with pytest.raises(TypeError, match="float32"):
        t.train_step([[0.0] * 64], [1])
    with pytest.raises(ValueError, match="no samples"):
        t.fit(np.zeros((0, 64), np.float32), np.zeros(0, np.uint32))
    assert t.fit(xtr[:64], ytr[:64], epochs=0) == []
    with pytest.raises(TypeError, match="keys must be tensor names"):
        t.set_weights({1: np.zeros(3, np.float32)})
    assert t.plan_info()["steps"] == 0


def test_a_model_files_weights_are_loaded():
    from conftest import REPO

    path = REPO / "examples" / "transfer.toml"
    loaded = frugal.Trainer(str(path)).get_weights()
    text = path.read_text().replace('weights = "digits-backbone.safetensors"', "")
    fresh = frugal.Trainer(text).get_weights()
    assert list(loaded) == list(fresh)
    assert any(not np.array_equal(loaded[k], fresh[k]) for k in loaded)
    with pytest.raises(frugal.WeightsError, match="nope.safetensors"):
        frugal.Trainer(text.replace("[train]", '[train]\nweights = "nope.safetensors"'))


@pytest.mark.parametrize("precision", ["int8", "int8-master"])
def test_int8_trains_within_its_plan(mlp_path, digits, precision):
    xtr, ytr, xte, yte = digits
    f32 = frugal.Trainer(mlp_path).plan_info()
    t = frugal.Trainer(mlp_path, precision=precision)
    info = t.plan_info()
    assert info["precision"] == precision and info["rungs"] == 1 and info["recomputes"] == 0
    # int8 tensors: a smaller arena than the f32 plan's.
    assert info["arena_bytes"] < f32["arena_bytes"], (info, f32)
    before = t.evaluate(xte, yte)["accuracy"]
    losses = t.fit(xtr, ytr, epochs=3)
    after = t.evaluate(xte, yte)["accuracy"]
    assert losses[-1] < losses[0] and after > 0.8 > before, (losses, before, after)
    w = t.get_weights()
    assert list(w) == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"]
    u = frugal.Trainer(mlp_path, precision=precision, seed=5)
    assert u.set_weights(w) == 6
    # Weights go in as f32 and are quantised again: the same accuracy within a few samples.
    assert abs(u.evaluate(xte, yte)["accuracy"] - after) < 0.03
    # predict as for f32: probabilities of shape (n, classes), float32, rows summing to 1 within f32
    # rounding of 10 terms; its arg-max is what evaluate counts correct (same samples, in batches).
    p = t.predict(xte)
    assert p.shape == (360, 10) and p.dtype == np.float32
    np.testing.assert_allclose(p.sum(axis=1), 1.0, atol=1e-5)
    assert t.evaluate(xte, yte)["correct"] == int((p.argmax(axis=1) == yte).sum())
    # The same batch gives the same values (int8 activations take their exponent from the batch, so
    # a sample's values can depend on the samples it is batched with).
    np.testing.assert_array_equal(t.predict(xte[:7]), t.predict(xte[:7].reshape(7, 64)))
    nan = xte[:4].copy()
    nan[2, 0, 3, 1] = np.nan
    with pytest.raises(ValueError, match="value 153 is NaN"):
        t.predict(nan)
    with pytest.raises(ValueError, match=r"shape \(4, 63\)"):
        t.predict(np.zeros((4, 63), np.float32))
    with pytest.raises(ValueError, match=r"shape \(0, 64\): no samples"):
        t.predict(np.zeros((0, 64), np.float32))
    with pytest.raises(TypeError, match="float64"):
        t.predict(xte[:4].astype(np.float64))
    # Prediction changes nothing: the weights and the evaluation are the same after it.
    w2 = t.get_weights()
    assert all(np.array_equal(w[k], w2[k]) for k in w)
    assert t.evaluate(xte, yte)["accuracy"] == after
    with pytest.raises(frugal.BudgetError) as e:
        frugal.Trainer(mlp_path, precision=precision, budget=info["floor_bytes"] - 1)
    assert e.value.needed_bytes == info["floor_bytes"]
    with pytest.raises(frugal.BudgetError):
        t.set_budget(info["floor_bytes"] - 1)
    with pytest.raises(ValueError, match="value 0 is NaN"):
        t.train_step(np.full((2, 64), np.nan, np.float32), ytr[:2])
