"""Element-wise chains over 8-bit quantized values as a table lookup (``optimizer/qdq_tables.py``,
``com.onnxhal`` GridTable): each tabulated op against its own CPU kernel on grid values, bit for
bit, at sizes that take numpy's vector loops and their tails; QDQ GELUs against onnxruntime."""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxhal
from onnxhal.hal.graph import Graph, Node
from onnxhal.runtime.optimizer.cleanup import evaluate_node
from onnxhal.runtime.optimizer.qdq_tables import TABULATED
from onnxhal.runtime.providers.cpu.kernels.quantize import GridTable

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

#: The constant operand of each binary op (right, and for Div and Pow also left of the value).
_OPERANDS = {"Add": 1.5, "Sub": 0.75, "Mul": 0.5, "Div": 1.4142135, "Pow": 3.0}


def _graph(opset: int = 21) -> Graph:
    return Graph.from_proto(helper.make_graph([], "g", [], []), {"": opset})


def _plain(op: str, x: np.ndarray, left: bool = False) -> np.ndarray:
    """The op's CPU kernel (as constant folding runs it) on x."""
    graph = _graph()
    if op in _OPERANDS:
        c = np.array(_OPERANDS[op], np.float32)
        inputs, values = (["c", "x"], [c, x]) if left else (["x", "c"], [x, c])
    else:
        inputs, values = ["x"], [x]
    return evaluate_node(graph, Node(op, inputs, ["y"], owner=graph), values)[0]


def _grid(dtype: type, scale: float, zp: int, shape: tuple, rng: np.random.Generator) -> np.ndarray:
    info = np.iinfo(dtype)
    codes = rng.integers(info.min, info.max + 1, shape).astype(dtype)
    if codes.size >= 2:
        codes.reshape(-1)[:2] = [info.min, info.max]
    return np.multiply(np.subtract(codes, np.array(zp, dtype), dtype=np.int32), np.float32(scale), dtype=np.float32)


@pytest.mark.parametrize("op", sorted(TABULATED))
@pytest.mark.parametrize("dtype, scale, zp", [(np.int8, 0.05, 3), (np.uint8, 0.013, 128), (np.uint8, 0.2, 0),
                                              (np.int8, 1.7e-3, -128)])
def test_grid_table_equals_the_kernel(op, dtype, scale, zp):
    rng = np.random.default_rng(7)
    info = np.iinfo(dtype)
    values = np.multiply(np.subtract(np.arange(info.min, info.max + 1).astype(dtype), np.array(zp, dtype),
                                     dtype=np.int32), np.float32(scale), dtype=np.float32)
    kernel = GridTable(Node("GridTable", ["x", "s", "z", "t"], ["y"], domain="com.onnxhal"), None)
    s, z = np.array([scale], np.float32), np.array([zp], dtype)
    for left in ((False, True) if op in ("Div", "Pow", "Sub") else (False,)):
        table = _plain(op, values, left)
        for shape in [(), (1,), (7,), (3, 5, 17), (2, 12, 64), (70001,)]:
            x = _grid(dtype, scale, zp, shape, rng)
            got = kernel.compute([x, s, z, table])[0]
            want = _plain(op, x, left)
            assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype, got.shape)
            np.testing.assert_array_equal(got.view(np.uint32) if got.dtype == np.float32 else got,
                                          want.view(np.uint32) if want.dtype == np.float32 else want,
                                          err_msg=f"{op} {shape} left={left}")


