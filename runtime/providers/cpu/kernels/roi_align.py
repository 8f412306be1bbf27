"""RoiAlign (opsets 10, 16): per ROI, the bilinear samples of all channels at once (separable
interpolation for ``avg``; the four weighted corners for ``max``, as ORT and onnx.reference
define it), with their boundary rules, in float32 coordinates like theirs."""

from __future__ import annotations

import math

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.run_control import check_terminate
from onnxhal.runtime.providers.cpu.kernels.registry import register


def _axis_samples(start: np.float32, bin_size: np.float32, pooled: int, grid: int, length: int):
    """Sample coordinates along one axis -> (low, high, low weight, high weight, valid)."""
    p = np.arange(pooled, dtype=np.float32).reshape(-1, 1)
    i = np.arange(grid, dtype=np.float32).reshape(1, -1)
    v = (start + p * bin_size + (i + np.float32(0.5)) * bin_size / np.float32(grid)).reshape(-1)
    valid = (v >= -1.0) & (v <= length)
    v = np.maximum(v, 0)
    low = v.astype(np.int64)
    at_end = low >= length - 1
    low = np.where(at_end, length - 1, low)
    high = np.where(at_end, length - 1, low + 1)
    v = np.where(at_end, low.astype(np.float32), v)
    frac = (v - low).astype(np.float32)
    return low, high, 1 - frac, frac, valid


@register("RoiAlign", since=10)
class RoiAlign(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.mode = node.attr("mode", "avg")
        self.oh = node.attr("output_height", 1)
        self.ow = node.attr("output_width", 1)
        self.ratio = node.attr("sampling_ratio", 0)
        self.scale = node.attr("spatial_scale", 1.0)
        default = "half_pixel" if node.since_version >= 16 else "output_half_pixel"
        self.half_pixel = node.attr("coordinate_transformation_mode", default) == "half_pixel"

    def compute(self, inputs: list) -> list:
        x, rois, batch_idx = inputs
        n_rois, c = rois.shape[0], x.shape[1]
        h, w = x.shape[2:]
        out = np.zeros((n_rois, c, self.oh, self.ow), dtype=x.dtype)
        offset = np.float32(0.5 if self.half_pixel else 0.0)
        scale = np.float32(self.scale)
        for r in range(n_rois):
            check_terminate()  # one ROI's gathers per read
            x1, y1, x2, y2 = (np.float32(v) * scale - offset for v in rois[r, :4])
            rw, rh = x2 - x1, y2 - y1
            if not self.half_pixel:  # malformed ROIs are forced to 1x1
                rw, rh = max(rw, np.float32(1)), max(rh, np.float32(1))
            bh, bw = np.float32(rh / self.oh), np.float32(rw / self.ow)
            gh = self.ratio if self.ratio > 0 else int(math.ceil(rh / self.oh))
            gw = self.ratio if self.ratio > 0 else int(math.ceil(rw / self.ow))
            if gh <= 0 or gw <= 0:
                continue  # no samples: the output stays 0
            yl, yh, wyl, wyh, vy = _axis_samples(y1, bh, self.oh, gh, h)
            xl, xh, wxl, wxh, vx = _axis_samples(x1, bw, self.ow, gw, w)
            img = x[int(batch_idx[r])]
            valid = (vy[:, None] & vx[None, :]).astype(x.dtype)
            if self.mode == "avg":
                rows = img[:, yl, :] * wyl[:, None] + img[:, yh, :] * wyh[:, None]  # (C, Ny, W)
                vals = (rows[:, :, xl] * wxl + rows[:, :, xh] * wxh) * valid
                out[r] = vals.reshape(c, self.oh, gh, self.ow, gw).sum(axis=(2, 4)) / max(gh * gw, 1)
            else:
                corners = [img[:, yl][:, :, xl] * (wyl[:, None] * wxl), img[:, yl][:, :, xh] * (wyl[:, None] * wxh),
                           img[:, yh][:, :, xl] * (wyh[:, None] * wxl), img[:, yh][:, :, xh] * (wyh[:, None] * wxh)]
                vals = np.maximum.reduce(corners) * valid
                out[r] = vals.reshape(c, self.oh, gh, self.ow, gw).max(axis=(2, 4))
        return [out]
