"""onnxhal: ONNX Runtime's plugin execution-provider model in Python.

``import onnxhal as ort`` offers onnxruntime's Python API for devices, EP libraries, sessions and
values (see docs/sessions.md); ``onnxhal.hal`` holds the contracts EP authors implement.
"""

from onnxhal import errors, hal
from onnxhal.hal import (
    ExecutionMode,
    GraphOptimizationLevel,
    OrtAllocatorType,
    OrtCompiledModelCompatibility,
    OrtDeviceMemoryType,
    OrtEpDevice,
    OrtExecutionProviderDevicePolicy,
    OrtHardwareDevice,
    OrtHardwareDeviceType,
    OrtMemoryInfo,
    OrtMemoryInfoDeviceType,
    OrtMemType,
    OrtSyncStream,
)
from onnxhal.runtime.environment import (
    get_all_providers,
    get_available_providers,
    get_ep_devices,
    get_hardware_devices,
    register_execution_provider_library,
    unregister_execution_provider_library,
)
from onnxhal.runtime.ortvalue import IOBinding, OrtValue, copy_tensors
from onnxhal.runtime.session import (
    InferenceSession,
    ModelMetadata,
    NodeArg,
    OrtEpAssignedNode,
    OrtEpAssignedSubgraph,
)
from onnxhal.runtime.session_options import RunOptions, SessionOptions

__version__ = "0.1.0"

__all__ = [
    "errors", "hal", "ExecutionMode", "GraphOptimizationLevel", "OrtAllocatorType", "OrtCompiledModelCompatibility",
    "OrtDeviceMemoryType", "OrtEpDevice", "OrtExecutionProviderDevicePolicy", "OrtHardwareDevice",
    "OrtHardwareDeviceType", "OrtMemoryInfo", "OrtMemoryInfoDeviceType", "OrtMemType", "OrtSyncStream",
    "get_all_providers", "get_available_providers", "get_ep_devices", "get_hardware_devices",
    "register_execution_provider_library", "unregister_execution_provider_library", "IOBinding", "OrtValue",
    "copy_tensors", "InferenceSession", "ModelMetadata", "NodeArg", "OrtEpAssignedNode", "OrtEpAssignedSubgraph",
    "RunOptions", "SessionOptions", "__version__",
]
