"""Session creation does its per-model work once: shape inference runs once on a model where the
loader's first (probe) pass has nothing to find, and what it infers is what the two passes found.
Each model also runs against onnxruntime, the judge of the result."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnx.onnx_cpp2py_export.shape_inference as onnx_cpp
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxhal
from onnxhal.hal.errors import InvalidGraph
from onnxhal.runtime.loader import guarded_inference
from onnxhal.runtime.loader.model_loader import load_model


def _model(nodes, inputs, outputs, inits=(), ml=False) -> onnx.ModelProto:
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid("ai.onnx.ml", 3)] if ml else [])
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(inits)), opset_imports=opsets)
    model.ir_version = 10  # onnx 1.23 writes IR 14, which onnxruntime refuses
    return model


def tree_model() -> onnx.ModelProto:
    """A two-tree regressor after a Relu: no node onnx's data propagation visits."""
    tree = helper.make_node(
        "TreeEnsembleRegressor", ["r"], ["y"], domain="ai.onnx.ml", n_targets=1,
        nodes_treeids=[0, 0, 0, 1, 1, 1], nodes_nodeids=[0, 1, 2, 0, 1, 2],
        nodes_featureids=[0, 0, 0, 1, 0, 0], nodes_values=[0.5, 0, 0, 0.25, 0, 0],
        nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"] * 2, nodes_truenodeids=[1, 0, 0, 1, 0, 0],
        nodes_falsenodeids=[2, 0, 0, 2, 0, 0], target_treeids=[0, 0, 1, 1], target_nodeids=[1, 2, 1, 2],
        target_ids=[0, 0, 0, 0], target_weights=[1.0, 2.0, 10.0, 20.0])
    return _model([helper.make_node("Relu", ["x"], ["r"]), tree],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], ml=True)


def shape_model() -> onnx.ModelProto:
    """y = Reshape(x, Concat(Shape(x)[0], [-1])): data propagation reads the Shape."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "i0"], ["n"], axis=0),
             helper.make_node("Concat", ["n", "m1"], ["dims"], axis=0),
             helper.make_node("Reshape", ["x", "dims"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4, 5])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                  [numpy_helper.from_array(np.array([0], np.int64), "i0"),
                   numpy_helper.from_array(np.array([-1], np.int64), "m1")])


@pytest.fixture
def inference_calls(monkeypatch) -> list:
    """Each call of onnx's shape inference during the test, as (data_prop,); the real function runs.
    Counted at onnx's C++ entry point, which ``onnx.shape_inference.infer_shapes`` calls and the
    loader's strict pass calls directly."""
    calls, real = [], onnx_cpp.infer_shapes

    def counted(model, check_type=False, strict_mode=False, data_prop=False):
        calls.append(data_prop)
        return real(model, check_type, strict_mode, data_prop)

    monkeypatch.setattr(onnx_cpp, "infer_shapes", counted)
    return calls


def _shapes(proto: onnx.ModelProto) -> dict:
    return {v.name: v.type.SerializeToString() for v in (*proto.graph.value_info, *proto.graph.output)}


def test_a_model_without_shape_data_is_inferred_in_one_pass(inference_calls):
    model = tree_model()
    loaded = load_model(model.SerializeToString())
    assert len(inference_calls) == 1  # the probe found nothing to check, so it did not run
    # the same types and shapes as onnx's strict inference with data propagation gives
    want = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    assert _shapes(loaded.proto) == _shapes(want)
    x = np.array([[0.2, 0.1], [0.9, -1.0], [-3.0, 0.4]], np.float32)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, ref, rtol=1e-6)


def test_a_model_with_shape_data_keeps_the_probe_pass(inference_calls):
    model = shape_model()
    loaded = load_model(model.SerializeToString())
    assert inference_calls == [False, True]  # the probe, then the real pass with data propagation
    out = next(v for v in loaded.proto.graph.output if v.name == "y")
    assert [d.dim_value for d in out.type.tensor_type.shape.dim] == [3, 20]  # found by data propagation
    x = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, ref)


