"""DynamicQuantizeLinear (float32 to uint8 with a scale and zero point computed from the data), and
QuantizeLinear / DequantizeLinear in their common forms (the others through onnx.reference)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import ModuleType

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.runtime.providers.cpu.kernels.native_kernels import native_module
from onnxhal.runtime.providers.cpu.kernels.numerics import saturate_codes
from onnxhal.runtime.providers.cpu.kernels.registry import register
from onnxhal.runtime.providers.path_tables import path_table

_F32 = np.float32
_ZERO, _ONE, _F255 = np.array(0, _F32), _F32(1), _F32(255)  # (0-d arrays: the ufuncs' fastest operands)
_min, _max, _fmin, _fmax = np.minimum.reduce, np.maximum.reduce, np.fmin.reduce, np.fmax.reduce
_divide, _rint, _add, _fmaxu, _fminu = np.divide, np.rint, np.add, np.fmax, np.fmin
_ZP = [np.array(z, _F32) for z in range(256)]  # the zero points as float32 operands, made once
_CODES = (np.uint8, np.int8, np.uint16, np.int16)

#: The quantization kernels' other ways to run, against their numpy forms.
QUANTIZE_PATHS = path_table("quantize", "the numpy forms: QuantizeLinear._apply, QuantizeDequantize's six ufunc "
                                        "passes, dynamic_quantize_centered")
QUANTIZE_PATHS.add("native_quantize", "QuantizeLinear of a float32 x (copied C-contiguous first where it is not) "
                                      "with a one-element float32 scale and an 8- or 16-bit zero point (or none), "
                                      "the C extension _native built, ONNXHAL_NATIVE_KERNELS not 0 and "
                                      "NATIVE_QUANTIZE_ENABLED (read when a kernel is built): "
                                      "_native.quantize_linear, numpy's operations in one pass")
QUANTIZE_PATHS.add("native_dequantize", "DequantizeLinear of 8- or 16-bit codes (copied C-contiguous first where "
                                        "they are not) with a one-element float32 scale and a zero point of their type (or none), under the same "
                                        "switches: _native.dequantize_linear, the two passes in one")
QUANTIZE_PATHS.add("native_quantize_dequantize", "QuantizeDequantize of a float32 x of rank >= 1 (copied "
                                                 "C-contiguous first where it is not) in its fast form with a "
                                                 "one-element scale, under the same switches: "
                                                 "_native.quantize_dequantize, the six passes in one")
QUANTIZE_PATHS.add("native_dynamic_quantize", "dynamic quantization (DynamicQuantizeLinear, DynamicQuantizeMatMul, "
                                              "DynamicQuantizeLSTM's input product) of a C-contiguous float32 tensor "
                                              "of at least one value, under the same switches: "
                                              "_native.dynamic_quantize, range, parameters and codes in two passes")
QUANTIZE_PATHS.add("native_requantize", "QLinearMatMul's requantization of C-contiguous float32 sums with a "
                                        "one-element float32 scale and an int8/uint8 zero point (or none), and "
                                        "QLinearAdd's rounding of its C-contiguous float32 sums to int8/uint8 codes, "
                                        "under the same switches: _native.requantize, the six passes in one")
#: The switch of ``QUANTIZE_PATHS``' native paths: False keeps the numpy forms.
NATIVE_QUANTIZE_ENABLED = True


def quantize_native() -> ModuleType | None:
    """The C module for ``QUANTIZE_PATHS``' native paths, or None (read when a kernel is built)."""
    return native_module() if NATIVE_QUANTIZE_ENABLED else None


def dynamic_quantize_uint8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """uint8 codes, scale and zero point of a float32 tensor (``dynamic_quantize_centered``'s
    codes plus the zero point)."""
    f, scale, zp = dynamic_quantize_centered(x)
    _add(f, _ZP[zp], f)
    return f.astype(np.uint8), scale, zp


