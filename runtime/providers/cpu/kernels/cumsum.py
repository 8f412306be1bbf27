"""CumSum: running sums along an axis."""

from __future__ import annotations

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.runtime.providers.cpu.kernels.axes import axis_index
from onnxhal.runtime.providers.cpu.kernels.registry import register


@register("CumSum", since=11)
class CumSum(Kernel):
    """Running sums along the axis input, ``reverse`` from the end, ``exclusive`` without the
    element itself."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.exclusive, self.reverse = bool(node.attr("exclusive", 0)), bool(node.attr("reverse", 0))

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        axis = axis_index(int(np.asarray(inputs[1]).reshape(-1)[0]), max(x.ndim, 1), "CumSum")
        data = x.reshape(1) if x.ndim == 0 else x
        if self.reverse:
            data = np.flip(data, axis)
        out = np.cumsum(data, axis=axis, dtype=x.dtype)
        if self.exclusive:
            out = out - data
        if self.reverse:
            out = np.flip(out, axis)
        return [np.ascontiguousarray(out).reshape(x.shape)]
