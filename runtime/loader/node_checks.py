"""Checks of a model's nodes against their operator schemas, in Python, before any of onnx's C++
code (the inliner, shape inference) reads the model.

onnx's C++ shape inference trusts what it is given: LayerNormalization's with ``axis=2**31`` and
its Mean output reads far outside a vector (SIGSEGV), GatherND's with a negative ``batch_dims``
does the same, Split's with ``num_outputs`` other than the node's output count fails a C++ assertion
(SIGABRT), and Einsum's loops forever, holding the GIL, on an equation with a character it does not
expect. Nothing in Python can catch or interrupt those, so what they would choke on is refused here,
typed, naming the node, the attribute, the value and what is allowed.

The schema checks are those onnxruntime makes when it loads a model (onnx's ``OpSchema::Verify``):
input and output counts, single inputs left empty, attributes given twice, unknown to the
operator, of another type than its schema's or holding a value of another type than they declare.
onnxruntime refuses each with INVALID_GRAPH ("This is an invalid model. In Node ...").

Also here: the domains a node may use (those the model imports), model-local functions (no
recursion, bodies that read only what they define and write their outputs, calls with all their
inputs), and ``check_after_inference``: required attributes and element-type attributes, checked
after shape inference so that its own messages for those (Cast without 'to') are kept. Checks that
need ranks run on what a first, safe pass of shape inference found (``runtime/loader/guarded_inference.py``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar

import onnx
from onnx import AttributeProto

from onnxhal.hal import Graph, Node
from onnxhal.hal.errors import InvalidGraph

#: Domains whose operators have schemas in the onnx package.
STANDARD_DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "ai.onnx.preview.training")

_A = AttributeProto
#: The value field of each attribute type.
_FIELD = {_A.FLOAT: "f", _A.INT: "i", _A.STRING: "s", _A.TENSOR: "t", _A.GRAPH: "g",
          _A.SPARSE_TENSOR: "sparse_tensor", _A.TYPE_PROTO: "tp", _A.FLOATS: "floats", _A.INTS: "ints",
          _A.STRINGS: "strings", _A.TENSORS: "tensors", _A.GRAPHS: "graphs",
          _A.SPARSE_TENSORS: "sparse_tensors", _A.TYPE_PROTOS: "type_protos"}
_SCALAR_FIELDS = ("f", "i", "s", "t", "g", "sparse_tensor", "tp")
_TYPE_NAME = {v: k for k, v in _A.AttributeType.items()}


def node_label(node: onnx.NodeProto | Node) -> str:
    """How messages name a node (a NodeProto, or the Graph's Node made of one): its op type and name."""
    return f"{node.op_type} node {node.name!r}" if node.name else f"{node.op_type} node (unnamed)"


#: Value fields in the order messages list them: the scalar ones, then the repeated ones.
_VALUE_ORDER = {f: k for k, f in enumerate((*_SCALAR_FIELDS, *(f for f in _FIELD.values() if f not in _SCALAR_FIELDS)))}


#: The value fields' descriptors, with their names: ``ListFields`` gives the descriptors themselves,
#: found here by identity (reading each one's name cost more than the rest of the check)
_VALUE_DESCRIPTORS = {AttributeProto.DESCRIPTOR.fields_by_name[f]: f for f in _VALUE_ORDER}


def _fields_set(a: AttributeProto) -> list[str]:
    """The value fields ``a`` holds: a scalar field set, a repeated one not empty. ``ListFields`` is
    one C call that lists exactly those; asking each of the 15 fields was most of the check."""
    value_fields = _VALUE_DESCRIPTORS
    found = [value_fields[fd] for fd, _ in a.ListFields() if fd in value_fields]
    return sorted(found, key=_VALUE_ORDER.__getitem__) if len(found) > 1 else found


def attribute_facts(node: onnx.NodeProto) -> list[tuple[str, int, str, AttributeProto]]:
    """(name, type, ref_attr_name, attribute) per attribute of ``node``: the checks below read
    these of each attribute, and each read of a name from the proto decodes it anew."""
    return [(a.name, a.type, a.ref_attr_name, a) for a in node.attribute]


def check_attribute_encoding(node: onnx.NodeProto, where: str,
                             facts: list[tuple[str, int, str, AttributeProto]] | None = None) -> None:
    """Each attribute has a name, appears once, declares its type, and holds only a value of it.
    ``facts``: ``attribute_facts(node)``, where the caller has them."""
    seen: set[str] = set()
    for name, kind, ref, a in attribute_facts(node) if facts is None else facts:
        if not name:
            raise InvalidGraph(f"{node_label(node)}{where} has an attribute without a name; remove it.")
        if name in seen:
            raise InvalidGraph(f"{node_label(node)}{where}: attribute {name!r} is given more than once; "
                               "give it once.")
        seen.add(name)
        if ref:  # a function body's reference to the caller's attribute: no value of its own
            continue
        field = _FIELD.get(kind)
        if field is None:
            raise InvalidGraph(f"{node_label(node)}{where}: attribute {name!r} declares no valid type "
                               f"(type {kind}); set its type to the one its value has.")
        stray = [f for f in _fields_set(a) if f != field]
        if stray:
            raise InvalidGraph(f"{node_label(node)}{where}: attribute {name!r} is declared "
                               f"{_TYPE_NAME[kind]} but holds a value in field(s) {', '.join(stray)}; an "
                               f"attribute holds one value, of the type it declares.")


class SchemaSpec:
    """What the checks read of one operator schema, read once per (op type, version, domain): the
    pybind schema builds new lists and dicts at each property access (``schema.attributes`` alone
    cost more than the rest of a node's checks)."""

    __slots__ = ("name", "since_version", "min_input", "max_input", "min_output", "max_output", "inputs",
                 "outputs", "input_names", "output_names", "variadic_last_input", "attributes", "required",
                 "attribute_names", "names_types")

    def __init__(self, schema: onnx.defs.OpSchema) -> None:
        single = onnx.defs.OpSchema.FormalParameterOption.Single
        variadic = onnx.defs.OpSchema.FormalParameterOption.Variadic
        self.name, self.since_version = schema.name, schema.since_version
        self.min_input, self.max_input = schema.min_input, schema.max_input
        self.min_output, self.max_output = schema.min_output, schema.max_output
        ins, outs = list(schema.inputs), list(schema.outputs)
        #: per formal parameter: (name, whether it is Single, i.e. must be named when given)
        self.inputs = tuple((f.name, f.option == single) for f in ins)
        self.outputs = tuple((f.name, f.option == single) for f in outs)
        self.input_names = ", ".join(f.name for f in ins)
        self.output_names = ", ".join(f.name for f in outs)
        self.variadic_last_input = bool(ins) and ins[-1].option == variadic
        attrs = schema.attributes
        self.attributes = {name: int(a.type) for name, a in attrs.items()}
        self.required = tuple(name for name, a in attrs.items() if a.required)
        self.attribute_names = ", ".join(sorted(attrs)) or "none"
        #: whether it has an attribute naming an element type (``_DTYPE_ATTRIBUTES``)
        self.names_types = any(name in attrs for name in ("to", "dtype", "output_dtype"))


def _schema(node: onnx.NodeProto, opset: Mapping[str, int]) -> SchemaSpec | None:
    domain = "" if node.domain == "ai.onnx" else node.domain
    if domain not in STANDARD_DOMAINS or domain not in opset:
        return None
    return schema_spec(node.op_type, opset[domain], domain)


@functools.lru_cache(maxsize=4096)
def schema_spec(op_type: str, version: int, domain: str) -> SchemaSpec | None:
    """The schema of ``op_type`` in force at opset ``version`` of ``domain``, or None (unknown
    operator, or older than its first version: the loader reports those)."""
    try:
        return SchemaSpec(onnx.defs.get_schema(op_type, version, domain))
    except Exception:
        return None


def _count_text(lo: int, hi: int) -> str:
    if lo == hi:
        return f"exactly {lo}"
    return f"{lo} or more" if hi >= 2**31 - 1 else f"{lo} to {hi}"


def check_against_schema(node: onnx.NodeProto, schema: SchemaSpec, where: str,
                         facts: list[tuple[str, int, str, AttributeProto]] | None = None) -> None:
    """onnx's ``OpSchema::Verify``, which onnxruntime runs on each node at load. ``facts``: as
    ``check_attribute_encoding``."""
    n_in, n_out = len(node.input), len(node.output)
    if not schema.min_input <= n_in <= schema.max_input:
        raise InvalidGraph(f"{_op(node, schema, where)} has {n_in} input(s); {schema.name} takes "
                           f"{_count_text(schema.min_input, schema.max_input)}: {schema.input_names}.")
    if not schema.min_output <= n_out <= schema.max_output:
        raise InvalidGraph(f"{_op(node, schema, where)} has {n_out} output(s); {schema.name} gives "
                           f"{_count_text(schema.min_output, schema.max_output)}: {schema.output_names}.")
    if schema.variadic_last_input and not all(node.input[len(schema.inputs) - 1:]):
        k = next(k for k, name in enumerate(node.input) if not name and k >= len(schema.inputs) - 1)
        raise InvalidGraph(f"{_op(node, schema, where)}: input {k} is one of its variadic inputs "
                           f"({schema.inputs[-1][0]}) and its name is empty; variadic inputs cannot be omitted "
                           "(onnxruntime crashes on some).")
    for kind, names, formals in (("input", node.input, schema.inputs), ("output", node.output, schema.outputs)):
        if all(names):
            continue
        for k, name in enumerate(names):
            if k >= len(formals):
                break  # past a variadic last formal parameter (counts were checked above)
            if not name and formals[k][1]:
                raise InvalidGraph(f"{_op(node, schema, where)}: {kind} {k} ({formals[k][0]}) is required but its "
                                   f"name is empty; give the value it {'reads' if kind == 'input' else 'writes'}.")
    for name, kind, ref, _ in attribute_facts(node) if facts is None else facts:
        if name.startswith("__"):  # onnx's internal symbols: not checked against the schema
            continue
        formal = schema.attributes.get(name)
        if formal is None:
            raise InvalidGraph(f"{_op(node, schema, where)}: attribute {name!r} is not an attribute of "
                               f"{schema.name} (it has: {schema.attribute_names}); remove it.")
        if kind != formal and not ref:
            raise InvalidGraph(f"{_op(node, schema, where)}: attribute {name!r} is "
                               f"{_TYPE_NAME.get(kind, kind)}, {schema.name} expects {_TYPE_NAME.get(formal, formal)}.")


def _op(node: onnx.NodeProto, schema: SchemaSpec, where: str) -> str:
    return f"{node_label(node)}{where} (schema {schema.name}-{schema.since_version})"


def check_after_inference(proto: onnx.ModelProto, opset: Mapping[str, int], checked: bool = False,
                          graph: Graph | None = None) -> None:
    """Each node has the attributes its schema requires (onnxruntime: "Required attribute 'axis'
    is missing") and names element types ONNX defines. Run after shape inference, whose own
    messages for some (Cast's 'to') are kept. ``checked``: ``check_nodes`` checked every node
    against the schema ``opset`` gives it (no function body was inlined since, whose nodes it
    checked at the function's own opset), so a node holds only attributes its schema names.
    ``graph``: the Graph built from ``proto``'s main graph, whose Nodes are read where the model has
    no other graph (their op types and domains are slots, their attributes by name)."""
    if graph is not None and flat_model():
        # whether ``_check_required`` has anything to check on a node is a matter of its op type
        # and domain alone (a model repeats a few): asked once for each
        checks: dict[tuple[str, str], bool] = {}
        for n in graph.nodes:
            kind = (n.op_type, n.domain)
            check = checks.get(kind)
            if check is None:
                check = checks[kind] = _checks_anything(n.op_type, n.domain, opset, checked)
            if check:
                _check_required(n, n.domain, n.attribute_protos, opset, checked, "")
        return
    for g, where in walk_graphs(proto.graph):
        for node in g.node:
            raw = node.domain
            _check_required(node, "" if raw == "ai.onnx" else raw, {a.name: a for a in node.attribute}, opset,
                            checked, where)


def _checks_anything(op_type: str, domain: str, opset: Mapping[str, int], checked: bool) -> bool:
    """Whether ``_check_required`` reads anything of a node of this op type and domain ("ai.onnx"
    read as ""): an element type attribute to check, or attributes its schema requires."""
    schema = schema_spec(op_type, opset[domain], domain) if domain in STANDARD_DOMAINS and domain in opset else None
    return bool((not domain and (not checked or schema is None or schema.names_types))
                or (schema is not None and schema.required))


def _check_required(node: onnx.NodeProto | Node, domain: str, attrs: Mapping[str, AttributeProto],
                    opset: Mapping[str, int], checked: bool, where: str) -> None:
    """``check_after_inference`` of one node (``domain``: its domain, "ai.onnx" read as "")."""
    schema = schema_spec(node.op_type, opset[domain], domain) if domain in STANDARD_DOMAINS and \
        domain in opset else None  # as _schema
    # (a checked node whose schema has no element type attribute has none to check)
    if not domain and (not checked or schema is None or schema.names_types):
        _check_dtype_attributes(node, where, attrs.values())
    if schema is None or not schema.required:
        return
    missing = [name for name in schema.required if name not in attrs]
    if missing:
        raise InvalidGraph(f"{node_label(node)}{where}: required attribute {missing[0]!r} of "
                           f"{schema.name}-{schema.since_version} is missing; give it.")


# -- values onnx's C++ cannot take ----------------------------------------------------------------
def _int_attr(node: onnx.NodeProto, name: str) -> int | None:
    for a in node.attribute:
        if a.name == name and a.type == _A.INT:
            return a.i
    return None


#: An Einsum term: letters and spaces, with at most one ellipsis.
_EINSUM_TERM = re.compile(r"^ *[A-Za-z ]*(\.\.\.)?[A-Za-z ]*$")


def _check_einsum(node: onnx.NodeProto, where: str, schema: SchemaSpec | None) -> None:
    eq = next((a.s for a in node.attribute if a.name == "equation"), None)
    if eq is None:
        return
    text = eq.decode("utf-8", "replace")
    lhs, arrow, rhs = text.partition("->")
    terms = lhs.split(",") + ([rhs] if arrow else [])
    bad = next((t for t in terms if not _EINSUM_TERM.match(t)), None)
    if bad is not None or "->" in rhs:
        raise InvalidGraph(f"{node_label(node)}{where}: equation {text!r} is not an Einsum equation: each term "
                           "holds letters (a-z, A-Z), spaces and at most one '...', terms are separated by ',' "
                           "and at most one '->' leads to the output term (e.g. 'bij,bjk->bik').")
    letters = [c for c in rhs if c.isalpha()]
    if len(set(letters)) != len(letters):
        raise InvalidGraph(f"{node_label(node)}{where}: equation {text!r} repeats a letter in its output term; "
                           "each output letter appears once.")
    if len(lhs.split(",")) != len(node.input):
        raise InvalidGraph(f"{node_label(node)}{where}: equation {text!r} has {len(lhs.split(','))} input term(s) "
                           f"for {len(node.input)} input(s); give one term per input.")


def _check_gathernd(node: onnx.NodeProto, where: str, schema: SchemaSpec | None) -> None:
    b = _int_attr(node, "batch_dims")
    if b is not None and b < 0:
        raise InvalidGraph(f"{node_label(node)}{where}: batch_dims={b}; it counts leading batch axes, so it is "
                           "0 or more (and less than the ranks of data and indices).")


def _check_split(node: onnx.NodeProto, where: str, schema: SchemaSpec | None) -> None:
    n = _int_attr(node, "num_outputs")
    if n is not None and len(node.input) > 1 and node.input[1]:
        raise InvalidGraph(f"{node_label(node)}{where}: it gives both num_outputs={n} and the input 'split' "
                           f"({node.input[1]!r}); give one of them (the spec allows only one).")
    if n is not None and n != len(node.output):
        raise InvalidGraph(f"{node_label(node)}{where}: num_outputs={n} but the node has {len(node.output)} "
                           "output(s); num_outputs is the number of outputs.")


#: Attributes of convolutions and pools that count elements or steps: 1 or more each.
_POSITIVE_INTS = ("strides", "dilations", "kernel_shape")
#: The attributes ``_check_window`` reads: a node with none of them (as ints) passes it.
_WINDOW_ATTRIBUTES = frozenset(_POSITIVE_INTS)


def _check_window(node: onnx.NodeProto, where: str, facts: list[tuple[str, int, str, AttributeProto]]) -> None:
    if not any(name in _WINDOW_ATTRIBUTES for name, kind, _, _ in facts if kind == _A.INTS):
        return
    given = {name: list(a.ints) for name, kind, _, a in facts if kind == _A.INTS}
    for name in _POSITIVE_INTS:
        if any(v < 1 for v in given.get(name, ())):
            raise InvalidGraph(f"{node_label(node)}{where}: {name}={given[name]}; each must be 1 or more.")
    kernel = given.get("kernel_shape")
    if kernel is None:
        return
    for name, per_axis in (("strides", 1), ("dilations", 1), ("pads", 2)):
        if name in given and len(given[name]) != per_axis * len(kernel):  # onnx checks it only where it infers
            raise InvalidGraph(f"{node_label(node)}{where}: {name}={given[name]} for kernel_shape={kernel}; give "
                               f"{per_axis * len(kernel)} values.")


def _check_recurrent(node: onnx.NodeProto, where: str, schema: SchemaSpec | None) -> None:
    h = _int_attr(node, "hidden_size")
    if h is None or h < 1:  # optional in the schema, but onnxruntime's kernels need it
        raise InvalidGraph(f"{node_label(node)}{where}: hidden_size is {'missing' if h is None else h}; give the "
                           "size of the hidden state, 1 or more (onnxruntime refuses the node without it).")


#: Attributes onnxruntime's kernels take only from a short list: (op, attribute) -> allowed values.
_ENUMS = {("Mod", "fmod"): (0, 1), ("NonMaxSuppression", "center_point_box"): (0, 1),
          ("DepthToSpace", "mode"): (b"DCR", b"CRD")}


def _check_enums(node: onnx.NodeProto, where: str, schema: SchemaSpec | None) -> None:
    for a in node.attribute:
        allowed = _ENUMS.get((node.op_type, a.name))
        value = a.i if a.type == _A.INT else a.s if a.type == _A.STRING else None
        if allowed is not None and value not in allowed:
            shown = [v.decode() if isinstance(v, bytes) else v for v in allowed]
            given = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
            raise InvalidGraph(f"{node_label(node)}{where}: {a.name}={given!r}; it must be one of {shown}.")


def _check_gemm(node: onnx.NodeProto, where: str, schema: SchemaSpec | None) -> None:
    for name in ("transA", "transB"):
        v = _int_attr(node, name)
        if v is not None and v not in (0, 1):  # onnx's inference reads 32 bits of it, onnxruntime's kernel 64
            raise InvalidGraph(f"{node_label(node)}{where}: {name}={v}; it is a flag, 0 or 1.")


def _graph_attr(node: onnx.NodeProto, name: str) -> onnx.GraphProto | None:
    return next((a.g for a in node.attribute if a.name == name and a.type == _A.GRAPH), None)


def _check_body_signature(node: onnx.NodeProto, where: str, schema: SchemaSpec | None) -> None:
    """The subgraph's inputs and outputs are as many as the node's make it take and give (onnxruntime:
    "Subgraph in 'body' produces 0 outputs but Scan expects 2", at run; refused here at load)."""
    op = node.op_type
    if op == "If":
        expect = {"then_branch": (0, len(node.output)), "else_branch": (0, len(node.output))}
    elif op == "Loop":
        expect = {"body": (len(node.input), len(node.output) + 1)}
    elif op == "Scan" and len(node.input) >= 1:
        scan8 = schema is not None and schema.since_version == 8  # its sequence_lens input is not the body's
        expect = {"body": (len(node.input) - (1 if scan8 else 0), len(node.output))}
    else:
        return
    for name, (n_in, n_out) in expect.items():
        g = _graph_attr(node, name)
        if g is None:
            continue  # a missing subgraph is reported by shape inference ("does not contain a graph")
        if len(g.input) != n_in or len(g.output) != n_out:
            raise InvalidGraph(f"{node_label(node)}{where}: its {name!r} subgraph takes {len(g.input)} input(s) "
                               f"and gives {len(g.output)} output(s); for this node's {len(node.input)} input(s) "
                               f"and {len(node.output)} output(s) it must take {n_in} and give {n_out}.")


#: Attributes that name a tensor element type (``SchemaSpec.names_types``).
_DTYPE_ATTRIBUTES = ("to", "dtype", "output_dtype")
_ELEM_TYPES = frozenset(onnx.TensorProto.DataType.values()) - {onnx.TensorProto.UNDEFINED}


def _check_dtype_attributes(node: onnx.NodeProto | Node, where: str, attrs: Iterable[AttributeProto]) -> None:
    for a in attrs:
        if a.name in _DTYPE_ATTRIBUTES and a.type == _A.INT and a.i not in _ELEM_TYPES:
            raise InvalidGraph(f"{node_label(node)}{where}: attribute {a.name!r} is {a.i}, which is not an ONNX tensor "
                               "element type; give one of onnx.TensorProto.DataType (e.g. 1 for FLOAT).")


_VALUE_CHECKS: dict[str, Callable[[onnx.NodeProto, str, SchemaSpec | None], None]] = {
    "Einsum": _check_einsum, "GatherND": _check_gathernd, "Split": _check_split, "Gemm": _check_gemm,
    "RNN": _check_recurrent, "GRU": _check_recurrent, "LSTM": _check_recurrent,
    "Mod": _check_enums, "NonMaxSuppression": _check_enums, "DepthToSpace": _check_enums,
    "If": _check_body_signature, "Loop": _check_body_signature, "Scan": _check_body_signature,
}


# -- walking a model -------------------------------------------------------------------------------
#: The standard operators that hold subgraphs (any other domain's may too).
_SUBGRAPH_OPS = frozenset({"If", "Loop", "Scan", "SequenceMap"})


#: True while the loader loads a model that holds no graph in any node and has no model-local
#: function (``flat_model_walks``): every graph walked meanwhile is that model's main graph or a
#: copy of it (stubs, inferred copies), so it has no subgraph to look for.
_FLAT_MODEL: ContextVar[bool] = ContextVar("onnxhal_flat_model", default=False)


def holds_graph(node: onnx.NodeProto) -> bool:
    """Whether ``node`` has an attribute typed GRAPH or GRAPHS (as ``walk_graphs`` reads them)."""
    if node.op_type not in _SUBGRAPH_OPS and node.domain in STANDARD_DOMAINS:
        return False
    return any(a.type in (_A.GRAPH, _A.GRAPHS) for a in node.attribute)


@contextmanager
def flat_model_walks(proto: onnx.ModelProto) -> Iterator[None]:
    """The body's ``walk_graphs`` calls yield the graph alone, where ``proto`` has no model-local
    function and no node of its main graph holds a graph: the loader walks its model a dozen times
    (checks, stubs, inference), each walk a read of every node's op type and domain.

    It also holds each of the model's nodes' Python message for the body: protobuf's Python
    library (upb) frees an arena block when a message whose unset repeated field was read goes,
    and calls ``malloc_trim(0)`` at every 10,000th free, whose handed-back pages the next session
    faults in again (16-20 ms). Each of the loader's passes read ``node.attribute`` of nodes that
    have none on messages made for that pass: one free per such node per pass (gpt2_ts 4 x 196).
    Held, a walk gets the same messages again, so a node pays one free per load. (Only the count
    of frees depends on this; what any pass reads does not.)"""
    held = _held_nodes(proto)
    flat = not proto.functions and not any(holds_graph(n) for n in held[0])
    token = _FLAT_MODEL.set(flat)
    try:
        yield
    finally:
        _FLAT_MODEL.reset(token)
        del held


def _held_nodes(proto: onnx.ModelProto) -> list[list[onnx.NodeProto]]:
    """The nodes of ``proto``'s main graph, then of each function body, as lists (each message
    made once, here)."""
    return [list(proto.graph.node), *(list(f.node) for f in proto.functions)]


def flat_model() -> bool:
    """Whether the model being loaded holds one graph alone (inside ``flat_model_walks``: no
    model-local function, no node holding a graph)."""
    return _FLAT_MODEL.get()


def walk_graphs(graph: onnx.GraphProto, where: str = "") -> Iterator[tuple[onnx.GraphProto, str]]:
    """The graph and every subgraph in it, each with a phrase saying where it is."""
    yield graph, where
    if _FLAT_MODEL.get():
        return
    for node in graph.node:
        if node.op_type not in _SUBGRAPH_OPS and node.domain in STANDARD_DOMAINS:
            continue  # no standard operator but those holds a graph: their attributes need no reading
        for a in node.attribute:
            inner = f" (in subgraph {a.name!r} of {node_label(node)}{where})"
            if a.type == _A.GRAPH:
                yield from walk_graphs(a.g, inner)
            elif a.type == _A.GRAPHS:
                for g in a.graphs:
                    yield from walk_graphs(g, inner)


def check_nodes(proto: onnx.ModelProto, opset: Mapping[str, int]) -> None:
    """Every node of the model (subgraphs and model-local function bodies included) against its
    schema and the values onnx's C++ cannot take. Raises InvalidGraph naming the first offender."""
    _check_no_recursion(proto)
    for f in proto.functions:
        f_opset = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in f.opset_import}
        for g, w in walk_graphs(onnx.GraphProto(node=f.node), f" (in function {f.domain}:{f.name})"):
            listed = {o.domain for o in f.opset_import}  # as written: onnxruntime does not equate "ai.onnx" with ""
            for n in g.node:
                if n.domain not in listed:
                    raise InvalidGraph(f"{node_label(n)}{w} is in domain {n.domain!r}, which the function's "
                                       "opset_import does not list; add the domain and its version to it.")
            _check_graph_nodes(g, w, f_opset)
        _check_function_body(f)
    local = {(f.domain, f.name): f for f in proto.functions}
    raw_imports = frozenset(o.domain for o in proto.opset_import)
    for g, w in walk_graphs(proto.graph):
        _check_graph_nodes(g, w, opset, raw_imports)
        if not local:  # (no function for a node to call)
            continue
        for n in g.node:
            f = local.get((n.domain, n.op_type))
            if f is not None and (len(n.input) != len(f.input) or len(n.output) > len(f.output)
                                  or any(not name for name in n.input)):
                raise InvalidGraph(f"{node_label(n)}{w} calls function {f.domain}:{f.name} with inputs {list(n.input)} "
                                   f"and outputs {list(n.output)}; it takes {list(f.input)} and gives {list(f.output)}, "
                                   "each input named.")


