"""DepthToSpace and SpaceToDepth, native: one reshape, transpose and reshape each (the spec's
definition), DCR and CRD modes (SpaceToDepth's since opset 28), where onnx.reference's kernel was
the fallback before; super-resolution nets end in DepthToSpace (PyTorch's PixelShuffle exports as
its CRD mode)."""

from __future__ import annotations

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels.registry import register

#: Per mode, how the channel axis splits ((bs, bs, C) for DCR, (C, bs, bs) for CRD) and the
#: transpose that interleaves the blocks with the rows and columns.
_DEPTH_TO_SPACE = {"DCR": ((0, 3, 4, 1, 5, 2), True), "CRD": ((0, 1, 4, 2, 5, 3), False)}
#: SpaceToDepth's inverse transposes, from [N, C, H/bs, bs, W/bs, bs] (its mode since opset 28).
_SPACE_TO_DEPTH = {"DCR": (0, 3, 5, 1, 2, 4), "CRD": (0, 1, 3, 5, 2, 4)}


def _blocksize(node: Node, label: str) -> int:
    bs = node.attr("blocksize", None)
    if bs is None or bs < 1:
        raise InvalidArgument(f"{label}: blocksize is {bs}; it must be given, 1 or more.")
    return int(bs)


def _mode(node: Node, label: str) -> str:
    mode = node.attr("mode", "DCR")
    if mode not in _DEPTH_TO_SPACE:  # the loader's node checks refuse it first; a kernel built alone too
        raise InvalidArgument(f"{label}: mode {mode!r}; it must be 'DCR' or 'CRD'.")
    return mode


def _four_d(x: np.ndarray, label: str) -> tuple[int, int, int, int]:
    if x.ndim != 4:
        raise InvalidArgument(f"{label}: the input is {list(x.shape)}; it must be 4-D [N, C, H, W].")
    return x.shape


@register("DepthToSpace", since=1)
class DepthToSpace(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.label = f"DepthToSpace node {node.name!r}"
        self.bs = _blocksize(node, self.label)
        self.perm, self.depth_first = _DEPTH_TO_SPACE[_mode(node, self.label)]

    def compute(self, inputs: list) -> list:
        x = np.asarray(inputs[0])
        n, c, h, w = _four_d(x, self.label)
        bs = self.bs
        if c % (bs * bs):
            raise InvalidArgument(f"{self.label}: {c} channels do not divide by blocksize^2 = {bs * bs}; the "
                                  f"input's channels must be a multiple of it.")
        split = (n, bs, bs, c // (bs * bs), h, w) if self.depth_first else (n, c // (bs * bs), bs, bs, h, w)
        y = x.reshape(split).transpose(self.perm)
        return [np.ascontiguousarray(y).reshape(n, c // (bs * bs), h * bs, w * bs)]


@register("SpaceToDepth", since=1)
class SpaceToDepth(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.label = f"SpaceToDepth node {node.name!r}"
        self.bs = _blocksize(node, self.label)
        self.perm = _SPACE_TO_DEPTH[_mode(node, self.label)]

    def compute(self, inputs: list) -> list:
        x = np.asarray(inputs[0])
        n, c, h, w = _four_d(x, self.label)
        bs = self.bs
        if h % bs or w % bs:
            raise InvalidArgument(f"{self.label}: height {h} and width {w} must both be multiples of the "
                                  f"blocksize {bs}.")
        y = x.reshape(n, c, h // bs, bs, w // bs, bs).transpose(self.perm)
        return [np.ascontiguousarray(y).reshape(n, c * bs * bs, h // bs, w // bs)]
