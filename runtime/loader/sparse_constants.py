"""Constant nodes with a ``sparse_value`` become dense initializers at load, as in onnxruntime's graph
(onnxruntime/core/graph/graph.cc turns Constant nodes into initializers, and sparse initializers into
dense ones). ONNX's shape inference types such a Constant's output as a dense tensor, so a model that
declares it a sparse tensor (a sparse graph output) would otherwise be refused, where onnxruntime
loads it and returns a sparse tensor (the session does the same: ``runtime/session/inference_session.py``).
"""

from __future__ import annotations

import onnx
from onnx import numpy_helper

from onnxhal.hal.graph import sparse_to_dense


def _sparse_constants(graph: onnx.GraphProto) -> list[int]:
    return [i for i, n in enumerate(graph.node)
            if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and len(n.output) == 1
            and any(a.name == "sparse_value" for a in n.attribute)]


def sparse_constants_to_initializers(proto: onnx.ModelProto, owned: bool) -> onnx.ModelProto:
    """The model with the main graph's sparse Constants as dense initializers named for their
    outputs; ``proto`` is changed in place if ``owned``, else copied. Subgraphs keep theirs (the
    Constant kernel expands them)."""
    positions = _sparse_constants(proto.graph)
    if not positions:
        return proto
    if not owned:
        copy = onnx.ModelProto()
        copy.CopyFrom(proto)
        proto = copy
    graph = proto.graph
    for i in reversed(positions):
        node = graph.node[i]
        sparse = next(a.sparse_tensor for a in node.attribute if a.name == "sparse_value")
        what = f"Constant node {node.name!r}'s sparse_value"
        graph.initializer.append(numpy_helper.from_array(sparse_to_dense(sparse, what), node.output[0]))
        del graph.node[i]
    return proto
