"""The C structs the bridge hands onnxruntime (OrtEpFactory, OrtEp, OrtNodeComputeInfo,
OrtNodeFusionOptions), filled with bridge.c's trampolines, and small helpers for the words that
arrive from C: output pointers to write, pointer arrays to read, strings that must outlive a call."""

from __future__ import annotations

import ctypes
from ctypes import POINTER, Structure, c_bool, c_uint32, c_void_p
from typing import Any

from onnxhal.ort_plugin import dispatch as d
from onnxhal.ort_plugin.ort_api import API_VERSION


def _struct(name: str, slots: list[tuple[str, str | None]]) -> type[Structure]:
    return type(name, (Structure,), {"_fields_": [("ort_version_supported", c_uint32)]
                                     + [(field, c_void_p) for field, _ in slots], "slots": slots})


# (struct member, bridge.c trampoline or None for "not implemented"), in onnxruntime's member order
# for API version 23 (onnxruntime_ep_c_api.h): onnxruntime reads no member past that version.
FactoryStruct = _struct("OrtEpFactory", [
    ("GetName", "f_get_name"), ("GetVendor", "f_get_vendor"), ("GetSupportedDevices", "f_get_supported_devices"),
    ("CreateEp", "f_create_ep"), ("ReleaseEp", "f_release_ep"), ("GetVendorId", "f_get_vendor_id"),
    ("GetVersion", "f_get_version"), ("ValidateCompiledModelCompatibilityInfo", "f_validate_compat"),
    ("CreateAllocator", "f_create_allocator"), ("ReleaseAllocator", "f_release_allocator"),
    ("CreateDataTransfer", "f_create_data_transfer"), ("IsStreamAware", "f_is_stream_aware"),
    ("CreateSyncStreamForDevice", "f_create_sync_stream")])
EpStruct = _struct("OrtEp", [
    ("GetName", "e_get_name"), ("GetCapability", "e_get_capability"), ("Compile", "e_compile"),
    ("ReleaseNodeComputeInfos", "e_release_compute_infos"), ("GetPreferredDataLayout", "e_get_layout"),
    ("ShouldConvertDataLayoutForOp", "e_should_convert"), ("SetDynamicOptions", "e_set_dynamic_options"),
    ("OnRunStart", "e_on_run_start"), ("OnRunEnd", "e_on_run_end"), ("CreateAllocator", None),
    ("CreateSyncStreamForDevice", None), ("GetCompiledModelCompatibilityInfo", "e_get_compat_info")])
ComputeStruct = _struct("OrtNodeComputeInfo", [
    ("CreateState", "c_create_state"), ("Compute", "c_compute"), ("ReleaseState", "c_release_state")])


class FusionOptions(Structure):
    _fields_ = [("ort_version_supported", c_uint32), ("drop_constant_initializers", c_bool)]


def fill(struct: Structure) -> Structure:
    struct.ort_version_supported = API_VERSION
    for field, tramp in struct.slots:
        setattr(struct, field, d.trampoline(tramp) if tramp else None)
    return struct


def write_out(address: int, value: int, ctype: Any = c_void_p) -> None:
    ctypes.cast(address, POINTER(ctype))[0] = value


def words(address: int, count: int) -> list[int]:
    if not count:
        return []
    arr = ctypes.cast(address, POINTER(c_void_p))
    return [arr[i] or 0 for i in range(count)]


class Strings:
    """Persistent C strings: onnxruntime may read a returned ``const char*`` after the call."""

    def __init__(self) -> None:
        self._keep: dict[str, ctypes.Array] = {}

    def __call__(self, text: str) -> int:
        buf = self._keep.get(text)
        if buf is None:
            buf = self._keep[text] = ctypes.create_string_buffer(text.encode())
        return ctypes.addressof(buf)
