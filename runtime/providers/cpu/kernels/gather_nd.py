"""GatherND (opsets 11, 12, 13): slices of data addressed by the last axis of indices, after
``batch_dims`` leading axes the two share; one fancy-indexing step, indices range-checked
(negative ones count from the end).

Paths (``GATHER_ND_PATHS``): ``fancy`` is the canonical one; ``take``, one ``ndarray.take`` on the
first axis, is taken where indices address that axis alone (no batch axes, a last axis of 1) and
lie in range without wrapping: what a graph network's ``x[src]`` exports to, 23 us -> 3 us a node
on a [96] gather. ``ravel`` takes indices of two or more columns the same way, through one flat
index per row (np.ravel_multi_index, which checks the range and declines to ``fancy`` otherwise)."""

from __future__ import annotations

import math

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels.kernel_paths import path_table
from onnxhal.runtime.providers.cpu.kernels.registry import register

GATHER_ND_PATHS = path_table("GatherND", "fancy: the indices' columns as one fancy index per addressed axis, "
                                         "batch axes broadcast, indices range-checked and wrapped")
FANCY = GATHER_ND_PATHS.add("fancy", "canonical: every other case (batch_dims, several addressed axes, negative "
                                     "or out-of-range indices, no indices)")
TAKE = GATHER_ND_PATHS.add("take", "batch_dims 0, the indices' last axis 1, at least one index, every index in "
                                   "[0, data.shape[0])")
RAVEL = GATHER_ND_PATHS.add("ravel", "batch_dims 0, the indices' last axis 2 or more, integer indices, at least one "
                                     "index: one flat index per row by np.ravel_multi_index and one take; a negative "
                                     "or out-of-range index makes it decline to fancy")


@register("GatherND", since=11)
class GatherND(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.b = int(node.attr("batch_dims", 0))
        self.name = node.name

    def path(self, data: np.ndarray, idx: np.ndarray) -> str:
        """The path ``GATHER_ND_PATHS`` names for these operands."""
        if (self.b == 0 and idx.ndim >= 1 and idx.shape[-1] == 1 and idx.size and data.ndim >= 1
                and idx.dtype.kind in "iu" and idx.min() >= 0 and idx.max() < data.shape[0]):
            return TAKE
        if (self.b == 0 and idx.ndim >= 1 and 2 <= idx.shape[-1] <= data.ndim and idx.size
                and idx.dtype.kind == "i"):
            return RAVEL
        return FANCY

    def compute(self, inputs: list) -> list:
        data, idx = inputs[0], np.asarray(inputs[1])
        b = self.b
        what = f"GatherND node {self.name!r}"
        if idx.ndim < 1 or data.ndim <= b or idx.ndim <= b:
            raise InvalidArgument(f"{what}: data {list(data.shape)} and indices {list(idx.shape)} for batch_dims {b}; "
                                  "both need more than batch_dims axes.")
        m = idx.shape[-1]
        path = self.path(data, idx)
        if path == TAKE:
            return [data.take(idx[..., 0], axis=0)]
        if path == RAVEL:
            # a transformers mask export's x[rows, cols] (Gemma 3: [1, 12] bool by [1, 1, 1, 12, 2]):
            # 85 -> 13 us a node; fancy's range checks, wrap and broadcast cost more than the gather
            try:
                flat_index = np.ravel_multi_index(tuple(idx.reshape(-1, m).T), data.shape[:m])
            except ValueError:  # an index negative or out of range: fancy wraps or names it
                pass
            else:
                flat = data.reshape((-1,) + data.shape[m:])
                return [flat.take(flat_index, axis=0).reshape(idx.shape[:-1] + data.shape[m:])]
        if data.shape[:b] != idx.shape[:b] or m > data.ndim - b:
            raise InvalidArgument(f"{what}: data {list(data.shape)} and indices {list(idx.shape)}: the first {b} axes "
                                  f"must agree and the last axis of indices ({m}) address at most {data.ndim - b} axes.")
        dims = np.array(data.shape[b:b + m], np.int64)
        idx = idx.astype(np.int64, copy=False)
        bad = (idx < -dims) | (idx >= dims)
        if bad.any():
            at = np.argwhere(bad)[0]
            raise InvalidArgument(f"{what}: index {int(idx[tuple(at)])} is out of range for axis {b + int(at[-1])} of "
                                  f"length {int(dims[at[-1]])}; indices must be in [-n, n).")
        idx = np.where(idx < 0, idx + dims, idx)
        lead = idx.shape[:-1]
        batch = int(math.prod(data.shape[:b]))
        flat = data.reshape((batch,) + data.shape[b:])
        rows = idx.reshape(batch, int(math.prod(lead[b:])), m)
        which = np.broadcast_to(np.arange(batch)[:, None], rows.shape[:2])  # also for m == 0: whole slices
        picked = flat[(which,) + tuple(rows[..., i] for i in range(m))]
        return [picked.reshape(lead + data.shape[b + m:])]
