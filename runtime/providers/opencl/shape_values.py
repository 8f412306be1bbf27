"""Rule ``shape_values``: the small integer computations that exporters build from tensor shapes.

TorchScript and dynamo exports with symbolic dims compute each Reshape target on the fly:
``Shape -> Gather -> Unsqueeze -> Concat -> Reshape``. Left to the host EP, such a chain reads a
value of the OpenCL partition and feeds another node of it, so the partition is cut in two there,
and the values at the cut (attention's head split and merge) are materialised and copied.

The OpenCL EP claims these nodes with the partition (``shape_values``) and computes nothing for
them on the device: a partition holding them is specialised per concrete input signature
(``dynamic_partition``), whose host run gives their values; the specialised copy has them as
constants (``fold``), so a Reshape's shape is a constant of the plan and the chain costs no launch.

A value is a shape value when a node of ``SHAPE_VALUE_OPS`` computes it with a static shape of at
most ``MAX_ELEMENTS`` elements from the shape of a tensor (Shape, Size), constants, other shape
values, and, inside a partition, small integer inputs (shape values the host or another partition
computed): those become part of the partition's signature, so a specialisation never uses a value
it was not made for.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from onnxhal.hal.graph import Graph, Node
from onnxhal.runtime.providers.opencl.op_support import GraphLookup

#: Ops that read only their input's shape.
SHAPE_READERS = frozenset({"Shape", "Size"})
#: Ops a shape computation is made of (ai.onnx).
SHAPE_VALUE_OPS = SHAPE_READERS | frozenset({
    "Gather", "Slice", "Squeeze", "Unsqueeze", "Concat", "Cast", "Reshape", "Identity", "Flatten",
    "Add", "Sub", "Mul", "Div", "Neg", "Abs", "Max", "Min", "Mod", "Sqrt", "Floor", "Ceil",
    "Equal", "Less", "Greater", "Not", "Where", "ReduceProd", "ReduceSum", "ReduceMax", "ReduceMin"})
#: Elements of the largest shape value (a shape of rank 6 and a few more).
MAX_ELEMENTS = 64
_KINDS = frozenset("iub")  # integer and bool values: a partition hands them over in host memory


def _small(lookup: GraphLookup, name: str, kinds: frozenset[str] = _KINDS) -> bool:
    shape = lookup.shape(name)
    dtype = lookup.dtype(name)
    return (shape is not None and math.prod(shape) <= MAX_ELEMENTS
            and dtype is not None and dtype.kind in kinds)


def small_int(lookup: GraphLookup, name: str) -> bool:
    """Whether ``name`` has a static shape of at most ``MAX_ELEMENTS`` integers."""
    return _small(lookup, name, frozenset("iu"))


def shape_values(graph: Graph, lookup: GraphLookup, outside: Callable[[str], bool] | None = None,
                 tensors: bool = False, gone: frozenset[str] = frozenset()) -> frozenset[str]:
    """The outputs of ``graph``'s nodes that are shape values: computed by an op of
    ``SHAPE_VALUE_OPS`` with a small static result from shapes (Shape, Size of any tensor),
    constants, other shape values, or values ``outside`` accepts (a partition's small integer
    inputs). ``tensors`` (rule ``shape_tensors``): also the results, of any size, dtype and
    deterministic ai.onnx op, computed from shapes this graph reads and constants alone (with at
    least one such shape: constants alone are constant folding): position ids (Range, Expand,
    GatherElements of a constant table) and causal masks. Never from an input of the graph, even a
    small integer one (fixed dims make ``input_ids`` one): each is a function of the input shapes,
    so a specialisation holds it as a constant. ``gone``: values computed elsewhere (left to the
    host), read here as inputs. ``graph.nodes`` is in topological order."""
    found: set[str] = set()
    rooted: set[str] = set()  # computed from shapes read here and constants alone
    for n in graph.nodes:
        if n.domain or n.subgraphs or (n.op_type not in SHAPE_VALUE_OPS and not tensors):
            continue
        outs = [o for o in n.outputs if o]
        if not outs or all(o in gone for o in outs):
            continue
        if n.op_type in SHAPE_READERS:
            if all(_small(lookup, o) for o in outs):
                found.update(outs)
                rooted.update(outs)
            continue
        inputs = [i for i in n.inputs if i]

        def given(i: str) -> bool:
            return i in found or (outside is not None and outside(i)) or (i in gone and small_int(lookup, i))

        # the inputs first: most nodes read activations, which fails fastest here
        if not inputs or not all(given(i) or lookup.const(i) is not None for i in inputs):
            continue
        is_rooted = all(i in rooted or lookup.const(i) is not None for i in inputs) and any(i in rooted for i in inputs)
        if n.op_type in SHAPE_VALUE_OPS and all(_small(lookup, o) for o in outs):
            found.update(outs)
            if is_rooted:
                rooted.update(outs)
        elif tensors and is_rooted and n.op_type not in NONDETERMINISTIC:
            found.update(outs)
            rooted.update(outs)
    return frozenset(found)


#: Ops whose result is not a function of their inputs: never shape-derived.
NONDETERMINISTIC = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                              "Multinomial", "Bernoulli", "Dropout"})


def shape_derived(graph: Graph, lookup: GraphLookup) -> frozenset[str]:
    """The values of ``graph`` computed from tensor shapes (Shape, Size) and constants alone, of any
    size and dtype: functions of the shapes of a run, never of the data it is fed. A partition may
    key its specialisations on such an input's value without specialising again at every run (a
    position-id Gather's indices), where a data input (a token-id Gather's indices) would.
    ``graph.nodes`` is in topological order."""
    found: set[str] = set()
    for n in graph.nodes:
        if n.subgraphs or n.domain not in ("", "ai.onnx") or n.op_type in NONDETERMINISTIC:
            continue
        outs = [o for o in n.outputs if o]
        inputs = [i for i in n.inputs if i]
        if n.op_type in SHAPE_READERS or (inputs and all(i in found or lookup.const(i) is not None for i in inputs)):
            found.update(outs)
    return frozenset(found)


def shape_value_nodes(graph: Graph, values: frozenset[str]) -> list[Node]:
    """The nodes of ``graph`` that compute the shape values ``values``."""
    return [n for n in graph.nodes if n.outputs and all(o in values for o in n.outputs if o)
            and any(n.outputs)]


def value_inputs(graph: Graph, nodes: list[Node]) -> frozenset[str]:
    """``graph``'s inputs whose values ``nodes`` (shape-value nodes) read: a Shape or Size reads only
    the shape of its input, every other op the value."""
    names = set(graph.input_names)
    return frozenset(i for n in nodes if n.op_type not in SHAPE_READERS for i in n.inputs if i in names)


def metadata_inputs(graph: Graph, nodes: list[Node]) -> frozenset[str]:
    """``graph``'s inputs that only Shape or Size nodes among ``nodes`` read (and that are not
    outputs): the partition needs their shape, not their data."""
    members = {id(n) for n in nodes if n.op_type in SHAPE_READERS}
    outputs = set(graph.output_names)
    return frozenset(name for name in graph.input_names
                     if name not in outputs and graph.consumers(name)
                     and all(id(c) in members for c in graph.consumers(name)))


def unclaim_unshared(graph: Graph, claimed: list[Node], values: frozenset[str]) -> list[Node]:
    """``claimed`` without the shape-value nodes whose result a node left to another EP reads (or a
    subgraph captures): the host computes that chain as before, and the partition takes the result
    as a small input, rather than the host waiting on the partition for a value of its shapes.
    Graph outputs may come from a claimed chain (the partition hands the value over in host memory)."""
    taken = {id(n) for n in claimed}
    captured = {v for n in graph.nodes for v in n.implicit_inputs}
    for n in reversed(graph.nodes):  # consumers first: dropping one may drop its producers
        if id(n) not in taken or not n.outputs or not all(o in values for o in n.outputs if o):
            continue
        if any(o in captured or any(id(c) not in taken for c in graph.consumers(o)) for o in n.outputs if o):
            taken.discard(id(n))
    return [n for n in claimed if id(n) in taken]
