"""ONNX Runtime's enums, with its names and values (onnxruntime_c_api.h, onnxruntime_ep_c_api.h)."""

from __future__ import annotations

from enum import IntEnum


class OrtHardwareDeviceType(IntEnum):
    CPU = 0
    GPU = 1
    NPU = 2

    def __str__(self) -> str:  # ORT prints "OrtHardwareDeviceType.CPU"
        return f"OrtHardwareDeviceType.{self.name}"


class OrtExecutionProviderDevicePolicy(IntEnum):
    DEFAULT = 0
    PREFER_CPU = 1
    PREFER_NPU = 2
    PREFER_GPU = 3
    MAX_PERFORMANCE = 4
    MAX_EFFICIENCY = 5
    MIN_OVERALL_POWER = 6

    @classmethod
    def _missing_(cls, value: object) -> OrtExecutionProviderDevicePolicy | None:
        # onnxruntime's enum accepts any int (and then crashes the session); so do we, and the
        # session rejects it with InvalidArgument instead.
        if isinstance(value, int) and not isinstance(value, bool):
            member = int.__new__(cls, value)
            member._name_ = f"UNKNOWN_{value}"
            member._value_ = value
            return member
        return None


class OrtMemoryInfoDeviceType(IntEnum):
    CPU = 0
    GPU = 1
    FPGA = 2
    NPU = 3


class OrtDeviceMemoryType(IntEnum):
    DEFAULT = 0
    HOST_ACCESSIBLE = 5


class OrtAllocatorType(IntEnum):
    INVALID = -1
    ORT_DEVICE_ALLOCATOR = 0
    ORT_ARENA_ALLOCATOR = 1
    ORT_READ_ONLY_ALLOCATOR = 2


class OrtMemType(IntEnum):
    CPU_INPUT = -2
    CPU_OUTPUT = -1
    CPU = -1  # alias of CPU_OUTPUT, as in ORT
    DEFAULT = 0


class OrtEpDataLayout(IntEnum):
    NCHW = 0
    NHWC = 1


class OrtDeviceEpIncompatibilityReason(IntEnum):
    NONE = 0
    DRIVER_INCOMPATIBLE = 1
    DEVICE_INCOMPATIBLE = 2
    MISSING_DEPENDENCY = 4
    UNKNOWN = 1 << 31


class OrtCompiledModelCompatibility(IntEnum):
    NOT_APPLICABLE = 0
    OPTIMAL = 1
    PREFER_RECOMPILATION = 2
    UNSUPPORTED = 3


class GraphOptimizationLevel(IntEnum):
    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3
    ORT_ENABLE_ALL = 99


class ExecutionMode(IntEnum):
    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


class ExecutionOrder(IntEnum):
    """``SessionOptions.execution_order``, as onnxruntime's. onnxhal runs every order as DEFAULT
    (the graph's topological order)."""

    DEFAULT = 0
    PRIORITY_BASED = 1
    MEMORY_EFFICIENT = 2
