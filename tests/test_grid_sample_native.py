"""GridSample's path ``native_bilinear`` (``grid_sample.LINEAR_PATHS``): bilinear sampling of a 4-D
float32 input in one C pass. Held to the canonical ``corners`` path bit for bit (the same float64
and float32 operations in the same order) on every padding mode and both align_corners
conventions, including points on and far beyond the borders, and to onnxruntime; it declines, and
the corners run, where a coordinate is NaN, infinite or far out. AffineGrid's positions, kept per
output size, give what a fresh kernel gives."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from onnxhal.runtime.providers.cpu.kernel_factory import create_cpu_kernel
from onnxhal.runtime.providers.cpu.kernels import grid_sample
from onnxhal.runtime.providers.cpu.kernels.native_kernels import native_module
from tests.test_cpu_kernels_nn import make_node, run_onnxruntime

RNG = np.random.default_rng(4405)
SHAPES = [((2, 3, 7, 9), (2, 5, 6)), ((1, 2, 1, 5), (1, 4, 3)), ((3, 1, 6, 1), (3, 2, 7)), ((1, 4, 32, 32), (1, 32, 32))]
native = pytest.mark.skipif(native_module() is None, reason="the C extension _native is not built")


def grid_of(shape: tuple) -> np.ndarray:
    """Random points within and beyond [-1, 1], with the corners, borders and far points."""
    g = RNG.uniform(-3.5, 3.5, shape + (2,)).astype(np.float32)
    special = [[-1, -1], [1, 1], [-1, 1], [0, 0], [1.0000001, -1.0000001], [-7, 9], [3, 3], [-1e6, 2e6]]
    g.reshape(-1, 2)[:len(special)] = np.array(special, np.float32)[:g.size // 2]
    return g


def both_paths(kernel, x: np.ndarray, grid: np.ndarray) -> tuple[np.ndarray, str, np.ndarray, str]:
    """The kernel's output and path with the native path switched off (canonical), then on."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # NaN and far points in the numpy casts
        try:
            grid_sample.NATIVE_GRID_SAMPLE_ENABLED = False
            (plain,) = kernel.compute([x, grid])
            plain_path = kernel.last_path
            grid_sample.NATIVE_GRID_SAMPLE_ENABLED = True
            (fast,) = kernel.compute([x, grid])
        finally:
            grid_sample.NATIVE_GRID_SAMPLE_ENABLED = True
    return plain, plain_path, fast, kernel.last_path


@native
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_native_bilinear_equals_corners_bit_for_bit_and_matches_onnxruntime(padding, align):
    for xs, gs in SHAPES:
        x, grid = RNG.standard_normal(xs).astype(np.float32), grid_of(gs)
        kernel = create_cpu_kernel(make_node("GridSample", 2, 20, mode="linear", padding_mode=padding,
                                             align_corners=align), None)
        plain, plain_path, fast, fast_path = both_paths(kernel, x, grid)
        assert (plain_path, fast_path) == (grid_sample.CORNERS, grid_sample.NATIVE_BILINEAR)
        np.testing.assert_array_equal(fast, plain, err_msg=f"{xs} {gs}")
        assert fast.dtype == np.float32 and fast.shape == plain.shape and fast.flags.c_contiguous
        # onnxruntime reflects in float32 (far points differ by more) and gives 0 a million pixels out
        grid = np.clip(grid, -2.5, 2.5)
        (fast,) = kernel.compute([x, grid])
        (want,) = run_onnxruntime("GridSample", [x, grid], 20, mode="linear", padding_mode=padding,
                                  align_corners=align)
        np.testing.assert_allclose(fast, want, rtol=1e-5, atol=1e-5, err_msg=f"{xs} {gs}")


@native
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
def test_native_bilinear_declines_on_nan_and_far_points(padding):
    x, grid = RNG.standard_normal((2, 3, 5, 4)).astype(np.float32), grid_of((2, 3, 3))
    kernel = create_cpu_kernel(make_node("GridSample", 2, 20, mode="linear", padding_mode=padding), None)
    for bad in (np.nan, np.inf, 1e30):
        g = grid.copy()
        g[1, 2, 1, 0] = bad
        plain, _, fast, path = both_paths(kernel, x, g)
        # border and reflection bring a finite far point back inside; NaN and inf always decline
        assert path == (grid_sample.CORNERS if padding == "zeros" or not np.isfinite(bad)
                        else grid_sample.NATIVE_BILINEAR)
        np.testing.assert_array_equal(fast, plain)


@native
def test_native_bilinear_leaves_other_cases_to_corners(monkeypatch):
    grid = grid_of((1, 3, 3))
    kernel = create_cpu_kernel(make_node("GridSample", 2, 20, mode="linear", padding_mode="reflection"), None)
    for x, g in ((RNG.standard_normal((1, 2, 4, 4)), grid), (RNG.standard_normal((1, 2, 4, 4)).astype(np.float32),
                                                             grid.astype(np.float64))):
        kernel.compute([x, g])
        assert kernel.last_path == grid_sample.CORNERS
    monkeypatch.setattr(grid_sample, "REFLECT_FOLDED_ENABLED", False)  # the C pass folds: the canonical borders
    kernel.compute([RNG.standard_normal((1, 2, 4, 4)).astype(np.float32), grid])
    assert kernel.last_path == grid_sample.CORNERS


@pytest.mark.parametrize("align", [0, 1])
def test_affine_grid_positions_kept_per_size_match_a_fresh_kernel(align):
    kept = create_cpu_kernel(make_node("AffineGrid", 2, 20, align_corners=align), None)
    for size in ([2, 3, 5, 7], [1, 1, 2, 4], [2, 3, 5, 7], [1, 2, 3, 4, 5], [2, 3, 5, 7]):
        nd = len(size) - 2
        theta = RNG.standard_normal((size[0], nd, nd + 1)).astype(np.float32)
        size_arr = np.array(size, np.int64)
        (got,) = kept.compute([theta, size_arr])
        fresh = create_cpu_kernel(make_node("AffineGrid", 2, 20, align_corners=align), None)
        np.testing.assert_array_equal(got, fresh.compute([theta, size_arr])[0])
        (want,) = run_onnxruntime("AffineGrid", [theta, size_arr], 20, align_corners=align)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert len(kept.bases) == 3
