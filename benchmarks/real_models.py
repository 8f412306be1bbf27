"""The real-model corpus (tests/real_models: torch.onnx.export of Hugging Face architectures, both
exporters, dynamic batch and sequence axes) on onnxhal's EPs against onnxruntime's CPU EP, side by
side in one process.

    python benchmarks/real_models.py [--ep cpu,opencl,opencl_off] [--repeat 20] [--load N] [--models bert_ts,...]

Per model and EP: nodes on the EP (dynamic model, and the same model with its dims fixed by
``add_free_dimension_override_by_name``), session creation plus first run (median of five fresh
sessions of each runtime, taking turns to go first; before each, the previous sessions are released and the
process's garbage collected, so neither the teardown nor a full collection of the benchmark's own
objects falls in a timing), the first run of each of the two stored input signatures
(for the OpenCL EP it specialises and builds that shape), then ``WARM_RUNS`` and ``repeat`` alternating runs of
signature ``a`` and the ratio of the medians (onnxhal / onnxruntime), and the largest difference
from onnxruntime's stored outputs. The geometric mean of the ratios closes each EP's table, then
the same per producer group (``producer_group``: the first exporters, the other producers, the
models kept out of tuning) and the load averages at the start and the end.
``--load N`` runs N busy processes the whole time (a shared CI machine).
"""

from __future__ import annotations

import argparse
import gc
import glob
import math
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
#: Model-name prefixes of the producers other than torch.onnx and skl2onnx (the corpus's first
#: exporters, on whose models the CPU EP was tuned), and of the models kept out of all tuning.
NEW_PRODUCERS = ("tf2onnx_", "paddle_", "lgbm_", "xgb_", "catboost_", "hb_", "yolov8")
UNTUNED = ("tv_", "hf_", "skh_", "pt_", "osc_", "omt_", "jx_", "spx_", "tm_", "opt_", "df_")


def producer_group(model: str) -> str:
    """'new' (other producers), 'untuned' (never looked at while tuning) or 'old'."""
    if model.startswith(UNTUNED):
        return "untuned"
    return "new" if model.startswith(NEW_PRODUCERS) else "old"
CORPUS = os.path.join(os.path.dirname(HERE), "tests", "real_models")
#: Fresh sessions timed per runtime (creation + first run), alternating; the median is reported. Five,
#: not three: under ``--load 2`` a sample of a few ms is at the mercy of one descheduling (a scheduler
#: slice is ms long), and the median of three then moved 2-3x between runs of the same code.
COLD_RUNS = 5
PROVIDERS = {"cpu": ["CPUExecutionProvider"], "opencl": ["OpenCLExecutionProvider", "CPUExecutionProvider"],
             # the OpenCL EP with its cost rule off (claim time and per signature): every partition on the device
             "opencl_off": [("OpenCLExecutionProvider", {"cost_rule": "off"}), "CPUExecutionProvider"]}


#: Runs of signature ``a`` before the timed ones: the OpenCL EP's cost rule tries a small signature
#: on the host and the device for its first 12 runs (``cost_rule.TRIAL_RUNS`` each) before it settles,
#: and a session whose partitions settled after their trials, some on the device, then tries its
#: device core and its CPU-only core for 12 more (``host_settled.SESSION_TRIAL_RUNS`` each).
WARM_RUNS = 28


def signatures(path: str) -> dict[str, tuple[dict[str, np.ndarray], np.ndarray]]:
    """Per signature: the feeds and onnxruntime's first output (the other stored outputs and ZipMap
    keys are tests/test_real_models.py's)."""
    from onnxhal.stored_outputs import read_signatures

    return {s: (feeds, outs[0][0]) for s, (feeds, outs) in read_signatures(path).items()}


