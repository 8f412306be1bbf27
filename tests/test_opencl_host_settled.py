"""Feeds whose every OpenCL partition settled on the host run on a CPU-only plan of the session
(runtime/session/host_settled.py, hal/settled_host.py): equal to the CPU EP's results, the
partition not called again, the plain path kept with session config host_settled_plan=0, for a
signature run on the device, for IOBinding (device-bound outputs), across threads and after a
failed run. The trial's outcome is fixed by a host margin no device run can meet."""

from __future__ import annotations

import functools
import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("pyopencl")

import onnxhal  # noqa: E402
from onnxhal.hal.errors import InvalidArgument  # noqa: E402
from onnxhal.runtime.providers.opencl import cost_rule  # noqa: E402
from onnxhal.runtime.session.host_settled import HOST_SETTLED_PLAN, feed_key  # noqa: E402
from tests.opencl_support import require_opencl  # noqa: E402

OPENCL_INDEX = require_opencl(module_level=True)
RNG = np.random.default_rng(4747)
C = 8
SETTLING_RUNS = 2 * cost_rule.TRIAL_RUNS + 1  # the trial's runs, then one on the host settled


@functools.lru_cache(maxsize=1)
def _model() -> onnx.ModelProto:
    """x [n, 8, h, w] -> Conv 3x3 (padded) -> Relu -> Conv 1x1 -> y: one partition with symbolic dims."""
    w1 = numpy_helper.from_array((RNG.standard_normal((C, C, 3, 3)) / 8).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((RNG.standard_normal((C, C, 1, 1)) / 3).astype(np.float32), "w2")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["h"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"], kernel_shape=[1, 1])]
    graph = helper.make_graph(nodes, "settle", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", C, "h", "w"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", C, "h", "w"])], [w1, w2])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


@pytest.fixture
def opencl(register, monkeypatch):
    register("onnxhal.runtime.providers.opencl", "opencl")
    monkeypatch.setattr(cost_rule, "HOST_MARGIN", 1e9)  # every tried signature settles on the host
    monkeypatch.setattr(cost_rule, "HOST_TIMING_FACTOR", 1e9)  # and every signature is tried


def _session(plan: str = "1") -> onnxhal.InferenceSession:
    so = onnxhal.SessionOptions()
    so.add_session_config_entry(HOST_SETTLED_PLAN, plan)
    # weighed with each dim at 4096, the partition is claimed whatever the load
    return onnxhal.InferenceSession(_model().SerializeToString(), so, providers=[
        ("OpenCLExecutionProvider", {"cost_rule": "on", "cost_rule_dim": "4096"}), "CPUExecutionProvider"])


def _cpu() -> onnxhal.InferenceSession:
    return onnxhal.InferenceSession(_model().SerializeToString(), providers=["CPUExecutionProvider"])


def _partition(sess: onnxhal.InferenceSession):
    (info,) = sess.eps["OpenCLExecutionProvider"].dynamic_partitions.values()
    return info


def _x(n: int = 1, side: int = 6) -> np.ndarray:
    return RNG.standard_normal((n, C, side, side)).astype(np.float32)


def _check(sess, cpu, x) -> None:
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], cpu.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_settled_feeds_run_on_a_cpu_only_plan(opencl):
    sess, cpu = _session(), _cpu()
    info = _partition(sess)
    for _ in range(SETTLING_RUNS):
        _check(sess, cpu, _x())
    settled = sess.settled_feeds
    assert info.stats.host_reasons and settled.settled_keys == 1 and settled.cpu_core is None
    calls = info.stats.hits + info.stats.misses
    for _ in range(3):
        _check(sess, cpu, _x())  # new values, the same key: the CPU-only plan, the partition not called
    assert info.stats.hits + info.stats.misses == calls
    core = settled.cpu_core
    assert core is not None and set(core.eps) == {"CPUExecutionProvider"} and not core.fused_infos
    # fetching one output by name, and RunOptions that change nothing, take it too
    x = _x()
    np.testing.assert_allclose(sess.run(["y"], {"x": x}, onnxhal.RunOptions())[0], cpu.run(None, {"x": x})[0],
                               rtol=1e-4, atol=1e-5)
    assert info.stats.hits + info.stats.misses == calls


