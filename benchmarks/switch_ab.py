"""A/B of one module-level switch of the CPU EP on corpus models, in one process.

    python benchmarks/switch_ab.py --switch fused_conv.NATIVE_POINTWISE_ENABLED \
        --models 'tv_*,resnet_ts,mobilenet_*' [--runs 200] [--threads 2] [--clock cpu]
    python benchmarks/switch_ab.py --optimizer-pass fuse_elementwise_chains --models 'jx_*'

The switch (a module of ``onnxhal.runtime.providers.cpu.kernels`` and a name in it, read when a
kernel is built) is set off and on while four sessions of each model are created (off, on, on, off);
then they, and
onnxruntime, run the model's signature ``a`` in alternation, run by run, and the medians of the runs'
times are compared (on/off below 1 is faster with the switch on), the five sessions in an order
shuffled run by run. ``--same`` builds both with the switch on: an A/A control of the method. The load average is printed at the
start and the end: on a shared machine, only the alternation in one process makes the two sides
comparable, and CPU time (the default clock) leaves out the waits for a core another process holds;
with several threads it adds up their CPU time.
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib
import math
import os
import random
import statistics
import sys
import time

if __name__ == "__main__":  # as bench.py: numpy's BLAS configured before numpy is imported
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "22")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

#: with --optimizer-pass, whether the session being made runs the pass
_PASS_ON = True

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "real_models")


def corpus_models(patterns: str, corpus: str = CORPUS) -> list[str]:
    """The corpus's model names that match any of the comma-separated shell patterns, sorted."""
    names = sorted(f[:-5] for f in os.listdir(corpus) if f.endswith(".onnx"))
    wanted = [p.strip() for p in patterns.split(",") if p.strip()]
    return [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in wanted)]


def _timed_run(session, feeds: dict, clock) -> float:
    t0 = clock()
    session.run(None, feeds)
    return (clock() - t0) * 1e3


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--switch", help="MODULE.NAME under onnxhal.runtime.providers.cpu.kernels, or a full "
                                        "onnxhal.MODULE.NAME")
    which.add_argument("--optimizer-pass", help="an optimizer pass's name: off is the session config key "
                                                "optimization.disable_passes naming it")
    p.add_argument("--models", required=True, help="comma-separated corpus names or shell patterns")
    p.add_argument("--runs", type=int, default=200, help="runs of each side, alternating run by run")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--same", action="store_true", help="an A/A control: both sessions with the switch on")
    p.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                   help="cpu: the process's CPU time (time.process_time: a run's time less the waits for a core "
                        "that other processes hold), wall: time.perf_counter")
    args = p.parse_args(argv)

    import onnxruntime as ort
    from real_models import signatures

    import onnxhal

    if args.switch:
        module_name, _, name = args.switch.rpartition(".")
        # a full onnxhal path names a switch outside the kernels (an optimizer pass's, read at creation)
        full = module_name if module_name.startswith("onnxhal.") else f"onnxhal.runtime.providers.cpu.kernels.{module_name}"
        module = importlib.import_module(full)
        if not hasattr(module, name):
            p.error(f"--switch {args.switch}: {module.__name__} has no {name!r} (give MODULE.NAME, e.g. "
                    "fused_conv.NATIVE_POINTWISE_ENABLED)")
    else:
        from onnxhal.runtime.optimizer.passes import PASSES
        if args.optimizer_pass not in {entry[0] for entry in PASSES}:
            p.error(f"--optimizer-pass {args.optimizer_pass}: no optimizer pass has that name")
        module, name = sys.modules[__name__], "_PASS_ON"  # this module's flag, read when a session is made
    original = getattr(module, name)
    models = corpus_models(args.models)
    if not models:
        p.error(f"--models {args.models!r} matches no model of {CORPUS}")
    print(f"load average at the start {os.getloadavg()}")
    print(f"{'model':20s} {'off ms':>8s} {'on ms':>8s} {'on/off':>7s} {'ort ms':>8s} {'off/ort':>8s} {'on/ort':>7s}")
    ratios = []
    for model in models:
        path = os.path.join(CORPUS, model + ".onnx")
        feeds = signatures(path)["a"][0]
        so = onnxhal.SessionOptions()
        so.intra_op_num_threads = args.threads
        sessions = []
        try:
            # off, on, on, off: neither side has all the early or all the late sessions
            for value in ((True,) * 4 if args.same else (False, True, True, False)):
                setattr(module, name, value)
                side = so
                if args.optimizer_pass and not value:
                    side = onnxhal.SessionOptions()
                    side.intra_op_num_threads = args.threads
                    side.add_session_config_entry("optimization.disable_passes", args.optimizer_pass)
                sessions.append(onnxhal.InferenceSession(path, side, providers=["CPUExecutionProvider"]))
        finally:
            setattr(module, name, original)
        oso = ort.SessionOptions()
        oso.intra_op_num_threads = args.threads
        oso.add_session_config_entry("session.intra_op.allow_spinning", "0")
        ref = ort.InferenceSession(path, oso, providers=["CPUExecutionProvider"])
        for s in (*sessions, ref):  # warm-up
            for _ in range(3):
                s.run(None, feeds)
        times: list[list[float]] = [[], [], []]
        clock = time.process_time if args.clock == "cpu" else time.perf_counter
        sides = (*sessions, ref)
        side_of = (0, 1, 1, 0, 2)
        order = list(range(5))
        shuffle = random.Random(0).shuffle
        for _ in range(args.runs):
            # the order shuffled run by run: a session run right after onnxruntime's pays for the
            # cache it evicted (with a fixed cyclic order, an A/A control read 0.93)
            shuffle(order)
            for i in order:
                times[side_of[i]].append(_timed_run(sides[i], feeds, clock))
        off, on, theirs = (statistics.median(t) for t in times)
        ratios.append(on / off)
        print(f"{model:20s} {off:8.3f} {on:8.3f} {on / off:7.2f} {theirs:8.3f} {off / theirs:8.2f} {on / theirs:7.2f}",
              flush=True)
    print(f"geometric mean on/off {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f} over {len(ratios)} models")
    print(f"load average at the end {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
