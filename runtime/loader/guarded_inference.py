"""ONNX shape inference, called only on what it can take.

onnx's C++ inference cannot be interrupted and has no bounds checks in places, so the loader
(``model_loader.load_model``) calls it through ``infer`` here, after ``node_checks.check_nodes``:

- a first pass without data propagation, on a copy where every LayerNormalization with a
  non-negative ``axis`` has only its first output (its inference reads ``axis`` dimensions of the
  input for the Mean output without checking the rank: ``axis=2**31`` is SIGSEGV). What it finds
  gives the ranks and dimensions the checks below need. It is skipped where the model has no such
  LayerNormalization (one with a negative axis, or with its first output alone, is safe) and no
  node data propagation would visit (a tree ensemble, a linear model):
  it would find nothing there; and where no node's inference may read a value data propagation
  computes (every node reads its inputs' types and shapes only, ``VALUE_BLIND``: a CNN of
  convolutions, pools and elementwise ops; or the others read the outputs of propagating nodes only
  as data, ``DATA_FIRST``: a Shape-Gather-Add chain into a Reshape's data, a Cast before a
  ZipMap), where the real pass runs without data propagation, which could find nothing either;
- an unsafe LayerNormalization's ``axis`` checked against the rank that pass found;
- the real pass, strict first as onnxruntime refuses what strict inference rejects. Data
  propagation runs only where no 1-D value a propagating node reads (Shape, Gather, Mul, ...: an
  operator with a data-propagation function, or one inferred through its function body) is longer
  than ``DATA_PROP_MAX_LENGTH``: its cost is linear in such a length (0.9 s at 10 million, for ever
  at 2**40, holding the GIL), and a shape tensor, the only thing it computes, is never that long.
  A long value only other nodes read costs it nothing. Where a LayerNormalization's input rank is
  unknown after the first pass, data propagation is off too, so that the real pass does not learn a
  rank the first one could not check.

``check_inferred``, run by the loader on the inferred model once strict inference's own errors are
reported, refuses an ``axis`` beyond its input's rank (LayerNormalization, Split, ...) and a Conv
``kernel_shape`` other than its weight's spatial shape, as onnxruntime does (onnxhal ran them, the
first returning zeros, the second ignoring the attribute), and a Loop or Scan input whose element
type is not the one its body declares (the body's kernels met it at run: "unsupported operand
type(s) for +: 'float' and 'str'").
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import onnx
import onnx.onnx_cpp2py_export.shape_inference as onnx_cpp
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from onnxhal.hal import Graph
from onnxhal.hal.errors import InvalidGraph
from onnxhal.runtime.loader.node_checks import STANDARD_DOMAINS, flat_model, node_label, walk_graphs

#: Longest 1-D value (elements) for which shape inference propagates data.
DATA_PROP_MAX_LENGTH = 1 << 16


def _value_shapes(values, wanted: set[str] | None) -> dict[str, list[int | None] | None]:
    found: dict[str, list[int | None] | None] = {}
    for v in values:
        if wanted is not None and v.name not in wanted:
            continue
        tt = v.type.tensor_type
        if not v.type.HasField("tensor_type") or not tt.HasField("shape"):
            found.setdefault(v.name, None)
            continue
        # a negative dim_value (-1 from some converters) is free, as in onnxruntime
        found[v.name] = [d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else None for d in tt.shape.dim]
    return found


def _shapes(proto: onnx.ModelProto, wanted: set[str] | None = None) -> dict[str, list[int | None] | None]:
    """value name -> dims (None where symbolic or unknown; None for an unknown rank), over every
    graph of the model; only the ``wanted`` names where given (the checks read a few inputs' shapes,
    and a model has thousands of values)."""
    found: dict[str, list[int | None] | None] = {}
    for g, _ in walk_graphs(proto.graph):
        for t in g.initializer:
            if wanted is None or t.name in wanted:
                found[t.name] = t.dims[:]
        for name, dims in _value_shapes((*g.input, *g.value_info, *g.output), wanted).items():
            if dims is not None or name not in found:
                found[name] = dims
    return found


def _probe_facts(proto: onnx.ModelProto, wanted: set[str], reads: set[str],
                 values: tuple | None = None) -> tuple[bool, dict[str, list[int | None] | None]]:
    """(whether a value data propagation reads, one of ``reads``, is 1-D and longer than
    DATA_PROP_MAX_LENGTH, ``_shapes`` of the ``wanted`` names): one pass that builds no dims list for
    the values nobody asked about. ``values``: the main graph's inferred (outputs, value_info) where
    they were read apart from ``proto`` (``_graph_values``)."""
    long_1d = False
    for k, (g, _) in enumerate(walk_graphs(proto.graph)):
        for t in g.initializer:
            # the name first: a scalar's dims read on a message made for this pass is a protobuf
            # free (node_checks.flat_model_walks says why that counts), and few names are read
            if t.name in reads and len(t.dims) == 1 and t.dims[0] > DATA_PROP_MAX_LENGTH:
                long_1d = True
        lists = (g.input, g.value_info, g.output) if values is None or k else (g.input, *values)
        for vs in lists:
            for v in vs:
                if v.name in reads:
                    dims = v.type.tensor_type.shape.dim
                    if len(dims) == 1 and dims[0].dim_value > DATA_PROP_MAX_LENGTH:
                        long_1d = True
    if not wanted:
        return long_1d, {}
    shapes = _shapes(proto, wanted)
    if values is not None:
        shapes.update(_value_shapes([v for vs in values for v in vs], wanted))
    return long_1d, shapes


def _layer_norms(proto: onnx.ModelProto) -> Iterator[tuple[onnx.NodeProto, str]]:
    for g, where in walk_graphs(proto.graph):
        for n in g.node:
            if n.op_type == "LayerNormalization" and n.domain in ("", "ai.onnx"):
                yield n, where


def _axis(node: onnx.NodeProto, default: int) -> int:
    return next((a.i for a in node.attribute if a.name == "axis"), default)


def _unsafe_layer_norm(node: onnx.NodeProto) -> bool:
    return len(node.output) > 1 and _axis(node, -1) >= 0


def _probe_copy(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The model with each unsafe LayerNormalization cut to its first output."""
    if not any(_unsafe_layer_norm(n) for n, _ in _layer_norms(proto)):
        return proto
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    for n, _ in _layer_norms(copy):
        if _unsafe_layer_norm(n):
            del n.output[1:]
    return copy


