"""The horizontal gather merge (runtime/optimizer/horizontal.py): sibling ArrayFeatureExtractor or
Gather nodes with constant indices on one value become one gather and a Split, whose outputs are
identical to the unmerged graph's and to onnxruntime's; what the pass must leave alone (computed
indices, a Gather of a shape, one sibling) stays; ``optimization.disable_passes`` switches it off."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxhal
from onnxhal.hal import GraphOptimizationLevel as Level
from onnxhal.hal.errors import InvalidArgument, OrtError
from onnxhal.runtime.loader.model_loader import load_model
from onnxhal.runtime.optimizer.passes import DISABLE_PASSES_KEY, optimize

ML = "ai.onnx.ml"
F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _siblings(opset: int = 17, rank1: bool = False) -> onnx.ModelProto:
    """Three ArrayFeatureExtractors and three Gathers (axis 1, one with a negative index and int32
    indices) on X, each output through its own Mul, all concatenated; one output also returned."""
    nodes, inits = [], []
    picks = {"a0": [0], "a1": [2, 4], "a2": [[1, 3], [0, 2]], "g0": [3], "g1": [-1, 0], "g2": [1, 1]}
    for name, idx in picks.items():
        dtype = np.int32 if name == "g1" else np.int64
        inits.append(numpy_helper.from_array(np.array(idx, dtype), f"{name}_idx"))
        if name.startswith("a"):
            nodes.append(helper.make_node("ArrayFeatureExtractor", ["X", f"{name}_idx"], [name], domain=ML))
        else:
            nodes.append(helper.make_node("Gather", ["X", f"{name}_idx"], [name], axis=1))
        nodes.append(helper.make_node("Mul", [name, "two"], [f"{name}_m"]))
    inits.append(numpy_helper.from_array(np.array(2, np.float32), "two"))
    nodes.append(helper.make_node("Concat", [f"{n}_m" for n in picks if not rank1 or n.startswith("a")], ["Y"],
                                  axis=-1))
    if rank1:  # a 1-D X: Gather along axis 1 does not exist; ArrayFeatureExtractor gives one row
        nodes = [n for n in nodes if n.op_type != "Gather" and not (n.op_type == "Mul" and n.input[0][0] == "g")]
    outputs = [helper.make_tensor_value_info("Y", F, None), helper.make_tensor_value_info("a1", F, None)]
    graph = helper.make_graph(nodes, "siblings", [helper.make_tensor_value_info("X", F, [5] if rank1 else [None, 5])],
                              outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(ML, 1)])
    model.ir_version = 10 if opset >= 13 else 6
    return model


def _ops(model: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in optimize(load_model(model).graph, Level.ORT_ENABLE_BASIC).nodes)


def _session(model: onnx.ModelProto, disabled: str = "") -> onnxhal.InferenceSession:
    so = onnxhal.SessionOptions()
    if disabled:
        so.add_session_config_entry(DISABLE_PASSES_KEY, disabled)
    return onnxhal.InferenceSession(model.SerializeToString(), so)


@pytest.mark.parametrize("opset", [11, 17])
def test_siblings_merge_into_one_gather_each_and_match(opset):
    model = _siblings(opset)
    ops = _ops(model)
    assert ops["ArrayFeatureExtractor"] == 1 and ops["Gather"] == 1 and ops["Split"] == 2
    x = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
    merged = _session(model).run(None, {"X": x})
    apart = _session(model, "merge_constant_gathers").run(None, {"X": x})
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"X": x})
    for m, a, e in zip(merged, apart, expected):
        assert m.shape == e.shape and np.array_equal(m, a) and np.array_equal(m, e)


def test_one_dimensional_x_keeps_array_feature_extractor_rows():
    model = _siblings(17, rank1=True)
    assert _ops(model)["ArrayFeatureExtractor"] == 1
    x = np.arange(5, dtype=np.float32)
    got = _session(model).run(None, {"X": x})
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"X": x})
    for g, e in zip(got, expected):
        assert g.shape == e.shape and np.array_equal(g, e)


def test_out_of_range_index_still_raises_and_session_stays_usable():
    model = _siblings(17)
    sess = _session(model)
    with pytest.raises(OrtError):
        sess.run(None, {"X": np.zeros((2, 3), np.float32)})  # index 4 is past 3 columns
    assert sess.run(None, {"X": np.ones((2, 5), np.float32)})[0].shape == (2, 12)


def test_left_alone_computed_indices_shape_gathers_and_single_siblings():
    idx = numpy_helper.from_array(np.array([0], np.int64), "i0")
    nodes = [helper.make_node("Shape", ["X"], ["s"]),
             helper.make_node("Gather", ["s", "i0"], ["d0"], axis=0),  # shape entries: memoised, not merged
             helper.make_node("Gather", ["s", "i0"], ["d1"], axis=0),
             helper.make_node("Gather", ["X", "I"], ["c0"], axis=1),  # computed indices
             helper.make_node("Gather", ["X", "i0"], ["c1"], axis=1),  # alone with constant indices
             helper.make_node("Gather", ["X", "i0"], ["c2"], axis=0)]  # another axis
    graph = helper.make_graph(nodes, "alone", [helper.make_tensor_value_info("X", F, [None, 5]),
                                               helper.make_tensor_value_info("I", I64, [1])],
                              [helper.make_tensor_value_info(n, I64 if n[0] == "d" else F, None)
                               for n in ("d0", "d1", "c0", "c1", "c2")], [idx])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    ops = _ops(model)
    assert ops["Gather"] == 5 and ops["Split"] == 0


def test_unknown_pass_name_is_refused():
    with pytest.raises(InvalidArgument, match="no_such_pass"):
        _session(_siblings(17), "merge_constant_gathers, no_such_pass")
