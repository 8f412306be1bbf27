"""The OpenCL EP's host cost per run and per session, against onnxruntime's CPU EP, in one process.

    python benchmarks/opencl_host_cost.py [--models mlp,cnn,encoder,bert_ts,...] [--repeat 20]
                                          [--threads 2] [--corpus DIR] [--cost-rule on|off]
                                          [--fixed-dims] [--disable-fusions RULES] [--kernels]
                                          [--ab KEY=VALUE] [--json out.json]

Per model (the OpenCL benchmark set of ``bench.py``, then a few models of the committed corpus in
tests/real_models, or of ``--corpus DIR`` such as the benchmark-size exports of ``make_corpus.py
--size medium``; corpus models run with their stored signature ``a``):

- the OpenCL commands one run sends: kernel launches, buffer copies, host waits, ``set_arg`` calls
  (``--kernels``: the launches by kernel name);
- host us: CPU time of the calling thread per run (a blocked wait takes none), what Python costs
  around the device's work (not wall time, which on a CPU device includes the device's own threads);
- the median run time against onnxruntime CPU with the same threads (alternating runs);
- session creation + first run of each runtime (medians of five fresh sessions, alternating).

``--cost-rule on`` passes the OpenCL EP's provider option (partitions smaller than their launches
and copies stay on the host: it weighs partitions of static shape only, so ``--fixed-dims`` fixes
the corpus models' batch and sequence dims to the feeds' as ``add_free_dimension_override_by_name``
does).

``--disable-fusions attention,gemm_residual`` passes the OpenCL EP's provider option of that name
(runtime/providers/opencl/fusion_rules.py): the plans without those fusion rules, for a before/after
of launches per run.

``--ab session.onnxhal.held_copies=0`` runs a second onnxhal session with that session config entry,
its runs alternating with the first's (A: as configured, B: with the entry): B's host us and ratio in
two more columns, for an A/B of one switch in one process under the same load.
``--ab-disable-fusions conv_flat`` does the same with B's plans built without those fusion rules.

Counting wraps pyopencl's public entry points (each wrapper calls the real function) during a few
separate runs, so the wrappers' cost is in neither the run times nor the figures compared; what the
native replay enqueues (runtime/providers/opencl/native_replay.py) comes from its own counters
(``--kernels`` lists those launches as "(native replay)"). ``ONNXHAL_NATIVE_REPLAY=0`` measures the
Python replay.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
CORPUS = os.path.join(os.path.dirname(HERE), "tests", "real_models")
#: bench.py's OpenCL models, then corpus models that exercise attention, convolution and many partitions.
DEFAULT_MODELS = "mlp,cnn,encoder,bert_ts,gpt2_ts,resnet_ts,vit_ts"
#: Fresh sessions timed per runtime (creation + first run), alternating; the median is reported. Five,
#: not three (as real_models.py): a model's first session in the process builds the programs that
#: no earlier model built, and protobuf's Python messages call ``malloc_trim(0)`` at every
#: 10,000th freed arena block (16-20 ms of system time, then the pages fault back), which a
#: transformer session's ~750-1,100 frees bring every 10-13 sessions into whichever session
#: crosses it: two slow samples of three made resnet_ts read 9x after the whole set
#: (docs/opencl.md, "Dynamic shapes": what a later session pays).
COLD_RUNS = 5
PROVIDERS = ["OpenCLExecutionProvider", "CPUExecutionProvider"]


class CommandCounter:
    """Counts, while active, the OpenCL commands and host waits made through pyopencl."""

    def __init__(self) -> None:
        self.launches = self.copies = self.waits = self.set_args = 0
        #: launches by kernel name (``--kernels``): which ones a run's count is made of
        self.by_kernel: Counter[str] = Counter()
        self._saved: list = []
        self._native = None  # the native replay module, where partitions use it
        self._native_start = (0, 0, 0)

    def __enter__(self) -> CommandCounter:
        import pyopencl as cl

        from onnxhal.runtime.providers.opencl.native_replay import replay_module

        self._native = replay_module()
        self._native_start = self._native.counters() if self._native is not None else (0, 0, 0, 0, 0, 0)

        def wrap(owner, name, on_call):
            real = getattr(owner, name)
            self._saved.append((owner, name, real))

            def wrapper(*a, **k):
                return on_call(real, a, k)
            setattr(owner, name, wrapper)

        def launch(real, a, k):
            self.launches += 1
            self.by_kernel[a[1].function_name] += 1
            return real(*a, **k)

        def copy(real, a, k):
            self.copies += 1
            host = any(isinstance(x, np.ndarray) for x in a[1:3]) or any(
                isinstance(k.get(n), np.ndarray) for n in ("dest", "src"))
            if host and k.get("is_blocking", True):
                self.waits += 1
            return real(*a, **k)

        def wait(real, a, k):
            self.waits += 1
            return real(*a, **k)

        def set_arg(real, a, k):
            self.set_args += 1
            return real(*a, **k)

        wrap(cl, "enqueue_nd_range_kernel", launch)
        wrap(cl, "enqueue_copy", copy)
        wrap(cl, "wait_for_events", wait)
        wrap(cl.CommandQueue, "finish", wait)
        wrap(cl.Event, "wait", wait)
        wrap(cl.Kernel, "set_arg", set_arg)
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, real in reversed(self._saved):
            setattr(owner, name, real)
        self._saved.clear()
        if self._native is not None:  # what the native replay enqueued, past pyopencl's wrappers
            launches, copies, set_args, writes, reads, finishes = (b - a for a, b in zip(self._native_start,
                                                                                 self._native.counters()))
            self.launches += launches
            self.copies += copies + writes + reads
            self.waits += finishes  # a one-call run's one wait (run_host)
            self.set_args += set_args
            if launches:
                self.by_kernel["(native replay)"] += launches


@dataclass
class Row:
    model: str
    nodes: str
    launches: float
    copies: float
    waits: float
    set_args: float
    host_us: float
    hal_ms: float
    ort_ms: float
    ratio: float
    cold_hal_ms: float
    cold_ort_ms: float
    cold_ratio: float
    kernels: dict[str, float] = field(default_factory=dict)  # launches per run by kernel name
    host_us_b: float | None = None  # ``--ab``: the session with the entry
    ratio_b: float | None = None


def model_and_feeds(name: str, corpus: str = CORPUS) -> tuple[bytes, dict]:
    path = os.path.join(corpus, f"{name}.onnx")
    if os.path.isfile(path):
        from onnxhal.stored_outputs import read_signatures

        feeds, _ = read_signatures(path)["a"]
        with open(path, "rb") as f:
            return f.read(), feeds
    import models

    model = models.BUILDERS[name]()
    return model.SerializeToString(), models.feeds(model)


#: Runs before the counted ones: with ``--cost-rule on`` the OpenCL EP tries a small signature on the
#: host and the device for its first 12 runs (``cost_rule.TRIAL_RUNS`` each) before it settles,
#: and a session whose partitions settled after their trials, some on the device, then tries its
#: device core and its CPU-only core for 12 more (``host_settled.SESSION_TRIAL_RUNS`` each).
WARM_RUNS = 28


def measure(name: str, repeat: int, threads: int, corpus: str = CORPUS, cost_rule: str = "off",
            fixed_dims: bool = False, disable_fusions: str = "", ab: tuple[str, str] | None = None,
            ab_disable: str = "") -> Row:
    import onnxruntime as ort

    import onnxhal

    data, feeds = model_and_feeds(name, corpus)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    hso = onnxhal.SessionOptions()
    hso.intra_op_num_threads = threads
    first = next(iter(feeds.values()))
    if fixed_dims and isinstance(first, np.ndarray) and first.ndim:
        hso.add_free_dimension_override_by_name("batch", first.shape[0])
        if first.ndim == 2:
            hso.add_free_dimension_override_by_name("sequence", first.shape[1])
    providers = [(PROVIDERS[0], {"cost_rule": cost_rule, "disable_fusions": disable_fusions}), PROVIDERS[1]]
    cold_ort, cold_hal = [], []
    ref = hal = None
    for _ in range(COLD_RUNS):  # alternating fresh sessions: creation + first run
        # as real_models.py: the previous round's sessions released and the process's garbage
        # collected before the clock (a full collection there scans every object the benchmark
        # holds, 24-32 ms here, and lands in whichever session's timing crosses its threshold)
        ref = hal = None
        gc.collect()
        t = time.perf_counter()
        ref = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
        ref.run(None, feeds)
        cold_ort.append(time.perf_counter() - t)
        t = time.perf_counter()
        hal = onnxhal.InferenceSession(data, hso, providers=providers)
        hal.run(None, feeds)
        cold_hal.append(time.perf_counter() - t)
    hal_b = None
    if ab_disable:  # B: the same session with these fusion rules off as well
        rules = ",".join(filter(None, (disable_fusions, ab_disable)))
        hal_b = onnxhal.InferenceSession(data, hso, providers=[
            (PROVIDERS[0], {"cost_rule": cost_rule, "disable_fusions": rules}), PROVIDERS[1]])
    elif ab is not None:
        hso.add_session_config_entry(*ab)
        hal_b = onnxhal.InferenceSession(data, hso, providers=providers)
    for _ in range(WARM_RUNS):
        ref.run(None, feeds)
        hal.run(None, feeds)
        if hal_b is not None:
            hal_b.run(None, feeds)
    counted = max(3, repeat // 4)
    with CommandCounter() as c:
        for _ in range(counted):
            hal.run(None, feeds)
    t_ort, t_hal, cpu_hal, t_b, cpu_b = [], [], [], [], []

    def run_b() -> None:
        t1, c1 = time.perf_counter(), time.thread_time()
        hal_b.run(None, feeds)
        cpu_b.append(time.thread_time() - c1)
        t_b.append(time.perf_counter() - t1)

    for i in range(repeat):
        t0 = time.perf_counter()
        ref.run(None, feeds)
        t_ort.append(time.perf_counter() - t0)
        if hal_b is not None and i % 2:  # A and B take turns right after onnxruntime's run
            run_b()
        t1, c1 = time.perf_counter(), time.thread_time()
        hal.run(None, feeds)
        cpu_hal.append(time.thread_time() - c1)
        t_hal.append(time.perf_counter() - t1)
        if hal_b is not None and not i % 2:
            run_b()
    ps = hal.partition_summary
    o_ms, h_ms = statistics.median(t_ort) * 1e3, statistics.median(t_hal) * 1e3
    co, ch = statistics.median(cold_ort) * 1e3, statistics.median(cold_hal) * 1e3
    return Row(name, f"{ps.get(PROVIDERS[0], 0)}/{sum(ps.values())}", c.launches / counted, c.copies / counted,
               c.waits / counted, c.set_args / counted, statistics.median(cpu_hal) * 1e6, h_ms, o_ms, h_ms / o_ms,
               ch, co, ch / co, {k: v / counted for k, v in c.by_kernel.most_common()},
               statistics.median(cpu_b) * 1e6 if cpu_b else None,
               statistics.median(t_b) * 1e3 / o_ms if t_b else None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=DEFAULT_MODELS)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--corpus", default=CORPUS, help="folder of .onnx/.npz pairs for the corpus names")
    p.add_argument("--cost-rule", choices=("on", "off"), default="off", help="the OpenCL EP's cost_rule option")
    p.add_argument("--fixed-dims", action="store_true", help="fix corpus models' batch and sequence dims")
    p.add_argument("--disable-fusions", default="", metavar="RULES",
                   help="the OpenCL EP's disable_fusions option: fusion rules to leave out, comma-separated")
    p.add_argument("--kernels", action="store_true", help="also print each model's launches per run by kernel")
    p.add_argument("--ab", metavar="KEY=VALUE",
                   help="also run a session with this session config entry, alternating: its host us and ratio")
    p.add_argument("--ab-disable-fusions", default="", metavar="RULES",
                   help="also run a session with these fusion rules off as well, alternating (as --ab)")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    ab = None
    if args.ab:
        key, sep, value = args.ab.partition("=")
        if not sep or not key:
            p.error(f"--ab takes KEY=VALUE, got {args.ab!r}")
        ab = (key, value)
    if args.ab_disable_fusions:
        ab = ("disable_fusions", args.ab_disable_fusions)  # the B column's label; measure() takes ab_disable
    from bench import opencl_driver

    off = f", fusions off: {args.disable_fusions}" if args.disable_fusions else ""
    print(f"OpenCL EP on {opencl_driver()}, cost_rule={args.cost_rule}{', dims fixed' if args.fixed_dims else ''}{off}; "
          f"onnxruntime CPU, {args.threads} threads; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    head = (f"{'model':12} {'nodes':>9} {'launch':>7} {'copies':>6} {'waits':>5} {'set_arg':>7} {'host us':>8} "
            f"{'hal ms':>8} {'ort ms':>8} {'ratio':>6} {'cold hal/ort ms':>16} {'cold x':>6}"
            + (f" {'B host us':>9} {'B ratio':>7}  (B: {ab[0]}={ab[1]})" if ab else ""))
    print(head)
    rows = []
    import models

    for name in args.models.split(","):
        if not os.path.isfile(os.path.join(args.corpus, f"{name}.onnx")) and name not in models.BUILDERS:
            print(f"{name:12} skipped: not in {args.corpus} nor a benchmarks/models.py builder", flush=True)
            continue
        r = measure(name, args.repeat, args.threads, args.corpus, args.cost_rule, args.fixed_dims, args.disable_fusions,
                    None if args.ab_disable_fusions else ab, args.ab_disable_fusions)
        rows.append(r)
        print(f"{r.model:12} {r.nodes:>9} {r.launches:7.1f} {r.copies:6.1f} {r.waits:5.1f} {r.set_args:7.1f} "
              f"{r.host_us:8.0f} {r.hal_ms:8.2f} {r.ort_ms:8.2f} {r.ratio:6.2f} "
              f"{r.cold_hal_ms:7.0f}/{r.cold_ort_ms:<8.0f} {r.cold_ratio:6.1f}"
              + (f" {r.host_us_b:9.0f} {r.ratio_b:7.2f}" if ab else ""), flush=True)
        if args.kernels:
            print("    " + ", ".join(f"{k} {v:g}" for k, v in r.kernels.items()), flush=True)
    geo = float(np.exp(np.mean(np.log([r.ratio for r in rows]))))
    cold = float(np.exp(np.mean(np.log([r.cold_ratio for r in rows]))))
    print(f"geometric mean ratio {geo:.2f}, creation + first run {cold:.1f}x; "
          f"load average {os.getloadavg()[0]:.2f}")
    if args.json:
        text = json.dumps([asdict(r) for r in rows], indent=1)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
