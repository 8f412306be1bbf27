"""The fused activations' C paths (``fused.ACTIVATION_PATHS``) against their numpy epilogues:
``hard_swish_native`` rounds as numpy's four operations, so the two agree to the bit, on random
and edge values, in float32 and float64; views it cannot take keep the numpy form."""

from __future__ import annotations

import numpy as np
import pytest

from onnxhal.hal.graph import Node
from onnxhal.ort_plugin.build import compiler
from onnxhal.runtime.providers.cpu.kernels import fused
from onnxhal.runtime.providers.cpu.kernels.native_kernels import NATIVE_SWITCH, native_module

pytestmark = pytest.mark.skipif(native_module() is None and compiler() is None,
                                reason="no C compiler: the optional extension _native could not be built")

NODE = Node("FusedConv", ["x", "w"], ["y"], name="conv")
PARAMS = [1 / 6, 0.5]  # paddle's and torch's HardSwish, HardSigmoid(x / 6 + 1 / 2)


def _values(dtype: type) -> np.ndarray:
    rng = np.random.default_rng(1)
    edge = [0.0, -0.0, 3.0, -3.0, np.nextafter(3.0, 0), np.nextafter(-3.0, 0), 1e-40, -1e-40, 1e30, -1e30,
            np.inf, -np.inf, np.nan, 2.9999998, -2.9999998]
    return np.concatenate([rng.standard_normal(5000) * 4, np.linspace(-3.5, 3.5, 3001), edge]).astype(dtype)


def _epilogues(monkeypatch) -> tuple:
    monkeypatch.delenv(NATIVE_SWITCH, raising=False)
    monkeypatch.setattr(fused, "NATIVE_HARD_SWISH_ENABLED", True)
    native = fused._activation("HardSwish", PARAMS, NODE)
    monkeypatch.setattr(fused, "NATIVE_HARD_SWISH_ENABLED", False)
    plain = fused._activation("HardSwish", PARAMS, NODE)
    return native, plain


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("params", [PARAMS, [0.2, 0.5], [0.25, -0.1]])
def test_hard_swish_native_matches_numpy_to_the_bit(dtype, params, monkeypatch):
    monkeypatch.delenv(NATIVE_SWITCH, raising=False)
    monkeypatch.setattr(fused, "NATIVE_HARD_SWISH_ENABLED", True)
    native = fused._activation("HardSwish", params, NODE)
    monkeypatch.setattr(fused, "NATIVE_HARD_SWISH_ENABLED", False)
    plain = fused._activation("HardSwish", params, NODE)
    x = _values(dtype).reshape(1, -1, 1)
    calls = _spy(monkeypatch)
    got, want = x.copy(), x.copy()
    native(got)
    plain(want)
    assert calls, "the C path was not taken"
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))  # the same bits, NaN and -0 included


def _spy(monkeypatch) -> list[int]:
    """Counts calls of the extension's hard_swish."""
    from onnxhal.runtime.providers.cpu.kernels import _native

    calls: list[int] = []
    real = _native.hard_swish
    monkeypatch.setattr(_native, "hard_swish", lambda *a: calls.append(1) or real(*a))
    return calls


def test_hard_swish_native_leaves_views_to_numpy(monkeypatch):
    native, plain = _epilogues(monkeypatch)
    calls = _spy(monkeypatch)
    values = _values(np.float32)[:4000].reshape(-1, 8)
    got = np.zeros((values.shape[0], 16), np.float32)[:, ::2]  # a strided view
    got[...] = values
    want = values.copy()
    native(got)
    plain(want)
    assert not calls
    np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError):
        native_module().hard_swish(np.zeros(4, np.int32), 0.2, 0.5)


def test_hard_swish_native_switches(monkeypatch):
    """ONNXHAL_NATIVE_KERNELS=0 and NATIVE_HARD_SWISH_ENABLED False, read when the epilogue is
    made, keep it on numpy."""
    calls = _spy(monkeypatch)
    x = _values(np.float32)
    monkeypatch.setenv(NATIVE_SWITCH, "0")
    fused._activation("HardSwish", PARAMS, NODE)(x.copy())
    monkeypatch.delenv(NATIVE_SWITCH)
    monkeypatch.setattr(fused, "NATIVE_HARD_SWISH_ENABLED", False)
    fused._activation("HardSwish", PARAMS, NODE)(x.copy())
    assert not calls
    monkeypatch.setattr(fused, "NATIVE_HARD_SWISH_ENABLED", True)
    fused._activation("HardSwish", PARAMS, NODE)(x.copy())
    assert calls
