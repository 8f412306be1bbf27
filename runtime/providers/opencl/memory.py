"""Device memory of the OpenCL EP: memory info, allocator, data transfer, streams, notifications.

Memory identity: an OpenCL device's memory is ``OrtMemoryInfo.create_v2("OpenCL", <type>,
<vendor id>, <ordinal>, DEFAULT, 0, ORT_DEVICE_ALLOCATOR)`` where <type> follows the hardware device
(GPU, NPU, else CPU), <vendor id> is the hardware device's PCI vendor id, or ``ONNXHAL_OPENCL_VENDOR_ID``
when that is 0, and <ordinal> numbers OpenCL devices in (platform, device) order. The vendor id is
never 0, so even PoCL's CPU device has a memory device distinct from plain host memory and every
transfer path (host->device, device->host, device->device) really runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pyopencl as cl

from onnxhal.hal.allocator import Allocator
from onnxhal.hal.data_transfer import DataTransfer
from onnxhal.hal.enums import (
    OrtAllocatorType,
    OrtDeviceMemoryType,
    OrtHardwareDeviceType,
    OrtMemoryInfoDeviceType,
)
from onnxhal.hal.errors import InvalidArgument
from onnxhal.hal.memory_info import OrtMemoryDevice, OrtMemoryInfo
from onnxhal.hal.sync_stream import SyncNotification, SyncStream
from onnxhal.hal.tensor import DeviceTensor
from onnxhal.runtime.providers.opencl.device_context import OpenCLDeviceContext

#: Vendor id of OpenCL device memory when the hardware device reports none ("OH", onnxhal).
ONNXHAL_OPENCL_VENDOR_ID = 0x4F48

_MEMORY_DEVICE_TYPES = {OrtHardwareDeviceType.GPU: OrtMemoryInfoDeviceType.GPU,
                        OrtHardwareDeviceType.NPU: OrtMemoryInfoDeviceType.NPU,
                        OrtHardwareDeviceType.CPU: OrtMemoryInfoDeviceType.CPU}


def opencl_memory_info(hardware_type: OrtHardwareDeviceType, hardware_vendor_id: int, ordinal: int) -> OrtMemoryInfo:
    """The DEFAULT memory info of the ``ordinal``-th OpenCL device, on a hardware device of this type."""
    vendor = hardware_vendor_id or ONNXHAL_OPENCL_VENDOR_ID
    return OrtMemoryInfo.create_v2("OpenCL", _MEMORY_DEVICE_TYPES[OrtHardwareDeviceType(hardware_type)], vendor,
                                   ordinal, OrtDeviceMemoryType.DEFAULT, 0, OrtAllocatorType.ORT_DEVICE_ALLOCATOR)


class OpenCLAllocator(Allocator):
    """``cl.Buffer``s on one device. ``limit`` caps bytes in use (PoCL's reported memory size is not
    trusted, so there is no default cap)."""

    def __init__(self, device: OpenCLDeviceContext, info: OrtMemoryInfo, limit: int = 0) -> None:
        super().__init__(info, limit)
        self.device = device

    def _alloc(self, size: int) -> cl.Buffer:
        # OpenCL rejects empty buffers; a 0-element tensor still gets a (tiny) handle of its own.
        return cl.Buffer(self.device.context, cl.mem_flags.READ_WRITE, max(int(size), 4))

    def _free(self, buffer: object) -> None:
        # clReleaseMemObject defers the real free until queued commands using the buffer finish,
        # so freeing right after enqueueing the last user is safe.
        buffer.release()

    def tensor(self, shape: Sequence[int], dtype: np.dtype) -> DeviceTensor:
        """A new DeviceTensor of this allocator, freed when the last reference to it goes."""
        return DeviceTensor.allocate(tuple(shape), np.dtype(dtype), self)


class OpenCLNotification(SyncNotification):
    """A marker event on the producing stream's queue."""

    def __init__(self, stream: OpenCLSyncStream) -> None:
        self.stream = stream
        self.event: cl.Event | None = None

    def activate(self) -> None:
        self.event = cl.enqueue_marker(self.stream.queue)
        self.stream.queue.flush()  # the marker must be submitted before anyone can wait on it

    def wait_on_device(self, consumer_stream: SyncStream) -> None:
        if self.event is None:
            return
        queue = consumer_stream.handle() if consumer_stream is not None else None
        if isinstance(queue, cl.CommandQueue) and queue.context == self.stream.queue.context:
            if queue != self.stream.queue:  # same in-order queue: already ordered
                cl.enqueue_barrier(queue, wait_for=[self.event])
        else:  # an inline (host) stream or another context: the host waits for the work
            self.event.wait()

    def wait_on_host(self) -> None:
        if self.event is not None:
            self.event.wait()


