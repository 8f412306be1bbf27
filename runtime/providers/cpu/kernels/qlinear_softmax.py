"""com.microsoft QLinearSoftmax as onnxruntime's CPU kernel computes it: from a table of exp over
the 256 codes, not from the dequantized values.

The steps are those of onnxruntime's ``qlinear_softmax.cc`` and MLAS's AVX2 kernel
(``qsoftmax_kernel_avx2.cpp``), written here in numpy; each rounding step matters, since one
code of difference moves every later value of an attention block:

- the table: per code i, exp((i - 255 + s) * x_scale) in double, stored as float32, with the
  headroom shift s = max(0, ln(FLT_MAX / D) - 5) / x_scale (D the row length); X's zero point
  does not enter (softmax ignores a common shift). int8 codes index it from -128.
- per row: the codes shifted so that the row's largest reads entry 255; their table values summed
  in float32, 8 lanes over the first multiple of 16 elements (each lane in order), the rest in
  order, then the lanes added to that one by one;
- the output: t * ((1 / sum) * floor(1 / y_scale)) + y_zero_point in float32 (a product, then a
  sum), rounded half to even and saturated (onnxruntime 1.32 saturates every element; the
  published AVX2 source casts the elements past the last multiple of 16 with wrap-around).

X's scale must be positive (onnxruntime refuses others at run). An infinite one (``quantize_static``
gives it to attention scores a -inf mask was added to) makes the sum NaN: onnxruntime 1.32 then
writes code 0 everywhere (measured, int8 and uint8, any Y scale and zero point), and so does this.
"""

from __future__ import annotations

import math

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels.numerics import mlas_lane_sums, round_to_codes
from onnxhal.runtime.providers.cpu.kernels.registry import register

_F32 = np.float32
_FLT_MAX = np.float32(np.finfo(np.float32).max)
_CODES = np.arange(256, dtype=np.float64)
_SIGNED_SLOTS = (np.arange(256) - 128) & 255  # code i's table slot for int8 rows


def exp_table(x_scale: float, row_length: int, signed: bool) -> np.ndarray:
    """The 256 float32 exp values a row's shifted codes index."""
    headroom = max(0.0, math.log(float(_FLT_MAX / _F32(row_length))) - 5.0) / x_scale
    values = np.exp((_CODES - 255.0 + headroom) * x_scale).astype(_F32)
    if not signed:
        return values
    table = np.empty(256, _F32)
    table[_SIGNED_SLOTS] = values
    return table


def qsoftmax_rows(x: np.ndarray, x_scale: float, y_scale: float, y_zero: int) -> np.ndarray:
    """QLinearSoftmax of [rows, D] int8/uint8 codes along the rows."""
    signed = x.dtype == np.int8
    table = exp_table(x_scale, x.shape[1], signed)
    top = np.maximum.reduce(x, axis=1, keepdims=True).astype(np.int32)
    if signed:
        index = (x.astype(np.int32) + (127 - top)) & 255
    else:
        index = x.astype(np.int32) + (255 - top)
    t = table[index]
    factor = (_F32(1) / mlas_lane_sums(t)) * np.floor(_F32(1) / _F32(y_scale))
    y = t * factor[:, None]
    y += _F32(y_zero)
    return round_to_codes(y, x.dtype)


@register("QLinearSoftmax", since=1, domain="com.microsoft")
class QLinearSoftmax(Kernel):
    """Along ``axis`` (flattened from the axis when the ``opset`` attribute is below 13, as ONNX
    Softmax before opset 13), by ``qsoftmax_rows``."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.name = node.name
        self.flatten = int(node.attr("opset", 13)) < 13
        self.axis = int(node.attr("axis", 1 if self.flatten else -1))

    def compute(self, inputs: list) -> list:
        x, x_s, _x_zp, y_s = inputs[:4]
        y_zp = inputs[4] if len(inputs) > 4 and inputs[4] is not None else None
        if x.dtype not in (np.int8, np.uint8):
            raise InvalidArgument(f"QLinearSoftmax node {self.name!r}: X must be int8 or uint8, got {x.dtype}.")
        scale = float(np.asarray(x_s).reshape(-1)[0])
        if not scale > 0:
            raise InvalidArgument(f"QLinearSoftmax node {self.name!r}: x_scale must be positive, got {scale:g}. "
                                  "Fix the model's quantization parameters.")
        if math.isinf(scale) or x.size == 0:
            return [np.zeros(x.shape, x.dtype)]
        axis = self.axis + x.ndim if self.axis < 0 else self.axis
        last = axis == x.ndim - 1
        if self.flatten:
            rows = x.reshape(math.prod(x.shape[:axis]), -1)
        else:
            moved = x if last else np.moveaxis(x, axis, -1)
            rows = moved.reshape(-1, x.shape[axis])
        zero = 0 if y_zp is None else int(np.asarray(y_zp).reshape(-1)[0])
        y = qsoftmax_rows(rows, scale, float(np.asarray(y_s).reshape(-1)[0]), zero)
        if self.flatten:
            return [y.reshape(x.shape)]
        y = y.reshape(moved.shape)
        return [y if last else np.moveaxis(y, -1, axis)]
