"""``normalization.LAYER_NORM_PATHS["native_small_rows"]`` (``_native.layer_norm``) against the
numpy form of ``layer_norm`` on small inputs (random rows of every length, offsets, with and without
bias, the statistics outputs), and its condition: what it does not take goes the numpy way."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

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

_F32 = np.dtype(np.float32)


def _both(monkeypatch, x, g, b, axis=-1, stats=True):
    monkeypatch.setattr(normalization, "NATIVE_LAYER_NORM_ENABLED", False)
    want = normalization.layer_norm(x, g, b, axis, 1e-5, _F32, stats)
    monkeypatch.setattr(normalization, "NATIVE_LAYER_NORM_ENABLED", True)
    return want, normalization.layer_norm(x, g, b, axis, 1e-5, _F32, stats)


def test_native_small_rows_matches_the_numpy_form(monkeypatch):
    """600 random small inputs (rows of 1 to 99 values, offsets up to 1e3, scales from 1e-3 to 100;
    with and without bias): Y within 2e-6 of the numpy form (relative, and absolute on the scale's
    size), the statistics within 1e-6 relative; the C routine is taken every time."""
    monkeypatch.delenv(NATIVE_SWITCH, raising=False)
    calls = []
    monkeypatch.setattr(normalization, "native_module",
                        lambda: SimpleNamespace(layer_norm=lambda *a: calls.append(1) or _native.layer_norm(*a)))
    rng = np.random.default_rng(0)
    for t in range(600):
        n = int(rng.integers(1, 100))
        rows = int(rng.integers(1, 4000 // n + 1))
        x = (rng.standard_normal((rows, n)) * rng.choice([1e-3, 1.0, 100.0]) + rng.choice([0.0, 5.0, 1e3]))
        x = x.astype(np.float32).reshape((rows, n) if t % 2 else (1, rows, n))
        g = rng.standard_normal(n).astype(np.float32)
        b = rng.standard_normal(n).astype(np.float32) if t % 3 else None
        (y0, m0, i0), (y1, m1, i1) = _both(monkeypatch, x, g, b)
        assert y1.shape == y0.shape and y1.dtype == y0.dtype and m1.shape == m0.shape and m1.dtype == m0.dtype
        size = np.abs(g).max() + (0.0 if b is None else np.abs(b).max())
        np.testing.assert_allclose(y1, y0, rtol=2e-6, atol=2e-6 * size)
        np.testing.assert_allclose(m1, m0, rtol=1e-6, atol=1e-30)
        np.testing.assert_allclose(i1, i0, rtol=1e-6)
    assert len(calls) == 600


def test_native_small_rows_keeps_its_condition(monkeypatch):
    """A transposed view, a float64 input, a bias of another shape than the rows', a scale over two
    axes given as one of broadcast shape and the switch off go the numpy way (the module is replaced
    by one without layer_norm: a call would raise), with that way's results."""
    monkeypatch.delenv(NATIVE_SWITCH, raising=False)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 6, 8)).astype(np.float32)
    g, b = rng.standard_normal(8).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    monkeypatch.setattr(normalization, "native_module", lambda: SimpleNamespace())
    cases = [(x.transpose(1, 0, 2), g, b, -1), (x.astype(np.float64), g, b, -1), (x, g, b.reshape(1, 8), -1),
             (x, rng.standard_normal((1, 8)).astype(np.float32), None, 1)]
    for xs, gs, bs, axis in cases:
        (y0, _, _), (y1, _, _) = _both(monkeypatch, xs, gs, bs, axis)
        np.testing.assert_array_equal(y1, y0)
