"""Basic cleanup passes: no-op elimination, CastLike as Cast, constant folding, dead-node removal.

Each pass takes one graph (main graph or subgraph), rewrites it in place and returns True when it
changed something. Values read by subgraphs (implicit inputs) are never renamed, and overridable
initializers (IR < 4 inputs with defaults) are never treated as constants.
"""

from __future__ import annotations

import logging
import math
import weakref

import numpy as np
import onnx
from onnx import helper

from onnxhal.hal.graph import Graph, Node, ValueInfo
from onnxhal.runtime.loader.guarded_inference import DATA_PROP_MAX_LENGTH, STUB_MIN_ELEMENTS, may_propagate
from onnxhal.runtime.optimizer.qdq_fusions import keep_for_fusion
from onnxhal.runtime.optimizer.rewrite import (
    constant,
    graph_output_names,
    live_nodes,
    make_node,
    remove_nodes,
    replace_nodes,
    static_shape,
    unlink_node,
)

logger = logging.getLogger("onnxhal.optimizer")

#: Ops whose result changes from run to run (or that need a subgraph): never folded.
NOT_FOLDABLE = frozenset({
    "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli",
    "Dropout", "If", "Loop", "Scan", "SequenceMap", "Optional", "OptionalGetElement", "OptionalHasElement",
})

#: Folded outputs larger than this stay computed at run time (ORT does the same to bound memory).
MAX_FOLDED_BYTES = 64 << 20


def _rename_input(graph: Graph, old: str, new: str) -> bool:
    """Make every reader of ``old`` read ``new``; False (and no change) if a subgraph reads ``old``."""
    readers = graph.consumers(old)
    if any(old in n.implicit_inputs for n in readers):
        return False
    for n in readers:
        n.inputs = tuple(new if i == old else i for i in n.inputs)
    return True


def _bypass(graph: Graph, node: Node, source: str, result: str, order: dict[int, int] | None = None) -> bool:
    """Remove a node that copies ``source`` to ``result``. Graph outputs keep their names: if
    ``result`` is one, the producer of ``source`` is renamed instead, when that is safe.
    ``order`` (id of node -> position, for a graph whose producer/consumer maps are in graph order,
    as ``Graph.reindex`` leaves them) updates just the entries this changes; without it the maps
    are rebuilt. A node holding subgraphs needs no rebuild either: the bypass renames no value a
    subgraph reads (it gives up on one), so no holder's implicit inputs change."""
    outputs = graph_output_names(graph)
    producer = None
    if result not in outputs:
        if not _rename_input(graph, result, source):
            return False
    else:
        producer = graph.producer(source)
        if (producer is None or source in outputs or len(graph.consumers(source)) != 1
                or any(source in n.implicit_inputs for n in graph.consumers(source))):
            return False
        producer.outputs = tuple(result if o == source else o for o in producer.outputs)
    graph.nodes.remove(node)
    if order is None:
        graph.reindex()
        return True
    # Just the entries a full reindex would change: a full reindex per removed node would make
    # no-op elimination quadratic in the graph's size.
    graph.unindex_node(node)
    if producer is None:  # the readers of result read source now
        graph.index_rename(result, source, order)
    else:  # source's producer writes result now
        graph.index_rename(source, result, order)
    return True


def _no_op_source(graph: Graph, node: Node) -> str | None:
    """The input a node merely copies to its first output, or None if it computes something."""
    if node.domain != "" or not node.inputs or not node.inputs[0]:
        return None
    op, x = node.op_type, node.inputs[0]
    extra_outputs_used = any(o and (graph.consumers(o) or o in graph_output_names(graph)) for o in node.outputs[1:])
    if op == "Identity":
        return x
    if op == "Dropout" and not extra_outputs_used:
        training = node.inputs[2] if len(node.inputs) > 2 else ""
        if not training:
            return x
        value = constant(graph, training)
        return x if value is not None and not bool(value.reshape(-1)[0]) else None
    if op == "Cast":
        in_type = graph.value_info(x).elem_type
        return x if in_type and in_type == node.attr("to") else None
    if op == "Slice":
        return x if _whole_slice(graph, node) else None
    return None


