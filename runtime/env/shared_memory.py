"""Environment-level memory: shared allocators and data transfers outside any session.

ORT creates a shared allocator for each memory info an EP device declares, and ``CopyTensors``
uses the data transfers of all registered factories. Here both are made on first use.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from onnxhal.hal import Allocator, DataTransfer, DeviceTensor, OrtMemoryInfo, SyncStream
from onnxhal.hal.enums import OrtDeviceMemoryType, OrtMemoryInfoDeviceType
from onnxhal.hal.errors import Fail, InvalidArgument
from onnxhal.hal.memory_info import HOST_MEMORY_DEVICE, OrtMemoryDevice
from onnxhal.runtime.env.environment import get_environment

_lock = threading.Lock()
_allocators: dict[OrtMemoryDevice, Allocator] = {}
_registered: set[OrtMemoryDevice] = set()  # devices whose allocator the application registered

_DEVICE_TYPES = {"gpu": OrtMemoryInfoDeviceType.GPU, "cuda": OrtMemoryInfoDeviceType.GPU,
                 "dml": OrtMemoryInfoDeviceType.GPU, "npu": OrtMemoryInfoDeviceType.NPU,
                 "fpga": OrtMemoryInfoDeviceType.FPGA, "cpu": OrtMemoryInfoDeviceType.CPU}


def _declared_infos() -> list[tuple[OrtMemoryInfo, Any]]:
    out = []
    for d in get_environment().ep_devices():
        for t in (OrtDeviceMemoryType.DEFAULT, OrtDeviceMemoryType.HOST_ACCESSIBLE):
            info = d.memory_info(t)
            if info is not None:
                out.append((info, d))
    return out


def device_memory_info(device_type: str, device_id: int = 0, vendor_id: int = -1) -> OrtMemoryInfo:
    """The DEFAULT memory info an EP device declared for ``device_type`` ("gpu", "npu", or a memory
    info name such as "opencl"), ``device_id`` and ``vendor_id`` (-1: any vendor)."""
    key = device_type.lower()
    for info, _ in _declared_infos():
        if info.device_mem_type != OrtDeviceMemoryType.DEFAULT:
            continue
        type_ok = info.name.lower() == key or _DEVICE_TYPES.get(key) == info.device_type
        if type_ok and info.device_id == device_id and (vendor_id in (-1, None) or info.device_vendor_id == vendor_id):
            return info
    known = sorted({f"{i.name} ({i.device_type.name.lower()}, id {i.device_id}, vendor 0x{i.device_vendor_id:x})"
                    for i, _ in _declared_infos()})
    raise InvalidArgument(f"no EP device declares memory for device_type={device_type!r}, device_id={device_id}, "
                          f"vendor_id={vendor_id}. Declared device memories: {known or 'none'}; register the EP "
                          "library of that device first.")


def register_shared_allocator(dev: OrtMemoryDevice, allocator: Allocator) -> None:
    """Make ``allocator`` the environment's allocator for ``dev`` (replacing any), as onnxruntime's
    ``create_and_register_allocator``: OrtValues made outside sessions, and sessions with
    ``session.use_env_allocators`` = "1", allocate from it."""
    with _lock:
        _allocators[dev] = allocator
        _registered.add(dev)


def unregister_shared_allocator(dev: OrtMemoryDevice) -> None:
    """Forget the allocator registered for ``dev``; the declaring factory makes a new one on next use."""
    with _lock:
        if dev in _registered:
            _registered.discard(dev)
            _allocators.pop(dev, None)


def registered_allocator(dev: OrtMemoryDevice) -> Allocator | None:
    """The allocator an application registered for ``dev``, or None."""
    with _lock:
        return _allocators.get(dev) if dev in _registered else None


def shared_allocator(info: OrtMemoryInfo) -> Allocator:
    dev = info.memory_device
    with _lock:
        alloc = _allocators.get(dev)
        if alloc is not None:
            return alloc
        for declared, ep_device in _declared_infos():
            if declared.memory_device == dev:
                alloc = ep_device.factory.create_allocator(declared)
                if alloc is not None:
                    _allocators[dev] = alloc
                    return alloc
    raise Fail(f"No shared allocator found for {info.name} ({dev}): no registered EP factory creates an allocator "
               "for that memory.")


def _transfer_for(src: OrtMemoryDevice, dst: OrtMemoryDevice) -> DataTransfer:
    for lib in get_environment().libraries():
        for f in lib.factories:
            t = f.create_data_transfer()
            if t is not None and t.can_copy(src, dst):
                return t
    raise Fail(f"Data transfer implementation between {src} and {dst} not found: no registered EP library copies "
               "between these memories.")


def _device(v: Any) -> OrtMemoryDevice:
    return v.memory_info.memory_device if isinstance(v, DeviceTensor) else HOST_MEMORY_DEVICE


def copy_values(src: Sequence[Any], dst: Sequence[Any], stream: SyncStream | None) -> None:
    """Copy tensors (numpy arrays or DeviceTensors) into preallocated destinations, then wait."""
    devs = {(_device(s), _device(d)) for s, d in zip(src, dst)}
    if len(devs) != 1:
        raise InvalidArgument("copy_tensors: all sources must share one device and all destinations another")
    (s_dev, d_dev), = devs
    if s_dev.is_host and d_dev.is_host:
        raise Fail(f"Data transfer implementation between {s_dev} and {d_dev} not found: both are host memory; "
                   "use numpy to copy between host arrays.")
    transfer = _transfer_for(s_dev, d_dev)
    transfer.copy_tensors([np.ascontiguousarray(s) if isinstance(s, np.ndarray) else s for s in src], list(dst),
                          [stream] * len(src) if stream is not None else None)
    if stream is not None:
        note = stream.create_notification()
        note.activate()
        note.wait_on_host()


def copy_value(src: Any, dst: Any) -> None:
    """One tensor into a preallocated one of the same shape and dtype, wherever either lives:
    numpy's copy between host arrays, the registered data transfers otherwise."""
    if isinstance(src, DeviceTensor) or isinstance(dst, DeviceTensor):
        copy_values([src], [dst], None)
    else:
        np.copyto(dst, src)
