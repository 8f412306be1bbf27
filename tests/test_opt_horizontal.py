"""The horizontal gather-reduce fusion (runtime/optimizer/horizontal.py): a Concat of keepdims
reductions of constant gathers of one value becomes one com.onnxhal GatherReduce whose outputs are
the unfused graph's bit for bit and onnxruntime's; what the pass must leave alone (long float
segments, computed indices, a Gather of a shape, a lone reduction) stays;
``optimization.disable_passes`` switches it off."""

from __future__ import annotations

import os
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxhal
from onnxhal.hal import GraphOptimizationLevel as Level
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.loader.model_loader import load_model
from onnxhal.runtime.optimizer.passes import DISABLE_PASSES_KEY, optimize

ML = "ai.onnx.ml"
F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _reductions(segments: list[list[int]], dtype: int = F, reduce: str = "ReduceProd", source: str = "afe",
                opset: int = 17, lead: bool = True, cols: int | None = 5) -> onnx.ModelProto:
    """skl2onnx's PolynomialFeatures shape: per segment a gather of X's columns and a keepdims
    reduction along them; a bias column of ones shaped after the last reduction leads the Concat."""
    nodes, inits = [], []
    outs = []
    for k, seg in enumerate(segments):
        inits.append(numpy_helper.from_array(np.array(seg, np.int64), f"i{k}"))
        if source == "afe":
            nodes.append(helper.make_node("ArrayFeatureExtractor", ["X", f"i{k}"], [f"c{k}"], domain=ML))
        else:
            nodes.append(helper.make_node("Gather", ["X", f"i{k}"], [f"c{k}"], axis=-1))
        if opset >= 18:
            nodes.append(helper.make_node(reduce, [f"c{k}", "ax"], [f"p{k}"]))
        else:
            nodes.append(helper.make_node(reduce, [f"c{k}"], [f"p{k}"], axes=[1]))
        outs.append(f"p{k}")
    if opset >= 18:
        inits.append(numpy_helper.from_array(np.array([-1], np.int64), "ax"))
    if lead:
        nodes += [helper.make_node("Shape", [outs[-1]], ["shape"]),
                  helper.make_node("ConstantOfShape", ["shape"], ["unit"],
                                   value=numpy_helper.from_array(np.ones(1, helper.tensor_dtype_to_np_dtype(dtype))))]
    nodes.append(helper.make_node("Concat", (["unit"] if lead else []) + outs, ["Y"], axis=1))
    graph = helper.make_graph(nodes, "poly", [helper.make_tensor_value_info("X", dtype, [None, cols])],
                              [helper.make_tensor_value_info("Y", dtype, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(ML, 1)])
    model.ir_version = 10
    return model


def _session(model: onnx.ModelProto, disabled: str = "") -> onnxhal.InferenceSession:
    so = onnxhal.SessionOptions()
    if disabled:
        so.add_session_config_entry(DISABLE_PASSES_KEY, disabled)
    return onnxhal.InferenceSession(model.SerializeToString(), so)


def _plan_ops(sess: onnxhal.InferenceSession) -> Counter:
    return Counter(s.node.op_type for s in sess.plan.steps if s.node is not None)


def _check_against_unfused_and_onnxruntime(model: onnx.ModelProto, x: np.ndarray,
                                           rtol: float = 0.0) -> onnxhal.InferenceSession:
    """The fused session's outputs: the unfused one's bit for bit, onnxruntime's exactly (within
    ``rtol`` where kernels after the fusion round their own way, as a classifier's scores)."""
    sess = _session(model)
    got = sess.run(None, {"X": x})
    apart = _session(model, "fuse_gather_reduce").run(None, {"X": x})
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"X": x})
    for g, a, e in zip(got, apart, expected):
        assert g.dtype == e.dtype and g.shape == e.shape
        assert g.tobytes() == a.tobytes()  # bit for bit, NaNs and signed zeros included
        if rtol:
            np.testing.assert_allclose(g, e, rtol=rtol, atol=rtol)
            continue
        assert np.array_equal(g, e, equal_nan=g.dtype.kind == "f")
        assert np.array_equal(np.signbit(g[g == 0]), np.signbit(e[g == 0]))
    return sess


SEGMENTS = [[0], [1], [0, 0], [0, 3], [4, 2], [1, 1], [3]]


@pytest.mark.parametrize("rows", [0, 1, 6])
def test_polynomial_products_fuse_into_one_node_bit_for_bit(rows):
    x = np.random.default_rng(rows).standard_normal((rows, 5)).astype(np.float32) * 1e3
    if rows:
        x[0, :2] = [np.nan, -0.0]
    sess = _check_against_unfused_and_onnxruntime(_reductions(SEGMENTS), x)
    ops = _plan_ops(sess)
    # the bias column's ReduceProd stays for its Shape, reading a gather of its own column
    assert ops["GatherReduce"] == 1 and ops["ReduceProd"] == 1 and ops["Split"] == 0


