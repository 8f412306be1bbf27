"""The quantization kernels' C paths (``quantize.QUANTIZE_PATHS``: ``native_quantize``,
``native_dequantize``, ``native_quantize_dequantize``, ``native_dynamic_quantize``) against their
numpy forms, bit for bit,
on random and edge inputs (NaN, infinities, signed zeros, ties, saturation, empty ranges), through
the kernels that take them; their conditions and switch; and a corpus model each way."""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest

import onnxhal
from onnxhal.hal import Node
from onnxhal.ort_plugin.build import compiler
from onnxhal.runtime.providers.cpu.kernels import quantize
from onnxhal.runtime.providers.cpu.kernels.ms_quantized import DynamicQuantizeMatMul, QLinearAdd, QLinearMatMul
from onnxhal.runtime.providers.cpu.kernels.native_kernels import NATIVE_SWITCH
from tests.test_real_models import CORPUS

try:  # the extension itself (built where the install had a C compiler)
    from onnxhal.runtime.providers.cpu.kernels import _native
except ImportError:
    _native = None

# skipped only where no C compiler exists; where one does, a missing extension fails
# test_tree_native.py's test_the_extension_is_built_where_a_compiler_is
pytestmark = pytest.mark.skipif(_native is None and compiler() is None,
                                reason="no C compiler: the optional extension _native could not be built")

_CODES = (np.int8, np.uint8, np.int16, np.uint16)
_SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, -0.5, 1.5, 2.5, -2.5, 1e30, -1e30], np.float32)


def _cases(seed: int, count: int):
    """(x, scale, zero point): shapes of 1 to 3 axes, magnitudes from tiny to saturating, one-signed
    tensors, special values and exact ties of the scale's grid."""
    rng = np.random.default_rng(seed)
    for trial in range(count):
        shape = tuple(int(d) for d in rng.integers(1, 40, size=rng.integers(1, 4)))
        scale = np.array(rng.choice([0.02, 0.5, 1e-3, 3.0, 0.25]), np.float32)
        x = (rng.standard_normal(shape) * rng.choice([0.01, 1.0, 100.0])).astype(np.float32)
        if trial % 3 == 0:  # ties: halves of the grid
            x = ((rng.integers(-300, 300, shape) + 0.5) * scale).astype(np.float32)
        if trial % 5 == 0:
            x.flat[rng.integers(0, x.size, size=3)] = rng.choice(_SPECIAL, size=3)
        if trial % 7 == 0:
            x = np.abs(x)
        if trial % 11 == 0:
            x = -np.abs(x)
        code = _CODES[trial % 4]
        info = np.iinfo(code)
        zp = np.array(rng.integers(max(info.min, -100), min(info.max, 200)), code)
        yield x, scale, (None if trial % 13 == 0 else zp)


def test_every_quantize_path_is_checked_here():
    """The paths this file holds to the numpy forms are every path of the table."""
    assert set(quantize.QUANTIZE_PATHS) == {"native_quantize", "native_dequantize", "native_quantize_dequantize",
                                            "native_dynamic_quantize", "native_requantize"}


def _kernels(monkeypatch, native: bool):
    monkeypatch.setattr(quantize, "NATIVE_QUANTIZE_ENABLED", native)
    names = (["x", "s", "z"], ["y"])
    return (quantize.QuantizeLinear(Node("QuantizeLinear", *names), None),
            quantize.QuantizeDequantize(Node("QuantizeDequantize", *names), None), quantize.dynamic_quantizer(),
            quantize.DequantizeLinear(Node("DequantizeLinear", *names), None))


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_native_quantize_paths_match_the_numpy_forms_bit_for_bit(monkeypatch):
    """native_quantize, native_dequantize, native_quantize_dequantize and native_dynamic_quantize
    give the numpy forms' bits (signed zeros included) on 1500 random and edge cases, a third of
    them on transposed views; each is checked to be taken."""
    monkeypatch.delenv(NATIVE_SWITCH, raising=False)
    q0, qd0, dq0, d0 = _kernels(monkeypatch, False)
    q1, qd1, dq1, d1 = _kernels(monkeypatch, True)
    assert q1._native is not None and qd1._native is not None and dq1 is not quantize.dynamic_quantize_centered
    calls = {"quantize_linear": 0, "quantize_dequantize": 0, "dynamic_quantize": 0, "dequantize_linear": 0}
    counting = {name: (lambda f, n: lambda *a: calls.__setitem__(n, calls[n] + 1) or f(*a))(getattr(_native, name), name)
                for name in calls}
    monkeypatch.setattr(q1, "_native", SimpleNamespace(**counting))
    monkeypatch.setattr(qd1, "_native", q1._native)
    monkeypatch.setattr(d1, "_native", q1._native)
    for k, (x, s, z) in enumerate(_cases(0, 1500)):
        if k % 3 == 1:
            x = x.T  # a view: the C paths copy it first
        with np.errstate(all="ignore"):  # NaN and infinite ranges are cases here, not warnings
            _check_case(q0, q1, qd0, qd1, dq0, dq1, d0, d1, x, s, z)
    assert calls["quantize_linear"] == calls["quantize_dequantize"] == calls["dequantize_linear"] == 1500, calls


