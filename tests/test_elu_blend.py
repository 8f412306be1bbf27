"""Elu's and Selu's path ``blend`` (``activation.ELU_PATHS``): max(x, 0) plus the negative branch
computed in place, held to the canonical ``select`` (np.where) bit for bit on random and edge
inputs (NaN, infinities, signed zeros, subnormals), and to onnxruntime."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from onnxhal.runtime.providers.cpu.kernel_factory import create_cpu_kernel
from onnxhal.runtime.providers.cpu.kernels import activation
from tests.test_cpu_kernels_nn import make_node, run_onnxruntime

RNG = np.random.default_rng(44)
EDGES = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-40, 1e-8, -1e-8, 88.0, -88.0, -200.0, 3.5, -3.5]


def inputs(dtype) -> np.ndarray:
    x = np.concatenate([RNG.standard_normal(200) * 4, np.array(EDGES)]).astype(dtype)
    return x.reshape(2, -1)


def both(kernel, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            activation.ELU_BLEND_ENABLED = False
            assert kernel.path(x) == activation.SELECT
            (plain,) = kernel.compute([x])
            activation.ELU_BLEND_ENABLED = True
            (fast,) = kernel.compute([x])
        finally:
            activation.ELU_BLEND_ENABLED = True
    return plain, fast


@pytest.mark.parametrize("op", ["Elu", "Selu"])
@pytest.mark.parametrize("alpha", [1.0, 0.5, 1e-30, 2.5, 1.6732632])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_blend_equals_select_bit_for_bit(op, alpha, dtype):
    attrs = {"alpha": alpha} if op == "Elu" else {"alpha": alpha, "gamma": 1.0507}
    kernel = create_cpu_kernel(make_node(op, 1, 6, **attrs), None)
    x = inputs(dtype)
    assert kernel.path(x) == activation.BLEND
    plain, fast = both(kernel, x)
    assert fast.dtype == plain.dtype == x.dtype and fast.shape == x.shape
    np.testing.assert_array_equal(fast.view(f"u{x.itemsize}"), plain.view(f"u{x.itemsize}"))  # bits, zeros' signs


@pytest.mark.parametrize("op", ["Elu", "Selu"])
def test_alphas_outside_the_condition_take_select(op):
    x = inputs(np.float32)
    for alpha in (-1.0, 0.0, 1e-40, np.inf, np.nan):  # products that may be -0, or NaN
        kernel = create_cpu_kernel(make_node(op, 1, 6, alpha=alpha), None)
        assert kernel.path(x) == activation.SELECT
    kernel = create_cpu_kernel(make_node(op, 1, 6), None)
    assert kernel.path(np.float32(1.0) * np.ones((), np.float32)) == activation.SELECT  # 0-d


@pytest.mark.parametrize("op", ["Elu", "Selu"])
def test_blend_matches_onnxruntime(op):
    x = (RNG.standard_normal((2, 8, 128)) * 3).astype(np.float32)
    (want,) = run_onnxruntime(op, [x], 6)
    kernel = create_cpu_kernel(make_node(op, 1, 6), None)
    assert kernel.path(x) == activation.BLEND
    (got,) = kernel.compute([x])
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)
