"""Values in device memory through the public API, on real OpenCL (PoCL): OrtValue, copy_tensors,
sync streams, IOBinding with device tensors, the allocator after many runs, threads."""

from __future__ import annotations

import numpy as np
import pytest

import onnxhal
from onnxhal import errors
from onnxhal.demo import demo_model
from tests.threads import run_threads

DEFAULT = onnxhal.OrtDeviceMemoryType.DEFAULT


@pytest.fixture(scope="module")
def mem(opencl_devices):
    return opencl_devices[0].memory_info(DEFAULT)


@pytest.fixture(scope="module")
def cl_session(opencl_devices):
    so = onnxhal.SessionOptions()
    so.add_provider_for_devices(opencl_devices[:1], {})
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    return onnxhal.InferenceSession(demo_model(), so)


@pytest.fixture(scope="module")
def reference():
    cpu = onnxhal.InferenceSession(demo_model(), providers=["CPUExecutionProvider"])
    return lambda x: cpu.run(None, {"x": x})[0]


def _x(seed=1):
    return np.random.default_rng(seed).standard_normal((1, 3, 16, 16)).astype(np.float32)


def test_device_memory_is_not_host_memory(mem):
    assert mem is not None and not mem.is_host
    assert mem.memory_device != onnxhal.hal.HOST_MEMORY_DEVICE


def test_ortvalue_in_device_memory(mem):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    v = onnxhal.OrtValue.ortvalue_from_shape_and_type([2, 3], np.float32, memory_info=mem)
    assert v.device_name() == "opencl" and v.shape() == [2, 3] and v.data_type() == "tensor(float)"
    v.update_inplace(a)
    np.testing.assert_array_equal(v.numpy(), a)
    w = onnxhal.OrtValue.ortvalue_from_numpy(a * 2, "opencl", 0)
    assert w.device_name() == "opencl"
    np.testing.assert_array_equal(w.numpy(), a * 2)
    # ORT's (device_type, device_id, vendor_id) addressing: "cpu" with the OpenCL memory's vendor id.
    u = onnxhal.OrtValue.ortvalue_from_numpy(a + 1, "cpu", 0, mem.device_vendor_id)
    assert u.device_name() == "opencl"
    np.testing.assert_array_equal(u.numpy(), a + 1)
    with pytest.raises(errors.InvalidArgument, match="update_inplace"):
        v.update_inplace(np.zeros((3, 2), np.float32))
    with pytest.raises(errors.InvalidArgument, match="no EP device declares memory"):
        onnxhal.OrtValue.ortvalue_from_numpy(a, "npu", 5)


def test_copy_tensors_every_direction(mem, opencl_devices):
    a = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
    host = onnxhal.OrtValue.ortvalue_from_numpy(a)
    dev1 = onnxhal.OrtValue.ortvalue_from_shape_and_type(a.shape, np.float32, memory_info=mem)
    dev2 = onnxhal.OrtValue.ortvalue_from_shape_and_type(a.shape, np.float32, memory_info=mem)
    back = onnxhal.OrtValue.ortvalue_from_numpy(np.zeros_like(a))
    onnxhal.copy_tensors([host], [dev1])                   # host -> device
    onnxhal.copy_tensors([dev1], [dev2])                   # device -> device
    stream = opencl_devices[0].create_sync_stream()
    assert stream.get_handle() is not None
    onnxhal.copy_tensors([dev2], [back], stream)           # device -> host, on a stream
    np.testing.assert_array_equal(back.numpy(), a)


def test_copy_tensors_errors(mem):
    a = onnxhal.OrtValue.ortvalue_from_numpy(np.ones(3, np.float32))
    with pytest.raises(errors.Fail, match="Invalid arguments provided to CopyTensors"):
        onnxhal.copy_tensors([], [])
    with pytest.raises(errors.Fail, match="not found"):
        onnxhal.copy_tensors([a], [onnxhal.OrtValue.ortvalue_from_numpy(np.ones(3, np.float32))])
    with pytest.raises(TypeError):
        onnxhal.copy_tensors([a], [onnxhal.OrtValue.ortvalue_from_shape_and_type([3], np.float32, memory_info=mem)], 5)


def test_sync_stream_needs_device_memory():
    cpu = onnxhal.get_ep_devices()[0]
    with pytest.raises(errors.Fail, match="does not use DEFAULT memory of a non-CPU device"):
        cpu.create_sync_stream()


