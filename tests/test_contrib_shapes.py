"""Shapes after onnxruntime's com.microsoft operators onnx cannot infer (runtime/loader/contrib_shapes.py):
the loader types the outputs that have input 0's shape (SkipLayerNormalization, BiasGelu, FastGelu, Gelu)
and inference goes on past them, with the shapes the run returns; what it cannot settle stays untyped."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import onnxhal
from onnxhal.runtime.loader.model_loader import load_model

F = TensorProto.FLOAT
RNG = np.random.default_rng(47)


def _model(stats: bool = False) -> onnx.ModelProto:
    """x [batch, 5, 8] -> SkipLayerNormalization (y, sum) -> MatMul [8, 6] -> BiasGelu -> FastGelu -> Gelu."""
    w = {k: numpy_helper.from_array(RNG.standard_normal(s).astype(np.float32), k)
         for k, s in (("gamma", (8,)), ("beta", (8,)), ("w", (8, 6)), ("b", (6,)))}
    outs = ["ln", "mean", "inv", "sum"] if stats else ["ln", "", "", "sum"]
    nodes = [helper.make_node("SkipLayerNormalization", ["x", "skip", "gamma", "beta"], outs, domain="com.microsoft"),
             helper.make_node("MatMul", ["ln", "w"], ["h"]),
             helper.make_node("BiasGelu", ["h", "b"], ["g"], domain="com.microsoft"),
             helper.make_node("FastGelu", ["g"], ["f"], domain="com.microsoft"),
             helper.make_node("Gelu", ["f"], ["y"], domain="com.microsoft")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, ["batch", 5, 8]),
                                           helper.make_tensor_value_info("skip", F, ["batch", 5, 8])],
                              [helper.make_tensor_value_info("y", F, None), helper.make_tensor_value_info("sum", F, None)],
                              list(w.values()))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    return model


def _dims(model: onnx.ModelProto) -> dict[str, list | None]:
    loaded = load_model(model.SerializeToString()).proto
    return {v.name: ([d.dim_value or d.dim_param or None for d in v.type.tensor_type.shape.dim]
                     if v.type.tensor_type.HasField("shape") else None)
            for v in (*loaded.graph.value_info, *loaded.graph.output)}


def test_inference_goes_on_past_the_contrib_operators():
    dims = _dims(_model())
    assert dims["ln"] == dims["sum"] == ["batch", 5, 8]
    assert dims["h"] == dims["g"] == dims["f"] == dims["y"] == ["batch", 5, 6]


def test_the_shapes_written_are_those_the_run_returns():
    model = _model()
    feeds = {"x": RNG.standard_normal((2, 5, 8)).astype(np.float32),
             "skip": RNG.standard_normal((2, 5, 8)).astype(np.float32)}
    got = onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=0, atol=2e-5)


def test_training_statistics_stay_untyped():
    dims = _dims(_model(stats=True))
    assert dims.get("mean") is None and dims.get("inv") is None
    assert dims["y"] == ["batch", 5, 6]
