"""Shapes after onnxruntime's com.microsoft operators onnx cannot infer (runtime/loader/contrib_shapes.py):
the loader types the outputs that have input 0's shape (SkipLayerNormalization, BiasGelu, FastGelu, Gelu)
and inference goes on past them, with the shapes the run returns; what it cannot settle stays untyped."""

from __future__ import annotations

import os

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


def _load(model: onnx.ModelProto, one_pass: bool):
    return load_model(model.SerializeToString(), contrib_one_pass=one_pass)


def _types(loaded) -> dict[str, tuple]:
    return {name: (v.elem_type, v.shape) for name, v in loaded.graph.value_infos.items()}


def test_one_pass_gives_the_types_of_the_two_passes():
    # one strict pass through the stand-ins (the default) against the model's pass then the stand-ins'
    for stats in (False, True):
        model = _model(stats)
        assert _types(_load(model, True)) == _types(_load(model, False))


def test_one_pass_runs_as_the_two_passes():
    model = _model()
    feeds = {"x": RNG.standard_normal((3, 5, 8)).astype(np.float32),
             "skip": RNG.standard_normal((3, 5, 8)).astype(np.float32)}
    runs = []
    for flag in ("1", "0"):
        so = onnxhal.SessionOptions()
        so.add_session_config_entry("session.load.contrib_one_pass", flag)
        runs.append(onnxhal.InferenceSession(model.SerializeToString(), so,
                                             providers=["CPUExecutionProvider"]).run(None, feeds))
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


def test_a_stand_in_pass_that_fails_falls_back_to_the_two_passes():
    # FastGelu of an int64 input into Softmax: the stand-in's Identity types Softmax's input int64,
    # which its strict inference refuses; the model's own pass never types it. Both paths load (or
    # refuse) the model alike.
    nodes = [helper.make_node("FastGelu", ["x"], ["g"], domain="com.microsoft"),
             helper.make_node("Softmax", ["g"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.INT64, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    outcomes = []
    for one_pass in (True, False):
        try:
            outcomes.append(_types(_load(model, one_pass)))
        except Exception as e:  # noqa: BLE001 - the outcome compared, whatever it is
            outcomes.append(type(e))
    assert outcomes[0] == outcomes[1]
    assert "g" not in outcomes[0] or outcomes[0]["g"] == (0, None)  # the stand-in's type was not kept


def test_an_output_declared_symbolic_takes_the_size_onnxruntime_reports():
    # gpt2_ts_ortopt declares its output [batch, dim_1, dim_2]; onnxruntime, which infers through
    # its contrib ops, reports dim_2 as 32, as the one pass through the stand-ins does.
    path = os.path.join(os.path.dirname(__file__), "real_models", "gpt2_ts_ortopt.onnx")
    want = [o.shape for o in ort.InferenceSession(path, providers=["CPUExecutionProvider"]).get_outputs()]
    assert [o.shape for o in onnxhal.InferenceSession(path, providers=["CPUExecutionProvider"]).get_outputs()] == want


def test_one_pass_types_a_model_with_subgraphs_as_the_two_passes():
    # the stand-in copy's inferred values, subgraphs included, with the model's own nodes
    then = helper.make_graph([helper.make_node("Relu", ["f"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", F, None)])
    other = helper.make_graph([helper.make_node("Neg", ["f"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", F, None)])
    nodes = [helper.make_node("FastGelu", ["x"], ["f"], domain="com.microsoft"),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, ["batch", 4]),
                                           helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", F, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    one, two = _load(model, True), _load(model, False)
    assert [n.op_type for n in one.graph.nodes] == ["FastGelu", "If"]
    assert _types(one) == _types(two) and _types(one)["f"] == _types(one)["y"] == (F, ("batch", 4))
    subs = [{k: (v.elem_type, v.shape) for k, v in sub.value_infos.items()}
            for loaded in (one, two) for sub in loaded.graph.nodes[1].subgraph_list()]
    assert subs[:2] == subs[2:]
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    for c in (True, False):
        feeds = {"x": x, "c": np.array(c)}
        got = onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)
