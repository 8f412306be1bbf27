"""Resize (opset 11+): nearest, linear and cubic modes natively, one axis at a time (a gather per
axis, a lerp for linear, four weighted taps for cubic), in the input's float type. Coordinates
follow the spec's coordinate transformation modes as onnx.reference maps them, except two, where
onnxruntime's reading is kept: ``pytorch_half_pixel`` at an output length of 1 samples 0 by the
integer output length (the spec and PyTorch too; onnx.reference takes scale * length and samples
-0.5), and ``align_corners`` divides by the integer output length less 1 (onnx.reference and the
spec's backend cases by scale * length less 1, which differs where that is fractional). Antialias,
tf_crop_and_resize and linear or cubic on integer tensors are delegated to onnx.reference.
Upsample (opsets 7 and 9) runs on the same native path."""

from __future__ import annotations

import functools

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels.registry import register


def _source_coords(mode: str, out_len: int, in_len: int, scale: float, dtype: type = np.float64) -> np.ndarray:
    """The input coordinate of each output index along one axis: the spec's formulas for the
    coordinate transformation modes (as onnx.reference's ``_compute_x_ori`` computes them, whose
    import would pull in all of onnx.reference's operators, tens of milliseconds at a process's
    first Resize). ``length_resized`` is ``scale * in_len``, a float, as there, except for
    ``align_corners``, which divides by the integer output length as onnxruntime does.

    ``dtype`` float32 computes each formula in float32, step by step as onnxruntime's CPU EP does
    (upsamplebase.h, GetOriginalCoordinateFromResizedCoordinate): nearest mode picks an index, and
    float64 lands on the other side of a rounding boundary where float32 does not (half_pixel at
    scale 0.6: (1 + 0.5) / 0.6 - 0.5 is 2.0 in float64, 1.9999998 in float32, floor 2 against 1)."""
    y = np.arange(out_len, dtype=dtype)
    half, scale_t = dtype(0.5), dtype(scale)
    if mode == "tf_half_pixel_for_nn":
        return (y + half) / scale_t
    if mode == "pytorch_half_pixel":  # the spec: length_resized > 1 ? ... : 0, by the integer length
        return (y + half) / scale_t - half if out_len > 1 else np.zeros(out_len, dtype)
    if mode == "half_pixel":
        return (y + half) / scale_t - half
    if mode == "asymmetric":
        return y / scale_t
    if mode == "align_corners":
        # by the integer output length, as onnxruntime (upsamplebase.h's ALIGN_CORNERS mapping gets
        # the output dim as length_resized): the spec's backend cases take scale * length, which
        # differs where that is fractional
        return np.zeros(out_len, dtype) if out_len == 1 else y * dtype(in_len - 1) / dtype(out_len - 1)
    resized = scale * in_len
    if mode == "half_pixel_symmetric":  # (onnxruntime computes this one in double, then rounds to float)
        offset = in_len / 2 * (1 - out_len / resized)
        return (offset + (np.arange(out_len, dtype=np.float64) + 0.5) / scale - 0.5).astype(dtype)
    raise InvalidArgument(f"Resize: coordinate_transformation_mode {mode!r} is not one of half_pixel, "
                          "half_pixel_symmetric, pytorch_half_pixel, align_corners, asymmetric, "
                          "tf_half_pixel_for_nn, tf_crop_and_resize; use one of those.")


def _nearest_index(x: np.ndarray, nearest_mode: str, in_len: int) -> np.ndarray:
    lo = np.floor(x)
    frac = x - lo
    if nearest_mode == "round_prefer_ceil":
        idx = np.where(frac < 0.5, lo, lo + 1)
    elif nearest_mode == "floor":
        idx = lo
    elif nearest_mode == "ceil":
        idx = np.ceil(x)
    else:  # round_prefer_floor (the default)
        idx = np.where(frac <= 0.5, lo, lo + 1)
    idx = np.where(frac == 0, x, idx)
    return np.clip(idx, 0, in_len - 1).astype(np.intp)


