"""fp16 storage on a simulated device, emulated on the float32 kernels of the OpenCL EP.

A profile with ``float32_as = "float16"`` computes float32 models in half precision, as an NPU
does. The OpenCL EP's kernels are float32 only, so the simulator reproduces fp16 *storage*: every
float32 value entering or leaving a partition is stored to half precision with ``vstore_half_rte``
and read back with ``vload_half`` (on the device, in the partition's queue), and the partition's
weights are rounded to float16 when it is compiled. Values inside one fused partition stay float32,
as in an NPU's wide accumulators. Results therefore carry real fp16 rounding error.

What a real NPU compiler keeps in float32 stays float32 here too: reduction results (the statistics
of a LayerNorm written as ReduceSum/Sqrt/Div, a mean, a norm) entering or leaving a partition are
not rounded (``FP32_PRODUCERS``). A value whose fp16 storage turns a finite float32 into inf is
reported: the store kernel raises a flag the EP reads after the run and logs once per value.
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
"""
LOCAL = 64
F32 = np.dtype(np.float32)


def overflows(a: np.ndarray) -> bool:
    """Whether fp16 storage turns some finite value of ``a`` into inf."""
    return a.dtype == F32 and a.size > 0 and bool(np.any(np.isfinite(a) & (np.abs(a) > FP16_MAX)))


def round_constants(constants: dict[str, np.ndarray]) -> list[str]:
    """Round float32 weights to float16 in place (in the dict), as an fp16 device stores them;
    returns the names of those with finite values fp16 cannot hold (they became inf)."""
    overflowed = []
    for name, arr in list(constants.items()):
        if isinstance(arr, np.ndarray) and arr.dtype == F32:
            if overflows(arr):
                overflowed.append(name)
            with np.errstate(over="ignore"):  # beyond 65504 is inf in fp16, as on the device
                constants[name] = arr.astype(np.float16).astype(np.float32)
    return overflowed


class HalfRounder:
    """Enqueues fp16 store/load round trips on a device's queue."""

    def __init__(self, device: OpenCLDeviceContext) -> None:
        self.device = device
        self._store = device.kernel(ROUND_SOURCE, "onnxhal_sim_store_half")
        self._load = device.kernel(ROUND_SOURCE, "onnxhal_sim_load_half")
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
_FLOATS = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE})


def decision_reason(compute_dtype: str, profile_name: str, node: Any, graph: Any) -> str | None:
    """Why an fp16 device declines ``node``: a float32 value it computes is compared against a
    threshold (tree models as tensors: hummingbird's GEMM strategy compares X @ W with each node's
    threshold). fp16 rounds about 1e-3 relative, enough to move a value across its threshold, and a
    flipped comparison changes the answer entirely (another leaf, another class), which no
    tolerance covers. Else None."""
    if compute_dtype != "float16":
        return None
    for name in node.outputs:
        if not name:
            continue
        info = graph.value_info(name)
        if info is None or info.elem_type not in _FLOATS:
            continue
        for consumer in graph.consumers(name):
            if consumer.op_type in COMPARISONS and consumer.domain in ("", "ai.onnx"):
                return (f"decision threshold on an fp16 device: {consumer.op_type} {consumer.name!r} compares "
                        f"{name!r}, and fp16 rounding (about 1e-3 relative) moves values across the threshold; "
                        f"{profile_name} cannot compute it in its precision")
    return None
