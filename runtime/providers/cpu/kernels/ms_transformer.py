"""com.microsoft operators that onnxruntime's transformer optimizer
(``onnxruntime.transformers.optimizer``) writes into BERT, GPT-2, T5 and ViT graphs, as its CPU
kernels compute them: SkipLayerNormalization, SkipSimplifiedLayerNormalization,
SimplifiedLayerNormalization (registered by onnxruntime in the default domain too), BiasGelu,
FastGelu, Gelu, QuickGelu, BiasAdd, FusedMatMul."""

from __future__ import annotations

import math
from types import ModuleType

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node, errors
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels.fused import gelu
from onnxhal.runtime.providers.cpu.kernels.normalization import layer_norm
from onnxhal.runtime.providers.cpu.kernels.registry import register
from onnxhal.runtime.providers.cpu.kernels.rms_group_norm import rms_native, rms_norm

MS = "com.microsoft"
_FLOAT32 = np.dtype(np.float32)


def _rms_norm(x: np.ndarray, gamma: np.ndarray, epsilon: float, native: ModuleType | None,
              axis: int = -1) -> tuple[np.ndarray, np.ndarray]:
    axis = axis + x.ndim if axis < 0 else axis
    if x.dtype == _FLOAT32:  # RMSNormalization's computation (its C rows where they apply)
        return rms_norm(x, gamma, axis, epsilon, _FLOAT32, native, want_inv=True)
    xs = x.astype(np.float32, copy=False)
    axes = tuple(range(axis, x.ndim))
    inv = 1 / np.sqrt(np.square(xs).mean(axis=axes, keepdims=True) + np.float32(epsilon))
    return (xs * inv * gamma).astype(x.dtype, copy=False), inv


def _check_hidden(op: str, name: str, x: np.ndarray, **params: np.ndarray | None) -> None:
    for pname, p in params.items():
        if p is not None and p.size != x.shape[-1]:
            raise InvalidArgument(f"{op} node {name!r}: {pname} has {p.size} values for a hidden size of "
                                  f"{x.shape[-1]} (input {list(x.shape)}); it must have one per hidden unit.")


@register("SkipLayerNormalization", since=1, domain=MS)
class SkipLayerNormalization(Kernel):
    """LayerNormalization(input + skip + bias) * gamma + beta over the last axis. Outputs: the
    result, mean and inverse standard deviation (onnxruntime leaves them empty: unused), and the
    sum input + skip + bias."""

    simplified = False

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.name = node.name
        self.epsilon = float(node.attr("epsilon", 1e-12))
        self.n_out = len(node.outputs)
        self.bias_index = 3 if self.simplified else 4
        self.native = rms_native() if self.simplified else None

    def compute(self, inputs: list) -> list:
        x, skip, gamma = inputs[0], inputs[1], inputs[2]
        beta = None if self.simplified or len(inputs) < 4 else inputs[3]
        bias = inputs[self.bias_index] if len(inputs) > self.bias_index else None
        h = x.shape[-1] if x.ndim else 1
        if gamma.size != h or (beta is not None and beta.size != h) or (bias is not None and bias.size != h):
            _check_hidden(self.op_name, self.name, x, gamma=gamma, beta=beta, bias=bias)
        total = x + skip
        if bias is not None:
            total += bias  # total is this kernel's own array
        if self.simplified:
            y, inv = _rms_norm(total, gamma, self.epsilon, self.native)
            mean = np.zeros_like(inv)
        else:
            y, mean, inv = layer_norm(total, gamma, beta, -1, self.epsilon, _FLOAT32, stats=self.n_out > 1)
        return [y, mean, inv, total][: self.n_out]

    op_name = "SkipLayerNormalization"


@register("SkipSimplifiedLayerNormalization", since=1, domain=MS)
class SkipSimplifiedLayerNormalization(SkipLayerNormalization):
    """RMS normalization of input + skip (+ bias) times gamma (T5's layer norm, fused)."""

    simplified = True
    op_name = "SkipSimplifiedLayerNormalization"


