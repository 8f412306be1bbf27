"""Graph optimizer: each pass rewrites what it should, leaves what it must not, and keeps results.

Basic-level graphs use only ONNX ops, so onnxruntime runs them (original vs optimized). Extended-level
graphs hold com.onnxhal fused ops, so onnxhal's session runs them, compared with onnxruntime on the
original model. Models are the benchmark builders at small sizes plus hand-made patterns.
"""

from __future__ import annotations

import importlib.util
import math
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxhal
from onnxhal.hal import GraphOptimizationLevel as Level
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.loader.model_loader import load_model
from onnxhal.runtime.optimizer.passes import optimize
from onnxhal.runtime.providers.cpu.kernels import fused as fused_kernels
from onnxhal.runtime.providers.cpu.kernels import numerics, worker_pool
from onnxhal.runtime.providers.cpu.kernels.fused import gelu
from tests.models import make, vi

_spec = importlib.util.spec_from_file_location("onnxhal_bench_models",
                                               Path(__file__).resolve().parents[1] / "benchmarks" / "models.py")
bench_models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_models)


def ort_run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


#: for the tests of what other passes leave: the chain fusion would take the elementwise nodes they count
NO_CHAINS = ("fuse_elementwise_chains",)


def optimized(model: onnx.ModelProto, level: Level, disabled: tuple[str, ...] = ()) -> onnxhal.hal.Graph:
    return optimize(load_model(model).graph, level, disabled=disabled)


def export(graph: onnxhal.hal.Graph) -> onnx.ModelProto:
    return helper.make_model(graph.to_proto(), ir_version=10,
                             opset_imports=[helper.make_opsetid(d, v) for d, v in graph.opset.items()])


def ops(graph: onnxhal.hal.Graph) -> Counter:
    return Counter(n.op_type for n in graph.nodes)


def assert_basic_keeps_results(model: onnx.ModelProto, feeds: dict, atol: float = 1e-4) -> onnxhal.hal.Graph:
    graph = optimized(model, Level.ORT_ENABLE_BASIC)
    assert graph.output_names == [o.name for o in model.graph.output]
    assert graph.input_names == [i.name for i in model.graph.input if i.name not in
                                 {t.name for t in model.graph.initializer}]
    for want, got in zip(ort_run(model, feeds), ort_run(export(graph), feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=atol)
    return graph


def assert_session_matches_ort(model: onnx.ModelProto, feeds: dict, atol: float = 1e-4) -> None:
    so = onnxhal.SessionOptions()
    so.graph_optimization_level = Level.ORT_ENABLE_ALL
    sess = onnxhal.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    for want, got in zip(ort_run(model, feeds), sess.run(None, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=atol)


def small_encoder() -> onnx.ModelProto:
    return bench_models.encoder(seq=8, hidden=32, heads=4, ffn=64)


def small_cnn() -> onnx.ModelProto:
    return bench_models.cnn(image=32, classes=10)


def model_of(nodes, inputs, outputs, inits=(), opset=17, ir_version=10) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir_version)
    return onnx.shape_inference.infer_shapes(model)


def fvi(name: str, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


# -- levels ---------------------------------------------------------------------------------


def test_disable_all_changes_nothing():
    model = small_cnn()
    graph = optimized(model, Level.ORT_DISABLE_ALL)
    assert [n.op_type for n in graph.nodes] == [n.op_type for n in model.graph.node]


@pytest.mark.parametrize("build", [small_cnn, small_encoder])
def test_incremental_producer_consumer_maps_match_a_full_rebuild(build):
    graph = optimized(build(), Level.ORT_ENABLE_ALL)
    values = {v for n in graph.nodes for v in (*n.inputs, *n.outputs) if v}
    seen = {v: (graph.producer(v), sorted(id(c) for c in graph.consumers(v))) for v in values}
    graph.reindex()
    assert seen == {v: (graph.producer(v), sorted(id(c) for c in graph.consumers(v))) for v in values}


def test_no_op_elimination_keeps_the_maps_in_graph_order():
    # The readers of a removed Identity's output join its source's readers: in graph order, as a
    # full rebuild lists them (consumer lists compared unsorted).
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Neg", ["r"], ["a"], name="a"),
        helper.make_node("Identity", ["r"], ["i"], name="copy"),
        helper.make_node("Abs", ["i"], ["b"], name="b"),
        helper.make_node("Exp", ["r"], ["c"], name="c"),
        helper.make_node("Sum", ["a", "b", "c", "i"], ["s"], name="sum"),
        helper.make_node("Identity", ["s"], ["y"], name="out"),  # graph output: Sum renamed instead
    ]
    graph = optimized(model_of(nodes, [fvi("x", [4])], [fvi("y", [4])]), Level.ORT_ENABLE_BASIC)
    assert "Identity" not in [n.op_type for n in graph.nodes]
    values = {v for n in graph.nodes for v in (*n.inputs, *n.outputs) if v}
    seen = {v: (graph.producer(v), [n.name for n in graph.consumers(v)]) for v in values}
    assert seen["r"][1] == ["a", "b", "c", "sum"] and seen["y"][0].name == "sum" and graph.producer("s") is None
    graph.reindex()
    assert seen == {v: (graph.producer(v), [n.name for n in graph.consumers(v)]) for v in values}


def test_live_nodes_by_op_type_skips_other_ops_and_removed_nodes():
    # Passes ask for the op types they rewrite: only those nodes are visited, in graph order,
    # and a node a rewrite took out meanwhile is not.
    from onnxhal.runtime.optimizer.rewrite import live_nodes, unlink_node

    nodes = [helper.make_node("Relu", ["x"], ["a"], name="r1"), helper.make_node("Neg", ["a"], ["b"], name="n"),
             helper.make_node("Relu", ["b"], ["c"], name="r2"), helper.make_node("Abs", ["c"], ["d"], name="abs"),
             helper.make_node("Relu", ["d"], ["y"], name="r3")]
    graph = load_model(model_of(nodes, [fvi("x", [4])], [fvi("y", [4])])).graph
    assert [n.name for n in live_nodes(graph, "Relu")] == ["r1", "r2", "r3"]
    assert [n.name for n in live_nodes(graph, "Abs", "Neg")] == ["n", "abs"]
    assert len(list(live_nodes(graph))) == 5
    seen = []
    for n in live_nodes(graph, "Relu"):
        seen.append(n.name)
        if n.name == "r1":
            unlink_node(graph, graph.nodes[2])  # r2, removed by a rewrite while iterating
    assert seen == ["r1", "r3"]


def test_unknown_level_is_rejected():
    with pytest.raises(InvalidArgument, match="optimization level"):
        optimize(load_model(small_cnn()).graph, 7)


# -- basic level: checked with onnxruntime ----------------------------------------------------


def test_conv_batchnorm_folding_keeps_results():
    model = small_cnn()
    graph = assert_basic_keeps_results(model, bench_models.feeds(model))
    assert ops(graph)["BatchNormalization"] == 0
    assert ops(graph)["Conv"] == ops(load_model(model).graph)["Conv"]


def test_conv_mul_add_folding_after_folding_unsqueeze():
    """DenseNet's exported scale layers: Mul/Add by Unsqueeze'd per-channel constants."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Unsqueeze", ["s", "axes"], ["s3"]),
        helper.make_node("Mul", ["c", "s3"], ["m"]),
        helper.make_node("Unsqueeze", ["b", "axes"], ["b3"]),
        helper.make_node("Add", ["b3", "m"], ["y"]),
    ]
    inits = [("w", rng.standard_normal((4, 3, 3, 3)).astype(np.float32)),
             ("s", rng.uniform(0.5, 2, 4).astype(np.float32)), ("b", rng.standard_normal(4).astype(np.float32)),
             ("axes", np.array([1, 2], np.int64))]
    model = model_of(nodes, [fvi("x", [1, 3, 8, 8])], [fvi("y", [1, 4, 8, 8])], inits)
    graph = assert_basic_keeps_results(model, {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)})
    assert [n.op_type for n in graph.nodes] == ["Conv"]
    assert graph.nodes[0].outputs == ("y",)


def test_conv_add_with_spatial_constant_is_not_folded():
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Add", ["c", "z"], ["y"])]
    inits = [("w", rng.standard_normal((2, 3, 1, 1)).astype(np.float32)),
             ("z", rng.standard_normal((1, 2, 4, 4)).astype(np.float32))]
    model = model_of(nodes, [fvi("x", [1, 3, 4, 4])], [fvi("y", [1, 2, 4, 4])], inits)
    graph = assert_basic_keeps_results(model, {"x": rng.standard_normal((1, 3, 4, 4)).astype(np.float32)})
    assert ops(graph) == Counter({"Conv": 1, "Add": 1})


def _linear_then_pointwise(a_attrs: dict, c_attrs: dict, c_kernel: int = 1, c_bias: bool = True,
                           between: str | None = None, shared: bool = False, seed: int = 0):
    """Conv A (to 8 channels, with a bias; depthwise when its group is 8) read by Conv C (8 -> 4,
    optionally with a bias), optionally with an op ``between`` them or A's output also a graph
    output."""
    rng = np.random.default_rng(seed)
    ga = a_attrs.get("group", 1)
    gc = c_attrs.get("group", 1)
    cin_a = 8 if ga == 8 else 6
    nodes = [helper.make_node("Conv", ["x", "wa", "ba"], ["a"], **a_attrs)]
    mid = "a"
    if between:
        nodes.append(helper.make_node(between, ["a"], ["m"]))
        mid = "m"
    nodes.append(helper.make_node("Conv", [mid, "wc", "bc"] if c_bias else [mid, "wc"], ["y"], **c_attrs))
    inits = [("wa", rng.standard_normal((8, cin_a // ga, 3, 3))), ("ba", rng.standard_normal(8)),
             ("wc", rng.standard_normal((4, 8 // gc, c_kernel, c_kernel))), ("bc", rng.standard_normal(4))]
    inits = [(k, v.astype(np.float32)) for k, v in inits if c_bias or k != "bc"]
    outputs = [fvi("y", None)] + ([fvi("a", None)] if shared else [])
    model = model_of(nodes, [fvi("x", [2, cin_a, 9, 9])], outputs, inits)
    return model, {"x": rng.standard_normal((2, cin_a, 9, 9)).astype(np.float32)}


@pytest.mark.parametrize("a_attrs, c_attrs, c_bias", [
    ({"pads": [1, 1, 1, 1]}, {}, True),
    ({"pads": [1, 1, 1, 1], "group": 8}, {"group": 2}, True),  # ShuffleNet: depthwise, then grouped 1x1
    ({"strides": [2, 2]}, {"group": 4}, False),
    ({"pads": [0, 1, 2, 1]}, {"auto_pad": "VALID", "strides": [2, 2]}, True),
    ({}, {"auto_pad": "SAME_UPPER"}, True),
])
def test_conv_bias_carried_through_a_pointwise_conv(a_attrs, c_attrs, c_bias):
    model, feeds = _linear_then_pointwise(a_attrs, c_attrs, c_bias=c_bias)
    graph = assert_basic_keeps_results(model, feeds)
    a, c = graph.nodes
    assert list(a.inputs) == ["x", "wa"]
    assert len(c.inputs) == 3 and c.inputs[2]
    assert_session_matches_ort(model, feeds)


@pytest.mark.parametrize("case", ["relu between", "3x3 after", "padded 1x1 after", "bias read elsewhere"])
def test_conv_bias_stays_where_it_cannot_be_carried(case):
    kw = {"relu between": {"between": "Relu"}, "3x3 after": {"c_kernel": 3},
          "padded 1x1 after": {"c_attrs": {"pads": [1, 1, 1, 1]}}, "bias read elsewhere": {"shared": True}}[case]
    kw.setdefault("c_attrs", {})
    model, feeds = _linear_then_pointwise({"pads": [1, 1, 1, 1]}, **kw)
    graph = assert_basic_keeps_results(model, feeds)
    assert list(graph.nodes[0].inputs) == ["x", "wa", "ba"]


def _concat_relu(second: str, seed: int = 0):
    """ShuffleNet's stride-2 unit: Relu(Concat(Conv branch, AveragePool of a Relu output)), with
    the pool branch replaced by ``second`` ("pool", "maxpool of pool", "input", "maxpool with a
    window of padding alone" or "shared conv")."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r"]),
             helper.make_node("Conv", ["r", "w1", "b1"], ["c1"], strides=[2, 2], pads=[1, 1, 1, 1])]
    outputs = [fvi("y", None)]
    if second == "pool":
        nodes.append(helper.make_node("AveragePool", ["r"], ["p"], kernel_shape=[3, 3], strides=[2, 2],
                                      pads=[1, 1, 1, 1]))
    elif second == "maxpool of pool":
        nodes += [helper.make_node("MaxPool", ["r"], ["q"], kernel_shape=[2, 2], strides=[1, 1], pads=[1, 1, 0, 0]),
                  helper.make_node("AveragePool", ["q"], ["p"], kernel_shape=[3, 3], strides=[2, 2],
                                   pads=[1, 1, 1, 1])]
    elif second == "input":
        nodes.append(helper.make_node("Identity", ["x2"], ["p"]))
    elif second == "maxpool with a window of padding alone":
        nodes.append(helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[1, 1], strides=[3, 3], pads=[2, 2, 0, 0]))
    else:  # a second Conv whose output is also a graph output
        nodes.append(helper.make_node("Conv", ["r", "w1"], ["p"], strides=[2, 2], pads=[1, 1, 1, 1]))
        outputs.append(fvi("p", None))
    nodes += [helper.make_node("Concat", ["c1", "p"], ["cat"], axis=1), helper.make_node("Relu", ["cat"], ["y"])]
    inits = [("w0", rng.standard_normal((4, 3, 3, 3)).astype(np.float32)),
             ("w1", rng.standard_normal((4, 4, 3, 3)).astype(np.float32)),
             ("b1", rng.standard_normal(4).astype(np.float32))]
    model = model_of(nodes, [fvi("x", [1, 3, 8, 8]), fvi("x2", [1, 4, 4, 4])], outputs, inits)
    feeds = {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32),
             "x2": rng.standard_normal((1, 4, 4, 4)).astype(np.float32)}
    return model, feeds