def test_operators_with_neither_inference_nor_body_need_no_probe_pass(inference_calls):
    """ai.onnx.ml opset 1's Scaler and TreeEnsembleRegressor have no inference function and no
    function body (skl2onnx writes that opset): onnx's inference passes them by, so nothing can
    propagate and the model is inferred without the probe pass. Their outputs are typed from the
    declared input before that pass (``ml_shapes.typed_before_inference``), so it is the only one:
    no second pass after typing them."""
    assert not guarded_inference.may_propagate("Scaler", "ai.onnx.ml", 1)
    assert not guarded_inference.may_propagate("TreeEnsembleRegressor", "ai.onnx.ml", 1)
    model = tree_model()
    model.graph.node[0].CopyFrom(helper.make_node("Scaler", ["x"], ["r"], domain="ai.onnx.ml",
                                                  offset=[0.5, -0.25], scale=[2.0, 4.0]))
    del model.opset_import[1:]
    model.opset_import.append(helper.make_opsetid("ai.onnx.ml", 1))
    loaded = load_model(model.SerializeToString())
    assert inference_calls == [True]
    want = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    got = _shapes(loaded.proto)
    typed = {"r": helper.make_tensor_type_proto(TensorProto.FLOAT, ["N", 2]),
             "y": helper.make_tensor_type_proto(TensorProto.FLOAT, ["N", 1])}
    assert {k: v for k, v in got.items() if k not in typed} == {k: v for k, v in _shapes(want).items() if k not in typed}
    assert {k: got[k] for k in typed} == {k: t.SerializeToString() for k, t in typed.items()}
    x = np.array([[0.2, 0.1], [0.9, -1.0], [-3.0, 0.4]], np.float32)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, ref)


def test_which_operators_may_propagate_data():
    assert guarded_inference.may_propagate("Shape", "", 17)
    assert not guarded_inference.may_propagate("Relu", "", 17)
    assert not guarded_inference.may_propagate("TreeEnsembleRegressor", "ai.onnx.ml", 3)
    assert not guarded_inference.may_propagate("NoSuchOp", "com.example", 1)


def test_a_long_value_no_propagating_node_reads_keeps_data_propagation(inference_calls):
    """A 1-D input longer than DATA_PROP_MAX_LENGTH read only by a Relu costs data propagation
    nothing: the Shape chain on the other input is still propagated (its Reshape gets a static
    shape). A long value a propagating node reads turns it off, as before."""
    n = guarded_inference.DATA_PROP_MAX_LENGTH * 2
    base = shape_model()
    base.graph.node.append(helper.make_node("Relu", ["v"], ["w"]))
    base.graph.input.append(helper.make_tensor_value_info("v", TensorProto.FLOAT, [n]))
    base.graph.output.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, None))
    loaded = load_model(base.SerializeToString())
    assert inference_calls == [False, True]
    out = next(v for v in loaded.proto.graph.output if v.name == "y")
    assert [d.dim_value for d in out.type.tensor_type.shape.dim] == [3, 20]
    feeds = {"x": np.arange(60, dtype=np.float32).reshape(3, 4, 5), "v": np.linspace(-1, 1, n, dtype=np.float32)}
    ref = ort.InferenceSession(base.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = onnxhal.InferenceSession(base.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, r in zip(got, ref):
        np.testing.assert_array_equal(g, r)

    read = shape_model()  # the long value now read by a Mul: data propagation is off
    read.graph.node.append(helper.make_node("Mul", ["v", "v"], ["w"]))
    read.graph.input.append(helper.make_tensor_value_info("v", TensorProto.FLOAT, [n]))
    read.graph.output.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, None))
    inference_calls.clear()
    load_model(read.SerializeToString())
    assert inference_calls == [False, False]


def _blind_model(n: int) -> onnx.ModelProto:
    """Conv -> Add(Shape-free) -> Relu, plus a 1-D int64 value of ``n`` read by an Add: data
    propagation visits the Adds, but no node reads a value as a shape."""
    w = numpy_helper.from_array(np.ones((2, 3, 3, 3), np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "c"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"]),
             helper.make_node("Add", ["v", "v"], ["u"])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 5, 5]),
                          helper.make_tensor_value_info("v", TensorProto.INT64, [n])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                   helper.make_tensor_value_info("u", TensorProto.INT64, None)], [w])


@pytest.mark.parametrize("n", [4, guarded_inference.DATA_PROP_MAX_LENGTH * 2])
def test_a_model_whose_nodes_read_no_values_as_shapes_is_inferred_in_one_pass(n, inference_calls):
    model = _blind_model(n)
    loaded = load_model(model.SerializeToString())
    assert inference_calls == [False]  # no probe, and no data propagation, however long the value
    want = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=n < 100)
    assert _shapes(loaded.proto) == _shapes(want)
    feeds = {"x": np.arange(150, dtype=np.float32).reshape(2, 3, 5, 5), "v": np.arange(n, dtype=np.int64)}
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, r in zip(got, ref):
        np.testing.assert_array_equal(g, r)


def test_a_node_reading_values_as_shapes_keeps_the_probe_and_data_propagation(inference_calls):
    model = _blind_model(4)
    model.graph.node.append(helper.make_node("Reshape", ["y", "u"], ["r"]))
    model.graph.output.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, None))
    load_model(model.SerializeToString())
    assert inference_calls == [False, True]


