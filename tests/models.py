"""Small models the tests build (ir_version 10 so onnxruntime accepts them too)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper


def make(nodes, inputs, outputs, inits=(), opset=17, **kw) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10, **kw)


def vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def add_mul_model() -> onnx.ModelProto:
    """y = ((x + 1) * 2) + x, on [2, 3] floats."""
    one = onnx.numpy_helper.from_array(np.ones(3, np.float32), "one")
    two = onnx.numpy_helper.from_array(np.full(3, 2, np.float32), "two")
    nodes = [helper.make_node("Add", ["x", "one"], ["a"], name="add1"),
             helper.make_node("Mul", ["a", "two"], ["m"], name="mul"),
             helper.make_node("Add", ["m", "x"], ["y"], name="add2")]
    return make(nodes, [vi("x", [2, 3])], [vi("y", [2, 3])], [one, two])


def add_mul_reference(x: np.ndarray) -> np.ndarray:
    return ((x + 1) * 2) + x


#: An input for ``add_mul_model``.
ADD_MUL_X = np.arange(6, dtype=np.float32).reshape(2, 3)


def assert_add_mul_runs(sess) -> None:
    """A session of ``add_mul_model`` gives the right answer on ``ADD_MUL_X`` (after a failed run,
    nothing is left broken)."""
    np.testing.assert_allclose(sess.run(None, {"x": ADD_MUL_X})[0], add_mul_reference(ADD_MUL_X))