@pytest.mark.parametrize("second", ["pool", "maxpool of pool"])
def test_relu_after_concat_moves_into_its_inputs(second):
    model, feeds = _concat_relu(second)
    graph = optimized(model, Level.ORT_ENABLE_ALL)
    assert ops(graph)["Relu"] == 0
    assert graph.producer("y").op_type == "Concat"
    branch = graph.producer(graph.producer("y").inputs[0])
    assert branch.op_type == "FusedConv" and branch.attr("activation") == "Relu"
    assert_session_matches_ort(model, feeds)


@pytest.mark.parametrize("second", ["input", "shared conv", "maxpool with a window of padding alone"])
def test_relu_after_concat_stays_when_an_input_may_be_negative(second):
    model, feeds = _concat_relu(second)
    graph = optimized(model, Level.ORT_ENABLE_ALL)
    assert graph.producer("y").op_type == "Relu"
    assert graph.producer(graph.producer("y").inputs[0]).op_type == "Concat"
    if second.startswith("maxpool"):  # onnxruntime rejects pads as wide as the kernel: -inf -> 0 here
        so = onnxhal.SessionOptions()
        so.graph_optimization_level = Level.ORT_ENABLE_ALL
        y = onnxhal.InferenceSession(model.SerializeToString(), so).run(None, feeds)[0]
        assert (y[:, 4:, 0, 0] == 0).all() and (y >= 0).all()
        return
    assert_session_matches_ort(model, feeds)


def _relu_maxpool(case: str, seed: int = 0):
    """Conv -> Relu -> MaxPool (SqueezeNet's and ResNet's stems) or Concat(Relu(Conv), Relu(Conv))
    -> MaxPool (SqueezeNet's fire3/fire5), with the variations named by ``case``."""
    rng = np.random.default_rng(seed)
    pool = {"kernel_shape": [3, 3], "strides": [2, 2]}
    if case == "padded":
        pool["pads"] = [1, 1, 1, 1]
    elif case == "ceil mode":
        pool["ceil_mode"] = 1
    elif case == "unit stride":
        pool["strides"] = [1, 1]
    elif case == "padding alone":
        pool = {"kernel_shape": [1, 1], "strides": [3, 3], "pads": [2, 2, 0, 0]}
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1])]
    inits = [("w0", rng.standard_normal((4, 3, 3, 3)).astype(np.float32)),
             ("b0", rng.standard_normal(4).astype(np.float32))]
    outputs = [fvi("y", None)]
    if case.startswith("concat"):
        nodes += [helper.make_node("Conv", ["x", "w1"], ["c1"]), helper.make_node("Relu", ["c0"], ["r0"]),
                  helper.make_node("Relu" if case != "concat with a non-relu input" else "Sigmoid", ["c1"], ["r1"]),
                  helper.make_node("Concat", ["r0", "r1"], ["r"], axis=1)]
        inits.append(("w1", rng.standard_normal((2, 3, 1, 1)).astype(np.float32)))
    else:
        nodes.append(helper.make_node("Relu", ["c0"], ["r"]))
    pool_outputs = ["y", "idx"] if case == "indices" else ["y"]
    nodes.append(helper.make_node("MaxPool", ["r"], pool_outputs, **pool))
    if case == "indices":
        outputs.append(helper.make_tensor_value_info("idx", TensorProto.INT64, None))
    if case == "relu read elsewhere":
        outputs.append(fvi("r", None))
    model = model_of(nodes, [fvi("x", [1, 3, 9, 11])], outputs, inits)
    return model, {"x": rng.standard_normal((1, 3, 9, 11)).astype(np.float32)}


def _run_at(model: onnx.ModelProto, feeds: dict, level: Level) -> np.ndarray:
    so = onnxhal.SessionOptions()
    so.graph_optimization_level = level
    return onnxhal.InferenceSession(model.SerializeToString(), so).run(None, feeds)[0]


@pytest.mark.parametrize("case", ["plain", "padded", "ceil mode", "concat"])
def test_relu_before_a_strided_maxpool_moves_after_it(case):
    model, feeds = _relu_maxpool(case)
    graph = optimized(model, Level.ORT_ENABLE_ALL)
    relu = graph.producer("y")
    assert relu.op_type == "Relu" and graph.producer(relu.inputs[0]).op_type == "MaxPool"
    assert ops(graph)["Relu"] == 1
    assert all(n.attr("activation", "") == "" for n in graph.nodes if n.op_type == "FusedConv")
    assert_session_matches_ort(model, feeds)
    # NaN goes through either order alike: compare with the unoptimized graph
    feeds["x"][0, 0, 2:4, 3] = np.nan
    unoptimized, optimized_run = (_run_at(model, feeds, level) for level in (Level.ORT_DISABLE_ALL, Level.ORT_ENABLE_ALL))
    assert np.isnan(unoptimized).any()
    np.testing.assert_allclose(optimized_run, unoptimized, rtol=1e-5, atol=1e-5)  # NaN where NaN, within rounding
    # beside another EP (an NHWC one would lose its Transposes' cancelling) the Relu stays
    other = optimize(load_model(model).graph, Level.ORT_ENABLE_ALL, cpu_ep_only=False)
    assert other.producer("y").op_type == "MaxPool"


@pytest.mark.parametrize("case", ["unit stride", "padding alone", "indices", "relu read elsewhere",
                                  "concat with a non-relu input"])
def test_relu_before_a_maxpool_stays_when_moving_it_changes_or_saves_nothing(case):
    model, feeds = _relu_maxpool(case)
    graph = optimized(model, Level.ORT_ENABLE_ALL)
    pool = graph.producer("y")
    assert pool.op_type == "MaxPool"
    if case == "padding alone":  # onnxruntime rejects pads as wide as the kernel: compare unoptimized
        unoptimized = _run_at(model, feeds, Level.ORT_DISABLE_ALL)
        assert (unoptimized == np.finfo(np.float32).min).any()  # the windows of padding alone
        np.testing.assert_allclose(_run_at(model, feeds, Level.ORT_ENABLE_ALL), unoptimized, rtol=1e-5, atol=1e-5)
        return
    assert_session_matches_ort(model, feeds)


def test_batchnorm_mul_add_fold_then_fuse_with_relu():
    """DenseNet's pre-activation: BatchNormalization, Mul and Add by per-channel constants, Relu."""
    rng = np.random.default_rng(9)
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["n"], epsilon=1e-3),
             helper.make_node("Mul", ["n", "k"], ["nk"]), helper.make_node("Add", ["nk", "c"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    inits = [("s", rng.uniform(0.5, 2, 6)), ("b", rng.standard_normal(6)), ("m", rng.standard_normal(6)),
             ("v", rng.uniform(0.5, 2, 6)), ("k", rng.uniform(0.5, 2, (6, 1, 1))), ("c", rng.standard_normal((6, 1, 1)))]
    inits = [(k, v.astype(np.float32)) for k, v in inits]
    model = model_of(nodes, [fvi("x", [2, 6, 5, 5])], [fvi("y", [2, 6, 5, 5])], inits)
    feeds = {"x": rng.standard_normal((2, 6, 5, 5)).astype(np.float32)}
    assert [n.op_type for n in assert_basic_keeps_results(model, feeds).nodes] == ["BatchNormalization", "Relu"]
    assert [n.op_type for n in optimized(model, Level.ORT_ENABLE_ALL).nodes] == ["FusedBatchNormalization"]
    assert_session_matches_ort(model, feeds)


def test_matmul_add_becomes_gemm_only_for_2d_inputs():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((6, 5)).astype(np.float32)
    bias = rng.standard_normal(5).astype(np.float32)
    for shape, expected in (([3, 6], "Gemm"), ([2, 3, 6], "MatMul")):
        nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "bias"], ["y"])]
        model = model_of(nodes, [fvi("x", shape)], [fvi("y", shape[:-1] + [5])], [("w", w), ("bias", bias)])
        graph = assert_basic_keeps_results(model, {"x": rng.standard_normal(shape).astype(np.float32)})
        assert graph.nodes[0].op_type == expected


def test_constant_folding_and_dead_nodes():
    rng = np.random.default_rng(3)
    nodes = [
        helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.float32([2.0]), "k")),
        helper.make_node("Mul", ["k", "c"], ["kc"]),         # constant: folded
        helper.make_node("Add", ["x", "kc"], ["y"]),
        helper.make_node("Neg", ["x"], ["unused"]),          # dead: removed
        helper.make_node("Shape", ["x"], ["shape"]),         # static shape: folded, then feeds nothing live
    ]
    model = model_of(nodes, [fvi("x", [4])], [fvi("y", [4])], [("c", np.float32([1, 2, 3, 4]))])
    graph = assert_basic_keeps_results(model, {"x": rng.standard_normal(4).astype(np.float32)})
    assert [n.op_type for n in graph.nodes] == ["Add"]
    folded = graph.initializers[[i for i in graph.nodes[0].inputs if i != "x"][0]]
    np.testing.assert_array_equal(folded, np.float32([2, 4, 6, 8]))
    assert "c" not in graph.initializers  # no longer read


