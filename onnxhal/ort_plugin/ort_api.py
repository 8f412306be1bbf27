"""onnxruntime's C API seen from Python: OrtApi / OrtEpApi slots bound with ctypes.

The slot indices come from ``api_table.py`` (generated from onnxruntime's source text, anchors
checked). ``OrtApi.bind`` verifies the table against the running onnxruntime before anything else
uses it: ``GetVersionString`` must name the version the Python module reports, and a status made with
``CreateStatus`` must read back the same code and message.
"""

from __future__ import annotations

import ctypes
import sys
from ctypes import POINTER, c_bool, c_char_p, c_int, c_int64, c_size_t, c_uint32, c_void_p
from typing import Any

from onnxhal.hal import errors
from onnxhal.ort_plugin.api_table import MODEL_EDITOR_API, ORT_API
from onnxhal.ort_plugin.ep_struct_table import ORT_EP_API

EP_API = {name: (slot, since) for slot, (name, since) in enumerate(ORT_EP_API)}

#: The OrtApi version the bridge asks for: the plugin-EP graph API arrived in 23 (onnxruntime 1.23).
API_VERSION = 23
#: Virtual hardware devices (OrtEpApi::CreateHardwareDevice) arrived in onnxruntime 1.24.
VIRTUAL_DEVICES_VERSION = 24
#: Before onnxruntime 1.24 each graph numbers its fused groups from 0, so groups claimed in two graphs
#: of a session (the main graph and an If branch, or two branches) get one kernel name and session
#: creation fails ("Failed to add kernel ... Conflicting with a registered kernel"; seen on 1.23.2).
DISTINCT_FUSED_NAMES_VERSION = 24

# OrtErrorCode values, and onnxhal's errors for them.
ORT_OK, ORT_FAIL, ORT_INVALID_ARGUMENT, ORT_NO_SUCHFILE = 0, 1, 2, 3
ORT_RUNTIME_EXCEPTION, ORT_INVALID_PROTOBUF, ORT_NOT_IMPLEMENTED, ORT_INVALID_GRAPH, ORT_EP_FAIL = 6, 7, 9, 10, 11
_CODES = [(errors.InvalidArgument, ORT_INVALID_ARGUMENT), (errors.NoSuchFile, ORT_NO_SUCHFILE),
          (errors.InvalidProtobuf, ORT_INVALID_PROTOBUF), (errors.InvalidGraph, ORT_INVALID_GRAPH),
          (errors.NotImplemented, ORT_NOT_IMPLEMENTED), (errors.EPFail, ORT_EP_FAIL),
          (errors.RuntimeException, ORT_RUNTIME_EXCEPTION)]
_ERRORS = {code: cls for cls, code in _CODES}

