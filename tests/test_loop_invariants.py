"""hoist_loop_invariants: invariant nodes leave Loop and Scan bodies, outer-scope constants fold into
subgraphs, and results stay those of the un-hoisted graph (to the bit) and onnxruntime's.

Each model runs three ways: onnxhal as optimized, onnxhal optimized without this pass (the same
kernels on the same values, so the bits must agree), and onnxruntime on the original model.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxhal
from onnxhal.hal import GraphOptimizationLevel as Level
from onnxhal.hal import errors
from onnxhal.runtime.loader.model_loader import load_model
from onnxhal.runtime.optimizer import passes
from onnxhal.runtime.optimizer.passes import optimize
from tests.models import make, vi

RNG = np.random.default_rng(44)
W = RNG.standard_normal((8, 8)).astype(np.float32)
B = RNG.standard_normal(8).astype(np.float32)


def _ort(model: onnx.ModelProto, feeds: dict) -> list:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _hal(model: onnx.ModelProto, feeds: dict, level: Level = Level.ORT_ENABLE_ALL) -> list:
    so = onnxhal.SessionOptions()
    so.graph_optimization_level = level
    return onnxhal.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _without_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(passes, "PASSES", [p for p in passes.PASSES if p[0] != "hoist_loop_invariants"])


def _check_runs(model: onnx.ModelProto, feeds_list: list[dict], monkeypatch: pytest.MonkeyPatch) -> None:
    """onnxhal with the pass == onnxhal without it (bit for bit) ~= onnxruntime, on each feed."""
    hoisted = [_hal(model, f) for f in feeds_list]
    with monkeypatch.context() as m:
        _without_pass(m)
        plain = [_hal(model, f) for f in feeds_list]
    for feeds, got, want in zip(feeds_list, hoisted, plain):
        ref = _ort(model, feeds)
        for g, w, r in zip(got, want, ref):
            np.testing.assert_array_equal(g, w)
            np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)


def _body_ops(graph, op_type: str = "Loop") -> list[str]:
    loop = next(n for n in graph.nodes if n.op_type == op_type)
    return [n.op_type for n in loop.attr("body").nodes]


def _chain_body(extra_nodes=(), x_read: str = "X") -> onnx.GraphProto:
    """h -> tanh(X @ W + b) * 0.5 + h * i (the product and its bias are invariant; the rest reads
    the iteration number or h), plus a scan output of h."""
    nodes = [
        helper.make_node("MatMul", [x_read, "W"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["xwb"]),
        helper.make_node("Tanh", ["xwb"], ["t"]),
        helper.make_node("Mul", ["t", "half"], ["th"]),
        helper.make_node("Cast", ["i"], ["fi"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["h", "fi"], ["hi"]),
        helper.make_node("Add", ["th", "hi"], ["h2"]),
        helper.make_node("Identity", ["c"], ["c2"]),
        helper.make_node("Identity", ["h2"], ["s"]),
        *extra_nodes,
    ]
    inits = [numpy_helper.from_array(W, "W"), numpy_helper.from_array(B, "b"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    return helper.make_graph(nodes, "body", [vi("i", [], TensorProto.INT64), vi("c", [], TensorProto.BOOL),
                                             vi("h", ["n", 8])],
                             [vi("c2", [], TensorProto.BOOL), vi("h2", ["n", 8]), vi("s", ["n", 8])], inits)


def _loop_model(body: onnx.GraphProto, x_shape=("n", 8), trips: int | None = None) -> onnx.ModelProto:
    inits = [] if trips is None else [numpy_helper.from_array(np.array(trips, np.int64), "M")]
    inputs = [vi("X", list(x_shape)), vi("h0", ["n", 8])] + ([] if trips is not None else [vi("M", [], TensorProto.INT64)])
    loop = helper.make_node("Loop", ["M", "", "h0"], ["h", "hs"], name="loop", body=body)
    return make([loop], inputs, [vi("h", ["n", 8]), vi("hs", [None, "n", 8])], inits)


def _feeds(trips: int | None, rows: int = 3, cols: int = 8) -> dict:
    feeds = {"X": RNG.standard_normal((rows, cols)).astype(np.float32),
             "h0": RNG.standard_normal((rows, 8)).astype(np.float32)}
    if trips is not None:
        feeds["M"] = np.array(trips, np.int64)
    return feeds


def test_invariant_chain_leaves_the_loop_and_keeps_the_bits(monkeypatch):
    model = _loop_model(_chain_body())
    graph = optimize(load_model(model).graph, Level.ORT_ENABLE_BASIC)
    body = _body_ops(graph)
    # X @ W (+ b) and its Tanh and scaling run once; what reads i or h stays.
    assert not {"MatMul", "Gemm", "Tanh"} & set(body), body
    assert {"Cast", "Mul", "Add"} <= set(body)
    main = [n.op_type for n in graph.nodes]
    assert "Tanh" in main and main.index("Tanh") < main.index("Loop")
    _check_runs(model, [_feeds(4), _feeds(1), _feeds(0)], monkeypatch)


def test_zero_trip_loop_keeps_nodes_that_could_raise(monkeypatch):
    """X's width is a free symbol, so X @ W may fail; with a trip count only known at run time a
    zero-trip run must not meet that failure (onnxruntime returns h0), so the MatMul stays."""
    model = _loop_model(_chain_body(), x_shape=("n", "k"))
    graph = optimize(load_model(model).graph, Level.ORT_ENABLE_BASIC)
    body = set(_body_ops(graph))
    assert "Tanh" in body and body & {"MatMul", "Gemm"}, body
    bad = _feeds(0, cols=5)  # X @ W cannot run; zero iterations never try
    _check_runs(model, [bad, _feeds(2)], monkeypatch)
    with pytest.raises(errors.OrtError, match="Loop node 'loop'"):
        _hal(model, _feeds(2, cols=5))


def test_loop_that_surely_runs_hoists_what_could_raise(monkeypatch):
    """A constant trip count >= 1 means the body's first iteration would raise whatever the hoisted
    node raises: the MatMul of unproven shapes moves out."""
    model = _loop_model(_chain_body(), x_shape=("n", "k"), trips=3)
    graph = optimize(load_model(model).graph, Level.ORT_ENABLE_BASIC)
    assert not {"MatMul", "Gemm", "Tanh"} & set(_body_ops(graph))
    feeds = _feeds(None)
    _check_runs(model, [feeds], monkeypatch)


def test_out_of_range_gather_stays_in_a_zero_trip_loop(monkeypatch):
    """Gather of row 7 from X of 3 rows is invariant but raises: kept in the body, so a zero-trip
    run returns h0 as onnxruntime's; a Gather whose constant index is in range of X's static rows
    is hoisted."""
    idx = [numpy_helper.from_array(np.array(7, np.int64), "seven"),
           numpy_helper.from_array(np.array(1, np.int64), "one")]
    body = _chain_body([helper.make_node("Gather", ["X", "seven"], ["row7"]),
                        helper.make_node("Gather", ["X", "one"], ["row1"]),
                        helper.make_node("Add", ["row7", "row1"], ["rows"])])
    body.output.append(vi("rows", [8]))
    body.initializer.extend(idx)
    model = _loop_model(body, x_shape=(3, 8))
    model.graph.output.append(vi("rows_all", [None, 8]))
    model.graph.node[0].output.append("rows_all")
    graph = optimize(load_model(model).graph, Level.ORT_ENABLE_BASIC)
    gathers = [n for n in next(n for n in graph.nodes if n.op_type == "Loop").attr("body").nodes
               if n.op_type == "Gather"]
    assert [n.inputs[1] for n in gathers] == ["seven"]
    assert [n.op_type for n in graph.nodes].count("Gather") == 1
    _check_runs(model, [_feeds(0)], monkeypatch)
    with pytest.raises(errors.OrtError, match="Loop node 'loop'"):
        _hal(model, _feeds(2))


def test_nested_loop_invariant_reaches_the_main_graph(monkeypatch):
    """The inner body's X @ W reads only the main graph's X: it leaves both loops."""
    inner = _chain_body()
    outer_nodes = [helper.make_node("Loop", ["M2", "", "g"], ["g2", "gs"], body=inner),
                   helper.make_node("Identity", ["c"], ["c2"])]
    outer = helper.make_graph(outer_nodes, "outer", [vi("j", [], TensorProto.INT64), vi("c", [], TensorProto.BOOL),
                                                     vi("g", ["n", 8])],
                              [vi("c2", [], TensorProto.BOOL), vi("g2", ["n", 8])],
                              [numpy_helper.from_array(np.array(2, np.int64), "M2")])
    model = _loop_model(outer, x_shape=("n", 8))
    del model.graph.output[1]
    del model.graph.node[0].output[1]
    graph = optimize(load_model(model).graph, Level.ORT_ENABLE_BASIC)
    main = [n.op_type for n in graph.nodes]
    assert "Tanh" in main and main.index("Tanh") < main.index("Loop")
    inner_body = next(n for n in next(n for n in graph.nodes if n.op_type == "Loop").attr("body").nodes
                      if n.op_type == "Loop").attr("body")
    assert not {"MatMul", "Gemm", "Tanh"} & {n.op_type for n in inner_body.nodes}
    _check_runs(model, [_feeds(3), _feeds(0)], monkeypatch)


def test_random_op_stays_in_the_body():
    """Each iteration draws anew: the RandomUniformLike stays even in a loop that surely runs."""
    body = _chain_body([helper.make_node("RandomUniformLike", ["X"], ["r"], seed=1.0),
                        helper.make_node("Add", ["r", "X"], ["rx"])])
    body.output.append(vi("rx", ["n", 8]))
    model = _loop_model(body, x_shape=("n", 8), trips=3)  # surely runs: only randomness keeps it in
    model.graph.output.append(vi("rxs", [None, "n", 8]))
    model.graph.node[0].output.append("rxs")
    graph = optimize(load_model(model).graph, Level.ORT_ENABLE_BASIC)
    assert "RandomUniformLike" in _body_ops(graph)
    assert "RandomUniformLike" not in [n.op_type for n in graph.nodes]
    out = _hal(model, _feeds(None))[2]
    assert out.shape == (3, 3, 8) and not np.array_equal(out[0], out[1])


def test_scan_body_invariant_hoisted(monkeypatch):
    """A Scan body's X @ W (X from the main graph) runs once; the scan itself is unchanged."""
    nodes = [helper.make_node("MatMul", ["X", "W"], ["xw"]),
             helper.make_node("Relu", ["xw"], ["r"]),
             helper.make_node("ReduceSum", ["r", "ax"], ["rs"], keepdims=0),
             helper.make_node("Mul", ["row", "rs"], ["prod"]),
             helper.make_node("Add", ["acc", "prod"], ["acc2"]),
             helper.make_node("Identity", ["acc2"], ["out"])]
    body = helper.make_graph(nodes, "body", [vi("acc", [8]), vi("row", [8])], [vi("acc2", [8]), vi("out", [8])],
                             [numpy_helper.from_array(W, "W"), numpy_helper.from_array(np.array([0], np.int64), "ax")])
    scan = helper.make_node("Scan", ["a0", "seq"], ["acc", "outs"], num_scan_inputs=1, body=body)
    model = make([scan], [vi("X", ["n", 8]), vi("a0", [8]), vi("seq", ["t", 8])],
                 [vi("acc", [8]), vi("outs", ["t", 8])])
    graph = optimize(load_model(model).graph, Level.ORT_ENABLE_BASIC)
    assert not {"MatMul", "Relu", "ReduceSum"} & set(_body_ops(graph, "Scan")), _body_ops(graph, "Scan")
    feeds = [{"X": RNG.standard_normal((t + 1, 8)).astype(np.float32), "a0": RNG.standard_normal(8).astype(np.float32),
              "seq": RNG.standard_normal((t, 8)).astype(np.float32)} for t in (5, 1)]
    _check_runs(model, feeds, monkeypatch)


