"""Lowering of the quantization ops in an OpenCL partition (claim rules: ``quant_support``).

- QuantizeLinear and DequantizeLinear are expressions of the fused elementwise kernels
  (``quant_codegen``): a QDQ pair on an activation, with what computes it, is one launch. The scale
  and zero point are constants of the plan, one value (per tensor) or shaped to broadcast along the
  axis.
- A DequantizeLinear of constant codes (QDQ weights and biases) runs once, at planning, with the CPU
  EP's arithmetic: its value is a constant of the plan, so a MatMul or Conv reading it packs it once
  as any float32 weight (the GEMM needs no int8 path).
- DynamicQuantizeLinear is two launches: ``dynamic_quantize_range`` (one work-group) and
  ``dynamic_quantize_codes``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from onnxhal.hal.errors import NotImplemented as OrtNotImplemented
from onnxhal.runtime.providers.opencl.partition_plan import LOCAL_1D, Buf
from onnxhal.runtime.providers.opencl.quant_codegen import DYNAMIC_RANGE_SOURCE
from onnxhal.runtime.providers.opencl.quant_support import F32, I32, QuantParams, quant_params

if TYPE_CHECKING:
    from onnxhal.hal.graph import Node
    from onnxhal.runtime.providers.opencl.plan_builder import PartitionPlanBuilder


def _params(builder: PartitionPlanBuilder, n: Node) -> QuantParams:
    params = quant_params(n, builder.lookup, runtime_zero_point=True)
    if isinstance(params, str):  # claimed on other shapes (a specialisation): decline the partition
        raise OrtNotImplemented(params)
    return params


def dequantized(x: np.ndarray, params: QuantParams) -> np.ndarray:
    """DequantizeLinear of constant codes as the CPU EP computes it: the difference in int32, converted
    to float32 in the product by the scale."""
    shape = () if params.axis is None else tuple(-1 if i == params.axis else 1 for i in range(x.ndim))
    scale, zp = params.scale.reshape(shape), params.zero_point.reshape(shape)
    return np.asarray(np.multiply(np.subtract(x, zp, dtype=np.int32), scale, dtype=np.float32))


def fold_constant_dequantize(builder: PartitionPlanBuilder, nodes: list[Node], outputs: set[str], skip: set[int]) -> None:
    """A DequantizeLinear of constant codes whose value is not a partition output becomes a float32
    constant of the plan (``skip``: it gets no launch)."""
    for n in nodes:
        if n.op_type != "DequantizeLinear" or n.domain not in ("", "ai.onnx") or id(n) in skip:
            continue
        out = n.outputs[0]
        x = builder.lookup.const(n.inputs[0])
        if x is None or out in outputs:
            continue
        params = _params(builder, n)
        if params.zero_point is None:
            continue
        value = dequantized(x, params)
        builder.plan.constants[out] = np.ascontiguousarray(value)
        builder.plan.shapes[out] = tuple(value.shape)
        builder.plan.dtypes[out] = F32
        skip.add(id(n))


def quant_args(builder: PartitionPlanBuilder, n: Node) -> tuple[list[str], dict]:
    """The fused kernel's inputs and parameters of a QuantizeLinear or DequantizeLinear (as
    ``PartitionPlanBuilder._elementwise_args``)."""
    params = _params(builder, n)
    x = n.inputs[0]
    if params.zero_point is None:  # computed at run time (the scale too, where None): the kernel's inputs
        scale = n.inputs[1]
        if params.scale is not None:
            scale = builder.constant("q_scale", params.scale.reshape(()))
            builder.plan.shapes[scale], builder.plan.dtypes[scale] = (), F32
        return [x, scale, n.inputs[2]], {"codes": params.codes}
    # Scale and zero point are inputs (one value each per tensor, read as scalars), not literals: every
    # QDQ pair of a model then shares one program (bert_ts_qdq_pt has about 100 scales).
    rank = len(builder.shape(x))
    shape = () if params.axis is None else (-1,) + (1,) * (rank - params.axis - 1)
    zp_type = F32 if n.op_type == "QuantizeLinear" else I32  # (the float or int step it enters)
    names = []
    for stem, arr, dtype in (("q_scale", params.scale, F32), ("q_zero_point", params.zero_point, zp_type)):
        name = builder.constant(stem, arr.astype(dtype).reshape(shape))
        builder.plan.shapes[name] = builder.plan.constants[name].shape
        builder.plan.dtypes[name] = dtype
        names.append(name)
    return [x, *names], {"codes": params.codes}


def lower_dynamic_quantize(builder: PartitionPlanBuilder, n: Node) -> None:
    """DynamicQuantizeLinear(x) -> (y, y_scale, y_zero_point): the range and parameters in one
    work-group, then the codes."""
    x = builder.data(n.inputs[0])
    total = int(np.prod(builder.shape(x), dtype=np.int64))
    if total == 0:
        raise OrtNotImplemented("DynamicQuantizeLinear of an empty tensor (the CPU EP computes it)")
    y, scale, zp = (list(n.outputs) + ["", "", ""])[:3]
    scale = builder.output(scale) if scale else builder.temp("dq_scale", 4)
    zp = builder.output(zp) if zp else builder.temp("dq_zero_point", 1)
    params = builder.temp("dq_params", 16)
    builder.plan.add_launch_1d(DYNAMIC_RANGE_SOURCE, "dynamic_quantize_range", LOCAL_1D,
                               [Buf(x), np.int32(total), Buf(scale), Buf(zp), Buf(params)])
    # (no codes where only quant_decompose's products read them: they quantize x themselves)
    if y and (y in builder.plan.output_names or builder.graph.consumers(y)):
        builder.plan.add_launch_1d(DYNAMIC_RANGE_SOURCE, "dynamic_quantize_codes", total,
                                   [Buf(builder.output(y)), Buf(x), Buf(params)])
