"""ONNX Runtime's enums, with its names and values (onnxruntime_c_api.h, onnxruntime_ep_c_api.h)."""

from __future__ import annotations

from enum import IntEnum, IntFlag


class OrtEnum(IntEnum):
    """An IntEnum that prints as onnxruntime's (pybind11) enums do: ``str(x)`` is "Class.NAME"
    (Python 3.11's IntEnum prints the number), ``repr`` and comparisons with ints unchanged."""

    def __str__(self) -> str:
        return f"{type(self).__name__}.{self.name}"


class OrtHardwareDeviceType(OrtEnum):
    CPU = 0
    GPU = 1
    NPU = 2


class OrtExecutionProviderDevicePolicy(OrtEnum):
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


class OrtMemoryInfoDeviceType(OrtEnum):
    CPU = 0
    GPU = 1
    FPGA = 2
    NPU = 3


class OrtDeviceMemoryType(OrtEnum):
    DEFAULT = 0
    HOST_ACCESSIBLE = 5


class OrtAllocatorType(OrtEnum):
    INVALID = -1
    ORT_DEVICE_ALLOCATOR = 0
    ORT_ARENA_ALLOCATOR = 1
    ORT_READ_ONLY_ALLOCATOR = 2


class OrtMemType(OrtEnum):
    CPU_INPUT = -2
    CPU_OUTPUT = -1
    CPU = -1  # alias of CPU_OUTPUT, as in ORT
    DEFAULT = 0


class OrtEpDataLayout(OrtEnum):
    NCHW = 0
    NHWC = 1


class OrtSparseFormat(OrtEnum):
    ORT_SPARSE_UNDEFINED = 0
    ORT_SPARSE_COO = 1
    ORT_SPARSE_CSRC = 2
    ORT_SPARSE_BLOCK_SPARSE = 4


class OrtGraphCaptureNodeAssignmentPolicy(OrtEnum):
    """Which nodes a graph-capturing EP needs to own (``Ep.get_graph_capture_node_assignment_policy``)."""

    ALL_NODES_ON_EP = 0
    ALLOW_CPU_FOR_SHAPES = 1  # CPU nodes are allowed where they only compute shapes (int64 values)


class OrtDeviceEpIncompatibilityReason(OrtEnum):
    NONE = 0
    DRIVER_INCOMPATIBLE = 1
    DEVICE_INCOMPATIBLE = 2
    MISSING_DEPENDENCY = 4
    UNKNOWN = -(1 << 31)  # 0x80000000 in a C int, as onnxruntime's Python enum shows it


class OrtCompiledModelCompatibility(OrtEnum):
    """What an EP's factory makes of a compiled model's compatibility info (onnxruntime's names)."""

    EP_NOT_APPLICABLE = 0
    EP_SUPPORTED_OPTIMAL = 1
    EP_SUPPORTED_PREFER_RECOMPILATION = 2
    EP_UNSUPPORTED = 3
    # onnxhal's earlier names, kept as aliases for EP libraries written against them; iteration and
    # str() show only the above.
    NOT_APPLICABLE = 0
    OPTIMAL = 1
    PREFER_RECOMPILATION = 2
    UNSUPPORTED = 3


class GraphOptimizationLevel(OrtEnum):
    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3
    ORT_ENABLE_ALL = 99


class ExecutionMode(OrtEnum):
    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


class ExecutionOrder(OrtEnum):
    """``SessionOptions.execution_order``, as onnxruntime's. onnxhal runs every order as DEFAULT
    (the graph's topological order)."""

    DEFAULT = 0
    PRIORITY_BASED = 1
    MEMORY_EFFICIENT = 2


class OrtCompileApiFlags(IntFlag):
    """``ModelCompiler``'s ``flags``, as onnxruntime's (printed as its enum prints them)."""

    NONE = 0
    ERROR_IF_NO_NODES_COMPILED = 1
    ERROR_IF_OUTPUT_FILE_EXISTS = 2

    def __str__(self) -> str:
        return f"{type(self).__name__}.{self.name}"
