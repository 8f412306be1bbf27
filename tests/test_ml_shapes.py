"""Shapes after the ai.onnx.ml operators onnx cannot infer (runtime/loader/ml_shapes.py): the loader
types their outputs as the specification states, inference goes on past them, the types it writes
are the ones the kernels return (and onnxruntime's), and a device that needs ranks claims the nodes
after them."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxhal
from onnxhal.runtime.loader.model_loader import load_model
from tests.conftest import simulated_or_skip

ML = "ai.onnx.ml"
F = TensorProto.FLOAT
COLS = 6


def _pipeline(ml_node: onnx.NodeProto, width: int, ml_opset: int = 3, extra_inputs: tuple = ()) -> onnx.ModelProto:
    """X [unnamed batch, COLS] -> the ml node (its output "s" an output too) -> MatMul by a [width, 3]
    weight -> Tanh: as skl2onnx writes a scaler in front of a network, with the batch dim unnamed."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((width, 3)).astype(np.float32), "w")
    nodes = [ml_node, helper.make_node("MatMul", [ml_node.output[0], "w"], ["h"]), helper.make_node("Tanh", ["h"], ["y"])]
    x = helper.make_tensor_value_info("X", F, [None, COLS])
    outputs = [helper.make_tensor_value_info(n, F, None) for n in ("y", ml_node.output[0])]
    graph = helper.make_graph(nodes, "g", [x, *extra_inputs], outputs, [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ML, ml_opset)])
    model.ir_version = 8
    return model


def _scaler():
    return helper.make_node("Scaler", ["X"], ["s"], domain=ML, offset=[0.5] * COLS, scale=[2.0] * COLS), COLS


def _normalizer():
    return helper.make_node("Normalizer", ["X"], ["s"], domain=ML, norm="L2"), COLS


def _imputer():
    return helper.make_node("Imputer", ["X"], ["s"], domain=ML, imputed_value_floats=[1.0] * COLS,
                            replaced_value_float=float("nan")), COLS


def _linear_regressor():
    return helper.make_node("LinearRegressor", ["X"], ["s"], domain=ML, targets=2,
                            coefficients=list(np.linspace(-1, 1, 2 * COLS)), intercepts=[0.1, -0.2]), 2


def _svm_regressor():
    return helper.make_node("SVMRegressor", ["X"], ["s"], domain=ML, kernel_type="LINEAR",
                            coefficients=list(np.linspace(-1, 1, COLS)), kernel_params=[0.0, 0.0, 0.0], rho=[0.3],
                            n_supports=0), 1


def _tree_regressor_v1():
    return helper.make_node("TreeEnsembleRegressor", ["X"], ["s"], domain=ML, n_targets=2,
                            nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[1, 0, 0],
                            nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_values=[0.0, 0.0, 0.0],
                            nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0],
                            target_treeids=[0, 0, 0, 0], target_nodeids=[1, 1, 2, 2], target_ids=[0, 1, 0, 1],
                            target_weights=[1.0, -1.0, 2.0, 0.5]), 2


def _feature_vectorizer():
    return helper.make_node("FeatureVectorizer", ["X", "Z"], ["s"], domain=ML, inputdimensions=[COLS, 2]), COLS + 2


CASES = {"Scaler": (_scaler, 3), "Normalizer": (_normalizer, 3), "Imputer": (_imputer, 3),
         "LinearRegressor": (_linear_regressor, 3), "SVMRegressor": (_svm_regressor, 3),
         "TreeEnsembleRegressor-1": (_tree_regressor_v1, 1), "FeatureVectorizer": (_feature_vectorizer, 3)}


def _case(name: str) -> tuple[onnx.ModelProto, dict]:
    make, ml_opset = CASES[name]
    node, width = make()
    extra = (helper.make_tensor_value_info("Z", F, [None, 2]),) if name == "FeatureVectorizer" else ()
    model = _pipeline(node, width, ml_opset, extra)
    rng = np.random.default_rng(1)
    feeds = {"X": rng.standard_normal((5, COLS)).astype(np.float32)}
    if extra:
        feeds["Z"] = rng.standard_normal((5, 2)).astype(np.float32)
    return model, feeds


