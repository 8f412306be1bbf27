"""Pass ``redirect_shape_reads``: a Shape of a computed tensor reads a graph input's dims instead,
where the dims it reads are PROVEN to be that input's.

TorchScript exports take the batch and sequence dims for the attention mask and the head splits
from ``Shape`` of an activation (the embeddings' LayerNorm output in BERT, the token embeddings in
GPT-2 and T5). On an EP that compiles fused partitions, such a Shape is a host node that reads a
value of the device partition and feeds another node of it (through the mask chain), so the
partition is cut in two there, each piece paying its copies, a wait and its launch gaps. Read from
``input_ids``, the same Shape depends on no partition, and the mask chain runs before it.

The rewrite is only made where it is proven, never from the dim names shape inference writes: two
inputs both declared ``[batch, sequence]`` may be fed ``[2, 12]`` and ``[1, 12]`` (onnxruntime does
not check that equal names get equal sizes), and a broadcasting Add of the two then has the size of
the larger, not of either by name. So each dim is tracked as an expression of where it comes from
(``Dim``): a static size, the axis ``k`` of graph input ``x`` (an *atom*: the same atom is the same
number at run time, whatever the names say), or ``min(atom, c)`` (a Slice ``[0:atom]`` of a static
axis ``c``). A dim of a broadcasting op's output is the atom ``E`` only where every operand's dim
at that position is absent (lower rank), the static size 1, ``E`` itself or ``min(E, c)``
(broadcasting ``E`` against ``min(E, c)`` gives ``E`` wherever it succeeds: they are equal, or
``c`` < ``E`` and only ``c`` = 1 broadcasts); a dim nothing proves (an unknown one, another atom,
two different static sizes) is unknown, and an unknown dim is never redirected. Small integer
values computed from shapes (``Shape -> Gather -> Unsqueeze -> Concat``, the ``Where(x == -1, 1,
x)`` of an Expand target) are tracked element by element, so a Reshape or Expand to such a target
keeps the atoms.

A Shape whose every reader is a ``Gather`` of constant non-negative positions (or one that reads
all of its input's dims) is redirected when each position it reads is, at that same position, the
dim of one graph input; the Shape's result is then the same at every run, for every feed, so the
rewrite holds for every EP. Ops not listed here make unknown dims: the pass proves less, never
something false.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from onnxhal.hal.graph import Graph, Node
from onnxhal.runtime.optimizer.rewrite import constant, graph_output_names, live_nodes, unique_name


@dataclass(frozen=True)
class Axis:
    """Axis ``axis`` of graph input ``name``: one number per run."""

    name: str
    axis: int


@dataclass(frozen=True)
class AxisMin:
    """``min(atom, bound)``: a Slice ``[0:atom]`` of an axis of static size ``bound`` (or ``[0:bound]``
    of an axis of size ``atom``)."""

    atom: Axis
    bound: int


#: A dim: a static size, an expression of the inputs' dims, or None (unknown).
Dim = int | Axis | AxisMin | None
#: A small integer value tracked element by element: its shape and its elements (a Dim, a bool
#: for comparisons, None unknown), or None when nothing is known of it.
_Value = tuple[tuple[int, ...], tuple]

#: Largest tracked value (a shape of rank 6 and a few more), as rule shape_values takes.
MAX_ELEMENTS = 64

_UNARY = frozenset({"Cast", "Relu", "Neg", "Abs", "Sqrt", "Exp", "Log", "Erf", "Tanh", "Sigmoid", "Reciprocal",
                    "Not", "Identity", "Softmax", "LogSoftmax", "Gelu", "Dropout", "LayerNormalization", "IsNaN",
                    "Floor", "Ceil", "Round", "Sign", "Sin", "Cos", "HardSigmoid", "LeakyRelu", "Elu", "Selu",
                    "Softplus", "Clip", "CastLike", "Celu", "Mish", "HardSwish", "InstanceNormalization",
                    "BatchNormalization", "Shrink", "ThresholdedRelu"})
_BROADCAST = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Where", "And", "Or", "Xor", "Equal", "Less", "Greater",
                        "LessOrEqual", "GreaterOrEqual", "Max", "Min", "Mod", "Sum", "Mean", "PRelu",
                        "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor"})
_REDUCE = frozenset({"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                     "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"})
#: TensorProto.INT32 and INT64: a Cast to them keeps a shape value's elements.
_WIDE_INTS = frozenset({6, 7})
#: Reductions whose axes are an input from this opset on (an attribute before).
_AXES_INPUT_FROM = {"ReduceSum": 13}


def broadcast_dim(dims: Sequence[Dim]) -> Dim:
    """The output dim of a broadcast of ``dims`` (one per operand that reaches this position), or
    None where it is not proven (see the module docstring)."""
    if any(d is None for d in dims):
        return None
    rest = [d for d in dims if d != 1]
    if not rest:
        return 1
    statics = {d for d in rest if isinstance(d, int)}
    if statics:
        # a symbolic operand must equal the static size for the broadcast to succeed
        return statics.pop() if len(statics) == 1 else None
    atoms = {d if isinstance(d, Axis) else d.atom for d in rest}  # type: ignore[union-attr]
    if len(atoms) != 1:
        return None
    atom = atoms.pop()
    if any(d == atom for d in rest):
        return atom
    mins = set(rest)
    return mins.pop() if len(mins) == 1 else None


def _broadcast(shapes: Sequence[tuple[Dim, ...] | None]) -> tuple[Dim, ...] | None:
    if any(s is None for s in shapes) or not shapes:
        return None
    first = shapes[0]
    if all(s == first for s in shapes):
        # operands of one shape (a residual Add, a gate's Mul): ``broadcast_dim`` of equal dims is
        # that dim, whatever it is (1, a size, an atom, a min, unknown), so the shape is the result
        return first
    rank = max(len(s) for s in shapes)  # type: ignore[arg-type]
    out = []
    for k in range(rank):
        at = [s[len(s) - rank + k] for s in shapes if len(s) - rank + k >= 0]  # type: ignore[arg-type]
        out.append(broadcast_dim(at))
    return tuple(out)


class _Shapes:
    """Dims (``dims``) and small integer values (``values``) of a graph's values, in one pass over
    its nodes in topological order; only over the first ``upto`` nodes where given (what a node
    computes depends on the nodes before it alone)."""

    def __init__(self, graph: Graph, upto: int | None = None) -> None:
        self.graph = graph
        self.dims: dict[str, tuple[Dim, ...]] = {}
        self.values: dict[str, _Value] = {}
        # onnxruntime checks a feed against the main graph's static input dims; a subgraph's
        # declared input dims are not checked, so each is an axis there
        checked = graph.parent is None
        for vi in graph.inputs:
            shape = vi.shape
            if shape is not None and not graph.is_constant_initializer(vi.name):
                self.dims[vi.name] = tuple(d if checked and isinstance(d, int) and d >= 0 else Axis(vi.name, k)
                                           for k, d in enumerate(shape))
        for node in graph.nodes if upto is None else graph.nodes[:upto]:
            if node.domain not in ("", "ai.onnx") or node.subgraphs:
                continue
            try:
                self._visit(node)
            except (ValueError, TypeError, IndexError, KeyError, OverflowError):
                continue  # a malformed node proves nothing

    # -- lookups ---------------------------------------------------------------------------------
    def shape(self, name: str) -> tuple[Dim, ...] | None:
        if not name:
            return None
        if name in self.dims:
            return self.dims[name]
        c = constant(self.graph, name)
        if c is not None:
            return tuple(int(d) for d in np.shape(c))
        return None

    def value(self, name: str) -> _Value | None:
        if name in self.values:
            return self.values[name]
        c = constant(self.graph, name)
        if c is None:
            return None
        a = np.asarray(c)
        if a.size > MAX_ELEMENTS or a.dtype.kind not in "iub":
            return None
        return tuple(a.shape), tuple(bool(x) if a.dtype.kind == "b" else int(x) for x in a.reshape(-1))

    def ints(self, name: str) -> list[int] | None:
        """A constant integer input's values."""
        c = constant(self.graph, name) if name else None
        if c is None or np.asarray(c).dtype.kind not in "iu":
            return None
        return [int(x) for x in np.asarray(c).reshape(-1)]

    def _set(self, name: str, dims: tuple[Dim, ...] | None, value: _Value | None = None) -> None:
        if dims is not None and name:
            self.dims[name] = dims
        if value is not None and name and len(value[1]) <= MAX_ELEMENTS:
            self.values[name] = value

    # -- ops -------------------------------------------------------------------------------------
    def _visit(self, n: Node) -> None:
        op, ins, out = n.op_type, n.inputs, n.outputs[0] if n.outputs else ""
        if op in _UNARY:
            self._set(out, self.shape(ins[0]))
            # a Cast to bool or a narrow type changes the elements: only the wide integer ones keep them
            if op == "Identity" or (op == "Cast" and n.attr("to") in _WIDE_INTS):
                self._set(out, None, self.value(ins[0]))
        elif op in _BROADCAST:
            self._set(out, _broadcast([self.shape(i) for i in ins if i]))
            self._set(out, None, self._elementwise_value(n))
        elif op == "Shape":
            self._shape(n)
        elif op == "Gather":
            self._gather(n)
        elif op in ("Unsqueeze", "Squeeze"):
            self._squeeze(n)
        elif op == "Concat":
            self._concat(n)
        elif op == "Transpose":
            s = self.shape(ins[0])
            if s is not None:
                perm = n.attr("perm") or list(range(len(s)))[::-1]
                self._set(out, tuple(s[int(p)] for p in perm))
        elif op in _REDUCE:
            self._reduce(n)
        elif op == "MatMul":
            a, b = self.shape(ins[0]), self.shape(ins[1])
            if a is not None and b is not None and len(a) >= 2 and len(b) >= 2:
                batch = _broadcast([a[:-2], b[:-2]])
                if batch is not None:
                    self._set(out, (*batch, a[-2], b[-1]))
        elif op == "Reshape":
            self._reshape(n)
        elif op == "Expand":
            target = self.value(ins[1])
            if target is not None and len(target[0]) == 1:
                self._set(out, _broadcast([self.shape(ins[0]), tuple(_as_dim(e) for e in target[1])]))
        elif op == "ConstantOfShape":
            target = self.value(ins[0])
            if target is not None and len(target[0]) == 1:
                dims = tuple(_as_dim(e) for e in target[1])
                self._set(out, dims)
                fill = n.attr("value")
                fill = np.zeros(1, np.float32) if fill is None else np.asarray(fill).reshape(-1)
                if fill.dtype.kind in "iub" and all(isinstance(d, int) for d in dims):
                    count = int(np.prod(dims))  # type: ignore[arg-type]
                    elem = bool(fill[0]) if fill.dtype.kind == "b" else int(fill[0])
                    self._set(out, None, (tuple(int(d) for d in dims), (elem,) * count))  # type: ignore[arg-type]
        elif op == "Slice":
            self._slice(n)
        elif op == "GatherElements":
            self._set(out, self.shape(ins[1]))
        elif op == "Range":
            self._range(n)

    def _shape(self, n: Node) -> None:
        s = self.shape(n.inputs[0])
        if s is None:
            return
        start, end = n.attr("start", 0), n.attr("end", None)
        r = len(s)
        lo = max(0, min(r, start + r if start < 0 else start))
        hi = r if end is None else max(0, min(r, end + r if end < 0 else end))
        part = s[lo:hi] if hi > lo else ()
        self._set(n.outputs[0], (len(part),), ((len(part),), tuple(part)))

    def _gather(self, n: Node) -> None:
        data, idx = self.shape(n.inputs[0]), self.shape(n.inputs[1])
        axis = n.attr("axis", 0)
        if data is not None and idx is not None:
            a = axis + len(data) if axis < 0 else axis
            self._set(n.outputs[0], (*data[:a], *idx, *data[a + 1:]))
        v, positions = self.value(n.inputs[0]), self.ints(n.inputs[1])
        if v is not None and positions is not None and len(v[0]) == 1 and axis in (0, -1):
            size = v[0][0]
            if all(-size <= p < size for p in positions):
                picked = tuple(v[1][p] for p in positions)
                shape = tuple(int(d) for d in np.shape(constant(self.graph, n.inputs[1])))
                self._set(n.outputs[0], None, (shape, picked))

    def _axes(self, n: Node, from_opset: int) -> list[int] | None:
        if self.graph.opset_version("") >= from_opset:
            return self.ints(n.inputs[1]) if len(n.inputs) > 1 and n.inputs[1] else None
        axes = n.attr("axes")
        return None if axes is None else [int(a) for a in axes]

    def _squeeze(self, n: Node) -> None:
        s = self.shape(n.inputs[0])
        axes = self._axes(n, 13)
        v = self.value(n.inputs[0])
        if s is None or axes is None:
            return
        if n.op_type == "Unsqueeze":
            r = len(s) + len(axes)
            norm = sorted(a + r if a < 0 else a for a in axes)
            it = iter(s)
            out = tuple(1 if k in norm else next(it) for k in range(r))
        else:
            norm = {a + len(s) if a < 0 else a for a in axes}
            if any(s[k] != 1 for k in norm):
                return
            out = tuple(d for k, d in enumerate(s) if k not in norm)
        self._set(n.outputs[0], out)
        if v is not None and all(isinstance(d, int) for d in out):
            self._set(n.outputs[0], None, (tuple(int(d) for d in out), v[1]))  # type: ignore[arg-type]

    def _concat(self, n: Node) -> None:
        shapes = [self.shape(i) for i in n.inputs if i]
        axis = n.attr("axis", 0)
        if shapes and all(s is not None for s in shapes) and len({len(s) for s in shapes}) == 1:  # type: ignore[arg-type]
            r = len(shapes[0])  # type: ignore[arg-type]
            a = axis + r if axis < 0 else axis
            out: list[Dim] = []
            for k in range(r):
                col = [s[k] for s in shapes]  # type: ignore[index]
                if k == a:
                    out.append(sum(col) if all(isinstance(d, int) for d in col) else None)  # type: ignore[arg-type]
                else:  # Concat needs equal dims: any known one is every operand's
                    out.append(next((d for d in col if d is not None), None))
            self._set(n.outputs[0], tuple(out))
        values = [self.value(i) for i in n.inputs if i]
        if values and all(v is not None and len(v[0]) == 1 for v in values):
            elems = tuple(e for v in values for e in v[1])  # type: ignore[union-attr]
            self._set(n.outputs[0], None, ((len(elems),), elems))

    def _reduce(self, n: Node) -> None:
        s = self.shape(n.inputs[0])
        if s is None:
            return
        axes = self._axes(n, _AXES_INPUT_FROM.get(n.op_type, 18))
        if not axes:
            return  # all axes (or noop_with_empty_axes): left unknown
        norm = {a + len(s) if a < 0 else a for a in axes}
        if n.attr("keepdims", 1):
            self._set(n.outputs[0], tuple(1 if k in norm else d for k, d in enumerate(s)))
        else:
            self._set(n.outputs[0], tuple(d for k, d in enumerate(s) if k not in norm))

    def _reshape(self, n: Node) -> None:
        s, target = self.shape(n.inputs[0]), self.value(n.inputs[1])
        if target is None or len(target[0]) != 1:
            return
        allowzero = n.attr("allowzero", 0)
        out: list[Dim] = []
        for k, e in enumerate(target[1]):
            d = _as_dim(e)
            if isinstance(d, int) and d > 0:
                out.append(d)
            elif d == 0 and not allowzero:
                out.append(s[k] if s is not None and k < len(s) else None)
            elif isinstance(d, (Axis, AxisMin)):
                # an atom may be 0 at run time, which (allowzero 0) copies the input's dim: only
                # proven where that dim is the same expression
                same = allowzero or (s is not None and k < len(s) and s[k] == d)
                out.append(d if same else None)
            else:
                out.append(None)
        if out.count(None) == 1 and target[1].count(-1) == 1 and s is not None and not allowzero:
            out[out.index(None)] = inferred_dim(s, [d for d in out if d is not None])
        self._set(n.outputs[0], tuple(out))
        v = self.value(n.inputs[0])
        if v is not None and all(isinstance(d, int) for d in out):
            self._set(n.outputs[0], None, (tuple(int(d) for d in out), v[1]))  # type: ignore[arg-type]

    def _slice(self, n: Node) -> None:
        s = self.shape(n.inputs[0])
        if s is None or len(n.inputs) < 3:
            return
        starts, ends = self.value(n.inputs[1]), self.value(n.inputs[2])
        axes = self.ints(n.inputs[3]) if len(n.inputs) > 3 and n.inputs[3] else list(range(len(s)))
        steps = self.ints(n.inputs[4]) if len(n.inputs) > 4 and n.inputs[4] else None
        if starts is None or ends is None or axes is None or len(starts[1]) != len(axes) or len(ends[1]) != len(axes):
            return
        out = list(s)
        for j, a in enumerate(axes):
            a = a + len(s) if a < 0 else a
            step = steps[j] if steps is not None else 1
            out[a] = _sliced(s[a], starts[1][j], ends[1][j]) if step == 1 else None
        self._set(n.outputs[0], tuple(out))

    def _range(self, n: Node) -> None:
        start, limit, delta = (self.value(i) for i in n.inputs[:3])
        if start is None or limit is None or delta is None or len(limit[1]) != 1:
            return
        if start[1] == (0,) and delta[1] == (1,):
            d = _as_dim(limit[1][0])
            if d is not None and not (isinstance(d, int) and d < 0):
                self._set(n.outputs[0], (d,))

    def _elementwise_value(self, n: Node) -> _Value | None:
        """The elements of a comparison of tracked dims with constants, and of a Where choosing by
        one (``Where(x == -1, 1, x)``); a dim is never negative."""
        values = [self.value(i) for i in n.inputs if i]
        if any(v is None for v in values):
            return None
        size = max(len(v[1]) for v in values)  # type: ignore[index]
        shape = next(v[0] for v in values if len(v[1]) == size)  # type: ignore[index]
        if not all(v[0] == shape or len(v[1]) == 1 for v in values):  # type: ignore[index]
            return None  # a broadcast of two shapes ([2, 1] with [1, 2]) is not element by element
        cols = [v[1] * size if len(v[1]) == 1 else v[1] for v in values]  # type: ignore[index]
        op = n.op_type
        if op == "Where":
            return shape, tuple(a if c is True else b if c is False else None for c, a, b in zip(*cols))
        if op == "Equal" and len(cols) == 2:
            return shape, tuple(_equal(a, b) for a, b in zip(*cols))
        if op in ("Add", "Sub", "Mul") and len(cols) == 2:
            return shape, tuple(_arith(op, a, b) for a, b in zip(*cols))
        return None