def run_model(path: str, ep: str, repeat: int, threads: int) -> dict:
    import onnxruntime as ort

    import onnxhal

    sigs = signatures(path)
    feeds, _ = sigs["a"]
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3  # its shape-mismatch warnings on the tree exports' declared outputs
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # session creation plus the first run, each runtime's (what a CLI call or a test pays): the
    # median of COLD_RUNS fresh sessions each, alternating (one sample of a few milliseconds is
    # at the mercy of one descheduling on a shared machine)
    hso = onnxhal.SessionOptions()
    hso.intra_op_num_threads = threads
    ort_colds, hal_colds = [], []
    ref = hal = None

    def cold_ort():
        s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        s.run(None, feeds)
        return s

    def cold_hal():
        s = onnxhal.InferenceSession(path, hso, providers=PROVIDERS[ep])
        s.run(None, feeds)
        return s

    for i in range(COLD_RUNS):
        # the previous round's sessions are released before the clock starts: a user creating a
        # session does not pay for tearing down another one (the next assignment would free
        # onnxhal's Python objects inside the timing, onnxruntime's C++ ones almost for free)
        ref = hal = None
        # and the process's garbage collected: a full collection scans every object the benchmark
        # holds (tens of ms with the transformer sessions' objects) and lands in whichever timing
        # crosses its threshold, one of the samples
        gc.collect()
        # The runtimes take turns going first: the second of a fixed pair found the first's file
        # and code warm (quiet, onnxruntime going first always put onnxhal's 2x models 5-10% lower).
        order = ((ort_colds, cold_ort), (hal_colds, cold_hal))
        for samples, make in order if i % 2 == 0 else order[::-1]:
            t = time.perf_counter()
            made = make()
            samples.append(time.perf_counter() - t)
            if make is cold_ort:
                ref = made
            else:
                hal = made
    ort_cold, hal_cold = statistics.median(ort_colds), statistics.median(hal_colds)
    fixed = onnxhal.SessionOptions()
    first = next(iter(feeds.values()))
    if isinstance(first, np.ndarray):  # a map input (DictVectorizer) has no dims to fix
        fixed.add_free_dimension_override_by_name("batch", first.shape[0])
        if first.ndim == 2:
            fixed.add_free_dimension_override_by_name("sequence", first.shape[1])
    static = onnxhal.InferenceSession(path, fixed, providers=PROVIDERS[ep])
    firsts, err = [], 0.0
    for s in ("a", "b"):
        f, want = sigs[s]
        t = time.perf_counter()
        got = hal.run(None, f)[0]
        firsts.append((time.perf_counter() - t) * 1e3)
        if want.dtype.kind in "fiu":
            err = max(err, float(np.max(np.abs(np.asarray(got, np.float64) - want), initial=0.0)))
        else:  # string labels
            err = max(err, float(np.mean(np.asarray(got) != want)))
    for _ in range(WARM_RUNS):
        ref.run(None, feeds)
        hal.run(None, feeds)
    t_ort, t_hal = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        ref.run(None, feeds)
        t1 = time.perf_counter()
        hal.run(None, feeds)
        t_hal.append(time.perf_counter() - t1)
        t_ort.append(t1 - t0)
    name = PROVIDERS[ep][0] if isinstance(PROVIDERS[ep][0], str) else PROVIDERS[ep][0][0]
    return {"model": os.path.basename(path)[:-5], "ort_ms": statistics.median(t_ort) * 1e3,
            "hal_ms": statistics.median(t_hal) * 1e3,
            "ratio": statistics.median(t_hal) / statistics.median(t_ort),
            "nodes": f"{hal.partition_summary.get(name, 0)}/{sum(hal.partition_summary.values())}",
            "static_nodes": f"{static.partition_summary.get(name, 0)}/{sum(static.partition_summary.values())}",
            "first_ms": "/".join(f"{v:.0f}" for v in firsts), "max_diff": err,
            "cold": f"{_cold_ms(ort_cold)}/{_cold_ms(hal_cold)}", "cold_ratio": hal_cold / ort_cold}


def _cold_ms(seconds: float) -> str:
    """Creation milliseconds: a decimal below 10 ms, where 1/2 could be 1.4/1.6."""
    ms = seconds * 1e3
    return f"{ms:.1f}" if ms < 10 else f"{ms:.0f}"


def _ms(v: float) -> str:
    """Milliseconds with three significant digits: the tiny corpus runs in 0.003-0.4 ms."""
    return f"{v:.3g}" if v < 1 else f"{v:.2f}"



