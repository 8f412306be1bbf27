"""Pooling: MaxPool, AveragePool and LpPool as separable max/add passes, one spatial axis at a
time: over strided slices of the input for strided pools (their unpadded first axis over the
flattened input), over the flattened padded input for unit-stride ones (``ceil_mode`` as extra end padding that never counts); MaxPool's Indices by
tracking the winning tap over a padded copy; GlobalAveragePool/GlobalMaxPool as reductions.
2-D AveragePool of small planes, or padded and strided, as matrix products (``_AverageProducts``);
MaxPool without Indices in C where built (``MAX_POOL_PATHS``: 3-D, 1-D/2-D lifted to 3-D,
2-D over small planes).
Column-major Indices (``storage_order=1``) are delegated to onnx.reference."""

from __future__ import annotations

import math

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.hal.run_control import check_terminate
from onnxhal.runtime.providers.cpu.kernels.conv import pad_spatial, per_shape, strided_view
from onnxhal.runtime.providers.cpu.kernels.kernel_paths import path_table
from onnxhal.runtime.providers.cpu.kernels.native_kernels import native_module
from onnxhal.runtime.providers.cpu.kernels.registry import register
from onnxhal.runtime.providers.op_geometry import PoolGeometry


def _tap_range(k: int, n: int, out: int, stride: int, dil: int, pb: int) -> tuple[int, int]:
    """The outputs [i0, i1) whose tap ``k`` lands inside an input axis of length ``n``: output i
    reads input i*stride + k*dil - pb."""
    off = k * dil - pb
    i0 = max(0, -(off // stride)) if off < 0 else 0
    i1 = min(out, (n - 1 - off) // stride + 1) if n - 1 - off >= 0 else 0
    return i0, max(i0, i1)


def _separable_reduce(x: np.ndarray, pb, out, kernel, strides, dil, op, identity, first: int = 0) -> np.ndarray:
    """``op`` (np.maximum or np.add) over each pooling window, one spatial axis at a time: a
    window's max or sum is the max or sum over rows of per-row results, so a k x k window costs
    2(k-1) whole-array passes instead of k*k - 1. The first axis goes first because its taps are
    whole contiguous rows (SIMD) and it shrinks the array the strided second pass reads. Taps that
    fall in the padding are left out rather than read from a padded copy, so no pass pads. Axes
    before ``first`` are already reduced."""
    y = x
    for a in range(first, len(kernel)):
        lead = (slice(None),) * (2 + a)  # index tuples along spatial axis a
        n, o, s, d = y.shape[2 + a], out[a], strides[a], dil[a]
        taps = [(k,) + _tap_range(k, n, o, s, d, pb[a]) for k in range(kernel[a])]
        full = [t for t in taps if t[1] == 0 and t[2] == o]
        part = [t for t in taps if t not in full and t[2] > t[1]]

        def src(k, i0, i1, y=y, lead=lead, s=s, d=d, p=pb[a]):
            r0 = i0 * s + k * d - p  # the input row of output i0's tap k
            return y[lead + (slice(r0, r0 + (i1 - i0 - 1) * s + 1, s),)]

        if len(full) >= 2:
            acc = op(src(*full[0]), src(*full[1]))
            rest = full[2:] + part
        else:
            acc = np.full(y.shape[:2 + a] + (o,) + y.shape[3 + a:], identity, dtype=x.dtype)
            rest = full + part
        for k, i0, i1 in rest:
            view = acc[lead + (slice(i0, i1),)]
            op(view, src(k, i0, i1), out=view)
        y = acc
    return y


def _flat_reduce(x: np.ndarray, pb, pe, out, kernel, strides, dil, op, identity) -> np.ndarray | None:
    """``op`` over each pooling window as whole-array passes over the flattened, padded input:
    per spatial axis, k - 1 passes combine each element with its taps' elements at offsets of
    d * (the axis' pitch), then one strided copy samples the window starts. The windows of
    positions that are never sampled run across row or plane ends and are ignored. Every pass is
    one contiguous stretch (SIMD, one inner loop) where the separable reduction's slices run one
    inner loop per row. None when the padded input cannot hold the last window."""
    nd = len(kernel)
    dims = tuple(n + b + e for n, b, e in zip(x.shape[2:], pb, pe))
    if x.size == 0 or any((o - 1) * s + (k - 1) * d >= n for o, s, k, d, n in zip(out, strides, kernel, dil, dims)):
        return None
    xp = np.ascontiguousarray(pad_spatial(x, pb, pe, identity))
    pitch = [int(math.prod(dims[a + 1:])) for a in range(nd)]
    f = xp.reshape(-1)
    for a in range(nd):
        if kernel[a] == 1:
            continue
        step = dil[a] * pitch[a]
        length = f.size - (kernel[a] - 1) * step
        acc = op(f[:length], f[step:step + length])
        for t in range(2, kernel[a]):
            op(acc, f[t * step:t * step + length], out=acc)
        f = acc
    item = f.itemsize
    view = strided_view(f, (x.shape[0] * x.shape[1],) + tuple(out),
                        (int(math.prod(dims)) * item,) + tuple(s * p * item for s, p in zip(strides, pitch)))
    y = np.empty(x.shape[:2] + tuple(out), dtype=x.dtype)  # a copy even when the view is x itself (1x1)
    np.copyto(y.reshape(view.shape), view)
    return y


def _first_axis_flat(x: np.ndarray, out, kernel, strides, dil, op) -> np.ndarray:
    """The first spatial axis of a pool whose windows along it stay inside the input (no padding
    there, ceil_mode's included), reduced by k - 1 passes over the whole flattened input, each one
    contiguous stretch: every row is combined with the rows below it, at full resolution, and the
    result is a read-only view (N, C, out[0], ...) of the rows the windows start at. Rows near a
    plane's end combine rows of the next plane and are never in the view. The separable pass
    would instead run one inner loop per output row (about 40 ns each here)."""
    k, s, d = kernel[0], strides[0], dil[0]
    n, c, h = x.shape[:3]
    pitch = int(math.prod(x.shape[3:]))
    f = np.ascontiguousarray(x).reshape(-1)
    step = d * pitch
    length = f.size - (k - 1) * step
    acc = op(f[:length], f[step:step + length])
    for t in range(2, k):
        op(acc, f[t * step:t * step + length], out=acc)
    it = acc.itemsize
    inner = tuple(int(math.prod(x.shape[3 + i + 1:])) * it for i in range(x.ndim - 3))
    return strided_view(acc, (n, c, out[0]) + x.shape[3:], (c * h * pitch * it, h * pitch * it, s * pitch * it) + inner)


def _window_reduce(x: np.ndarray, pb, pe, out, kernel, strides, dil, op, identity) -> np.ndarray:
    """``op`` over each pooling window: the flat passes (``_flat_reduce``) for unit-stride pools,
    where they are 0.54-0.88 of the separable reduction's time (3x3 at 192x28x28 to 832x7x7); the
    separable one for strided pools, where the flat passes, all at full resolution, took 1.0-1.24x
    its time (3x3 stride 2, 24x56x56 to 480x28x28, alternating runs), with its first axis as flat
    passes (``_first_axis_flat``) when the windows need no padding along it."""
    if all(s == 1 for s in strides):
        y = _flat_reduce(x, pb, pe, out, kernel, strides, dil, op, identity)
        if y is not None:
            return y
    elif (x.ndim >= 4 and x.size and kernel[0] > 1 and strides[0] > 1 and not pb[0] and not pe[0]
          and (out[0] - 1) * strides[0] + (kernel[0] - 1) * dil[0] < x.shape[2]):
        # Unpadded rows (SqueezeNet's and Inception's 3x3/2 pools): the row pass as flat passes,
        # faster than strided slices; with row padding the padded copy it needs costs more than it
        # saves.
        return _separable_reduce(_first_axis_flat(x, out, kernel, strides, dil, op), pb, out, kernel, strides,
                                 dil, op, identity, first=1)
    return _separable_reduce(x, pb, out, kernel, strides, dil, op, identity)


def _whole_window(x: np.ndarray, kernel, strides, dil, pb, pe) -> bool:
    """True when one unpadded window covers the whole spatial extent (a global pool)."""
    return (not any(pb) and not any(pe) and all(d == 1 for d in dil)
            and tuple(kernel) == tuple(x.shape[2:]))


def padding_only_windows(spatial, kernel, strides, dil, pb, out) -> tuple | None:
    """The output positions whose window holds padding alone, as an index over the spatial axes
    (None when there are none). onnxruntime gives such a MaxPool window the lowest finite value
    (-FLT_MAX), not -inf; they exist only with dilation or padding at least the kernel's size."""
    if all(d == 1 and p < k for d, p, k in zip(dil, pb, kernel)) and all(
            (o - 1) * s - p < n for o, s, p, n in zip(out, strides, pb, spatial)):
        return None  # unit dilation, pads under the kernel, last window starting inside: none
    empty = []
    for n, k, s, d, p, o in zip(spatial, kernel, strides, dil, pb, out):
        taps = np.arange(o)[:, None] * s + np.arange(k)[None, :] * d - p
        empty.append(~((taps >= 0) & (taps < n)).any(axis=1))
    mask = np.zeros(tuple(out), bool)
    for a, e in enumerate(empty):
        mask |= e.reshape([-1 if i == a else 1 for i in range(len(out))])
    return np.nonzero(mask) if mask.any() else None


#: Largest number of window elements (taps x outputs, all planes) a MaxPool gathers in one take
#: (``_window_indices``): below this size one take beats the separable passes, whose per-tap
#: slicing costs more than the data.
POOL_GATHER_MAX = 1 << 15


def _window_indices(shape: tuple, kernel, strides, dil, pb, out) -> tuple[np.ndarray, bool] | None:
    """The flat indices (taps, N C prod(out)) of every window's taps in an input of ``shape``
    flattened with one cell appended, which the taps in the padding read, and whether any does;
    None past ``POOL_GATHER_MAX`` elements."""
    planes, spatial = shape[0] * shape[1], shape[2:]
    # math.prod: np.prod of a short list costs microseconds (an array made, a reduction's wrappers)
    taps, size = math.prod(kernel), math.prod(out)
    if not planes or not size or taps * planes * size > POOL_GATHER_MAX:
        return None
    at = inside = None  # (taps so far, outputs so far): flat positions in a plane, and which are in it
    for n, k, s, d, p, o in zip(spatial, kernel, strides, dil, pb, out):
        # (k, o) positions along this axis by outer sums (a few calls a axis: the plans are small,
        # their cost is the number of numpy calls); a negative one, seen unsigned, is past the axis
        pos = np.add.outer(np.arange(0, k * d, d, dtype=np.intp), np.arange(-p, o * s - p, s, dtype=np.intp))
        ok = pos.view(np.uintp) < n
        if at is None:
            at, inside = pos, ok
            continue
        rows = at.shape[0] * k
        at = np.add.outer(at * n, pos).transpose(0, 2, 1, 3).reshape(rows, -1)
        inside = np.logical_and.outer(inside, ok).transpose(0, 2, 1, 3).reshape(rows, -1)
    plane = math.prod(spatial)
    # (planes, taps, outputs) made by one outer add, then viewed tap-major: a broadcast np.where
    # over the three axes cost about as much again as this whole plan (a session's first run
    # plans every small pool); taps in the padding read the cell appended after the planes
    idx = np.add.outer(np.arange(0, planes * plane, plane, dtype=np.intp), at).transpose(1, 0, 2)
    padded = not inside.all()
    if padded:
        np.copyto(idx, planes * plane, where=~inside[:, None, :])
    return np.ascontiguousarray(idx).reshape(taps, -1), padded


def _tap_slices(idx, dil, strides, out):
    return (slice(None), slice(None)) + tuple(
        slice(idx[i] * dil[i], idx[i] * dil[i] + (out[i] - 1) * strides[i] + 1, strides[i]) for i in range(len(idx)))


MAX_POOL_PATHS = path_table("pooling.MaxPool", "the separable np.maximum passes (``_window_reduce``)")
MAX_POOL_NATIVE_3D = MAX_POOL_PATHS.add(
    "native_3d", "3-D (5-D input), float32 or float64, no Indices output, _native built and "
                 "ONNXHAL_NATIVE_KERNELS not 0: each plane's windows reduced in C, columns, then rows, then "
                 "frames (``_native.max_pool_3d``)")
MAX_POOL_NATIVE_LIFTED = MAX_POOL_PATHS.add(
    "native_lifted", "1-D or 2-D (3-D or 4-D input), float32 or float64, no Indices output, planes of at least "
                     "NATIVE_LIFTED_MIN_PLANE inputs, _native built and ONNXHAL_NATIVE_KERNELS not 0, ahead of "
                     "the gather plan: native_3d's C passes over the input viewed with leading spatial axes of 1 "
                     "(a window of 1 there)")
MAX_POOL_NATIVE_2D = MAX_POOL_PATHS.add(
    "native_2d", "2-D (4-D input), float32 or float64, no Indices output, planes of fewer than "
                 "NATIVE_LIFTED_MIN_PLANE inputs (where native_lifted leaves them to the gather plan), "
                 "_native.max_pool_2d built, ONNXHAL_NATIVE_KERNELS not 0 and NATIVE_2D_ENABLED: each output "
                 "row's window rows reduced into a row buffer padded with -inf, then its columns, per column "
                 "phase for strided pools, in one C call for all planes")
#: The switch of ``MAX_POOL_NATIVE_2D`` (read at each run): False leaves its pools to the gather plan
#: (tests/test_max_pool_2d.py compares them; benchmarks/switch_ab.py measures it). Per pool, one thread,
#: CPU time, alternating (load 5.3): googlenet's 24x4x4 3x3/1 6.7 -> 4.4 us, 64x2x2 5.9 -> 4.4,
#: 104x1x1 4.7 -> 3.4, squeezenet's 64x3x3 3x3/2 9.9 -> 3.6, vgg's 64x4x4 2x2/2 3.8 -> 4.3. On larger
#: planes its per-row loops (a row buffer of W, OW outputs) are too short to vectorise well and it lost
#: to native_lifted's whole-plane passes (832x14x14 3x3/2: 290 against 882 us), so it is not taken there.
NATIVE_2D_ENABLED = True
#: Below this many inputs a plane, the C passes' per-plane setup costs more than the gather plan's one
#: take (2x2/2 over 64 planes of 4x4: 7.9 against 3.7 us; 3x3/2 over 24 planes of 8x8: 4.8 against 5.7).
NATIVE_LIFTED_MIN_PLANE = 64


class _Pool(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.geo = PoolGeometry(node)
        self.ceil = self.geo.ceil

    def geometry(self, spatial):
        """``PoolGeometry.geometry``: what every EP sizes this pool by."""
        return self.geo.geometry(spatial)


@register("MaxPool", since=1)
class MaxPool(_Pool):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        super().__init__(node, ctx)
        self.with_indices = len(node.outputs) > 1 and bool(node.outputs[1])
        self._plans: dict[tuple, tuple | bool] = {}  # per (input shape, dtype); kernels are shared by runs
        self._native_plans: dict[tuple, tuple | bool] = {}  # per input shape, ``_native_plan``
        self.ref = None
        # the C passes run every axis of a plane while it is in cache, where numpy's passes run one
        # whole-array pass per tap and axis (each a slice and a loop call)
        self._native = native_module()
        self._native_2d = getattr(self._native, "max_pool_2d", None)  # an older build lacks it
        self.last_path = ""  #: the path the last compute took (tests and benchmarks read it)
        if self.with_indices and node.attr("storage_order", 0):
            from onnxhal.runtime.providers.cpu.kernel_factory import ReferenceKernel

            self.ref = ReferenceKernel(node, ctx, node.since_version or 12)

    def compute(self, inputs: list) -> list:
        if self.ref is not None:
            return self.ref.compute(inputs)
        x = inputs[0]
        if (x.ndim == 4 and NATIVE_2D_ENABLED and self._native is not None and self._native_2d is not None
                and not self.with_indices and x.size
                and x.dtype in (np.float32, np.float64) and x.shape[2] * x.shape[3] < NATIVE_LIFTED_MIN_PLANE):
            y = self._native_pool(x, self._native_2d)
            if y is not None:
                self.last_path = MAX_POOL_NATIVE_2D
                return [y]
        if (self._native is not None and not self.with_indices and x.size and x.dtype in (np.float32, np.float64)
                and (x.ndim == 5 or x.ndim in (3, 4) and x.size >= NATIVE_LIFTED_MIN_PLANE * x.shape[0] * x.shape[1])):
            y = self._native_3d(x)
            if y is not None:
                self.last_path = MAX_POOL_NATIVE_3D if x.ndim == 5 else MAX_POOL_NATIVE_LIFTED
                return [y]
        self.last_path = ""
        if not self.with_indices:
            plan = per_shape(self._plans, (x.shape, x.dtype), lambda: self._gather_plan(x.shape, x.dtype))
            if plan:
                idx, appended, out_shape = plan
                flat = x.reshape(-1)
                if appended is not None:
                    flat = np.concatenate((flat, appended))
                taps = flat.take(idx)
                if taps.dtype == np.float16:
                    # numpy's float16 maximum widens element by element (3-5x a float32 one); the
                    # largest of the widened taps is the same number, exactly
                    return [np.maximum.reduce(taps.astype(np.float32), axis=0).astype(np.float16).reshape(out_shape)]
                return [np.maximum.reduce(taps, axis=0).reshape(out_shape)]
        kernel, strides, dil, pb, pe, out, _ = self.geometry(x.shape[2:])
        if any(o <= 0 for o in out):  # a window larger than the padded input: no output, as onnxruntime
            shape = tuple(x.shape[:2]) + tuple(max(int(o), 0) for o in out)
            return [np.empty(shape, x.dtype)] + ([np.empty(shape, np.int64)] if self.with_indices else [])
        if not self.with_indices and _whole_window(x, kernel, strides, dil, pb, pe):
            return [x.max(axis=tuple(range(2, x.ndim)), keepdims=True)]
        low = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
        if not self.with_indices:
            ys = [_window_reduce(x, pb, pe, out, kernel, strides, dil, np.maximum, low)]
        else:
            xp = pad_spatial(x, pb, pe, low)
            ys = list(self._with_indices(x, xp, kernel, strides, dil, pb, out))
        empty = padding_only_windows(x.shape[2:], kernel, strides, dil, pb, out) if x.dtype.kind == "f" else None
        if empty is not None:
            ys[0] = np.array(ys[0])  # a view of the input (or read-only) in some paths
            ys[0][(slice(None), slice(None)) + empty] = np.finfo(x.dtype).min
        return ys

    def _native_3d(self, x: np.ndarray) -> np.ndarray | None:
        """``_native.max_pool_3d``'s maxima, with onnxruntime's -FLT_MAX in windows of padding
        alone; None when the pool has no output (the plain path's shapes)."""
        plan = per_shape(self._native_plans, x.shape, lambda: self._native_plan(x.shape))
        if not plan:
            return None
        out_shape, args, empty = plan
        y = np.empty(out_shape, x.dtype)
        lift = (1,) * (5 - x.ndim)  # a 1-D or 2-D pool is a 3-D one over spatial axes of 1
        self._native.max_pool_3d(np.ascontiguousarray(x).reshape(x.shape[:2] + lift + x.shape[2:]),
                                 y.reshape(out_shape[:2] + lift + out_shape[2:]), *args)
        if empty is not None:
            y[empty] = np.finfo(x.dtype).min
        return y

    def _native_pool(self, x: np.ndarray, pool) -> np.ndarray | None:
        """``_native.max_pool_2d``'s maxima of a 4-D ``x`` (geometry as ``_native_3d``'s, less
        the lifted axis), with onnxruntime's -FLT_MAX in windows of padding alone; None when the
        pool has no output."""
        plan = per_shape(self._native_plans, x.shape, lambda: self._native_plan(x.shape))
        if not plan:
            return None
        out_shape, args, empty = plan
        y = np.empty(out_shape, x.dtype)
        pool(np.ascontiguousarray(x), y, *(a[1:] for a in args))
        if empty is not None:
            y[empty] = np.finfo(x.dtype).min
        return y

    def _native_plan(self, shape: tuple) -> tuple | bool:
        """For an input ``shape``: the output shape, ``max_pool_3d``'s geometry arguments and the
        outputs whose windows read padding alone (None: none), resolved once per shape, as a
        video network's small pools would otherwise resolve their geometry on every run; False
        when the pool has no output."""
        kernel, strides, dil, pb, _, out, _ = self.geometry(shape[2:])
        if any(o <= 0 for o in out):
            return False
        empty = padding_only_windows(shape[2:], kernel, strides, dil, pb, out)
        lift = 5 - len(shape)  # the lifted axes: a window of 1, no padding, stride and dilation 1
        return (tuple(shape[:2]) + tuple(out), ((1,) * lift + tuple(kernel), (1,) * lift + tuple(strides),
                                               (0,) * lift + tuple(pb), (1,) * lift + tuple(dil)),
                None if empty is None else (slice(None), slice(None)) + empty)

    def _gather_plan(self, shape: tuple, dtype: np.dtype) -> tuple | bool:
        """For a small input: the window indices (``_window_indices``), the cell appended for
        the padding (the lowest value, or None when no tap reads padding) and the output shape;
        False for the other paths (large inputs, global pools, windows of padding alone, which
        take onnxruntime's -FLT_MAX)."""
        if len(shape) < 3:
            return False
        kernel, strides, dil, pb, pe, out, _ = self.geometry(shape[2:])
        if (not any(pb) and not any(pe) and all(d == 1 for d in dil) and tuple(kernel) == tuple(shape[2:])
                or padding_only_windows(shape[2:], kernel, strides, dil, pb, out) is not None):
            return False  # a global pool's one reduction; the -FLT_MAX windows
        found = _window_indices(shape, kernel, strides, dil, pb, out)
        if found is None:
            return False
        idx, padded = found
        low = -np.inf if dtype.kind == "f" else np.iinfo(dtype).min
        return idx, np.array([low], dtype) if padded else None, tuple(shape[:2]) + tuple(out)

    @staticmethod
    def _with_indices(x, xp, kernel, strides, dil, pb, out):
        """Max and the row-major flat index (into the whole input) of its first occurrence."""
        nd = len(kernel)
        spatial = x.shape[2:]
        base = (np.arange(x.shape[0] * x.shape[1], dtype=np.int64) * int(math.prod(spatial))).reshape(
            (x.shape[0], x.shape[1]) + (1,) * nd)
        y = idx_best = None
        for tap in np.ndindex(*kernel):
            check_terminate()  # one pass over the whole output per tap
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


#: Largest (H W) x (oh ow) of a plane's whole averaging matrix (``_AverageProducts``): 14x14 to 7x7
#: is 9,604 (ShuffleNet's last 3x3/2 pool), where the products beat the window passes.
WHOLE_PLANE_MAX = 20_000


class _AverageProducts:
    """A 2-D average pool as matrix products: per spatial axis, a matrix (out, n) whose row i
    holds 1 / count(i) at the input positions window i covers (the count is the product of the
    per-axis counts, with or without the explicit padding), so a plane's averages are A X B^T.
    Planes small enough take one product with the whole (H W, oh ow) matrix; larger ones take X B^T
    as one product over all rows (N C H, W) @ (W, ow), then A @ that per plane. The separable
    passes run one inner loop per output row (about 35 ns each here) and then divide: 0.17
    against 0.27 ms at 136x28x28 with 3x3/2 windows and pads 1."""

    def __init__(self, spatial, kernel, strides, dil, pb, counted_end, out, dtype) -> None:
        mats = []
        for a in range(2):
            n, o = spatial[a], out[a]
            taps = np.arange(o)[:, None] * strides[a] + np.arange(kernel[a])[None, :] * dil[a] - pb[a]
            inside = (taps >= 0) & (taps < n)
            counted = inside if counted_end is None else (taps >= -pb[a]) & (taps < n + counted_end[a])
            count = counted.sum(axis=1)
            if not count.all():  # a window of padding alone: the separable path's 0 / 0
                self.ok = False
                return
            m = np.zeros((o, n), np.float64)
            for i in range(o):
                np.add.at(m[i], taps[i][inside[i]], 1.0 / count[i])
            mats.append(m)
        self.ok = True
        (oh, ow), (h, w) = out, spatial
        if h * w * oh * ow <= WHOLE_PLANE_MAX:
            self.whole = np.kron(mats[0], mats[1]).T.astype(dtype)  # (H W, oh ow)
        else:
            self.whole = None
            self.rows = mats[0].astype(dtype)  # (oh, H)
            self.columns = np.ascontiguousarray(mats[1].T.astype(dtype))  # (W, ow)

    def __call__(self, x: np.ndarray, out) -> np.ndarray:
        n, c, h, w = x.shape
        x = np.ascontiguousarray(x)
        if self.whole is not None:
            return np.matmul(x.reshape(n * c, h * w), self.whole).reshape(n, c, *out)
        t = np.matmul(x.reshape(n * c * h, w), self.columns).reshape(n * c, h, out[1])
        return np.matmul(self.rows, t).reshape(n, c, *out)


def _whole_mean(x: np.ndarray, out: None) -> np.ndarray:
    """A global average pool: the mean over every spatial axis (``out``: the products' signature)."""
    return np.asarray(x.mean(axis=tuple(range(2, x.ndim)), keepdims=True), dtype=x.dtype)


@register("AveragePool", since=1)
class AveragePool(_Pool):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        super().__init__(node, ctx)
        self.include_pad = bool(node.attr("count_include_pad", 0))
        self._divisors: dict[tuple, np.ndarray] = {}  # per (spatial shape, dtype); kernels are shared by runs
        self._products: dict[tuple, _AverageProducts] = {}  # likewise
        # (input shape, dtype) -> (products or _whole_mean, out): no geometry per run
        self._by_shape: dict[tuple, tuple] = {}

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        found = self._by_shape.get((x.shape, x.dtype))  # the products or whole-window path, resolved once per shape
        if found is not None:
            return [found[0](x, found[1])]
        kernel, strides, dil, pb, pe, out, pe_explicit = self.geometry(x.shape[2:])
        if _whole_window(x, kernel, strides, dil, pb, pe):
            if len(self._by_shape) > 64:
                self._by_shape.clear()
            self._by_shape[x.shape, x.dtype] = (_whole_mean, None)  # a video network's closing pool
            return [_whole_mean(x, None)]
        padded = any(pb) or any(pe)
        if x.ndim == 4 and x.size and x.dtype in (np.float32, np.float64):
            products = self._average_products(x, kernel, strides, dil, pb, pe, pe_explicit, out, padded)
            if products is not None:
                if len(self._by_shape) > 64:
                    self._by_shape.clear()
                self._by_shape[x.shape, x.dtype] = (products, tuple(out))
                return [products(x, out)]
        y = _window_reduce(x, pb, pe, out, kernel, strides, dil, np.add, 0)
        if not padded:
            y /= x.dtype.type(int(math.prod(kernel)))
            return [y]
        y /= per_shape(self._divisors, (x.shape[2:], x.dtype), lambda: self._divisor(x, kernel, strides, dil, pb, pe, pe_explicit, out))
        return [y]

    def _average_products(self, x, kernel, strides, dil, pb, pe, pe_explicit, out, padded) -> _AverageProducts | None:
        """The products for this input shape, when they beat the separable passes: a whole-plane
        matrix, or a padded pool with every stride above 1 (its separable passes need a divisor
        pass after them; unpadded 2x2/2 pools stay separable, 0.15 against 0.21 ms at 256x28x28)."""
        products = per_shape(self._products, (x.shape[2:], x.dtype), lambda: _AverageProducts(
            x.shape[2:], kernel, strides, dil, pb, pe_explicit if self.include_pad else None, out, x.dtype))
        if not products.ok or (products.whole is None and not (padded and min(strides) > 1)):
            return None
        return products

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
        y = _window_reduce(np.abs(x) ** x.dtype.type(self.p), pb, pe, out, kernel, strides, dil, np.add, 0)
        return [np.asarray(y ** x.dtype.type(1.0 / self.p), dtype=x.dtype)]


class _GlobalPool(Kernel):
    """The canonical kernel: ``fn`` (np.mean, np.max) over the spatial axes. Fast path
    ``flat_plane`` (``flat_reduce``) where its condition holds; ``last_path`` names the path the
    last run took ("canonical" or "flat_plane")."""

    fn = None
    flat = None  #: the ufunc ``flat_reduce`` reduces with

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.op = node.op_type
        self.last_path: str | None = None

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        if x.ndim > 2 and x.dtype.kind == "f" and x.dtype.itemsize >= 4 and x.flags.c_contiguous and x.size:
            self.last_path = "flat_plane"
            return [flat_reduce(x, self.flat)]
        self.last_path = "canonical"
        if _empty_windows(x, self.op):
            return [np.empty(x.shape[:2] + (1,) * (x.ndim - 2), x.dtype)]
        return [np.asarray(self.fn(x, axis=tuple(range(2, x.ndim)), keepdims=True), dtype=x.dtype)]


def flat_reduce(x: np.ndarray, ufunc: np.ufunc) -> np.ndarray:
    """GlobalAveragePool (``np.add``: the sum, then divided by the plane's size) or GlobalMaxPool
    (``np.maximum``) of a C-contiguous float32/float64 ``x`` (N, C, ...) with every axis non-empty:
    one reduction over each flattened plane. The same sums as np.mean's (numpy joins the
    contiguous spatial axes into one there too, and divides likewise), in two numpy calls where
    np.mean makes several in Python, which is the cost of a squeeze-excitation block's small pool."""
    n, c = x.shape[:2]
    y = ufunc.reduce(x.reshape(n, c, -1), axis=2)
    if ufunc is np.add:
        np.divide(y, x.size // (n * c), out=y)
    return y.reshape((n, c) + (1,) * (x.ndim - 2))


def _empty_windows(x: np.ndarray, op: str) -> bool:
    """True when a global pool's output is empty (N or C is 0). A spatial size of 0 with
    channels to pool has no value to take a max or mean of: refused, as onnxruntime does."""
    if x.ndim > 2 and 0 in x.shape[2:]:
        if x.shape[0] and x.shape[1]:
            raise InvalidArgument(f"{op} over input shape {list(x.shape)}: a spatial dimension is 0, so every "
                                  "window is empty. Only the batch or channel dimension may be 0.")
        return True
    return x.size == 0


GlobalAveragePool = register("GlobalAveragePool", since=1)(
    type("GlobalAveragePool", (_GlobalPool,), {"fn": staticmethod(np.mean), "flat": np.add}))
GlobalMaxPool = register("GlobalMaxPool", since=1)(
    type("GlobalMaxPool", (_GlobalPool,), {"fn": staticmethod(np.max), "flat": np.maximum}))


@register("GlobalLpPool", since=1)
class GlobalLpPool(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.p = node.attr("p", 2)

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        if _empty_windows(x, "GlobalLpPool"):
            return [np.empty(x.shape[:2] + (1,) * (x.ndim - 2), x.dtype)]
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
            check_terminate()  # one ROI's bins per read
            b = int(roi[0])
            # C's round (half away from zero), as Caffe and onnxruntime; Python's rounds half to even
            x1, y1, x2, y2 = (int(math.copysign(math.floor(abs(float(v) * self.scale) + 0.5), float(v)))
                              for v in roi[1:5])
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


@register("MaxUnpool", since=9)
class MaxUnpool(Kernel):
    """Scatters X into zeros at its flat indices I (MaxPool's Indices) in the shape MaxPool's
    attributes imply; a larger ``output_shape`` pads that result at the end of each axis. This is
    the spec's backend case (`maxunpool_export_with_output_shape`) and onnx.reference; onnxruntime
    reads the indices as flat in output_shape instead (docs/cpu-ep.md)."""

    host_inputs = frozenset({1, 2})

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.kernel = node.attr("kernel_shape")
        self.strides = node.attr("strides")
        self.pads = node.attr("pads")

    def compute(self, inputs: list) -> list:
        x, idx = inputs[0], inputs[1]
        nd = x.ndim - 2
        strides = self.strides or [1] * nd
        pads = self.pads or [0] * (2 * nd)
        implied = x.shape[:2] + tuple((x.shape[2 + i] - 1) * strides[i] + self.kernel[i] - pads[i] - pads[i + nd]
                                      for i in range(nd))
        shape = tuple(int(v) for v in inputs[2]) if len(inputs) > 2 and inputs[2] is not None else implied
        if len(shape) != x.ndim or any(o < m for o, m in zip(shape, implied)):
            raise InvalidArgument(f"MaxUnpool: output_shape {list(shape)} is smaller than the unpooled shape "
                                  f"{list(implied)} or of another rank; give at least that shape.")
        if idx.shape != x.shape:
            raise InvalidArgument(f"MaxUnpool: I has shape {list(idx.shape)}, X {list(x.shape)}; they must match.")
        y = np.zeros(implied, dtype=x.dtype)
        flat = idx.reshape(-1)
        if flat.size and (flat.min() < 0 or flat.max() >= y.size):
            bad = int(flat.max() if flat.max() >= y.size else flat.min())
            raise InvalidArgument(f"MaxUnpool: index {bad} is outside the unpooled shape {list(implied)} ({y.size} "
                                  "elements). I must hold flat indices, as MaxPool's Indices output.")
        y.reshape(-1)[flat] = x.reshape(-1)
        if shape == implied:
            return [y]
        out = np.zeros(shape, dtype=x.dtype)
        out[tuple(slice(0, d) for d in implied)] = y
        return [out]
