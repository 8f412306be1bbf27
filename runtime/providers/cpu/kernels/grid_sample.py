"""GridSample (opset 16, N-d from 20): nearest and (bi/multi)linear sampling vectorized over the
whole grid, with zeros/border/reflection padding and both align_corners conventions, following
onnx.reference's rules (which loop per output element: minutes on a feature map). 2-D cubic is
PyTorch's and onnxruntime's (``GridSample._cubic``); cubic over other ranks goes to onnx.reference."""

from __future__ import annotations

import itertools
import math

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels.native_kernels import native_module
from onnxhal.runtime.providers.cpu.kernels.registry import register
from onnxhal.runtime.providers.path_tables import path_table

_MODES = {"bilinear": "linear", "bicubic": "cubic"}

REFLECT_PATHS = path_table("GridSample.reflection", "reflect_by_borders: onnx.reference's reflection, by the "
                                                    "nearer border, counted")
REFLECT_BY_BORDERS = REFLECT_PATHS.add("reflect_by_borders", "canonical: REFLECT_FOLDED_ENABLED off")
REFLECT_FOLDED = REFLECT_PATHS.add("reflect_folded", "padding_mode reflection, every grid: a position's offset from "
                                                     "the low border modulo twice the range, folded back above the "
                                                     "range (4 array operations where the canonical form takes 10)")
#: switch of ``reflect_folded`` (tests compare it with the canonical form)
REFLECT_FOLDED_ENABLED = True

LINEAR_PATHS = path_table("GridSample.linear", "corners: the numpy form, each axis's two sides once, then the 2^nd "
                                               "corners' gathers and weighted sums")
CORNERS = LINEAR_PATHS.add("corners", "canonical: every other case (other dtypes or ranks, NaN or far coordinates, "
                                      "no C module, NATIVE_GRID_SAMPLE_ENABLED off)")
NATIVE_BILINEAR = LINEAR_PATHS.add(
    "native_bilinear", "the C extension _native is built, ONNXHAL_NATIVE_KERNELS is not 0 and "
                       "NATIVE_GRID_SAMPLE_ENABLED at kernel build and at the run, linear mode over a 4-D float32 "
                       "input and grid, any padding (reflection while REFLECT_FOLDED_ENABLED): one C pass, each "
                       "point's four corners and weights made once for all channels, corners' float64 and "
                       "float32 operations in their order (so their bits); it declines, and the corners run, "
                       "where a coordinate is not finite or beyond 2^40")
#: switch of ``native_bilinear`` (read when the kernel is made and at each run)
NATIVE_GRID_SAMPLE_ENABLED = True
_PADDING_CODES = {"zeros": 0, "border": 1, "reflection": 2}


