"""Unique: the distinct elements (or slices along an axis), sorted or in first-occurrence order.

onnx.reference's version refused some dtypes (int8) and kept the shape of an empty input without an
axis, where the spec flattens it (onnxruntime gives a 1-D empty output).
"""

from __future__ import annotations

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels.registry import register


@register("Unique", since=11)
class Unique(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.axis = node.attr("axis")
        self.sorted = bool(node.attr("sorted", 1))

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        axis = self.axis
        if axis is None:
            x = x.reshape(-1)
            axis = 0
        elif not -x.ndim <= axis < x.ndim:
            raise InvalidArgument(f"Unique: axis {axis} is out of range for an input of rank {x.ndim}.")
        # numpy sorts; its first-occurrence indices give the spec's sorted=0 order back.
        y, first, inverse, counts = np.unique(x, return_index=True, return_inverse=True, return_counts=True,
                                              axis=axis, equal_nan=False)
        inverse = inverse.reshape(-1)
        if not self.sorted:
            order = np.argsort(first, kind="stable")
            rank = np.empty_like(order)
            rank[order] = np.arange(order.size)
            y, first, counts, inverse = np.take(y, order, axis=axis), first[order], counts[order], rank[inverse]
        i64 = np.int64
        return [y, first.astype(i64, copy=False), inverse.astype(i64, copy=False), counts.astype(i64, copy=False)]
