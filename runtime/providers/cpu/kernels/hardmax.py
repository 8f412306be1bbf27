"""Hardmax: 1 at the first largest value along an axis, 0 elsewhere (softmax's limit)."""

from __future__ import annotations

import math

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.runtime.providers.cpu.kernels.axes import axis_index
from onnxhal.runtime.providers.cpu.kernels.registry import register


@register("Hardmax", since=1)
class Hardmax(Kernel):
    """1 at the first largest value along the axis (before opset 13: of the input flattened to
    2-D at ``axis``), 0 elsewhere."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.flatten = (node.since_version or 13) < 13
        self.axis = int(node.attr("axis", 1 if self.flatten else -1))

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        axis = axis_index(self.axis, max(x.ndim, 1), "Hardmax")
        rows = x.reshape(int(math.prod(x.shape[:axis])), -1) if self.flatten else np.moveaxis(x, axis, -1)
        if rows.shape[-1] == 0:
            return [np.zeros_like(x)]
        out = np.zeros_like(rows)
        np.put_along_axis(out, np.argmax(rows, axis=-1)[..., None], 1, axis=-1)
        return [out.reshape(x.shape) if self.flatten else np.moveaxis(out, -1, axis)]
