"""Types and shapes for the ai.onnx.ml operators that onnx gives no inference function (Scaler,
Normalizer, Imputer, LinearRegressor, SVMRegressor, the opset-1 TreeEnsembleRegressor and
FeatureVectorizer), and com.microsoft's Tokenizer, which skl2onnx puts in the same pipelines (onnx
knows no schema for it); and ai.onnx's STFT, whose inference function gives no shape at all where
the signal's length is symbolic (an audio front end's), not even its rank.

onnx's shape inference stops at such a node: its outputs get no type, and nothing after it gets a
rank, so a device that needs ranks (every simulated profile) declines the rest of a scikit-learn
pipeline that begins with a StandardScaler. The output of each of these operators follows from its
input and attributes as the ai.onnx.ml specification states it (and as onnxruntime's kernels
allocate it: ``onnxruntime/core/providers/cpu/ml``): the loader adds those outputs' value_info and
infers again. Inference stays a help: where the second pass fails, the model keeps the first
pass's values.
"""

from __future__ import annotations

import onnx

from onnxhal.runtime.loader import guarded_inference

ML = "ai.onnx.ml"
_FLOAT = onnx.TensorProto.FLOAT
#: operators whose output has the input's shape: the output's element type (None: the input's)
_SAME_SHAPE = {"Scaler": _FLOAT, "Normalizer": _FLOAT, "Imputer": None}
#: operators whose [N, C] input gives a float [N, width] output, with how the width is read
_ROW_WIDTH = {
    "LinearRegressor": lambda attrs: _int(attrs, "targets", 1),
    "SVMRegressor": lambda attrs: 1,
    "TreeEnsembleRegressor": lambda attrs: _int(attrs, "n_targets", 1),
    "FeatureVectorizer": lambda attrs: sum(attrs["inputdimensions"].ints) if "inputdimensions" in attrs else None,
}
MS = "com.microsoft"
#: operators of other domains, typed here at any ai.onnx.ml opset: their output adds one unknown dim
#: to the input's shape, with this element type. Tokenizer's [N, C] (or [C]) strings give [N, C, D]
#: ([C, D]), D the most tokens of a row (onnxruntime/contrib_ops/cpu/tokenizer.cc allocates that);
#: only an input with no strings gives the input's rank.
_ADDS_DIM = {(MS, "Tokenizer"): onnx.TensorProto.STRING}
#: ai.onnx operators whose onnx inference gives no shape at all where a dim it reads is symbolic
#: (STFT: the signal's length): their output's rank and the dims the input settles, onnx's own
#: rule otherwise (STFT [batch, frames, bins, 2], the input's element type), so that a device
#: that needs ranks does not decline everything after an audio front end
_RANK_ONLY = {("", "STFT"): 4}
#: TreeEnsembleRegressor has an inference function from opset 3 of ai.onnx.ml
_SINCE_INFERRED = {"TreeEnsembleRegressor": 3}
#: how many rounds of "fill, infer again" a chain of such operators may take
_ROUNDS = 4


def _int(attrs: dict[str, onnx.AttributeProto], name: str, default: int) -> int:
    return attrs[name].i if name in attrs else default


def _uninferred(node: onnx.NodeProto, ml_opset: int) -> bool:
    if (node.domain, node.op_type) in _ADDS_DIM or (node.domain, node.op_type) in _RANK_ONLY:
        return True
    if node.domain != ML or (node.op_type not in _SAME_SHAPE and node.op_type not in _ROW_WIDTH):
        return False
    return ml_opset < _SINCE_INFERRED.get(node.op_type, 1 << 30)


