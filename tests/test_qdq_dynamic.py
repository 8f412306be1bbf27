"""``quantize_dynamic``'s DynamicQuantizeLinear -> MatMulIntegerToFloat pairs as com.microsoft
DynamicQuantizeMatMul (``optimizer/dynamic_quant_fusions.py``): the kernel against the pair's two
kernels bit for bit on random and edge inputs, the fused models against the unfused run and
onnxruntime."""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxhal
from onnxhal.hal.graph import Node
from onnxhal.runtime.providers.cpu.kernels.ms_quantized import DynamicQuantizeMatMul, MatMulIntegerToFloat
from onnxhal.runtime.providers.cpu.kernels.quantize import DynamicQuantizeLinear

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _inputs(rng: np.random.Generator, shape: tuple) -> list[np.ndarray]:
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    edge = x.copy()
    edge.reshape(-1)[:5] = [np.nan, 0.0, -0.0, 1e-30, 40.0]
    return [x, edge, np.zeros(shape, np.float32), np.full(shape, -2.5, np.float32), np.abs(x), -np.abs(x)]


@pytest.mark.parametrize("b_type", [np.int8, np.uint8])
@pytest.mark.parametrize("a_shape, k, n", [((6, 32), 32, 16), ((2, 12, 32), 32, 64), ((3, 300), 300, 5)])
@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_dynamic_quantize_matmul_equals_the_pair(b_type, a_shape, k, n, per_column, bias):
    rng = np.random.default_rng(4)
    info = np.iinfo(b_type)
    b = rng.integers(info.min, info.max + 1, (k, n)).astype(b_type)
    b_s = (rng.uniform(0.001, 0.02, n) if per_column else np.array(0.01)).astype(np.float32)
    b_zp = (rng.integers(info.min, info.max + 1, n) if per_column else np.array(info.min + 7)).astype(b_type)
    c = rng.standard_normal(n).astype(np.float32) if bias else None
    fused = DynamicQuantizeMatMul(Node("DynamicQuantizeMatMul", ["a", "b", "bs", "bz", "c"], ["y"], domain="com.microsoft"),
                                  None)
    dql = DynamicQuantizeLinear(Node("DynamicQuantizeLinear", ["a"], ["q", "s", "z"]), None)
    mitf = MatMulIntegerToFloat(Node("MatMulIntegerToFloat", ["q", "b", "s", "bs", "z", "bz", "c"], ["y"],
                                     domain="com.microsoft"), None)
    for a in _inputs(rng, a_shape):
        q, s, z = dql.compute([a])
        want = mitf.compute([q, b, s, b_s, z, b_zp] + ([c] if bias else []))[0]
        got = fused.compute([a, b, b_s, b_zp] + ([c] if bias else []))[0]
        assert got.dtype == want.dtype == np.float32
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def _model(shared: bool) -> onnx.ModelProto:
    """Two MatMuls (and a bias Add) as ``quantize_dynamic`` quantizes them; ``shared``: both read x,
    so one DynamicQuantizeLinear feeds both."""
    rng = np.random.default_rng(9)
    inits = [numpy_helper.from_array((rng.standard_normal((16, 24)) / 4).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal((24, 8)) / 4).astype(np.float32), "w2"),
             numpy_helper.from_array(rng.standard_normal(24).astype(np.float32), "b1"),
             numpy_helper.from_array((rng.standard_normal((16, 8)) / 4).astype(np.float32), "w3")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y1"])]
    if shared:
        nodes += [helper.make_node("MatMul", ["x", "w3"], ["y2"]), helper.make_node("Add", ["y1", "y2"], ["y"])]
    else:
        nodes += [helper.make_node("Identity", ["y1"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


@pytest.mark.parametrize("shared", [False, True])
def test_quantize_dynamic_matmuls_fuse_and_match_onnxruntime(tmp_path, shared):
    from onnxruntime.quantization import QuantType, quantize_dynamic

    src, dst = tmp_path / "mlp.onnx", tmp_path / "mlp_q.onnx"
    onnx.save(_model(shared), src)
    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8)
    data = onnx.load(dst).SerializeToString()
    x = (np.random.default_rng(1).standard_normal((5, 16)) * 2).astype(np.float32)
    runs = {}
    for level in ("ORT_ENABLE_BASIC", "ORT_ENABLE_ALL"):
        so = onnxhal.SessionOptions()
        so.graph_optimization_level = getattr(onnxhal.GraphOptimizationLevel, level)
        sess = onnxhal.InferenceSession(data, so, providers=["CPUExecutionProvider"])
        runs[level] = (re.findall(r"# step \d+: (\S+) ", sess.plan.explain()), sess.run(None, {"x": x})[0])
    steps = runs["ORT_ENABLE_ALL"][0]
    # the first product's input is x, read by one MatMul (fused) or by two (shared: kept)
    assert steps.count("DynamicQuantizeMatMul") == (1 if shared else 2), steps
    assert steps.count("DynamicQuantizeLinear") == (1 if shared else 0), steps
    np.testing.assert_array_equal(runs["ORT_ENABLE_ALL"][1], runs["ORT_ENABLE_BASIC"][1])
    for level in ("ORT_ENABLE_BASIC", "ORT_ENABLE_ALL"):
        o = ort.SessionOptions()
        o.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        want = ort.InferenceSession(data, o, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        np.testing.assert_allclose(runs["ORT_ENABLE_ALL"][1], want, rtol=1e-5, atol=1e-5)