def _whole_slice(graph: Graph, node: Node) -> bool:
    """A Slice of constant parameters that keeps every element of its input (onnxruntime's
    EliminateSlice): each sliced axis from its start (0, or a negative start past the dim) to
    its end (a huge end such as TorchScript's INT64_MAX for ``x[:]``, or one past a static dim)
    in steps of 1."""
    if node.since_version and node.since_version < 10:
        starts, ends, axes, steps = node.attr("starts"), node.attr("ends"), node.attr("axes"), None
    else:
        params = [constant(graph, i) if i else None for i in node.inputs[1:5]]
        if len(params) < 2 or params[0] is None or params[1] is None or \
                any(i and p is None for i, p in zip(node.inputs[3:5], params[2:])):
            return False
        starts, ends = params[0].reshape(-1).tolist(), params[1].reshape(-1).tolist()
        axes = params[2].reshape(-1).tolist() if len(params) > 2 and params[2] is not None else None
        steps = params[3].reshape(-1).tolist() if len(params) > 3 and params[3] is not None else None
    if starts is None or ends is None or len(starts) != len(ends):
        return False
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    shape = graph.value_info(node.inputs[0]).shape
    if len(axes) != len(starts) or len(steps) != len(starts) or shape is None:
        return False
    for start, end, axis, step in zip(starts, ends, axes, steps):
        if step != 1 or not -len(shape) <= axis < len(shape):
            return False
        dim = shape[axis]
        if not (start == 0 or (isinstance(dim, int) and start <= -dim)):
            return False
        if not (end >= 2 ** 31 - 1 or (isinstance(dim, int) and end >= dim)):
            return False
    return True


def eliminate_no_ops(graph: Graph) -> bool:
    """Remove Identity, inference-mode Dropout, Cast to the same type and Slice of everything."""
    changed = False
    order = None
    for node in live_nodes(graph, "Identity", "Dropout", "Cast", "Slice"):
        source = _no_op_source(graph, node)
        if source is None:
            continue
        if order is None:
            # Maps in graph order, then kept so node by node (removing nodes keeps the order); with
            # a full rebuild per bypass, SSDlite's graph (one Loop among 1,067 nodes) took 25 ms.
            graph.reindex()
            order = {id(n): k for k, n in enumerate(graph.nodes)}
        # onnx's data propagation reads through Cast, not through Identity or Dropout
        informs = node.op_type != "Cast" and carries_shape_data(graph, node.outputs[0])
        if _bypass(graph, node, source, node.outputs[0], order):
            changed = True
            if informs:
                _settled.discard(graph)
    return changed


def castlike_to_cast(graph: Graph) -> bool:
    """CastLike whose target's element type is known -> Cast to that type (the target input no
    longer read). onnxruntime inlines CastLike's function body the same way at load, so its
    optimized models hold the Cast; ``saturate`` goes along from opset 19, where Cast has it."""
    changed = False
    for node in live_nodes(graph, "CastLike"):
        if node.op_type != "CastLike" or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2:
            continue
        to = graph.value_info(node.inputs[1]).elem_type
        if not to:
            continue
        saturate = int(node.attr("saturate", 1)) if graph.opset_version("") >= 19 else None
        cast = make_node(graph, "Cast", [node.inputs[0]], node.outputs[:1], name=node.name, to=to, saturate=saturate)
        replace_nodes(graph, [node], [cast])
        changed = True
    return changed


#: Domains whose nodes have no effect besides their outputs: dropped when nothing reads those.
_PURE_DOMAINS = frozenset({"", "ai.onnx.ml", "com.onnxhal"})


def remove_dead_nodes(graph: Graph) -> bool:
    """Remove nodes none of whose outputs is read or is a graph output, then unused constants."""
    used = graph_output_names(graph)
    kept: list[Node] = []
    # set operations in C per node (the pass runs in every round; a generator per node was most of
    # its time). "" (an omitted optional input) never stays in ``used``: an unnamed output is unread.
    for node in reversed(graph.nodes):
        if node.domain in _PURE_DOMAINS and used.isdisjoint(node.outputs):
            continue
        kept.append(node)
        used.update(node.inputs)
        if node.implicit_inputs:
            used.update(node.implicit_inputs)
        used.discard("")
    changed = len(kept) != len(graph.nodes)
    if changed:
        graph.nodes = kept[::-1]
    for name in [n for n in graph.initializers if n not in used and graph.is_constant_initializer(n)]:
        del graph.initializers[name]
        changed = True
    if changed:
        graph.reindex()
    return changed