def _output_type(node: onnx.NodeProto, types: dict[str, onnx.TypeProto]) -> onnx.TypeProto | None:
    """The output's type, or None where the inputs' types do not settle it."""
    ins = [types.get(i) for i in node.input if i]
    if not ins or any(t is None or not t.HasField("tensor_type") for t in ins):
        return None
    first = ins[0].tensor_type
    rank = _RANK_ONLY.get((node.domain, node.op_type))
    if rank is not None:
        if not first.HasField("shape") or not first.shape.dim or not first.elem_type:
            return None
        out = onnx.TypeProto()
        out.tensor_type.elem_type = first.elem_type
        dims = [out.tensor_type.shape.dim.add() for _ in range(rank)]
        dims[0].CopyFrom(first.shape.dim[0])  # the batch
        dims[-1].dim_value = 2  # real and imaginary parts
        return out
    adds = _ADDS_DIM.get((node.domain, node.op_type))
    if adds is not None:
        if not first.HasField("shape") or len(first.shape.dim) not in (1, 2):
            return None
        out = onnx.TypeProto()
        out.tensor_type.elem_type = adds
        out.tensor_type.shape.CopyFrom(first.shape)
        out.tensor_type.shape.dim.add()  # the token count: known only at run time
        return out
    if node.op_type in _SAME_SHAPE:
        elem = _SAME_SHAPE[node.op_type] or first.elem_type
        if not first.HasField("shape") or not elem:
            return None
        out = onnx.TypeProto()
        out.tensor_type.elem_type = elem
        out.tensor_type.shape.CopyFrom(first.shape)
        return out
    attrs = {a.name: a for a in node.attribute}
    width = _ROW_WIDTH[node.op_type](attrs)
    # only [N, C] inputs: the operators' rank-1 forms differ between producers and runtimes
    if width is None or any(not t.tensor_type.HasField("shape") or len(t.tensor_type.shape.dim) != 2 for t in ins):
        return None
    out = onnx.TypeProto()
    out.tensor_type.elem_type = _FLOAT
    rows, cols = out.tensor_type.shape.dim.add(), out.tensor_type.shape.dim.add()
    rows.CopyFrom(first.shape.dim[0])
    cols.dim_value = width
    return out


def _fill(model: onnx.ModelProto, ml_opset: int) -> list[tuple[onnx.ValueInfoProto, onnx.TypeProto | None]]:
    """Types the untyped (or shapeless) outputs of such operators that the known types settle, in
    their value_info (or graph output) entries; returns each entry changed with its type before
    (None: added)."""
    g = model.graph
    nodes = [n for n in g.node if _uninferred(n, ml_opset)]
    # only the names such nodes read or write are ever looked up: the types of the others (most of
    # a graph, and a pipeline's weights) are not made; a round's model is walked once per ``_fill``
    named = {i for n in nodes for i in (*n.input, *n.output)}
    types: dict[str, onnx.TypeProto] = {v.name: v.type for v in (*g.input, *g.value_info, *g.output)
                                        if v.name in named and v.type.WhichOneof("value") is not None}
    for t in g.initializer:
        if t.name in named:
            types.setdefault(t.name, onnx.helper.make_tensor_type_proto(t.data_type, list(t.dims)))
    # a graph output's own entry first (the later entry of a name wins)
    infos = {v.name: v for v in (*g.value_info, *g.output) if v.name in named}
    changed: list[tuple[onnx.ValueInfoProto, onnx.TypeProto | None]] = []
    for node in nodes:
        if not node.output or not node.output[0]:
            continue
        name = node.output[0]
        known = types.get(name)
        if known is not None and known.tensor_type.HasField("shape"):
            continue
        found = _output_type(node, types)
        # a declared element type is kept: the computed one must agree with it (or it is left alone)
        if found is None or (known is not None and known.tensor_type.elem_type not in (0, found.tensor_type.elem_type)):
            continue
        info = infos.get(name)
        if info is None:
            info = infos[name] = g.value_info.add(name=name)
            changed.append((info, None))
        else:
            before = onnx.TypeProto()
            before.CopyFrom(info.type)
            changed.append((info, before))
        info.type.CopyFrom(found)
        types[name] = found
    return changed


def with_ml_shapes(model: onnx.ModelProto, ml_opset: int,
                   scan: guarded_inference.NodeScan | None = None) -> onnx.ModelProto:
    """``model`` (strictly inferred, the loader's own) with the outputs of the ai.onnx.ml operators
    onnx cannot infer typed, and inference run again from them; ``model`` as it was where there are
    none, or where the new pass fails. ``scan``: ``guarded_inference.scan_nodes(model)``, where the
    caller has it; each round's pass reuses one scan while the model stays the same object (a
    round types outputs, which a scan does not read)."""
    if not any(_uninferred(n, ml_opset) for n in model.graph.node):
        return model
    for _ in range(_ROUNDS):
        changed = _fill(model, ml_opset)
        if not changed:
            break
        if scan is None:
            scan = guarded_inference.scan_nodes(model)
        if INFER_DOWNSTREAM and _infer_downstream(model, changed, scan, ml_opset):
            continue
        again, _, _ = guarded_inference.infer(model, owned=True, scan=scan)
        if again is None:  # the first pass's values stand: give back what was changed
            restore(model, changed)
            break
        if again is not model:  # a model of its own: its own scan, if another round needs one
            scan = None
        model = again
    return model


