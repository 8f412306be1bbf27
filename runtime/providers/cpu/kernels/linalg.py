"""Matrix products: MatMul (numpy matmul, BLAS) and Gemm."""

from __future__ import annotations

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.runtime.providers.cpu.kernels.registry import register

_ndarray = np.ndarray


@register("MatMul", since=1)
class MatMul(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        pass

    def compute(self, inputs: list) -> list:
        a = inputs[0]
        r = np.matmul(a, inputs[1])
        if r.dtype != a.dtype:  # ml_dtypes (bfloat16) matmul returns float32
            r = r.astype(a.dtype)
        return [r if type(r) is _ndarray else np.asarray(r)]


@register("Gemm", since=1)
class Gemm(Kernel):
    """Y = alpha * A' @ B' + beta * C (C optional and unidirectionally broadcast)."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.alpha = node.attr("alpha", 1.0)
        self.beta = node.attr("beta", 1.0)
        self.ta = bool(node.attr("transA", 0))
        self.tb = bool(node.attr("transB", 0))

    def compute(self, inputs: list) -> list:
        a, b = inputs[0], inputs[1]
        if self.ta:
            a = a.T
        if self.tb:
            b = b.T
        y = a @ b
        if y.dtype != a.dtype:
            y = y.astype(a.dtype)
        if y.dtype.kind != "f":  # integer Gemm: scale in float64, cast back
            c = inputs[2] if len(inputs) > 2 and inputs[2] is not None else 0
            return [np.asarray(self.alpha * y + self.beta * c).astype(y.dtype)]
        t = y.dtype.type
        if self.alpha != 1.0:
            y *= t(self.alpha)
        c = inputs[2] if len(inputs) > 2 else None
        if c is not None and self.beta != 0.0:
            y += c * t(self.beta) if self.beta != 1.0 else c
        return [y]


@register("MatMulInteger", since=10)
class MatMulInteger(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        pass

    def compute(self, inputs: list) -> list:
        a = inputs[0].astype(np.int32)
        b = inputs[1].astype(np.int32)
        if len(inputs) > 2 and inputs[2] is not None:
            za = inputs[2].astype(np.int32)
            a = a - (za.reshape(-1, 1) if za.ndim == 1 and a.ndim >= 2 and za.size > 1 else za)
        if len(inputs) > 3 and inputs[3] is not None:
            b = b - inputs[3].astype(np.int32)
        return [np.asarray(np.matmul(a, b), dtype=np.int32)]
