"""Session creation + first run on the CPU EP, stage by stage, against onnxruntime's creation + first
run, in CPU time (``time.process_time_ns``: other processes' load does not inflate it).

    python benchmarks/creation_stages.py [--models a,b] [--repeat 7] [--threads 2] [--top 5]

One warm process: per model, one untimed session of each runtime, then ``repeat`` rounds of
onnxruntime, onnxhal plain and onnxhal with its stages timed (functions of the loader, build and
optimizer wrapped for that session only). Per model: medians of onnxruntime, onnxhal plain and
their ratio, then the stages (median ms, outermost call of each; ``load.*`` are parts of ``load``,
``pass.*`` parts of ``optimize``). The models above 2x are listed with the stage that dominates.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(os.path.dirname(HERE), "tests", "real_models")


class StageTimer:
    """Wraps named functions so that each outermost call adds its CPU time to ``totals``."""

    def __init__(self) -> None:
        self.totals: dict[str, int] = defaultdict(int)
        self.depth: dict[str, int] = defaultdict(int)
        self.patches: list[tuple[object, str, object]] = []

    def wrap(self, owner: object, attr: str, stage: str, kind: str = "function") -> None:
        original = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
        fn = original.__func__ if kind == "classmethod" else original
        totals, depth = self.totals, self.depth

        def timed(*args, **kwargs):
            depth[stage] += 1
            t = time.process_time_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                depth[stage] -= 1
                if not depth[stage]:
                    totals[stage] += time.process_time_ns() - t

        self.patches.append((owner, attr, original))
        setattr(owner, attr, classmethod(timed) if kind == "classmethod" else timed)

    def restore(self) -> None:
        for owner, attr, original in reversed(self.patches):
            setattr(owner, attr, original)
        self.patches.clear()


def instrument() -> StageTimer:
    from onnxhal.hal.graph import Graph
    from onnxhal.runtime.loader import declared_value_info, guarded_inference, model_loader
    from onnxhal.runtime.optimizer import passes
    from onnxhal.runtime.session import build, inference_session

    t = StageTimer()
    t.wrap(inference_session, "load", "load")
    t.wrap(inference_session, "select", "select")
    for name in ("create_eps", "optimize", "partition_and_layout", "compile_groups", "plan"):
        t.wrap(build, name, name)
    for name in ("read_model", "check_declarations", "constants_to_initializers", "check_nodes",
                 "sparse_constants_to_initializers", "check_graph", "resolve_schemas", "check_after_inference",
                 "shapes_settled"):
        t.wrap(model_loader, name, "load." + name)
    t.wrap(declared_value_info, "set_aside", "load.set_aside")
    t.wrap(declared_value_info, "check_element_types", "load.check_element_types")
    t.wrap(guarded_inference, "infer", "load.infer")
    t.wrap(guarded_inference, "infer_lenient", "load.infer_lenient")
    t.wrap(guarded_inference, "check_inferred", "load.check_inferred")
    t.wrap(Graph, "from_proto", "load.graph_from_proto", kind="classmethod")
    wrapped = []
    for name, level, fn, recurse, cpu_only in passes.PASSES:
        stage = "pass." + name
        totals, depth = t.totals, t.depth

        def timed(graph, fn=fn, stage=stage, totals=totals, depth=depth):
            depth[stage] += 1
            s = time.process_time_ns()
            try:
                return fn(graph)
            finally:
                depth[stage] -= 1
                if not depth[stage]:
                    totals[stage] += time.process_time_ns() - s

        wrapped.append((name, level, timed, recurse, cpu_only))
    t.patches.append((passes, "PASSES", passes.PASSES))
    passes.PASSES = wrapped
    return t


def one_model(path: str, repeat: int, threads: int) -> dict:
    import onnxruntime as ort

    import onnxhal
    from onnxhal.stored_outputs import read_signatures

    feeds = read_signatures(path)["a"][0]
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    hso = onnxhal.SessionOptions()
    hso.intra_op_num_threads = threads

    def ort_once() -> int:
        t = time.process_time_ns()
        ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]).run(None, feeds)
        return time.process_time_ns() - t

    def hal_once(first_run: list | None = None) -> int:
        t = time.process_time_ns()
        s = onnxhal.InferenceSession(path, hso, providers=["CPUExecutionProvider"])
        r = time.process_time_ns()
        s.run(None, feeds)
        e = time.process_time_ns()
        if first_run is not None:
            first_run.append(e - r)
        return e - t

    ort_once()
    hal_once()
    ort_t, hal_t, stages = [], [], defaultdict(list)
    for _ in range(repeat):
        ort_t.append(ort_once())
        hal_t.append(hal_once())
        timer = instrument()
        first: list[int] = []
        try:
            total = hal_once(first)
        finally:
            timer.restore()
        stages["total(instrumented)"].append(total)
        stages["first_run"].append(first[0])
        for k, v in timer.totals.items():
            stages[k].append(v)
    ms = {k: statistics.median(v) / 1e6 for k, v in stages.items()}
    return {"model": os.path.basename(path)[:-5], "ort": statistics.median(ort_t) / 1e6,
            "hal": statistics.median(hal_t) / 1e6, "stages": ms}


TOP = ("load", "select", "create_eps", "optimize", "partition_and_layout", "compile_groups", "plan", "first_run")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="")
    p.add_argument("--corpus", default=CORPUS)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--top", type=int, default=4, help="sub-stages shown per model")
    p.add_argument("--all", action="store_true", help="every model's stages, not only those above 2x")
    args = p.parse_args(argv)
    import onnxruntime  # noqa: F401

    import onnxhal
    from onnxhal.runtime.providers.cpu.kernels.registry import registered_ops

    registered_ops()
    onnxhal.get_ep_devices()
    from real_models import corpus_paths

    paths = corpus_paths(args.corpus, args.models)
    load_before = os.getloadavg()
    rows = []
    for path in paths:
        try:
            rows.append(one_model(path, args.repeat, args.threads))
        except Exception as exc:  # noqa: BLE001 - one model failing must not hide the others
            print(f"{os.path.basename(path)}: {type(exc).__name__}: {exc}"[:200], file=sys.stderr)
    load_after = os.getloadavg()
    ratios = []
    for r in rows:
        ratio = r["hal"] / r["ort"]
        ratios.append(ratio)
        st = r["stages"]
        rest = st["total(instrumented)"] - sum(st.get(k, 0.0) for k in TOP)
        line = (f"{r['model']:28s} ort {r['ort']:7.2f} hal {r['hal']:7.2f} ratio {ratio:5.2f} | "
                + " ".join(f"{k.split('_')[0]} {st.get(k, 0.0):.2f}" for k in TOP) + f" rest {rest:.2f}")
        print(line)
        if ratio > 2 or args.all:
            subs = sorted(((v, k) for k, v in st.items() if "." in k), reverse=True)[:args.top]
            print(" " * 30 + "  ".join(f"{k} {v:.2f}" for v, k in subs))
    above = [r["model"] for r, q in zip(rows, ratios) if q > 2]
    print(f"geometric mean {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f} over {len(ratios)} models; "
          f"above 2x: {len(above)}; sums ort {sum(r['ort'] for r in rows):.1f} hal {sum(r['hal'] for r in rows):.1f} ms; "
          f"load average {load_before[0]:.2f} -> {load_after[0]:.2f}")
    print("above 2x: " + ", ".join(above))
    return 0


if __name__ == "__main__":
    sys.exit(main())