_S = c_void_p  # OrtStatus* (NULL is success)
P = c_void_p
PP = POINTER(c_void_p)
# name: (restype, argtypes). Only what the bridge calls.
ORT_SIGNATURES: dict[str, tuple[Any, tuple]] = {
    "CreateStatus": (_S, (c_int, c_char_p)),
    "GetErrorCode": (c_int, (P,)),
    "GetErrorMessage": (c_char_p, (P,)),
    "ReleaseStatus": (None, (P,)),
    "GetEpApi": (P, ()),
    "CreateKeyValuePairs": (None, (PP,)),
    "AddKeyValuePair": (None, (P, c_char_p, c_char_p)),
    "GetKeyValuePairs": (None, (P, POINTER(POINTER(c_char_p)), POINTER(POINTER(c_char_p)), POINTER(c_size_t))),
    "ReleaseKeyValuePairs": (None, (P,)),
    "HardwareDevice_Type": (c_int, (P,)),
    "HardwareDevice_VendorId": (c_uint32, (P,)),
    "HardwareDevice_Vendor": (c_char_p, (P,)),
    "HardwareDevice_DeviceId": (c_uint32, (P,)),
    "HardwareDevice_Metadata": (P, (P,)),
    "GetSessionOptionsConfigEntries": (_S, (P, PP)),
    "GetRunConfigEntry": (c_char_p, (P, c_char_p)),
    "Graph_GetName": (_S, (P, POINTER(c_char_p))),
    "Graph_GetNumOperatorSets": (_S, (P, POINTER(c_size_t))),
    "Graph_GetOperatorSets": (_S, (P, POINTER(c_char_p), POINTER(c_int64), c_size_t)),
    "Graph_GetNumInputs": (_S, (P, POINTER(c_size_t))),
    "Graph_GetInputs": (_S, (P, PP, c_size_t)),
    "Graph_GetNumOutputs": (_S, (P, POINTER(c_size_t))),
    "Graph_GetOutputs": (_S, (P, PP, c_size_t)),
    "Graph_GetNumInitializers": (_S, (P, POINTER(c_size_t))),
    "Graph_GetInitializers": (_S, (P, PP, c_size_t)),
    "Graph_GetNumNodes": (_S, (P, POINTER(c_size_t))),
    "Graph_GetNodes": (_S, (P, PP, c_size_t)),
    "Node_GetName": (_S, (P, POINTER(c_char_p))),
    "Node_GetOperatorType": (_S, (P, POINTER(c_char_p))),
    "Node_GetDomain": (_S, (P, POINTER(c_char_p))),
    "Node_GetSinceVersion": (_S, (P, POINTER(c_int))),
    "Node_GetNumInputs": (_S, (P, POINTER(c_size_t))),
    "Node_GetInputs": (_S, (P, PP, c_size_t)),
    "Node_GetNumOutputs": (_S, (P, POINTER(c_size_t))),
    "Node_GetOutputs": (_S, (P, PP, c_size_t)),
    "Node_GetNumAttributes": (_S, (P, POINTER(c_size_t))),
    "Node_GetAttributes": (_S, (P, PP, c_size_t)),
    "Node_GetNumSubgraphs": (_S, (P, POINTER(c_size_t))),
    "OpAttr_GetName": (_S, (P, POINTER(c_char_p))),
    "OpAttr_GetType": (_S, (P, POINTER(c_int))),
    "ReadOpAttr": (_S, (P, c_int, P, c_size_t, POINTER(c_size_t))),
    "OpAttr_GetTensorAttributeAsOrtValue": (_S, (P, PP)),
    "GetValueInfoName": (_S, (P, POINTER(c_char_p))),
    "GetValueInfoTypeInfo": (_S, (P, PP)),
    "GetOnnxTypeFromTypeInfo": (_S, (P, POINTER(c_int))),
    "CastTypeInfoToTensorInfo": (_S, (P, PP)),
    "GetTensorElementType": (_S, (P, POINTER(c_int))),
    "GetDimensionsCount": (_S, (P, POINTER(c_size_t))),
    "GetDimensions": (_S, (P, POINTER(c_int64), c_size_t)),
    "GetSymbolicDimensions": (_S, (P, POINTER(c_char_p), c_size_t)),
    "TensorTypeAndShape_HasShape": (c_bool, (P,)),
    "ValueInfo_GetInitializerValue": (_S, (P, PP)),
    "ValueInfo_IsConstantInitializer": (_S, (P, POINTER(c_bool))),
    "GetTensorTypeAndShape": (_S, (P, PP)),
    "ReleaseTensorTypeAndShapeInfo": (None, (P,)),
    "GetTensorMutableData": (_S, (P, PP)),
    "GetStringTensorDataLength": (_S, (P, POINTER(c_size_t))),
    "GetStringTensorContent": (_S, (P, c_void_p, c_size_t, POINTER(c_size_t), c_size_t)),
    "ReleaseValue": (None, (P,)),
    "KernelContext_GetInputCount": (_S, (P, POINTER(c_size_t))),
    "KernelContext_GetOutputCount": (_S, (P, POINTER(c_size_t))),
    "KernelContext_GetInput": (_S, (P, c_size_t, PP)),
    "KernelContext_GetOutput": (_S, (P, c_size_t, POINTER(c_int64), c_size_t, PP)),
    "KernelContext_GetGPUComputeStream": (_S, (P, PP)),
    "SyncStream_GetHandle": (P, (P,)),
    "CreateOpAttr": (_S, (c_char_p, P, c_int, c_int, PP)),
    "CreateMemoryInfo_V2": (_S, (c_char_p, c_int, c_uint32, c_int, c_int, c_size_t, c_int, PP)),
    "ReleaseMemoryInfo": (None, (P,)),
    "ReleaseOpAttr": (None, (P,)),
    "GetModelEditorApi": (P, ()),
    # custom_ops.py: a factory's custom-op domains and their kernels
    "CreateCustomOpDomain": (_S, (c_char_p, PP)),
    "AddCustomOpDomain": (_S, (P, P)),
    "CustomOpDomain_Add": (_S, (P, P)),
    "KernelInfo_GetNodeName": (_S, (P, P, POINTER(c_size_t))),
    "KernelInfo_GetInputCount": (_S, (P, POINTER(c_size_t))),
    "KernelInfo_GetOutputCount": (_S, (P, POINTER(c_size_t))),
    "KernelInfo_GetInputName": (_S, (P, c_size_t, P, POINTER(c_size_t))),
    "KernelInfo_GetOutputName": (_S, (P, c_size_t, P, POINTER(c_size_t))),
    "KernelInfoGetAttribute_float": (_S, (P, c_char_p, POINTER(ctypes.c_float))),
    "KernelInfoGetAttribute_int64": (_S, (P, c_char_p, POINTER(c_int64))),
    "KernelInfoGetAttribute_string": (_S, (P, c_char_p, P, POINTER(c_size_t))),
    "KernelInfoGetAttributeArray_float": (_S, (P, c_char_p, P, POINTER(c_size_t))),
    "KernelInfoGetAttributeArray_int64": (_S, (P, c_char_p, P, POINTER(c_size_t))),
    "KernelInfoGetAttribute_tensor": (_S, (P, c_char_p, P, PP)),
    "GetAllocatorWithDefaultOptions": (_S, (PP,)),
}
MODEL_EDITOR_SIGNATURES: dict[str, tuple[Any, tuple]] = {
    "CreateNode": (_S, (c_char_p, c_char_p, c_char_p, POINTER(c_char_p), c_size_t, POINTER(c_char_p), c_size_t,
                        PP, c_size_t, PP)),
}
EP_SIGNATURES: dict[str, tuple[Any, tuple]] = {
    "CreateEpDevice": (_S, (P, P, P, P, PP)),
    "EpGraphSupportInfo_AddNodesToFuse": (_S, (P, PP, c_size_t, P)),
    "EpGraphSupportInfo_AddSingleNode": (_S, (P, P)),
    "NodeComputeContext_NodeName": (c_char_p, (P,)),
    "CreateHardwareDevice": (_S, (c_int, c_uint32, c_uint32, c_char_p, P, PP)),
    "EpDevice_AddAllocatorInfo": (_S, (P, P)),
    "MemoryInfo_GetMemoryDevice": (P, (P,)),
    "Value_GetMemoryDevice": (P, (P,)),
    "MemoryDevice_GetDeviceType": (c_int, (P,)),
    "MemoryDevice_GetMemoryType": (c_int, (P,)),
    "MemoryDevice_GetVendorId": (c_uint32, (P,)),
    "MemoryDevice_GetDeviceId": (c_uint32, (P,)),
    "ReleaseHardwareDevice": (None, (P,)),
    "DeviceEpIncompatibilityDetails_SetDetails": (_S, (P, c_uint32, ctypes.c_int32, c_char_p)),
    "CreateProfilingEvent": (_S, (c_int, ctypes.c_int32, ctypes.c_int32, c_char_p, c_int64, c_int64,
                                  POINTER(c_char_p), POINTER(c_char_p), c_size_t, PP)),
    "ReleaseProfilingEvent": (None, (P,)),
    "ProfilingEventsContainer_AddEvents": (_S, (P, PP, c_size_t)),
    "GetEnvConfigEntries": (_S, (PP,)),
}


