"""``fuse_elementwise_chains``: connected elementwise nodes -> one ``com.onnxhal`` ElementwiseChain.

A GRU cell's gates in a Loop body (Add, Sigmoid, Mul, Sub, Tanh on tensors of a few dozen
elements) or a transformer's hand-written normalization tail cost, per node, a numpy call and
an executor step, a few us each, for tens of ns of arithmetic. This pass groups them into DAG
fragments run by one kernel (cpu/kernels/elementwise_chain.py, one C call where it can). CPU-only
sessions; recursive into subgraphs, where the per-node cost is paid per iteration.

A node joins when its op is one the kernel runs (``CHAIN_OPS``, without attributes; Sum, Max and
Min of two inputs), at opset 7 or later for the binary ones (numpy broadcasting), and every value
it reads and writes is known to be float32, or every one float64 (float16 and integers decline:
their plain kernels compute differently). Three ops join on their own terms (``_typed_fusible``):
a Cast to float or double of a bool or an integer (the mask of an attention block, a position
index) or of its own type; a Where of a bool condition and two float values; a Pow of a constant
exponent 2 or 3, which the chain runs as the Pow kernel does, as products (x * x, x * x * x). A group stays convex: a node joins the groups it reads
only where no path leaves one of them and comes back through a node outside, so the fused node
can take the place of its last member in a topological order. Groups of one node are left alone.
"""

from __future__ import annotations

import logging

import numpy as np

from onnxhal.hal.errors import InvalidGraph
from onnxhal.hal.graph import Graph, Node
from onnxhal.runtime.loader.model_loader import toposort
from onnxhal.runtime.optimizer.rewrite import FUSED_DOMAIN, graph_output_names, make_node

logger = logging.getLogger("onnxhal.optimizer")

#: op type -> arity of the ops ElementwiseChain runs (its ``OPS``); Sum, Max and Min of two inputs
CHAIN_OPS: dict[str, int] = {"Add": 2, "Sub": 2, "Mul": 2, "Div": 2, "Sum": 2, "Max": 2, "Min": 2, "Neg": 1,
                             "Abs": 1, "Sqrt": 1, "Exp": 1, "Log": 1, "Tanh": 1, "Sigmoid": 1, "Relu": 1,
                             "Reciprocal": 1, "Cast": 1, "Where": 3, "Pow": 2}
#: a group's size limits: the kernel's registers (inputs + ops) are at most 128
MAX_OPS = 48
MAX_INPUTS = 32
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
#: a Cast's target the kernel runs (onnx TensorProto FLOAT, DOUBLE) -> its dtype
_CAST_TARGETS = {1: _FLOATS[0], 11: _FLOATS[1]}
#: what a Cast to a float converts in the kernel (read as the float as loaded; uint64 is not)
_CAST_SOURCES = frozenset(np.dtype(t) for t in (np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32,
                                                  np.uint32, np.int64))
_BOOL = np.dtype(np.bool_)
#: the switch of Cast, Where and Pow's joining (read as the pass runs); off, they stay nodes of their own
TYPED_OPS_ENABLED = True


def _dtype(graph: Graph, name: str) -> np.dtype | None:
    g = graph
    while g is not None:  # an outer scope's constant, read by a Loop body
        if name in g.initializers:
            return g.initializers[name].dtype
        g = g.parent
    return graph.value_info(name).dtype


def _constant(graph: Graph, name: str) -> np.ndarray | None:
    g = graph
    while g is not None:
        if name in g.initializers:
            return g.initializers[name] if g.is_constant_initializer(name) else None
        g = g.parent
    return None


def pow_exponent(graph: Graph, node: Node) -> int | None:
    """2 or 3 where ``node`` is a Pow the chain runs as products (its exponent a constant of one
    element, of a rank the base's has, as the Pow kernel's condition for its products)."""
    e = _constant(graph, node.inputs[1])
    if e is None or e.size != 1 or e.dtype.kind not in "fiu" or e.reshape(-1)[0] not in (2, 3):
        return None
    shape = graph.value_info(node.inputs[0]).shape
    if e.ndim and (shape is None or len(shape) < e.ndim):
        return None
    return int(e.reshape(-1)[0])


def _one_element(graph: Graph, name: str) -> bool:
    """Whether ``name`` is known to hold one element: a shape's arithmetic (a size cast to float,
    divided, rounded up), which the executor's shape handling serves better as plain nodes
    (hf_mobilevit's six such chains made it 1.12x slower)."""
    shape = graph.value_info(name).shape
    return shape is not None and all(isinstance(d, int) and d == 1 for d in shape)


def _typed_fusible(graph: Graph, node: Node) -> bool:
    """Cast, Where and Pow's terms (see the module's docstring); the node's arity is checked."""
    out = _dtype(graph, node.outputs[0])
    if out not in _FLOATS:
        return False
    if node.op_type == "Cast":
        names = set(node.attribute_protos)
        to = node.attr("to")
        return (names <= {"to", "saturate"} and isinstance(to, int) and _CAST_TARGETS.get(to) == out
                and _dtype(graph, node.inputs[0]) in (*_CAST_SOURCES, out) and not _one_element(graph, node.inputs[0]))
    if node.attribute_protos:
        return False
    if node.op_type == "Where":
        return (_dtype(graph, node.inputs[0]) == _BOOL
                and {_dtype(graph, node.inputs[1]), _dtype(graph, node.inputs[2])} == {out})
    return _dtype(graph, node.inputs[0]) == out and pow_exponent(graph, node) is not None


