"""Per-run work taken out of control-flow bodies: outer-scope constants folded into subgraphs, and
loop-invariant nodes hoisted out of Loop and Scan bodies.

``hoist_loop_invariants(graph)`` looks at the If, Loop and Scan nodes of one graph:

- In every subgraph (If branches included), a node whose inputs are all constants, its own
  initializers or constant initializers of an enclosing graph, is evaluated once and becomes an
  initializer of the subgraph (onnxruntime's constant folding reads outer-scope constants too;
  the per-graph ``fold_constants`` sees only the graph's own initializers). A node whose
  evaluation fails stays, to fail where the model put it.
- In a Loop or Scan body, a node is invariant when each input is an outer-scope value, a constant
  initializer of the body or the output of another invariant node. Invariant nodes move, in order,
  to the enclosing graph just before the loop, and run once per run instead of once per iteration.

A hoisted node runs even when the loop runs zero times, which the body's node never did. So a node
is hoisted only where that cannot change the result: the loop provably runs at least once (a Loop
whose trip count is a constant >= 1, or absent, and whose condition is absent or a constant true;
a Scan whose sequence axis has a static length >= 1), or the node cannot raise for the inputs'
declared types and shapes (``cannot_raise``: elementwise math, broadcasts of compatible shapes,
MatMul with matching inner dims, Slice / Unsqueeze / Transpose / Gather with valid constant
parameters; the per-op rules below). Never hoisted: random ops and Dropout, nodes with subgraphs
(an If's branch may not be the one taken; a nested loop is hoisted from the inside instead, as
passes run bottom-up), ops outside the default domain, and nodes that write a body output.
"""

from __future__ import annotations

import logging

import numpy as np
from onnx import TypeProto, helper

from onnxhal.hal.graph import Graph, Node, ValueInfo, dtype_to_elem_type
from onnxhal.runtime.optimizer.cleanup import (
    MAX_FOLDED_BYTES,
    NOT_FOLDABLE,
    eliminate_no_ops,
    evaluate_node,
    fold_constants,
    remove_dead_nodes,
)
from onnxhal.runtime.optimizer.rewrite import graph_output_names, unique_name

logger = logging.getLogger("onnxhal.optimizer")

#: Ops never moved out of a loop: random ops and Dropout (their result differs from call to call)
#: and control flow.
NOT_HOISTABLE = NOT_FOLDABLE

#: Elementwise ops of one input defined for every value of their input types (no error, at most a
#: NaN or an infinity).
_TOTAL_UNARY = frozenset({
    "Abs", "Neg", "Relu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Reciprocal", "Floor", "Ceil", "Round",
    "Sign", "Erf", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh",
    "Softplus", "Softsign", "LeakyRelu", "Elu", "Selu", "Celu", "HardSigmoid", "HardSwish", "Mish", "Gelu",
    "ThresholdedRelu", "Not", "IsNaN", "IsInf", "Identity", "Shape", "Size",
})

#: Broadcasting elementwise ops that cannot raise once the shapes broadcast. Div and Pow only on
#: floats (integer division by zero and negative integer powers raise), Mod and BitShift never.
_BROADCAST = frozenset({
    "Add", "Sub", "Mul", "Max", "Min", "Mean", "Sum", "Equal", "Less", "Greater", "LessOrEqual",
    "GreaterOrEqual", "And", "Or", "Xor", "Where",
})
_FLOAT_BROADCAST = frozenset({"Div", "Pow"})

#: Reductions with a value for an empty set (0, 1 or NaN), so only their axes can be wrong.
_TOTAL_REDUCE = frozenset({"ReduceSum", "ReduceSumSquare", "ReduceMean", "ReduceProd", "ReduceL1", "ReduceL2"})


def hoist_loop_invariants(graph: Graph) -> bool:
    """Fold outer-scope constants into the subgraphs of ``graph``'s control-flow nodes and hoist the
    invariant nodes of its Loop and Scan bodies into ``graph``; True if anything changed."""
    changed = False
    for node in list(graph.nodes):
        if not node.subgraphs or node.domain:
            continue
        for sub in node.subgraph_list():
            if _fold_outer_constants(sub):
                changed = True
        if node.op_type in ("Loop", "Scan"):
            body = node.attr("body")
            if isinstance(body, Graph) and _hoist(graph, node, body):
                changed = True
    if changed:
        graph.reindex()
    return changed


# -- constants of enclosing scopes ------------------------------------------------------------

