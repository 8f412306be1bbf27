"""ScatterElements, ScatterND and the deprecated Scatter: a copy of the data with updates written
(or reduced) at the given indices.

Updates apply in order, as onnxruntime does: with duplicate indices the last write wins
(``none``) or every update is reduced in (``add``/``mul``/``max``/``min``). ``max``/``min`` follow
onnxruntime's ``std::max(data, update)`` order, which a NaN makes visible: a NaN update propagates,
a NaN already in the data is replaced. onnx.reference's versions used ``np.maximum``, which keeps
the data's NaN.
"""

from __future__ import annotations

import math

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels.kernel_paths import path_table
from onnxhal.runtime.providers.cpu.kernels.native_kernels import native_module
from onnxhal.runtime.providers.cpu.kernels.registry import register

_REDUCTIONS = ("none", "add", "mul", "max", "min")
_CODES = {r: k for k, r in enumerate(_REDUCTIONS)}  # _native's reduction codes
#: Operand signatures a scatter node keeps its checked C arguments for (a few shapes per model; a
#: stream of new ones is not kept).
NATIVE_ARGS_LIMIT = 64


def _run_native(fn, data: np.ndarray, idx: np.ndarray, upd: np.ndarray, args: tuple) -> np.ndarray | None:
    """A copy of ``data`` scattered by the C loop ``fn`` with its arguments ``args``, or None where an
    index is out of range (the canonical form then names it)."""
    out = np.array(data, order="C")
    return out if fn(out, np.ascontiguousarray(idx), np.ascontiguousarray(upd), *args) < 0 else None

SCATTER_PATHS = path_table("ScatterElements/ScatterND", "flat: numpy, the updates through flat indices by one "
                                                        "1-D ufunc.at in C order, onnxruntime's NaN order for max/min")
FLAT = SCATTER_PATHS.add("flat", "canonical: every other case (other types, ScatterElements indices shorter than "
                                 "the data on another axis, no indices, no C module)")
NATIVE = SCATTER_PATHS.add("native", "the C extension _native is built and ONNXHAL_NATIVE_KERNELS is not 0 at "
                                     "kernel build, float32 data and updates, int64 indices, at least one; "
                                     "ScatterElements' indices as long as the data on every axis but its own: one C "
                                     "loop in the same order (a graph network's scatters: 15-20 us -> 3-5 us)")


def _normalize(op: str, idx: np.ndarray, dims) -> np.ndarray:
    """Indices made non-negative; ``dims`` broadcasts against ``idx`` (one length per index column)."""
    idx = idx.astype(np.int64, copy=False)
    n = np.asarray(dims, dtype=np.int64)
    if idx.size and idx.min() >= 0 and idx.max() < n.min():  # the common case: two reductions, no copy
        return idx
    if idx.size and ((idx < -n) | (idx >= n)).any():
        bad = np.argwhere((idx < -n) | (idx >= n))[0]
        length = int(np.broadcast_to(n, idx.shape)[tuple(bad)])
        raise InvalidArgument(f"{op}: index {int(idx[tuple(bad)])} at {bad.tolist()} is out of range for an axis of "
                              f"length {length}; indices must lie in [-{length}, {length - 1}].")
    return np.where(idx < 0, idx + n, idx)


def _strides(shape: tuple) -> list[int]:
    """A C-contiguous array's strides in elements."""
    strides = [1] * len(shape)
    for k in range(len(shape) - 2, -1, -1):
        strides[k] = strides[k + 1] * shape[k + 1]
    return strides


def _apply(out: np.ndarray, cells: np.ndarray, upd: np.ndarray, reduction: str) -> None:
    """Write or reduce ``upd`` into the C-contiguous ``out`` at the flat indices ``cells`` (of
    ``upd``'s shape), update by update in C order. Flat 1-D indices, not one index array per axis:
    ``ufunc.at`` takes its fast loop only for those (4-9x faster on a graph network's [96, 16]
    updates, the same updates in the same order)."""
    view, cells, upd = out.reshape(-1), cells.reshape(-1), upd.reshape(-1)
    if reduction == "none":
        view[cells] = upd  # numpy assigns in order: the last duplicate wins
    elif reduction == "add":
        np.add.at(view, cells, upd)
    elif reduction == "mul":
        np.multiply.at(view, cells, upd)
    elif out.dtype.kind != "f" or not (np.isnan(upd).any() or np.isnan(view[cells]).any()):
        (np.maximum if reduction == "max" else np.minimum).at(view, cells, upd)
    else:  # onnxruntime's std::max(data, update) / std::min(data, update), one element at a time
        for cell, u in zip(cells.tolist(), upd):
            d = view[cell]
            if not (u < d if reduction == "max" else d < u):
                view[cell] = u


def _reduction(node: Node) -> str:
    reduction = node.attr("reduction", "none")
    if reduction not in _REDUCTIONS:
        raise InvalidArgument(f"{node.op_type} node {node.name!r}: reduction {reduction!r}; the spec allows "
                              f"{', '.join(_REDUCTIONS)}.")
    return reduction