def inferred_dim(dims: Sequence[Dim], others: Sequence[Dim]) -> Dim:
    """A Reshape's -1 dim from the input's dims and the target's other dims: the symbolic ones
    must pair off, the static ones left divide. The product of the others is never 0 on a run
    that succeeds (onnxruntime's ``ReshapeHelper``, core/providers/cpu/tensor/reshape_helper.h,
    enforces ``size != 0`` when a dim is -1 and allowzero is 0), so each factor cancels."""
    if any(d is None for d in dims):
        return None
    left, rest = list(dims), []
    for d in others:
        if not isinstance(d, int) and d in left:
            left.remove(d)
        elif isinstance(d, int):
            rest.append(d)
        else:
            return None
    for d in list(rest):
        if d in left:
            left.remove(d)
            rest.remove(d)
    if not all(isinstance(x, int) for x in left):
        return left[0] if len(left) == 1 and not rest else None
    known, total = int(np.prod(rest)), int(np.prod(left))  # type: ignore[arg-type]
    return total // known if known and total % known == 0 else None


def _as_dim(e: object) -> Dim:
    if isinstance(e, bool):
        return None
    if isinstance(e, (int, Axis, AxisMin)):
        return e
    return None


def _equal(a: object, b: object) -> bool | None:
    if isinstance(a, bool) or isinstance(b, bool):
        return None
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    sym, num = (a, b) if isinstance(b, int) else (b, a)
    if isinstance(sym, (Axis, AxisMin)) and isinstance(num, int) and num < 0:
        return False  # a dim is never negative
    if isinstance(a, (Axis, AxisMin)) and a == b:
        return True
    return None