def _defines(graph: Graph, name: str) -> bool:
    return (graph.producer(name) is not None or name in graph.initializers
            or any(v.name == name for v in graph.inputs) or any(v.name == name for v in graph.overridable))


def scoped_constant(graph: Graph, name: str) -> np.ndarray | None:
    """The value of ``name`` as ``graph`` sees it, if that is a constant initializer of ``graph`` or
    of the nearest enclosing graph that defines the name."""
    g: Graph | None = graph
    while g is not None:
        if g.is_constant_initializer(name):
            return g.initializers[name]
        if _defines(g, name):
            return None
        g = g.parent
    return None


def _scoped_value_info(graph: Graph, name: str) -> ValueInfo | None:
    g: Graph | None = graph
    while g is not None:
        vi = g.value_infos.get(name)
        if vi is not None:
            return vi
        g = g.parent
    return None


def _fold_outer_constants(sub: Graph) -> bool:
    """Evaluate the nodes of ``sub`` whose inputs are all constants, where at least one comes from an
    enclosing graph (``sub``'s own ``fold_constants`` takes the rest)."""
    outputs = graph_output_names(sub)
    folded: list[Node] = []
    for node in list(sub.nodes):
        if (node.domain or node.subgraphs or not node.inputs or node.op_type in NOT_FOLDABLE
                or any(o in outputs for o in node.outputs)):
            continue
        if all(not i or sub.is_constant_initializer(i) for i in node.inputs):
            continue  # the subgraph's own folding takes it
        values = [scoped_constant(sub, i) if i else None for i in node.inputs]
        if any(i and v is None for i, v in zip(node.inputs, values)):
            continue
        try:
            results = evaluate_node(sub, node, values)
        except Exception as exc:  # it stays, to fail (or not) where the model put it
            logger.debug("cannot fold %s %r from outer constants: %s", node.op_type, node.name, exc)
            continue
        if any(r.nbytes > MAX_FOLDED_BYTES for r in results):
            continue
        for name, value in zip(node.outputs, results):
            if name:
                sub.initializers[name] = value
                sub.set_value_info(ValueInfo(name, _tensor_type(value)))
        sub.unindex_node(node)
        folded.append(node)
    if not folded:
        return False
    gone = {id(n) for n in folded}
    sub.nodes = [n for n in sub.nodes if id(n) not in gone]
    sub.reindex()
    # The subgraph's own cleanup ran before these constants were known (subgraphs are optimized
    # before the graph around them): what they make constant or a no-op goes now.
    fold_constants(sub)
    eliminate_no_ops(sub)
    remove_dead_nodes(sub)
    return True


def _tensor_type(value: np.ndarray) -> TypeProto:
    return helper.make_tensor_type_proto(dtype_to_elem_type(value.dtype), value.shape)


# -- hoisting -----------------------------------------------------------------------------------

def _runs_at_least_once(graph: Graph, loop: Node, body: Graph) -> bool:
    """Whether the loop's body provably runs at least once per run of the loop."""
    if loop.op_type == "Loop":
        trips = loop.inputs[0] if loop.inputs else ""
        cond = loop.inputs[1] if len(loop.inputs) > 1 else ""
        m = scoped_constant(graph, trips) if trips else None
        c = scoped_constant(graph, cond) if cond else None
        trips_ok = not trips or (m is not None and m.size == 1 and int(m.reshape(-1)[0]) >= 1)
        cond_ok = not cond or (c is not None and c.size == 1 and bool(c.reshape(-1)[0]))
        return trips_ok and cond_ok
    if loop.since_version and loop.since_version < 9:  # batched Scan: a batch of 0 runs nothing
        return False
    n_scan = loop.attr("num_scan_inputs") or 0
    if n_scan <= 0:
        return False
    first = loop.inputs[len(loop.inputs) - n_scan]
    shape = _shape(graph, first)
    axes = loop.attr("scan_input_axes") or [0] * n_scan
    if shape is None or not -len(shape) <= axes[0] < len(shape):
        return False
    steps = shape[axes[0]]
    return isinstance(steps, int) and steps >= 1


def _name_free(graph: Graph, name: str) -> bool:
    """Whether ``name`` may be defined in ``graph``: nothing in it or around it uses the name."""
    if (name in graph.initializers or graph.producer(name) is not None or graph.consumers(name)
            or name in graph.value_infos or any(v.name == name for v in graph.outputs)):
        return False
    g = graph.parent
    while g is not None:
        if _defines(g, name):
            return False
        g = g.parent
    return True


