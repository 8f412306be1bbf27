"""ONNX shape inference at load sees the data it propagates: a Gather over a long int64 index table
feeding a Reshape (hummingbird's tree traversal, TF-made G2P models) is read by onnx's data
propagation, so the table must not be emptied in the weightless copy inference gets. onnxruntime
loads and runs such a model; onnxhal must too, with the same result."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxhal
from onnxhal.hal.graph import Graph
from onnxhal.runtime.loader import guarded_inference


def table_model(length: int = 100) -> onnx.ModelProto:
    """y = Reshape(x, Gather(table, [3, 5])): the table is 1-D int64 of ``length`` elements, beyond
    the size up to which inference gets an initializer's data."""
    table = np.arange(length, dtype=np.int64) % 7 + 1  # table[3] = 4, table[5] = 6
    nodes = [helper.make_node("Gather", ["table", "idx"], ["dims"], axis=0),
             helper.make_node("Reshape", ["x", "dims"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [24])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(table, "table"),
                               numpy_helper.from_array(np.array([3, 5], np.int64), "idx")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10  # onnx 1.23 writes IR 14, which onnxruntime refuses
    return model


def test_a_gather_over_a_long_int64_table_loads_and_matches_onnxruntime():
    model = table_model()
    assert len(model.graph.initializer[0].int64_data) + len(model.graph.initializer[0].raw_data) > 0
    assert model.graph.initializer[0].dims[0] > guarded_inference.STUB_MIN_ELEMENTS
    x = np.arange(24, dtype=np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    sess = onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"x": x})[0]
    assert want.shape == (4, 6)
    np.testing.assert_array_equal(got, want)


def test_inference_that_fails_on_the_stub_is_tried_with_all_the_data_before_refusing(monkeypatch):
    """Were some other value read by inference emptied in the stub (every large initializer
    emptied here), the model is inferred again with its data before it is refused."""
    monkeypatch.setattr(guarded_inference, "stubbed",
                        lambda t: guarded_inference._elements(t) > guarded_inference.STUB_MIN_ELEMENTS)
    inferred, _, error = guarded_inference.infer(table_model())
    assert error == "" and inferred is not None
    y = next(v for v in inferred.graph.output if v.name == "y")
    assert [d.dim_value for d in y.type.tensor_type.shape.dim] == [4, 6]


def test_a_model_inference_rejects_with_its_data_is_still_refused():
    """The retry does not wave through what onnx rejects with every value at hand (an index beyond
    the table, which onnx's data propagation checks)."""
    model = table_model()
    model.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.array([3, 500], np.int64), "idx"))
    inferred, _, error = guarded_inference.infer(model)
    assert inferred is None and error


def test_the_optimizers_inference_stub_keeps_int64_tables():
    """``Graph.to_proto(data_up_to=...)``, the stub the optimizer's shape refresh gives onnx, keeps
    a 1-D int64 table's data, so data propagation through it succeeds."""
    model = table_model()
    graph = Graph.from_proto(model.graph, {"": 17})
    proto = graph.to_proto(data_up_to=guarded_inference.STUB_MIN_ELEMENTS)
    table = next(t for t in proto.initializer if t.name == "table")
    np.testing.assert_array_equal(numpy_helper.to_array(table), numpy_helper.to_array(model.graph.initializer[0]))
    stub = helper.make_model(proto, opset_imports=[helper.make_opsetid("", 17)])
    inferred = onnx.shape_inference.infer_shapes(stub, strict_mode=True, data_prop=True)
    y = next(v for v in inferred.graph.output if v.name == "y")
    assert [d.dim_value for d in y.type.tensor_type.shape.dim] == [4, 6]


def test_weights_inside_subgraphs_come_back_after_inference():
    # Inference gets the weights of an If's branches emptied too (a 100-element float initializer
    # in each); the loaded model has them back.
    w_then = np.linspace(-1, 1, 100, dtype=np.float32)
    w_else = np.linspace(2, 3, 100, dtype=np.float32)

    def branch(name: str, w: np.ndarray) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node("Mul", ["x1", f"w_{name}"], [f"y_{name}"])], name, [],
                                 [helper.make_tensor_value_info(f"y_{name}", TensorProto.FLOAT, [100])],
                                 [numpy_helper.from_array(w, f"w_{name}")])

    nodes = [helper.make_node("Abs", ["x0"], ["x1"]),
             helper.make_node("If", ["c"], ["y"], then_branch=branch("then", w_then), else_branch=branch("else", w_else))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x0", TensorProto.FLOAT, [100]),
                                           helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [100])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    data = model.SerializeToString()
    x = np.linspace(-5, 5, 100, dtype=np.float32)
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    hal = onnxhal.InferenceSession(data, providers=["CPUExecutionProvider"])
    for c in (True, False):
        feeds = {"x0": x, "c": np.array(c)}
        np.testing.assert_array_equal(hal.run(None, feeds)[0], ref.run(None, feeds)[0])


