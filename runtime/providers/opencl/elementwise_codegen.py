"""Elementwise ops of the OpenCL EP and the generator of fused elementwise kernels.

A chain (tree) of elementwise nodes becomes one kernel: every intermediate value is a C local, each
external input is read once per output element with its own broadcasting, and only the chain's
result is written. Attributes are baked into the source as literals; shapes travel in a small
constant buffer, so one program serves every shape with the same expression and broadcast pattern.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from onnxhal.hal.graph import Node
from onnxhal.runtime.providers.opencl.kernel_sources import ACTIVATION_HELPERS
from onnxhal.runtime.providers.opencl.quant_codegen import QUANT_ELEMENTWISE_OPS, QUANT_HELPERS, uses_quant_helpers

MAX_RANK = 6


def float_literal(x: float) -> str:
    """A float literal C accepts (inf and nan included)."""
    x = float(x)
    if np.isnan(x):
        return "NAN"
    if np.isinf(x):
        return "INFINITY" if x > 0 else "(-INFINITY)"
    return f"{x!r}f" if "e" in repr(x) or "." in repr(x) else f"{x!r}.0f"


def _erf(x: str) -> str:
    # Abramowitz & Stegun 7.1.26 (abs error < 1.5e-7), with native_exp: erf() is a slow call on PoCL.
    return f"onnxhal_erf({x})"


ERF_HELPER = ACTIVATION_HELPERS


def _gelu(n: Node, a: list[str], x: dict) -> str:
    if n.attr("approximate", "none") == "tanh":
        v = a[0]
        return f"(0.5f * {v} * (1.0f + onnxhal_tanh(0.7978845608f * ({v} + 0.044715f * {v} * {v} * {v}))))"
    return f"(0.5f * {a[0]} * (1.0f + onnxhal_erf({a[0]} * 0.70710678118f)))"


def _clip(n: Node, a: list[str], x: dict) -> str:
    lo, hi = x.get("min"), x.get("max")  # resolved from constant inputs or attributes in lowering
    expr = a[0]
    if lo is not None:
        expr = f"onnxhal_max({expr}, {float_literal(lo)})"
    if hi is not None:
        expr = f"onnxhal_min({expr}, {float_literal(hi)})"
    return expr


def _variadic(op: str) -> Callable[[Node, list[str], dict], str]:
    def build(n: Node, a: list[str], x: dict) -> str:
        expr = a[0]
        for v in a[1:]:
            expr = f"{op}({expr}, {v})" if op.startswith("onnxhal_") else f"({expr} {op} {v})"
        return f"({expr} / {float_literal(len(a))})" if n.op_type == "Mean" else expr
    return build


#: Constant exponents computed as products: pow() is a slow library call on PoCL (GPT-2's
#: tanh-Gelu cubes every activation: most of its kernels' time went there), and these are exact
#: for every input, NaN, inf and -0 included (pow(-0, 0.5) is +0 but sqrt(-0) is -0: not here).
POW_AS_PRODUCT = {1.0: "({a})", 2.0: "({a} * {a})", 3.0: "({a} * {a} * {a})", 4.0: "(({a} * {a}) * ({a} * {a}))",
                  -1.0: "(1.0f / {a})"}


def _pow(a: list[str], x: dict) -> str:
    if "exponent" in x:
        return POW_AS_PRODUCT[x["exponent"]].format(a=a[0])
    return f"pow({a[0]}, {a[1]})"


#: op type -> C expression builder ``(node, argument expressions, params from lowering)``.
ELEMENTWISE_OPS: dict[str, Callable[[Node, list[str], dict], str]] = {
    "Add": lambda n, a, x: f"({a[0]} + {a[1]})",
    "Sub": lambda n, a, x: f"({a[0]} - {a[1]})",
    "Mul": lambda n, a, x: f"({a[0]} * {a[1]})",
    "Div": lambda n, a, x: f"({a[0]} / {a[1]})",
    "Pow": lambda n, a, x: _pow(a, x),
    "Max": _variadic("onnxhal_max"),
    "Min": _variadic("onnxhal_min"),
    "Sum": _variadic("+"),
    "Mean": _variadic("+"),
    "Neg": lambda n, a, x: f"(-{a[0]})",
    "Abs": lambda n, a, x: f"fabs({a[0]})",
    "Sqrt": lambda n, a, x: f"sqrt({a[0]})",
    "Reciprocal": lambda n, a, x: f"(1.0f / {a[0]})",
    "Exp": lambda n, a, x: f"ONNXHAL_EXP({a[0]})",
    "Log": lambda n, a, x: f"log({a[0]})",
    "Sin": lambda n, a, x: f"sin({a[0]})",
    "Cos": lambda n, a, x: f"cos({a[0]})",
    "Floor": lambda n, a, x: f"floor({a[0]})",
    "Ceil": lambda n, a, x: f"ceil({a[0]})",
    "Relu": lambda n, a, x: f"({a[0]} < 0.0f ? 0.0f : {a[0]})",  # NaN stays NaN (fmax drops it)
    "LeakyRelu": lambda n, a, x: f"({a[0]} >= 0.0f ? {a[0]} : {float_literal(n.attr('alpha', 0.01))} * {a[0]})",
    "Elu": lambda n, a, x: f"({a[0]} >= 0.0f ? {a[0]} : {float_literal(n.attr('alpha', 1.0))} * (ONNXHAL_EXP({a[0]}) - 1.0f))",
    "Selu": lambda n, a, x: (f"({float_literal(n.attr('gamma', 1.05070102214813232421875))} * ({a[0]} > 0.0f ? {a[0]} : "
                          f"{float_literal(n.attr('alpha', 1.67326319217681884765625))} * (ONNXHAL_EXP({a[0]}) - 1.0f)))"),
    "Sigmoid": lambda n, a, x: f"(1.0f / (1.0f + ONNXHAL_EXP(-{a[0]})))",
    "HardSigmoid": lambda n, a, x: (f"onnxhal_clamp({float_literal(n.attr('alpha', 0.2))} * {a[0]} + "
                                 f"{float_literal(n.attr('beta', 0.5))}, 0.0f, 1.0f)"),
    "HardSwish": lambda n, a, x: f"({a[0]} * onnxhal_clamp({a[0]} / 6.0f + 0.5f, 0.0f, 1.0f))",
    # log1p: log(1 + e) rounds 1 + e to 1 for e below float32 epsilon and loses all precision.
    "Softplus": lambda n, a, x: f"({a[0]} > 20.0f ? {a[0]} : log1p(ONNXHAL_EXP({a[0]})))",
    "Softsign": lambda n, a, x: f"({a[0]} / (1.0f + fabs({a[0]})))",
    "Tanh": lambda n, a, x: f"onnxhal_tanh({a[0]})",
    "Erf": lambda n, a, x: _erf(a[0]),
    "Gelu": _gelu,
    # com.onnxhal ReplaceNaN: a NaN (v != v, kept by the build options) becomes the constant.
    "ReplaceNaN": lambda n, a, x: f"({a[0]} != {a[0]} ? {float_literal(n.attr('value', 0.0))} : {a[0]})",
    "Clip": _clip,
    "Identity": lambda n, a, x: a[0],
    # Inference BatchNormalization: inputs rewritten in lowering to (x, scale, shift).
    "BatchNormalization": lambda n, a, x: f"({a[0]} * {a[1]} + {a[2]})",
    # com.onnxhal FusedBatchNormalization(x, multiplier, shift) + activation (codes of apply_act).
    "FusedBatchNormalization": lambda n, a, x: (f"apply_act({a[0]} * {a[1]} + {a[2]}, {x['act'][0]}, "
                                                f"{float_literal(x['act'][1])}, {float_literal(x['act'][2])})"),
}

#: Rule ``typed_values``: C types of the element types the fused kernels compute besides float32.
#: bool is numpy's one byte (0 or 1); int64 needs the device's 64-bit integers (``long``: every
#: OpenCL full-profile device, ``cles_khr_int64`` on an embedded one).
C_TYPES: dict[np.dtype, str] = {np.dtype(np.float32): "float", np.dtype(np.int64): "long",
                                np.dtype(np.int32): "int", np.dtype(np.bool_): "uchar"}


def _cast(n: Node, a: list[str], x: dict) -> str:
    # C's conversions: to an integer truncates toward zero (numpy's and onnxruntime's static_cast);
    # to bool is "not zero", so NaN is true, as numpy's astype(bool).
    to = x["to"]
    return f"(uchar)({a[0]} != 0)" if to == "uchar" else f"(({to}){a[0]})"


#: Rule ``typed_values``: ops whose operands or results are not float32 (comparisons and logic give
#: bool, Where selects by a bool, Cast converts between C_TYPES); their C is that of numpy's
#: semantics for these types (a comparison with NaN is false, != is true).
TYPED_OPS: dict[str, Callable[[Node, list[str], dict], str]] = {
    "Cast": _cast,
    "Equal": lambda n, a, x: f"(uchar)({a[0]} == {a[1]})",
    "Less": lambda n, a, x: f"(uchar)({a[0]} < {a[1]})",
    "Greater": lambda n, a, x: f"(uchar)({a[0]} > {a[1]})",
    "LessOrEqual": lambda n, a, x: f"(uchar)({a[0]} <= {a[1]})",
    "GreaterOrEqual": lambda n, a, x: f"(uchar)({a[0]} >= {a[1]})",
    "And": lambda n, a, x: f"(uchar)({a[0]} && {a[1]})",
    "Or": lambda n, a, x: f"(uchar)({a[0]} || {a[1]})",
    "Xor": lambda n, a, x: f"(uchar)(({a[0]} != 0) != ({a[1]} != 0))",
    "Not": lambda n, a, x: f"(uchar)(!{a[0]})",
    "Where": lambda n, a, x: f"({a[0]} ? {a[1]} : {a[2]})",
}
ELEMENTWISE_OPS.update(TYPED_OPS)
ELEMENTWISE_OPS.update(QUANT_ELEMENTWISE_OPS)  # QuantizeLinear, DequantizeLinear (quant_codegen.py)


def _biased(a: list[str]) -> str:
    return f"({a[0]} + {a[1]})" if len(a) > 1 else a[0]


#: onnxruntime's com.microsoft GELU ops (docs/ContribOperators.md): BiasGelu is the erf form of
#: x + bias, FastGelu the tanh form of x (+ bias); the bias is added first, as onnxruntime and the CPU EP.
CONTRIB_ELEMENTWISE: dict[str, Callable[[Node, list[str], dict], str]] = {
    "BiasGelu": lambda n, a, x: f"(0.5f * {_biased(a)} * (1.0f + onnxhal_erf({_biased(a)} * 0.70710678118f)))",
    "FastGelu": lambda n, a, x: (f"(0.5f * {_biased(a)} * (1.0f + onnxhal_tanh(0.7978845608f * ({_biased(a)} + "
                                 f"0.044715f * {_biased(a)} * {_biased(a)} * {_biased(a)}))))"),
}
ELEMENTWISE_OPS.update(CONTRIB_ELEMENTWISE)
#: Ops of ELEMENTWISE_OPS whose C is the same for int32 and int64 operands as for float32 (wrapping
#: arithmetic, as numpy's and onnxruntime's integer kernels).
INTEGER_OPS = frozenset({"Add", "Sub", "Mul", "Neg", "Identity"})

#: Ops with exactly this many float data inputs (others: variadic or checked in lowering).
BINARY_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Pow"})
VARIADIC_OPS = frozenset({"Max", "Min", "Sum", "Mean"})


#: LayerNormalization whose input is a fused elementwise tree (``fused_at``): the tree's values are
#: written to Y, then normalised there, with the arithmetic of kernel_sources' ``layernorm_rows``;
#: where ``store_x`` (rule ``layernorm_prologue_stored``), also to X, for the tree's other readers.
LAYERNORM_PROLOGUE_SOURCE = """
__kernel void layernorm_prologue(__global float* Y PARAMS, __constant int* meta, __global const float* gamma,
                                 __global const float* beta, const int has_beta, const int R, const float eps,
                                 __global float* X, const int store_x, const int total) {
  const int row = get_global_id(0);
  if (row >= total) return;
  __global float* yp = Y + (size_t)row * R;
  __global float* xp = X + (size_t)row * R;
  float mean = 0.0f;
  for (int r = 0; r < R; ++r) {
    const float v = fused_at(row * R + r ARGS, meta);
    yp[r] = v;
    if (store_x) xp[r] = v;
    mean += v;
  }
  mean /= (float)R;
  float var = 0.0f;
  for (int r = 0; r < R; ++r) { const float d = yp[r] - mean; var += d * d; }
  const float inv = rsqrt(var / (float)R + eps);
  for (int r = 0; r < R; ++r) {
    const float v = (yp[r] - mean) * inv * gamma[r];
    yp[r] = has_beta ? v + beta[r] : v;
  }
}
"""


@dataclass(frozen=True)
class FusedInput:
    """How the fused kernel reads one external input: ``mode`` is "same" (index = gid), "scalar"
    (index 0) or "bcast" (strides into the output's coordinates, 0 on broadcast dimensions).
    ``table``: the input is a Gather's result read through its table of flat source indices (rule
    ``take_elementwise``): the kernel takes the table after the input's buffer and reads
    ``p[table[index]]``. ``rows``: the input is a Gather's result along axis 0 of ``p`` by indices
    read at run time (rule ``gather_elementwise``): (axis length, row length, the indices' C type);
    the kernel takes the indices after the buffer and reads row ``g[index / row length]`` (negative
    indices counting from the end, as Gather does; the host range-checks them before the run)."""

    mode: str
    strides: tuple[int, ...] = ()
    table: bool = False
    rows: tuple[int, int, str] | None = None


def broadcast_strides(in_shape: Sequence[int], out_shape: Sequence[int]) -> FusedInput:
    """How an input of ``in_shape`` is read when broadcast to ``out_shape`` (numpy rules)."""
    in_shape, out_shape = tuple(in_shape), tuple(out_shape)
    if in_shape == out_shape:
        return FusedInput("same")
    if int(np.prod(in_shape, dtype=np.int64)) == 1:
        return FusedInput("scalar")
    padded = (1,) * (len(out_shape) - len(in_shape)) + in_shape
    strides, acc = [], 1
    for d in reversed(padded):
        strides.append(0 if d == 1 else acc)
        acc *= d
    return FusedInput("bcast", tuple(reversed(strides)))


@dataclass
class FusedExpression:
    """A fused elementwise kernel: ``source`` (kernel ``fused_elementwise``), ``inputs`` (how each
    external input is read) and ``meta`` (int32 constant buffer: rank, out dims, bcast strides)."""

    source: str
    inputs: list[FusedInput]
    meta: np.ndarray


@dataclass(frozen=True)
class FusedTypes:
    """The C types of a fused kernel's values (rule ``typed_values``): of each external input, of
    each statement's local and of the result; a kernel of float32 values alone takes none."""

    inputs: tuple[str, ...]
    locals: tuple[str, ...]
    out: str


def generate_fused_kernel(statements: Sequence[tuple[str, str]], result: str, inputs: Sequence[FusedInput],
                          out_shape: Sequence[int], function: bool = False,
                          types: FusedTypes | None = None) -> FusedExpression:
    """Source for ``out[gid] = result`` after ``statements`` (``(local name, C expression)``), where
    expressions read external input ``k`` as ``in{k}``. ``function``: instead of that kernel, an
    inline ``fused_at(gid, p0, ..., meta)`` returning the value at flat index ``gid``, for another
    kernel to read the tree's result as its input (``LAYERNORM_PROLOGUE_SOURCE``, float32 only).
    ``types``: the C types where values are not all float32."""
    if types is None:
        types = FusedTypes(("float",) * len(inputs), ("float",) * len(statements), "float")
    elif function and {*types.inputs, *types.locals, types.out} != {"float"}:
        raise ValueError("a fused_at function computes float32 values only")
    rank = len(out_shape)
    bcast = [k for k, fi in enumerate(inputs) if fi.mode == "bcast"]
    params = ", ".join(f"__global const {types.inputs[k]}* restrict p{k}"
                       + (f", __global const int* restrict t{k}" if fi.table else "")
                       + (f", __global const {fi.rows[2]}* restrict g{k}" if fi.rows else "") for k, fi in enumerate(inputs))
    if function and any(fi.table for fi in inputs):
        raise ValueError("a fused_at function reads no input through a table")
    if function:
        lines = [ERF_HELPER, "inline float fused_at(const int gid" + (", " + params if params else "")
                 + ", __constant int* meta) {"]
    else:
        lines = [ERF_HELPER + (QUANT_HELPERS if uses_quant_helpers(e for _, e in statements) else ""),
                 f"__kernel void fused_elementwise(__global {types.out}* restrict out"
                 + (", " + params if params else "") + ", __constant int* meta, const int total) {",
                 "  const int gid = get_global_id(0);", "  if (gid >= total) return;"]
    if bcast:
        lines.append("  int rem = gid;")
        for k in bcast:
            lines.append(f"  int i{k} = 0;")
        for d in range(rank - 1, -1, -1):
            lines.append(f"  {{ const int c = rem % meta[{1 + d}]; rem /= meta[{1 + d}];")
            for j, k in enumerate(bcast):
                lines.append(f"    i{k} += c * meta[{1 + rank + j * rank + d}];")
            lines.append("  }")
    for k, fi in enumerate(inputs):
        index = "gid" if fi.mode == "same" else "0" if fi.mode == "scalar" else f"i{k}"
        if fi.table:
            index = f"t{k}[{index}]"
        if fi.rows:
            n, inner, _ = fi.rows
            lines.append(f"  const long r{k} = g{k}[({index}) / {inner}];")
            index = f"(size_t)(r{k} < 0 ? r{k} + {n} : r{k}) * {inner} + ({index}) % {inner}"
        lines.append(f"  const {types.inputs[k]} in{k} = p{k}[{index}];")
    for (name, expr), ctype in zip(statements, types.locals):
        lines.append(f"  const {ctype} {name} = {expr};")
    lines.append(f"  return {result};" if function else f"  out[gid] = {result};")
    lines.append("}")
    if function:
        args = "".join(f", p{k}" + (f", g{k}" if fi.rows else "") for k, fi in enumerate(inputs))
        fparams = "".join(f", __global const float* restrict p{k}"
                          + (f", __global const {fi.rows[2]}* restrict g{k}" if fi.rows else "")
                          for k, fi in enumerate(inputs))
        lines.append(LAYERNORM_PROLOGUE_SOURCE.replace("PARAMS", fparams).replace("ARGS", args))
    meta = [rank, *out_shape]
    for k in bcast:
        meta.extend(inputs[k].strides)
    return FusedExpression("\n".join(lines), list(inputs), np.array(meta or [0], dtype=np.int32))
