"""GEMM throughput of the OpenCL EP's kernel vs numpy's BLAS, side by side.

Runs the EP's real path (a MatMul node through get_capability/compile/compute, inputs already in
device memory, timing enqueue + finish; best of several runs for both) and reports GFLOP/s with B an
input ("OpenCL": B packed every run) and B a constant weight ("const-B": packed once, time shown),
then data-transfer throughput against a numpy copy. Usage: python benchmarks/opencl_gemm.py [N ...]   (default 512 1024 2048)
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
    fg = info.filtered_graph(*info.fused_groups[0])
    (cinfo,) = ep.compile([fg], [None])
    t = time.perf_counter()
    state = cinfo.create_state(None)
    return cinfo, state, fg, time.perf_counter() - t


def main(sizes: list[int]) -> None:
    factory = create_ep_factories("opencl", hal.EpApi(), logging.getLogger("bench"))[0]
    # The first OpenCL device that passes discovery's probe (the bundled PoCL fails on CPUs newer than
    # its LLVM; Debian's PoCL or Intel's runtime then come first).
    from onnxhal.devices.opencl import first_usable_opencl_device

    index, reason = first_usable_opencl_device()
    if index is None:
        raise SystemExit(reason)
    print(f"OpenCL device {index}")
    hw = hal.OrtHardwareDevice(hal.OrtHardwareDeviceType.CPU, "cpu", 0x1022, 0,
                               {"opencl_devices": index})
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
        reps = max(4, int(2e10 // flop))
        ref = a @ b
        best_np = float("inf")
        for _ in range(reps + 1):  # best of, as for OpenCL: the machine's cores are shared
            t = time.perf_counter()
            ref = a @ b
            best_np = min(best_np, time.perf_counter() - t)
        numpy_gf = flop / best_np / 1e9
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
    transfer(alloc, dt)


def transfer(alloc, dt, nbytes: int = 64 << 20) -> None:
    """Copy throughput of the data transfer against a numpy copy of the same bytes (best of 5)."""
    x = np.random.default_rng(1).random(nbytes // 4, dtype=np.float32)
    y = np.empty_like(x)
    dev, dev2 = alloc.tensor(x.shape, np.float32), alloc.tensor(x.shape, np.float32)

    def rate(fn) -> float:
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t)
        return nbytes / best / 1e9

    numpy_rate = rate(lambda: np.copyto(y, x))
    rates = {"host->device": rate(lambda: dt.copy_tensors([x], [dev])),
             "device->host": rate(lambda: dt.copy_tensors([dev], [y])),
             "device->device": rate(lambda: dt.copy_tensors([dev], [dev2]))}
    assert np.array_equal(x, y)
    print(f"copies of {nbytes >> 20} MiB: numpy {numpy_rate:.1f} GB/s; " + ", ".join(
        f"{k} {v:.1f} GB/s ({100 * v / numpy_rate:.0f}%)" for k, v in rates.items()))


if __name__ == "__main__":
    main([int(v) for v in sys.argv[1:]] or [512, 1024, 2048])
