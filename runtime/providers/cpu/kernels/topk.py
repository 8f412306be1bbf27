"""TopK (opsets 1, 10, 11): the k largest (or smallest) values along an axis and their indices,
equal values in index order, as onnxruntime and the spec order them; NaN counts as the largest
value (numpy's sort order)."""

from __future__ import annotations

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels.registry import register


@register("TopK", since=1)
class TopK(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.axis = int(node.attr("axis", -1))
        self.largest = bool(node.attr("largest", 1))
        self.k_attr = node.attr("k")  # opset 1; an input from opset 10
        self.name = node.name

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        k = int(self.k_attr) if self.k_attr is not None else int(np.asarray(inputs[1]).reshape(-1)[0])
        if x.ndim == 0:
            raise InvalidArgument(f"TopK node {self.name!r}: X is a scalar; it needs an axis to take values from.")
        axis = self.axis + x.ndim if self.axis < 0 else self.axis
        if not 0 <= axis < x.ndim:
            raise InvalidArgument(f"TopK node {self.name!r}: axis {self.axis} is out of range for X of rank {x.ndim}.")
        n = x.shape[axis]
        if not 0 <= k <= n:
            raise InvalidArgument(f"TopK node {self.name!r}: K = {k} for an axis of length {n}; K must be in [0, {n}].")
        if axis == x.ndim - 1 and 0 < k and 4 * k <= n and x.dtype.kind in "fiu":
            done = _few_of_many(x, k, self.largest)
            if done is not None:
                return done
        moved = np.moveaxis(x, axis, -1)
        if self.largest:
            # a stable ascending sort of the reversed axis, read backwards: values descending and
            # equal values in increasing index order
            order = np.argsort(moved[..., ::-1], axis=-1, kind="stable")[..., ::-1]
            index = (n - 1) - order[..., :k]
        else:
            index = np.argsort(moved, axis=-1, kind="stable")[..., :k]
        values = np.take_along_axis(moved, index, axis=-1)
        return [np.moveaxis(values, -1, axis), np.moveaxis(index.astype(np.int64), -1, axis)]


def _few_of_many(x: np.ndarray, k: int, largest: bool) -> list | None:
    """TopK of a few (k <= n / 4) along the last axis without sorting whole rows: the k-th value
    by ``np.partition``, the elements on its side of it (in index order), and a stable sort of
    those alone; the same result as the full stable sort where every row has exactly k such
    elements. None (the full sort decides) where a row has more (ties at the k-th value) or a
    NaN is among the largest."""
    n = x.shape[-1]
    rows = np.ascontiguousarray(x).reshape(-1, n)
    if largest:
        if x.dtype.kind == "f" and np.isnan(np.add.reduce(rows, axis=None)):  # NaN (or inf - inf): a NaN is largest
            return None
        kth = np.partition(rows, n - k, axis=1)[:, n - k:n - k + 1]
        near = rows >= kth
    else:
        kth = np.partition(rows, k - 1, axis=1)[:, k - 1:k]  # NaN sorts last: never among the smallest k
        near = rows <= kth
    if np.count_nonzero(near) != rows.shape[0] * k:  # each row has k at least: exactly k each
        return None
    flat = near.reshape(-1).nonzero()[0].reshape(-1, k)  # each row's k, flat, in index order
    values = rows.reshape(-1).take(flat)
    if largest:  # descending, equal values in index order: the reversed rows' stable ascending order
        order = (k - 1) - np.argsort(values[:, ::-1], axis=1, kind="stable")[:, ::-1]
    else:
        order = np.argsort(values, axis=1, kind="stable")
    order += np.arange(0, values.size, k, dtype=np.intp)[:, None]
    flat -= np.arange(0, rows.size, n, dtype=np.intp)[:, None]  # flat -> column
    shape = x.shape[:-1] + (k,)
    return [values.reshape(-1).take(order).reshape(shape), flat.reshape(-1).take(order).astype(np.int64).reshape(shape)]
