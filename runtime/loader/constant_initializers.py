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
from typing import Any

import onnx
from onnx import AttributeProto, TensorProto, helper

from onnxhal.runtime.loader.node_checks import walk_graphs

#: value attribute -> (attribute type, the ai.onnx opset that introduced it, the field holding it)
_VALUES = {"value": (AttributeProto.TENSOR, 1, "t"), "value_float": (AttributeProto.FLOAT, 12, "f"),
           "value_floats": (AttributeProto.FLOATS, 12, "floats"), "value_int": (AttributeProto.INT, 12, "i"),
           "value_ints": (AttributeProto.INTS, 12, "ints"), "value_string": (AttributeProto.STRING, 12, "s"),
           "value_strings": (AttributeProto.STRINGS, 12, "strings")}
_FIELD = AttributeProto.DESCRIPTOR.fields_by_name
#: value attribute name -> (its type, the ai.onnx opset that introduced it, the descriptor of the
#: field holding its value): ``ListFields`` gives descriptors, which compare as themselves
_BY_NAME = {name: (kind, since, _FIELD[field]) for name, (kind, since, field) in _VALUES.items()}
_NAME, _TYPE, _DOC = _FIELD["name"], _FIELD["type"], _FIELD["doc_string"]


def _add_tensor(graph: onnx.GraphProto, kind: int, value: Any, name: str) -> None:
    """Append to ``graph``'s initializers the tensor a Constant's value attribute of type ``kind``
    holding ``value`` stands for, named ``name``: a tensor value is copied once, into its place
    (appending a message copies it)."""
    if kind == AttributeProto.TENSOR:
        t = graph.initializer.add()
        t.CopyFrom(value)
        t.name = name
        return
    if kind == AttributeProto.FLOAT:
        tensor = helper.make_tensor(name, TensorProto.FLOAT, [], [value])
    elif kind == AttributeProto.FLOATS:
        tensor = helper.make_tensor(name, TensorProto.FLOAT, [len(value)], value)
    elif kind == AttributeProto.INT:
        tensor = helper.make_tensor(name, TensorProto.INT64, [], [value])
    elif kind == AttributeProto.INTS:
        tensor = helper.make_tensor(name, TensorProto.INT64, [len(value)], value)
    elif kind == AttributeProto.STRING:
        tensor = helper.make_tensor(name, TensorProto.STRING, [], [value])
    else:
        tensor = helper.make_tensor(name, TensorProto.STRING, [len(value)], value)
    graph.initializer.append(tensor)


def _value(node: onnx.NodeProto, opset: int) -> tuple[int, Any] | None:
    """(type, value) of the value attribute of a Constant node with one named output (checked by
    the caller), if the node checks would pass it as it is (they run after: converted, it is not
    theirs to see): no input, domain "", one value attribute of its type at this opset holding only
    its value; None for any other."""
    attrs = node.attribute  # (each read of a field makes a new wrapper)
    if node.domain or len(attrs) != 1 or len(node.input):
        return None
    # One ListFields call reads all the attribute holds: its set fields in field-number order
    # (name 1, the value fields 2-9, doc_string 13, type 20, the rest above), so a convertible one
    # is exactly [name, its value field, type] or [name, its value field, doc_string, type].
    fields = attrs[0].ListFields()
    count = len(fields)
    if count != 3 and count != 4:
        return None
    (first, name), (value_field, value), (last, kind) = fields[0], fields[1], fields[-1]
    want = _BY_NAME.get(name) if first is _NAME else None
    if want is None or value_field is not want[2] or last is not _TYPE or kind != want[0] \
            or opset < want[1] or (count == 4 and fields[2][0] is not _DOC) \
            or (kind == AttributeProto.TENSOR and value.data_location == TensorProto.EXTERNAL):
        return None
    return kind, value


def _graphs(graph: onnx.GraphProto):
    # only control-flow nodes and other domains' nodes hold graphs: the rest's attributes need no reading
    return (g for g, _ in walk_graphs(graph))


def _convertible(graph: onnx.GraphProto, opset: int) -> list[tuple[int, str, int, Any]]:
    """(position, output, value type, value) of each of ``graph``'s Constant nodes to convert."""
    nodes = list(graph.node)  # each node's wrapper made once, in C, for the two loops below
    candidates = [(i, n) for i, n in enumerate(nodes) if n.op_type == "Constant"]
    if not candidates:
        return []
    written: list[str] = []
    for n in nodes:
        written += n.output[:]  # one slice per node (a list made in C), counted in C after
    outputs = Counter(written)
    taken = {o.name for o in graph.output} | {i.name for i in graph.input} | {t.name for t in graph.initializer} \
        | {t.values.name for t in graph.sparse_initializer}
    found = []
    for i, n in candidates:
        outs = n.output
        out = outs[0] if len(outs) == 1 else ""
        if out and outputs[out] == 1 and out not in taken:
            value = _value(n, opset)
            if value is not None:
                found.append((i, out, *value))
    return found


def constants_to_initializers(proto: onnx.ModelProto, owned: bool) -> onnx.ModelProto:
    """The model with its Constant nodes (main graph and subgraphs) as initializers; ``proto`` is
    changed in place if ``owned``, else copied first. Models of IR version < 4, whose initializers
    are graph inputs too, are left as they are."""
    if proto.ir_version < 4:
        return proto
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    if not owned:
        if not any(_convertible(g, opset) for g in _graphs(proto.graph)):
            return proto
        copy = onnx.ModelProto()
        copy.CopyFrom(proto)
        proto = copy
    for graph in reversed(list(_graphs(proto.graph))):  # subgraphs before the graphs holding them
        found = _convertible(graph, opset)
        for _, out, kind, value in found:
            _add_tensor(graph, kind, value, out)
        nodes = graph.node
        for i, *_ in reversed(found):
            del nodes[i]
    return proto
