"""A hal EP's device memory declared to onnxruntime: OrtMemoryInfo, OrtAllocator, OrtDataTransferImpl.

With these onnxruntime keeps values in the simulated device's memory: it allocates the EP's
tensors there, plans its own copies (through ``OrtDataTransferImpl::CopyTensors``, done by the hal
factory's data transfer) and passes values between partitions of the same device without a trip
through host memory.

Device buffers are Python objects (numpy buffers on the host backend, ``cl.Buffer``s on OpenCL) that
have no address onnxruntime could use, so each allocation gets one in ``AddressSpace``: a range of
virtual addresses reserved with ``mmap(PROT_NONE)``, never backed by memory. onnxruntime only
stores, offsets and compares device pointers (it never reads device memory itself); the bridge
turns a pointer back into (buffer, offset) with a sorted lookup. Were anything to dereference one,
it would fault at once rather than corrupt host memory.
"""

from __future__ import annotations

import bisect
import ctypes
import mmap
import threading
from ctypes import POINTER, c_size_t, c_uint32, c_void_p
from typing import Any

import numpy as np

from onnxhal.hal.enums import OrtDeviceMemoryType, OrtMemoryInfoDeviceType
from onnxhal.hal.errors import InvalidArgument, OutOfMemory
from onnxhal.hal.memory_info import OrtMemoryDevice, OrtMemoryInfo
from onnxhal.hal.tensor import DeviceTensor
from onnxhal.ort_plugin import dispatch as d
from onnxhal.ort_plugin import streams as sync_streams  # a module: streams.py imports this one too
from onnxhal.ort_plugin import tensors
from onnxhal.ort_plugin.ort_api import OrtApi
from onnxhal.ort_plugin.structs import words

_ALIGN = 256
#: Address space to reserve, no memory behind it: the first size the system grants (a ``ulimit -v``
#: may refuse 1 TiB).
_RESERVE_SIZES = (1 << 40, 1 << 36, 1 << 32)


