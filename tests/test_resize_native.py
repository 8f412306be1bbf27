"""Resize's path ``native_last_two`` (``resize.RESIZE_PATHS``): nearest and linear Resize (and
Upsample) of float32 planes that resample only the last two axes, one C pass with taps made once
per shape. Held to the canonical ``axes`` path bit for bit (the same float32 operations in the same
order, NaN and infinities included) and to onnxruntime within the corpus tolerance."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from onnxhal.runtime.providers.cpu.kernel_factory import create_cpu_kernel
from onnxhal.runtime.providers.cpu.kernels import resize
from onnxhal.runtime.providers.cpu.kernels.native_kernels import native_module
from tests.test_cpu_kernels_nn import make_node, run_onnxruntime

pytestmark = pytest.mark.skipif(native_module() is None, reason="the C extension _native is not built")
RNG = np.random.default_rng(44)
COORDS = ["half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel", "half_pixel_symmetric",
          "tf_half_pixel_for_nn"]
CASES = [((2, 3, 5, 7), [1, 1, 1.6, 0.6]), ((2, 16, 2, 2), [1, 1, 2, 2]), ((1, 3, 8, 8), [1, 1, 16, 16]),
         ((4, 9), [2.5, 0.5]), ((2, 3, 5, 7), [1, 1, 1, 2]), ((2, 3, 5, 7), [1, 1, 1.1, 1.0]),
         ((3, 1, 1, 6), [1, 1, 3, 0.5]), ((2, 2, 3, 4, 5), [1, 1, 1, 0.7, 1.9])]


def both_paths(kernel, inputs: list) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's output with the native path switched off (canonical ``axes``), then on."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # NaN and inf in the lerp
        try:
            resize.NATIVE_RESIZE_ENABLED = False
            (plain,) = kernel.compute(list(inputs))
            resize.NATIVE_RESIZE_ENABLED = True
            (fast,) = kernel.compute(list(inputs))
        finally:
            resize.NATIVE_RESIZE_ENABLED = True
    return plain, fast


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("coord", COORDS)
def test_native_last_two_equals_axes_bit_for_bit_and_matches_onnxruntime(mode, coord):
    for shape, scales in CASES:
        x = RNG.standard_normal(shape).astype(np.float32)
        x.flat[1], x.flat[4] = np.nan, np.inf
        kernel = create_cpu_kernel(make_node("Resize", 3, 19, mode=mode, coordinate_transformation_mode=coord), None)
        inputs = [x, None, np.array(scales, np.float32)]
        assert kernel.last_two.path(x, [int(np.float32(s) * np.float32(d)) for s, d in zip(scales, shape)],
                                    [float(s) for s in scales]) == resize.NATIVE_LAST_TWO
        plain, fast = both_paths(kernel, inputs)
        np.testing.assert_array_equal(fast, plain, err_msg=f"{shape} {scales}")
        assert fast.dtype == np.float32 and fast.flags.c_contiguous
        x[np.isnan(x) | np.isinf(x)] = 0.5
        (want,) = run_onnxruntime("Resize", inputs, 19, mode=mode, coordinate_transformation_mode=coord)
        _, fast = both_paths(kernel, inputs)
        np.testing.assert_allclose(fast, want, rtol=1e-5, atol=1e-5, err_msg=f"{shape} {scales}")


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_native_last_two_by_sizes_and_nearest_modes(mode):
    for nearest_mode in ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"):
        x = RNG.standard_normal((2, 4, 7, 13)).astype(np.float32)
        for sizes in ([2, 4, 4, 20], [2, 4, 15, 6], [2, 4, 1, 1], [2, 4, 7, 26]):
            inputs = [x, None, None, np.array(sizes, np.int64)]
            attrs = {"mode": mode, "coordinate_transformation_mode": "asymmetric", "nearest_mode": nearest_mode}
            kernel = create_cpu_kernel(make_node("Resize", 4, 19, **attrs), None)
            plain, fast = both_paths(kernel, inputs)
            np.testing.assert_array_equal(fast, plain)
            (want,) = run_onnxruntime("Resize", inputs, 19, **attrs)
            np.testing.assert_allclose(fast, want, rtol=1e-5, atol=1e-5)


def test_native_last_two_upsample():
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    for mode in ("nearest", "linear"):
        kernel = create_cpu_kernel(make_node("Upsample", 2, 9, mode=mode), None)
        plain, fast = both_paths(kernel, [x, np.array([1, 1, 2, 3.5], np.float32)])
        assert fast.shape == (2, 3, 8, 17)
        np.testing.assert_array_equal(fast, plain)


def test_other_inputs_take_the_axes_path():
    kernel = create_cpu_kernel(make_node("Resize", 3, 19, mode="linear"), None)
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    out = [2, 3, 8, 10]
    one = [1.0, 1.0, 2.0, 2.0]
    assert kernel.last_two.path(x, out, one) == resize.NATIVE_LAST_TWO
    assert kernel.last_two.path(x.astype(np.float64), out, one) == resize.AXES  # float32 only
    strided = x.transpose(0, 1, 3, 2)  # copied first
    assert kernel.last_two.path(strided, [2, 3, 10, 8], one) == resize.NATIVE_LAST_TWO
    plain, fast = both_paths(kernel, [strided, None, np.array(one, np.float32)])
    np.testing.assert_array_equal(fast, plain)
    assert kernel.last_two.path(x, [2, 6, 8, 10], [1.0, 2.0, 2.0, 2.0]) == resize.AXES  # a channel axis resized
    assert kernel.last_two.path(x, [2, 3, 8, 10], [1.0, 1.1, 2.0, 2.0]) == resize.AXES  # resampled at its length
    cubic = create_cpu_kernel(make_node("Resize", 3, 19, mode="cubic"), None)
    assert cubic.last_two.path(x, out, one) == resize.AXES
    x64 = x.astype(np.float64)  # the canonical path still runs these
    (y,) = kernel.compute([x64, None, np.array(one, np.float32)])
    assert y.dtype == np.float64 and y.shape == (2, 3, 8, 10)


def test_taps_are_made_once_per_shape():
    kernel = create_cpu_kernel(make_node("Resize", 3, 19, mode="linear"), None)
    scales = np.array([1, 1, 2, 2], np.float32)
    for shape in ((1, 2, 3, 4), (1, 2, 3, 4), (2, 2, 3, 4), (1, 2, 3, 4)):
        kernel.compute([RNG.standard_normal(shape).astype(np.float32), None, scales])
    assert len(kernel.last_two.tables) == 2


def test_antialiased_resize_keeps_its_own_form():
    # antialias is checked before this path: a downscale's wider taps, not two taps per axis
    x = RNG.standard_normal((1, 2, 12, 12)).astype(np.float32)
    inputs = [x, None, np.array([1, 1, 0.5, 0.5], np.float32)]
    kernel = create_cpu_kernel(make_node("Resize", 3, 18, mode="linear", antialias=1), None)
    (got,) = kernel.compute(inputs)
    (want,) = run_onnxruntime("Resize", inputs, 18, mode="linear", antialias=1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
