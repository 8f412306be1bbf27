"""com.microsoft quantized operators that onnxruntime's quantizer (``quantize_dynamic``,
``quantize_static`` in the QOperator format) writes, as its CPU kernels compute them:
QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu, QLinearGlobalAveragePool,
QLinearConcat, QLinearWhere, QLinearAveragePool, QGemm, MatMulIntegerToFloat,
DynamicQuantizeMatMul and DynamicQuantizeLSTM; and the default domain's QLinearConv,
QLinearMatMul and ConvInteger (the weight-only MatMuls are in ``ms_weight_quant.py``).

Rounding is numpy's rint (half to even), as MLAS's float-to-int conversions; the element-wise ops
use MLAS's form y = a * (a_scale / c_scale) + b * (b_scale / c_scale) + bias, so that results agree
with onnxruntime to the last quantization step."""

from __future__ import annotations

import math
from types import ModuleType

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.hal.run_control import RUN_OPTIONS, check_terminate
from onnxhal.runtime.providers.cpu.kernels.linalg import MatMulInteger, exact_float_dtype
from onnxhal.runtime.providers.cpu.kernels.numerics import round_to_codes, saturate_codes
from onnxhal.runtime.providers.cpu.kernels.quantize import dynamic_quantize_uint8, dynamic_quantizer, quantize_native
from onnxhal.runtime.providers.cpu.kernels.recurrent import (
    LSTM,
    WORKSPACES,
    RecurrentKernel,
    cell_update,
    gate_order,
    gate_scale,
    gate_workspace,
    pair_rows,
    projection_steps,
)
from onnxhal.runtime.providers.cpu.kernels.registry import register

try:  # np.clip's own ufunc, without np.clip's Python layers (per LSTM time step they cost more than it)
    from numpy._core.umath import clip as _clip
except ImportError:  # numpy 1.26
    from numpy.core.umath import clip as _clip

MS = "com.microsoft"
_CODES = (np.dtype(np.int8), np.dtype(np.uint8))
# 0-d arrays: the ufuncs' fastest operands
_ZERO32, _F255, _F255N = np.array(0, np.float32), np.array(255, np.float32), np.array(-255, np.float32)
_min, _max = np.minimum.reduce, np.maximum.reduce
_empty, _negative, _add, _divide, _maximum, _minimum, _rint, _multiply, _dot = (
    np.empty, np.negative, np.add, np.divide, np.maximum, np.minimum, np.rint, np.multiply, np.dot)


def _zero(zp: np.ndarray | None, like: np.dtype) -> np.ndarray:
    return np.zeros((), like) if zp is None else zp


