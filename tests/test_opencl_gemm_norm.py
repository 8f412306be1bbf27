"""The OpenCL EP's rule ``gemm_norm`` (runtime/providers/opencl/gemm_norm_fusion.py): a LayerNormalization,
or rule ``rms_norm``'s kernel, right after the row-major GEMM writing its input, computed by that GEMM's
launch (``gemm_rowmajor_a_norm``), against the two launches of the rule off and onnxruntime's CPU EP:
rows past a block, partial panels, the wide tile, bias and residual epilogues, the
GEMM's result also an output (pre-norm models read it again), LayerNorm without bias, both RMS forms,
and a row too long for the rule."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("pyopencl")

import onnxhal  # noqa: E402
from tests.opencl_support import require_opencl  # noqa: E402

OPENCL_INDEX = require_opencl(module_level=True)
RNG = np.random.default_rng(4749)
RULE = "gemm_norm"


def _f(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _model(nodes, inputs: dict, weights: dict, outputs: list[str]) -> bytes:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape)
                                           for k, v in inputs.items()],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
                              [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model.SerializeToString()


def _kernels(sess) -> list[str]:
    return [s.kernel_name for p in sess.eps["OpenCLExecutionProvider"].compiled_plans for s in p.steps
            if hasattr(s, "kernel_name")]


def _check(nodes, inputs: dict, weights: dict, outputs: list[str]) -> tuple[list[str], list[str]]:
    """Outputs with every rule and with gemm_norm off against onnxruntime and each other; the kernels
    of both plans."""
    data = _model(nodes, inputs, weights, outputs)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, inputs)
    got, kernels = [], []
    for disabled in ("", RULE):
        sess = onnxhal.InferenceSession(data, providers=[("OpenCLExecutionProvider", {"disable_fusions": disabled}),
                                                         "CPUExecutionProvider"])
        assert set(sess.partition_summary) == {"OpenCLExecutionProvider"}, sess.partition_summary
        ys = sess.run(None, inputs)
        for name, y, w in zip(outputs, ys, want):
            np.testing.assert_allclose(y, w, rtol=1e-4, atol=1e-4, err_msg=f"{name}, disable_fusions={disabled!r}")
        got.append(ys)
        kernels.append(_kernels(sess))
    for name, on, off in zip(outputs, *got):
        np.testing.assert_allclose(on, off, rtol=1e-5, atol=1e-5, err_msg=f"{name}: the rule on against off")
    assert "gemm_rowmajor_a_norm" not in kernels[1], kernels[1]
    return kernels[0], kernels[1]


def _residual_block() -> list:
    """s = a @ w + b + r: one GEMM with bias and residual in its epilogue."""
    return [helper.make_node("MatMul", ["a", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["mb"]),
            helper.make_node("Add", ["mb", "r"], ["s"])]


@pytest.mark.parametrize("m,k,n,gemm", [
    (24, 32, 32, "gemm_rowmajor_a"),    # a tiny transformer's hidden size: 3 row blocks, 2 panels
    (13, 40, 100, "gemm_rowmajor_a"),   # rows past the last block, a partial last panel
    (64, 16, 256, "gemm_rowmajor_a_x2"),  # 16 panels (MAX_PANELS), from the wide tile's launch
])
def test_residual_gemm_then_layernorm_is_one_launch(opencl, m, k, n, gemm):
    nodes = _residual_block() + [helper.make_node("LayerNormalization", ["s", "g", "beta"], ["y"], axis=-1,
                                                  epsilon=1e-5)]
    weights = {"w": _f(k, n, scale=0.2), "b": _f(n), "g": _f(n), "beta": _f(n)}
    on, off = _check(nodes, {"a": _f(m, k), "r": _f(m, n)}, weights, ["y"])
    assert on == ["gemm_rowmajor_a_norm"], on
    assert off == [gemm, "layernorm_rows"], off


def test_gemm_result_also_read_later_is_still_stored(opencl):
    """Pre-norm: the sum is the next block's residual (here a graph output) as well as the norm's input."""
    nodes = _residual_block() + [
        helper.make_node("LayerNormalization", ["s", "g"], ["y"], axis=-1, epsilon=1e-3),  # no bias input
        helper.make_node("Add", ["y", "s"], ["z"])]
    weights = {"w": _f(32, 64, scale=0.2), "b": _f(64), "g": _f(64)}
    on, _ = _check(nodes, {"a": _f(24, 32), "r": _f(24, 64)}, weights, ["s", "y", "z"])
    assert on[0] == "gemm_rowmajor_a_norm", on


@pytest.mark.parametrize("divide", [False, True])
def test_residual_gemm_then_rms_norm_is_one_launch(opencl, divide):
    """T5's LayerNorm as exported (rule rms_norm's kernel), x * (1 / sqrt(mean(x^2) + eps)) * weight or
    x / sqrt(...) * weight."""
    nodes = _residual_block() + [
        helper.make_node("Pow", ["s", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1], keepdims=1),
        helper.make_node("Add", ["ms", "eps"], ["me"]), helper.make_node("Sqrt", ["me"], ["rt"])]
    if divide:
        nodes.append(helper.make_node("Div", ["s", "rt"], ["nx"]))
    else:
        nodes += [helper.make_node("Reciprocal", ["rt"], ["inv"]), helper.make_node("Mul", ["s", "inv"], ["nx"])]
    nodes.append(helper.make_node("Mul", ["nx", "g"], ["y"]))
    weights = {"w": _f(32, 48, scale=0.2), "b": _f(48), "g": _f(48), "two": np.array(2.0, np.float32),
               "eps": np.array(1e-6, np.float32)}
    on, off = _check(nodes, {"a": _f(20, 32), "r": _f(20, 48)}, weights, ["y"])
    assert on == ["gemm_rowmajor_a_norm"], on
    assert off == ["gemm_rowmajor_a", "rmsnorm_rows"], off


def test_rows_longer_than_max_panels_keep_two_launches(opencl):
    """17 panels: a work-item would walk more than a work-group of the plain GEMM does."""
    nodes = _residual_block() + [helper.make_node("LayerNormalization", ["s", "g", "beta"], ["y"], axis=-1)]
    n = 17 * 16
    weights = {"w": _f(16, n, scale=0.2), "b": _f(n), "g": _f(n), "beta": _f(n)}
    on, off = _check(nodes, {"a": _f(8, 16), "r": _f(8, n)}, weights, ["y"])
    assert on == off == ["gemm_rowmajor_a", "layernorm_rows"], (on, off)