def test_equal_constant_computations_fold_once(monkeypatch):
    """Nodes of one op type, attributes and input values are evaluated once; a different input
    (same bytes, other shape) or a different attribute is evaluated on its own, and each folded
    value is an array of its own."""
    from onnxhal.runtime.optimizer import cleanup
    evaluated = []

    def counting(graph, node, inputs):
        evaluated.append(node.outputs[0])
        return real(graph, node, inputs)

    real = cleanup.evaluate_node
    monkeypatch.setattr(cleanup, "evaluate_node", counting)
    w = np.arange(6, dtype=np.float32)
    nodes = [
        helper.make_node("Reshape", ["w1", "s1"], ["r1"]),
        helper.make_node("Reshape", ["w2", "s2"], ["r2"]),  # as r1: w2 == w1, s2 == s1
        helper.make_node("Reshape", ["w1", "s3"], ["r3"]),  # other shape
        helper.make_node("Transpose", ["r1"], ["t1"], perm=[1, 0]),
        helper.make_node("Transpose", ["r2"], ["t2"], perm=[1, 0]),  # as t1
        helper.make_node("Transpose", ["r3"], ["t3"], perm=[1, 0]),  # r3's bytes are r1's, its shape not
        helper.make_node("Transpose", ["r1"], ["t4"], perm=[0, 1]),  # other attribute
        helper.make_node("Add", ["x", "t1"], ["y1"]),
        helper.make_node("Add", ["x", "t2"], ["y2"]),
        helper.make_node("MatMul", ["x", "t3"], ["y3"]),
        helper.make_node("MatMul", ["x", "t4"], ["y4"]),
    ]
    inits = [("w1", w), ("w2", w.copy()), ("s1", np.int64([3, 2])), ("s2", np.int64([3, 2])),
             ("s3", np.int64([2, 3]))]
    model = model_of(nodes, [fvi("x", [2, 3])], [fvi(y, None) for y in ("y1", "y2", "y3", "y4")], inits)
    graph = assert_basic_keeps_results(model, {"x": np.random.default_rng(0).standard_normal((2, 3), np.float32)})
    assert sorted(evaluated) == ["r1", "r3", "t1", "t3", "t4"]
    assert ops(graph) == Counter({"Add": 2, "MatMul": 2})
    reads = [n.inputs[1] for n in graph.nodes if n.op_type == "Add"]
    assert graph.initializers[reads[0]] is not graph.initializers[reads[1]]


def test_random_ops_and_overridable_initializers_are_not_folded():
    nodes = [
        helper.make_node("RandomNormal", [], ["r"], shape=[4], seed=1.0),
        helper.make_node("Add", ["r", "c"], ["rc"]),
        helper.make_node("Mul", ["d", "d"], ["dd"]),  # d is overridable (IR 3 input with a default)
        helper.make_node("Add", ["rc", "dd"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "g", [fvi("d", [4])], [fvi("y", [4])],
                              [numpy_helper.from_array(np.float32([1, 2, 3, 4]), "c"),
                               numpy_helper.from_array(np.float32([1, 1, 1, 1]), "d")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)], ir_version=3)
    out = optimized(model, Level.ORT_ENABLE_ALL, NO_CHAINS)
    assert ops(out) == Counter({"RandomNormal": 1, "Add": 2, "Mul": 1})


def test_identity_dropout_elimination_keeps_output_names():
    rng = np.random.default_rng(4)
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Identity", ["r"], ["i"]),
        helper.make_node("Dropout", ["i"], ["d"]),
        helper.make_node("Neg", ["d"], ["n"]),
        helper.make_node("Identity", ["n"], ["y"]),  # graph output: producer renamed instead
        helper.make_node("Identity", ["x"], ["x_copy"]),  # graph input to graph output: must stay
    ]
    model = model_of(nodes, [fvi("x", [5])], [fvi("y", [5]), fvi("x_copy", [5])])
    graph = assert_basic_keeps_results(model, {"x": rng.standard_normal(5).astype(np.float32)})
    assert [n.op_type for n in graph.nodes] == ["Relu", "Neg", "Identity"]
    assert graph.nodes[1].outputs == ("y",)


