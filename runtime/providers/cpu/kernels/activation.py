"""Activation kernels (Relu, Sigmoid, Erf, Gelu, LeakyRelu, ...), float32 kept float32."""

from __future__ import annotations

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.runtime.providers.cpu.kernels import half_via_float as half
from onnxhal.runtime.providers.cpu.kernels.clamp import MIN_SIZE, clip
from onnxhal.runtime.providers.cpu.kernels.fused import gelu as fused_gelu
from onnxhal.runtime.providers.cpu.kernels.kernel_paths import path_table
from onnxhal.runtime.providers.cpu.kernels.numerics import erf, erf_table, gelu, gelu_tanh
from onnxhal.runtime.providers.cpu.kernels.registry import register

_ndarray = np.ndarray
_asarray = np.asarray
_maximum = np.maximum
_multiply = np.multiply
_tanh = np.tanh
# A 0-d float32 array, not a numpy scalar: numpy converts a scalar operand on every call, 0.3 us
# of Sigmoid's three each (a GRU gate in a Loop body: 2.7 -> 1.7 us on [2, 16]). float32 * float32
# stays float32, float64 * float32 float64: exact either way, the same values as the scalar's.
_HALF = np.array(0.5, np.float32)
_HALF.flags.writeable = False
# A typed zero per dtype, a 0-d array (a numpy scalar operand is converted on every call, and a
# Python 0 pays for weak-scalar promotion too).
_ZEROS: dict = {}


ELU_PATHS = path_table("Elu/Selu", "select: np.where(x > 0, x, alpha * (exp(min(x, 0)) - 1)), times gamma for "
                                   "Selu")
SELECT = ELU_PATHS.add("select", "canonical: every other case (an alpha below 1e-30, where a product may underflow "
                                 "to -0, infinite or NaN; a gamma infinite or NaN; integer or 0-d inputs)")
BLEND = ELU_PATHS.add("blend", "a float input of rank >= 1, 1e-30 <= alpha < inf (and a finite gamma): max(x, 0) "
                               "+ the negative branch, which is +0 where x > 0, each step in place; the select's "
                               "values bit for bit, NaN and signed zeros included (numpy's select through a mask "
                               "costs more than the exp)")
#: the switch of ``blend`` (read when the kernel is made and at each run)
ELU_BLEND_ENABLED = True


def _elu_blend(x: np.ndarray, alpha) -> np.ndarray:
    """Path ``blend``: alpha * (exp(min(x, 0)) - 1) + max(x, 0), each step in place."""
    zero = _ZEROS.get(x.dtype)
    if zero is None:
        zero = _ZEROS.setdefault(x.dtype, np.zeros((), x.dtype))
    r = np.minimum(x, zero)
    np.exp(r, out=r)
    np.subtract(r, x.dtype.type(1), out=r)
    if alpha != 1:
        np.multiply(r, alpha, out=r)
    r += _maximum(x, zero)
    return r