def dynamic_quantize_centered(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """uint8 codes less their zero point (float32: what a product reads), scale and zero point
    of a float32 tensor, exactly as onnxruntime's
    ``GetQuantizationParameter`` and ``MlasQuantizeLinear`` compute them: the range widened to
    hold 0 with NaNs left out of it, scale (max - min) / 255 in float32 (1 for a zero range),
    zero point ``round_half_even(clamp(-min / scale, 0, 255))`` with a NaN zero point taken as 255
    (``std::min``'s order), codes ``round_half_even(clamp(x / scale, -zp, 255 - zp)) + zp`` and
    NaN to code 0. The scale comes back as a float32 0-d array (the op's output), the zero point
    as an int.

    Fewest numpy calls for the tiny tensors of the corpus: two reductions, a division and a rint;
    the clamp runs only when the scalar bounds say a code could leave [0, 255]
    (ties rounded up at both ends, or inf and NaN)."""
    lo = _min(x, None, None, None, False, _ZERO)  # min(0, min(x)); NaN if x holds one
    hi = _max(x, None, None, None, False, _ZERO)
    clean = lo == lo and hi == hi
    if not clean:  # onnxruntime's range leaves NaNs out
        lo = _fmin(x, None, None, None, False, _ZERO)
        hi = _fmax(x, None, None, None, False, _ZERO)
    scale = _ONE if hi == lo else (hi - lo) / _F255
    v = float(-lo / scale)
    v = v if v < 255.0 else 255.0  # std::min(qmax, v): a NaN gives qmax
    zp = round(v) if v > 0.0 else 0  # Python's round: half to even, as RoundHalfToEven
    scale_out = np.array(scale, _F32)
    f = _divide(x, scale_out)
    # rint(x / scale) + zp stays in [0, 255] when the range's own ends do (rint is monotonic);
    # the bounds first keep inf and NaN away from round()
    top, bottom = float(hi / scale), float(lo / scale)
    if not (clean and -256.0 < bottom and top < 256.0 and round(top) <= 255 - zp and round(bottom) >= -zp):
        _fmaxu(f, _F32(-zp), out=f)  # (fmax: a NaN becomes the lower bound, code 0)
        _fminu(f, _F32(255 - zp), out=f)
    _rint(f, f)  # (out= positionally: a keyword argument costs more per call)
    return f, scale_out, zp


def dynamic_quantizer() -> Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, int]]:
    """``dynamic_quantize_centered``, or its C form where ``QUANTIZE_PATHS["native_dynamic_quantize"]``
    is on (read when a kernel is built); either takes any float32 tensor of at least one value."""
    native = quantize_native()
    if native is None:
        return dynamic_quantize_centered

    def centered(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        if not x.flags.c_contiguous or not x.size:
            return dynamic_quantize_centered(x)
        f = np.empty(x.shape, _F32)
        scale, zp = native.dynamic_quantize(x, f)  # QUANTIZE_PATHS["native_dynamic_quantize"]
        return f, np.array(scale, _F32), zp
    return centered


@register("DynamicQuantizeLinear", since=11)
class DynamicQuantizeLinear(Kernel):
    """As onnxruntime (``dynamic_quantize_uint8``). Where the spec's formula divides by zero (every
    value 0, or no value at all) the scale is 1, as onnxruntime (onnx.reference gives 1/255 for
    all zeros and fails on an empty input); the codes are 0 either way."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self._centered = dynamic_quantizer()

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        if x.dtype != np.float32:  # the spec's T1 is float32; a float16/float64 feed is read as it
            x = x.astype(np.float32)
        # (a 0-d division gives a numpy scalar, which takes no out=)
        f, scale, zp = self._centered(x.reshape(1) if x.ndim == 0 else x)
        _add(f, _ZP[zp], f)
        return [f.astype(np.uint8).reshape(x.shape), scale, np.array(zp, np.uint8)]


class _LinearQuant(Kernel):
    """What QuantizeLinear and DequantizeLinear share: the common forms natively (float32 scales,
    per tensor or per axis, 8-bit codes; int32 codes for DequantizeLinear), every other form
    (blocked quantization, float8/int4/int16 codes, float16 scales, output_dtype) through
    onnx.reference's kernel."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.axis = int(node.attr("axis", 1))
        self.plain = not node.attr("block_size", 0) and not node.attr("output_dtype", 0)
        self._node, self._ctx = node, ctx
        self._fallback: Kernel | None = None
        self._lock = threading.Lock()
        self._kept: tuple | None = None
        self._native_args: tuple | None = None  # _per_tensor_args's entry
        self._native = quantize_native() if self.plain else None

    def _per_tensor_args(self, scale: np.ndarray, zp: np.ndarray | None, pick) -> tuple | None:
        """(scale, zero point, code type, C arguments) for a per-tensor scale, kept from the last run
        while the same arrays come (one swap: a concurrent run sees either entry); ``pick`` makes the
        C arguments from ``per_tensor_codes``. None for a form the C routes do not take."""
        args = self._native_args
        if args is None or args[0] is not scale or args[1] is not zp:
            codes = per_tensor_codes(scale, zp)
            if codes is None:
                return None
            args = self._native_args = (scale, zp, codes[0], pick(codes))
        return args

    def _reference(self) -> Kernel:
        """onnx.reference's kernel, built on the first run that needs it (most models never do)."""
        with self._lock:
            if self._fallback is None:
                from onnxhal.runtime.providers.cpu.kernel_factory import ReferenceKernel

                self._fallback = ReferenceKernel(self._node, self._ctx, self._node.since_version or 10)
            return self._fallback

    def _scale_shape(self, x: np.ndarray, scale: np.ndarray) -> tuple | None:
        """How the scale broadcasts over x, or None for a form left to onnx.reference."""
        if scale.size == 1 and scale.ndim <= 1:  # a one-element 1-D scale is per tensor (onnxruntime's too)
            return ()
        if scale.ndim != 1 or x.ndim == 0:
            return None
        axis = self.axis + x.ndim if self.axis < 0 else self.axis
        if not 0 <= axis < x.ndim or scale.shape[0] != x.shape[axis]:
            return None
        return tuple(-1 if i == axis else 1 for i in range(x.ndim))

    def compute(self, inputs: list) -> list:
        x, scale = inputs[0], inputs[1]
        zp = inputs[2] if len(inputs) > 2 else None
        kept = self._kept  # a per-tensor run's checked operands, while its scale, zero point and x's type are the same
        if kept is not None and kept[0] is scale and kept[1] is zp and kept[2] is x.dtype:
            return [self._apply(x, kept[3], kept[4])]
        shape = self._scale_shape(x, scale) if self.plain and scale.dtype == np.float32 else None
        if shape is None or not self._native_types(x, zp) or (
                zp is not None and zp.shape != scale.shape and not zp.size == scale.size == 1):
            return self._reference().compute(inputs)
        s = scale.reshape(shape)
        z = None if zp is None else zp.reshape(shape)
        if shape == ():
            self._kept = (scale, zp, x.dtype, s, z)  # one swap: a concurrent run sees either entry
        return [self._apply(x, s, z)]


@register("DequantizeLinear", since=10)
class DequantizeLinear(_LinearQuant):
    """(x - zero_point) * scale in float32. 8- or 16-bit codes with a per-tensor scale take ``QUANTIZE_PATHS["native_dequantize"]`` where it is on."""

    def compute(self, inputs: list) -> list:
        native = self._native
        if native is None:
            return super().compute(inputs)
        x, scale = inputs[0], inputs[1]
        zp = inputs[2] if len(inputs) > 2 else None
        args = self._per_tensor_args(scale, zp, lambda codes: (codes[1], int(codes[2])))
        if args is None or x.__class__ is not np.ndarray or x.dtype != args[2]:
            return super().compute(inputs)
        if not x.flags.c_contiguous:  # (a transposed view: a copy costs less than numpy's passes)
            x = np.ascontiguousarray(x)
        y = np.empty(x.shape, _F32)
        native.dequantize_linear(x, y, *args[3])  # QUANTIZE_PATHS["native_dequantize"]
        return [y]

    @staticmethod
    def _native_types(x: np.ndarray, zp: np.ndarray | None) -> bool:
        if x.dtype == np.int32:
            return zp is None or zp.dtype == np.int32
        return x.dtype in _CODES and (zp is None or zp.dtype == x.dtype)

    @staticmethod
    def _apply(x: np.ndarray, scale: np.ndarray, zp: np.ndarray | None) -> np.ndarray:
        # the difference in int32, converted to float32 in the product: exact, one pass each
        d = x if zp is None else np.subtract(x, zp, dtype=np.int32)
        y = np.multiply(d, scale, dtype=np.float32)
        return y if type(y) is np.ndarray else np.asarray(y)


def per_tensor_codes(scale: np.ndarray, zp: np.ndarray | None) -> tuple[np.dtype, float, float, float, float] | None:
    """(code type, scale, zero point, lowest code, highest code) as Python numbers for a one-element
    float32 scale and an 8- or 16-bit zero point of one element (or none: uint8, 0); else None."""
    if scale.dtype != _F32 or scale.size != 1 or scale.ndim > 1:
        return None
    if zp is None:
        return np.dtype(np.uint8), float(scale.reshape(-1)[0]), 0.0, 0.0, 255.0
    if zp.dtype not in _CODE_RANGE or zp.size != 1 or zp.ndim > 1:
        return None
    qmin, qmax = _CODE_RANGE[zp.dtype]
    return zp.dtype, float(scale.reshape(-1)[0]), float(zp.reshape(-1)[0]), float(qmin), float(qmax)


@register("QuantizeLinear", since=10)
class QuantizeLinear(_LinearQuant):
    """saturate(round_half_to_even(x / scale) + zero_point) into the zero point's type (uint8
    without one), x float32; a NaN gives the type's minimum (``saturate_codes``). A C-contiguous x
    with a per-tensor scale takes ``QUANTIZE_PATHS["native_quantize"]`` where it is on."""

    def compute(self, inputs: list) -> list:
        native = self._native
        if native is None:
            return super().compute(inputs)
        x, scale = inputs[0], inputs[1]
        zp = inputs[2] if len(inputs) > 2 else None
        args = self._per_tensor_args(scale, zp, lambda codes: codes[1:])
        if args is None or x.__class__ is not np.ndarray or x.dtype != _F32:
            return super().compute(inputs)
        if not x.flags.c_contiguous:  # (a transposed view: a copy costs less than numpy's passes)
            x = np.ascontiguousarray(x)
        y = np.empty(x.shape, args[2])
        native.quantize_linear(x, y, *args[3])  # QUANTIZE_PATHS["native_quantize"]
        return [y]

    @staticmethod
    def _native_types(x: np.ndarray, zp: np.ndarray | None) -> bool:
        return x.dtype == np.float32 and (zp is None or zp.dtype in _CODES)

    @staticmethod
    def _apply(x: np.ndarray, scale: np.ndarray, zp: np.ndarray | None) -> np.ndarray:
        y = np.divide(x, scale)
        if type(y) is not np.ndarray:  # 0-d operands give a numpy scalar
            y = np.asarray(y)
        np.rint(y, out=y)  # round(x / scale) + zp: the zero point is added after rounding
        if zp is None:
            return saturate_codes(y, np.uint8)
        y += zp.astype(np.float32)
        return saturate_codes(y, zp.dtype)


_FUSED_DOMAIN = "com.onnxhal"
_POS_ZERO = np.array(0.0, _F32)
_CODE_RANGE = {np.dtype(t): (np.iinfo(t).min, np.iinfo(t).max) for t in _CODES}


@register("QuantizeDequantize", since=1, domain=_FUSED_DOMAIN)
class QuantizeDequantize(_LinearQuant):
    """``com.onnxhal`` QuantizeDequantize(x, scale, zero_point; axis): DequantizeLinear of
    QuantizeLinear on the same scale and zero point (``optimizer/qdq_pairs.py``), the values the
    pair gives without its codes.

    Fast form (float32 x and scale, 8- or 16-bit zero point, per tensor or per axis):
    ``clamp(rint(x / scale), qmin - zp, qmax - zp) * scale`` with the lower bound taken by fmax (a
    NaN gives the type's minimum code, as ``saturate_codes``) and + 0.0 before the product (rint
    gives -0.0 where the pair's integer difference gives +0.0). Equal to the pair: the codes less
    their zero point are small integers in float32 either way, and both end in the same float32
    product. Six array passes where the pair makes two kernels and nine. Every other form runs the
    pair's own kernels (the canonical form). A C-contiguous x with a per-tensor scale takes
    ``QUANTIZE_PATHS["native_quantize_dequantize"]`` (the six passes in one) where it is on."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        super().__init__(node, ctx)
        from onnx import helper

        axis = [helper.make_attribute("axis", self.axis)]
        names = (["x", "scale", "zero_point"], ["y"])
        self._quantize = QuantizeLinear(Node("QuantizeLinear", *names, attribute_protos=axis), ctx)
        self._dequantize = DequantizeLinear(Node("DequantizeLinear", *names, attribute_protos=axis), ctx)
        self._bounds: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self._kept: tuple | None = None

    def pair(self, inputs: list) -> list:
        """The canonical form: QuantizeLinear's kernel, then DequantizeLinear's on its codes."""
        codes = self._quantize.compute(inputs)[0]
        return self._dequantize.compute([codes, *inputs[1:]])

    def compute(self, inputs: list) -> list:
        x, scale = inputs[0], inputs[1]
        zp = inputs[2] if len(inputs) > 2 else None
        kept = self._kept  # the operands of the last per-tensor run, while its scale and zero point are the same arrays
        if kept is None or kept[0] is not scale or kept[1] is not zp or x.dtype != _F32 or x.ndim == 0:
            shape = self._scale_shape(x, scale) if (
                self.plain and x.dtype == _F32 and scale.dtype == _F32 and x.ndim > 0
                and (zp is None or (zp.dtype in _CODE_RANGE and zp.size == scale.size))) else None
            if shape is None:
                return self.pair(inputs)
            s = scale.reshape(shape)
            lo, hi = self._code_bounds(zp, shape)
            if shape != ():
                return [self._fast_form(x, s, lo, hi)]
            # one swap: a concurrent run sees either entry
            kept = self._kept = (scale, zp, (s, lo, hi), (float(s), float(lo), float(hi)))
        if self._native is not None and x.__class__ is np.ndarray:
            if not x.flags.c_contiguous:  # (a transposed view: a copy costs less than numpy's passes)
                x = np.ascontiguousarray(x)
            y = np.empty(x.shape, _F32)
            self._native.quantize_dequantize(x, y, *kept[3])  # QUANTIZE_PATHS["native_quantize_dequantize"]
            return [y]
        return [self._fast_form(x, *kept[2])]

    @staticmethod
    def _fast_form(x: np.ndarray, s: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        y = _divide(x, s)
        _rint(y, y)
        np.fmax(y, lo, out=y)
        np.minimum(y, hi, out=y)
        _add(y, _POS_ZERO, y)
        np.multiply(y, s, out=y)
        return y

    def _code_bounds(self, zp: np.ndarray | None, shape: tuple) -> tuple[np.ndarray, np.ndarray]:
        """qmin - zp and qmax - zp as float32 operands shaped as the scale (kept per zero point)."""
        dtype = np.dtype(np.uint8) if zp is None else zp.dtype
        key = (dtype.char, shape, b"" if zp is None else zp.tobytes())
        bounds = self._bounds.get(key)
        if bounds is None:
            qmin, qmax = _CODE_RANGE[dtype]
            z = np.zeros(shape, np.int32) if zp is None else zp.astype(np.int32).reshape(shape)
            bounds = (np.subtract(qmin, z, dtype=_F32), np.subtract(qmax, z, dtype=_F32))
            if len(self._bounds) < 8:  # constant zero points in practice: a few keys at most
                self._bounds[key] = bounds
        return bounds


@register("GridTable", since=1, domain=_FUSED_DOMAIN)
class GridTable(Kernel):
    """``com.onnxhal`` GridTable(x, scale, zero_point, table): ``table[code(x) - qmin]``, x's
    values on the 8-bit grid of scale and zero point (``optimizer/qdq_tables.py``: the 256 results
    of an element-wise chain). x / scale is within a few ulps of the integer code less the zero
    point, so + (zero point - qmin + 0.5) truncated is its index; ``clip`` keeps the index in the
    table whatever x holds."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self._offsets: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}

    def compute(self, inputs: list) -> list:
        x, scale, zp, table = inputs[:4]
        key = (zp.dtype.char, zp.tobytes(), scale.tobytes())
        operands = self._offsets.get(key)
        if operands is None:  # (one-element scale and zero point, of any rank, as 0-d operands)
            offset = int(zp.reshape(-1)[0]) - _CODE_RANGE[zp.dtype][0] + 0.5
            operands = self._offsets.setdefault(key, (scale.reshape(()), np.array(offset, _F32)))
        s, offset = operands
        f = _divide(x, s, dtype=_F32)
        if type(f) is not np.ndarray:  # 0-d operands give a numpy scalar
            f = np.asarray(f)
        _add(f, offset, f)
        return [table.take(f.astype(np.intp), mode="clip")]