def test_subgraphs_are_optimized_and_keep_outer_reads():
    rng = np.random.default_rng(5)
    then_g = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["t0"]), helper.make_node("Add", ["t0", "one"], ["t1"]),
         helper.make_node("Mul", ["one", "two"], ["k"]), helper.make_node("Mul", ["t1", "k"], ["then_out"])],
        "then", [], [fvi("then_out", [3])],
        [numpy_helper.from_array(np.float32([1, 1, 1]), "one"), numpy_helper.from_array(np.float32([2, 2, 2]), "two")])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["else_out"])], "else", [], [fvi("else_out", [3])])
    nodes = [helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g)]
    model = model_of(nodes, [fvi("x", [3]), helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                     [fvi("y", [3])])
    for cond in (True, False):
        graph = assert_basic_keeps_results(model, {"x": rng.standard_normal(3).astype(np.float32),
                                                   "cond": np.array(cond)})
    then_ops = [n.op_type for n in graph.nodes[0].subgraphs["then_branch"].nodes]
    assert then_ops == ["Add", "Mul"]
    assert graph.nodes[0].implicit_inputs == ("x",)


# -- extended level: fused ops, run by onnxhal's session ----------------------------------------


def test_encoder_fusions_keep_results():
    model = small_encoder()
    graph = optimized(model, Level.ORT_ENABLE_ALL)
    counts = ops(graph)
    assert counts["LayerNormalization"] == 2
    assert counts["FusedMatMul"] == 6  # Q, K, V, output projection, FFN in (with Gelu), FFN out
    assert counts["Erf"] == counts["ReduceMean"] == counts["Pow"] == 0
    assert any(n.attr("activation") == "Gelu" for n in graph.nodes if n.op_type == "FusedMatMul")
    assert_session_matches_ort(model, bench_models.feeds(model))


def test_cnn_fusions_keep_results():
    model = small_cnn()
    graph = optimized(model, Level.ORT_ENABLE_EXTENDED)
    fused = [n for n in graph.nodes if n.op_type == "FusedConv"]
    assert len(fused) == 16 and sum(len(n.inputs) == 4 for n in fused) == 8  # 8 residual Adds fused
    assert all(n.attr("activation") == "Relu" for n in fused)
    # the downsample projections, followed by nothing to fuse, and the stem, whose Relu now
    # follows its MaxPool (pull_relu_after_maxpool)
    assert ops(graph)["Conv"] == 4 and ops(graph)["Relu"] == 1
    everything = ops(optimized(model, Level.ORT_ENABLE_ALL))  # all level: those run on FusedConv too
    assert everything["FusedConv"] == 20 and everything["FusedGemm"] == 1 and everything["Conv"] == 0
    assert_session_matches_ort(model, bench_models.feeds(model))


def test_mlp_gemm_relu_fusion_keeps_results():
    model = bench_models.mlp(batch=4, sizes=(16, 32, 32, 8))
    assert ops(optimized(model, Level.ORT_ENABLE_EXTENDED)) == Counter({"FusedGemm": 2, "Gemm": 1})
    assert_session_matches_ort(model, bench_models.feeds(model))


def test_opset_20_gelu_is_fused_into_the_matmul_before_it():
    """The ONNX Gelu (opset 20, as exporters write it) is an activation the fused MatMul applies,
    as the com.onnxhal Gelu the optimizer makes from the Erf form."""
    rng = np.random.default_rng(7)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Gelu", ["a"], ["y"])]
    model = model_of(nodes, [fvi("x", [8, 16])], [fvi("y", [8, 32])],
                     [("w", rng.standard_normal((16, 32)).astype(np.float32)),
                      ("b", rng.standard_normal(32).astype(np.float32))], opset=20)
    graph = optimized(model, Level.ORT_ENABLE_ALL)
    assert [(n.op_type, n.attr("activation")) for n in graph.nodes] == [("FusedGemm", "Gelu")]  # 2-D: a Gemm
    assert_session_matches_ort(model, {"x": rng.standard_normal((8, 16)).astype(np.float32)})


def _quantized_matmul(k: int, per_column: bool, bias: bool, expose_cast: bool = False) -> onnx.ModelProto:
    """One MatMul as onnxruntime's quantize_dynamic writes it: DynamicQuantizeLinear of x [2, 5, k],
    MatMulInteger with int8 weights, Cast, Mul by Mul(x_scale, w_scale) [, Add bias]."""
    rng = np.random.default_rng(k)
    n = 12
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("MatMulInteger", ["xq", "w", "xz", "wz"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["xs", "ws"], ["s"]),
             helper.make_node("Mul", ["accf", "s"], ["m" if bias else "y"])]
    if bias:
        nodes.append(helper.make_node("Add", ["m", "b"], ["y"]))
    inits = [("w", rng.integers(-128, 128, (k, n)).astype(np.int8)), ("wz", np.array(3, np.int8)),
             ("ws", (rng.random(n if per_column else ()) * 0.01 + 1e-3).astype(np.float32)),
             ("b", rng.standard_normal(n).astype(np.float32))]
    outputs = [fvi("y", [2, 5, n])] + ([helper.make_tensor_value_info("accf", TensorProto.FLOAT, [2, 5, n])]
                                       if expose_cast else [])
    return model_of(nodes, [fvi("x", [2, 5, k])], outputs, inits if bias else inits[:3], opset=17)


@pytest.mark.parametrize("k,per_column,bias", [(32, True, True), (32, False, False), (300, True, True)])
def test_quantized_matmul_chain_fuses_to_matmul_integer_to_float_with_the_same_bits(k, per_column, bias):
    """k 300: the exact product needs float64 (300 * 255^2 > 2^24)."""
    model = _quantized_matmul(k, per_column, bias)
    graph = optimized(model, Level.ORT_ENABLE_EXTENDED)
    # (and with the DynamicQuantizeLinear it alone reads: DynamicQuantizeMatMul, dynamic_quant_fusions)
    assert ops(graph) == Counter({"DynamicQuantizeMatMul": 1})
    x = {"x": np.random.default_rng(1).standard_normal((2, 5, k)).astype(np.float32) * 3}
    fused = _run_at(model, x, Level.ORT_ENABLE_ALL)
    np.testing.assert_array_equal(fused, _run_at(model, x, Level.ORT_DISABLE_ALL))
    np.testing.assert_allclose(fused, ort_run(model, x)[0], rtol=1e-6, atol=1e-6)


def test_quantized_matmul_chain_with_an_exposed_intermediate_is_not_fused():
    graph = optimized(_quantized_matmul(32, True, True, expose_cast=True), Level.ORT_ENABLE_ALL)
    assert ops(graph)["MatMulInteger"] == 1 and ops(graph)["MatMulIntegerToFloat"] == 0


def test_without_cpu_fusions_only_standard_ops_remain():
    graph = optimize(load_model(small_encoder()).graph, Level.ORT_ENABLE_ALL, fuse_cpu_ops=False)
    assert all(n.domain == "" for n in graph.nodes)
    assert ops(graph)["LayerNormalization"] == 2 and ops(graph)["Erf"] == 1


@pytest.mark.parametrize("variant", ["half_first", "mul_by_rsqrt2", "dynamo"])
def test_gelu_variants_fuse(variant):
    rng = np.random.default_rng(6)
    if variant == "dynamo":  # x * (0.5 * (1 + erf(x / sqrt2))), torch.onnx.export(dynamo=True)'s order
        nodes = [helper.make_node("Div", ["x", "s2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
                 helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", ["half", "a"], ["h"]),
                 helper.make_node("Mul", ["x", "h"], ["y"])]
    elif variant == "half_first":  # (x * 0.5) * (1 + erf(x / sqrt2))
        nodes = [helper.make_node("Mul", ["x", "half"], ["h"]), helper.make_node("Div", ["x", "s2"], ["d"]),
                 helper.make_node("Erf", ["d"], ["e"]), helper.make_node("Add", ["one", "e"], ["a"]),
                 helper.make_node("Mul", ["h", "a"], ["y"])]
    else:  # x * (1 + erf(x * 1/sqrt2)) * 0.5
        nodes = [helper.make_node("Mul", ["rs2", "x"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
                 helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", ["a", "x"], ["m"]),
                 helper.make_node("Mul", ["half", "m"], ["y"])]
    inits = [("half", np.float32(0.5)), ("one", np.float32(1.0)), ("s2", np.float32(math.sqrt(2))),
             ("rs2", np.float32(1 / math.sqrt(2)))]
    model = model_of(nodes, [fvi("x", [64])], [fvi("y", [64])], inits)
    assert [n.op_type for n in optimized(model, Level.ORT_ENABLE_ALL).nodes] == ["Gelu"]
    assert_session_matches_ort(model, {"x": (rng.standard_normal(64) * 3).astype(np.float32)})


def _scaled_scores(case: str):
    """Attention scores of 2 heads, Q K^T scaled by a constant, with Q (or K) projected by a
    constant product; ``case`` picks the variant or a reason the factor must stay."""
    rng = np.random.default_rng(15)

    def w(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    q_side = case != "mul on k side"
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q0"]), helper.make_node("Add", ["q0", "bq"], ["q1"]),
             helper.make_node("Reshape", ["q1", "heads"], ["q2"]),
             helper.make_node("Transpose", ["q2"], ["q"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["k_in", "heads"], ["k2"]),
             helper.make_node("Transpose", ["k2"], ["k"], perm=[0, 2, 3, 1])]
    if not q_side:  # K projected by a 2-D Gemm instead; Q a plain input
        nodes = [helper.make_node("Gemm", ["x2", "wk", "bk"], ["k0"]),
                 helper.make_node("Reshape", ["k0", "heads"], ["k2"]),
                 helper.make_node("Transpose", ["k2"], ["k"], perm=[0, 2, 3, 1]),
                 helper.make_node("Reshape", ["q_in", "heads"], ["q2"]),
                 helper.make_node("Transpose", ["q2"], ["q"], perm=[0, 2, 1, 3])]
    if case == "relu after the product":  # FusedMatMul with a Relu: the factor must not cross it
        nodes[1:2] = [helper.make_node("Add", ["q0", "bq"], ["qa"]), helper.make_node("Relu", ["qa"], ["q1"])]
    nodes.append(helper.make_node("MatMul", ["q", "k"], ["scores"]))
    if case == "factor first":
        nodes.append(helper.make_node("Div", ["s", "scores"], ["scaled"]))
    elif case == "mul on k side":
        nodes.append(helper.make_node("Mul", ["scores", "s"], ["scaled"]))
    else:
        nodes.append(helper.make_node("Div", ["scores", "s"], ["scaled"]))
    nodes.append(helper.make_node("Softmax", ["scaled"], ["y"], axis=-1))
    outputs = [fvi("y", [1, 2, 6, 6])] + ([fvi("q", [1, 2, 6, 4])] if case == "q read elsewhere" else [])
    inits = [("heads", np.array([1, 6, 2, 4], np.int64)), ("s", np.float32(0.125 if not q_side else math.sqrt(8)))]
    if q_side:
        inputs = [fvi("x", [1, 6, 16]), fvi("k_in", [1, 6, 8])]
        inits += [("wq", w(16, 8)), ("bq", w(8))]
        feeds = {"x": w(1, 6, 16), "k_in": w(1, 6, 8)}
    else:
        inputs = [fvi("x2", [6, 16]), fvi("q_in", [1, 6, 8])]
        inits += [("wk", w(16, 8)), ("bk", w(8))]
        feeds = {"x2": w(6, 16), "q_in": w(1, 6, 8)}
    return model_of(nodes, inputs, outputs, inits), feeds


@pytest.mark.parametrize("case", ["div on q side", "mul on k side"])
def test_attention_scale_folds_into_the_projection_weights(case):
    model, feeds = _scaled_scores(case)
    graph = optimized(model, Level.ORT_ENABLE_ALL)
    assert ops(graph)["Div"] == ops(graph)["Mul"] == 0
    assert_session_matches_ort(model, feeds, atol=1e-5)


@pytest.mark.parametrize("case", ["factor first", "q read elsewhere", "relu after the product"])
def test_attention_scale_stays_when_it_cannot_move(case):
    model, feeds = _scaled_scores(case)
    assert ops(optimized(model, Level.ORT_ENABLE_ALL))["Div"] == 1
    assert_session_matches_ort(model, feeds, atol=1e-5)


def test_scale_of_a_product_with_itself_stays():
    rng = np.random.default_rng(16)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("MatMul", ["p", "p"], ["pp"]),
             helper.make_node("Div", ["pp", "s"], ["y"])]
    model = model_of(nodes, [fvi("x", [4, 4])], [fvi("y", [4, 4])],
                     [("w", rng.standard_normal((4, 4)).astype(np.float32)), ("s", np.float32(4.0))])
    assert ops(optimized(model, Level.ORT_ENABLE_ALL))["Div"] == 1
    assert_session_matches_ort(model, {"x": rng.standard_normal((4, 4)).astype(np.float32)}, atol=1e-5)


def test_encoder_scores_are_scaled_in_the_query_weights():
    model = small_encoder()
    assert ops(optimized(model, Level.ORT_ENABLE_ALL))["Div"] == 0
    assert_session_matches_ort(model, bench_models.feeds(model), atol=1e-5)


def test_layer_norm_with_opset18_axes_input_fuses():
    rng = np.random.default_rng(7)
    nodes = [helper.make_node("ReduceMean", ["x", "ax"], ["m"]), helper.make_node("Sub", ["x", "m"], ["d"]),
             helper.make_node("Mul", ["d", "d"], ["p"]), helper.make_node("ReduceMean", ["p", "ax"], ["v"]),
             helper.make_node("Add", ["v", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["s"]),
             helper.make_node("Div", ["d", "s"], ["y"])]
    inits = [("ax", np.array([-1], np.int64)), ("eps", np.float32(1e-5))]
    model = model_of(nodes, [fvi("x", [3, 16])], [fvi("y", [3, 16])], inits, opset=18)
    assert [n.op_type for n in optimized(model, Level.ORT_ENABLE_ALL).nodes] == ["LayerNormalization"]
    assert_session_matches_ort(model, {"x": rng.standard_normal((3, 16)).astype(np.float32)})


def _decomposed_layer_norm(out: str) -> tuple[list, list]:
    """The nodes and constants of LayerNormalization as PyTorch exports it before opset 17
    (ReduceMean with an axes attribute, Pow by 2), from "x" to ``out``, without scale and bias."""
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], axes=[-1]), helper.make_node("Sub", ["x", "m"], ["d"]),
             helper.make_node("Pow", ["d", "two"], ["p"]), helper.make_node("ReduceMean", ["p"], ["v"], axes=[-1]),
             helper.make_node("Add", ["v", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["s"]),
             helper.make_node("Div", ["d", "s"], [out])]
    return nodes, [("two", np.float32(2)), ("eps", np.float32(1e-5))]


def test_layer_norm_below_opset17_fuses_to_the_onnxhal_op_and_matches_ort():
    """A model older than opset 17 (BERT exports at 11-14) gets the com.onnxhal op, which shares
    the ONNX op's kernel; 16x512 takes its BLAS row-sum path."""
    rng = np.random.default_rng(8)
    nodes, inits = _decomposed_layer_norm("n")
    nodes += [helper.make_node("Mul", ["n", "gamma"], ["g"]), helper.make_node("Add", ["g", "beta"], ["y"])]
    inits += [("gamma", rng.standard_normal(512).astype(np.float32)),
              ("beta", rng.standard_normal(512).astype(np.float32))]
    model = model_of(nodes, [fvi("x", [16, 512])], [fvi("y", [16, 512])], inits, opset=13)
    fused = optimized(model, Level.ORT_ENABLE_ALL).nodes
    assert [(n.op_type, n.domain) for n in fused] == [("LayerNormalization", "com.onnxhal")]
    assert_session_matches_ort(model, {"x": (rng.standard_normal((16, 512)) * 3 + 5).astype(np.float32)}, atol=1e-5)


def test_layer_norm_pattern_with_exposed_intermediate_is_not_fused():
    """If the centred value is also a graph output, fusing would lose it."""
    nodes, inits = _decomposed_layer_norm("y")
    model = model_of(nodes, [fvi("x", [2, 8])], [fvi("y", [2, 8]), fvi("d", [2, 8])], inits)
    assert ops(optimized(model, Level.ORT_ENABLE_ALL))["LayerNormalization"] == 0


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [1, 1], "strides": [2, 2]},
    {"kernel_shape": [3, 3], "pads": [0, 1, 2, 1], "dilations": [2, 2]},
    {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]},
    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "group": 2},
    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "group": 4, "strides": [2, 1]},  # 2 outputs per channel
    {"kernel_shape": [7, 7], "pads": [3, 2, 3, 1], "strides": [2, 2]},  # im2col from stride phases
    {"kernel_shape": [5, 5], "pads": [2, 2, 1, 2], "strides": [2, 1], "dilations": [1, 2]},
    # output as wide as the input: taps read as contiguous slices of the flattened planes
    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 3], "pads": [2, 0, 0, 4], "dilations": [1, 2]},
    {"kernel_shape": [5, 5], "pads": [2, 3, 2, 1]},
])
@pytest.mark.parametrize("activation", ["Relu", "LeakyRelu", "Clip"])
def test_fused_conv_kernel_matches_conv_then_activation(attrs, activation):
    rng = np.random.default_rng(8)
    act = {"Relu": helper.make_node("Relu", ["c"], ["y"]),
           "LeakyRelu": helper.make_node("LeakyRelu", ["c"], ["y"], alpha=0.1),
           "Clip": helper.make_node("Clip", ["c", "lo", "hi"], ["y"])}[activation]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs), act]
    inits = [("w", rng.standard_normal((8, 4 // attrs.get("group", 1), *attrs["kernel_shape"])).astype(np.float32)),
             ("b", rng.standard_normal(8).astype(np.float32)), ("lo", np.float32(-0.5)), ("hi", np.float32(0.7))]
    model = model_of(nodes, [fvi("x", [2, 4, 11, 9])], [fvi("y", None)], inits)
    assert [n.op_type for n in optimized(model, Level.ORT_ENABLE_ALL).nodes] == ["FusedConv"]
    assert_session_matches_ort(model, {"x": rng.standard_normal((2, 4, 11, 9)).astype(np.float32)})


def test_light_squeezenet_materialized_and_fused_end_to_end():
    """The light model zoo file with its ConstantOfShape weights made random initializers."""
    model = bench_models.light_model("squeezenet")
    assert not any(n.op_type == "ConstantOfShape" for n in model.graph.node)
    assert [i.name for i in model.graph.input] == ["data_0"]
    graph = optimized(model, Level.ORT_ENABLE_ALL)
    # each of the three MaxPools is followed by the Relu its input had (pull_relu_after_maxpool)
    assert ops(graph)["FusedConv"] == 26 and ops(graph)["Relu"] == 3
    assert_session_matches_ort(model, bench_models.feeds(model), atol=1e-5)


def test_fused_conv_1d_runs_through_the_cpu_conv_kernel():
    rng = np.random.default_rng(12)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1]), helper.make_node("Relu", ["c"], ["y"])]
    model = model_of(nodes, [fvi("x", [2, 3, 10])], [fvi("y", [2, 4, 10])],
                     [("w", rng.standard_normal((4, 3, 3)).astype(np.float32))])
    assert [n.op_type for n in optimized(model, Level.ORT_ENABLE_ALL).nodes] == ["FusedConv"]
    assert_session_matches_ort(model, {"x": rng.standard_normal((2, 3, 10)).astype(np.float32)})


