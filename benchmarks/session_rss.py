"""Resident memory over session cycles: create a session, run it once, drop it; again and again.

    python benchmarks/session_rss.py [--model cnn] [--cycles 200] [--warmup 20] [--sides ort-cpu,ort-bridge,onnxhal]

Each side runs in a child process of its own (so none inherits another's heap), and prints the
process's RSS after every cycle, then a summary line:

- ``ort-cpu``: onnxruntime's own CPU EP (the baseline);
- ``ort-bridge``: onnxruntime with the model on the simulated device through onnxhal's plugin EP
  library (``onnxhal.ort_plugin``), the device's memory declared to onnxruntime;
- ``onnxhal``: onnxhal's own session on the same simulated device.

Summary: RSS before the first session (libraries loaded, model built), after warm-up and at the end (the least of the first and of the last ten cycles: the
allocator's free lists make RSS swing by tens of MiB from cycle to cycle, the low points are what
stays), the growth per session after warm-up (``KiB/session``: low point to low point, and the slope
of a straight-line fit), and what ``malloc_trim(0)`` gives back after the last cycle (free memory
the C allocator keeps: the peak working set of one session, which a later session reuses), and the
median seconds per cycle. The environment passes to the children: ``MALLOC_MMAP_THRESHOLD_=1048576``
shows what pinning glibc's threshold does (docs/memory.md).

``--model``: ``cnn`` (ResNet-18 at 1x3x224x224, benchmarks/models.py) or ``encoder`` (one BERT-base
encoder layer, seq 128).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "22")

SIDES = ("ort-cpu", "ort-bridge", "onnxhal")
PROFILE = "generic-gpu"


def _model(name: str):
    from benchmarks import models

    if name == "cnn":
        return models.cnn()
    if name == "encoder":
        return models.encoder()
    raise SystemExit(f"unknown model {name!r}: cnn, encoder")


def _session_maker(side: str, data: bytes):
    """A function making one session of ``side`` on the model's bytes."""
    if side == "onnxhal":
        import onnxhal
        from onnxhal.simulators.testing import simulated_devices

        held = simulated_devices(PROFILE)  # registered for the child's life: the closure keeps it
        devices = held.__enter__()
        dev = next(d for d in devices if d.ep_name == "VirtualGpuExecutionProvider")

        def make(_held=held):
            so = onnxhal.SessionOptions()
            so.add_provider_for_devices([dev])
            return onnxhal.InferenceSession(data, so)
        return make
    import onnxruntime as ort

    if side == "ort-cpu":
        return lambda: ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    import onnxhal.ort_plugin as plugin

    plugin.configure(profiles=[PROFILE])
    ort.register_execution_provider_library(plugin.REGISTRATION_NAME, plugin.library_path())
    dev = next(d for d in ort.get_ep_devices() if d.ep_name == "VirtualGpuExecutionProvider")

    def make():
        so = ort.SessionOptions()
        so.add_provider_for_devices([dev], {})
        return ort.InferenceSession(data, so)
    return make


def child(side: str, model_name: str, cycles: int, warmup: int) -> None:
    import numpy as np
    import psutil

    from benchmarks import models

    model = _model(model_name)
    data, feeds = model.SerializeToString(), models.feeds(model)
    make = _session_maker(side, data)
    proc = psutil.Process()
    gc.collect()
    baseline = proc.memory_info().rss / 2**20  # libraries loaded, the model built, no session yet
    rss: list[float] = []
    seconds: list[float] = []
    for k in range(warmup + cycles):
        t0 = time.perf_counter()
        sess = make()
        sess.run(None, feeds)
        del sess
        gc.collect()
        seconds.append(time.perf_counter() - t0)
        rss.append(proc.memory_info().rss / 2**20)
        print(f"{side} cycle {k + 1}: {rss[-1]:.1f} MiB", flush=True)
    after = rss[warmup:]
    start, end = min(after[:10]), min(after[-10:])
    slope = float(np.polyfit(np.arange(len(after)), np.array(after), 1)[0])
    before_trim = proc.memory_info().rss
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    trimmed = (before_trim - proc.memory_info().rss) / 2**20
    print(json.dumps({"side": side, "baseline_mib": baseline, "start_mib": start, "end_mib": end,
                      "kib_per_session": (end - start) * 1024 / max(len(after) - 10, 1),
                      "slope_kib_per_session": slope * 1024, "malloc_trim_mib": trimmed,
                      "cycle_s": statistics.median(seconds[warmup:])}), flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="cnn")
    p.add_argument("--cycles", type=int, default=200, help="measured cycles per side (default 200)")
    p.add_argument("--warmup", type=int, default=20, help="cycles before measuring (default 20)")
    p.add_argument("--sides", default=",".join(SIDES))
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.child, args.model, args.cycles, args.warmup)
        return 0
    rows = []
    for side in args.sides.split(","):
        if side not in SIDES:
            raise SystemExit(f"unknown side {side!r}: {', '.join(SIDES)}")
        done = subprocess.run([sys.executable, __file__, "--child", side, "--model", args.model, "--cycles",
                               str(args.cycles), "--warmup", str(args.warmup)], capture_output=True, text=True)
        lines = done.stdout.strip().splitlines()
        for line in lines[:-1]:
            print(line)
        if done.returncode != 0 or not lines:
            print(done.stderr[-2000:], file=sys.stderr)
            return done.returncode or 1
        rows.append(json.loads(lines[-1]))
    import onnxruntime as ort

    print(f"\n{args.model}, {args.warmup} warm-up + {args.cycles} measured cycles, onnxruntime {ort.__version__}, "
          f"{PROFILE}")
    print(f"{'side':11} {'no session':>11} {'after warm-up':>14} {'end':>9} {'KiB/session':>12} {'(fit)':>8} "
          f"{'malloc_trim frees':>18} {'s/cycle':>8}")
    for r in rows:
        print(f"{r['side']:11} {r['baseline_mib']:>7.1f} MiB {r['start_mib']:>10.1f} MiB {r['end_mib']:>5.1f} MiB "
              f"{r['kib_per_session']:>12.1f} {r['slope_kib_per_session']:>8.1f} {r['malloc_trim_mib']:>14.1f} MiB "
              f"{r['cycle_s']:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
