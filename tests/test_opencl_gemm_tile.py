"""The OpenCL EP's rule ``gemm_wide_tile`` (runtime/providers/opencl/fusion_rules.py): GEMM work-items of
8 rows x 32 columns (``gemm_packed_x2``, ``gemm_rowmajor_a_x2``) against the 16-column kernels (the rule
off) and onnxruntime's CPU EP: odd and even panel counts, rows past a block, batches, every bias mode,
alpha/beta, activations and residuals in the epilogue, packed and row-major A, Conv through im2col."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("pyopencl")

import onnxhal  # noqa: E402
from tests.opencl_support import require_opencl  # noqa: E402

OPENCL_INDEX = require_opencl(module_level=True)
RNG = np.random.default_rng(4748)
RULE = "gemm_wide_tile"


def _model(nodes, inputs: dict, weights: dict) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape)
                                           for k, v in inputs.items()],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def _f(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _kernels(sess) -> list[str]:
    return [s.kernel_name for p in sess.eps["OpenCLExecutionProvider"].compiled_plans for s in p.steps
            if hasattr(s, "kernel_name")]


def _check(nodes, inputs: dict, weights: dict, rtol: float = 1e-4, atol: float = 1e-4,
           base: str = "") -> tuple[list, list]:
    """Outputs with every rule (but those in ``base``) and with gemm_wide_tile off as well against
    onnxruntime and each other; the kernels of both plans."""
    data = _model(nodes, inputs, weights).SerializeToString()
    (want,) = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, inputs)
    got, kernels = [], []
    for disabled in (base, ",".join(filter(None, (base, RULE)))):
        sess = onnxhal.InferenceSession(data, providers=[("OpenCLExecutionProvider", {"disable_fusions": disabled}),
                                                         "CPUExecutionProvider"])
        assert set(sess.partition_summary) == {"OpenCLExecutionProvider"}, sess.partition_summary
        (y,) = sess.run(None, inputs)
        np.testing.assert_allclose(y, want, rtol=rtol, atol=atol, err_msg=f"disable_fusions={disabled!r}")
        got.append(y)
        kernels.append(_kernels(sess))
    np.testing.assert_allclose(got[0], got[1], rtol=1e-5, atol=1e-5, err_msg="wide tile against the 16-wide kernel")
    assert not any(k.endswith("_x2") for k in kernels[1] if k.startswith("gemm")), kernels[1]
    return kernels[0], kernels[1]


@pytest.mark.parametrize("m,k,n,wide", [
    (260, 24, 32, True),    # two panels, rows past the last 8-row block
    (13, 24, 32, False),    # two panels but 2 work-items: too few to halve (WIDE_TILE_MIN_ITEMS)
    (8, 40, 48, False),     # three panels: odd and under 9, one kernel each
    (61, 7, 144, True),     # nine panels: the last pair's second panel is recomputed, not stored
    (64, 200, 160, True),   # ten panels
    (5, 1, 33, False),      # K = 1; three panels, the last one column
    (3, 16, 16, False),     # one panel
])
def test_matmul_bias_relu(opencl, m, k, n, wide):
    nodes = [helper.make_node("MatMul", ["a", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    on, _ = _check(nodes, {"a": _f(m, k)}, {"w": _f(k, n, scale=0.2), "b": _f(n)})
    assert on == ["gemm_rowmajor_a_x2" if wide else "gemm_rowmajor_a"], on


@pytest.mark.parametrize("c_shape", [(1,), (128,), (110, 1), (110, 128)])
def test_gemm_transposed_with_alpha_beta_and_every_bias(opencl, c_shape):
    # transA packs A (gemm_packed_x2); C as a scalar, a row, a column and a full matrix.
    nodes = [helper.make_node("Gemm", ["a", "w", "c"], ["g"], transA=1, transB=1, alpha=0.7, beta=-1.3),
             helper.make_node("Sigmoid", ["g"], ["y"])]
    on, _ = _check(nodes, {"a": _f(30, 110)}, {"w": _f(128, 30, scale=0.2), "c": _f(*c_shape)})
    assert "gemm_packed_x2" in on, on


def test_batched_matmul_with_residual(opencl):
    # Both operands activations (B packed per run), batch 3, the residual Add in the epilogue.
    nodes = [helper.make_node("MatMul", ["a", "b"], ["mm"]), helper.make_node("Add", ["mm", "r"], ["y"])]
    on, _ = _check(nodes, {"a": _f(3, 48, 17), "b": _f(3, 17, 64), "r": _f(3, 48, 64)}, {})
    assert "gemm_rowmajor_a_x2" in on, on


def test_conv_through_im2col_with_tanh(opencl):
    # A 3x3 stride-2 Conv to a 7x7 map takes im2col + GEMM (49 columns, 4 panels), bias per output
    # channel, Tanh after; 80 output channels, not whole 32-channel blocks, so conv_lanes does not take it
    # (nor conv_flat, off here: 1.1 M multiply-adds would run as one conv_flat launch).
    data_nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
                  helper.make_node("Tanh", ["c"], ["y"])]
    on, off = _check(data_nodes, {"x": _f(2, 16, 14, 14)}, {"w": _f(80, 16, 3, 3, scale=0.1), "b": _f(80)},
                     base="conv_flat")
    assert "gemm_packed_x2" in on and "gemm_packed" in off, (on, off)


def test_nan_and_infinity_stay_in_their_rows(opencl):
    a, w = _f(9, 12), _f(12, 64, scale=0.2)
    a[2, 3] = np.nan
    a[7, 0] = np.inf
    nodes = [helper.make_node("MatMul", ["a", "w"], ["y"])]
    data = _model(nodes, {"a": a}, {"w": w}).SerializeToString()
    (want,) = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"a": a})
    for disabled in ("", RULE):
        sess = onnxhal.InferenceSession(data, providers=[("OpenCLExecutionProvider", {"disable_fusions": disabled})])
        (y,) = sess.run(None, {"a": a})
        np.testing.assert_array_equal(np.isnan(y), np.isnan(want))
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
