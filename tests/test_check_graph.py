"""The loader's graph checks (``model_loader.check_graph``): the graph's index answers for a sound
graph, and each fault is still found and named by the node-by-node loops."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from onnxhal.hal.errors import InvalidGraph
from onnxhal.runtime.loader.model_loader import check_graph, load_model
from tests.models import make, vi

W = numpy_helper.from_array(np.ones(3, np.float32), "w")


def _load(nodes, outputs=("y",), inits=(W,)):
    return load_model(make(nodes, [vi("x", [3])], [vi(o, [3]) for o in outputs], inits).SerializeToString())


@pytest.mark.parametrize("nodes, outputs, words", [
    ([helper.make_node("Relu", ["x"], ["y"], name="a"), helper.make_node("Neg", ["x"], ["y"], name="b")], ("y",),
     "value 'y' is produced by two nodes (Relu 'a' and Neg 'b')"),
    ([helper.make_node("Relu", ["x"], ["y"], name="a"), helper.make_node("Neg", ["y"], ["x"], name="b")], ("y",),
     "node Neg 'b' writes 'x', which is a graph input or initializer"),
    ([helper.make_node("Relu", ["x"], ["y"], name="a"), helper.make_node("Neg", ["y"], ["w"], name="b")], ("y",),
     "node Neg 'b' writes 'w', which is a graph input or initializer"),
    ([helper.make_node("Add", ["x", "nowhere"], ["y"], name="a")], ("y",),
     "node Add 'a' reads 'nowhere', which no node, graph input or initializer defines"),
    ([helper.make_node("Relu", ["x"], ["y"], name="a")], ("y", "z"), "output 'z' is not produced by any node"),
    ([helper.make_node("Relu", ["t"], ["y"], name="a"), helper.make_node("Neg", ["y"], ["t"], name="b")], ("y",),
     "has a cycle through 2 node(s)"),
])
def test_a_faulty_graph_is_refused_naming_the_fault(nodes, outputs, words):
    with pytest.raises(InvalidGraph) as e:
        _load(nodes, outputs)
    assert words in str(e.value)


def test_a_graph_out_of_order_is_sorted_and_its_index_kept():
    loaded = _load([helper.make_node("Neg", ["t"], ["y"], name="b"), helper.make_node("Add", ["x", "w"], ["t"], name="a")])
    assert [n.name for n in loaded.graph.nodes] == ["a", "b"]
    assert loaded.graph.producer("t").name == "a" and [n.name for n in loaded.graph.consumers("t")] == ["b"]


def test_omitted_outputs_and_outer_names_pass():
    # an omitted optional output ('') is no value written; a subgraph reads an outer-scope value
    then = helper.make_graph([helper.make_node("Neg", ["x"], ["o"])], "then", [], [vi("o", [3])])
    other = helper.make_graph([helper.make_node("Relu", ["x"], ["o2"])], "else", [], [vi("o2", [3])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
             helper.make_node("Dropout", ["y"], ["d", ""])]
    zero = numpy_helper.from_array(np.zeros((), np.float32), "zero")
    loaded = _load(nodes, ("d",), (zero,))
    check_graph(loaded.graph, outer=set())
    assert loaded.graph.producer("d").op_type == "Dropout"


@pytest.mark.parametrize("node, words", [
    (helper.make_node("EyeLike", ["x"], ["y"], name="e", dtype=999), "attribute 'dtype' is 999, which is not an ONNX"),
    (helper.make_node("LRN", ["x"], ["y"], name="l"), "required attribute 'size' of LRN-13 is missing"),
])
def test_the_checks_after_inference_read_the_graph_or_the_proto_alike(node, words):
    from onnxhal.hal import Graph
    from onnxhal.runtime.loader.node_checks import check_after_inference, flat_model_walks

    model = make([node], [vi("x", [1, 3, 2, 2])], [vi("y", None)])
    graph = Graph.from_proto(model.graph, {"": 17})
    for given in (graph, None):
        with flat_model_walks(model), pytest.raises(InvalidGraph) as e:
            check_after_inference(model, {"": 17}, checked=False, graph=given)
        assert words in str(e.value) and f"node {node.name!r}" in str(e.value)