def _arith(op: str, a: object, b: object) -> int | None:
    if isinstance(a, int) and isinstance(b, int) and not isinstance(a, bool) and not isinstance(b, bool):
        return a + b if op == "Add" else a - b if op == "Sub" else a * b
    return None


#: Slice ends at least this large mean "to the end" (exporters write INT64_MAX or INT32_MAX).
_TO_END = 2**31 - 1


def _sliced(dim: Dim, start: object, end: object) -> Dim:
    """The dim of ``[start:end]`` (step 1) of an axis of size ``dim``, where it is proven."""
    if start != 0 or isinstance(end, bool):
        return None
    if isinstance(end, int):
        if end >= _TO_END:
            return dim
        if end < 0:
            return None
        if isinstance(dim, int):
            return min(dim, end)
        if isinstance(dim, Axis):
            return AxisMin(dim, end)
        return None
    if isinstance(end, Axis):
        if dim == end:
            return end
        if isinstance(dim, int):
            return AxisMin(end, dim)
    return None


def _read_positions(graph: Graph, shape_out: str, rank: int) -> list[tuple[Node, list[int]]] | None:
    """The readers of a Shape's result and the positions each takes: each reader a Gather (axis
    0) of constant non-negative positions; None when a reader takes the whole result or something
    else."""
    readers = graph.consumers(shape_out)
    if not readers:
        return None
    found = []
    for r in readers:
        if (r.op_type != "Gather" or r.domain or len(r.inputs) < 2 or r.inputs[0] != shape_out
                or r.inputs[1] == shape_out or r.attr("axis", 0)):
            return None
        idx = constant(graph, r.inputs[1])
        if idx is None or np.asarray(idx).dtype.kind not in "iu":
            return None
        ps = [int(p) for p in np.asarray(idx).reshape(-1)]
        if any(p < 0 or p >= rank for p in ps):
            return None  # a negative position would mean another dim of an input of other rank
        found.append((r, ps))
    return found


