"""Graph-editing primitives shared by the optimizer passes (``optimizer/*.py``).

A pass finds a pattern of nodes, builds replacement nodes with ``make_node`` and swaps them in with
``replace_nodes``. Every helper keeps the invariants the passes rely on: graph inputs and outputs
keep their names, the node list stays topologically sorted (a replacement takes the place of the
last node it replaces, after which all of the pattern's inputs exist), and producer/consumer maps
are rebuilt after each edit.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper

from onnxhal.hal.graph import Graph, Node, ValueInfo
from onnxhal.runtime.loader.node_checks import schema_spec

#: Domain of the fused operators the optimizer introduces (kernels in cpu/kernels/fused.py).
FUSED_DOMAIN = "com.onnxhal"


def _empty_list(value: Any) -> bool:
    """Empty lists have no ONNX attribute type: such attributes are left out (kernels default them)."""
    return isinstance(value, (list, tuple)) and len(value) == 0


def make_node(graph: Graph, op_type: str, inputs: Sequence[str], outputs: Sequence[str], name: str,
              domain: str = "", **attrs: Any) -> Node:
    """A new node for ``graph`` with ``attrs`` as ONNX attributes (None and [] are left out).

    Registers the domain's opset on the graph (fused ops are version 1) and fills
    ``since_version`` from the ONNX schema, as the runtime does for loaded nodes.
    """
    protos = [make_attribute(k, v) for k, v in attrs.items() if v is not None and not _empty_list(v)]
    node = Node(op_type, inputs, outputs, name=name, domain=domain, attribute_protos=protos, owner=graph)
    if domain == FUSED_DOMAIN:
        graph.opset.setdefault(FUSED_DOMAIN, 1)
        node.since_version = 1
    else:
        # (an unknown op or domain has no schema: the runtime resolves it later)
        schema = schema_spec(op_type, graph.opset_version(domain) or onnx.defs.onnx_opset_version(), domain)
        node.since_version = schema.since_version if schema is not None else 0
    return node


_A = onnx.AttributeProto


def make_attribute(name: str, value: Any) -> onnx.AttributeProto:
    """``helper.make_attribute(name, value)``. The values passes write most (a Python int, float
    or str, a list of ints, a list of floats) are set on the proto directly: onnx's helper tests
    each value against the ``numbers`` ABCs and each list element's type, per fused node."""
    kind = type(value)
    if kind is int:
        return _A(name=name, type=_A.INT, i=value)
    if kind is float:
        return _A(name=name, type=_A.FLOAT, f=value)
    if kind is str:
        return _A(name=name, type=_A.STRING, s=value.encode("utf-8"))
    if (kind is list or kind is tuple) and value:
        kinds = set(map(type, value))
        if kinds == {int}:
            return _A(name=name, type=_A.INTS, ints=value)
        if kinds <= {int, float}:
            return _A(name=name, type=_A.FLOATS, floats=value)
    return helper.make_attribute(name, value)


def rewired(graph: Graph, node: Node, inputs: Sequence[str], outputs: Sequence[str], name: str) -> Node:
    """A new node of ``node``'s op, attributes and opset version, reading ``inputs``."""
    new = make_node(graph, node.op_type, inputs, outputs, name=name, domain=node.domain)
    new.attribute_protos = dict(node.attribute_protos)
    new.attributes = dict(node.attributes)
    new.since_version = node.since_version or new.since_version
    return new


def value_like(graph: Graph, like: str, base: str) -> str:
    """A new value name from ``base``, given ``like``'s type and shape when the graph knows them."""
    name = unique_name(graph, base)
    if like in graph.value_infos:
        graph.set_value_info(ValueInfo(name, graph.value_infos[like].type_proto))
    return name


def constant(graph: Graph, name: str) -> np.ndarray | None:
    """The value of ``name`` if it is a constant (non-overridable) initializer of ``graph``."""
    if name and graph.is_constant_initializer(name):
        return graph.initializers[name]
    return None


def graph_output_names(graph: Graph) -> set[str]:
    return {v.name for v in graph.outputs}


def sole_consumer(graph: Graph, name: str) -> Node | None:
    """The one node reading ``name``, if exactly one node reads it and it is not a graph output
    (so the value may disappear into a fusion)."""
    if name in graph_output_names(graph):
        return None
    consumers = graph.consumers(name)
    if len(consumers) != 1:
        return None
    node = consumers[0]
    if name in node.implicit_inputs:  # read by a subgraph: keep it as a value of its own
        return None
    return node


def unique_name(graph: Graph, base: str) -> str:
    """A value name not used anywhere in ``graph`` (initializers, value infos, node outputs)."""
    def taken(candidate: str) -> bool:
        return (candidate in graph.initializers or candidate in graph.value_infos
                or graph.producer(candidate) is not None or bool(graph.consumers(candidate)))

    name, i = base, 0
    while taken(name):
        i += 1
        name = f"{base}_{i}"
    return name