#: False: every round of ``with_ml_shapes`` runs a whole strict inference pass (the plain path;
#: for A/B measurements and the tests that compare the two)
INFER_DOWNSTREAM = True
#: a node inferred from Python costs about as much as this many nodes of a whole pass in onnx's C++
#: (skh_columns: 16 nodes one by one 0.86 ms, its whole pass of 30 nodes 0.16 ms): a round infers
#: node by node only where at most this fraction of the graph may read what it typed
_PASS_PER_NODE = 10
#: below this many nodes a whole pass costs little more than the walk that bounds the tail (each
#: read of a node's names decodes them: about 2 us a node; skh_tfidf's 11 nodes 27 us a round)
_MIN_NODES = 32
#: type-only operators that still make data from a type (their output's values are its shape):
#: data propagation would carry a new shape on, which a node-by-node inference cannot
_SHAPE_READERS = frozenset({"Shape", "Size"})
#: ai.onnx operators of text pipelines whose inference reads their input's type and their
#: attributes alone, besides ``guarded_inference.VALUE_BLIND`` (onnx/defs/nn/defs.cc, text/defs.cc)
_TYPES_ONLY = frozenset({"TfIdfVectorizer", "StringNormalizer"})


def _merged(old: onnx.TypeProto, new: onnx.TypeProto) -> onnx.TypeProto | None:
    """``new`` merged into a value's ``old`` type as strict inference merges an inferred type into
    the one the model has (onnx/shape_inference/implementation.cc, mergeShapesAndTypes: an
    element type kept where the same or unset; a dim's value where it had none, a dim's name where it
    had neither); None where they conflict or are not both tensors (the whole pass then decides)."""
    if old == new:
        return old
    if not (old.HasField("tensor_type") and new.HasField("tensor_type")):
        return None
    o, n = old.tensor_type, new.tensor_type
    if o.elem_type not in (0, n.elem_type):
        return None
    out = onnx.TypeProto()
    out.CopyFrom(old)
    out.tensor_type.elem_type = n.elem_type or o.elem_type
    if not n.HasField("shape"):
        return out
    if not o.HasField("shape"):
        out.tensor_type.shape.CopyFrom(n.shape)
        return out
    if len(o.shape.dim) != len(n.shape.dim):
        return None
    for target, source in zip(out.tensor_type.shape.dim, n.shape.dim):
        if source.HasField("dim_value"):
            if target.HasField("dim_value") and target.dim_value != source.dim_value:
                return None
            target.dim_value = source.dim_value
        elif source.HasField("dim_param") and not target.HasField("dim_value") and not target.HasField("dim_param"):
            target.dim_param = source.dim_param
    return out


