"""The optimizer driver's skips of confirming calls (``passes.SELF_SETTLING``,
``passes.SKIP_SELF_CONFIRMATION``): they change which passes are called, never the graph."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxhal.hal import GraphOptimizationLevel
from onnxhal.hal.graph import Graph
from onnxhal.runtime.loader.model_loader import load_model
from onnxhal.runtime.optimizer import passes
from onnxhal.runtime.optimizer.cleanup import remove_dead_nodes

CORPUS = os.path.join(os.path.dirname(__file__), "real_models")
MODELS = ["tv_shufflenet", "hf_distilbert", "mobilenet_dynamo", "vad_if_loop_ts", "resnet_ts_qdq_pt", "skh_adaboost"]


def _signature(graph: Graph) -> tuple:
    nodes = [(n.op_type, n.domain, n.name, n.inputs, n.outputs,
              sorted((k, repr(v)) for k, v in n.attributes.items() if k not in n.subgraphs),
              [_signature(s) for s in n.subgraph_list()]) for n in graph.nodes]
    inits = sorted((k, v.dtype.str, v.shape, v.tobytes() if v.dtype != object else repr(v))
                   for k, v in graph.initializers.items())
    return nodes, inits


def _optimized(name: str, **kwargs) -> Graph:
    graph = load_model(os.path.join(CORPUS, f"{name}.onnx")).graph
    return passes.optimize(graph, GraphOptimizationLevel.ORT_ENABLE_ALL, **kwargs)


def _recorded(name: str, monkeypatch, skip: bool) -> list[tuple[str, bool]]:
    calls: list[tuple[str, bool]] = []

    def counted(pass_name, fn):
        return lambda graph: calls.append((pass_name, bool(fn(graph)))) or calls[-1][1]

    monkeypatch.setattr(passes, "SKIP_SELF_CONFIRMATION", skip)
    monkeypatch.setattr(passes, "PASSES", [(n, lv, counted(n, fn), r, c) for n, lv, fn, r, c in REAL_PASSES])
    _optimized(name)
    return calls


REAL_PASSES = list(passes.PASSES)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("cpu_ops", [True, False])
def test_skipping_confirmations_keeps_the_optimized_graph(name, cpu_ops, monkeypatch):
    kwargs = {"fuse_cpu_ops": cpu_ops, "cpu_ep_only": cpu_ops}
    skipped = _optimized(name, **kwargs)
    monkeypatch.setattr(passes, "SKIP_SELF_CONFIRMATION", False)
    assert _signature(skipped) == _signature(_optimized(name, **kwargs))


@pytest.mark.parametrize("name", ["tv_shufflenet", "hf_distilbert"])
def test_the_same_changes_come_with_fewer_calls(name, monkeypatch):
    skipping, every = _recorded(name, monkeypatch, True), _recorded(name, monkeypatch, False)
    assert [c for c in skipping if c[1]] == [c for c in every if c[1]]
    assert len(skipping) < len(every)
    # a self-settling pass is not called again before another pass (one that counts) changed the graph
    settled: set[str] = set()
    for pass_name, changed in skipping:
        assert pass_name not in settled, f"{pass_name} called to confirm its own change"
        if changed and pass_name != "remove_dead_nodes":
            settled.clear()
        if changed and pass_name in passes.SELF_SETTLING:
            settled.add(pass_name)


@pytest.mark.parametrize("name", MODELS)
def test_self_settling_passes_find_nothing_right_after_their_change(name):
    """What ``SELF_SETTLING`` claims, checked on the models: each pass, run until it changes the
    graph, changes nothing when called again at once."""
    graph = load_model(os.path.join(CORPUS, f"{name}.onnx")).graph
    fns = {n: fn for n, _lv, fn, _r, _c in passes.PASSES}
    for _ in range(2):
        for pass_name in sorted(passes.SELF_SETTLING):
            if fns[pass_name](graph):
                assert not fns[pass_name](graph), f"{pass_name} left work for a second call on {name}"


def test_dropping_unread_constants_is_no_change_for_the_other_passes(monkeypatch, tmp_path):
    """A Conv whose bias is folded forward (``fold_conv_bias_forward``) leaves its old bias unread:
    the dead-node pass then drops that constant alone, and no further round follows for it."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((5, 4, 1, 1)).astype(np.float32), "w2")
    b2 = numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "b2")
    nodes = [helper.make_node("Identity", ["x"], ["xi"]),
             helper.make_node("Conv", ["xi", "w1", "b1"], ["c1"]),
             helper.make_node("Conv", ["c1", "w2", "b2"], ["y"])]
    model = helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5, 6, 6])], [w1, b1, w2, b2]),
        opset_imports=[helper.make_opsetid("", 17)])
    path = str(tmp_path / "conv_bias.onnx")
    onnx.save(model, path)
    calls: list[tuple[str, bool, int]] = []

    def counted(pass_name, fn):
        def run(graph):
            changed = bool(fn(graph))
            calls.append((pass_name, changed, len(graph.nodes)))
            return changed
        return run

    monkeypatch.setattr(passes, "PASSES", [(n, lv, counted(n, fn), r, c) for n, lv, fn, r, c in REAL_PASSES])
    graph = load_model(path).graph
    passes.optimize(graph, GraphOptimizationLevel.ORT_ENABLE_BASIC)
    assert ("fold_conv_bias_forward", True, 2) in calls
    after = calls[calls.index(("fold_conv_bias_forward", True, 2)) + 1:]
    assert [c for c in after if c[0] == "fold_constants"] == [("fold_constants", False, 2)]  # one round after the fold
    dropped = [c for c in after if c[0] == "remove_dead_nodes"]
    assert dropped == [("remove_dead_nodes", True, 2)]  # the old bias, alone: no round confirms it
    assert "b1" not in graph.initializers
    assert not remove_dead_nodes(graph)
