"""``rms_group_norm.RMS_NORM_PATHS["native_rows"]`` (``_native.rms_norm``) against the numpy form of
``rms_norm`` (random rows of every length, axes, offsets, both stash types, the 1 / rms output), its
condition (what it does not take goes the numpy way), and RMSNormalization and
SimplifiedLayerNormalization nodes on it against onnxruntime."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

import onnxhal
from onnxhal.ort_plugin.build import compiler
from onnxhal.runtime.providers.cpu.kernels import rms_group_norm
from onnxhal.runtime.providers.cpu.kernels.native_kernels import NATIVE_SWITCH

try:  # the extension itself (built where the install had a C compiler)
    from onnxhal.runtime.providers.cpu.kernels import _native
except ImportError:
    _native = None

# skipped only where no C compiler exists; where one does, a missing extension fails
# test_tree_native.py's test_the_extension_is_built_where_a_compiler_is
pytestmark = pytest.mark.skipif(_native is None and compiler() is None,
                                reason="no C compiler: the optional extension _native could not be built")

_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)


def _both(x, g, axis, stash=_F32, want_inv=False, native=None):
    """(the numpy form, the form ``native`` (default the extension) takes)."""
    want = rms_group_norm.rms_norm(x, g, axis, 1e-6, stash, None, want_inv)
    return want, rms_group_norm.rms_norm(x, g, axis, 1e-6, stash, native or _native, want_inv)


def test_native_rows_matches_the_numpy_form():
    """400 random inputs (rows of 1 to 99 values over one or two axes, offsets up to 1e3, scales
    from 1e-3 to 100, stash float32 and float64, with the 1 / rms output): Y within 2e-6 of the
    numpy form (relative, and absolute on the scale's size), 1 / rms within 1e-6; the C routine is
    taken every time."""
    calls = []
    spy = SimpleNamespace(rms_norm=lambda *a: calls.append(1) or _native.rms_norm(*a))
    rng = np.random.default_rng(0)
    for t in range(400):
        n = int(rng.integers(1, 100))
        rows = int(rng.integers(1, 2000 // n + 1))
        x = rng.standard_normal((rows, n)) * rng.choice([1e-3, 1.0, 100.0]) + rng.choice([0.0, 5.0, 1e3])
        if t % 4 == 3 and n % 2 == 0:  # normalized over two axes
            x, axis = x.reshape(1, rows, 2, n // 2), 2
        else:
            x, axis = x.reshape(1, rows, n), 2
        x = x.astype(np.float32)
        g = rng.standard_normal(x.shape[axis:]).astype(np.float32)
        stash = _F64 if t % 5 == 0 else _F32
        want_inv = stash == _F32 and t % 2 == 0
        (y0, i0), (y1, i1) = _both(x, g, axis, stash, want_inv, spy)
        assert y1.shape == y0.shape and y1.dtype == y0.dtype == _F32
        np.testing.assert_allclose(y1, y0, rtol=2e-6, atol=2e-6 * np.abs(g).max())
        if want_inv:
            assert i1.shape == i0.shape and i1.dtype == i0.dtype
            np.testing.assert_allclose(i1, i0, rtol=1e-6)
        else:
            assert i0 is None and i1 is None
    assert len(calls) == 400


def test_native_rows_keeps_its_condition(monkeypatch):
    """A transposed view, float64 and float16 inputs, a scale that broadcasts to more rows than the
    normalized axes, a float64 scale, an empty input and a float64 stash with the 1 / rms output go
    the numpy way (the module given has no rms_norm: a call would raise), with that way's results;
    ``rms_native`` is None with the switch off or the extension switched off."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 6, 8)).astype(np.float32)
    g = rng.standard_normal(8).astype(np.float32)
    bare = SimpleNamespace()
    cases = [(x.transpose(1, 0, 2), g, 2, _F32, False), (x.astype(np.float64), g, 2, _F64, False),
             (x.astype(np.float16), g.astype(np.float16), 2, _F32, False),
             (x, rng.standard_normal((6, 8)).astype(np.float32), 2, _F32, False), (x, g.astype(np.float64), 2, _F32, False),
             (np.zeros((0, 8), np.float32), g, 1, _F32, False), (x, g, 2, _F64, True)]
    for xs, gs, axis, stash, want_inv in cases:
        (y0, i0), (y1, i1) = _both(xs, gs, axis, stash, want_inv, bare)
        np.testing.assert_array_equal(y1, y0)
        if want_inv:
            np.testing.assert_array_equal(i1, i0)
    monkeypatch.setattr(rms_group_norm, "NATIVE_RMS_NORM_ENABLED", False)
    assert rms_group_norm.rms_native() is None
    monkeypatch.setattr(rms_group_norm, "NATIVE_RMS_NORM_ENABLED", True)
    monkeypatch.setenv(NATIVE_SWITCH, "0")
    assert rms_group_norm.rms_native() is None
    monkeypatch.delenv(NATIVE_SWITCH)
    assert rms_group_norm.rms_native() is _native


def _node_model(op: str, domain: str, x_shape: tuple, g_shape: tuple, outputs: list[str], **attrs) -> bytes:
    node = helper.make_node(op, ["x", "g"], outputs, domain=domain, **attrs)
    graph = helper.make_graph([node], op.lower(), [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x_shape),
                                                   helper.make_tensor_value_info("g", onnx.TensorProto.FLOAT, g_shape)],
                              [onnx.ValueInfoProto(name=o) for o in outputs])
    opsets = [helper.make_opsetid("", 23)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    return model.SerializeToString()


@pytest.mark.parametrize("op, domain, outputs", [("RMSNormalization", "", ["y"]),
                                                 ("SimplifiedLayerNormalization", "", ["y", "inv"])])
@pytest.mark.parametrize("x_shape, axis", [((1, 12, 32), -1), ((1, 4, 12, 8), -1), ((2, 3, 4, 6), 2), ((1, 1, 64), -1)])
def test_nodes_on_the_native_rows_match_onnxruntime(monkeypatch, op, domain, outputs, x_shape, axis):
    """The decoders' RMS norms (rows of the hidden size, query and key heads) and one over two axes,
    the C rows on and off, within 1e-5 of onnxruntime."""
    rng = np.random.default_rng(len(x_shape) + axis)
    feeds = {"x": (rng.standard_normal(x_shape) * 3 + 0.5).astype(np.float32),
             "g": rng.standard_normal(x_shape[axis:]).astype(np.float32)}
    data = _node_model(op, domain, x_shape, x_shape[axis:], outputs, axis=axis, epsilon=1e-6)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    for on in (True, False):
        monkeypatch.setattr(rms_group_norm, "NATIVE_RMS_NORM_ENABLED", on)
        got = onnxhal.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
        for w, g in zip(want, got):
            assert g.shape == w.shape and g.dtype == w.dtype
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=f"{op} {x_shape} native {on}")
