"""Held feed uploads (runtime/session/memory_context.py): inside an onnxhal run a feed's copy to the
OpenCL device is not waited for; the outputs' download or the run's end waits once. Against the
path that waits for each copy (session config ``session.onnxhal.held_copies`` = "0") and the CPU EP;
``DataTransfer.copy_tensors`` (what the onnxruntime plugin bridge calls) still waits for each copy."""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("pyopencl")
import pyopencl as cl  # noqa: E402

import onnxhal  # noqa: E402
from onnxhal import hal  # noqa: E402
from onnxhal.hal.errors import InvalidArgument  # noqa: E402
from onnxhal.runtime.providers.opencl import create_ep_factories  # noqa: E402
from onnxhal.runtime.providers.opencl.memory import OpenCLDataTransfer, OpenCLHeldCopies  # noqa: E402
from onnxhal.runtime.session.executor import ExecutionPlan  # noqa: E402
from onnxhal.runtime.session.memory_context import HELD_COPIES  # noqa: E402
from tests.opencl_support import close_sessions, require_opencl  # noqa: E402

OPENCL_INDEX = require_opencl(module_level=True)

OPENCL = [("OpenCLExecutionProvider", {"cost_rule": "off"}), "CPUExecutionProvider"]


def two_feed_model() -> bytes:
    rng = np.random.default_rng(5)
    w = rng.standard_normal((16, 8)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    graph = helper.make_graph(nodes, "held", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16]),
                                              helper.make_tensor_value_info("b", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
                              [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.fixture
def sessions(register):
    register("onnxhal.runtime.providers.opencl", "opencl")
    model = two_feed_model()
    made = {}
    for held in ("1", "0"):
        so = onnxhal.SessionOptions()
        so.add_session_config_entry(HELD_COPIES, held)
        made[held] = onnxhal.InferenceSession(model, so, providers=OPENCL)
        assert made[held].partition_summary.get("OpenCLExecutionProvider", 0) == 3
    made["cpu"] = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"])
    yield made
    close_sessions(made)


def feeds(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((4, 16)).astype(np.float32),
            "b": rng.standard_normal((4, 8)).astype(np.float32)}


def test_held_and_waited_uploads_give_the_cpu_eps_outputs(sessions):
    for seed in range(5):
        f = feeds(seed)
        f["x"] = np.asfortranarray(f["x"]) if seed % 2 else f["x"]  # a copy made for the upload is held too
        ref = sessions["cpu"].run(None, f)[0]
        for held in ("1", "0"):
            np.testing.assert_allclose(sessions[held].run(None, f)[0], ref, rtol=1e-5, atol=1e-6)


def test_a_feed_array_changed_once_run_returns_does_not_change_that_run(sessions):
    f = feeds(1)
    first = sessions["1"].run(None, f)[0]
    expected = sessions["cpu"].run(None, f)[0]
    f["x"][:] = 7.0  # the caller reuses its array: the run waited for its upload before returning
    np.testing.assert_allclose(first, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(sessions["1"].run(None, f)[0], sessions["cpu"].run(None, f)[0], rtol=1e-5, atol=1e-6)


def count_waits(monkeypatch) -> list[int]:
    calls = [0]
    real = OpenCLHeldCopies.wait

    def wait(self):
        calls[0] += 1
        real(self)
    monkeypatch.setattr(OpenCLHeldCopies, "wait", wait)
    return calls


def test_a_run_with_host_outputs_waits_once_for_the_download(sessions, monkeypatch):
    calls = count_waits(monkeypatch)
    sessions["1"].run(None, feeds(2))
    assert calls[0] == 1  # the download; the two uploads before it on the in-order queue need no wait
    calls[0] = 0
    sessions["0"].run(None, feeds(2))
    assert calls[0] == 0  # the previous path: each copy waits, the download with a marker


def test_inputs_bound_outside_a_run_are_not_held(sessions, monkeypatch):
    f = feeds(3)
    calls = count_waits(monkeypatch)
    binding = sessions["1"].io_binding()
    for name, value in f.items():
        binding.bind_cpu_input(name, value)
    binding.bind_output("y", "opencl", 0)
    sessions["1"].run_with_iobinding(binding)
    assert calls[0] == 0  # bound (copied) at bind time, outside a run: waited there; outputs left on the device
    (out,) = binding.get_outputs()
    np.testing.assert_allclose(out.numpy(), sessions["cpu"].run(None, f)[0], rtol=1e-5, atol=1e-6)


def test_a_failed_run_still_waits_for_its_uploads(sessions, monkeypatch):
    def fail(self, slots, run_options, profiler, options_set=False):
        raise RuntimeError("a step failed")
    calls = count_waits(monkeypatch)
    monkeypatch.setattr(ExecutionPlan, "_execute", fail)
    with pytest.raises(RuntimeError, match="a step failed"):
        sessions["1"].run(None, feeds(4))
    assert calls[0] == 2
    monkeypatch.undo()
    np.testing.assert_allclose(sessions["1"].run(None, feeds(4))[0], sessions["cpu"].run(None, feeds(4))[0],
                               rtol=1e-5, atol=1e-6)


def test_threads_on_one_session_each_wait_for_their_own_uploads(sessions):
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            for k in range(15):
                f = feeds(seed * 100 + k)
                got = sessions["1"].run(None, f)[0]
                np.testing.assert_allclose(got, sessions["cpu"].run(None, f)[0], rtol=1e-5, atol=1e-6)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_copy_tensors_on_a_stream_is_complete_on_return(monkeypatch):
    """The bridge's path: onnxruntime's callers reuse the host array once the copy returns."""
    factory = create_ep_factories("opencl", hal.EpApi(), logging.getLogger("test"))[0]
    hw = hal.OrtHardwareDevice(hal.OrtHardwareDeviceType.CPU, "AMD", 0x1022, 0, {"opencl_devices": OPENCL_INDEX})
    (ep_device,) = factory.get_supported_devices([hw])
    mem = ep_device.memory_info(hal.OrtDeviceMemoryType.DEFAULT)
    transfer, alloc = factory.create_data_transfer(), factory.create_allocator(mem)
    stream = factory.create_sync_stream_for_device(mem.memory_device)
    events = []
    real = cl.enqueue_copy

    def enqueue_copy(*a, **k):
        events.append(real(*a, **k))
        return events[-1]
    monkeypatch.setattr(cl, "enqueue_copy", enqueue_copy)
    host = np.arange(1 << 18, dtype=np.float32)
    dev = alloc.tensor(host.shape, host.dtype)
    transfer.copy_tensors([host], [dev], [stream])
    back = np.empty_like(host)
    transfer.copy_tensors([dev], [back], [stream])
    assert len(events) == 2
    assert all(e.command_execution_status == cl.command_execution_status.COMPLETE for e in events)
    np.testing.assert_array_equal(back, host)
    alloc.free(dev.buffer)


def test_a_bad_held_copies_value_is_an_error_naming_it(register):
    register("onnxhal.runtime.providers.opencl", "opencl")
    so = onnxhal.SessionOptions()
    so.add_session_config_entry(HELD_COPIES, "yes")
    with pytest.raises(InvalidArgument, match=r"session\.onnxhal\.held_copies.*'yes'"):
        onnxhal.InferenceSession(two_feed_model(), so, providers=OPENCL)


def test_only_the_outermost_runs_feeds_are_held(sessions, monkeypatch):
    """A run inside a run (a subgraph's, SubgraphRunner.run) is fed values of the run: a kernel may
    reuse them, so their uploads wait."""
    held_uploads = [0]
    real = OpenCLDataTransfer.copy_tensors_held

    def copy_tensors_held(self, src, dst, streams):
        held_uploads[0] += sum(isinstance(s, np.ndarray) for s in src)
        return real(self, src, dst, streams)
    monkeypatch.setattr(OpenCLDataTransfer, "copy_tensors_held", copy_tensors_held)
    f = feeds(6)
    sessions["1"].run(None, f)
    assert held_uploads[0] == 2
    held_uploads[0] = 0
    memory = sessions["1"].memory
    assert memory.run_begin()  # as an outer run on this thread
    try:
        got = sessions["1"].run(None, f)[0]
    finally:
        memory.run_end()
    assert held_uploads[0] == 0
    np.testing.assert_allclose(got, sessions["cpu"].run(None, f)[0], rtol=1e-5, atol=1e-6)