def _ranks(model: onnx.ModelProto) -> dict[str, int | None]:
    loaded = load_model(model.SerializeToString()).proto
    return {v.name: (len(v.type.tensor_type.shape.dim) if v.type.tensor_type.HasField("shape") else None)
            for v in (*loaded.graph.value_info, *loaded.graph.output)}


@pytest.mark.parametrize("name", CASES)
def test_inference_goes_on_past_the_operator_with_the_shapes_it_computes(name):
    model, feeds = _case(name)
    assert onnx.shape_inference.infer_shapes(model).graph.output[0].type.tensor_type.HasField("shape") is False, \
        "onnx infers this operator itself now: the case tests nothing"
    ranks = _ranks(model)
    assert ranks["s"] == 2 and ranks["h"] == 2 and ranks["y"] == 2
    loaded = load_model(model.SerializeToString()).proto
    declared = {v.name: [d.dim_value or None for d in v.type.tensor_type.shape.dim]
                for v in (*loaded.graph.value_info, *loaded.graph.output)}
    sess = onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(["s", "y"], feeds)
    for value, out in zip(("s", "y"), got):  # the types written are the ones the run returns
        assert out.dtype == np.float32 and out.ndim == len(declared[value])
        assert all(d is None or d == n for d, n in zip(declared[value], out.shape))
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(["s", "y"], feeds)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_contradiction_after_the_operator_keeps_the_first_pass_and_the_model_loads():
    # Scaler's [N, 6] output meets a [4] bias: strict inference past it fails, onnxruntime (which
    # cannot type the Scaler) loads the model; so must the loader, with the first pass's values.
    node = helper.make_node("Scaler", ["X"], ["s"], domain=ML, offset=[0.0], scale=[1.0])
    b = numpy_helper.from_array(np.ones(4, np.float32), "b")
    graph = helper.make_graph([node, helper.make_node("Add", ["s", "b"], ["y"])], "g",
                              [helper.make_tensor_value_info("X", F, [None, COLS])],
                              [helper.make_tensor_value_info("y", F, None)], [b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ML, 3)])
    model.ir_version = 8
    ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])  # loads
    ranks = _ranks(model)
    assert ranks.get("y") is None  # nothing past the Scaler: the first pass's values
    onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_a_gpu_profile_claims_the_network_after_a_scaler():
    model, feeds = _case("Scaler")
    want = onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(["y"], feeds)[0]
    with simulated_or_skip("generic-gpu") as sims:
        so = onnxhal.SessionOptions()
        so.add_provider_for_devices([next(iter(sims.values()))])
        sess = onnxhal.InferenceSession(model.SerializeToString(), so)
        # MatMul and Tanh on the GPU; the Scaler (an operator the profile lacks) on the CPU EP
        assert sum(n for ep, n in sess.partition_summary.items() if ep != "CPUExecutionProvider") == 2
        np.testing.assert_allclose(sess.run(["y"], feeds)[0], want, rtol=1e-3, atol=1e-4)


def test_typing_before_inference_takes_what_the_declared_types_settle(monkeypatch):
    """Before inference a Scaler on the graph input is typed; one after a Relu (whose output only
    inference types) is left, without a look at the model's values (``_fill`` is not called)."""
    from onnxhal.runtime.loader import ml_shapes

    model, _ = _case("Scaler")
    changed = ml_shapes.typed_before_inference(model, 3)
    assert [info.name for info, _ in changed] == ["s"]
    assert [d.dim_value for d in model.graph.output[1].type.tensor_type.shape.dim] == [0, COLS]
    ml_shapes.restore(model, changed)
    assert not model.graph.output[1].type.tensor_type.HasField("shape")
    late, _ = _case("Scaler")
    late.graph.node[0].input[0] = "r"
    late.graph.node.insert(0, helper.make_node("Relu", ["X"], ["r"]))
    assert _ranks(late)["s"] == 2  # typed after inference reached it
    calls = []
    monkeypatch.setattr(ml_shapes, "_fill", lambda *a: calls.append(a) or [])
    assert ml_shapes.typed_before_inference(late, 3) == [] and calls == []