@pytest.mark.parametrize("strides", [[1, 1], [2, 2]])
def test_fused_depthwise_conv_with_residual(strides):
    rng = np.random.default_rng(10)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=6, kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                              strides=strides),
             helper.make_node("Add", ["c", "r"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    inits = [("w", rng.standard_normal((6, 1, 3, 3)).astype(np.float32)), ("b", rng.standard_normal(6).astype(np.float32))]
    out = [2, 6, 9 // strides[0] + 1 if strides[0] == 2 else 9, 7 // strides[1] + 1 if strides[1] == 2 else 7]
    model = model_of(nodes, [fvi("x", [2, 6, 9, 7]), fvi("r", out)], [fvi("y", out)], inits)
    assert [n.op_type for n in optimized(model, Level.ORT_ENABLE_ALL).nodes] == ["FusedConv"]
    assert_session_matches_ort(model, {"x": rng.standard_normal((2, 6, 9, 7)).astype(np.float32),
                                       "r": rng.standard_normal(out).astype(np.float32)})


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]},  # ShuffleNet's and MobileNet's stride-2 layers
    {"kernel_shape": [3, 3], "pads": [0, 0, 1, 1]},
    {"kernel_shape": [3, 3], "auto_pad": "SAME_LOWER"},
    {"kernel_shape": [5, 5], "pads": [2, 2, 2, 2]},
    {"kernel_shape": [3, 3], "pads": [2, 2, 2, 2], "dilations": [2, 2]},
    {"kernel_shape": [2, 2]},
    {"kernel_shape": [1, 1]},
    {"kernel_shape": [3, 3], "pads": [3, 1, 2, 1]},  # more output rows than a phase has
    {"kernel_shape": [3, 3]},  # output narrower than half the input: the padded-phase path
])
def test_fused_depthwise_stride2_over_even_input(attrs):
    """Stride 2 over an even input with the output half as wide: taps read from flat phase planes."""
    _assert_stride2_conv_relu_matches_ort({"group": 6, **attrs}, cin=6, seed=13)


def _assert_stride2_conv_relu_matches_ort(attrs: dict, cin: int, seed: int) -> None:
    """Conv (stride 2, 6 outputs, bias) + Relu over an even (2, cin, 10, 8) input: fused into one
    FusedConv, and its results equal to onnxruntime's."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[2, 2], **attrs),
             helper.make_node("Relu", ["c"], ["y"])]
    inits = [("w", rng.standard_normal((6, cin // attrs.get("group", 1), *attrs["kernel_shape"])).astype(np.float32)),
             ("b", rng.standard_normal(6).astype(np.float32))]
    model = model_of(nodes, [fvi("x", [2, cin, 10, 8])], [fvi("y", None)], inits)
    assert [n.op_type for n in optimized(model, Level.ORT_ENABLE_ALL).nodes] == ["FusedConv"]
    assert_session_matches_ort(model, {"x": rng.standard_normal((2, cin, 10, 8)).astype(np.float32)})


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]},  # ShuffleNet's stem, ResNet's 3x3/2 layers
    {"kernel_shape": [7, 7], "pads": [3, 3, 3, 3]},  # the 7x7/2 stems
    {"kernel_shape": [3, 3], "pads": [0, 0, 1, 1], "group": 2},
    {"kernel_shape": [5, 5], "pads": [2, 1, 3, 2], "dilations": [1, 1]},
    {"kernel_shape": [3, 3], "pads": [3, 1, 2, 1]},  # more output rows than a phase has
])
def test_fused_conv_stride2_over_even_input_reads_flat_phase_planes(attrs):
    """im2col of a stride-2 convolution whose output is half as wide as an even input comes from
    the four stride phases as flat planes (``half_width_taps``), the bias folded into the product."""
    _assert_stride2_conv_relu_matches_ort(attrs, cin=4, seed=14)


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]},  # DenseNet's 128-to-32 layers
    {"kernel_shape": [5, 5], "pads": [2, 3, 2, 1]},
    {"kernel_shape": [3, 3], "pads": [0, 2, 2, 2], "dilations": [1, 2]},
])
@pytest.mark.parametrize("bias,residual", [(True, False), (False, True)])
def test_fused_conv_with_fewer_outputs_than_inputs_adds_tap_products(attrs, bias, residual):
    """Unit stride, output as wide as the input, at most half as many output channels as input
    channels: one product of every tap's weights with the padded input, added at the taps' offsets."""
    rng = np.random.default_rng(14)
    conv_inputs = ["x", "w", "b"] if bias else ["x", "w"]
    nodes = [helper.make_node("Conv", conv_inputs, ["c"], **attrs)]
    if residual:
        nodes.append(helper.make_node("Add", ["c", "r"], ["a"]))
    nodes.append(helper.make_node("Relu", ["a" if residual else "c"], ["y"]))
    inits = [("w", rng.standard_normal((3, 8, *attrs["kernel_shape"])).astype(np.float32))]
    if bias:
        inits.append(("b", rng.standard_normal(3).astype(np.float32)))
    oh = 9 + attrs["pads"][0] + attrs["pads"][2] - (attrs["kernel_shape"][0] - 1) * attrs.get("dilations", [1, 1])[0]
    inputs = [fvi("x", [2, 8, 9, 7])] + ([fvi("r", [2, 3, oh, 7])] if residual else [])
    model = model_of(nodes, inputs, [fvi("y", None)], inits)
    assert [n.op_type for n in optimized(model, Level.ORT_ENABLE_ALL).nodes] == ["FusedConv"]
    feeds = {"x": rng.standard_normal((2, 8, 9, 7)).astype(np.float32)}
    if residual:
        feeds["r"] = rng.standard_normal((2, 3, oh, 7)).astype(np.float32)
    assert_session_matches_ort(model, feeds)


@pytest.mark.parametrize("m,n", [(3, 7), (9, 4)])  # split by columns / by rows
@pytest.mark.parametrize("c_shape", ["n", "1n", "mn", "m1", "none"])
@pytest.mark.parametrize("trans", [(0, 0), (1, 1)])
def test_fused_gemm_split_with_every_bias_shape(m, n, c_shape, trans, monkeypatch):
    monkeypatch.setattr(worker_pool, "WORKERS", 2)
    monkeypatch.setattr(worker_pool, "SPLIT_PRODUCTS", True)
    monkeypatch.setattr(worker_pool, "PARALLEL_MIN_WORK", 0)
    rng = np.random.default_rng(11)
    a_shape, b_shape = ([5, m] if trans[0] else [m, 5]), ([n, 5] if trans[1] else [5, n])
    shapes = {"n": [n], "1n": [1, n], "mn": [m, n], "m1": [m, 1], "none": None}
    inits = [("b", rng.standard_normal(b_shape).astype(np.float32))]
    inputs = ["a", "b"]
    if shapes[c_shape] is not None:
        inits.append(("c", rng.standard_normal(shapes[c_shape]).astype(np.float32)))
        inputs.append("c")
    nodes = [helper.make_node("Gemm", inputs, ["g"], transA=trans[0], transB=trans[1]),
             helper.make_node("Relu", ["g"], ["y"])]
    model = model_of(nodes, [fvi("a", a_shape)], [fvi("y", [m, n])], inits)
    assert [n.op_type for n in optimized(model, Level.ORT_ENABLE_ALL).nodes] == ["FusedGemm"]
    assert_session_matches_ort(model, {"a": rng.standard_normal(a_shape).astype(np.float32)})


@pytest.mark.parametrize("group,cin,cout", [(1, 6, 10), (4, 8, 12), (3, 9, 3)])
@pytest.mark.parametrize("split", [False, True])
def test_pointwise_fused_conv_with_bias_residual_and_relu(group, cin, cout, split, monkeypatch):
    """1x1 convolutions, grouped or not, with bias, a residual and Relu over a batch of two: the
    pointwise path (one batched product, one epilogue) when BLAS threads itself, the per-group
    split path otherwise; both as onnxruntime."""
    monkeypatch.setattr(worker_pool, "WORKERS", 2)
    monkeypatch.setattr(worker_pool, "SPLIT_PRODUCTS", split)
    monkeypatch.setattr(worker_pool, "PARALLEL_MIN_WORK", 0)
    rng = np.random.default_rng(17)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=group),
             helper.make_node("Add", ["c", "r"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    inits = [("w", rng.standard_normal((cout, cin // group, 1, 1)).astype(np.float32)),
             ("b", rng.standard_normal(cout).astype(np.float32))]
    model = model_of(nodes, [fvi("x", [2, cin, 5, 7]), fvi("r", [2, cout, 5, 7])], [fvi("y", None)], inits)
    assert [n.op_type for n in optimized(model, Level.ORT_ENABLE_ALL).nodes] == ["FusedConv"]
    assert_session_matches_ort(model, {"x": rng.standard_normal((2, cin, 5, 7)).astype(np.float32),
                                       "r": rng.standard_normal((2, cout, 5, 7)).astype(np.float32)})


@pytest.mark.parametrize("build", [small_cnn, small_encoder])
def test_fused_kernels_split_over_threads_keep_results(build, monkeypatch):
    """Force the fused kernels' thread split (two workers, even for tiny products)."""
    monkeypatch.setattr(worker_pool, "WORKERS", 2)
    monkeypatch.setattr(worker_pool, "SPLIT_PRODUCTS", True)
    monkeypatch.setattr(worker_pool, "PARALLEL_MIN_WORK", 0)
    model = build()
    assert_session_matches_ort(model, bench_models.feeds(model))


def test_gelu_runs_inline_while_blas_threads_itself(monkeypatch):
    # BLAS's idle threads spin on the other cores after each product: a pool thread beside them
    # made the encoder's Gelu slower, so it is split only when BLAS is serial.
    monkeypatch.setattr(worker_pool, "WORKERS", 2)
    monkeypatch.setattr(worker_pool, "PARALLEL_MIN_WORK", 0)
    monkeypatch.setattr(worker_pool, "get_pool", lambda: pytest.fail("the Gelu was handed to the pool"))
    monkeypatch.setattr(worker_pool, "SPLIT_PRODUCTS", False)
    x = np.linspace(-5, 5, 200_000, dtype=np.float32)
    inline = gelu(x)
    monkeypatch.undo()
    monkeypatch.setattr(worker_pool, "WORKERS", 2)
    monkeypatch.setattr(worker_pool, "PARALLEL_MIN_WORK", 0)
    monkeypatch.setattr(worker_pool, "SPLIT_PRODUCTS", True)
    np.testing.assert_array_equal(gelu(x), inline)  # the split computes the same values


def test_gelu_kernel_matches_exact_erf():
    # The fused Gelu's c(a) = a / q(a)^16 form: its documented bound, past the clamp at 15, and
    # the special values, with no numpy warning (q^16 must not overflow).
    x = np.linspace(-20, 20, 400_001, dtype=np.float32)  # big enough for the threaded blocks
    exact = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.astype(np.float64)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = gelu(x)
        special = gelu(np.array([np.inf, -np.inf, np.nan, 3e38, -3e38], np.float32))
    np.testing.assert_allclose(got, exact, rtol=0, atol=4e-7)
    assert special[0] == np.inf and abs(special[1]) < 1e-30 and np.isnan(special[2])
    assert special[3] == np.float32(3e38) and abs(special[4]) < 1e-30


