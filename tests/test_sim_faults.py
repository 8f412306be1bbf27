"""Injected faults of simulated devices: each surfaces as a typed error and the session stays usable;
a lost device fails over to the remaining EPs with ``session.ep_failover``."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxhal
from onnxhal.hal.errors import EPFail, InvalidArgument, OutOfMemory
from onnxhal.simulators.faults import DeviceLost, TransientDeviceError
from onnxhal.simulators.testing import simulated_devices
from tests.conftest import simulated_or_skip

pytest.importorskip("pyopencl")

NPU, GPU, CPU = "VirtualNpuExecutionProvider", "VirtualGpuExecutionProvider", "CPUExecutionProvider"
RNG = np.random.default_rng(21)
W = RNG.standard_normal((32, 16)).astype(np.float32)
X = RNG.standard_normal((8, 32)).astype(np.float32)
EXPECTED = np.tanh(np.maximum(X @ W, 0))


def model_bytes() -> bytes:
    """MatMul -> Relu -> Tanh: all of it runs on either simulated device."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"), helper.make_node("Relu", ["h"], ["r"], name="relu"),
         helper.make_node("Tanh", ["r"], ["y"], name="tanh")],
        "faulty", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 16])], [numpy_helper.from_array(W, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.fixture(scope="module")
def sims():
    with simulated_or_skip("generic-npu,generic-gpu") as devices:
        yield devices


def session(device, options=None, fallback=True, **config) -> onnxhal.InferenceSession:
    so = onnxhal.SessionOptions()
    for k, v in config.items():
        so.add_session_config_entry(k, v)
    so.add_provider_for_devices([device], options or {})
    sess = onnxhal.InferenceSession(model_bytes(), so)
    if not fallback:
        sess.disable_fallback()
    return sess


def run(sess) -> np.ndarray:
    return sess.run(None, {"x": X})[0]


def test_device_lost_after_n_runs_raises_ep_fail(sims):
    sess = session(sims[GPU], {"fault_device_lost_after_runs": "2"}, fallback=False)
    for _ in range(2):
        np.testing.assert_allclose(run(sess), EXPECTED, rtol=1e-4, atol=1e-4)
    with pytest.raises(EPFail, match="lost after 2 run"):
        run(sess)
    with pytest.raises(EPFail):  # it stays lost
        run(sess)
    assert sess.get_providers() == [GPU, CPU]


def test_lost_device_falls_back_to_cpu_as_onnxruntime(sims):
    sess = session(sims[NPU], {"fault_device_lost_after_runs": "0"})
    np.testing.assert_allclose(run(sess), EXPECTED, rtol=1e-5, atol=1e-5)  # retried on the CPU EP
    assert sess.get_providers() == [CPU]


def test_failover_repartitions_onto_the_remaining_eps(sims):
    so = onnxhal.SessionOptions()
    so.add_session_config_entry("session.ep_failover", "1")
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    so.add_provider_for_devices([sims[NPU]], {"fault_device_lost_after_runs": "1"})
    so.add_provider_for_devices([sims[GPU]], {})
    sess = onnxhal.InferenceSession(model_bytes(), so)
    sess.disable_fallback()  # failover, not the one-shot CPU fallback, must carry the run
    assert set(sess.partition_summary) == {NPU}
    first = run(sess)
    assert np.abs(first - EXPECTED).max() < 2e-2  # on the fp16 NPU
    cpu_only = onnxhal.InferenceSession(model_bytes(), providers=[CPU]).run(None, {"x": X})[0]
    second = run(sess)  # meets the lost NPU: re-partitioned onto the GPU, and completes
    np.testing.assert_allclose(second, cpu_only, rtol=1e-5, atol=1e-5)
    assert sess.get_providers() == [GPU, CPU] and set(sess.partition_summary) == {GPU}
    np.testing.assert_allclose(run(sess), cpu_only, rtol=1e-5, atol=1e-5)  # later runs stay there
    assert [f[0] for f in sess.failovers] == [NPU]


def test_alloc_failure_is_out_of_memory_and_the_session_recovers(sims):
    # One run allocates the feed (1 KiB), the output (512 B) and intermediates; allow a bit over one run.
    probe = session(sims[GPU])
    shared = probe.memory.allocator(probe.eps[GPU].memory_info.memory_device)  # the device's, shared
    before = shared.stats()["TotalAllocated"]
    run(probe)
    per_run = shared.stats()["TotalAllocated"] - before
    sess = session(sims[GPU], {"fault_alloc_fail_after_bytes": str(per_run + per_run // 2)}, fallback=False)
    run(sess)
    with pytest.raises(OutOfMemory, match="injected allocation failure"):
        run(sess)
    np.testing.assert_allclose(run(sess), EXPECTED, rtol=1e-4, atol=1e-4)  # the count restarted
    assert sess.get_providers() == [GPU, CPU]  # OutOfMemory is not an EP failure: no fallback
    assert sess.eps[GPU].allocator.injected == 1


def test_compile_failure_gives_the_nodes_to_the_cpu_or_fails_creation(sims):
    sess = session(sims[GPU], {"fault_compile_fail": "1"},
                   **{"session.record_ep_graph_assignment_info": "1"})
    assert sess.partition_summary == {CPU: 3}
    np.testing.assert_allclose(run(sess), EXPECTED, rtol=1e-5, atol=1e-5)
    with pytest.raises(EPFail, match="fault_compile_fail"):
        session(sims[GPU], {"fault_compile_fail": "true"}, **{"session.disable_cpu_ep_fallback": "1"})


def test_transient_errors_are_seeded_and_retryable(sims):
    def pattern(seed: str) -> list[str]:
        sess = session(sims[GPU], {"fault_transient_error_rate": "0.5", "fault_seed": seed}, fallback=False)
        out = []
        for _ in range(12):
            try:
                np.testing.assert_allclose(run(sess), EXPECTED, rtol=1e-4, atol=1e-4)
                out.append("ok")
            except TransientDeviceError:
                out.append("err")
        assert sess.get_providers() == [GPU, CPU]  # not an EP failure: the device stays in use
        return out

    a = pattern("7")
    assert "ok" in a and "err" in a
    assert pattern("7") == a
    assert pattern("8") != a


def test_slowdown_multiplies_device_time(sims):
    base = session(sims[GPU])
    slow = session(sims[GPU], {"fault_slowdown": "8"})
    run(base), run(slow)
    b, s = base.eps[GPU].meter, slow.eps[GPU].meter
    assert s.last_run.kernel_seconds == pytest.approx(8 * b.last_run.kernel_seconds)
    assert s.last_run.transfer_seconds == pytest.approx(8 * b.last_run.transfer_seconds)
    # ... and compute really takes 8x its wall-clock time (it waits for the device, then idles 7x that).
    assert s.wall_slept_seconds >= 7 * s.wall_busy_seconds > 0
    assert b.wall_slept_seconds == 0


def test_faults_from_a_profile_and_bad_fault_options(sims, tmp_path):
    text = open(sims[NPU].device.metadata["simulator_profile_path"]).read()
    text = text.replace('name = "generic-npu"', 'name = "doomed-npu"').replace("0x4E01", "0x4E77")
    path = tmp_path / "doomed.toml"
    path.write_text(text + "\n[faults]\ndevice_lost_after_runs = 0\n")
    with simulated_devices(str(path)) as (dev,):
        sess = session(dev, fallback=False)
        with pytest.raises(DeviceLost):
            run(sess)
        ok = session(dev, {"fault_device_lost_after_runs": "-1"})  # a provider option overrides the profile
        assert np.abs(run(ok) - EXPECTED).max() < 2e-2
        assert ok.get_providers() == [NPU, CPU]
    with pytest.raises(InvalidArgument, match="fault_slowdown"):
        session(sims[GPU], {"fault_slowdown": "0.5"})
    with pytest.raises(InvalidArgument, match="unknown provider option 'fault_explode'"):
        session(sims[GPU], {"fault_explode": "1"})


@pytest.mark.parametrize("option, value, allowed", [
    ("fault_seed", "-1", "an integer in [0, 9223372036854775807]"),
    ("fault_seed", "2.5", "an integer in [0, "),
    ("fault_seed", str(2**64), "an integer in [0, "),
    ("fault_slowdown", "nan", "a finite number in [1, 1e+06]"),
    ("fault_slowdown", "inf", "a finite number in [1, 1e+06]"),
    ("fault_slowdown", "-3", "a finite number in [1, 1e+06]"),
    ("fault_slowdown", "0.5", "a finite number in [1, 1e+06]"),
    ("fault_slowdown", "1e7", "a finite number in [1, 1e+06]"),
    ("fault_slowdown", "fast", "a finite number in [1, 1e+06]"),
    ("fault_device_lost_after_runs", "-2", "an integer in [-1, 2147483647] (-1: never)"),
    ("fault_device_lost_after_runs", str(2**70), "an integer in [-1, 2147483647] (-1: never)"),
    ("fault_device_lost_after_runs", "1_000", "an integer in [-1, "),
    ("fault_device_lost_after_runs", "True", "an integer in [-1, "),
    ("fault_alloc_fail_after_bytes", "-5", "an integer in [-1, 9223372036854775807] (-1: never)"),
    ("fault_transient_error_rate", "1.5", "a finite number in [0, 1]"),
    ("fault_transient_error_rate", "nan", "a finite number in [0, 1]"),
    ("fault_compile_fail", "maybe", "1/0 or true/false"),
    # Values that are not strings are converted with str(), as onnxruntime's provider options;
    # none of these reads as a number.
    ("fault_seed", None, "an integer in [0, "),
    ("fault_slowdown", [2.0], "a finite number in [1, "),
    ("fault_device_lost_after_runs", {"runs": 3}, "an integer in [-1, "),
])
def test_bad_fault_options_are_refused_at_session_creation_naming_option_value_and_range(sims, option, value, allowed):
    with pytest.raises(InvalidArgument) as info:
        session(sims[GPU], {option: value})
    msg = str(info.value)
    assert f"provider option {option}={str(value)!r}: expected {allowed}" in msg, msg


def test_unknown_fault_option_is_refused_naming_the_known_ones(sims):
    with pytest.raises(InvalidArgument, match=r"unknown provider option 'fault_slowness'; fault options are .*"
                                              r"fault_slowdown"):
        session(sims[GPU], {"fault_slowness": "2"})


def test_fault_options_at_their_bounds_are_accepted(sims):
    sess = session(sims[GPU], {"fault_seed": str(2**63 - 1), "fault_slowdown": "1.0", "fault_transient_error_rate": "0",
                               "fault_device_lost_after_runs": "-1", "fault_alloc_fail_after_bytes": str(2**63 - 1)})
    np.testing.assert_allclose(run(sess), EXPECTED, rtol=1e-4, atol=1e-4)
    numeric = session(sims[GPU], {"fault_slowdown": 1, "fault_device_lost_after_runs": 5})  # str() as onnxruntime
    np.testing.assert_allclose(run(numeric), EXPECTED, rtol=1e-4, atol=1e-4)


def test_a_direct_caller_passing_a_non_string_value_is_refused():
    from onnxhal.simulators.faults import faults_with_options
    from onnxhal.simulators.profiles import Faults

    with pytest.raises(InvalidArgument, match=r"fault_seed=3: a int; provider option values are strings"):
        faults_with_options(Faults(), {"fault_seed": 3})