def _reflect(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Reflect ``x`` into [lo, hi]: ``reflect_folded`` where enabled, else the canonical form."""
    if REFLECT_FOLDED_ENABLED:
        return reflect_folded(x, lo, hi)
    return reflect_by_borders(x, lo, hi)


def reflect_folded(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Reflection as a fold: the offset from ``lo`` modulo 2 * range, mirrored where past the range
    (a period of the reflections is two ranges)."""
    rng = hi - lo
    if rng <= 0:
        return np.full_like(x, lo)
    t = np.mod(x - lo, 2 * rng)
    return lo + np.where(t > rng, 2 * rng - t, t)


def reflect_by_borders(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Reflect by the nearer border until inside [lo, hi] (onnx.reference's _gs_reflect)."""
    rng = hi - lo
    if rng <= 0:
        return np.full_like(x, lo)
    below, above = x < lo, x > hi
    d = np.where(below, lo - x, np.where(above, x - hi, 0.0))
    n = np.trunc(d / rng)
    r = d - n * rng
    even = (n % 2) == 0
    from_low = np.where(even, lo + r, hi - r)
    from_high = np.where(even, hi - r, lo + r)
    return np.where(below, from_low, np.where(above, from_high, x))


def _cubic_weights(t: np.ndarray, a: float = -0.75) -> list:
    """Cubic convolution weights of the taps at -1, 0, 1 and 2 for a fraction ``t`` in [0, 1)."""
    def near(s):
        return ((a + 2) * s - (a + 3)) * s * s + 1

    def far(s):
        return ((a * s - 5 * a) * s + 8 * a) * s - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


@register("GridSample", since=16)
class GridSample(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        mode = node.attr("mode", "linear" if node.since_version >= 20 else "bilinear")
        self.mode = _MODES.get(mode, mode)
        self.padding = node.attr("padding_mode", "zeros")
        self.align = bool(node.attr("align_corners", 0))
        self.ref = None
        self.node, self.ctx = node, ctx
        self.native = native_module() if NATIVE_GRID_SAMPLE_ENABLED and self.mode == "linear" else None
        self.last_path = ""  #: the path the last linear run took (tests read it)

    def _reference(self):
        """onnx.reference's GridSample, for cubic over a rank other than 2 (built on first use)."""
        if self.ref is None:
            from onnx import helper

            from onnxhal.runtime.providers.cpu.kernel_factory import ReferenceKernel

            proto = self.node.to_proto()
            for a in proto.attribute:  # onnx.reference knows only the opset-20 mode names
                if a.name == "mode":
                    a.CopyFrom(helper.make_attribute("mode", "cubic"))
            ref_node = Node.from_proto(proto)
            ref_node.since_version = self.node.since_version
            self.ref = ReferenceKernel(ref_node, self.ctx, self.node.since_version or 20)
        return self.ref

    def _index(self, i: np.ndarray, d: int, lo: float, hi: float):
        """Integer positions -> (clamped index, in-bounds mask) under the padding mode."""
        if self.padding == "zeros":
            return np.clip(i, 0, d - 1), (i >= 0) & (i < d)
        if self.padding == "border":
            return np.clip(i, 0, d - 1), None
        return np.clip(_reflect(i.astype(np.float64), lo, hi).astype(np.int64), 0, d - 1), None

    def compute(self, inputs: list) -> list:
        x, grid = inputs[0], inputs[1]
        if self.mode == "cubic":
            return [self._cubic(x, grid)] if x.ndim == 4 else self._reference().compute(inputs)
        y = self._native_bilinear(x, grid) if self.mode == "linear" else None
        if y is not None:
            return [y]
        dims = x.shape[2:]
        nd = len(dims)
        n_idx = np.arange(x.shape[0]).reshape((-1,) + (1,) * (grid.ndim - 2))
        coords, bounds = [], []
        for i, d in enumerate(dims):
            g = grid[..., nd - 1 - i].astype(np.float64)  # grid holds (x, y, ...): reversed axes
            c = (g + 1) / 2.0 * (d - 1) if self.align else ((g + 1) * d - 1) / 2.0
            c = c.astype(np.float32).astype(np.float64)
            lo, hi = (0.0, d - 1.0) if self.align else (-0.5, d - 0.5)
            if self.mode == "nearest":
                c = np.rint(c)
            if self.padding == "border":
                c = np.where((c < lo) | (c > hi), np.clip(c, 0, d - 1), c)
            elif self.padding == "reflection":
                c = _reflect(c, lo, hi)
            coords.append(c)
            bounds.append((lo, hi))
        if self.mode == "nearest":
            idx, valid = [], None
            for c, d, (lo, hi) in zip(coords, dims, bounds):
                k, ok = self._index(np.trunc(c).astype(np.int64), d, lo, hi)
                idx.append(k)
                valid = ok if valid is None else (valid if ok is None else valid & ok)
            y = self._gather(x, n_idx, idx)
            if valid is not None:
                y = y * valid[..., None]
            return [np.moveaxis(y, -1, 1).astype(x.dtype, copy=False)]
        self.last_path = CORNERS
        # Per axis, each side's (index, in-bounds mask) and weight made once (not once per corner:
        # 2^nd corners share them), and the input laid out once as rows of channels that one flat
        # index per corner takes: the same values, summed in the same order, as per-corner work.
        sides = []
        for c, d, (lo, hi) in zip(coords, dims, bounds):
            f = np.floor(c)
            frac = c - f
            f = f.astype(np.int64)
            sides.append([(*self._index(f, d, lo, hi), 1.0 - frac), (*self._index(f + 1, d, lo, hi), frac)])
        rows = np.ascontiguousarray(np.moveaxis(x, 1, -1)).reshape(-1, x.shape[1])
        base = n_idx * math.prod(dims)
        strides = [math.prod(dims[i + 1:]) for i in range(nd)]
        acc = np.float32 if x.dtype != np.float64 else x.dtype
        y = 0.0
        for corner in itertools.product((0, 1), repeat=nd):
            w = 1.0
            flat, valid = base, None
            for i, bit in enumerate(corner):
                k, ok, wi = sides[i][bit]
                w = w * wi
                flat = flat + k * strides[i]
                valid = ok if valid is None else (valid if ok is None else valid & ok)
            if valid is not None:
                w = w * valid
            y = y + rows[flat] * w[..., None].astype(acc)
        return [np.ascontiguousarray(np.moveaxis(y, -1, 1)).astype(x.dtype, copy=False)]

    def _native_bilinear(self, x: np.ndarray, grid: np.ndarray) -> np.ndarray | None:
        """Path ``native_bilinear``: the output, or None where it does not apply or declines."""
        if (self.native is None or not NATIVE_GRID_SAMPLE_ENABLED or x.dtype != np.float32
                or grid.dtype != np.float32 or x.ndim != 4 or grid.ndim != 4 or grid.shape[-1] != 2
                or grid.shape[0] != x.shape[0] or x.shape[2] == 0 or x.shape[3] == 0
                or (self.padding == "reflection" and not REFLECT_FOLDED_ENABLED)):
            return None
        n, c, h, w = x.shape
        gh, gw = grid.shape[1], grid.shape[2]
        out = np.empty((n, c, gh, gw), np.float32)
        if not self.native.grid_sample_linear(out, np.ascontiguousarray(x), np.ascontiguousarray(grid), n, c, h, w,
                                              gh, gw, int(self.align), _PADDING_CODES[self.padding]):
            return None
        self.last_path = NATIVE_BILINEAR
        return out

    def _cubic(self, x: np.ndarray, grid: np.ndarray) -> np.ndarray:
        """Bicubic (A = -0.75) over the 4x4 taps around each point, as PyTorch's grid_sample and
        onnxruntime: the point itself is not moved by the padding mode; each tap is (clamped to
        the border, reflected, or zero outside). onnx.reference moves the point first, which gives
        other values near the border and divides by zero on a 1-pixel axis with align_corners."""
        dims = x.shape[2:]
        n_idx = np.arange(x.shape[0]).reshape(-1, 1, 1)
        taps, weights = [], []
        for i, d in enumerate(dims):
            g = grid[..., 1 - i].astype(np.float64)
            c = (g + 1) / 2.0 * (d - 1) if self.align else ((g + 1) * d - 1) / 2.0
            c = c.astype(np.float32).astype(np.float64)
            f = np.floor(c)
            t = c - f
            bounds = (0.0, d - 1.0) if self.align else (-0.5, d - 0.5)
            taps.append([self._index(f.astype(np.int64) + k, d, *bounds) for k in (-1, 0, 1, 2)])
            weights.append(_cubic_weights(t))
        acc = np.float32 if x.dtype != np.float64 else np.float64
        y = 0.0
        for (iy, oky), wy in zip(taps[0], weights[0]):
            for (ix, okx), wx in zip(taps[1], weights[1]):
                w = wy * wx
                ok = oky if okx is None else (okx if oky is None else oky & okx)
                if ok is not None:
                    w = w * ok
                y = y + self._gather(x, n_idx, [iy, ix]) * w[..., None].astype(acc)
        return np.ascontiguousarray(np.moveaxis(np.asarray(y), -1, 1)).astype(x.dtype, copy=False)

    @staticmethod
    def _gather(x: np.ndarray, n_idx: np.ndarray, idx: list) -> np.ndarray:
        """x[n, :, i0, i1, ...] for every grid position -> (N, *grid_out, C)."""
        xc = np.moveaxis(x, 1, -1)  # (N, *dims, C)
        return xc[(n_idx, *idx)]


_BASES_MAX = 8  # output sizes whose positions an AffineGrid keeps


def _base_coords(n: int, align: bool) -> np.ndarray:
    """Normalized pixel positions along an axis of n pixels. With align_corners a 1-pixel axis is
    at 0, as PyTorch's affine_grid, which the operator exports; onnxruntime 1.32 puts it at 1 and
    onnx.reference at -1 (docs/cpu-ep-random-cases.md, the table of deliberate differences)."""
    if align:
        return np.linspace(-1.0, 1.0, n) if n > 1 else np.zeros(n)
    return (2.0 * np.arange(n) + 1.0) / n - 1.0


@register("AffineGrid", since=20)
class AffineGrid(Kernel):
    """The sampling grid of an affine transform: (N, H, W, 2) from theta (N, 2, 3) and size
    (N, C, H, W), or (N, D, H, W, 3) from (N, 3, 4) and (N, C, D, H, W)."""

    host_inputs = frozenset({1})

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.align = bool(node.attr("align_corners", 0))
        self.bases: dict = {}

    def _base(self, dims: list, nd: int, wt: np.dtype) -> np.ndarray:
        """The homogeneous pixel positions (x, y[, z], 1) of an output of ``dims``, [prod(dims), nd + 1]."""
        axes = [_base_coords(d, self.align) for d in dims]  # D, H, W order
        mesh = np.meshgrid(*axes, indexing="ij")
        base = np.stack([*mesh[::-1], np.ones_like(mesh[0])], -1)  # (..., x, y[, z], 1)
        base = base.reshape(-1, nd + 1).astype(wt)
        base.flags.writeable = False
        return base

    def compute(self, inputs: list) -> list:
        theta, size = inputs[0], [int(v) for v in inputs[1]]
        nd = len(size) - 2
        if nd not in (2, 3) or theta.shape[1:] != (nd, nd + 1) or theta.shape[0] != size[0]:
            raise InvalidArgument(f"AffineGrid: theta {list(theta.shape)} and size {size}; give theta (N, 2, 3) with "
                                  "size (N, C, H, W), or (N, 3, 4) with (N, C, D, H, W).")
        wt = np.promote_types(theta.dtype, np.float32)
        key = (tuple(size[2:]), wt)
        base = self.bases.get(key)
        if base is None:  # the grid's positions depend on the size alone: made once per size
            if len(self.bases) >= _BASES_MAX:
                self.bases.clear()
            base = self.bases[key] = self._base(size[2:], nd, wt)
        grid = base @ np.swapaxes(theta.astype(wt), 1, 2)
        return [grid.reshape(size[0], *size[2:], nd).astype(theta.dtype, copy=False)]
