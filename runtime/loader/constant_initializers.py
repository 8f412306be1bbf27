"""Constant nodes become initializers at load, as onnxruntime's graph makes them
(onnxruntime/core/graph/graph.cc, the Graph constructor: each Constant node's value becomes an
initializer named for its output, and the node is dropped). Exporters write weights, shapes and
scalars as Constant nodes (a TorchScript MobileNet has hundreds): as nodes, every later stage of
the load (shape inference, the graph built, the checks) and the optimizer's folding paid for each
of them, once per session.

It runs before the node checks (which cost as much per Constant as per any other node), so it
converts only Constants those checks would pass: one output, no input, domain "", exactly one value
attribute of the type it must have, allowed at the model's opset, holding nothing else; the rest
stay nodes, for the checks to refuse or the Constant kernel to run as before. A Constant whose output is a graph output stays a node (a
graph output is produced by a node), and so does one whose name an input, an initializer or another
node already has (the graph checks name that conflict).
"""

from __future__ import annotations

from collections import Counter

import onnx
from onnx import AttributeProto, TensorProto, helper

from onnxhal.runtime.loader.node_checks import walk_graphs

#: value attribute -> (attribute type, the ai.onnx opset that introduced it, the field holding it)
_VALUES = {"value": (AttributeProto.TENSOR, 1, "t"), "value_float": (AttributeProto.FLOAT, 12, "f"),
           "value_floats": (AttributeProto.FLOATS, 12, "floats"), "value_int": (AttributeProto.INT, 12, "i"),
           "value_ints": (AttributeProto.INTS, 12, "ints"), "value_string": (AttributeProto.STRING, 12, "s"),
           "value_strings": (AttributeProto.STRINGS, 12, "strings")}
#: AttributeProto fields a convertible value attribute may set besides its value's
_PLAIN_FIELDS = frozenset({"name", "type", "doc_string"})
#: per value attribute, (the descriptor of the field holding its value, the descriptors of the fields
#: it may set): ``ListFields`` gives descriptors, which compare as themselves, where reading each
#: one's name is a Python call per field of each of a model's hundreds of Constants
_FIELDS = {name: (AttributeProto.DESCRIPTOR.fields_by_name[field],
                  frozenset(AttributeProto.DESCRIPTOR.fields_by_name[f] for f in _PLAIN_FIELDS | {field}))
           for name, (_, _, field) in _VALUES.items()}


def _add_tensor(graph: onnx.GraphProto, attr: AttributeProto, name: str) -> None:
    """Append to ``graph``'s initializers the tensor a Constant's value attribute stands for,
    named ``name``: a tensor value is copied once, into its place (appending a message copies it)."""
    if attr.type == AttributeProto.TENSOR:
        t = graph.initializer.add()
        t.CopyFrom(attr.t)
        t.name = name
        return
    graph.initializer.append(_as_tensor(attr, name))


def _as_tensor(attr: AttributeProto, name: str) -> TensorProto:
    """The tensor a Constant's value attribute stands for, named ``name``."""
    if attr.type == AttributeProto.TENSOR:
        t = TensorProto()
        t.CopyFrom(attr.t)
        t.name = name
        return t
    if attr.type == AttributeProto.FLOAT:
        return helper.make_tensor(name, TensorProto.FLOAT, [], [attr.f])
    if attr.type == AttributeProto.FLOATS:
        return helper.make_tensor(name, TensorProto.FLOAT, [len(attr.floats)], attr.floats)
    if attr.type == AttributeProto.INT:
        return helper.make_tensor(name, TensorProto.INT64, [], [attr.i])
    if attr.type == AttributeProto.INTS:
        return helper.make_tensor(name, TensorProto.INT64, [len(attr.ints)], attr.ints)
    if attr.type == AttributeProto.STRING:
        return helper.make_tensor(name, TensorProto.STRING, [], [attr.s])
    return helper.make_tensor(name, TensorProto.STRING, [len(attr.strings)], attr.strings)


def _convertible(node: onnx.NodeProto, opset: int) -> bool:
    """A Constant the node checks would pass as it is (they run after: converted, it is not theirs
    to see): one output, no input, domain "", one value attribute of its type at this opset holding
    only its value."""
    attrs, outputs = node.attribute, node.output  # (each read of a field makes a new wrapper)
    if node.op_type != "Constant" or node.domain or len(attrs) != 1 \
            or len(outputs) != 1 or not outputs[0] or len(node.input):
        return False
    attr = attrs[0]
    name = attr.name
    want = _VALUES.get(name)
    if want is None or attr.type != want[0] or opset < want[1]:
        return False
    value_field, allowed = _FIELDS[name]
    fields = [fd for fd, _ in attr.ListFields()]
    if value_field not in fields or not allowed.issuperset(fields):
        return False
    return not (attr.type == AttributeProto.TENSOR and attr.t.data_location == TensorProto.EXTERNAL)


def _graphs(graph: onnx.GraphProto):
    # only control-flow nodes and other domains' nodes hold graphs: the rest's attributes need no reading
    return (g for g, _ in walk_graphs(graph))


def _positions(graph: onnx.GraphProto, opset: int) -> list[int]:
    candidates = [i for i, n in enumerate(graph.node) if n.op_type == "Constant"]
    if not candidates:
        return []
    written: list[str] = []
    for n in graph.node:
        written += n.output[:]  # one slice per node (a list made in C), counted in C after
    outputs = Counter(written)
    taken = {o.name for o in graph.output} | {i.name for i in graph.input} | {t.name for t in graph.initializer} \
        | {t.values.name for t in graph.sparse_initializer}
    nodes = graph.node
    return [i for i in candidates
            if _convertible(nodes[i], opset) and nodes[i].output[0] not in taken and outputs[nodes[i].output[0]] == 1]


def constants_to_initializers(proto: onnx.ModelProto, owned: bool) -> onnx.ModelProto:
    """The model with its Constant nodes (main graph and subgraphs) as initializers; ``proto`` is
    changed in place if ``owned``, else copied first. Models of IR version < 4, whose initializers
    are graph inputs too, are left as they are."""
    if proto.ir_version < 4:
        return proto
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    if not owned:
        if not any(_positions(g, opset) for g in _graphs(proto.graph)):
            return proto
        copy = onnx.ModelProto()
        copy.CopyFrom(proto)
        proto = copy
    for graph in reversed(list(_graphs(proto.graph))):  # subgraphs before the graphs holding them
        positions = _positions(graph, opset)
        nodes = graph.node
        for i in positions:
            node = nodes[i]
            _add_tensor(graph, node.attribute[0], node.output[0])
        for i in reversed(positions):
            del graph.node[i]
    return proto
