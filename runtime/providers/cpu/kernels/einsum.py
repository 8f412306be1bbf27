"""Einsum: numpy's einsum on the equation, in the inputs' type."""

from __future__ import annotations

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels.registry import register


@register("Einsum", since=12)
class Einsum(Kernel):
    """numpy's einsum on the equation (contractions through BLAS where numpy's path finds them),
    in the inputs' type."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.equation = str(node.attr("equation", "")).replace(" ", "")

    def compute(self, inputs: list) -> list:
        dtype = inputs[0].dtype
        if dtype.kind not in "fiub":  # bfloat16 and the other ml_dtypes: numpy's einsum takes float32
            inputs = [x.astype(np.float32) for x in inputs]
        try:
            out = np.einsum(self.equation, *inputs, optimize=len(inputs) > 2)
        except ValueError as exc:
            raise InvalidArgument(f"Einsum: equation {self.equation!r} does not fit inputs "
                                  f"{[list(np.shape(x)) for x in inputs]}: {exc}") from None
        return [np.asarray(out).astype(dtype, copy=False)]