def _tokenizer_model(in_shape: list) -> onnx.ModelProto:
    """strings -> com.microsoft Tokenizer -> Flatten: skl2onnx's text chain, with an ai.onnx.ml opset."""
    nodes = [helper.make_node("Tokenizer", ["x"], ["t"], domain="com.microsoft", mark=0, mincharnum=1,
                              pad_value="#", tokenexp="[a-z]+"),
             helper.make_node("Flatten", ["t"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.STRING, in_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.STRING, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ML, 1),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("in_shape", [[None], [None, 2], [3, 2]])
def test_tokenizer_output_adds_one_unknown_dim_to_the_input_shape(in_shape):
    model = _tokenizer_model(in_shape)
    loaded = load_model(model.SerializeToString()).proto
    types = {v.name: v.type.tensor_type for v in (*loaded.graph.value_info, *loaded.graph.output)}
    t = types["t"]
    assert t.elem_type == TensorProto.STRING
    dims = [d.dim_value or None for d in t.shape.dim]
    assert len(dims) == len(in_shape) + 1 and dims[:-1] == in_shape and dims[-1] is None
    assert len(types["y"].shape.dim) == 2  # inference goes on past it
    x = np.array([["ab cd", "e"], ["", "fgh i j"], ["k", "l"]], dtype=object)
    x = x[:, 0] if len(in_shape) == 1 else x
    got = onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(["y"], {"x": x})
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(["y"], {"x": x})
    assert got[0].tolist() == want[0].tolist()


def test_a_skl2onnx_text_pipeline_gets_ranks_past_the_tokenizer():
    model = onnx.load("tests/real_models/skh_tfidf.onnx")
    ranks = _ranks(model)
    assert ranks["tokenized"] == 2 and ranks["flattened1"] == 2 and ranks["output"] == 2
    data = model.SerializeToString()
    saved = np.load("tests/real_models/skh_tfidf.npz", allow_pickle=True)
    feeds = {name: saved[f"a.{name}"] for name in ("text", "num")}
    want = onnxhal.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    with simulated_or_skip("generic-gpu") as sims:
        so = onnxhal.SessionOptions()
        so.add_provider_for_devices([next(iter(sims.values()))])
        sess = onnxhal.InferenceSession(data, so)
        # every node was declined for want of a rank; now the ones after the Tokenizer the profile has
        assert sum(n for ep, n in sess.partition_summary.items() if ep != "CPUExecutionProvider") >= 1
        for a, b in zip(sess.run(None, feeds), want):
            np.testing.assert_allclose(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64), rtol=1e-3,
                                       atol=1e-4)


def test_the_passes_after_typing_reuse_one_scan_of_the_nodes_and_infer_the_same_types(monkeypatch):
    """X -> Relu -> Scaler -> Relu -> Normalizer -> Tanh: inference stops at each ai.onnx.ml
    operator, so the loader infers three times; the nodes are scanned once for all three
    (``guarded_inference.scan_nodes``), and every value gets the type and shape a fresh scan per
    pass gives."""
    from onnxhal.runtime.loader import guarded_inference

    nodes = [helper.make_node("Relu", ["X"], ["r1"]),
             helper.make_node("Scaler", ["r1"], ["s1"], domain=ML, offset=[0.5] * COLS, scale=[2.0] * COLS),
             helper.make_node("Relu", ["s1"], ["r2"]),
             helper.make_node("Normalizer", ["r2"], ["s2"], domain=ML, norm="L2"),
             helper.make_node("Tanh", ["s2"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", F, [None, COLS])],
                              [helper.make_tensor_value_info("y", F, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ML, 3)])
    model.ir_version = 8
    data = model.SerializeToString()

    def types(proto: onnx.ModelProto) -> dict[str, str]:
        return {v.name: str(v.type) for v in (*proto.graph.value_info, *proto.graph.output)}

    scans, infers = [], []
    scan_nodes, infer = guarded_inference.scan_nodes, guarded_inference.infer
    monkeypatch.setattr(guarded_inference, "scan_nodes", lambda proto: scans.append(1) or scan_nodes(proto))
    monkeypatch.setattr(guarded_inference, "infer", lambda *a, **k: infers.append(1) or infer(*a, **k))
    reused = types(load_model(data).proto)
    assert len(infers) == 3 and len(scans) == 1
    monkeypatch.setattr(guarded_inference, "infer", lambda proto, owned=False, scan=None: infer(proto, owned))
    fresh = types(load_model(data).proto)
    assert reused == fresh and len(scans) == 5  # the loader's, then one in each pass
    assert _ranks(model)["y"] == 2  # typed past both operators


def test_stft_of_a_symbolic_signal_gets_its_rank_and_the_values_after_it_theirs():
    """onnx's inference gives STFT no shape where the signal's length is symbolic (spox's log-mel
    front end, torch.stft by the dynamo exporter): the loader types it [batch, ?, ?, 2], inference
    goes on through the power spectrum and the mel product, and the run gives onnxruntime's values."""
    step, frame = numpy_helper.from_array(np.array(4, np.int64), "step"), numpy_helper.from_array(np.array(16, np.int64), "len")
    mel = numpy_helper.from_array(np.random.default_rng(0).random((9, 5)).astype(np.float32), "mel")
    axes = numpy_helper.from_array(np.array([-1], np.int64), "axes")
    nodes = [helper.make_node("Unsqueeze", ["wav", "axes"], ["sig"]),
             helper.make_node("STFT", ["sig", "step", "", "len"], ["spec"]),
             helper.make_node("Mul", ["spec", "spec"], ["sq"]),
             helper.make_node("ReduceSum", ["sq", "axes"], ["power"], keepdims=0),
             helper.make_node("MatMul", ["power", "mel"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("wav", F, ["batch", "samples"])],
                              [helper.make_tensor_value_info("y", F, None)], [step, frame, mel, axes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    loaded = load_model(model.SerializeToString()).proto
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in (*loaded.graph.value_info, *loaded.graph.output)
             if v.type.tensor_type.HasField("shape")}
    assert ranks.get("spec") == 4 and ranks.get("power") == 3 and ranks.get("y") == 3, ranks
    feeds = {"wav": np.random.default_rng(1).standard_normal((2, 50)).astype(np.float32)}
    got = onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_fill_types_a_chain_in_one_call_and_leaves_other_values_alone():
    # Scaler -> Normalizer on a declared input: the Normalizer reads what the Scaler's entry was
    # just given; a declared value no such node touches keeps its entry as it was
    from onnxhal.runtime.loader import ml_shapes

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])
    other = helper.make_tensor_value_info("r", TensorProto.FLOAT, None)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Scaler", ["x"], ["s"], domain="ai.onnx.ml", offset=[0.0] * 3, scale=[1.0] * 3),
             helper.make_node("Normalizer", ["s"], ["y"], domain="ai.onnx.ml", norm="L2")]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], value_info=[other]),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 1)])
    changed = ml_shapes._fill(model, 1)
    assert sorted(info.name for info, _ in changed) == ["s", "y"]
    shapes = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in (*model.graph.value_info, *model.graph.output)}
    assert shapes["s"] == shapes["y"] == ["n", 3]
    assert shapes["r"] == [] and not model.graph.value_info[0].type.tensor_type.HasField("shape")