def _gelu_model(kind: str, dtype: int) -> onnx.ModelProto:
    """x -> Q/DQ -> GELU -> Q/DQ -> y, GELU as exporters write it: the Erf form (BERT) or the tanh
    form (GPT-2), the float ops between the pairs as quantize_static leaves them."""
    np_type = {TensorProto.INT8: np.int8, TensorProto.UINT8: np.uint8}[dtype]
    zp = 0 if np_type is np.int8 else 128
    inits = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in
             [("s", 0.03), ("so", 0.02), ("sqrt2", 1.4142135), ("one", 1.0), ("half", 0.5), ("three", 3.0),
              ("k", 0.044715), ("c", 0.7978846)]]
    inits += [numpy_helper.from_array(np.array(zp, np_type), n) for n in ("z", "zo")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"])]
    if kind == "erf":
        nodes += [helper.make_node("Div", ["xd", "sqrt2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
                  helper.make_node("Add", ["e", "one"], ["e1"])]
    else:
        nodes += [helper.make_node("Pow", ["xd", "three"], ["p"]), helper.make_node("Mul", ["p", "k"], ["pk"]),
                  helper.make_node("Add", ["xd", "pk"], ["inner"]), helper.make_node("Mul", ["inner", "c"], ["ic"]),
                  helper.make_node("Tanh", ["ic"], ["t"]), helper.make_node("Add", ["t", "one"], ["e1"])]
    nodes += [helper.make_node("Mul", ["xd", "e1"], ["m"]), helper.make_node("Mul", ["m", "half"], ["g"]),
              helper.make_node("QuantizeLinear", ["g", "so", "zo"], ["gq"]),
              helper.make_node("DequantizeLinear", ["gq", "so", "zo"], ["y"])]
    graph = helper.make_graph(nodes, "gelu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16, 64])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


@pytest.mark.parametrize("kind", ["erf", "tanh"])
@pytest.mark.parametrize("dtype", [TensorProto.INT8, TensorProto.UINT8])
def test_qdq_gelu_chains_are_tables_and_match_onnxruntime(kind, dtype):
    model = _gelu_model(kind, dtype).SerializeToString()
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((2, 16, 64)) * 2).astype(np.float32)
    x.reshape(-1)[:4] = [np.nan, np.inf, -np.inf, 1e30]
    got = {}
    for level in ("ORT_ENABLE_BASIC", "ORT_ENABLE_ALL"):
        so = onnxhal.SessionOptions()
        so.graph_optimization_level = getattr(onnxhal.GraphOptimizationLevel, level)
        sess = onnxhal.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        got[level] = (re.findall(r"# step \d+: (\S+) ", sess.plan.explain()), sess.run(None, {"x": x})[0])
    steps = got["ORT_ENABLE_ALL"][0]
    assert "GridTable" in steps and "Erf" not in steps and "Tanh" not in steps, steps
    assert "GridTable" not in got["ORT_ENABLE_BASIC"][0]
    # the table is the plain kernels' values: the basic level's run, bit for bit
    np.testing.assert_array_equal(got["ORT_ENABLE_ALL"][1], got["ORT_ENABLE_BASIC"][1])
    for level in ("ORT_ENABLE_BASIC", "ORT_ENABLE_ALL"):
        o = ort.SessionOptions()
        o.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        want = ort.InferenceSession(model, o, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        # within one output code of onnxruntime's (its Erf and tanh differ by float32 ulps)
        assert np.abs(got["ORT_ENABLE_ALL"][1] - want).max() <= 0.02 * 1.0001
        assert np.mean(got["ORT_ENABLE_ALL"][1] == want) > 0.99


def test_a_cheap_chain_is_left_and_a_value_off_the_grid_is_not_tabulated():
    inits = [numpy_helper.from_array(np.array(0.03, np.float32), "s"), numpy_helper.from_array(np.array(1, np.int8), "z"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             helper.make_node("Mul", ["xd", "two"], ["m"]),  # cheap alone: left
             helper.make_node("Add", ["m", "x"], ["a"]),  # reads x too: the chain ends at the Mul
             helper.make_node("Tanh", ["a"], ["y"])]  # off the grid
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10).SerializeToString()
    so = onnxhal.SessionOptions()  # the Mul, Add and Tanh left as nodes (no ElementwiseChain over them)
    so.add_session_config_entry("optimization.disable_passes", "fuse_elementwise_chains")
    sess = onnxhal.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    steps = re.findall(r"# step \d+: (\S+) ", sess.plan.explain())
    assert "GridTable" not in steps and "Tanh" in steps, steps
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-6, atol=1e-6)
