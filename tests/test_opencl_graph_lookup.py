"""``GraphLookup.const`` (runtime/providers/opencl/op_support.py) remembers where each value comes from
(a constant initializer, outside the graph, or neither) once per lookup: the claim asks it for each
input of each node many times over. Its answers are checked against the plain look-up on the graph,
including values whose array the EP's shared ``constants`` gains later."""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import TensorProto, helper

from onnxhal import hal
from onnxhal.runtime.providers.opencl.op_support import GraphLookup

CORPUS = os.path.join(os.path.dirname(__file__), "real_models")


def _plain_const(graph: hal.Graph, constants: dict, name: str) -> np.ndarray | None:
    """The look-up without the memo: the graph asked at every call."""
    if name and graph.is_constant_initializer(name):
        return np.asarray(graph.initializer(name))
    if name and graph.producer(name) is None and name not in graph.input_names:
        return constants.get(name)
    return None


def _graph(w: float) -> hal.Graph:
    # y = x + w; z = y * outer, where ``outer`` has no producer and is no input (a value of the
    # enclosing graph, as a partition's graph may read one its owner holds as a constant)
    f = TensorProto.FLOAT
    g = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"], name="add"),
         helper.make_node("Mul", ["y", "outer"], ["z"], name="mul")],
        "g", [helper.make_tensor_value_info("x", f, [2])], [helper.make_tensor_value_info("z", f, [2])],
        [helper.make_tensor("w", f, [2], [w, w])])
    return hal.Graph.from_proto(g, {"": 17})


def test_const_agrees_with_the_plain_look_up_on_a_corpus_graph():
    model = onnx.load(os.path.join(CORPUS, "gpt2_ts.onnx"))
    graph = hal.Graph.from_proto(model.graph, {"": 17})
    lookup = GraphLookup(graph, {}, {}, {}, allow_dynamic=True)
    names = {*graph.input_names, *graph.initializers, *(v for n in graph.nodes for v in (*n.inputs, *n.outputs))}
    assert any(graph.is_constant_initializer(n) for n in names) and graph.input_names
    for _ in range(2):  # the second pass answers from the memo
        for name in sorted(names):
            got, want = lookup.const(name), _plain_const(graph, lookup.constants, name)
            assert (got is None) == (want is None), name
            if got is not None:
                np.testing.assert_array_equal(got, want)
                assert lookup.constants[name] is got


def test_an_outside_value_is_read_from_constants_at_each_call():
    graph = _graph(1.0)
    lookup = GraphLookup(graph, {}, {}, {})
    assert lookup.const("outer") is None and lookup.const("x") is None and lookup.const("y") is None
    arr = np.full(2, 3.0, np.float32)
    lookup.constants["outer"] = arr  # the EP remembers it later (a graph it saw before)
    assert lookup.const("outer") is arr
    assert lookup.const("x") is None  # a graph input never is a constant, whatever ``constants`` holds
    assert lookup.const("") is None


def test_the_latest_lookup_to_read_a_name_leaves_its_array_in_shared_constants():
    shared: dict[str, np.ndarray] = {}
    one, two = GraphLookup(_graph(1.0), {}, {}, shared), GraphLookup(_graph(2.0), {}, {}, shared)
    for lookup, value in ((one, 1.0), (two, 2.0), (one, 1.0)):
        np.testing.assert_array_equal(lookup.const("w"), [value, value])
        np.testing.assert_array_equal(shared["w"], [value, value])