@register("Resize", since=11)
class Resize(Kernel):
    host_inputs = frozenset({1, 2, 3})

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.mode = node.attr("mode", "nearest")
        self.coord_mode = node.attr("coordinate_transformation_mode", "half_pixel")
        self.nearest_mode = node.attr("nearest_mode", "round_prefer_floor")
        self.axes = node.attr("axes")
        self.cubic_a = float(node.attr("cubic_coeff_a", -0.75))
        self.exclude_outside = bool(node.attr("exclude_outside", 0))
        self.policy = node.attr("keep_aspect_ratio_policy", "stretch")
        self.antialias = bool(node.attr("antialias", 0)) and self.mode in ("linear", "cubic")
        native = (self.mode in ("nearest", "linear", "cubic") and (self.mode != "nearest" or not node.attr("antialias", 0))
                  and self.coord_mode != "tf_crop_and_resize"
                  and self.policy in ("stretch", "not_larger", "not_smaller"))
        self.ref = None
        self.node, self.ctx = node, ctx
        if not native:
            self.ref = self._reference()

    def _reference(self):
        from onnxhal.runtime.providers.cpu.kernel_factory import ReferenceKernel

        return ReferenceKernel(self.node, self.ctx, self.node.since_version or 19)

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        if self.ref is not None:
            return self.ref.compute(inputs)
        if self.mode != "nearest" and x.dtype.kind != "f":
            return self._reference().compute(inputs)  # integer rounding/saturation: reference
        n = len(inputs)
        scales = inputs[2] if n > 2 and inputs[2] is not None and inputs[2].size else None
        sizes = inputs[3] if n > 3 and inputs[3] is not None and inputs[3].size else None
        rank = x.ndim
        axes = [a + rank if a < 0 else a for a in self.axes] if self.axes else list(range(rank))
        for name, v in (("scales", scales), ("sizes", sizes)):
            if v is not None and (v.ndim != 1 or v.shape[0] != len(axes)):  # as onnxruntime refuses it
                raise InvalidArgument(f"Resize node {self.node.name!r}: {name} has shape {list(v.shape)}; it must be "
                                      f"1-D with one entry per resized axis ({len(axes)} for an input of rank {rank}).")
        scale_list = [1.0] * rank
        out_shape = list(x.shape)
        if sizes is not None and self.policy != "stretch":
            # one scale for every resized axis, the largest that fits (not_larger) or the smallest
            # that covers (not_smaller) the sizes; lengths rounded half up, as the spec
            ratios = [int(sizes[i]) / x.shape[a] for i, a in enumerate(axes)]
            common = min(ratios) if self.policy == "not_larger" else max(ratios)
            for a in axes:
                scale_list[a] = common
                out_shape[a] = int(np.floor(common * x.shape[a] + 0.5))
        else:
            for i, a in enumerate(axes):
                # in float32, as onnxruntime (upsamplebase.h: the scale of sizes is a float32
                # division, the length of scales a float32 product truncated): 10 x 0.7 is 7, where
                # float64's 6.9999998 truncates to 6
                if sizes is not None:
                    out_shape[a] = int(sizes[i])
                    scale_list[a] = float(np.float32(out_shape[a]) / np.float32(x.shape[a])) if x.shape[a] else 1.0
                else:
                    scale_list[a] = float(scales[i])
                    out_shape[a] = int(np.float32(scales[i]) * np.float32(x.shape[a]))
        if out_shape == list(x.shape):  # onnxruntime copies the input whatever the scales (upsample.cc)
            return [x.copy()]
        if self.antialias:
            return [resize_antialias(x, axes, out_shape, scale_list, self.mode, self.coord_mode, self.cubic_a,
                                     self.exclude_outside)]
        return [resize_axes(x, axes, out_shape, scale_list, self.mode, self.coord_mode, self.nearest_mode,
                            self.cubic_a, self.exclude_outside)]


