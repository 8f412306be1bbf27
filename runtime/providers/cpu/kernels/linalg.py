"""Matrix products: MatMul (numpy matmul, BLAS) and Gemm."""

from __future__ import annotations

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.runtime.providers.cpu.kernels import half_via_float as half
from onnxhal.runtime.providers.cpu.kernels.registry import register

_ndarray = np.ndarray


@register("MatMul", since=1)
class MatMul(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.widen = half.WidenedInputs(node, ctx)

    def compute(self, inputs: list) -> list:
        a = inputs[0]
        if a.dtype is half.F16 and half.applies(a, inputs[1]):
            return half.via_float32(self.compute, inputs, self.widen)
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
        self.widen = half.WidenedInputs(node, ctx)

    def compute(self, inputs: list) -> list:
        a, b = inputs[0], inputs[1]
        if a.dtype is half.F16 and half.applies(a, b):
            return half.via_float32(self.compute, inputs, self.widen)
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
    matmul has no BLAS: a medium BERT's quantized products took tens of ms, and even a 24x32x32
    one takes 20 us against 2 us). B less its zero point is converted once when both are constant
    initializers; A less its zero point is one conversion per run."""

    b_zero_point_index = 3  # MatMulIntegerToFloat's is 5

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        names = list(node.inputs) + [""] * 7
        zb = names[self.b_zero_point_index]
        self.constant_b = ctx is not None and bool(names[1]) and ctx.is_constant_initializer(names[1]) and (
            not zb or ctx.is_constant_initializer(zb))
        self._b: tuple | None = None  # (B, B's zero point, B - zero point as float)

    def _centered_b(self, b: np.ndarray, zb: np.ndarray | None) -> np.ndarray:
        # exact for B's K, which A's last axis must match
        ft = exact_float_dtype(b.shape[-2] if b.ndim >= 2 else b.shape[0] if b.ndim else 1)
        bf = b.astype(ft) if zb is None else np.subtract(b, zb, dtype=ft)
        if self.constant_b:
            self._b = (b, zb, bf)  # one swap: a concurrent run sees the old entry or this one
        return bf

    def compute(self, inputs: list) -> list:
        a, b = inputs[0], inputs[1]
        n = len(inputs)
        zb = inputs[3] if n > 3 else None
        cached = self._b
        bf = cached[2] if cached is not None and cached[0] is b and cached[1] is zb else self._centered_b(b, zb)
        y = self._product(a, inputs[2] if n > 2 else None, bf)
        return [y.astype(np.int32) if type(y) is _ndarray else np.asarray(y, np.int32)]

    @staticmethod
    def _product(a: np.ndarray, za: np.ndarray | None, bf: np.ndarray) -> np.ndarray:
        """(A - za) @ bf in bf's float type (exact integers). A stack of matrices times one matrix
        is one product of A's rows (numpy's matmul runs one BLAS call per matrix of the stack: a
        tiny BERT's [2, 12, 32] by [32, 32], 2.9 against 1.1 us)."""
        ft = bf.dtype
        if za is None:
            af = a.astype(ft)
        elif za.ndim == 1 and a.ndim >= 2 and za.size > 1:  # per row of A
            return np.matmul(np.subtract(a, za.reshape(-1, 1), dtype=ft), bf)
        else:
            af = np.subtract(a, za, dtype=ft)
        if af.ndim > 2 and bf.ndim == 2:
            return np.dot(af.reshape(-1, af.shape[-1]), bf).reshape(*af.shape[:-1], bf.shape[1])
        return np.matmul(af, bf)
