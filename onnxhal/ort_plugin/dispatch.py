"""The Python end of the bridge: one ctypes callback that every trampoline of bridge.c calls.

``attach()`` loads the bridge library into this process (the same file onnxruntime will load, so
both see one copy of its globals), installs the dispatcher and arranges for it to be switched off
at interpreter exit: from then on bridge.c refuses calls instead of entering a dead interpreter.

A call arrives as (call id, self pointer, argument words). ``self`` is the address of a struct
Python built (an OrtEpFactory, OrtEp, ...), registered in ``objects``; the handler for the call id
unpacks the words. No exception leaves ``_dispatch``: a call that returns an OrtStatus gets one
carrying the error, any other call logs it and returns a neutral value.
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import threading
from collections.abc import Callable
from ctypes import POINTER, c_int, c_size_t, c_void_p
from pathlib import Path
from typing import Any

logger = logging.getLogger("onnxhal.ort_plugin")

# Call ids: the same numbers as the enum in bridge.c.
CREATE_EP_FACTORIES, RELEASE_EP_FACTORY, REGISTER_CUSTOM_OPS = 1, 2, 3
(F_GET_NAME, F_GET_VENDOR, F_GET_SUPPORTED_DEVICES, F_CREATE_EP, F_RELEASE_EP, F_GET_VENDOR_ID, F_GET_VERSION,
 F_VALIDATE_COMPAT, F_CREATE_ALLOCATOR, F_RELEASE_ALLOCATOR, F_CREATE_DATA_TRANSFER, F_IS_STREAM_AWARE,
 F_CREATE_SYNC_STREAM, F_GET_INCOMPATIBILITY_DETAILS, F_GET_NUM_CUSTOM_OP_DOMAINS,
 F_GET_CUSTOM_OP_DOMAINS) = range(10, 26)
(E_GET_NAME, E_GET_CAPABILITY, E_COMPILE, E_RELEASE_COMPUTE_INFOS, E_GET_LAYOUT, E_SHOULD_CONVERT,
 E_SET_DYNAMIC_OPTIONS, E_ON_RUN_START, E_ON_RUN_END, E_CREATE_ALLOCATOR, E_CREATE_SYNC_STREAM,
 E_GET_COMPAT_INFO, E_SYNC, E_ON_SESSION_INITIALIZATION_END, E_CREATE_PROFILER,
 E_GET_DEFAULT_MEMORY_DEVICE, E_GET_AVAILABLE_RESOURCE) = range(30, 47)
C_CREATE_STATE, C_COMPUTE, C_RELEASE_STATE = 50, 51, 52
D_RELEASE, D_CAN_COPY, D_COPY_TENSORS = 60, 61, 62
A_ALLOC, A_FREE, A_INFO, A_RESERVE = 70, 71, 72, 73
P_RELEASE, P_START_PROFILING, P_END_PROFILING = 80, 81, 82
S_RELEASE, S_GET_HANDLE, S_CREATE_NOTIFICATION, S_FLUSH, S_ON_SESSION_RUN_END = 90, 91, 92, 93, 94
N_RELEASE, N_ACTIVATE, N_WAIT_ON_DEVICE, N_WAIT_ON_HOST = 100, 101, 102, 103
(O_CREATE_KERNEL, O_GET_NAME, O_GET_EP_TYPE, O_GET_INPUT_TYPE, O_GET_INPUT_TYPE_COUNT, O_GET_OUTPUT_TYPE,
 O_GET_OUTPUT_TYPE_COUNT, O_GET_INPUT_CHARACTERISTIC, O_GET_OUTPUT_CHARACTERISTIC, O_GET_VARIADIC_MIN_ARITY,
 O_GET_VARIADIC_HOMOGENEITY) = range(110, 121)
K_COMPUTE, K_DESTROY = 130, 131
G_IS_GRAPH_CAPTURE_ENABLED, G_IS_GRAPH_CAPTURED, G_REPLAY_GRAPH, G_GET_POLICY, G_RELEASE_CAPTURED_GRAPH = range(140, 145)

#: Calls whose C function returns OrtStatus*: errors become statuses.
STATUS_CALLS = frozenset({
    CREATE_EP_FACTORIES, RELEASE_EP_FACTORY, REGISTER_CUSTOM_OPS, F_GET_SUPPORTED_DEVICES, F_CREATE_EP, F_VALIDATE_COMPAT,
    F_CREATE_ALLOCATOR, F_CREATE_DATA_TRANSFER, F_CREATE_SYNC_STREAM, E_GET_CAPABILITY, E_COMPILE, E_GET_LAYOUT,
    E_SHOULD_CONVERT, E_SET_DYNAMIC_OPTIONS, E_ON_RUN_START, E_ON_RUN_END, E_CREATE_ALLOCATOR,
    E_CREATE_SYNC_STREAM, C_CREATE_STATE, C_COMPUTE, D_COPY_TENSORS, F_GET_INCOMPATIBILITY_DETAILS,
    E_SYNC, E_ON_SESSION_INITIALIZATION_END, E_CREATE_PROFILER, E_GET_DEFAULT_MEMORY_DEVICE, P_START_PROFILING,
    P_END_PROFILING, S_CREATE_NOTIFICATION, S_FLUSH, S_ON_SESSION_RUN_END, N_ACTIVATE, N_WAIT_ON_DEVICE,
    N_WAIT_ON_HOST, F_GET_NUM_CUSTOM_OP_DOMAINS, F_GET_CUSTOM_OP_DOMAINS, E_GET_AVAILABLE_RESOURCE, O_CREATE_KERNEL,
    K_COMPUTE, G_REPLAY_GRAPH, G_RELEASE_CAPTURED_GRAPH})

#: Calls whose C function returns a string: on an error they get "" (onnxruntime reads it), not NULL.
STRING_CALLS = frozenset({F_GET_NAME, F_GET_VENDOR, F_GET_VERSION, E_GET_NAME, E_GET_COMPAT_INFO, O_GET_NAME})
_EMPTY = ctypes.create_string_buffer(b"")

Handler = Callable[[Any, Any], int | None]
HANDLERS: dict[int, Handler] = {}
#: Struct address -> the Python object behind it; kept here so nothing handed over is collected.
objects: dict[int, Any] = {}
#: Objects onnxruntime released but may still call: factories (adapter.py, FactoryAdapter.release).
retired: dict[int, Any] = {}
#: Makes an OrtStatus from an exception; set once the OrtApi is bound (library.py).
status_maker: list[Callable[[BaseException, str], int]] = []

#: Call id -> finds the object behind a struct the C side made itself (streams.py), for a self
#: pointer ``objects`` does not know yet.
resolvers: dict[int, Callable[[int], Any]] = {}

_DISPATCH_TYPE = ctypes.CFUNCTYPE(c_size_t, c_int, c_void_p, POINTER(c_size_t))
_lock = threading.Lock()
_library: ctypes.CDLL | None = None
_library_path: Path | None = None
_callback: Any = None


def _dispatch(call: int, self_ptr: int | None, args: Any) -> int:
    try:
        handler = HANDLERS[call]
        target = (objects.get(self_ptr) or retired.get(self_ptr)) if self_ptr else None
        if target is None and self_ptr and call in resolvers:
            target = resolvers[call](self_ptr)
        result = handler(target, args)
        return int(result or 0)
    except BaseException as exc:  # noqa: BLE001 - nothing may cross the C ABI
        where = f"onnxhal {_CALL_NAMES.get(call, f'call {call}')}"
        if call in STATUS_CALLS and status_maker:
            try:
                return status_maker[0](exc, where)
            except BaseException:  # noqa: BLE001
                pass
        logger.error("%s failed: %s: %s", where, type(exc).__name__, exc, exc_info=exc)
        return ctypes.addressof(_EMPTY) if call in STRING_CALLS else 0


#: What onnxruntime called, by the C API's names (for messages).
_CALL_NAMES = {
    CREATE_EP_FACTORIES: "CreateEpFactories", RELEASE_EP_FACTORY: "ReleaseEpFactory",
    REGISTER_CUSTOM_OPS: "RegisterCustomOps",
    F_GET_SUPPORTED_DEVICES: "OrtEpFactory::GetSupportedDevices", F_CREATE_EP: "OrtEpFactory::CreateEp",
    F_RELEASE_EP: "OrtEpFactory::ReleaseEp", F_VALIDATE_COMPAT: "OrtEpFactory::ValidateCompiledModelCompatibilityInfo",
    E_GET_CAPABILITY: "OrtEp::GetCapability", E_COMPILE: "OrtEp::Compile",
    E_GET_COMPAT_INFO: "OrtEp::GetCompiledModelCompatibilityInfo",
    E_RELEASE_COMPUTE_INFOS: "OrtEp::ReleaseNodeComputeInfos", E_GET_LAYOUT: "OrtEp::GetPreferredDataLayout",
    E_SHOULD_CONVERT: "OrtEp::ShouldConvertDataLayoutForOp", E_SET_DYNAMIC_OPTIONS: "OrtEp::SetDynamicOptions",
    E_ON_RUN_START: "OrtEp::OnRunStart", E_ON_RUN_END: "OrtEp::OnRunEnd",
    C_CREATE_STATE: "OrtNodeComputeInfo::CreateState", C_COMPUTE: "OrtNodeComputeInfo::Compute",
    C_RELEASE_STATE: "OrtNodeComputeInfo::ReleaseState", F_CREATE_ALLOCATOR: "OrtEpFactory::CreateAllocator",
    F_CREATE_DATA_TRANSFER: "OrtEpFactory::CreateDataTransfer", D_CAN_COPY: "OrtDataTransferImpl::CanCopy",
    D_COPY_TENSORS: "OrtDataTransferImpl::CopyTensors", A_ALLOC: "OrtAllocator::Alloc", A_FREE: "OrtAllocator::Free",
    A_RESERVE: "OrtAllocator::Reserve",
    F_GET_INCOMPATIBILITY_DETAILS: "OrtEpFactory::GetHardwareDeviceIncompatibilityDetails",
    E_SYNC: "OrtEp::Sync",
    E_ON_SESSION_INITIALIZATION_END: "OrtEp::OnSessionInitializationEnd",
    E_CREATE_PROFILER: "OrtEp::CreateProfiler", E_GET_DEFAULT_MEMORY_DEVICE: "OrtEp::GetDefaultMemoryDevice",
    P_RELEASE: "OrtEpProfilerImpl::Release", P_START_PROFILING: "OrtEpProfilerImpl::StartProfiling",
    P_END_PROFILING: "OrtEpProfilerImpl::EndProfiling",
    F_IS_STREAM_AWARE: "OrtEpFactory::IsStreamAware", F_CREATE_SYNC_STREAM: "OrtEpFactory::CreateSyncStreamForDevice",
    E_CREATE_SYNC_STREAM: "OrtEp::CreateSyncStreamForDevice", S_RELEASE: "OrtSyncStreamImpl::Release",
    S_GET_HANDLE: "OrtSyncStreamImpl::GetHandle", S_CREATE_NOTIFICATION: "OrtSyncStreamImpl::CreateNotification",
    S_FLUSH: "OrtSyncStreamImpl::Flush", S_ON_SESSION_RUN_END: "OrtSyncStreamImpl::OnSessionRunEnd",
    N_RELEASE: "OrtSyncNotificationImpl::Release", N_ACTIVATE: "OrtSyncNotificationImpl::Activate",
    N_WAIT_ON_DEVICE: "OrtSyncNotificationImpl::WaitOnDevice", N_WAIT_ON_HOST: "OrtSyncNotificationImpl::WaitOnHost",
    F_GET_NUM_CUSTOM_OP_DOMAINS: "OrtEpFactory::GetNumCustomOpDomains",
    F_GET_CUSTOM_OP_DOMAINS: "OrtEpFactory::GetCustomOpDomains", E_GET_AVAILABLE_RESOURCE: "OrtEp::GetAvailableResource",
    O_CREATE_KERNEL: "OrtCustomOp::CreateKernelV2", O_GET_NAME: "OrtCustomOp::GetName",
    O_GET_EP_TYPE: "OrtCustomOp::GetExecutionProviderType", K_COMPUTE: "OrtCustomOp::KernelComputeV2",
    K_DESTROY: "OrtCustomOp::KernelDestroy",
    G_IS_GRAPH_CAPTURE_ENABLED: "OrtEp::IsGraphCaptureEnabled", G_IS_GRAPH_CAPTURED: "OrtEp::IsGraphCaptured",
    G_REPLAY_GRAPH: "OrtEp::ReplayGraph", G_GET_POLICY: "OrtEp::GetGraphCaptureNodeAssignmentPolicy",
    G_RELEASE_CAPTURED_GRAPH: "OrtEp::ReleaseCapturedGraph",
}


def attach(path: Path) -> ctypes.CDLL:
    """Load the bridge library at ``path`` and route its calls here (once per process)."""
    global _library, _library_path, _callback
    with _lock:
        if _library is not None:
            if path != _library_path:
                raise RuntimeError(f"onnxhal's bridge is already loaded from {_library_path}; cannot switch to {path}")
            return _library
        lib = ctypes.CDLL(str(path))
        lib.onnxhal_bridge_attach.argtypes = [_DISPATCH_TYPE]
        lib.onnxhal_bridge_attach.restype = None
        lib.onnxhal_bridge_detach.restype = None
        _callback = _DISPATCH_TYPE(_dispatch)
        lib.onnxhal_bridge_attach(_callback)
        lib.onnxhal_bridge_interrupt_after_call.argtypes, lib.onnxhal_bridge_interrupt_after_call.restype = [], None
        lib.onnxhal_bridge_set_interrupt.argtypes, lib.onnxhal_bridge_set_interrupt.restype = [c_void_p], None
        lib.onnxhal_bridge_set_interrupt(ctypes.cast(ctypes.pythonapi.PyErr_SetInterrupt, c_void_p))
        lib.onnxhal_bridge_clock_ns.argtypes, lib.onnxhal_bridge_clock_ns.restype = [], ctypes.c_int64
        lib.onnxhal_bridge_set_memory_device_getters.argtypes = [c_void_p] * 4
        lib.onnxhal_bridge_set_memory_device_getters.restype = None
        lib.onnxhal_bridge_set_stream_devices.argtypes = [c_void_p, POINTER(ctypes.c_int64), c_int]
        lib.onnxhal_bridge_set_stream_devices.restype = c_int
        lib.onnxhal_bridge_lazy_stream.argtypes = [c_void_p, POINTER(c_void_p), POINTER(ctypes.c_int64)]
        lib.onnxhal_bridge_lazy_stream.restype = c_int
        atexit.register(lib.onnxhal_bridge_detach)
        _library, _library_path = lib, path
        return lib


def interrupt_after_call() -> None:
    """Have bridge.c raise SIGINT's KeyboardInterrupt again once the current call is back in C
    (interrupts.py)."""
    if _library is not None:
        _library.onnxhal_bridge_interrupt_after_call()


def clock_ns() -> int:
    """Now on the clock of onnxruntime's profiler, read in bridge.c (its ``onnxhal_bridge_clock_ns``)."""
    if _library is None:
        raise RuntimeError("onnxhal's bridge library is not loaded; call onnxhal.ort_plugin.library_path() first")
    return _library.onnxhal_bridge_clock_ns()


def trampoline(name: str) -> int:
    """Address of one of bridge.c's trampolines (what goes into a struct's function slots)."""
    if _library is None:
        raise RuntimeError("onnxhal's bridge library is not loaded; call onnxhal.ort_plugin.library_path() first")
    return ctypes.cast(getattr(_library, name), c_void_p).value or 0


def library() -> ctypes.CDLL:
    """The loaded bridge library (after ``attach``)."""
    if _library is None:
        raise RuntimeError("onnxhal's bridge library is not loaded; call onnxhal.ort_plugin.library_path() first")
    return _library