@register("SimplifiedLayerNormalization", since=1, domain=MS)
@register("SimplifiedLayerNormalization", since=1)
class SimplifiedLayerNormalization(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.axis = int(node.attr("axis", -1))
        self.epsilon = float(node.attr("epsilon", 1e-5))
        self.n_out = len(node.outputs)
        self.native = rms_native()

    def compute(self, inputs: list) -> list:
        y, inv = _rms_norm(inputs[0], inputs[1], self.epsilon, self.native, self.axis)
        return [y, inv][: self.n_out]


@register("BiasGelu", since=1, domain=MS)
class BiasGelu(Kernel):
    """gelu(x + bias), erf form."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        pass

    def compute(self, inputs: list) -> list:
        if len(inputs) < 2 or inputs[1] is None:
            return [gelu(inputs[0])]
        return [gelu(inputs[0] + inputs[1], fresh=True)]


@register("Gelu", since=1, domain=MS)
class Gelu(BiasGelu):
    pass


@register("FastGelu", since=1, domain=MS)
class FastGelu(Kernel):
    """The tanh approximation of gelu, of x + bias (bias optional)."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        pass

    def compute(self, inputs: list) -> list:
        x = inputs[0] if len(inputs) < 2 or inputs[1] is None else inputs[0] + inputs[1]
        dt = x.dtype
        inner = np.tanh(np.float32(math.sqrt(2.0 / math.pi)) * (x + np.float32(0.044715) * x * x * x))
        return [(np.float32(0.5) * x * (1 + inner)).astype(dt, copy=False)]


@register("QuickGelu", since=1, domain=MS)
class QuickGelu(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.alpha = np.float32(node.attr("alpha", 1.702))

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        return [(x / (1 + np.exp(-self.alpha * x))).astype(x.dtype, copy=False)]


@register("BiasAdd", since=1, domain=MS)
class BiasAdd(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        pass

    def compute(self, inputs: list) -> list:
        return [inputs[0] + inputs[1] + inputs[2]]


@register("FusedMatMul", since=1, domain=MS)
class FusedMatMul(Kernel):
    """alpha * op(A) @ op(B), op a transpose of the last two axes where transA / transB say so."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        if node.attr("transBatchA", 0) or node.attr("transBatchB", 0):
            raise errors.NotImplemented(f"FusedMatMul node {node.name!r}: transBatchA / transBatchB are not implemented by "
                                 "the CPU EP; save the model at a lower optimization level.")
        self.alpha = float(node.attr("alpha", 1.0))
        self.ta, self.tb = bool(node.attr("transA", 0)), bool(node.attr("transB", 0))

    def compute(self, inputs: list) -> list:
        a, b = inputs[0], inputs[1]
        if self.ta and a.ndim >= 2:
            a = np.swapaxes(a, -1, -2)
        if self.tb and b.ndim >= 2:
            b = np.swapaxes(b, -1, -2)
        y = np.matmul(a, b)
        return [y if self.alpha == 1.0 else (y * y.dtype.type(self.alpha))]


def _activation(node: Node, what: str, params: list[float]):
    """The activation onnxruntime's FusedConv / FusedGemm apply, from its name and parameters."""
    name = node.attr("activation", "")
    p = [float(v) for v in params]

    def need(count: int) -> list[float]:
        if len(p) < count:
            raise InvalidArgument(f"{what}: activation {name!r} needs {count} parameters, got {p}.")
        return p

    f32 = np.float32
    if name in ("", "Identity"):
        return None
    if name == "Relu":
        return lambda y: np.maximum(y, f32(0))
    if name == "Sigmoid":
        return lambda y: (1 / (1 + np.exp(-y))).astype(y.dtype, copy=False)
    if name == "Tanh":
        return np.tanh
    if name == "LeakyRelu":
        alpha = f32(need(1)[0])
        return lambda y: np.where(y >= 0, y, y * alpha)
    if name == "Clip":
        lo, hi = (f32(v) for v in need(2)[:2])
        return lambda y: np.clip(y, lo, hi)
    if name == "HardSigmoid":
        alpha, beta = (f32(v) for v in need(2)[:2])
        return lambda y: np.clip(y * alpha + beta, f32(0), f32(1))
    raise InvalidArgument(f"{what}: activation {name!r} is none of Relu, Sigmoid, Tanh, LeakyRelu, Clip, "
                          "HardSigmoid.")


@register("FusedConv", since=1, domain=MS)
class FusedConv(Kernel):
    """onnxruntime's Conv + activation (saved optimized models): Conv, then the optional residual
    input Z added, then the activation (``activation``, ``activation_params``)."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        from onnxhal.runtime.providers.cpu.kernels.conv import Conv

        self.conv = Conv(node, ctx)
        self.act = _activation(node, f"FusedConv node {node.name!r}", node.attr("activation_params", []))

    def compute(self, inputs: list) -> list:
        y = self.conv.compute(list(inputs[:3]))[0]
        if len(inputs) > 3 and inputs[3] is not None:
            y = y + inputs[3]
        return [y if self.act is None else self.act(y)]


@register("FusedGemm", since=1, domain=MS)
class FusedGemm(Kernel):
    """onnxruntime's Gemm + activation (saved optimized models); the activation's parameters in
    activation_alpha / activation_beta."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        from onnxhal.runtime.providers.cpu.kernels.linalg import Gemm

        self.gemm = Gemm(node, ctx)
        name = node.attr("activation", "")
        alpha, beta = node.attr("activation_alpha", 0.01 if name == "LeakyRelu" else 0.2), node.attr(
            "activation_beta", 0.5)
        self.act = _activation(node, f"FusedGemm node {node.name!r}", [alpha, beta])

    def compute(self, inputs: list) -> list:
        y = self.gemm.compute(inputs)[0]
        return [y if self.act is None else self.act(y)]
