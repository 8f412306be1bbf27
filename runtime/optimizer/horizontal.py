"""Horizontal fusion: sibling nodes that gather constant columns of one value, each reduced and
the results concatenated, as one node.

``fuse_gather_reduce``: a run of a Concat's inputs, each a keepdims ReduceProd / ReduceSum /
ReduceMax / ReduceMin along the concatenated axis of an ArrayFeatureExtractor (ai.onnx.ml) or a
Gather of constant indices along that axis, all of one value with one reduction -> one
``com.onnxhal`` GatherReduce (cpu/kernels/gather_reduce.py): the columns of every segment gathered
at once, reduced per segment by ``ufunc.reduceat``. skl2onnx writes PolynomialFeatures so: per
output column an ArrayFeatureExtractor of the columns it multiplies and a ReduceProd, then a
Concat (88 nodes for degree 2 on 8 features, each a kernel call on one or two values).

Results stay bit for bit the separate nodes': a float segment has at most ``MAX_FLOAT_SEGMENT``
(2) elements, whose reduction is one operation in any order; integer segments any length (exact
modulo the width in any order). Out-of-range indices still raise, from the fused node. A
reduction read elsewhere too (skl2onnx's bias column of ones takes the shape of the last product)
stays for those readers.

The idea is the horizontal fusion of parallel ops sharing an input: TVM's ``CombineParallelDense``
and ``CombineParallelConv2D`` passes (tvm.relay.transform: parallel operators on one input combined
into one) and TensorRT's horizontal layer fusion (TensorRT Developer Guide, "Layer Fusion").
onnxruntime has no such pass. Merging the gathers alone (one gather, then a Split into the
original pieces) was measured and left out: the Split's slices and the strided reads of every
consumer cost more than the gathers saved, at every group size tried (2 to 12 siblings, 1 and 100
rows).
"""

from __future__ import annotations

import numpy as np

from onnxhal.hal.graph import Graph, Node
from onnxhal.runtime.optimizer.rewrite import (
    FUSED_DOMAIN,
    constant,
    live_nodes,
    make_node,
    rank,
    replace_nodes,
    rewired,
    sole_consumer,
    unique_name,
)

ML = "ai.onnx.ml"
#: Fewer reductions than this in a run are left apart.
MIN_GROUP = 2
#: Gathers of a shape's entries are left alone: those are computed once per input shape
#: (runtime/session/shape_memo.py), so fusing them saves nothing.
_SHAPE_SOURCES = frozenset({"Shape", "Size"})


def _indices(graph: Graph, node: Node) -> np.ndarray | None:
    """The node's constant integer indices, flattened, or None when they are not constant or not
    fit for a fusion (empty, or a Gather's not 1-D: its output would drop or add axes)."""
    if len(node.inputs) != 2 or len(node.outputs) != 1 or not node.outputs[0]:
        return None
    idx = constant(graph, node.inputs[1])
    if idx is None or idx.dtype.kind not in "iu" or idx.size == 0:
        return None
    if node.op_type == "Gather" and idx.ndim != 1:
        return None
    return idx.reshape(-1).astype(np.int64)


def _group_key(graph: Graph, node: Node) -> tuple | None:
    """(op, data value, axis) of a gather the pass may fuse; None for a node it leaves alone."""
    if node.op_type == "ArrayFeatureExtractor" and node.domain == ML:
        return ("ArrayFeatureExtractor", node.inputs[0], -1) if node.inputs and node.inputs[0] else None
    if node.op_type == "Gather" and node.domain in ("", "ai.onnx") and node.inputs and node.inputs[0]:
        producer = graph.producer(node.inputs[0])
        if producer is not None and producer.op_type in _SHAPE_SOURCES:
            return None
        return ("Gather", node.inputs[0], int(node.attr("axis", 0)))
    return None


#: The reductions ``fuse_gather_reduce`` takes: one ufunc's reduce each (cpu/kernels/gather_reduce.py).
SEGMENT_REDUCTIONS = frozenset({"ReduceProd", "ReduceSum", "ReduceMax", "ReduceMin"})
#: Longest float segment fused: a reduction of two elements is one operation, so any order of
#: evaluation gives the same bits; longer ones may round differently (numpy's reduce unrolls).
MAX_FLOAT_SEGMENT = 2


def _gathered_piece(graph: Graph, value: str) -> tuple[tuple[str, str, int], np.ndarray] | None:
    """((gathering op, data value, output axis), the indices of the columns ``value`` holds) when
    ``value`` is a gather of constant indices; None otherwise. The axis is non-negative, read
    against the data's known rank; None when the rank is unknown."""
    node = graph.producer(value)
    if node is None:
        return None
    key = _group_key(graph, node)
    idx = _indices(graph, node) if key is not None else None
    if idx is None:
        return None
    op, data, axis = key
    out_axis = _normal_axis(graph, (op, data, 0), axis)
    return None if out_axis is None else ((op, data, out_axis), idx)