#: Operators whose ``axis`` attribute indexes the axes of their first input: op -> how far past the
#: last axis it may point (Flatten's axis r puts every axis in the first dimension).
AXIS_OPS = {"Split": 0, "Concat": 0, "Softmax": 0, "LogSoftmax": 0, "Hardmax": 0, "Flatten": 1, "Gather": 0,
            "GatherElements": 0, "ScatterElements": 0, "ArgMax": 0, "ArgMin": 0, "LayerNormalization": 0,
            "TopK": 0, "LpNormalization": 0, "Compress": 0, "SplitToSequence": 0}


#: Recurrent operators: gates per hidden unit, the rows of W per hidden_size.
_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
_CHECKED_OPS = frozenset({"Conv", "If", "Loop", "Scan", *_GATES})
#: The ops ``check_inferred`` reads (the op type first: most nodes are none of them).
_SHAPE_CHECKED_OPS = frozenset(AXIS_OPS) | _CHECKED_OPS
#: How many of a checked op's first inputs ``check_inferred`` reads the dims of (3 where not named).
_READS = {**{op: 1 for op in AXIS_OPS}, "Conv": 2}
#: Control-flow inputs of a fixed element type: (op, input index) -> type.
_CONTROL_TYPES = {("If", 0): onnx.TensorProto.BOOL, ("Loop", 0): onnx.TensorProto.INT64,
                  ("Loop", 1): onnx.TensorProto.BOOL}


def _graph_shapes(graph: Graph, wanted: set[str]) -> dict[str, list[int | None] | None]:
    """``_shapes`` of the ``wanted`` names, read from the Graph the loader built of the inferred
    model's main graph (its value infos parse each type once, and are found by name: ``_shapes``
    reads the name of every value and initializer of the model to find a few). A symbolic or
    negative dim is None, as both read it for the checks."""
    found: dict[str, list[int | None] | None] = {}
    values = graph.value_infos
    for name in wanted:
        vi = values.get(name)
        shape = vi.shape if vi is not None else None
        if shape is None and name in graph.initializers:
            shape = graph.initializers[name].shape
        found[name] = None if shape is None else [d if isinstance(d, int) else None for d in shape]
    return found


#: What ``check_inferred`` reads of a node (from its NodeProto, or from the Graph's Node): the node
#: (named in messages by ``node_label``), its op type, inputs, attributes by name and where it is.
_Checked = tuple[Any, str, Sequence[str], Mapping[str, onnx.AttributeProto], str]


def _checked_nodes(proto: onnx.ModelProto, graph: Graph | None) -> list[_Checked]:
    """The nodes of the ops ``check_inferred`` checks: the Graph's where it is given and the model
    has no other graph (its nodes' op types are slots, where each NodeProto read makes a wrapper and
    decodes its strings: this filter read every node of the model), else the proto's."""
    if graph is not None and flat_model():
        return [(n, n.op_type, n.inputs, n.attribute_protos, "") for n in graph.nodes
                if n.op_type in _SHAPE_CHECKED_OPS and not n.domain and n.inputs]
    return [(n, n.op_type, n.input[:], {a.name: a for a in n.attribute}, where)
            for g, where in walk_graphs(proto.graph) for n in g.node
            if n.op_type in _SHAPE_CHECKED_OPS and n.domain in ("", "ai.onnx") and n.input]


