"""GroupNormalization (opsets 18 and 21) and RMSNormalization (opset 23), which onnx.reference ran:
statistics in the stash type (float32 unless stash_type says otherwise), one reshape and a few
reductions each. ``rms_norm`` is RMSNormalization's computation, shared with com.microsoft's
SimplifiedLayerNormalization; its C row kernel is a registered path (``RMS_NORM_PATHS``)."""

from __future__ import annotations

import math
from types import ModuleType

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels.native_kernels import native_module
from onnxhal.runtime.providers.cpu.kernels.registry import register
from onnxhal.runtime.providers.path_tables import path_table

_F32 = np.dtype(np.float32)

#: ``rms_norm``'s other ways to run, against its numpy form.
RMS_NORM_PATHS = path_table("rms_group_norm.rms_norm", "the numpy passes in the stash type: sum of squares, "
                                                       "mean, epsilon, square root, reciprocal, product, scale")
RMS_NORM_PATHS.add("native_rows", "a float32 input, C-contiguous, not empty; a float32 C-contiguous scale of the "
                                  "normalized axes' shape (or its trailing axes, as many values); the C extension "
                                  "_native built, ONNXHAL_NATIVE_KERNELS not 0 and NATIVE_RMS_NORM_ENABLED (both "
                                  "read when the kernel is built: ``rms_native``): _native.rms_norm, each row's sum of squares in float64 (more "
                                  "exact than a float32 stash, the float64 stash's own arithmetic), the product "
                                  "by the scale in float32; one call where numpy makes about nine")
#: The switch of ``RMS_NORM_PATHS["native_rows"]``: False keeps the numpy form.
NATIVE_RMS_NORM_ENABLED = True


def rms_native() -> ModuleType | None:
    """The C module ``rms_norm`` is to use, for a kernel being built: None where the extension is
    off or missing or ``NATIVE_RMS_NORM_ENABLED`` is False (the numpy form)."""
    return native_module() if NATIVE_RMS_NORM_ENABLED else None


def _stash(node: Node) -> np.dtype:
    return np.dtype(np.float64) if int(node.attr("stash_type", 1)) == 11 else np.dtype(np.float32)


@register("GroupNormalization", since=18)
class GroupNormalization(Kernel):
    """x [N, C, ...] normalized over each of num_groups groups of channels, then scale and bias:
    one value per channel (opset 21), or per group (opset 18)."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.groups = int(node.attr("num_groups", 0))
        self.epsilon = float(node.attr("epsilon", 1e-5))
        self.per_group = (node.since_version or 21) < 21
        self.stash = _stash(node)
        self.name = node.name

    def compute(self, inputs: list) -> list:
        x, scale, bias = inputs[:3]
        if x.ndim < 2 or self.groups <= 0 or x.shape[1] % self.groups:
            raise InvalidArgument(f"GroupNormalization node {self.name!r}: input {list(x.shape)} and num_groups "
                                  f"{self.groups}; the channels (axis 1) must divide into the groups.")
        n, c = x.shape[:2]
        stash = np.dtype(np.float64) if x.dtype == np.float64 else self.stash
        g = x.reshape(n, self.groups, -1).astype(stash, copy=False)
        mean = g.mean(axis=-1, keepdims=True)
        var = np.square(g - mean).mean(axis=-1, keepdims=True)
        y = ((g - mean) / np.sqrt(var + stash.type(self.epsilon))).reshape(x.shape)
        per = self.groups if self.per_group else c
        if scale.size != per or bias.size != per:
            raise InvalidArgument(f"GroupNormalization node {self.name!r}: scale and bias need {per} values (one per "
                                  f"{'group' if self.per_group else 'channel'}), got {scale.size} and {bias.size}.")
        if self.per_group:
            scale, bias = np.repeat(scale, c // self.groups), np.repeat(bias, c // self.groups)
        shape = (1, c) + (1,) * (x.ndim - 2)
        return [(y * scale.reshape(shape) + bias.reshape(shape)).astype(x.dtype, copy=False)]


def rms_norm(x: np.ndarray, scale: np.ndarray, axis: int, epsilon: float, stash: np.dtype,
             native: ModuleType | None, want_inv: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
    """x / sqrt(mean(x^2 over the axes from ``axis``, in ``stash``) + epsilon) * scale, in x's
    dtype, and (``want_inv``) the rows' 1 / rms in ``stash`` of x's rank with the normalized axes
    1 (else None). ``axis`` is within x's rank (non-negative). ``native``: ``rms_native()`` as the
    calling kernel read it when it was built (None: the numpy form)."""
    n = math.prod(x.shape[axis:])
    if (native is not None and x.dtype == _F32 and x.size and x.flags.c_contiguous and scale.dtype == _F32
            and (not want_inv or stash == _F32) and scale.size == n and scale.shape == x.shape[x.ndim - scale.ndim:] and scale.flags.c_contiguous):
        y = np.empty(x.shape, _F32)
        inv = np.empty(x.shape[:axis] + (1,) * (x.ndim - axis), _F32) if want_inv else None
        native.rms_norm(x, scale, y, inv, epsilon)  # RMS_NORM_PATHS["native_rows"]
        return y, inv
    xs = x.astype(stash, copy=False)
    axes = tuple(range(axis, x.ndim))
    # mean, sqrt and reciprocal in place on the row statistics, ufunc.reduce rather than
    # ndarray.mean (whose wrapper costs more than a small row's pass); the same operations and
    # roundings as 1 / sqrt(mean(x^2) + eps)
    inv = np.add.reduce(np.square(xs), axis=axes, keepdims=True)
    inv /= stash.type(n or 1)
    inv += stash.type(epsilon)
    np.sqrt(inv, out=inv)
    np.divide(1, inv, out=inv)
    y = (xs * inv).astype(x.dtype, copy=False)
    if scale.dtype == y.dtype and scale.ndim <= y.ndim and scale.shape == y.shape[y.ndim - scale.ndim:]:
        y *= scale
    else:
        y = (y * scale).astype(x.dtype, copy=False)
    return y, inv if want_inv else None


@register("RMSNormalization", since=23)
class RMSNormalization(Kernel):
    """x / sqrt(mean(x^2 over the axes from ``axis``) + epsilon) * scale."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.axis = int(node.attr("axis", -1))
        self.epsilon = float(node.attr("epsilon", 1e-5))
        self.stash = _stash(node)
        self.name = node.name
        self.native = rms_native()

    def compute(self, inputs: list) -> list:
        x, scale = inputs[0], inputs[1]
        axis = self.axis + x.ndim if self.axis < 0 else self.axis
        if not 0 <= axis < max(x.ndim, 1):
            raise InvalidArgument(f"RMSNormalization node {self.name!r}: axis {self.axis} for an input of rank "
                                  f"{x.ndim}.")
        stash = np.dtype(np.float64) if x.dtype == np.float64 else self.stash  # onnxruntime: doubles in double
        return [rms_norm(x, scale, axis, self.epsilon, stash, self.native)[0]]
