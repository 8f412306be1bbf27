"""Einsum: numpy's einsum on the equation, in the inputs' type.

With three or more operands numpy searches a contraction order (``einsum_path``) on every call,
half of the call at small sizes (a Mamba-2 scan's ``bhts,bsh,bshp->bthp``: 55 us, 26 us given
the path). The kernel keeps the path it found per operand shapes (``PATHS_KEPT`` at most) and
passes it back: the same order, so the same arithmetic and the same bits."""

from __future__ import annotations

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels.registry import register

#: contraction paths one Einsum node keeps, by operand shapes (dynamic shapes bring new ones)
PATHS_KEPT = 16


@register("Einsum", since=12)
class Einsum(Kernel):
    """numpy's einsum on the equation (contractions through BLAS where numpy's path finds them),
    in the inputs' type."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.equation = str(node.attr("equation", "")).replace(" ", "")
        self.paths: dict[tuple, list] = {}  # operand shapes -> numpy's contraction path for them

    def compute(self, inputs: list) -> list:
        dtype = inputs[0].dtype
        if dtype.kind not in "fiub":  # bfloat16 and the other ml_dtypes: numpy's einsum takes float32
            inputs = [x.astype(np.float32) for x in inputs]
        try:
            out = np.einsum(self.equation, *inputs, optimize=self.path(inputs))
        except ValueError as exc:
            raise InvalidArgument(f"Einsum: equation {self.equation!r} does not fit inputs "
                                  f"{[list(np.shape(x)) for x in inputs]}: {exc}") from None
        return [np.asarray(out).astype(dtype, copy=False)]

    def path(self, inputs: list) -> list | bool:
        """numpy's contraction path for these operands' shapes, found once (False for one or two
        operands: numpy's direct loop, as before)."""
        if len(inputs) <= 2:
            return False
        shapes = tuple(x.shape for x in inputs)
        path = self.paths.get(shapes)
        if path is None:
            path = np.einsum_path(self.equation, *inputs, optimize="greedy")[0]  # optimize=True's search
            if len(self.paths) >= PATHS_KEPT:
                self.paths.clear()
            self.paths[shapes] = path
        return path
