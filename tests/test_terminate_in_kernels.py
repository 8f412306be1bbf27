"""RunOptions.terminate stops a run inside long kernels, an OpenCL partition's launches and a simulated
device's modelled wait, in bounded time, with onnxruntime's "Exiting due to terminate flag"; the
session then runs correctly. Each case times a short run and bounds the stop by it, while the
terminated run is many times longer: a run that ignores the flag completes and fails the test."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxhal
from onnxhal.hal.run_control import Terminated
from tests.conftest import PLUGINS, library_module, simulated_or_skip
from tests.hostile_models import ROOT
from tests.models import make, vi
from tests.opencl_support import require_opencl

STOP_AFTER_S = 0.1


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def terminated_run(sess: onnxhal.InferenceSession, feeds: dict) -> tuple[BaseException | None, float]:
    """Run with a RunOptions whose flag another thread sets after STOP_AFTER_S: (error, seconds)."""
    ro = onnxhal.RunOptions()
    timer = threading.Timer(STOP_AFTER_S, lambda: setattr(ro, "terminate", True))
    timer.start()
    t0 = time.perf_counter()
    try:
        sess.run(None, feeds, ro)
        err = None
    except Exception as e:  # noqa: BLE001 - the test asserts its type
        err = e
    seconds = time.perf_counter() - t0
    timer.cancel()
    return err, seconds


def assert_stopped(err: BaseException | None, seconds: float, bound: float) -> None:
    assert isinstance(err, Terminated), f"expected Terminated, got {type(err).__name__}: {err}"
    assert str(err).startswith("Exiting due to terminate flag"), str(err)
    assert seconds < bound, f"stopped after {seconds:.2f} s, bound {bound:.2f} s"


def lstm_model(hidden: int = 8, width: int = 4) -> onnx.ModelProto:
    rng = np.random.default_rng(34)
    w = onnx.numpy_helper.from_array((rng.standard_normal((1, 4 * hidden, width)) * 0.3).astype(np.float32), "W")
    r = onnx.numpy_helper.from_array((rng.standard_normal((1, 4 * hidden, hidden)) * 0.3).astype(np.float32), "R")
    node = helper.make_node("LSTM", ["x", "W", "R"], ["y", "y_h"], hidden_size=hidden, name="lstm")
    return make([node], [vi("x", [None, 1, width])], [vi("y", None), vi("y_h", None)], [w, r])


def test_terminate_stops_a_long_lstm(monkeypatch):
    """The numpy steps read the flag every step (tests/test_lstm_native.py has the C steps' blocks)."""
    from onnxhal.runtime.providers.cpu.kernels import recurrent

    monkeypatch.setattr(recurrent, "NATIVE_LSTM_ENABLED", False)
    sess = onnxhal.InferenceSession(lstm_model())
    short = np.random.default_rng(1).standard_normal((20_000, 1, 4)).astype(np.float32)
    expected = sess.run(None, {"x": short})
    t_short = timed(lambda: sess.run(None, {"x": short}))
    long = np.tile(short, (30, 1, 1))  # 600,000 time steps: about 30 short runs
    err, seconds = terminated_run(sess, {"x": long})
    assert_stopped(err, seconds, STOP_AFTER_S + 4 * t_short)
    after = sess.run(None, {"x": short})
    for a, e in zip(after, expected):
        np.testing.assert_array_equal(a, e)


def nms_model() -> onnx.ModelProto:
    node = helper.make_node("NonMaxSuppression", ["boxes", "scores", "limit", "iou"], ["selected"], name="nms")
    return make([node], [vi("boxes", [1, None, 4]), vi("scores", [1, 1, None]), vi("limit", [1], TensorProto.INT64),
                         vi("iou", [1])], [vi("selected", None, TensorProto.INT64)])


def nms_feeds(n: int) -> dict:
    """``n`` disjoint boxes: every one is kept, each compared with all kept before it."""
    i = np.arange(n, dtype=np.float32)
    boxes = np.stack([2 * i, np.zeros(n), 2 * i + 1, np.ones(n)], 1)[None].astype(np.float32)
    return {"boxes": boxes, "scores": np.linspace(1, 0, n, dtype=np.float32)[None, None],
            "limit": np.array([n], np.int64), "iou": np.array([0.5], np.float32)}


def test_terminate_stops_a_long_non_max_suppression():
    sess = onnxhal.InferenceSession(nms_model())
    short = nms_feeds(3000)
    expected = sess.run(None, short)[0]
    assert expected.shape == (3000, 3)
    t_short = timed(lambda: sess.run(None, short))
    err, seconds = terminated_run(sess, nms_feeds(30_000))  # quadratic: about 100 short runs
    # the C loop reads the flag between chunks of NATIVE_CHUNK candidates (a chunk of the long run
    # weighs more than the short run's whole loop): 10 short runs, a tenth of the ignoring run
    assert_stopped(err, seconds, STOP_AFTER_S + 10 * t_short)
    np.testing.assert_array_equal(sess.run(None, short)[0], expected)


def matmul_chain(n: int, d: int) -> onnx.ModelProto:
    w = onnx.numpy_helper.from_array(np.eye(d, dtype=np.float32), "w")
    nodes, prev = [], "x"
    for i in range(n):
        nodes.append(helper.make_node("MatMul", [prev, "w"], [f"m{i}"], name=f"mm{i}"))
        prev = f"m{i}"
    nodes.append(helper.make_node("Relu", [prev], ["y"], name="relu"))
    return make(nodes, [vi("x", [d, d])], [vi("y", [d, d])], [w])


def test_terminate_stops_an_opencl_partition_between_launches():
    require_opencl()
    providers = ["OpenCLExecutionProvider", "CPUExecutionProvider"]
    x = np.random.default_rng(2).standard_normal((512, 512)).astype(np.float32)
    short = onnxhal.InferenceSession(matmul_chain(200, 512), providers=providers)
    short.run(None, {"x": x})  # warm up the kernels
    t_short = timed(lambda: short.run(None, {"x": x}))
    sess = onnxhal.InferenceSession(matmul_chain(1200, 512), providers=providers)
    assert sess.get_providers()[0] == "OpenCLExecutionProvider"
    err, seconds = terminated_run(sess, {"x": x})  # 1,200 launches in one fused node: 6 short runs
    # 2 * IN_FLIGHT launches may still be queued when the flag is seen: fewer than the short run's 200.
    assert_stopped(err, seconds, STOP_AFTER_S + 2 * t_short)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], np.maximum(x, 0), rtol=1e-5, atol=1e-5)