def test_small_gelus_take_the_table_to_the_same_bound():
    # Up to 2048 float32 values: c(|x|) interpolated from a table (numerics.gelu_table_inplace), every
    # block of the range, the table's end at 6, and the special values, as the polynomial's bound.
    for lo in range(-20, 20, 2):
        x = np.linspace(lo, lo + 2, 2048, dtype=np.float32)
        exact = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.astype(np.float64)])
        np.testing.assert_allclose(gelu(x), exact, rtol=0, atol=4e-7)
    edge = np.array([6.0, -6.0, np.nextafter(6.0, 7.0), -np.nextafter(6.0, 7.0), 0.0, -0.0, 5.9995], np.float32)
    exact = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in edge.astype(np.float64)])
    np.testing.assert_allclose(gelu(edge), exact, rtol=0, atol=4e-7)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        special = gelu(np.array([np.inf, -np.inf, np.nan, 3e38, -3e38], np.float32))
    assert special[0] == np.inf and abs(special[1]) < 1e-30 and np.isnan(special[2])
    assert special[3] == np.float32(3e38) and abs(special[4]) < 1e-30
    strided = np.linspace(-4, 4, 64, dtype=np.float32).reshape(8, 8)[:, ::2]
    np.testing.assert_array_equal(gelu(strided), gelu(np.ascontiguousarray(strided)))


def test_gelu_polynomial_is_the_documented_fit():
    # benchmarks/fit_gelu.py reproduces the kernel's constants (loosely: LAPACK builds differ in
    # the last digits) and the fit's own error bound.
    spec = importlib.util.spec_from_file_location("onnxhal_fit_gelu",
                                                  Path(__file__).resolve().parents[1] / "benchmarks" / "fit_gelu.py")
    fit_gelu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fit_gelu)
    coef, err = fit_gelu.fit(7, 4)
    np.testing.assert_allclose(coef, numerics.GELU_Q, rtol=1e-4)
    assert err < 5e-8


def shuffle_model(conv_attrs: dict, cin: int, cout: int, shuffle: int, perm=(0, 2, 1, 3, 4), bias: bool = True,
                  activation: bool = True, batch: int = 2, extra_output: str = "") -> onnx.ModelProto:
    """Conv [+ Relu] -> Reshape (N, G, C/G, H, W) -> Transpose -> Reshape (N, C, H, W) -> Sigmoid."""
    rng = np.random.default_rng(21)
    group = conv_attrs.get("group", 1)
    kernel = conv_attrs.get("kernel_shape", [1, 1])
    conv_out = "a" if activation else "c"
    nodes = [helper.make_node("Conv", ["x", "w", "b"] if bias else ["x", "w"], ["c"], **conv_attrs)]
    if activation:
        nodes.append(helper.make_node("Relu", ["c"], ["a"]))
    nodes += [helper.make_node("Reshape", [conv_out, "split"], ["r"]),
              helper.make_node("Transpose", ["r"], ["t"], perm=list(perm)),
              helper.make_node("Reshape", ["t", "merge"], ["s"]),
              helper.make_node("Sigmoid", ["s"], ["y"])]
    inits = [("w", rng.standard_normal((cout, cin // group, *kernel)).astype(np.float32)),
             ("split", np.array([0, shuffle, cout // shuffle, -1, 5], np.int64)),
             ("merge", np.array([batch, cout, -1, 5], np.int64))]
    if bias:
        inits.append(("b", rng.standard_normal(cout).astype(np.float32)))
    outputs = [fvi("y", None)] + ([fvi(extra_output, None)] if extra_output else [])
    return model_of(nodes, [fvi("x", [batch, cin, 6, 5])], outputs, inits)


@pytest.mark.parametrize("conv_attrs, cin, cout, shuffle, bias, activation", [
    ({"group": 4}, 8, 12, 4, True, True),  # ShuffleNet's 1x1 group conv: written shuffled in place
    ({"group": 4}, 8, 12, 4, False, False),
    ({"group": 3, "kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, 6, 9, 3, True, True),  # im2col, in place
    ({"group": 2}, 8, 12, 4, True, True),  # groups != shuffle: one copy
    ({"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, 4, 8, 2, True, False),  # ungrouped: one copy
    ({"group": 8, "kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, 8, 8, 4, True, True),  # depthwise: one copy
])
def test_channel_shuffle_folds_into_the_fused_conv(conv_attrs, cin, cout, shuffle, bias, activation):
    model = shuffle_model(conv_attrs, cin, cout, shuffle, bias=bias, activation=activation,
                          extra_output="s")  # the shuffled value may be a graph output: the fused node makes it
    graph = optimized(model, Level.ORT_ENABLE_ALL)
    assert [n.op_type for n in graph.nodes] == ["FusedConv", "Sigmoid"]
    assert graph.nodes[0].attr("channel_shuffle") == shuffle
    x = np.random.default_rng(3).standard_normal((2, cin, 6, 5)).astype(np.float32)
    assert_session_matches_ort(model, {"x": x}, atol=1e-5)


@pytest.mark.parametrize("case", ["other perm", "transposed value is a graph output"])
def test_channel_shuffle_left_alone_when_it_is_not_the_pattern(case):
    model = shuffle_model({"group": 4}, 8, 12, 4, perm=(0, 1, 2, 4, 3) if case == "other perm" else (0, 2, 1, 3, 4),
                          extra_output="" if case == "other perm" else "t")  # other perm: (N, G, C/G, W, H)
    graph = optimized(model, Level.ORT_ENABLE_ALL)
    assert ops(graph)["Transpose"] == 1 and not any(n.attr("channel_shuffle", 0) for n in graph.nodes)
    assert_session_matches_ort(model, {"x": np.random.default_rng(4).standard_normal((2, 8, 6, 5)).astype(np.float32)})


def test_channel_shuffle_fused_conv_is_declined_by_the_opencl_ep():
    from onnxhal.runtime.providers.opencl import op_support

    graph = optimized(shuffle_model({"group": 4}, 8, 12, 4), Level.ORT_ENABLE_ALL)
    reason = op_support._check_fused(graph.nodes[0], None)
    assert reason is not None and "channel_shuffle" in reason


# -- Gemm weights stored transposed ------------------------------------------------------------


def gemm_model(rows, trans_a: int = 0, shared_b: bool = False) -> onnx.ModelProto:
    """Gemm(A, B (N, K), C, transB=1) + Relu; with ``shared_b`` a MatMul reads B too."""
    rng = np.random.default_rng(31)
    k, n = 6, 5
    a_shape = [k, rows] if trans_a else [rows, k]
    nodes = [helper.make_node("Gemm", ["a", "b", "c"], ["g"], transA=trans_a, transB=1, alpha=1.0, beta=1.0),
             helper.make_node("Relu", ["g"], ["y"])]
    outputs = [fvi("y", None)]
    if shared_b:
        nodes.append(helper.make_node("MatMul", ["b", "k"], ["z"]))
        outputs.append(fvi("z", None))
    inits = [("b", rng.standard_normal((n, k)).astype(np.float32)), ("c", rng.standard_normal(n).astype(np.float32)),
             ("k", rng.standard_normal((k, 3)).astype(np.float32))]
    return model_of(nodes, [fvi("a", a_shape)], outputs, inits if shared_b else inits[:2])


@pytest.mark.parametrize("rows, trans_a", [(4, 0), (4, 1), ("batch", 0)])
def test_gemm_weights_are_stored_transposed_once(rows, trans_a):
    model = gemm_model(rows, trans_a)
    graph = optimized(model, Level.ORT_ENABLE_ALL)
    gemm = next(n for n in graph.nodes if n.op_type == "FusedGemm")
    assert gemm.attr("transB") == 0
    assert graph.initializers[gemm.inputs[1]].shape == (6, 5) and graph.initializers[gemm.inputs[1]].flags.c_contiguous
    assert "b" not in graph.initializers  # replaced, not duplicated
    a = np.random.default_rng(5).standard_normal((6, 4) if trans_a else (4, 6)).astype(np.float32)
    assert_session_matches_ort(model, {"a": a}, atol=1e-5)


@pytest.mark.parametrize("case", ["one row", "weights read by another node"])
def test_gemm_weights_keep_their_layout(case):
    model = gemm_model(4, shared_b=True) if case == "weights read by another node" else gemm_model(1)
    graph = optimized(model, Level.ORT_ENABLE_ALL)
    gemm = next(n for n in graph.nodes if n.op_type == "FusedGemm")
    assert gemm.attr("transB") == 1 and gemm.inputs[1] == "b"


def test_gemm_weights_keep_their_layout_beside_another_ep():
    graph = optimize(load_model(gemm_model(4)).graph, Level.ORT_ENABLE_ALL, cpu_ep_only=False)
    gemm = next(n for n in graph.nodes if n.op_type == "FusedGemm")
    assert gemm.attr("transB") == 1


# -- regressions found by random differential testing against onnxruntime (17,000 graphs) ---------
def _levels_agree_with_ort(model: onnx.ModelProto, feeds: dict, atol: float = 1e-5) -> None:
    """Every optimization level gives onnxruntime's unoptimized result, shape included."""
    model.ir_version = 8
    want = ort_run(model, feeds)
    for level in Level:
        so = onnxhal.SessionOptions()
        so.graph_optimization_level = level
        got = onnxhal.InferenceSession(model.SerializeToString(), so).run(None, feeds)
        for w, g in zip(want, got):
            assert g.shape == w.shape, level
            np.testing.assert_allclose(g, w, atol=atol, err_msg=str(level))


def _c(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, np.float32), name)


def _model(nodes, inputs, inits=()) -> onnx.ModelProto:
    return make(nodes, inputs, [vi("y", None)], inits)


def _erf_gelu(x: str) -> list:
    return [helper.make_node("Div", [x, "sqrt2"], ["t"]), helper.make_node("Erf", ["t"], ["e"]),
            helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", [x, "a"], ["m"]),
            helper.make_node("Mul", ["m", "half"], ["y"])]


def test_gelu_constants_of_higher_rank_than_x_keep_the_broadcast_shape():
    m = _model(_erf_gelu("x"), [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
               [_c("sqrt2", np.full((1, 1, 1), math.sqrt(2))), _c("one", 1.0), _c("half", 0.5)])
    _levels_agree_with_ort(m, {"x": np.array([-1.5, 0.3, 2.0], np.float32)})  # (1, 1, 3), not (3,)


def test_gelu_of_a_transposed_value_is_applied():
    """The fused Gelu wrote a copy when its input was not C-contiguous (a Transpose's view), and
    returned its input unchanged; so did a BatchNormalization with a Gelu epilogue."""
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 3, 1, 2]),
             helper.make_node("BatchNormalization", ["xt", "s", "b", "mu", "var"], ["bn"]), *_erf_gelu("bn")]
    rng = np.random.default_rng(0)
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 5, 3])],
               [_c("s", rng.uniform(0.5, 2, 3)), _c("b", rng.normal(size=3)), _c("mu", rng.normal(size=3)),
                _c("var", rng.uniform(0.5, 2, 3)), _c("sqrt2", math.sqrt(2)), _c("one", 1.0), _c("half", 0.5)])
    _levels_agree_with_ort(m, {"x": rng.uniform(-2, 2, (1, 4, 5, 3)).astype(np.float32)})
    xt = rng.uniform(-2, 2, (4, 3)).astype(np.float32).T
    np.testing.assert_allclose(gelu(xt), gelu(np.ascontiguousarray(xt)))


def test_matmul_bias_of_shape_1_n_on_a_vector_keeps_the_row():
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["mm"]), helper.make_node("Add", ["mm", "bias"], ["y"])]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
               [_c("W", rng.normal(size=(4, 3))), _c("bias", rng.normal(size=(1, 3)))])
    _levels_agree_with_ort(m, {"x": rng.uniform(-2, 2, 4).astype(np.float32)})  # (1, 3), not (3,)


def test_layer_norm_epsilon_of_higher_rank_than_x_keeps_the_broadcast_shape():
    nodes = [helper.make_node("ReduceMean", ["x"], ["mu"], axes=[-1], keepdims=1),
             helper.make_node("Sub", ["x", "mu"], ["d"]), helper.make_node("Mul", ["d", "d"], ["sq"]),
             helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1], keepdims=1),
             helper.make_node("Add", ["var", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["sd"]),
             helper.make_node("Div", ["d", "sd"], ["y"])]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])],
               [_c("eps", np.full((1, 1, 1, 1), 1e-5))])
    m.opset_import[0].version = 13  # ReduceMean's axes as an attribute
    _levels_agree_with_ort(m, {"x": np.random.default_rng(0).uniform(-2, 2, (2, 5)).astype(np.float32)}, atol=1e-4)