def evaluate_node(graph: Graph, node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    """Run one node on numpy inputs: with the CPU EP's kernel when there is one, else onnx.reference."""
    try:
        from onnxhal.runtime.providers.cpu.kernel_factory import create_cpu_kernel
    except ImportError:  # CPU EP not built yet: the reference evaluator still gives exact results
        create_cpu_kernel = None
    if create_cpu_kernel is not None:
        try:
            return [_tensor(v) for v in create_cpu_kernel(node, None, graph.opset).compute(list(inputs))]
        except _NotATensor:
            raise
        except Exception as exc:  # fall back to the reference implementation below
            logger.debug("CPU kernel could not fold %s (%s); trying onnx.reference", node.name, exc)
    from onnx.reference import ReferenceEvaluator

    feeds = {name: value for name, value in zip(node.inputs, inputs) if name}
    graph_inputs = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                    for name, v in feeds.items()]
    model = helper.make_model(
        helper.make_graph([node.to_proto()], "fold", graph_inputs,
                          [helper.make_empty_tensor_value_info(o) for o in node.outputs if o]),
        opset_imports=[helper.make_opsetid(d, v) for d, v in graph.opset.items()], ir_version=10)
    return [_tensor(v) for v in ReferenceEvaluator(model).run(None, feeds)]


class _NotATensor(ValueError):
    pass


def _tensor(value: object) -> np.ndarray:
    """A folded output must be a tensor: initializers hold nothing else. A sequence, map or empty
    optional (SequenceConstruct, Optional, ...) cannot be folded, so the node stays."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, np.generic):
        return np.asarray(value)
    raise _NotATensor(f"output is a {type(value).__name__}, not a tensor")


def _shape_of(graph: Graph, node: Node) -> np.ndarray | None:
    """Shape/Size of a value whose shape is fully known from shape inference."""
    shape = static_shape(graph, node.inputs[0])
    if shape is None:
        return None
    if node.op_type == "Size":
        return np.array(int(np.prod(shape)), dtype=np.int64)
    start, end = node.attr("start", 0), node.attr("end", None)
    return np.array(shape[start:end], dtype=np.int64)


#: Ops whose outputs together hold at most as many elements as their inputs (Concat: their sum),
#: of the inputs' types, or (Cast) of at most 8 bytes each (int64, double, a string's pointer).
_NOT_GROWING = frozenset({"Reshape", "Transpose", "Slice", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Concat",
                          "Cast", "Split", "Shape", "Size"})


def _too_big(graph: Graph, node: Node, inputs: list[np.ndarray | None] | None = None) -> bool:
    """Whether an output's inferred size passes MAX_FOLDED_BYTES (so folding would compute it in
    vain: its value is refused after). ``inputs``: the node's constant inputs, where known; an op
    that cannot grow its inputs past the limit needs no look at its outputs' types (reading each
    output's TypeProto was a third of folding a graph of shape chains)."""
    if inputs is not None and node.op_type in _NOT_GROWING and \
            sum(v.nbytes + 8 * v.size for v in inputs if v is not None) <= MAX_FOLDED_BYTES:
        return False
    for o in node.outputs:
        vi = graph.value_info(o)
        shape = vi.shape  # parsed from the TypeProto at each read: read once
        if shape is None or not all(isinstance(d, int) for d in shape):
            continue
        dtype = vi.dtype
        if dtype is not None and dtype.kind != "O" and math.prod(shape) * dtype.itemsize > MAX_FOLDED_BYTES:
            return True
    return False


#: Inputs (and tensor attributes) of more bytes than this, together, make no key of ``_fold_key``:
#: copying them into a key would cost about what evaluating the node does.
_FOLD_KEY_MAX_BYTES = 1 << 12
#: Types of attribute values (and list elements) ``_fold_key`` takes as they are: hashable, equal
#: exactly when the attributes are (the type is part of the key: 1 == 1.0 == True in Python)
_KEY_SCALARS = frozenset({int, float, str, bytes})


