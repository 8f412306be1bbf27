"""One conformance suite for the hal contracts, run against every EP library that ships: the CPU
EP, the OpenCL EP and the simulated NPU and GPU. As IREE's CTS: each subject declares the tests it
skips, with the reason; everything else must pass on every subject."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxhal
from onnxhal import hal
from onnxhal.errors import OutOfMemory
from onnxhal.simulators.testing import simulated_devices
from tests.models import make, vi
from tests.opencl_support import opencl_verdict

SUBJECTS = ["cpu", "opencl", "virtual-npu", "virtual-gpu"]

# Declared skips: (subject, test) -> reason.
SKIPS = {
    ("cpu", "transfer"): "the CPU EP computes in host memory: it declares no device memory and no data transfer",
    ("cpu", "stream"): "the CPU EP runs inline on the caller's thread: it is not stream aware",
    ("cpu", "notification"): "the CPU EP has no streams to notify across",
}


HOST_BACKEND_SKIPS = {
    "stream": "a simulated device on the host backend (no usable OpenCL device) finishes each partition in "
              "compute: it is not stream aware",
    "notification": "a simulated device on the host backend has no streams to notify across",
}


@pytest.fixture(scope="module")
def subjects(request):
    """subject name -> its EP device, or the reason it is missing (the OpenCL probe's verdict). The
    simulated devices stay registered for the module."""
    cpu = onnxhal.get_ep_devices()[0]
    index, reason = opencl_verdict()
    opencl = request.getfixturevalue("opencl_devices")[0] if index is not None else reason
    with simulated_devices("generic-npu,generic-gpu") as sims:
        by_type = {d.device.type: d for d in sims}
        yield {"cpu": cpu, "opencl": opencl, "virtual-npu": by_type[hal.OrtHardwareDeviceType.NPU],
               "virtual-gpu": by_type[hal.OrtHardwareDeviceType.GPU]}


@pytest.fixture(params=SUBJECTS)
def subject(request, subjects):
    device = subjects[request.param]
    if isinstance(device, str):
        pytest.skip(f"needs a working OpenCL device: {device}")
    return request.param, device


def _skip_declared(name: str, test: str, device: onnxhal.OrtEpDevice | None = None) -> None:
    if (name, test) in SKIPS:
        pytest.skip(SKIPS[(name, test)])
    if device is not None and device.ep_metadata.get("backend") == "host" and test in HOST_BACKEND_SKIPS:
        pytest.skip(HOST_BACKEND_SKIPS[test])


def _memory(device: onnxhal.OrtEpDevice) -> hal.OrtMemoryInfo | None:
    return device.memory_info(hal.OrtDeviceMemoryType.DEFAULT)


def _allocator(device: onnxhal.OrtEpDevice) -> hal.Allocator:
    info = _memory(device)
    if info is None:  # ORT: a factory allocator of None means CPU memory
        assert device.factory.create_allocator(hal.CPU_MEMORY_INFO) is None
        return hal.CPUAllocator()
    alloc = device.factory.create_allocator(info)
    assert alloc is not None and alloc.info.memory_device == info.memory_device
    return alloc


# -- allocators -----------------------------------------------------------------------------------------

def test_allocator_stats(subject):
    name, device = subject
    alloc = _allocator(device)
    before = alloc.stats()
    assert set(hal.STATS_KEYS) <= set(before)
    a, b = alloc.alloc(1000), alloc.alloc(24)
    s = alloc.stats()
    assert s["NumAllocs"] == before["NumAllocs"] + 2
    assert s["InUse"] - before["InUse"] >= 1024 and s["MaxInUse"] >= s["InUse"] and s["MaxAllocSize"] >= 1000
    alloc.free(a)
    alloc.free(b)
    assert alloc.stats()["InUse"] == before["InUse"]
    r = alloc.reserve(64)
    assert alloc.stats()["NumReserves"] == before["NumReserves"] + 1
    alloc.free(r)
    with pytest.raises(ValueError):
        alloc.free(object())


@pytest.mark.parametrize("strategy", [hal.NEXT_POWER_OF_TWO, hal.SAME_AS_REQUESTED])
def test_arena_over_the_device_allocator(subject, strategy):
    name, device = subject
    arena = hal.ArenaAllocator(_allocator(device), strategy, limit=8192)
    x = arena.alloc(3000)
    arena.free(x)
    y = arena.alloc(3000)  # reused from the pool: no new extension
    assert y is x and arena.stats()["NumArenaExtensions"] == 1
    chunk = 4096 if strategy == hal.NEXT_POWER_OF_TWO else 3000
    assert arena.stats()["InUse"] == chunk and arena.stats()["Limit"] == 8192
    with pytest.raises(OutOfMemory, match="cannot allocate 6000 bytes.*8192-byte arena limit"):
        arena.alloc(6000)
    assert arena.stats()["InUse"] == chunk  # the failure changed nothing
    arena.free(y)
    z = arena.alloc(6000)  # after shrinking the pools it fits
    arena.free(z)
    assert arena.stats()["InUse"] == 0
    arena.shrink()
    assert arena.pooled_bytes() == 0 and arena.stats()["TotalAllocated"] == 0


# -- data transfer ---------------------------------------------------------------------------------------

def _device_tensor(device, array):
    alloc = _allocator(device)
    t = hal.DeviceTensor.allocate(array.shape, array.dtype, alloc)
    return t


def test_transfer_every_direction(subject):
    name, device = subject
    _skip_declared(name, "transfer")
    transfer = device.factory.create_data_transfer()
    dev = _memory(device).memory_device
    host = hal.HOST_MEMORY_DEVICE
    assert transfer.can_copy(host, dev) and transfer.can_copy(dev, host) and transfer.can_copy(dev, dev)
    a = np.random.default_rng(0).standard_normal((3, 7)).astype(np.float32)
    d1, d2 = _device_tensor(device, a), _device_tensor(device, a)
    back = np.zeros_like(a)
    transfer.copy_tensors([a], [d1])
    transfer.copy_tensors([d1], [d2])
    transfer.copy_tensors([d2], [back])
    np.testing.assert_array_equal(back, a)


def test_batched_transfer(subject):
    name, device = subject
    _skip_declared(name, "transfer")
    transfer = device.factory.create_data_transfer()
    arrays = [np.full((n,), n, np.float32) for n in (1, 5, 1000)]
    devs = [_device_tensor(device, a) for a in arrays]
    outs = [np.zeros_like(a) for a in arrays]
    transfer.copy_tensors(arrays, devs)
    transfer.copy_tensors(devs, outs)
    for a, o in zip(arrays, outs):
        np.testing.assert_array_equal(a, o)


# -- streams and notifications ---------------------------------------------------------------------------

def test_stream_orders_copies_and_the_host_waits(subject):
    name, device = subject
    _skip_declared(name, "stream", device)
    assert device.factory.is_stream_aware()
    stream = device.create_sync_stream()
    assert stream.get_handle() is not None
    transfer = device.factory.create_data_transfer()
    a = np.arange(1 << 16, dtype=np.float32)
    d = _device_tensor(device, a)
    out = np.zeros_like(a)
    transfer.copy_tensors([a], [d], [stream])
    transfer.copy_tensors([d], [out], [stream])  # queued after the first on the same stream
    note = stream.create_notification()
    note.activate()
    note.wait_on_host()
    np.testing.assert_array_equal(out, a)
    stream.flush()
    stream.on_session_run_end()


def test_notification_lets_another_stream_wait(subject):
    name, device = subject
    _skip_declared(name, "notification", device)
    producer, consumer = device.create_sync_stream(), device.create_sync_stream()
    transfer = device.factory.create_data_transfer()
    a = np.random.default_rng(1).standard_normal(1 << 16).astype(np.float32)
    d1, d2 = _device_tensor(device, a), _device_tensor(device, a)
    out = np.zeros_like(a)
    transfer.copy_tensors([a], [d1], [producer])
    note = producer.create_notification()
    note.activate()
    note.wait_on_device(consumer)  # the consumer's later work waits for the producer's copy
    transfer.copy_tensors([d1], [d2], [consumer])
    transfer.copy_tensors([d2], [out], [consumer])
    done = consumer.create_notification()
    done.activate()
    done.wait_on_host()
    np.testing.assert_array_equal(out, a)


# -- compile / compute -----------------------------------------------------------------------------------

def _add_relu_model():
    b = helper.make_tensor("b", TensorProto.FLOAT, [8], list(np.linspace(-1, 1, 8)))
    nodes = [helper.make_node("Add", ["x", "b"], ["a"], name="add"), helper.make_node("Relu", ["a"], ["y"], name="relu")]
    return make(nodes, [vi("x", [4, 8])], [vi("y", [4, 8])], [b])


def test_get_capability_claims_the_supported_nodes(subject):
    """Fused (compile/compute) or single (kernels): every subject claims a float Add -> Relu."""
    name, device = subject
    so = onnxhal.SessionOptions()
    ep = device.factory.create_ep([device.device], [device.ep_metadata], so, logging.getLogger("cts"))
    from onnxhal.runtime.loader.model_loader import load_model

    graph = load_model(_add_relu_model()).graph
    info = hal.EpGraphSupportInfo(graph)
    ep.get_capability(graph, info)
    claimed = {n.name for group, _ in info.fused_groups for n in group} | {n.name for n in info.single_nodes}
    assert claimed == {"add", "relu"}
    device.factory.release_ep(ep)


def test_session_on_the_ep_alone_matches_the_cpu_ep(subject):
    name, device = subject
    so = onnxhal.SessionOptions()
    so.add_provider_for_devices([device], {})
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    if name != "cpu":
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    sess = onnxhal.InferenceSession(_add_relu_model(), so)
    assert sess.get_providers() == [device.ep_name]
    x = np.random.default_rng(2).standard_normal((4, 8)).astype(np.float32)
    b = np.linspace(-1, 1, 8).astype(np.float32)
    tol = 2e-3 if "npu" in name else 1e-6  # the simulated NPU computes in fp16
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], np.maximum(x + b, 0), rtol=tol, atol=tol)
