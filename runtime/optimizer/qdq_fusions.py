"""Extended-level fusion of QDQ groups into integer kernels, as onnxruntime's
``QDQSelectorActionTransformer`` makes them for its CPU EP.

A float op whose float inputs all come from DequantizeLinear and whose one reader is a
QuantizeLinear (``quantize_static``'s QDQ format) is replaced by the integer op that reads the
codes and writes the QuantizeLinear's codes:

- MatMul -> QLinearMatMul (A and Y of one 8-bit type; B uint8 with a uint8 A, else int8; B's
  scale per tensor or per column),
- Softmax -> com.microsoft QLinearSoftmax (X and Y of one type),
- Add / Mul -> com.microsoft QLinearAdd / QLinearMul (A, B and C of one type),
- Concat -> com.microsoft QLinearConcat (all of one type).

Scales and zero points must be one-element constants (per-tensor quantization) and every zero
point given. Which groups onnxruntime fuses on x86-64 follows from two of its rules, matched here:
int8 activations are not fused there (its ``QDQIsInt8Allowed`` is false), but its
``QDQS8ToU8Transformer`` first turns an int8 QuantizeLinear -> DequantizeLinear pair into uint8
(exactly: codes and zero point shifted by 128) where the QuantizeLinear feeds that one
DequantizeLinear and it that one node; int8 constants stay int8, which its QLinearMatMul takes as
weights (uint8 x int8) and the other kernels do not. So a group is fused where every activation is uint8
or such a pair; a shared int8 activation (a LayerNorm output read by Q, K, V and the residual)
keeps its node unfused. The shift changes no value, so the codes are left as they are.

The integer kernels round where onnxruntime's do, which is not where the float ops between a
DequantizeLinear and a QuantizeLinear round, so without this a QDQ model runs as onnxruntime runs
it at ``ORT_ENABLE_BASIC`` and differs at its default level (a ViT's attention: 9e-2 of the
output's scale). The DequantizeLinear nodes are left for the dead-node pass (another reader may
share them); constant folding keeps a DequantizeLinear whose MatMul this pass would fuse
(``keep_for_fusion``), as onnxruntime's constant folding keeps every one.
"""

from __future__ import annotations

import weakref

import numpy as np

from onnxhal.hal.graph import Graph, Node
from onnxhal.runtime.optimizer.rewrite import (
    constant,
    graph_output_names,
    live_nodes,
    make_node,
    replace_nodes,
    sole_consumer,
)

MS = "com.microsoft"
_U8, _I8 = np.dtype(np.uint8), np.dtype(np.int8)
_FUSED = frozenset({"MatMul", "Softmax", "Add", "Mul", "Concat"})


def _params(graph: Graph, node: Node, per_column: bool = False) -> tuple[str, str, str, np.dtype] | None:
    """(codes, scale, zero point, code type) of a per-tensor QuantizeLinear/DequantizeLinear with
    constant parameters (``per_column``: or per last-axis column, constant 2-D codes: MatMul
    weights), or None."""
    if node.domain != "" or len(node.inputs) < 3 or not node.inputs[2] or node.attr("block_size", 0):
        return None
    scale, zero = constant(graph, node.inputs[1]), constant(graph, node.inputs[2])
    if scale is None or zero is None or zero.shape != scale.shape or scale.dtype != np.float32 \
            or zero.dtype not in (_U8, _I8) or not np.isfinite(scale).all():
        return None  # (an infinite scale: an attention mask's -inf; onnxruntime leaves those groups)
    codes = node.outputs[0] if node.op_type == "QuantizeLinear" else node.inputs[0]
    if scale.size != 1:
        weights = constant(graph, codes) if per_column else None
        if weights is None or weights.ndim != 2 or scale.ndim != 1 or scale.size != weights.shape[1] or \
                int(node.attr("axis", 1)) not in (1, -1):
            return None
    return codes, node.inputs[1], node.inputs[2], zero.dtype


def _dequantized(graph: Graph, name: str, per_column: bool = False) -> tuple[str, str, str, np.dtype, Node] | None:
    producer = graph.producer(name)
    if producer is None or producer.op_type != "DequantizeLinear":
        return None
    params = _params(graph, producer, per_column)
    return None if params is None else (*params, producer)


def _single_reader(graph: Graph, name: str) -> Node | None:
    readers = graph.consumers(name)
    return readers[0] if len(readers) == 1 and name not in graph_output_names(graph) else None


