"""onnxhal.hal: the contracts between the runtime and execution providers.

Device and memory types, the EP author base classes and the read-only graph view. No device code,
no I/O: everything here can be imported and subclassed anywhere.
"""

from onnxhal.hal.allocator import STATS_KEYS, Allocator, CPUAllocator
from onnxhal.hal.arena import NEXT_POWER_OF_TWO, SAME_AS_REQUESTED, ArenaAllocator, OrtArenaCfg
from onnxhal.hal.custom_op import CustomOp, CustomOpDomain
from onnxhal.hal.data_transfer import DataTransfer
from onnxhal.hal.enums import (
    ExecutionMode,
    ExecutionOrder,
    GraphOptimizationLevel,
    OrtAllocatorType,
    OrtCompileApiFlags,
    OrtCompiledModelCompatibility,
    OrtDeviceEpIncompatibilityReason,
    OrtDeviceMemoryType,
    OrtEpDataLayout,
    OrtExecutionProviderDevicePolicy,
    OrtGraphCaptureNodeAssignmentPolicy,
    OrtHardwareDeviceType,
    OrtMemoryInfoDeviceType,
    OrtMemType,
    OrtSparseFormat,
)
from onnxhal.hal.ep import (
    Ep,
    EpFactory,
    EpGraphSupportInfo,
    Kernel,
    KernelContext,
    KernelCreateContext,
    NodeComputeInfo,
    NodeFusionOptions,
)
from onnxhal.hal.ep_api import EpApi
from onnxhal.hal.ep_device import OrtEpDevice
from onnxhal.hal.ep_profiler import EpProfiler
from onnxhal.hal.graph import Graph, Node, ValueInfo, elem_type_to_dtype, type_proto_to_string
from onnxhal.hal.hardware_device import OrtHardwareDevice
from onnxhal.hal.memory_info import CPU_MEMORY_INFO, HOST_MEMORY_DEVICE, OrtMemoryDevice, OrtMemoryInfo
from onnxhal.hal.ort_device import OrtDevice, OrtDeviceVendorId
from onnxhal.hal.sync_stream import OrtSyncStream, SyncNotification, SyncStream
from onnxhal.hal.tensor import DeviceTensor

__all__ = [
    "STATS_KEYS", "Allocator", "CPUAllocator", "ArenaAllocator", "NEXT_POWER_OF_TWO", "SAME_AS_REQUESTED",
    "OrtArenaCfg", "OrtDevice", "OrtDeviceVendorId",
    "CustomOp", "CustomOpDomain", "DataTransfer", "ExecutionMode", "ExecutionOrder", "GraphOptimizationLevel",
    "OrtAllocatorType", "OrtCompileApiFlags", "OrtCompiledModelCompatibility", "OrtDeviceEpIncompatibilityReason",
    "OrtDeviceMemoryType", "OrtEpDataLayout", "OrtExecutionProviderDevicePolicy", "OrtHardwareDeviceType",
    "OrtMemoryInfoDeviceType", "OrtMemType", "OrtGraphCaptureNodeAssignmentPolicy", "OrtSparseFormat", "EpProfiler", "Ep", "EpFactory", "EpGraphSupportInfo", "Kernel",
    "KernelContext", "KernelCreateContext", "NodeComputeInfo", "NodeFusionOptions", "EpApi", "OrtEpDevice",
    "Graph", "Node", "ValueInfo", "elem_type_to_dtype", "type_proto_to_string", "OrtHardwareDevice",
    "CPU_MEMORY_INFO", "HOST_MEMORY_DEVICE", "OrtMemoryDevice", "OrtMemoryInfo", "OrtSyncStream",
    "SyncNotification", "SyncStream", "DeviceTensor",
]
