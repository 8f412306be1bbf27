"""The bridge's graph view given the loader's types after ai.onnx.ml operators (ml_value_types.py),
in process: what onnxruntime leaves without a rank is typed, and nothing onnxruntime typed changes."""

from __future__ import annotations

from onnx import TensorProto, helper

from onnxhal.hal.graph import Graph, ValueInfo
from onnxhal.ort_plugin.ml_value_types import apply_types, inferred_types


def sym(name: str, elem_type: int, shape: list) -> ValueInfo:
    return ValueInfo(name, helper.make_tensor_type_proto(elem_type, shape))


def scaler_graph(out_type: ValueInfo | None = None) -> Graph:
    """x [N, 3] -> Scaler -> s -> Relu -> y, as onnxruntime gives it: s and y without a type."""
    nodes = [helper.make_node("Scaler", ["x"], ["s"], domain="ai.onnx.ml", offset=[0.0] * 3, scale=[2.0] * 3),
             helper.make_node("Relu", ["s"], ["y"])]
    x = sym("x", TensorProto.FLOAT, ["N", 3])
    infos = {"x": x, "s": ValueInfo("s"), "y": out_type or ValueInfo("y")}
    return Graph("g", Graph.from_proto(helper.make_graph(nodes, "g", [], []), {}).nodes, [x], [infos["y"]], {}, infos, {"": 17, "ai.onnx.ml": 3})


def test_values_after_a_scaler_get_its_inputs_shape():
    graph = scaler_graph()
    types = inferred_types(graph)
    assert {n: types[n].shape for n in types} == {"s": ("N", 3), "y": ("N", 3)}
    assert apply_types(graph, types) == 2
    assert graph.value_info("y").shape == ("N", 3) and graph.outputs[0].shape == ("N", 3)


def test_a_type_onnxruntime_gives_is_kept():
    typed = sym("y", TensorProto.FLOAT, ["N", 3])
    graph = scaler_graph(typed)
    types = inferred_types(graph)
    assert "y" not in types
    assert apply_types(graph, {"y": ValueInfo.tensor("y", TensorProto.DOUBLE, [1])}) == 0
    assert graph.value_info("y") is typed


def test_a_graph_without_ml_operators_is_left_alone():
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    x = ValueInfo.tensor("x", TensorProto.FLOAT, [2])
    graph = Graph("g", Graph.from_proto(helper.make_graph(nodes, "g", [], []), {}).nodes, [x], [ValueInfo("y")],
                  {}, {"x": x, "y": ValueInfo("y")}, {"": 17})
    assert inferred_types(graph) == {}