def check_inferred(proto: onnx.ModelProto, graph: Graph | None = None) -> None:
    """Attribute values that must fit an input's rank or shape, where inference found it (``proto``
    is the inferred model). onnx's inference checks some (not LayerNormalization's axis beyond the
    rank, and an axis beyond 32 bits wraps around in some of its checks); onnxruntime refuses each.
    ``graph``: the Graph built from ``proto``'s main graph, where the caller has it (its nodes and
    shapes are read there where the model has no other graph)."""
    nodes = _checked_nodes(proto, graph)
    if not nodes:
        return
    # only the inputs each check below reads: an axis op's first, a Conv's first two, a recurrent
    # op's weights (its first three); a model's Concats have many more, whose dims no check needs
    wanted = {i for _, op, inputs, _, _ in nodes for i in inputs[:_READS.get(op, 3)] if i}
    shapes = _graph_shapes(graph, wanted) if graph is not None and flat_model() else _shapes(proto, wanted)
    if any(n[1] in ("If", "Loop", "Scan") for n in nodes):
        _check_body_input_types(proto)
    for node, op, inputs, attrs, where in nodes:
        if op in AXIS_OPS and "axis" in attrs and attrs["axis"].type == onnx.AttributeProto.INT:
            dims = shapes.get(inputs[0])
            axis = attrs["axis"].i
            r = len(dims) if dims is not None else None
            if r is not None and not -r <= axis < r + AXIS_OPS[op]:
                raise InvalidGraph(f"{node_label(node)}{where}: axis={axis} but its input {inputs[0]!r} has rank "
                                   f"{r}; axis must be in [{-r}, {r - 1 + AXIS_OPS[op]}].")
        elif op in _GATES and len(inputs) > 1:
            w = shapes.get(inputs[1])
            h = attrs["hidden_size"].i if "hidden_size" in attrs else None
            if w is not None and len(w) == 3 and h is not None and w[1] is not None and w[1] != _GATES[op] * h:
                raise InvalidGraph(f"{node_label(node)}{where}: hidden_size={h} but its weight {inputs[1]!r} has shape "
                                   f"{w}; W is [directions, {_GATES[op]} * hidden_size, input_size].")
            r = shapes.get(inputs[2]) if len(inputs) > 2 and inputs[2] else None
            want = [w[0] if w else None, _GATES[op] * h if h else None, h]
            if r is not None and (len(r) != 3 or any(a is not None and b is not None and a != b for a, b in zip(r, want))):
                raise InvalidGraph(f"{node_label(node)}{where}: its recurrence weight {inputs[2]!r} has shape {r}; R is "
                                   f"[directions, {_GATES[op]} * hidden_size, hidden_size] = {want}.")
        elif op == "Conv" and len(inputs) > 1:
            ks = list(attrs["kernel_shape"].ints) if "kernel_shape" in attrs else None
            w = shapes.get(inputs[1])
            x = shapes.get(inputs[0])
            # onnx's inference skips this check where kernel_shape is given; onnxruntime's kernel
            # refuses it ("X num_dims does not match W num_dims").
            if x is not None and w is not None and len(x) != len(w):
                raise InvalidGraph(f"{node_label(node)}{where}: its input {inputs[0]!r} has rank {len(x)} and its "
                                   f"weight {inputs[1]!r} has shape {w}; W must have X's rank [M, C/group, "
                                   "kernel...]. Check the order of the Conv's inputs.")
            if ks is None or w is None or len(w) < 2 or None in w[2:]:
                continue
            if ks != w[2:]:
                raise InvalidGraph(f"{node_label(node)}{where}: kernel_shape={ks} but its weight {inputs[1]!r} "
                                   f"has shape {w}, whose spatial dimensions are {w[2:]}; make kernel_shape "
                                   "equal to them, or leave it out.")