class AddressSpace:
    """Addresses for device buffers: a PROT_NONE reservation, handed out in aligned ranges and
    reused by size once freed."""

    def __init__(self, sizes: tuple[int, ...] = _RESERVE_SIZES) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = c_void_p
        libc.mmap.argtypes = [c_void_p, c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0x4000)
        failed = ctypes.c_void_p(-1).value
        base, size = None, 0
        for size in sizes:
            base = libc.mmap(None, size, getattr(mmap, "PROT_NONE", 0), flags, -1, 0)
            if base not in (None, failed):
                break
        if base in (None, failed):
            raise OutOfMemory(f"cannot reserve {size >> 30} GiB of address space for onnxhal's device buffers "
                              f"(errno {ctypes.get_errno()}); raise 'ulimit -v', or configure(device_memory=False)")
        self.base, self.end, self.next = base, base + size, base
        self._free: dict[int, list[int]] = {}  # rounded size -> free start addresses
        self._starts: list[int] = []  # sorted starts of live ranges
        self._live: dict[int, tuple[int, Any, OrtMemoryInfo]] = {}  # start -> (size, buffer, hal memory info)
        self._lock = threading.Lock()

    def add(self, size: int, buffer: Any, info: OrtMemoryInfo) -> int:
        rounded = max(_ALIGN, -(-int(size) // _ALIGN) * _ALIGN)
        with self._lock:
            spare = self._free.get(rounded)
            if spare:
                start = spare.pop()
            else:
                if self.next + rounded > self.end:
                    raise OutOfMemory("onnxhal's device address space is exhausted")
                start, self.next = self.next, self.next + rounded + _ALIGN  # a gap: no two ranges touch
            bisect.insort(self._starts, start)
            self._live[start] = (rounded, buffer, info)
        return start

    def remove(self, start: int) -> Any:
        with self._lock:
            size, buffer, _ = self._live.pop(start)
            self._starts.pop(bisect.bisect_left(self._starts, start))
            self._free.setdefault(size, []).append(start)
        return buffer

    def find(self, address: int) -> tuple[Any, int, OrtMemoryInfo] | None:
        """(buffer, byte offset, memory info) of the live range holding ``address``, or None."""
        with self._lock:
            i = bisect.bisect_right(self._starts, address) - 1
            if i < 0:
                return None
            start = self._starts[i]
            size, buffer, info = self._live[start]
        return (buffer, address - start, info) if address < start + size else None


_space: list[AddressSpace] = []


def address_space() -> AddressSpace:
    if not _space:
        _space.append(AddressSpace())
    return _space[0]


def memory_device_of(api: OrtApi, ort_memory_device: int) -> OrtMemoryDevice:
    e = api.ep
    return OrtMemoryDevice(device_type=OrtMemoryInfoDeviceType(e["MemoryDevice_GetDeviceType"](ort_memory_device)),
                           memory_type=OrtDeviceMemoryType(e["MemoryDevice_GetMemoryType"](ort_memory_device)),
                           vendor_id=int(e["MemoryDevice_GetVendorId"](ort_memory_device)),
                           device_id=int(e["MemoryDevice_GetDeviceId"](ort_memory_device)))


def host_or_device(value: int, api: OrtApi, what: str = "a tensor") -> Any:
    """An OrtValue as a hal DeviceTensor over the same buffer (onnxhal device memory) or as a numpy
    view of onnxruntime's buffer (host memory). A non-empty tensor with no data (an allocation that
    failed) is ``OutOfMemory``, naming it as ``what``."""
    dtype, shape, address = tensors.describe(api, value)
    found = address_space().find(address) if _space and address else None
    if found is None:
        return tensors.view_at(address, dtype, shape, what)
    buffer, offset, info = found
    return DeviceTensor(shape, dtype, info, buffer, offset)


# Every member onnxruntime's OrtAllocator has had, those past Reserve NULL (``version`` 18 says they
# are absent; the NULLs are for a reader that tests the pointer instead).
AllocatorStruct = type("OrtAllocator", (ctypes.Structure,), {"_fields_": [
    ("version", c_uint32), ("Alloc", c_void_p), ("Free", c_void_p), ("Info", c_void_p), ("Reserve", c_void_p),
    ("GetStats", c_void_p), ("AllocOnStream", c_void_p), ("Shrink", c_void_p), ("_spare", c_void_p * 8)]})
DataTransferStruct = type("OrtDataTransferImpl", (ctypes.Structure,), {"_fields_": [
    ("ort_version_supported", c_uint32), ("Release", c_void_p), ("CanCopy", c_void_p), ("CopyTensors", c_void_p)]})
#: OrtAllocator's version: 18 is the first with Reserve, the last member filled here.
ALLOCATOR_VERSION = 18


_adoption = threading.local()


def adoptable(value: Any) -> bool:
    """Whether ``value`` may become onnxruntime's output tensor as it is: a tensor in device memory
    at the start of a buffer that onnxhal allocated (not one onnxruntime handed in, which it frees
    on its own)."""
    if not isinstance(value, DeviceTensor) or value.offset != 0:
        return False
    owner = value.base or value
    return owner.allocator is not None


def offer_for_output(value: Any) -> None:
    """Until ``withdraw_offer``, the next allocation of ``value``'s size in its memory on this thread
    (onnxruntime allocating a partition output in ``KernelContext_GetOutput``) is ``value``'s own
    buffer, so the output needs no copy; onnxruntime's Free of it drops the tensor."""
    _adoption.value = value if adoptable(value) else None


def withdraw_offer() -> None:
    _adoption.value = None


def _take_offer(size: int, memory_device: OrtMemoryDevice) -> DeviceTensor | None:
    value = getattr(_adoption, "value", None)
    if value is None or value.nbytes != size or value.memory_info.memory_device != memory_device:
        return None
    _adoption.value = None
    return value


class AllocatorAdapter:
    """A hal allocator as an OrtAllocator whose pointers are addresses in ``AddressSpace``."""

    def __init__(self, allocator: Any, ort_info: int) -> None:
        self.allocator = allocator
        self.ort_info = ort_info
        self.struct = AllocatorStruct(ALLOCATOR_VERSION, d.trampoline("a_alloc"), d.trampoline("a_free"),
                                      d.trampoline("a_info"), d.trampoline("a_reserve"))
        self.address = ctypes.addressof(self.struct)
        self.live: set[int] = set()  # addresses handed out and not freed yet
        self.adopted: dict[int, DeviceTensor] = {}  # address -> the partition output it is (offer_for_output)
        self.released = False
        self._lock = threading.Lock()
        d.objects[self.address] = self

    def alloc(self, size: int, reserve: bool = False) -> int:
        offered = None if reserve else _take_offer(size, self.allocator.info.memory_device)
        if offered is not None:
            address = address_space().add(size, offered.buffer, self.allocator.info)
            with self._lock:
                self.adopted[address] = offered
                self.live.add(address)
            return address
        buffer = self.allocator.reserve(size) if reserve else self.allocator.alloc(size)
        address = address_space().add(size, buffer, self.allocator.info)
        with self._lock:
            self.live.add(address)
        return address

    def free(self, address: int) -> None:
        if not address:
            return
        buffer = address_space().remove(address)
        with self._lock:
            adopted = self.adopted.pop(address, None)
        if adopted is None:
            self.allocator.free(buffer)
        # an adopted output's buffer goes back to its own allocator when the tensor is gone
        del adopted
        with self._lock:
            self.live.discard(address)
            done = self.released and not self.live
        if done:
            d.objects.pop(self.address, None)

    def release(self) -> None:
        """onnxruntime's ReleaseAllocator. Values it allocated may be freed later (a session that ends
        after its library was unregistered): until the last is, the struct stays reachable."""
        with self._lock:
            self.released = True
            done = not self.live
        if done:
            d.objects.pop(self.address, None)


class DataTransferAdapter:
    """A hal DataTransfer as an OrtDataTransferImpl: onnxruntime's copies between host memory and
    the device (and between devices the transfer knows)."""

    def __init__(self, api: OrtApi, transfer: Any) -> None:
        self.api = api
        self.transfer = transfer
        self.struct = DataTransferStruct(23, d.trampoline("d_release"), d.trampoline("d_can_copy"),
                                         d.trampoline("d_copy_tensors"))
        self.address = ctypes.addressof(self.struct)
        d.objects[self.address] = self

    def can_copy(self, args: Any) -> int:
        src, dst = memory_device_of(self.api, args[0]), memory_device_of(self.api, args[1])
        return int(bool(self.transfer.can_copy(_hal_side(src), _hal_side(dst))))

    def copy_tensors(self, args: Any) -> None:
        n = args[3]
        srcs = ctypes.cast(args[0], POINTER(c_void_p))
        dsts = ctypes.cast(args[1], POINTER(c_void_p))
        src = [host_or_device(srcs[i], self.api, f"the source of copy {i}") for i in range(n)]
        dst = [host_or_device(dsts[i], self.api, f"the destination of copy {i}") for i in range(n)]
        pairs = []
        for i, (s, t) in enumerate(zip(src, dst)):
            if not isinstance(s, DeviceTensor) and not isinstance(t, DeviceTensor):
                # An empty tensor has no buffer, so it reads as host memory on either side: nothing to copy.
                if isinstance(s, np.ndarray) and isinstance(t, np.ndarray) and s.size == t.size == 0:
                    continue
                raise InvalidArgument(f"copy {i}: neither side is in onnxhal device memory")
            pairs.append((i, np.ascontiguousarray(s) if isinstance(s, np.ndarray) else s, t))
        # onnxruntime's streams (NULL when the EP is not stream aware): the copies are queued on them
        # and onnxruntime's notifications wait for them (streams.py)
        streams = [sync_streams.hal_stream(self.api, w) for w in words(args[2], n)] if args[2] else None
        if pairs:
            self.transfer.copy_tensors([s for _, s, _ in pairs], [t for _, _, t in pairs],
                                       [streams[i] for i, _, _ in pairs] if streams is not None else None)

    def release(self) -> None:
        d.objects.pop(self.address, None)


def _hal_side(device: OrtMemoryDevice) -> OrtMemoryDevice:
    """onnxruntime's CPU memory (of any vendor id) is the host memory of hal's transfers."""
    if device.device_type == OrtMemoryInfoDeviceType.CPU:
        return OrtMemoryDevice(device_type=OrtMemoryInfoDeviceType.CPU, memory_type=OrtDeviceMemoryType.DEFAULT,
                               vendor_id=0, device_id=0)
    return device


d.HANDLERS.update({
    d.A_ALLOC: lambda a, args: a.alloc(args[0]),
    d.A_RESERVE: lambda a, args: a.alloc(args[0], reserve=True),
    d.A_FREE: lambda a, args: a.free(args[0]),
    d.A_INFO: lambda a, args: a.ort_info,
    d.D_RELEASE: lambda t, args: t.release() if t is not None else None,
    d.D_CAN_COPY: lambda t, args: t.can_copy(args),
    d.D_COPY_TENSORS: lambda t, args: t.copy_tensors(args),
})
