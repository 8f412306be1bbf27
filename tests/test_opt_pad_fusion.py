"""Pad + Conv -> Conv (``opt_pad_fusion``): folded exactly where a zero constant pad of the spatial
axes equals the Conv's own padding, left alone everywhere else, and the results match onnxruntime's
on the original model either way."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import onnxhal
from onnxhal.hal import GraphOptimizationLevel as Level
from onnxhal.runtime.loader.model_loader import load_model
from onnxhal.runtime.optimizer.passes import optimize
from tests.models import make, vi

RNG = np.random.default_rng(30)


def pad_conv_model(pads, mode="constant", value=0.0, conv_attrs=None, opset=17, axes=None, extra_reader=False,
                   value_input=True):
    """x (2, 3, 7, 6) -> Pad -> Conv(4, 3, 3, 3) + bias -> y; ``extra_reader`` also returns the Pad output."""
    x_shape = [2, 3, 7, 6]
    w = numpy_helper.from_array(RNG.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(RNG.standard_normal(4).astype(np.float32), "b")
    inits = [w, b]
    if opset < 11:
        pad = helper.make_node("Pad", ["x"], ["p"], mode=mode, pads=list(pads), value=value)
    else:
        inputs = ["x", "pads"]
        inits.append(numpy_helper.from_array(np.array(pads, np.int64), "pads"))
        if value_input:
            inits.append(numpy_helper.from_array(np.array(value, np.float32), "value"))
            inputs.append("value")
        if axes is not None:
            if not value_input:
                inputs.append("")
            inits.append(numpy_helper.from_array(np.array(axes, np.int64), "axes"))
            inputs.append("axes")
        pad = helper.make_node("Pad", inputs, ["p"], mode=mode)
    conv = helper.make_node("Conv", ["p", "w", "b"], ["y"], kernel_shape=[3, 3], **(conv_attrs or {}))
    outputs = [vi("y", None)] + ([vi("p", None)] if extra_reader else [])
    return make([pad, conv], [vi("x", x_shape)], outputs, inits, opset=opset), x_shape


def ort_run(model, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def check(model, x_shape, fused: bool, conv_pads=None):
    graph = optimize(load_model(model).graph, Level.ORT_ENABLE_BASIC)
    ops = [n.op_type for n in graph.nodes]
    assert ops == (["Conv"] if fused else ["Pad", "Conv"]), ops
    if conv_pads is not None:
        assert graph.nodes[0].attr("pads") == conv_pads
    x = RNG.standard_normal(x_shape).astype(np.float32)
    x[0, 0, 0, 0] = np.inf  # a padded border next to an infinite cell stays what onnxruntime gives
    want = ort_run(model, {"x": x})
    for level in (Level.ORT_ENABLE_BASIC, Level.ORT_ENABLE_ALL):
        so = onnxhal.SessionOptions()
        so.graph_optimization_level = level
        got = onnxhal.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
            None, {"x": x})
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pads,conv_attrs,conv_pads", [
    ([0, 0, 1, 2, 0, 0, 3, 0], None, [1, 2, 3, 0]),  # asymmetric, the Conv unpadded
    ([0, 0, 0, 0, 0, 0, 1, 1], {"strides": [2, 2]}, [0, 0, 1, 1]),  # TF "same" at stride 2
    ([0, 0, 1, 1, 0, 0, 1, 1], {"pads": [1, 0, 0, 2]}, [2, 1, 1, 3]),  # added to the Conv's own
    ([0, 0, 0, 0, 0, 0, 0, 0], None, [0, 0, 0, 0]),  # all zero: the Pad just goes
    ([0, 0, 2, 1, 0, 0, 0, 1], {"auto_pad": "VALID"}, [2, 1, 0, 1]),
])
def test_zero_constant_pad_folds_into_the_conv(pads, conv_attrs, conv_pads):
    model, x_shape = pad_conv_model(pads, conv_attrs=conv_attrs)
    check(model, x_shape, fused=True, conv_pads=conv_pads)


def test_pad_without_a_value_input_and_with_axes_folds():
    model, x_shape = pad_conv_model([0, 0, 1, 0, 0, 0, 2, 1], value_input=False)
    check(model, x_shape, fused=True, conv_pads=[1, 0, 2, 1])
    model, x_shape = pad_conv_model([1, 0, 2, 1], opset=18, axes=[-2, 3], value_input=False)
    check(model, x_shape, fused=True, conv_pads=[1, 0, 2, 1])
    model, x_shape = pad_conv_model([1, 0, 2, 1], opset=18, axes=[2, 3])
    check(model, x_shape, fused=True, conv_pads=[1, 0, 2, 1])


def test_opset_10_pad_attributes_fold():
    model, x_shape = pad_conv_model([0, 0, 1, 1, 0, 0, 1, 1], opset=10)
    check(model, x_shape, fused=True, conv_pads=[1, 1, 1, 1])


@pytest.mark.parametrize("case", ["reflect", "edge", "nonzero value", "negative pad", "channel pad", "batch pad",
                                  "read elsewhere", "same_upper", "opset 10 value"])
def test_pads_a_conv_would_not_make_stay(case):
    pads = [0, 0, 1, 1, 0, 0, 1, 1]
    kw = {}
    if case in ("reflect", "edge"):
        kw["mode"] = case
    elif case == "nonzero value":
        kw["value"] = 0.5
    elif case == "negative pad":
        pads = [0, 0, 1, -1, 0, 0, 1, 1]
    elif case == "channel pad":
        pads = [0, 1, 1, 1, 0, 0, 1, 1]
    elif case == "batch pad":
        pads = [0, 0, 1, 1, 1, 0, 1, 1]
    elif case == "read elsewhere":
        kw["extra_reader"] = True
    elif case == "same_upper":
        kw["conv_attrs"] = {"auto_pad": "SAME_UPPER"}
    elif case == "opset 10 value":
        kw.update(opset=10, value=1.0)
    model, x_shape = pad_conv_model(pads, **kw)
    if case in ("channel pad", "batch pad"):  # the Conv then sees 4 channels or 3 images: keep shapes valid
        model = _reshaped_for(model, case)
        x_shape = [2, 3, 7, 6]
    check(model, x_shape, fused=False)


def _reshaped_for(model, case):
    """The model with weights that take the padded input: 4 input channels for a channel pad."""
    if case == "channel pad":
        w = next(t for t in model.graph.initializer if t.name == "w")
        w.CopyFrom(numpy_helper.from_array(RNG.standard_normal((4, 4, 3, 3)).astype(np.float32), "w"))
    return model