class OpenCLSyncStream(SyncStream):
    """A stream is an in-order command queue of its own on the device."""

    def __init__(self, device: OpenCLDeviceContext) -> None:
        self.device = device
        self.queue = device.new_queue()

    def handle(self) -> cl.CommandQueue:
        return self.queue

    def create_notification(self) -> OpenCLNotification:
        return OpenCLNotification(self)

    def flush(self) -> None:
        self.queue.flush()

    def on_session_run_end(self) -> None:
        self.queue.flush()

    def finish(self) -> None:
        """Block until everything queued on this stream is done (tests, benchmarks)."""
        self.queue.finish()


class OpenCLDataTransfer(DataTransfer):
    """Copies between host memory and the OpenCL devices of ``devices`` (memory device -> context),
    and between two of those devices."""

    def __init__(self, devices: dict[OrtMemoryDevice, OpenCLDeviceContext]) -> None:
        self.devices = dict(devices)

    def can_copy(self, src_memory_device: OrtMemoryDevice, dst_memory_device: OrtMemoryDevice) -> bool:
        src_ok = src_memory_device.is_host or src_memory_device in self.devices
        dst_ok = dst_memory_device.is_host or dst_memory_device in self.devices
        return src_ok and dst_ok and not (src_memory_device.is_host and dst_memory_device.is_host)

    def copy_tensors(self, src: Sequence[object], dst: Sequence[object],
                     streams: Sequence[SyncStream | None] | None = None) -> None:
        # Every copy is complete on return, stream or not: onnxruntime's callers (the plugin bridge)
        # reuse the host array once this returns (docs/opencl-internals.md, "Copies wait").
        queued: list[cl.Event] = []
        self._copy_all(src, dst, streams, queued)
        if queued:
            cl.wait_for_events(queued)

    def copy_tensors_held(self, src: Sequence[object], dst: Sequence[object],
                          streams: Sequence[SyncStream | None]) -> OpenCLHeldCopies:
        """The copies queued on a stream are not waited for: their events (which hold the host
        arrays) go in the returned handle, and the caller waits on it or on the stream."""
        held: list[cl.Event] = []
        self._copy_all(src, dst, streams, held)
        return OpenCLHeldCopies(held)

    def held_copier(self, src_memory_device: OrtMemoryDevice, dst_memory_device: OrtMemoryDevice,
                    stream: SyncStream) -> Callable[[object, object], OpenCLHeldCopies] | None:
        """``pair_copier`` for this transfer's devices. None from a subclass that does more per copy
        in its ``copy_tensors_held`` (a meter): it gives its own copier or none."""
        if type(self).copy_tensors_held is not OpenCLDataTransfer.copy_tensors_held:
            return None
        return pair_copier(self.devices, src_memory_device, dst_memory_device, stream)

    def _copy_all(self, src: Sequence[object], dst: Sequence[object],
                  streams: Sequence[SyncStream | None] | None, held: list[cl.Event]) -> None:
        if len(src) != len(dst):
            raise InvalidArgument(f"copy_tensors: {len(src)} sources but {len(dst)} destinations")
        streams = list(streams) if streams is not None else [None] * len(src)
        blocking_queues: set[cl.CommandQueue] = set()
        for i, (s, d) in enumerate(zip(src, dst)):
            stream = streams[i] if i < len(streams) else None
            event = self._copy_one(i, s, d, stream, blocking_queues)
            if event is not None:
                held.append(event)
        for q in blocking_queues:  # no stream given: the copy is complete on return
            q.finish()

    def _queue_for(self, tensor: DeviceTensor, stream: SyncStream | None,
                   blocking: set[cl.CommandQueue]) -> cl.CommandQueue:
        device = self.devices.get(tensor.memory_device)
        if device is None:
            raise InvalidArgument(f"copy_tensors: {tensor!r} is not in the memory of this OpenCL data transfer "
                                  f"(devices {[str(m) for m in self.devices]})")
        queue = stream.handle() if stream is not None else None
        if device.in_context(queue):
            return queue
        blocking.add(device.queue)
        return device.queue

    def _copy_one(self, i: int, s: object, d: object, stream: SyncStream | None,
                  blocking: set[cl.CommandQueue]) -> cl.Event | None:
        """Queue one copy; its event where it may still run on return (None: nothing queued)."""
        if isinstance(s, np.generic):  # a numpy scalar is a 0-d host tensor
            s = np.asarray(s)
        src_nbytes = s.nbytes
        if src_nbytes != d.nbytes:
            raise InvalidArgument(f"copy_tensors: pair {i}: source {getattr(s, 'dtype', '?')}{list(s.shape)} has "
                                  f"{src_nbytes} bytes, destination {d.dtype}{list(d.shape)} has {d.nbytes} bytes")
        if src_nbytes == 0:
            return None
        if isinstance(s, np.ndarray) and isinstance(d, DeviceTensor):
            q = self._queue_for(d, stream, blocking)
            host = np.ascontiguousarray(s)
            return cl.enqueue_copy(q, d.buffer, host, dst_offset=d.offset, is_blocking=False)
        elif isinstance(s, DeviceTensor) and isinstance(d, np.ndarray):
            if not (d.flags.c_contiguous and d.flags.writeable):
                raise InvalidArgument(f"copy_tensors: pair {i}: host destination must be a writable C-contiguous "
                                      "array; allocate it with numpy.empty")
            q = self._queue_for(s, stream, blocking)
            return cl.enqueue_copy(q, d, s.buffer, src_offset=s.offset, is_blocking=False)
        elif isinstance(s, DeviceTensor) and isinstance(d, DeviceTensor):
            qs = self._queue_for(s, stream, blocking)
            qd = self._queue_for(d, stream, blocking)
            if qs.context == qd.context:
                return cl.enqueue_copy(qd, d.buffer, s.buffer, byte_count=src_nbytes, src_offset=s.offset,
                                       dst_offset=d.offset)
            else:  # two OpenCL contexts: through the host
                staging = np.empty(src_nbytes, np.uint8)
                cl.enqueue_copy(qs, staging, s.buffer, src_offset=s.offset, is_blocking=True)
                cl.enqueue_copy(qd, d.buffer, staging, dst_offset=d.offset, is_blocking=True)
                return None
        else:
            raise InvalidArgument(f"copy_tensors: pair {i}: cannot copy {type(s).__name__} to {type(d).__name__}; "
                                  "one side must be an OpenCL DeviceTensor, the other a numpy array or DeviceTensor")


