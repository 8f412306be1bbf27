"""The random generators: a generator per node that advances from run to run, seeded by the node's
``seed``, else by ``onnxhal.set_seed`` (onnxruntime's), with the requested distribution."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxhal
from onnxhal import errors
from onnxhal.runtime.providers.cpu.kernels import random_ops
from tests.models import make, vi


@pytest.fixture(autouse=True)
def _no_global_seed():
    yield
    random_ops._GLOBAL_SEED[0] = None  # other tests see unseeded generators again


def _model(op: str = "RandomNormal", **attrs):
    # The output declared with the type the node gives (onnxruntime refuses a float declaration of a
    # double output: "Type Error ... does not match expected type").
    out = vi("y", None, attrs.get("dtype", TensorProto.FLOAT))
    if op.endswith("Like") or op == "Bernoulli":
        node = helper.make_node(op, ["x"], ["y"], **attrs)
        return make([node], [vi("x", [200, 50])], [out], opset=15)
    node = helper.make_node(op, [], ["y"], shape=[200, 50], **attrs)
    return make([node], [], [out], opset=15)


def _run(model, feeds=None):
    return onnxhal.InferenceSession(model).run(None, feeds or {})[0]


def test_set_seed_makes_sessions_repeat_and_runs_advance():
    onnxhal.set_seed(42)
    a, b = onnxhal.InferenceSession(_model()), onnxhal.InferenceSession(_model())
    first, second = a.run(None, {})[0], a.run(None, {})[0]
    np.testing.assert_array_equal(first, b.run(None, {})[0])  # same seed, same stream
    assert not np.array_equal(first, second)  # the node's generator advances, as onnxruntime's
    onnxhal.set_seed(7)
    assert not np.array_equal(_run(_model()), first)


def test_seed_attribute_wins_and_unseeded_nodes_differ():
    onnxhal.set_seed(1)
    np.testing.assert_array_equal(_run(_model(seed=3.0)), _run(_model(seed=3.0)))
    assert not np.array_equal(_run(_model(seed=3.0)), _run(_model()))
    random_ops._GLOBAL_SEED[0] = None
    assert not np.array_equal(_run(_model()), _run(_model()))


@pytest.mark.parametrize("op,attrs,mean,std", [
    ("RandomNormal", {"mean": 2.0, "scale": 0.5}, 2.0, 0.5),
    ("RandomUniform", {"low": -1.0, "high": 3.0}, 1.0, 4 / 12 ** 0.5),
    ("RandomNormalLike", {"mean": -1.0, "scale": 2.0, "dtype": TensorProto.DOUBLE}, -1.0, 2.0),
    ("RandomUniformLike", {"low": 0.0, "high": 1.0}, 0.5, 1 / 12 ** 0.5),
])
def test_distributions_have_the_requested_moments(op, attrs, mean, std):
    onnxhal.set_seed(0)
    x = np.zeros((200, 50), np.float32)
    y = _run(_model(op, **attrs), {"x": x} if op.endswith("Like") else None)
    assert y.shape == (200, 50)
    assert y.dtype == (np.float64 if attrs.get("dtype") == TensorProto.DOUBLE else np.float32)
    assert abs(y.mean() - mean) < 0.05 * max(std, 1) and abs(y.std() - std) < 0.05 * std
    if op.startswith("RandomUniform"):
        assert attrs["low"] <= y.min() and y.max() < attrs["high"]


def test_bernoulli_follows_the_probabilities():
    onnxhal.set_seed(0)
    p = np.tile(np.linspace(0, 1, 50, dtype=np.float32), (200, 1))
    y = _run(_model("Bernoulli"), {"x": p})
    assert set(np.unique(y)) <= {0.0, 1.0} and y.dtype == np.float32
    assert not y[:, 0].any() and y[:, -1].all()  # probability 0 and 1
    assert abs(y.mean() - 0.5) < 0.02


def test_set_seed_rejects_a_non_integer():
    with pytest.raises(errors.InvalidArgument, match="expected an int"):
        onnxhal.set_seed("42")
