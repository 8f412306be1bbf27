"""A/B of the positional kernel call in the generated run plan (``inline_fn = INLINE_APPLY``), in one process.

    python benchmarks/inline_ab.py [--rounds 30] MODEL_OR_GLOB ...   (corpus names, 'hf_*', .onnx paths, or
    chain:N, N chained Reshape/Transpose/Cast/Expand nodes on [1,8] made here)

Each model gets four sessions: two built with Reshape, Transpose, Concat, Expand and Cast's
``inline_fn`` set to None (their steps call ``compute`` with an input list, as before), two with
it on. They run in alternation, in an order shuffled each round, and the medians of CPU time per
run are compared (on/off below 1: the inline call is faster). Both sides' outputs are compared for
equality. The load average is printed at the start and the end: on a shared machine only the
alternation in one process makes the two sides comparable.
"""

from __future__ import annotations

import argparse
import glob
import os
import random
import statistics
import time

import numpy as np

import onnxhal
from onnxhal.hal.ep import INLINE_APPLY
from onnxhal.runtime.providers.cpu.kernels import cast, shape_ops

CLASSES = (shape_ops.Reshape, shape_ops.Transpose, shape_ops.Concat, shape_ops.Expand, cast.Cast)
CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "real_models")


def _chain(n: int) -> bytes:
    """``n`` trivial structural nodes in a chain on a [1,8] float tensor: the plan's per-step cost."""
    from onnx import TensorProto, helper, numpy_helper

    nodes, prev = [], "x"
    for k in range(n):
        out = f"v{k}" if k < n - 1 else "y"
        nodes.append([helper.make_node("Reshape", [prev, "s81"], [out]),
                      helper.make_node("Transpose", [prev], [out], perm=[1, 0]),
                      helper.make_node("Cast", [prev], [out], to=TensorProto.FLOAT),
                      helper.make_node("Expand", [prev, "s18"], [out])][k % 4])
        prev = out
    shape = [1, 8] if n % 4 != 1 else [8, 1]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
                              [numpy_helper.from_array(np.array([8, 1], np.int64), "s81"),
                               numpy_helper.from_array(np.array([1, 8], np.int64), "s18")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def _session(model: str, on: bool) -> tuple[onnxhal.InferenceSession, dict]:
    """A session built with the classes' inline call on or off (read when the plan is built), and its feeds."""
    for c in CLASSES:
        c.inline_fn = INLINE_APPLY if on else None
    try:
        if model.endswith(".onnx") or model.startswith("chain:"):
            options = onnxhal.SessionOptions()  # a synthetic chain: no fusion or folding of its nodes
            options.graph_optimization_level = onnxhal.GraphOptimizationLevel.ORT_DISABLE_ALL
            source = _chain(int(model[6:])) if model.startswith("chain:") else model
            sess = onnxhal.InferenceSession(source, options)
            feeds = {i.name: np.arange(np.prod(i.shape), dtype=np.float32).reshape(i.shape) for i in sess.get_inputs()}
        else:
            stored = np.load(os.path.join(CORPUS, f"{model}.npz"), allow_pickle=True)
            sess = onnxhal.InferenceSession(os.path.join(CORPUS, f"{model}.onnx"))
            feeds = {i.name: stored["a." + i.name] for i in sess.get_inputs()}
    finally:
        for c in CLASSES:
            c.inline_fn = INLINE_APPLY
    for _ in range(3):  # past the first run's loop and the preparation of the second
        sess.run(None, feeds)
    return sess, feeds


def _same(a: list, b: list) -> bool:
    return all(np.array_equal(x, y, equal_nan=x.dtype.kind in "fc") if isinstance(x, np.ndarray) else x == y
               for x, y in zip(a, b))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    models: list[str] = []
    for m in args.models:
        found = sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(CORPUS, f"{m}.onnx")))
        models += found if found else [m]
    print("load", os.getloadavg())
    ratios = []
    for m in models:
        sessions = {"off": [_session(m, False), _session(m, False)], "on": [_session(m, True), _session(m, True)]}
        same = _same(sessions["off"][0][0].run(None, sessions["off"][0][1]),
                     sessions["on"][0][0].run(None, sessions["on"][0][1]))
        t0 = time.process_time()
        sessions["on"][0][0].run(None, sessions["on"][0][1])
        reps = max(1, min(50, int(0.004 / max(time.process_time() - t0, 1e-6))))  # about 4 ms a sample
        times: dict[str, list[float]] = {"off": [], "on": []}
        for _ in range(args.rounds):
            order = [(k, s) for k in times for s in sessions[k]]
            random.shuffle(order)
            for k, (sess, feeds) in order:
                t0 = time.process_time()
                for _ in range(reps):
                    sess.run(None, feeds)
                times[k].append((time.process_time() - t0) / reps * 1e6)
        off, on = statistics.median(times["off"]), statistics.median(times["on"])
        ratios.append(on / off)
        print(f"{os.path.basename(m):24s} off {off:8.1f} us  on {on:8.1f} us  on/off {on / off:.3f}"
              + ("" if same else "  OUTPUTS DIFFER"))
    print(f"geomean on/off {np.exp(np.mean(np.log(ratios))):.3f} over {len(ratios)}; load {os.getloadavg()}")


if __name__ == "__main__":
    main()