def _out_rank(graph: Graph, op: str, data: str) -> int | None:
    r = rank(graph, data)
    if r is None:
        return None
    return max(r, 2) if op == "ArrayFeatureExtractor" else r


def _normal_axis(graph: Graph, key: tuple[str, str, int], axis: int) -> int | None:
    """``axis`` of the gather ``key``'s output, made non-negative; None if out of range or unknown."""
    r = _out_rank(graph, key[0], key[1])
    if r is None or not -r <= axis < r:
        return None
    return axis % r


def _reduced_piece(graph: Graph, concat: Node, value: str, axis: int) -> tuple[tuple, np.ndarray] | None:
    """(fusion key, indices) when ``value``, read once by ``concat``, is a keepdims reduction, along
    the concatenated ``axis`` only, of a gathered piece along that same axis."""
    node = graph.producer(value)
    if (node is None or node.op_type not in SEGMENT_REDUCTIONS or node.domain not in ("", "ai.onnx")
            or node.attr("keepdims", 1) != 1 or not node.inputs or len(node.outputs) != 1):
        return None
    if list(concat.inputs).count(value) != 1:
        return None
    axes = node.attr("axes")
    if axes is None and len(node.inputs) > 1:
        given = constant(graph, node.inputs[1])
        axes = None if given is None else given.reshape(-1).tolist()
    if axes is None or len(axes) != 1:
        return None
    piece = _gathered_piece(graph, node.inputs[0])
    if piece is None:
        return None
    (op, data, gather_axis), idx = piece
    if _normal_axis(graph, (op, data, 0), int(axes[0])) != gather_axis or gather_axis != axis:
        return None
    dtype = graph.value_info(data).dtype
    if dtype is None or dtype.kind not in "fiu" or (dtype.kind == "f" and idx.size > MAX_FLOAT_SEGMENT):
        return None
    return (node.op_type, op, data, gather_axis), idx


def fuse_gather_reduce(graph: Graph) -> bool:
    """Runs of a Concat's inputs that are keepdims reductions of gathered pieces of one value ->
    ``com.onnxhal`` GatherReduce (cpu/kernels/gather_reduce.py): skl2onnx's PolynomialFeatures, a
    ReduceProd per output column of the columns it multiplies, concatenated."""
    changed = False
    for concat in live_nodes(graph, "Concat"):
        if concat.domain not in ("", "ai.onnx") or len(concat.inputs) < MIN_GROUP:
            continue
        r = rank(graph, concat.inputs[0])
        axis = int(concat.attr("axis", 1 if concat.since_version == 1 else 0))
        if r is None or not -r <= axis < r:
            continue
        axis %= r
        pieces = [_reduced_piece(graph, concat, v, axis) for v in concat.inputs]
        runs: list[tuple[int, int]] = []  # [start, end) of each run of pieces with one key
        k = 0
        while k < len(pieces):
            end = k + 1
            if pieces[k] is not None:
                while end < len(pieces) and pieces[end] is not None and pieces[end][0] == pieces[k][0]:
                    end += 1
                if end - k >= MIN_GROUP:
                    runs.append((k, end))
            k = end
        if not runs:
            continue
        inputs: list[str] = []
        fused: list[Node] = []
        last = 0
        for start, end in runs:
            inputs += concat.inputs[last:start]
            reduce_op, op, data, gather_axis = pieces[start][0]
            whole = start == 0 and end == len(pieces)
            out = concat.outputs[0] if whole else unique_name(graph, f"{concat.outputs[0]}_gathered_{start}")
            node = make_node(graph, "GatherReduce", [data], [out], name=f"{concat.name or concat.outputs[0]}_{start}",
                             domain=FUSED_DOMAIN, indices=[int(i) for p in pieces[start:end] for i in p[1]],
                             segments=[int(p[1].size) for p in pieces[start:end]], axis=gather_axis,
                             reduce=reduce_op, source=op)
            fused.append(node)
            inputs.append(out)
            last = end
        inputs += concat.inputs[last:]
        # a reduction read elsewhere too stays for those readers (dead-node removal drops the
        # gathers only the fused ones read)
        gone = [graph.producer(concat.inputs[k]) for start, end in runs for k in range(start, end)
                if sole_consumer(graph, concat.inputs[k]) is concat]
        if len(inputs) > 1:
            fused.append(rewired(graph, concat, inputs, concat.outputs, name=concat.name))
        replace_nodes(graph, [*gone, concat], fused)
        changed = True
    return changed
