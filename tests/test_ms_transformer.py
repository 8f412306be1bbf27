"""The com.microsoft ops of onnxruntime's transformer optimizer outside attention, on the CPU EP
against onnxruntime: SkipLayerNormalization and SkipSimplifiedLayerNormalization (with and without
beta and bias, the input + skip + bias output, a skip broadcast over the batch), BiasGelu, Gelu,
FastGelu (with and without bias), QuickGelu, FusedMatMul (transposes, alpha, batches), and
FusedConv / FusedGemm in models onnxruntime saved after its own fusions."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

import onnxhal

MS = "com.microsoft"


def _f(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def run_both_default(op: str, feeds: dict, **attrs) -> None:
    """``run_both`` for a default-domain op with one output."""
    run_both(op, feeds, ["y"], domain="", **attrs)


def run_both(op: str, feeds: dict, outputs: list[str], domain: str = MS, **attrs) -> None:
    """One node with ``outputs`` ("" for an omitted one), in onnxruntime and onnxhal; every named
    output compared within 1e-4 relative (integers exactly)."""
    names = [k if v is not None else "" for k, v in feeds.items()]
    node = helper.make_node(op, names, outputs, domain=domain, **attrs)
    given = {k: v for k, v in feeds.items() if v is not None}
    inputs = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
              for k, v in given.items()]
    graph = helper.make_graph([node], op.lower(), inputs, [onnx.ValueInfoProto(name=o) for o in outputs if o])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    model.ir_version = 10
    data = model.SerializeToString()
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, given)
    got = onnxhal.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, given)
    for i, (w, g) in enumerate(zip(want, got)):
        assert np.asarray(g).shape == w.shape and np.asarray(g).dtype == w.dtype, (op, attrs, i, np.asarray(g).shape,
                                                                                  w.shape)
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=f"{op} {attrs} output {i}")


@pytest.mark.parametrize("seed", range(4))
def test_skip_layer_normalization(seed):
    rng = np.random.default_rng(seed)
    b, s, h = int(rng.integers(1, 4)), int(rng.integers(1, 6)), 16
    for with_beta in (True, False):
        for with_bias in (True, False):
            for skip_shape in ((b, s, h), (1, s, h)):
                feeds = {"x": _f(rng, b, s, h), "skip": _f(rng, *skip_shape), "gamma": _f(rng, h),
                         "beta": _f(rng, h) if with_beta else None, "bias": _f(rng, h) if with_bias else None}
                run_both("SkipLayerNormalization", feeds, ["y", "", "", "sum"], epsilon=1e-5)
                simple = {"x": feeds["x"], "skip": feeds["skip"], "gamma": feeds["gamma"], "bias": feeds["bias"]}
                run_both("SkipSimplifiedLayerNormalization", simple, ["y", "", "", "sum"], epsilon=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_gelus_and_fused_matmul(seed):
    rng = np.random.default_rng(seed)
    x = _f(rng, 2, 3, 16) * 3
    run_both("BiasGelu", {"x": x, "bias": _f(rng, 16)}, ["y"])
    run_both("Gelu", {"x": x}, ["y"])
    run_both("FastGelu", {"x": x, "bias": _f(rng, 16)}, ["y"])
    run_both("FastGelu", {"x": x}, ["y"])
    run_both("QuickGelu", {"x": x}, ["y"], alpha=1.5)
    for ta, tb in ((0, 0), (1, 0), (0, 1), (1, 1)):
        a = _f(rng, 2, 5, 4) if ta else _f(rng, 2, 4, 5)
        b = _f(rng, 6, 5) if tb else _f(rng, 5, 6)
        run_both("FusedMatMul", {"a": a, "b": b}, ["y"], transA=ta, transB=tb, alpha=0.75)


def _saved_by_onnxruntime(model: onnx.ModelProto, tmp_path, name: str) -> str:
    """The model as onnxruntime saves it after its extended graph optimizations (com.microsoft
    FusedConv / FusedGemm in place of Conv / Gemm + activation)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(tmp_path / f"{name}.onnx")
    ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return so.optimized_model_filepath


@pytest.mark.parametrize("act", ["Relu", "Sigmoid", "Tanh", "LeakyRelu", "Clip", "HardSigmoid"])
def test_fused_conv_and_gemm_from_onnxruntime_saved_models(act, tmp_path):
    rng = np.random.default_rng(0)
    attrs = {"LeakyRelu": {"alpha": 0.2}, "HardSigmoid": {"alpha": 0.3, "beta": 0.4}}.get(act, {})
    inits = [onnx.numpy_helper.from_array(_f(rng, 4, 3, 3, 3), "w"), onnx.numpy_helper.from_array(_f(rng, 4), "b"),
             onnx.numpy_helper.from_array(_f(rng, 8, 6), "gw"), onnx.numpy_helper.from_array(_f(rng, 6), "gb")]
    clip_in = []
    if act == "Clip":
        inits += [onnx.numpy_helper.from_array(np.array(-0.5, np.float32), "lo"),
                  onnx.numpy_helper.from_array(np.array(0.7, np.float32), "hi")]
        clip_in = ["lo", "hi"]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node(act, ["c"] + clip_in, ["y"], **attrs),
             helper.make_node("Gemm", ["g", "gw", "gb"], ["gm"]),
             helper.make_node(act, ["gm"] + clip_in, ["z"], **attrs)]
    graph = helper.make_graph(nodes, "fused", [helper.make_tensor_value_info("x", 1, [2, 3, 6, 6]),
                                               helper.make_tensor_value_info("g", 1, [5, 8])],
                              [helper.make_tensor_value_info(o, 1, None) for o in ("y", "z")],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = _saved_by_onnxruntime(model, tmp_path, act)
    saved = onnx.load(path)
    fused = {n.op_type for n in saved.graph.node if n.domain == MS}
    feeds = {"x": _f(rng, 2, 3, 6, 6), "g": _f(rng, 5, 8)}
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = onnxhal.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
    assert "FusedConv" in fused, fused
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=f"{act} ({sorted(fused)})")


def test_fused_conv_with_a_residual_input():
    """FusedConv's fourth input Z (Conv + Add + activation), as onnxruntime's fusion writes it."""
    rng = np.random.default_rng(1)
    feeds = {"x": _f(rng, 2, 3, 6, 6), "w": _f(rng, 4, 3, 3, 3), "b": _f(rng, 4), "z": _f(rng, 2, 4, 6, 6)}
    run_both("FusedConv", feeds, ["y"], activation="Relu", pads=[1, 1, 1, 1])
    run_both("FusedConv", feeds, ["y"], activation="LeakyRelu", activation_params=[0.1], pads=[1, 1, 1, 1])
