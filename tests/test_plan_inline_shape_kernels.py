"""Reshape, Transpose, Concat, Expand and Cast offer a positional ``apply`` as ``inline_fn``
(``INLINE_APPLY``): the generated run function calls it directly instead of building an input list
and indexing the returned one (runtime/session/plan_codegen.py). Checked here: the inline call
against ``compute`` (the plain path, which the interpreted loop and the profiler run), a model of
them against onnxruntime on the generated, first-run and interpreted paths, and a failing inline
node still named in a typed error."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxhal
from onnxhal.hal.ep import INLINE_APPLY
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernel_factory import create_cpu_kernel
from onnxhal.runtime.providers.cpu.kernels import cast, shape_ops
from tests.test_cpu_kernels_nn import make_node, randn

I64 = np.int64

CASES = [
    ("Reshape", [randn(2, 3, 4), np.array([0, -1], I64)], {}),
    ("Reshape", [randn(2, 0, 4), np.array([4, 0, 2], I64)], {"allowzero": 1}),
    ("Reshape", [randn(2, 0, 4), np.array([3, 0], I64)], {}),
    ("Transpose", [randn(2, 3, 4)], {}),
    ("Transpose", [randn(2, 3, 4)], {"perm": [1, 2, 0]}),
    ("Concat", [randn(2, 3), randn(2, 1), randn(2, 0)], {"axis": 1}),
    ("Concat", [randn(1, 3)], {"axis": -2}),
    ("Expand", [randn(3, 1), np.array([2, 1, 4], I64)], {}),
    ("Expand", [randn(3, 1).astype(np.float16), np.array([1], I64)], {}),
    ("Cast", [randn(5) * 100], {"to": TensorProto.INT32}),
    ("Cast", [randn(5)], {"to": TensorProto.FLOAT}),  # the same type: the input itself
    ("Cast", [randn(4)], {"to": TensorProto.STRING}),
    ("Cast", [np.array(["1.5", "NaN"], dtype=object)], {"to": TensorProto.FLOAT}),
]


@pytest.mark.parametrize("op,inputs,attrs", CASES, ids=[f"{c[0]}{k}" for k, c in enumerate(CASES)])
def test_inline_call_equals_compute(op, inputs, attrs):
    kernel = create_cpu_kernel(make_node(op, len(inputs), 19, **attrs), None)
    assert type(kernel).inline_fn is INLINE_APPLY and "inline_fn" not in vars(kernel)  # no cycle
    plain = kernel.compute(list(inputs))[0]
    for _ in range(2):  # the second call takes what the first kept (Reshape's and Expand's shapes)
        fast = kernel.inline_fn(*inputs)
        assert fast.__class__ is np.ndarray and fast.dtype == plain.dtype and fast.shape == plain.shape
        np.testing.assert_array_equal(fast, plain)
    if op == "Cast" and attrs["to"] == TensorProto.FLOAT and inputs[0].dtype == np.float32:
        assert kernel.inline_fn(*inputs) is inputs[0]


def _model(shape_fed: bool) -> onnx.ModelProto:
    """x[2,3] -> Transpose -> Reshape -> Cast(double) -> Expand -> Concat -> Cast(float)."""
    nodes = [helper.make_node("Transpose", ["x"], ["t"], name="tr", perm=[1, 0]),
             helper.make_node("Reshape", ["t", "shape"], ["r"], name="re"),
             helper.make_node("Cast", ["r"], ["c"], name="ca", to=TensorProto.DOUBLE),
             helper.make_node("Expand", ["c", "big"], ["e"], name="ex"),
             helper.make_node("Concat", ["e", "e", "c"], ["k"], name="co", axis=0),
             helper.make_node("Cast", ["k"], ["y"], name="cb", to=TensorProto.FLOAT)]
    inits = [onnx.numpy_helper.from_array(np.array([3, 1], I64), "big")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])]
    if shape_fed:
        inputs.append(helper.make_tensor_value_info("shape", TensorProto.INT64, [2]))
    else:
        inits.append(onnx.numpy_helper.from_array(np.array([1, 6], I64), "shape"))
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)


class _Recorder:
    def __init__(self) -> None:
        self.labels: list[str] = []

    def record_step(self, step, t0, t1, ins, outs) -> None:
        self.labels.append(step.label)


def test_model_of_inline_shape_kernels_matches_onnxruntime_on_every_path():
    ort = pytest.importorskip("onnxruntime")
    model = _model(shape_fed=False)
    x = randn(2, 3)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    sess = onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert all(st.inline_fn is not None for st in sess.plan.steps)  # every step takes the inline call
    for _ in range(3):  # first run (the loop), second (generated), third (the prepared session run)
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], want)
    recorder = _Recorder()
    interpreted = sess.plan.run({"x": x}, profiler=recorder)[0]  # the plain path: each compute
    assert recorder.labels == ["tr", "re", "ca", "ex", "co", "cb"]
    np.testing.assert_array_equal(interpreted, want)


def test_failing_inline_node_is_named_in_a_typed_error():
    sess = onnxhal.InferenceSession(_model(shape_fed=True).SerializeToString(), providers=["CPUExecutionProvider"])
    x, good, bad = randn(2, 3), np.array([1, 6], I64), np.array([4, 4], I64)
    for _ in range(3):  # the error from the first run's loop, the generated function, the prepared run
        sess.run(None, {"x": x, "shape": good})
        with pytest.raises(InvalidArgument, match=r"Reshape node 're' on CPUExecutionProvider: .*\[3, 2\].* to \[4, 4\]"):
            sess.run(None, {"x": x, "shape": bad})


def test_classes_declare_inline_apply():
    for cls in (shape_ops.Reshape, shape_ops.Transpose, shape_ops.Concat, shape_ops.Expand, cast.Cast):
        assert cls.inline_fn is INLINE_APPLY, cls
