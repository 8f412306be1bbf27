"""GRU's and RNN's steps in C (``recurrent.RECURRENT_PATHS["gru_native"]`` and ``["rnn_native"]``:
``RecurrentKernel._run_native``, one ``_native.gru_steps`` or ``rnn_steps`` call a block of steps of
one direction) against the canonical plain loop, the numpy transposed loop and onnxruntime; their
conditions, switches, terminate flag and threads."""

from __future__ import annotations

import threading

import numpy as np
import onnxruntime as ort
import pytest

import onnxhal
from onnxhal.ort_plugin.build import compiler
from onnxhal.runtime.providers.cpu.kernels import recurrent
from onnxhal.runtime.providers.cpu.kernels.native_kernels import NATIVE_SWITCH
from tests.test_real_models import check_outputs, load
from tests.test_recurrent_fast_paths import (
    PAIRED_TRANSPOSED_CASES,
    TRANSPOSED_CASES,
    _gru_rnn,
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



def _applies(op: str, hidden: int, batch: int) -> bool:
    return (recurrent.native_gru_applies if op == "GRU" else recurrent.native_rnn_applies)(hidden, batch)


#: (op, seq, batch, input, hidden, options): the cases of the numpy loops' tests within the bounds, both directions
#: of their bidirectional ones, and the edges the C steps have of their own
CASES = {name: case for name, case in TRANSPOSED_CASES.items() if _applies(case[0], case[4], case[2])}
CASES.update({f"pair_{name}": case[:-1] + ({**case[-1], "direction": "bidirectional"},)
              for name, case in PAIRED_TRANSPOSED_CASES.items() if _applies(case[0], case[4], case[2])})
CASES.update({
    "pt_gru_form": ("GRU", 12, 3, 10, 24, {"direction": "bidirectional", "linear_before_reset": 1, "lens": [12, 7, 3]}),
    # (a zero length with no initial state: onnxruntime's Y_h of such a row is 0, not initial_h)
    "ragged_zero_reverse_lbr": ("GRU", 6, 4, 3, 9, {"direction": "reverse", "linear_before_reset": 1, "lens": [0, 6, 2, 5],
                                             "h0": False}),
    "ragged_reverse_h0": ("GRU", 6, 4, 3, 9, {"direction": "reverse", "lens": [1, 6, 2, 5]}),
    "ragged_bidirectional_float64": ("GRU", 5, 3, 4, 6, {"direction": "bidirectional", "dtype": np.float64,
                                                  "lens": [5, 0, 3]}),
    "batch1_hidden40": ("GRU", 7, 1, 5, 40, {"direction": "bidirectional"}),
    "hidden1_reverse": ("GRU", 5, 3, 2, 1, {"direction": "reverse", "linear_before_reset": 1}),
    "tile_and_rest": ("GRU", 4, 2, 3, 37, {"linear_before_reset": 1}),  # 3 x 37 gates: 3 tiles of 32, one of 8, 7 more
    "tiles_16_8_rest": ("GRU", 4, 2, 3, 13, {}),  # z, r: 26 = 16 + 8 + 2; n from 26 to 39: 8 + 5
    "layout1": ("GRU", 5, 3, 4, 6, {"layout": 1, "direction": "bidirectional", "lens": [5, 2, 4]}),
    "rnn_layout1": ("RNN", 5, 3, 4, 6, {"layout": 1, "direction": "bidirectional", "lens": [5, 2, 4]}),
    "rnn_ragged_zero_bidirectional_no_h0": ("RNN", 6, 3, 4, 13, {"direction": "bidirectional", "lens": [0, 6, 3],
                                                                "h0": False}),
    "rnn_float64_ragged": ("RNN", 5, 2, 3, 7, {"dtype": np.float64, "lens": [5, 2]}),
    "rnn_hidden1_batch1": ("RNN", 4, 1, 2, 1, {"direction": "reverse"}),
    "rnn_tiles": ("RNN", 4, 2, 3, 61, {}),  # 61 = 32 + 16 + 8 + 5
})


def _native_calls(monkeypatch) -> list[int]:
    """Counts ``RecurrentKernel._run_native`` runs (GRU's and RNN's)."""
    calls: list[int] = []
    real = recurrent.RecurrentKernel._run_native
    monkeypatch.setattr(recurrent.RecurrentKernel, "_run_native", lambda self, *a: calls.append(1) or real(self, *a))
    return calls


def _session(model: bytes) -> onnxhal.InferenceSession:
    return onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("case", sorted(CASES))
def test_native_steps_match_the_plain_loop_numpy_loop_and_onnxruntime(case, monkeypatch):
    """The C steps against the canonical loop and the numpy transposed loop (within
    ``TRANSPOSED_ATOL``; float64 1e-12) and onnxruntime (float32, layout 0); a second run repeats
    bit for bit and a run on other inputs in the same session matches too."""
    op, seq, batch, k, h, options = CASES[case]
    assert _applies(op, h, batch)
    model, feeds = _gru_rnn(np.random.default_rng(len(case) + 5), op, seq, batch, k, h, **options)
    other = {n: v * 0.5 if v.dtype.kind == "f" else v for n, v in feeds.items()}
    monkeypatch.delenv(NATIVE_SWITCH, raising=False)
    calls = _native_calls(monkeypatch)
    sess = _session(model)
    fast = sess.run(None, feeds)
    assert calls, "the C route was not taken"
    np.testing.assert_array_equal(sess.run(None, feeds)[0], fast[0])
    fast_other = sess.run(None, other)
    f32 = options.get("dtype", np.float32) == np.float32
    atol = recurrent.TRANSPOSED_ATOL if f32 else 1e-12
    monkeypatch.setattr(recurrent, "NATIVE_GRU_ENABLED", False)
    monkeypatch.setattr(recurrent, "NATIVE_RNN_ENABLED", False)
    numpy_sess = _session(model)
    monkeypatch.setattr(recurrent, "TRANSPOSED_ENABLED", False)
    plain_sess = _session(model)
    for got, want_feeds in ((fast, feeds), (fast_other, other)):
        for what, ref in (("numpy loop", numpy_sess), ("plain loop", plain_sess)):
            for i, (f, p) in enumerate(zip(got, ref.run(None, want_feeds))):
                assert f.shape == p.shape and f.dtype == p.dtype, (case, what, i)
                np.testing.assert_allclose(f, p, rtol=0, atol=atol, err_msg=f"{case} output {i}: {what}")
    if f32 and not options.get("layout"):  # (onnxruntime has no float64 GRU and declines layout 1)
        theirs = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
        for i, (f, t) in enumerate(zip(fast, theirs)):
            np.testing.assert_allclose(f, t, rtol=1e-5, atol=1e-5, err_msg=f"{case} output {i}: onnxruntime")


def test_gru_native_condition(monkeypatch):
    assert recurrent.native_gru_applies(32, 16) and recurrent.native_gru_applies(128, 2)
    assert recurrent.native_gru_applies(1, 16) and recurrent.native_gru_applies(64, 8)
    assert not recurrent.native_gru_applies(64, 9) and not recurrent.native_gru_applies(256, 1)
    assert recurrent.native_gru_applies(4, 64) and not recurrent.native_gru_applies(2, 65)  # the batch bound
    assert recurrent.native_rnn_applies(128, 2) and not recurrent.native_rnn_applies(64, 9)
    assert not recurrent.native_rnn_applies(2, 65)
    assert not recurrent.native_gru_applies(0, 1)
    monkeypatch.setattr(recurrent, "NATIVE_GRU_ENABLED", False)
    assert not recurrent.native_gru_applies(8, 1)
    monkeypatch.setattr(recurrent, "NATIVE_GRU_ENABLED", True)
    monkeypatch.setattr(recurrent, "NATIVE_RNN_ENABLED", False)
    assert not recurrent.native_rnn_applies(8, 1) and recurrent.native_gru_applies(8, 1)
    monkeypatch.setattr(recurrent, "NATIVE_RNN_ENABLED", True)
    monkeypatch.setattr(recurrent, "TRANSPOSED_ENABLED", False)
    assert not recurrent.native_gru_applies(8, 1) and not recurrent.native_rnn_applies(8, 1)


@pytest.mark.parametrize("route", ["switched_off", "too_large", "large_batch", "clip", "rnn_relu", "rnn_too_large"])
def test_gru_native_not_taken_outside_its_condition(route, monkeypatch):
    """ONNXHAL_NATIVE_KERNELS=0, work beyond NATIVE_GRU_MAX_WORK (or RNN's), a batch beyond
    NATIVE_GRU_MAX_BATCH and forms other than the default (clip, Relu) keep the numpy paths, with
    onnxruntime's results."""
    opts = {"clip": {"clip": 2.0}, "rnn_relu": {"activations": ["Relu"]}}.get(route, {})
    h, batch = {"too_large": (64, 9), "rnn_too_large": (64, 9), "large_batch": (2, 65)}.get(route, (8, 2))
    op = "RNN" if route.startswith("rnn") else "GRU"
    model, feeds = _gru_rnn(np.random.default_rng(9), op, 4, batch, 3, h, **opts)
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


def test_gru_native_reads_the_terminate_flag_between_blocks(monkeypatch):
    """A sequence longer than a block runs block by block (ragged lengths counted from each
    block's first step), the flag read before each: blocks give the one-block result, and the run
    stops at the block where the flag is set."""

    model, feeds = _gru_rnn(np.random.default_rng(4), "GRU", 50, 3, 3, 8, direction="bidirectional",
                            linear_before_reset=1, lens=[50, 23, 9])
    monkeypatch.delenv(NATIVE_SWITCH, raising=False)
    calls = _native_calls(monkeypatch)
    whole = _session(model).run(None, feeds)
    monkeypatch.setattr(recurrent, "_BLOCK", 7)
    sess = _session(model)
    for a, b in zip(sess.run(None, feeds), whole):
        np.testing.assert_array_equal(a, b)
    assert calls
    assert_stops_at_the_third_check(sess, feeds, monkeypatch)


def test_terminate_stops_a_long_gru_on_the_c_steps(monkeypatch):
    """RunOptions.terminate set 0.1 s into a long run stops it at the next block, well before the
    run's own end (measured on this machine, not assumed); the session then runs as before."""
    from tests.test_terminate_in_kernels import STOP_AFTER_S, assert_stopped, terminated_run, timed

    monkeypatch.delenv(NATIVE_SWITCH, raising=False)
    calls = _native_calls(monkeypatch)
    model, feeds = _gru_rnn(np.random.default_rng(34), "GRU", 20_000, 1, 4, 40, h0=False)
    sess = _session(model)
    expected = sess.run(None, feeds)
    assert calls
    t_short = min(timed(lambda: sess.run(None, feeds)) for _ in range(3))
    # long enough to take 4 stop delays, at most 1.2M steps (its output Y: 192 MB)
    reps = int(min(60, max(15, np.ceil(4 * (STOP_AFTER_S + 0.1) / t_short))))
    long = {"x": np.tile(feeds["x"], (reps, 1, 1))}
    t_long = timed(lambda: sess.run(None, long))
    assert t_long > 2 * (STOP_AFTER_S + 0.1), f"the long run ({reps} x 20,000 steps) is too short to tell a stop from its end"
    err, seconds = terminated_run(sess, long)
    assert_stopped(err, seconds, max(STOP_AFTER_S + 0.1, t_long / 2))
    for a, e in zip(sess.run(None, feeds), expected):
        np.testing.assert_array_equal(a, e)


def test_gru_native_steps_reject_wrong_arguments():
    h, batch = 4, 2
    xw = np.zeros((3, batch, 3 * h), np.float32)
    rt = np.zeros((h, 3 * h), np.float32)
    hs, y = np.zeros((batch, h), np.float32), np.zeros((3, 1, batch, h), np.float32)
    lens = np.array([3, 1], np.int64)
    _native.gru_steps(xw, rt, hs, y, 0, 2, 3, -1, True, np.zeros(h, np.float32), lens)
    with pytest.raises(ValueError):
        _native.gru_steps(xw, rt, hs, y, 0, 1, 3, 1, False, None, None)  # past the last step
    with pytest.raises(ValueError):
        _native.gru_steps(xw, rt, hs, y, 1, 0, 3, 1, False, None, None)  # no direction 1
    with pytest.raises(ValueError):
        _native.gru_steps(xw, rt.astype(np.float64), hs, y, 0, 0, 3, 1, False, None, None)  # mixed types
    with pytest.raises(ValueError):
        _native.gru_steps(xw[:, :, :-1].copy(), rt, hs, y, 0, 0, 3, 1, False, None, None)
    with pytest.raises(ValueError):
        _native.gru_steps(xw, rt, hs, y, 0, 0, 3, 1, True, np.zeros(h + 1, np.float32), None)  # rbh not [hidden]
    with pytest.raises(ValueError):
        _native.gru_steps(xw, rt, hs, y, 0, 0, 3, 1, False, None, lens.astype(np.int32))  # lens not int64


def test_rnn_native_steps_reject_wrong_arguments():
    h, batch = 4, 2
    xw = np.zeros((3, batch, h), np.float32)
    rt = np.zeros((h, h), np.float32)
    hs, y = np.zeros((batch, h), np.float32), np.zeros((3, 1, batch, h), np.float32)
    _native.rnn_steps(xw, rt, hs, y, 0, 0, 3, 1, np.array([3, 1], np.int64), np.zeros(h, np.float32))
    with pytest.raises(ValueError):
        _native.rnn_steps(xw, np.zeros((h, 3 * h), np.float32), hs, y, 0, 0, 3, 1, None)  # GRU's R^T
    with pytest.raises(ValueError):
        _native.rnn_steps(xw, rt, hs, y, 0, 0, 3, 1, None, np.zeros(3 * h, np.float32))  # bias not [hidden]
    with pytest.raises(ValueError):
        _native.rnn_steps(xw, rt, hs, y, 0, 3, 1, 1, None)  # past the last step


def test_gru_native_runs_at_once_on_threads(monkeypatch):
    """Runs of one session on four threads at once (different inputs and batches, ragged
    lengths) give each the result of the same run alone: the C steps' state is each run's own."""
    monkeypatch.delenv(NATIVE_SWITCH, raising=False)
    calls = _native_calls(monkeypatch)
    model, _ = _gru_rnn(np.random.default_rng(2), "GRU", 30, 2, 5, 16, direction="bidirectional",
                        linear_before_reset=1, lens=[30, 11])
    sess = _session(model)
    rng = np.random.default_rng(3)
    feeds = []
    for i in range(8):
        batch = 1 + i % 3
        feeds.append({"x": rng.standard_normal((30, batch, 5)).astype(np.float32),
                      "h0": rng.standard_normal((2, batch, 16)).astype(np.float32),
                      "lens": rng.integers(0, 31, batch).astype(np.int32)})
    alone = [sess.run(None, f) for f in feeds]
    results: list = [None] * len(feeds)

    def work(j: int) -> None:
        for _ in range(5):
            results[j] = sess.run(None, feeds[j])

    threads = [threading.Thread(target=work, args=(j,)) for j in range(len(feeds))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls
    for got, want in zip(results, alone):
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


def test_pt_gru_on_the_native_route(monkeypatch):
    """The corpus's pt_gru (two bidirectional GRU layers, linear_before_reset, sequence_lens of
    several lengths) on the C steps, within the corpus tolerances of onnxruntime."""
    monkeypatch.delenv(NATIVE_SWITCH, raising=False)
    calls = _native_calls(monkeypatch)
    path, signatures = load("pt_gru")
    sess = onnxhal.InferenceSession(path, providers=["CPUExecutionProvider"])
    for sig, (feeds, want) in signatures.items():
        check_outputs(sess.run(None, feeds), want, what=f"pt_gru {sig}")
    assert len(calls) >= 2


@pytest.mark.parametrize("batch", [3, 64, 65, 200])
def test_ragged_lengths_helpers_read_few_and_many_rows_alike(batch):
    """``ragged_lengths_apply`` and ``ragged_lengths`` read a few rows as Python ints and more with
    numpy: the same answers either side of ``_FEW_ROWS``."""
    rng = np.random.default_rng(batch)
    lens = rng.integers(1, 9, batch).astype(np.int32)
    assert recurrent.ragged_lengths_apply(lens, 8, batch)
    assert recurrent.ragged_lengths(lens, 8).tolist() == lens.tolist()
    full = np.full(batch, 8, np.int64)
    assert recurrent.ragged_lengths_apply(full, 8, batch) and recurrent.ragged_lengths(full, 8) is None
    for bad in (-1, 9):
        wrong = lens.copy()
        wrong[batch // 2] = bad
        assert not recurrent.ragged_lengths_apply(wrong, 8, batch)
