"""The OpenCL EP's native replay against its Python replay, alternating in one process.

    python benchmarks/opencl_replay_ab.py [--models mlp,cnn,encoder,bert_ts,...] [--repeat 40] [--threads 2]

First the one-kernel probe (DESIGN.md section 6): a one-work-item kernel's launch + finish, and the
host CPU time of enqueueing 64 of them through pyopencl (one ``enqueue_nd_range_kernel`` each)
against one native replay of a 64-launch recording. Then, per model (opencl_host_cost.py's set),
two sessions of the OpenCL EP, one made with ``ONNXHAL_NATIVE_REPLAY=0`` (the switch is read when a
partition state is created), and onnxruntime's CPU EP, run in turn: commands per run of each path
(the native replay's counters and pyopencl's wrapped entry points), host CPU time of the calling
thread per run (``time.thread_time``) and the part of it inside the partitions' ``PartitionState.run``
(binding, allocating outputs and the replay), median wall time per run and its ratio to onnxruntime. The
load average is printed with the figures: on a shared machine compare the columns of one row only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from opencl_host_cost import DEFAULT_MODELS, PROVIDERS, CommandCounter, model_and_feeds  # noqa: E402

PROBE_LAUNCHES = 64


def probe() -> str:
    """The one-kernel probe: launch + finish, and the host cost of enqueueing per launch each way."""
    import pyopencl as cl

    from onnxhal.runtime.providers.opencl.native_replay import replay_module

    native = replay_module()
    device = next(d for p in cl.get_platforms() for d in p.get_devices())
    ctx = cl.Context([device])
    queue = cl.CommandQueue(ctx)
    kernels = [cl.Program(ctx, "__kernel void k(__global float *a) { a[get_global_id(0)] += 1.0f; }").build().k
               for _ in range(PROBE_LAUNCHES)]
    bufs = [cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4) for _ in range(2)]
    for k in kernels:
        k.set_arg(0, bufs[0])
    lf = []
    for _ in range(50):
        t = time.perf_counter()
        cl.enqueue_nd_range_kernel(queue, kernels[0], (1,), (1,))
        queue.finish()
        lf.append(time.perf_counter() - t)
    # per launch: enqueue alone (the argument bound already), and set_arg + enqueue (a new buffer)
    times: dict[str, list] = {"py": [], "py_set": [], "nat": [], "nat_set": []}
    recording = None
    if native is not None:
        recording = native.Recording([(0, k, (1,), (1,), ((0, 0),)) for k in kernels], 1)
        recording.replay(queue, [bufs[0]])
    for r in range(30):  # each batch starts on an idle queue
        queue.finish()
        t = time.thread_time()
        for k in kernels:
            cl.enqueue_nd_range_kernel(queue, k, (1,), (1,))
        times["py"].append(time.thread_time() - t)
        buf = bufs[(r + 1) % 2]
        queue.finish()
        t = time.thread_time()
        for k in kernels:
            k.set_arg(0, buf)
            cl.enqueue_nd_range_kernel(queue, k, (1,), (1,))
        times["py_set"].append(time.thread_time() - t)
        queue.finish()
        if recording is not None:
            for key, slot in (("nat", bufs[0]), ("nat_set", bufs[1])):
                queue.finish()
                t = time.thread_time()
                code, _, _ = recording.replay(queue, [slot])
                times[key].append(time.thread_time() - t)
                assert code == 0, code
            recording.replay(queue, [bufs[0]])
    queue.finish()
    per = {k: statistics.median(v) / PROBE_LAUNCHES * 1e6 for k, v in times.items() if v}
    out = (f"probe on {device.platform.version}: launch + finish {statistics.median(lf) * 1e6:.0f} us; host CPU per "
           f"launch, enqueue / set_arg + enqueue: pyopencl {per['py']:.1f} / {per['py_set']:.1f} us")
    if recording is not None:
        out += f", native replay {per['nat']:.1f} / {per['nat_set']:.1f} us"
    return out


def measure(name: str, repeat: int, threads: int) -> tuple:
    import onnxruntime as ort

    import onnxhal

    data, feeds = model_and_feeds(name)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    ref = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    sessions = {}
    for path, switch in (("native", "1"), ("python", "0")):
        os.environ["ONNXHAL_NATIVE_REPLAY"] = switch
        hso = onnxhal.SessionOptions()
        hso.intra_op_num_threads = threads
        sess = onnxhal.InferenceSession(data, hso, providers=PROVIDERS)
        for _ in range(3):  # records every shape's states with the switch as set now
            sess.run(None, feeds)
        sessions[path] = sess
    os.environ.pop("ONNXHAL_NATIVE_REPLAY")
    outs = {p: s.run(None, feeds) for p, s in sessions.items()}
    for a, b in zip(outs["native"], outs["python"]):
        np.testing.assert_array_equal(a, b)
    counts = {}
    for path, sess in sessions.items():
        with CommandCounter() as c:
            for _ in range(3):
                sess.run(None, feeds)
        counts[path] = (c.launches / 3, c.set_args / 3)
    cpu = {p: [] for p in sessions}
    part = {p: [] for p in sessions}
    wall = {p: [] for p in sessions}
    from onnxhal.runtime.providers.opencl import partition_plan

    spent = [0.0]
    real_run = partition_plan.PartitionState.run

    def timed_run(self, inputs, queue):  # the partitions' share of a run's host time
        t = time.thread_time()
        try:
            return real_run(self, inputs, queue)
        finally:
            spent[0] += time.thread_time() - t
    partition_plan.PartitionState.run = timed_run
    t_ort = []
    order = list(sessions.items())
    for k in range(repeat):
        t = time.perf_counter()
        ref.run(None, feeds)
        t_ort.append(time.perf_counter() - t)
        for path, sess in order if k % 2 else order[::-1]:  # each path first after onnxruntime half the time
            spent[0] = 0.0
            t, c = time.perf_counter(), time.thread_time()
            sess.run(None, feeds)
            cpu[path].append(time.thread_time() - c)
            wall[path].append(time.perf_counter() - t)
            part[path].append(spent[0])
    partition_plan.PartitionState.run = real_run
    med = statistics.median
    o = med(t_ort)
    return (name, counts["native"], counts["python"], med(cpu["native"]) * 1e6, med(cpu["python"]) * 1e6,
            med(wall["native"]) * 1e3, med(wall["python"]) * 1e3, o * 1e3,
            med(wall["native"]) / o, med(wall["python"]) / o, med(part["native"]) * 1e6, med(part["python"]) * 1e6)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=DEFAULT_MODELS)
    p.add_argument("--repeat", type=int, default=40)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    print(probe(), f"; load average {os.getloadavg()[0]:.2f}")
    print(f"{'model':14} {'launches n/py':>13} {'set_arg n/py':>12} {'host us n/py':>15} {'partition us':>13} "
          f"{'wall ms n/py/ort':>22} {'ratio n/py':>11}  load")
    for name in args.models.split(","):
        r = measure(name, args.repeat, args.threads)
        print(f"{r[0]:14} {r[1][0]:6.1f}/{r[2][0]:<6.1f} {r[1][1]:5.1f}/{r[2][1]:<6.1f} {r[3]:7.0f}/{r[4]:<7.0f} "
              f"{r[10]:6.0f}/{r[11]:<6.0f} "
              f"{r[5]:7.2f}/{r[6]:.2f}/{r[7]:.2f} {r[8]:5.2f}/{r[9]:<5.2f}  {os.getloadavg()[0]:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