def _layer_norm_model(axis: int, n_outputs: int) -> onnx.ModelProto:
    outs = ["y", "mean", "inv_std"][:n_outputs]
    nodes = [helper.make_node("LayerNormalization", ["x", "s", "b"], outs, axis=axis),
             helper.make_node("Relu", ["y"], ["r"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("r", *outs[1:])],
                              [numpy_helper.from_array(np.ones(3, np.float32), "s"),
                               numpy_helper.from_array(np.zeros(3, np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def _passes(monkeypatch, model: onnx.ModelProto) -> int:
    import onnx.onnx_cpp2py_export.shape_inference as onnx_cpp

    calls = []
    real = onnx_cpp.infer_shapes
    monkeypatch.setattr(onnx_cpp, "infer_shapes", lambda *a: calls.append(a[1:]) or real(*a))
    onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return len(calls)


def test_only_an_unsafe_layer_norm_costs_a_first_inference_pass(monkeypatch):
    # a negative axis, or the Y output alone, cannot make inference read past the input's rank:
    # no first pass for its ranks (a model of value-blind ops otherwise); axis 1 with Mean has one
    assert _passes(monkeypatch, _layer_norm_model(-1, 3)) == 1
    assert _passes(monkeypatch, _layer_norm_model(1, 1)) == 1
    assert _passes(monkeypatch, _layer_norm_model(1, 3)) == 2
    x = np.random.default_rng(3).standard_normal((2, 3)).astype(np.float32)
    for model in (_layer_norm_model(-1, 3), _layer_norm_model(1, 3)):
        got = onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def _branch(name: str, scale: float) -> onnx.GraphProto:
    """y = Reshape(x, [Shape(x)[0], -1]) * scale: a Shape whose data onnx propagates, its values
    named as in the other branch (optimum's merged decoders write both branches so)."""
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Gather", ["s", "zero"], ["n"], name="gather", axis=0),
             helper.make_node("Unsqueeze", ["n", "zero1"], ["n1"], name="unsqueeze"),
             helper.make_node("Concat", ["n1", "minus1"], ["dims"], name="concat", axis=0),
             helper.make_node("Reshape", ["x", "dims"], ["r"], name="reshape"),
             helper.make_node("Mul", ["r", "k"], ["y"], name="mul")]
    inits = [numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array([0], np.int64), "zero1"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus1"),
             numpy_helper.from_array(np.array(scale, np.float32), "k")]
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)


def if_model(bad_perm: bool = False) -> onnx.ModelProto:
    then = _branch("then", 2.0)
    if bad_perm:  # a real error in a branch: a Transpose with a repeated axis
        then.node.append(helper.make_node("Transpose", ["y"], ["t"], name="tr", perm=[1, 1]))
    node = helper.make_node("If", ["c"], ["out"], name="cond", then_branch=then, else_branch=_branch("else", -1.0))
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                                            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 3, 4])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def test_if_branches_writing_the_same_names_load_and_match_onnxruntime():
    """onnx's data propagation keeps one table for the whole model: the second branch's Shape
    failed strict inference with 'Data for input 0 already exists' and the valid model was refused
    (optimum's merged decoder, opt_marian_decoder); inference runs again without propagation."""
    model = if_model()
    with pytest.raises(onnx.shape_inference.InferenceError, match=guarded_inference.DATA_PROP_COLLISION.pattern):
        onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    sess = onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    for c in (True, False):
        feeds = {"c": np.array(c), "x": x}
        np.testing.assert_array_equal(sess.run(None, feeds)[0], ref.run(None, feeds)[0])


def test_a_real_error_in_such_a_branch_is_still_refused():
    with pytest.raises(onnxhal.hal.errors.InvalidGraph, match=r"node Transpose 'tr': .*repeated value"):
        onnxhal.InferenceSession(if_model(bad_perm=True).SerializeToString(), providers=["CPUExecutionProvider"])
