"""Hostile and malformed models (issue 34): no crash, no hang, no silently wrong answer; each
refusal an OrtError naming the node, the attribute or input, the value and what is allowed.

The models that crashed or hung the process are loaded in a child process with a timeout, so that
a regression fails here instead of killing or hanging the test run. Each refusal is checked against
onnxruntime, which refuses the same models (at load, or at their first run)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import onnxhal
from onnxhal import errors
from tests import hostile_models as hm
from tests.models import make, vi

ort = pytest.importorskip("onnxruntime")


def _feeds(sess) -> dict:
    return {i.name: np.ones([d if isinstance(d, int) else 1 for d in i.shape],
                            np.int64 if "int64" in i.type else np.bool_ if "bool" in i.type else np.float32)
            for i in sess.get_inputs()}


def ort_refuses(model: onnx.ModelProto) -> bool:
    """Whether onnxruntime refuses the model, at load or at a first run on inputs of ones."""
    try:
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        sess.run(None, _feeds(sess))
    except Exception:
        return True
    return False


# -- what crashed or hung the process ---------------------------------------------------------------
#: name -> (outcome, words of the message). Before: SIGSEGV (LayerNormalization, GatherND),
#: SIGABRT (Split), a hang holding the GIL (Einsum, the long vectors), a C++ stack overflow
#: (the recursive function) and "module 'onnx' has no attribute 'inliner'" (the local function).
EXPECTED = {
    "local_function": ("loaded", ""),
    "layer_norm_axis_2**31": ("InvalidGraph", "LayerNormalization node 'ln': axis=2147483648 but its input 'x' has "
                              "rank 2; axis must be in [-2, 1]"),
    "layer_norm_axis_2**63-1": ("InvalidGraph", "axis=9223372036854775807"),
    "einsum_control_character": ("InvalidGraph", r"Einsum node 'es': equation 'bij,bjk\x18->bik' is not an Einsum"),
    "einsum_lone_dot": ("InvalidGraph", "equation 'bij.,bjk->bik' is not an Einsum equation"),
    "gather_nd_negative_batch_dims": ("InvalidGraph", "GatherND node 'gnd': batch_dims=-7"),
    "split_num_outputs_mismatch": ("InvalidGraph", "Split node 'sp': num_outputs=1 but the node has 2 output(s)"),
    "long_declared_vector": ("loaded", ""),
    "long_inferred_vector": ("loaded", ""),
    "recursive_local_function": ("InvalidGraph", "model-local functions call themselves: local:twice -> local:twice"),
}


def test_models_that_crashed_or_hung_the_process_are_refused_typed_in_a_child_process():
    results = hm.load_in_child(list(EXPECTED), timeout=120)
    for name, (outcome, words) in EXPECTED.items():
        got = results.get(name, ("not reached", ""))
        assert got[0] == outcome and words in got[1], (name, got)


def test_a_model_with_a_local_function_runs():
    sess = onnxhal.InferenceSession(hm.local_function())
    np.testing.assert_array_equal(sess.run(None, {"x": np.array([1, 2], np.float32)})[0], [2, 4])


def test_a_long_vector_loads_without_propagating_data_and_runs():
    """A 1-D value longer than DATA_PROP_MAX_LENGTH: inference skips data propagation (its cost is
    linear in the length) and the model still runs."""
    n = 2**17
    sess = onnxhal.InferenceSession(hm.long_vector(n))
    x = np.arange(n, dtype=np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], x * x)


# -- what onnxruntime's schema checks refuse at load ------------------------------------------------
def _relu(**attrs) -> onnx.ModelProto:
    return make([helper.make_node("Relu", ["x"], ["y"], name="r", **attrs)], [vi("x", [2, 3])], [vi("y", None)])


def _with_attribute(op: str, inputs: list[str], set_attr) -> onnx.ModelProto:
    node = helper.make_node(op, inputs, ["y"], name="n")
    set_attr(node.attribute.add())
    return make([node], [vi("x", [2, 3])], [vi("y", None)])


def _attr(name, type_, **fields):
    def set_attr(a):
        a.name, a.type = name, type_
        for k, v in fields.items():
            if isinstance(v, list):
                getattr(a, k).extend(v)
            else:
                setattr(a, k, v)
    return set_attr


def _perm_twice() -> onnx.ModelProto:
    node = helper.make_node("Transpose", ["x"], ["y"], name="n", perm=[0, 1])
    node.attribute.append(helper.make_attribute("perm", [1, 0]))
    return make([node], [vi("x", [2, 3])], [vi("y", None)])


def _if_without_condition() -> onnx.ModelProto:
    then = helper.make_graph([helper.make_node("Identity", ["x"], ["t"])], "then", [], [vi("t", [2, 3])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [vi("e", [2, 3])])
    node = helper.make_node("If", [], ["y"], name="n", then_branch=then, else_branch=other)
    return make([node], [vi("x", [2, 3])], [vi("y", None)])


def _scan_without_body_outputs() -> onnx.ModelProto:
    body = helper.make_graph([helper.make_node("Identity", ["xi"], ["so"])], "body", [vi("s", [2]), vi("xi", [2])], [])
    node = helper.make_node("Scan", ["s0", "xs"], ["sf", "ys"], name="n", body=body, num_scan_inputs=1)
    return make([node], [vi("s0", [2]), vi("xs", [3, 2])], [vi("sf", None), vi("ys", None)])


def _conv(kernel_shape) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="n", kernel_shape=kernel_shape)
    return make([node], [vi("x", [1, 3, 8, 8])], [vi("y", None)], [w])


A = onnx.AttributeProto
REFUSED = {
    "unknown attribute": (lambda: _relu(foo=1), "Relu node 'r' .*attribute 'foo' is not an attribute of Relu"),
    "attribute of another type": (lambda: _with_attribute("Transpose", ["x"], _attr("perm", A.FLOATS, floats=[1.0, 0.0])),
                                  "Transpose node 'n' .*attribute 'perm' is FLOATS, Transpose expects INTS"),
    "attribute given twice": (_perm_twice, "Transpose node 'n': attribute 'perm' is given more than once"),
    "attribute without a type": (lambda: _with_attribute("Softmax", ["x"], _attr("axis", A.UNDEFINED)),
                                 "Softmax node 'n': attribute 'axis' declares no valid type"),
    "attribute holding another type's value": (
        lambda: _with_attribute("Softmax", ["x"], _attr("axis", A.INT, f=1.0)),
        "Softmax node 'n': attribute 'axis' is declared INT but holds a value in field.s. f"),
    "too few inputs": (lambda: make([helper.make_node("MatMul", ["x"], ["y"], name="mm")], [vi("x", [2, 3])],
                                    [vi("y", None)]), r"MatMul node 'mm' .*has 1 input\(s\); MatMul takes exactly 2: A, B"),
    "too many outputs": (lambda: make([helper.make_node("Relu", ["x"], ["y", "z"], name="r")], [vi("x", [2, 3])],
                                      [vi("y", None)]), r"Relu node 'r' .*has 2 output\(s\); Relu gives exactly 1"),
    "a required input left empty": (lambda: make([helper.make_node("Add", ["x", ""], ["y"], name="a")],
                                                 [vi("x", [2, 3])], [vi("y", None)]),
                                    r"Add node 'a' .*input 1 \(B\) is required but its name is empty"),
    "If without its condition": (_if_without_condition, r"If node 'n' .*has 0 input\(s\); If takes exactly 1: cond"),
    "Scan body without outputs": (_scan_without_body_outputs,
                                  r"Scan node 'n': its 'body' subgraph takes 2 input\(s\) and gives 0 output\(s\).*give 2"),
    "LayerNormalization axis 2 of rank 2": (lambda: hm.layer_norm(2, 1),
                                            r"axis=2 but its input 'x' has rank 2; axis must be in \[-2, 1\]"),
    "LayerNormalization axis 7 of rank 2": (lambda: hm.layer_norm(7, 1), "axis=7 but its input 'x' has rank 2"),
    "Conv kernel_shape other than W's": (lambda: _conv([2, 2]),
                                         r"Conv node 'n': kernel_shape=\[2, 2\] but its weight 'w' has shape \[4, 3, 3, 3\]"),
    "Einsum repeating an output letter": (lambda: hm.einsum("bij,bjk->bikk"), "repeats a letter in its output term"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_models_onnxruntime_refuses_are_refused_at_load_naming_the_node(case):
    """Before, the first three to the seventh ran (unknown and duplicated attributes ignored, the
    second perm used), MatMul raised a bare IndexError, and the last seven ran to a wrong answer:
    LayerNormalization returned zeros, If ran its else branch, Scan returned [None, None], Conv
    ignored kernel_shape."""
    build, words = REFUSED[case]
    with pytest.raises(errors.InvalidGraph, match=words):
        onnxhal.InferenceSession(build())
    assert ort_refuses(build())


def test_valid_layer_norm_einsum_and_conv_still_run():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for axis in (1, -1):
        y, mean, _ = onnxhal.InferenceSession(hm.layer_norm(axis)).run(None, {"x": x})
        np.testing.assert_allclose(mean, x.mean(axis=1, keepdims=True))
    a, b = np.ones((2, 3, 4), np.float32), np.ones((2, 4, 5), np.float32)
    for eq in ("bij,bjk->bik", "b ij, bjk -> bik", "...ij,...jk->...ik"):
        np.testing.assert_allclose(onnxhal.InferenceSession(hm.einsum(eq)).run(None, {"a": a, "b": b})[0], a @ b)
    y = onnxhal.InferenceSession(_conv([3, 3])).run(None, {"x": np.ones((1, 3, 8, 8), np.float32)})[0]
    np.testing.assert_allclose(y, np.full((1, 4, 6, 6), 27, np.float32))