def _fold_key(node: Node, inputs: list[np.ndarray | None]) -> tuple | None:
    """What decides a foldable node's values, as a hashable key: its op type, its attributes, which
    of its outputs are named and its inputs' dtypes, shapes and bytes. None where a value cannot be
    keyed exactly (a graph or proto attribute, an object array, tensors past
    ``_FOLD_KEY_MAX_BYTES``). Exporters repeat one shape computation per layer (a TorchScript
    export's padding arithmetic before each convolution): equal keys fold once."""
    size = 0
    key: list = [node.op_type, node.domain, tuple(map(bool, node.outputs))]
    for v in (*inputs, *node.attributes.values()):
        kind = type(v)
        if kind is np.ndarray:
            size += v.nbytes
            if size > _FOLD_KEY_MAX_BYTES or v.dtype.hasobject:
                return None
            key.append((v.dtype, v.shape, v.tobytes()))
        elif kind is list:
            if not all(type(x) in _KEY_SCALARS for x in v):
                return None
            key.append((list, *map(type, v), *v))
        elif v is None or kind in _KEY_SCALARS:
            key.append((kind, v))
        else:
            return None
    key += node.attributes  # the attributes' names, after their values
    return tuple(key)


def fold_constants(graph: Graph) -> bool:
    """Replace nodes whose inputs are all constants (and Shape/Size of static shapes) by initializers."""
    outputs = graph_output_names(graph)
    changed = False
    folded: list[Node] = []
    folded_by_key: dict[tuple, list[np.ndarray]] = {}
    settled = graph in _settled  # (a WeakSet's lookup makes a weak reference: asked once)
    initializers = graph.initializers
    for node in live_nodes(graph):
        first = node.inputs[0] if node.inputs else ""
        shape_of = node.op_type in ("Shape", "Size") and bool(node.inputs) and first not in initializers
        # most nodes read a computed value first: one dict lookup rejects them (no initializer, no constant)
        if first and not shape_of and first not in initializers:
            continue
        if (node.domain != "" or (not shape_of and node.inputs and node.inputs[0]
                                  and constant(graph, node.inputs[0]) is None)
                or node.op_type in NOT_FOLDABLE or node.subgraphs
                or any(o in outputs for o in node.outputs) or keep_for_fusion(graph, node)):
            continue
        values: list[np.ndarray] | None
        if shape_of:
            if _too_big(graph, node):
                continue
            value = _shape_of(graph, node)
            values = None if value is None else [value]
        else:
            inputs = [constant(graph, i) if i else None for i in node.inputs]
            if any(i and v is None for i, v in zip(node.inputs, inputs)):
                continue
            if (not node.inputs and node.op_type != "Constant") or _too_big(graph, node, inputs):
                continue
            key = _fold_key(node, inputs)
            known = folded_by_key.get(key) if key is not None else None
            if known is not None:  # a node like one folded before, on equal inputs: its values, copied
                values = [v.copy() for v in known]
            else:
                try:
                    values = evaluate_node(graph, node, inputs)
                except Exception as exc:  # folding is an optimization: leave the node to run normally
                    logger.debug("cannot fold %s %r: %s", node.op_type, node.name, exc)
                    continue
                if key is not None:
                    folded_by_key[key] = values
        if values is None or any(v.nbytes > MAX_FOLDED_BYTES for v in values):
            continue
        # (once unsettled, the graph stays so until the next inference: nothing more to ask)
        if node.op_type != "Constant" and settled and any(
                o and (carries_shape_data(graph, o) or not graph.value_info(o).has_static_shape) for o in node.outputs):
            _settled.discard(graph)  # a value, or a shape, onnx's inference did not know
            settled = False
        for name, value in zip(node.outputs, values):
            if name:
                graph.initializers[name] = value
                graph.set_value_info(ValueInfo.of_array(name, value))
        # Unlinked now (later nodes see its outputs as constants); dropped from the node list at
        # the end, in one pass (a list rebuild per folded node made folding quadratic).
        unlink_node(graph, node)
        folded.append(node)
        changed = True
    remove_nodes(graph, folded, unlinked=True)
    return changed


#: Graphs whose shapes onnx's inference with data propagation has seen since the last rewrite that
#: could tell it more (``shapes_settled``); ``refresh_shapes`` skips them.
_settled: weakref.WeakSet[Graph] = weakref.WeakSet()


def shapes_settled(graph: Graph) -> None:
    """Record that onnx's inference with data propagation ran on ``graph`` as it is now (the
    loader's strict pass): ``refresh_shapes`` then runs only after folding or no-op elimination
    gave inference something new to read."""
    _settled.add(graph)


