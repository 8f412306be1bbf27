"""Elementwise kernels: unary math, binary arithmetic with broadcasting, comparisons, logic.

The hot path is one numpy call per node. ufuncs return a numpy scalar for 0-d inputs, so results
go through ``_arr`` only where that can happen cheaply (one type check).
"""

from __future__ import annotations

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels.clamp import clip
from onnxhal.runtime.providers.cpu.kernels.registry import register

_ndarray = np.ndarray
_asarray = np.asarray


def _arr(r):
    return r if type(r) is _ndarray else _asarray(r)


class UnaryUfunc(Kernel):
    """``y = f(x)`` for a numpy ufunc ``f`` set on the subclass (copied to the instance, whose
    attribute lookup is the cheaper one on the hot path)."""

    fn = None

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.fn = self.inline_fn = type(self).fn

    def compute(self, inputs: list) -> list:
        r = self.fn(inputs[0])
        return [r] if r.__class__ is _ndarray else [_asarray(r)]


class BinaryUfunc(Kernel):
    """``z = f(x, y)`` with numpy broadcasting (ONNX multidirectional broadcasting)."""

    fn = None

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.fn = self.inline_fn = type(self).fn

    def compute(self, inputs: list) -> list:
        r = self.fn(*inputs)
        return [r] if r.__class__ is _ndarray else [_asarray(r)]


def _unary(op: str, fn, *versions: int) -> None:
    cls = type(op, (UnaryUfunc,), {"fn": fn, "__doc__": f"ONNX {op}."})
    for v in versions or (1,):
        register(op, since=v)(cls)


for _op, _fn in {"Abs": np.abs, "Neg": np.negative, "Exp": np.exp, "Log": np.log, "Sqrt": np.sqrt,
                 "Floor": np.floor, "Ceil": np.ceil, "Reciprocal": np.reciprocal, "Sin": np.sin,
                 "Cos": np.cos, "Tan": np.tan, "Asin": np.arcsin, "Acos": np.arccos, "Atan": np.arctan,
                 "Sinh": np.sinh, "Cosh": np.cosh, "Asinh": np.arcsinh, "Acosh": np.arccosh,
                 "Atanh": np.arctanh, "Sign": np.sign, "IsNaN": np.isnan, "Round": np.rint,
                 "Not": np.logical_not, "BitwiseNot": np.invert, "Tanh": np.tanh}.items():
    _unary(_op, _fn)

def _binary(op: str, fn, since: int = 1) -> type[Kernel]:
    cls = type(op, (BinaryUfunc,), {"fn": fn, "__doc__": f"ONNX {op} (broadcasting)."})
    register(op, since=since)(cls)
    return cls


# Before opset 7 these took ``broadcast``/``axis`` attributes (LegacyBroadcast, at the end).
_LEGACY_BINARY = {op: _binary(op, fn, since=7) for op, fn in {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "And": np.logical_and, "Or": np.logical_or,
    "Xor": np.logical_xor, "Less": np.less, "Greater": np.greater}.items()}
for _op, _fn in {"BitwiseAnd": np.bitwise_and, "BitwiseOr": np.bitwise_or, "BitwiseXor": np.bitwise_xor,
                 "LessOrEqual": np.less_equal, "GreaterOrEqual": np.greater_equal}.items():
    _binary(_op, _fn)


@register("Equal", since=7)
class Equal(Kernel):
    """Equal; string tensors compare element-wise as Python objects."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        pass

    def compute(self, inputs: list) -> list:
        r = np.equal(inputs[0], inputs[1])
        if type(r) is not _ndarray:
            r = _asarray(r)
        if r.dtype != np.bool_:
            r = r.astype(np.bool_)
        return [r]


@register("Div", since=7)
class Div(Kernel):
    """Div; integer division truncates toward zero (C semantics, as ORT and onnx.reference)."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        pass

    def compute(self, inputs: list) -> list:
        a, b = inputs
        if a.dtype.kind in "iu":
            q = np.floor_divide(a, b)
            fix = (np.remainder(a, b) != 0) & ((a < 0) != (b < 0))
            return [_arr(np.where(fix, q + 1, q).astype(a.dtype, copy=False))]
        r = np.divide(a, b)
        return [r if type(r) is _ndarray else _asarray(r)]


