"""A/B of one module-level switch of the CPU EP on session creation + first run, in one process.

    python benchmarks/creation_ab.py --switch ml_trees.NATIVE_BUILD --models 'sk_*,lgbm_*' [--rounds 15]

Per model, round by round: onnxruntime's creation + first run, then onnxhal's with the switch off
and on (in an order shuffled per round), in CPU time (``time.process_time_ns``: the waits for a core
another process holds are left out). Printed per model: the medians (ms), on/off (below 1: the
switch saves time) and onnxhal with the switch on over onnxruntime, the figure issue 44 counts;
the load average at the start and the end. switch_ab.py does the same for steady runs.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import random
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--switch", required=True, help="MODULE.NAME under onnxhal.runtime.providers.cpu.kernels, or a full "
                   "onnxhal.PACKAGE.MODULE.NAME (onnxhal.runtime.loader.ml_shapes.INFER_DOWNSTREAM)")
    p.add_argument("--models", required=True, help="comma-separated corpus names or shell patterns")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    import onnxruntime as ort
    from real_models import CORPUS
    from switch_ab import corpus_models

    import onnxhal
    from onnxhal.stored_outputs import read_signatures

    module_name, _, name = args.switch.rpartition(".")
    full = module_name if module_name.startswith("onnxhal.") else f"onnxhal.runtime.providers.cpu.kernels.{module_name}"
    module = importlib.import_module(full)
    if not hasattr(module, name):
        p.error(f"--switch {args.switch}: {module.__name__} has no {name!r}")
    original = getattr(module, name)
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.log_severity_level = 3
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    hso = onnxhal.SessionOptions()
    hso.intra_op_num_threads = args.threads

    def timed(make) -> int:
        t = time.process_time_ns()
        make()
        return time.process_time_ns() - t

    load_before = os.getloadavg()
    rng = random.Random(0)
    ratios, gains = [], []
    print(f"{'model':26s} {'ort':>7s} {'off':>7s} {'on':>7s} {'on/off':>7s} {'on/ort':>7s}")
    for path in (os.path.join(CORPUS, f"{m}.onnx") for m in corpus_models(args.models, CORPUS)):
        feeds = read_signatures(path)["a"][0]

        def ort_side(path=path, feeds=feeds) -> None:
            ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]).run(None, feeds)
        sides = {"ort": ort_side}
        for label, value in (("off", False), ("on", True)):
            def hal(value=value, path=path, feeds=feeds) -> None:
                setattr(module, name, value)
                try:
                    onnxhal.InferenceSession(path, hso, providers=["CPUExecutionProvider"]).run(None, feeds)
                finally:
                    setattr(module, name, original)
            sides[label] = hal
        times: dict[str, list[int]] = {k: [] for k in sides}
        for k in sides:  # warm: imports, caches
            sides[k]()
        for _ in range(args.rounds):
            order = list(sides)
            rng.shuffle(order)
            for k in order:
                times[k].append(timed(sides[k]))
        med = {k: statistics.median(v) / 1e6 for k, v in times.items()}
        gains.append(med["on"] / med["off"])
        ratios.append(med["on"] / med["ort"])
        print(f"{os.path.basename(path)[:-5]:26s} {med['ort']:7.2f} {med['off']:7.2f} {med['on']:7.2f} "
              f"{gains[-1]:7.2f} {ratios[-1]:7.2f}")
    load_after = os.getloadavg()

    def geo(v: list[float]) -> float:
        return math.exp(sum(map(math.log, v)) / len(v))

    print(f"geometric mean on/off {geo(gains):.3f}, on/ort {geo(ratios):.3f} over {len(gains)} models; "
          f"above 2x onnxruntime with the switch on: {sum(r > 2 for r in ratios)}; load average "
          f"{load_before[0]:.2f}, {load_before[1]:.2f} -> {load_after[0]:.2f}, {load_after[1]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