class _Act(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        pass


@register("Relu", since=1)
class Relu(_Act):
    def compute(self, inputs: list) -> list:
        x = inputs[0]
        if x.size >= MIN_SIZE:
            return [clip(x, 0)]
        zero = _ZEROS.get(x.dtype)
        if zero is None:
            zero = _ZEROS.setdefault(x.dtype, np.zeros((), x.dtype))
        r = _maximum(x, zero)
        return [r] if r.__class__ is _ndarray else [_asarray(r)]


@register("Sigmoid", since=1)
@half.float16_table
class Sigmoid(_Act):
    """sigmoid(x) = 0.5 * (1 + tanh(x / 2)): no overflow for large |x|."""

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        if x.dtype.itemsize < 4:  # float16/bfloat16: onnx.reference's formula, in the input type
            e = np.exp(x)
            return [_asarray(np.where(x > 0, 1.0 / (1.0 + np.exp(-x)), e / (1.0 + e)).astype(x.dtype))]
        return [sigmoid_float(x)]


def sigmoid_float(x: np.ndarray) -> np.ndarray:
    """Sigmoid of a float32/float64 array as 0.5 tanh(x / 2) + 0.5 (the Sigmoid kernel's form, and
    ElementwiseChain's numpy form of it)."""
    # A typed half, and tanh in place: a Python float costs numpy a scalar conversion per
    # operation, a third of the kernel on a small tensor (a GRU gate in a Loop body).
    r = _multiply(x, _HALF)
    if r.__class__ is not _ndarray:  # a 0-d input gives a numpy scalar
        r = np.array(r)
    _tanh(r, out=r)
    r *= _HALF
    r += _HALF
    return r


@register("Erf", since=9)
@half.float16_table
class Erf(_Act):
    def compute(self, inputs: list) -> list:
        x = inputs[0]
        if x.dtype.kind != "f":
            return [erf(x.astype(np.float64)).astype(x.dtype)]
        if x.dtype == np.float32:  # the registered fast path
            return [_asarray(erf_table(x))]
        return [_asarray(erf(x))]


GELU_PATHS = path_table("Gelu", "erf: numerics.gelu, 0.5 x (1 + erf(x / sqrt 2)) with the canonical erf (about 40 "
                                "numpy calls), or numerics.gelu_tanh for approximate='tanh'")
GELU_ERF = GELU_PATHS.add("erf", "canonical: approximate='tanh', float64 (exact through math.erf) and any input "
                                 "not float32")
GELU_FUSED = GELU_PATHS.add("fused_form", "approximate='none' on float32 (float16 too, whose table is built from "
                                          "float32 values) with GELU_FUSED_ENABLED: fused.gelu, the form the fused "
                                          "ops' Gelu epilogue runs (numerics' registered fast paths gelu_native, "
                                          "gelu_table, gelu_polynomial; within 4e-7 of the canonical)")
#: The switch of ``GELU_PATHS["fused_form"]`` (read at each run): False keeps the canonical form.
GELU_FUSED_ENABLED = True


@register("Gelu", since=20)
@half.float16_table
class Gelu(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.tanh = node.attr("approximate", "none") == "tanh"

    def path(self, x: np.ndarray) -> str:
        """The path ``GELU_PATHS`` names for this input."""
        return GELU_FUSED if GELU_FUSED_ENABLED and not self.tanh and x.dtype == np.float32 else GELU_ERF

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        if self.tanh:
            return [gelu_tanh(x)]
        if self.path(x) == GELU_FUSED:
            # a standalone Gelu (one the optimizer fused into no MatMul or Conv): on [2, 16, 9]
            # 46 -> 4 us a node (the canonical erf: 40 numpy calls; onnxruntime 6 us a one-node run)
            y = fused_gelu(x)
            if x.size and not x.min() > -np.inf:  # -inf (or NaN) present: -inf * 0 is NaN in
                y[np.isneginf(x)] = np.nan  # onnxruntime and the canonical form, not the limit 0
            return [y]
        return [gelu(x)]


@register("LeakyRelu", since=1)
@register("LeakyRelu", since=6)
@half.float16_table
class LeakyRelu(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.alpha = node.attr("alpha", 0.01)

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        return [_asarray(np.where(x >= 0, x, x * x.dtype.type(self.alpha)))]


@register("PRelu", since=7)
class PRelu(_Act):
    def compute(self, inputs: list) -> list:
        x, slope = inputs
        return [_asarray(np.where(x >= 0, x, x * slope).astype(x.dtype, copy=False))]


@register("PRelu", since=1)
class PRelu1(_Act):
    """Before opset 7 a 1-D slope of length C applies along the channel axis (axis 1), not the
    last axis as numpy broadcasting would: PyTorch's exports rely on this."""

    def compute(self, inputs: list) -> list:
        x, slope = inputs
        if slope.ndim == 1 and x.ndim > 2 and slope.shape[0] == x.shape[1] and slope.shape[0] != 1:
            slope = slope.reshape((-1,) + (1,) * (x.ndim - 2))
        return [_asarray(np.where(x >= 0, x, x * slope).astype(x.dtype, copy=False))]


@register("Elu", since=1)
@register("Elu", since=6)
@half.float16_table
class Elu(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.alpha = node.attr("alpha", 1.0)
        self.blend = ELU_BLEND_ENABLED and 1e-30 <= self.alpha < np.inf

    def path(self, x: np.ndarray) -> str:
        """The path ``ELU_PATHS`` names for input ``x``."""
        return BLEND if self.blend and ELU_BLEND_ENABLED and x.dtype.kind == "f" and x.ndim else SELECT

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        if self.path(x) == BLEND:
            return [_elu_blend(x, x.dtype.type(self.alpha))]
        neg = (np.exp(np.minimum(x, 0)) - 1) * x.dtype.type(self.alpha)
        return [_asarray(np.where(x > 0, x, neg))]


@register("Selu", since=1)
@register("Selu", since=6)
@half.float16_table
class Selu(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.alpha = node.attr("alpha", 1.67326319217681884765625)
        self.gamma = node.attr("gamma", 1.05070102214813232421875)
        self.blend = ELU_BLEND_ENABLED and 1e-30 <= self.alpha < np.inf and np.isfinite(self.gamma)

    def path(self, x: np.ndarray) -> str:
        """The path ``ELU_PATHS`` names for input ``x``."""
        return BLEND if self.blend and ELU_BLEND_ENABLED and x.dtype.kind == "f" and x.ndim else SELECT

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        t = x.dtype.type
        if self.path(x) == BLEND:
            r = _elu_blend(x, t(self.alpha))
            np.multiply(r, t(self.gamma), out=r)
            return [r]
        neg = (np.exp(np.minimum(x, 0)) - 1) * t(self.alpha)
        return [_asarray(np.where(x > 0, x, neg) * t(self.gamma))]


@register("HardSigmoid", since=1)
@register("HardSigmoid", since=6)
@half.float16_table
class HardSigmoid(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.alpha = node.attr("alpha", 0.2)
        self.beta = node.attr("beta", 0.5)

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        t = x.dtype.type
        return [_asarray(np.clip(x * t(self.alpha) + t(self.beta), t(0), t(1)))]


@register("HardSwish", since=14)
@half.float16_table
class HardSwish(_Act):
    def compute(self, inputs: list) -> list:
        x = inputs[0]
        t = x.dtype.type
        return [_asarray(x * np.clip(x * t(1 / 6) + t(0.5), t(0), t(1)))]


@register("Softplus", since=1)
@half.float16_table
class Softplus(_Act):
    def compute(self, inputs: list) -> list:
        x = inputs[0]
        return [_asarray(np.logaddexp(x, x.dtype.type(0)))]


@register("Softsign", since=1)
@half.float16_table
class Softsign(_Act):
    def compute(self, inputs: list) -> list:
        x = inputs[0]
        return [_asarray(x / (1 + np.abs(x)))]
