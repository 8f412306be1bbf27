"""ONNX Gelu's path ``fused_form`` (``activation.GELU_PATHS``): a standalone float32 Gelu (opset
20, approximate 'none') runs the form the fused ops' Gelu epilogue runs, held to the canonical
``erf`` form within 4e-7 (and the canonical's own error) on random and edge inputs (NaN, infinities, signed zeros, large
values), on contiguous and transposed arrays of the sizes each of its inner paths takes, and to
onnxruntime; float64 and approximate 'tanh' stay on the canonical form."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from onnxhal.runtime.providers.cpu.kernel_factory import create_cpu_kernel
from onnxhal.runtime.providers.cpu.kernels import activation
from tests.test_cpu_kernels_nn import make_node, run_onnxruntime

RNG = np.random.default_rng(20)
EDGES = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-40, 5.9, -5.9, 6.1, -6.1, 15.0, -15.5, 1e30, -1e30]


def inputs(size: int, dtype=np.float32) -> np.ndarray:
    x = np.concatenate([RNG.standard_normal(size - len(EDGES)) * 3, np.array(EDGES)])
    return x.astype(dtype).reshape(-1, 5 if size % 5 == 0 else 1)


def both(x: np.ndarray, approximate: str = "none") -> tuple[str, np.ndarray, np.ndarray]:
    kernel = create_cpu_kernel(make_node("Gelu", 1, 20, approximate=approximate), None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            activation.GELU_FUSED_ENABLED = False
            assert kernel.path(x) == activation.GELU_ERF
            (plain,) = kernel.compute([x])
            activation.GELU_FUSED_ENABLED = True
            path = kernel.path(x)
            (fast,) = kernel.compute([x])
        finally:
            activation.GELU_FUSED_ENABLED = True
    return path, plain, fast


# 300 values: the table; 5000: the C pass (or the polynomial where the C extension is off);
# 70000: past one block, the polynomial in blocks
@pytest.mark.parametrize("size", [300, 5000, 70000])
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_fused_form_is_within_4e_7_of_erf(size, layout):
    x = inputs(size)
    if layout == "transposed":
        x = x.T
    path, plain, fast = both(x)
    assert path == activation.GELU_FUSED
    assert fast.dtype == np.float32 and fast.shape == x.shape
    np.testing.assert_array_equal(np.isnan(fast), np.isnan(plain))
    # the fused form's 4e-7 of the exact gelu, plus the canonical's own 0.5 |x| 2e-7 and roundings
    np.testing.assert_allclose(fast, plain, rtol=3e-7, atol=4e-7)
    assert x is not fast and np.shares_memory(x, fast) is False  # the input is left alone


def test_fused_form_matches_onnxruntime():
    x = RNG.standard_normal((2, 16, 9)).astype(np.float32) * 3
    _, _, fast = both(x)
    (want,) = run_onnxruntime("Gelu", [x], 20)
    np.testing.assert_allclose(fast, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype, approximate", [(np.float64, "none"), (np.float32, "tanh")])
def test_float64_and_tanh_keep_the_canonical_form(dtype, approximate):
    x = inputs(300, dtype)
    path, plain, fast = both(x, approximate)
    assert path == activation.GELU_ERF
    np.testing.assert_array_equal(fast, plain)


def test_float16_table_within_one_unit_and_4e_7_of_the_canonical():
    """float16 Gelu looks its values up in a table built from float32 ones (half_via_float): the
    fused form's entries differ from the canonical's by the fused form's 4e-7 plus one float16
    unit in the last place (the rounding), and are NaN where the canonical's are."""
    x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    kernel = create_cpu_kernel(make_node("Gelu", 1, 20), None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        (fast,) = kernel.compute([x])
        plain = activation.gelu(x.astype(np.float32)).astype(np.float16)
    assert fast.dtype == np.float16
    np.testing.assert_array_equal(np.isnan(fast), np.isnan(plain))
    ok = ~np.isnan(plain)
    wide, want = fast[ok].astype(np.float32), plain[ok].astype(np.float32)
    finite = np.isfinite(want)
    np.testing.assert_array_equal(wide[~finite], want[~finite])
    with np.errstate(over="ignore"):  # float16's largest value has an infinite spacing
        unit = np.spacing(np.abs(plain[ok][finite])).astype(np.float32)
    assert np.all(np.abs(wide[finite] - want[finite]) <= 4e-7 + 3e-7 * np.abs(want[finite]) + unit)