def _hoist(graph: Graph, loop: Node, body: Graph) -> bool:
    """Move the body's invariant nodes into ``graph``, just before ``loop``."""
    always = _runs_at_least_once(graph, loop, body)
    formal = set(body.input_names)
    body_outputs = graph_output_names(body)
    hoisted_values: set[str] = set()
    moved: list[Node] = []
    copies: dict[str, str] = {}  # body initializer -> its copy in graph

    def invariant(name: str) -> bool:
        if not name or name in hoisted_values:
            return True
        if name in formal or body.producer(name) is not None:
            return False
        if name in body.initializers:
            return body.is_constant_initializer(name)
        return True  # read from an enclosing scope

    for node in body.nodes:
        if (node.domain or node.subgraphs or node.op_type in NOT_HOISTABLE
                or any(o in body_outputs for o in node.outputs) or not node.outputs
                or not all(invariant(i) for i in node.inputs)):
            continue
        if not always and not cannot_raise(body, node):
            continue
        if not all(_name_free(graph, o) for o in node.outputs if o):
            continue
        moved.append(node)
        hoisted_values.update(o for o in node.outputs if o)
    if not moved:
        return False
    at = graph.nodes.index(loop)
    for node in moved:
        renamed = []
        for i in node.inputs:
            if i and i in body.initializers and i not in hoisted_values:
                if i not in copies:
                    copies[i] = unique_name(graph, i)
                    graph.initializers[copies[i]] = body.initializers[i]
                    graph.set_value_info(ValueInfo(copies[i], _tensor_type(body.initializers[i])))
                renamed.append(copies[i])
            else:
                renamed.append(i)
        node.inputs = tuple(renamed)
        for o in node.outputs:
            vi = body.value_infos.get(o)
            if o and vi is not None:
                graph.set_value_info(vi)
                body.remove_value_info(o)
    gone = {id(n) for n in moved}
    body.nodes = [n for n in body.nodes if id(n) not in gone]
    body.reindex()
    remove_dead_nodes(body)  # body constants only the hoisted nodes read
    graph.nodes[at:at] = moved
    logger.debug("hoisted %d nodes out of %s %r", len(moved), loop.op_type, loop.name)
    return True


# -- which nodes cannot raise -------------------------------------------------------------------

def _shape(graph: Graph, name: str) -> tuple | None:
    value = scoped_constant(graph, name)
    if value is not None:
        return value.shape
    vi = _scoped_value_info(graph, name)
    return vi.shape if vi is not None else None


def _dtype(graph: Graph, name: str) -> np.dtype | None:
    value = scoped_constant(graph, name)
    if value is not None:
        return value.dtype
    vi = _scoped_value_info(graph, name)
    return vi.dtype if vi is not None else None


def _same_dim(a: object, b: object) -> bool:
    """Equal by declaration: the same number, or the same symbol."""
    return a is not None and a != "" and type(a) is type(b) and a == b


def _broadcast(shapes: list[tuple]) -> bool:
    """Whether shapes, all known, broadcast (numpy rules) whatever values their symbols take."""
    rank = max(len(s) for s in shapes)
    for k in range(1, rank + 1):
        dims = [s[-k] for s in shapes if len(s) >= k]
        dims = [d for d in dims if d != 1]
        if dims and not all(_same_dim(dims[0], d) for d in dims[1:]):
            return False
    return True


def _constant_ints(graph: Graph, name: str) -> list[int] | None:
    value = scoped_constant(graph, name) if name else None
    if value is None or value.dtype.kind not in "iu":
        return None
    return [int(v) for v in value.reshape(-1)]


def _valid_axes(axes: list[int], rank: int) -> bool:
    normal = [a + rank if a < 0 else a for a in axes]
    return all(0 <= a < rank for a in normal) and len(set(normal)) == len(normal)