@register("Upsample", since=7)
class Upsample(Kernel):
    """Upsample (opsets 7 and 9, deprecated at 10): Resize with ``asymmetric`` coordinates and
    ``floor`` nearest rounding, the output length floor(scale * length). onnx.reference implements
    only integer nearest scales."""

    host_inputs = frozenset({1})

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.mode = node.attr("mode", "nearest")
        if self.mode not in ("nearest", "linear", "bilinear"):
            raise InvalidArgument(f"Upsample node {node.name!r}: mode {self.mode!r}; use nearest or linear.")
        self.mode = "linear" if self.mode == "bilinear" else self.mode
        self.scales = node.attr("scales")

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        scales = [float(v) for v in (inputs[1] if len(inputs) > 1 and inputs[1] is not None else self.scales)]
        if len(scales) != x.ndim or min(scales) < 1:
            raise InvalidArgument(f"Upsample: scales {scales} for an input of rank {x.ndim}; give one scale >= 1 per "
                                  "axis.")
        out_shape = [int(np.float32(sc) * np.float32(d)) for d, sc in zip(x.shape, scales)]  # onnxruntime's float32
        if out_shape == list(x.shape):  # onnxruntime copies the input whatever the scales
            return [x.copy()]
        if self.mode == "linear" and x.dtype.kind != "f":
            y = resize_axes(x.astype(np.float64), list(range(x.ndim)), out_shape, scales, "linear", "asymmetric", "floor")
            return [np.rint(y).astype(x.dtype)]
        return [resize_axes(x, list(range(x.ndim)), out_shape, scales, self.mode, "asymmetric", "floor")]


def _cubic_taps(coords: np.ndarray, in_len: int, a: float, exclude_outside: bool) -> tuple[list, np.ndarray]:
    """Keys' cubic convolution (coefficient ``a``) at ``coords``: the four tap indices (clamped to
    the edge) and their weights, shape (4, out_len); with ``exclude_outside`` the taps outside the
    input weigh 0 and the rest are renormalized, as the spec and onnxruntime."""
    lo = np.floor(coords)
    t = coords - lo
    dist = np.stack([1 + t, t, 1 - t, 2 - t])
    near = (((a + 2) * dist - (a + 3)) * dist * dist) + 1
    far = ((a * dist - 5 * a) * dist + 8 * a) * dist - 4 * a
    w = np.where(dist <= 1, near, far)
    taps = lo[None, :] + np.arange(-1, 3)[:, None]
    if exclude_outside:
        w = np.where((taps < 0) | (taps > in_len - 1), 0.0, w)
        w = w / w.sum(axis=0, keepdims=True)
    return [np.clip(k, 0, in_len - 1).astype(np.intp) for k in taps], w


def resize_axes(x: np.ndarray, axes: list, out_shape: list, scale_list: list, mode: str, coord_mode: str,
                nearest_mode: str, cubic_a: float = -0.75, exclude_outside: bool = False) -> np.ndarray:
    """Nearest, linear or cubic resize of ``x`` to ``out_shape``, one axis at a time."""
    y = x
    rank = x.ndim
    for a in axes:
        in_len, out_len = x.shape[a], out_shape[a]
        if out_len == in_len and scale_list[a] == 1.0:
            continue
        if mode == "nearest":  # an index: float32 steps, onnxruntime's (``_source_coords``)
            coords = _source_coords(coord_mode, out_len, in_len, scale_list[a], np.float32)
            y = np.take(y, _nearest_index(coords, nearest_mode, in_len), axis=a)
            continue
        coords = _source_coords(coord_mode, out_len, in_len, scale_list[a])
        shape = [1] * rank
        shape[a] = out_len
        if mode == "cubic":
            taps, weights = _cubic_taps(coords, in_len, cubic_a, exclude_outside)
            acc = np.take(y, taps[0], axis=a) * weights[0].astype(x.dtype).reshape(shape)
            for k in range(1, 4):
                acc += np.take(y, taps[k], axis=a) * weights[k].astype(x.dtype).reshape(shape)
            y = acc
            continue
        lo = np.floor(coords)
        w = (coords - lo).astype(x.dtype)
        i0 = np.clip(lo, 0, in_len - 1).astype(np.intp)
        i1 = np.clip(lo + 1, 0, in_len - 1).astype(np.intp)
        w = w.reshape(shape)
        y0 = np.take(y, i0, axis=a)
        y = y0 + (np.take(y, i1, axis=a) - y0) * w
    return np.ascontiguousarray(y)


