"""Pad's ``edge``, ``reflect`` and ``wrap`` modes as index gathers (path ``index_take``): each
padded axis's output positions map to input positions once per (input shape, pads, axes), and a
run is one ``take`` per padded axis. np.pad, the canonical form (``shape_ops._pad``), builds its
padded views through general Python machinery that costs about 100 us on a small tensor; the
gather copies the same elements, so the results are the same bits."""

from __future__ import annotations

import numpy as np

from onnxhal.runtime.providers.cpu.kernels.kernel_paths import path_table

PAD_PATHS = path_table("Pad.edge_reflect_wrap", "np_pad: shape_ops._pad, its checks then numpy's np.pad")
NP_PAD = PAD_PATHS.add("np_pad", "canonical: constant mode (its own fill-and-copy form), negative pads, pads "
                                 "_pad refuses, object tensors, INDEX_PAD_ENABLED off")
INDEX_TAKE = PAD_PATHS.add("index_take", "edge, reflect or wrap mode, every pad non-negative, each padded axis "
                                         "non-empty, reflect pads shorter than their axis, INDEX_PAD_ENABLED at kernel build and at the run: "
                                         "one take per padded axis with the output's source positions made once "
                                         "per (input shape, pads, axes)")
#: switch of ``index_take`` (read when the kernel is made and at each run)
INDEX_PAD_ENABLED = True
INDEX_MODES = frozenset({"edge", "reflect", "wrap"})


def source_positions(mode: str, length: int, begin: int, end: int) -> np.ndarray:
    """For each output position along an axis of ``length`` padded by (``begin``, ``end``), the
    input position np.pad copies there (reflect: mirrored without repeating the edge)."""
    j = np.arange(-begin, length + end, dtype=np.intp)
    if mode == "edge":
        return np.clip(j, 0, length - 1)
    if mode == "wrap":
        return np.mod(j, length)
    period = 2 * (length - 1)  # reflect; pads shorter than the axis, so one fold at most either side
    if period == 0:
        return np.zeros_like(j)
    j = np.abs(j)
    return np.where(j >= length, period - j, j)


def take_plan(shape: tuple, pads: list, mode: str, axes: list | None) -> tuple | None:
    """((axis, source positions) per padded axis) for ``index_take``, or None where the canonical
    form must decide (its errors included)."""
    nd = len(shape)
    axes = list(range(nd)) if axes is None else [int(a) + nd if int(a) < 0 else int(a) for a in axes]
    k = len(axes)
    if mode not in INDEX_MODES or len(pads) != 2 * k or any(not 0 <= a < nd for a in axes) or len(set(axes)) != k:
        return None
    plan = []
    for i, a in enumerate(axes):
        b, e, d = int(pads[i]), int(pads[i + k]), shape[a]
        if b < 0 or e < 0:
            return None
        if not (b or e):
            continue
        if d == 0 or (mode == "reflect" and max(b, e) >= d):
            return None
        plan.append((a, source_positions(mode, d, b, e)))
    return tuple(plan)


def run_plan(x: np.ndarray, plan: tuple) -> np.ndarray:
    """``x`` padded by ``take_plan``'s gathers (a copy also where nothing is padded, as np.pad)."""
    if not plan:
        return x.copy()
    for a, idx in plan:
        x = np.take(x, idx, axis=a)
    return x
