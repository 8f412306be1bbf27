"""Pooling: MaxPool and AveragePool as one vectorized max/add per kernel tap over strided slices
of the padded input (``ceil_mode`` as extra end padding that never counts, MaxPool's Indices by
tracking the winning tap); GlobalAveragePool/GlobalMaxPool as reductions. Column-major Indices
(``storage_order=1``) are delegated to onnx.reference."""

from __future__ import annotations

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.runtime.providers.cpu.kernels.conv import ConvGeometry, pad_spatial, phase_taps, rows_to_output
from onnxhal.runtime.providers.cpu.kernels.registry import register


def _reduce_taps_2d(x: np.ndarray, pb, pe, value, out, kernel, strides, dil, op) -> np.ndarray:
    """``op`` (np.maximum or np.add) over the kernel taps of a 4-D input padded with ``value``, on
    contiguous rows (``phase_taps``): an (N, C, *out) array."""
    taps, wq = phase_taps(x, (pb[0], pb[1], pe[0], pe[1]), value, tuple(out), tuple(kernel), tuple(strides),
                          tuple(dil))
    if len(taps) == 1:
        return rows_to_output(taps[0], tuple(out), wq).copy()
    acc = op(taps[0], taps[1])
    for tap in taps[2:]:
        op(acc, tap, out=acc)
    return rows_to_output(acc, tuple(out), wq)


def _whole_window(x: np.ndarray, kernel, strides, dil, pb, pe) -> bool:
    """True when one unpadded window covers the whole spatial extent (a global pool)."""
    return (not any(pb) and not any(pe) and all(d == 1 for d in dil)
            and tuple(kernel) == tuple(x.shape[2:]))


def _tap_slices(idx, dil, strides, out):
    return (slice(None), slice(None)) + tuple(
        slice(idx[i] * dil[i], idx[i] * dil[i] + (out[i] - 1) * strides[i] + 1, strides[i]) for i in range(len(idx)))


