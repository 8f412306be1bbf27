"""The rounds of ``ml_shapes.with_ml_shapes`` that infer only the nodes reading what a round typed
(``INFER_DOWNSTREAM``), one by one with onnx's inference functions, instead of a whole strict
pass: the same types as the whole pass wherever they run, and the whole pass (its types, its
errors) wherever they cannot tell."""

from __future__ import annotations

import warnings
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from onnxhal.runtime.loader import guarded_inference, ml_shapes
from onnxhal.runtime.loader.model_loader import load_model

ML = "ai.onnx.ml"
F = TensorProto.FLOAT
CORPUS = Path(__file__).parent / "real_models"


def _types(model: onnx.ModelProto) -> dict[str, bytes]:
    g = model.graph
    return {v.name: v.type.SerializeToString() for v in (*g.value_info, *g.output)}


def _load_both(monkeypatch, model) -> tuple[dict, dict, int, int]:
    """(types off, types on, whole passes off, whole passes on); a load that raises gives its
    error's type and message in place of the types."""
    passes = []
    infer = guarded_inference.infer

    def counted(*a, **k):
        passes[-1] += 1
        return infer(*a, **k)

    monkeypatch.setattr(guarded_inference, "infer", counted)
    found = []
    for on in (False, True):
        monkeypatch.setattr(ml_shapes, "INFER_DOWNSTREAM", on)
        passes.append(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                found.append(_types(load_model(model).proto))
            except Exception as e:  # the outcome compared is then the error, type and message
                found.append((type(e).__name__, str(e)))
    return found[0], found[1], passes[0], passes[1]


def _long_chain_then_scaler(tail_op: str = "Relu", chain: int = 40, tail: int = 1, **attrs) -> onnx.ModelProto:
    """X [N, 4] -> ``chain`` Relus -> Scaler (onnx gives it no shape) -> ``tail`` ``tail_op`` nodes: a
    large graph whose ML node reads an inferred value, so its output's shape is filled in after the
    first pass."""
    nodes = [helper.make_node("Relu", ["X" if i == 0 else f"r{i - 1}"], [f"r{i}"]) for i in range(chain)]
    nodes.append(helper.make_node("Scaler", [f"r{chain - 1}"], ["s"], domain=ML, offset=[0.5] * 4, scale=[2.0] * 4))
    nodes += [helper.make_node(tail_op, ["s" if i == 0 else f"t{i - 1}"], ["y" if i == tail - 1 else f"t{i}"], **attrs)
              for i in range(tail)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", F, ["N", 4])],
                              [helper.make_empty_tensor_value_info("y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ML, 3)])
    model.ir_version = 8
    return model


def test_a_small_tail_after_the_ml_node_is_inferred_node_by_node_with_the_whole_pass_types(monkeypatch):
    off, on, passes_off, passes_on = _load_both(monkeypatch, _long_chain_then_scaler())
    assert (passes_off, passes_on) == (2, 1)
    assert on == off
    y = onnx.TypeProto.FromString(on["y"]).tensor_type
    assert [d.dim_param or d.dim_value for d in y.shape.dim] == ["N", 4]


def test_a_shape_the_tail_refuses_falls_back_to_the_whole_pass(monkeypatch):
    # Flatten's axis 5 is past the rank the Scaler's shape gives: the node's own inference refuses
    # it, the whole pass runs (and fails), and the outcome is the plain path's
    off, on, passes_off, passes_on = _load_both(monkeypatch, _long_chain_then_scaler("Flatten", axis=5))
    assert passes_on == passes_off == 2
    assert on == off


@pytest.mark.parametrize("chain, tail", [(40, 10), (3, 1)])
def test_a_tail_too_large_for_the_graph_or_a_small_graph_runs_the_whole_pass(monkeypatch, chain, tail):
    off, on, passes_off, passes_on = _load_both(monkeypatch, _long_chain_then_scaler(chain=chain, tail=tail))
    assert passes_on == passes_off == 2
    assert on == off


@pytest.mark.parametrize("name", ["skh_quantile_nusvr", "sk_onehot", "sk_imputer", "skh_tfidf", "spx_logmel"])
def test_corpus_models_get_the_whole_pass_types(monkeypatch, name):
    path = CORPUS / f"{name}.onnx"
    if not path.exists():
        pytest.fail(f"{path} is missing from the corpus")
    off, on, passes_off, passes_on = _load_both(monkeypatch, str(path))
    assert on == off
    assert passes_on <= passes_off


def _tensor(elem: int, dims: list | None) -> onnx.TypeProto:
    return helper.make_tensor_type_proto(elem, dims)


def test_merge_fills_unknown_dims_and_refuses_conflicts():
    merged = ml_shapes._merged(_tensor(F, [None, 3]), _tensor(F, ["N", 3]))
    assert [d.dim_param or d.dim_value for d in merged.tensor_type.shape.dim] == ["N", 3]
    assert ml_shapes._merged(_tensor(F, None), _tensor(F, ["N", 3])) == _tensor(F, ["N", 3])
    assert ml_shapes._merged(_tensor(F, ["M", 3]), _tensor(F, ["N", 3])) == _tensor(F, ["M", 3])
    assert ml_shapes._merged(_tensor(F, [2, 3]), _tensor(F, [2, 4])) is None
    assert ml_shapes._merged(_tensor(F, [2, 3]), _tensor(F, [2, 3, 1])) is None
    assert ml_shapes._merged(_tensor(TensorProto.INT64, [2]), _tensor(F, [2])) is None