def _fusible(graph: Graph, node: Node) -> bool:
    arity = CHAIN_OPS.get(node.op_type)
    if arity is None or node.domain not in ("", "ai.onnx") or node.subgraphs:
        return False
    if len(node.inputs) != arity or len(node.outputs) != 1 or not all(node.inputs) or not node.outputs[0]:
        return False
    if arity >= 2 and (node.since_version or 0) < 7:  # legacy broadcast (axis) semantics
        return False
    if node.op_type in ("Cast", "Where", "Pow"):
        return TYPED_OPS_ENABLED and _typed_fusible(graph, node)
    if node.attribute_protos:
        return False
    dtypes = {_dtype(graph, v) for v in (*node.inputs, node.outputs[0])}
    return len(dtypes) == 1 and next(iter(dtypes)) in _FLOATS


def _groups(graph: Graph) -> list[list[Node]]:
    """The convex groups of fusible nodes, in topological order each (see the module's docstring)."""
    parent: dict[int, int] = {}

    def find(g: int) -> int:
        while parent[g] != g:
            parent[g] = parent[parent[g]]
            g = parent[g]
        return g

    anc: dict[str, frozenset[int]] = {}  # value -> groups it depends on (raw ids: map through find)
    made_by: dict[str, int] = {}  # value written by a group member -> its group
    members: dict[int, list[Node]] = {}
    outside: dict[int, set[int]] = {}  # group -> groups its external inputs depend on
    for node in graph.nodes:
        reads = [v for v in (*node.inputs, *node.implicit_inputs) if v]
        above = {find(g) for v in reads for g in anc.get(v, ())}
        if not _fusible(graph, node):
            if above:
                for o in node.outputs:
                    anc[o] = frozenset(above)
            continue
        cands = {find(made_by[v]) for v in node.inputs if v in made_by}
        ext = [v for v in node.inputs if v not in made_by]
        ext_above = {find(g) for v in ext for g in anc.get(v, ())}
        ok = not (ext_above & cands) and sum(len(members[g]) for g in cands) < MAX_OPS
        for g in cands if ok else ():
            if {find(x) for x in outside[g]} & (cands - {g}):
                ok = False
                break
        if ok and cands:
            gid = min(cands)
            for g in cands - {gid}:
                parent[g] = gid
                members[gid] += members.pop(g)
                outside[gid] |= outside.pop(g)
            outside[gid] |= ext_above
        else:
            gid = len(parent)
            parent[gid] = gid
            members[gid] = []
            # every input is external to a new group: what it reads from other groups included
            outside[gid] = {find(g) for v in node.inputs for g in anc.get(v, ())}
        members[gid].append(node)
        made_by[node.outputs[0]] = gid
        anc[node.outputs[0]] = frozenset(above | {gid})
    order = {id(n): k for k, n in enumerate(graph.nodes)}
    return [sorted(m, key=lambda n: order[id(n)]) for m in members.values() if len(m) > 1]


def _chain_node(graph: Graph, group: list[Node], outputs_read: set[str]) -> Node | None:
    """The ElementwiseChain of ``group``, or None where it has too many inputs."""
    written = {n.outputs[0] for n in group}
    exponents = {id(n): pow_exponent(graph, n) for n in group if n.op_type == "Pow"}
    inputs: list[str] = []
    for n in group:
        read = n.inputs[:1] if n.op_type == "Pow" else n.inputs  # an exponent is the ops it makes
        inputs += [v for v in read if v not in written and v not in inputs]
    if len(inputs) > MAX_INPUTS:
        return None
    reg = {v: k for k, v in enumerate(inputs)}
    ops, operands, outputs, results, targets = [], [], [], [], []
    for n in group:
        if n.op_type == "Pow":  # the Pow kernel's products: x * x, then (x * x) * x
            x = reg[n.inputs[0]]
            ops.append("Mul")
            operands += [x, x]
            if exponents[id(n)] == 3:
                ops.append("Mul")
                operands += [len(inputs) + len(ops) - 2, x]
        else:
            ops.append("Add" if n.op_type == "Sum" else n.op_type)
            operands += [reg[v] for v in n.inputs]
        if n.op_type == "Cast":
            targets.append(int(n.attr("to")))
        reg[n.outputs[0]] = len(inputs) + len(ops) - 1
    for n in group:
        o = n.outputs[0]
        if o in outputs_read or any(c not in group for c in graph.consumers(o)):
            outputs.append(o)
            results.append(reg[o])
    first = group[0]
    return make_node(graph, "ElementwiseChain", inputs, outputs, name=f"{first.name or first.outputs[0]}_chain",
                     domain=FUSED_DOMAIN, ops=ops, operands=operands, results=results, to=targets)


def fuse_elementwise_chains(graph: Graph) -> bool:
    """Groups of two or more connected elementwise float nodes -> one ElementwiseChain each."""
    groups = _groups(graph)
    if not groups:
        return False
    outputs_read = graph_output_names(graph)
    replaced: dict[int, Node] = {}  # id of a group's last member -> the chain node
    dropped: set[int] = set()
    for group in groups:
        node = _chain_node(graph, group, outputs_read)
        if node is None:
            continue
        replaced[id(group[-1])] = node
        dropped.update(id(n) for n in group[:-1])
    if not replaced:
        return False
    nodes = [replaced.get(id(n), n) for n in graph.nodes if id(n) not in dropped]
    try:
        # a member's output read by a node between the members now comes from the chain: sort again
        nodes = toposort(nodes, graph.name)
    except InvalidGraph as e:  # a bug in the grouping: keep the graph as it was
        logger.warning("fuse_elementwise_chains: left graph %r unfused: %s", graph.name, e)
        return False
    graph.nodes = nodes
    graph.reindex()
    return True