def test_shape_data_read_only_as_data_needs_no_propagation(inference_calls):
    """A Shape-Gather-Add chain whose result reaches a Reshape only as its data input (the shape
    comes from an initializer), and a Cast into an ai.onnx.ml Scaler: inference reads those values'
    types and shapes, never what propagation computes, so neither model gets the probe pass or
    propagation, and each is inferred to the shapes propagation gives; the sessions match
    onnxruntime."""
    chain = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "i"], ["g"], axis=0),
             helper.make_node("Add", ["g", "g"], ["a"]),
             helper.make_node("Reshape", ["a", "two"], ["y"])]
    scaled = [helper.make_node("Cast", ["x"], ["c"], to=TensorProto.FLOAT),
              helper.make_node("Scaler", ["c"], ["y"], domain="ai.onnx.ml", offset=[0.5], scale=[2.0])]
    x = np.arange(12, dtype=np.float32).reshape(3, 4) - 5
    for nodes, out_type, ml in ((chain, TensorProto.INT64, False), (scaled, TensorProto.FLOAT, True)):
        model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                       [helper.make_tensor_value_info("y", out_type, None)],
                       [numpy_helper.from_array(np.array([1, 0], np.int64), "i"),
                        numpy_helper.from_array(np.array([2, 1], np.int64), "two")], ml=ml)
        inference_calls.clear()
        loaded = load_model(model.SerializeToString())
        # the one strict pass (a Scaler's output typed from inference's result is inferred once more)
        assert inference_calls[0] is False and True not in inference_calls
        want = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
        got_shapes, want_shapes = _shapes(loaded.proto), _shapes(want)
        if ml:  # the Scaler's output is typed by the loader (``ml_shapes``), which onnx leaves untyped
            del got_shapes["y"], want_shapes["y"]
        assert got_shapes == want_shapes
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        got = onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(got.run(None, {"x": x})[0], sess.run(None, {"x": x})[0], rtol=1e-6)


def test_an_operator_inferred_through_its_body_keeps_data_propagation(inference_calls):
    """onnx infers GroupNormalization-18 through its function body, whose Reshape reads a shape
    propagation computes inside the body: propagation stays on although no node outside reads a
    propagated value."""
    nodes = [helper.make_node("GroupNormalization", ["x", "sc", "b"], ["y"], num_groups=2)]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 3])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                   [numpy_helper.from_array(np.ones(2, np.float32), "sc"),
                    numpy_helper.from_array(np.zeros(2, np.float32), "b")])
    model.opset_import[0].version = 18
    load_model(model.SerializeToString())
    assert inference_calls[-1] is True


@pytest.mark.parametrize("name", ["mobilenet_dynamo", "resnet_dynamo", "resnet_ts", "resnet_ts_qdq", "hb_perf_tree_trav"])
def test_corpus_models_inferred_without_data_propagation_get_what_it_gives(name, inference_calls):
    path = os.path.join(os.path.dirname(__file__), "real_models", f"{name}.onnx")
    loaded = load_model(path)
    assert inference_calls == [False]
    want = onnx.shape_inference.infer_shapes(loaded.proto, check_type=True, strict_mode=True, data_prop=True)
    assert _shapes(loaded.proto) == _shapes(want)


def test_a_model_below_ir_4_is_inferred_without_a_copy(monkeypatch, inference_calls):
    """Below IR 4 the loader infers the model as IR 4 (onnx then reads the type of an initializer
    that is not a graph input, as onnxruntime). Where that is all that changes, the serialized model
    is given the version rather than a copy of the model made: the types, shapes and IR version
    loaded are those of inferring the raised copy, and a type error the raise reveals is refused."""
    made = []
    real = guarded_inference._weightless

    def spied(proto, *args, **kwargs):
        stub = real(proto, *args, **kwargs)
        made.append(stub is not proto)
        return stub

    monkeypatch.setattr(guarded_inference, "_weightless", spied)
    nodes = [helper.make_node("Add", ["x", "c"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                   [numpy_helper.from_array(np.ones(3, np.float32), "c")])
    model.ir_version = 3
    loaded = load_model(model.SerializeToString())
    assert made == [False] and len(inference_calls) == 1
    raised = onnx.ModelProto()
    raised.CopyFrom(model)
    raised.ir_version = 4
    want = onnx.shape_inference.infer_shapes(raised, check_type=True, strict_mode=True)
    assert loaded.proto.ir_version == 4 and _shapes(loaded.proto) == _shapes(want)
    assert [d.dim_param or d.dim_value for d in loaded.proto.graph.output[0].type.tensor_type.shape.dim] == ["N", 3]
    bad = onnx.ModelProto()
    bad.CopyFrom(model)
    bad.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.ones(3, np.int64), "c"))
    with pytest.raises(InvalidGraph, match="B has inconsistent type tensor\\(int64\\)"):
        load_model(bad.SerializeToString())
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 3
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, ref)
