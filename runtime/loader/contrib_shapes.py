"""Shapes through onnxruntime's com.microsoft operators whose outputs have their first input's shape.

onnx knows no com.microsoft schema, so its shape inference stops at such a node: its outputs get no
type, and nothing after it a rank. onnxruntime-optimized exports (``*_ortopt``: BERT, GPT-2,
Whisper) are made of them (SkipLayerNormalization, BiasGelu, FastGelu), so a device that needs
ranks declined everything after the first one. Per onnxruntime's docs/ContribOperators.md, the
outputs below have the shape and element type of input 0 (SkipLayerNormalization's ``output`` and
``input_skip_bias_sum``; its training-only mean and inv_std_var outputs are left untyped). The
loader infers a copy in which each such node is an Identity of input 0 per typed output and takes
the values found there that the model left untyped; where that pass fails, the model stays as it was.

``infer_through_stand_ins`` is the one-pass form the loader takes first: strict inference of the
stand-in copy alone, its values (a superset of what the model's own pass finds: the same nodes, and
Identities that type what onnx left untyped) given to the model's nodes. That pass checks every node
the model's own would, with at least as much known of its inputs, so where it succeeds the model's
own would refuse nothing; where it fails, the loader runs the two passes as before, so what is
refused, and with which message, does not change. One inference instead of two: about a sixth of
an onnxruntime-optimized export's load.
"""

from __future__ import annotations

import onnx

from onnxhal.runtime.loader import guarded_inference

MS = "com.microsoft"
#: op type -> the outputs (indices) with input 0's shape and element type
SAME_SHAPE_OUTPUTS: dict[str, tuple[int, ...]] = {
    "SkipLayerNormalization": (0, 3), "SkipSimplifiedLayerNormalization": (0, 3), "BiasGelu": (0,),
    "FastGelu": (0,), "Gelu": (0,), "QuickGelu": (0,),
}


def _stand_in(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """A copy of ``model`` with each such node (main graph) an Identity per typed output; None if none."""
    if not any(n.domain == MS and n.op_type in SAME_SHAPE_OUTPUTS for n in model.graph.node):
        return None
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    nodes = []
    for n in copy.graph.node:
        if n.domain != MS or n.op_type not in SAME_SHAPE_OUTPUTS or not n.input or not n.input[0]:
            nodes.append(n)
            continue
        for k in SAME_SHAPE_OUTPUTS[n.op_type]:
            if k < len(n.output) and n.output[k]:
                nodes.append(onnx.helper.make_node("Identity", [n.input[0]], [n.output[k]], name=f"{n.name}:{k}"))
    del copy.graph.node[:]
    copy.graph.node.extend(nodes)
    return copy


def infer_through_stand_ins(model: onnx.ModelProto) -> tuple[onnx.ModelProto | None, bool]:
    """(``model`` with the values strict inference of its stand-in copy finds, and whether data was
    propagated), or (None, False) where ``model`` has no such node or that inference fails. ``model``
    is the loader's own; it is changed only where the inference succeeds."""
    stub = _stand_in(model)
    if stub is None:
        return None, False
    inferred, data_prop, _ = guarded_inference.infer(stub, owned=True)
    if inferred is None:
        return None, False
    if not any(a.type in _GRAPH_KINDS for n in model.graph.node for a in n.attribute):
        # one graph: its values go to the model (fewer messages to copy than its nodes)
        g, values = model.graph, inferred.graph
        g.ClearField("value_info")
        g.ClearField("output")
        g.value_info.extend(values.value_info)
        g.output.extend(values.output)
        model.ir_version = inferred.ir_version  # (raised where inference needed it)
        return model, data_prop
    # the inferred copy (its values, and its weights, given back where inference went without
    # them) with the model's own main-graph nodes; the subgraphs, their values filled, are the same
    del inferred.graph.node[:]
    inferred.graph.node.extend(model.graph.node)
    return inferred, data_prop


_GRAPH_KINDS = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)


def with_contrib_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` (strictly inferred, the loader's own) with the values after such nodes typed where
    the stand-in copy's inference types them and the model does not."""
    stub = _stand_in(model)
    if stub is None:
        return model
    inferred, _, _ = guarded_inference.infer(stub, owned=True)
    if inferred is None:
        return model
    g = model.graph
    inputs = {v.name for v in g.input}
    entries = {v.name: v for v in (*g.value_info, *g.output)}  # a graph output's own entry last
    for v in (*inferred.graph.value_info, *inferred.graph.output):
        if v.name in inputs or v.type.WhichOneof("value") is None:
            continue
        entry = entries.get(v.name)
        if entry is None:
            g.value_info.append(v)
        elif entry.type.WhichOneof("value") is None or not entry.type.tensor_type.HasField("shape"):
            entry.type.CopyFrom(v.type)  # typed without a shape, or untyped: the stand-in's is finer
    return model
