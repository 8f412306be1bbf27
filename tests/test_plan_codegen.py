"""The generated run function (runtime/session/plan_codegen.py) against the interpreted step loop it
stands for, and ``explain``'s reading of it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import onnxhal
from onnxhal.runtime.session.plan_codegen import generate
from onnxhal.stored_outputs import read_signatures

CORPUS = Path(__file__).parent / "real_models"
# Control flow (If, Loop, Scan bodies with their own plans), shape memos, multi-output nodes,
# ZipMap sequences, quantized and fp16 graphs.
MODELS = ["vad_if_loop_ts", "bert_ts", "gpt2_past_ts", "lstm_ts", "sk_knn", "sk_forest_zipmap",
          "crnn_ts_qdq_pc", "resnet_ts_fp16", "yolov8_tiny", "t5_seq2seq_ts"]


class _StepRecorder:
    """The profiler's per-step hook: a run given one goes through the interpreted loop."""

    def __init__(self) -> None:
        self.labels: list[str] = []

    def record_step(self, step, t0, t1, ins, outs) -> None:
        self.labels.append(step.label)


def _same(a, b) -> None:
    if isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b)
    else:
        assert a == b


@pytest.mark.parametrize("name", MODELS)
def test_generated_and_interpreted_runs_agree(name):
    path = CORPUS / f"{name}.onnx"
    feeds = next(iter(read_signatures(path).values()))[0]
    sess = onnxhal.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    plan = sess.plan
    first = plan.run(dict(feeds))  # the plan's first run: its steps in a loop (``_first_run``)
    assert plan._generated is None  # not written for a plan run once
    generated = plan.run(dict(feeds))
    assert plan._generated is not None
    recorder = _StepRecorder()
    interpreted = plan.run(dict(feeds), profiler=recorder)
    # every step ran one by one (the generated function may skip shape steps it memoised)
    assert recorder.labels == [s.label for s in plan.steps]
    assert len(first) == len(generated) == len(interpreted) == len(sess.get_outputs())
    for f, g, i in zip(first, generated, interpreted):
        _same(f, i)
        _same(g, i)


def test_a_wrong_generated_function_is_caught():
    """The comparison above can fail: a generated function whose LSTM step computes zeros differs
    from the interpreted run."""
    path = CORPUS / "lstm_ts.onnx"
    feeds = next(iter(read_signatures(path).values()))[0]
    plan = onnxhal.InferenceSession(str(path), providers=["CPUExecutionProvider"]).plan
    steps = list(plan.generated_steps)
    k = max(i for i, s in enumerate(steps) if s.node is not None and s.node.op_type == "LSTM")
    right = steps[k].fn
    steps[k] = dataclasses.replace(steps[k], inline_fn=None, fn=lambda ins: [np.zeros_like(right(ins)[0])])
    plan.generated = generate(steps, plan.output_slots, False)  # made: the first run takes it too
    broken = plan.run(dict(feeds))
    reference = plan.run(dict(feeds), profiler=_StepRecorder())
    assert any(not np.array_equal(b, r) for b, r in zip(broken, reference))


def test_a_wrong_first_run_loop_is_caught():
    """The same for the first run's loop over the steps: a step computing zeros there differs from
    the interpreted run."""
    path = CORPUS / "lstm_ts.onnx"
    feeds = next(iter(read_signatures(path).values()))[0]
    plan = onnxhal.InferenceSession(str(path), providers=["CPUExecutionProvider"]).plan
    steps = list(plan.generated_steps)
    k = max(i for i, s in enumerate(steps) if s.node is not None and s.node.op_type == "LSTM")
    right = steps[k].fn
    steps[k] = dataclasses.replace(steps[k], inline_fn=None, fn=lambda ins: [np.zeros_like(right(ins)[0])])
    plan.generated_steps = steps
    broken = plan.run(dict(feeds))
    reference = plan.run(dict(feeds), profiler=_StepRecorder())
    assert any(not np.array_equal(b, r) for b, r in zip(broken, reference))


def test_a_failing_step_of_the_first_run_is_named():
    """The first run's loop names the failing node, with the error's type, as the generated
    function's errors do."""
    from onnx import TensorProto, helper

    from onnxhal.hal.errors import OrtError

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="act"),
         helper.make_node("Reshape", ["r", "shape"], ["y"], name="bad_reshape")], "g", [x], [y],
        [helper.make_tensor("shape", TensorProto.INT64, [2], [5, 5])]), opset_imports=[helper.make_opsetid("", 17)])
    sess = onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    errors = []
    for _ in range(2):  # the first run's loop, then the generated function
        with pytest.raises(OrtError, match="running Reshape node 'bad_reshape' on CPUExecutionProvider") as e:
            sess.run(None, {"x": np.ones((2, 3), np.float32)})
        errors.append((type(e.value), str(e.value)))
    assert sess.plan._generated is not None and errors[0] == errors[1]


def test_explain_names_every_node_once():
    path = CORPUS / "bert_ts.onnx"
    sess = onnxhal.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    text = sess.plan.explain()
    compile(text, "<explain>", "exec")  # the annotated source is still Python
    for step in sess.plan.generated_steps:  # shape-only nodes are folded into memoised "shape values" steps
        assert (f"{step.node.op_type} {step.node.name!r}" if step.node is not None else step.label) in text


def test_partition_plan_prints_the_generated_function():
    out = subprocess.run([sys.executable, "-m", "onnxhal", "partition", str(CORPUS / "sk_linreg.onnx"), "--plan"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "def _run(slots, fns, ro):" in out.stdout and "LinearRegressor" in out.stdout