def _saturate(y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return saturate_codes(np.rint(np.asarray(y, np.float32)), dtype)


def dequantize(x: np.ndarray, scale: np.ndarray, zp: np.ndarray | None) -> np.ndarray:
    """(x - zp) * scale in float32 (the difference in int32, then converted: exact)."""
    d = x if zp is None else np.subtract(x, zp, dtype=np.int32)
    return np.multiply(d, scale.astype(np.float32, copy=False), dtype=np.float32)


def quantize(y: np.ndarray, scale: np.ndarray, zp: np.ndarray | None, dtype: np.dtype) -> np.ndarray:
    """saturate(round_half_even(y / scale + zp)) as dtype; one new array, the rest in place."""
    f = np.divide(y, scale.astype(np.float32, copy=False))
    if type(f) is not np.ndarray:  # 0-d operands give a numpy scalar
        return _saturate(f + _zero(zp, dtype).astype(np.float32), dtype)
    if zp is not None:
        f += zp.astype(np.float32)
    return round_to_codes(f, dtype)


class _QLinearBinary(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.name = node.name
        self._native = quantize_native()

    def compute(self, inputs: list) -> list:
        a, a_s, a_zp, b, b_s, b_zp, c_s = inputs[:7]
        c_zp = inputs[7] if len(inputs) > 7 else None
        if a.dtype != b.dtype or a.dtype not in (np.uint8, np.int8):
            raise InvalidArgument(f"{type(self).__name__} node {self.name!r}: A and B must both be uint8 or int8, "
                                  f"got {a.dtype} and {b.dtype}.")
        return [self._combine(a, a_s, a_zp, b, b_s, b_zp, c_s, c_zp)]


@register("QLinearAdd", since=1, domain=MS)
class QLinearAdd(_QLinearBinary):
    def _combine(self, a, a_s, a_zp, b, b_s, b_zp, c_s, c_zp):
        f32 = np.float32
        ra, rb = f32(a_s) / f32(c_s), f32(b_s) / f32(c_s)
        bias = f32(_zero(c_zp, a.dtype)) - ra * f32(_zero(a_zp, a.dtype)) - rb * f32(_zero(b_zp, a.dtype))
        y = np.multiply(a, ra, dtype=f32)
        y = np.add(y, np.multiply(b, rb, dtype=f32), out=y if a.shape == b.shape else None)
        y += bias
        return _round_codes(y, a.dtype, self._native)


@register("QLinearMul", since=1, domain=MS)
class QLinearMul(_QLinearBinary):
    def _combine(self, a, a_s, a_zp, b, b_s, b_zp, c_s, c_zp):
        y = dequantize(a, a_s, a_zp) * dequantize(b, b_s, b_zp)
        return quantize(y, c_s, c_zp, a.dtype)


class _QLinearUnary(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.alpha = np.float32(node.attr("alpha", 0.01))

    def compute(self, inputs: list) -> list:
        x, x_s, x_zp, y_s = inputs[:4]
        y_zp = inputs[4] if len(inputs) > 4 else None
        # onnxruntime builds a 256-entry table of f over the dequantized codes: the same values
        return [quantize(self._fn(dequantize(x, x_s, x_zp)), y_s, y_zp, x.dtype)]


@register("QLinearSigmoid", since=1, domain=MS)
class QLinearSigmoid(_QLinearUnary):
    def _fn(self, v):
        return 1 / (1 + np.exp(-v))


@register("QLinearLeakyRelu", since=1, domain=MS)
class QLinearLeakyRelu(_QLinearUnary):
    def _fn(self, v):
        return np.where(v >= 0, v, v * self.alpha)


@register("QLinearGlobalAveragePool", since=1, domain=MS)
class QLinearGlobalAveragePool(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.channels_last = bool(node.attr("channels_last", 0))

    def compute(self, inputs: list) -> list:
        x, x_s, x_zp, y_s = inputs[:4]
        y_zp = inputs[4] if len(inputs) > 4 else None
        axes = tuple(range(1, x.ndim - 1)) if self.channels_last else tuple(range(2, x.ndim))
        mean = dequantize(x, x_s, x_zp).mean(axis=axes, keepdims=True)
        return [quantize(mean, y_s, y_zp, x.dtype)]


def dynamic_quantize(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.uint8]:
    """uint8 codes, scale and zero point of a float tensor, as onnxruntime's dynamic quantization
    (``dynamic_quantize_uint8``: range widened to hold 0; a zero range gives scale 1)."""
    a = np.asarray(a, np.float32)
    q, scale, zp = dynamic_quantize_uint8(a.reshape(-1) if a.ndim == 0 else a)
    return q.reshape(a.shape), scale, np.uint8(zp)


def quantized_product_by_row(a: np.ndarray, w: np.ndarray, w_scale: np.ndarray, w_zp: np.ndarray | None,
                             w_centered: np.ndarray | None = None) -> np.ndarray:
    """``quantized_product`` of each row of a 2-D ``a`` on its own range, all rows at once.
    ``w_centered``: ``centered(w, w_zp)`` when the caller has it (the same weights every step)."""
    lo = np.minimum(a.min(axis=1, keepdims=True), np.float32(0))
    hi = np.maximum(a.max(axis=1, keepdims=True), np.float32(0))
    # (copy=False: these are float32 already for float32 rows, and this runs once per time step)
    scale = np.where(hi == lo, np.float32(1), (hi - lo) / np.float32(255)).astype(np.float32, copy=False)
    zp = np.rint(_clip(-lo / scale, 0, 255)).astype(np.float32, copy=False)
    q = _clip(np.rint(a / scale) + zp, 0, 255)
    # q - zp in float64 (exact: small integers), and acc rounded to float32 before the scaling, each
    # as one ufunc call with its dtype
    acc = np.subtract(q, zp, dtype=np.float64) @ (centered(w, w_zp) if w_centered is None else w_centered)
    return np.multiply(acc, scale * w_scale.astype(np.float32, copy=False), dtype=np.float32)


def centered(w: np.ndarray, w_zp: np.ndarray | None) -> np.ndarray:
    """Integer weights minus their zero point, in float64 (exact: the products' right operand)."""
    return w.astype(np.float64) - _zero(w_zp, w.dtype).astype(np.float64)


def quantized_product(a: np.ndarray, w: np.ndarray, w_scale: np.ndarray, w_zp: np.ndarray | None) -> np.ndarray:
    """a (float) @ w (int8/uint8 [K, N]) with a quantized dynamically, accumulated exactly (the
    integer sums are below 2^24 for K up to 256 and so exact in float64 too), scaled per column."""
    q, scale, zp = dynamic_quantize(a)
    acc = (q.astype(np.float64) - float(zp)) @ (w.astype(np.float64) - _zero(w_zp, w.dtype).astype(np.float64))
    return (acc.astype(np.float32) * (scale * w_scale.astype(np.float32))).astype(np.float32)


@register("MatMulIntegerToFloat", since=1, domain=MS)
class MatMulIntegerToFloat(MatMulInteger):
    """(A - a_zero_point) @ (B - b_zero_point) * (a_scale * b_scale) + bias: MatMulInteger's exact
    float product (B less its zero point prepared once when constant), then the float32 steps of
    the MatMulInteger -> Cast -> Mul [-> Add] chain it replaces (``opt_fusions``), in that order, so
    the fused and the unfused graph give the same bits."""

    b_zero_point_index = 5

    def compute(self, inputs: list) -> list:
        n = len(inputs)
        a, b, a_s, b_s = inputs[0], inputs[1], inputs[2], inputs[3]
        za = inputs[4] if n > 4 else None
        zb = inputs[5] if n > 5 else None
        bias = inputs[6] if n > 6 else None
        if za is not None and za.size > 1:
            raise InvalidArgument(f"MatMulIntegerToFloat: a_zero_point has {za.size} values; it must be one "
                                  "(per-tensor quantization of A).")
        cached = self._b
        bf = cached[2] if cached is not None and cached[0] is b and cached[1] is zb else self._centered_b(b, zb)
        acc = self._product(a, za, bf)
        # float32 whatever the scales' type: onnxruntime's kernel takes float scales
        y = np.multiply(acc, np.multiply(a_s, b_s, dtype=np.float32), dtype=np.float32)
        if bias is not None:
            y += bias
        return [y]


@register("DynamicQuantizeMatMul", since=1, domain=MS)
class DynamicQuantizeMatMul(MatMulInteger):
    """A quantized on its own range (``quantize.dynamic_quantizer``: uint8 codes less their zero
    point) times B less its zero point, exactly (``MatMulInteger``'s product, B prepared once when
    constant), scaled by a_scale * b_scale, plus bias: the float32 steps of the
    DynamicQuantizeLinear -> MatMulIntegerToFloat pair it replaces (``dynamic_quant_fusions``), in
    that order, so the fused and the unfused graph give the same bits."""

    b_zero_point_index = 3

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        super().__init__(node, ctx)
        self._centered = dynamic_quantizer()

    def compute(self, inputs: list) -> list:
        n = len(inputs)
        a, b, b_s = inputs[0], inputs[1], inputs[2]
        zb = inputs[3] if n > 3 else None
        bias = inputs[4] if n > 4 else None
        cached = self._b
        bf = cached[2] if cached is not None and cached[0] is b and cached[1] is zb else self._centered_b(b, zb)
        if a.dtype != np.float32:  # (read as float32, as DynamicQuantizeLinear reads it)
            a = a.astype(np.float32)
        codes, scale, _ = self._centered(a.reshape(1) if a.ndim == 0 else a)
        acc = self._product(codes.reshape(a.shape), None, bf)
        y = np.multiply(acc, np.multiply(scale, b_s, dtype=np.float32), dtype=np.float32)
        if bias is not None:
            y += bias
        return [y]


_NEG_TAU = np.array(-(2.0 ** -100), np.float32)  # the ranges' reduction's initial (``_quantized_steps``)
_HALF32 = np.array(0.5, np.float32)


@register("DynamicQuantizeLSTM", since=1, domain=MS)
class DynamicQuantizeLSTM(LSTM):
    """LSTM whose W [directions, input, 4*hidden] and R [directions, hidden, 4*hidden] are int8 or
    uint8 with per-direction (or per-column) scales and zero points. As onnxruntime: all time steps'
    inputs are quantized together (one range) for the input product, and each step's hidden state
    row by row for the recurrent one.

    The common form runs LSTM's ``_run_default`` with the weights less their zero points, in gate
    order, and the per-column multipliers (weight scale times ``gate_scale``) prepared once; a
    small bidirectional one runs LSTM's ``_run_both_directions`` (``_quantized_pair``)."""

    weight_inputs = (1, 2, 3, 8, 9, 10, 11)

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        super().__init__(node, ctx)
        self._centered = dynamic_quantizer()

    def _general(self, inputs: list) -> list:
        args = list(inputs) + [None] * (12 - len(inputs))
        # The LSTM kernel reads W and R as [directions, 4*hidden, K]: hand it views in that layout;
        # the scales and zero points (inputs 8-11) reach the products through the inputs list.
        args[1], args[2] = np.swapaxes(args[1], 1, 2), np.swapaxes(args[2], 1, 2)
        # R's scale, zero point and R minus its zero point per direction, once for every step of
        # this run (args[12]; a list of this call's own, so threads running the kernel at once
        # share nothing)
        args[12:] = [[None] * args[2].shape[0]]
        return RecurrentKernel.plain_loop(self, args)

    @staticmethod
    def _per_direction(v: np.ndarray | None, d: int) -> np.ndarray | None:
        if v is None or np.ndim(v) == 0:
            return v
        return v[d] if v.shape[0] > 1 or v.ndim > 1 else v[0]

    def _input_product(self, x: np.ndarray, w: np.ndarray, d: int, inputs: list) -> np.ndarray:
        return quantized_product(x, w[d].T, self._per_direction(inputs[8], d), self._per_direction(inputs[9], d))

    def _hidden_product(self, h: np.ndarray, r: np.ndarray, d: int, inputs: list) -> np.ndarray:
        # onnxruntime splits the batch's rows over its threads and quantizes each block of rows on
        # its own range; with as many threads as rows (its default on small batches) each row has
        # its own: quantize row by row, as that.
        prepared = inputs[12]
        if prepared[d] is None:
            scale, zp = self._per_direction(inputs[10], d), self._per_direction(inputs[11], d)
            prepared[d] = scale, zp, centered(r.T, zp)
        scale, zp, weights = prepared[d]
        return quantized_product_by_row(h, r.T, scale, zp, weights)

    def _prepare(self, args: list, dt: np.dtype) -> list | None:
        """Per direction (W less its zero point [input, 4*hidden], R less its zero point
        [4*hidden, hidden], bias row, (R's, the steps' outer-product factor, R's float type), W's
        multipliers: per column, or W's one scale with ``gate_scale`` in W), gates in
        ``gate_order``; None for a form the general loop takes."""
        w, r, b = args[1], args[2], args[3]
        nd = len(self.directions)
        if (dt != np.float32 or w.ndim != 3 or r.ndim != 3 or w.dtype not in _CODES or r.dtype not in _CODES
                or args[8] is None or args[10] is None):
            return None
        h = r.shape[1]
        if w.shape[0] != nd or r.shape[0] != nd or w.shape[2] != 4 * h or r.shape[2] != 4 * h or (
                self.hidden is not None and h != self.hidden) or (b is not None and (b.dtype != dt or b.shape != (nd, 8 * h))):
            return None
        order, scale = gate_order(h), gate_scale(h, np.float32)
        fx, fh = exact_float_dtype(w.shape[1]), exact_float_dtype(h)
        out = []
        for d in range(nd):
            w_scale, w_zp = self._per_direction(args[8], d), self._per_direction(args[9], d)
            r_scale, r_zp = self._per_direction(args[10], d), self._per_direction(args[11], d)
            wc = np.ascontiguousarray(np.subtract(w[d], _zero(w_zp, w.dtype), dtype=fx)[:, order])
            rc = np.ascontiguousarray(np.subtract(r[d], _zero(r_zp, r.dtype), dtype=fh)[:, order].T)
            if np.size(w_scale) == 1:  # one scale: gate_scale into W's columns (halves: exact), the scale a 0-d operand
                wc = np.ascontiguousarray(wc * scale.astype(fx))
                w_mul = np.asarray(w_scale, np.float32).reshape(())
            else:
                w_mul = np.broadcast_to(np.asarray(w_scale, np.float32), (4 * h,))[order] * scale
            r_mul = (np.broadcast_to(np.asarray(r_scale, np.float32), (4 * h,))[order] * scale).reshape(-1, 1)
            bias = None if b is None else (b[d, :4 * h] + b[d, 4 * h:])[order] * scale
            # the step's one outer product with [min; -max] (see ``_quantized_direction``): R's
            # multipliers / -255 (twice), [1, 1] and [1, 0] rows, as one [7 * hidden, 2] factor
            spread = np.ones((7 * h, 2), np.float32)
            spread[:4 * h] = r_mul / np.float32(-255)
            spread[6 * h:, 1] = 0
            out.append((wc, rc, bias, (rc, spread, fh), w_mul))
        return out

    project_whole = True  # every step's input on one range: ``_run_native`` projects them at once

    def _make_native_weights(self, weights: list, inputs: list) -> list[tuple] | None:
        """Per direction (R less its zero point transposed [hidden, 4 * hidden] float32, R's
        multipliers [4 * hidden]: its scale per gate row in ``gate_order`` times ``gate_scale``)
        for LSTM's ``_run_native``; None where R's products are not exact in float32."""
        out = []
        for d, wd in enumerate(weights):
            rc, _, ft = wd[3]
            if ft != np.float32:
                return None
            h = rc.shape[1]
            r_scale = self._per_direction(inputs[10], d)
            mult = np.broadcast_to(np.asarray(r_scale, np.float32), (4 * h,))[gate_order(h)] * gate_scale(h, np.float32)
            out.append((np.ascontiguousarray(rc.T), np.ascontiguousarray(mult, np.float32)))
        return out

    def _input_projection(self, x2: np.ndarray, weights: tuple) -> np.ndarray:
        """Every step's input quantized on one range, times W less its zero point, exactly, then
        scaled per column: [seq * batch, 4 * hidden] float32."""
        codes, scale, _ = self._centered(x2)
        wc = weights[0]
        acc = _dot(codes if wc.dtype == np.float32 else codes.astype(wc.dtype), wc)
        if acc.dtype == np.float32:
            _multiply(acc, scale * weights[4], acc)
            return acc
        return np.multiply(acc, scale * weights[4], dtype=np.float32)

    def _quantized_direction(self, rq: tuple, xw: np.ndarray, h0: np.ndarray | None, c0: np.ndarray | None,
                             yt: np.ndarray, y_h: np.ndarray, y_c: np.ndarray, d: int, run_options) -> None:
        """The recurrence with the hidden state quantized batch row by row (onnxruntime's threads
        quantize each block of batch rows on its own range; with as many threads as rows, its
        default on small batches, each row has its own) before its product with R.

        Eleven calls a step beyond the float loop's, each on a contiguous array (a broadcast
        operand costs numpy three times a plain one):
        - the rows' ends from one reduction of [h; -h] (batch rows along the last axis), its
          initial -2^-100 in place of 0: an all-zero row then gets a tiny range instead of a
          zero one (no division by zero; its codes are 0 either way), and any row whose range
          exceeds 2^-75 gets exactly onnxruntime's range;
        - one outer product of [min; -max] spreads over the columns the later calls read
          [hidden, batch] blocks: min - max (twice, then / -255: the rows' scales, exactly as
          onnxruntime), min, and R's multipliers times the scales ([4 * hidden, batch], as
          (multiplier / -255) * (min - max): within a few ulps of onnxruntime's multiplier *
          scale, which only scales the exact integer products);
        - [min; h] / scale in one division and rint: rint(min / scale) = -zero point, so
          min(rint(h / scale), 255 - zero point) are the codes less their zero point, clamped
          as onnxruntime; their product with R less its zero point is exact (integers), then
          scaled per column and row.
        The scratch arrays and their views are made once per shape: a run takes them out of the
        dict and puts them back, so runs at once on other threads make their own."""
        rc, spread, ft = rq
        seq, batch, h4 = xw.shape
        h = h4 // 4
        key = ("quantized", h, batch, ft)
        ws = self._workspaces.pop(key, None) or _step_workspace(h, batch, ft)
        (g4, c, both, h_rows, neg_rows, lo_nhi, spreads7, mult, scales, lo_hd, hslot, hslot_t, codes, top, v,
         acc) = ws[0], ws[3], *ws[10:]
        tail = ws[1:10]  # cell_update's arrays
        c[...] = 0 if c0 is None else c0.T
        hslot[...] = 0 if h0 is None else h0.T
        half = _HALF32
        dot, add, multiply, tanh, divide, rint, minimum, negative, reduce = (
            _dot, _add, _multiply, np.tanh, _divide, _rint, _minimum, _negative, _min)
        reverse = self.reverse[d]
        # an all-zero initial state (exporters feed zeros) has codes 0: its R product is 0, exactly
        zero_state = h0 is None or not np.count_nonzero(h0)
        for t, xt in projection_steps(xw, reverse, run_options):
            if zero_state:
                zero_state = False
                tanh(xt, g4)
            else:
                h_rows[...] = hslot_t
                negative(h_rows, neg_rows)
                reduce(both, 2, None, lo_nhi, False, _NEG_TAU)  # -> [min; -max]
                dot(spread, lo_nhi, spreads7)
                divide(scales, _F255N, scales)
                divide(lo_hd, scales, codes)
                rint(codes, codes)
                add(top, _F255, top)
                minimum(v, top, out=v)
                dot(rc, v, acc)
                multiply(acc, mult, g4)
                add(g4, xt, g4)
                tanh(g4, g4)
            cell_update(tail, half, hslot)
            yt[t, d] = hslot
        y_h[d] = hslot_t
        y_c[d] = c.T
        if len(self._workspaces) < WORKSPACES:  # a few shapes per model; a stream of new ones is not kept
            self._workspaces[key] = ws

    def _make_pair_weights(self, weights: list) -> tuple:
        """Both directions' weights in ``pair_rows`` order for ``_run_both_directions``: (W less
        its zero point [input, 8 * hidden] and its multipliers, for ``_input_projection``; R less
        its zero point, block-diagonal [8 * hidden, 2 * hidden]; bias row or None; False (the
        first step's product is left out by the state's codes); (that R, the steps' outer-product
        factor of both directions, R's float type)). The block product of integers is exact: the
        same sums as each direction's own."""
        (wf, rf, bf, (_, sf, fh), mf), (wb, rb, bb, (_, sb, _), mb) = weights
        h = rf.shape[1]
        rows = pair_rows(h)
        wc = np.ascontiguousarray(np.concatenate([wf, wb], axis=1)[:, rows])
        w_mul = np.concatenate([np.broadcast_to(mf, (4 * h,)), np.broadcast_to(mb, (4 * h,))])[rows]
        rc = np.zeros((8 * h, 2 * h), fh)
        rc[:4 * h, :h] = rf
        rc[4 * h:, h:] = rb
        rc = np.ascontiguousarray(rc[rows])
        # the outer product with [min_f; min_b; -max_f; -max_b] (``_quantized_pair``): each
        # direction's R multipliers / -255 on its rows (both of its columns), its scales twice
        # ([min - max] of each direction, for the min rows and for the hidden-state rows), its min
        spread = np.zeros((14 * h, 4), np.float32)
        mult = np.zeros((8 * h, 4), np.float32)
        mult[:4 * h, 0] = mult[:4 * h, 2] = sf[:4 * h, 0]
        mult[4 * h:, 1] = mult[4 * h:, 3] = sb[:4 * h, 0]
        spread[:8 * h] = mult[rows]
        for i in range(2):
            for d in range(2):
                spread[8 * h + (2 * i + d) * h: 8 * h + (2 * i + d + 1) * h, [d, 2 + d]] = 1
            spread[12 * h + i * h: 12 * h + (i + 1) * h, i] = 1
        bias = None if bf is None else np.concatenate([bf, bb])[rows]
        return (wc, None, None, None, w_mul), rc, bias, False, (rc, spread, fh)

    def _quantized_pair(self, rq: tuple, blocks, h0: np.ndarray | None, c0: np.ndarray | None,
                        ys: np.ndarray) -> np.ndarray:
        """``_quantized_direction``'s steps for both directions at once (``_run_both_directions``):
        the hidden state [2 * hidden, batch] quantized per direction and batch row (the ranges of
        [h; -h] as [sign, direction, batch row, hidden], one reduction), one outer product giving
        both directions' multipliers, scales and minima, and the block-diagonal product of the
        codes less their zero points with R less its zero point. The codes are each direction's
        own; the multipliers sum the same two terms as ``_quantized_direction`` with zero terms
        between (within an ulp of them)."""
        rc, spread, ft = rq
        batch = ys.shape[2]
        h = rc.shape[1] // 2
        key = ("quantized pair", h, batch, ft)
        ws = self._workspaces.pop(key, None) or _pair_workspace(h, batch, ft)
        (g8, c, both, h_rows, neg_rows, lo_nhi, lo4, spreads7, mult, scales, lo_hd, hslot, hslot_t, codes, top,
         v, acc) = ws[0], ws[3], *ws[10:]
        tail = ws[1:10]  # cell_update's arrays
        c[...] = 0 if c0 is None else c0
        hslot[...] = 0 if h0 is None else h0
        half = _HALF32
        dot, add, multiply, tanh, divide, rint, minimum, negative, reduce = (
            _dot, _add, _multiply, np.tanh, _divide, _rint, _minimum, _negative, _min)
        # an all-zero initial state has codes 0: its R product is 0, exactly
        zero_state = h0 is None or not np.count_nonzero(h0)
        run_options = RUN_OPTIONS.get()  # (its terminate flag is read every step, as check_terminate does)
        for xs, outs in blocks:
            for xt, out in zip(xs, outs):
                if run_options is not None and run_options.terminate:  # a long sequence stops in bounded time
                    check_terminate()
                if zero_state:
                    zero_state = False
                    tanh(xt, g8)
                else:
                    h_rows[...] = hslot_t
                    negative(h_rows, neg_rows)
                    reduce(both, 3, None, lo_nhi, False, _NEG_TAU)  # -> [min_f; min_b; -max_f; -max_b]
                    dot(spread, lo4, spreads7)
                    divide(scales, _F255N, scales)
                    divide(lo_hd, scales, codes)
                    rint(codes, codes)
                    add(top, _F255, top)
                    minimum(v, top, out=v)
                    dot(rc, v, acc)
                    multiply(acc, mult, g8)
                    add(g8, xt, g8)
                    tanh(g8, g8)
                cell_update(tail, half, hslot)
                out[...] = hslot
        final = c.copy()
        if len(self._workspaces) < WORKSPACES:  # a few shapes per model; a stream of new ones is not kept
            self._workspaces[key] = ws
        return final


def _pair_workspace(h: int, batch: int, ft: type) -> tuple:
    """``DynamicQuantizeLSTM._quantized_pair``'s scratch arrays and their views, as
    ``_step_workspace``'s for both directions (hidden-state rows [forward; backward])."""
    gates = gate_workspace(2 * h, batch, np.dtype(np.float32))
    both = _empty((2, 2, batch, h), np.float32)  # [h; -h] by direction and batch row
    spreads = _empty((16 * h, batch), np.float32)  # [multipliers; scales; scales; minima | hidden state]
    codes = _empty((4 * h, batch), ft)  # [rint(min / scale) + 255; codes less the zero point]
    hslot = spreads[14 * h:]
    lo_nhi = _empty((4, batch), np.float32)  # [min_f; min_b; -max_f; -max_b]
    return gates + (both, both[0], both[1], lo_nhi.reshape(2, 2, batch), lo_nhi,
            spreads[:14 * h], spreads[:8 * h], spreads[8 * h:12 * h], spreads[12 * h:], hslot,
            hslot.reshape(2, h, batch).transpose(0, 2, 1), codes, codes[:2 * h], codes[2 * h:],
            gates[0] if ft is np.float32 else _empty((8 * h, batch), ft))


def _step_workspace(h: int, batch: int, ft: type) -> tuple:
    """``DynamicQuantizeLSTM._quantized_direction``'s scratch arrays and their views."""
    gates = gate_workspace(h, batch, np.dtype(np.float32))
    both = _empty((2, batch, h), np.float32)  # [h; -h], batch rows
    spreads = _empty((8 * h, batch), np.float32)  # [multipliers; scale; scale; min | hidden state]
    codes = _empty((2 * h, batch), ft)  # [rint(min / scale) + 255; codes less the zero point]
    return gates + (both, both[0], both[1], _empty((2, batch), np.float32),
            spreads[:7 * h], spreads[:4 * h], spreads[4 * h:6 * h], spreads[6 * h:], spreads[7 * h:],
            spreads[7 * h:].T, codes, codes[:h], codes[h:], gates[0] if ft is np.float32 else _empty((4 * h, batch), ft))


_CODE_BOUNDS = {np.dtype(np.int8): (-128.0, 127.0), np.dtype(np.uint8): (0.0, 255.0)}


def _round_codes(y: np.ndarray, dtype: np.dtype, native: ModuleType | None) -> np.ndarray:
    """``round_to_codes(y, dtype)``, by ``QUANTIZE_PATHS["native_requantize"]`` (a product by 1 and
    a zero point of 0 change no value) where ``native`` is given and y is C-contiguous float32."""
    bounds = _CODE_BOUNDS.get(np.dtype(dtype)) if native is not None else None
    if bounds is None or y.dtype != np.float32 or not y.flags.c_contiguous:
        return round_to_codes(y, dtype)
    codes = np.empty(y.shape, dtype)
    native.requantize(y, codes, 1.0, 0.0, *bounds)
    return codes


def _requantize(acc: np.ndarray, scale: np.ndarray, zp: np.ndarray | None, dtype: np.dtype,
                native: ModuleType | None = None) -> np.ndarray:
    """int32 accumulations (held exactly in a float array) to y's codes as MLAS requantizes them:
    float32 product with the combined scale, rounded half to even, plus the zero point, saturated.
    ``native``: by ``QUANTIZE_PATHS["native_requantize"]`` where its condition holds (float32 sums,
    one float32 scale, an 8-bit zero point of one value or none)."""
    if native is not None and acc.dtype == np.float32 and acc.flags.c_contiguous and scale.dtype == np.float32 \
            and scale.size == 1 and scale.ndim <= acc.ndim and (zp is None or (zp.size == 1 and zp.ndim <= acc.ndim)):
        bounds = _CODE_BOUNDS.get(np.dtype(dtype))
        if bounds is not None and (zp is None or zp.dtype == dtype):
            codes = np.empty(acc.shape, dtype)
            z = 0.0 if zp is None else float(zp.reshape(-1)[0])
            native.requantize(acc, codes, float(scale.reshape(-1)[0]), z, *bounds)
            return codes
    y = np.multiply(acc, scale, dtype=np.float32)
    np.rint(y, out=y)
    if zp is not None:
        y += zp.astype(np.float32)
    return saturate_codes(y, dtype)


_exact_dtype = exact_float_dtype


_CONV_ATTRIBUTES = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


class _CodesConv:
    """The convolution of 8-bit codes less their zero points (exact in float32 or float64, as the
    integer sums) by the CPU EP's ``com.onnxhal`` FusedConv kernel, whose 2-D paths are faster than
    the plain Conv's (the corpus's ResNet QLinearConv with the 7x7 stem over 2x3x32x32: 57 against
    86 us);
    the weights less their zero point are converted once while both are constant initializers."""

    def __init__(self, node: Node, ctx: KernelCreateContext, x_input: int, w_input: int, w_zp_input: int) -> None:
        from onnxhal.runtime.providers.cpu.kernel_factory import create_cpu_kernel
        from onnxhal.runtime.providers.cpu.kernels.fused import DOMAIN

        names = list(node.inputs) + [""] * 9
        attrs = [a for k, a in node.attribute_protos.items() if k in _CONV_ATTRIBUTES]
        conv = Node("FusedConv", [names[x_input], names[w_input]], node.outputs[:1], name=node.name, domain=DOMAIN,
                    attribute_protos=attrs)
        self.conv = create_cpu_kernel(conv, ctx, 1)
        self.constant_w = ctx is not None and bool(names[w_input]) and ctx.is_constant_initializer(
            names[w_input]) and (not names[w_zp_input] or ctx.is_constant_initializer(names[w_zp_input]))
        self._w: tuple | None = None  # (W, its zero point, W less it as float)

    def weights(self, w: np.ndarray, w_zp: np.ndarray | None) -> np.ndarray:
        kept = self._w
        if kept is not None and kept[0] is w and kept[1] is w_zp:
            return kept[2]
        ft = _exact_dtype(math.prod(w.shape[1:]))
        wzp = _zero(w_zp, w.dtype).astype(ft)
        wf = w.astype(ft) - (wzp.reshape((-1,) + (1,) * (w.ndim - 1)) if wzp.ndim and wzp.size > 1 else wzp)
        if self.constant_w:
            self._w = (w, w_zp, wf)  # one swap: a concurrent run sees the old entry or this one
        return wf

    def __call__(self, x: np.ndarray, x_zp: np.ndarray | None, w: np.ndarray, w_zp: np.ndarray | None) -> np.ndarray:
        wf = self.weights(w, w_zp)
        xf = x.astype(wf.dtype) if x_zp is None else np.subtract(x, x_zp, dtype=wf.dtype)
        return self.conv.compute([xf, wf])[0]


@register("QLinearConv", since=10)
class QLinearConv(Kernel):
    """Conv of uint8/int8 codes: ``_CodesConv`` on the codes less their zero points, the int32 bias
    added, and the result requantized with x_scale * w_scale / y_scale per output channel (kept
    while the scales are the same arrays)."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.conv = _CodesConv(node, ctx, 0, 3, 5)
        self.name = node.name
        names = list(node.inputs) + [""] * 9
        self.constant_scales = ctx is not None and all(bool(names[i]) and ctx.is_constant_initializer(names[i])
                                                       for i in (1, 4, 6))
        self._scale: tuple | None = None  # (x, w and y scales, the combined scale)

    def compute(self, inputs: list) -> list:
        inputs = list(inputs) + [None] * (9 - len(inputs))
        x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp, bias = inputs[:9]
        acc = self.conv(x, x_zp, w, w_zp)
        m = w.shape[0]
        if bias is not None:
            acc += bias.astype(acc.dtype).reshape((1, m) + (1,) * (acc.ndim - 2))
        kept = self._scale
        if kept is not None and kept[0] is x_s and kept[1] is w_s and kept[2] is y_s:
            scale = kept[3]
        else:
            scale = (np.float32(x_s) * w_s.astype(np.float32) / np.float32(y_s)).astype(np.float32)
            if scale.size > 1:
                scale = scale.reshape((1, m) + (1,) * (acc.ndim - 2))
            if self.constant_scales:
                self._scale = (x_s, w_s, y_s, scale)  # one swap: a concurrent run sees either entry
        return [_requantize(acc, scale, y_zp, (y_zp.dtype if y_zp is not None else x.dtype))]


@register("QLinearMatMul", since=10)
class QLinearMatMul(Kernel):
    """(A - a_zp) @ (B - b_zp), exact in the float type ``exact_float_dtype`` gives, requantized
    with a_scale * b_scale / y_scale (``plain``). B less its zero point and the combined scale are
    kept while they are constant initializers (a QDQ model's weights and scales), and a 2-D B takes
    the rows of every batch of A in one BLAS product: the same exact sums and the same scale."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        names = list(node.inputs) + [""] * 8
        constant = [ctx is not None and bool(n) and ctx.is_constant_initializer(n) for n in names[:8]]
        self.constant_b = constant[3] and (constant[5] or not names[5])
        self.constant_scales = constant[1] and constant[4] and constant[6]
        self._b: tuple | None = None  # (B, its zero point, B less it)
        self._scale: tuple | None = None  # (the three scales, the combined one)
        self._native = quantize_native()

    @staticmethod
    def plain(inputs: list) -> np.ndarray:
        """The canonical form, every step per call."""
        a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp = inputs[:8]
        ft = _exact_dtype(a.shape[-1])
        acc = np.matmul(a.astype(ft) - _zero(a_zp, a.dtype).astype(ft), b.astype(ft) - _zero(b_zp, b.dtype).astype(ft))
        scale = (np.float32(a_s) * b_s.astype(np.float32) / np.float32(y_s)).astype(np.float32)
        return _requantize(acc, scale, y_zp, y_zp.dtype)

    def compute(self, inputs: list) -> list:
        a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp = inputs[:8]
        ft = _exact_dtype(a.shape[-1])
        kept = self._b
        if kept is not None and kept[0] is b and kept[1] is b_zp and kept[2].dtype == ft:
            bf = kept[2]
        else:
            bf = b.astype(ft) - _zero(b_zp, b.dtype).astype(ft)
            if self.constant_b:
                self._b = (b, b_zp, bf)  # one swap: a concurrent run sees the old entry or this one
        af = np.subtract(a, _zero(a_zp, a.dtype), dtype=ft)
        if bf.ndim == 2 and af.ndim > 2:
            acc = _dot(af.reshape(-1, af.shape[-1]), bf).reshape(af.shape[:-1] + bf.shape[1:])
        else:
            acc = np.matmul(af, bf)
        kept = self._scale
        if kept is not None and kept[0] is a_s and kept[1] is b_s and kept[2] is y_s:
            scale = kept[3]
        else:
            scale = (np.float32(a_s) * b_s.astype(np.float32) / np.float32(y_s)).astype(np.float32)
            if self.constant_scales:
                self._scale = (a_s, b_s, y_s, scale)
        return [_requantize(acc, scale, y_zp, y_zp.dtype, self._native)]


def _requant(x: np.ndarray, x_scale, x_zp, y_scale, y_zp, dtype: np.dtype) -> np.ndarray:
    """Codes from one (scale, zero point) to another, as onnxruntime's lookup tables: dequantize
    in float32, divide by the new scale, round half to even, add the new zero point, saturate."""
    return quantize(dequantize(x, x_scale, x_zp), y_scale, y_zp, dtype)


_CODES_IN_BIT_ORDER = np.arange(256, dtype=np.uint8)


def requant_table(x_dtype: np.dtype, x_scale, x_zp, y_scale, y_zp, dtype: np.dtype) -> np.ndarray:
    """``_requant`` of every 8-bit code of x_dtype, indexed by the code's bits (x.view(uint8)):
    onnxruntime's own lookup table, one take per tensor instead of eight passes over it."""
    return _requant(_CODES_IN_BIT_ORDER.view(x_dtype), x_scale, x_zp, y_scale, y_zp, dtype)


def _one_value(v: np.ndarray | None) -> bool:
    return v is None or v.size == 1


@register("QLinearConcat", since=1, domain=MS)
class QLinearConcat(Kernel):
    """Concat of quantized inputs (Y_scale, Y_zero_point, then X, X_scale, X_zero_point per input),
    each requantized to Y's scale and zero point (copied where they are already Y's) through
    ``requant_table``, kept per input while the four scales and zero points are constant."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.axis = int(node.attr("axis", 0))
        self.name = node.name
        names = list(node.inputs)
        constant = [ctx is not None and bool(n) and ctx.is_constant_initializer(n) for n in names]
        #: per input: whether its scale and zero point and Y's are constant initializers
        self.constant = [all(constant[j] for j in (0, 1, i + 1, i + 2)) if i + 2 < len(names) else False
                         for i in range(2, len(names), 3)]
        self._tables: dict[int, tuple] = {}

    def _table(self, k: int, x: np.ndarray, s, z, y_scale, y_zp) -> np.ndarray:
        kept = self._tables.get(k)
        if kept is not None and kept[0] is s and kept[1] is z and kept[2] is y_scale and kept[3] is y_zp:
            return kept[4]
        table = requant_table(x.dtype, s, z, y_scale, y_zp, y_zp.dtype)
        if k < len(self.constant) and self.constant[k]:
            self._tables[k] = (s, z, y_scale, y_zp, table)
        return table

    def compute(self, inputs: list) -> list:
        y_scale, y_zp = inputs[0], inputs[1]
        rest = inputs[2:]
        if len(rest) % 3 or not rest:
            raise InvalidArgument(f"QLinearConcat node {self.name!r}: {len(rest)} inputs after Y_scale and "
                                  "Y_zero_point; give (X, X_scale, X_zero_point) triples.")
        dtype = y_zp.dtype
        parts = []
        for k, i in enumerate(range(0, len(rest), 3)):
            x, s, z = rest[i:i + 3]
            if s.size == 1 == y_scale.size and _one_value(z) and y_zp.size == 1 and x.dtype.itemsize == 1:
                same = s.item() == y_scale.item() and (0 if z is None else z.item()) == y_zp.item() and x.dtype == dtype
                parts.append(x if same else self._table(k, x, s, z, y_scale, y_zp).take(x.view(np.uint8)))
                continue
            same = np.array_equal(s, y_scale) and np.array_equal(z, y_zp)
            parts.append(x if same else _requant(x, s, z, y_scale, y_zp, dtype))
        return [np.concatenate(parts, axis=self.axis)]


@register("QLinearWhere", since=1, domain=MS)
class QLinearWhere(Kernel):
    """Where(condition, X, Y) with X and Y requantized to Z's scale and zero point."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        pass

    def compute(self, inputs: list) -> list:
        cond, x, xs, xz, y, ys, yz, zs, zz = inputs[:9]
        dtype = zz.dtype
        return [np.where(cond, _requant(x, xs, xz, zs, zz, dtype), _requant(y, ys, yz, zs, zz, dtype))]


@register("QLinearAveragePool", since=1, domain=MS)
class QLinearAveragePool(Kernel):
    """AveragePool of the dequantized input (the float kernel, every attribute but channels_last),
    quantized with Y's scale and zero point; channels_last=1 inputs are NHWC."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        from onnxhal.runtime.providers.cpu.kernels.pooling import AveragePool

        self.channels_last = bool(node.attr("channels_last", 0))
        self.pool = AveragePool(node, ctx)

    def compute(self, inputs: list) -> list:
        x, x_s, x_zp, y_s = inputs[:4]
        y_zp = inputs[4] if len(inputs) > 4 else None
        f = dequantize(x, x_s, x_zp)
        if self.channels_last:
            f = np.moveaxis(f, -1, 1)
        y = self.pool.compute([f])[0]
        if self.channels_last:
            y = np.moveaxis(y, 1, -1)
        return [quantize(y, y_s, y_zp, x.dtype)]


@register("QGemm", since=1, domain=MS)
class QGemm(Kernel):
    """alpha * A' @ B' of quantized A and B (their integer product held exactly), plus the int32
    bias C in alpha * A_scale * B_scale units; float32 out without y_scale, else requantized."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.alpha = np.float32(node.attr("alpha", 1.0))
        self.ta, self.tb = bool(node.attr("transA", 0)), bool(node.attr("transB", 0))
        names = list(node.inputs) + [""] * 9
        self.constant_b = ctx is not None and bool(names[3]) and ctx.is_constant_initializer(names[3]) and (
            not names[5] or ctx.is_constant_initializer(names[5]))
        self._b: tuple | None = None  # (B, its zero point, B' less it as float)

    def _centered_b(self, b: np.ndarray, b_zp: np.ndarray | None) -> np.ndarray:
        kept = self._b
        if kept is not None and kept[0] is b and kept[1] is b_zp:
            return kept[2]
        bt = b.T if self.tb else b
        ft = _exact_dtype(bt.shape[0])
        bzp = _zero(b_zp, b.dtype).astype(ft)
        if bzp.ndim and bzp.size > 1:  # per output column
            bzp = bzp.reshape(1, -1)
        bf = np.ascontiguousarray(bt.astype(ft) - bzp)
        if self.constant_b:
            self._b = (b, b_zp, bf)  # one swap: a concurrent run sees the old entry or this one
        return bf

    def compute(self, inputs: list) -> list:
        args = list(inputs) + [None] * (9 - len(inputs))
        a, a_s, a_zp, b, b_s, b_zp, c, y_s, y_zp = args[:9]
        if self.ta:
            a = a.T
        bf = self._centered_b(b, b_zp)
        ft = bf.dtype
        af = a.astype(ft) if a_zp is None else np.subtract(a, a_zp, dtype=ft)
        acc = np.matmul(af, bf)
        scale = np.float32(a_s) * b_s.astype(np.float32).reshape(-1) * self.alpha
        if c is not None:
            acc += c.astype(ft)  # C is in alpha * A_scale * B_scale units (zero point 0)
        if y_s is None:
            return [np.multiply(acc, scale, dtype=np.float32)]
        dtype = y_zp.dtype if y_zp is not None else a.dtype
        return [_requantize(acc, (scale / np.float32(y_s)).astype(np.float32), y_zp, dtype)]


@register("ConvInteger", since=10)
class ConvInteger(Kernel):
    """Conv of 8-bit codes less their zero points (w's per output channel or one), int32 out:
    ``_CodesConv`` (padding is the zero point, 0 after the subtraction), as QLinearConv without
    the requantization."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.conv = _CodesConv(node, ctx, 0, 1, 3)

    def compute(self, inputs: list) -> list:
        n = len(inputs)
        acc = self.conv(inputs[0], inputs[2] if n > 2 else None, inputs[1], inputs[3] if n > 3 else None)
        return [np.rint(acc).astype(np.int32)]
