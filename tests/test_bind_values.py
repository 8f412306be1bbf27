"""``ExecutionPlan.bind_values``: a Loop or Scan body's runs with the outer-scope values placed once
give what ``run_values`` gives with every value placed per run."""

from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

import onnxhal
from tests.models import make, vi


def _plan():
    """y = a * b + c, with c an overridable initializer (a graph input with a default)."""
    nodes = [helper.make_node("Mul", ["a", "b"], ["ab"]), helper.make_node("Add", ["ab", "c"], ["y"])]
    model = make(nodes, [vi("a", [3]), vi("b", [3]), vi("c", [3])], [vi("y", [3])],
                 [numpy_helper.from_array(np.full(3, 10, np.float32), "c")], opset=9)
    model.ir_version = 3
    sess = onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.plan


def test_bound_runs_match_run_values():
    plan = _plan()
    assert plan.feed_names[:3] == ["a", "b", "c"]
    rng = np.random.default_rng(0)
    a = rng.standard_normal(3).astype(np.float32)
    run = plan.bind_values([a, None, None], [(1, 0), (2, 1)])
    for _ in range(3):
        b, c = rng.standard_normal(3).astype(np.float32), rng.standard_normal(3).astype(np.float32)
        np.testing.assert_array_equal(run([b, c])[0], plan.run_values([a, b, c])[0])
        # c not given (None, or past the end of the arguments): its default, as run_values keeps it
        np.testing.assert_array_equal(run([b, None])[0], plan.run_values([a, b, None])[0])
        np.testing.assert_array_equal(run([b])[0], a * b + 10)