def _int_attribute(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((a.i for a in node.attribute if a.name == name), default)


def _elem_types(proto: onnx.ModelProto) -> dict[str, int]:
    found: dict[str, int] = {}
    for g, _ in walk_graphs(proto.graph):
        for t in g.initializer:
            found[t.name] = t.data_type
        for v in (*g.input, *g.value_info, *g.output):
            if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type:
                found[v.name] = v.type.tensor_type.elem_type
    return found


def _check_body_input_types(proto: onnx.ModelProto) -> None:
    types = _elem_types(proto)
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    for g, where in walk_graphs(proto.graph):
        for n in g.node:
            if n.domain not in ("", "ai.onnx") or n.op_type not in ("If", "Loop", "Scan"):
                continue
            for k, name in enumerate(n.input):
                want = _CONTROL_TYPES.get((n.op_type, k))
                got = types.get(name, 0) if name else 0
                if want and got and got != want:  # onnx's inference skips it when a body has errors of its own
                    raise InvalidGraph(f"{node_label(n)}{where}: input {name!r} is "
                                       f"{onnx.TensorProto.DataType.Name(got)}; {n.op_type} takes it as "
                                       f"{onnx.TensorProto.DataType.Name(want)}.")
            if n.op_type == "If":
                continue
            body = next((a.g for a in n.attribute if a.name == "body" and a.type == onnx.AttributeProto.GRAPH), None)
            if body is None:
                continue
            # Loop: (M, cond, carried...) -> body (iteration, cond, carried...); Scan 9+: inputs in order;
            # Scan 8: (sequence_lens, inputs...) -> body (inputs...).
            if n.op_type == "Loop":
                pairs = list(zip(n.input, body.input))[2:]
            else:
                pairs = list(zip(n.input[1:] if opset < 9 else n.input, body.input))
            for outer, inner in pairs:
                want = inner.type.tensor_type.elem_type if inner.type.HasField("tensor_type") else 0
                got = types.get(outer, 0)
                if outer and want and got and want != got:
                    raise InvalidGraph(
                        f"{node_label(n)}{where}: input {outer!r} is {onnx.TensorProto.DataType.Name(got)} but its body "
                        f"takes it as {inner.name!r}, {onnx.TensorProto.DataType.Name(want)}; make the types agree.")


#: Initializers with more elements than this go to inference without their data: it needs their
#: types and dims only (it reads values of small, shape-like ones), and serializing the weights
#: into onnx's C++ and parsing them back is nearly all of a pass's time on a model with weights.
STUB_MIN_ELEMENTS = 64
#: Except 1-D (or scalar) int32/int64 ones, of any length: onnx's data propagation parses them as
#: shape data (a Gather on an index table feeding a Reshape: hummingbird's tree traversal, TF's G2P
#: models) and rejects an emptied one ("Data size mismatch"), where onnxruntime loads the model.
_DATA_PROP_TYPES = frozenset({onnx.TensorProto.INT32, onnx.TensorProto.INT64})
_DATA_FIELDS = ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data")


def _elements(t: onnx.TensorProto) -> int:
    n = 1
    for d in t.dims[:]:  # one slice (a list made in C), not the field iterated
        n *= max(d, 0)
    return n


def stubbed(t: onnx.TensorProto) -> bool:
    """Whether ``_weightless`` leaves ``t`` without its data."""
    return (_elements(t) > STUB_MIN_ELEMENTS and t.data_location != onnx.TensorProto.EXTERNAL
            and not (t.data_type in _DATA_PROP_TYPES and len(t.dims) <= 1))


def _reads(node: onnx.NodeProto) -> set[str]:
    """The names a node reads: its inputs, and every input of the nodes of its subgraphs (a superset of
    what they read from outside, enough to order the nodes)."""
    names = {i for i in node.input if i}
    for a in node.attribute:
        for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
            for n in g.node:
                names |= _reads(n)
    return names


def _in_order(graph: onnx.GraphProto) -> bool:
    """Whether no node reads a value a later node writes (the common case, checked in one pass): a
    name a node reads that neither the graph's inputs and initializers nor the nodes so far (itself
    included) define is set aside, and the graph is out of order if a node writes one of those.
    Each node's names are read once; a set test per node, in C, clears the usual node."""
    seen = {"", *(t.name for t in graph.initializer), *(v.name for v in graph.input),
            *(st.values.name for st in graph.sparse_initializer)}
    ahead: set[str] = set()  # read before any node of this graph wrote it: outer scope, undefined, or later
    for n in graph.node:
        seen.update(n.output)
        # only a node that can hold a graph (as ``walk_graphs``) reads more than its inputs
        holder = n.op_type in _GRAPH_HOLDERS or n.domain not in STANDARD_DOMAINS
        reads = _reads(n) if holder and n.attribute else n.input
        if not seen.issuperset(reads):
            ahead.update(r for r in reads if r not in seen)
    return ahead.isdisjoint(seen)


def _topological(graph: onnx.GraphProto) -> list[onnx.NodeProto] | None:
    """The graph's nodes in an order where each comes after the nodes it reads from, or None if they
    already are (or form a cycle, which the loader reports). onnx's inference reads the nodes in the
    order given and infers nothing for a node whose inputs it has not met yet, so the checks it
    makes were skipped for such a node (ReduceL2 axes beyond the rank ran); onnxruntime sorts first."""
    if _in_order(graph):
        return None
    producer = {o: k for k, n in enumerate(graph.node) for o in n.output if o}
    deps = [{producer[r] for r in _reads(n) if r in producer and producer[r] != k} for k, n in enumerate(graph.node)]
    order, done, pending = [], set(), list(range(len(deps)))
    while pending:
        ready = [k for k in pending if deps[k] <= done]
        if not ready:
            return None
        order += ready
        done.update(ready)
        pending = [k for k in pending if k not in done]
    return [graph.node[k] for k in order]


def _weightless(proto: onnx.ModelProto, strip: bool = True, reshaped: tuple[bool, bool, bool] | None = None,
                graphs: list[onnx.GraphProto] | None = None) -> onnx.ModelProto:
    """A copy of the model whose large initializers keep their types and dims but no data (unless
    not ``strip``; ``stubbed`` says which), whose
    nodes and opset imports in domain "ai.onnx" say "" (onnx's inference finds no opset for
    "ai.onnx" and infers nothing for such a node; onnxruntime takes both names as one), and whose IR
    version is at least 4, as onnxruntime type-checks such a model's nodes too, and whose nodes are
    in topological order."""
    graphs = [g for g, _ in walk_graphs(proto.graph)] if graphs is None else graphs
    big = strip and any(stubbed(t) for g in graphs for t in g.initializer)
    reshaped = _reshaped(proto, graphs) if reshaped is None else reshaped  # (``infer`` knows it already)
    spelled, old_ir, unsorted = reshaped
    if not big and not any(reshaped):
        return proto
    stub = onnx.ModelProto()
    stub.CopyFrom(proto)
    for g, _ in walk_graphs(stub.graph):
        order = _topological(g) if unsorted else None
        if order is not None:
            copies = [onnx.NodeProto() for _ in order]
            for c, n in zip(copies, order):
                c.CopyFrom(n)
            del g.node[:]
            g.node.extend(copies)
    if old_ir:  # below IR 4 onnx's inference reads no type from an initializer that is not also an input
        stub.ir_version = _IR_4_VERSION
    for g, _ in walk_graphs(stub.graph):
        if big:
            for t in g.initializer:
                if stubbed(t):
                    for f in _DATA_FIELDS:
                        t.ClearField(f)
        if spelled:  # the copy's nodes are read (made) only where one needs renaming
            for n in g.node:
                if n.domain == "ai.onnx":
                    n.domain = ""
    for o in stub.opset_import:
        if o.domain == "ai.onnx":
            o.domain = ""
    return stub


def _reshaped(proto: onnx.ModelProto, graphs: list[onnx.GraphProto]) -> tuple[bool, bool, bool]:
    """What ``_weightless`` changes in its copy besides weights: (a node or opset import says
    "ai.onnx", the IR version is below 4, a graph's nodes are out of order)."""
    spelled = any(o.domain == "ai.onnx" for o in proto.opset_import) or any(
        n.domain == "ai.onnx" for g in graphs for n in g.node)
    return spelled, proto.ir_version < 4, not all(_in_order(g) for g in graphs)


@functools.cache
def _graph_values() -> type | None:
    """A message class that reads, of a serialized ModelProto, only its graph's outputs and
    value_info (onnx's field numbers: ModelProto.graph 7, GraphProto.output 12, .value_info 13);
    the rest it keeps as unread bytes. Shape inference returns the whole model, and parsing it
    whole again (every attribute value, every weight) was as costly as the inference itself on a
    tree ensemble. Built in a descriptor pool of its own; None where it cannot be (the whole
    inferred model is parsed then)."""
    field = descriptor_pb2.FieldDescriptorProto
    name = "onnxhal_inferred_values"
    try:
        onnx_file = descriptor_pb2.FileDescriptorProto()
        onnx.ModelProto.DESCRIPTOR.file.CopyToProto(onnx_file)
        value_info = f".{onnx.ValueInfoProto.DESCRIPTOR.full_name}"
        fdp = descriptor_pb2.FileDescriptorProto(name=f"{name}.proto", package=name, syntax="proto2",
                                                 dependency=[onnx_file.name])
        graph = fdp.message_type.add(name="Graph")
        graph.field.add(name="output", number=12, label=field.LABEL_REPEATED, type=field.TYPE_MESSAGE,
                        type_name=value_info)
        graph.field.add(name="value_info", number=13, label=field.LABEL_REPEATED, type=field.TYPE_MESSAGE,
                        type_name=value_info)
        model = fdp.message_type.add(name="Model")
        model.field.add(name="graph", number=7, label=field.LABEL_OPTIONAL, type=field.TYPE_MESSAGE,
                        type_name=f".{name}.Graph")
        pool = descriptor_pool.DescriptorPool()
        pool.Add(onnx_file)
        pool.Add(fdp)
        reader = message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{name}.Model"))
        _keep_message_classes(reader.DESCRIPTOR)
        return reader
    except Exception:  # noqa: BLE001 - a protobuf or onnx this cannot mirror: the whole model is parsed
        return None


#: The classes of every message type ``_graph_values``'s reader reaches, held for the process. The
#: protobuf runtime (upb) makes a nested message's class at its first use and keeps it only while
#: a message of it lives: each session's parse made the six classes its values read (Graph,
#: ValueInfoProto, TypeProto, ...) again, and dropped them as reference cycles for the collector.
_MESSAGE_CLASSES: list[type] = []


def _keep_message_classes(descriptor: Any) -> None:
    """Make and hold the class of ``descriptor`` and of every message type its fields reach."""
    seen: set[str] = set()
    pending = [descriptor]
    while pending:
        d = pending.pop()
        if d.full_name in seen:
            continue
        seen.add(d.full_name)
        _MESSAGE_CLASSES.append(message_factory.GetMessageClass(d))
        pending.extend(f.message_type for f in d.fields if f.message_type is not None)


def _infer_values(stub: bytes, target: onnx.ModelProto, data_prop: bool) -> None:
    """Strict inference of the serialized ``stub``, its graph outputs and value_info put in
    ``target`` (the model the stub was made from, whose graph alone it is: no subgraph, whose
    value_info inference would fill as well)."""
    inferred = onnx_cpp.infer_shapes(stub, True, True, data_prop)
    reader = _graph_values()
    g = target.graph
    if reader is None:  # the values from the whole model, parsed
        whole = onnx.ModelProto.FromString(inferred).graph
        g.ClearField("output")
        g.ClearField("value_info")
        g.output.extend(whole.output)
        g.value_info.extend(whole.value_info)
        return
    values = reader.FromString(inferred)
    values.DiscardUnknownFields()
    g.ClearField("output")
    g.ClearField("value_info")
    g.MergeFromString(values.graph.SerializeToString())


def _stripped(stub: onnx.ModelProto) -> bool:
    """Whether ``_weightless`` emptied an initializer of ``stub`` (it keeps the dims, drops the data)."""
    return any(stubbed(t) and not any(len(getattr(t, f)) for f in _DATA_FIELDS)
               for g, _ in walk_graphs(stub.graph) for t in g.initializer)


#: The standard operators that hold subgraphs.
_GRAPH_HOLDERS = frozenset({"If", "Loop", "Scan", "SequenceMap"})


def _graph_pairs(inferred: onnx.GraphProto, original: onnx.GraphProto) -> Iterator[tuple[onnx.GraphProto,
                                                                                         onnx.GraphProto]]:
    """Each graph of the inferred copy with its original, matched through the nodes' outputs (the
    copy's nodes may be in another order)."""
    yield inferred, original
    # Only a control-flow node or a node of another domain holds a graph (as ``walk_graphs``):
    # the others' outputs and attributes need no reading.
    holders = [n for n in inferred.node if n.op_type in _GRAPH_HOLDERS or n.domain not in STANDARD_DOMAINS]
    if not holders:
        return
    by_outputs = {tuple(n.output): n for n in original.node}
    for n in holders:
        twin = by_outputs.get(tuple(n.output))
        if twin is None:
            continue
        attrs = {a.name: a for a in twin.attribute}
        for a in n.attribute:
            b = attrs.get(a.name)
            if b is None:
                continue
            if a.type == onnx.AttributeProto.GRAPH and b.type == a.type:
                yield from _graph_pairs(a.g, b.g)
            for g_inf, g in zip(a.graphs, b.graphs):
                yield from _graph_pairs(g_inf, g)


def _with_weights(inferred: onnx.ModelProto, proto: onnx.ModelProto, stub: onnx.ModelProto) -> onnx.ModelProto:
    """The inferred model with the initializers ``_weightless`` emptied (in ``stub``) given back their
    data."""
    if inferred is proto or stub is proto or not _stripped(stub):
        return inferred
    for g_inf, g in _graph_pairs(inferred.graph, proto.graph):
        full = {t.name: t for t in g.initializer}
        for t in g_inf.initializer:
            if t.name in full and stubbed(t):
                t.CopyFrom(full[t.name])
    return inferred


@functools.lru_cache(maxsize=4096)
def may_propagate(op_type: str, domain: str, version: int) -> bool:
    """Whether onnx's data propagation may run for this operator at this opset: it has a
    propagation function, or no inference function of its own and a function body (onnx then
    infers through the body, whose nodes may propagate). An operator onnx does not know, or with
    neither an inference function nor a body (ai.onnx.ml's Scaler, LinearRegressor and the opset-1
    tree ensembles), is skipped: inference leaves it as it is."""
    try:
        schema = onnx.defs.get_schema(op_type, version, domain)
    except Exception:  # not an onnx operator (or older than its first version): inference skips it
        return False
    return schema.has_data_propagation_function or _inferred_through_body(op_type, domain, version)


@functools.lru_cache(maxsize=4096)
def _inferred_through_body(op_type: str, domain: str, version: int) -> bool:
    """Whether onnx infers this operator through its function body (no inference function of its
    own): the body's nodes may read shapes that data propagation computes inside it."""
    try:
        schema = onnx.defs.get_schema(op_type, version, domain)
    except Exception:  # not an onnx operator: inference skips it
        return False
    return not schema.has_type_and_shape_inference_function and (
        schema.has_function or schema.has_context_dependent_function)


@dataclass
class NodeScan:
    """What ``infer`` needs to know of a model's nodes, read in one pass over them (each access to
    a node's names decodes them anew: the passes this replaces were a third of the load). It reads
    the nodes, initializers, graph inputs' names, opset imports, IR version and functions, never
    the value_info or the types inference fills in: a scan stays valid for its model across
    inference passes (``ml_shapes.with_ml_shapes`` infers again after typing outputs)."""

    graphs: list[onnx.GraphProto]
    norms: list[tuple[onnx.NodeProto, str]]  # the LayerNormalization nodes, with where they are
    propagating: bool  # a node data propagation may visit (``may_propagate``)
    reads: set[str]  # the values such nodes read
    shape_data_read: bool  # a node's inference may read what data propagation computes (``DATA_FIRST``)
    reshaped: tuple[bool, bool, bool]  # as ``_reshaped``


def _node_kind(op: str, raw_domain: str, opset: dict[str, int]) -> tuple[str, bool, bool, bool, bool, int]:
    """What ``scan_nodes`` reads of a node of this op type and domain: (its domain, "ai.onnx" as "";
    whether it may hold a graph; whether it is a LayerNormalization; whether data propagation may
    visit it; whether it is also inferred through its body and not ``VALUE_BLIND``; from which input
    on its inference may read values, -1 for none)."""
    domain = "" if raw_domain == "ai.onnx" else raw_domain
    version = opset.get(domain, 0)
    blind = op in VALUE_BLIND if not domain else domain == ML_DOMAIN
    propagates = may_propagate(op, domain, version)
    via_body = propagates and not blind and _inferred_through_body(op, domain, version)
    values_from = -1 if blind else 1 if not domain and op in DATA_FIRST else 0
    return (domain, op in _GRAPH_HOLDERS or domain not in STANDARD_DOMAINS, op == "LayerNormalization" and not domain,
            propagates, via_body, values_from)


def scan_nodes(proto: onnx.ModelProto) -> NodeScan:
    opset = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in proto.opset_import}
    graphs, norms, reads = [], [], set()
    propagating = False
    carriers: set[str] = set()  # outputs of nodes data propagation may visit: what may hold its values
    values_read: set[str] = set()  # the inputs of nodes whose inference may read such a value, less data inputs
    through_body = False  # a node inferred through its function body, other than a ``VALUE_BLIND`` one
    spelled = any(o.domain == "ai.onnx" for o in proto.opset_import)
    unsorted = False
    # what each (op type, domain) is to the scan, worked out once per scan: a model repeats a few
    # operators many times, and each test below is a call or a set lookup per node
    kinds: dict[tuple[str, str], tuple[str, bool, bool, bool, bool, int]] = {}
    for g, where in walk_graphs(proto.graph):
        graphs.append(g)
        seen = {"", *(t.name for t in g.initializer), *(v.name for v in g.input),
                *(st.values.name for st in g.sparse_initializer)}
        ahead: set[str] = set()
        for n in g.node:
            op, raw = n.op_type, n.domain
            kind = kinds.get((op, raw))
            if kind is None:
                kind = kinds[op, raw] = _node_kind(op, raw, opset)
                spelled = spelled or raw == "ai.onnx"
            domain, holder, is_norm, propagates, via_body, values_from = kind
            # each repeated field read as one slice (a list made in C), not iterated name by name
            inputs, outputs = n.input[:], n.output[:]
            seen.update(outputs)
            node_reads = _reads(n) if holder and n.attribute else inputs
            if not seen.issuperset(node_reads):
                ahead.update(r for r in node_reads if r not in seen)
            if is_norm:
                norms.append((n, where))
            if propagates:
                propagating = True
                reads.update(inputs)
                carriers.update(outputs)
                through_body = through_body or via_body
            if values_from >= 0:
                values_read.update(inputs[values_from:] if values_from else inputs)
        unsorted = unsorted or not ahead.isdisjoint(seen)
    for names in (reads, carriers, values_read):
        names.discard("")  # an omitted optional input or output: no value
    shape_data_read = len(graphs) > 1 or bool(proto.functions) or through_body or not carriers.isdisjoint(values_read)
    return NodeScan(graphs, norms, propagating, reads, shape_data_read, (spelled, proto.ir_version < 4, unsorted))


