"""CenterCropPad (opset 18): each named axis cut or zero-padded to its target length around the
centre, the odd cell at the end (as the specification and onnx.reference)."""

from __future__ import annotations

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels.registry import register


@register("CenterCropPad", since=18)
class CenterCropPad(Kernel):
    host_inputs = frozenset({1})

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.axes = node.attr("axes")
        self.name = node.name

    def compute(self, inputs: list) -> list:
        x, shape = inputs[0], [int(v) for v in np.asarray(inputs[1]).reshape(-1)]
        axes = [a % x.ndim for a in self.axes] if self.axes else list(range(x.ndim))
        if len(shape) != len(axes) or min(shape, default=0) < 0:
            raise InvalidArgument(f"CenterCropPad {self.name!r}: shape {shape} for axes {axes} of an input of shape "
                                  f"{list(x.shape)}; give one non-negative length per axis.")
        crop, place, out_shape = [slice(None)] * x.ndim, [slice(None)] * x.ndim, list(x.shape)
        for a, target in zip(axes, shape):
            dim = x.shape[a]
            start = abs(dim - target) // 2
            if target < dim:
                crop[a] = slice(start, start + target)
            elif target > dim:
                place[a] = slice(start, start + dim)
            out_shape[a] = target
        cropped = x[tuple(crop)]
        if out_shape == list(cropped.shape):
            return [np.ascontiguousarray(cropped)]
        out = np.zeros(out_shape, x.dtype)
        out[tuple(place)] = cropped
        return [out]