def _as_uint8(graph: Graph, codes: str, dtype: np.dtype, dq: Node) -> bool:
    """Whether onnxruntime sees these DequantizeLinear codes as uint8 when it fuses (above)."""
    if dtype == _U8:
        return True
    if constant(graph, codes) is not None:  # int8 constants stay int8 (a MatMul's weights: see _group)
        return False
    # written by a QuantizeLinear, or by a group fused before this one (which took its place)
    q = graph.producer(codes)
    return q is not None and (q.op_type == "QuantizeLinear" or q.op_type.startswith("QLinear")) and \
        _single_reader(graph, codes) is dq and _single_reader(graph, dq.outputs[0]) is not None


def _output_as_uint8(graph: Graph, q: Node, dtype: np.dtype) -> bool:
    if dtype == _U8:
        return True
    dq = _single_reader(graph, q.outputs[0])
    return dq is not None and dq.op_type == "DequantizeLinear" and _single_reader(graph, dq.outputs[0]) is not None


def _group(graph: Graph, node: Node) -> tuple[list, tuple, Node] | None:
    """The DequantizeLinear parameters of ``node``'s inputs, its QuantizeLinear's, and that node;
    None where ``node`` is not a group onnxruntime fuses."""
    if node.domain != "" or node.op_type not in _FUSED or len(node.outputs) != 1:
        return None
    q = sole_consumer(graph, node.outputs[0])
    if q is None or q.op_type != "QuantizeLinear" or q.inputs[0] != node.outputs[0]:
        return None
    out = _params(graph, q)
    if out is None or not _output_as_uint8(graph, q, out[3]):
        return None
    ins = [_dequantized(graph, i, node.op_type == "MatMul" and k == 1) for k, i in enumerate(node.inputs)]
    if any(i is None for i in ins):
        return None
    weights = {1} if node.op_type == "MatMul" and ins[1][3] == _I8 and constant(graph, ins[1][0]) is not None else set()
    if not all(k in weights or _as_uint8(graph, i[0], i[3], i[4]) for k, i in enumerate(ins)):
        return None
    return [i[:4] for i in ins], out, q


def keep_for_fusion(graph: Graph, dq: Node) -> bool:
    """Whether constant folding should keep ``dq`` (a DequantizeLinear of constant codes) for this
    pass: it feeds a node that forms a QDQ group (a MatMul's weights, an Add's bias)."""
    return dq.op_type == "DequantizeLinear" and any(
        c.op_type in _FUSED and _group(graph, c) is not None for c in graph.consumers(dq.outputs[0]))


def _fused(graph: Graph, node: Node, ins: list, out: tuple, q: Node) -> Node | None:
    op, y_type = node.op_type, out[3]
    types = [i[3] for i in ins]
    name = f"{node.name or node.outputs[0]}_quant"
    flat = [v for i in ins for v in i[:3]]
    if op == "MatMul":
        a, b = types
        if a != y_type or (a, b) not in ((_U8, _U8), (_U8, _I8), (_I8, _I8)):
            return None  # (the kernels take these; onnxruntime's u8 x u8 after its shift is the same values)
        return make_node(graph, "QLinearMatMul", [*flat, out[1], out[2]], [q.outputs[0]], name=name)
    if any(t != y_type for t in types):
        return None  # one code type for the com.microsoft kernels (the shift above is not made here)
    if op == "Softmax":
        opset = graph.opset_version("")
        axis = int(node.attr("axis", -1 if opset >= 13 else 1))
        return make_node(graph, "QLinearSoftmax", [*flat, out[1], out[2]], [q.outputs[0]], name=name, domain=MS,
                         axis=axis, opset=opset)
    if op in ("Add", "Mul"):
        return make_node(graph, f"QLinear{op}", [*flat, out[1], out[2]], [q.outputs[0]], name=name, domain=MS)
    return make_node(graph, "QLinearConcat", [out[1], out[2], *flat], [q.outputs[0]], name=name, domain=MS,
                     axis=int(node.attr("axis")))


#: Graphs this pass has run on: it runs once per graph, as onnxruntime decides which pairs become
#: uint8 once, before any fusion; a later round (after other passes removed a reader) would fuse
#: groups onnxruntime leaves.
_done: weakref.WeakSet[Graph] = weakref.WeakSet()


def fuse_qdq_groups(graph: Graph) -> bool:
    """Each fusable DequantizeLinear -> op -> QuantizeLinear group as its integer op."""
    if graph in _done:
        return False
    _done.add(graph)
    changed = False
    for node in live_nodes(graph, *_FUSED):
        group = _group(graph, node)
        if group is None:
            continue
        fused = _fused(graph, node, *group)
        if fused is None:
            continue
        if fused.domain == MS:
            graph.opset.setdefault(MS, 1)
        replace_nodes(graph, [node, group[2]], [fused])
        changed = True
    return changed
