"""Random graphs (``tests/random_graphs.py``) at every optimization level against onnxruntime.

Each seed's graph runs in onnxruntime with its optimizer off, and in onnxhal at the four levels.
At ORT_ENABLE_ALL the session runs twice on the same input arrays, the first time with other
values, so that a kernel keeping something derived from a graph input would show. Graphs that
onnxruntime refuses are skipped (onnxhal may run them). 17,000 seeds of this generator found six
bugs; the suite runs 480 of them (about 15 s here). 60 more run with the OpenCL EP
first, whose fused partitions then span many nodes (1,900 seeds, 400 of them tiny:
no mismatch; 35,645 nodes ran on the OpenCL EP).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import onnxhal
from onnxhal.hal import GraphOptimizationLevel as Level
from tests.compare import float_difference
from tests.random_graphs import build

SEEDS_PER_CHUNK = 40
CHUNKS = 10  # seeds 0-399
TINY_CHUNKS = 2  # seeds 20000-20079 with 2-4 pixel inputs and dilated pools
TOL = 1e-4  # relative to the output's largest magnitude (at least 1), and per element


def _ort(model: bytes, feeds: dict) -> list | None:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    try:
        return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feeds)
    except Exception:  # noqa: BLE001 - onnxruntime refuses some valid graphs (no float64 Conv, ...)
        return None


def _mismatch(want: list, got: list) -> str | None:
    for i, (w, g) in enumerate(zip(want, got)):
        w, g = np.asarray(w), np.asarray(g)
        if w.shape != g.shape or w.dtype != g.dtype:
            return f"output {i}: {g.dtype}{list(g.shape)}, onnxruntime {w.dtype}{list(w.shape)}"
        problem = float_difference(w, g, TOL)
        if problem:
            return f"output {i}: {problem}"
    return None


def _check(seed: int, tiny: bool) -> str | None:
    model, feeds, meta = build(seed, tiny)
    want = _ort(model, feeds)
    if want is None:
        return None
    for level in Level:
        so = onnxhal.SessionOptions()
        so.graph_optimization_level = level
        sess = onnxhal.InferenceSession(model, so)
        arrays = {k: v.copy() for k, v in feeds.items()}
        if level == Level.ORT_ENABLE_ALL:
            rng = np.random.default_rng(seed)
            for v in arrays.values():
                if v.dtype.kind == "f":
                    v[...] = rng.uniform(-2, 2, v.shape)
            sess.run(None, arrays)
            for k, v in arrays.items():
                v[...] = feeds[k]  # the values onnxruntime ran, in the arrays the first run saw
        problem = _mismatch(want, sess.run(None, arrays))
        if problem:
            return f"seed {seed}{' tiny' if tiny else ''} ({meta['kind']}, opset {meta['opset']}) at {level.name}: {problem}"
    return None


@pytest.mark.parametrize("first, tiny", [(c * SEEDS_PER_CHUNK, False) for c in range(CHUNKS)]
                         + [(20000 + c * SEEDS_PER_CHUNK, True) for c in range(TINY_CHUNKS)])
def test_random_graphs_agree_with_onnxruntime_at_every_level(first, tiny):
    problems = [p for seed in range(first, first + SEEDS_PER_CHUNK) if (p := _check(seed, tiny))]
    assert not problems, "\n".join(problems)


OPENCL = ["OpenCLExecutionProvider", "CPUExecutionProvider"]


def _check_opencl(seed: int) -> tuple[str | None, int]:
    """The graph with the OpenCL EP first (fused multi-node partitions on PoCL, the rest on the CPU
    EP), unoptimized and at ORT_ENABLE_ALL: (problem, OpenCL nodes)."""
    model, feeds, meta = build(seed, False)
    want = _ort(model, feeds)
    if want is None:
        return None, 0
    nodes = 0
    for level in (Level.ORT_DISABLE_ALL, Level.ORT_ENABLE_ALL):
        so = onnxhal.SessionOptions()
        so.graph_optimization_level = level
        sess = onnxhal.InferenceSession(model, so, providers=OPENCL)
        nodes += sess.partition_summary.get(OPENCL[0], 0)
        problem = _mismatch(want, sess.run(None, {k: v.copy() for k, v in feeds.items()}))
        if problem:
            return f"seed {seed} ({meta['kind']}) with the OpenCL EP at {level.name}: {problem}", nodes
    return None, nodes


@pytest.mark.parametrize("first", [0, 1000])
def test_random_graphs_with_the_opencl_ep_agree_with_onnxruntime(first, opencl_devices):
    results = [_check_opencl(seed) for seed in range(first, first + 30)]
    problems = [p for p, _ in results if p]
    assert not problems, "\n".join(problems)
    assert sum(n for _, n in results) > 100  # the OpenCL EP ran much of these graphs, not the CPU EP alone
