"""com.onnxhal GatherReduce: the optimizer's fusion of a Concat of per-segment reductions of
gathered columns (runtime/optimizer/horizontal.py, ``fuse_gather_reduce``).

One node stands for ``Concat([Reduce(Gather(X, idx_k), axis) for k], axis)`` with keepdims: the
columns ``indices`` of ``axis`` gathered at once, then reduced per run of ``segments[k]`` of them
(``ufunc.reduceat``). Attributes:

- ``indices`` (ints): every segment's indices, in order; ``segments`` (ints): each segment's length;
- ``axis`` (int, >= 0): the gathered, reduced and concatenated axis of the output;
- ``reduce`` (string): ReduceProd, ReduceSum, ReduceMax or ReduceMin;
- ``source`` (string): the gathering op, for its index rules and messages: ``Gather`` (indices in
  [-dim, dim)) or ``ArrayFeatureExtractor`` (indices in [0, dim), along the last axis; a 1-D X is
  one row).

The optimizer makes it only where the result is the separate nodes' bit for bit: a float segment
has at most two elements (one operation, whatever the order), integer arithmetic is exact modulo
its width in any order.
"""

from __future__ import annotations

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.ep import INLINE_APPLY
from onnxhal.hal.errors import InvalidArgument, InvalidGraph
from onnxhal.runtime.providers.cpu.kernels.registry import register

FUSED_DOMAIN = "com.onnxhal"
#: The reductions a segment may use: those that are one ufunc's reduce in reduction.py.
UFUNCS = {"ReduceProd": np.multiply, "ReduceSum": np.add, "ReduceMax": np.maximum, "ReduceMin": np.minimum}


@register("GatherReduce", since=1, domain=FUSED_DOMAIN)
class GatherReduce(Kernel):
    """Gathered columns reduced per segment (module docstring)."""

    inline_fn = INLINE_APPLY

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.name = node.name
        indices = [int(i) for i in node.attr("indices", [])]
        segments = [int(s) for s in node.attr("segments", [])]
        reduce = node.attr("reduce", "")
        if not indices or not segments or min(segments) < 1 or sum(segments) != len(indices) or reduce not in UFUNCS:
            raise InvalidGraph(f"GatherReduce node {self.name!r}: segments {segments} must be positive and add up to "
                               f"the {len(indices)} indices, and reduce {reduce!r} one of {sorted(UFUNCS)}.")
        self.indices = np.array(indices, dtype=np.intp)
        self.starts = np.concatenate(([0], np.cumsum(segments[:-1]))).astype(np.intp)
        self.ufunc = UFUNCS[reduce]
        self.axis = int(node.attr("axis", 0))
        self.source = node.attr("source", "Gather")
        self.feature_extractor = self.source == "ArrayFeatureExtractor"
        # (axis length, indices made non-negative for it): replaced whole, so threads read one pair
        self._checked: tuple[int, np.ndarray | None] = (-1, None)

    def compute(self, inputs: list) -> list:
        return [self.apply(inputs[0])]

    def apply(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x)
        if self.feature_extractor and x.ndim == 1:
            x = x.reshape(1, -1)  # ArrayFeatureExtractor gives a 1-D X's columns as one row
        axis = self.axis
        if axis >= x.ndim:
            raise InvalidArgument(f"GatherReduce node {self.name!r} ({self.source} of the merged nodes): axis {axis} "
                                  f"is out of range for the input {list(x.shape)}.")
        dim = x.shape[axis]
        seen, index = self._checked
        if dim != seen or index is None:
            index = self.indices
            low = 0 if self.feature_extractor else -dim
            bad = (index < low) | (index >= dim)
            if bad.any():
                raise InvalidArgument(f"GatherReduce node {self.name!r} ({self.source} of the merged nodes): index "
                                      f"{int(index[np.argmax(bad)])} is out of range for axis {axis} of the input "
                                      f"{list(x.shape)}; indices must be in [{low}, {dim}).")
            index = np.where(index < 0, index + dim, index)
            self._checked = (dim, index)
        gathered = x.take(index, axis=axis)
        if x.dtype == np.float16:  # as the Reduce kernels: computed in float32, returned in float16
            gathered = gathered.astype(np.float32)
        r = self.ufunc.reduceat(gathered, self.starts, axis=axis)
        return r if r.dtype == x.dtype else r.astype(x.dtype)
