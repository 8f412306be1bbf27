"""Each 2-D convolution of a model alone on the OpenCL EP against onnxruntime's CPU EP, alternating.

    python benchmarks/opencl_conv_layers.py [MODEL] [--batch 1] [--repeat 30] [--threads 2]
                                            [--disable-fusions RULES] [--ab RULES] [--whole] [--profile]

MODEL is a corpus ``.onnx`` file or ``cnn`` (``models.cnn()``, the default). Every Conv with constant
weights (and its bias) is one model of one node, run by an OpenCL session (input in host memory, as a
model run is) and by onnxruntime with ``--threads`` threads, alternating (every other round in
reverse order); the figures are medians of
wall time (a CPU device's work runs on the driver's threads, which process CPU time of this thread
would miss), with the load average printed at the start and end. ``--ab RULES`` adds a third session
with those fusion rules off, alternating with the other two, for a before/after of a kernel rule on
the same layer under the same load. ``--whole`` times the whole model the same way (its first
input of the given batch, random) instead of its layers. ``--profile`` also prints, per OpenCL session,
each launch of a run with the median of its device time by the driver's profiling events (a
profiling queue: the figures show where a run's device time goes, not the time without profiling).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import onnx
from onnx import helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from conv_layers import conv_layers  # noqa: E402


def conv_model(node: onnx.NodeProto, shape: tuple, w: np.ndarray, b: np.ndarray | None) -> bytes:
    """A model of one Conv of ``node``'s attributes with constant weights (and bias)."""
    inits = [numpy_helper.from_array(w, "w")] + ([numpy_helper.from_array(b, "b")] if b is not None else [])
    conv = helper.make_node("Conv", ["x", "w"] + (["b"] if b is not None else []), ["y"])
    conv.attribute.extend(node.attribute)
    graph = helper.make_graph([conv], "conv", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10).SerializeToString()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", nargs="?", default="cnn")
    p.add_argument("--batch", default="1")
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--disable-fusions", default="", metavar="RULES")
    p.add_argument("--ab", default="", metavar="RULES", help="also time a session with these rules off")
    p.add_argument("--whole", action="store_true", help="time the whole model instead of its layers")
    p.add_argument("--profile", action="store_true", help="print each launch's device time (profiling events)")
    args = p.parse_args(argv)
    events: list = []
    if args.profile:
        _profile_launches(events)
    import onnxruntime as ort

    import onnxhal

    model = __import__("models").cnn() if args.model == "cnn" else onnx.load(args.model)
    rng = np.random.default_rng(0)
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    hso = onnxhal.SessionOptions()
    hso.intra_op_num_threads = args.threads

    def hal_session(data: bytes, off: str) -> onnxhal.InferenceSession:
        return onnxhal.InferenceSession(data, hso, providers=[
            ("OpenCLExecutionProvider", {"disable_fusions": off}), "CPUExecutionProvider"])

    print(f"load average at the start {open('/proc/loadavg').read().split()[:3]}")
    for batch in (int(v) for v in args.batch.split(",")):
        totals = [0.0, 0.0, 0.0]
        for node, shape, w, b in _whole(model, batch) if args.whole else conv_layers(model, batch):
            x = rng.standard_normal(shape).astype(np.float32)
            data = model.SerializeToString() if args.whole else conv_model(node, shape, w, b)
            if args.whole:  # the model's own input name
                x_name = model.graph.input[0].name
                feeds = {x_name: x}
            else:
                feeds = {"x": x}
            sessions = [hal_session(data, args.disable_fusions),
                        ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])]
            if args.ab:
                sessions.append(hal_session(data, ",".join(filter(None, (args.disable_fusions, args.ab)))))
            want = sessions[1].run(None, feeds)[0]
            diffs = [float(np.max(np.abs(s.run(None, feeds)[0] - want))) for s in sessions]
            cpu: list[list[float]] = [[] for _ in sessions]
            wall: list[list[float]] = [[] for _ in sessions]
            launches: list[list[list[tuple[str, float]]]] = [[] for _ in sessions]
            for r in range(args.repeat):
                # Every other repeat in reverse order, so that neither OpenCL session always runs
                # right after onnxruntime's (which leaves the driver's threads asleep, caches cold).
                for i in range(len(sessions)) if r % 2 == 0 else reversed(range(len(sessions))):
                    s = sessions[i]
                    events.clear()
                    c0, t0 = time.process_time(), time.perf_counter()
                    s.run(None, feeds)
                    wall[i].append(time.perf_counter() - t0)
                    cpu[i].append(time.process_time() - c0)
                    if events:
                        launches[i].append([(name, (e.profile.end - e.profile.start) / 1e3) for name, e in events])
            for i, runs in enumerate(launches):
                if runs and i != 1:
                    _print_launches("rules off" if i == 2 else "ocl", runs)
            med = [statistics.median(t) * 1e6 for t in cpu]
            wmed = [statistics.median(t) * 1e6 for t in wall]
            for i, m in enumerate(med):
                totals[i] += m
            ab = f"  rules off {med[2]:8.1f} ({med[2] / med[1]:4.2f})" if args.ab else ""
            print(f"N={batch} x={str(shape):19s} w={str(w.shape):17s} s={_strides(node)} cpu us ocl {med[0]:8.1f} "
                  f"ort {med[1]:8.1f} ({med[0] / med[1]:4.2f}){ab}  wall ocl {wmed[0]:8.1f} ort {wmed[1]:8.1f}  "
                  f"diff {max(diffs):.1e}", flush=True)
        ab = f", rules off {totals[2]:.0f} ({totals[2] / totals[1]:.2f})" if args.ab else ""
        print(f"N={batch} total cpu us {totals[0]:.0f} against onnxruntime's {totals[1]:.0f} "
              f"({totals[0] / totals[1]:.2f}){ab}")
    print(f"load average at the end {open('/proc/loadavg').read().split()[:3]}")
    return 0


