"""Kernels that take sparse tensors: com.microsoft SparseToDenseMatMul.

A sparse value reaches a kernel as the session's sparse tensor object (COO or CSR, host memory), which
offers ``to_dense()``; the product is computed on the dense form, which is exact (the zeros add
nothing) and as fast as numpy's GEMM for the sizes such models use.
"""

from __future__ import annotations

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels.registry import register

MS = "com.microsoft"


def dense_of(value: object, what: str) -> np.ndarray:
    """A sparse tensor's dense array (anything with ``to_dense()``), or a dense array as it is."""
    to_dense = getattr(value, "to_dense", None)
    if callable(to_dense):
        return np.asarray(to_dense())
    if isinstance(value, np.ndarray):
        return value
    raise InvalidArgument(f"{what}: expected a sparse or dense tensor, got {type(value).__name__}")


@register("SparseToDenseMatMul", since=1, domain=MS)
class SparseToDenseMatMul(Kernel):
    """Y = alpha * op(A) @ op(B), A sparse 2-D, B dense 2-D, op a transpose when transA/transB is 1
    (onnxruntime's contrib op schema, contrib_defs.cc)."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.name = node.name
        self.alpha = float(node.attr("alpha", 1.0))
        self.trans_a = bool(node.attr("transA", 0))
        self.trans_b = bool(node.attr("transB", 0))

    def compute(self, inputs: list) -> list:
        a = dense_of(inputs[0], f"SparseToDenseMatMul node {self.name!r} input A")
        b = inputs[1]
        if a.ndim != 2 or b.ndim != 2:
            raise InvalidArgument(f"SparseToDenseMatMul node {self.name!r}: A and B must be 2-D, got A {list(a.shape)} "
                                  f"and B {list(b.shape)}")
        a = a.T if self.trans_a else a
        b = b.T if self.trans_b else b
        if a.shape[1] != b.shape[0]:
            raise InvalidArgument(f"SparseToDenseMatMul node {self.name!r}: op(A) {list(a.shape)} and op(B) "
                                  f"{list(b.shape)} do not multiply; check transA/transB")
        y = np.matmul(a.astype(b.dtype, copy=False), b)
        if self.alpha != 1.0:
            y *= b.dtype.type(self.alpha)
        return [y]
