"""fp16 (and bf16) storage on a simulated device, emulated on the float32 kernels of the OpenCL EP.

A profile with ``float32_as = "float16"`` computes float32 models in half precision, as an NPU
does. The OpenCL EP's kernels are float32 only, so the simulator reproduces fp16 *storage*: every
float32 value entering or leaving a partition is stored to half precision with ``vstore_half_rte``
and read back with ``vload_half`` (on the device, in the partition's queue), and the partition's
weights are rounded to float16 when it is compiled. Values inside one fused partition stay float32,
as in an NPU's wide accumulators. Results therefore carry real fp16 rounding error.

What a real NPU compiler keeps in float32 stays float32 here too: reduction results (the statistics
of a LayerNorm written as ReduceSum/Sqrt/Div, a mean, a norm) entering or leaving a partition are
not rounded (``FP32_PRODUCERS``). Weights beyond the storage range are clamped to it, as device
compilers store them (``stored_weight``), and logged. A value computed at run time whose fp16
storage turns a finite float32 into inf is reported: the store kernel raises a flag the EP reads
after the run and logs once per value.

``float32_as = "bfloat16"`` stores the same values as bf16 instead (round to nearest even on the
upper 16 bits of the float32 pattern): float32's range, 8 significant bits.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import onnx
import pyopencl as cl

from onnxhal.hal.allocator import Allocator
from onnxhal.hal.tensor import DeviceTensor
from onnxhal.runtime.providers.opencl.device_context import OpenCLDeviceContext

#: Ops whose float32 results an NPU compiler keeps in float32 (accumulators, statistics).
FP32_PRODUCERS = frozenset({"ReduceSum", "ReduceMean", "ReduceSumSquare", "ReduceL2", "ReduceL1", "ReduceLogSum",
                            "ReduceLogSumExp", "ReduceProd"})
FP16_MAX = 65504.0
#: The storage formats emulated: float32_as values whose values are rounded at partition edges.
STORAGE_DTYPES = ("float16", "bfloat16")

ROUND_SOURCE = r"""
// onnxhal simulator: fp16 storage of float32 values; flag[0] = value id where a finite value overflows.
__kernel void onnxhal_sim_store_half(__global const float* x, const int x_offset, __global half* h,
                                     __global int* flag, const int value_id, const int n) {
    int i = get_global_id(0);
    if (i < n) {
        const float v = x[x_offset + i];
        vstore_half_rte(v, i, h);
        if (isinf(vload_half(i, h)) && !isinf(v)) flag[0] = value_id;
    }
}
__kernel void onnxhal_sim_load_half(__global const half* h, __global float* y, const int n) {
    int i = get_global_id(0);
    if (i < n) y[i] = vload_half(i, h);
}
__kernel void onnxhal_sim_store_bf16(__global const float* x, const int x_offset, __global ushort* h,
                                     __global int* flag, const int value_id, const int n) {
    int i = get_global_id(0);
    if (i < n) {
        const float v = x[x_offset + i];
        const uint u = as_uint(v);
        const ushort r = isnan(v) ? (ushort)((u >> 16) | 0x40u) : (ushort)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
        h[i] = r;
        if (isinf(as_float(((uint)r) << 16)) && !isinf(v)) flag[0] = value_id;
    }
}
__kernel void onnxhal_sim_load_bf16(__global const ushort* h, __global float* y, const int n) {
    int i = get_global_id(0);
    if (i < n) y[i] = as_float(((uint)h[i]) << 16);
}
"""
LOCAL = 64
F32 = np.dtype(np.float32)


def round_bf16(a: np.ndarray) -> np.ndarray:
    """float32 values as bf16 storage gives them back (round to nearest even; NaN stays NaN)."""
    a = np.asarray(a, np.float32)
    u = a.view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)).view(np.float32)
    return np.where(np.isnan(a), a, rounded)


def stored(a: np.ndarray, dtype: str = "float16") -> np.ndarray:
    """float32 values as ``dtype`` storage gives them back (beyond the range: inf, as on the device)."""
    if dtype == "bfloat16":
        return round_bf16(a)
    with np.errstate(over="ignore"):  # beyond 65504 is inf in fp16, as on the device
        return np.asarray(a).astype(np.float16).astype(np.float32)


#: The largest finite bfloat16 (0x7F7F).
BF16_MAX = 3.3895313892515355e38


def stored_weight(a: np.ndarray, dtype: str = "float16") -> np.ndarray:
    """A float32 constant as a device compiler stores it in ``dtype``: finite values beyond the
    range clamped to its largest finite value, then rounded; infinities and NaN kept. OpenVINO's
    constant compression clamps so (``convert_from_f32_to_f16_with_clamp``, used by
    compress_float_constants), and TensorRT's builder clamps fp16 weights out of range with a
    warning. The difference matters for masks: DeBERTa-v2 writes float32's lowest value into
    masked attention scores, which as -inf makes a fully masked row's Softmax NaN, and as -65504
    keeps it finite, as in float32."""
    if a.dtype != F32 or a.size == 0:
        return a
    limit = FP16_MAX if dtype == "float16" else BF16_MAX
    with np.errstate(invalid="ignore"):
        clamped = np.where(np.isfinite(a), np.clip(a, -limit, limit), a).astype(F32)
    return stored(clamped, dtype)


def overflows(a: np.ndarray, dtype: str = "float16") -> bool:
    """Whether ``dtype`` storage turns some finite value of ``a`` into inf."""
    if a.dtype != F32 or a.size == 0:
        return False
    if dtype == "bfloat16":
        return bool(np.any(np.isfinite(a) & np.isinf(round_bf16(a))))
    return bool(np.any(np.isfinite(a) & (np.abs(a) > FP16_MAX)))


def round_constants(constants: dict[str, np.ndarray], dtype: str = "float16") -> list[str]:
    """Round float32 weights to ``dtype`` storage in place (in the dict), as such a device stores
    them (``stored_weight``); returns the names of those with finite values beyond its range (they
    were clamped to it)."""
    clamped = []
    for name, arr in list(constants.items()):
        if isinstance(arr, np.ndarray) and arr.dtype == F32:
            if overflows(arr, dtype):
                clamped.append(name)
            constants[name] = stored_weight(arr, dtype)
    return clamped


class HalfRounder:
    """Enqueues fp16 (or bf16, ``dtype``) store/load round trips on a device's queue."""

    def __init__(self, device: OpenCLDeviceContext, dtype: str = "float16") -> None:
        self.device = device
        self.dtype = dtype
        suffix = "bf16" if dtype == "bfloat16" else "half"
        self._store = device.kernel(ROUND_SOURCE, f"onnxhal_sim_store_{suffix}")
        self._load = device.kernel(ROUND_SOURCE, f"onnxhal_sim_load_{suffix}")
        self._lock = threading.Lock()  # kernel objects hold their arguments: one launch at a time
        self._flag = cl.Buffer(device.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
                               hostbuf=np.zeros(1, np.int32))
        self.value_names: list[str] = []  # value id - 1 -> name, for the overflow report

    def value_id(self, name: str) -> np.int32:
        with self._lock:
            if name not in self.value_names:
                self.value_names.append(name)
            return np.int32(self.value_names.index(name) + 1)

    def overflowed(self, queue: cl.CommandQueue) -> str | None:
        """The name of a value whose fp16 storage overflowed since the last call (and reset), or None."""
        flag = np.zeros(1, np.int32)
        cl.enqueue_copy(queue, flag, self._flag, is_blocking=True)
        if not flag[0]:
            return None
        cl.enqueue_copy(queue, self._flag, np.zeros(1, np.int32), is_blocking=True)
        return self.value_names[int(flag[0]) - 1] if 0 < flag[0] <= len(self.value_names) else "?"

    def _launch(self, queue: cl.CommandQueue, kernel: cl.Kernel, n: int, *args) -> None:
        padded = -(-n // LOCAL) * LOCAL
        with self._lock:
            kernel(queue, (padded,), (LOCAL,), *args, np.int32(n))

    def rounded_copy(self, t: DeviceTensor, allocator: Allocator, queue: cl.CommandQueue, name: str = "") -> DeviceTensor:
        """A new float32 tensor holding ``t`` rounded through fp16 storage (``t`` is left alone:
        other consumers may read it)."""
        n = t.size
        out = DeviceTensor.allocate(t.shape, F32, allocator)
        if n:
            half = allocator.alloc(2 * n)
            try:
                self._launch(queue, self._store, n, t.buffer, np.int32(t.offset // 4), half, self._flag,
                             self.value_id(name))
                self._launch(queue, self._load, n, half, out.buffer)
            finally:
                allocator.free(half)  # the release waits for the queued kernels (OpenCL semantics)
        return out

    def round_in_place(self, t: DeviceTensor, allocator: Allocator, queue: cl.CommandQueue, name: str = "") -> None:
        """Round a tensor the partition just produced (it owns its buffer, at offset 0)."""
        n = t.size
        if not n or t.offset:
            return
        half = allocator.alloc(2 * n)
        try:
            self._launch(queue, self._store, n, t.buffer, np.int32(t.offset // 4), half, self._flag,
                         self.value_id(name))
            self._launch(queue, self._load, n, half, t.buffer)
        finally:
            allocator.free(half)


#: Ops that turn a float into a decision: fp16 rounding of their float input flips them.
COMPARISONS = frozenset({"Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Equal"})
#: Ops that pick an index by comparing floats with each other (a classifier's label, a vector
#: quantizer's nearest code): fp16 rounding of two near values swaps which one wins.
ARG_PICKS = frozenset({"ArgMax", "ArgMin"})
DECISIONS = COMPARISONS | ARG_PICKS
_FLOATS = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE})


def is_pick(node: Any, graph: Any) -> bool:
    """Whether ``node`` picks indices by comparing floats with each other: ArgMax/ArgMin, and a
    TopK whose indices are read (a mixture of experts' routing, a detector's top boxes, a
    sampler); a TopK read for its values only keeps them sorted, and near values swapped by
    rounding are equal within tolerance."""
    if node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type in ARG_PICKS:
        return True
    if node.op_type != "TopK" or len(node.outputs) < 2 or not node.outputs[1]:
        return False
    indices = node.outputs[1]
    return bool(graph.consumers(indices)) or indices in graph.output_names


def decision_reason(compute_dtype: str, profile_name: str, node: Any, graph: Any) -> str | None:
    """Why an fp16 (or bf16) device declines ``node``: a float32 value it computes is compared against a
    threshold (tree models as tensors: hummingbird's GEMM strategy compares X @ W with each node's
    threshold) or an ArgMax/ArgMin picks an index from it (a stacked classifier's label, an audio
    codec's nearest code). fp16 rounds about 1e-3 relative, enough to move a value across its
    threshold or to swap two near values, and a flipped decision changes the answer entirely
    (another leaf, another class, another code), which no tolerance covers. Else None."""
    if compute_dtype not in ("float16", "bfloat16"):
        return None
    short = "fp16" if compute_dtype == "float16" else "bf16"
    if (node.op_type in COMPARISONS and node.domain in ("", "ai.onnx")) or is_pick(node, graph):
        # the comparison itself (a device that computes bool values takes it): its float operands
        # are stored in the device's precision whichever EP made them, the threshold included
        for name in node.inputs:
            info = graph.value_info(name) if name else None
            if info is not None and info.elem_type in _FLOATS:
                return (f"decision threshold on an {short} device: {node.op_type} compares {name!r} in {short} "
                        f"storage, whose rounding moves values across the threshold; "
                        f"{profile_name} cannot compute it in its precision")
    for name in node.outputs:
        if not name:
            continue
        info = graph.value_info(name)
        if info is None or info.elem_type not in _FLOATS:
            continue
        for consumer in graph.consumers(name):
            if (consumer.op_type in COMPARISONS and consumer.domain in ("", "ai.onnx")) or is_pick(consumer, graph):
                return (f"decision threshold on an {'fp16' if compute_dtype == 'float16' else 'bf16'} device: "
                        f"{consumer.op_type} {consumer.name!r} compares {name!r}, and its rounding (1e-3 relative "
                        "in fp16, 8e-3 in bf16) moves values across the threshold; "
                        f"{profile_name} cannot compute it in its precision")
    return None


#: Ops whose float output can carry an operand's values unchanged or larger (data movement,
#: selection, sums and products): a constant beyond the storage range stays beyond it through them.
_CARRIERS = frozenset({"Where", "Add", "Sub", "Mul", "Neg", "Abs", "Max", "Min", "Concat", "Expand", "Tile", "Pad",
                       "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Gather", "GatherElements",
                       "Slice", "Identity", "Cast"})


def picked_values(graph: Any) -> dict[str, str]:
    """The float values of ``graph`` a pick (``is_pick``: ArgMax/ArgMin, TopK read for its
    indices) picks from, directly or through the float
    values they are computed from, each with the pick's node: on an fp16 device the rounding of
    any of them (about 1e-3 relative) can swap two near candidates, so the pick (an integer
    output, which must equal onnxruntime's) changes with no float error to tolerate. A vector
    quantizer's distances come from the whole encoder; a stacked classifier's label from every
    estimator. The walk stops at graph inputs and constants."""
    picked: dict[str, str] = {}
    stack = [(name, node.name or node.op_type) for node in graph.nodes
             if is_pick(node, graph) for name in node.inputs[:1] if name]
    while stack:
        name, pick = stack.pop()
        if name in picked or name in graph.initializers or graph.value_info(name).elem_type not in _FLOATS:
            continue
        picked[name] = pick
        producer = graph.producer(name)
        if producer is not None:
            stack.extend((i, pick) for i in producer.inputs if i)
    return picked


def beyond_range_values(graph: Any, dtype: str = "float16") -> dict[str, str]:
    """The float32 values of ``graph`` that may hold finite values beyond ``dtype``'s range, each
    with the constant whose values they carry: constants that overflow, and what data movement,
    selection and arithmetic (``_CARRIERS``) make from them (DeBERTa-v2's Where(mask, float32's
    lowest, scores)). A device clamps such a weight when it stores it (``stored_weight``), but a
    value computed from it elsewhere reaches the device at run time and its storage makes it inf."""
    beyond = {name: name for name, arr in graph.initializers.items()
              if isinstance(arr, np.ndarray) and overflows(arr, dtype)}
    if not beyond:
        return beyond
    for node in graph.nodes:
        if node.domain not in ("", "ai.onnx") or node.op_type not in _CARRIERS:
            continue
        source = next((beyond[i] for i in node.inputs if i in beyond), None)
        if source is None:
            continue
        for out in node.outputs:  # float32 or of unknown type
            if out and graph.value_info(out).elem_type in (0, onnx.TensorProto.FLOAT):
                beyond[out] = source
    return beyond
