"""Malformed models, options and arguments: each is an onnxhal error naming the thing, the value and
the remedy (never a bare KeyError, TypeError or AttributeError from inside), and nothing is left
broken: the next good session or run works."""

from __future__ import annotations

import copy
import json
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxhal
from onnxhal import errors
from tests.models import ADD_MUL_X, add_mul_model, assert_add_mul_runs, make, vi

X = ADD_MUL_X


# -- models --------------------------------------------------------------------------------------
def _cast(**attrs):
    return make([helper.make_node("Cast", ["x"], ["y"], name="caster", **attrs)], [vi("x", [2])], [vi("y", None)])


def _if_without_else():
    branch = helper.make_graph([helper.make_node("Identity", ["x"], ["t"])], "then", [], [vi("t", [2])])
    node = helper.make_node("If", ["c"], ["y"], name="cond", then_branch=branch)
    return make([node], [vi("c", [], TensorProto.BOOL), vi("x", [2])], [vi("y", None)])


@pytest.mark.parametrize("model, words", [
    (lambda: _cast(), r"node Cast 'caster': Value of attribute to not specified"),
    (lambda: _cast(to=999), r"node Cast 'caster': Attribute to does not specify a valid type"),
    (_if_without_else, r"node If 'cond': Attribute else_branch does not contain a graph"),
])
def test_malformed_attributes_are_invalid_graph_errors_naming_the_node(model, words):
    with pytest.raises(errors.InvalidGraph, match=words):
        onnxhal.InferenceSession(model())


def _one_node(op, attrs, n_inputs=1):
    inputs = ["x"] * n_inputs + (["i"] if op == "Gather" else [])
    inits = [numpy_helper.from_array(np.array([0], np.int64), "i")] if op == "Gather" else []
    nodes = [helper.make_node(op, inputs, ["t"], name="bad", **attrs), helper.make_node("Relu", ["t"], ["y"])]
    return make(nodes, [vi("x", [2, 3])], [vi("y", None)], inits=inits, opset=11)


@pytest.mark.parametrize("op, attrs, n_inputs, words", [
    ("Transpose", {"perm": [0, 0]}, 1, "perm for Transpose has repeated value: 0"),
    ("Concat", {"axis": 5}, 2, r"axis must be in \[-rank, rank-1\]"),
    ("Softmax", {"axis": 4}, 1, "'axis' must be in .*Its actual value is: 4"),
    ("Flatten", {"axis": 7}, 1, r"Invalid value\(7\) for attribute 'axis'"),
    ("Gather", {"axis": 3}, 1, r"axis must be in \[-r, r-1\]"),
    ("Split", {"axis": 3}, 1, "Invalid value of attribute 'axis'. Rank=2 Value=3"),
    ("ReduceSum", {"axes": [4]}, 1, "input rank was 2"),
])
def test_attributes_out_of_range_for_the_input_are_refused_at_load(op, attrs, n_inputs, words):
    """As onnxruntime does at load (it runs each node's shape inference and refuses what it
    rejects). Loaded, they would fail every run with numpy's error, or (Softmax, Flatten) return
    an answer for an axis the input does not have."""
    with pytest.raises(errors.InvalidGraph, match=f"node {op} 'bad': .*{words}.*fix its attributes"):
        onnxhal.InferenceSession(_one_node(op, attrs, n_inputs))
    assert_add_mul_runs(onnxhal.InferenceSession(add_mul_model()))


def test_a_bad_attribute_inside_a_subgraph_is_refused_at_load():
    then = helper.make_graph([helper.make_node("Transpose", ["x"], ["o"], name="tr", perm=[1, 1])], "then", [],
                             [vi("o", None)])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["o"])], "else", [], [vi("o", None)])
    node = helper.make_node("If", ["c"], ["y"], name="cond", then_branch=then, else_branch=other)
    model = make([node], [vi("c", [], TensorProto.BOOL), vi("x", [2, 3])], [vi("y", None)])
    with pytest.raises(errors.InvalidGraph, match=r"node Transpose 'tr': .*repeated value: 1 \(in a subgraph of If 'cond'\)"):
        onnxhal.InferenceSession(model)


def test_a_declared_shape_that_inference_contradicts_still_loads_and_runs():
    """A declared output shape that disagrees with the inferred one is a warning in onnxruntime,
    not a refusal: the model runs, and the result has the computed shape."""
    model = make([helper.make_node("Transpose", ["x"], ["y"])], [vi("x", [2, 3])], [vi("y", [2, 3])])
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (y,) = onnxhal.InferenceSession(model).run(None, {"x": x})
    np.testing.assert_array_equal(y, x.T)


def _with_initializer(tensor):
    return make([helper.make_node("Add", ["x", "w"], ["y"])], [vi("x", [2])], [vi("y", None)], inits=[tensor])


def _raw_tensor(data_type, dims, raw):
    t = TensorProto(name="w", data_type=data_type, dims=dims)
    t.raw_data = raw
    return t


