"""GatherND (opsets 11, 12, 13): slices of data addressed by the last axis of indices, after
``batch_dims`` leading axes the two share; one fancy-indexing step, indices range-checked
(negative ones count from the end)."""

from __future__ import annotations

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels.registry import register


@register("GatherND", since=11)
class GatherND(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.b = int(node.attr("batch_dims", 0))
        self.name = node.name

    def compute(self, inputs: list) -> list:
        data, idx = inputs[0], np.asarray(inputs[1])
        b = self.b
        what = f"GatherND node {self.name!r}"
        if idx.ndim < 1 or data.ndim <= b or idx.ndim <= b:
            raise InvalidArgument(f"{what}: data {list(data.shape)} and indices {list(idx.shape)} for batch_dims {b}; "
                                  "both need more than batch_dims axes.")
        m = idx.shape[-1]
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
        batch = int(np.prod(data.shape[:b], dtype=np.int64))
        flat = data.reshape((batch,) + data.shape[b:])
        rows = idx.reshape(batch, int(np.prod(lead[b:], dtype=np.int64)), m)
        which = np.broadcast_to(np.arange(batch)[:, None], rows.shape[:2])  # also for m == 0: whole slices
        picked = flat[(which,) + tuple(rows[..., i] for i in range(m))]
        return [picked.reshape(lead + data.shape[b + m:])]