def _check_case(q0, q1, qd0, qd1, dq0, dq1, d0, d1, x, s, z) -> None:
    inputs = [x, s] if z is None else [x, s, z]
    codes = q0.compute(inputs)[0]
    assert _same(codes, q1.compute(inputs)[0]), (x, s, z)
    assert _same(d0.compute([codes, *inputs[1:]])[0], d1.compute([codes, *inputs[1:]])[0]), (codes, s, z)
    assert _same(qd0.pair(inputs)[0], qd1.compute(inputs)[0]), (x, s, z)
    f0, s0, z0 = dq0(x)
    f1, s1, z1 = dq1(x)
    assert _same(f0, f1) and _same(s0, s1) and z0 == z1 and type(z0) is type(z1), x


def test_native_dynamic_quantize_edge_ranges(monkeypatch):
    """All zeros (scale 1), all NaN, one infinity, a range whose zero point rounds to 0 with values in
    (-scale / 2, 0) (-0.0 codes in the numpy form), and one value: native_dynamic_quantize as numpy."""
    monkeypatch.delenv(NATIVE_SWITCH, raising=False)
    dq0 = _kernels(monkeypatch, False)[2]
    dq1 = _kernels(monkeypatch, True)[2]
    cases = [np.zeros(17, np.float32), np.full(5, np.nan, np.float32), np.array([1.0, np.inf, -3.0], np.float32),
             np.array([-1e-3, 10.0, 3.0, -2e-4] * 9, np.float32), np.array([-7.5], np.float32),
             np.array([np.nan, -np.inf, 2.0, -0.0], np.float32)]
    with np.errstate(all="ignore"):
        for x in cases:
            f0, s0, z0 = dq0(x)
            f1, s1, z1 = dq1(x)
            assert _same(f0, f1) and _same(s0, s1) and z0 == z1, x


def test_the_native_paths_keep_their_conditions(monkeypatch):
    """A per-axis scale, codes of another type than the zero point's and int32 codes take the numpy
    forms (the C routines are not called: the module is replaced by None), with the switch-off
    results; the switch off builds kernels that never take them."""
    monkeypatch.delenv(NATIVE_SWITCH, raising=False)
    q0, qd0, dq0, d0 = _kernels(monkeypatch, False)
    assert q0._native is None and qd0._native is None and d0._native is None
    assert dq0 is quantize.dynamic_quantize_centered
    q1, qd1, _, d1 = _kernels(monkeypatch, True)
    for kernel in (q1, qd1, d1):
        assert kernel._native is not None
        monkeypatch.setattr(kernel, "_native", SimpleNamespace())  # a C call would raise AttributeError
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 8)).astype(np.float32)
    per_axis, zs = np.linspace(0.01, 0.1, 8, dtype=np.float32), np.zeros(8, np.int8)  # along axis 1
    assert _same(q1.compute([x, per_axis, zs])[0], q0.compute([x, per_axis, zs])[0])
    assert _same(qd1.compute([x, per_axis, zs])[0], qd0.compute([x, per_axis, zs])[0])
    codes = rng.integers(-128, 128, (6, 8)).astype(np.int8)
    assert _same(d1.compute([codes, per_axis, zs])[0], d0.compute([codes, per_axis, zs])[0])
    wide = rng.integers(-1000, 1000, (4, 5)).astype(np.int32)
    s = np.array(0.5, np.float32)
    assert _same(d1.compute([wide, s, np.array(3, np.int32)])[0], d0.compute([wide, s, np.array(3, np.int32)])[0])


