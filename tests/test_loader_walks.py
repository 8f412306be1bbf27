"""The loader's walks made cheaper (issue 44) keep their answers: the order check seeded with the
names no node writes, the node checks' key by input and output counts, the required-attribute
check asked once per op type, the EPContext walk skipped without com.microsoft, and the shape
sources' broadcast of equal shapes."""

from __future__ import annotations

import os
import random

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import onnxhal
from onnxhal.hal import Node
from onnxhal.hal.errors import InvalidGraph
from onnxhal.runtime.loader.model_loader import load_model, toposort
from onnxhal.runtime.optimizer import shape_sources
from onnxhal.runtime.session.ep_context_model import resolve_external_contexts
from tests.models import make, vi


def _random_dag(rng: random.Random, n: int) -> tuple[list[Node], set[str]]:
    """``n`` nodes in topological order, each reading earlier outputs and names no node writes."""
    outer = {f"in{k}" for k in range(4)}
    names = sorted(outer)
    nodes = []
    for k in range(n):
        reads = [rng.choice(names) for _ in range(rng.randint(1, 3))] + ([""] if rng.random() < 0.2 else [])
        nodes.append(Node("Add", reads, [f"v{k}"], name=f"n{k}"))
        names.append(f"v{k}")
    return nodes, outer


def test_toposort_with_the_names_no_node_writes_finds_the_same_order():
    rng = random.Random(44)
    for _ in range(200):
        nodes, outer = _random_dag(rng, rng.randint(1, 12))
        assert toposort(nodes, "g", outer) is nodes  # in order: the list itself
        shuffled = nodes[:]
        rng.shuffle(shuffled)
        want = [n.name for n in toposort(shuffled, "g")]
        assert [n.name for n in toposort(shuffled, "g", outer)] == want
        assert [n.name for n in toposort(shuffled, "g", set(rng.sample(sorted(outer), 2)))] == want


def test_a_node_like_one_that_passed_but_with_an_empty_required_input_is_refused():
    """The node checks skip a node equal to one that passed (op type, attributes, which inputs are
    named): a second Add whose input 1 is empty is not that node."""
    nodes = [helper.make_node("Add", ["x", "x"], ["a"], name="first"),
             helper.make_node("Add", ["a", ""], ["y"], name="second")]
    with pytest.raises(InvalidGraph, match=r"Add node 'second'.*input 1 \(B\) is required but its name is empty"):
        load_model(make(nodes, [vi("x", [3])], [vi("y", [3])]).SerializeToString())


def test_clips_with_and_without_an_omitted_input_load_and_run_as_onnxruntime():
    consts = [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in (("lo", -0.5), ("hi", 0.5))]
    nodes = [helper.make_node("Clip", ["x", "lo", "hi"], ["a"], name="both"),
             helper.make_node("Clip", ["a", "", "hi"], ["b"], name="max_only"),
             helper.make_node("Clip", ["b", "lo", "hi"], ["y"], name="both_again")]
    model = make(nodes, [vi("x", [5])], [vi("y", [5])], consts).SerializeToString()
    x = np.linspace(-2, 2, 5, dtype=np.float32)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, want)


def test_a_missing_required_attribute_is_found_on_any_node_of_its_op_type():
    nodes = [helper.make_node("LRN", ["x"], ["a"], name="sized", size=3),
             helper.make_node("LRN", ["a"], ["y"], name="unsized")]
    with pytest.raises(InvalidGraph, match="LRN node 'unsized': required attribute 'size' of LRN-13 is missing"):
        load_model(make(nodes, [vi("x", [1, 3, 4, 4])], [vi("y", [1, 3, 4, 4])]).SerializeToString())


def test_an_ep_context_node_without_the_com_microsoft_import_is_not_resolved_but_refused():
    node = helper.make_node("EPContext", ["x"], ["y"], name="ctx", domain="com.microsoft", embed_mode=0,
                            ep_cache_context="no_such_file.bin")
    model = make([node], [vi("x", [3])], [vi("y", [3])])
    assert resolve_external_contexts(model, None, None) is model  # no walk, nothing read
    with pytest.raises(InvalidGraph, match="domain 'com.microsoft', which the model's opset_import does not list"):
        load_model(model.SerializeToString())


def test_the_broadcast_of_equal_shapes_is_the_per_dim_broadcast():
    a, b = shape_sources.Axis("x", 0), shape_sources.Axis("y", 1)
    dims = [None, 0, 1, 2, 7, a, b, shape_sources.AxisMin(a, 4), shape_sources.AxisMin(b, 1)]
    rng = random.Random(4)
    for _ in range(2000):
        shape = tuple(rng.choice(dims) for _ in range(rng.randint(0, 4)))
        shapes = [shape] * rng.randint(1, 3)
        per_dim = tuple(shape_sources.broadcast_dim([s[k] for s in shapes]) for k in range(len(shape)))
        assert shape_sources._broadcast(shapes) == per_dim


def _declared_wrong_output_model() -> onnx.ModelProto:
    """A small model (no weight to strip) whose output's declared shape contradicts the computed one."""
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 5])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("source", ["synthetic", "skh_plsr"])
def test_a_session_made_from_a_proto_leaves_the_callers_proto_as_it_was(source):
    # The declared-output merge (onnxruntime's lenient merge) once cleared the caller's output shape
    # where the loader had nothing to strip and worked on the proto itself.
    if source == "synthetic":
        model = _declared_wrong_output_model()
    else:
        model = onnx.load(os.path.join(os.path.dirname(__file__), "real_models", source + ".onnx"))
    before = model.SerializeToString()
    first = onnxhal.InferenceSession(model)
    assert model.SerializeToString() == before
    second = onnxhal.InferenceSession(model)  # and a second session from it loads the same model
    assert [(o.name, o.shape) for o in first.get_outputs()] == [(o.name, o.shape) for o in second.get_outputs()]
