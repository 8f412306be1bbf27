"""Constant nodes become initializers at load (runtime/loader/constant_initializers.py), as onnxruntime's
graph makes them: every value attribute, in subgraphs too; the ones that must stay nodes stay, and
the results are onnxruntime's."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxhal
from onnxhal.errors import InvalidGraph
from onnxhal.runtime.loader.model_loader import load_model


def _constants_model() -> onnx.ModelProto:
    """x + each kind of Constant, a Loop whose body adds a Constant, and a Constant that is a graph
    output (that one stays a node)."""
    t = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "ignored")
    nodes = [
        helper.make_node("Constant", [], ["c_tensor"], value=t),
        helper.make_node("Constant", [], ["c_float"], value_float=0.5),
        helper.make_node("Constant", [], ["c_floats"], value_floats=[1.0, 2.0, 3.0]),
        helper.make_node("Constant", [], ["c_int"], value_int=2),
        helper.make_node("Constant", [], ["c_ints"], value_ints=[2, 3]),
        helper.make_node("Constant", [], ["c_strings"], value_strings=["a", "bc"]),
        helper.make_node("Constant", [], ["c_out"], value_ints=[7]),
        helper.make_node("Add", ["x", "c_tensor"], ["a1"]),
        helper.make_node("Mul", ["a1", "c_float"], ["a2"]),
        helper.make_node("Add", ["a2", "c_floats"], ["a3"]),
        helper.make_node("Reshape", ["a3", "c_ints"], ["a4"]),
        helper.make_node("Cast", ["c_int"], ["trips"], to=TensorProto.INT64),
        helper.make_node("Constant", [], ["cond"], value=numpy_helper.from_array(np.array(True))),
        helper.make_node("Loop", ["trips", "cond", "a4"], ["y"], body=_loop_body()),
        helper.make_node("Identity", ["c_strings"], ["s"]),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("s", TensorProto.STRING, None),
                               helper.make_tensor_value_info("c_out", TensorProto.INT64, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def _loop_body() -> onnx.GraphProto:
    nodes = [helper.make_node("Constant", [], ["one"], value_float=1.0),
             helper.make_node("Add", ["acc_in", "one"], ["acc_out"]),
             helper.make_node("Identity", ["cond_in"], ["cond_out"])]
    return helper.make_graph(nodes, "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                                             helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                                             helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, None)],
                             [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, None)])


def test_constant_nodes_are_initializers_after_load_and_results_match_onnxruntime():
    model = _constants_model()
    graph = load_model(model.SerializeToString()).graph
    constants = [n.outputs[0] for n in graph.nodes if n.op_type == "Constant"]
    assert constants == ["c_out"]  # a graph output is produced by a node: it stays one
    for name in ("c_tensor", "c_float", "c_floats", "c_int", "c_ints", "c_strings", "cond"):
        assert name in graph.initializers, name
    loop = next(n for n in graph.nodes if n.op_type == "Loop")
    body = loop.subgraph_list()[0]
    assert "one" in body.initializers and not [n for n in body.nodes if n.op_type == "Constant"]
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
    assert got[1].tolist() == want[1].tolist() and got[2].tolist() == want[2].tolist()


def test_the_callers_model_proto_is_not_changed():
    model = _constants_model()
    before = model.SerializeToString()
    onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"])
    assert model.SerializeToString() == before


@pytest.mark.parametrize("case,match", [("two_values", "One and only one of the attributes"),
                                        ("value_float_at_opset_11", "'value_float' is not an attribute of Constant"),
                                        ("name_taken", "'c' is produced by two nodes"),
                                        ("stray_field", "declared FLOAT but holds a value in field")])
def test_constants_that_cannot_be_initializers_stay_nodes_for_the_checks(case, match):
    """A Constant with two values, a value_* attribute its opset lacks, an output another node
    writes or a value attribute holding a second field is left a node, and the node and graph
    checks, which run after the conversion, name it as before."""
    attrs = {"value_float": 1.0}
    opset = 17
    extra = []
    if case == "two_values":
        attrs = {"value_float": 1.0, "value_int": 1}
    elif case == "value_float_at_opset_11":
        opset = 11
    elif case == "name_taken":
        extra = [helper.make_node("Identity", ["x"], ["c"])]
    nodes = [helper.make_node("Constant", [], ["c"], **attrs), *extra, helper.make_node("Add", ["x", "c"], ["y"])]
    if case == "stray_field":
        nodes[0].attribute[0].i = 3
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7
    with pytest.raises(InvalidGraph, match=match):
        onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_only_a_value_attribute_holding_its_value_alone_is_converted():
    """A value attribute with a doc string is converted; one that also sets another value field, or
    whose own field is empty, stays a node (for the node checks, which refuse it)."""
    from onnxhal.runtime.loader import constant_initializers as ci

    def node(**fields) -> onnx.NodeProto:
        attr = onnx.AttributeProto(name="value_ints", type=onnx.AttributeProto.INTS, **fields)
        n = helper.make_node("Constant", [], ["c"])
        n.attribute.append(attr)
        return n

    def convertible(n: onnx.NodeProto, opset: int) -> bool:
        return ci._value(n, opset) is not None

    assert convertible(node(ints=[1, 2], doc_string="why"), 17)
    assert not convertible(node(ints=[1, 2], floats=[1.0]), 17)
    assert not convertible(node(ints=[1, 2], ref_attr_name="outer"), 17)
    assert not convertible(node(ints=[1, 2], tp=onnx.TypeProto()), 17)  # between doc_string and type
    assert not convertible(node(ints=[1, 2], doc_string="why", tp=onnx.TypeProto()), 17)
    assert not convertible(node(), 17)  # no value at all
    assert not convertible(node(ints=[1]), 11)  # value_ints is from opset 12
    tensor = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.ones(2, np.float32)))
    assert convertible(tensor, 17)
    tensor.attribute[0].i = 3
    assert not convertible(tensor, 17)