class OpenCLHeldCopies:
    """The events of copies left running (pyopencl's ``NannyEvent`` holds a copy's host array and
    waits for the copy when dropped, so a handle dropped unwaited still never frees it early)."""

    def __init__(self, events: list[cl.Event]) -> None:
        self.events = events

    def wait(self) -> None:
        if self.events:
            cl.wait_for_events(self.events)


def pair_copier(devices: dict[OrtMemoryDevice, OpenCLDeviceContext], src_memory_device: OrtMemoryDevice,
                dst_memory_device: OrtMemoryDevice,
                stream: SyncStream | None) -> Callable[[object, object], OpenCLHeldCopies] | None:
    """One host <-> device pair's ``copy_tensors_held`` on ``stream``'s queue, found once
    (``DataTransfer.held_copier``): the checks and look-ups of ``_copy_all`` / ``_copy_one`` (a list
    of pairs, the kind of copy, the byte counts, the queue's context) were a dozen Python calls around
    each upload and download of a run. None for another pair of devices, or a stream whose queue is
    not in the device's context (``copy_tensors_held`` then queues on the device's own queue and waits)."""
    if src_memory_device.is_host == dst_memory_device.is_host:
        return None
    device = devices.get(src_memory_device if dst_memory_device.is_host else dst_memory_device)
    queue = stream.handle() if stream is not None else None
    if device is None or not device.in_context(queue):
        return None
    nothing = OpenCLHeldCopies([])
    # cl.enqueue_copy looked up at each copy, as _copy_one does: benchmarks count copies by wrapping it

    if src_memory_device.is_host:
        def upload(s: np.ndarray, d: DeviceTensor) -> OpenCLHeldCopies:
            if not s.nbytes:  # OpenCL rejects an empty copy
                return nothing
            return OpenCLHeldCopies([cl.enqueue_copy(queue, d.buffer, s, dst_offset=d.offset, is_blocking=False)])
        return upload

    def download(s: DeviceTensor, d: np.ndarray) -> OpenCLHeldCopies:
        if not d.nbytes:
            return nothing
        return OpenCLHeldCopies([cl.enqueue_copy(queue, d, s.buffer, src_offset=s.offset, is_blocking=False)])
    return download
