"""Which quantization nodes the OpenCL EP can run (QuantizeLinear, DequantizeLinear,
DynamicQuantizeLinear), and their parameters as the lowering reads them.

Taken: int8 and uint8 codes (int32 too for DequantizeLinear: QDQ biases), a float32 scale and an
optional zero point that are constant initializers, per tensor (one element) or per axis (1-D along
``axis``), opset 10 to 21 semantics (rounding half to even, saturation to the codes' range).
Declined, each with its reason (the CPU EP runs them): 16-bit, 4-bit and float8 codes, blocked
quantization (``block_size``), ``output_dtype``, float16 scales, scales or zero points computed at
run time (a plan bakes them into its kernels).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from onnxhal.runtime.providers.opencl.quant_codegen import CODE_C_TYPES, CODE_RANGE

if TYPE_CHECKING:
    from onnxhal.hal.graph import Node
    from onnxhal.runtime.providers.opencl.op_support import GraphLookup

F32 = np.dtype(np.float32)
U8 = np.dtype(np.uint8)
I32 = np.dtype(np.int32)
_MAX_RANK = 6
_MAX_ELEMENTS = 2**31 - 1
#: The ops this module claims (op_support registers them).
QUANT_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})


@dataclass(frozen=True)
class QuantParams:
    """A QuantizeLinear's or DequantizeLinear's constant parameters: the codes' type, the scale
    (float32) and zero point (the codes' type; 0 where absent; None: read at run time), both of one
    element (``axis`` None) or 1-D along ``axis`` of x."""

    codes: np.dtype
    scale: np.ndarray | None
    zero_point: np.ndarray | None
    axis: int | None


def quant_params(node: Node, lookup: GraphLookup, runtime_zero_point: bool = False) -> QuantParams | str:
    """``node``'s parameters, or why the OpenCL EP does not compute it. ``runtime_zero_point``: the
    zero point (a DequantizeLinear's; a QuantizeLinear's with its scale, both uint8/float32 of one
    value) may be computed at run time (``zero_point``, ``scale`` None: ``quant_decompose``'s
    MatMulIntegerToFloat and ConvInteger read DynamicQuantizeLinear's)."""
    op = node.op_type
    if node.attr("block_size", 0):
        return f"{op} with block_size {node.attr('block_size')} (blocked quantization) has no OpenCL kernel"
    if node.attr("output_dtype", 0):
        return f"{op} with output_dtype {node.attr('output_dtype')} has no OpenCL kernel"
    x = node.inputs[0]
    x_type, x_dims = lookup.dtype(x), lookup.dims(x)
    if x_dims is None:
        return f"{x!r} has no known rank"
    if op == "QuantizeLinear" and x_type != F32:
        return f"QuantizeLinear of {x_type} (the OpenCL EP quantizes float32)"
    scale_name = node.inputs[1]
    scale = lookup.const(scale_name)
    zp_name = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else ""
    if (scale is None and runtime_zero_point and op == "QuantizeLinear" and zp_name and lookup.const(zp_name) is None
            and lookup.dtype(scale_name) == F32 and lookup.dtype(zp_name) == U8
            and lookup.dims(scale_name) in ((), (1,)) and lookup.dims(zp_name) in ((), (1,))):
        return QuantParams(U8, None, None, None)
    if scale is None:
        return (f"{op} scale {scale_name!r} is not a constant initializer (the OpenCL EP bakes it into "
                f"its kernel)")
    if scale.dtype != F32:
        return f"{op} scale {scale_name!r} is {scale.dtype}, not float32"
    zp = lookup.const(zp_name) if zp_name else None
    if zp_name and zp is None:
        if runtime_zero_point and op == "DequantizeLinear" and lookup.dtype(zp_name) == x_type \
                and lookup.dims(zp_name) in ((), (1,)) and scale.size == 1:
            return QuantParams(np.dtype(x_type), scale.reshape(1), None, None)
        return f"{op} zero point {zp_name!r} is not a constant initializer"
    codes = (zp.dtype if zp is not None else U8) if op == "QuantizeLinear" else x_type
    allowed = CODE_RANGE if op == "QuantizeLinear" else CODE_C_TYPES
    if codes not in allowed:
        kinds = "int8/uint8" if op == "QuantizeLinear" else "int8/uint8/int32"
        return f"{op} to or from {codes} codes has no OpenCL kernel (only {kinds})"
    if zp is not None and zp.dtype != codes:
        return f"{op} zero point {zp_name!r} is {zp.dtype}, codes are {codes}"
    if zp is None:
        zp = np.zeros(scale.shape, codes)
    if scale.size == 1 and scale.ndim <= 1:
        if zp.size != 1:
            return f"{op} zero point of {zp.size} elements for a per-tensor scale"
        return QuantParams(np.dtype(codes), scale.reshape(1), zp.reshape(1), None)
    axis = int(node.attr("axis", 1))
    rank = len(x_dims)
    if scale.ndim != 1 or not -rank <= axis < rank:
        return f"{op} scale of shape {list(scale.shape)} along axis {axis} of a rank-{rank} input"
    axis %= rank
    if x_dims[axis] != scale.shape[0] or zp.shape != scale.shape:
        return (f"{op} scale of {scale.shape[0]} elements and zero point of shape {list(zp.shape)} along axis "
                f"{axis} of {list(x_dims)}")
    return QuantParams(np.dtype(codes), scale, zp, axis)


def quant_reason(node: Node, lookup: GraphLookup) -> str | None:
    """None when the OpenCL EP computes ``node`` (one of ``QUANT_OPS``), else why not."""
    for name in (node.inputs[0], *(o for o in node.outputs if o)):
        dims = lookup.dims(name)
        if dims is None:
            return f"{name!r} has no known rank" if lookup.allow_dynamic else f"{name!r} has no static shape"
        if len(dims) > _MAX_RANK:
            return f"{name!r} has rank {len(dims)} > {_MAX_RANK}"
        if all(isinstance(d, int) for d in dims) and math.prod(dims) >= _MAX_ELEMENTS:
            return f"{name!r} has {math.prod(dims)} elements; kernels index with 32-bit ints"
    if node.op_type == "DynamicQuantizeLinear":
        types = [lookup.dtype(node.inputs[0]), *(lookup.dtype(o) for o in node.outputs if o)]
        if types[0] != F32:
            return f"DynamicQuantizeLinear of {types[0]} (the OpenCL EP quantizes float32)"
        return None
    params = quant_params(node, lookup)
    if isinstance(params, str):
        return params
    out = lookup.dtype(node.outputs[0])
    want = params.codes if node.op_type == "QuantizeLinear" else F32
    if out is not None and out != want:
        return f"{node.op_type} output {node.outputs[0]!r} is {out}, not {want}"
    return None
