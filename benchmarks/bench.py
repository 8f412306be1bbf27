"""Benchmark onnxhal against onnxruntime (CPU, 2 intra-op threads), side by side in one process.

    python benchmarks/bench.py [--models mlp,cnn,encoder,chain,light] [--repeat 20] [--json out.json]
                               [--ep cpu|opencl] [--load N]

``--ep opencl`` runs onnxhal's side on the OpenCL EP (CPU EP fallback) on the first OpenCL device
that passes the probe, and names that driver in the table's title; its targets are 3x onnxruntime's
CPU time. ``--load N`` runs N busy processes during the whole measurement (a competing load, as on
a shared CI machine).

For each model: build it (``models.py``), create both sessions, check the outputs agree (max abs
difference, also relative to the largest output), warm up, then time ``repeat`` runs alternating
onnxruntime and onnxhal, and report medians. ``ratio`` is the ratio of the two medians (what the
targets are judged on); ``pair ratio`` is the median of the per-pair ratios, with its quartiles,
which a slow phase of the machine lasting several runs does not skew. ``steal %`` is the share of
the CPU time the hypervisor gave to other guests during the timed runs (/proc/stat): on a shared
VM both runtimes slow down by a varying amount, and a row measured at a high steal share is the
one to re-run before reading much into its ratio. ``light`` expands to every
light model-zoo model; single light models are named ``light:resnet50`` etc. Materialized light models are cached in
``$ONNXHAL_BENCH_CACHE`` (default ``~/.cache/onnxhal-bench``) because random weights for vgg19 take
half a minute to build.

Threads: both runtimes get ``--threads`` (2) intra-op threads. onnxhal's session maps that to
numpy's BLAS (OpenBLAS, whose threads take work in C while spinning: handing work to a Python
pool thread costs 0.1-0.2 ms per wake-up on this 2-vCPU VM) and to the fused kernels' pool for
large elementwise work. OpenBLAS reads ``OPENBLAS_NUM_THREADS`` and ``OPENBLAS_THREAD_TIMEOUT``
when numpy is first imported, so this script sets them before importing numpy unless already set.
Its idle threads spin for 2^N cycles (N = 28 by default, about 0.1 s here), which in alternating
runs would take the cores from the onnxruntime run that follows; ``--blas-timeout`` (22, about
2 ms) bounds that. For the same reason onnxruntime's spinning is off
(``session.intra_op.allow_spinning=0``) unless ``--ort-spin``.
"""

from __future__ import annotations

import argparse
import os
import sys


def _option(argv: list[str], name: str, default: str) -> str:
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return default


if __name__ == "__main__":  # BLAS pools are sized when numpy is imported: set them first
    _threads = _option(sys.argv, "--threads", "2")
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, _threads)
    # OpenBLAS's idle threads spin 2^N cycles before sleeping (default N=28, about 0.1 s here):
    # in alternating runs they would take the cores from the onnxruntime run that follows.
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", _option(sys.argv, "--blas-timeout", "22"))

import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402

import numpy as np  # noqa: E402
import onnx  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402

#: Issue targets: max onnxhal/ORT time ratio per model (the chain is judged per node instead).
TARGETS = {"mlp": 1.3, "encoder": 1.3, "cnn": 2.0}
LIGHT_TARGET = 2.0
CHAIN_US_PER_NODE = 3.0


@dataclass
class Result:
    model: str
    ort_ms: float
    onnxhal_ms: float
    ratio: float
    target: str
    met: bool
    max_abs_diff: float
    rel_diff: float
    nodes: int
    note: str = ""
    #: Median and quartiles of the per-pair ratios (each onnxhal run over the onnxruntime run just
    #: before it): a machine slowdown lasting longer than a pair cancels out of these.
    pair_ratio: float = float("nan")
    pair_q1: float = float("nan")
    pair_q3: float = float("nan")
    #: Share of the machine's CPU time the hypervisor gave to other guests during the timed runs
    #: (/proc/stat "steal"; NaN where unavailable). Ratios measured at a high steal share are noisy.
    steal_pct: float = float("nan")