@pytest.mark.parametrize("data_type, dims, words", [
    (61, [2], r"initializer tensor 'w' \(data_type 61, dims \[2\], 8 bytes\) cannot be decoded"),
    (TensorProto.FLOAT, [124], r"initializer tensor 'w' \(data_type 1, dims \[124\], 8 bytes\) cannot be decoded"),
])
def test_undecodable_initializers_are_invalid_graph_errors(data_type, dims, words):
    tensor = _raw_tensor(data_type, dims, b"\0" * 8)
    with pytest.raises(errors.InvalidGraph, match=words):
        onnxhal.InferenceSession(_with_initializer(tensor))


def test_an_operator_older_than_the_models_opset_is_refused_at_load():
    rng = helper.make_node("Range", ["a", "b", "c"], ["y"], name="rg")
    m = make([rng], [vi(n, [], TensorProto.INT64) for n in "abc"], [vi("y", None, TensorProto.INT64)], opset=1)
    with pytest.raises(errors.InvalidGraph, match="Range node 'rg'.*opset 1; it exists from opset 11 on"):
        onnxhal.InferenceSession(m)


def test_a_model_without_opset_import_is_refused():
    m = add_mul_model()
    del m.opset_import[:]
    with pytest.raises(errors.InvalidGraph, match="no opset_import"):
        onnxhal.InferenceSession(m)


@pytest.fixture
def external_model(tmp_path):
    """A model whose weights are in w.bin beside it."""
    m = make([helper.make_node("Add", ["x", "w"], ["y"])], [vi("x", [2])], [vi("y", None)],
             inits=[numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "w")])
    path = tmp_path / "m.onnx"
    onnx.save_model(m, str(path), save_as_external_data=True, location="w.bin", size_threshold=0)
    return path


def test_external_data_is_read_beside_the_model(external_model):
    s = onnxhal.InferenceSession(str(external_model))
    np.testing.assert_allclose(s.run(None, {"x": np.zeros(2, np.float32)})[0], [1.0, 2.0])


def test_missing_external_data_is_no_such_file(external_model):
    os.remove(external_model.parent / "w.bin")
    with pytest.raises(errors.NoSuchFile, match="external data not found"):
        onnxhal.InferenceSession(str(external_model))


def test_external_data_outside_the_models_folder_is_refused(external_model):
    m = onnx.load(str(external_model), load_external_data=False)
    m.graph.initializer[0].external_data[0].value = "../../../../etc/passwd"
    onnx.save(m, str(external_model))
    with pytest.raises(errors.Fail, match="External data path escapes model directory"):
        onnxhal.InferenceSession(str(external_model))


def test_external_data_without_a_path_is_refused_not_read_from_the_current_folder(external_model, monkeypatch):
    monkeypatch.chdir(external_model.parent)  # w.bin is right here: it must still not be read
    data = external_model.read_bytes()
    with pytest.raises(errors.InvalidArgument, match="'w.bin'.*Pass the model's path"):
        onnxhal.InferenceSession(data)
    with pytest.raises(errors.InvalidArgument, match="'w.bin'"):
        onnxhal.InferenceSession(onnx.load(str(external_model), load_external_data=False))


# -- options and arguments -----------------------------------------------------------------------
@pytest.mark.parametrize("attr, value, words", [
    ("graph_optimization_level", 7, "graph_optimization_level 7 is not one of ORT_DISABLE_ALL"),
    ("graph_optimization_level", -1, "graph_optimization_level -1"),
    ("execution_mode", 5, "execution_mode 5 is not one of ORT_SEQUENTIAL"),
    ("intra_op_num_threads", -1, "intra_op_num_threads -1 must be an int >= 0"),
    ("intra_op_num_threads", "four", "intra_op_num_threads 'four'"),
])
def test_out_of_range_session_options(attr, value, words):
    so = onnxhal.SessionOptions()
    setattr(so, attr, value)
    with pytest.raises(errors.InvalidArgument, match=words):
        onnxhal.InferenceSession(add_mul_model(), so)


def test_a_numpy_int_is_a_thread_count():
    so = onnxhal.SessionOptions()
    so.intra_op_num_threads = np.int64(2)
    assert_add_mul_runs(onnxhal.InferenceSession(add_mul_model(), so))


@pytest.mark.parametrize("kwargs, words", [
    ({"sess_options": {}}, "sess_options must be an onnxhal.SessionOptions, got dict"),
    ({"providers": ["CPUExecutionProvider"], "provider_options": ["abc"]},
     r"provider_options\[0\] \(for CPUExecutionProvider\): provider options must be a dict"),
])
def test_wrongly_typed_session_arguments(kwargs, words):
    with pytest.raises(errors.InvalidArgument, match=words):
        onnxhal.InferenceSession(add_mul_model(), **kwargs)


def test_provider_options_for_devices_must_be_a_dict():
    so = onnxhal.SessionOptions()
    with pytest.raises(errors.InvalidArgument, match="add_provider_for_devices .*must be a dict"):
        so.add_provider_for_devices(onnxhal.get_ep_devices()[:1], ["a"])
    assert not so.has_providers()