def test_session_runs_on_opencl_and_matches_cpu(cl_session, reference):
    assert cl_session.get_providers() == ["OpenCLExecutionProvider", "CPUExecutionProvider"]
    counts = cl_session.partition_summary
    assert counts.get("OpenCLExecutionProvider", 0) >= 4
    x = _x()
    np.testing.assert_allclose(cl_session.run(None, {"x": x})[0], reference(x), rtol=1e-3, atol=1e-6)


def test_iobinding_keeps_inputs_and_outputs_on_the_device(cl_session, reference, mem):
    x = _x(2)
    xd = onnxhal.OrtValue.ortvalue_from_numpy(x, "opencl", 0)
    b = cl_session.io_binding()
    b.bind_ortvalue_input("x", xd)
    b.bind_output("probs", "opencl", 0)
    cl_session.run_with_iobinding(b)
    (out,) = b.get_outputs()
    assert out.device_name() == "opencl"
    np.testing.assert_allclose(out.numpy(), reference(x), rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(b.copy_outputs_to_cpu()[0], reference(x), rtol=1e-3, atol=1e-6)
    # A preallocated device output is filled in place.
    pre = onnxhal.OrtValue.ortvalue_from_shape_and_type([1, 10], np.float32, memory_info=mem)
    b.bind_ortvalue_output("probs", pre)
    cl_session.run_with_iobinding(b)
    np.testing.assert_allclose(pre.numpy(), reference(x), rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("one_call", ["0", "1"])
def test_allocator_in_use_returns_to_its_start_after_1000_runs(opencl_devices, reference, one_call):
    so = onnxhal.SessionOptions()
    so.add_provider_for_devices(opencl_devices[:1], {})
    so.add_session_config_entry("session.onnxhal.one_call_run", one_call)
    session = onnxhal.InferenceSession(demo_model(), so)
    (alloc,) = [a for dev, a in session.memory.allocators().items()]
    x = _x(3)
    for _ in range(3):  # prepared at the first runs; the one-call run's buffers are taken then
        session.run(None, {"x": x})
    before = alloc.stats()
    for _ in range(1000):
        out = session.run(None, {"x": x})[0]
    stats = alloc.stats()
    assert stats["InUse"] == before["InUse"]
    if one_call == "0":
        assert stats["NumAllocs"] - before["NumAllocs"] >= 1000  # the runs did allocate on the device
    else:  # one native call a run into buffers the partition keeps: no allocation per run
        assert stats["NumAllocs"] == before["NumAllocs"]
    np.testing.assert_allclose(out, reference(x), rtol=1e-3, atol=1e-6)


def test_four_threads_on_one_opencl_session_agree(cl_session, reference):
    xs = [_x(10 + k) for k in range(4)]
    refs = [reference(x) for x in xs]
    bad: list = []

    def worker(k):
        for _ in range(25):
            out = cl_session.run(None, {"x": xs[k]})[0]
            if not np.allclose(out, refs[k], rtol=1e-3, atol=1e-6):
                bad.append(k)

    run_threads(worker, 4)
    assert bad == []


def test_memory_info_device_ids_are_onnxruntimes_16_bit_ordinals():
    """onnxruntime keeps a memory device's id in 16 bits and refuses a wider one (narrowing_error):
    onnxhal refuses it the same way rather than make memory onnxruntime cannot describe."""
    ort = pytest.importorskip("onnxruntime")
    args = (onnxhal.OrtMemoryInfoDeviceType.GPU, 0x8086)
    for device_id in (32767, -32768):
        assert onnxhal.OrtMemoryInfo.create_v2("x", *args, device_id, onnxhal.OrtDeviceMemoryType.DEFAULT, 0,
                                               onnxhal.OrtAllocatorType.ORT_DEVICE_ALLOCATOR).device_id == device_id
    for device_id in (32768, 0x9A49, -32769):
        with pytest.raises(RuntimeError, match="narrowing_error"):
            ort.OrtMemoryInfo.create_v2("x", ort.OrtMemoryInfoDeviceType.GPU, 0x8086, device_id,
                                        ort.OrtDeviceMemoryType.DEFAULT, 0, ort.OrtAllocatorType.ORT_DEVICE_ALLOCATOR)
        with pytest.raises(onnxhal.errors.InvalidArgument, match="narrowing_error"):
            onnxhal.OrtMemoryInfo.create_v2("x", *args, device_id, onnxhal.OrtDeviceMemoryType.DEFAULT, 0,
                                            onnxhal.OrtAllocatorType.ORT_DEVICE_ALLOCATOR)
