"""Quantized models on an fp16 device: what it computes in int8, and what it declines.

The OpenCL EP computes QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, QLinearMatMul,
ConvInteger and MatMulIntegerToFloat in float32 (exact integer sums, float32 scales and dequantized
weights); an fp16 device would store those scales and weights in fp16, so it declines them, and they
stay on the CPU EP with the other integer operators (MatMulInteger, QLinear*). What a simulated fp16
device gets of a quantized model is the float nodes between them:

- **Static QDQ.** A partition whose every float input is a DequantizeLinear output and whose every
  float output is read by QuantizeLinear nodes only is an int8 QDQ group: a device with int8
  compute runs it as an integer kernel (int8 operands, int32 accumulators, one requantization), not
  in fp16. The simulator computes it on the dequantized values in float32 (the kernels' precision),
  which is that integer arithmetic up to float32 rounding of the scaled values, and rounds neither
  its inputs, its outputs nor its weights (dequantized constants the optimizer folded) to fp16.
  Rounded through fp16, a QDQ ResNet's requantized activations moved by one step here and there and
  its logits ended 2-5% off. On an fp16 device without int8 such nodes are declined.
- **Dynamic quantization.** ConvInteger and MatMulInteger give int32 accumulators, which the model
  casts to float and scales. fp16 holds integers exactly only up to 2048 and overflows at 65504, so
  an fp16 device cannot compute on such a value in its precision: the node reading it is declined
  with that reason (stored in fp16 it became inf, and the outputs were 60-150% off).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from onnx import TensorProto

from onnxhal.hal.graph import Graph, Node
from onnxhal.simulators.profiles import Profile

#: Ops the OpenCL EP's quantization kernels compute in float32 (runtime/providers/opencl/quant_*.py):
#: an fp16 device leaves them to the CPU EP, as before those kernels.
QUANTIZATION_KERNEL_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearMatMul",
                                     "MatMulIntegerToFloat", "ConvInteger"})
#: Integer kernels whose int32 outputs are accumulators (sums of products of 8-bit values).
ACCUMULATING_OPS = frozenset({"ConvInteger", "MatMulInteger"})
_FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE})
_F32 = np.dtype(np.float32)


@dataclass
class QuantizedValues:
    """Values of a model's graphs that carry quantized data, by name."""

    #: DequantizeLinear outputs: int8/uint8 data (or int32 biases) times a scale.
    dequantized: set[str] = field(default_factory=set)
    #: Float values read by QuantizeLinear nodes only: what an integer kernel requantizes.
    requantized: set[str] = field(default_factory=set)
    #: Float casts of ConvInteger/MatMulInteger outputs: value -> the integer node that made it.
    accumulators: dict[str, Node] = field(default_factory=dict)

    def add_graph(self, graph: Graph) -> None:
        """Record the quantized values of ``graph`` (each graph the EP is shown)."""
        for n in graph.nodes:
            if n.op_type == "DequantizeLinear":
                self.dequantized.update(o for o in n.outputs[:1] if o)
            elif n.op_type == "QuantizeLinear" and n.inputs and n.inputs[0]:
                x = n.inputs[0]
                if all(c.op_type == "QuantizeLinear" for c in graph.consumers(x)) and x not in graph.output_names:
                    self.requantized.add(x)
            elif n.op_type == "Cast" and n.inputs and n.outputs and n.attr("to", 0) in _FLOAT_TYPES:
                src = graph.producer(n.inputs[0])
                if src is not None and src.op_type in ACCUMULATING_OPS:
                    self.accumulators[n.outputs[0]] = src

    def in_qdq_group(self, node: Node, graph: Graph) -> bool:
        """Whether ``node`` computes an int8 QDQ group on its own: its float inputs are dequantized
        values or constants (weights whose DequantizeLinear the optimizer folded), at least one
        dequantized, and its float outputs are all requantized."""
        ins = [n for n in node.inputs if n and _is_float(graph, n)]
        outs = [n for n in node.outputs if n and _is_float(graph, n)]
        return (any(n in self.dequantized for n in ins) and bool(outs)
                and all(n in self.dequantized or graph.is_constant_initializer(n) for n in ins)
                and all(n in self.requantized for n in outs))

    def int8_partition(self, graph: Graph) -> bool:
        """Whether the partition ``graph`` is an int8 QDQ group: float inputs all dequantized, float
        outputs all requantized, at least one of each."""
        ins = [n for n in graph.input_names if _is_float(graph, n)]
        outs = [n for n in graph.output_names if _is_float(graph, n)]
        return (bool(ins) and bool(outs) and all(n in self.dequantized for n in ins)
                and all(n in self.requantized for n in outs))


def _is_float(graph: Graph, name: str) -> bool:
    if graph.is_constant_initializer(name):
        return np.asarray(graph.initializer(name)).dtype == _F32
    vi = graph.value_info(name)
    return vi.dtype is not None and np.dtype(vi.dtype) == _F32


def has_int8(profile: Profile) -> bool:
    return "int8" in profile.dtypes or "uint8" in profile.dtypes


#: Largest integer each float storage format holds exactly (2^(significand bits)), and its range.
_EXACT = {"float16": ("fp16", 2048, "65504"), "bfloat16": ("bf16", 256, "about 3.4e38")}


def integer_reason(profile: Profile, node: Node, values: QuantizedValues) -> str | None:
    """Why an fp16 (or bf16) device declines ``node`` for the quantized data it reads or writes,
    else None."""
    if profile.compute_dtype not in _EXACT:
        return None
    short, exact, top = _EXACT[profile.compute_dtype]
    if node.op_type in QUANTIZATION_KERNEL_OPS:
        return (f"quantization op on {_a(short)} device: the OpenCL EP computes {node.op_type} with float32 "
                f"scales and dequantized weights, which {profile.name} would store in {short}; it runs int8 QDQ "
                f"groups as integer kernels between such nodes instead")
    # the Cast that makes the float accumulator too: a device that takes int32 Casts would store
    # its output in the device's precision
    for name, verb in [(n, "reads") for n in node.inputs] + [(n, "writes") for n in node.outputs]:
        src = values.accumulators.get(name) if name else None
        if src is not None:
            return (f"integer op on {_a(short)} device: {node.op_type} {verb} {name!r}, the int32 accumulator of "
                    f"{src.op_type} {src.name!r} cast to float; {short} holds integers exactly only up to {exact}"
                    + (f" and overflows at {top}" if profile.compute_dtype == "float16" else "")
                    + f", so {profile.name} cannot compute it in its precision")
    if not has_int8(profile):
        quantized = [n for n in node.inputs if n in values.dequantized] + [
            n for n in node.outputs if n in values.requantized]
        if quantized:
            return (f"int8 QDQ group on {_a(short)} device without int8: {node.op_type} computes on {quantized[0]!r}, "
                    f"which the model quantizes to 8 bits; {profile.name} would compute it in {short}")
    return None


def _a(short: str) -> str:
    return ("an " if short.startswith("f") else "a ") + short
