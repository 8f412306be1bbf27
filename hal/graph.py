"""The graph an EP sees: graphs, nodes and value infos (ORT's OrtGraph / OrtNode / OrtValueInfo).

EPs treat these objects as read-only: ``get_capability`` reads them and ``compile`` receives
filtered graphs built from them. The runtime builds them from an ``onnx.ModelProto`` and rewrites
them in place: the optimizer and the layout pass change nodes and value infos, the partitioner
records each node's EP in ``Node.ep_name`` and replaces each compiled group by its fused node. A
rewrite goes through the methods under "runtime-only mutation" and ends with ``reindex()`` (or keeps
the index current node by node with ``index_node``/``unindex_node``).

Producers and consumers are per graph, not per value, so a node can appear both in the whole graph
and in a filtered graph that holds a fused partition.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Iterable, KeysView, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, TypeProto, helper, numpy_helper

from onnxhal.hal.errors import InvalidGraph

# ORT's type strings for tensor element types.
_ELEM_NAMES = {
    TensorProto.FLOAT: "float", TensorProto.UINT8: "uint8", TensorProto.INT8: "int8",
    TensorProto.UINT16: "uint16", TensorProto.INT16: "int16", TensorProto.INT32: "int32",
    TensorProto.INT64: "int64", TensorProto.STRING: "string", TensorProto.BOOL: "bool",
    TensorProto.FLOAT16: "float16", TensorProto.DOUBLE: "double", TensorProto.UINT32: "uint32",
    TensorProto.UINT64: "uint64", TensorProto.COMPLEX64: "complex64",
    TensorProto.COMPLEX128: "complex128", TensorProto.BFLOAT16: "bfloat16",
    TensorProto.FLOAT8E4M3FN: "float8e4m3fn", TensorProto.FLOAT8E4M3FNUZ: "float8e4m3fnuz",
    TensorProto.FLOAT8E5M2: "float8e5m2", TensorProto.FLOAT8E5M2FNUZ: "float8e5m2fnuz",
    TensorProto.UINT4: "uint4", TensorProto.INT4: "int4",
}
for _name in ("FLOAT4E2M1", "FLOAT8E8M0", "UINT2", "INT2"):
    if hasattr(TensorProto, _name):
        _ELEM_NAMES[getattr(TensorProto, _name)] = _name.lower()


def elem_type_name(elem_type: int) -> str:
    return _ELEM_NAMES.get(elem_type, f"elem_type_{elem_type}")


def elem_type_to_dtype(elem_type: int) -> np.dtype | None:
    """numpy dtype of an ONNX element type (ml_dtypes types for bfloat16 and float8), or None."""
    try:
        return _DTYPES[elem_type]
    except KeyError:
        pass
    if elem_type == TensorProto.STRING:
        dtype = np.dtype(object)
    else:
        try:
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
        except Exception:  # undefined or unknown element type
            dtype = None
    if isinstance(elem_type, int):
        _DTYPES[elem_type] = dtype
    return dtype


def dtype_to_elem_type(dtype: np.dtype) -> int:
    """ONNX element type of a numpy dtype (object arrays hold strings); onnx's KeyError or
    TypeError for a dtype ONNX has no type for."""
    try:
        return _ELEM_TYPES[dtype]
    except KeyError:
        pass
    elem_type = TensorProto.STRING if dtype.kind == "O" else helper.np_dtype_to_tensor_dtype(dtype)
    _ELEM_TYPES[dtype] = elem_type
    return elem_type


#: dtype_to_elem_type's answers.
_ELEM_TYPES: dict[np.dtype, int] = {}
#: elem_type_to_dtype's answers (onnx's lookup goes through a mapping object per call).
_DTYPES: dict[int, np.dtype | None] = {}


def type_proto_to_string(tp: TypeProto | None) -> str:
    """ORT's type string: ``tensor(float)``, ``seq(tensor(int64))``, ``optional(tensor(float))``,
    ``map(string,tensor(float))``."""
    if tp is None:
        return "unknown"
    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        return f"tensor({elem_type_name(tp.tensor_type.elem_type)})"
    if kind == "sparse_tensor_type":
        return f"sparse_tensor({elem_type_name(tp.sparse_tensor_type.elem_type)})"
    if kind == "sequence_type":
        return f"seq({type_proto_to_string(tp.sequence_type.elem_type)})"
    if kind == "optional_type":
        return f"optional({type_proto_to_string(tp.optional_type.elem_type)})"
    if kind == "map_type":
        return (f"map({elem_type_name(tp.map_type.key_type)},"
                f"{type_proto_to_string(tp.map_type.value_type)})")
    return "unknown"


def _parse_type(tp: TypeProto) -> tuple[bool, int, tuple | None]:
    """(whether a tensor, its element type, its dims or None) of a TypeProto."""
    if tp.WhichOneof("value") != "tensor_type":
        return False, 0, None
    tt = tp.tensor_type
    shape = None
    if tt.HasField("shape"):
        dims = []
        for d in tt.shape.dim:
            kind = d.WhichOneof("value")
            # A negative dim_value (some converters write -1 for a dynamic axis) is free, as in onnxruntime.
            dims.append((d.dim_value if d.dim_value >= 0 else None) if kind == "dim_value"
                        else d.dim_param if kind == "dim_param" else None)
        shape = tuple(dims)
    return True, tt.elem_type, shape


#: _parse_type's answers by serialized TypeProto (emptied when full: a process's models share few types).
_PARSED_TYPES: dict[bytes, tuple[bool, int, tuple | None]] = {}
_PARSED_TYPES_MAX = 1 << 14


class ValueInfo:
    """Name and type of one value. ``shape`` is a tuple whose entries are ints (fixed), strs
    (symbolic) or None (unknown), or None when even the rank is unknown.

    The TypeProto is read once, on the first question about it, and its answers kept: the loader's
    checks and the optimizer's passes ask each value's shape and element type many times, and
    parsing the proto at each read was a large part of their cost. A ValueInfo's TypeProto is
    treated as immutable (a new type is a new ValueInfo, ``Graph.set_value_info``); assigning
    ``type_proto`` forgets the kept answers. ``ValueInfo.tensor`` makes one from an element type
    and dims, building the TypeProto only if something asks for it."""

    __slots__ = ("name", "_type_proto", "_parsed")

    def __init__(self, name: str, type_proto: TypeProto | None = None) -> None:
        self.name = name
        self._type_proto = type_proto
        self._parsed: tuple[bool, int, tuple | None] | None = None

    @classmethod
    def tensor(cls, name: str, elem_type: int, shape: Sequence[int]) -> ValueInfo:
        """A tensor value of element type ``elem_type`` and static ``shape``."""
        vi = cls.__new__(cls)
        vi.name = name
        vi._type_proto = None
        vi._parsed = (True, int(elem_type), tuple(int(d) for d in shape))
        return vi

    @classmethod
    def of_array(cls, name: str, array: np.ndarray) -> ValueInfo:
        """A tensor value of ``array``'s element type and shape (``tensor`` without its conversions:
        a numpy shape is a tuple of ints already; a graph reads one per initializer)."""
        vi = cls.__new__(cls)
        vi.name = name
        vi._type_proto = None
        vi._parsed = (True, dtype_to_elem_type(array.dtype), array.shape)
        return vi

    @property
    def type_proto(self) -> TypeProto | None:
        if self._type_proto is None and self._parsed is not None and self._parsed[0]:
            self._type_proto = helper.make_tensor_type_proto(self._parsed[1], self._parsed[2])
        return self._type_proto

    @type_proto.setter
    def type_proto(self, value: TypeProto | None) -> None:
        self._type_proto = value
        self._parsed = None

    def _parse(self) -> tuple[bool, int, tuple | None]:
        parsed = self._parsed
        if parsed is not None:
            return parsed
        tp = self._type_proto
        if tp is None:
            parsed = (False, 0, None)
        else:
            # A model's values share a few types (each block's activations), and sessions of one
            # model all of them: serializing the TypeProto is one C call, reading its dims one
            # Python call per field. Equal bytes are equal types, so the answer is shared.
            key = tp.SerializeToString()
            parsed = _PARSED_TYPES.get(key)
            if parsed is None:
                parsed = _parse_type(tp)
                if len(_PARSED_TYPES) >= _PARSED_TYPES_MAX:
                    _PARSED_TYPES.clear()
                _PARSED_TYPES[key] = parsed
        self._parsed = parsed
        return parsed

    @property
    def is_tensor(self) -> bool:
        return self._parse()[0]

    @property
    def elem_type(self) -> int:
        """ONNX element type of a tensor value (0, UNDEFINED, if unknown or not a tensor)."""
        return self._parse()[1]

    @property
    def dtype(self) -> np.dtype | None:
        parsed = self._parse()
        return elem_type_to_dtype(parsed[1]) if parsed[0] else None

    @property
    def shape(self) -> tuple | None:
        return self._parse()[2]

    @property
    def has_static_shape(self) -> bool:
        shape = self.shape
        return shape is not None and all(isinstance(d, int) for d in shape)

    @property
    def type_string(self) -> str:
        return type_proto_to_string(self.type_proto)

    def __repr__(self) -> str:
        return f"ValueInfo({self.name!r}, {self.type_string}, shape={self.shape})"


def decode_strings(values: Sequence[bytes]) -> list[str]:
    """Each bytes value decoded as UTF-8 (an invalid byte kept as a lone surrogate): one decode of
    the values joined by NUL and one split, where no value holds a NUL (a tree ensemble's
    ``nodes_modes`` holds a string per node: one decode call each costs more than the rest of its
    attributes' parsing)."""
    if len(values) < 2:
        return [v.decode("utf-8", errors="surrogateescape") for v in values]
    joined = b"\0".join(values)
    if joined.count(b"\0") != len(values) - 1:  # a NUL inside a value: each on its own
        return [v.decode("utf-8", errors="surrogateescape") for v in values]
    return joined.decode("utf-8", errors="surrogateescape").split("\0")


def parse_attribute(attr: AttributeProto, parent: Graph | None) -> Any:
    """Python value of an attribute: numbers, str, lists, numpy arrays, ``Graph`` for subgraphs."""
    t = attr.type
    if t == AttributeProto.FLOAT:
        return float(attr.f)
    if t == AttributeProto.INT:
        return int(attr.i)
    if t == AttributeProto.STRING:
        return attr.s.decode("utf-8", errors="surrogateescape")
    if t == AttributeProto.TENSOR:
        return tensor_to_array(attr.t, f"attribute {attr.name!r}")
    if t == AttributeProto.GRAPH:
        return Graph.from_proto(attr.g, parent.opset if parent else {}, parent=parent)
    # a repeated field's slice is a list made in C, where list() iterates it from Python's side
    if t == AttributeProto.FLOATS:
        return attr.floats[:]
    if t == AttributeProto.INTS:
        return attr.ints[:]
    if t == AttributeProto.STRINGS:
        return decode_strings(attr.strings)
    if t == AttributeProto.TENSORS:
        return [tensor_to_array(x, f"attribute {attr.name!r}") for x in attr.tensors]
    if t == AttributeProto.GRAPHS:
        return [Graph.from_proto(g, parent.opset if parent else {}, parent=parent) for g in attr.graphs]
    return helper.get_attribute_value(attr)  # sparse tensors, type protos: kept as protos


_INT, _INTS, _FLOAT, _FLOATS = AttributeProto.INT, AttributeProto.INTS, AttributeProto.FLOAT, AttributeProto.FLOATS


#: the fewest values ``Node.attr_array`` reads from the attribute's proto: numpy reading a repeated
#: field costs about 3 us whatever its length, a list of Python numbers about 0.4 us plus 20 ns a value
#: (equal near 90 values; measured on tree ensembles' 7- to 422-entry attributes, numpy 2)
_FIELD_READ_FROM = 64


class Node:
    """One node. ``inputs`` and ``outputs`` are value names ('' for an omitted optional input).
    ``implicit_inputs`` are outer-scope values its subgraphs read (as ORT's implicit inputs);
    a kernel receives them after the explicit inputs."""

    __slots__ = ("name", "op_type", "domain", "inputs", "outputs", "attribute_protos", "attributes",
                 "subgraphs", "implicit_inputs", "since_version", "ep_name", "doc_string", "__weakref__")

    def __init__(self, op_type: str, inputs: Iterable[str], outputs: Iterable[str], name: str = "",
                 domain: str = "", attribute_protos: Iterable[AttributeProto] = (),
                 owner: Graph | None = None, doc_string: str = "") -> None:
        self.name = name
        self.op_type = op_type
        self.domain = "" if domain == "ai.onnx" else domain
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self.attributes: dict[str, Any] = {}
        self.subgraphs: dict[str, Graph | list[Graph]] = {}
        if attribute_protos:
            self._read_attributes(attribute_protos, owner)
        else:
            self.attribute_protos = {}
        self.implicit_inputs: tuple[str, ...] = ()
        self.since_version = 0  # opset version of the operator schema, set by the runtime
        self.ep_name = ""  # set by the partitioner
        self.doc_string = doc_string

    def _read_attributes(self, attribute_protos: Iterable[AttributeProto], owner: Graph | None) -> None:
        """``attribute_protos`` by name, and each one's value in ``attributes`` (graphs also in
        ``subgraphs``, which starts empty)."""
        self.attribute_protos = protos = {a.name: a for a in attribute_protos}
        attributes = self.attributes
        for name_, a in protos.items():
            # the common types read here as ``parse_attribute`` reads them (a call less per attribute)
            kind = a.type
            if kind == _INT:
                attributes[name_] = a.i
            elif kind == _INTS:
                attributes[name_] = a.ints[:]
            elif kind == _FLOAT:
                attributes[name_] = a.f
            else:
                value = attributes[name_] = parse_attribute(a, owner)
                if kind == AttributeProto.GRAPH or kind == AttributeProto.GRAPHS:
                    self.subgraphs[name_] = value

    @classmethod
    def from_proto(cls, proto: onnx.NodeProto, owner: Graph | None = None) -> Node:
        """The node ``proto`` describes, as ``Node(...)`` builds it, its slots set here: a model's
        thousands of nodes each paid the constructor's conversions of what a proto gives as it is."""
        node = cls.__new__(cls)
        node.name = proto.name
        node.op_type = proto.op_type
        domain = proto.domain
        node.domain = "" if domain == "ai.onnx" else domain
        # a repeated field read as one slice (a list made in C) costs less than iterated name by name
        node.inputs = tuple(proto.input[:])
        node.outputs = tuple(proto.output[:])
        node.attributes = {}
        node.subgraphs = {}
        attrs = proto.attribute
        if len(attrs):
            node._read_attributes(attrs, owner)
        else:
            node.attribute_protos = {}
        node.implicit_inputs = ()
        node.since_version = 0
        node.ep_name = ""
        node.doc_string = proto.doc_string
        return node

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attributes.get(name, default)

    def attr_array(self, name: str, dtype: np.dtype | type) -> np.ndarray | None:
        """A list-valued attribute (ints, floats) as a 1-D array of ``dtype``; None where the node has
        no such attribute. Read from the attribute's proto where it holds as many values as the
        parsed list (the two are kept together by whatever edits a node) where it holds at least
        ``_FIELD_READ_FROM`` values: protobuf's repeated field hands numpy its values in C, in about a
        third of the time numpy takes to read a list of Python numbers (a tree ensemble's attributes
        hold a number per tree node), after a fixed cost that a short list does not reach."""
        value = self.attributes.get(name)
        if not isinstance(value, list):
            return None
        proto = self.attribute_protos.get(name) if len(value) >= _FIELD_READ_FROM else None
        if proto is not None:
            kind = proto.type
            field = proto.ints if kind == _INTS else proto.floats if kind == _FLOATS else None
            if field is not None and len(field) == len(value):
                return np.array(field, dtype)
        return np.array(value, dtype)

    def subgraph_list(self) -> list[Graph]:
        out: list[Graph] = []
        for g in self.subgraphs.values():
            out.extend(g if isinstance(g, list) else [g])
        return out

    def to_proto(self) -> onnx.NodeProto:
        proto = helper.make_node(self.op_type, list(self.inputs), list(self.outputs),
                                 name=self.name or None, domain=self.domain or None)
        for name_, a in self.attribute_protos.items():
            if name_ in self.subgraphs:  # subgraphs may have been optimized: write them back
                sub = self.subgraphs[name_]
                new = onnx.AttributeProto()
                new.CopyFrom(a)
                if isinstance(sub, list):
                    del new.graphs[:]
                    new.graphs.extend(g.to_proto() for g in sub)
                else:
                    new.g.CopyFrom(sub.to_proto())
                proto.attribute.append(new)
            else:
                proto.attribute.append(a)
        return proto

    def __repr__(self) -> str:
        return f"Node({self.op_type!r}, name={self.name!r}, {list(self.inputs)} -> {list(self.outputs)})"


class Graph:
    """A graph or subgraph: nodes in topological order, inputs, outputs, constant initializers,
    value infos and opset imports. ``parent_node`` is the node owning a subgraph.

    A subgraph refers to its parent graph and owning node weakly: the parent holds the subgraph
    (in its node's attributes), so strong links both ways would make every If/Loop/Scan model a
    reference cycle, which only the garbage collector frees, in some later session's time."""

    @property
    def parent(self) -> Graph | None:
        """The graph whose node holds this subgraph (None for a main graph, or once it is freed)."""
        ref = self._parent_ref
        return None if ref is None else ref()

    @parent.setter
    def parent(self, graph: Graph | None) -> None:
        self._parent_ref = None if graph is None else weakref.ref(graph)

    @property
    def parent_node(self) -> Node | None:
        """The node holding this subgraph in an attribute (None for a main graph)."""
        ref = self._parent_node_ref
        return None if ref is None else ref()

    @parent_node.setter
    def parent_node(self, node: Node | None) -> None:
        self._parent_node_ref = None if node is None else weakref.ref(node)

    def __init__(self, name: str, nodes: list[Node], inputs: list[ValueInfo], outputs: list[ValueInfo],
                 initializers: Mapping[str, np.ndarray] | None = None,
                 value_infos: Mapping[str, ValueInfo] | None = None,
                 opset: Mapping[str, int] | None = None, parent: Graph | None = None,
                 doc_string: str = "") -> None:
        self.name = name
        self.doc_string = doc_string
        self.nodes = list(nodes)
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.initializers: dict[str, np.ndarray] = dict(initializers or {})
        self._value_infos: dict[str, ValueInfo] = dict(value_infos or {})
        for v in (*self.inputs, *self.outputs):
            self._value_infos.setdefault(v.name, v)
        self.opset: dict[str, int] = dict(opset or {})
        self.parent = parent
        self.parent_node: Node | None = None
        self.reindex()

    # -- building ---------------------------------------------------------------------------
    @classmethod
    def from_proto(cls, gp: onnx.GraphProto, opset: Mapping[str, int], parent: Graph | None = None) -> Graph:
        g = cls.__new__(cls)
        g.name, g.doc_string, g.parent, g.parent_node = gp.name, gp.doc_string, parent, None
        g.opset = dict(opset)
        g.initializers = {}
        for t in gp.initializer:
            g.initializers[t.name] = tensor_to_array(t, "initializer")
        for st in gp.sparse_initializer:
            g.initializers[st.values.name] = sparse_to_dense(st, "sparse initializer")
        vi: dict[str, ValueInfo] = {}
        new = ValueInfo.__new__
        for v in (*gp.value_info, *gp.input, *gp.output):
            # ``ValueInfo(name, type)``'s slots set here: a model's thousands of values paid the call
            info = new(ValueInfo)
            info.name = name = v.name
            info._type_proto = v.type if v.HasField("type") else None
            info._parsed = None
            vi[name] = info
        for name, arr in g.initializers.items():
            if name not in vi:
                vi[name] = ValueInfo.of_array(name, arr)
        g._value_infos = vi
        g.inputs = [vi[v.name] for v in gp.input if v.name not in g.initializers]
        # Inputs that are also initializers are overridable defaults (IR < 4 style).
        g.overridable = [vi[v.name] for v in gp.input if v.name in g.initializers]
        g.outputs = [vi[v.name] for v in gp.output]
        g.nodes = [Node.from_proto(n, g) for n in gp.node]
        for n in g.nodes:
            if n.subgraphs:  # (most nodes hold none: no call for their empty list)
                for sub in n.subgraph_list():
                    sub.parent_node = n
        g.reindex()
        return g

    def reindex(self) -> None:
        """Rebuild producer/consumer maps and implicit inputs. Call after any rewrite of ``nodes``."""
        if not hasattr(self, "overridable"):
            self.overridable = []
        # one loop over the nodes for both maps (the same entries, in the same order, as a loop
        # for each): a graph is reindexed after each rewriting pass
        producer: dict[str, Node] = {}
        consumers: dict[str, list[Node]] = {}
        holders = []
        for n in self.nodes:
            for o in n.outputs:
                if o:
                    producer[o] = n
            for i in n.inputs:
                if i:
                    readers = consumers.get(i)
                    if readers is None:
                        consumers[i] = [n]
                    else:
                        readers.append(n)
            for i in n.implicit_inputs:  # as the last reindex found them: refreshed below
                if i:
                    consumers.setdefault(i, []).append(n)
            if n.subgraphs:
                holders.append(n)
        self._producer = producer
        self._consumers = consumers
        for n in holders:
            n.implicit_inputs = tuple(self._outer_reads(n))
            for i in n.implicit_inputs:
                lst = consumers.setdefault(i, [])
                if n not in lst:
                    lst.append(n)

    @staticmethod
    def _outer_reads(node: Node) -> list[str]:
        seen: dict[str, None] = {}
        for sub in node.subgraph_list():
            for name in sub.outer_scope_reads():
                seen[name] = None
        return list(seen)

    def outer_scope_reads(self) -> list[str]:
        """Names this graph (and its nested subgraphs) reads that it does not define."""
        defined = {v.name for v in self.inputs} | set(self.initializers) | {v.name for v in self.overridable}
        for n in self.nodes:
            defined.update(o for o in n.outputs if o)
        reads: dict[str, None] = {}
        for n in self.nodes:
            for i in n.inputs:
                if i and i not in defined:
                    reads[i] = None
            if n.subgraphs:
                for i in self._outer_reads(n):
                    if i not in defined:
                        reads[i] = None
        for o in self.outputs:
            if o.name not in defined:
                reads[o.name] = None
        return list(reads)

    # -- reading ----------------------------------------------------------------------------
    def producer(self, name: str) -> Node | None:
        return self._producer.get(name)

    def consumers(self, name: str) -> list[Node]:
        return list(self._consumers.get(name, ()))

    def indexed_names(self) -> tuple[KeysView[str], KeysView[str]]:
        """(the names the nodes write, the names they read, implicit inputs included), as the last
        ``reindex`` found them: live views, for set arithmetic in C over a whole graph."""
        return self._producer.keys(), self._consumers.keys()

    def value_info(self, name: str) -> ValueInfo:
        """Type information of any value of the graph (an untyped ValueInfo when unknown)."""
        vi = self._value_infos.get(name)
        if vi is None and self.parent is not None:
            vi = self.parent._value_infos.get(name)
        return vi if vi is not None else ValueInfo(name)

    def is_constant_initializer(self, name: str) -> bool:
        if name not in self.initializers:
            return False
        # overridable defaults exist only in IR < 4 models: most graphs have none to look through
        return not self.overridable or all(v.name != name for v in self.overridable)

    def initializer(self, name: str) -> np.ndarray | None:
        return self.initializers.get(name)

    def holds_elem_type(self, elem_type: int) -> bool:
        """Whether a value of the graph may be of ONNX element type ``elem_type``: a value info of
        the graph, or of its parent for a name its nodes read or write (``value_info`` reads the
        parent's where the graph has none), or an initializer's dtype, says so. False proves that no value of the graph is of that type: a pass about one element
        type (float16 regions) asks this once, where asking each node's inputs walked the graph."""
        own = self._value_infos
        if any(vi._parse()[1] == elem_type for vi in own.values()):
            return True
        if self.parent is not None:
            # of the parent's values, only those this graph's nodes name and it does not type (a
            # loop body of a few nodes in a large graph: the parent's thousands are not read)
            outer = self.parent._value_infos
            for n in self.nodes:
                for name in (*n.inputs, *n.outputs):
                    vi = outer.get(name) if name not in own else None
                    if vi is not None and vi._parse()[1] == elem_type:
                        return True
        dtype = elem_type_to_dtype(elem_type)
        return dtype is not None and any(a.dtype == dtype for a in self.initializers.values())

    @property
    def input_names(self) -> list[str]:
        return [v.name for v in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [v.name for v in self.outputs]

    @property
    def value_infos(self) -> Mapping[str, ValueInfo]:
        return MappingProxyType(self._value_infos)

    def opset_version(self, domain: str = "") -> int:
        return self.opset.get("" if domain == "ai.onnx" else domain, 0)

    def node_by_name(self, name: str) -> Node | None:
        for n in self.nodes:
            if n.name == name:
                return n
        return None

    # -- runtime-only mutation --------------------------------------------------------------
    def set_value_info(self, vi: ValueInfo) -> None:
        self._value_infos[vi.name] = vi

    def remove_value_info(self, name: str) -> None:
        self._value_infos.pop(name, None)

    def unindex_node(self, node: Node) -> None:
        """Drop ``node`` (being removed from ``nodes``) from the producer/consumer maps, without a
        full ``reindex`` (a rebuild per rewrite makes large graphs quadratic). Not for nodes with
        subgraphs: their implicit inputs need ``reindex``."""
        for o in node.outputs:
            if o and self._producer.get(o) is node:
                del self._producer[o]
        for i in {*node.inputs, *node.implicit_inputs}:
            readers = self._consumers.get(i)
            if readers:
                readers[:] = [r for r in readers if r is not node]
                if not readers:
                    del self._consumers[i]

    def index_node(self, node: Node) -> None:
        """Add ``node`` (just put in ``nodes``) to the producer/consumer maps; as ``unindex_node``."""
        for o in node.outputs:
            if o:
                self._producer[o] = node
        for i in node.inputs:
            if i:
                self._consumers.setdefault(i, []).append(node)

    def index_rename(self, old: str, new: str, order: Mapping[int, int]) -> None:
        """Record in the producer/consumer maps that value ``old`` is now called ``new`` on the nodes
        (its producer writes ``new``, its readers read it), as ``unindex_node``, without a full
        ``reindex``. ``order`` maps ``id(node)`` to its position in ``nodes``: the readers of both
        names are kept in graph order, as ``reindex`` lists them."""
        producer = self._producer.pop(old, None)
        if producer is not None:
            self._producer[new] = producer
        moved = self._consumers.pop(old, None)
        if moved:
            readers = self._consumers.setdefault(new, [])
            readers.extend(moved)
            readers.sort(key=lambda n: order[id(n)])

    # -- writing ----------------------------------------------------------------------------
    def to_proto(self, data_up_to: int | None = None) -> onnx.GraphProto:
        """The graph as a GraphProto. ``data_up_to``: initializers of more elements keep their type
        and dims but no data (a stub for onnx's shape inference, which reads the values of small
        shape tensors only: serializing a medium BERT's 14 MB of weights for it took 9 ms a pass),
        except 1-D int32/int64 ones, which its data propagation parses as shape data at any length
        (a Gather on an index table) and rejects emptied."""
        inits = []
        for name, arr in self.initializers.items():
            arr = np.asarray(arr)
            shape_data = arr.ndim <= 1 and arr.dtype in (np.int32, np.int64)
            stub = (_stub_tensor(name, arr) if data_up_to is not None and arr.size > data_up_to and not shape_data
                    else None)
            inits.append(stub if stub is not None else numpy_helper.from_array(arr, name))

        def vip(v: ValueInfo) -> onnx.ValueInfoProto:
            p = onnx.ValueInfoProto(name=v.name)
            if v.type_proto is not None:
                p.type.CopyFrom(v.type_proto)
            return p

        io = {v.name for v in (*self.inputs, *self.outputs)}
        extra = [vip(v) for n, v in self._value_infos.items()
                 if n not in io and n not in self.initializers and v.type_proto is not None]
        return helper.make_graph([n.to_proto() for n in self.nodes], self.name,
                                 [vip(v) for v in (*self.inputs, *self.overridable)],
                                 [vip(v) for v in self.outputs], inits, doc_string=self.doc_string or None,
                                 value_info=extra)

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, {len(self.nodes)} nodes)"


_DATA_TYPES = frozenset(TensorProto.DataType.values()) - {TensorProto.UNDEFINED}
#: Element types whose raw_data numpy reads as it is (on a little-endian machine), as
#: ``numpy_helper.to_array`` does: a view of the bytes, reshaped to the dims.
_RAW_DTYPES: dict[int, np.dtype] = {} if sys.byteorder == "big" else {
    k: np.dtype(helper.tensor_dtype_to_np_dtype(k)) for k in (
        TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT8, TensorProto.UINT8,
        TensorProto.INT16, TensorProto.UINT16, TensorProto.INT32, TensorProto.UINT32, TensorProto.INT64,
        TensorProto.UINT64, TensorProto.BOOL)}
#: data_type -> (typed field, the field's numpy type, the tensor's): the types whose values
#: ``numpy_helper.to_array`` reads from a typed field as ``np.asarray(field, storage).astype(type)``
#: (its last case); its per-call type lookups cost 10 us a tensor, the read alone 3 (scikit-learn
#: exports keep their weights in these fields: 950 of the corpus's tensors)
_FIELD_DTYPES: dict[int, tuple[str, np.dtype, np.dtype]] = {
    TensorProto.FLOAT: ("float_data", np.dtype(np.float32), np.dtype(np.float32)),
    TensorProto.DOUBLE: ("double_data", np.dtype(np.float64), np.dtype(np.float64)),
    TensorProto.INT64: ("int64_data", np.dtype(np.int64), np.dtype(np.int64)),
    TensorProto.INT32: ("int32_data", np.dtype(np.int32), np.dtype(np.int32)),
    TensorProto.INT8: ("int32_data", np.dtype(np.int32), np.dtype(np.int8)),
    TensorProto.UINT8: ("int32_data", np.dtype(np.int32), np.dtype(np.uint8)),
    TensorProto.UINT32: ("uint64_data", np.dtype(np.uint64), np.dtype(np.uint32)),
    TensorProto.UINT64: ("uint64_data", np.dtype(np.uint64), np.dtype(np.uint64)),
}


def _stub_tensor(name: str, arr: np.ndarray) -> TensorProto | None:
    """A TensorProto of ``arr``'s type and dims without its data, or None for a dtype onnx names
    no type for (numpy_helper writes those)."""
    try:
        data_type = helper.np_dtype_to_tensor_dtype(arr.dtype)
    except (KeyError, TypeError, ValueError):
        return None
    return TensorProto(name=name, data_type=data_type, dims=arr.shape)


def _raw_size(t: TensorProto) -> str:
    return f"{len(t.raw_data)} bytes" if t.HasField("raw_data") else "no raw bytes"


def tensor_to_array(t: TensorProto, what: str) -> np.ndarray:
    """``numpy_helper.to_array``, with a tensor that cannot be decoded (an unknown data type, data
    that does not fill its dims) reported as the invalid graph it makes, naming the tensor."""
    data_type, dims = t.data_type, t.dims[:]  # a list, made in C: read thrice below
    if data_type not in _DATA_TYPES:  # numpy_helper's KeyError would name nothing
        raise InvalidGraph(f"{what} tensor {t.name!r} (data_type {data_type}, dims {list(dims)}, {_raw_size(t)}) "
                           f"cannot be decoded: data_type {data_type} is not an ONNX tensor element type "
                           "(onnx.TensorProto.DataType). Re-export the model or fix the tensor.")
    if dims and min(dims) < 0:  # numpy would read -1 as "whatever is left" and decode it anyway
        raise InvalidGraph(f"{what} tensor {t.name!r} has dims {list(dims)}: a dimension cannot be negative. "
                           "Re-export the model or fix the tensor's dims.")
    try:
        dtype = _RAW_DTYPES.get(data_type)
        if dtype is not None and t.HasField("raw_data") and t.data_location != TensorProto.EXTERNAL \
                and not t.HasField("segment"):
            # numpy_helper.to_array's own result for these (a view of the bytes), without its
            # per-call type lookups: a model's hundreds of small initializers paid them each
            return np.frombuffer(t.raw_data, dtype=dtype).reshape(dims)
        field = _FIELD_DTYPES.get(data_type)
        if field is not None and not t.HasField("raw_data") and t.data_location != TensorProto.EXTERNAL \
                and not t.HasField("segment"):
            name, storage, dtype = field
            arr = np.array(getattr(t, name)[:], dtype=storage)
            return (arr if dtype == storage else arr.astype(dtype)).reshape(dims)
        return numpy_helper.to_array(t)
    except Exception as e:
        raise InvalidGraph(f"{what} tensor {t.name!r} (data_type {data_type}, dims {list(dims)}, {_raw_size(t)}) "
                           f"cannot be decoded: {type(e).__name__}: {e}. Re-export the model or fix the "
                           "tensor's data_type, dims and data.") from e


def sparse_to_dense(st: onnx.SparseTensorProto, what: str = "sparse tensor") -> np.ndarray:
    """A SparseTensorProto (COO: values with flat or per-dimension indices) as a dense array; bad
    indices are ``InvalidGraph`` naming ``what`` and the tensor."""
    try:
        return _sparse_values(st)
    except InvalidGraph:
        raise
    except Exception as e:
        raise InvalidGraph(f"{what} {st.values.name!r} (dims {list(st.dims)}) cannot be expanded: "
                           f"{type(e).__name__}: {e}. Check its indices against its dims.") from e


def _sparse_values(st: onnx.SparseTensorProto) -> np.ndarray:
    values = tensor_to_array(st.values, "sparse initializer")
    indices = tensor_to_array(st.indices, "sparse initializer indices")
    dense = np.zeros(int(np.prod(st.dims)), dtype=values.dtype)
    if indices.ndim == 2:  # COO, one row per value
        flat = np.ravel_multi_index(tuple(indices.T), tuple(st.dims))
    else:
        flat = indices
    dense[flat] = values
    return dense.reshape(tuple(st.dims))
