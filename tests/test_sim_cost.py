"""The cost model: per-kernel max(work/peak, bytes/bandwidth) + launch, host-link transfers, energy;
in the meters, the profiling trace and the explain rows."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxhal
from onnxhal.simulators.cost import attach_to_session, explain_rows, transfer_seconds
from tests.conftest import simulated_or_skip

pytest.importorskip("pyopencl")

M, K, N = 64, 256, 128


def model_bytes() -> bytes:
    w = np.random.default_rng(0).standard_normal((K, N)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [M, K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [M, N])], [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.fixture(scope="module")
def sims():
    with simulated_or_skip("generic-npu,discrete-gpu", by="profile") as devices:
        yield devices


def session(device, profiling=False, tmp_path=None):
    so = onnxhal.SessionOptions()
    so.add_provider_for_devices([device])
    if profiling:
        so.enable_profiling = True
        so.profile_file_prefix = str(tmp_path / "trace")
    return onnxhal.InferenceSession(model_bytes(), so)


@pytest.mark.parametrize("name, itemsize", [("generic-npu", 2), ("discrete-gpu", 4)])
def test_a_matmul_costs_what_the_formula_says(sims, name, itemsize):
    sess = session(sims[name])
    sess.run(None, {"x": np.ones((M, K), np.float32)})
    ep = next(iter(sess.eps.values()))
    p = ep.profile
    dtype = "float16" if itemsize == 2 else "float32"
    work = 2.0 * M * N * K
    nbytes = (M * K + K * N + M * N) * itemsize  # fp16 storage moves half the bytes
    expect = max(work / (p.peak_tops[dtype] * 1e12), nbytes / (p.memory_bandwidth_gbps * 1e9)) + p.kernel_launch_us * 1e-6
    (cost,) = ep.partition_costs.values()
    assert cost.dtype == dtype and cost.seconds == pytest.approx(expect)
    run = ep.meter.last_run
    assert run.kernel_seconds == pytest.approx(expect)
    link = transfer_seconds(p, M * K * 4) + transfer_seconds(p, M * N * 4)
    assert run.transfer_seconds == pytest.approx(link) and run.transfers == 2
    assert run.energy_joules == pytest.approx((expect + link) * p.active_w)
    sess.run(None, {"x": np.ones((M, K), np.float32)})
    assert ep.meter.total.runs == 2 and ep.meter.total.kernel_seconds == pytest.approx(2 * expect)


def test_the_discrete_gpu_pays_for_its_pcie_link_and_the_npu_for_little(sims):
    npu, gpu = session(sims["generic-npu"]), session(sims["discrete-gpu"])
    for s in (npu, gpu):
        s.run(None, {"x": np.ones((M, K), np.float32)})
    (n_row,), (g_row,) = explain_rows(npu), explain_rows(gpu)
    assert g_row["transfer_ms"] > n_row["transfer_ms"]  # 15.75 GB/s PCIe vs 50 GB/s shared memory
    assert g_row["energy_mj"] > 10 * n_row["energy_mj"]  # 115 W vs 2 W
    assert n_row["device"] == "generic-npu" and n_row["nodes_on_device"] == 1 and n_row["runs"] == 1


def test_the_profiling_trace_carries_simulated_time_and_energy(sims, tmp_path):
    sess = session(sims["discrete-gpu"], profiling=True, tmp_path=tmp_path)
    assert attach_to_session(sess)
    sess.run(None, {"x": np.ones((M, K), np.float32)})
    events = json.load(open(sess.end_profiling()))
    ep = next(iter(sess.eps.values()))
    (cost,) = ep.partition_costs.values()
    nodes = [e for e in events if e["cat"] == "Node" and e["args"].get("provider") == "VirtualGpuExecutionProvider"]
    assert nodes and nodes[0]["args"]["sim_device"] == "discrete-gpu"
    assert nodes[0]["args"]["sim_device_us"] == pytest.approx(cost.seconds * 1e6, rel=1e-3)
    assert nodes[0]["args"]["sim_energy_uj"] == pytest.approx(cost.seconds * 115 * 1e6, rel=1e-3)
    assert not attach_to_session(session(sims["discrete-gpu"]))  # no profiler: nothing to attach to


def test_an_nhwc_device_pays_the_layout_transposes_the_runtime_inserts(sims):
    """Conv -> Relu on an NHWC NPU becomes Transpose -> NHWC Conv -> Transpose (the runtime's
    layout transformer); the two Transposes are costed like any data movement. An NCHW GPU runs
    the Conv as it is."""
    w = onnx.numpy_helper.from_array(np.ones((8, 8, 3, 3), np.float32) * 0.01, "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["y"], name="relu")], "nchw",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 4, 4])], [w])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    costs = {}
    for name in ("generic-npu", "discrete-gpu"):
        so = onnxhal.SessionOptions()
        so.add_provider_for_devices([sims[name]])
        ep = next(iter(onnxhal.InferenceSession(data, so).eps.values()))
        (costs[name],) = ep.partition_costs.values()
    npu_ops = [k.op_type for k in costs["generic-npu"].kernels]
    assert npu_ops.count("Transpose") == 2 and "FusedConv" in npu_ops
    assert [k for k in costs["generic-npu"].kernels if k.op_type == "Transpose"][0].nbytes == 2 * 128 * 2  # fp16
    assert "Transpose" not in [k.op_type for k in costs["discrete-gpu"].kernels]  # NCHW: nothing to convert


def test_a_sessions_copies_charge_its_ep_whatever_the_factory_was_asked_in_between(sims):
    """The session's data transfer is its EP's (Ep.create_data_transfer), not whatever the factory's
    create_data_transfer hands out next on the thread: asking the factory first changes nothing."""
    device = sims["generic-npu"]
    device.factory.create_data_transfer()  # a factory-wide transfer, as copy_tensors uses
    sess = session(device)
    ep = next(iter(sess.eps.values()))
    device.factory.create_data_transfer()
    sess.run(None, {"x": np.ones((M, K), np.float32)})
    assert ep.create_data_transfer().own_meter is ep.meter
    assert ep.meter.last_run.transfers >= 2  # the input's upload and the output's download