class _Pool(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.geo = ConvGeometry(node)
        self.ceil = bool(node.attr("ceil_mode", 0)) and node.attr("auto_pad", "NOTSET") in ("NOTSET", "VALID")

    def geometry(self, spatial):
        """kernel, strides, dilations, pads begin, pads end (incl. ceil_mode's extra), output size,
        and the explicit pads end (what counts as padding for count_include_pad)."""
        kernel, strides, dil, pb, pe, out = self.geo.resolve(spatial)
        pe_explicit = list(pe)
        if self.ceil:
            pe = list(pe)
            for i in range(len(kernel)):
                span = (kernel[i] - 1) * dil[i] + 1
                o = -(-(spatial[i] + pb[i] + pe[i] - span) // strides[i]) + 1
                if (o - 1) * strides[i] >= spatial[i] + pb[i]:  # the last window must start inside
                    o -= 1
                out[i] = o
                pe[i] += max(0, (o - 1) * strides[i] + span - (spatial[i] + pb[i] + pe[i]))
        return kernel, strides, dil, pb, pe, out, pe_explicit


@register("MaxPool", since=1)
class MaxPool(_Pool):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        super().__init__(node, ctx)
        self.with_indices = len(node.outputs) > 1 and bool(node.outputs[1])
        self.ref = None
        if self.with_indices and node.attr("storage_order", 0):
            from onnxhal.runtime.providers.cpu.kernel_factory import ReferenceKernel

            self.ref = ReferenceKernel(node, ctx, node.since_version or 12)

    def compute(self, inputs: list) -> list:
        if self.ref is not None:
            return self.ref.compute(inputs)
        x = inputs[0]
        kernel, strides, dil, pb, pe, out, _ = self.geometry(x.shape[2:])
        if not self.with_indices and _whole_window(x, kernel, strides, dil, pb, pe):
            return [x.max(axis=tuple(range(2, x.ndim)), keepdims=True)]
        low = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
        if x.ndim == 4 and not self.with_indices:
            return [_reduce_taps_2d(x, pb, pe, low, out, kernel, strides, dil, np.maximum)]
        xp = pad_spatial(x, pb, pe, low)
        if self.with_indices:
            return list(self._with_indices(x, xp, kernel, strides, dil, pb, out))
        y = None
        for idx in np.ndindex(*kernel):
            v = xp[_tap_slices(idx, dil, strides, out)]
            y = v.copy() if y is None else np.maximum(y, v, out=y)
        return [y]

    @staticmethod
    def _with_indices(x, xp, kernel, strides, dil, pb, out):
        """Max and the row-major flat index (into the whole input) of its first occurrence."""
        nd = len(kernel)
        spatial = x.shape[2:]
        base = (np.arange(x.shape[0] * x.shape[1], dtype=np.int64) * int(np.prod(spatial))).reshape(
            (x.shape[0], x.shape[1]) + (1,) * nd)
        y = idx_best = None
        for tap in np.ndindex(*kernel):
            v = xp[_tap_slices(tap, dil, strides, out)]
            flat = np.zeros((1, 1) + tuple(out), dtype=np.int64)
            for i in range(nd):
                coord = np.arange(out[i], dtype=np.int64) * strides[i] + tap[i] * dil[i] - pb[i]
                shape = [1, 1] + [1] * nd
                shape[2 + i] = out[i]
                flat = flat * spatial[i] + coord.reshape(shape)
            if y is None:
                y, idx_best = v.copy(), np.broadcast_to(flat + base, v.shape).copy()
            else:
                better = v > y
                y = np.where(better, v, y)
                idx_best = np.where(better, flat + base, idx_best)
        return y, idx_best


@register("AveragePool", since=1)
class AveragePool(_Pool):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        super().__init__(node, ctx)
        self.include_pad = bool(node.attr("count_include_pad", 0))
        self._divisors: dict[tuple, np.ndarray] = {}  # per (spatial shape, dtype); kernels are shared by runs

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        kernel, strides, dil, pb, pe, out, pe_explicit = self.geometry(x.shape[2:])
        if _whole_window(x, kernel, strides, dil, pb, pe):
            return [np.asarray(x.mean(axis=tuple(range(2, x.ndim)), keepdims=True), dtype=x.dtype)]
        if x.ndim == 4:
            y = _reduce_taps_2d(x, pb, pe, 0, out, kernel, strides, dil, np.add)
        else:
            xp = pad_spatial(x, pb, pe, 0)
            y = None
            for idx in np.ndindex(*kernel):
                v = xp[_tap_slices(idx, dil, strides, out)]
                y = v.astype(x.dtype, copy=True) if y is None else np.add(y, v, out=y)
        padded = any(pb) or any(pe)
        if not padded:
            y /= x.dtype.type(int(np.prod(kernel)))
            return [y]
        key = (x.shape[2:], x.dtype)
        cnt = self._divisors.get(key)
        if cnt is None:
            if len(self._divisors) > 64:  # many input shapes (dynamic axes): keep the cache bounded
                self._divisors.clear()
            cnt = self._divisors[key] = self._divisor(x, kernel, strides, dil, pb, pe, pe_explicit, out)
        y /= cnt
        return [y]

    def _divisor(self, x, kernel, strides, dil, pb, pe, pe_explicit, out) -> np.ndarray:
        """Per output position, the taps that land on counted positions (the input, plus the
        explicit pads with count_include_pad); ceil_mode's extra end padding never counts."""
        if self.include_pad:
            counted = np.ones((1, 1) + tuple(s + b + e for s, b, e in zip(x.shape[2:], pb, pe_explicit)), x.dtype)
            ones = pad_spatial(counted, [0] * len(pb), [e - ee for e, ee in zip(pe, pe_explicit)], 0)
        else:
            ones = pad_spatial(np.ones((1, 1) + x.shape[2:], dtype=x.dtype), pb, pe, 0)
        cnt = None
        for idx in np.ndindex(*kernel):
            v = ones[_tap_slices(idx, dil, strides, out)]
            cnt = v.copy() if cnt is None else cnt + v
        return cnt


@register("LpPool", since=1)
class LpPool(_Pool):
    """(sum over the window of |x|**p) ** (1/p); padding contributes zeros."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        super().__init__(node, ctx)
        self.p = node.attr("p", 2)

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        kernel, strides, dil, pb, pe, out, _ = self.geometry(x.shape[2:])
        xp = pad_spatial(np.abs(x) ** x.dtype.type(self.p), pb, pe, 0)
        y = None
        for idx in np.ndindex(*kernel):
            v = xp[_tap_slices(idx, dil, strides, out)]
            y = v.copy() if y is None else np.add(y, v, out=y)
        return [np.asarray(y ** x.dtype.type(1.0 / self.p), dtype=x.dtype)]


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
