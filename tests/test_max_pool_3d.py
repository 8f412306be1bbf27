"""MaxPool's 3-D C path (``native_3d``: ``_native.max_pool_3d``, each plane's windows reduced frames,
then rows, then columns) against the canonical kernel (the separable np.maximum passes, the C route
switched off) bit for bit, NaN included, and against onnxruntime, over pads, dilations, strides,
ceil_mode and windows of padding alone; the inputs its condition leaves out take the plain path."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

from onnxhal.hal import Node
from onnxhal.runtime.providers.cpu.kernels import pooling
from onnxhal.runtime.providers.cpu.kernels.native_kernels import native_module
from tests.models import make, vi

pytestmark = pytest.mark.skipif(native_module() is None or not hasattr(native_module(), "max_pool_3d"),
                                reason="the CPU EP's C kernels are not built")

# (input shape, attributes)
CASES = [
    ((1, 3, 4, 9, 9), dict(kernel_shape=[1, 3, 3], pads=[0, 1, 1, 0, 1, 1])),
    ((1, 2, 5, 11, 10), dict(kernel_shape=[1, 3, 3], strides=[1, 2, 2], pads=[0, 1, 1, 0, 1, 1])),
    ((2, 2, 5, 7, 9), dict(kernel_shape=[3, 3, 3], strides=[2, 2, 2], pads=[1, 1, 1, 1, 1, 1])),
    ((1, 3, 4, 6, 6), dict(kernel_shape=[3, 3, 3], pads=[1, 1, 1, 1, 1, 1])),
    ((1, 2, 5, 9, 8), dict(kernel_shape=[2, 2, 2], strides=[2, 2, 2])),
    ((1, 2, 5, 9, 8), dict(kernel_shape=[2, 3, 2], strides=[2, 2, 3], ceil_mode=1)),
    ((1, 2, 6, 8, 7), dict(kernel_shape=[2, 2, 3], dilations=[2, 1, 2], pads=[1, 0, 2, 0, 1, 1])),
    ((1, 2, 3, 4, 5), dict(kernel_shape=[3, 1, 1], strides=[1, 1, 1], pads=[1, 0, 0, 1, 0, 0])),
    ((1, 1, 2, 2, 2), dict(kernel_shape=[2, 2, 2], dilations=[3, 3, 3], pads=[1, 1, 1, 1, 1, 1])),  # padding alone
]


def _kernel(attrs, outputs=("y",)):
    node = Node("MaxPool", ["x"], list(outputs), attribute_protos=[helper.make_attribute(k, v) for k, v in attrs.items()])
    node.since_version = 12
    return pooling.MaxPool(node, None)


def _input(shape, dtype, seed):
    x = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    x.reshape(-1)[:: 17] = np.nan  # np.maximum keeps NaN; so must the C passes
    x.reshape(-1)[5:: 23] = -np.inf
    return x


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_native_3d_matches_canonical_and_onnxruntime(case, dtype):
    shape, attrs = CASES[case]
    x = _input(shape, dtype, case)
    kernel = _kernel(attrs)
    y = kernel.compute([x])[0]
    assert kernel.last_path == pooling.MAX_POOL_NATIVE_3D == "native_3d"
    plain = _kernel(attrs)
    plain._native = None  # the canonical separable passes
    want = plain.compute([x])[0]
    assert plain.last_path == ""
    assert y.shape == want.shape and y.dtype == dtype
    np.testing.assert_array_equal(y, want)
    if dtype != np.float32:
        return
    clean = np.nan_to_num(x, nan=-1.0)  # onnxruntime's max skips NaN
    y = kernel.compute([clean])[0]
    model = make([helper.make_node("MaxPool", ["x"], ["y"], **attrs)], [vi("x", list(shape))], [vi("y", None)])
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": clean})[0]
    np.testing.assert_array_equal(y, ref)


def test_inputs_outside_the_condition_take_the_plain_path(monkeypatch):
    monkeypatch.setattr(pooling, "NATIVE_2D_ENABLED", False)  # small 2-D planes: tests/test_max_pool_2d.py
    shape, attrs = CASES[2]
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    with_indices = _kernel(attrs, ("y", "i"))
    y, idx = with_indices.compute([x])
    assert with_indices.last_path == ""
    np.testing.assert_array_equal(y, _kernel(attrs).compute([x])[0])
    assert idx.dtype == np.int64
    for other in (x.astype(np.float16), x[:, :, 0]):  # float16; a 2-D pool of planes under the lifted path's size
        assert other.ndim == 5 or other[0, 0].size < pooling.NATIVE_LIFTED_MIN_PLANE
        kernel = _kernel(attrs if other.ndim == 5 else dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
        kernel.compute([other])
        assert kernel.last_path == ""
    strided = np.random.default_rng(4).standard_normal((1, 2, 5, 7, 18)).astype(np.float32)[..., ::2]
    kernel = _kernel(attrs)
    assert kernel.compute([strided])[0].shape == (1, 2, 3, 4, 5)
    assert kernel.last_path == "native_3d"  # a view is copied contiguous first


def test_switch_off_keeps_the_plain_path(monkeypatch):
    monkeypatch.setenv("ONNXHAL_NATIVE_KERNELS", "0")
    shape, attrs = CASES[0]
    kernel = _kernel(attrs)
    kernel.compute([np.zeros(shape, np.float32)])
    assert kernel.last_path == ""


def test_native_3d_plan_is_per_input_shape():
    """One kernel over shapes in turn (a dynamic frame axis), one of them with windows of padding
    alone: each run is the canonical pool of its own shape, the plan kept per shape."""
    attrs = dict(kernel_shape=[2, 2, 2], dilations=[3, 1, 1], pads=[1, 0, 0, 1, 0, 0])
    kernel, plain = _kernel(attrs), _kernel(attrs)
    plain._native = None
    for seed, shape in enumerate([(1, 2, 2, 3, 3), (1, 2, 6, 4, 3), (1, 2, 2, 3, 3), (1, 2, 6, 4, 3)]):
        x = _input(shape, np.float32, seed)
        y = kernel.compute([x])[0]
        assert kernel.last_path == "native_3d"
        np.testing.assert_array_equal(y, plain.compute([x])[0])


# 2-D and 1-D pools through the 3-D C passes (``native_lifted``): (input shape, attributes)
LIFTED = [
    ((2, 8, 16, 16), dict(kernel_shape=[2, 2], strides=[2, 2])),
    ((1, 3, 11, 10), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ((1, 2, 9, 12), dict(kernel_shape=[3, 2], strides=[2, 3], ceil_mode=1)),
    ((1, 2, 10, 9), dict(kernel_shape=[2, 3], dilations=[2, 1], pads=[1, 2, 0, 1])),
    ((1, 2, 8, 8), dict(kernel_shape=[5, 5], pads=[2, 2, 2, 2])),
    ((2, 3, 70), dict(kernel_shape=[3], strides=[2], pads=[1, 1])),
    ((1, 1, 8, 8), dict(kernel_shape=[2, 2], dilations=[9, 9], pads=[1, 1, 1, 1])),  # padding alone
]


@pytest.mark.parametrize("case", range(len(LIFTED)))
def test_native_lifted_matches_canonical_and_onnxruntime(case):
    shape, attrs = LIFTED[case]
    x = _input(shape, np.float32, case)
    kernel, plain = _kernel(attrs), _kernel(attrs)
    plain._native = None
    y = kernel.compute([x])[0]
    assert kernel.last_path == pooling.MAX_POOL_NATIVE_LIFTED == "native_lifted"
    want = plain.compute([x])[0]
    assert plain.last_path == "" and y.shape == want.shape
    np.testing.assert_array_equal(y, want)
    clean = np.nan_to_num(x, nan=-1.0)  # onnxruntime's max skips NaN
    model = make([helper.make_node("MaxPool", ["x"], ["y"], **attrs)], [vi("x", list(shape))], [vi("y", None)])
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": clean})[0]
    np.testing.assert_array_equal(kernel.compute([clean])[0], ref)


def test_small_planes_keep_the_gather_plan(monkeypatch):
    monkeypatch.setattr(pooling, "NATIVE_2D_ENABLED", False)  # with it: native_2d (tests/test_max_pool_2d.py)
    attrs = dict(kernel_shape=[2, 2], strides=[2, 2])
    kernel = _kernel(attrs)
    x = _input((2, 64, 4, 4), np.float32, 0)  # 16 inputs a plane
    kernel.compute([x])
    assert kernel.last_path == ""
    kernel.compute([_input((2, 4, 8, 8), np.float32, 1)])  # 64 a plane: lifted
    assert kernel.last_path == "native_lifted"