@dataclass(frozen=True)
class ShapeSource:
    """Where a Shape's result comes from: graph input ``name``, and for a Shape read only by
    Gathers, per Gather the input's axes at the positions it takes (``axes``, None: the whole
    shape, the same in place)."""

    name: str
    axes: tuple[tuple[Node, tuple[int, ...]], ...] | None = None


def _candidates(graph: Graph) -> list[tuple[int, Node]]:
    """(position, node) of the Shape nodes ``shape_sources`` may redirect: of a computed value, whose
    result is no graph output nor read by a subgraph, with no start or end."""
    outputs = graph_output_names(graph)
    captured: set[str] | None = None
    found = []
    for k, n in enumerate(graph.nodes):
        if n.op_type != "Shape" or n.domain or not n.inputs or not n.outputs:
            continue
        if n.inputs[0] in graph.input_names or n.outputs[0] in outputs:
            continue
        if n.attr("start") is not None or n.attr("end") is not None:
            continue
        if captured is None:  # built once, and only where a Shape is left to ask about
            captured = {v for m in graph.nodes for v in m.implicit_inputs}
        if n.outputs[0] in captured:
            continue
        found.append((k, n))
    return found


def shape_sources(graph: Graph) -> dict[int, ShapeSource]:
    """``id(Shape node)`` -> where the Shape nodes of ``graph`` reading a computed value get the
    same result from a graph input, for every feed (see the module docstring)."""
    candidates = _candidates(graph)
    if not candidates:
        return {}
    # the dims a Shape reads are its input's, computed before it (the nodes are in topological
    # order): the nodes after the last candidate need no visit
    shapes = _Shapes(graph, upto=candidates[-1][0] + 1)
    found: dict[int, ShapeSource] = {}
    for _, n in candidates:
        x, out = n.inputs[0], n.outputs[0]
        dims = shapes.dims.get(x)
        if dims is None:
            continue
        readers = _read_positions(graph, out, len(dims))
        if readers is None:  # the whole shape: the same rank and every dim an input's, in place
            names = {d.name for d in dims if isinstance(d, Axis)}
            if len(names) == 1:
                name = names.pop()
                if shapes.dims.get(name) == dims:
                    found[id(n)] = ShapeSource(name)
            continue
        atoms = [dims[p] for _, ps in readers for p in ps]
        if not all(isinstance(a, Axis) for a in atoms):
            continue
        names = {a.name for a in atoms}  # type: ignore[union-attr]
        if len(names) == 1:
            axes = tuple((r, tuple(dims[p].axis for p in ps)) for r, ps in readers)  # type: ignore[union-attr]
            found[id(n)] = ShapeSource(names.pop(), axes)
    return found


def redirect_shape_reads(graph: Graph) -> bool:
    """Pass ``redirect_shape_reads``: each Shape of a computed value whose read dims are proven to
    be a graph input's (``shape_sources``) reads that input instead; a Gather of its result takes
    the input's axes where the dims sit elsewhere in it."""
    if not any(n.op_type == "Shape" for n in graph.nodes):
        return False
    sources = shape_sources(graph)
    changed = False
    for n in live_nodes(graph, "Shape"):
        source = sources.get(id(n))
        if source is None:
            continue
        for gather, axes in source.axes or ():
            old = np.asarray(constant(graph, gather.inputs[1]))
            if [int(p) for p in old.reshape(-1)] == list(axes):
                continue
            # not add_initializer: its ascontiguousarray makes a 0-d index 1-d
            index = unique_name(graph, f"{gather.inputs[1]}_redirected")
            graph.initializers[index] = np.array(axes, old.dtype).reshape(old.shape)
            graph.unindex_node(gather)
            gather.inputs = (gather.inputs[0], index, *gather.inputs[2:])
            graph.index_node(gather)
        graph.unindex_node(n)
        n.inputs = (source.name, *n.inputs[1:])
        graph.index_node(n)
        changed = True
    return changed
