"""The model's own ``value_info`` for values standard operators compute: set aside before shape
inference, and only their element types held against what inference finds.

onnx's inference takes a declared shape as given where it cannot merge it with its own, so a stale
``value_info`` entry (a rank or dimensions from an older version of the graph) led the loader to
refuse a model onnxruntime runs ("Incompatible dimensions" for an Add after a stale [7, 7]) or the
optimizer to fold a rank-3 MatMul into a Gemm that then failed at run. onnxruntime recomputes those
shapes and ignores stale ones, but refuses a stale element type ("Type Error: Type (tensor(double))
of output arg (a) of node () does not match expected type (tensor(float))"): so does this.
Entries for values of other domains' operators are kept, since nothing else says what those are.

An entry for a graph output (or input) is ignored altogether, as onnxruntime: its graph builds each
graph input's and output's value from their own declarations first, and a value_info entry of the
same name finds that value made (``Graph::Graph`` in onnxruntime's ``core/graph/graph.cc``). So
onnxconverter-common's fp16 models with ``keep_io_types`` (a stale FLOAT16 entry for the float
output its final Cast computes) load, as in onnxruntime.
"""

from __future__ import annotations

import onnx

from onnxhal.hal.errors import Fail
from onnxhal.runtime.loader.node_checks import STANDARD_DOMAINS, walk_graphs


def _standard_outputs(graph: onnx.GraphProto) -> set[str]:
    return {o for n in graph.node if n.domain in STANDARD_DOMAINS for o in n.output if o}


def set_aside(proto: onnx.ModelProto, owned: bool = False) -> tuple[onnx.ModelProto, dict[str, int]]:
    """The model without the value_info entries of standard operators' outputs, and {name: declared
    element type} of those. ``proto`` is changed in place if ``owned`` (the loader parsed it), else
    copied: the caller's ModelProto is not changed."""
    outputs = [_standard_outputs(g) if len(g.value_info) else set() for g, _ in walk_graphs(proto.graph)]
    if not any(v.name in ours for (g, _), ours in zip(walk_graphs(proto.graph), outputs) for v in g.value_info):
        return proto, {}
    if not owned:
        copy = onnx.ModelProto()
        copy.CopyFrom(proto)
        proto = copy
    declared: dict[str, int] = {}
    for (g, _), ours in zip(walk_graphs(proto.graph), outputs):  # a copy walks in the same order
        if not len(g.value_info):
            continue
        keep = [v for v in g.value_info if v.name not in ours]
        io = {v.name for v in g.output} | {v.name for v in g.input}
        for v in g.value_info:
            if v.name in ours and v.name not in io and v.type.HasField("tensor_type") and \
                    v.type.tensor_type.elem_type:
                declared[v.name] = v.type.tensor_type.elem_type
        del g.value_info[:]
        g.value_info.extend(keep)
    return proto, declared


def check_element_types(inferred: onnx.ModelProto, declared: dict[str, int]) -> None:
    """Refuse a set-aside entry whose element type is not the one inference found, as onnxruntime."""
    if not declared:
        return
    for g, where in walk_graphs(inferred.graph):
        for v in (*g.value_info, *g.output):
            want = declared.get(v.name)
            got = v.type.tensor_type.elem_type if v.type.HasField("tensor_type") else 0
            if want and got and want != got:
                name = onnx.TensorProto.DataType.Name
                raise Fail(f"value {v.name!r}{where} is declared {name(want)} in the model's value_info, but the node "
                           f"that computes it gives {name(got)} (onnxruntime: 'Type Error ... does not match expected "
                           "type'). Fix or remove that value_info entry.")
