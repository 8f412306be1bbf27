"""Session creation runs with Python's cyclic garbage collector paused (runtime/session/collector_pause.py)
and leaves it as it found it: enabled after a build, raising or not, after builds on several
threads, and disabled where the application had disabled it."""

from __future__ import annotations

import gc
import logging
import threading

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnxhal
from onnxhal.hal.errors import InvalidGraph


def chain_model(n: int = 200) -> bytes:
    """x -> Identity -> Relu -> ... : the optimizer removes the Identity (and logs it)."""
    nodes = [helper.make_node("Identity", ["x"], ["t0"])]
    nodes += [helper.make_node("Relu" if k % 2 else "Neg", [f"t{k}"], [f"t{k + 1}"]) for k in range(n)]
    nodes.append(helper.make_node("Identity", [f"t{n}"], ["y"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model.SerializeToString()


class _CollectorState(logging.Handler):
    """Records, for each log record of the build, whether the collector was enabled."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen: list[bool] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(gc.isenabled())


@pytest.fixture
def collector_enabled():
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_the_build_runs_with_the_collector_paused_and_resumes_it(collector_enabled):
    state = _CollectorState()
    log = logging.getLogger("onnxhal.optimizer")
    log.addHandler(state)
    try:
        so = onnxhal.SessionOptions()
        so.log_severity_level = 0  # the optimizer's debug records reach the handler
        sess = onnxhal.InferenceSession(chain_model(), so, providers=["CPUExecutionProvider"])
    finally:
        log.removeHandler(state)
    assert state.seen and not any(state.seen)  # records made mid-build: the collector was paused
    assert gc.isenabled()
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    want = ort.InferenceSession(chain_model(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], want)


def test_a_failed_build_resumes_the_collector(collector_enabled):
    bad = onnx.ModelProto.FromString(chain_model(4))
    bad.graph.node[2].input[0] = "nowhere"
    with pytest.raises(InvalidGraph):
        onnxhal.InferenceSession(bad.SerializeToString(), providers=["CPUExecutionProvider"])
    assert gc.isenabled()


def test_a_collector_the_application_disabled_stays_disabled():
    was = gc.isenabled()
    gc.disable()
    try:
        onnxhal.InferenceSession(chain_model(4), providers=["CPUExecutionProvider"])
        assert not gc.isenabled()
    finally:
        if was:
            gc.enable()


def test_builds_on_several_threads_resume_the_collector_once_all_end(collector_enabled):
    model = chain_model(100)
    errors: list[BaseException] = []

    def build() -> None:
        try:
            for _ in range(3):
                onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"])
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=build) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert gc.isenabled()