def _infer_downstream(model: onnx.ModelProto, changed: list[tuple[onnx.ValueInfoProto, onnx.TypeProto | None]],
                      scan: guarded_inference.NodeScan, ml_opset: int) -> bool:
    """Infers the nodes that read what ``changed`` typed, and those that read what they type in
    turn, one by one with onnx's own inference function (type checks included), instead of a
    whole pass: a whole pass infers every other node exactly as the last one did, since a node's
    inference reads its inputs' types alone where it is ``guarded_inference.VALUE_BLIND`` (and
    not Shape or Size, whose data propagation would carry the new shape on). Returns False, the
    model unchanged, where that does not hold of every such node (or the graph holds subgraphs, or
    is not in topological order or is reshaped for the pass, or is small, or a node's inference
    fails or contradicts a type it has): the caller then runs the whole pass, whose result and
    errors stay the reference."""
    g = model.graph
    if len(scan.graphs) != 1 or any(scan.reshaped) or len(g.node) < _MIN_NODES:
        return False
    typed = {info.name for info, _ in changed}
    # every node that may read what this round changes, and what they read in turn: an upper bound
    # of the nodes to infer, known before any is inferred (the walk stops once past the bound:
    # each read of a node's names decodes them anew)
    nodes = list(g.node)
    most = len(nodes) // _PASS_PER_NODE
    reach, cascade = set(typed), []
    for node in nodes:
        if any(i in reach for i in node.input):
            if len(cascade) == most:
                return False
            cascade.append(node)
            reach.update(node.output)
    if not cascade:
        return True
    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
    types: dict[str, onnx.TypeProto] = {v.name: v.type for v in (*g.input, *g.value_info, *g.output)
                                        if v.type.WhichOneof("value") is not None}
    weights = {t.name: t for t in g.initializer}
    found: dict[str, onnx.TypeProto] = {}
    for node in cascade:  # topological order: a node's inputs are typed before it is visited
        if not any(i in typed for i in node.input):
            continue
        if _uninferred(node, ml_opset):
            continue  # the next round's ``_fill`` types it, as after a whole pass
        domain = "" if node.domain == "ai.onnx" else node.domain
        blind = (node.op_type in guarded_inference.VALUE_BLIND or node.op_type in _TYPES_ONLY) if not domain \
            else domain == ML
        # an operator that reads values from its second input on (a ReduceSum's axes) is inferred
        # here where those are initializers the whole pass's stub keeps whole
        reads_from = 1 if not domain and node.op_type in guarded_inference.DATA_FIRST else None
        if node.op_type in _SHAPE_READERS or not (blind or reads_from):
            return False
        try:
            schema = onnx.defs.get_schema(node.op_type, opsets.get(domain, 0), domain)
        except Exception:
            return False
        if not schema.has_type_and_shape_inference_function:
            return False
        inputs, data = {}, {}
        for k, i in enumerate(node.input):
            if not i:
                continue
            if reads_from is not None and k >= reads_from:
                w = weights.get(i)
                if w is None or guarded_inference.stubbed(w) or w.data_location == onnx.TensorProto.EXTERNAL:
                    return False
                data[i] = w
            t = found.get(i) or types.get(i)
            if t is None and i in weights:
                t = onnx.helper.make_tensor_type_proto(weights[i].data_type, list(weights[i].dims))
            if t is None:
                return False
            inputs[i] = t
        try:
            outputs = onnx.shape_inference.infer_node_outputs(schema, node, inputs, data,
                                                              opset_imports=model.opset_import,
                                                              ir_version=model.ir_version)
        except Exception:
            return False
        for name, new in outputs.items():
            old = types.get(name)
            merged = new if old is None else _merged(old, new)
            # a whole pass names each unknown dim (onnx's symbol table: "unk__3"), which ties the
            # dims of different values together: one left unnamed here would lose that
            if merged is None or (merged.HasField("tensor_type") and any(
                    not d.HasField("dim_value") and not d.HasField("dim_param") for d in merged.tensor_type.shape.dim)):
                return False
            if merged != old:
                found[name] = merged
                typed.add(name)
    infos = {v.name: v for v in (*g.value_info, *g.output)}
    for name, new in found.items():
        info = infos.get(name)
        if info is None:
            info = g.value_info.add(name=name)
        info.type.CopyFrom(new)
    return True


def typed_before_inference(model: onnx.ModelProto, ml_opset: int,
                           ) -> list[tuple[onnx.ValueInfoProto, onnx.TypeProto | None]]:
    """Types, in ``model`` (the loader's own, not yet inferred), the outputs of such operators whose
    inputs' types the model declares (a scikit-learn pipeline's Scaler or regressor on a graph
    input), so that the first inference pass already runs through them, rather than a second pass
    after ``with_ml_shapes`` typed them. Returns what was changed, for ``restore``."""
    g = model.graph
    uninferred = [n for n in g.node if _uninferred(n, ml_opset)]
    if not uninferred:
        return []
    # the first such node ``_fill`` can type reads declared values alone: where none does, it would
    # type nothing (the usual case after a classifier, whose outputs only inference types)
    declared = {v.name for v in (*g.input, *g.value_info, *g.output)} | {t.name for t in g.initializer}
    if not any(all(i in declared for i in n.input if i) for n in uninferred):
        return []
    return _fill(model, ml_opset)


def restore(model: onnx.ModelProto, changed: list[tuple[onnx.ValueInfoProto, onnx.TypeProto | None]]) -> None:
    """Undo ``_fill``'s ``changed`` entries in ``model``: types given back, added entries removed."""
    added = {info.name for info, before in changed if before is None}
    for info, before in changed:
        if before is not None:
            info.type.CopyFrom(before)
    infos = model.graph.value_info
    for i in reversed(range(len(infos))):
        if infos[i].name in added:
            del infos[i]
