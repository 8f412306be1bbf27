"""TopK (opsets 1, 10, 11): the k largest (or smallest) values along an axis and their indices,
equal values in index order, as onnxruntime and the spec order them; NaN counts as the largest
value (numpy's sort order)."""

from __future__ import annotations

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels.registry import register


@register("TopK", since=1)
class TopK(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.axis = int(node.attr("axis", -1))
        self.largest = bool(node.attr("largest", 1))
        self.k_attr = node.attr("k")  # opset 1; an input from opset 10
        self.name = node.name

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        k = int(self.k_attr) if self.k_attr is not None else int(np.asarray(inputs[1]).reshape(-1)[0])
        if x.ndim == 0:
            raise InvalidArgument(f"TopK node {self.name!r}: X is a scalar; it needs an axis to take values from.")
        axis = self.axis + x.ndim if self.axis < 0 else self.axis
        if not 0 <= axis < x.ndim:
            raise InvalidArgument(f"TopK node {self.name!r}: axis {self.axis} is out of range for X of rank {x.ndim}.")
        n = x.shape[axis]
        if not 0 <= k <= n:
            raise InvalidArgument(f"TopK node {self.name!r}: K = {k} for an axis of length {n}; K must be in [0, {n}].")
        moved = np.moveaxis(x, axis, -1)
        if self.largest:
            # a stable ascending sort of the reversed axis, read backwards: values descending and
            # equal values in increasing index order
            order = np.argsort(moved[..., ::-1], axis=-1, kind="stable")[..., ::-1]
            index = (n - 1) - order[..., :k]
        else:
            index = np.argsort(moved, axis=-1, kind="stable")[..., :k]
        values = np.take_along_axis(moved, index, axis=-1)
        return [np.moveaxis(values, -1, axis), np.moveaxis(index.astype(np.int64), -1, axis)]