#: AttributeProto's serializer, mapped over a node's attributes in C (no Python frame per attribute)
_SERIALIZE = AttributeProto.SerializeToString


def _check_graph_nodes(graph: onnx.GraphProto, where: str, opset: Mapping[str, int],
                       raw_imports: frozenset[str] = frozenset(("ai.onnx",))) -> None:
    # (op type, domain, each attribute serialized, which inputs and outputs are named) of the nodes
    # whose schema and attribute checks passed: those checks read nothing else, and a model repeats
    # a few such nodes many times (a MobileNet's 52 convolutions have 6 attributes each and 10
    # distinct sets): serializing an attribute is one C call, where checking it reads each field
    # through Python.
    passed: set[tuple] = set()
    for node in graph.node:
        key = None
        raw_domain = node.domain
        op_type = node.op_type
        # A subgraph holder's attributes would serialize whole graphs, and ai.onnx.ml's nodes (a
        # tree ensemble's thousands of attribute values) seldom repeat: checked each time.
        if op_type not in _SUBGRAPH_OPS and raw_domain in ("", "ai.onnx"):
            # which inputs and outputs are named: their count where all are (nearly every node),
            # found in C, else a flag for each (an int and a tuple never compare equal)
            ins, outs = node.input[:], node.output[:]
            key = (op_type, raw_domain, tuple(map(_SERIALIZE, node.attribute)),
                   len(ins) if "" not in ins else tuple(map(bool, ins)),
                   len(outs) if "" not in outs else tuple(map(bool, outs)))
        known = key is not None and key in passed
        facts = attribute_facts(node) if not known and len(node.attribute) else []
        has_attributes = bool(facts)
        if has_attributes:
            check_attribute_encoding(node, where, facts)
        domain = "" if raw_domain == "ai.onnx" else raw_domain
        # a node like one that passed needs its schema only for a value check
        schema = schema_spec(op_type, opset[domain], domain) if domain in STANDARD_DOMAINS and \
            domain in opset and (not known or op_type in _VALUE_CHECKS) else None  # as _schema
        if schema is not None and not known:
            check_against_schema(node, schema, where, facts)
        # onnxruntime takes "ai.onnx" for "" in the main graph, not inside subgraphs.
        spelled_out = raw_domain == "ai.onnx" and bool(where) and "ai.onnx" not in raw_imports
        if domain not in opset or spelled_out:
            raise InvalidGraph(f"{node_label(node)}{where} is in domain {raw_domain!r}, which the model's "
                               "opset_import does not list; add the domain and its version to it.")
        if not domain:
            if has_attributes:
                _check_window(node, where, facts)
            check = _VALUE_CHECKS.get(op_type)
            if check is not None:
                check(node, where, schema)
        if key is not None:
            passed.add(key)