@pytest.mark.parametrize("reduce", ["ReduceSum", "ReduceMax", "ReduceMin"])
def test_other_reductions_and_gather_source_with_axes_input(reduce):
    model = _reductions([[0, 4], [-1], [2, -5]], reduce=reduce, source="gather", opset=18, lead=False)
    sess = _check_against_unfused_and_onnxruntime(model, np.random.default_rng(1).standard_normal((3, 5)).astype(
        np.float32))
    assert _plan_ops(sess)[reduce] == 0


def test_float_segments_longer_than_two_stay_apart_integer_ones_fuse():
    segments = [[0, 1, 2], [3], [4, 0]]
    floats = _session(_reductions(segments, lead=False))
    assert _plan_ops(floats)["ReduceProd"] == 1  # three float products may round in another order
    x = np.random.default_rng(2).integers(-2**15, 2**15, (4, 5))  # products below 2**53: onnxruntime's lose bits past it
    ints = _check_against_unfused_and_onnxruntime(_reductions(segments, dtype=I64, lead=False), x)
    assert _plan_ops(ints)["ReduceProd"] == 0


def test_fused_out_of_range_index_raises_typed_and_session_stays_usable():
    sess = _session(_reductions(SEGMENTS, cols=None))
    assert _plan_ops(sess)["GatherReduce"] == 1
    with pytest.raises(InvalidArgument, match="out of range"):
        sess.run(None, {"X": np.ones((2, 4), np.float32)})
    assert sess.run(None, {"X": np.ones((2, 5), np.float32)})[0].shape == (2, len(SEGMENTS) + 1)


def test_skl2onnx_polynomial_union_fuses_and_matches_onnxruntime():
    """The corpus's skl2onnx FeatureUnion(PolynomialFeatures(2), StandardScaler) -> RidgeClassifier
    (tests/real_models/make_corpus.py, ``sk_polyunion``): its 44 ArrayFeatureExtractor/ReduceProd
    pairs run as one GatherReduce and the pair skl2onnx reads the bias column's shape from."""
    path = os.path.join(os.path.dirname(__file__), "real_models", "sk_polyunion.onnx")
    model = onnx.load(path)
    x = np.random.default_rng(3).standard_normal((7, 8)).astype(np.float32)
    sess = _check_against_unfused_and_onnxruntime(model, x, rtol=1e-6)
    ops = _plan_ops(sess)
    assert ops["GatherReduce"] == 1 and ops["ArrayFeatureExtractor"] == 1 and ops["ReduceProd"] == 1


def test_left_alone_computed_indices_shape_gathers_and_single_reductions():
    idx = numpy_helper.from_array(np.array([0], np.int64), "i0")
    nodes = [helper.make_node("Shape", ["X"], ["s"]),
             helper.make_node("Gather", ["s", "i0"], ["d0"], axis=0),  # shape entries: memoised per shape
             helper.make_node("Gather", ["s", "i0"], ["d1"], axis=0),
             helper.make_node("ReduceProd", ["d0"], ["e0"], axes=[0]),
             helper.make_node("ReduceProd", ["d1"], ["e1"], axes=[0]),
             helper.make_node("Concat", ["e0", "e1"], ["E"], axis=0),
             helper.make_node("Gather", ["X", "I"], ["c0"], axis=1),  # computed indices
             helper.make_node("Gather", ["X", "i0"], ["c1"], axis=1),
             helper.make_node("ReduceSum", ["c0"], ["r0"], axes=[1]),
             helper.make_node("ReduceSum", ["c1"], ["r1"], axes=[1]),
             helper.make_node("Concat", ["r0", "r1"], ["R"], axis=1)]  # one fusable reduction: a lone one
    graph = helper.make_graph(nodes, "alone", [helper.make_tensor_value_info("X", F, [None, 5]),
                                               helper.make_tensor_value_info("I", I64, [1])],
                              [helper.make_tensor_value_info("E", I64, None), helper.make_tensor_value_info("R", F, None)],
                              [idx])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])  # axes attributes
    ops = Counter(n.op_type for n in optimize(load_model(model).graph, Level.ORT_ENABLE_EXTENDED).nodes)
    assert ops["GatherReduce"] == 0 and ops["ReduceProd"] == 2 and ops["ReduceSum"] == 2


def test_unknown_pass_name_is_refused():
    with pytest.raises(InvalidArgument, match="no_such_pass"):
        _session(_reductions(SEGMENTS), "fuse_gather_reduce, no_such_pass")