def test_outer_constants_fold_into_if_branches(monkeypatch):
    """An If branch's Unsqueeze of main-graph constants is computed once, at load."""
    then = helper.make_graph([helper.make_node("Unsqueeze", ["k", "axes"], ["ku"]),
                              helper.make_node("Slice", ["x", "zero", "ku", "ku"], ["y"])], "then", [],
                             [vi("y", None)], [numpy_helper.from_array(np.array([0], np.int64), "axes"),
                                               numpy_helper.from_array(np.array([0], np.int64), "zero")])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["y2"])], "else", [], [vi("y2", None)])
    nodes = [helper.make_node("If", ["flag"], ["y"], then_branch=then, else_branch=other)]
    model = make(nodes, [vi("x", [4, 4]), vi("flag", [], TensorProto.BOOL)], [vi("y", None)],
                 [numpy_helper.from_array(np.array(1, np.int64), "k")])
    graph = optimize(load_model(model).graph, Level.ORT_ENABLE_BASIC)
    branch = next(n for n in graph.nodes if n.op_type == "If").attr("then_branch")
    assert [n.op_type for n in branch.nodes] == ["Slice"]
    x = RNG.standard_normal((4, 4)).astype(np.float32)
    _check_runs(model, [{"x": x, "flag": np.array(True)}, {"x": x, "flag": np.array(False)}], monkeypatch)


