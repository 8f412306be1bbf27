"""GroupNormalization (opsets 18 and 21) and RMSNormalization (opset 23), which onnx.reference ran:
statistics in the stash type (float32 unless stash_type says otherwise), one reshape and a few
reductions each."""

from __future__ import annotations

import math

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels.registry import register


def _stash(node: Node) -> np.dtype:
    return np.dtype(np.float64) if int(node.attr("stash_type", 1)) == 11 else np.dtype(np.float32)


@register("GroupNormalization", since=18)
class GroupNormalization(Kernel):
    """x [N, C, ...] normalized over each of num_groups groups of channels, then scale and bias:
    one value per channel (opset 21), or per group (opset 18)."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.groups = int(node.attr("num_groups", 0))
        self.epsilon = float(node.attr("epsilon", 1e-5))
        self.per_group = (node.since_version or 21) < 21
        self.stash = _stash(node)
        self.name = node.name

    def compute(self, inputs: list) -> list:
        x, scale, bias = inputs[:3]
        if x.ndim < 2 or self.groups <= 0 or x.shape[1] % self.groups:
            raise InvalidArgument(f"GroupNormalization node {self.name!r}: input {list(x.shape)} and num_groups "
                                  f"{self.groups}; the channels (axis 1) must divide into the groups.")
        n, c = x.shape[:2]
        stash = np.dtype(np.float64) if x.dtype == np.float64 else self.stash
        g = x.reshape(n, self.groups, -1).astype(stash, copy=False)
        mean = g.mean(axis=-1, keepdims=True)
        var = np.square(g - mean).mean(axis=-1, keepdims=True)
        y = ((g - mean) / np.sqrt(var + stash.type(self.epsilon))).reshape(x.shape)
        per = self.groups if self.per_group else c
        if scale.size != per or bias.size != per:
            raise InvalidArgument(f"GroupNormalization node {self.name!r}: scale and bias need {per} values (one per "
                                  f"{'group' if self.per_group else 'channel'}), got {scale.size} and {bias.size}.")
        if self.per_group:
            scale, bias = np.repeat(scale, c // self.groups), np.repeat(bias, c // self.groups)
        shape = (1, c) + (1,) * (x.ndim - 2)
        return [(y * scale.reshape(shape) + bias.reshape(shape)).astype(x.dtype, copy=False)]


@register("RMSNormalization", since=23)
class RMSNormalization(Kernel):
    """x / sqrt(mean(x^2 over the axes from ``axis``) + epsilon) * scale."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.axis = int(node.attr("axis", -1))
        self.epsilon = float(node.attr("epsilon", 1e-5))
        self.stash = _stash(node)
        self.name = node.name

    def compute(self, inputs: list) -> list:
        x, scale = inputs[0], inputs[1]
        axis = self.axis + x.ndim if self.axis < 0 else self.axis
        if not 0 <= axis < max(x.ndim, 1):
            raise InvalidArgument(f"RMSNormalization node {self.name!r}: axis {self.axis} for an input of rank "
                                  f"{x.ndim}.")
        stash = np.dtype(np.float64) if x.dtype == np.float64 else self.stash  # onnxruntime: doubles in double
        xs = x.astype(stash, copy=False)
        axes = tuple(range(axis, x.ndim))
        # mean, sqrt and reciprocal in place on the row statistics, ufunc.reduce rather than
        # ndarray.mean (whose wrapper costs more than a small row's pass): Gemma 3 runs 13 of these
        # on [1, 12, 32]; the same operations and roundings as 1 / sqrt(mean(x^2) + eps)
        inv = np.add.reduce(np.square(xs), axis=axes, keepdims=True)
        inv /= stash.type(math.prod(x.shape[axis:]) or 1)
        inv += stash.type(self.epsilon)
        np.sqrt(inv, out=inv)
        np.divide(1, inv, out=inv)
        y = (xs * inv).astype(x.dtype, copy=False)
        if scale.dtype == y.dtype and scale.ndim <= y.ndim and scale.shape == y.shape[y.ndim - scale.ndim:]:
            y *= scale
            return [y]
        return [(y * scale).astype(x.dtype, copy=False)]