def cpu_steal_ticks() -> tuple[int, int] | None:
    """(steal, total) jiffies of all CPUs from /proc/stat, or None off Linux."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal [guest guest_nice]: guest time is already
    # counted in user/nice, so the total stops at steal.
    return (fields[7], sum(fields[:8])) if len(fields) >= 8 else None


def build(name: str) -> onnx.ModelProto:
    if name.startswith("light:"):
        short = name.split(":", 1)[1]
        cache = os.environ.get("ONNXHAL_BENCH_CACHE", os.path.expanduser("~/.cache/onnxhal-bench"))
        path = os.path.join(cache, f"light_{short}_seed0_v{models.LIGHT_WEIGHTS_VERSION}.onnx")
        if os.path.isfile(path):
            return onnx.load(path)
        model = models.light_model(short)
        os.makedirs(cache, exist_ok=True)
        onnx.save(model, path)
        return model
    return models.BUILDERS[name]()


def expand(names: list[str]) -> list[str]:
    out: list[str] = []
    for n in names:
        if n == "light":
            out.extend(f"light:{m}" for m in models.light_models())
        elif n in models.light_models():
            out.append(f"light:{n}")
        else:
            out.append(n)
    return out


OPENCL_TARGET = 3.0
#: onnxhal's providers: the CPU EP alone, or the OpenCL EP first (``--ep opencl``).
PROVIDERS = {"cpu": ["CPUExecutionProvider"], "opencl": ["OpenCLExecutionProvider", "CPUExecutionProvider"]}


def opencl_driver() -> str:
    """Register the OpenCL EP and name the device and driver it runs on (raises if there is none)."""
    import onnxhal
    from onnxhal.devices.opencl import enumerate_opencl_devices

    onnxhal.register_execution_provider_library("opencl", "onnxhal.runtime.providers.opencl")
    devices = [d for d in onnxhal.get_ep_devices() if d.ep_name == "OpenCLExecutionProvider"]
    if not devices:
        verdicts = "; ".join(f"{r.device_name}: {r.probe.state}" for r in enumerate_opencl_devices())
        raise SystemExit(f"--ep opencl: no OpenCL device passed the probe ({verdicts or 'none listed'})")
    md = devices[0].ep_metadata
    return f"{md['opencl_platform']} {md['opencl_driver']} on {md['opencl_device']}"


def _busy(stop) -> None:
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x += 1


def start_load(n: int) -> tuple:
    """``n`` processes spinning on a core each, until ``stop_load``."""
    import multiprocessing as mp

    stop = mp.Event()
    procs = [mp.Process(target=_busy, args=(stop,), daemon=True) for _ in range(n)]
    for proc in procs:
        proc.start()
    return stop, procs


def stop_load(load: tuple) -> None:
    stop, procs = load
    stop.set()
    for proc in procs:
        proc.join(5)


def sessions(model: onnx.ModelProto, threads: int, ort_spin: bool, ep: str = "cpu") -> tuple:
    import onnxruntime as ort

    import onnxhal

    data = model.SerializeToString()
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    if not ort_spin:  # spinning pool threads would steal the cores from the next (onnxhal) run
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    ort_sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    hso = onnxhal.SessionOptions()
    hso.intra_op_num_threads = threads
    hal_sess = onnxhal.InferenceSession(data, hso, providers=PROVIDERS[ep])
    return ort_sess, hal_sess


def measure(name: str, repeat: int, warmup: int, threads: int, ort_spin: bool, progress, ep: str = "cpu") -> Result:
    model = build(name)
    feeds = models.feeds(model)
    ort_sess, hal_sess = sessions(model, threads, ort_spin, ep)
    ref = ort_sess.run(None, feeds)
    got = hal_sess.run(None, feeds)
    diff = max(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)))) for a, b in zip(ref, got))
    scale = max(float(np.max(np.abs(np.asarray(a, np.float64)))) for a in ref) or 1.0
    for _ in range(warmup):
        ort_sess.run(None, feeds)
        hal_sess.run(None, feeds)
    t_ort, t_hal = [], []
    before = cpu_steal_ticks()
    for _ in range(repeat):  # alternate so both see the same machine load
        t0 = time.perf_counter()
        ort_sess.run(None, feeds)
        t1 = time.perf_counter()
        hal_sess.run(None, feeds)
        t2 = time.perf_counter()
        t_ort.append(t1 - t0)
        t_hal.append(t2 - t1)
        progress()
    after = cpu_steal_ticks()
    steal = (100.0 * (after[0] - before[0]) / max(1, after[1] - before[1])
             if before is not None and after is not None else float("nan"))
    ort_ms, hal_ms = statistics.median(t_ort) * 1e3, statistics.median(t_hal) * 1e3
    nodes = len(model.graph.node)
    ratio = hal_ms / ort_ms
    q1, pair, q3 = statistics.quantiles([h / o for h, o in zip(t_hal, t_ort)], n=4) if repeat > 1 else (ratio,) * 3
    if name == "chain":
        per_node = hal_ms * 1e3 / nodes
        target, met = f"<= {CHAIN_US_PER_NODE} us/node", per_node <= CHAIN_US_PER_NODE
        note = f"{per_node:.2f} us/node (ORT {ort_ms * 1e3 / nodes:.2f})"
    else:
        limit = OPENCL_TARGET if ep == "opencl" else TARGETS.get(name, LIGHT_TARGET)
        target, met, note = f"<= {limit}", ratio <= limit, ""
        if ep == "opencl":
            on_device = hal_sess.partition_summary.get("OpenCLExecutionProvider", 0)
            note = f"{on_device}/{sum(hal_sess.partition_summary.values())} nodes on OpenCL"
    return Result(name, ort_ms, hal_ms, ratio, target, met, diff, diff / scale, nodes, note, pair, q1, q3, steal)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="mlp,cnn,encoder,chain,light",
                   help="comma-separated: mlp, cnn, encoder, chain, light (all light models), "
                        "or a light model name such as resnet50")
    p.add_argument("--repeat", type=int, default=20, help="timed runs per runtime (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs per runtime first (default 3)")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads for both runtimes (default 2)")
    p.add_argument("--blas-timeout", type=int, default=22,
                   help="OPENBLAS_THREAD_TIMEOUT: idle BLAS threads spin 2^N cycles before sleeping (default 22)")
    p.add_argument("--ort-spin", action="store_true",
                   help="keep onnxruntime's intra-op thread spinning on (off by default: in alternating runs the "
                        "spinning threads take the cores from the onnxhal run that follows)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON ('-' for stdout)")
    p.add_argument("--ep", choices=sorted(PROVIDERS), default="cpu",
                   help="onnxhal's EP: the CPU EP (default) or the OpenCL EP with CPU fallback")
    p.add_argument("--load", type=int, default=0, metavar="N", help="N busy processes competing for the cores")
    args = p.parse_args(argv)
    driver = opencl_driver() if args.ep == "opencl" else "CPU EP"

    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    console = Console(stderr=True)
    names = expand([n.strip() for n in args.models.split(",") if n.strip()])
    results: list[Result] = []
    # No auto-refresh: rich would redraw from its own thread ten times a second, taking the GIL
    # during onnxhal's timed runs (onnxruntime's release it for the whole run). The bar is redrawn
    # between timed pairs instead. The thread's effect measured within the noise; this keeps it
    # out of the timings rather than fixing a measured bias.
    load = start_load(args.load) if args.load else None
    with Progress(console=console, transient=True, auto_refresh=False) as prog:
        task = prog.add_task("benchmark", total=len(names) * args.repeat)
        for name in names:
            prog.update(task, description=f"{name}", refresh=True)
            try:
                results.append(measure(name, args.repeat, args.warmup, args.threads, args.ort_spin,
                                       lambda: (prog.advance(task), prog.refresh()), args.ep))
            except Exception as exc:  # one broken model must not hide the others' figures
                console.print(f"[red]{name}: {type(exc).__name__}: {exc}")
                results.append(Result(name, float("nan"), float("nan"), float("nan"), "", False,
                                      float("nan"), float("nan"), 0, f"error: {type(exc).__name__}: {exc}"[:200]))
    if load is not None:
        stop_load(load)
    loaded = f", {args.load} busy processes" if args.load else ""
    table = Table(title=f"onnxhal ({driver}) vs onnxruntime (CPU), {args.threads} threads, median of {args.repeat}"
                        f"{loaded}")
    for col in ("model", "ort ms", "onnxhal ms", "ratio", "pair ratio (q1-q3)", "target", "met", "max abs diff", "steal %", "note"):
        table.add_column(col, justify="left" if col in ("model", "target", "note") else "right")
    for r in results:
        table.add_row(r.model, f"{r.ort_ms:.2f}", f"{r.onnxhal_ms:.2f}", f"{r.ratio:.2f}",
                      f"{r.pair_ratio:.2f} ({r.pair_q1:.2f}-{r.pair_q3:.2f})", r.target,
                      "yes" if r.met else "NO", f"{r.max_abs_diff:.2e}", f"{r.steal_pct:.1f}", r.note)
    Console(width=max(140, Console().width)).print(table)
    if args.json:
        text = json.dumps([asdict(r) for r in results], indent=2)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text)
    return 0 if all(r.met for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