def test_the_switch_off_keeps_the_partition_on_every_run(opencl):
    sess, cpu = _session("0"), _cpu()
    info = _partition(sess)
    assert sess.settled_feeds is None
    for _ in range(SETTLING_RUNS + 2):
        _check(sess, cpu, _x())
    assert info.stats.cost_host_runs == cost_rule.TRIAL_RUNS + 3


def test_a_signature_the_device_runs_is_not_settled(opencl):
    sess, cpu = _session(), _cpu()
    info = _partition(sess)
    for _ in range(SETTLING_RUNS):
        _check(sess, cpu, _x())
    info.cost_rule = False  # the next signature runs on the device untried, as one the host cannot win
    for _ in range(2):
        _check(sess, cpu, _x(2, 6))
    assert sess.settled_feeds.settled_keys == 1 and len(info.cached_plans) == 1


def test_iobinding_keeps_the_device_core_with_outputs_on_the_device(opencl):
    sess, cpu = _session(), _cpu()
    info = _partition(sess)
    for _ in range(SETTLING_RUNS):
        _check(sess, cpu, _x())
    before = info.stats.cost_host_runs
    x = _x()
    binding = sess.io_binding()
    binding.bind_cpu_input("x", x)
    binding.bind_output("y", "opencl", 0)
    sess.run_with_iobinding(binding)
    (out,) = binding.get_outputs()
    assert out.device_name() != "cpu"
    np.testing.assert_allclose(out.numpy(), cpu.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
    assert info.stats.cost_host_runs == before + 1


def test_threads_sharing_a_settled_session_build_one_cpu_plan(opencl):
    sess, cpu = _session(), _cpu()
    for _ in range(SETTLING_RUNS):
        _check(sess, cpu, _x())
    xs = [_x() for _ in range(4)]
    wants = [cpu.run(None, {"x": x})[0] for x in xs]
    cores, errors = [], []

    def work(k: int) -> None:
        try:
            for i in range(8):
                got = sess.run(None, {"x": xs[(i + k) % 4]})[0]
                np.testing.assert_allclose(got, wants[(i + k) % 4], rtol=1e-4, atol=1e-5)
            cores.append(sess.settled_feeds.cpu_core)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len({id(c) for c in cores}) == 1


def test_a_failed_run_leaves_the_session_usable(opencl):
    sess, cpu = _session(), _cpu()
    for _ in range(SETTLING_RUNS):
        _check(sess, cpu, _x())
    with pytest.raises(InvalidArgument, match="x"):
        sess.run(None, {"x": _x().astype(np.float64)})  # another key: the device core's checks
    with pytest.raises(InvalidArgument):
        sess.run(None, {"x": _x(), "z": _x()})  # an unknown input
    _check(sess, cpu, _x())
    assert sess.settled_feeds.settled_keys == 1


def test_the_switch_takes_0_or_1():
    so = onnxhal.SessionOptions()
    so.add_session_config_entry(HOST_SETTLED_PLAN, "yes")
    with pytest.raises(InvalidArgument, match=HOST_SETTLED_PLAN):
        onnxhal.InferenceSession(_model().SerializeToString(), so, providers=["CPUExecutionProvider"])


def test_feeds_other_than_arrays_have_no_key():
    x = np.zeros((1, 2), np.float32)
    assert feed_key({"x": x}) == (("x", (1, 2), np.dtype(np.float32)),)
    assert feed_key({"x": [[0.0, 0.0]]}) is None


def test_a_cpu_plan_that_cannot_be_built_leaves_the_device_core(opencl, monkeypatch):
    def fail(self):
        raise MemoryError("no room for a second copy of the weights")

    monkeypatch.setattr(onnxhal.InferenceSession, "_cpu_runner", fail)
    sess, cpu = _session(), _cpu()
    info = _partition(sess)
    for _ in range(SETTLING_RUNS + 2):
        _check(sess, cpu, _x())  # the first settled run tries the build, logs it and runs on the device core
    assert sess.settled_feeds.settled_keys == 0 and sess.settled_feeds.cpu_core is None
    assert info.stats.cost_host_runs == cost_rule.TRIAL_RUNS + 3
    sess.close()  # pytest keeps the logged error's traceback, and through it the session, past the test: closed here


def test_a_run_tells_its_partitions_whether_the_whole_session_settles():
    # hal/settled_host.py: a counted run of a core with one partition tells it that, settled on the
    # host, its feeds would run on the CPU-only plan (what its trial's host side then times)
    from onnxhal.hal.settled_host import SETTLE_TALLY, SettleTally, whole_session_settles

    assert not whole_session_settles()  # no session counts
    for partitions, whole in ((1, True), (2, False), (0, False)):
        token = SETTLE_TALLY.set(SettleTally(partitions))
        try:
            assert whole_session_settles() is whole
        finally:
            SETTLE_TALLY.reset(token)


@functools.lru_cache(maxsize=1)
def _two_partitions() -> onnx.ModelProto:
    """x -> Conv 3x3 -> Round (the host's) -> Conv 1x1 -> y: two partitions with symbolic dims."""
    w1 = numpy_helper.from_array((RNG.standard_normal((C, C, 3, 3)) / 8).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((RNG.standard_normal((C, C, 1, 1)) / 3).astype(np.float32), "w2")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["h"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
             helper.make_node("Round", ["h"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"], kernel_shape=[1, 1])]
    graph = helper.make_graph(nodes, "two", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", C, "h", "w"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", C, "h", "w"])], [w1, w2])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("partitions, cpu_wins", [(2, True), (2, False), (1, True)])
def test_a_session_of_partitions_settled_on_the_device_is_tried_whole(register, monkeypatch, partitions, cpu_wins):
    # each partition's trial settles on the device (no host margin), then the feed key alternates
    # between the device core and the CPU-only core for SESSION_TRIAL_RUNS each; it settles on the
    # CPU-only core where that won the session trial (its margin forced), else stays on the device
    from onnxhal.runtime.session import host_settled

    register("onnxhal.runtime.providers.opencl", "opencl")
    monkeypatch.setattr(cost_rule, "HOST_MARGIN", 0.0)
    monkeypatch.setattr(cost_rule, "HOST_TIMING_FACTOR", 1e9)
    monkeypatch.setattr(host_settled, "SESSION_MARGIN", 1e9 if cpu_wins else 0.0)
    data = (_two_partitions() if partitions == 2 else _model()).SerializeToString()
    so = onnxhal.SessionOptions()
    sess = onnxhal.InferenceSession(data, so, providers=[
        ("OpenCLExecutionProvider", {"cost_rule": "on", "cost_rule_dim": "4096"}), "CPUExecutionProvider"])
    cpu = onnxhal.InferenceSession(data, providers=["CPUExecutionProvider"])
    infos = list(sess.eps["OpenCLExecutionProvider"].dynamic_partitions.values())
    assert len(infos) == partitions
    for _ in range(SETTLING_RUNS):  # the partitions' trials: both settle on the device
        _check(sess, cpu, _x())
    assert all(len(i.cached_plans) == 1 and not i.stats.host_reasons for i in infos)
    settled = sess.settled_feeds
    assert settled.settled_keys == 0 and not settled.trials
    for _ in range(2 * host_settled.SESSION_TRIAL_RUNS):  # the session trial (its first run was the last one)
        _check(sess, cpu, _x())
    (figures,) = settled.trials.values()
    assert ("CPU-only plan by a session trial" in figures) is cpu_wins, figures
    assert settled.settled_keys == (1 if cpu_wins else 0)
    calls = sum(i.stats.hits for i in infos)
    for _ in range(2):
        _check(sess, cpu, _x())
    assert sum(i.stats.hits for i in infos) == calls + (0 if cpu_wins else 2 * partitions)
