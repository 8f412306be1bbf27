"""QLinearMatMul (the QDQ MatMul groups the optimizer fuses, and the QOperator format's): constant
B less its zero point and the combined scale kept across runs, a 2-D B as one BLAS product over
A's batches; against the canonical form (``QLinearMatMul.plain``) bit for bit and onnxruntime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxhal
from onnxhal.hal.graph import Node
from onnxhal.runtime.providers.cpu.kernels.ms_quantized import QLinearMatMul

_TYPES = {np.int8: TensorProto.INT8, np.uint8: TensorProto.UINT8}


def _codes(rng: np.random.Generator, dtype: type, shape: tuple) -> np.ndarray:
    info = np.iinfo(dtype)
    c = rng.integers(info.min, info.max + 1, shape).astype(dtype)
    if c.size >= 4:
        c.reshape(-1)[:4] = [info.min, info.max, info.min, info.max]
    return c


def _case(rng, a_type, b_type, a_shape, b_shape, per_column, y_scale):
    a_info, b_info = np.iinfo(a_type), np.iinfo(b_type)
    n = b_shape[-1]
    b_scale = (rng.uniform(0.002, 0.02, n) if per_column else np.array(0.01)).astype(np.float32)
    b_zp = (np.zeros(n, b_type) if per_column else np.array(b_info.min if b_type is np.uint8 else 0, b_type))
    return {"a": _codes(rng, a_type, a_shape), "a_s": np.array(0.03, np.float32),
            "a_zp": np.array(a_info.max if a_type is np.uint8 else -3, a_type),
            "b": _codes(rng, b_type, b_shape), "b_s": b_scale, "b_zp": b_zp,
            "y_s": np.array(y_scale, np.float32), "y_zp": np.array(a_info.min + 5, a_type)}


_SHAPES = [((7, 32), (32, 16)), ((2, 12, 32), (32, 64)), ((2, 4, 12, 8), (2, 4, 8, 12)), ((3, 300), (300, 5))]


@pytest.mark.parametrize("types", [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)])
@pytest.mark.parametrize("shapes, per_column", [(s, False) for s in _SHAPES] +
                         [(s, True) for s in _SHAPES if len(s[1]) == 2])  # (per-column scales: a 2-D B)
@pytest.mark.parametrize("y_scale", [0.05, 0.0005])  # the second saturates most outputs
def test_qlinear_matmul_with_constant_weights_matches_onnxruntime(types, shapes, per_column, y_scale):
    rng = np.random.default_rng(11)
    case = _case(rng, *types, *shapes, per_column, y_scale)
    names = list(case)
    inits = [numpy_helper.from_array(case[k], k) for k in names if k != "a"]
    graph = helper.make_graph([helper.make_node("QLinearMatMul", names, ["y"])], "qmm",
                              [helper.make_tensor_value_info("a", _TYPES[types[0]], list(case["a"].shape))],
                              [helper.make_tensor_value_info("y", _TYPES[types[0]], None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10).SerializeToString()
    sess = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"])
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"a": case["a"]})[0]
    for _ in range(2):  # the second run reads the kept weights and scale
        np.testing.assert_array_equal(sess.run(None, {"a": case["a"]})[0], want)
    kernel = QLinearMatMul(Node("QLinearMatMul", names, ["y"]), None)
    inputs = [case[k] for k in names]
    np.testing.assert_array_equal(kernel.compute(inputs)[0], QLinearMatMul.plain(inputs))


def test_weights_fed_at_run_time_are_not_kept():
    """B as a graph input: each run reads its own B."""
    rng = np.random.default_rng(2)
    case = _case(rng, np.uint8, np.int8, (4, 16), (16, 8), False, 0.05)
    names = list(case)
    inits = [numpy_helper.from_array(case[k], k) for k in names if k not in ("a", "b")]
    graph = helper.make_graph([helper.make_node("QLinearMatMul", names, ["y"])], "qmm",
                              [helper.make_tensor_value_info("a", TensorProto.UINT8, [4, 16]),
                               helper.make_tensor_value_info("b", TensorProto.INT8, [16, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10).SerializeToString()
    sess = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"])
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for seed in range(3):
        b = _codes(np.random.default_rng(seed + 20), np.int8, (16, 8))
        np.testing.assert_array_equal(sess.run(None, {"a": case["a"], "b": b})[0],
                                      ref.run(None, {"a": case["a"], "b": b})[0])