def _slice_model(starts, ends, axes, steps, x_shape=(4, 6)) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(np.array(v, np.int64), n)
             for n, v in (("st", starts), ("en", ends), ("ax", axes), ("sp", steps))]
    node = helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["s"], name="slice")
    return make([node, helper.make_node("Relu", ["s"], ["y"])], [vi("x", list(x_shape))], [vi("y", None)], inits)


@pytest.mark.parametrize(("starts", "ends", "axes", "steps", "kept"), [
    ([0], [2 ** 63 - 1], [0], [1], False),         # x[:] as TorchScript writes it
    ([-9, 0], [6, 2 ** 31 - 1], [-1, 0], [1, 1], False),  # a start before the first, an end at the last
    ([0], [5], [1], [1], True),                   # drops the last column
    ([1], [2 ** 63 - 1], [0], [1], True),          # drops the first row
    ([0], [2 ** 63 - 1], [0], [2], True),          # every other row
])
def test_a_slice_of_everything_is_removed(starts, ends, axes, steps, kept):
    model = _slice_model(starts, ends, axes, steps)
    graph = optimize(load_model(model).graph, Level.ORT_ENABLE_BASIC)
    assert ("Slice" in [n.op_type for n in graph.nodes]) == kept
    x = RNG.standard_normal((4, 6)).astype(np.float32)
    np.testing.assert_array_equal(_hal(model, {"x": x})[0], _ort(model, {"x": x})[0])


