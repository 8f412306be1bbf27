"""The C structs the bridge hands onnxruntime (OrtEpFactory, OrtEp, OrtNodeComputeInfo,
OrtNodeFusionOptions), filled with bridge.c's trampolines, and small helpers for the words that
arrive from C: output pointers to write, pointer arrays to read, strings that must outlive a call."""

from __future__ import annotations

import ctypes
from ctypes import POINTER, Structure, c_bool, c_uint32, c_void_p
from typing import Any

from onnxhal.ort_plugin import dispatch as d
from onnxhal.ort_plugin.ep_struct_table import NEWEST_VERSION, ORT_EP, ORT_EP_FACTORY
from onnxhal.ort_plugin.ort_api import API_VERSION

#: Empty slots after the last member a table knows: an onnxruntime newer than the table that reads
#: one more member finds NULL ("not implemented") instead of memory past the struct.
SPARE_SLOTS = 16


def _struct(name: str, members: list[tuple[str, int | None]], trampolines: dict[str, str]) -> type[Structure]:
    """A ctypes struct with ``members`` in onnxruntime's order; ``slots`` pairs each member with the
    API version it arrived in and bridge.c's trampoline for it (None: left NULL, "not implemented")."""
    slots = [(member, since, trampolines.get(member)) for member, since in members]
    fields = ([("ort_version_supported", c_uint32)] + [(member, c_void_p) for member, _, _ in slots]
              + [(f"spare{i}", c_void_p) for i in range(SPARE_SLOTS)])
    return type(name, (Structure,), {"_fields_": fields, "slots": slots})


# The trampolines bridge.c has for each member; members without one stay NULL.
FactoryStruct = _struct("OrtEpFactory", ORT_EP_FACTORY, {
    "GetName": "f_get_name", "GetVendor": "f_get_vendor", "GetSupportedDevices": "f_get_supported_devices",
    "CreateEp": "f_create_ep", "ReleaseEp": "f_release_ep", "GetVendorId": "f_get_vendor_id",
    "GetVersion": "f_get_version", "ValidateCompiledModelCompatibilityInfo": "f_validate_compat",
    "CreateAllocator": "f_create_allocator", "ReleaseAllocator": "f_release_allocator",
    "CreateDataTransfer": "f_create_data_transfer", "IsStreamAware": "f_is_stream_aware",
    "CreateSyncStreamForDevice": "f_create_sync_stream",
    "GetHardwareDeviceIncompatibilityDetails": "f_get_incompatibility_details",
    "GetNumCustomOpDomains": "f_get_num_custom_op_domains", "GetCustomOpDomains": "f_get_custom_op_domains"})
EpStruct = _struct("OrtEp", ORT_EP, {
    "GetName": "e_get_name", "GetCapability": "e_get_capability", "Compile": "e_compile",
    "ReleaseNodeComputeInfos": "e_release_compute_infos", "GetPreferredDataLayout": "e_get_layout",
    "ShouldConvertDataLayoutForOp": "e_should_convert", "SetDynamicOptions": "e_set_dynamic_options",
    "OnRunStart": "e_on_run_start", "OnRunEnd": "e_on_run_end",
    "GetCompiledModelCompatibilityInfo": "e_get_compat_info", "CreateSyncStreamForDevice": "e_create_sync_stream",
    "Sync": "e_sync", "OnSessionInitializationEnd": "e_on_session_initialization_end",
    "CreateProfiler": "e_create_profiler", "GetDefaultMemoryDevice": "e_get_default_memory_device",
    "GetAvailableResource": "e_get_available_resource", "IsGraphCaptureEnabled": "e_is_graph_capture_enabled",
    "IsGraphCaptured": "e_is_graph_captured", "ReplayGraph": "e_replay_graph",
    "GetGraphCaptureNodeAssignmentPolicy": "e_get_graph_capture_policy",
    "ReleaseCapturedGraph": "e_release_captured_graph"})
# IsConcurrentRunSupported stays NULL: onnxruntime's answer to "no" is a session lock that its Python
# API can take while holding the GIL, and a Python EP then deadlocks it; the bridge serializes such
# an EP itself (missing_hooks.py).
ComputeStruct = _struct("OrtNodeComputeInfo", [("CreateState", 23), ("Compute", 23), ("ReleaseState", 23)], {
    "CreateState": "c_create_state", "Compute": "c_compute", "ReleaseState": "c_release_state"})


def negotiated_version(ort_api_version: int) -> int:
    """The ``ort_version_supported`` the bridge gives its OrtEp / OrtEpFactory: the running
    onnxruntime's API version, capped at the newest one ep_struct_table.py describes (onnxruntime
    reads no member past it)."""
    return min(int(ort_api_version), NEWEST_VERSION)


class FusionOptions(Structure):
    _fields_ = [("ort_version_supported", c_uint32), ("drop_constant_initializers", c_bool)]


def fill(struct: Structure, version: int = API_VERSION) -> Structure:
    """Point ``struct``'s members at their trampolines, up to API ``version``, and declare it."""
    struct.ort_version_supported = version
    for member, since, tramp in struct.slots:
        setattr(struct, member, d.trampoline(tramp) if tramp and since is not None and since <= version else None)
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
