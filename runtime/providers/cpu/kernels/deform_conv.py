"""DeformConv (opset 19), 2-D: every kernel tap's sampling point (grid position + learned offset)
is bilinearly sampled for all channels at once (zero outside the image, as onnx.reference's
GridSample with align_corners), optionally masked, then one batched matmul per group. Other ranks
go to onnx.reference."""

from __future__ import annotations

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.runtime.providers.cpu.kernels.registry import register


@register("DeformConv", since=19)
class DeformConv(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.kernel_shape = node.attr("kernel_shape")
        self.strides = node.attr("strides") or [1, 1]
        self.dilations = node.attr("dilations") or [1, 1]
        self.pads = node.attr("pads") or [0, 0, 0, 0]
        self.group = node.attr("group", 1)
        self.offset_group = node.attr("offset_group", 1)
        self.node, self.ctx = node, ctx

    def compute(self, inputs: list) -> list:
        x, w, off = inputs[0], inputs[1], inputs[2]
        if x.ndim != 4:
            from onnxhal.runtime.providers.cpu.kernel_factory import ReferenceKernel

            return ReferenceKernel(self.node, self.ctx, self.node.since_version or 19).compute(inputs)
        b = inputs[3] if len(inputs) > 3 else None
        mask = inputs[4] if len(inputs) > 4 else None
        n, c, h, wd = x.shape
        oc = w.shape[0]
        kh, kw = self.kernel_shape or w.shape[2:]
        k = kh * kw
        og = self.offset_group
        oh, ow = off.shape[2:]
        p = oh * ow
        off = off.reshape(n, og, k, 2, oh, ow).astype(np.float64)
        ki, kj = (a.reshape(-1) for a in np.indices((kh, kw)))
        base_y = (np.arange(oh) * self.strides[0] - self.pads[0]).reshape(1, 1, 1, oh, 1) + (
            ki * self.dilations[0]).reshape(1, 1, k, 1, 1)
        base_x = (np.arange(ow) * self.strides[1] - self.pads[1]).reshape(1, 1, 1, 1, ow) + (
            kj * self.dilations[1]).reshape(1, 1, k, 1, 1)
        py = (base_y + off[:, :, :, 0]).reshape(n, og, 1, k * p)
        px = (base_x + off[:, :, :, 1]).reshape(n, og, 1, k * p)
        y0, x0 = np.floor(py), np.floor(px)
        fy, fx = py - y0, px - x0
        cog = c // og
        xg = x.reshape(n, og, cog, h * wd)
        sampled = np.zeros((n, og, cog, k * p), dtype=x.dtype)
        for dy in (0, 1):
            for dx in (0, 1):
                yy, xx = y0 + dy, x0 + dx
                valid = (yy >= 0) & (yy < h) & (xx >= 0) & (xx < wd)
                weight = (fy if dy else 1 - fy) * (fx if dx else 1 - fx) * valid
                idx = (np.clip(yy, 0, h - 1) * wd + np.clip(xx, 0, wd - 1)).astype(np.intp)
                vals = np.take_along_axis(xg, np.broadcast_to(idx, (n, og, cog, k * p)), axis=3)
                sampled += vals * weight.astype(x.dtype)
        if mask is not None:
            sampled *= mask.reshape(n, og, 1, k * p).astype(x.dtype)
        g = self.group
        cols = sampled.reshape(n, g, (c // g) * k, p)  # channel-major, then tap: matches W's layout
        y = np.matmul(w.reshape(g, oc // g, (c // g) * k), cols).reshape(n, oc, oh, ow)
        if b is not None:
            y += b.reshape(1, oc, 1, 1)
        return [y]
