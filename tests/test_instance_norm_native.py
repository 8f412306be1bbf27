"""``normalization.INSTANCE_NORM_PATHS["native_channel_rows"]`` (each plane a row of
``_native.layer_norm``, then the channels' scale and shift) against InstanceNormalization's numpy
form and onnxruntime: 3-D to 5-D inputs, one plane value, offsets far above the spread; and its
condition: what it does not take (float16, float64, strided inputs, past the size limit) goes the
numpy way."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from onnxhal.hal import KernelCreateContext, Node
from onnxhal.ort_plugin.build import compiler
from onnxhal.runtime.providers.cpu.kernels import normalization
from onnxhal.runtime.providers.cpu.kernels.native_kernels import NATIVE_SWITCH

try:  # the extension itself (built where the install had a C compiler)
    from onnxhal.runtime.providers.cpu.kernels import _native
except ImportError:
    _native = None

# skipped only where no C compiler exists; where one does, a missing extension fails
# test_tree_native.py's test_the_extension_is_built_where_a_compiler_is
pytestmark = pytest.mark.skipif(_native is None and compiler() is None,
                                reason="no C compiler: the optional extension _native could not be built")

SHAPES = [(2, 4, 1024), (2, 4, 128), (1, 32, 16, 16), (2, 3, 5), (3, 2, 1), (1, 3, 2, 3, 4), (2, 5, 7, 9)]


def _kernel(eps: float = 1e-5) -> normalization.InstanceNormalization:
    node = Node("InstanceNormalization", ["x", "s", "b"], ["y"], attribute_protos=[helper.make_attribute("epsilon", eps)])
    node.since_version = 6
    return normalization.InstanceNormalization(node, KernelCreateContext())


def _inputs(shape, offset: float, dtype=np.float32) -> list:
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 2 + offset).astype(dtype)
    return [x, rng.standard_normal(shape[1]).astype(dtype), rng.standard_normal(shape[1]).astype(dtype)]


def _onnxruntime(inputs: list, eps: float) -> np.ndarray:
    elem = onnx.TensorProto.FLOAT
    graph = helper.make_graph([helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=eps)], "in",
                              [helper.make_tensor_value_info("x", elem, inputs[0].shape)],
                              [helper.make_tensor_value_info("y", elem, None)],
                              [numpy_helper.from_array(inputs[1], "s"), numpy_helper.from_array(inputs[2], "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": inputs[0]})[0]


def _truth(inputs: list, eps: float) -> np.ndarray:
    x, s, b = (a.astype(np.float64) for a in inputs)
    axes = tuple(range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    y = (x - x.mean(axis=axes, keepdims=True)) / np.sqrt(x.var(axis=axes, keepdims=True) + eps)
    return y * s.reshape(shape) + b.reshape(shape)


@pytest.mark.parametrize("offset", [0.0, 100.0])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_native_channel_rows_matches_numpy_and_onnxruntime(monkeypatch, shape, offset):
    monkeypatch.delenv(NATIVE_SWITCH, raising=False)
    inputs = _inputs(shape, offset)
    eps = 1e-3 if offset else 1e-5
    kernel = _kernel(eps)
    got = kernel.compute(inputs)[0]
    assert kernel.last_path == "native_channel_rows"
    assert got.dtype == np.float32 and got.shape == shape and got.flags.c_contiguous
    monkeypatch.setattr(normalization, "NATIVE_INSTANCE_NORM_ENABLED", False)
    want = kernel.compute(inputs)[0]
    assert kernel.last_path is None
    # float32 statistics (the numpy form's, onnxruntime's) lose digits at an offset of 100 (3e-5 to
    # 8e-5); the C ones are float64, within float32 rounding of the float64 truth
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got, _onnxruntime(inputs, eps), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got, _truth(inputs, eps), rtol=1e-6, atol=2e-6)


@pytest.mark.parametrize("case", ["float16", "float64", "strided", "large"])
def test_native_channel_rows_declines_what_it_does_not_take(monkeypatch, case):
    monkeypatch.delenv(NATIVE_SWITCH, raising=False)
    shape = (2, 4, 64)
    inputs = _inputs(shape, 1.0, {"float16": np.float16, "float64": np.float64}.get(case, np.float32))
    if case == "strided":
        inputs[0] = _inputs((2, 4, 128), 1.0)[0][:, :, ::2]
    if case == "large":
        monkeypatch.setattr(normalization, "NATIVE_INSTANCE_NORM_MAX", inputs[0].size - 1)
    kernel = _kernel()
    got = kernel.compute(inputs)[0]
    assert kernel.last_path is None
    np.testing.assert_allclose(got, _truth(inputs, 1e-5), rtol=1e-2 if case == "float16" else 1e-5, atol=1e-2 if case == "float16" else 1e-5)
