"""MaxPool's 2-D C path for small planes (``native_2d``: ``_native.max_pool_2d``, a row buffer padded
with -inf, then per column phase) against the plain kernel (the switch off: the gather plan; the C
kernels off: the separable np.maximum passes) bit for bit, NaN included, and against onnxruntime on
NaN-free inputs: onnxruntime's MLAS max does not keep NaN (a NaN at a window's first tap is dropped,
one elsewhere may be kept or not, by position), so the plain kernel's numpy semantics are the
reference for NaN; and the inputs its condition leaves out."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

from onnxhal.hal import Node
from onnxhal.runtime.providers.cpu.kernels import pooling
from onnxhal.runtime.providers.cpu.kernels.native_kernels import native_module
from tests.models import make, vi

pytestmark = pytest.mark.skipif(native_module() is None or not hasattr(native_module(), "max_pool_2d"),
                                reason="the CPU EP's C kernels are not built")

# (input shape, attributes): the corpus's small pools (GoogLeNet's, SqueezeNet's, VGG's), then
# strides 3, dilations, asymmetric pads, ceil_mode, a 1x1 plane and windows of padding alone
CASES = [
    ((1, 24, 4, 4), dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], ceil_mode=1)),
    ((2, 6, 2, 2), dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], ceil_mode=1)),
    ((1, 5, 1, 1), dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], ceil_mode=1)),
    ((1, 7, 4, 4), dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    ((1, 8, 3, 3), dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    ((2, 8, 4, 4), dict(kernel_shape=[2, 2], strides=[2, 2])),
    ((1, 3, 7, 9), dict(kernel_shape=[3, 2], strides=[3, 3], pads=[1, 0, 2, 1])),
    ((1, 3, 6, 7), dict(kernel_shape=[2, 3], dilations=[2, 2], pads=[1, 2, 1, 0])),
    ((1, 2, 5, 6), dict(kernel_shape=[2, 4], strides=[1, 2], pads=[0, 3, 0, 3], ceil_mode=1)),
    ((1, 2, 2, 9), dict(kernel_shape=[5, 1], strides=[1, 1], pads=[2, 0, 2, 0])),
    ((1, 1, 3, 3), dict(kernel_shape=[2, 2], dilations=[4, 4], pads=[1, 1, 1, 1])),  # padding alone
]


def _kernel(attrs, outputs=("y",)):
    node = Node("MaxPool", ["x"], list(outputs), attribute_protos=[helper.make_attribute(k, v) for k, v in attrs.items()])
    node.since_version = 12
    return pooling.MaxPool(node, None)


def _input(shape, dtype, seed, nan=True):
    x = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    if nan:
        x.reshape(-1)[3:: 13] = np.nan  # np.maximum keeps NaN; so must the C kernel
        x.reshape(-1)[5:: 11] = -np.inf
    return x


def _plain(attrs, x, monkeypatch):
    """The switch off (the gather plan) and the C kernels off (the separable passes)."""
    with monkeypatch.context() as m:
        m.setattr(pooling, "NATIVE_2D_ENABLED", False)
        gathered = _kernel(attrs)
        y = gathered.compute([x])[0]
        assert gathered.last_path != pooling.MAX_POOL_NATIVE_2D
    separable = _kernel(attrs)
    separable._native = None
    np.testing.assert_array_equal(separable.compute([x])[0], y)
    assert separable.last_path == ""
    return y


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_native_2d_matches_plain_and_onnxruntime(case, dtype, monkeypatch):
    shape, attrs = CASES[case]
    x = _input(shape, dtype, case)
    kernel = _kernel(attrs)
    y = kernel.compute([x])[0]
    assert kernel.last_path == pooling.MAX_POOL_NATIVE_2D == "native_2d"
    want = _plain(attrs, x, monkeypatch)
    assert y.shape == want.shape and y.dtype == dtype
    np.testing.assert_array_equal(y, want)
    if dtype != np.float32:
        return
    clean = _input(shape, dtype, case, nan=False)
    model = make([helper.make_node("MaxPool", ["x"], ["y"], **attrs)], [vi("x", list(shape))], [vi("y", None)])
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": clean})[0]
    np.testing.assert_array_equal(kernel.compute([clean])[0], ref)


def test_nan_kept_where_onnxruntime_drops_it(monkeypatch):
    """A NaN at a window's first tap: numpy's maximum (the plain kernel) and native_2d give NaN."""
    attrs = dict(kernel_shape=[2, 2], strides=[2, 2])
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    x[0, 0, 0, 0] = np.nan
    y = _kernel(attrs).compute([x])[0]
    assert np.isnan(y[0, 0, 0, 0]) and np.array_equal(y[0, 0].reshape(-1)[1:], [7, 13, 15])
    np.testing.assert_array_equal(y, _plain(attrs, x, monkeypatch))


def test_inputs_outside_the_condition_keep_their_paths(monkeypatch):
    attrs = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    kernel = _kernel(attrs)
    kernel.compute([_input((1, 4, 8, 8), np.float32, 0)])  # 64 inputs a plane: the lifted passes
    assert kernel.last_path == pooling.MAX_POOL_NATIVE_LIFTED
    kernel.compute([_input((1, 4, 5, 5), np.float16, 0)])
    assert kernel.last_path == ""
    with_indices = _kernel(attrs, ("y", "i"))
    with_indices.compute([_input((1, 4, 5, 5), np.float32, 0)])
    assert with_indices.last_path == ""
    kernel.compute([_input((1, 4, 7, 9), np.float32, 0)[..., ::2]])  # a view: copied contiguous first
    assert kernel.last_path == pooling.MAX_POOL_NATIVE_2D
    monkeypatch.setenv("ONNXHAL_NATIVE_KERNELS", "0")
    off = _kernel(attrs)
    off.compute([_input((1, 4, 5, 5), np.float32, 0)])
    assert off.last_path == ""


def test_bad_arguments_are_named():
    native = native_module()
    x = np.zeros((1, 2, 4, 4), np.float32)
    with pytest.raises(ValueError, match="max_pool_2d: x must be"):
        native.max_pool_2d(x[0], np.zeros((1, 2, 2, 2), np.float32), (2, 2), (2, 2), (0, 0), (1, 1))
    with pytest.raises(ValueError, match="y: expected"):
        native.max_pool_2d(x, np.zeros((1, 2, 2, 2), np.float64), (2, 2), (2, 2), (0, 0), (1, 1))
    with pytest.raises(ValueError, match="y must be"):
        native.max_pool_2d(x, np.zeros((1, 3, 2, 2), np.float32), (2, 2), (2, 2), (0, 0), (1, 1))
    with pytest.raises(ValueError, match="at least 1"):
        native.max_pool_2d(x, np.zeros((1, 2, 2, 2), np.float32), (2, 2), (0, 2), (0, 0), (1, 1))
