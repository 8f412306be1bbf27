"""Pooling: MaxPool and AveragePool as one vectorized max/add per kernel tap over strided slices
of the padded input; GlobalAveragePool/GlobalMaxPool as reductions. ``ceil_mode``, MaxPool's
Indices output and other rare forms are delegated to onnx.reference."""

from __future__ import annotations

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.runtime.providers.cpu.kernels.conv import ConvGeometry, pad_spatial
from onnxhal.runtime.providers.cpu.kernels.registry import register


def _tap_slices(idx, dil, strides, out):
    return (slice(None), slice(None)) + tuple(
        slice(idx[i] * dil[i], idx[i] * dil[i] + (out[i] - 1) * strides[i] + 1, strides[i]) for i in range(len(idx)))


class _Pool(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.geo = ConvGeometry(node)
        self.ref = None
        if self._needs_reference(node):
            from onnxhal.runtime.providers.cpu.kernel_factory import ReferenceKernel

            self.ref = ReferenceKernel(node, ctx, node.since_version or 19)

    def _needs_reference(self, node: Node) -> bool:
        return bool(node.attr("ceil_mode", 0))


@register("MaxPool", since=1)
class MaxPool(_Pool):
    def _needs_reference(self, node: Node) -> bool:
        return bool(node.attr("ceil_mode", 0)) or len([o for o in node.outputs if o]) > 1 or bool(
            node.attr("storage_order", 0))

    def compute(self, inputs: list) -> list:
        if self.ref is not None:
            return self.ref.compute(inputs)
        x = inputs[0]
        kernel, strides, dil, pb, pe, out = self.geo.resolve(x.shape[2:])
        low = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
        xp = pad_spatial(x, pb, pe, low)
        y = None
        for idx in np.ndindex(*kernel):
            v = xp[_tap_slices(idx, dil, strides, out)]
            y = v.copy() if y is None else np.maximum(y, v, out=y)
        return [y]


@register("AveragePool", since=1)
class AveragePool(_Pool):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        super().__init__(node, ctx)
        self.include_pad = bool(node.attr("count_include_pad", 0))

    def compute(self, inputs: list) -> list:
        if self.ref is not None:
            return self.ref.compute(inputs)
        x = inputs[0]
        kernel, strides, dil, pb, pe, out = self.geo.resolve(x.shape[2:])
        xp = pad_spatial(x, pb, pe, 0)
        y = None
        for idx in np.ndindex(*kernel):
            v = xp[_tap_slices(idx, dil, strides, out)]
            y = v.astype(x.dtype, copy=True) if y is None else np.add(y, v, out=y)
        padded = any(pb) or any(pe)
        if self.include_pad or not padded:
            y /= x.dtype.type(int(np.prod(kernel)))
            return [y]
        ones = pad_spatial(np.ones((1, 1) + x.shape[2:], dtype=x.dtype), pb, pe, 0)
        cnt = None
        for idx in np.ndindex(*kernel):
            v = ones[_tap_slices(idx, dil, strides, out)]
            cnt = v.copy() if cnt is None else cnt + v
        y /= cnt
        return [y]


class _GlobalPool(Kernel):
    fn = None

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        pass

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        return [np.asarray(self.fn(x, axis=tuple(range(2, x.ndim)), keepdims=True), dtype=x.dtype)]


register("GlobalAveragePool", since=1)(type("GlobalAveragePool", (_GlobalPool,), {"fn": staticmethod(np.mean)}))
register("GlobalMaxPool", since=1)(type("GlobalMaxPool", (_GlobalPool,), {"fn": staticmethod(np.max)}))


@register("GlobalLpPool", since=1)
class GlobalLpPool(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.p = node.attr("p", 2)

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        axes = tuple(range(2, x.ndim))
        s = np.sum(np.abs(x) ** self.p, axis=axes, keepdims=True)
        return [np.asarray(s ** (1.0 / self.p), dtype=x.dtype)]


@register("MaxRoiPool", since=1)
class MaxRoiPool(Kernel):
    """ROI max pooling (Caffe's ROIPooling): rois are [batch, x1, y1, x2, y2] in input pixels
    times ``spatial_scale``; each bin's max, 0 for an empty bin."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.ph, self.pw = node.attr("pooled_shape")
        self.scale = node.attr("spatial_scale", 1.0)

    def compute(self, inputs: list) -> list:
        x, rois = inputs
        _, c, h, w = x.shape
        y = np.zeros((rois.shape[0], c, self.ph, self.pw), dtype=x.dtype)
        for r, roi in enumerate(rois):
            b = int(roi[0])
            x1, y1, x2, y2 = (int(round(float(v) * self.scale)) for v in roi[1:5])
            rh, rw = max(y2 - y1 + 1, 1), max(x2 - x1 + 1, 1)
            bh, bw = rh / self.ph, rw / self.pw
            for i in range(self.ph):
                hs = min(max(int(np.floor(i * bh)) + y1, 0), h)
                he = min(max(int(np.ceil((i + 1) * bh)) + y1, 0), h)
                for j in range(self.pw):
                    ws = min(max(int(np.floor(j * bw)) + x1, 0), w)
                    we = min(max(int(np.ceil((j + 1) * bw)) + x1, 0), w)
                    if he > hs and we > ws:
                        y[r, :, i, j] = x[b, :, hs:he, ws:we].max(axis=(1, 2))
        return [y]
