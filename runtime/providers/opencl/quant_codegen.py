"""OpenCL C of the OpenCL EP's quantization ops: QuantizeLinear and DequantizeLinear as expressions of
the fused elementwise kernels (``elementwise_codegen``), and DynamicQuantizeLinear's range kernel.

Each computes the float32 steps of the CPU EP's kernels (``cpu/kernels/quantize.py`` and their C
paths in ``_native.c``) in the same order: codes ``clamp(rint(x / scale) + zero_point, lo, hi)``
(rint: half to even; a NaN gives ``lo``), values ``(float)(code - zero_point) * scale``.

Programs build with ``-cl-unsafe-math-optimizations``, under which clang turns ``x / s`` into
``x * (1 / s)`` (even for a run-time ``s``): on PoCL 3.1 that moved 7 to 670K of 8M codes near a
tie by one quantum. The helpers here switch clang's fast-math flags off in their bodies
(``#pragma float_control(precise, on)``), so the division is IEEE's and the product is not
contracted into a following add: the CPU EP's bits. A driver whose compiler is not clang ignores the
pragma (``-cl-fp32-correctly-rounded-divide-sqrt`` still applies where offered); there a code may
differ by one quantum where x / scale lies within an ulp of a tie.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from onnxhal.hal.graph import Node

#: C types of the codes the quantization ops read and write (beside ``elementwise_codegen.C_TYPES``,
#: which the other ops' rule ``typed_values`` takes; these only the quantization ops compute).
CODE_C_TYPES: dict[np.dtype, str] = {np.dtype(np.int8): "char", np.dtype(np.uint8): "uchar",
                                     np.dtype(np.int32): "int"}
#: Saturation bounds of the codes QuantizeLinear writes.
CODE_RANGE: dict[np.dtype, tuple[int, int]] = {np.dtype(np.int8): (-128, 127), np.dtype(np.uint8): (0, 255)}

_PRECISE = "#ifdef __clang__\n#pragma float_control(precise, on)\n#endif\n"

#: Helpers the quantization expressions call, prepended to a fused kernel that uses them.
QUANT_HELPERS = f"""
inline float onnxhal_quantize(const float x, const float s, const float zp, const float lo, const float hi) {{
{_PRECISE}  float v = rint(x / s) + zp;
  v = v > lo ? v : lo;
  return v < hi ? v : hi;
}}
inline float onnxhal_dequantize(const float d, const float s) {{
{_PRECISE}  return d * s;
}}
"""


def _quantize(n: Node, a: list[str], x: dict) -> str:
    """QuantizeLinear: the scale and zero point are inputs 1 and 2 (float32), ``x["codes"]`` the
    codes' type."""
    lo, hi = (float(b) for b in CODE_RANGE[x["codes"]])
    ctype = CODE_C_TYPES[x["codes"]]
    return f"({ctype})onnxhal_quantize({a[0]}, {a[1]}, {a[2]}, {lo!r}f, {hi!r}f)"


def _dequantize(n: Node, a: list[str], x: dict) -> str:
    """DequantizeLinear: the difference in int (exact for 8-bit codes, wrapping for int32 as numpy's),
    converted to float, times the scale (input 1; the zero point is input 2)."""
    return f"onnxhal_dequantize((float)((int){a[0]} - (int){a[2]}), {a[1]})"


#: op type -> C expression builder, as ``elementwise_codegen.ELEMENTWISE_OPS``.
QUANT_ELEMENTWISE_OPS: dict[str, Callable[[Node, list[str], dict], str]] = {
    "QuantizeLinear": _quantize,
    "DequantizeLinear": _dequantize,
}


def uses_quant_helpers(expressions) -> bool:
    """Whether any of the C expressions calls ``QUANT_HELPERS``."""
    return any("onnxhal_quantize(" in e or "onnxhal_dequantize(" in e for e in expressions)


#: DynamicQuantizeLinear's parameters (onnxruntime's GetQuantizationParameter, as the CPU EP's
#: ``dynamic_quantize_centered``): one work-group of ``LOCAL`` items finds min(0, x) and max(0, x)
#: without NaNs (a NaN compares false), item 0 computes the scale (hi - lo) / 255 (1 for a zero range)
#: and the zero point round_half_even(min(-lo / scale, 255)) (0 below 0 or NaN... then 255 for NaN, as
#: std::min), and writes them to the op's outputs and to ``params`` for the codes' launch
#: (scale, -zp, 255 - zp, zp as floats).
DYNAMIC_RANGE_SOURCE = f"""
#define LOCAL 64
__kernel __attribute__((reqd_work_group_size(LOCAL, 1, 1)))
void dynamic_quantize_range(__global const float* x, const int n, __global float* scale_out,
                            __global uchar* zp_out, __global float* params, const int total) {{
{_PRECISE}  __local float los[LOCAL], his[LOCAL];
  const int t = get_local_id(0);
  float lo = 0.0f, hi = 0.0f;
  for (int i = t; i < n; i += LOCAL) {{
    const float v = x[i];
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
  }}
  los[t] = lo;
  his[t] = hi;
  barrier(CLK_LOCAL_MEM_FENCE);
  if (t != 0) return;
  for (int k = 1; k < LOCAL; ++k) {{
    lo = los[k] < lo ? los[k] : lo;
    hi = his[k] > hi ? his[k] : hi;
  }}
  const float s = hi == lo ? 1.0f : (hi - lo) / 255.0f;
  float v = -lo / s;
  v = v < 255.0f ? v : 255.0f;
  const float zp = v > 0.0f ? rint(v) : 0.0f;
  scale_out[0] = s;
  zp_out[0] = (uchar)zp;
  params[0] = s;
  params[1] = -zp;
  params[2] = 255.0f - zp;
  params[3] = zp;
}}

__kernel void dynamic_quantize_codes(__global uchar* y, __global const float* x, __global const float* params,
                                     const int total) {{
{_PRECISE}  const int i = get_global_id(0);
  if (i >= total) return;
  float v = x[i] / params[0];
  v = v > params[1] ? v : params[1];
  v = v < params[2] ? v : params[2];
  y[i] = (uchar)(rint(v) + params[3]);
}}
"""
