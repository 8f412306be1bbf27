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


def inferred_bytes(nodes, inputs, outputs, consts: dict) -> bytes:
    """``make``'s model with ``consts`` (name -> array) as its initializers, shapes inferred, serialized."""
    model = make(nodes, inputs, outputs, [onnx.numpy_helper.from_array(v, k) for k, v in consts.items()])
    return onnx.shape_inference.infer_shapes(model).SerializeToString()


def int64_vi(name, shape):
    return vi(name, shape, TensorProto.INT64)


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


def multi_output_model() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """One partition with two inputs and three outputs (Sub, then Relu / Neg / Sigmoid), and feeds."""
    nodes = [helper.make_node("Sub", ["x", "y"], ["a"], name="sub"),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Neg", ["a"], ["n"], name="neg"),
             helper.make_node("Sigmoid", ["a"], ["s"], name="sig")]
    model = make(nodes, [vi("x", [2, 3]), vi("y", [2, 3])], [vi("r", [2, 3]), vi("n", [2, 3]), vi("s", [2, 3])])
    rng = np.random.default_rng(5)
    return model, {k: rng.standard_normal((2, 3)).astype(np.float32) for k in ("x", "y")}


def multi_output_reordered(compiled: onnx.ModelProto) -> dict[str, onnx.ModelProto]:
    """``multi_output_model`` compiled (one EPContext node), changed two ways: "reordered" lists the
    node's inputs and outputs in another order; "unread" also drops the graph output 'n', so the node's
    middle output is read by nobody."""
    out = {}
    reordered = onnx.ModelProto()
    reordered.CopyFrom(compiled)
    n = next(n for n in reordered.graph.node if n.op_type == "EPContext")
    ins, outs = list(n.input), list(n.output)
    del n.input[:], n.output[:]
    n.input.extend(ins[::-1])
    n.output.extend(outs[2:] + outs[:2])
    out["reordered"] = reordered
    unread = onnx.ModelProto()
    unread.CopyFrom(compiled)
    dropped = [o for o in unread.graph.output if o.name == "n"]
    kept = [o for o in unread.graph.output if o.name != "n"]
    del unread.graph.output[:]
    unread.graph.output.extend(kept)
    unread.graph.value_info.extend(dropped)  # its type, which onnxruntime no longer learns from the outputs
    out["unread"] = unread
    return out
