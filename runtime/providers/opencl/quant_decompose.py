"""QLinearMatMul, ConvInteger and com.microsoft MatMulIntegerToFloat as ops the OpenCL EP already
lowers, with the CPU EP's bits (``cpu/kernels/ms_quantized.py``), before a partition is planned.

The CPU EP sums (A - a_zero_point) @ (B - b_zero_point) exactly in float32 (``exact_float_dtype``:
while K * 255^2 < 2^24) and then takes float32 steps. So does this form:

- QLinearMatMul: ``DequantizeLinear(A, 1, a_zp) @ DequantizeLinear(B, 1, b_zp)`` (exact integers in
  float32: any summation order gives the same sums), ``Mul`` by the constant
  ``float32(a_scale * b_scale / y_scale)`` computed as the CPU EP computes it, then
  ``QuantizeLinear(., 1, y_zp)`` (x / 1 is x: rint, zero point, saturation).
- ConvInteger: ``Conv`` of the centered codes (zero padding: the padding of x's zero point less
  it), ``Cast`` to int32.
- MatMulIntegerToFloat: the same exact product, ``Mul`` by ``a_scale * b_scale`` (a ``Mul`` node of
  a_scale, expanded to the result's shape, by b_scale: a_scale may come from DynamicQuantizeLinear
  at run time), ``Add`` of the bias.
- Codes a DynamicQuantizeLinear of the partition makes are made again from its float input in the
  centering kernel (``_Rewrite.centered``).

The existing GEMM then runs the product (a constant B folds once into a float32 weight), and the
other steps join the fused elementwise kernels. One difference is possible: the fused kernels may
contract MatMulIntegerToFloat's ``* scale + bias`` into one fma (one rounding where the CPU EP
rounds twice, 1 ulp of the float result); QLinearMatMul's codes are the CPU EP's.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
from onnx import TensorProto, helper

from onnxhal.hal.graph import Graph, Node, ValueInfo

if TYPE_CHECKING:
    from onnxhal.runtime.providers.opencl.op_support import GraphLookup

F32 = np.dtype(np.float32)
_CODES = (np.dtype(np.int8), np.dtype(np.uint8))
MS_DOMAIN = "com.microsoft"
#: (op type, domain) of the ops this module rewrites.
DECOMPOSED_OPS = {("QLinearMatMul", ""), ("MatMulIntegerToFloat", MS_DOMAIN), ("ConvInteger", "")}


def exact_in_float32(k: int) -> bool:
    """Whether sums of k products of 8-bit codes less their zero points stay exact in float32 (the CPU
    EP's ``exact_float_dtype``; beyond it sums in float64)."""
    return 65025 * k < (1 << 24)


def _inputs(node: Node) -> list[str]:
    return [*node.inputs, *[""] * 8][:8]


def integer_product_reason(node: Node, lookup: GraphLookup) -> str | None:
    """Why the OpenCL EP does not compute a QLinearMatMul, MatMulIntegerToFloat or ConvInteger
    ``node``, or None."""
    op = node.op_type
    names = _inputs(node)
    if op == "ConvInteger":
        return _conv_integer_reason(node, lookup)
    if op == "QLinearMatMul":
        a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp = names
        consts, scales = (a_s, a_zp, b_s, b_zp, y_s, y_zp), (a_s, b_s, y_s)
    else:
        a, b, a_s, b_s, a_zp, b_zp, bias = names[:7]
        consts, scales = (b_s, b_zp, bias), (b_s,)  # (a_scale, a_zero_point: DynamicQuantizeLinear's)
        if lookup.dtype(a_s) != F32 or lookup.dims(a_s) not in ((), (1,)):
            return f"MatMulIntegerToFloat a_scale {a_s!r} is not one float32 value"
    for c in consts:
        if c and lookup.const(c) is None:
            return f"{op} parameter {c!r} is not a constant initializer"
    for s in scales:
        if lookup.const(s).dtype != F32:
            return f"{op} scale {s!r} is {lookup.const(s).dtype}, not float32"
    for x in (a, b):
        if lookup.dtype(x) not in _CODES:
            return f"{op} of {lookup.dtype(x)} codes (the OpenCL EP computes int8/uint8)"
    da, db = lookup.dims(a), lookup.dims(b)
    if da is None or db is None or len(da) < 2 or len(db) < 2 or len(da) > 6 or len(db) > 6:
        return f"{op} operands of ranks {da and len(da)}, {db and len(db)} (2 to 6 taken)"
    # (symbolic batch dims and K are checked again on each concrete shape, as MatMul's)
    symbolic = not all(isinstance(d, int) for d in (*da[:-2], *db[:-2]))
    if len(db) > 2 and (len(da) != len(db) or not symbolic and da[:-2] != db[:-2]):
        return f"{op} with broadcast batch dimensions"
    k = db[-2]
    if not isinstance(k, int) and not lookup.allow_dynamic or isinstance(k, int) and not exact_in_float32(k):
        return f"{op} over K = {k}: its sums are not exact in float32 (the CPU EP sums in float64)"
    n = db[-1]
    if a_zp and (lookup.dims(a_zp) not in ((), (1,)) or lookup.dtype(a_zp) != lookup.dtype(a)):
        return f"{op} a_zero_point {a_zp!r} is not one value of A's type (per-row A)"
    for c in (b_s, b_zp):
        arr = lookup.const(c) if c else None
        if arr is not None and arr.size != 1 and (arr.ndim != 1 or arr.shape[0] != n or len(db) != 2):
            return f"{op} parameter {c!r} of shape {list(arr.shape)} for B of dims {list(db)}"
    if op == "QLinearMatMul":
        yz = lookup.const(y_zp) if y_zp else None
        if yz is None or yz.dtype not in _CODES or yz.size != 1 or lookup.const(y_s).size != 1:
            return "QLinearMatMul with a y_scale or y_zero_point that is not one value of int8/uint8"
    elif bias and (lookup.dtype(bias) != F32 or lookup.dims(bias) != (n,)):
        return f"MatMulIntegerToFloat bias {bias!r} is not float32 [{n}]"
    return None


def _conv_integer_reason(node: Node, lookup: GraphLookup) -> str | None:
    x, w, x_zp, w_zp = _inputs(node)[:4]
    for v in (x, w):
        if lookup.dtype(v) not in _CODES:
            return f"ConvInteger of {lookup.dtype(v)} codes (the OpenCL EP computes int8/uint8)"
    weight = lookup.const(w)
    if weight is None or (w_zp and lookup.const(w_zp) is None):
        return "ConvInteger weight or its zero point is not a constant initializer"
    dims = lookup.dims(x)
    if dims is None or len(dims) not in (3, 4) or weight.ndim != len(dims):
        return "ConvInteger on an input of rank other than 3 or 4 (only 1-D and 2-D)"
    if x_zp and (lookup.dims(x_zp) not in ((), (1,)) or lookup.dtype(x_zp) != lookup.dtype(x)):
        return f"ConvInteger x_zero_point {x_zp!r} is not one value of x's type"
    wz = lookup.const(w_zp) if w_zp else None
    if wz is not None and wz.size != 1:  # (onnxruntime 1.32's conv_integer.cc: "Non per-tensor quantization")
        return f"ConvInteger with a w_zero_point of {wz.size} values (onnxruntime refuses it; the CPU EP reports it)"
    k = math.prod(weight.shape[1:])
    if not exact_in_float32(k):
        return f"ConvInteger over {k} taps a channel group: its sums are not exact in float32"
    # (a local import: op_support imports this module for its claim rules)
    from onnxhal.runtime.providers.opencl.op_support import conv_shape_error

    return conv_shape_error(node, dims, list(weight.shape), None)


class _Rewrite:
    """The new nodes, constants and value infos of one partition's rewrite."""

    def __init__(self, lookup: GraphLookup, dynamic: dict[str, Node]) -> None:
        self.lookup = lookup
        #: codes -> the DynamicQuantizeLinear that makes them
        self.dynamic = dynamic
        self.nodes: list[Node] = []
        self.constants: dict[str, np.ndarray] = {}
        self.infos: dict[str, ValueInfo] = {}
        self.count = 0

    def value(self, stem: str, dims, elem_type: int = TensorProto.FLOAT) -> str:
        self.count += 1
        name = f"::{stem}{self.count}"
        self.infos[name] = ValueInfo(name, helper.make_tensor_type_proto(elem_type, list(dims)))
        return name

    def constant(self, stem: str, arr: np.ndarray) -> str:
        self.count += 1
        name = f"::{stem}{self.count}"
        self.constants[name] = arr
        self.infos[name] = ValueInfo.of_array(name, arr)
        return name

    def add(self, op: str, inputs: list[str], outputs: list[str], **attrs) -> None:
        protos = [helper.make_attribute(k, v) for k, v in attrs.items()]
        self.nodes.append(Node(op, inputs, outputs, name=outputs[0], attribute_protos=protos))

    def centered(self, x: str, zp: str, axis: int = -1) -> str:
        """DequantizeLinear(x, 1, zp): the codes less their zero point (one, or one per index of
        ``axis``), exact in float32. Codes a DynamicQuantizeLinear of this graph makes (with that
        zero point) are made again from its input, ``QuantizeLinear(f, scale, zp)``, in the same
        fused kernel: the same codes (its ``dynamic_quantize_codes``' steps), and the node's codes
        launch is dropped where nothing else reads them."""
        dims = self.lookup.dims(x)
        dynamic = self.dynamic.get(x)
        if dynamic is not None and dynamic.outputs[2] == zp:
            codes = self.value("codes", dims, TensorProto.UINT8)
            self.add("QuantizeLinear", [dynamic.inputs[0], dynamic.outputs[1], zp], [codes])
            x = codes
        arr = self.lookup.const(zp) if zp else None
        ones = np.ones(() if arr is None or arr.size == 1 else arr.shape, np.float32)
        out = self.value("centered", dims)
        self.add("DequantizeLinear", [x, self.constant("one", ones), zp], [out], axis=axis % len(dims))
        return out

    def product(self, a: str, a_zp: str, b: str, b_zp: str, y_dims) -> str:
        acc = self.value("acc", y_dims)
        self.add("MatMul", [self.centered(a, a_zp), self.centered(b, b_zp)], [acc])
        return acc


def decompose_quantized(graph: Graph, lookup: GraphLookup) -> tuple[Graph, GraphLookup]:
    """``graph`` with its QLinearMatMul and MatMulIntegerToFloat nodes written as the ops above, and a
    lookup over it; the same pair where it holds none."""
    if not any((n.op_type, n.domain) in DECOMPOSED_OPS for n in graph.nodes):
        return graph, lookup
    dynamic = {n.outputs[0]: n for n in graph.nodes
               if n.op_type == "DynamicQuantizeLinear" and not n.domain and len(n.outputs) == 3 and all(n.outputs)}
    rw = _Rewrite(lookup, dynamic)
    for n in graph.nodes:
        if (n.op_type, n.domain) not in DECOMPOSED_OPS:
            rw.nodes.append(n)
            continue
        y = n.outputs[0]
        y_dims = lookup.dims(y)
        if n.op_type == "QLinearMatMul":
            a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp = _inputs(n)
            # the CPU EP's combined scale, in its float32 steps
            m = (np.float32(lookup.const(a_s).reshape(-1)[0]) * lookup.const(b_s).astype(np.float32)
                 / np.float32(lookup.const(y_s).reshape(-1)[0])).astype(np.float32)
            scaled = rw.value("scaled", y_dims)
            rw.add("Mul", [rw.product(a, a_zp, b, b_zp, y_dims), rw.constant("scale", m)], [scaled])
            rw.add("QuantizeLinear", [scaled, rw.constant("one", np.ones((), np.float32)), y_zp], [y])
        elif n.op_type == "ConvInteger":  # exact sums in float32, then int32 (exact integers: no rounding)
            x, w, x_zp, w_zp = _inputs(n)[:4]
            conv = rw.value("conv", y_dims)
            rw.nodes.append(Node("Conv", [rw.centered(x, x_zp), rw.centered(w, w_zp, axis=0)], [conv], name=conv,
                                 attribute_protos=list(n.attribute_protos.values())))
            rw.add("Cast", [conv], [y], to=TensorProto.INT32)
        else:
            a, b, a_s, b_s, a_zp, b_zp, bias = _inputs(n)[:7]
            # a_scale expanded to the result's (static: a plan's) shape, read through strides (rule
            # expand_elementwise): a_scale * b_scale joins the result's kernel, not a launch of its own
            wide = rw.value("a_scale", y_dims)
            rw.add("Expand", [a_s, rw.constant("shape", np.array(y_dims, np.int64))], [wide])
            scale = rw.value("scale", y_dims)
            rw.add("Mul", [wide, b_s], [scale])
            out = rw.value("scaled", y_dims) if bias else y
            rw.add("Mul", [rw.product(a, a_zp, b, b_zp, y_dims), scale], [out])
            if bias:
                rw.add("Add", [out, bias], [y])
    infos = {**graph.value_infos, **rw.infos}
    new = Graph(graph.name, rw.nodes, graph.inputs, graph.outputs, {**graph.initializers, **rw.constants},
                infos, graph.opset, parent=graph.parent)
    return new, replace(lookup, graph=new)