#: The ai.onnx.ml domain: none of its operators' inference functions reads an input's values
#: (onnx/defs/traditionalml/defs.cc calls neither getInputData nor getSymbolicInput).
ML_DOMAIN = "ai.onnx.ml"

#: Standard operators whose inference reads their first input's type and shape only (never its
#: values): the data input of the operators that take a shape, axes or sizes as another input.
#: onnx reads data propagation's values only through ``InferenceContext::getSymbolicInput``
#: (onnx/defs/shape_inference.cc ``getShapeInput``), which its operators call for
#: ConstantOfShape's input 0, Expand's and Reshape's input 1, AffineGrid's input 1 and Resize's
#: sizes (onnx commit f7546912, onnx/defs/{generator,math,tensor}); the operators here and in
#: ``VALUE_BLIND`` are a narrower set that holds whatever the onnx version.
DATA_FIRST = frozenset({
    "Reshape", "Expand", "Tile", "Slice", "Pad", "Squeeze", "Unsqueeze", "Resize", "Split", "TopK", "ArgMax",
    "ArgMin", "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
    "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare",
})


#: Standard operators whose inference reads their inputs' types and shapes only, never their values
#: (a Reshape's shape, a Slice's starts, a Resize's sizes, Squeeze's axes from opset 13 and Reduce*'s
#: from 18 are read as values: none of those is here). In a model of these alone, what data
#: propagation computes (Shape, Gather, Add on shape values) reaches no node that would read it, so
#: inference with it and without it give the same types and shapes.
VALUE_BLIND = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Neg", "Abs", "Sqrt", "Reciprocal", "Exp", "Log", "Floor", "Ceil",
    "Round", "Sign", "Erf", "Sin", "Cos", "Tanh", "Sigmoid", "Relu", "LeakyRelu", "PRelu", "Elu", "Selu",
    "Celu", "Softplus", "Softsign", "HardSigmoid", "HardSwish", "Mish", "Gelu", "ThresholdedRelu", "Clip",
    "Max", "Min", "Sum", "Mean", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And",
    "Or", "Xor", "Where", "IsNaN", "IsInf", "Identity", "Cast", "Dropout", "Conv", "MaxPool", "AveragePool",
    "GlobalAveragePool", "GlobalMaxPool", "BatchNormalization", "InstanceNormalization", "LRN", "Softmax",
    "LogSoftmax", "MatMul", "Gemm", "Transpose", "Flatten", "Concat", "Gather", "GatherElements", "Shape",
    "Size", "DepthToSpace", "SpaceToDepth", "QuantizeLinear", "DequantizeLinear", "QLinearConv",
    "QLinearMatMul", "MatMulInteger", "ConvInteger",
})


