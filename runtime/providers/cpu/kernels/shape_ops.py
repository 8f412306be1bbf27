"""Shape and data-movement kernels: Reshape, Flatten, Transpose, Concat, Split, Slice, Gather,
Squeeze/Unsqueeze, Expand, Shape, Size, Tile, Pad, Constant, ConstantOfShape, Range.

Opset-dependent signatures (attributes that became inputs) are separate registrations. Views are
returned where numpy gives them: produced values are never written in place.
"""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.ep import INLINE_APPLY
from onnxhal.hal.errors import InvalidArgument
from onnxhal.hal.graph import sparse_to_dense
from onnxhal.runtime.providers.cpu.kernels import pad_indices
from onnxhal.runtime.providers.cpu.kernels.registry import register
from onnxhal.runtime.providers.op_geometry import first_out_of_range

_ndarray = np.ndarray
_INT64 = np.int64


class _NoAttr(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        pass


def _reshape(x: np.ndarray, shape, allowzero: bool) -> np.ndarray:
    asked = [int(s) for s in shape]
    shape = list(asked)
    if not allowzero:
        for i, s in enumerate(shape):
            if s == 0:
                if i >= x.ndim:
                    raise InvalidArgument(f"Reshape: shape {asked} has 0 (copy the input's dimension) at position {i}, "
                                          f"but the input {list(x.shape)} has rank {x.ndim}; give the size itself.")
                shape[i] = x.shape[i]
    try:
        return x.reshape(shape)
    except ValueError:  # numpy checks the sizes; say it in ONNX's terms
        raise InvalidArgument(f"Reshape: cannot reshape {list(x.shape)} ({x.size} elements) to {asked}"
                              f"{'' if allowzero else f' (resolved {shape})'}; the sizes must match, with at most "
                              f"one -1 and no -1 beside a 0-sized dimension.") from None


@register("Reshape", since=1)
class ReshapeAttr(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.shape = node.attr("shape", [])

    def compute(self, inputs: list) -> list:
        return [_reshape(inputs[0], self.shape, False)]


@register("Reshape", since=5)
class Reshape(Kernel):
    host_inputs = frozenset({1})
    inline_fn = INLINE_APPLY

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.allowzero = bool(node.attr("allowzero", 0))
        self._last: tuple = (None, None, None)  # (read-only shape array, input shape, resolved shape)
        # a constant initializer is the same array, never changed, every run (it may be writeable)
        self.constant_shape = ctx is not None and len(node.inputs) > 1 and ctx.is_constant_initializer(node.inputs[1])

    def compute(self, inputs: list) -> list:
        return [self.apply(inputs[0], inputs[1])]

    def apply(self, x: np.ndarray, shape: np.ndarray) -> np.ndarray:
        last_shape, last_in, last_out = self._last
        # A model constant (read-only, the same array each run) resolves once per input shape
        if shape is last_shape and x.shape == last_in:
            return x.reshape(last_out)
        y = _reshape(x, shape.tolist(), self.allowzero)
        if self.constant_shape or not shape.flags.writeable:
            self._last = (shape, x.shape, y.shape)
        return y


@register("Flatten", since=1)
class Flatten(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.axis = node.attr("axis", 1)

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        axis = self.axis + x.ndim if self.axis < 0 else self.axis
        return [x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))]


@register("Transpose", since=1)
class Transpose(Kernel):
    inline_fn = INLINE_APPLY

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        perm = node.attr("perm")
        self.perm = tuple(perm) if perm is not None else None

    def compute(self, inputs: list) -> list:
        return [np.transpose(inputs[0], self.perm)]

    def apply(self, x: np.ndarray) -> np.ndarray:
        return np.transpose(x, self.perm)


@register("Concat", since=1)
class Concat(Kernel):
    inline_fn = INLINE_APPLY

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.axis = node.attr("axis", 1)

    def compute(self, inputs: list) -> list:
        return [np.concatenate(inputs, axis=self.axis)]

    def apply(self, *inputs: np.ndarray) -> np.ndarray:
        return np.concatenate(inputs, axis=self.axis)


@register("Split", since=1)
class SplitAttr(Kernel):
    """Split with a ``split`` attribute (opset < 13; opset 1 also accepts it as input 2)."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.axis = node.attr("axis", 0)
        self.split = node.attr("split")
        self.n = len(node.outputs)

    def compute(self, inputs: list) -> list:
        split = self.split
        if split is None and len(inputs) > 1 and inputs[1] is not None:
            split = inputs[1].tolist()
        return _do_split(inputs[0], self.axis, split, self.n)


def _do_split(x: np.ndarray, axis: int, split, n: int) -> list:
    """The plain path: the parts of ``x``, checked and indexed at each call."""
    return [x[index] for index in _split_index(x.shape, axis, split, n)]


def _split_index(shape: tuple, axis: int, split, n: int) -> tuple[tuple, ...]:
    """The basic index of each part ``_do_split`` takes from an input of ``shape``."""
    ndim = len(shape)
    if not -ndim <= axis < ndim:
        raise InvalidArgument(f"Split: axis {axis} is out of range for the input {list(shape)}; it must lie in "
                              f"[{-ndim}, {ndim - 1}].")
    axis %= ndim
    dim = shape[axis]
    if split is None:
        chunk = -(-dim // n)  # opset 18 num_outputs: ceil-sized chunks, the last smaller
        split = [chunk] * (n - 1) + [dim - chunk * (n - 1)]
    elif sum(split) != dim or min(split, default=0) < 0:
        raise InvalidArgument(f"Split: the sizes {list(split)} must be non-negative and add up to the length {dim} "
                              f"of axis {axis} of the input {list(shape)}; give sizes that do.")
    # Basic slices (views, as np.split gives) without np.split's Python-level bookkeeping
    lead = (slice(None),) * axis
    return tuple(lead + (slice(e - s, e),) for s, e in zip(split, itertools.accumulate(split)))


#: Input shapes (with sizes, where they are not constant) a Split node keeps its parts' indices for.
SPLIT_INDEX_LIMIT = 64


@register("Split", since=13)
class Split(Kernel):
    host_inputs = frozenset({1})

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.axis = node.attr("axis", 0)
        self.n = node.attr("num_outputs", len(node.outputs))
        # Sizes absent or a constant initializer make the parts' indices a function of the input's
        # shape alone; other sizes (a loop body's, read from an outer-scope value) key them by
        # their bytes too. Kept per key: a Loop body splits its gates at every iteration, and
        # checking and building the slices cost twice the indexing.
        sizes = node.inputs[1] if len(node.inputs) > 1 else ""
        self.constant = not sizes or (ctx is not None and ctx.is_constant_initializer(sizes))
        self._index: dict[tuple, tuple] = {}

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        sizes = inputs[1] if len(inputs) > 1 else None
        if self.constant:
            key = x.shape
        elif sizes is None:
            key = (x.shape, None)
        elif sizes.__class__ is np.ndarray:
            key = (x.shape, sizes.dtype, sizes.shape, sizes.tobytes())
        else:
            key = None
        index = self._index.get(key) if key is not None else None
        if index is None:
            index = _split_index(x.shape, self.axis, sizes.tolist() if sizes is not None else None, self.n)
            if key is not None and len(self._index) < SPLIT_INDEX_LIMIT:
                self._index[key] = index
        return [x[i] for i in index]


def _slice(x: np.ndarray, starts, ends, axes, steps) -> np.ndarray:
    return x[_slice_index(x.shape, starts, ends, axes, steps)]


@register("Slice", since=1)
class SliceAttr(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.starts, self.ends = node.attr("starts"), node.attr("ends")
        self.axes = node.attr("axes")

    def compute(self, inputs: list) -> list:
        return [_slice(inputs[0], self.starts, self.ends, self.axes, None)]


def _slice_index(shape: tuple, starts, ends, axes, steps) -> tuple:
    """The basic index ``_slice`` takes ``x`` by, for an input of ``shape``."""
    index = [slice(None)] * len(shape)
    if axes is None:
        axes = range(len(starts))
    if steps is None:
        steps = [1] * len(starts)
    for s, e, a, st in zip(starts, ends, axes, steps):
        s, e, a, st = int(s), int(e), int(a), int(st)
        dim = shape[a]
        if s < 0:
            s += dim
        if e < 0:
            e += dim
        if st > 0:
            s = min(max(s, 0), dim)
            e = min(max(e, 0), dim)
        else:
            s = min(max(s, 0), dim - 1)
            e = min(max(e, -1), dim - 1)
        index[a] = slice(s, e if e >= 0 else None, st)
    return tuple(index)


@register("Slice", since=10)
class Slice(Kernel):
    """starts, ends, axes and steps from constant initializers (what exporters write) make the
    index a function of the input's shape alone: kept per shape, so a run indexes and returns (a
    shape chain or loop body slices small tensors at every step). Other inputs are read each run."""

    host_inputs = frozenset({1, 2, 3, 4})

    inline_fn = INLINE_APPLY

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.constant = ctx is not None and all(ctx.is_constant_initializer(i) for i in node.inputs[1:] if i)
        # input shape -> index for constant parameters; (shape, parameter values) -> index for
        # others (a loop body's starts and ends come from Unsqueezes of outer-scope scalars: new
        # arrays every iteration, the same few values)
        self._index: dict[tuple, tuple] = {}

    def compute(self, inputs: list) -> list:
        return [self.apply(*inputs)]

    def apply(self, x: np.ndarray, starts: np.ndarray, ends: np.ndarray, axes: np.ndarray | None = None,
              steps: np.ndarray | None = None) -> np.ndarray:
        cache = self._index
        if self.constant:
            index = cache.get(x.shape)
            if index is not None:
                return x[index]
            key = x.shape
        elif starts.__class__ is np.ndarray and ends.__class__ is np.ndarray and \
                (axes is None or axes.__class__ is np.ndarray) and (steps is None or steps.__class__ is np.ndarray):
            # the raw bytes with the dtype they share (ONNX's one Tind): a key built without a
            # Python int per element
            key = (x.shape, starts.dtype, starts.tobytes(), ends.tobytes(), None if axes is None else axes.tobytes(),
                   None if steps is None else steps.tobytes())
            index = cache.get(key)
            if index is not None:
                return x[index]
        else:
            key = None
        index = _slice_index(x.shape, starts.tolist(), ends.tolist(), None if axes is None else axes.tolist(),
                             None if steps is None else steps.tolist())
        if key is not None and len(cache) < 64:
            cache[key] = index
        return x[index]


@register("Gather", since=1)
class Gather(Kernel):
    inline_fn = INLINE_APPLY

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.axis = node.attr("axis", 0)

    def compute(self, inputs: list) -> list:
        x, idx = inputs
        return [self.apply(x, idx)]

    def apply(self, x: np.ndarray, idx: np.ndarray) -> np.ndarray:
        if idx.dtype.kind in "iu" and -x.ndim <= self.axis < x.ndim:
            try:  # take checks [-n, n) itself, as ONNX asks: no separate min/max pass
                # the ndarray method, not np.take: the same call without a Python wrapper that
                # costs more than the gather on a model's small index tensors
                r = x.take(idx, axis=self.axis) if x.__class__ is np.ndarray else np.take(x, idx, axis=self.axis)
                return r if r.__class__ is np.ndarray else np.asarray(r)
            except IndexError:
                pass
        _check_indices("Gather", idx, x.shape[self.axis] if -x.ndim <= self.axis < x.ndim else 0, self.axis)
        return np.asarray(np.take(x, idx, axis=self.axis))


def _check_indices(op: str, idx: np.ndarray, n: int, axis: int) -> None:
    """Indices must lie in [-n, n): numpy would wrap some and raise a bare IndexError on others."""
    bad = first_out_of_range(idx, n)
    if bad is not None:
        raise InvalidArgument(f"{op}: index {bad} is out of range for axis {axis} of length {n}; "
                              f"indices must lie in [{-n}, {n - 1}].")


@register("GatherElements", since=11)
class GatherElements(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.axis = node.attr("axis", 0)
        self._bases: dict[tuple, np.ndarray] = {}

    def compute(self, inputs: list) -> list:
        x, idx = inputs
        if x.ndim != idx.ndim or not -x.ndim <= self.axis < x.ndim:
            raise InvalidArgument(f"GatherElements: data {list(x.shape)} and indices {list(idx.shape)} must have one "
                                  f"rank, and axis {self.axis} must lie in it.")
        axis = self.axis % x.ndim
        # The output has the indices' shape: other axes of the data may be longer (read a prefix).
        if any(i > d for k, (i, d) in enumerate(zip(idx.shape, x.shape)) if k != axis):
            raise InvalidArgument(f"GatherElements: indices {list(idx.shape)} are longer than data {list(x.shape)} "
                                  f"on an axis other than {axis}.")
        _check_indices("GatherElements", idx, x.shape[axis], axis)
        if not x.flags.c_contiguous or idx.size == 0:
            x = x[tuple(slice(None) if k == axis else slice(0, i) for k, i in enumerate(idx.shape))]
            return [np.take_along_axis(x, idx.astype(np.int64, copy=False), axis=axis)]
        # One np.take on x's flat memory (take_along_axis builds an open mesh of aranges per call):
        # the flat position of out[i] is base[i] + idx[i] * stride(axis), base memoized per shape.
        key = (x.shape, idx.shape, axis)
        base = self._bases.get(key)
        if base is None:
            strides = [math.prod(x.shape[k + 1:]) for k in range(x.ndim)]
            base = np.zeros(idx.shape, np.int64)
            for k, n in enumerate(idx.shape):
                if k != axis:
                    base += (np.arange(n, dtype=np.int64) * strides[k]).reshape((n,) + (1,) * (idx.ndim - k - 1))
            base.flags.writeable = False
            if len(self._bases) < 64:
                self._bases[key] = base
        n = x.shape[axis]
        pos = idx.astype(np.int64)  # a copy: negative indices are wrapped in it
        if np.minimum.reduce(pos, axis=None) < 0:
            pos[pos < 0] += n
        pos *= math.prod(x.shape[axis + 1:])
        pos += base
        return [np.take(x.reshape(-1), pos)]


def _axes_tuple(axes) -> tuple:
    if isinstance(axes, int):  # a 0-d axes tensor
        return (axes,)
    return tuple(int(a) for a in axes)


@functools.lru_cache(maxsize=256)
def _insert_at(rank: int, axes: tuple) -> tuple | None:
    """Where Unsqueeze puts its length-1 axes in an output of ``rank`` (ascending), None where
    the axes are out of range or repeated."""
    at = sorted(a + rank if a < 0 else a for a in axes)
    if not at or at[0] < 0 or at[-1] >= rank or len(set(at)) != len(at):
        return None
    return tuple(at)


def _unsqueeze(x: np.ndarray, axes: tuple) -> np.ndarray:
    """``np.expand_dims(x, axes)`` as one reshape where the axes are valid (a view: inserting
    length-1 axes never needs a copy). Shape chains and loop bodies unsqueeze small tensors at every
    step, and expand_dims' axis normalization was most of such a node's time; invalid axes go to
    expand_dims, whose error names them."""
    at = _insert_at(x.ndim + len(axes), axes)
    if at is None:
        return np.expand_dims(x, axes)
    shape = list(x.shape)
    for a in at:
        shape.insert(a, 1)
    return x.reshape(shape)


@register("Unsqueeze", since=1)
class UnsqueezeAttr(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.axes = _axes_tuple(node.attr("axes", []))

    def compute(self, inputs: list) -> list:
        return [_unsqueeze(inputs[0], self.axes)]


@register("Unsqueeze", since=13)
class Unsqueeze(Kernel):
    host_inputs = frozenset({1})

    inline_fn = INLINE_APPLY

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        # axes from a constant initializer: the same array every run, read once
        self.constant_axes = ctx is not None and len(node.inputs) > 1 and bool(node.inputs[1]) \
            and ctx.is_constant_initializer(node.inputs[1])
        self._axes: tuple | None = None  # (the axes array, its tuple, input shape -> output shape)

    def compute(self, inputs: list) -> list:
        return [self.apply(*inputs)]

    def apply(self, x: np.ndarray, a: np.ndarray) -> np.ndarray:
        kept = self._axes
        if kept is not None and kept[0] is a:
            # constant axes: the output shape per input shape (a loop body unsqueezes the same
            # scalars every iteration)
            shape = kept[2].get(x.shape)
            if shape is not None:
                return x.reshape(shape)
            out = _unsqueeze(x, kept[1])
            if len(kept[2]) < 64:
                kept[2][x.shape] = out.shape
            return out
        axes = _axes_tuple(a.tolist())
        if self.constant_axes:
            self._axes = (a, axes, {})  # one swap: a concurrent run sees either
        return _unsqueeze(x, axes)


def _squeeze(x: np.ndarray, axes) -> np.ndarray:
    if axes is None:
        return np.squeeze(x)
    return np.squeeze(x, axis=_axes_tuple(axes))


@register("Squeeze", since=1)
class SqueezeAttr(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.axes = node.attr("axes")

    def compute(self, inputs: list) -> list:
        return [_squeeze(inputs[0], self.axes)]


@register("Squeeze", since=13)
class Squeeze(Kernel):
    host_inputs = frozenset({1})

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self._shapes: dict[tuple, tuple] = {}  # (input shape, axes) -> output shape

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        axes = inputs[1].tolist() if len(inputs) > 1 and inputs[1] is not None else None
        key = (x.shape, axes if axes is None or isinstance(axes, int) else tuple(axes))
        shape = self._shapes.get(key)
        if shape is not None:  # a reshape (a view) in place of np.squeeze's Python layers
            return [x.reshape(shape)]
        y = _squeeze(x, axes)  # (checks the axes: a bad one raises here, and is not kept)
        if len(self._shapes) < 64:  # a few shapes per model; a stream of new ones is not kept
            self._shapes[key] = y.shape
        return [y]


@register("Expand", since=8)
class Expand(_NoAttr):
    host_inputs = frozenset({1})
    inline_fn = INLINE_APPLY

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self._shapes: dict[tuple, tuple] = {}  # (input shape, asked shape) -> output shape

    def compute(self, inputs: list) -> list:
        return [self.apply(inputs[0], inputs[1])]

    def apply(self, x: np.ndarray, asked: np.ndarray) -> np.ndarray:
        key = (x.shape, tuple(asked.tolist()))
        shape = self._shapes.get(key)
        if shape is None:
            shape = np.broadcast_shapes(x.shape, tuple(int(s) for s in key[1]))
            if len(self._shapes) < 64:  # a few shapes per model; a stream of new ones is not kept
                self._shapes[key] = shape
        # one broadcasting copy (np.array(np.broadcast_to(...)) costs three times as much on small inputs)
        y = np.empty(shape, x.dtype)
        np.copyto(y, x)
        return y


@register("Shape", since=1)
class Shape(Kernel):
    host_outputs = frozenset({0})
    #: Only the input's shape is read: the runtime hands over a device tensor as it is, no copy.
    metadata_inputs = frozenset({0})

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.start = node.attr("start", 0)
        self.end = node.attr("end")

    def compute(self, inputs: list) -> list:
        return [np.array(inputs[0].shape[self.start:self.end], dtype=_INT64)]


@register("Size", since=1)
class Size(_NoAttr):
    host_outputs = frozenset({0})
    metadata_inputs = frozenset({0})  # as Shape: no copy of a device tensor

    def compute(self, inputs: list) -> list:
        return [np.array(inputs[0].size, dtype=_INT64)]


@register("Tile", since=6)
class Tile(_NoAttr):
    host_inputs = frozenset({1})

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.name = node.name

    def compute(self, inputs: list) -> list:
        x, repeats = inputs[0], np.asarray(inputs[1])
        # onnxruntime's checks and words (Tile::Compute), so that a bad 'repeats' is refused, not run
        # (np.tile would broadcast a short one) or failed inside numpy.
        where = f"Tile node {self.name!r}: "
        if repeats.ndim != 1:
            raise InvalidArgument(f"{where}'repeat' input tensor must be 1 dimensional; got shape "
                                  f"{list(repeats.shape)}. Give one repeat count per axis of the input.")
        if repeats.shape[0] != x.ndim:
            raise InvalidArgument(f"{where}'repeat' input tensor must have the same length as the 'input' tensor: "
                                  f"{repeats.shape[0]} repeats for an input of rank {x.ndim} {list(x.shape)}.")
        if repeats.dtype != np.int64:
            raise InvalidArgument(f"{where}'repeats' must be int64, got {repeats.dtype}.")
        counts = repeats.tolist()
        if any(r < 0 for r in counts):
            raise InvalidArgument(f"{where}Tile repeat value must be non-negative, got: {min(counts)} in {counts}.")
        return [np.tile(x, counts)]


def _pad(x: np.ndarray, pads, mode: str, value, axes=None) -> np.ndarray:
    nd = x.ndim
    pads = [int(p) for p in pads]
    if axes is None:
        axes = list(range(nd))
    else:
        axes = [int(a) + nd if int(a) < 0 else int(a) for a in axes]
    k = len(axes)
    if len(pads) != 2 * k or any(not 0 <= a < nd for a in axes):
        raise InvalidArgument(f"Pad: {len(pads)} pads for axes {axes} of a rank-{nd} input; give two per axis "
                              f"(all begins, then all ends).")
    width = [[0, 0] for _ in range(nd)]
    for i, a in enumerate(axes):
        width[a] = [pads[i], pads[i + k]]
    out = [d + b + e for d, (b, e) in zip(x.shape, width)]
    if min(out, default=0) < 0:
        raise InvalidArgument(f"Pad: pads {pads} crop the input {list(x.shape)} to a negative size {out}.")
    if mode == "constant":
        value = 0 if value is None else value
        if all(b >= 0 and e >= 0 for b, e in width):
            if nd and x.dtype != object and ((type(value) is int and value == 0) or
                                             (isinstance(value, np.generic) and value.dtype == x.dtype)):
                # np.pad's general machinery costs more than the copy on small inputs; a filled array and one
                # copy into its middle give the same result (a value of x's own type: no casting).
                y = np.full(out, value, dtype=x.dtype)
                y[tuple(slice(b, b + d) for d, (b, _) in zip(x.shape, width))] = x
                return y
            return np.pad(x, width, mode="constant", constant_values=value)
        # Output index j holds input index j - begin (the spec's shape, d + begin + end, also when a
        # negative pad on one side reaches past a positive one on the other): copy the overlap.
        y = np.full(out, value, dtype=x.dtype)
        src = tuple(slice(max(0, -b), min(d, d + e)) for d, (b, e) in zip(x.shape, width))
        if all(s.start < s.stop for s in src):
            y[tuple(slice(s.start + b, s.stop + b) for s, (b, _) in zip(src, width))] = x[src]
        return y
    # Edge, reflect and wrap extend what is left after the negative pads crop; as in onnxruntime,
    # cropping an axis to nothing is an error in these modes, and so is extending an empty one.
    for a, (d, (b, e)) in enumerate(zip(x.shape, width)):
        left = d - max(-b, 0) - max(-e, 0)
        if (left <= 0 and (b < 0 or e < 0)) or (d == 0 and (b > 0 or e > 0)):
            raise InvalidArgument(f"Pad: mode {mode!r} with pads {[b, e]} leaves axis {a} (length {d}) nothing to "
                                  f"extend; use mode 'constant' or smaller negative pads.")
    if any(b < 0 or e < 0 for b, e in width):
        x = x[tuple(slice(max(-b, 0), d - max(-e, 0)) for d, (b, e) in zip(x.shape, width))]
        width = [[max(b, 0), max(e, 0)] for b, e in width]
    for d, (b, e), a in zip(x.shape, width, range(nd)):
        if mode == "reflect" and (b or e) and max(b, e) >= d:  # numpy would reflect again; onnxruntime refuses
            raise InvalidArgument(f"Pad: reflect pads {[b, e]} on axis {a} of length {d} (after negative pads); "
                                  f"each must be less than the length.")
    return np.pad(x, width, mode=mode)


def _constant_pad_geometry(shape: tuple, pads: list, axes: list | None) -> tuple[tuple, tuple] | None:
    """(output shape, slice of the output the input fills) for a constant Pad whose pads are all
    non-negative, or None where ``_pad`` must decide (negative pads, or pads it refuses)."""
    nd = len(shape)
    axes = list(range(nd)) if axes is None else [int(a) + nd if int(a) < 0 else int(a) for a in axes]
    k = len(axes)
    if len(pads) != 2 * k or any(not 0 <= a < nd for a in axes):
        return None
    width = [[0, 0] for _ in range(nd)]
    for i, a in enumerate(axes):
        width[a] = [int(pads[i]), int(pads[i + k])]
    if any(b < 0 or e < 0 for b, e in width):
        return None
    out = tuple(d + b + e for d, (b, e) in zip(shape, width))
    return out, tuple(slice(b, b + d) for d, (b, _) in zip(shape, width))


@register("Pad", since=1)
@register("Pad", since=2)
class PadAttr(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.pads = node.attr("pads", node.attr("paddings"))
        self.mode = node.attr("mode", "constant")
        self.value = node.attr("value", 0.0)

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        return [_pad(x, self.pads, self.mode, x.dtype.type(self.value) if x.dtype != object else self.value)]


@register("Pad", since=11)
class Pad(Kernel):
    host_inputs = frozenset({1, 2, 3})

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.mode = node.attr("mode", "constant")
        #: (input shape, pads, axes) -> _constant_pad_geometry: a MobileNet export pads before each
        #: convolution, the same few shapes at every run
        self._geometries: dict[tuple, tuple[tuple, tuple] | None] = {}
        #: (input shape, pads, axes) -> pad_indices.take_plan, for edge, reflect and wrap
        self._takes: dict[tuple, tuple | None] = {}
        self.index_pad = pad_indices.INDEX_PAD_ENABLED and self.mode in pad_indices.INDEX_MODES
        self.last_path = ""  #: the PAD_PATHS path of the last edge, reflect or wrap run (tests read it)

    def compute(self, inputs: list) -> list:
        n = len(inputs)
        value = inputs[2] if n > 2 and inputs[2] is not None and inputs[2].size else None
        if value is not None:
            if value.size != 1:
                raise InvalidArgument(f"Pad: constant_value has {value.size} elements {list(value.shape)}; give a "
                                      f"scalar (axes are input 3).")
            value = value.reshape(-1)[0]
        axes = inputs[3].tolist() if n > 3 and inputs[3] is not None else None
        x, pads = inputs[0], inputs[1].tolist()
        if (self.mode == "constant" and x.ndim and x.dtype != object
                and (value is None or (isinstance(value, np.generic) and value.dtype == x.dtype))):
            key = (x.shape, tuple(pads), None if axes is None else tuple(axes))
            geometry = self._geometries.get(key, False)
            if geometry is False:
                geometry = _constant_pad_geometry(x.shape, pads, axes)
                if len(self._geometries) < 64:
                    self._geometries[key] = geometry
            if geometry is not None:  # _pad's constant fast path, its checks done once per shape
                out, inner = geometry
                y = np.full(out, 0 if value is None else value, dtype=x.dtype)
                y[inner] = x
                return [y]
        if self.index_pad and pad_indices.INDEX_PAD_ENABLED and x.dtype != object:
            key = (x.shape, tuple(pads), None if axes is None else tuple(axes))
            plan = self._takes.get(key, False)
            if plan is False:
                plan = pad_indices.take_plan(x.shape, pads, self.mode, axes)
                if len(self._takes) < 64:
                    self._takes[key] = plan
            if plan is not None:
                self.last_path = pad_indices.INDEX_TAKE
                return [pad_indices.run_plan(x, plan)]
        self.last_path = pad_indices.NP_PAD
        return [_pad(x, pads, self.mode, value, axes)]


@register("Constant", since=1)
class Constant(Kernel):
    """The value is built once; every run returns the same (read-only) array."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        a = node.attributes
        if "value" in a:
            v = np.asarray(a["value"])
        elif "value_float" in a:
            v = np.array(a["value_float"], dtype=np.float32)
        elif "value_floats" in a:
            v = np.array(a["value_floats"], dtype=np.float32)
        elif "value_int" in a:
            v = np.array(a["value_int"], dtype=np.int64)
        elif "value_ints" in a:
            v = np.array(a["value_ints"], dtype=np.int64)
        elif "value_string" in a:
            v = np.array(a["value_string"], dtype=object)
        elif "value_strings" in a:
            v = np.array(a["value_strings"], dtype=object)
        elif "sparse_value" in a:
            v = sparse_to_dense(a["sparse_value"], f"Constant node {node.name!r}'s sparse_value")
        else:
            from onnxhal.hal.errors import InvalidArgument

            raise InvalidArgument(f"Constant node {node.name!r} has no value attribute; set 'value'")
        v.flags.writeable = False
        self.value = v

    def compute(self, inputs: list) -> list:
        return [self.value]


@register("ConstantOfShape", since=9)
class ConstantOfShape(Kernel):
    host_inputs = frozenset({0})

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        v = node.attr("value")
        self.value = np.asarray(v).reshape(-1)[0] if v is not None else np.float32(0)
        self.dtype = np.asarray(v).dtype if v is not None else np.dtype(np.float32)
        # all bits zero (not -0.0): np.zeros, a C call, in place of np.full's Python layers
        self.zeros = np.asarray(self.value, self.dtype).tobytes() == bytes(self.dtype.itemsize)

    def compute(self, inputs: list) -> list:
        shape = tuple(inputs[0].tolist())  # (tolist: Python ints)
        if self.zeros:
            return [np.zeros(shape, self.dtype)]
        return [np.full(shape, self.value, dtype=self.dtype)]


@register("Range", since=11)
class Range(_NoAttr):
    def compute(self, inputs: list) -> list:
        start, limit, delta = (v.reshape(-1)[0] for v in inputs)
        return [np.asarray(np.arange(start, limit, delta)).astype(inputs[0].dtype, copy=False)]
