"""GEMM throughput of the OpenCL EP's kernel vs numpy's BLAS, side by side.

Runs the EP's real path (a MatMul node through get_capability/compile/compute, inputs already in
device memory, timing enqueue + finish) and reports GFLOP/s, plus the one-off pack of a constant
weight. Usage: python benchmarks/opencl_gemm.py [N ...]   (default 512 1024 2048)
"""

from __future__ import annotations

import logging
import sys
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxhal import hal
from onnxhal.runtime.providers.opencl import create_ep_factories
from onnxhal.runtime.providers.opencl.ep import filtered_graph


def build(factory, ep, n: int, constant_b: bool, b: np.ndarray):
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, [n, n])]
    inits = [numpy_helper.from_array(b, "b")] if constant_b else []
    if not constant_b:
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, [n, n]))
    model = helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["y"])], "gemm", inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, n])], inits),
        opset_imports=[helper.make_opsetid("", 17)])
    graph = hal.Graph.from_proto(onnx.shape_inference.infer_shapes(model).graph, {"": 17})
    info = hal.EpGraphSupportInfo(graph)
    ep.get_capability(graph, info)
    fg = filtered_graph(graph, info.fused_groups[0][0])
    (cinfo,) = ep.compile([fg], [None])
    t = time.perf_counter()
    state = cinfo.create_state(None)
    return cinfo, state, fg, time.perf_counter() - t


def main(sizes: list[int]) -> None:
    factory = create_ep_factories("opencl", hal.EpApi(), logging.getLogger("bench"))[0]
    hw = hal.OrtHardwareDevice(hal.OrtHardwareDeviceType.CPU, "cpu", 0x1022, 0, {"opencl_devices": "0:0"})
    (ep_device,) = factory.get_supported_devices([hw])
    ep = factory.create_ep([hw], [ep_device.ep_metadata], None, logging.getLogger("bench"))
    mem = ep_device.memory_info(hal.OrtDeviceMemoryType.DEFAULT)
    alloc, dt = factory.create_allocator(mem), factory.create_data_transfer()
    stream = factory.create_sync_stream_for_device(mem.memory_device)
    print(f"{'N':>6} {'numpy GF/s':>11} {'OpenCL GF/s':>12} {'const-B GF/s':>13} {'pack-once s':>12}")
    rng = np.random.default_rng(0)
    for n in sizes:
        a, b = rng.random((n, n), dtype=np.float32), rng.random((n, n), dtype=np.float32)
        flop = 2.0 * n ** 3
        reps = max(2, int(2e10 // flop))
        a @ b
        t = time.perf_counter()
        for _ in range(reps):
            ref = a @ b
        numpy_gf = flop * reps / (time.perf_counter() - t) / 1e9
        results = []
        for constant_b in (False, True):
            cinfo, state, fg, pack_s = build(factory, ep, n, constant_b, b)
            dev_in = []
            for vi in fg.inputs:
                d = alloc.tensor((n, n), np.float32)
                dt.copy_tensors([{"a": a, "b": b}[vi.name]], [d])
                dev_in.append(d)
            best = float("inf")
            for _ in range(reps + 1):  # the first run also compiles for the launch's local size
                t = time.perf_counter()
                (out,) = cinfo.compute(state, hal.KernelContext(dev_in, 1, stream))
                stream.finish()
                best = min(best, time.perf_counter() - t)
                y = np.empty((n, n), np.float32)
                dt.copy_tensors([out], [y])
                alloc.free(out.buffer)
            err = float(np.abs(y - ref).max() / np.abs(ref).max())
            assert err < 1e-4, f"OpenCL GEMM {n} wrong: relative error {err}"
            results.append((flop / best / 1e9, pack_s))
            for d in dev_in:
                alloc.free(d.buffer)
            cinfo.release_state(state)
        print(f"{n:>6} {numpy_gf:>11.1f} {results[0][0]:>12.1f} {results[1][0]:>13.1f} {results[1][1]:>12.3f}")


if __name__ == "__main__":
    main([int(v) for v in sys.argv[1:]] or [512, 1024, 2048])