def infer(proto: onnx.ModelProto, owned: bool = False, scan: NodeScan | None = None,
          ) -> tuple[onnx.ModelProto | None, bool, str]:
    """Run the guarded passes. Returns (the strictly inferred model or None, whether data was
    propagated, the strict failure's message or ""). ``owned``: the caller may have ``proto``
    changed (the inferred model may then be ``proto`` itself, its values filled in). ``scan``:
    ``scan_nodes(proto)``, where the caller has it."""
    scan = scan_nodes(proto) if scan is None else scan
    graphs, reshaped = scan.graphs, scan.reshaped
    # only an unsafe LayerNormalization needs the first pass's ranks: one with a negative axis, or
    # its Y output alone, is inferred without reading past its input's rank
    norms = [(n, where) for n, where in scan.norms if _unsafe_layer_norm(n)]
    spelled, old_ir, unsorted = reshaped
    # Where the IR version is all ``_weightless`` would change besides weights, its copy is not made:
    # the serialized stub ends in the field again (``_IR_4``), which a protobuf parser reads as the
    # value (the last one of a non-repeated field wins), and what is inferred is the same.
    raise_ir = old_ir and not spelled and not unsorted
    stub = _weightless(proto, reshaped=(False, False, False) if raise_ir else reshaped, graphs=graphs)

    def serialize(model: onnx.ModelProto) -> bytes:
        return model.SerializeToString() + (_IR_4 if raise_ir else b"")

    # one graph, the stub no more than the model less weights (and a raised IR version, set on the
    # result as the inferred stub has it): inference's values are read apart from the model and put
    # in it (``_graph_values``), not the whole inferred model parsed again
    apart = len(graphs) == 1 and not spelled and not unsorted
    serialized: bytes | None = None  # the stub as onnx's C++ reads it, serialized once for both passes
    wanted = {n.input[0] for n, _ in norms if n.input}
    if not norms and not scan.propagating:
        # Nothing for the first pass to find: no LayerNormalization to check, and no node data
        # propagation would visit (so it costs nothing and changes nothing): the real pass alone.
        long_1d, shapes = False, {}
    elif not norms and not scan.shape_data_read:
        # No node's inference reads what propagation computes: it would change nothing, so the
        # real pass runs without it, and needs no first pass to tell whether a long value makes it
        # too costly.
        long_1d, shapes = True, {}
    else:
        probe = stub if not norms else _probe_copy(stub)
        if probe is stub:
            serialized = serialize(stub)
        elif raise_ir:  # a copy of its own
            probe.ir_version = _IR_4_VERSION
        if apart and probe is stub and _graph_values() is not None:
            try:
                values = _graph_values().FromString(onnx_cpp.infer_shapes(serialized, False, False, False)).graph
                long_1d, shapes = _probe_facts(stub, wanted, scan.reads, (values.value_info, values.output))
            except Exception:  # inference is a help, not a requirement: onnxruntime runs models it cannot infer
                long_1d, shapes = _probe_facts(stub, wanted, scan.reads)
        else:
            try:
                first = onnx.shape_inference.infer_shapes(probe if serialized is None else serialized,
                                                          check_type=False, strict_mode=False, data_prop=False)
            except Exception:  # inference is a help, not a requirement: onnxruntime runs models it cannot infer
                first = probe
            long_1d, shapes = _probe_facts(first, wanted, scan.reads)
    for n, where in norms:  # before the real pass, which would read past the rank
        dims = shapes.get(n.input[0]) if n.input else None
        if dims is not None and _axis(n, -1) >= len(dims):
            raise InvalidGraph(f"{node_label(n)}{where}: axis={_axis(n, -1)} but its input {n.input[0]!r} has rank "
                               f"{len(dims)}; axis must be in [{-len(dims)}, {len(dims) - 1}].")
    unknown_ln = any(shapes.get(n.input[0]) is None for n, _ in norms if n.input)
    data_prop = not (long_1d or unknown_ln)
    serialized = serialize(stub) if serialized is None else serialized
    try:
        if apart:
            # its inferred values go into the model itself (or a copy, where the model is the caller's)
            target = proto if owned else _copy(proto)
            _infer_values(serialized, target, data_prop)
            if raise_ir:
                target.ir_version = _IR_4_VERSION
            return target, data_prop, ""
        inferred = onnx.shape_inference.infer_shapes(serialized, check_type=True, strict_mode=True,
                                                     data_prop=data_prop)
        return _with_weights(inferred, proto, stub), data_prop, ""
    except onnx.shape_inference.InferenceError as e:
        if data_prop and DATA_PROP_COLLISION.search(str(e)):
            return _infer_without_data_prop(serialized, proto, stub, str(e))
        if not _stripped(stub):
            return None, data_prop, str(e)
    except Exception:
        if not _stripped(stub):
            return None, data_prop, ""
    # The stub's missing data may be what failed (a value some inference function reads that
    # stubbed does not foresee): only the model with all its data may be refused.
    full = _weightless(proto, strip=False)
    try:
        return onnx.shape_inference.infer_shapes(full, check_type=True, strict_mode=True, data_prop=data_prop), \
            data_prop, ""
    except onnx.shape_inference.InferenceError as e:
        return None, data_prop, str(e)
    except Exception:
        return None, data_prop, ""