def test_terminate_cuts_a_simulated_devices_slowdown_short():
    d = 768
    w = onnx.numpy_helper.from_array(np.eye(d, dtype=np.float32), "w")
    model = make([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], [vi("x", [d, d])], [vi("y", [d, d])], [w])
    x = np.random.default_rng(3).standard_normal((d, d)).astype(np.float32)
    with simulated_or_skip("generic-gpu") as sims:
        device = sims["VirtualGpuExecutionProvider"]

        def session(slowdown: str) -> onnxhal.InferenceSession:
            so = onnxhal.SessionOptions()
            so.add_provider_for_devices([device], {"fault_slowdown": slowdown})
            return onnxhal.InferenceSession(model, so)

        plain = session("1")
        plain.run(None, {"x": x})
        t_plain = min(timed(lambda: plain.run(None, {"x": x})) for _ in range(3))
        # The full run idles (slowdown - 1) times its busy time: about 3 s, at least 29 busy times.
        slow = session(str(max(30, round(3.0 / t_plain))))
        err, seconds = terminated_run(slow, {"x": x})
        assert_stopped(err, seconds, STOP_AFTER_S + 0.4 + 2 * t_plain)
        # The device is not lost: with the flag clear the run computes and waits out its slowdown.
        t0 = time.perf_counter()
        np.testing.assert_allclose(slow.run(None, {"x": x}, onnxhal.RunOptions())[0], x, rtol=1e-6, atol=1e-6)
        assert time.perf_counter() - t0 > seconds


@pytest.mark.parametrize("name", ["sk_forest", "sk_gboost_reg"])
def test_tree_ensembles_give_the_same_results_in_row_chunks(monkeypatch, name):
    """Rows go in chunks (so that the work between two terminate checks is bounded), by the leaf
    bits and by the level walk: chunks of one row give what one chunk of every row gives."""
    from onnxhal.runtime.providers.cpu.kernels import ml_trees

    monkeypatch.setenv(ml_trees.NATIVE_SWITCH, "0")  # the numpy routes' chunks (test_tree_native: the C route's)
    sess = onnxhal.InferenceSession(os.path.join(ROOT, "tests", "real_models", f"{name}.onnx"))
    x = np.random.default_rng(4).standard_normal((300, 8)).astype(np.float32)
    whole = sess.run(None, {"X": x})
    monkeypatch.setattr(ml_trees, "_BITS_CELLS", 1)
    chunked = sess.run(None, {"X": x})
    monkeypatch.setattr(ml_trees, "_CHUNK", 1)
    monkeypatch.setattr(ml_trees, "_BITS_CELLS", 0)  # no leaf bits: the walk, a row at a time
    walked = sess.run(None, {"X": x})
    for a, b, c in zip(whole, chunked, walked):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)


def test_a_fused_nodes_compute_gets_the_runs_run_options(register, monkeypatch):
    """A plugin EP's NodeComputeInfo sees the run's RunOptions (KernelContext.run_options), so that a
    long compute can read the terminate flag; None for a run given no RunOptions."""
    module = library_module(register(os.path.join(PLUGINS, "toy_fusing_ep.py"), "toy_terminate"))
    seen = []
    compute = module._Compute.compute

    def recording(self, state, ctx):
        seen.append(ctx.run_options)
        return compute(self, state, ctx)

    monkeypatch.setattr(module._Compute, "compute", recording)
    model = make([helper.make_node("Add", ["x", "x"], ["a"], name="add"), helper.make_node("Mul", ["a", "a"], ["y"])],
                 [vi("x", [3])], [vi("y", [3])])
    sess = onnxhal.InferenceSession(model, providers=[("ToyA", {"ops": "Add,Mul"})])
    x = np.arange(3, dtype=np.float32)
    ro = onnxhal.RunOptions()
    np.testing.assert_array_equal(sess.run(None, {"x": x}, ro)[0], (2 * x) ** 2)
    sess.run(None, {"x": x})
    assert seen == [ro, None]