def _check_no_recursion(proto: onnx.ModelProto) -> None:
    """Model-local functions call each other without a cycle (onnx's inliner would recurse until the
    C++ stack overflows), and no two share a name."""
    local: dict[tuple[str, str], onnx.FunctionProto] = {}
    for f in proto.functions:
        key = (f.domain, f.name)
        if key in local and not f.overload:
            raise InvalidGraph(f"the model defines function {f.domain}:{f.name} twice; give each function a "
                               "distinct (domain, name).")
        local[key] = f
    state: dict[tuple[str, str], int] = {}  # 1: on the current call path, 2: done
    for key in local:
        _visit_calls(key, [], local, state)


def _visit_calls(key: tuple[str, str], path: list[str], local: dict[tuple[str, str], onnx.FunctionProto],
                 state: dict[tuple[str, str], int]) -> None:
    """``_check_no_recursion``'s depth-first walk from function ``key`` (a module function, not a
    closure: a closure that calls itself is a reference cycle each session would leave)."""
    if state.get(key) == 2:
        return
    if state.get(key) == 1:
        raise InvalidGraph(f"model-local functions call themselves: {' -> '.join(path + [':'.join(key)])}; "
                           "a function cannot call itself, directly or through others.")
    state[key] = 1
    for n in local[key].node:
        if (n.domain, n.op_type) in local:
            _visit_calls((n.domain, n.op_type), path + [":".join(key)], local, state)
    state[key] = 2


def _check_function_body(f: onnx.FunctionProto) -> None:
    """A function's nodes read only its inputs and what earlier nodes wrote, and its outputs are
    written (onnxruntime refuses the model otherwise, even if nothing calls the function)."""
    where = f"function {f.domain}:{f.name}"
    if any(not name for name in (*f.input, *f.output)):
        raise InvalidGraph(f"{where} has an input or output without a name (inputs {list(f.input)}, outputs "
                           f"{list(f.output)}); name each.")
    known = set(f.input)
    for n in f.node:
        for name in n.input:
            if name and name not in known:
                raise InvalidGraph(f"{node_label(n)} (in {where}) reads {name!r}, which is neither an input of the "
                                   "function nor written by a node before it.")
        known.update(o for o in n.output if o)
    missing = [o for o in f.output if o not in known]
    if missing:
        raise InvalidGraph(f"{where} declares output(s) {missing} that none of its nodes writes.")
