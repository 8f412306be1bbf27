"""The CPU EP's BLAS threads under a competing load (kernels/blas_threads.LoadAwareBlasThreads):
OpenBLAS splits each product evenly over its threads and waits for the slowest, so on cores other
processes hold a run with 2 threads took 60x longer than with one. The governor gives a run the
session's thread count only where that many cores are idle."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxhal
from onnxhal.runtime.providers.cpu.kernels.blas_threads import (
    LoadAwareBlasThreads,
    get_blas_threads,
    set_blas_threads,
)


def test_threads_follow_the_idle_cores_and_hold_a_peak_for_a_second():
    gov = LoadAwareBlasThreads(2, cores=2)
    assert gov.threads_now(now=0.0, runnable=2) == 2  # only this process: its caller and one BLAS thread
    assert gov.threads_now(now=1.0, runnable=4) == 1  # two other runnable processes: no idle core
    assert gov.threads_now(now=1.02, runnable=1) == 1  # read at most every 50 ms
    assert gov.threads_now(now=1.5, runnable=1) == 1  # the peak holds for a second
    assert gov.threads_now(now=2.6, runnable=1) == 2  # then the cores are idle again
    assert gov.threads_now(now=3.0, runnable=3) == 1  # one other process on two cores: one thread
    assert LoadAwareBlasThreads(4, cores=8).threads_now(now=0.0, runnable=9) == 3  # 5 others: 3 idle cores


def test_this_processs_own_threads_are_not_a_competing_load():
    """onnxruntime's workers (or an OpenCL driver's) in the same process are its own threads: a process
    alternating onnxhal and onnxruntime runs keeps its BLAS threads (medium ResNet-18 ran 4.3x
    onnxruntime's time with them counted as others, 1.9x without)."""
    assert LoadAwareBlasThreads(2, cores=2).threads_now(now=0.0, runnable=4, own=4) == 2
    assert LoadAwareBlasThreads(2, cores=2).threads_now(now=0.0, runnable=4, own=2) == 1  # 2 others
    own = LoadAwareBlasThreads._own_runnable()
    assert own is None or own >= 1  # at least the thread reading it


def test_the_sessions_of_a_process_share_one_reading_of_the_load(monkeypatch):
    # Each session's first run read /proc (the machine's count and every thread's state) again;
    # within 50 ms of a reading, any session's, the counts are the same.
    reads = []
    monkeypatch.setattr(LoadAwareBlasThreads, "_runnable", staticmethod(lambda: reads.append("machine") or 4))
    monkeypatch.setattr(LoadAwareBlasThreads, "_own_runnable", staticmethod(lambda: reads.append("own") or 1))
    first, second = LoadAwareBlasThreads(2, cores=2), LoadAwareBlasThreads(2, cores=2)
    assert first.threads_now(now=1000.0) == 1 and second.threads_now(now=1000.01) == 1  # 3 others either way
    assert reads.count("machine") == 1
    assert second.threads_now(now=1000.2) == 1 and reads.count("machine") == 2  # 50 ms on: read again


def test_a_session_run_sets_blas_threads_from_the_load(monkeypatch):
    before = get_blas_threads()
    if before is None:
        pytest.skip("numpy is not linked against OpenBLAS here")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])
    model = helper.make_model(helper.make_graph([helper.make_node("MatMul", ["x", "x"], ["y"])], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    monkeypatch.setenv("ONNXHAL_LOAD_AWARE_THREADS", "1")  # the suite turns it off (conftest.py)
    so = onnxhal.SessionOptions()
    so.intra_op_num_threads = 2
    try:
        sess = onnxhal.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        # every core held by others: the run gets one BLAS thread
        monkeypatch.setattr(LoadAwareBlasThreads, "_runnable", staticmethod(lambda: 64))
        feed = {"x": np.eye(4, dtype=np.float32)}
        np.testing.assert_array_equal(sess.run(None, feed)[0], feed["x"])
        assert get_blas_threads() == 1
        monkeypatch.setenv("ONNXHAL_LOAD_AWARE_THREADS", "0")  # the switch: the session's count stays
        sess = onnxhal.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        sess.run(None, feed)
        assert get_blas_threads() == 2
    finally:
        set_blas_threads(before)


def test_a_host_plan_run_outside_a_session_sets_blas_threads_from_the_load(monkeypatch):
    # the OpenCL EP's claim-time trial runs a host plan at session creation, before any session
    # run has set BLAS's threads: with OpenBLAS's start-up count on a loaded machine tv_resnext's
    # partition took 230-280 ms a run, against 2.4 with one thread
    from onnxhal.hal.graph import Graph
    from onnxhal.hal.host_execution import host_plan
    from onnxhal.runtime.providers.cpu.kernels import blas_threads

    before = get_blas_threads()
    if before is None:
        pytest.skip("numpy is not linked against OpenBLAS here")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])
    graph = Graph.from_proto(helper.make_graph([helper.make_node("MatMul", ["x", "x"], ["y"])], "g", [x], [y]), {"": 17})
    feed = {"x": np.eye(4, dtype=np.float32)}
    try:
        set_blas_threads(2)
        # the session default it governs, whatever OpenBLAS started with on this machine
        monkeypatch.setattr(blas_threads, "startup_blas_threads", lambda: 2)
        monkeypatch.setenv("ONNXHAL_LOAD_AWARE_THREADS", "1")  # the suite turns it off (conftest.py)
        plan = host_plan(graph)
        monkeypatch.setattr(LoadAwareBlasThreads, "_runnable", staticmethod(lambda: 64))  # every core held
        np.testing.assert_array_equal(plan.run(feed)[0], feed["x"])
        assert get_blas_threads() == 1
        set_blas_threads(2)
        monkeypatch.setenv("ONNXHAL_LOAD_AWARE_THREADS", "0")  # the switch: BLAS's count stays
        np.testing.assert_array_equal(host_plan(graph).run(feed)[0], feed["x"])
        assert get_blas_threads() == 2
    finally:
        set_blas_threads(before)


def test_a_cpu_ep_that_runs_no_node_reads_no_load(monkeypatch):
    """A session whose nodes all run on another EP (the OpenCL EP's CNN) runs no product on the CPU
    EP: its run start read /proc/self/task/*/stat each 50 ms for nothing, 200-300 us of a run whose
    wall time exceeds 50 ms. The CPU EP that creates a kernel governs as before."""
    import logging

    from onnxhal.runtime.providers.cpu.ep import CpuEp

    applied = []

    class Governor:
        def apply(self) -> None:
            applied.append(1)

    ep = CpuEp(logging.getLogger("test"), None, Governor())
    ep.on_run_start(None)
    assert applied == []
    from onnxhal.runtime.providers.cpu.kernels import blas_threads

    reads = []
    monkeypatch.setattr(blas_threads, "_last_reading", (-1.0, None, None))  # no other test's reading
    monkeypatch.setattr(LoadAwareBlasThreads, "_runnable", staticmethod(lambda: reads.append(1) or 1))
    monkeypatch.setenv("ONNXHAL_LOAD_AWARE_THREADS", "1")  # the suite turns it off (conftest.py)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])
    model = helper.make_model(helper.make_graph([helper.make_node("MatMul", ["x", "x"], ["y"])], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    so = onnxhal.SessionOptions()
    so.intra_op_num_threads = 2
    before = get_blas_threads()
    try:
        sess = onnxhal.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        sess.run(None, {"x": np.eye(4, dtype=np.float32)})
    finally:
        if before is not None:
            set_blas_threads(before)
    assert reads or before is None or before < 2  # the MatMul's CPU EP read the load
