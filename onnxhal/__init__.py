"""onnxhal: ONNX Runtime's plugin execution-provider model in Python.

``import onnxhal as ort`` offers onnxruntime's Python API for devices, EP libraries, sessions and
values (see docs/sessions.md and docs/api-parity.md); ``onnxhal.hal`` holds the contracts EP authors implement.

Names are imported on first use (PEP 562), so ``import onnxhal`` (and the pytest plugin, which
every pytest run in the environment loads) costs almost nothing until the API is used.
"""

from __future__ import annotations

import importlib
from typing import Any

from onnxhal.devices.opencl_env import prepare_opencl_environment

# Before any onnxhal module imports pyopencl: drivers read these variables once (devices/opencl_env.py).
prepare_opencl_environment()

# The version is pyproject.toml's, read from the installed distribution on first use (get_version_string).

_HAL = ("ExecutionMode", "ExecutionOrder", "GraphOptimizationLevel", "OrtAllocatorType", "OrtArenaCfg", "OrtCompileApiFlags",
        "OrtCompiledModelCompatibility", "OrtDevice", "OrtDeviceEpIncompatibilityReason", "OrtDeviceMemoryType",
        "OrtDeviceVendorId", "OrtEpDevice", "OrtExecutionProviderDevicePolicy", "OrtHardwareDevice",
        "OrtHardwareDeviceType", "OrtMemoryInfo", "OrtMemoryInfoDeviceType", "OrtMemType", "OrtSparseFormat", "OrtSyncStream")
_LAZY: dict[str, str] = {name: "onnxhal.hal" for name in _HAL}
_LAZY.update({name: "onnxhal.runtime.env.environment" for name in (
    "get_all_providers", "get_available_providers", "get_device", "get_ep_devices", "get_hardware_devices",
    "get_version_string",
    "register_execution_provider_library", "unregister_execution_provider_library")})
_LAZY.update({name: "onnxhal.runtime.values.ortvalue" for name in ("IOBinding", "OrtValue", "copy_tensors")})
_LAZY.update({name: "onnxhal.runtime.env.compatibility" for name in (
    "get_compatibility_info_from_model", "get_compatibility_info_from_model_bytes",
    "get_hardware_device_ep_incompatibility_details", "get_model_compatibility_for_ep_devices")})
_LAZY["OrtValueVector"] = "onnxhal.runtime.values.ortvalue_vector"
_LAZY.update({name: "onnxhal.runtime.values.lora_adapters" for name in ("AdapterFormat", "LoraAdapter")})
_LAZY["SparseTensor"] = "onnxhal.runtime.values.sparse_tensor"
_LAZY.update({name: "onnxhal.runtime.env.allocators" for name in (
    "create_and_register_allocator", "create_and_register_allocator_v2")})
_LAZY.update({name: "onnxhal.runtime.session.inference_session" for name in (
    "InferenceSession", "ModelMetadata", "NodeArg", "OrtEpAssignedNode", "OrtEpAssignedSubgraph")})
_LAZY["set_default_logger_severity"] = "onnxhal.runtime.session.log_scope"
_LAZY.update({name: "onnxhal.runtime.session.options" for name in ("RunOptions", "SessionOptions")})
_LAZY["set_seed"] = "onnxhal.runtime.providers.cpu.kernels.random_ops"
_LAZY.update({name: "onnxhal.runtime.session.model_compiler" for name in ("ModelCompiler", "OrtExternalInitializerInfo")})
_LAZY.update({name: "onnxhal.runtime.session.ep_context_model" for name in ("OrtEpContextData", "OrtEpContextDataBuffer")})
_LAZY.update({name: "onnxhal.runtime.env.process_settings" for name in (
    "disable_telemetry_events", "enable_telemetry_events", "get_build_info", "has_collective_ops",
    "set_default_logger_callback", "set_default_logger_verbosity", "set_global_thread_pool_sizes")})
_SUBMODULES = ("backend", "capi", "errors", "hal")

__all__ = sorted([*_LAZY, *_SUBMODULES, "__version__"])


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from onnxhal.runtime.env.environment import get_version_string

        value = globals()["__version__"] = get_version_string()
        return value
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later lookups skip this function
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"onnxhal.{name}")
    raise AttributeError(f"module 'onnxhal' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
