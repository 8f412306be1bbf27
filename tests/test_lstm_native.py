"""An LSTM's steps in C (``recurrent.RECURRENT_PATHS["lstm_native"]``: ``LSTM._run_native``, one
``_native.lstm_steps`` call a block of steps) against the canonical plain loop and onnxruntime, on
random and edge inputs; its tanh against numpy's in float32 ulps; its condition and switches."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import onnxhal
from onnxhal.ort_plugin.build import compiler
from onnxhal.runtime.providers.cpu.kernels import recurrent
from onnxhal.runtime.providers.cpu.kernels.native_kernels import NATIVE_SWITCH
from tests.test_real_models import check_outputs, load
from tests.test_recurrent_fast_paths import (
    PAIR_CASES,
    QUANTIZED_PAIR_CASES,
    _lstm,
    _quantized_lstm,
    assert_stops_at_the_third_check,
)

try:  # the extension itself (built where the install had a C compiler)
    from onnxhal.runtime.providers.cpu.kernels import _native
except ImportError:
    _native = None

# skipped only where no C compiler exists; where one does, a missing extension fails
# test_tree_native.py's test_the_extension_is_built_where_a_compiler_is
pytestmark = pytest.mark.skipif(_native is None and compiler() is None,
                                reason="no C compiler: the optional extension _native could not be built")


def _native_calls(monkeypatch) -> list[int]:
    """Counts ``LSTM._run_native`` runs."""
    calls: list[int] = []
    real = recurrent.LSTM._run_native
    monkeypatch.setattr(recurrent.LSTM, "_run_native", lambda self, *a: calls.append(1) or real(self, *a))
    return calls


def _session(model: bytes) -> onnxhal.InferenceSession:
    return onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"])


def _native_runs(model: bytes, feeds: dict, monkeypatch) -> tuple[onnxhal.InferenceSession, list]:
    """A session with the C steps switched on and its outputs for ``feeds``, checked to come from
    the C route and to repeat bit for bit on a second run."""
    monkeypatch.delenv(NATIVE_SWITCH, raising=False)
    calls = _native_calls(monkeypatch)
    sess = _session(model)
    fast = sess.run(None, feeds)
    assert calls, "the C route was not taken"
    np.testing.assert_array_equal(sess.run(None, feeds)[0], fast[0])
    return sess, fast


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("case", sorted(set(PAIR_CASES) - {"cells512"}) + ["layout1", "hidden128", "odd_hidden"])
def test_lstm_native_matches_the_plain_loop_and_onnxruntime(direction, case, monkeypatch):
    """The C steps against the canonical loop (``LSTM_DEFAULT_ENABLED`` False) within
    ``PAIR_ATOL`` and onnxruntime; a second run and a run on other inputs in the same session."""
    seq, batch, k, h, opts = {"layout1": (7, 3, 5, 12, {"layout": 1}), "hidden128": (5, 1, 9, 128, {}),
                              "odd_hidden": (6, 2, 3, 13, {"h0": "none"})}.get(case) or PAIR_CASES[case]
    assert recurrent.native_lstm_applies(h, batch)
    model, feeds = _lstm(np.random.default_rng(len(case) * 3 + len(direction)), seq, batch, k, h,
                         direction=direction, **opts)
    sess, fast = _native_runs(model, feeds, monkeypatch)
    other = {n: v * 0.5 for n, v in feeds.items()}
    fast_other = sess.run(None, other)
    monkeypatch.setattr(recurrent, "LSTM_DEFAULT_ENABLED", False)
    plain_sess = _session(model)
    for got, want_feeds in ((fast, feeds), (fast_other, other)):
        plain = plain_sess.run(None, want_feeds)
        for i, (f, p) in enumerate(zip(got, plain)):
            assert f.shape == p.shape and f.dtype == p.dtype
            np.testing.assert_allclose(f, p, rtol=0, atol=recurrent.PAIR_ATOL, err_msg=f"{case} output {i}")
    # onnxruntime's LSTM has no double kernel and no layout 1 ("Batchwise recurrent operations")
    if opts.get("dtype", np.float32) == np.float32 and not opts.get("layout"):
        theirs = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
        for f, t in zip(fast, theirs):
            np.testing.assert_allclose(f, t, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", sorted(set(QUANTIZED_PAIR_CASES) - {"cells512"}))
def test_lstm_native_dynamic_quantize_lstm(case, monkeypatch):
    """DynamicQuantizeLSTM on the C steps (each batch row of the hidden state quantized on its
    own range, the integer product exact) against its numpy loop with the directions apart
    (``_quantized_direction``: the same codes, the multipliers within an ulp) and the canonical
    loop, and against onnxruntime on two threads (one row per thread at batches up to 2)."""
    seq, batch, k, h, options = QUANTIZED_PAIR_CASES[case]
    assert recurrent.native_lstm_applies(h, batch)
    model, feeds = _quantized_lstm(np.random.default_rng(len(case) + 40), seq, batch, k, h, **options)
    _, fast = _native_runs(model, feeds, monkeypatch)
    monkeypatch.setattr(recurrent, "NATIVE_LSTM_ENABLED", False)
    monkeypatch.setattr(recurrent, "PAIR_ENABLED", False)
    numpy_loop = _session(model).run(None, feeds)
    monkeypatch.setattr(recurrent, "LSTM_DEFAULT_ENABLED", False)
    plain = _session(model).run(None, feeds)
    for i, (f, n, p) in enumerate(zip(fast, numpy_loop, plain)):
        assert f.shape == n.shape and f.dtype == n.dtype
        np.testing.assert_allclose(f, n, rtol=0, atol=recurrent.PAIR_ATOL, err_msg=f"{case} output {i}: numpy loop")
        np.testing.assert_allclose(f, p, rtol=0, atol=recurrent.PAIR_ATOL, err_msg=f"{case} output {i}: plain loop")
    if batch <= 2:
        so = ort.SessionOptions()
        so.intra_op_num_threads = 2
        want = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feeds)
        for i, (f, w) in enumerate(zip(fast, want)):
            np.testing.assert_allclose(f, w, rtol=1e-5, atol=1e-5, err_msg=f"{case} output {i}: onnxruntime")


def test_lstm_native_tanh_within_a_few_ulps():
    """With R = 0 and the i, f and o gates saturated (i = o = 1, f = 0), the cell state is tanh of
    the c gate's input: the C tanh against numpy's in float64, over its two forms' ranges (|x| <
    0.25 and beyond), their edge, saturation, zeros and NaN."""
    h = 64
    xs = np.concatenate([np.linspace(-12, 12, 4001), np.linspace(-0.3, 0.3, 4001), np.geomspace(1e-30, 1e-3, 400),
                         [0.25, -0.25, np.nextafter(0.25, 0), 9, -9, 40, -40, 0.0, -0.0, np.nan, np.inf, -np.inf]])
    xs = np.concatenate([xs, -xs]).astype(np.float32)
    xs = np.concatenate([xs, np.zeros((-len(xs)) % h, np.float32)])
    batch = len(xs) // h
    xw = np.empty((1, batch, 4 * h), np.float32)
    xw[..., :h] = 30  # i: tanh(30) = 1, so 0.5 + 0.5 tanh = 1
    xw[..., h:2 * h] = -30  # f: 0
    xw[..., 2 * h:3 * h] = 30  # o: 1
    xw[..., 3 * h:] = xs.reshape(batch, h)
    hs, cs = np.zeros((batch, h), np.float32), np.full((batch, h), 7, np.float32)
    y = np.empty((1, 1, batch, h), np.float32)
    _native.lstm_steps(xw, np.zeros((h, 4 * h), np.float32), hs, cs, y, 0, 0, 1, 1)
    got = cs.reshape(-1)
    want = np.tanh(xs.astype(np.float64))
    nan = np.isnan(want)
    assert np.isnan(got[nan]).all()
    ulp = np.spacing(np.abs(want[~nan]).astype(np.float32)).astype(np.float64)
    err = np.abs(got[~nan] - want[~nan]) / ulp
    assert err.max() <= 3, (err.max(), xs[~nan][err.argmax()])
    # h = o tanh(c) with o = 1: tanh applied twice
    np.testing.assert_allclose(hs.reshape(-1)[~nan], np.tanh(want[~nan]), rtol=0, atol=3e-7)


def test_lstm_native_steps_reject_wrong_shapes():
    h, batch = 4, 2
    xw = np.zeros((3, batch, 4 * h), np.float32)
    rt = np.zeros((h, 4 * h), np.float32)
    hs, cs, y = np.zeros((batch, h), np.float32), np.zeros((batch, h), np.float32), np.zeros((3, 1, batch, h),
                                                                                             np.float32)
    _native.lstm_steps(xw, rt, hs, cs, y, 0, 2, 3, -1)
    with pytest.raises(ValueError):
        _native.lstm_steps(xw, rt, hs, cs, y, 0, 1, 3, 1)  # past the last step
    with pytest.raises(ValueError):
        _native.lstm_steps(xw, rt, hs, cs, y, 1, 0, 3, 1)  # no direction 1
    with pytest.raises(ValueError):
        _native.lstm_steps(xw, rt.astype(np.float64), hs, cs, y, 0, 0, 3, 1)  # mixed types
    with pytest.raises(ValueError):
        _native.lstm_steps(xw[:, :, :-1].copy(), rt, hs, cs, y, 0, 0, 3, 1)


def test_lstm_native_condition(monkeypatch):
    assert recurrent.native_lstm_applies(32, 16) and recurrent.native_lstm_applies(128, 1)
    assert not recurrent.native_lstm_applies(32, 17) and not recurrent.native_lstm_applies(256, 1)
    assert not recurrent.native_lstm_applies(0, 1)
    monkeypatch.setattr(recurrent, "NATIVE_LSTM_ENABLED", False)
    assert not recurrent.native_lstm_applies(8, 1)


@pytest.mark.parametrize("route", ["switched_off", "too_large", "clip"])
def test_lstm_native_not_taken_outside_its_condition(route, monkeypatch):
    """ONNXHAL_NATIVE_KERNELS=0, work beyond NATIVE_MAX_WORK and a form other than the default
    (clip) keep the numpy paths, with onnxruntime's results."""
    opts = {"clip": 2.0} if route == "clip" else {}
    h, batch = (64, 5) if route == "too_large" else (8, 2)
    model, feeds = _lstm(np.random.default_rng(9), 4, batch, 3, h, direction="forward", **opts)
    if route == "switched_off":
        monkeypatch.setenv(NATIVE_SWITCH, "0")
    else:
        monkeypatch.delenv(NATIVE_SWITCH, raising=False)
    calls = _native_calls(monkeypatch)
    got = _session(model).run(None, feeds)
    assert not calls
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_lstm_native_reads_the_terminate_flag_between_blocks(monkeypatch):
    """A sequence longer than a block runs block by block, the flag read before each: the run stops
    at the block where it is set, and blocks give the same result as one."""

    model, feeds = _lstm(np.random.default_rng(4), 50, 2, 3, 8, direction="bidirectional", scale=0.5)
    monkeypatch.delenv(NATIVE_SWITCH, raising=False)
    whole = _session(model).run(None, feeds)
    monkeypatch.setattr(recurrent, "_BLOCK", 7)
    sess = _session(model)
    for a, b in zip(sess.run(None, feeds), whole):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    assert_stops_at_the_third_check(sess, feeds, monkeypatch)