@pytest.mark.parametrize("concat", [False, True])
def test_relu_is_not_moved_across_a_dilated_pool_whose_window_reads_only_padding(concat):
    """Rows -1 and 2 of a 2-row input: the window holds no input element, so MaxPool(Relu(x)) is
    the padding value and Relu(MaxPool(x)) would be 0. Both sides agree on -inf here, and
    onnxruntime gives -FLT_MAX, so the check is against the unoptimized session."""
    # strided for pull_relu_after_maxpool, which takes strided pools only; unit stride for
    # push_relu_into_concat, since the pulled Relu would otherwise come first
    pool = dict(kernel_shape=[2, 1], dilations=[3, 1], pads=[1, 0, 1, 0], strides=[1 if concat else 2, 1])
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("MaxPool", ["r"], ["p" if concat else "y"], **pool)]
    inits = []
    if concat:  # the Relu after the Concat would be pushed into the Conv and dropped for the pool
        nodes += [helper.make_node("Conv", ["x", "w"], ["q"], kernel_shape=[2, 1]),  # (1, 1, 1, 1) as p
                  helper.make_node("Concat", ["p", "q"], ["c"], axis=1), helper.make_node("Relu", ["c"], ["y"])]
        inits = [_c("w", np.ones((1, 1, 2, 1)))]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 1])], inits)
    feeds = {"x": np.array([-1.0, 0.5], np.float32).reshape(1, 1, 2, 1)}
    results = []
    for level in (Level.ORT_DISABLE_ALL, Level.ORT_ENABLE_ALL):
        so = onnxhal.SessionOptions()
        so.graph_optimization_level = level
        results.append(onnxhal.InferenceSession(m.SerializeToString(), so).run(None, feeds)[0])
    np.testing.assert_array_equal(results[1], results[0])
    assert (results[0].reshape(-1)[0] == 0) == concat  # the Concat's Relu turns the padding value into 0


def test_fused_conv_weights_fed_as_inputs_are_read_on_every_run():
    """Weights that are graph inputs may be one array updated in place between runs: the [W | b]
    the fused kernel derives must not be kept from the first run."""
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in
              (("x", [1, 2, 5, 5]), ("W", [4, 2, 3, 3]), ("B", [4]))]
    m = _model(nodes, inputs)
    m.ir_version = 8
    rng = np.random.default_rng(0)
    feeds = {"x": rng.normal(size=(1, 2, 5, 5)).astype(np.float32), "W": rng.normal(size=(4, 2, 3, 3)).astype(np.float32),
             "B": rng.normal(size=4).astype(np.float32)}
    sess = onnxhal.InferenceSession(m.SerializeToString())
    assert "FusedConv" in {n.op_type for n in sess.assigned_nodes()}
    sess.run(None, feeds)
    feeds["W"] *= -2.0  # in place: the same arrays come back
    feeds["B"] += 3.0
    np.testing.assert_allclose(sess.run(None, feeds)[0], ort_run(m, feeds)[0], atol=1e-5)


def test_nodes_a_rewrite_makes_get_names_of_their_own():
    """Two Relus moved across one MaxPool in turn gave two nodes named ``n_MaxPool_33_relu``
    (random graph 24, tiny); 1 of 800 graphs had such a pair. The model's own duplicate names
    stay as they are."""
    from tests.random_graphs import build

    model, _, _ = build(24, tiny=True)
    graph = optimize(load_model(model).graph, Level.ORT_ENABLE_ALL, disabled=NO_CHAINS)
    names = [n.name for n in graph.nodes]
    assert len(names) == len(set(names))
    assert sum(name.startswith("n_MaxPool_33_relu") for name in names) == 2

    nodes = [helper.make_node("Abs", ["x"], ["a"], name="same"), helper.make_node("Neg", ["a"], ["y"], name="same")]
    model = helper.make_model(helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                                                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]),
                              opset_imports=[helper.make_opsetid("", 17)])
    assert [n.name for n in optimized(model, Level.ORT_ENABLE_ALL, NO_CHAINS).nodes] == ["same", "same"]


@pytest.mark.parametrize("opset", [15, 19])
def test_castlike_is_written_as_cast_in_the_optimized_model_as_onnxruntime(tmp_path, opset):
    """onnxruntime inlines CastLike into a Cast to the target's type (``saturate`` from opset 19)
    and drops the target when nothing else reads it; the optimized model it writes holds that."""
    g = helper.make_graph(
        [helper.make_node("CastLike", ["x", "t"], ["c"], name="like_t"),
         helper.make_node("CastLike", ["x", "y"], ["d"], name="like_y"),
         helper.make_node("Add", ["c", "one"], ["z"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]), helper.make_tensor_value_info("y", TensorProto.INT32, [2])],
        [helper.make_tensor_value_info("z", TensorProto.DOUBLE, [2]), helper.make_tensor_value_info("d", TensorProto.INT32, [2])],
        [numpy_helper.from_array(np.zeros(1, np.float64), "t"), numpy_helper.from_array(np.ones(1, np.float64), "one")])
    data = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10).SerializeToString()
    feeds = {"x": np.array([1.5, -2.7], np.float32), "y": np.zeros(2, np.int32)}
    written = {}
    for lib in (ort, onnxhal):
        so = lib.SessionOptions()
        so.graph_optimization_level = lib.GraphOptimizationLevel.ORT_ENABLE_BASIC
        so.optimized_model_filepath = str(tmp_path / f"{lib.__name__}.onnx")
        outputs = lib.InferenceSession(data, so, providers=["CPUExecutionProvider"]).run(None, feeds)
        model = onnx.load(so.optimized_model_filepath)
        nodes = sorted((n.op_type, tuple(n.input), tuple(sorted((a.name, helper.get_attribute_value(a))
                                                                for a in n.attribute))) for n in model.graph.node)
        written[lib.__name__] = nodes, sorted(i.name for i in model.graph.initializer), outputs
    (ours, our_inits, our_out), (theirs, their_inits, their_out) = written["onnxhal"], written["onnxruntime"]
    assert ours == theirs
    assert {n[0] for n in ours} == {"Cast", "Add"}
    assert our_inits == their_inits == ["one"]
    for a, b in zip(our_out, their_out):
        np.testing.assert_array_equal(a, b)


def _conv_gated(gate: str, seed: int = 0, residual: bool = False, depthwise: bool = False):
    """Conv (+ a residual Add) then x * gate(x): ``gate`` "sigmoid" (SiLU as YOLOv8 exports it),
    "hardsigmoid" (paddle's hard-swish before opset 14, alpha 1/6), "hardswish" (one node, opset
    14), "sigmoid of another" (a Mul of the Conv by another value's Sigmoid: no activation) or
    "gate read twice" (the Sigmoid's output also a graph output)."""
    rng = np.random.default_rng(seed)
    c, m = (4, 4) if depthwise else (3, 5)
    attrs = {"group": 4} if depthwise else {}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2], **attrs)]
    src = "c"
    if residual:
        nodes.append(helper.make_node("Add", ["c", "r"], ["s"]))
        src = "s"
    outputs = [fvi("y", None)]
    if gate == "hardswish":
        nodes.append(helper.make_node("HardSwish", [src], ["y"]))
    elif gate == "hardsigmoid":
        nodes += [helper.make_node("HardSigmoid", [src], ["g"], alpha=1 / 6, beta=0.5),
                  helper.make_node("Mul", ["g", src], ["y"])]
    elif gate == "sigmoid of another":
        nodes += [helper.make_node("Sigmoid", ["r"], ["g"]), helper.make_node("Mul", [src, "g"], ["y"])]
    else:
        nodes += [helper.make_node("Sigmoid", [src], ["g"]), helper.make_node("Mul", [src, "g"], ["y"])]
        if gate == "gate read twice":
            outputs.append(fvi("g", None))
    inits = [("w", rng.standard_normal((m, 1 if depthwise else c, 3, 3)).astype(np.float32)),
             ("b", rng.standard_normal(m).astype(np.float32))]
    model = model_of(nodes, [fvi("x", [2, c, 9, 9]), fvi("r", [2, m, 5, 5])], outputs, inits)
    # random values, and values past where sigmoid saturates in float32 (|x| 20 to 1e4), exact zeros
    x = rng.standard_normal((2, c, 9, 9)).astype(np.float32)
    x[1] *= rng.choice(np.float32([0, 20, 1e3, 1e4]), size=(c, 9, 9))
    feeds = {"x": x, "r": rng.standard_normal((2, m, 5, 5)).astype(np.float32)}
    return model, feeds


@pytest.mark.parametrize("gate, act", [("sigmoid", "Swish"), ("hardsigmoid", "HardSwish"), ("hardswish", "HardSwish")])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("depthwise", [False, True])
def test_conv_with_a_gated_activation_fuses_into_one_conv(gate, act, residual, depthwise):
    model, feeds = _conv_gated(gate, residual=residual, depthwise=depthwise)
    graph = optimized(model, Level.ORT_ENABLE_ALL)
    assert [n.op_type for n in graph.nodes] == ["FusedConv"]
    assert graph.nodes[0].attr("activation") == act
    assert len(graph.nodes[0].inputs) == (4 if residual else 3)
    assert_session_matches_ort(model, feeds)


@pytest.mark.parametrize("gate", ["sigmoid of another", "gate read twice"])
def test_conv_with_a_gate_of_another_value_keeps_its_mul(gate):
    model, feeds = _conv_gated(gate)
    graph = optimized(model, Level.ORT_ENABLE_ALL, NO_CHAINS)
    assert ops(graph)["Mul"] == 1 and ops(graph)["Sigmoid"] == 1
    assert all(n.attr("activation", "") == "" for n in graph.nodes if n.op_type == "FusedConv")
    assert_session_matches_ort(model, feeds)


def test_gated_activation_fusion_is_left_out_for_other_eps():
    """The OpenCL EP's FusedConv has no Swish or HardSwish epilogue: with another EP in the session
    the Sigmoid and Mul stay for it to claim."""
    model, _ = _conv_gated("sigmoid")
    graph = optimize(load_model(model).graph, Level.ORT_ENABLE_ALL, cpu_ep_only=False)
    assert ops(graph)["Sigmoid"] == 1 and ops(graph)["Mul"] == 1


@pytest.mark.parametrize("name, params", [("Swish", [1.0]), ("Swish", [1.702]), ("HardSwish", [1 / 6, 0.5]),
                                          ("HardSwish", [0.2, 0.5])])
