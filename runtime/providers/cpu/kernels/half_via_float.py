"""float16 products computed in float32: the fast path of MatMul, Gemm, Conv, their fused forms
and RNN, GRU and LSTM when their inputs are float16.

numpy has no BLAS for float16: its matmul runs a plain C loop, and a float16 model (as
onnxconverter-common writes it) spent nearly all its time there. onnxruntime's CPU EP has no
float16 kernels for these ops on x86 either; it inserts Casts to float32 around them
(``InsertCastTransformer``), so each product is computed in float32 and rounded to float16 once.
This does the same inside the kernel: float16 inputs widened to float32 (a constant weight once,
kept per kernel), the float32 kernel run, its outputs rounded to float16.

``ENABLED`` False keeps the plain float16 kernels (the tests compare the two).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from onnxhal.hal import KernelCreateContext, Node

F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)

#: The fast path's switch: False runs float16 products in numpy's float16 arithmetic.
ENABLED = True


def applies(a: np.ndarray, b: np.ndarray) -> bool:
    """The condition that selects the fast path: both operands of the product float16 (kernels
    test ``a.dtype is F16`` first, so that the float32 path pays one identity test)."""
    return ENABLED and a.dtype is F16 and b.dtype is F16


class WidenedInputs:
    """Widens a kernel's float16 inputs to float32, keeping the copy of each constant initializer
    (the same array every run) so that weights are widened once, not per run."""

    def __init__(self, node: Node, ctx: KernelCreateContext | None) -> None:
        self.constant = frozenset(i for i, name in enumerate(node.inputs)
                                  if name and ctx is not None and ctx.is_constant_initializer(name))
        # input index -> (the float16 array, its float32 copy); a race only widens one twice
        self._copies: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def __call__(self, inputs: list) -> list:
        out = []
        for i, v in enumerate(inputs):
            if not isinstance(v, np.ndarray) or v.dtype is not F16:
                out.append(v)
            elif i in self.constant:
                kept = self._copies.get(i)
                if kept is None or kept[0] is not v:
                    kept = (v, v.astype(_F32))
                    self._copies[i] = kept
                out.append(kept[1])
            else:
                out.append(v.astype(_F32))
        return out


def via_float32(compute: Callable[[list], list], inputs: list, widen: WidenedInputs) -> list:
    """``compute`` on the widened inputs, its float32 outputs rounded to float16."""
    return [y.astype(F16) if isinstance(y, np.ndarray) and y.dtype is _F32 else y for y in compute(widen(inputs))]
