"""Horizontal fusion of sibling gathers: several nodes picking constant indices from one value
become one gather and a Split.

``merge_constant_gathers``: ArrayFeatureExtractor (ai.onnx.ml) nodes, or Gather nodes of one
``axis``, that read the same data value with constant 1-D (Gather) or any-shape (ArrayFeatureExtractor
flattens it) integer indices -> one node of that op with the indices concatenated, then one Split
along the gathered axis into the original outputs, in order. skl2onnx writes PolynomialFeatures as
one ArrayFeatureExtractor per output column (44 of them for degree 2 on 8 features), each a kernel
call on one or two columns, where one gather and one Split make two calls.

A gather copies elements: the merged gather holds exactly the elements the separate ones did, and
Split gives each original output its own run of them, so results are identical, shapes included
(a 1-D X gives ArrayFeatureExtractor outputs of one row, and the merged output of one row splits
into them). Out-of-range indices still raise, from the merged node.

The idea is the horizontal fusion of parallel ops sharing an input: TVM's ``CombineParallelDense``
and ``CombineParallelConv2D`` passes (tvm.relay.transform, "combine multiple dense operators that
share the same input ... into a single dense" followed by a split) and TensorRT's horizontal layer
fusion (TensorRT Developer Guide, "Layer Fusion"). onnxruntime has no such pass; its CPU EP pays a
kernel launch per node instead, which costs it less.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from onnxhal.hal.graph import Graph, Node
from onnxhal.runtime.optimizer.rewrite import add_initializer, constant, make_node, rank, unique_name

ML = "ai.onnx.ml"
#: Fewer siblings than this are left apart.
MIN_GROUP = 2
#: Split's ``split`` became an input at opset 13, and a negative ``axis`` allowed at opset 11.
_SPLIT_INPUT_SINCE = 13
_NEGATIVE_AXIS_SINCE = 11
_SHAPE_SOURCES = frozenset({"Shape", "Size"})


def _indices(graph: Graph, node: Node) -> np.ndarray | None:
    """The node's constant integer indices, flattened, or None when they are not constant or not
    fit for a merge (empty, or a Gather's not 1-D: its output would drop or add axes)."""
    if len(node.inputs) != 2 or len(node.outputs) != 1 or not node.outputs[0]:
        return None
    idx = constant(graph, node.inputs[1])
    if idx is None or idx.dtype.kind not in "iu" or idx.size == 0:
        return None
    if node.op_type == "Gather" and idx.ndim != 1:
        return None
    return idx.reshape(-1).astype(np.int64)


def _group_key(graph: Graph, node: Node) -> tuple | None:
    """(op, data value, axis) of a mergeable gather; None for a node this pass leaves alone."""
    if node.op_type == "ArrayFeatureExtractor" and node.domain == ML:
        return ("ArrayFeatureExtractor", node.inputs[0], -1) if node.inputs and node.inputs[0] else None
    if node.op_type == "Gather" and node.domain in ("", "ai.onnx") and node.inputs and node.inputs[0]:
        # A shape's entries are computed once per input shape (runtime/session/shape_memo.py):
        # merging their gathers saves nothing and would reshape the chains the shape passes read.
        producer = graph.producer(node.inputs[0])
        if producer is not None and producer.op_type in _SHAPE_SOURCES:
            return None
        return ("Gather", node.inputs[0], int(node.attr("axis", 0)))
    return None


def _split_axis(graph: Graph, op: str, data: str, axis: int) -> int | None:
    """The axis the merged output splits along, as the graph's Split accepts it; None when it
    cannot be written (a negative axis before opset 11 with the rank unknown)."""
    if axis >= 0:
        return axis
    if graph.opset_version("") >= _NEGATIVE_AXIS_SINCE:
        return axis
    r = rank(graph, data)
    if r is None:
        return None
    # ArrayFeatureExtractor's output has at least two axes (a 1-D X gives one row)
    out_rank = max(r, 2) if op == "ArrayFeatureExtractor" else r
    return axis + out_rank


def merge_constant_gathers(graph: Graph) -> bool:
    """Sibling ArrayFeatureExtractor / Gather nodes with constant indices on one value -> one
    gather and a Split (module docstring)."""
    opset = graph.opset_version("")
    if opset < 2:  # Split with sizes needs opset 2 (an attribute) or 13 (an input)
        return False
    groups: dict[tuple, list[tuple[Node, np.ndarray]]] = {}
    for node in graph.nodes:
        if node.op_type not in ("ArrayFeatureExtractor", "Gather"):
            continue
        key = _group_key(graph, node)
        if key is None:
            continue
        idx = _indices(graph, node)
        if idx is not None:
            groups.setdefault(key, []).append((node, idx))
    changed = False
    for (op, data, axis), members in groups.items():
        if len(members) < MIN_GROUP:
            continue
        split_axis = _split_axis(graph, op, data, axis)
        if split_axis is None:
            continue
        _merge(graph, op, data, axis, split_axis, [m[0] for m in members], [m[1] for m in members])
        changed = True
    return changed


def _merge(graph: Graph, op: str, data: str, axis: int, split_axis: int, nodes: Sequence[Node],
           indices: Sequence[np.ndarray]) -> None:
    first = nodes[0]
    base = first.name or first.outputs[0]
    merged_idx = add_initializer(graph, f"{base}_merged_indices", np.concatenate(indices))
    merged_out = unique_name(graph, f"{first.outputs[0]}_merged")
    if op == "Gather":
        gather = make_node(graph, "Gather", [data, merged_idx], [merged_out], name=f"{base}_merged", axis=axis)
    else:
        gather = make_node(graph, "ArrayFeatureExtractor", [data, merged_idx], [merged_out], name=f"{base}_merged",
                           domain=ML)
    sizes = [int(i.size) for i in indices]
    outputs = [n.outputs[0] for n in nodes]
    if graph.opset_version("") >= _SPLIT_INPUT_SINCE:
        sizes_name = add_initializer(graph, f"{base}_split_sizes", np.array(sizes, dtype=np.int64))
        split = make_node(graph, "Split", [merged_out, sizes_name], outputs, name=f"{base}_split", axis=split_axis)
    else:
        split = make_node(graph, "Split", [merged_out], outputs, name=f"{base}_split", axis=split_axis, split=sizes)
    # The merged nodes take the first member's place: the data and the constant indices exist
    # there, and every reader of any member's output comes after it.
    gone = {id(n) for n in nodes}
    position = next(k for k, n in enumerate(graph.nodes) if n is first)
    kept = [n for n in graph.nodes[:position] if id(n) not in gone]
    rest = [n for n in graph.nodes[position:] if id(n) not in gone]
    graph.nodes = kept + [gather, split] + rest
    for n in nodes:
        graph.unindex_node(n)
    graph.index_node(gather)
    graph.index_node(split)