def test_config_entry_values_must_be_strings():
    so = onnxhal.SessionOptions()
    with pytest.raises(errors.InvalidArgument, match="'session.record_ep_graph_assignment_info'.*got bool True"):
        so.add_session_config_entry("session.record_ep_graph_assignment_info", True)
    ro = onnxhal.RunOptions()
    with pytest.raises(errors.InvalidArgument, match="run config entry 'k'.*got int 1"):
        ro.add_run_config_entry("k", 1)


@pytest.mark.parametrize("run_options", [{"terminate": True}, "ro", onnxhal.SessionOptions()])
def test_run_options_of_the_wrong_type(add_mul_session, run_options):
    with pytest.raises(errors.InvalidArgument, match="run_options must be an onnxhal.RunOptions"):
        add_mul_session.run(None, {"x": X}, run_options)
    assert_add_mul_runs(add_mul_session)


def test_output_names_as_a_string_is_refused_not_iterated(add_mul_session):
    with pytest.raises(errors.InvalidArgument, match=r"got the string 'y'; use \['y'\]"):
        add_mul_session.run("y", {"x": X})
    assert_add_mul_runs(add_mul_session)


def test_a_delegate_must_return_devices_it_was_given():
    so = onnxhal.SessionOptions()
    so.set_provider_selection_policy_delegate(lambda devices, *_: [copy.copy(devices[0])])
    with pytest.raises(errors.Fail, match="not one of the ep_devices it was given"):
        onnxhal.InferenceSession(add_mul_model(), so)


# -- profiling and memory ------------------------------------------------------------------------
def test_a_profile_prefix_in_a_missing_folder_is_refused_at_creation(tmp_path):
    so = onnxhal.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "no" / "such" / "prof")
    with pytest.raises(errors.NoSuchFile, match="profile_file_prefix .*does not exist"):
        onnxhal.InferenceSession(add_mul_model(), so)


def test_end_profiling_stops_profiling(tmp_path):
    so = onnxhal.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "prof")
    s = onnxhal.InferenceSession(add_mul_model(), so)
    s.run(None, {"x": X})
    path = s.end_profiling()
    s.run(None, {"x": X})  # not recorded
    assert s.end_profiling() == ""
    assert sum(e["name"] == "model_run" for e in json.load(open(path))) == 1


def test_out_of_memory_is_an_out_of_memory_error_and_the_session_survives():
    mm = make([helper.make_node("MatMul", ["a", "b"], ["c"], name="mm")], [vi("a", ["m", "k"]), vi("b", ["k", "n"])],
              [vi("c", None)])
    s = onnxhal.InferenceSession(mm)
    n = 1 << 23  # a 256 TiB result, more than x86-64's 128 TiB of user address space: refused by any kernel
    huge = {"a": np.broadcast_to(np.float32(1), (n, 1)), "b": np.broadcast_to(np.float32(1), (1, n))}
    with pytest.raises(errors.OutOfMemory, match=r"MatMul node 'mm'.*Reduce the input shapes") as info:
        s.run(None, huge)
    assert isinstance(info.value, MemoryError)
    np.testing.assert_allclose(s.run(None, {"a": np.ones((2, 3), np.float32), "b": np.ones((3, 2), np.float32)})[0],
                               np.full((2, 2), 3.0))


def test_inference_errors_keep_subgraph_errors_and_skip_function_bodies():
    """onnx nests a node's inner errors as a list ending in a blank line: a subgraph's are real
    (onnxruntime refuses them), a function body's are onnx's own (test_mvn), and an input of
    unknown type is a consequence of an earlier error."""
    from onnxhal.runtime.loader.model_loader import inference_errors

    message = ("[ShapeInferenceError] Inference error(s): (op_type:MeanVarianceNormalization): [ShapeInferenceError] "
               "Inference error(s): (op_type:Constant): [ShapeInferenceError] one and only one attribute\n"
               "(op_type:Mul): [TypeInferenceError] a second error in the body\n\n"
               "(op_type:Loop, node name: loop): [ShapeInferenceError] Inference error(s): "
               "(op_type:Transpose, node name: tr): [TypeInferenceError] repeated value: 0\n"
               "(op_type:Concat): [ShapeInferenceError] axis must be in [-rank, rank-1].\n\n"
               "(op_type:Softmax, node name: sm): [TypeInferenceError] Input 0 expected to have type but instead is null\n"
               "(op_type:Flatten, node name: f): [ShapeInferenceError] Invalid value(7) for attribute 'axis'\n")
    assert inference_errors(message) == [
        "node Transpose 'tr': repeated value: 0 (in a subgraph of Loop 'loop')",
        "node Concat (unnamed): axis must be in [-rank, rank-1] (in a subgraph of Loop 'loop')",
        "node Flatten 'f': Invalid value(7) for attribute 'axis'"]
