"""Graphs an onnxhal EP must not claim from inside onnxruntime: those with nodes onnxhal's loader
refuses.

onnxhal's EPs run nodes that onnxhal's loader checked (``runtime/loader/model_loader.py``: each node against
its schema, ONNX's strict shape inference, and ``guarded_inference.check_inferred``: an ``axis``
beyond its input's rank, a Conv ``kernel_shape`` other than its weight's). Inside onnxruntime that
loader never runs, and onnxruntime leaves some of those checks to its own kernels, at run time: an
EP kernel met them unchecked (a Concat with ``axis=-2**62`` concatenated along axis 0 where
onnxruntime refuses the model; a Conv whose weight has rank 1 failed inside the OpenCL EP's lowering
with an IndexError). Each claimed node is checked with the loader's rules on onnxruntime's graph,
alone, with the types and shapes onnxruntime gives its inputs, before the EP sees the graph; in a
graph holding a node that fails, the EP claims nothing (a warning names the node and the reason):
onnxruntime's own EPs take the graph and its kernel gives its own error, as without onnxhal. The
EP's get_capability is not asked (its lowering would meet the node unchecked), and no claim is
withheld from a valid graph. Verdicts are kept by node signature (op, attributes, input
types): a model's repeated layers are checked once.
"""

from __future__ import annotations

import functools
import threading

import numpy as np
import onnx
from onnx import helper

from onnxhal.hal.errors import OrtError
from onnxhal.hal.graph import Graph, Node
from onnxhal.runtime.loader import guarded_inference
from onnxhal.runtime.loader.model_loader import inference_errors
from onnxhal.runtime.loader.node_checks import check_nodes

_STANDARD = ("", "ai.onnx")
_verdicts: dict[bytes, None] = {}
_verdicts_lock = threading.Lock()
_MAX_VERDICTS = 4096


def _value_info(graph: Graph, name: str) -> onnx.ValueInfoProto | None:
    if name in graph.initializers:
        a = np.asarray(graph.initializers[name])
        if a.dtype == object:
            return None
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
    info = graph.value_info(name)
    if info is None or info.type_proto is None or not info.type_proto.WhichOneof("value"):
        return None
    return helper.make_value_info(name, info.type_proto)


def _one_node_model(graph: Graph, node: Node) -> onnx.ModelProto | None:
    """``node`` alone in a model whose inputs carry onnxruntime's types for it; None where an input's
    type is unknown (nothing to check it against)."""
    infos = []
    for name in dict.fromkeys(i for i in node.inputs if i):
        info = _value_info(graph, name)
        if info is None:
            return None
        infos.append(info)
    one = helper.make_graph([node.to_proto()], graph.name or "graph", infos, [])
    opset = graph.opset.get("", graph.opset.get("ai.onnx", 0))
    return helper.make_model(one, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _verdict(model: onnx.ModelProto, opset: int) -> str | None:
    try:
        check_nodes(model, {"": opset})
        inferred, _, strict_error = guarded_inference.infer(model)
        if strict_error:
            errors = inference_errors(strict_error)
            if errors:
                return errors[0]
        if inferred is not None:
            guarded_inference.check_inferred(inferred)
    except OrtError as e:
        return str(e)
    return None


@functools.cache
def holds_subgraphs(op_type: str) -> bool:
    """Whether ``op_type`` takes graph attributes (If, Loop, Scan, SequenceMap): graph_view.py does
    not carry them, so such a node cannot be judged alone."""
    try:
        schema = onnx.defs.get_schema(op_type)
    except onnx.defs.SchemaError:
        return False
    graph_kinds = (onnx.defs.OpSchema.AttrType.GRAPH, onnx.defs.OpSchema.AttrType.GRAPHS)
    return any(a.type in graph_kinds for a in schema.attributes.values())


def refusal(graph: Graph, node: Node) -> str | None:
    """Why onnxhal's loader would refuse ``node`` of ``graph`` (its message), else None. Nodes of
    other domains (onnxruntime's own, com.microsoft) and nodes holding subgraphs (their bodies read
    the enclosing graph) are not judged."""
    if node.domain not in _STANDARD or holds_subgraphs(node.op_type):
        return None
    model = _one_node_model(graph, node)
    if model is None:
        return None
    key = _signature(model)
    with _verdicts_lock:
        if key in _verdicts:
            return None
    verdict = _verdict(model, model.opset_import[0].version)
    if verdict is None:  # only passes are kept: a refusal's message names this node's values
        with _verdicts_lock:
            if len(_verdicts) >= _MAX_VERDICTS:
                _verdicts.clear()
            _verdicts[key] = None
    return verdict


def _signature(model: onnx.ModelProto) -> bytes:
    """The one-node model with its names taken out: what the verdict depends on."""
    key = onnx.ModelProto()
    key.CopyFrom(model)
    g = key.graph
    names = {v.name: f"i{k}" for k, v in enumerate(g.input)}
    for v in g.input:
        v.name = names[v.name]
    n = g.node[0]
    n.name = ""
    for k, name in enumerate(n.input):
        n.input[k] = names.get(name, "")
    for k in range(len(n.output)):
        n.output[k] = f"o{k}" if n.output[k] else ""
    g.name = ""
    return key.SerializeToString()


def graph_refusal(graph: Graph) -> str | None:
    """The first node of ``graph`` onnxhal's loader refuses, with the reason; else None."""
    for node in graph.nodes:
        reason = refusal(graph, node)
        if reason is not None:
            return reason
    return None