def test_a_free_dim_keeps_a_slice_with_a_small_end():
    """End 6 covers a static width of 6, but not a free one."""
    graph = optimize(load_model(_slice_model([0], [6], [1], [1], x_shape=(4, "w"))).graph, Level.ORT_ENABLE_BASIC)
    assert "Slice" in [n.op_type for n in graph.nodes]


def test_a_body_cleans_up_after_outer_constants_fold(monkeypatch):
    """The body's Slice reads its end through an Unsqueeze of a main-graph constant: once folded,
    the Slice is seen to take everything and goes, which the body's own passes (run before the
    main graph's constants were known) could not see."""
    nodes = [helper.make_node("Unsqueeze", ["big", "axes"], ["end"]),
             helper.make_node("Slice", ["h", "zero", "end", "zero"], ["hs"]),
             helper.make_node("Add", ["hs", "X"], ["h2"]),
             helper.make_node("Identity", ["c"], ["c2"]),
             helper.make_node("Identity", ["h2"], ["s"])]
    body = helper.make_graph(nodes, "body", [vi("i", [], TensorProto.INT64), vi("c", [], TensorProto.BOOL),
                                             vi("h", ["n", 8])],
                             [vi("c2", [], TensorProto.BOOL), vi("h2", ["n", 8]), vi("s", ["n", 8])],
                             [numpy_helper.from_array(np.array([0], np.int64), "zero"),
                              numpy_helper.from_array(np.array([0], np.int64), "axes")])
    model = _loop_model(body)
    model.graph.node.insert(0, helper.make_node("Constant", [], ["big"], value=numpy_helper.from_array(
        np.array(2 ** 63 - 1, np.int64))))
    graph = optimize(load_model(model).graph, Level.ORT_ENABLE_BASIC)
    assert _body_ops(graph) == ["Add", "Identity", "Identity"]
    _check_runs(model, [_feeds(3), _feeds(0)], monkeypatch)