def _antialias_coefficients(ratios: np.ndarray, scale: float, mode: str, a: float) -> np.ndarray:
    """Per output position (rows), the taps' weights of the filter widened by 1/scale when
    downscaling: the triangle (linear) or Keys' cubic (coefficient ``a``), each row normalized, as
    the specification's reference (``ratio`` in (0, 1], the fraction past the tap left of the
    source coordinate)."""
    scale = min(scale, 1.0)
    reach = 1 if mode == "linear" else 2
    start = int(np.floor(-reach / scale) + 1)
    taps = np.arange(start, 2 - start)
    d = np.abs((taps[None, :] - ratios[:, None]) * scale)
    if mode == "linear":
        w = np.clip(1 - d, 0, 1)
    else:
        w = np.where(d <= 1, ((a + 2) * d - (a + 3)) * d * d + 1,
                     np.where(d < 2, ((a * d - 5 * a) * d + 8 * a) * d - 4 * a, 0.0))
    return w / w.sum(axis=1, keepdims=True)


@functools.lru_cache(maxsize=64)  # per geometry: a model resizes the same shapes run after run
def antialias_matrix(out_len: int, in_len: int, scale: float, mode: str, coord_mode: str, cubic_a: float = -0.75,
                     exclude_outside: bool = False, dtype: type = np.float64) -> np.ndarray:
    """[out_len, in_len] weights of an antialiased linear or cubic resize along one axis: the
    specification's taps nearest each source coordinate (edge-clamped, or with ``exclude_outside``
    dropped and the rest renormalized), summed per input cell; float64."""
    coords = _source_coords(coord_mode, out_len, in_len, scale)
    lo = np.floor(coords)
    ratios = np.where(coords == lo, 1.0, coords - lo)  # prefer the tap left of an exact position
    coeffs = _antialias_coefficients(ratios, scale, mode, cubic_a)
    n = coeffs.shape[1]
    pad = -(-n // 2)
    padded = coords + pad
    base = np.floor(padded)
    frac = padded - base
    if n % 2 == 0:  # the n nearest cells, ties to the smaller index
        offset = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        offset = np.where(frac <= 0.5, -((n - 1) // 2), -((n - 1) // 2) + 1)
    idx = (base + offset).astype(np.int64)[:, None] + np.arange(n)[None, :] - pad
    if exclude_outside:
        coeffs = np.where((idx < 0) | (idx >= in_len), 0.0, coeffs)
        total = coeffs.sum(axis=1, keepdims=True)
        coeffs = coeffs / np.where(total == 0, 1.0, total)
    matrix = np.zeros((out_len, in_len))
    np.add.at(matrix, (np.repeat(np.arange(out_len), n), np.clip(idx, 0, in_len - 1).reshape(-1)), coeffs.reshape(-1))
    matrix = matrix.astype(dtype)
    matrix.flags.writeable = False  # shared by the cache
    return matrix


def resize_antialias(x: np.ndarray, axes: list, out_shape: list, scale_list: list, mode: str, coord_mode: str,
                     cubic_a: float = -0.75, exclude_outside: bool = False) -> np.ndarray:
    """Antialiased linear or cubic resize of a float ``x``: one matrix product per resized axis
    (onnx.reference gathers every tap of every output cell)."""
    y = x
    for a in axes:
        in_len, out_len = x.shape[a], out_shape[a]
        if out_len == in_len and scale_list[a] == 1.0:
            continue
        w = antialias_matrix(out_len, in_len, float(scale_list[a]), mode, coord_mode, float(cubic_a),
                             bool(exclude_outside), x.dtype.type)
        y = np.moveaxis(np.tensordot(w, y, axes=([1], [a])), 0, a)
    return np.ascontiguousarray(y)