def test_dynamic_quantize_matmul_takes_the_native_quantization(monkeypatch):
    """DynamicQuantizeMatMul with the switch on and off: the same bits (its product reads the codes)."""
    monkeypatch.delenv(NATIVE_SWITCH, raising=False)
    rng = np.random.default_rng(5)
    node = Node("DynamicQuantizeMatMul", ["a", "b", "b_scale", "b_zp", "bias"], ["y"], domain="com.microsoft")
    a = rng.standard_normal((2, 7, 16)).astype(np.float32)
    b = rng.integers(-128, 128, (16, 9)).astype(np.int8)
    inputs = [a, b, np.array(0.03, np.float32), np.array(2, np.int8), rng.standard_normal(9).astype(np.float32)]
    monkeypatch.setattr(quantize, "NATIVE_QUANTIZE_ENABLED", False)
    want = DynamicQuantizeMatMul(node, None).compute(inputs)[0]
    monkeypatch.setattr(quantize, "NATIVE_QUANTIZE_ENABLED", True)
    kernel = DynamicQuantizeMatMul(node, None)
    assert kernel._centered is not quantize.dynamic_quantize_centered
    assert _same(kernel.compute(inputs)[0], want)


def test_native_requantize_in_qlinear_matmul_and_add(monkeypatch):
    """QLinearMatMul (int8 and uint8, per-tensor scales, saturating and NaN-free sums) and QLinearAdd
    (broadcast B) with the switch on: native_requantize gives the bits of the switch off and of
    QLinearMatMul's canonical ``plain``; a per-column scale keeps the numpy form."""
    monkeypatch.delenv(NATIVE_SWITCH, raising=False)
    rng = np.random.default_rng(7)
    mm = Node("QLinearMatMul", [f"i{k}" for k in range(8)], ["y"])
    add = Node("QLinearAdd", [f"i{k}" for k in range(8)], ["y"], domain="com.microsoft")
    calls: list[int] = []
    counted = SimpleNamespace(requantize=lambda *args: calls.append(1) or _native.requantize(*args))
    for trial in range(60):
        code = (np.int8, np.uint8)[trial % 2]
        lo, hi = np.iinfo(code).min, np.iinfo(code).max
        a = rng.integers(lo, hi + 1, (2, 5, 16)).astype(code)
        b = rng.integers(lo, hi + 1, (16, 7)).astype(code)
        per_column = trial % 5 == 4
        b_s = (rng.uniform(1e-3, 0.1, 7) if per_column else np.array(rng.uniform(1e-3, 0.1))).astype(np.float32)
        scales = [np.array(rng.uniform(1e-3, 0.1), np.float32) for _ in range(2)]
        zps = [np.array(rng.integers(lo, hi + 1), code) for _ in range(3)]
        y_s = np.array(rng.choice([1e-4, 0.05, 3.0]), np.float32)  # 1e-4: most codes saturate
        inputs = [a, scales[0], zps[0], b, b_s, zps[1], y_s, zps[2]]
        monkeypatch.setattr(quantize, "NATIVE_QUANTIZE_ENABLED", False)
        want = QLinearMatMul(mm, None).compute(inputs)[0]
        add_inputs = [a, scales[0], zps[0], a[:1, :1, :], scales[1], zps[1], y_s, zps[2]]
        want_add = QLinearAdd(add, None).compute(add_inputs)[0]
        monkeypatch.setattr(quantize, "NATIVE_QUANTIZE_ENABLED", True)
        calls.clear()
        kernel, adder = QLinearMatMul(mm, None), QLinearAdd(add, None)
        kernel._native = adder._native = counted
        assert _same(kernel.compute(inputs)[0], want) and _same(QLinearMatMul.plain(inputs), want)
        assert _same(adder.compute(add_inputs)[0], want_add)
        assert len(calls) == (1 if per_column else 2), (trial, calls)


@pytest.mark.parametrize("model", ["bert_ts_qdq_pt", "bert_ts_qdyn"])
def test_corpus_models_give_the_same_bits_with_the_native_paths(model, monkeypatch):
    """A QDQ and a dynamically quantized BERT of the corpus: sessions with the switch off and on give
    the same outputs, bit for bit."""
    from onnxhal.stored_outputs import read_signatures

    monkeypatch.delenv(NATIVE_SWITCH, raising=False)
    path = os.path.join(CORPUS, f"{model}.onnx")
    feeds, _ = read_signatures(path)["a"]
    outputs = []
    for native in (False, True):
        monkeypatch.setattr(quantize, "NATIVE_QUANTIZE_ENABLED", native)
        sess = onnxhal.InferenceSession(path, providers=["CPUExecutionProvider"])
        outputs.append(sess.run(None, feeds))
    for a, b in zip(*outputs):
        assert _same(a, b)
