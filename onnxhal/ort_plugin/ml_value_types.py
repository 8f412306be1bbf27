"""Types and shapes of the values after the ai.onnx.ml operators (and the others ``ml_shapes``
types) in the bridge's graph view, where onnxruntime's OrtGraph gives none.

onnxruntime infers with onnx's schemas, which give Scaler, Normalizer, Imputer, LinearRegressor,
SVMRegressor, the opset-1 TreeEnsembleRegressor, FeatureVectorizer and com.microsoft's Tokenizer no
inference function: every value after one of them reaches the EP with no rank, and an EP that
needs ranks (every simulated profile) declined the rest of a scikit-learn pipeline inside
onnxruntime (skh_countvec: 0 of 19 nodes) where onnxhal's own session, whose loader types those
outputs (``runtime/loader/ml_shapes.py``), takes 5 of 18. The graph view is given the same types:
the loader's strict inference and ``ml_shapes.with_ml_shapes`` run on the view as a model, and
a value gets the inferred type only where onnxruntime gives it none (onnxruntime's types stand).
Where the nodes fail the loader's checks, an input is not a tensor, or inference fails, the view
stays as onnxruntime gave it.
"""

from __future__ import annotations

from collections.abc import Mapping

import onnx
from onnx import helper

from onnxhal.hal.errors import OrtError
from onnxhal.hal.graph import Graph, ValueInfo
from onnxhal.runtime.loader import guarded_inference
from onnxhal.runtime.loader.ml_shapes import ML, with_ml_shapes
from onnxhal.runtime.loader.node_checks import check_nodes

#: Session config key: "0" leaves the graph view as onnxruntime gives it (for A/B measurements and
#: the tests that compare the two)
BRIDGE_ML_SHAPES_KEY = "ep.onnxhal.bridge_ml_shapes"
#: initializers of more elements cross into the inference model without data (it reads none of
#: theirs: ``Graph.to_proto``)
_DATA_UP_TO = 64
#: domains and operators whose outputs ``with_ml_shapes`` may type
_DOMAINS = frozenset({ML, "com.microsoft"})
_OPS = frozenset({"STFT"})


def _untyped(info: ValueInfo | None) -> bool:
    return info is None or info.type_proto is None or info.shape is None


def _may_type(graph: Graph) -> bool:
    return any(n.domain in _DOMAINS or n.op_type in _OPS for n in graph.nodes)


def inferred_types(graph: Graph) -> dict[str, ValueInfo]:
    """The values of ``graph`` onnxruntime gives no rank that the loader's inference with
    ``with_ml_shapes`` types, by name (empty where there are none, or inference fails)."""
    if not _may_type(graph):
        return {}
    untyped = {n for node in graph.nodes for n in node.outputs if n and _untyped(graph.value_infos.get(n))}
    # an input the view does not type (a map or sequence: graph_view.py carries tensors alone)
    # would reach onnx's C++ inference untyped, which it does not survive (DictVectorizer: a crash)
    if not untyped or any(v.type_proto is None for v in graph.inputs):
        return {}
    opset = [helper.make_opsetid(d, v) for d, v in graph.opset.items()]
    model = helper.make_model(graph.to_proto(data_up_to=_DATA_UP_TO), opset_imports=opset,
                              ir_version=min(onnx.IR_VERSION, 10))
    try:
        check_nodes(model, graph.opset)  # as the loader: onnx's C++ trusts the nodes it is given
    except OrtError:
        return {}  # claim_checks.py refuses the graph and names the node
    inferred, _, _ = guarded_inference.infer(model, owned=True)
    if inferred is None:
        return {}
    inferred = with_ml_shapes(inferred, graph.opset.get(ML, 0))
    found: dict[str, ValueInfo] = {}
    g = inferred.graph
    for vi in (*g.value_info, *g.output):
        if vi.name in untyped and vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
            found[vi.name] = ValueInfo(vi.name, vi.type)
    return found


def apply_types(graph: Graph, types: Mapping[str, ValueInfo]) -> int:
    """Give each value of ``graph`` with no rank its type in ``types`` (same element type, or none
    known); the graph's inputs and outputs too. Returns how many values were typed."""
    typed = 0
    for name, info in types.items():
        old = graph.value_infos.get(name)
        if not _untyped(old) or (old is not None and old.type_proto is not None
                                 and old.elem_type not in (0, info.elem_type)):
            continue
        if old is None and graph.producer(name) is None and name not in graph.input_names:
            continue  # not a value of this graph
        graph.set_value_info(info)
        for edges in (graph.inputs, graph.outputs):
            for i, v in enumerate(edges):
                if v.name == name:
                    edges[i] = info
        typed += 1
    return typed
