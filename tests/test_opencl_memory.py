"""OpenCL EP memory on real OpenCL (PoCL here): memory info, allocator, transfers, streams, notifications,
program cache."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("pyopencl")
import pyopencl as cl  # noqa: E402

from onnxhal import hal  # noqa: E402
from onnxhal.hal.errors import InvalidArgument, OutOfMemory  # noqa: E402
from onnxhal.runtime.providers.opencl import create_ep_factories  # noqa: E402
from onnxhal.runtime.providers.opencl.device_context import ProgramBuildError  # noqa: E402
from onnxhal.runtime.providers.opencl.memory import OpenCLNotification, OpenCLSyncStream  # noqa: E402
from tests.opencl_support import require_opencl  # noqa: E402

OPENCL_INDEX = require_opencl(module_level=True)

HW = hal.OrtHardwareDevice(hal.OrtHardwareDeviceType.CPU, "AMD", 0x1022, 0, {"opencl_devices": OPENCL_INDEX})


@pytest.fixture(scope="module")
def factory():
    return create_ep_factories("opencl", hal.EpApi(), logging.getLogger("test"))[0]


@pytest.fixture(scope="module")
def ep_device(factory):
    devices = factory.get_supported_devices([HW])
    assert len(devices) == 1
    return devices[0]


@pytest.fixture(scope="module")
def mem(ep_device):
    return ep_device.memory_info(hal.OrtDeviceMemoryType.DEFAULT)


def test_ep_device_memory_is_not_host_memory(factory, ep_device, mem):
    assert ep_device.ep_name == "OpenCLExecutionProvider" and ep_device.ep_vendor == "onnxhal"
    assert ep_device.ep_metadata["opencl_index"] == OPENCL_INDEX
    assert mem.name == "OpenCL" and mem.device_type == hal.OrtMemoryInfoDeviceType.CPU
    assert mem.device_vendor_id == 0x1022
    assert mem.memory_device != hal.HOST_MEMORY_DEVICE and not mem.is_host


def test_hardware_without_opencl_gets_no_ep_device(factory):
    plain = hal.OrtHardwareDevice(hal.OrtHardwareDeviceType.CPU, "AMD", 0x1022, 0, {})
    assert factory.get_supported_devices([plain]) == []


def test_vendor_id_zero_hardware_gets_onnxhal_vendor_id(factory):
    hw = hal.OrtHardwareDevice(hal.OrtHardwareDeviceType.CPU, "", 0, 0, {"opencl_devices": OPENCL_INDEX})
    (dev,) = factory.get_supported_devices([hw])
    assert dev.memory_info(hal.OrtDeviceMemoryType.DEFAULT).device_vendor_id == 0x4F48


def test_allocator_stats_and_limit(factory, mem):
    alloc = factory.create_allocator(mem)
    assert alloc is factory.create_allocator(mem)  # one allocator per device, shared
    from onnxhal.runtime.providers.opencl.memory import OpenCLAllocator

    limited = OpenCLAllocator(alloc.device, mem, limit=1024)
    a = limited.alloc(1000)
    assert isinstance(a, cl.Buffer)
    with pytest.raises(OutOfMemory, match="1000 bytes.*1024-byte limit"):
        limited.alloc(1000)
    s = limited.stats()
    assert (s["InUse"], s["NumAllocs"], s["MaxAllocSize"], s["Limit"]) == (1000, 1, 1000, 1024)
    limited.free(a)
    b = limited.alloc(1000)  # usable again after the failure
    limited.free(b)
    assert limited.stats()["InUse"] == 0 and limited.stats()["TotalAllocated"] == 2000


def test_can_copy(factory, mem):
    dt = factory.create_data_transfer()
    host = hal.HOST_MEMORY_DEVICE
    dev = mem.memory_device
    assert dt.can_copy(host, dev) and dt.can_copy(dev, host) and dt.can_copy(dev, dev)
    assert not dt.can_copy(host, host)
    other = hal.OrtMemoryDevice(hal.OrtMemoryInfoDeviceType.GPU, hal.OrtDeviceMemoryType.DEFAULT, 0x10DE, 0)
    assert not dt.can_copy(other, dev)


@pytest.mark.parametrize("use_stream", [False, True])
def test_copies_in_all_three_directions(factory, mem, use_stream):
    dt = factory.create_data_transfer()
    alloc = factory.create_allocator(mem)
    start = alloc.stats()["InUse"]
    stream = factory.create_sync_stream_for_device(mem.memory_device) if use_stream else None
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    y = np.linspace(-1, 1, 10, dtype=np.float32)
    d1, d2 = alloc.tensor(x.shape, x.dtype), alloc.tensor(x.shape, x.dtype)
    d3 = alloc.tensor(y.shape, y.dtype)
    streams = [stream, stream] if use_stream else None
    dt.copy_tensors([x, y], [d1, d3], streams)                      # host -> device, batched
    dt.copy_tensors([d1], [d2], [stream] if use_stream else None)   # device -> device
    out_x, out_y = np.empty_like(x), np.empty_like(y)
    dt.copy_tensors([d2, d3], [out_x, out_y], streams)              # device -> host, batched
    if stream is not None:
        stream.finish()
    np.testing.assert_array_equal(out_x, x)
    np.testing.assert_array_equal(out_y, y)
    for t in (d1, d2, d3):
        alloc.free(t.buffer)
    assert alloc.stats()["InUse"] == start


def test_copy_size_mismatch_is_a_typed_error(factory, mem):
    dt = factory.create_data_transfer()
    alloc = factory.create_allocator(mem)
    d = alloc.tensor((4,), np.float32)
    try:
        with pytest.raises(InvalidArgument, match="16 bytes"):
            dt.copy_tensors([np.zeros(3, np.float32)], [d])
    finally:
        alloc.free(d.buffer)


def test_stream_handle_is_a_queue_and_ep_device_creates_streams(factory, ep_device):
    stream = ep_device.create_sync_stream()
    assert isinstance(stream, OpenCLSyncStream)
    assert isinstance(stream.handle(), cl.CommandQueue) and stream.get_handle() is stream.handle()
    stream.flush()
    stream.on_session_run_end()


def test_notification_orders_work_across_streams(factory, mem):
    """Stream A fills a buffer with a slow kernel; stream B copies it after waiting on A's notification."""
    ctx = factory.device_context(mem.memory_device)
    alloc = factory.create_allocator(mem)
    dt = factory.create_data_transfer()
    a, b = (factory.create_sync_stream_for_device(mem.memory_device) for _ in range(2))
    n = 1 << 16
    src, dst = alloc.tensor((n,), np.float32), alloc.tensor((n,), np.float32)
    kernel = ctx.kernel("""__kernel void slow_fill(__global float* x, const int reps) {
        const int i = get_global_id(0); float v = 0.0f;
        for (int r = 0; r < reps; ++r) v += 1.0f;
        x[i] = v; }""", "slow_fill")
    kernel(a.queue, (n,), None, src.buffer, np.int32(2000))
    note = a.create_notification()
    assert isinstance(note, OpenCLNotification)
    note.activate()
    note.wait_on_device(b)
    dt.copy_tensors([src], [dst], [b])
    host = np.empty(n, np.float32)
    dt.copy_tensors([dst], [host], [b])
    done = b.create_notification()
    done.activate()
    done.wait_on_host()
    np.testing.assert_array_equal(host, np.full(n, 2000, np.float32))
    note.wait_on_device(hal.SyncStream())  # an inline consumer: the host waits instead
    alloc.free(src.buffer)
    alloc.free(dst.buffer)