def test_gated_epilogues_equal_the_plain_kernels(name, params):
    """The fused epilogue against the CPU EP's own Sigmoid / HardSigmoid and Mul kernels, on random
    values, saturating ones, zeros, signed infinities and NaN, contiguous and strided."""
    from onnxhal.hal import Node
    from onnxhal.runtime.providers.cpu.kernels.activation import HardSigmoid, Sigmoid

    rng = np.random.default_rng(3)
    x = np.concatenate([rng.standard_normal(1000) * 8, np.float32([0, -0.0, 1e-40, 30, -30, 90, -90, 1e30, -1e30,
                                                                     np.inf, -np.inf, np.nan])]).astype(np.float32)
    alpha = params[0]
    if name == "Swish":
        want = x * Sigmoid(Node("Sigmoid", ["x"], ["y"]), None).compute([x * np.float32(alpha)])[0]
    else:
        node = Node("HardSigmoid", ["x"], ["y"], attribute_protos=[helper.make_attribute("alpha", params[0]),
                                                                    helper.make_attribute("beta", params[1])])
        want = x * HardSigmoid(node, None).compute([x])[0]
    act = fused_kernels._activation(name, params, Node("FusedConv", [], []))
    got = x.copy()
    act(got)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-30)
    strided = np.repeat(x, 2).reshape(-1, 2)
    act(strided[:, 0])
    np.testing.assert_allclose(strided[:, 0], want, rtol=2e-6, atol=1e-30)
    np.testing.assert_array_equal(strided[:, 1], x)


def test_replace_nodes_keeps_the_order_of_the_nodes_around_scattered_old_ones():
    """Old nodes apart from each other (and one named twice): the new ones stand where the last
    old one stood, every other node keeps its place."""
    from onnxhal.hal.graph import Graph, Node
    from onnxhal.runtime.optimizer.rewrite import replace_nodes

    nodes = [Node("Relu", [f"v{i}"], [f"v{i + 1}"], name=f"n{i}") for i in range(7)]
    graph = Graph("g", nodes, inputs=[], outputs=[])
    new = [Node("Tanh", ["v1"], ["t"], name="new0"), Node("Tanh", ["t"], ["v5"], name="new1")]
    replace_nodes(graph, [nodes[4], nodes[1], nodes[4]], new)
    assert [n.name for n in graph.nodes] == ["n0", "n2", "n3", "new0", "new1", "n5", "n6"]
    assert graph.producer("v5") is new[1] and graph.producer("v2") is None


def _count_inference(monkeypatch) -> list:
    calls = []
    real = onnx.shape_inference.infer_shapes

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", counting)
    return calls


def test_shapes_are_not_inferred_again_when_folding_showed_inference_nothing_new(monkeypatch):
    """A loaded graph whose folding only turns Constant nodes into initializers and bypasses an
    Identity of a float weight: the loader's inference already saw all of it, and the optimizer
    runs none of its own (it ran one to three, the largest part of its time on most models)."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(
                 rng.standard_normal((4, 3, 3, 3)).astype(np.float32))),
             helper.make_node("Identity", ["w"], ["wi"]),
             helper.make_node("Conv", ["x", "wi"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    model = model_of(nodes, [fvi("x", ["batch", 3, 8, 8])], [fvi("y", None)])
    graph = load_model(model).graph
    calls = _count_inference(monkeypatch)
    optimize(graph, Level.ORT_ENABLE_ALL)
    assert ops(graph)["Constant"] == 0 and ops(graph)["Identity"] == 0  # folded and bypassed
    assert calls == []
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    assert_session_matches_ort(model, {"x": x})


@pytest.mark.parametrize("hidden", ["Identity", "Where"])
def test_a_shape_hidden_from_inference_at_load_is_found_after_folding(hidden):
    """Reshape's target shape behind an Identity (which onnx's data propagation does not read
    through) or a Where of constants (folded): inference at load leaves the output's dims unknown,
    and the optimizer's inference after the bypass or the fold makes them static."""
    target = np.array([2, 12], dtype=np.int64)
    if hidden == "Identity":
        nodes = [helper.make_node("Identity", ["shape"], ["t"])]
        inits = [("shape", target)]
    else:
        nodes = [helper.make_node("Where", ["cond", "shape", "other"], ["t"])]
        inits = [("cond", np.array([True, True])), ("shape", target), ("other", np.array([1, 1], dtype=np.int64))]
    nodes.append(helper.make_node("Reshape", ["x", "t"], ["r"]))
    nodes.append(helper.make_node("Relu", ["r"], ["y"]))
    model = model_of(nodes, [fvi("x", [2, 3, 4])], [fvi("y", None)], inits)
    graph = load_model(model).graph
    assert not graph.value_info("r").has_static_shape
    optimize(graph, Level.ORT_ENABLE_BASIC)
    assert tuple(graph.value_info("r").shape) == (2, 12)


def _where_shape_chain() -> onnx.ModelProto:
    """y = Reshape(z, Where(True, [2, 2], [4, 1])) beside x of a free batch dim: onnx's data
    propagation does not follow Where; folding makes it a constant, for inference to read again."""
    nodes = [helper.make_node("Where", ["cond", "s1", "s2"], ["shape"]),
             helper.make_node("Reshape", ["z", "shape"], ["y"]),
             helper.make_node("Relu", ["x"], ["r"])]
    inits = [numpy_helper.from_array(np.array([True, True]), "cond"),
             numpy_helper.from_array(np.array([2, 2], np.int64), "s1"),
             numpy_helper.from_array(np.array([4, 1], np.int64), "s2")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
                                           helper.make_tensor_value_info("z", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("r", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


@pytest.mark.parametrize("fixed", [False, True])
def test_shapes_inferred_again_after_folding_only_where_the_inputs_dims_are_known(monkeypatch, fixed):
    # The optimizer's second shape inference (refresh_shapes) serves graphs whose dims were fixed;
    # with a free input dim it found nothing on the corpus and cost more than the other passes.
    calls = []
    real = onnx.shape_inference.infer_shapes
    loaded = load_model(_where_shape_chain().SerializeToString(), ({"batch": 3}, {}) if fixed else None)
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", lambda *a, **k: calls.append(1) or real(*a, **k))
    graph = optimize(loaded.graph, Level.ORT_ENABLE_ALL)
    assert len(calls) == (1 if fixed else 0)
    assert [n.op_type for n in graph.nodes] == ["Reshape", "Relu"]  # the Where folded either way


def test_shapes_are_not_inferred_again_where_propagation_reads_a_long_value(monkeypatch):
    # onnx's data propagation is linear in a 1-D value's length (a fuzzed 2**31-element input held
    # the GIL for ever): as the loader's inference, refresh_shapes leaves such a graph as it is.
    from onnxhal.runtime.loader.guarded_inference import DATA_PROP_MAX_LENGTH
    from onnxhal.runtime.optimizer.cleanup import refresh_shapes
    n = DATA_PROP_MAX_LENGTH + 1
    nodes = [helper.make_node("Add", ["x", "x"], ["a"]), helper.make_node("Gather", ["a", "i"], ["g"]),
             helper.make_node("Reshape", ["z", "g"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.INT64, [n]),
                                           helper.make_tensor_value_info("z", TensorProto.FLOAT, [6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.array([0, 1], np.int64), "i")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    loaded = load_model(model.SerializeToString())
    calls = []
    real = onnx.shape_inference.infer_shapes
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert not refresh_shapes(loaded.graph)
    assert calls == []


@pytest.mark.parametrize("value", [
    3, -(2 ** 63), 0.25, float("inf"), "relu", "ünïcode", [1, 2, 3], (4, 5), [1.5, 2.0], [1, 2.5], (0.5,),
    True, np.int64(7), np.float32(0.5), [np.int64(1), 2], ["a", "b"], [b"x"], b"bytes",
    numpy_helper.from_array(np.zeros(2, np.float32), "t"),
])
def test_the_optimizers_attributes_are_those_onnx_makes(value):
    from onnxhal.runtime.optimizer.rewrite import make_attribute
    assert make_attribute("a", value).SerializeToString() == helper.make_attribute("a", value).SerializeToString()


@pytest.mark.parametrize("value", [2 ** 63, [1, 2 ** 64], [True, False], object()])
def test_an_attribute_onnx_refuses_is_refused(value):
    from onnxhal.runtime.optimizer.rewrite import make_attribute
    with pytest.raises((ValueError, TypeError)) as theirs:
        helper.make_attribute("a", value)
    with pytest.raises(theirs.type):
        make_attribute("a", value)


def _folding_model(node: onnx.NodeProto, inits: list, out_shape: list) -> onnx.ModelProto:
    # x + folded value: the folded node's output is not a graph output, so folding may replace it
    add = helper.make_node("Add", ["x", "c"], ["y"])
    return make([node, add], [vi("x", out_shape)], [vi("y", out_shape)], inits)


@pytest.mark.parametrize("node, inits, out_shape, folded", [
    # within the limit, and past it: Reshape and Concat keep their inputs' sizes, Cast widens them
    (helper.make_node("Reshape", ["w", "s"], ["c"]), [np.ones(200, np.float32), np.array([20, 10])], [20, 10], False),
    (helper.make_node("Reshape", ["w", "s"], ["c"]), [np.ones(20, np.float32), np.array([4, 5])], [4, 5], True),
    (helper.make_node("Concat", ["w", "s"], ["c"], axis=0), [np.ones(100, np.int64), np.ones(100, np.int64)],
     [200], False),
    (helper.make_node("Cast", ["w"], ["c"], to=TensorProto.INT64), [np.ones(200, bool)], [200], False),
    (helper.make_node("Cast", ["w"], ["c"], to=TensorProto.INT64), [np.ones(50, bool)], [50], True),
])
def test_folding_keeps_values_past_its_size_limit_computed(node, inits, out_shape, folded, monkeypatch):
    from onnxhal.runtime.optimizer import cleanup
    monkeypatch.setattr(cleanup, "MAX_FOLDED_BYTES", 600)
    names = [i for i in node.input]
    inits = [numpy_helper.from_array(v, n) for v, n in zip(inits, names)]
    elem = TensorProto.INT64 if node.op_type != "Reshape" else TensorProto.FLOAT
    model = _folding_model(node, inits, out_shape)
    model.graph.input[0].type.tensor_type.elem_type = elem
    model.graph.output[0].type.tensor_type.elem_type = elem
    graph = optimize(load_model(model).graph, Level.ORT_ENABLE_BASIC)
    assert ("c" in graph.initializers) == folded
    assert any(n.op_type == node.op_type for n in graph.nodes) != folded


@pytest.mark.parametrize("node, inits", [
    (helper.make_node("Expand", ["w", "s"], ["c"]), [np.ones(1, np.float32), np.array([40, 10])]),
    (helper.make_node("Tile", ["w", "s"], ["c"]), [np.ones(4, np.float32), np.array([100])]),
    (helper.make_node("ConstantOfShape", ["s"], ["c"], value=numpy_helper.from_array(np.ones(1, np.float32))),
     [np.array([400])]),
])
def test_folding_does_not_compute_values_their_types_say_are_past_its_size_limit(node, inits, monkeypatch):
    from onnxhal.runtime.optimizer import cleanup
    monkeypatch.setattr(cleanup, "MAX_FOLDED_BYTES", 600)
    evaluated = []
    monkeypatch.setattr(cleanup, "evaluate_node", lambda g, n, i: evaluated.append(n.op_type) or [])
    inits = [numpy_helper.from_array(v, n) for v, n in zip(inits, [i for i in node.input])]
    shape = [40, 10] if node.op_type == "Expand" else [400]
    graph = optimize(load_model(_folding_model(node, inits, shape)).graph, Level.ORT_ENABLE_BASIC)
    assert node.op_type not in evaluated and "c" not in graph.initializers
