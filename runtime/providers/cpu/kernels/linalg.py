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


def exact_float_dtype(k: int) -> type:
    """A float type whose BLAS product of 8-bit codes less their zero points (each factor at most
    255 in magnitude) over k terms is exact: float32 while k * 255^2 stays below 2^24, else float64."""
    return np.float32 if 65025 * k < (1 << 24) else np.float64


@register("MatMulInteger", since=10)
class MatMulInteger(Kernel):
    """The integer product through BLAS in a float type that holds it exactly (numpy's integer
    matmul has no BLAS: a medium BERT's quantized products took tens of ms)."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        pass

    def compute(self, inputs: list) -> list:
        ft = exact_float_dtype(inputs[0].shape[-1] if inputs[0].ndim else 1)
        a = inputs[0].astype(ft)
        b = inputs[1].astype(ft)
        if len(inputs) > 2 and inputs[2] is not None:
            za = inputs[2].astype(ft)
            a = a - (za.reshape(-1, 1) if za.ndim == 1 and a.ndim >= 2 and za.size > 1 else za)
        if len(inputs) > 3 and inputs[3] is not None:
            b = b - inputs[3].astype(ft)
        return [np.asarray(np.matmul(a, b)).astype(np.int32)]