#: onnx's data propagation keeps one table of computed values for the whole model, subgraphs
#: included: where two subgraphs write the same name (an If's branches each computing
#: '/model/decoder/Shape', as optimum's merged decoders do; legal, each graph is its own scope), the
#: second one's node fails strict inference with this message, though the model is valid and
#: onnxruntime loads it.
DATA_PROP_COLLISION = re.compile(r"Data for input\s+\d+ already exists")


def _infer_without_data_prop(serialized: bytes, proto: onnx.ModelProto, stub: onnx.ModelProto,
                             first_error: str) -> tuple[onnx.ModelProto | None, bool, str]:
    """Strict inference again without data propagation, after its shared table refused a valid
    model (``DATA_PROP_COLLISION``); a real error still fails it, with its own message."""
    try:
        inferred = onnx.shape_inference.infer_shapes(serialized, check_type=True, strict_mode=True, data_prop=False)
    except onnx.shape_inference.InferenceError as e:
        return None, False, str(e)
    except Exception:  # inference is a help, not a requirement
        return None, False, first_error
    return _with_weights(inferred, proto, stub), False, ""


#: The IR version ``_weightless`` raises an older model to, and ModelProto.ir_version (field 1, a
#: varint) set to it, as serialized bytes.
_IR_4_VERSION = 4
_IR_4 = bytes((1 << 3, _IR_4_VERSION))