@pytest.mark.parametrize("kernel_cache", ["1", "0"], ids=["driver_cache_on", "driver_cache_off"])
def test_program_cache_memory_disk_and_build_error(tmp_path, kernel_cache):
    """Run in a subprocess: the disk cache location is read from the environment. Where the driver
    keeps its own build cache (PoCL unless POCL_KERNEL_CACHE=0), onnxhal stores no binaries and a
    second process compiles again (from the driver's cache); elsewhere it loads onnxhal's binaries."""
    code = f"""
import os, time
os.environ["ONNXHAL_CACHE_DIR"] = {str(tmp_path)!r}
os.environ["POCL_KERNEL_CACHE"] = {kernel_cache!r}
from onnxhal.runtime.providers.opencl.device_context import device_context, opencl_device, ProgramBuildError
ctx = device_context(opencl_device({OPENCL_INDEX.split(":")[0]}, {OPENCL_INDEX.split(":")[1]}))
src = "__kernel void k(__global float* x) {{ x[get_global_id(0)] *= 3.0f; }}"
ctx.program(src); ctx.program(src)
print(ctx.stats.compiled, ctx.stats.memory_hits, ctx.stats.loaded_from_disk, ctx.stores_binaries)
try:
    ctx.program("__kernel void broken() {{ undefined_thing; }}")
except ProgramBuildError as e:
    print("BUILD_ERROR", "undefined_thing" in e.log)
"""
    from onnxhal.runtime.providers.opencl.device_context import opencl_device

    platform = opencl_device(*(int(i) for i in OPENCL_INDEX.split(":"))).platform.name
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "POCL_KERNEL_CACHE": kernel_cache})
    assert first.returncode == 0, first.stderr
    stores = first.stdout.split("\n")[0].split()[3] == "True"
    assert stores == (not (platform == "Portable Computing Language" and kernel_cache == "1"))
    # Two programs: the device's native_exp accuracy check (device_context.exp_option) and src.
    assert first.stdout.split("\n")[0].split()[:3] == ["2", "1", "0"]
    assert "BUILD_ERROR True" in first.stdout
    assert bool(list((tmp_path / "programs").rglob("*.bin"))) == stores
    second = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "POCL_KERNEL_CACHE": kernel_cache})
    assert second.returncode == 0, second.stderr
    # loaded from onnxhal's binaries, or compiled again (the driver's own cache serving it)
    assert second.stdout.split("\n")[0].split()[:3] == (["0", "1", "2"] if stores else ["2", "1", "0"])


