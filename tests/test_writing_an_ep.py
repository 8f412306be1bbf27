"""docs/writing-an-ep.md's one-file EP, extracted from the doc and run against the CPU EP."""

from __future__ import annotations

import os
import re

import numpy as np
import onnx
from onnx import helper

import onnxhal
from tests.models import make, vi

DOC = os.path.join(os.path.dirname(__file__), "..", "docs", "writing-an-ep.md")


def _ep_source() -> str:
    blocks = re.findall(r"```python\n(.*?)```", open(DOC).read(), re.S)
    return next(b for b in blocks if "def create_ep_factories" in b)


def test_the_documented_ep_runs_and_matches_the_cpu_ep(register, plugin_file):
    register(plugin_file(_ep_source(), "chain_ep"), "chain")
    rng = np.random.default_rng(0)
    b = onnx.numpy_helper.from_array(rng.standard_normal((4, 8)).astype(np.float32), "b")
    nodes = [helper.make_node("Add", ["x", "b"], ["a"], name="add"),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Mul", ["r", "x"], ["m"], name="mul"),
             helper.make_node("Softmax", ["m"], ["s"], name="softmax"),  # not claimed: CPU fallback
             helper.make_node("Sigmoid", ["s"], ["y"], name="sigmoid")]  # a chain of one: not claimed
    model = make(nodes, [vi("x", [4, 8])], [vi("y", [4, 8])], [b])
    devices = [d for d in onnxhal.get_ep_devices() if d.ep_name == "ChainExecutionProvider"]
    assert devices[0].ep_options == {}  # defaults live in create_ep (min_chain 2)
    so = onnxhal.SessionOptions()
    so.add_provider_for_devices(devices, {})
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    so.graph_optimization_level = onnxhal.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = onnxhal.InferenceSession(model, so)
    assignment = [(s.ep_name, sorted(n.op_type for n in s.get_nodes())) for s in sess.get_provider_graph_assignment_info()]
    assert sorted(assignment) == [("CPUExecutionProvider", ["Sigmoid"]), ("CPUExecutionProvider", ["Softmax"]),
                                  ("ChainExecutionProvider", ["Add", "Mul", "Relu"])]
    assert assignment[0] == ("ChainExecutionProvider", ["Add", "Mul", "Relu"])
    x = rng.standard_normal((4, 8)).astype(np.float32)
    ref = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref, rtol=1e-6)
