"""OneHot, native: onnx.reference's (the fallback before) fails on a depth given as a 1-element
1-D tensor, which the spec allows and exporters write ("only 0-dimensional arrays can be converted
to Python scalars" under numpy 2, while onnxruntime runs it)."""

from __future__ import annotations

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import Fail
from onnxhal.runtime.providers.cpu.kernels.registry import register


@register("OneHot", since=9)
class OneHot(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.axis = node.attr("axis", -1)
        self.label = f"OneHot node {node.name!r}"

    def compute(self, inputs: list) -> list:
        indices, depth, values = (np.asarray(v) for v in inputs[:3])
        if depth.size != 1 or values.size != 2:
            raise Fail(f"{self.label}: depth must hold one element and values two (off, on); got depth of shape "
                       f"{list(depth.shape)} and values of shape {list(values.shape)}.")
        n = int(depth.reshape(-1)[0])
        if n < 1:
            raise Fail(f"{self.label}: depth is {n}; it must be 1 or more.")
        rank = indices.ndim
        axis = self.axis + rank + 1 if self.axis < 0 else self.axis
        if not 0 <= axis <= rank:
            raise Fail(f"{self.label}: axis={self.axis} for indices of rank {rank}; it must be in "
                       f"[{-rank - 1}, {rank}].")
        idx = indices.astype(np.int64)
        idx = np.where(idx < 0, idx + n, idx)  # [-depth, -1] counts from the end; anything else is all off
        hot = np.moveaxis(idx[..., None] == np.arange(n), -1, axis)
        off, on = values.reshape(-1)
        return [np.where(hot, on, off).astype(values.dtype)]
