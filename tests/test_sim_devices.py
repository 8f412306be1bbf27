"""Simulated NPUs and GPUs: virtual devices from profiles, selection policies, profile-driven partial
partitions of the benchmark models, fp16 storage, memory capacity, transfers, concurrent sessions."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxhal
from onnxhal.hal import OrtDeviceMemoryType, OrtHardwareDeviceType
from onnxhal.hal.errors import OutOfMemory
from onnxhal.simulators.testing import simulated_devices
from tests.conftest import simulated_or_skip

pytest.importorskip("pyopencl")

_spec = importlib.util.spec_from_file_location("onnxhal_bench_models_sim",
                                               Path(__file__).resolve().parents[1] / "benchmarks" / "models.py")
bench_models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_models)

P = onnxhal.OrtExecutionProviderDevicePolicy
NPU, GPU = "VirtualNpuExecutionProvider", "VirtualGpuExecutionProvider"


@pytest.fixture(scope="module")
def sims():
    """generic-npu, generic-gpu, mobile-npu and integrated-gpu for the whole module."""
    with simulated_or_skip("generic-npu,generic-gpu,mobile-npu,integrated-gpu", by="profile") as devices:
        yield devices


def session_on(model, ep_device, options=None, **config) -> onnxhal.InferenceSession:
    so = onnxhal.SessionOptions()
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    for k, v in config.items():
        so.add_session_config_entry(k, v)
    so.add_provider_for_devices([ep_device], options or {})
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    return onnxhal.InferenceSession(data, so)


def cpu_run(model, feeds):
    return onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def small_cnn():
    return bench_models.cnn(image=32, classes=10)


def small_encoder():
    return bench_models.encoder(seq=16, hidden=64, heads=4, ffn=128)


def matmul_model(m=8, k=32, n=16, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((k, n)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"), helper.make_node("Relu", ["h"], ["y"], name="relu")],
        "mm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])], [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), w


# -- devices ------------------------------------------------------------------------------------
def test_each_profile_is_a_virtual_device_with_its_own_memory(sims):
    hw = onnxhal.get_hardware_devices()
    for name, d in sims.items():
        assert d.device.is_virtual and d.device.metadata["simulator_profile"] == name
        assert d in onnxhal.get_ep_devices() and d.device in hw
        assert d.ep_name == (NPU if d.device.type == OrtHardwareDeviceType.NPU else GPU)
        info = d.memory_info(OrtDeviceMemoryType.DEFAULT)
        # The memory's device id is an ordinal (onnxruntime's is 16 bits), the hardware's the PCI id.
        assert not info.is_host and info.device_vendor_id == d.device.vendor_id and 0 <= info.device_id < 32768
    assert len({d.memory_info(OrtDeviceMemoryType.DEFAULT).memory_device for d in sims.values()}) == 4
    assert sims["generic-gpu"].device.metadata["Discrete"] == "1"
    assert sims["integrated-gpu"].device.metadata["Discrete"] == "0"
    assert sims["mobile-npu"].device.metadata["peak_tops_int8"] == "45"


def test_policies_pick_the_simulated_devices(sims):
    model, _ = matmul_model()
    picked = {}
    for policy in (P.PREFER_NPU, P.PREFER_GPU, P.MAX_PERFORMANCE, P.MAX_EFFICIENCY, P.PREFER_CPU):
        so = onnxhal.SessionOptions()
        so.set_provider_selection_policy(policy)
        sess = onnxhal.InferenceSession(model.SerializeToString(), so)
        picked[policy] = (sess.get_providers(), [ep.profile.name for ep in sess.eps.values()
                                                 if hasattr(ep, "profile")])
    # ORT's order: NPU first; among GPUs the discrete one (generic-gpu, not integrated-gpu).
    assert picked[P.PREFER_NPU] == ([NPU, "CPUExecutionProvider"], ["generic-npu"])
    assert picked[P.PREFER_GPU] == ([GPU, "CPUExecutionProvider"], ["generic-gpu"])
    assert picked[P.MAX_PERFORMANCE] == picked[P.PREFER_GPU]
    assert picked[P.MAX_EFFICIENCY] == picked[P.PREFER_NPU]
    assert picked[P.PREFER_CPU] == (["CPUExecutionProvider"], [])


def test_onnxhal_simulate_needs_no_code_change(tmp_path):
    script = (
        "import json, onnxhal\n"
        "hw = [d.metadata.get('simulator_profile') for d in onnxhal.get_hardware_devices() if d.is_virtual]\n"
        "eps = [(d.ep_name, d.device.type.name) for d in onnxhal.get_ep_devices()]\n"
        "print(json.dumps({'hw': hw, 'eps': eps, 'available': onnxhal.get_available_providers()}))\n")
    env = dict(os.environ, ONNXHAL_SIMULATE="generic-npu,generic-gpu")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["hw"] == ["generic-npu", "generic-gpu"]
    assert got["eps"] == [["CPUExecutionProvider", "CPU"], [NPU, "NPU"], [GPU, "GPU"]]
    assert got["available"] == [NPU, GPU, "CPUExecutionProvider"]
    env["ONNXHAL_SIMULATE"] = "no-such-profile"
    bad = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert bad.returncode != 0 and "no-such-profile" in bad.stderr


# -- partitions the profiles produce -------------------------------------------------------------
@pytest.mark.parametrize("builder", [small_cnn, small_encoder], ids=["cnn", "encoder"])
def test_benchmark_models_run_mostly_on_the_generic_devices(sims, builder):
    model = builder()
    feeds = bench_models.feeds(model)
    ref = cpu_run(model, feeds)[0]
    for name in ("generic-npu", "generic-gpu"):
        sess = session_on(model, sims[name])
        ep_name = sims[name].ep_name
        counts = sess.partition_summary
        assert counts.get(ep_name, 0) / sum(counts.values()) >= 0.6, (name, counts)
        out = sess.run(None, feeds)[0]
        prof = sess.eps[ep_name].profile
        np.testing.assert_allclose(out, ref, rtol=prof.rtol, atol=prof.atol * max(1.0, float(np.abs(ref).max())))


def test_profile_op_limits_give_partial_partitions_with_cpu_fallback(sims):
    model = small_encoder()
    feeds = bench_models.feeds(model)
    ref = cpu_run(model, feeds)[0]
    on_cpu = {}
    for name in ("generic-npu", "mobile-npu", "generic-gpu"):
        sess = session_on(model, sims[name])
        on_cpu[name] = sorted(n.op_type for n in sess.assigned_nodes() if n.ep_name == "CPUExecutionProvider")
        np.testing.assert_allclose(sess.run(None, feeds)[0], ref, rtol=2e-2, atol=2e-2 * float(np.abs(ref).max()))
        ep = sess.eps[sims[name].ep_name]
        for n in sess.assigned_nodes():
            if n.ep_name == "CPUExecutionProvider":
                assert name in ep.declined[n.name]  # declined by the profile, which says why
    assert on_cpu["generic-gpu"] == []
    assert on_cpu["generic-npu"] == ["FusedMatMul"]  # the FFN's MatMul+Gelu: generic-npu has no Gelu/Erf
    assert on_cpu["mobile-npu"] == ["FusedMatMul", "LayerNormalization", "LayerNormalization"]


def test_static_shapes_rank_and_dtype_limits(sims):
    dyn = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")], "dyn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])]), opset_imports=[helper.make_opsetid("", 17)])
    sess = session_on(dyn, sims["generic-npu"])
    assert sess.partition_summary == {"CPUExecutionProvider": 1}
    assert "static shapes only" in sess.eps[NPU].declined["relu"]
    rank5 = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")], "r5",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 2, 2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 2, 2, 2])]), opset_imports=[helper.make_opsetid("", 17)])
    npu = session_on(rank5, sims["generic-npu"])
    assert npu.partition_summary == {"CPUExecutionProvider": 1}
    assert "rank <= 4" in npu.eps[NPU].declined["relu"]
    assert session_on(rank5, sims["generic-gpu"]).partition_summary == {GPU: 1}


def test_fp16_device_rounds_like_fp16_storage(sims):
    model, w = matmul_model()
    x = np.random.default_rng(3).standard_normal((8, 32)).astype(np.float32) * 3
    exact = np.maximum(x @ w, 0)
    npu = session_on(model, sims["generic-npu"]).run(None, {"x": x})[0]
    gpu = session_on(model, sims["generic-gpu"]).run(None, {"x": x})[0]
    h = np.float16
    fp16_ref = np.maximum(x.astype(h).astype(np.float32) @ w.astype(h).astype(np.float32), 0).astype(h).astype(np.float32)
    np.testing.assert_allclose(npu, fp16_ref, rtol=1e-3, atol=1e-3)  # fp16 storage of inputs, weights, outputs
    assert np.abs(npu - exact).max() > 1e-3  # ... which really loses precision
    np.testing.assert_allclose(npu, exact, rtol=2e-2, atol=2e-2 * np.abs(exact).max())  # within the profile's
    np.testing.assert_allclose(gpu, exact, rtol=1e-5, atol=1e-4)  # an fp32 device does not round


# -- memory --------------------------------------------------------------------------------------
def test_transfers_are_real_copies_to_device_memory(sims):
    model, _ = matmul_model()
    sess = session_on(model, sims["generic-gpu"])
    x = np.ones((8, 32), np.float32)
    sess.run(None, {"x": x})
    ep = sess.eps[GPU]
    alloc = sess.memory.allocator(ep.memory_info.memory_device)
    stats = alloc.stats()
    assert stats["NumAllocs"] >= 2 and stats["Limit"] == ep.profile.capacity_bytes
    run = ep.meter.last_run
    assert run.transfers == 2 and run.transfer_bytes == x.nbytes + 8 * 16 * 4  # feed in, output out


def test_memory_capacity_is_enforced_and_the_device_recovers(tmp_path, sims):
    text = (Path(sims["generic-gpu"].device.metadata["simulator_profile_path"]).read_text()
            .replace('name = "generic-gpu"', 'name = "small-gpu"').replace("device_id = 0x4701", "device_id = 0x4799")
            .replace("capacity_mib = 4096", "capacity_mib = 0.0625"))  # 64 KiB
    path = tmp_path / "small-gpu.toml"
    path.write_text(text)
    with simulated_devices(str(path)) as (dev,):
        big = helper.make_model(helper.make_graph(
            [helper.make_node("Relu", ["x"], ["h"], name="r1"), helper.make_node("Sigmoid", ["h"], ["y"], name="s")],
            "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 160])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 160])]), opset_imports=[helper.make_opsetid("", 17)])
        sess = session_on(big, dev)
        x = np.ones((64, 160), np.float32)  # 40 KiB in + 40 KiB out > 64 KiB
        alloc = sess.memory.allocator(sess.eps[GPU].memory_info.memory_device)
        idle = alloc.stats()["InUse"]  # the partition's constants, held while the session lives
        with pytest.raises(OutOfMemory, match="65536-byte limit"):
            sess.run(None, {"x": x})
        assert alloc.stats()["InUse"] == idle  # nothing leaked by the failed run
        small = session_on(matmul_model()[0], dev)  # the device still works for what fits
        assert small.run(None, {"x": np.ones((8, 32), np.float32)})[0].shape == (8, 16)
        with pytest.raises(OutOfMemory):  # and the session fails the same clean way again
            sess.run(None, {"x": x})
        small.close()
        assert alloc.stats()["InUse"] == idle
        # Weights count too: a model whose weights do not fit runs on the CPU EP instead.
        heavy, w = matmul_model(m=4, k=256, n=128)  # 128 KiB of weights
        sess_heavy = session_on(heavy, dev)
        assert sess_heavy.partition_summary == {"CPUExecutionProvider": 2}
        xh = np.ones((4, 256), np.float32)
        np.testing.assert_allclose(sess_heavy.run(None, {"x": xh})[0], np.maximum(xh @ w, 0), rtol=1e-5, atol=1e-4)
        sess.close()
        assert alloc.stats()["InUse"] == 0  # closing the sessions gives their weights' memory back


# -- several sessions at once --------------------------------------------------------------------
def test_several_sessions_on_several_devices_at_once(sims):
    model, w = matmul_model(m=16, k=64, n=32, seed=5)
    sessions = {name: session_on(model, sims[name]) for name in ("generic-npu", "generic-gpu", "integrated-gpu")}
    rng = np.random.default_rng(11)
    xs = [rng.standard_normal((16, 64)).astype(np.float32) for _ in range(4)]
    errors: list[BaseException] = []
    results: dict = {}

    def work(name, sess, i):
        try:
            for _ in range(3):
                results[(name, i)] = sess.run(None, {"x": xs[i]})[0]
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(n, s, i)) for n, s in sessions.items() for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    for (name, i), y in results.items():
        tol = 2e-2 if name == "generic-npu" else 1e-4
        np.testing.assert_allclose(y, np.maximum(xs[i] @ w, 0), rtol=tol, atol=tol * 10)
    assert len(results) == 12


def test_power_aware_delegate_goes_beyond_orts_device_order(sims):
    from onnxhal.simulators.power_selection import power_aware_delegate

    model, _ = matmul_model()
    picked = {}
    for policy in (P.MIN_OVERALL_POWER, P.MAX_EFFICIENCY):
        so = onnxhal.SessionOptions()
        so.set_provider_selection_policy_delegate(power_aware_delegate(policy))
        sess = onnxhal.InferenceSession(model.SerializeToString(), so)
        picked[policy] = [ep.profile.name for ep in sess.eps.values() if hasattr(ep, "profile")]
        assert sess.get_providers()[-1] == "CPUExecutionProvider"
    assert picked[P.MIN_OVERALL_POWER] == ["generic-npu"]  # 2 W
    assert picked[P.MAX_EFFICIENCY] == ["mobile-npu"]  # 22.5 fp16 TOPS / 6 W beats 5 / 2 W
    with pytest.raises(onnxhal.errors.InvalidArgument):
        power_aware_delegate(P.PREFER_GPU)
