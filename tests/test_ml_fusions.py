"""The ai.onnx.ml fusions (runtime/optimizer/ml_fusions.py) against onnxruntime: LinearClassifier ->
Normalizer becomes one FusedLinearClassifier node whose outputs match onnxruntime's for every
post transform, norm and class count (labels exactly, scores within 1e-5 relative), on rows that
take the kernels' small paths and on rows with scores beyond +-60 (their fallback)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnxhal
from onnxhal.hal import GraphOptimizationLevel as Level
from onnxhal.runtime.loader.model_loader import load_model
from onnxhal.runtime.optimizer.passes import optimize

ML = "ai.onnx.ml"
F, I64, S = TensorProto.FLOAT, TensorProto.INT64, TensorProto.STRING


def _classifier(classes: int, transform: str, norm: str, strings: bool, seed: int,
                probabilities_out: bool = False) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    feats = 4
    labels = list(range(10, 10 + max(2, classes)))
    label_attr = {"classlabels_strings": [f"c{v}" for v in labels]} if strings else {"classlabels_ints": labels}
    clf = helper.make_node("LinearClassifier", ["X"], ["label", "scores"], domain=ML, post_transform=transform,
                           coefficients=rng.standard_normal(classes * feats).tolist(),
                           intercepts=rng.standard_normal(classes).tolist(), **label_attr)
    normalizer = helper.make_node("Normalizer", ["scores"], ["probabilities"], domain=ML, norm=norm)
    outputs = [helper.make_tensor_value_info("label", S if strings else I64, None),
               helper.make_tensor_value_info("probabilities", F, None)]
    if probabilities_out:  # the classifier's scores read outside the pair: not fused
        outputs.append(helper.make_tensor_value_info("scores", F, None))
    graph = helper.make_graph([clf, normalizer], "clf", [helper.make_tensor_value_info("X", F, [None, feats])],
                              outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ML, 1)])
    model.ir_version = 10  # onnxruntime 1.32 refuses the IR onnx 1.23 writes
    return model


def _ops(model: onnx.ModelProto, level: Level) -> Counter:
    return Counter(n.op_type for n in optimize(load_model(model).graph, level).nodes)


def _inputs(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((16, 4)).astype(np.float32)
    x[3] = 0  # a row of intercepts alone
    wide = (x * 40).astype(np.float32)  # scores beyond +-60: the softmax's fallback with row maxima
    return {"small": x, "wide": wide}


@pytest.mark.parametrize("transform", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"])
@pytest.mark.parametrize("norm", ["L1", "L2", "MAX"])
def test_fused_linear_classifier_matches_onnxruntime(transform, norm):
    for classes in (1, 2, 3):
        for strings in (False, True):
            model = _classifier(classes, transform, norm, strings, seed=classes)
            assert _ops(model, Level.ORT_ENABLE_ALL) == {"FusedLinearClassifier": 1}
            data = model.SerializeToString()
            ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
            sess = onnxhal.InferenceSession(data, providers=["CPUExecutionProvider"])
            for what, x in _inputs(classes).items():
                want, got = ref.run(None, {"X": x}), sess.run(None, {"X": x})
                case = f"{classes} classes, {'string' if strings else 'int'} labels, {transform}, {norm}, {what}"
                assert got[0].tolist() == want[0].tolist(), case
                assert got[1].dtype == np.float32 and got[1].shape == want[1].shape, case
                np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-6, err_msg=case)


def test_classifier_and_normalizer_stay_apart_where_the_scores_are_read_elsewhere():
    model = _classifier(3, "SOFTMAX", "L1", False, seed=0, probabilities_out=True)
    assert _ops(model, Level.ORT_ENABLE_ALL) == {"LinearClassifier": 1, "Normalizer": 1}
    x = _inputs(0)["small"]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"X": x})
    got = onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"X": x})
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_basic_level_keeps_the_pair():
    model = _classifier(3, "SOFTMAX", "L1", False, seed=0)
    assert _ops(model, Level.ORT_ENABLE_BASIC) == {"LinearClassifier": 1, "Normalizer": 1}