def corpus_paths(corpus: str, models: str | None) -> list[str]:
    """The corpus's .onnx files, sorted; only those named in ``models`` (comma-separated) if given."""
    paths = sorted(glob.glob(os.path.join(corpus, "*.onnx")))
    if models:
        wanted = set(models.split(","))
        paths = [p for p in paths if os.path.basename(p)[:-5] in wanted]
    return paths

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ep", default="cpu,opencl", help="comma-separated: cpu, opencl, opencl_off (its cost rule "
                                                      "off); the EPs alternate per model")
    p.add_argument("--models", default="", help="comma-separated corpus names (default: all)")
    p.add_argument("--corpus", default=CORPUS, help="folder of .onnx/.npz pairs (default: tests/real_models; "
                                                    "make_corpus.py --size medium --out DIR makes bigger ones)")
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--load", type=int, default=0, metavar="N", help="N busy processes competing for the cores")
    args = p.parse_args(argv)
    sys.path.insert(0, HERE)
    # Library loading is not session creation: import both runtimes, onnxhal's kernel modules
    # (imported on the first kernel lookup) and its device discovery (once a process: OpenCL
    # enumeration, about 60 ms) before any session is timed.
    import onnxruntime  # noqa: F401
    from bench import opencl_driver, start_load, stop_load
    from rich.console import Console
    from rich.table import Table

    import onnxhal
    from onnxhal.runtime.providers.cpu.kernels.registry import registered_ops

    registered_ops()
    onnxhal.get_ep_devices()
    paths = corpus_paths(args.corpus, args.models)
    load_before = os.getloadavg()
    load = start_load(args.load) if args.load else None
    eps = args.ep.split(",")
    driver = opencl_driver() if any(ep.startswith("opencl") for ep in eps) else ""  # registers it, once
    tables = [(ep, driver if ep.startswith("opencl") else "CPU EP", []) for ep in eps]
    try:
        for path in paths:  # the EPs alternate per model: a change in the machine's load hits them alike
            for ep, _, rows in tables:
                try:
                    rows.append(run_model(path, ep, args.repeat, args.threads))
                except Exception as exc:  # noqa: BLE001 - one model failing must not hide the others
                    rows.append({"model": os.path.basename(path)[:-5], "error": f"{type(exc).__name__}: {exc}"[:160]})
    finally:
        load_after = os.getloadavg()
        if load is not None:
            stop_load(load)
    console = Console(width=180)
    for ep, driver, rows in tables:
        loaded = f", {args.load} busy processes" if args.load else ""
        t = Table(title=f"corpus on onnxhal {ep} ({driver}) vs onnxruntime CPU, {args.threads} threads{loaded}")
        for c in ("model", "nodes on EP (dynamic)", "(dims fixed)", "create+run ms ort/hal", "first runs ms a/b",
                  "ort ms", "onnxhal ms", "ratio", "max diff"):
            t.add_column(c, justify="left" if c == "model" else "right")
        ratios, colds = [], []
        for r in rows:
            if "error" in r:
                t.add_row(r["model"], r["error"], "", "", "", "", "", "", "")
                continue
            ratios.append(r["ratio"])
            colds.append(r["cold_ratio"])
            t.add_row(r["model"], r["nodes"], r["static_nodes"], r["cold"], r["first_ms"], _ms(r["ort_ms"]),
                      _ms(r["hal_ms"]), f"{r['ratio']:.2f}", f"{r['max_diff']:.1e}")
        console.print(t)
        if ratios:
            worst = max((r for r in rows if "ratio" in r), key=lambda r: r["ratio"])
            worst_cold = max((r for r in rows if "ratio" in r), key=lambda r: r["cold_ratio"])
            console.print(f"geometric mean ratio ({ep}): {_geomean(ratios):.2f} "
                          f"over {len(ratios)} models; worst {worst['model']} {worst['ratio']:.2f}; session creation "
                          f"+ first run: geometric mean ratio {_geomean(colds):.2f}, "
                          f"worst {worst_cold['model']} {worst_cold['cold_ratio']:.2f}, "
                          f"{sum(c > 2 for c in colds)} models above 2")
            for group in ("old", "new", "untuned"):
                done = [r for r in rows if "ratio" in r and producer_group(r["model"]) == group]
                if done:
                    console.print(f"  {group} ({len(done)} models): steady {_geomean([r['ratio'] for r in done]):.2f}"
                                  f", worst {max(r['ratio'] for r in done):.2f}; creation + first run "
                                  f"{_geomean([r['cold_ratio'] for r in done]):.2f}, worst "
                                  f"{max(r['cold_ratio'] for r in done):.2f}")
        console.print("load average (1, 5, 15 min) at the start " + ", ".join(f"{v:.2f}" for v in load_before)
                      + ", at the end " + ", ".join(f"{v:.2f}" for v in load_after))
    return 0


def _geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


if __name__ == "__main__":
    sys.exit(main())
