"""Ops that pick or reorder elements: NonZero, Compress, Trilu (a triangle of the last two axes)
and ReverseSequence, each a few numpy calls."""

from __future__ import annotations

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels.axes import axis_index
from onnxhal.runtime.providers.cpu.kernels.registry import register


@register("NonZero", since=9)
class NonZero(Kernel):
    """The indices of the nonzero elements, int64 [rank, count], in row-major order; a scalar gives
    [0, count] (rank rows, as onnx's shape inference; onnxruntime gives one row, docs/cpu-ep.md)."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        pass

    def compute(self, inputs: list) -> list:
        x = np.asarray(inputs[0])
        if x.ndim == 0:
            return [np.zeros((0, int(x != 0)), np.int64)]
        return [np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)]


@register("Compress", since=9)
class Compress(Kernel):
    """The slices along ``axis`` (of the flattened input without one) where condition is true;
    a condition shorter than the axis leaves the rest out."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.axis = node.attr("axis")

    def compute(self, inputs: list) -> list:
        x, cond = inputs[0], np.asarray(inputs[1]).reshape(-1).astype(bool)
        data = x.reshape(-1) if self.axis is None else x
        axis = 0 if self.axis is None else axis_index(int(self.axis), x.ndim, "Compress")
        if cond.size > data.shape[axis]:
            raise InvalidArgument(f"Compress: condition of length {cond.size} for an axis of length "
                                  f"{data.shape[axis]}; it may be at most as long.")
        return [np.compress(cond, data, axis=axis)]


@register("Trilu", since=14)
class Trilu(Kernel):
    """The upper (upper=1) or lower triangle of the last two axes from diagonal k, the rest 0."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.upper = bool(node.attr("upper", 1))

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        if x.ndim < 2:
            raise InvalidArgument(f"Trilu: input of rank {x.ndim}; it needs at least 2 axes.")
        k = int(np.asarray(inputs[1]).reshape(-1)[0]) if len(inputs) > 1 and inputs[1] is not None else 0
        rows, cols = x.shape[-2:]
        i, j = np.arange(rows)[:, None], np.arange(cols)[None, :]
        keep = (j - i >= k) if self.upper else (j - i <= k)
        return [np.where(keep, x, np.zeros((), x.dtype))]


@register("ReverseSequence", since=10)
class ReverseSequence(Kernel):
    """Per batch entry b, the first sequence_lens[b] steps along time_axis reversed."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.batch_axis, self.time_axis = int(node.attr("batch_axis", 1)), int(node.attr("time_axis", 0))
        if {self.batch_axis, self.time_axis} != {0, 1}:
            raise InvalidArgument(f"ReverseSequence node {node.name!r}: batch_axis {self.batch_axis} and time_axis "
                                  f"{self.time_axis} must be 0 and 1.")

    def compute(self, inputs: list) -> list:
        x, lens = inputs[0], np.asarray(inputs[1]).astype(np.int64).reshape(-1)
        batch, steps = x.shape[self.batch_axis], x.shape[self.time_axis]
        if lens.size != batch or (lens < 0).any() or (lens > steps).any():
            raise InvalidArgument(f"ReverseSequence: sequence_lens {lens.tolist()} for batch {batch} and {steps} "
                                  f"steps; give one length in [0, {steps}] per batch entry.")
        t = np.arange(steps)[None, :]
        src = np.where(t < lens[:, None], lens[:, None] - 1 - t, t)  # [batch, steps]
        moved = np.moveaxis(x, (self.batch_axis, self.time_axis), (0, 1))
        out = moved[np.arange(batch)[:, None], src]
        return [np.moveaxis(out, (0, 1), (self.batch_axis, self.time_axis))]