def add_initializer(graph: Graph, base: str, value: np.ndarray) -> str:
    """Store ``value`` as a new constant initializer named after ``base``; returns its name."""
    name = unique_name(graph, base)
    graph.initializers[name] = np.ascontiguousarray(value)
    return name


def live_nodes(graph: Graph, *op_types: str) -> Iterator[Node]:
    """The graph's nodes, from a snapshot, skipping those a rewrite removed meanwhile (a node is
    live while it still produces its first output), so passes can edit while iterating.

    ``op_types``, when given, keeps only nodes of those op types (any domain: the pass still checks
    it). A pass looks for one or two op types; the optimizer runs some thirty passes, each up to
    ``MAX_ROUNDS`` times, and visiting every node in Python for each was most of their cost."""
    if op_types:
        wanted = frozenset(op_types)
        snapshot = [n for n in graph.nodes if n.op_type in wanted]
    else:
        snapshot = list(graph.nodes)
    producer = graph.producer
    for node in snapshot:
        outputs = node.outputs
        if not outputs or not outputs[0] or producer(outputs[0]) is node:
            yield node


def replace_nodes(graph: Graph, old: Iterable[Node], new: Sequence[Node]) -> None:
    """Remove ``old`` and insert ``new`` where the last of ``old`` stood (topological order).

    Producer/consumer maps are updated for just these nodes (``Graph.index_node``); nodes holding
    subgraphs fall back to the full rebuild."""
    old = list(old)
    nodes = graph.nodes
    # list.index compares by identity here (Node defines no __eq__), a scan in C: a pass that
    # rewrites every convolution of a graph would otherwise scan the node list in Python per rewrite.
    # One scan a node ('in' before 'index' scanned the list twice: mobilenet_ts's 106 rewrites a
    # session 1.13 -> 0.98 ms).
    found = set()
    for n in old:
        try:
            found.add(nodes.index(n))
        except ValueError:
            pass
    positions = sorted(found)
    rebuilt, start = [], 0
    for p in positions[:-1]:
        rebuilt += nodes[start:p]
        start = p + 1
    rebuilt += nodes[start:positions[-1]]
    rebuilt += new
    rebuilt += nodes[positions[-1] + 1:]
    graph.nodes = rebuilt
    if any(n.subgraphs for n in (*old, *new)):
        graph.reindex()
        return
    for n in old:
        graph.unindex_node(n)
    for n in new:
        graph.index_node(n)


def remove_node(graph: Graph, node: Node) -> None:
    """Drop ``node`` from the graph and from the producer/consumer maps."""
    graph.nodes = [n for n in graph.nodes if n is not node]
    if node.subgraphs:
        graph.reindex()
    else:
        graph.unindex_node(node)


def unlink_node(graph: Graph, node: Node) -> None:
    """Take a node without subgraphs out of the producer/consumer maps; it stays in
    ``graph.nodes`` until ``remove_nodes``."""
    graph.unindex_node(node)


def remove_nodes(graph: Graph, nodes: Sequence[Node], unlinked: bool = False) -> None:
    """``remove_node`` for many nodes: one pass over the graph's node list, not one per node.
    ``unlinked``: each of ``nodes`` went through ``unlink_node`` already (its map entries are gone)."""
    if not nodes:
        return
    gone = {id(n) for n in nodes}
    graph.nodes = [n for n in graph.nodes if id(n) not in gone]
    if any(n.subgraphs for n in nodes):
        graph.reindex()
        return
    if unlinked:
        return
    for n in nodes:
        graph.unindex_node(n)


def remove_unused_value_infos(graph: Graph) -> None:
    """Forget type information of values no node, input, output or initializer names any more."""
    live = {v.name for v in (*graph.inputs, *graph.outputs, *graph.overridable)} | set(graph.initializers)
    for n in graph.nodes:
        live.update(n.inputs)
        live.update(n.outputs)
    for name in [k for k in graph.value_infos if k not in live]:
        graph.remove_value_info(name)


def static_shape(graph: Graph, name: str) -> tuple[int, ...] | None:
    """Fully known shape of ``name`` (initializer or value info), or None."""
    if name in graph.initializers:
        return tuple(graph.initializers[name].shape)
    vi = graph.value_info(name)
    return vi.shape if vi.has_static_shape else None


def rank(graph: Graph, name: str) -> int | None:
    if name in graph.initializers:
        return graph.initializers[name].ndim
    shape = graph.value_info(name).shape
    return None if shape is None else len(shape)


def scalar_constant(graph: Graph, name: str, like: str | None = None, kinds: str = "fiu") -> float | None:
    """The value of a one-element constant whose dtype kind is in ``kinds``, or None. With ``like``,
    also None unless the constant's rank is 0 or known to be at most ``like``'s: an operand of shape
    (1, 1, 1) broadcasts a value of lower rank up to rank 3, which a fused op replacing the
    elementwise one would not."""
    value = constant(graph, name)
    if value is None or value.size != 1 or value.dtype.kind not in kinds:
        return None
    if like is not None and value.ndim:
        r = rank(graph, like)
        if r is None or value.ndim > r:
            return None
    return float(value.reshape(-1)[0])
