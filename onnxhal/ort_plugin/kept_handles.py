"""onnxruntime objects the bridge creates for an EP library and never frees: its OrtMemoryInfos
and its virtual OrtHardwareDevices.

onnxruntime's Python objects point at them without owning them: ``ep_device.memory_info(...)`` and
``ep_device.device`` stay usable after ``unregister_execution_provider_library``, and reading one
the library had freed at unregister crashed the process (onnxruntime 1.28 to 1.32) or returned
garbage. So each is made once per process, reused by every later registration that declares the
same memory or device (a few small objects per profile, however often a library is registered),
and left to the process's exit.
"""

from __future__ import annotations

import ctypes
import threading
from ctypes import c_void_p

from onnxhal.hal.hardware_device import OrtHardwareDevice
from onnxhal.hal.memory_info import OrtMemoryInfo
from onnxhal.ort_plugin.ort_api import OrtApi

_lock = threading.Lock()
_memory_infos: dict[tuple, int] = {}
_hardware_devices: dict[tuple, int] = {}


def memory_info(api: OrtApi, info: OrtMemoryInfo) -> int:
    """The process's OrtMemoryInfo* for a hal memory info (same name, device, kind and alignment)."""
    key = (info.name, int(info.device_type), info.device_vendor_id, info.device_id, int(info.device_mem_type),
           int(info.alignment), int(info.allocator_type))
    with _lock:
        known = _memory_infos.get(key)
        if known is None:
            out = c_void_p()
            api.call("CreateMemoryInfo_V2", info.name.encode(), *key[1:], ctypes.byref(out))
            known = _memory_infos[key] = out.value
    return known


def hardware_device(api: OrtApi, hw: OrtHardwareDevice) -> int:
    """The process's virtual OrtHardwareDevice* for a hal hardware device of the same type, ids,
    vendor and metadata (keyed on those values: a factory may make new hal objects on every call)."""
    metadata = dict(hw.metadata)
    key = (int(hw.type), hw.vendor_id, hw.device_id, hw.vendor, tuple(sorted(metadata.items())))
    with _lock:
        known = _hardware_devices.get(key)
        if known is None:
            md = api.make_pairs(metadata)
            out = c_void_p()
            try:
                api.ep_call("CreateHardwareDevice", int(hw.type), hw.vendor_id, hw.device_id, hw.vendor.encode(), md,
                            ctypes.byref(out))
            finally:
                api.release_pairs(md)
            known = _hardware_devices[key] = out.value
    return known


def counts() -> dict[str, int]:
    """How many of each the process holds (what tests and the RSS benchmark check stays bounded)."""
    with _lock:
        return {"memory_infos": len(_memory_infos), "hardware_devices": len(_hardware_devices)}