def _copy(proto: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    return copy


def infer_lenient(proto: onnx.ModelProto, data_prop: bool) -> onnx.ModelProto:
    """The lenient pass, after a strict one failed (with the same data propagation)."""
    stub = _weightless(proto)
    try:
        inferred = onnx.shape_inference.infer_shapes(stub, check_type=False, strict_mode=False, data_prop=data_prop)
    except Exception:  # inference is a help, not a requirement: onnxruntime runs models it cannot infer
        return proto
    return _with_weights(inferred, proto, stub)


def computed_output_shapes(proto: onnx.ModelProto, data_prop: bool) -> dict[str, list]:
    """{main-graph output: the dims inference computes for it} with the outputs' declared shapes set
    aside (a converter that writes the tracing batch into an output's declared shape: hummingbird's
    ``[8, 3]`` for a 256-row run). Dims are ints, strs or None; outputs inference cannot shape are
    left out."""
    stub = _weightless(proto)
    if stub is proto:  # nothing was stripped: the outputs' shapes are cleared below on a copy, never on the caller's model
        stub = _copy(proto)
    for out in stub.graph.output:
        if out.type.HasField("tensor_type"):
            out.type.tensor_type.ClearField("shape")
    try:
        inferred = onnx.shape_inference.infer_shapes(stub, check_type=False, strict_mode=False, data_prop=data_prop)
    except Exception:  # inference is a help, not a requirement
        return {}
    shapes = {}
    for out in inferred.graph.output:
        if out.type.HasField("tensor_type") and out.type.tensor_type.HasField("shape"):
            shapes[out.name] = [d.dim_value if d.HasField("dim_value") else d.dim_param or None
                                for d in out.type.tensor_type.shape.dim]
    return shapes