@register("Scatter", since=9)
@register("ScatterElements", since=11)
class ScatterElements(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.op = node.op_type
        self.axis = node.attr("axis", 0)
        self.reduction = _reduction(node)
        self.native = native_module()
        self.native_args: dict = {}  # operand shapes and dtypes checked and on path native -> its C arguments

    def path(self, data: np.ndarray, idx: np.ndarray, upd: np.ndarray) -> str:
        """The path ``SCATTER_PATHS`` names for these (validated) operands."""
        axis = self.axis % data.ndim
        if (self.native is not None and data.dtype == np.float32 and upd.dtype == np.float32
                and idx.dtype == np.int64 and idx.size
                and all(i == d for k, (i, d) in enumerate(zip(idx.shape, data.shape)) if k != axis)):
            return NATIVE
        return FLAT

    def compute(self, inputs: list) -> list:
        data, idx, upd = inputs
        key = (data.shape, idx.shape, upd.shape, data.dtype, idx.dtype, upd.dtype)
        args = self.native_args.get(key)
        if args is not None:  # shapes checked at an earlier run: straight to the C loop
            out = _run_native(self.native.scatter_elements, data, idx, upd, args)
            if out is not None:
                return [out]
        if not (data.ndim == idx.ndim >= 1 and idx.shape == upd.shape and -data.ndim <= self.axis < data.ndim):
            raise InvalidArgument(f"{self.op}: data {list(data.shape)}, indices {list(idx.shape)} and updates "
                                  f"{list(upd.shape)} with axis {self.axis}: indices and updates need one shape, of "
                                  f"the data's rank, and the axis must lie in it.")
        axis = self.axis % data.ndim
        if any(i > d for k, (i, d) in enumerate(zip(idx.shape, data.shape)) if k != axis):
            raise InvalidArgument(f"{self.op}: indices {list(idx.shape)} are longer than data {list(data.shape)} on an "
                                  f"axis other than {axis}.")
        if self.path(data, idx, upd) == NATIVE:
            args = (math.prod(data.shape[:axis]), data.shape[axis], idx.shape[axis], math.prod(data.shape[axis + 1:]),
                    _CODES[self.reduction])
            if len(self.native_args) < NATIVE_ARGS_LIMIT:
                self.native_args[key] = args
            out = _run_native(self.native.scatter_elements, data, idx, upd, args)
            if out is not None:
                return [out]
        out = np.array(data, order="C")  # a copy, C-contiguous for the flat indices
        if idx.size:
            strides = _strides(data.shape)
            cells = _normalize(self.op, idx, data.shape[axis])
            if strides[axis] != 1:
                cells = cells * strides[axis]
            for k, w in enumerate(np.indices(idx.shape, sparse=True) if data.ndim > 1 else ()):
                if k != axis:  # the other axes' coordinates, which broadcast against the indices
                    cells = cells + w * strides[k]
            _apply(out, cells, upd.astype(out.dtype, copy=False), self.reduction)
        return [out]


@register("ScatterND", since=11)
class ScatterND(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.reduction = _reduction(node)
        self.native = native_module()
        self.native_args: dict = {}  # operand shapes and dtypes checked and on path native -> its C arguments

    def path(self, data: np.ndarray, idx: np.ndarray, upd: np.ndarray) -> str:
        """The path ``SCATTER_PATHS`` names for these (validated) operands."""
        if (self.native is not None and data.dtype == np.float32 and upd.dtype == np.float32
                and idx.dtype == np.int64 and idx.size):
            return NATIVE
        return FLAT

    def compute(self, inputs: list) -> list:
        data, idx, upd = inputs
        key = (data.shape, idx.shape, upd.shape, data.dtype, idx.dtype, upd.dtype)
        args = self.native_args.get(key)
        if args is not None:  # shapes checked at an earlier run: straight to the C loop
            out = _run_native(self.native.scatter_nd, data, idx, upd, args)
            if out is not None:
                return [out]
        k = idx.shape[-1] if idx.ndim else -1
        if idx.ndim < 1 or not 1 <= k <= data.ndim or upd.shape != idx.shape[:-1] + data.shape[k:]:
            raise InvalidArgument(f"ScatterND: data {list(data.shape)}, indices {list(idx.shape)}, updates "
                                  f"{list(upd.shape)}: the indices' last dimension k must lie in [1, rank(data)] "
                                  f"and updates must be indices.shape[:-1] + data.shape[k:].")
        if self.path(data, idx, upd) == NATIVE:
            args = (np.array(data.shape[:k], np.int64), math.prod(data.shape[k:]), _CODES[self.reduction])
            if len(self.native_args) < NATIVE_ARGS_LIMIT:
                self.native_args[key] = args
            out = _run_native(self.native.scatter_nd, data, idx, upd, args)
            if out is not None:
                return [out]
        out = np.array(data, order="C")  # a copy, C-contiguous for the flat indices
        rows = idx.reshape(-1, k)
        if rows.shape[0]:
            rows = _normalize("ScatterND", rows, data.shape[:k])
            strides = _strides(data.shape)
            inner = strides[k - 1]  # elements per addressed slice
            cells = rows[:, 0] * strides[0] if k == 1 else rows @ np.array(strides[:k], np.int64)
            if inner > 1:
                cells = cells[:, None] + np.arange(inner)
            _apply(out, cells, upd.astype(out.dtype, copy=False), self.reduction)
        return [out]
