"""The cost rule's claim-time trial of a static partition (rule claim_trial,
runtime/providers/opencl/claim_trial.py): where the formula claims a partition by less than
CLAIM_UNTRIED_FACTOR, the claim times it on the host and the device and keeps it where it ran
faster; its figures are in the decline reason or in ``cost_trials`` and the profile. The timings
themselves are never asserted: the tests force the band or the figures and check the wiring, and
that both ways compute what onnxruntime does."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("pyopencl")

import onnxhal  # noqa: E402
from onnxhal.runtime.providers.opencl import backend as backend_module  # noqa: E402
from onnxhal.runtime.providers.opencl import cost_rule  # noqa: E402
from onnxhal.runtime.providers.opencl.claim_trial import ClaimTrial  # noqa: E402
from onnxhal.runtime.providers.opencl.cost_rule import (  # noqa: E402
    TRIAL_RUNS,
    claim_trial_reason,
    worth_a_trial,
)
from tests.opencl_support import require_opencl  # noqa: E402

OPENCL_INDEX = require_opencl(module_level=True)
RNG = np.random.default_rng(48)
EP = "OpenCLExecutionProvider"


def _model(n: int, k: int) -> onnx.ModelProto:
    """x [n, k] -> MatMul by a constant [k, k] -> Relu -> y: one static partition."""
    w = (RNG.standard_normal((k, k)) / np.sqrt(k)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Relu", ["h"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, k])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


@pytest.fixture
def near_the_line(monkeypatch):
    """Every static partition the formula claims is tried (the band made unbounded)."""
    monkeypatch.setattr(cost_rule, "CLAIM_UNTRIED_FACTOR", 1e9)


def _forced(monkeypatch, side: str) -> None:
    """The trial runs both sides for real, then ``side`` is made the fastest by far."""

    class Forced(ClaimTrial):
        def run(self):
            trial = super().run()
            setattr(trial, side, [1e-9] * len(getattr(trial, side)))
            return trial

    monkeypatch.setattr(backend_module, "ClaimTrial", Forced)


def _session(model: onnx.ModelProto, **options: str) -> onnxhal.InferenceSession:
    return onnxhal.InferenceSession(model.SerializeToString(),
                                    providers=[(EP, {"cost_rule": "on", **options}), "CPUExecutionProvider"])


def _check(sess: onnxhal.InferenceSession, model: onnx.ModelProto) -> None:
    x = RNG.standard_normal(tuple(d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim))
    x = x.astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-5)


def test_a_partition_the_host_wins_at_claim_runs_as_a_cpu_only_session(opencl, near_the_line, monkeypatch):
    model = _model(256, 256)
    _forced(monkeypatch, "host")
    sess = _session(model)
    cpu = onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    # the whole share declined: the session is the CPU EP's, its passes included (no copies, no launches)
    assert set(sess.partition_summary) == {"CPUExecutionProvider"}, sess.partition_summary
    assert [n.op_type for n in sess.graph.nodes] == [n.op_type for n in cpu.graph.nodes]
    declined = sess.eps[EP].declined
    assert declined and all("rule claim_trial" in v and "kept on the host by the cost rule" in v
                            and "cost_rule=off" in v and f"fastest of {TRIAL_RUNS}" in v for v in declined.values())
    assert sess.eps[EP].backend.compiled_plans == []
    _check(sess, model)


def test_a_partition_the_device_wins_at_claim_is_kept_with_its_figures(opencl, near_the_line, monkeypatch):
    model = _model(256, 256)
    _forced(monkeypatch, "device")
    sess = _session(model)
    assert sess.partition_summary == {EP: 2}, sess.partition_summary
    backend = sess.eps[EP].backend
    (name, text), = backend.cost_trials.items()
    assert "timed at claim by the cost rule (rule claim_trial)" in text and "1 launch(es)" in text
    node = next(n for n in sess.graph.nodes if n.name == name)
    assert backend.profiling_step_args(node) == {"cost_trial": text}
    assert len(backend.compiled_plans) == 1
    _check(sess, model)


def test_an_unforced_trial_decides_one_way_and_both_compute_the_same(opencl, near_the_line):
    model = _model(256, 256)
    sess = _session(model)
    backend = sess.eps[EP].backend
    on_host = [v for v in backend.declined.values() if "rule claim_trial" in v]
    # either the host won (both nodes declined with the figures) or the device (kept with them)
    assert (len(on_host) == 2 and not backend.cost_trials) or (not on_host and len(backend.cost_trials) == 1)
    _check(sess, model)
    plain = _session(model, disable_fusions="claim_trial")  # the formula alone: claimed, untimed
    assert plain.partition_summary == {EP: 2} and plain.eps[EP].backend.cost_trials == {}
    _check(plain, model)


def test_a_clearly_device_bound_partition_is_claimed_untried(opencl, monkeypatch):
    calls = []
    monkeypatch.setattr(ClaimTrial, "run", lambda self: calls.append(self))
    # 2 x 512 x 1024 x 1024: a GFLOP, milliseconds at the host's best rate, against one launch and
    # two copies (tens of us, plus 4 MB of copies at the host's memory rate)
    sess = _session(_model(512, 1024))
    assert sess.partition_summary == {EP: 2} and calls == [] and sess.eps[EP].backend.cost_trials == {}


def test_a_trial_that_fails_leaves_the_formulas_claim_and_says_so(opencl, near_the_line, monkeypatch):
    def fail(self):
        raise ValueError("no memory for the trial's inputs")

    monkeypatch.setattr(ClaimTrial, "run", fail)
    model = _model(256, 256)
    sess = _session(model)
    assert sess.partition_summary == {EP: 2}
    (text,) = sess.eps[EP].backend.cost_trials.values()
    assert "claimed untimed: its trial failed" in text and "no memory for the trial's inputs" in text
    _check(sess, model)
    sess.close()  # pytest keeps the logged error's traceback, and through it the session, past the test: closed here


def test_the_band_and_the_margin():
    # work 5 us against a price of 1 launch of 10 us: near the line; 200 us: ten times it, untried
    assert worth_a_trial(5e-6, 1, 0, 10e-6, 10e-6)
    assert worth_a_trial(99e-6, 1, 0, 10e-6, 0.0)
    assert not worth_a_trial(100e-6, 1, 0, 10e-6, 0.0)
    assert not worth_a_trial(200e-6, 1, 0, 10e-6, 0.0, 0.0)
    assert worth_a_trial(200e-6, 1, 2, 10e-6, 5e-6, 5e-6)  # the copies count in the price
    assert claim_trial_reason(81e-6, 100e-6, 3, 2) is None  # the host must win by 20%
    reason = claim_trial_reason(79e-6, 100e-6, 3, 2)
    assert "host runs took 79 us" in reason and "3 launch(es) and 2 copy(ies) 100 us" in reason