def test_terminate_stops_a_long_lstm_on_the_c_steps(monkeypatch):
    """RunOptions.terminate set 0.1 s into a long run stops it at the next block: well before the
    run's own end, and the session then runs as before. The run's length is measured on this
    machine (the C steps' speed varies with the build and the load), not assumed."""
    from tests.test_terminate_in_kernels import STOP_AFTER_S, assert_stopped, lstm_model, terminated_run, timed

    monkeypatch.delenv(NATIVE_SWITCH, raising=False)
    calls = _native_calls(monkeypatch)
    sess = onnxhal.InferenceSession(lstm_model(hidden=40))
    short = np.random.default_rng(1).standard_normal((20_000, 1, 4)).astype(np.float32)
    expected = sess.run(None, {"x": short})
    assert calls
    t_short = min(timed(lambda: sess.run(None, {"x": short})) for _ in range(3))
    # long enough to take 8 stop delays, at most 2.4M steps (its output Y: 384 MB)
    reps = int(min(120, max(30, np.ceil(8 * (STOP_AFTER_S + 0.1) / t_short))))
    long = {"x": np.tile(short, (reps, 1, 1))}
    t_long = timed(lambda: sess.run(None, long))
    assert t_long > 2 * (STOP_AFTER_S + 0.1), f"the long run ({reps} x 20,000 steps) is too short to tell a stop from its end"
    err, seconds = terminated_run(sess, long)
    assert_stopped(err, seconds, max(STOP_AFTER_S + 0.1, t_long / 2))
    for a, e in zip(sess.run(None, {"x": short}), expected):
        np.testing.assert_array_equal(a, e)


@pytest.mark.parametrize("name", ["lstm_ts", "crnn_ts", "crnn_ts_fp16", "lstm_ts_qdyn", "crnn_ts_qdyn"])
def test_corpus_lstms_on_the_native_route(name, monkeypatch):
    monkeypatch.delenv(NATIVE_SWITCH, raising=False)
    calls = _native_calls(monkeypatch)
    path, signatures = load(name)
    sess = onnxhal.InferenceSession(path, providers=["CPUExecutionProvider"])
    for sig, (feeds, want) in signatures.items():
        check_outputs(sess.run(None, feeds), want, what=f"{name} {sig}")
    assert calls