def _profile_launches(events: list) -> None:
    """Make every OpenCL queue a profiling one and record each kernel launch's event in ``events``
    as (kernel name, event); set up before the first session opens the device."""
    import pyopencl as cl

    class ProfilingQueue(cl.CommandQueue):
        def __init__(self, context, device=None, properties=None) -> None:
            super().__init__(context, device, cl.command_queue_properties.PROFILING_ENABLE)

    enqueue = cl.enqueue_nd_range_kernel

    def recorded(queue, kernel, *rest, **kw):
        event = enqueue(queue, kernel, *rest, **kw)
        events.append((kernel.function_name, event))
        return event

    cl.CommandQueue = ProfilingQueue
    cl.enqueue_nd_range_kernel = recorded


def _print_launches(label: str, runs: list[list[tuple[str, float]]]) -> None:
    """Each launch of a run (the runs' common launch order) with its median device microseconds."""
    n = min(len(r) for r in runs)
    meds = [statistics.median(r[k][1] for r in runs) for k in range(n)]
    print(f"  {label}: {n} launches, device us a run {sum(meds):.0f}")
    for k in range(n):
        print(f"    {k:3d} {runs[0][k][0]:24s} {meds[k]:9.1f}")


def _whole(model: onnx.ModelProto, batch: int) -> list[tuple[onnx.NodeProto, tuple, np.ndarray, None]]:
    """The model's first input as one "layer" (its shape with the batch axis set), for ``--whole``."""
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    shape = (batch, *dims[1:])
    node = helper.make_node("Identity", [model.graph.input[0].name], ["whole"])
    return [(node, shape, np.zeros((0,), np.float32), None)]


def _strides(node: onnx.NodeProto) -> int:
    for a in node.attribute:
        if a.name == "strides":
            return a.ints[0]
    return 1


if __name__ == "__main__":
    sys.exit(main())