@register("Pow", since=7)
class Pow(Kernel):
    """Pow; the result has the base's type even when the exponent's type differs."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        pass

    def compute(self, inputs: list) -> list:
        a, b = inputs
        if b.size == 1 and a.dtype.kind == "f" and b.dtype.kind in "fiu" and b.ndim <= a.ndim:
            # x ** 2 and x ** 3 (GPT-2's gelu) as products, as onnxruntime's Pow does: numpy's power
            # with a float exponent calls C's pow per element, many times the cost of a multiply
            e = b.reshape(-1)[0]
            if e == 2:
                return [_arr(np.multiply(a, a))]
            if e == 3:
                sq = _arr(np.multiply(a, a))
                return [_arr(np.multiply(sq, a, out=sq) if sq.ndim else sq * a)]
        if a.dtype == b.dtype and a.dtype.kind == "f":
            r = _c_pow_of_neg_inf(a, b, np.power(a, b))
            return [r if type(r) is _ndarray else _asarray(r)]
        if a.dtype.kind in "iu" and b.dtype.kind in "iu":
            return [_arr(np.power(a.astype(np.int64), b.astype(np.int64)).astype(a.dtype))]
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        return [_arr(_c_pow_of_neg_inf(a64, b64, np.power(a64, b64)).astype(a.dtype))]


def _c_pow_of_neg_inf(a: np.ndarray, b: np.ndarray, r):
    """numpy's power gives NaN for -inf to a non-integer power, where C's pow (onnxruntime's, and
    IEEE 754's) gives +inf for a positive one and +0 for a negative one; and for an exponent of
    0.5 it takes the square root, which keeps -0 where pow gives +0. An integer scalar exponent
    (x ** 2) needs neither fix; otherwise only a result holding NaN is looked at again, and -0 + 0
    is +0 and changes nothing else."""
    if b.size == 1:
        e = b.reshape(-1)[0]
        if e == np.floor(e):
            return r
        if e == 0.5:
            r = np.add(r, 0.0, out=r) if type(r) is _ndarray else r + 0.0
    nan = np.isnan(r)
    if not nan.any():
        return r
    base, exp = np.broadcast_arrays(a, b)
    fix = nan & np.isneginf(base) & np.isfinite(exp) & (np.floor(exp) != exp)
    if fix.any():
        r = np.array(r, copy=True)
        r[fix] = np.where(exp[fix] > 0, np.inf, 0.0)
    return r


@register("Mod", since=10)
class Mod(Kernel):
    """Mod: ``fmod=1`` is C fmod (sign of the dividend), else Python mod (sign of the divisor)."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.fn = np.fmod if node.attr("fmod", 0) else np.mod

    def compute(self, inputs: list) -> list:
        return [_arr(self.fn(inputs[0], inputs[1]))]


@register("BitShift", since=11)
class BitShift(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.fn = np.left_shift if node.attr("direction", "LEFT") == "LEFT" else np.right_shift

    def compute(self, inputs: list) -> list:
        a, b = inputs
        return [_arr(self.fn(a, b.astype(a.dtype, copy=False)))]


class _Variadic(Kernel):
    fn = None

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        pass

    def compute(self, inputs: list) -> list:
        r = inputs[0]
        for x in inputs[1:]:
            r = self.fn(r, x)
        return [_arr(r) if len(inputs) > 1 else r.copy()]


for _op, _fn in {"Sum": np.add, "Max": np.maximum, "Min": np.minimum}.items():
    register(_op, since=1)(type(_op, (_Variadic,), {"fn": _fn, "__doc__": f"ONNX {_op} (variadic)."}))


@register("Mean", since=1)
class Mean(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        pass

    def compute(self, inputs: list) -> list:
        r = inputs[0]
        for x in inputs[1:]:
            r = r + x
        return [_arr((r / len(inputs)).astype(inputs[0].dtype, copy=False))]


@register("Where", since=9)
class Where(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        pass

    def compute(self, inputs: list) -> list:
        return [_arr(np.where(inputs[0], inputs[1], inputs[2]))]


@register("Clip", since=1)
@register("Clip", since=6)
class ClipAttr(Kernel):
    """Clip with ``min``/``max`` attributes (opset < 11)."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.lo = node.attr("min", -3.4028234663852886e38)
        self.hi = node.attr("max", 3.4028234663852886e38)

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        return [clip(x, self.lo, self.hi)]


@register("Clip", since=11)
class Clip(Kernel):
    """Clip with optional ``min``/``max`` inputs (opset >= 11)."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        pass

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        lo = inputs[1] if len(inputs) > 1 else None
        hi = inputs[2] if len(inputs) > 2 else None
        for name, v in (("min", lo), ("max", hi)):
            if v is not None and np.size(v) != 1:  # as onnxruntime: not an elementwise bound
                raise InvalidArgument(f"Clip: {name} has shape {list(np.shape(v))}; it must be a scalar (one element).")
        lo, hi = None if lo is None else lo.reshape(())[()], None if hi is None else hi.reshape(())[()]
        if x.dtype.kind == "f" and (lo is None or hi is None):
            # An absent bound is numeric_limits<T>::lowest() / max() (the spec's words, and
            # onnxruntime's): an inf input comes out as the largest finite value.
            info = np.finfo(x.dtype)
            lo = info.min if lo is None else lo
            hi = info.max if hi is None else hi
        return [clip(x, lo, hi)]


@register("Identity", since=1)
class Identity(Kernel):
    """Identity: values are immutable once produced, so the input is returned as is."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        pass

    def compute(self, inputs: list) -> list:
        return [inputs[0]]


class LegacyBroadcast(Kernel):
    """Opset < 7 binary ops: with ``broadcast=1`` the second input is aligned at ``axis`` of the
    first (not at the trailing dimensions); the computation is the modern kernel's."""

    modern: type[Kernel] = Kernel

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.inner = self.modern(node, ctx)
        self.axis = node.attr("axis") if node.attr("broadcast", 0) else None

    def compute(self, inputs: list) -> list:
        a, b = inputs[0], inputs[1]
        if self.axis is not None and b.ndim < a.ndim:
            axis = self.axis + a.ndim if self.axis < 0 else self.axis
            b = b.reshape(b.shape + (1,) * (a.ndim - axis - b.ndim))
        return self.inner.compute([a, b])


def _with_legacy_broadcast(op: str, modern: type[Kernel]) -> None:
    register(op, since=1)(type(op, (LegacyBroadcast,), {"modern": modern, "__doc__": f"ONNX {op} (opset < 7)."}))


for _cls in (Equal, Div, Pow, *_LEGACY_BINARY.values()):
    _with_legacy_broadcast(_cls.__name__, _cls)
