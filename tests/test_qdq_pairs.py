"""QuantizeLinear -> DequantizeLinear pairs on one scale and zero point (``optimizer/qdq_pairs.py``):
the ``com.onnxhal`` QuantizeDequantize kernel against the plain pair of kernels, bit for bit, on
random and edge inputs; the pairs dropped where their input already lies on their grid, and what
keeps a pair; each model against onnxruntime side by side."""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxhal
from onnxhal.hal.graph import Node
from onnxhal.runtime.providers.cpu.kernels.quantize import QuantizeDequantize

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

_TYPES = {np.uint8: TensorProto.UINT8, np.int8: TensorProto.INT8, np.uint16: TensorProto.UINT16,
          np.int16: TensorProto.INT16}


def _kernel(axis: int = 1) -> QuantizeDequantize:
    attrs = [helper.make_attribute("axis", axis)]
    return QuantizeDequantize(Node("QuantizeDequantize", ["x", "s", "z"], ["y"], domain="com.onnxhal",
                                   attribute_protos=attrs), None)


def _edge_values(scale: float, zp: int, dtype: type) -> np.ndarray:
    """Ties at every code near 0 and at the saturation bounds, just past them, NaN, infinities,
    signed zeros, tiny and huge values."""
    info = np.iinfo(dtype)
    codes = np.array([-3, -2, -1, 0, 1, 2, 3, info.min - zp, info.max - zp, info.min - zp - 1, info.max - zp + 1],
                     np.float64)
    ties = np.concatenate([codes + 0.5, codes - 0.5, codes, codes + 0.4999, codes - 0.5001]) * scale
    special = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 1e30, -1e30, 3.4e38, -3.4e38]
    return np.concatenate([ties, special]).astype(np.float32)


@pytest.mark.parametrize("dtype", list(_TYPES))
@pytest.mark.parametrize("scale", [0.02, 1.0, 3.7e-3, 1e-39, np.inf, -0.5])
def test_quantize_dequantize_equals_the_pair_per_tensor(dtype, scale):
    """Bit for bit (signed zeros, NaN's code, saturation, ties to even), every zero point kind."""
    rng = np.random.default_rng(0)
    info = np.iinfo(dtype)
    kernel = _kernel()
    for zp in sorted({0, 3, info.min, info.max, (info.min + info.max) // 2}):
        s, z = np.array(scale, np.float32), np.array(zp, dtype)
        for x in (_edge_values(scale if np.isfinite(scale) else 1.0, zp, dtype),
                  (rng.standard_normal((2, 3, 5, 7)) * 80 * abs(scale if np.isfinite(scale) else 1.0)).astype(np.float32),
                  rng.standard_normal(()).astype(np.float32)):
            got, want = kernel.compute([x, s, z])[0], kernel.pair([x, s, z])[0]
            assert got.dtype == want.dtype == np.float32 and got.shape == want.shape
            np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32), err_msg=f"zp {zp}")


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("axis", [1, -1, 0])
def test_quantize_dequantize_equals_the_pair_per_axis(dtype, axis):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((4, 6, 5)) * 30).astype(np.float32)
    x[0, 0, :3] = [np.nan, np.inf, -0.0]
    n = x.shape[axis]
    s = rng.uniform(0.01, 0.5, n).astype(np.float32)
    info = np.iinfo(dtype)
    z = rng.integers(info.min, info.max + 1, n).astype(dtype)
    kernel = _kernel(axis)
    got, want = kernel.compute([x, s, z])[0], kernel.pair([x, s, z])[0]
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))


def test_quantize_dequantize_takes_the_pair_for_other_forms():
    """float16 scales and inputs: the pair's own kernels (the canonical form), same values."""
    x = np.linspace(-3, 3, 12).astype(np.float16)
    s, z = np.array(0.1, np.float16), np.array(2, np.int8)
    kernel = _kernel()
    got = kernel.compute([x, s, z])[0]
    np.testing.assert_array_equal(got, kernel.pair([x, s, z])[0])
    assert got.dtype == np.float16


