"""A session with OpenCL partitions is freed as soon as the application drops it (reference counting,
no garbage collection): its partition states give their kernel objects back then, so the next
session's first run takes them instead of making new ones, and its results are the same."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("pyopencl")

import onnxhal  # noqa: E402
from tests.opencl_support import require_opencl  # noqa: E402

OPENCL_INDEX = require_opencl(module_level=True)
RNG = np.random.default_rng(4747)
EP = "OpenCLExecutionProvider"


def _model_bytes() -> bytes:
    """x [n, 8, 6, 6] -> Conv 3x3 (padded) -> Relu -> y: one partition with a symbolic dim."""
    w = numpy_helper.from_array((RNG.standard_normal((8, 8, 3, 3)) / 8).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["h"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
             helper.make_node("Relu", ["h"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8, 6, 6])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model.SerializeToString()


@pytest.mark.parametrize("cost_rule", ["on", "off"])
def test_a_dropped_session_is_freed_without_the_collector_and_gives_its_kernels_back(register, cost_rule):
    register("onnxhal.runtime.providers.opencl", "opencl")
    data = _model_bytes()
    x = RNG.standard_normal((2, 8, 6, 6)).astype(np.float32)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    # weighed with each dim at 4096, the partition is claimed whatever the load
    providers = [(EP, {"cost_rule": cost_rule, "cost_rule_dim": "4096"}), "CPUExecutionProvider"]
    enabled = gc.isenabled()
    gc.disable()
    try:
        first = onnxhal.InferenceSession(data, providers=providers)
        assert set(first.partition_summary) == {EP}  # every node on the device
        np.testing.assert_allclose(first.run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-6)
        device = first.eps[EP].device
        gone = weakref.ref(first)
        del first
        assert gone() is None, "the session is part of a reference cycle: only the garbage collector frees it"
        created = device.stats.kernels_created
        second = onnxhal.InferenceSession(data, providers=providers)
        np.testing.assert_allclose(second.run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-6)
        assert device.stats.kernels_created == created  # the first session's kernel objects, taken again
    finally:
        if enabled:
            gc.enable()


def test_a_session_whose_feeds_settled_on_the_host_is_freed_without_the_collector(register, monkeypatch):
    from onnxhal.runtime.providers.opencl import cost_rule

    register("onnxhal.runtime.providers.opencl", "opencl")
    monkeypatch.setattr(cost_rule, "HOST_MARGIN", 1e9)  # every tried signature settles on the host
    monkeypatch.setattr(cost_rule, "HOST_TIMING_FACTOR", 1e9)  # and every signature is tried
    data = _model_bytes()
    x = RNG.standard_normal((2, 8, 6, 6)).astype(np.float32)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    providers = [(EP, {"cost_rule": "on", "cost_rule_dim": "4096"}), "CPUExecutionProvider"]
    enabled = gc.isenabled()
    gc.disable()
    try:
        sess = onnxhal.InferenceSession(data, providers=providers)
        for _ in range(2 * cost_rule.TRIAL_RUNS + 2):  # the trial's runs, settled, then on the CPU-only plan
            np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-6)
        assert sess.settled_feeds.settled_keys == 1 and sess.settled_feeds.cpu_core is not None
        gone = weakref.ref(sess)
        del sess
        assert gone() is None, "the settled feeds' CPU-only runner makes the session a reference cycle"
    finally:
        if enabled:
            gc.enable()
