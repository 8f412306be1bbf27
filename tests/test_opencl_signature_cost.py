"""The cost rule at run time (runtime/providers/opencl/dynamic_partition.py, cost_rule.signature_reason):
a partition with symbolic dims, claimed at cost_rule_dim, weighs each concrete signature's plan when
it specialises it; a tiny signature runs on the host (counted apart from build failures), a large
one on the device, both equal to the CPU EP; cost_rule=off and the simulated devices run every
signature on the device."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("pyopencl")

import onnxhal  # noqa: E402
from onnxhal.runtime.providers.opencl.cost_rule import signature_reason  # noqa: E402
from tests.conftest import simulated_or_skip  # noqa: E402
from tests.opencl_support import require_opencl  # noqa: E402

OPENCL_INDEX = require_opencl(module_level=True)
RNG = np.random.default_rng(47)
K = 64
DEPTH = 16  # one launch per MatMul: a tiny signature's host run is a few us a node, a launch about 10


@functools.lru_cache(maxsize=1)
def _model() -> onnx.ModelProto:
    """(one model, the same weights for every session) x [n, 64] -> DEPTH x (MatMul by a constant [64, 64]) -> y: one partition with symbolic n."""
    inits, nodes, prev = [], [], "x"
    for i in range(DEPTH):
        w = (RNG.standard_normal((K, K)) / np.sqrt(K)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        out = "y" if i == DEPTH - 1 else f"h{i}"
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [out], name=f"mm{i}"))
        prev = out
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", K])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


@pytest.fixture
def opencl(register):
    register("onnxhal.runtime.providers.opencl", "opencl")


def _session(rule: str) -> onnxhal.InferenceSession:
    # weighed at 4096 rows at claim (537 MFLOP), the partition is claimed whatever the load
    options = {"cost_rule": rule, "cost_rule_dim": "4096"}
    return onnxhal.InferenceSession(_model().SerializeToString(),
                                    providers=[("OpenCLExecutionProvider", options), "CPUExecutionProvider"])


def _partition(sess: onnxhal.InferenceSession):
    (info,) = sess.eps["OpenCLExecutionProvider"].dynamic_partitions.values()
    return info


def _run(sess: onnxhal.InferenceSession, cpu: onnxhal.InferenceSession, rows: int) -> None:
    x = RNG.standard_normal((rows, K)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], cpu.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_a_tiny_signature_runs_on_the_host_and_a_large_one_on_the_device(opencl):
    sess, cpu = _session("on"), onnxhal.InferenceSession(_model().SerializeToString(), providers=["CPUExecutionProvider"])
    assert sess.partition_summary == {"OpenCLExecutionProvider": DEPTH}
    info = _partition(sess)
    _run(sess, cpu, 1)  # 1 x 64: 131 kFLOP, a few us a node on the host against 16 launches
    assert info.stats.cost_host_runs == 1 and info.stats.host_runs == 0 and info.cached_plans == []
    (reason,) = info.stats.host_reasons.values()
    assert "run on the host by the cost rule" in reason and f"{DEPTH} launch(es)" in reason and "cost_rule=off" in reason
    _run(sess, cpu, 2048)  # 268 MFLOP: milliseconds on the host against 16 launches
    assert len(info.cached_plans) == 1 and info.cached_plans[0].launches_per_run >= DEPTH
    _run(sess, cpu, 1)  # decided once per signature: a cache hit, on the host again
    assert info.stats.cost_host_runs == 2 and info.stats.misses == 2 and info.stats.hits == 1
    args = sess.eps["OpenCLExecutionProvider"].backend.profiling_step_args(
        next(n for n in sess.graph.nodes if n.ep_name == "OpenCLExecutionProvider"))
    assert args["shape_cost_host_runs"] == 2 and args["shape_host_runs"] == 0


def test_the_rule_off_runs_every_signature_on_the_device(opencl):
    sess, cpu = _session("off"), onnxhal.InferenceSession(_model().SerializeToString(), providers=["CPUExecutionProvider"])
    info = _partition(sess)
    assert not info.cost_rule
    _run(sess, cpu, 1)
    _run(sess, cpu, 2048)
    assert info.stats.cost_host_runs == 0 and info.stats.host_runs == 0 and len(info.cached_plans) == 2


def test_a_simulated_device_runs_a_tiny_signature_on_its_device():
    # a simulated device's claims and costs follow its profile: the OpenCL EP's cost rule is not its
    with simulated_or_skip("generic-gpu", by="profile") as devices:
        so = onnxhal.SessionOptions()
        so.add_provider_for_devices([devices["generic-gpu"]])
        sess = onnxhal.InferenceSession(_model().SerializeToString(), so)
        infos = [i for ep in sess.eps.values() for i in getattr(ep, "dynamic_partitions", {}).values()]
        assert infos, sess.partition_summary  # (this module runs only where OpenCL does: the simulator's backend)
        x = RNG.standard_normal((1, K)).astype(np.float32)
        cpu = onnxhal.InferenceSession(_model().SerializeToString(), providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], cpu.run(None, {"x": x})[0], rtol=1e-2, atol=1e-2)
        assert all(not i.cost_rule and i.stats.cost_host_runs == 0 for i in infos)
        assert sum(len(i.cached_plans) for i in infos) == len(infos)


def test_equal_costs_keep_the_device_and_the_reason_gives_the_figures():
    assert signature_reason(100e-6, 10, 10e-6, 0, 5e-6, 0.0) is None  # 100 us against 10 x 10 us
    assert signature_reason(90e-6, 10, 10e-6, 2, 5e-6, 10e-6) is None  # 90 + 2 x 5 + 10 = 110: the device
    reason = signature_reason(30e-6, 10, 10e-6, 2, 5e-6, 10e-6)
    assert reason is not None and "took 30 us" in reason and "2 copy(ies) of device values 20 us" in reason
    assert "10 launch(es)" in reason