def carries_shape_data(graph: Graph, name: str) -> bool:
    """Whether value ``name`` may be read as shape data by onnx's inference: an integer tensor of
    rank 0 or 1 (shapes, axes, starts: its data propagation follows those), a float one a Resize,
    Upsample or Range reads (scales, bounds), or one whose type or rank is unknown. Inference
    carries shapes through Identity, Cast and Dropout, so only such values' contents, once known,
    can make more shapes static."""
    vi = graph.value_info(name)
    if vi.dtype is None or vi.shape is None:
        return True
    if len(vi.shape) > 1:
        return False
    return vi.dtype.kind in "iu" or any(r.op_type in _FLOAT_SHAPE_READERS for r in graph.consumers(name))


#: Ops whose inference reads a float input's values (Resize and Upsample scales, Range bounds).
_FLOAT_SHAPE_READERS = frozenset({"Resize", "Upsample", "Range"})


def _propagation_reads_long_value(graph: Graph) -> bool:
    """Whether a node onnx's data propagation visits reads a 1-D value longer than
    ``DATA_PROP_MAX_LENGTH``: propagation's cost is linear in its length (for ever at 2**31, holding
    the GIL), which is why the loader's inference runs without it there."""
    version = graph.opset.get("", 0)
    for node in graph.nodes:
        if not may_propagate(node.op_type, "", version):
            continue
        for name in node.inputs:
            shape = graph.value_info(name).shape if name else None
            if shape is not None and len(shape) == 1 and isinstance(shape[0], int) and shape[0] > DATA_PROP_MAX_LENGTH:
                return True
    return False


def refresh_shapes(graph: Graph) -> bool:
    """Infer shapes again where folding made them knowable, and keep what became static.

    onnx's inference at load stops where a shape flows through ops its data propagation does not
    follow (Where, Equal on shape tensors, as Hugging Face exports write them), so with the inputs'
    dims fixed (free-dimension overrides, ``onnxhal fix-shapes``) those values stay symbolic; once
    ``fold_constants`` turned their shape chains into constants, another inference pass finds them.
    A value's known shape is only ever made more static, never replaced by a less static one.
    Main graphs of standard-domain nodes only (onnx cannot infer com.onnxhal ops); True when a
    value gained a static shape (so folding may go further)."""
    if graph.parent is not None or any(n.domain not in ("", "ai.onnx") for n in graph.nodes):
        return False
    # Inference again finds nothing new unless folding or no-op elimination showed it a value, or
    # a shape, it did not know (``_settled``; the loader's strict pass counts as a run). Folding
    # Constant nodes and weights, bypassing Identity and Cast of float tensors do not: on the
    # corpus this pass never gains a shape there, and each run of onnx's inference on a large
    # graph costs more than the rest of the optimizer.
    if graph in _settled:
        return False
    # It is for graphs whose inputs' dims are all known (free-dimension overrides, fix-shapes), where
    # folded shape chains make the values after them static. With an input dim left free (a dynamic
    # batch), the values folding leaves are computed from that input and stay symbolic: on the
    # corpus's dynamic models it never gained a shape and cost more than the rest of the optimizer.
    if not all(graph.value_info(i).has_static_shape for i in graph.input_names):
        return False
    names = [o for n in graph.nodes for o in n.outputs if o]
    if all(graph.value_info(n).has_static_shape for n in names):
        return False
    if _propagation_reads_long_value(graph):
        _settled.add(graph)  # as the loader's pass: no data propagation, so nothing more to learn
        return False
    model = helper.make_model(graph.to_proto(data_up_to=STUB_MIN_ELEMENTS),
                              opset_imports=[helper.make_opsetid(d, v) for d, v in graph.opset.items()])
    try:
        inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)
    except Exception:  # inference is a help: the shapes stay as they were (and would again, unchanged)
        _settled.add(graph)
        return False
    _settled.add(graph)
    changed = False
    for vi in inferred.graph.value_info:
        new = ValueInfo(vi.name, vi.type)
        old = graph.value_info(vi.name)
        if (new.has_static_shape and not old.has_static_shape and new.dtype is not None
                and (old.shape is None or len(old.shape) == len(new.shape))
                and (old.dtype is None or old.dtype == new.dtype)):
            graph.set_value_info(new)
            changed = True
    return changed
