"""The OpenCL EP's MaxPool with rule ``pool_rows`` (a work-item per output row, 8 outputs a vector with
rule ``pool_row_vectors``) against ``pool_row_vectors`` off (the scalar row kernel) and ``pool_rows``
off (a work-item per output), alternating in one process, per shape.

    python benchmarks/opencl_pool.py [--repeat 40] [N,C,H,W,K,S,P ...]

Each shape is one MaxPool node (square kernel K, stride S, pads P) run through onnxhal's session with
its input and output on the host; times are medians of wall time per run (the device's threads work
while the calling thread waits, so its CPU time does not show the kernel). The default shapes are
ResNet's stem pool and smaller rows down to 4 outputs, where ``POOL_ROWS_MIN_OW`` draws the line.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
from onnx import TensorProto, helper

import onnxhal

DEFAULT_SHAPES = ["1,64,112,112,3,2,1", "1,256,14,14,3,1,1", "1,512,7,7,3,2,1", "1,16,64,64,2,2,0",
                  "1,4,16,256,3,2,1", "1,2,8,512,2,2,0", "1,3,32,32,3,1,1"]


def _session(shape: tuple[int, ...], k: int, s: int, p: int, disabled: str) -> onnxhal.InferenceSession:
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[k, k], strides=[s, s], pads=[p] * 4)
    graph = helper.make_graph([node], "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return onnxhal.InferenceSession(model.SerializeToString(),
                                    providers=[("OpenCLExecutionProvider", {"disable_fusions": disabled}),
                                               "CPUExecutionProvider"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shapes", nargs="*", default=DEFAULT_SHAPES, help="N,C,H,W,K,S,P")
    ap.add_argument("--repeat", type=int, default=40)
    args = ap.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.2f}")
    print(f"{'N,C,H,W,K,S,P':24s} {'rows ms':>8s} {'scalar ms':>9s} {'plain ms':>9s} {'ratio':>6s}")
    for text in args.shapes:
        n, c, h, w, k, s, p = (int(v) for v in text.split(","))
        feeds = {"x": np.random.default_rng(0).standard_normal((n, c, h, w)).astype(np.float32)}
        sessions = {"rows": _session((n, c, h, w), k, s, p, ""),
                    "scalar": _session((n, c, h, w), k, s, p, "pool_row_vectors"),
                    "plain": _session((n, c, h, w), k, s, p, "pool_rows")}
        outs = {name: sess.run(None, feeds)[0] for name, sess in sessions.items()}
        if not (np.array_equal(outs["rows"], outs["plain"]) and np.array_equal(outs["scalar"], outs["plain"])):
            raise SystemExit(f"{text}: the row kernels and the plain kernel disagree")
        times: dict[str, list[float]] = {name: [] for name in sessions}
        for _ in range(args.repeat):
            for name, sess in sessions.items():
                t = time.perf_counter()
                sess.run(None, feeds)
                times[name].append(time.perf_counter() - t)
        rows, scalar, plain = (statistics.median(times[name]) * 1e3 for name in ("rows", "scalar", "plain"))
        print(f"{text:24s} {rows:8.3f} {scalar:9.3f} {plain:9.3f} {rows / plain:6.2f}")
    print(f"load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