def _model(nodes: list, inits: list, out_shape: list, opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "qdq_pairs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _qdq(x: str, y: str, s: str, z: str, tag: str) -> list:
    return [helper.make_node("QuantizeLinear", [x, s, z], [f"{tag}_q"], name=f"{tag}_Q"),
            helper.make_node("DequantizeLinear", [f"{tag}_q", s, z], [y], name=f"{tag}_DQ")]


def _params(dtype: type = np.int8, scale: float = 0.05, zp: int = 3, second_scale: float | None = None) -> list:
    return [numpy_helper.from_array(np.array(scale, np.float32), "s"), numpy_helper.from_array(np.array(zp, dtype), "z"),
            numpy_helper.from_array(np.array(second_scale or scale, np.float32), "s2"),
            numpy_helper.from_array(np.array(zp, dtype), "z2"),
            numpy_helper.from_array(np.array([0, 2, 3, 1], np.int64), "shape_perm")]


def _pool_chain(pool: dict | None = None, **params) -> onnx.ModelProto:
    """x -> Q/DQ -> MaxPool -> Q/DQ -> Transpose -> Q/DQ -> Relu -> y: the last two pairs re-quantize
    values already on their grid (when the second pair's parameters equal the first's)."""
    pool = pool or {"kernel_shape": [2, 2], "strides": [2, 2]}
    nodes = [*_qdq("x", "a", "s", "z", "in"),
             helper.make_node("MaxPool", ["a"], ["p"], **pool),
             *_qdq("p", "pd", "s2", "z2", "pool"),
             helper.make_node("Transpose", ["pd"], ["t"], perm=[0, 2, 3, 1]),
             *_qdq("t", "td", "s2", "z2", "tr"),
             helper.make_node("Relu", ["td"], ["y"])]
    opset = 21 if params.get("dtype") in (np.int16, np.uint16) else 17  # (16-bit codes from opset 21)
    return _model(nodes, _params(**params), ["n", "h", "w", "c"], opset)


def _run_both(model: onnx.ModelProto, x: np.ndarray, level: str = "ORT_ENABLE_ALL") -> tuple:
    data = model.SerializeToString()
    so = onnxhal.SessionOptions()
    so.graph_optimization_level = getattr(onnxhal.GraphOptimizationLevel, level)
    sess = onnxhal.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    steps = re.findall(r"# step \d+: (\S+) ", sess.plan.explain())
    results = []
    for lvl in ("ORT_ENABLE_BASIC", "ORT_ENABLE_ALL"):
        o = ort.SessionOptions()
        o.graph_optimization_level = getattr(ort.GraphOptimizationLevel, lvl)
        results.append(ort.InferenceSession(data, o, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0])
    return steps, sess.run(None, {"x": x})[0], results


def _inputs() -> list[np.ndarray]:
    rng = np.random.default_rng(5)
    edge = np.zeros((2, 3, 8, 8), np.float32)
    edge.reshape(-1)[:8] = [np.nan, np.inf, -np.inf, -0.0, 1e30, -1e30, 0.025, 0.075]  # ties of scale 0.05
    return [(rng.standard_normal((2, 3, 8, 8)) * 4).astype(np.float32), edge]


@pytest.mark.parametrize("dtype, zp", [(np.int8, 3), (np.uint8, 128), (np.uint8, 0), (np.int16, -7)])
def test_requantizing_pairs_are_dropped_and_the_rest_collapsed(dtype, zp):
    steps, _, _ = _run_both(_pool_chain(dtype=dtype, zp=zp), _inputs()[0])
    assert steps == ["QuantizeDequantize", "MaxPool", "Transpose", "Relu"], steps
    for x in _inputs():
        _, got, (basic, full) = _run_both(_pool_chain(dtype=dtype, zp=zp), x)
        np.testing.assert_array_equal(got, basic)
        np.testing.assert_array_equal(got, full)


@pytest.mark.parametrize("case", ["other scale", "ceil mode", "dilated", "subnormal scale"])
def test_pairs_off_their_input_grid_are_kept(case):
    """Where a pair could change its input's values it stays (collapsed, not dropped)."""
    pool = {"kernel_shape": [2, 2], "strides": [2, 2]}
    params: dict = {}
    if case == "other scale":
        params = {"second_scale": 0.07}
    elif case == "ceil mode":
        pool["ceil_mode"] = 1
    elif case == "dilated":
        pool["dilations"] = [2, 2]
    else:
        params = {"scale": 1e-39}
    model = _pool_chain(pool, **params)
    steps, _, _ = _run_both(model, _inputs()[0])
    # the pool's pair stays; the Transpose's is on the pool pair's grid (dropped) unless no grid is exact
    assert steps.count("QuantizeDequantize") == (3 if case == "subnormal scale" else 2), steps
    for x in _inputs():
        _, got, (basic, full) = _run_both(model, x)
        np.testing.assert_array_equal(got, basic)
        np.testing.assert_array_equal(got, full)


def test_a_pair_whose_codes_are_read_elsewhere_is_kept():
    nodes = [*_qdq("x", "a", "s", "z", "in"), helper.make_node("Cast", ["in_q"], ["c"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["a", "c"], ["y"])]
    model = _model(nodes, _params(), [2, 3, 8, 8])
    for x in _inputs():
        steps, got, (basic, full) = _run_both(model, x)
        assert steps.count("QuantizeLinear") == 1 and steps.count("DequantizeLinear") == 1, steps
        np.testing.assert_array_equal(got, basic)


def test_disabled_below_the_extended_level():
    steps, _, _ = _run_both(_pool_chain(), _inputs()[0], level="ORT_ENABLE_BASIC")
    assert steps.count("QuantizeLinear") == 3 and "QuantizeDequantize" not in steps


@pytest.mark.parametrize("op", ["QuantizeLinear", "DequantizeLinear", "QuantizeDequantize"])
def test_kept_operands_follow_the_scale_zero_point_and_type(op):
    """The per-tensor kernels keep their checked operands between runs: a run with other scales,
    zero points, code types or a per-axis scale on the same kernel gives what a fresh kernel gives."""
    from onnxhal.runtime.providers.cpu.kernels import quantize

    rng = np.random.default_rng(8)
    domain = "com.onnxhal" if op == "QuantizeDequantize" else ""

    def kernel():
        return getattr(quantize, op)(Node(op, ["x", "s", "z"], ["y"], domain=domain), None)

    kept = kernel()
    x = (rng.standard_normal((4, 3)) * 5).astype(np.float32)
    runs = [(np.array(0.05, np.float32), np.array(3, np.int8)), (np.array(0.05, np.float32), np.array(3, np.uint8)),
            (np.array(0.1, np.float32), np.array(3, np.uint8)), (np.array([0.1, 0.2, 0.3], np.float32),
                                                                 np.array([1, 2, 3], np.uint8))]
    for s, z in runs + runs[:1]:
        arg = x if op != "DequantizeLinear" else rng.integers(0, 100, (4, 3)).astype(z.dtype)
        for _ in range(2):  # the second run reads the kept operands
            np.testing.assert_array_equal(kept.compute([arg, s, z])[0], kernel().compute([arg, s, z])[0])
        if op == "DequantizeLinear":
            np.testing.assert_array_equal(kept.compute([arg.astype(np.int32), s, None])[0],
                                          kernel().compute([arg.astype(np.int32), s, None])[0])
