"""The model folders shipped in the onnx package, on the CPU EP: simple, pytorch-converted,
pytorch-operator and the light model zoo. All but the two training Gradient cases pass."""

from __future__ import annotations

import pytest

import onnxhal
from tests.onnx_cases import ModelCase, assert_similar, folder_cases, light_cases

# ai.onnx.preview.training Gradient needs autodiff of the graph; no inference runtime runs it.
TRAINING_ONLY = {"test_gradient_of_add", "test_gradient_of_add_and_mul"}

CASES: list[ModelCase] = [c for kind in ("simple", "pytorch-converted", "pytorch-operator") for c in folder_cases(kind)]
LIGHT: list[ModelCase] = light_cases()


def _run_case(case: ModelCase) -> None:
    sess = onnxhal.InferenceSession(case.model, providers=["CPUExecutionProvider"])
    for k, (feeds, expected) in enumerate(case.data_sets):
        outs = sess.run(None, feeds)
        assert len(outs) == len(expected)
        for i, (o, e) in enumerate(zip(outs, expected)):
            assert_similar(e, o, case.rtol, case.atol, f"{case.name} data set {k} output {i}")


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name, marks=pytest.mark.xfail(
    reason="training-only Gradient operator (ai.onnx.preview.training)", strict=True, raises=onnxhal.errors.OrtError))
    if c.name in TRAINING_ONLY else pytest.param(c, id=c.name) for c in CASES])
def test_model_folder(case):
    _run_case(case)


@pytest.mark.parametrize("case", LIGHT, ids=[c.name for c in LIGHT])
def test_light_model_zoo(case):
    _run_case(case)


def test_counts():
    assert len(CASES) == 23 + 82 + 35
    assert {c.name for c in LIGHT} == {"bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
                                       "shufflenet", "squeezenet", "vgg19", "zfnet512"}