def cannot_raise(graph: Graph, node: Node) -> bool:
    """Whether ``node`` of ``graph`` runs without an error on any inputs of the declared types and
    shapes (symbolic dims equal where their symbols are). False where that is not known."""
    op = node.op_type
    ins = node.inputs
    shapes = [_shape(graph, i) if i else None for i in ins]
    if op == "Constant":
        return True
    if op in _TOTAL_UNARY:
        return True
    if op == "Cast":
        src, dst = _dtype(graph, ins[0]), node.attr("to")
        return src is not None and src.kind in "biuf" and dst in (1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13)
    if op in _BROADCAST or op in _FLOAT_BROADCAST:
        if any(s is None for s in shapes) or not shapes:
            return False
        if op in _FLOAT_BROADCAST and any((_dtype(graph, i) is None or _dtype(graph, i).kind != "f") for i in ins):
            return False
        return _broadcast(shapes)
    if op == "MatMul":
        a, b = shapes
        if a is None or b is None or not a or not b:
            return False
        k_a = a[-1]
        k_b = b[0] if len(b) == 1 else b[-2]
        if not (_same_dim(k_a, k_b)):
            return False
        return len(a) <= 2 or len(b) <= 2 or _broadcast([a[:-2], b[:-2]])
    if op == "Gemm":
        a, b = shapes[0], shapes[1]
        if a is None or b is None or len(a) != 2 or len(b) != 2:
            return False
        m, k_a = (a[1], a[0]) if node.attr("transA", 0) else (a[0], a[1])
        k_b, n = (b[1], b[0]) if node.attr("transB", 0) else (b[0], b[1])
        if not _same_dim(k_a, k_b):
            return False
        if len(ins) > 2 and ins[2]:
            c = shapes[2]
            return c is not None and len(c) <= 2 and all(
                d == 1 or _same_dim(d, want) for d, want in zip(c[::-1], (n, m)))
        return True
    if op == "Transpose":
        rank = len(shapes[0]) if shapes[0] is not None else None
        perm = node.attr("perm")
        return rank is not None and (perm is None or sorted(perm) == list(range(rank)))
    if op == "Unsqueeze":
        rank = len(shapes[0]) if shapes[0] is not None else None
        axes = node.attr("axes") if node.since_version and node.since_version < 13 else \
            (_constant_ints(graph, ins[1]) if len(ins) > 1 else None)
        return rank is not None and axes is not None and _valid_axes(axes, rank + len(axes))
    if op in _TOTAL_REDUCE:
        rank = len(shapes[0]) if shapes[0] is not None else None
        if "axes" in node.attributes:
            axes = node.attr("axes")
        elif len(ins) > 1 and ins[1]:
            axes = _constant_ints(graph, ins[1])
        else:
            axes = []  # all axes
        return rank is not None and axes is not None and _valid_axes(axes, rank)
    if op == "Slice":
        return _slice_cannot_raise(graph, node, shapes[0])
    if op == "Gather":
        data, indices = shapes[0], _constant_ints(graph, ins[1])
        axis = node.attr("axis", 0)
        if data is None or indices is None or not -len(data) <= axis < len(data):
            return False
        size = data[axis]
        return isinstance(size, int) and all(-size <= i < size for i in indices)
    if op == "Concat":
        if any(s is None for s in shapes) or not shapes:
            return False
        rank = len(shapes[0])
        axis = node.attr("axis", 0)
        if any(len(s) != rank for s in shapes) or not -rank <= axis < rank:
            return False
        axis %= rank
        return all(_same_dim(shapes[0][d], s[d]) for s in shapes[1:] for d in range(rank) if d != axis)
    if op == "Reshape":
        data, target = shapes[0], _constant_ints(graph, ins[1]) if len(ins) > 1 else None
        if data is None or target is None or not all(isinstance(d, int) for d in data):
            return False
        if not node.attr("allowzero", 0):
            if any(d == 0 and k >= len(data) for k, d in enumerate(target)):
                return False
            target = [data[k] if d == 0 else d for k, d in enumerate(target)]
        try:
            np.empty(data, dtype=np.bool_).reshape(target)
        except ValueError:
            return False
        return True
    return False


def _slice_cannot_raise(graph: Graph, node: Node, data: tuple | None) -> bool:
    if data is None:
        return False
    rank = len(data)
    if node.since_version and node.since_version < 10:
        starts, ends = node.attr("starts"), node.attr("ends")
        axes = node.attr("axes", list(range(len(starts or []))))
        steps = [1] * len(starts or [])
    else:
        ins = node.inputs
        starts = _constant_ints(graph, ins[1])
        ends = _constant_ints(graph, ins[2])
        axes = _constant_ints(graph, ins[3]) if len(ins) > 3 and ins[3] else \
            (list(range(len(starts))) if starts is not None else None)
        steps = _constant_ints(graph, ins[4]) if len(ins) > 4 and ins[4] else \
            ([1] * len(starts) if starts is not None else None)
    if starts is None or ends is None or axes is None or steps is None:
        return False
    return (len(starts) == len(ends) == len(axes) == len(steps) and _valid_axes(axes, rank)
            and all(s != 0 for s in steps))
