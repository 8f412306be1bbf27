"""GlobalAveragePool's and GlobalMaxPool's fast path (``pooling.flat_reduce``: one reduction over
each flattened plane of a C-contiguous float32/float64 input) against the canonical kernel (np.mean
or np.max over the spatial axes) on random and edge inputs, bit for bit, and against onnxruntime.
Inputs the condition leaves out (float16, strided views, empty planes) take the canonical path.
AveragePool's whole-window case, kept per input shape, against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

from onnxhal.hal import Node
from onnxhal.runtime.providers.cpu.kernels import pooling
from tests.models import make, vi

OPS = {"GlobalAveragePool": np.mean, "GlobalMaxPool": np.max}
SHAPES = [(2, 48, 8, 8), (1, 3, 1, 1), (2, 5, 7), (1, 4, 3, 5, 6), (3, 1, 57, 31), (2, 144, 2, 2)]


def _kernel(op: str):
    node = Node(op, ["x"], ["y"])
    node.since_version = 1
    return {"GlobalAveragePool": pooling.GlobalAveragePool, "GlobalMaxPool": pooling.GlobalMaxPool}[op](node, None)


def _input(shape, dtype, edge, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 3 + 1).astype(dtype)
    if edge:  # NaN, infinities, large and tiny magnitudes, exact cancellations
        flat = x.reshape(-1)
        flat[::7] = 1.0e30 if dtype == np.float32 else 1.0e300
        flat[1::7] = -flat[::7][: len(flat[1::7])]
        flat[2::11] = 1.0e-38
        flat[3::13] = np.inf
        flat[len(flat) // 2] = np.nan
    return x


def _ort(op, x):
    elem = helper.np_dtype_to_tensor_dtype(x.dtype)
    model = make([helper.make_node(op, ["x"], ["y"])], [vi("x", list(x.shape), elem)],
                 [vi("y", list(x.shape[:2]) + [1] * (x.ndim - 2), elem)], opset=17)
    model.ir_version = 10
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@pytest.mark.parametrize("edge", [False, True], ids=["random", "edge"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("op", sorted(OPS))
def test_flat_plane_matches_canonical_and_onnxruntime(op, shape, dtype, edge):
    x = _input(shape, dtype, edge, len(shape) * 10 + edge)
    kernel = _kernel(op)
    with np.errstate(invalid="ignore", over="ignore"):
        y = kernel.compute([x])[0]
        want = np.asarray(OPS[op](x, axis=tuple(range(2, x.ndim)), keepdims=True), dtype=dtype)
    assert kernel.last_path == "flat_plane"
    assert y.shape == want.shape and y.dtype == dtype
    np.testing.assert_array_equal(y, want)  # the same sums in the same order: bit for bit, NaN where NaN
    if dtype != np.float32:
        return  # onnxruntime's CPU EP has these pools for float32 alone
    ref = _ort(op, x)
    if op == "GlobalMaxPool":  # onnxruntime's max skips NaN where np.max (and onnx.reference) keep it
        clean = ~np.isnan(y)
        np.testing.assert_array_equal(y[clean], ref[clean])
        return
    # Sums in another order round (and cancel) differently: bounded by the mean of the magnitudes.
    with np.errstate(invalid="ignore", over="ignore"):
        mag = np.mean(np.abs(x.astype(np.float64)), axis=tuple(range(2, x.ndim)), keepdims=True)
    finite = np.isfinite(mag)
    assert np.array_equal(np.isnan(y), np.isnan(ref))
    assert np.all(np.abs(y[finite].astype(np.float64) - ref[finite]) <= 1e-6 * mag[finite] + 1e-6)


@pytest.mark.parametrize("op", sorted(OPS))
def test_inputs_outside_the_condition_take_the_canonical_path(op):
    rng = np.random.default_rng(1)
    kernel = _kernel(op)
    for x in (rng.standard_normal((2, 4, 6, 6)).astype(np.float16),
              rng.standard_normal((2, 4, 6, 12)).astype(np.float32)[..., ::2],
              np.zeros((0, 4, 3, 3), np.float32)):
        y = kernel.compute([x])[0]
        assert kernel.last_path == "canonical"
        want = np.asarray(OPS[op](x, axis=(2, 3), keepdims=True), dtype=x.dtype) if x.size else y
        np.testing.assert_array_equal(y, want)


def test_average_pool_whole_window_kept_per_shape():
    """An AveragePool whose window is the whole input (a video network's closing 2x2x2 pool) keeps
    that per input shape: the same kernel on an input its window no longer covers whole pools
    windows again, and back; each run matches onnxruntime."""
    attrs = dict(kernel_shape=[2, 2, 2])
    node = Node("AveragePool", ["x"], ["y"], attribute_protos=[helper.make_attribute(k, v) for k, v in attrs.items()])
    node.since_version = 19
    kernel = pooling.AveragePool(node, None)
    model = make([helper.make_node("AveragePool", ["x"], ["y"], **attrs)], [vi("x", ["n", "c", "t", "h", "w"])],
                 [vi("y", None)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for seed, shape in enumerate([(1, 6, 2, 2, 2), (1, 6, 4, 4, 2), (1, 6, 2, 2, 2), (2, 3, 2, 2, 2)]):
        x = _input(shape, np.float32, False, seed)
        y = kernel.compute([x])[0]
        want = sess.run(None, {"x": x})[0]
        assert y.shape == want.shape and y.dtype == np.float32
        np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)