def test_a_failed_build_is_remembered_not_retried():
    """Each session creation asked the compiler again for a program that had failed, and kept each
    failure's digest in a list that only grew (2,000 creations: 17.6 s against 3.1 s on the CPU EP)."""
    import uuid

    from onnxhal.runtime.providers.opencl.device_context import device_context, opencl_device

    ctx = device_context(opencl_device(*(int(i) for i in OPENCL_INDEX.split(":"))))
    src = f"// {uuid.uuid4()}\n__kernel void broken(__global float* x) {{ x[0] = undefined_thing; }}"
    with pytest.raises(ProgramBuildError) as first:
        ctx.program(src)
    assert "undefined_thing" in first.value.log
    compiled, failures, hits = ctx.stats.compiled, len(ctx.stats.failures), ctx.stats.failure_hits
    for _ in range(200):
        with pytest.raises(ProgramBuildError) as again:
            ctx.program(src)
    assert str(again.value) == str(first.value) and again.value.log == first.value.log
    assert (ctx.stats.compiled, len(ctx.stats.failures), ctx.stats.failure_hits) == (compiled, failures, hits + 200)


def test_build_error_is_an_ep_failure():
    from onnxhal.hal.errors import EPFail

    assert issubclass(ProgramBuildError, EPFail)


def test_held_copier_declines_what_it_does_not_copy_and_copies_empty_tensors(factory, mem):
    """``OpenCLDataTransfer.held_copier`` (a prepared run's per-pair copy): None for host to host,
    device to device, a stream whose queue is another context's, and a subclass with its own
    ``copy_tensors_held``; its uploads and downloads, an empty tensor's included, as copy_tensors'."""
    dt = factory.create_data_transfer()
    dev, host = mem.memory_device, hal.CPU_MEMORY_INFO.memory_device
    stream = factory.create_sync_stream_for_device(dev)
    assert dt.held_copier(host, host, stream) is None and dt.held_copier(dev, dev, stream) is None
    other = cl.CommandQueue(cl.Context([stream.handle().device]))

    class Foreign:
        def handle(self):
            return other
    assert dt.held_copier(host, dev, Foreign()) is None

    class Metered(type(dt)):
        def copy_tensors_held(self, src, dst, streams):
            return super().copy_tensors_held(src, dst, streams)
    assert Metered(dt.devices).held_copier(host, dev, stream) is None
    up, down = dt.held_copier(host, dev, stream), dt.held_copier(dev, host, stream)
    alloc = factory.create_allocator(mem)
    for shape in ((0, 3), (2, 5)):
        x = np.arange(shape[0] * shape[1], dtype=np.float32).reshape(shape)
        t = alloc.tensor(shape, np.float32)
        up(x, t).wait()
        back = np.full(shape, -1.0, np.float32)
        down(t, back).wait()
        np.testing.assert_array_equal(back, x)