def ort_version_tuple(text: str) -> tuple[int, int]:
    parts = text.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise errors.Fail(f"onnxruntime reported version {text!r}, which is not MAJOR.MINOR[.PATCH]") from None


def error_code(exc: BaseException) -> int:
    for cls, code in _CODES:
        if isinstance(exc, cls):
            return code
    return ORT_FAIL


class OrtApi:
    """The OrtApi and OrtEpApi of the onnxruntime that loaded the bridge, as Python callables."""

    def __init__(self, api_base: int) -> None:
        base = ctypes.cast(api_base, POINTER(c_void_p * 2)).contents
        get_api = ctypes.CFUNCTYPE(c_void_p, c_uint32)(base[0])
        self.version_string = ctypes.CFUNCTYPE(c_char_p)(base[1])().decode()
        self.version = ort_version_tuple(self.version_string)
        if self.version < (1, API_VERSION):
            raise errors.NotImplemented(
                f"onnxhal's plugin EP library needs onnxruntime 1.{API_VERSION} or newer (the plugin-EP graph API); "
                f"this process runs onnxruntime {self.version_string}. Upgrade: pip install 'onnxruntime>=1.{API_VERSION}'")
        # The newest OrtApi version this onnxruntime serves (GetApi answers NULL past it): the
        # version the bridge's OrtEp / OrtEpFactory are declared at (structs.negotiated_version).
        self.api_version = self.version[1]
        while self.api_version > API_VERSION and not get_api(self.api_version):
            self.api_version -= 1
        table = get_api(API_VERSION)
        if not table:
            raise errors.Fail(f"onnxruntime {self.version_string} returned no OrtApi for version {API_VERSION}")
        self._ort = ctypes.cast(table, POINTER(c_void_p))
        self.ort = self._bind(self._ort, ORT_API, ORT_SIGNATURES, "OrtApi")
        self._ep = ctypes.cast(self.ort["GetEpApi"](), POINTER(c_void_p))
        self.ep = self._bind(self._ep, EP_API, EP_SIGNATURES, "OrtEpApi")
        editor = self.ort["GetModelEditorApi"]()
        self.editor = self._bind(ctypes.cast(editor, POINTER(c_void_p)), MODEL_EDITOR_API, MODEL_EDITOR_SIGNATURES,
                                 "OrtModelEditorApi") if editor else {}
        self._verify()

    @property
    def names_fused_groups_across_graphs(self) -> bool:
        """Whether fused groups claimed in different graphs of one session get distinct kernel names."""
        return self.version >= (1, DISTINCT_FUSED_NAMES_VERSION)

    @property
    def has_virtual_devices(self) -> bool:
        return self.version >= (1, VIRTUAL_DEVICES_VERSION)

    def env_config(self) -> dict[str, str]:
        """onnxruntime's environment config entries (env_config.py); empty before onnxruntime 1.24,
        which has no GetEnvConfigEntries."""
        if "GetEnvConfigEntries" not in self.ep:
            return {}
        entries = c_void_p()
        self.ep_call("GetEnvConfigEntries", ctypes.byref(entries))
        try:
            return self.read_pairs(entries.value)
        finally:
            if entries.value:
                self.release_pairs(entries.value)

    def _bind(self, table: Any, indices: dict, signatures: dict, struct: str) -> dict[str, Any]:
        out = {}
        for name, (restype, argtypes) in signatures.items():
            index, since = indices[name]
            if since > self.version[1]:
                continue  # not in this onnxruntime: callers check has_virtual_devices and the like
            address = table[index]
            if not address:
                raise errors.Fail(f"{struct} slot {index} ({name}) is NULL in onnxruntime {self.version_string}")
            out[name] = ctypes.CFUNCTYPE(restype, *argtypes)(address)
        return out

    def _verify(self) -> None:
        """The table must fit this onnxruntime: same version as its Python module, and a status
        round trip through CreateStatus / GetErrorCode / GetErrorMessage."""
        module = sys.modules.get("onnxruntime")
        py_version = getattr(module, "__version__", None)
        if py_version is not None and py_version.split("+")[0] != self.version_string:
            raise errors.Fail(f"onnxruntime's GetVersionString says {self.version_string!r} but the onnxruntime "
                              f"Python module is {py_version!r}: two onnxruntime builds in one process")
        status = self.ort["CreateStatus"](ORT_INVALID_ARGUMENT, b"onnxhal status probe")
        try:
            code = self.ort["GetErrorCode"](status)
            message = self.ort["GetErrorMessage"](status)
        finally:
            self.ort["ReleaseStatus"](status)
        if code != ORT_INVALID_ARGUMENT or message != b"onnxhal status probe":
            raise errors.Fail(f"OrtApi slot table does not match onnxruntime {self.version_string}: a status round "
                              f"trip gave code {code}, message {message!r}")

    # -- statuses ---------------------------------------------------------------------------
    def check(self, status: int | None, what: str) -> None:
        """Raise the onnxhal error for a non-NULL OrtStatus (and release it)."""
        if not status:
            return
        code = self.ort["GetErrorCode"](status)
        message = (self.ort["GetErrorMessage"](status) or b"").decode(errors="replace")
        self.ort["ReleaseStatus"](status)
        raise _ERRORS.get(code, errors.Fail)(f"onnxruntime {what}: {message}")

    def status_for(self, exc: BaseException, where: str) -> int:
        """An OrtStatus carrying ``exc`` (for onnxruntime to report): the error's type and message."""
        text = f"{where}: {type(exc).__name__}: {exc}"
        return self.ort["CreateStatus"](error_code(exc), text.encode(errors="replace")) or 0

    # -- key-value pairs --------------------------------------------------------------------
    def read_pairs(self, kvp: int | None) -> dict[str, str]:
        if not kvp:
            return {}
        keys, values, n = POINTER(c_char_p)(), POINTER(c_char_p)(), c_size_t()
        self.ort["GetKeyValuePairs"](kvp, ctypes.byref(keys), ctypes.byref(values), ctypes.byref(n))
        return {keys[i].decode(): (values[i] or b"").decode() for i in range(n.value)}

    def make_pairs(self, mapping: dict[str, str]) -> int:
        """A new OrtKeyValuePairs; the caller releases it with ``release_pairs``."""
        out = c_void_p()
        self.ort["CreateKeyValuePairs"](ctypes.byref(out))
        for k, v in mapping.items():
            self.ort["AddKeyValuePair"](out, str(k).encode(), str(v).encode())
        return out.value

    def release_pairs(self, kvp: int) -> None:
        self.ort["ReleaseKeyValuePairs"](kvp)

    def call(self, name: str, *args: Any) -> None:
        """Call a status-returning OrtApi function, raising its error."""
        self.check(self.ort[name](*args), name)

    def ep_call(self, name: str, *args: Any) -> None:
        self.check(self.ep[name](*args), name)
