"""fp16 storage on a simulated device, emulated on the float32 kernels of the OpenCL EP.

A profile with ``float32_as = "float16"`` computes float32 models in half precision, as an NPU
does. The OpenCL EP's kernels are float32 only, so the simulator reproduces fp16 *storage*: every
float32 value entering or leaving a partition is stored to half precision with ``vstore_half_rte``
and read back with ``vload_half`` (on the device, in the partition's queue), and the partition's
weights are rounded to float16 when it is compiled. Values inside one fused partition stay float32,
as in an NPU's wide accumulators. Results therefore carry real fp16 rounding error.
"""

from __future__ import annotations

import threading

import numpy as np
import pyopencl as cl

from onnxhal.hal.allocator import Allocator
from onnxhal.hal.tensor import DeviceTensor
from onnxhal.runtime.providers.opencl.program_cache import OpenCLDeviceContext

ROUND_SOURCE = r"""
// onnxhal simulator: fp16 storage of float32 values.
__kernel void onnxhal_sim_store_half(__global const float* x, const int x_offset, __global half* h, const int n) {
    int i = get_global_id(0);
    if (i < n) vstore_half_rte(x[x_offset + i], i, h);
}
__kernel void onnxhal_sim_load_half(__global const half* h, __global float* y, const int n) {
    int i = get_global_id(0);
    if (i < n) y[i] = vload_half(i, h);
}
"""
LOCAL = 64
F32 = np.dtype(np.float32)


def round_constants(constants: dict[str, np.ndarray]) -> None:
    """Round float32 weights to float16 in place (in the dict), as an fp16 device stores them."""
    for name, arr in list(constants.items()):
        if isinstance(arr, np.ndarray) and arr.dtype == F32:
            with np.errstate(over="ignore"):  # beyond 65504 is inf in fp16, as on the device
                constants[name] = arr.astype(np.float16).astype(np.float32)


class HalfRounder:
    """Enqueues fp16 store/load round trips on a device's queue."""

    def __init__(self, device: OpenCLDeviceContext) -> None:
        self.device = device
        self._store = device.kernel(ROUND_SOURCE, "onnxhal_sim_store_half")
        self._load = device.kernel(ROUND_SOURCE, "onnxhal_sim_load_half")
        self._lock = threading.Lock()  # kernel objects hold their arguments: one launch at a time

    def _launch(self, queue: cl.CommandQueue, kernel: cl.Kernel, n: int, *args) -> None:
        padded = -(-n // LOCAL) * LOCAL
        with self._lock:
            kernel(queue, (padded,), (LOCAL,), *args, np.int32(n))

    def rounded_copy(self, t: DeviceTensor, allocator: Allocator, queue: cl.CommandQueue) -> DeviceTensor:
        """A new float32 tensor holding ``t`` rounded through fp16 storage (``t`` is left alone:
        other consumers may read it)."""
        n = t.size
        out = DeviceTensor.allocate(t.shape, F32, allocator)
        if n:
            half = allocator.alloc(2 * n)
            try:
                self._launch(queue, self._store, n, t.buffer, np.int32(t.offset // 4), half)
                self._launch(queue, self._load, n, half, out.buffer)
            finally:
                allocator.free(half)  # the release waits for the queued kernels (OpenCL semantics)
        return out

    def round_in_place(self, t: DeviceTensor, allocator: Allocator, queue: cl.CommandQueue) -> None:
        """Round a tensor the partition just produced (it owns its buffer, at offset 0)."""
        n = t.size
        if not n or t.offset:
            return
        half = allocator.alloc(2 * n)
        try:
            self._launch(queue, self._store, n, t.buffer, np.int32(t.offset // 4), half)
            self._launch(queue, self._load, n, half, t.buffer)
        finally:
            allocator.free(half)
