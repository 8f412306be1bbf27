"""``onnxhal.backend``: ONNX's backend API, and onnx's own backend test runner over it."""

from __future__ import annotations

import unittest
import warnings

import numpy as np
import onnx
import onnx.backend.test
import pytest
from onnx import TensorProto, helper

import onnxhal.backend as backend
from onnxhal.errors import InvalidArgument
from tests.conftest import simulated_or_skip
from tests.test_node_conformance import EXPECTED_FAILURES, NONDETERMINISTIC

# The runner's cases that fail, with why: the node cases the CPU EP's own conformance test lists
# (tests/test_node_conformance.py), then the runner's own. Any other failure fails the test, and so
# does one of these passing (except the random ones, which can match by chance): the list stays true.
_RANDOM = NONDETERMINISTIC
RUNNER_FAILURES: dict[str, str] = {
    **{f"{name}_cpu": why for name, why in EXPECTED_FAILURES.items()},
    # The runner recurses into a sequence's 0-d tensor and calls len() on it; onnxruntime.backend
    # fails it the same way with the same outputs (onnx 1.23's runner/__init__.py, assert_similar_outputs).
    "test_loop16_seq_none_cpu": "onnx's runner cannot compare a sequence holding a 0-d tensor",
    # ai.onnx.preview.training: inference runtimes (onnxruntime's CPU build too) have no Gradient kernel.
    "test_gradient_of_add_cpu": "Gradient is a training operator",
    "test_gradient_of_add_and_mul_cpu": "Gradient is a training operator",
}


def _add_model() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Relu", ["s"], ["y"])], "add_relu",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_onnx_backend_runner_over_every_node_and_model_folder():
    """onnx's BackendTest over onnxhal.backend: the node cases and the simple / pytorch folders (the
    "real" models download weights, which CI cannot)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runner = onnx.backend.test.BackendTest(backend, __name__)
        suite = unittest.TestSuite()
        for name, case in runner.test_cases.items():
            if "RealModel" not in name:
                suite.addTests(unittest.defaultTestLoader.loadTestsFromTestCase(case))
        result = unittest.TestResult()
        suite.run(result)
    failed = {test.id().rsplit(".", 1)[-1]: text.strip().splitlines()[-1] for test, text in result.failures + result.errors}
    ran = result.testsRun - len(result.skipped)
    assert ran > 1500, f"the runner ran only {ran} cases"
    unexpected = {k: v for k, v in failed.items() if k not in RUNNER_FAILURES}
    assert not unexpected, f"{len(unexpected)} runner case(s) failed: {unexpected}"
    now_passing = {k for k in RUNNER_FAILURES if k not in failed and not RUNNER_FAILURES[k] == _RANDOM}
    assert not now_passing, f"listed as failing but passed: {sorted(now_passing)}; drop them from RUNNER_FAILURES"


def test_prepare_runs_lists_dicts_and_single_arrays():
    a = np.arange(6, dtype=np.float32).reshape(2, 3) - 3
    b = np.ones((2, 3), np.float32)
    rep = backend.prepare(_add_model())
    want = np.maximum(a + b, 0)
    np.testing.assert_array_equal(rep.run([a, b])[0], want)
    np.testing.assert_array_equal(rep.run({"a": a, "b": b})["y"], want)
    np.testing.assert_array_equal(backend.run_model(_add_model().SerializeToString(), [a, b])[0], want)
    assert backend.prepare(rep) is rep


def test_run_node_builds_its_model_from_the_inputs():
    node = helper.make_node("Add", ["x", "y"], ["z"])
    x, y = np.float32([1, 2]), np.float32([10, 20])
    (z,) = backend.run_node(node, [x, y])
    np.testing.assert_array_equal(z, x + y)
    (z,) = backend.run_node(node, [x, y], outputs_info=[(np.float32, (2,))], opset_version=13)
    np.testing.assert_array_equal(z, x + y)


def test_bad_devices_and_options_are_named():
    assert backend.supports_device("CPU")
    assert not backend.supports_device("TPU")
    with pytest.raises(InvalidArgument, match="'TPU'.*'CPU', 'GPU' or 'NPU'"):
        backend.prepare(_add_model(), "TPU")
    with pytest.raises(InvalidArgument, match="'graph_optimisation_level'.*SessionOptions"):
        backend.prepare(_add_model(), graph_optimisation_level=0)
    with pytest.raises(InvalidArgument, match="3 inputs given, the model takes 2"):
        backend.prepare(_add_model()).run([np.zeros((2, 3), np.float32)] * 3)


def test_npu_device_runs_on_the_simulated_npu():
    a = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    b = np.ones((2, 3), np.float32)
    with simulated_or_skip("generic-npu"):
        assert backend.supports_device("NPU")
        assert not backend.supports_device("NPU:5")
        rep = backend.prepare(_add_model(), "NPU")
        assert rep.session.get_providers()[0] == "VirtualNpuExecutionProvider"
        out = rep.run([a, b])[0]
    np.testing.assert_allclose(out, np.maximum(a + b, 0), rtol=1e-3, atol=1e-3)
