"""ReduceLogSumExp's path ``native_rows`` (``reduction.LOGSUMEXP_PATHS``): a float32 reduction over
the last axis in one C pass. Held to the canonical ``numpy_shifted`` form within float32 rounding
and to onnxruntime; rows with NaN, +inf or only -inf, other axes and other types stay canonical."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from onnxhal.runtime.providers.cpu.kernel_factory import create_cpu_kernel
from onnxhal.runtime.providers.cpu.kernels import reduction
from onnxhal.runtime.providers.cpu.kernels.native_kernels import native_module
from tests.test_cpu_kernels_nn import make_node, run_onnxruntime

pytestmark = pytest.mark.skipif(native_module() is None, reason="the C extension _native is not built")
RNG = np.random.default_rng(4408)


def both_paths(kernel, inputs: list) -> tuple[np.ndarray, str, np.ndarray, str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            reduction.NATIVE_LOGSUMEXP_ENABLED = False
            (plain,) = kernel.compute(list(inputs))
            plain_path = kernel.last_path
            reduction.NATIVE_LOGSUMEXP_ENABLED = True
            (fast,) = kernel.compute(list(inputs))
        finally:
            reduction.NATIVE_LOGSUMEXP_ENABLED = True
    return plain, plain_path, fast, kernel.last_path


@pytest.mark.parametrize("keepdims", [0, 1])
def test_native_rows_matches_numpy_shifted_and_onnxruntime(keepdims):
    for shape, scale in [((64, 3), 30.0), ((16, 3), 1.0), ((5,), 10.0), ((2, 3, 130), 5.0), ((7, 1), 100.0),
                         ((4, 8), 1e-3), ((3, 12), 80.0)]:
        x = (RNG.standard_normal(shape) * scale - scale).astype(np.float32)
        if shape[-1] > 1:
            x.reshape(-1, shape[-1])[0, 0] = -np.inf  # one -inf in a row: a zero term
        for axes in ([-1], [len(shape) - 1]):
            kernel = create_cpu_kernel(make_node("ReduceLogSumExp", 2, 18, keepdims=keepdims), None)
            inputs = [x, np.array(axes, np.int64)]
            plain, plain_path, fast, fast_path = both_paths(kernel, inputs)
            assert (plain_path, fast_path) == (reduction.NUMPY_SHIFTED, reduction.NATIVE_ROWS), (shape, axes)
            assert fast.shape == plain.shape and fast.dtype == np.float32
            np.testing.assert_allclose(fast, plain, rtol=2e-6, atol=1e-6, err_msg=str(shape))
            (want,) = run_onnxruntime("ReduceLogSumExp", inputs, 18, keepdims=keepdims)
            np.testing.assert_allclose(fast, want, rtol=1e-5, atol=1e-5, err_msg=str(shape))
    kernel = create_cpu_kernel(make_node("ReduceLogSumExp", 1, 13, axes=[1], keepdims=0), None)  # axes attribute
    plain, _, fast, path = both_paths(kernel, [RNG.standard_normal((6, 4)).astype(np.float32)])
    assert path == reduction.NATIVE_ROWS
    np.testing.assert_allclose(fast, plain, rtol=2e-6, atol=1e-6)


def test_native_rows_declines_nan_inf_and_all_minus_inf_rows():
    kernel = create_cpu_kernel(make_node("ReduceLogSumExp", 2, 18, keepdims=0), None)
    for bad in (np.nan, np.inf, "row"):
        x = RNG.standard_normal((4, 5)).astype(np.float32)
        if bad == "row":
            x[2] = -np.inf
        else:
            x[1, 3] = bad
        plain, _, fast, path = both_paths(kernel, [x, np.array([-1], np.int64)])
        assert path == reduction.NUMPY_SHIFTED
        np.testing.assert_array_equal(fast, plain)


def test_other_axes_and_types_stay_on_numpy_shifted():
    kernel = create_cpu_kernel(make_node("ReduceLogSumExp", 2, 18, keepdims=1), None)
    x = RNG.standard_normal((4, 5)).astype(np.float32)
    for inputs in ([x, np.array([0], np.int64)], [x, np.array([0, 1], np.int64)], [x.T, np.array([1], np.int64)],
                   [x.astype(np.float64), np.array([1], np.int64)]):
        kernel.compute(inputs)
        assert kernel.last_path == reduction.NUMPY_SHIFTED
