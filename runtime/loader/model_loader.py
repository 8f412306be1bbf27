"""Loading a model: bytes, path or ModelProto in, a checked ``hal.Graph`` out.

Checks what ORT checks at load time and reports it as a typed error naming the problem: unreadable
files, bytes that are not a model, cycles, undefined inputs, duplicate outputs, opsets newer than
the onnx package knows.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from collections.abc import KeysView, Mapping, Set
from dataclasses import dataclass

import numpy as np
import onnx
import onnx.inliner  # `import onnx` does not import it: without this line model-local functions fail in a fresh process
import onnx.numpy_helper
from google.protobuf.message import DecodeError

from onnxhal.hal import Graph, Node
from onnxhal.hal.errors import Fail, InvalidArgument, InvalidGraph, InvalidProtobuf, NoSuchFile
from onnxhal.hal.errors import NotImplemented as OrtNotImplemented
from onnxhal.runtime.loader import declared_value_info, guarded_inference, ml_shapes
from onnxhal.runtime.loader.constant_initializers import constants_to_initializers
from onnxhal.runtime.loader.contrib_shapes import infer_through_stand_ins, with_contrib_shapes
from onnxhal.runtime.loader.declaration_checks import check_declarations, check_ir_version
from onnxhal.runtime.loader.external_data import load_external_data, tensors
from onnxhal.runtime.loader.ml_shapes import ML as ML_DOMAIN
from onnxhal.runtime.loader.ml_shapes import with_ml_shapes
from onnxhal.runtime.loader.model_overrides import override_free_dimensions
from onnxhal.runtime.loader.node_checks import (
    STANDARD_DOMAINS,
    check_after_inference,
    check_nodes,
    flat_model_walks,
    schema_spec,
)
from onnxhal.runtime.loader.proto_strings import check_strings, mirror_may_keep_external_data, utf8_mirror_of
from onnxhal.runtime.loader.sparse_constants import sparse_constants_to_initializers
from onnxhal.runtime.optimizer.cleanup import shapes_settled
from onnxhal.runtime.session.ep_context_model import ReadFunc, resolve_external_contexts

_logger = logging.getLogger("onnxhal.model_loader")


@dataclass
class LoadedModel:
    proto: onnx.ModelProto
    graph: Graph
    opset: dict[str, int]
    path: str | None

    def fresh(self) -> LoadedModel:
        """The model with a new Graph, for a session rebuilt after partitioning rewrote this one
        in place: from the proto already read, inlined and inferred, so the rebuild does not run
        shape inference (strict, then maybe lenient) over the whole model again."""
        graph = Graph.from_proto(self.proto.graph, self.opset)
        check_graph(graph, outer=set())
        resolve_schemas(graph)
        return LoadedModel(self.proto, graph, self.opset, self.path)


def _inject_external_data(proto: onnx.ModelProto, initializers: Mapping[str, np.ndarray],
                          files: Mapping[str, memoryview], what: str) -> None:
    """``SessionOptions.add_external_initializers`` and ``..._from_files_in_memory``: named main-graph
    initializers take the given arrays, and tensors stored in an in-memory file read their bytes
    from it; both stop being external, so nothing is read from disk for them."""
    if not initializers and not files:  # (the usual session: no index of the initializers to build)
        return
    by_name = {t.name: t for t in proto.graph.initializer}
    for name, arr in initializers.items():
        t = by_name.get(name)
        if t is None:
            raise InvalidArgument(f"add_external_initializers: {what} has no initializer {name!r} in its main graph; "
                                  f"give the names of its initializers.")
        new = onnx.numpy_helper.from_array(np.asarray(arr), name)
        if new.data_type != t.data_type or list(new.dims) != list(t.dims):
            want = onnx.helper.tensor_dtype_to_np_dtype(t.data_type)
            raise InvalidArgument(f"add_external_initializers({name!r}): {arr.dtype}{list(arr.shape)} given, the "
                                  f"model's initializer is {want}{list(t.dims)}; give that dtype and shape.")
        t.CopyFrom(new)
    if not files:
        return
    for t in tensors(proto.graph):
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in t.external_data}
        buf = files.get(info.get("location", ""))
        if buf is None:
            continue
        offset = int(info.get("offset", 0))
        length = int(info["length"]) if "length" in info else buf.nbytes - offset
        if offset < 0 or length < 0 or offset + length > buf.nbytes:
            raise InvalidArgument(f"tensor {t.name!r} reads bytes [{offset}, {offset + length}) of in-memory file "
                                  f"{info['location']!r}, which has {buf.nbytes}; give the whole file's contents.")
        t.raw_data = bytes(buf[offset:offset + length])
        del t.external_data[:]
        t.data_location = onnx.TensorProto.DEFAULT


def _no_external_data(proto: onnx.ModelProto, what: str) -> None:
    """A model given as bytes or a ModelProto has no folder to find external data in: ORT refuses
    it ("model_path must not be empty"), where reading the files from the current directory would
    load whatever happens to be there."""
    for t in tensors(proto.graph):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            location = next((e.value for e in t.external_data if e.key == "location"), "?")
            raise InvalidArgument(
                f"tensor {t.name!r} of the model given as {what} keeps its data in the external file {location!r}, "
                "which is found relative to the model file's folder. Pass the model's path instead, load it "
                "with onnx.load(path) (which reads the external data) and pass that ModelProto, or give the data "
                "with SessionOptions.add_external_initializers(_from_files_in_memory).")


def read_model(model: str | bytes | os.PathLike | onnx.ModelProto,
               external: tuple[Mapping[str, np.ndarray], Mapping[str, memoryview]] = ({}, {}),
               ) -> tuple[onnx.ModelProto, str | None]:
    """The model as a ModelProto (and its absolute path, if it came from a file). ``external``:
    initializers and external-data files given in memory (``SessionOptions.external_data``)."""
    initializers, files = external
    if isinstance(model, onnx.ModelProto):
        check_strings(model, "the onnx.ModelProto")
        if initializers or files:  # the caller's proto stays as it was
            copy = onnx.ModelProto()
            copy.CopyFrom(model)
            model = copy
            _inject_external_data(model, initializers, files, "the onnx.ModelProto")
        _no_external_data(model, "an onnx.ModelProto")
        return model, None
    if isinstance(model, (bytes, bytearray, memoryview)):
        data = bytes(model)
        try:
            proto = onnx.ModelProto()
            proto.ParseFromString(data)
        except (DecodeError, RuntimeError, ValueError) as e:
            raise InvalidProtobuf(f"model bytes ({len(data)} bytes) are not a valid ONNX ModelProto: {e}. "
                                  "Pass the bytes of an .onnx file, a path, or an onnx.ModelProto.") from e
        if not proto.HasField("graph"):
            raise InvalidProtobuf(f"model bytes ({len(data)} bytes) parse to a ModelProto with no graph: "
                                  "they are not an ONNX model.")
        # the bytes give the mirror, as a file's do (below): the walk over every tensor (and so
        # every node's attributes, a protobuf free per node without any) only where one may be external
        mirror = utf8_mirror_of(data)
        check_strings(proto, f"model bytes ({len(data)} bytes)", mirror)
        _inject_external_data(proto, initializers, files, "the model bytes")
        if mirror is None or mirror_may_keep_external_data(mirror):
            _no_external_data(proto, "bytes")
        return proto, None
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        # one stat for both checks (``isdir`` then ``isfile`` made two system calls)
        try:
            mode = os.stat(path).st_mode
        except (OSError, ValueError):  # missing, unreadable folder, or a name the OS refuses
            mode = 0
        if stat.S_ISDIR(mode):
            raise NoSuchFile(f"model file {path!r} is a folder, not a file. Give the path of the .onnx file in it.")
        if not stat.S_ISREG(mode):
            raise NoSuchFile(f"model file {path!r} does not exist (or is not a file). Check the path.")
        try:
            with open(path, "rb") as f:
                data = f.read()
            # the format onnx.load reads the file in (protobuf, or a text format by its extension)
            fmt = onnx.serialization.registry.get_format_from_file_extension(os.path.splitext(path)[1])
            proto = onnx.load_model_from_string(data, format=fmt)
            # A protobuf file's own bytes give the mirror: no serializing the model again to check
            # its strings, and a model none of whose tensors is external skips the walk over them
            mirror = utf8_mirror_of(data) if fmt in (None, "protobuf") else None
            check_strings(proto, f"model file {path!r}", mirror)  # external-data locations are among them
            _inject_external_data(proto, initializers, files, f"model file {path!r}")  # not read from disk
            if mirror is None or mirror_may_keep_external_data(mirror):
                load_external_data(proto, os.path.dirname(os.path.abspath(path)), f"model file {path!r}", path)
        except (Fail, InvalidArgument, InvalidProtobuf, NoSuchFile):
            raise
        except (DecodeError, RuntimeError, ValueError) as e:
            raise InvalidProtobuf(f"model file {path!r} is not a valid ONNX model: {e}") from e
        except OSError as e:  # the model or a data file cannot be read (permissions, a folder, ...)
            raise NoSuchFile(f"model file {path!r}: {e}") from e
        if not proto.HasField("graph"):
            raise InvalidProtobuf(f"model file {path!r} holds no graph: it is not an ONNX model.")
        return proto, os.path.abspath(path)
    raise InvalidArgument(f"InferenceSession expects a path, bytes or onnx.ModelProto, got {type(model).__name__}")


def load_model(model: str | bytes | os.PathLike | onnx.ModelProto,
               free_dimensions: tuple[Mapping[str, int], Mapping[str, int]] | None = None,
               external: tuple[Mapping[str, np.ndarray], Mapping[str, memoryview]] = ({}, {}),
               ep_context_read: tuple[ReadFunc, int] | None = None, contrib_one_pass: bool = True) -> LoadedModel:
    """``free_dimensions``: ({dim name: size}, {lower-case denotation: size}) to fix in the
    main graph's inputs before shape inference (``model_overrides.override_free_dimensions``).
    ``external``: as ``read_model``. ``ep_context_read``: where EPContext nodes that keep their
    data outside the model find it (``ep_context_model.resolve_external_contexts``).
    ``contrib_one_pass``: a model with com.microsoft ops of input 0's shape is inferred in one pass
    through their stand-ins where it can be (``contrib_shapes.infer_through_stand_ins``); False:
    always the model's own pass, then the stand-ins' (``LOAD_CONTRIB_ONE_PASS_KEY`` "0")."""
    proto, path = read_model(model, external)
    proto = resolve_external_contexts(proto, path, ep_context_read)
    if free_dimensions is not None:
        proto = override_free_dimensions(proto, *free_dimensions)
    opset = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in proto.opset_import}
    if not proto.opset_import:
        if proto.ir_version >= 3:  # the spec requires it from IR version 3 on; ORT refuses such a model
            raise InvalidGraph(f"the model (IR version {proto.ir_version}) has no opset_import, so its operators "
                               "have no version. Add one, e.g. onnx.helper.make_opsetid('', 17).")
        opset = {"": 1}
    known = onnx.defs.onnx_opset_version()
    if opset.get("", 0) > known:
        raise OrtNotImplemented(f"model uses ai.onnx opset {opset['']}, newer than the {known} this onnx "
                                f"package ({onnx.__version__}) knows. Upgrade onnx or export at opset <= {known}.")
    check_ir_version(proto)
    with flat_model_walks(proto):
        return _checked_and_inferred(model, proto, opset, path, contrib_one_pass)


def _checked_and_inferred(model: object, proto: onnx.ModelProto, opset: dict[str, int], path: str | None,
                          contrib_one_pass: bool = True) -> LoadedModel:
    """``load_model`` from the declaration checks on (``model``: what the caller gave;
    ``contrib_one_pass``: as ``load_model``)."""
    check_declarations(proto)
    # A proto the loader parsed (or copied, inlined) is its own to change; the caller's is not.
    proto = constants_to_initializers(proto, owned=proto is not model)
    check_nodes(proto, opset)  # before any C++ of onnx's reads the nodes: it trusts what it is given
    inlined = bool(proto.functions)
    if inlined:
        try:
            proto = onnx.inliner.inline_local_functions(proto)
        except Exception as e:
            raise InvalidGraph(f"model-local functions could not be inlined: {e}") from e
        proto = constants_to_initializers(proto, owned=True)  # the function bodies' Constants
    proto = sparse_constants_to_initializers(proto, owned=proto is not model)
    proto, declared_types = declared_value_info.set_aside(proto, owned=proto is not model)
    # Strict first: ORT runs each node's inference function at load and refuses what it rejects.
    # Outputs of ai.onnx.ml operators onnx cannot infer, where the declared types settle them, are
    # typed first (on the loader's own proto), so that one pass infers through them; where that
    # pass fails they are taken back and the model inferred as it came, so that what is refused,
    # and with which message, does not depend on them.
    owned = proto is not model
    typed = ml_shapes.typed_before_inference(proto, opset[ML_DOMAIN]) if owned and ML_DOMAIN in opset else []
    inferred, data_prop, strict_error = None, False, ""
    if contrib_one_pass and owned and not typed and "com.microsoft" in opset:
        # one strict pass through the contrib ops' stand-ins where it succeeds (contrib_shapes);
        # else the two passes below
        inferred, data_prop = infer_through_stand_ins(proto)
    one_pass = inferred is not None
    # one scan of the nodes for every strict pass on ``proto`` (the typing above and below changes
    # value_info alone, which a scan does not read)
    scan = guarded_inference.scan_nodes(proto) if not one_pass else None
    if not one_pass:
        inferred, data_prop, strict_error = guarded_inference.infer(proto, owned=owned, scan=scan)
    if typed and inferred is None:
        ml_shapes.restore(proto, typed)
        inferred, data_prop, strict_error = guarded_inference.infer(proto, owned=owned, scan=scan)
    inferred_strictly = inferred is not None
    node_errors = inference_errors(strict_error) if strict_error else []
    if inferred is None:
        inferred = guarded_inference.infer_lenient(proto, data_prop)
    elif ML_DOMAIN in opset or opset.get("", 0) >= 17:  # STFT from 17 (ml_shapes._RANK_ONLY)
        inferred = with_ml_shapes(inferred, opset.get(ML_DOMAIN, 0), scan if inferred is proto else None)
    if inferred_strictly and "com.microsoft" in opset and not one_pass:
        inferred = with_contrib_shapes(inferred)
    if any(k in strict_error for k in _SHAPE_CONFLICTS):
        _computed_output_shapes(inferred, proto, data_prop)
    graph = Graph.from_proto(inferred.graph, opset)
    if inferred_strictly and data_prop:
        shapes_settled(graph)  # the optimizer's refresh_shapes would repeat this very inference
    check_graph(graph, outer=set())
    resolve_schemas(graph)
    if node_errors:
        raise InvalidGraph(f"the model is invalid: {node_errors[0]}"
                           + (f" (and {len(node_errors) - 1} more: {'; '.join(node_errors[1:3])})" if node_errors[1:] else "")
                           + ". ONNX's shape inference rejects the node, as onnxruntime does at load; fix its "
                           "attributes or inputs.")
    declared_value_info.check_element_types(inferred, declared_types)
    guarded_inference.check_inferred(inferred, graph)
    check_after_inference(inferred, opset, checked=not inlined, graph=graph)
    return LoadedModel(inferred, graph, opset, path)


#: Session config key: "0" turns ``load_model``'s ``contrib_one_pass`` off (for A/B measurements
#: and to compare the two paths' types).
LOAD_CONTRIB_ONE_PASS_KEY = "session.load.contrib_one_pass"

_SHAPE_CONFLICTS = ("existing shape differ", "Inferred shape and existing")


def _computed_output_shapes(inferred: onnx.ModelProto, proto: onnx.ModelProto, data_prop: bool) -> None:
    """Graph outputs whose declared shape contradicts the computed one merge as onnxruntime merges
    them ("Falling back to lenient merge", graph.cc MergeShapeInfo): a dim the two disagree on
    becomes unknown, with a warning. onnxruntime allocates each output by the shape its kernel
    computes; a plan made from the contradicted declaration (an EP's static buffers) would write
    past its end."""
    computed = guarded_inference.computed_output_shapes(proto, data_prop)
    for out in inferred.graph.output:
        dims = computed.get(out.name)
        if dims is None or not out.type.HasField("tensor_type") or not out.type.tensor_type.HasField("shape"):
            continue
        declared = out.type.tensor_type.shape.dim
        said = [d.dim_value if d.HasField("dim_value") else None for d in declared]
        if len(said) == len(dims) and all(a is None or not isinstance(b, int) or a == b for a, b in zip(said, dims)):
            continue
        _logger.warning("output %r is declared %s but computes as %s; dims they disagree on are taken as unknown, "
                        "as onnxruntime merges them (re-export the model to fix its declaration)", out.name, said, dims)
        if len(said) != len(dims):
            out.type.tensor_type.ClearField("shape")
            continue
        for d, b in zip(declared, dims):
            if d.HasField("dim_value") and isinstance(b, int) and d.dim_value != b:
                d.Clear()


_ERROR_LINE = re.compile(r"\(op_type:([^,)]+)(?:, node name: ([^)]*))?\): (\[\w+\] )?(.*)")
#: Messages of strict inference that onnxruntime does not refuse a model for: a declared shape that
#: disagrees with the inferred one (a warning in ORT), a node whose input type is unknown because
#: an earlier node failed (a consequence, not a cause). A declared graph output's element type that
#: disagrees is refused by ORT but kept here on purpose (the computed type is returned; docs/sessions.md);
#: a disagreeing value_info element type is refused by ``declared_value_info``.
_NOT_FATAL = ("existing shape differ", "existing elem type", "instead is null", "Inferred shape and existing")
#: Ops whose nested errors come from their subgraphs (real); other ops' nested errors come from
#: inferring their function body, which onnx 1.23 gets wrong for some (MeanVarianceNormalization).
_SUBGRAPH_OPS = ("If", "Loop", "Scan", "SequenceMap")


def inference_errors(message: str) -> list[str]:
    """The node errors of a strict ONNX shape-inference failure that onnxruntime also refuses a
    model for, each as 'node OP 'NAME': message'."""
    found = []
    lines = message.splitlines()
    i = 0
    while i < len(lines):
        m = _ERROR_LINE.search(lines[i])
        i += 1
        if not m:
            continue
        op, name, text = m.group(1), m.group(2) or "", m.group(4)
        if text.startswith("Inference error(s):"):  # a nested list: its lines run to a blank one
            while i < len(lines) and lines[i].strip():
                text += "\n" + lines[i]
                i += 1
            if op in _SUBGRAPH_OPS:
                found += [f"{e} (in a subgraph of {op} {repr(name) if name else '(unnamed)'})"
                          for e in inference_errors(text)]
            continue
        if not any(k in text for k in _NOT_FATAL):
            found.append(f"node {op} {repr(name) if name else '(unnamed)'}: {text.strip().rstrip('.')}")
    return found


def check_graph(graph: Graph, outer: set[str]) -> None:
    """Sort the nodes topologically (ORT accepts unsorted graphs) and reject cycles, undefined
    inputs and values produced twice. Recurses into subgraphs with the names they may read."""
    defined = set(outer) | set(graph.initializers) | set(graph.input_names) | {v.name for v in graph.overridable}
    written, read = graph.indexed_names()
    # The graph's index answers for the usual graph, in C: as many names written as outputs (no
    # name written twice, none empty), none of them an input or initializer, and every name read
    # defined. Where it does not, the loops below find the offender and name it.
    if sum(1 for n in graph.nodes for o in n.outputs if o) == len(written) and written.isdisjoint(graph.input_names) \
            and written.isdisjoint(graph.initializers) and not (read - defined - written):
        _check_order_and_outputs(graph, defined, written)
        return
    produced: dict[str, Node] = {}
    for n in graph.nodes:
        for o in n.outputs:
            if not o:
                continue
            if o in produced:
                raise InvalidGraph(f"graph {graph.name!r}: value {o!r} is produced by two nodes "
                                   f"({produced[o].op_type} {produced[o].name!r} and {n.op_type} {n.name!r}).")
            if o in graph.input_names or o in graph.initializers:
                raise InvalidGraph(f"graph {graph.name!r}: node {n.op_type} {n.name!r} writes {o!r}, which is a "
                                   "graph input or initializer.")
            produced[o] = n
    for n in graph.nodes:
        for i in (*n.inputs, *n.implicit_inputs):
            if i and i not in defined and i not in produced:
                raise InvalidGraph(f"graph {graph.name!r}: node {n.op_type} {n.name!r} reads {i!r}, which no node, "
                                   "graph input or initializer defines.")
    _check_order_and_outputs(graph, defined, produced.keys())


def _check_order_and_outputs(graph: Graph, defined: set[str], produced: KeysView[str]) -> None:
    """``check_graph`` from the nodes' order on: ``defined``, the names the graph may read besides
    what its nodes write, ``produced``."""
    # the names no node writes (inputs, initializers, the outer scope's) are read by nearly every
    # node: given to ``toposort``, the order check passes such reads in C
    ordered = toposort(graph.nodes, graph.name, defined.difference(produced))
    if ordered is not graph.nodes:  # (already in order, the common case: the index stands)
        graph.nodes = ordered
        graph.reindex()
    for o in graph.outputs:
        if o.name not in produced and o.name not in defined:
            raise InvalidGraph(f"graph {graph.name!r}: output {o.name!r} is not produced by any node.")
    scope = defined | set(produced)
    for n in graph.nodes:
        if n.subgraphs:  # (most nodes hold none: no call for their empty list)
            for sub in n.subgraph_list():
                check_graph(sub, scope)


def toposort(nodes: list[Node], graph_name: str = "", unwritten: Set[str] = frozenset()) -> list[Node]:
    """Kahn's algorithm, stable with respect to the given order. Raises InvalidGraph on a cycle.
    ``nodes`` itself where it is in order already (every value a node reads that a node of the
    list writes is written before it), which one pass over the names finds. ``unwritten``: names
    that no node of ``nodes`` writes, where the caller knows them (any subset; the order found is
    the same)."""
    if _in_order(nodes, unwritten):
        return nodes
    producer = {o: i for i, n in enumerate(nodes) for o in n.outputs if o}
    deps: list[set[int]] = []
    users: list[list[int]] = [[] for _ in nodes]
    for i, n in enumerate(nodes):
        d = {producer[x] for x in (*n.inputs, *n.implicit_inputs) if x in producer and producer[x] != i}
        if any(producer.get(x) == i for x in n.inputs if x):
            raise InvalidGraph(f"graph {graph_name!r}: node {n.op_type} {n.name!r} reads its own output (a cycle).")
        deps.append(d)
        for j in d:
            users[j].append(i)
    pending = [len(d) for d in deps]
    import heapq

    ready = [i for i, p in enumerate(pending) if p == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            pending[u] -= 1
            if pending[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(nodes):
        stuck = [f"{nodes[i].op_type} {nodes[i].name!r}" for i in range(len(nodes)) if pending[i] > 0]
        raise InvalidGraph(f"graph {graph_name!r} has a cycle through {len(stuck)} node(s): {', '.join(stuck[:8])}")
    return [nodes[i] for i in order]


def _in_order(nodes: list[Node], unwritten: Set[str] = frozenset()) -> bool:
    """Whether no node reads a value that it or a later node of ``nodes`` writes (a node reading
    its own output is a cycle: Kahn's algorithm reports it). ``unwritten``: names no node of
    ``nodes`` writes; a read of one cannot make the order wrong, so it starts among the names
    ``written`` (without them, nearly every node read a weight or an input not written yet, and
    each such read was sorted out name by name)."""
    written: set[str] = {"", *unwritten}  # "": an omitted input, no value
    ahead: set[str] = set()  # read before any node of the list wrote it: a graph input, or later
    for n in nodes:
        reads = (*n.inputs, *n.implicit_inputs)
        if not written.issuperset(reads):
            ahead.update(r for r in reads if r not in written)
        written.update(n.outputs)
    return ahead.isdisjoint(written)


def _has_schema(op_type: str, domain: str) -> bool:
    try:
        return onnx.defs.has(op_type, domain)
    except Exception:  # a name onnx cannot take (not valid UTF-8): no such operator
        return False


def _predates(node: Node, version: int) -> str:
    """The message for a standard operator used at an opset older than its first version (ORT:
    "No Op registered for X with domain_version of N")."""
    domain = node.domain or "ai.onnx"
    first = min((s.since_version for s in onnx.defs.get_all_schemas_with_history()
                 if s.name == node.op_type and (s.domain or "ai.onnx") == domain), default=None)
    return (f"{node.op_type} node {node.name!r}: no operator {node.op_type} is registered for domain {domain!r} at "
            f"the model's opset {version}" + (f"; it exists from opset {first} on. Import {domain} opset >= "
                                              f"{first} in the model's opset_import" if first else "") + ".")


def resolve_schemas(graph: Graph) -> None:
    """Record each node's operator ``since_version`` (the schema in force at the model's opset)."""
    for n in graph.nodes:
        version = graph.opset_version(n.domain)
        if n.domain in STANDARD_DOMAINS:
            spec = schema_spec(n.op_type, version, n.domain)
            if spec is not None:
                n.since_version = spec.since_version
            elif _has_schema(n.op_type, n.domain):  # a standard op the model's opset predates
                raise InvalidGraph(_predates(n, version))
            else:
                n.since_version = 0  # unknown op: the CPU EP reports it when nobody claims it
        if n.subgraphs:
            for sub in n.subgraph_list():
                resolve_schemas(sub)
