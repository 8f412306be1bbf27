"""The cost rule at run time (runtime/providers/opencl/dynamic_partition.py, cost_rule.SignatureTrial):
a partition with symbolic dims, claimed at cost_rule_dim, tries each small concrete signature on
both sides for its first runs; a tiny signature then runs on the host (counted apart from build
failures), a large one on the device untried, both equal to the CPU EP; cost_rule=off and the
simulated devices run every signature on the device."""

from __future__ import annotations

import functools
import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("pyopencl")

import onnxhal  # noqa: E402
from onnxhal.runtime.providers.opencl.cost_rule import TRIAL_RUNS, SignatureTrial, signature_reason  # noqa: E402
from tests.conftest import simulated_or_skip  # noqa: E402
from tests.opencl_support import require_opencl  # noqa: E402

OPENCL_INDEX = require_opencl(module_level=True)
RNG = np.random.default_rng(47)
C, DEPTH = 32, 8  # one launch per depthwise Conv: PoCL's depthwise kernel is slow at small sizes


@functools.lru_cache(maxsize=1)
def _model() -> onnx.ModelProto:
    """(one model, the same weights for every session) x [n, 32, h, w] -> DEPTH x (depthwise 3 x 3
    Conv, padded) -> y: one partition with symbolic dims."""
    inits, nodes, prev = [], [], "x"
    for i in range(DEPTH):
        w = (RNG.standard_normal((C, 1, 3, 3)) / 3).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        out = "y" if i == DEPTH - 1 else f"h{i}"
        nodes.append(helper.make_node("Conv", [prev, f"w{i}"], [out], name=f"dw{i}", group=C, pads=[1, 1, 1, 1],
                                      kernel_shape=[3, 3]))
        prev = out
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", C, "h", "w"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", C, "h", "w"])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def _session(rule: str, settled_plan: str = "1") -> onnxhal.InferenceSession:
    # weighed with each dim at 4096, the partition is claimed whatever the load; settled_plan "0":
    # a signature settled on the host still runs in the partition (runtime/session/host_settled.py)
    options = {"cost_rule": rule, "cost_rule_dim": "4096"}
    so = onnxhal.SessionOptions()
    so.add_session_config_entry("session.onnxhal.host_settled_plan", settled_plan)
    return onnxhal.InferenceSession(_model().SerializeToString(), so,
                                    providers=[("OpenCLExecutionProvider", options), "CPUExecutionProvider"])


def _partition(sess: onnxhal.InferenceSession):
    (info,) = sess.eps["OpenCLExecutionProvider"].dynamic_partitions.values()
    return info


def _run(sess: onnxhal.InferenceSession, cpu: onnxhal.InferenceSession, n: int, side: int) -> None:
    x = RNG.standard_normal((n, C, side, side)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], cpu.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_a_tiny_signature_runs_on_the_host_and_a_large_one_on_the_device(opencl):
    sess, cpu = _session("on"), onnxhal.InferenceSession(_model().SerializeToString(), providers=["CPUExecutionProvider"])
    assert sess.partition_summary == {"OpenCLExecutionProvider": DEPTH}
    info = _partition(sess)
    for _ in range(2 * TRIAL_RUNS):  # 1 x 32 x 8 x 8: its trial, alternating, host first
        _run(sess, cpu, 1, 8)
    assert info.stats.cost_host_runs == TRIAL_RUNS and info.stats.host_runs == 0
    (reason,) = info.stats.host_reasons.values()  # settled: 99 against 560 us on a loaded PoCL
    assert "run on the host by the cost rule" in reason and f"{DEPTH} launch(es)" in reason and "cost_rule=off" in reason
    assert info.cached_plans == []
    _run(sess, cpu, 1, 8)  # settled once per signature: a cache hit, on the host again
    assert info.stats.cost_host_runs == TRIAL_RUNS + 1
    _run(sess, cpu, 32, 32)  # 151 MFLOP: 5-40 ms on the host against 8 launches (0.3-1.3 ms at 10x): untried
    assert len(info.cached_plans) == 1 and info.cached_plans[0].launches_per_run >= DEPTH
    _run(sess, cpu, 32, 32)
    assert info.stats.cost_host_runs == TRIAL_RUNS + 1 and info.stats.misses == 2
    figures = list(info.stats.trials.values())  # each signature's decision, with its figures
    assert len(figures) == 2 and figures[0].startswith("settled on the host") and figures[1].startswith("untried")
    args = sess.eps["OpenCLExecutionProvider"].backend.profiling_step_args(
        next(n for n in sess.graph.nodes if n.ep_name == "OpenCLExecutionProvider"))
    assert args["shape_cost_host_runs"] == TRIAL_RUNS + 1 and args["shape_host_runs"] == 0


def test_the_rule_off_runs_every_signature_on_the_device(opencl):
    sess, cpu = _session("off"), onnxhal.InferenceSession(_model().SerializeToString(), providers=["CPUExecutionProvider"])
    info = _partition(sess)
    assert not info.cost_rule
    for _ in range(2 * TRIAL_RUNS):
        _run(sess, cpu, 1, 8)
    _run(sess, cpu, 32, 32)
    assert info.stats.cost_host_runs == 0 and info.stats.host_runs == 0 and len(info.cached_plans) == 2


def test_a_simulated_device_runs_a_tiny_signature_on_its_device():
    # a simulated device's claims and costs follow its profile: the OpenCL EP's cost rule is not its
    with simulated_or_skip("generic-gpu", by="profile") as devices:
        so = onnxhal.SessionOptions()
        so.add_provider_for_devices([devices["generic-gpu"]])
        sess = onnxhal.InferenceSession(_model().SerializeToString(), so)
        infos = [i for ep in sess.eps.values() for i in getattr(ep, "dynamic_partitions", {}).values()]
        assert infos, sess.partition_summary  # (this module runs only where OpenCL does: the simulator's backend)
        x = RNG.standard_normal((1, C, 8, 8)).astype(np.float32)
        cpu = onnxhal.InferenceSession(_model().SerializeToString(), providers=["CPUExecutionProvider"])
        for _ in range(2 * TRIAL_RUNS):
            np.testing.assert_allclose(sess.run(None, {"x": x})[0], cpu.run(None, {"x": x})[0], rtol=1e-2, atol=1e-2)
        assert all(not i.cost_rule and i.stats.cost_host_runs == 0 for i in infos)
        assert sum(len(i.cached_plans) for i in infos) == len(infos)


def test_a_trial_alternates_and_the_host_must_win_by_the_margin():
    trial = SignatureTrial()
    sides = []
    for k in range(2 * TRIAL_RUNS):
        sides.append(trial.next_side())
        assert not trial.settled
        trial.record(sides[-1], 1e-3 if k < 2 else 100e-6)  # the first runs pay a ramp; the fastest counts
    assert sides == ["host", "device"] * TRIAL_RUNS and trial.settled
    assert trial.reason(10) is None  # 100 us against 100 us: the device
    assert signature_reason(79e-6, 100e-6, 10) is not None  # inside the margin: the host
    assert signature_reason(81e-6, 100e-6, 10) is None
    reason = signature_reason(30e-6, 100e-6, 10)
    assert "took 30 us" in reason and "10 launch(es) 100 us" in reason and f"fastest of {TRIAL_RUNS}" in reason


def test_threads_sharing_a_session_during_a_trial_get_the_cpu_eps_results(opencl):
    # the trial's side is picked and recorded under the partition's lock; a run that started on the
    # device while another settled the signature on the host finishes on the plan's retired state
    sess, cpu = _session("on", "0"), onnxhal.InferenceSession(_model().SerializeToString(), providers=["CPUExecutionProvider"])
    info = _partition(sess)
    xs = [RNG.standard_normal((1, C, 8, 8)).astype(np.float32) for _ in range(4)]
    wants = [cpu.run(None, {"x": x})[0] for x in xs]
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for i in range(2 * TRIAL_RUNS):
                x, want = xs[(i + k) % len(xs)], wants[(i + k) % len(xs)]
                np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-5)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    # threads that missed together specialised it each; the first entry stays, with the one trial
    assert 1 <= info.stats.misses <= len(threads) and info.cached_signatures == 1 and info.stats.host_runs == 0
    # 36 runs settled it one way: on the host with the reason and no plan, or on the device with its
    # plan; a further run goes that way (a run of a trial would alternate)
    on_host = bool(info.stats.host_reasons)
    assert len(info.cached_plans) == (0 if on_host else 1)
    before = info.stats.cost_host_runs
    for _ in range(2):
        np.testing.assert_allclose(sess.run(None, {"x": xs[0]})[0], wants[0], rtol=1e-4, atol=1e-5)
    assert info.stats.cost_host_runs == before + (2 if on_host else 0)


def test_a_sole_partitions_trial_is_timed_as_the_session_would_run_it(opencl):
    # the session's only partition: settled on the host its feeds run on the CPU-only plan, so the
    # host side is timed without copies and the device side with the session's; with that plan off
    # (settled_plan "0") the host side keeps its copies, the device side none. Results equal either way.
    cpu = onnxhal.InferenceSession(_model().SerializeToString(), providers=["CPUExecutionProvider"])
    for settled_plan, words in (("1", "the session's CPU-only plan would run them, with no copy"),
                                ("0", "their copies of device values included")):
        sess = _session("on", settled_plan)
        info = _partition(sess)
        for _ in range(2 * TRIAL_RUNS):
            _run(sess, cpu, 1, 8)
        (figures,) = info.stats.trials.values()
        assert figures.startswith("settled on the ") and words in figures, figures
        assert (figures.startswith("settled on the host")) == bool(info.stats.host_reasons)
        for reason in info.stats.host_reasons.values():
            assert words in reason
        _run(sess, cpu, 1, 8)


def test_a_trial_records_how_its_runs_were_timed():
    trial = SignatureTrial()
    for k in range(2 * TRIAL_RUNS):
        trial.record(trial.next_side(), 50e-6 if k % 2 == 0 else 100e-6, alone=True)
    assert trial.alone and "CPU-only plan" in trial.reason(4) and trial.figures(4).startswith("settled on the host")
    trial.record("host", 50e-6, alone=False)  # one run timed among other partitions: the old words
    assert not trial.alone and "copies of device values included" in trial.figures(4)


def test_a_ramping_first_host_run_is_timed_again_warm(monkeypatch):
    # the first host runs of a new signature pay one-time costs for several runs: _trial times a warm
    # one after a first run within COLD_RUN_FACTOR of the line (6 launches x 10 us x 10 = 600 us), then
    # more while the last was within 10x, up to WARM_HOST_RUNS in all; untried, it says why
    from types import SimpleNamespace

    from onnxhal.runtime.providers.opencl import dynamic_partition as dp

    def info(runs_us: list[float]):
        clock = iter(t for us in runs_us for t in (0.0, us * 1e-6))
        monkeypatch.setattr(dp, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
        device = SimpleNamespace(launch_costs=lambda: SimpleNamespace(launch_s=10e-6))
        return SimpleNamespace(device=device, graph=SimpleNamespace(input_names=["x"]),
                               _host_plan=SimpleNamespace(run=lambda feeds, options: None))

    trial = dp.DynamicNodeComputeInfo._trial
    x = [np.zeros(1)]
    assert isinstance(trial(info([700, 150]), x, 1000e-6, 6), SignatureTrial)  # 1000, 700, then 150 us: tried
    assert isinstance(trial(info([150]), x, 30000e-6, 6), SignatureTrial)  # a cold first run 50x over the line
    untried, look = trial(info([]), x, 70000e-6, 6)  # over COLD_RUN_FACTOR times the line: no rerun
    assert "untried" in untried and "70000 us" in untried and "6 launch(es)" in untried
    assert not look  # and over SECOND_LOOK_FACTOR times it: no second look either
    assert trial(info([7000]), x, 7000e-6, 6)[1] is False  # the warm rerun over 10x: no further one
    untried, look = trial(info([900, 800, 700]), x, 1000e-6, 6)  # WARM_HOST_RUNS reruns at most
    assert look and "700 us" in untried  # within 10x of the line: its host side is looked at again later
    assert dp.WARM_HOST_RUNS == 3


def _untried_at_first(monkeypatch, host_s: float = 2000e-6) -> None:
    """Every new signature untried with second looks, as when its host runs at specialisation were all
    descheduled (resnet_ts at load 6: 1133 us against its 780 us line)."""
    from onnxhal.runtime.providers.opencl import dynamic_partition as dp

    monkeypatch.setattr(dp.DynamicNodeComputeInfo, "_trial", lambda self, host, first_s, launches: (
        dp._untried_text(host_s, launches, 1e-6, 0), True))


def test_an_untried_signature_gets_a_second_look_that_starts_its_trial(opencl, monkeypatch):
    # untried by its slow first host runs, the tiny signature runs on the device until its second look
    # (SECOND_LOOK_RUNS[0]-th run): one host run, timed, under the line, so its trial starts and settles it
    from onnxhal.runtime.providers.opencl.dynamic_partition import SECOND_LOOK_RUNS

    _untried_at_first(monkeypatch)
    sess, cpu = _session("on"), onnxhal.InferenceSession(_model().SerializeToString(), providers=["CPUExecutionProvider"])
    info = _partition(sess)
    for _ in range(SECOND_LOOK_RUNS[0] - 1):
        _run(sess, cpu, 1, 8)
    assert info.stats.cost_host_runs == 0 and list(info.stats.trials.values())[0].startswith("untried")
    _run(sess, cpu, 1, 8)  # the look
    assert info.stats.cost_host_runs == 1 and info.stats.trials == {}  # under trial now
    for _ in range(2 * TRIAL_RUNS):
        _run(sess, cpu, 1, 8)
    assert info.stats.cost_host_runs == 1 + TRIAL_RUNS
    (figures,) = info.stats.trials.values()
    assert figures.startswith("settled on the "), figures  # (the host on PoCL; the device where it won)
    on_host = bool(info.stats.host_reasons)
    for _ in range(SECOND_LOOK_RUNS[1] + 1):  # settled: no further look; on the host, the session's CPU-only plan
        _run(sess, cpu, 1, 8)  # takes its feeds after the next run (runtime/session/host_settled.py)
    assert info.stats.cost_host_runs == 1 + TRIAL_RUNS + (1 if on_host else 0)
    assert sess.settled_feeds.settled_keys == (1 if on_host else 0)


def test_a_second_look_over_the_line_keeps_the_device_until_the_next(opencl, monkeypatch):
    # the look's host run over the line: untried still, with the look's figure; the next look after
    # SECOND_LOOK_RUNS[1] more device runs, then none; every run equal to the CPU EP
    from onnxhal.runtime.providers.opencl import dynamic_partition as dp

    _untried_at_first(monkeypatch)
    monkeypatch.setattr(dp, "host_worth_trying", lambda host_s, launches, launch_s: False)
    monkeypatch.setattr(dp, "SECOND_LOOK_RUNS", (2, 3))
    sess, cpu = _session("on"), onnxhal.InferenceSession(_model().SerializeToString(), providers=["CPUExecutionProvider"])
    info = _partition(sess)
    looks = []
    for _ in range(12):
        _run(sess, cpu, 1, 8)
        looks.append(info.stats.cost_host_runs)
    assert looks == [0, 1, 1, 1, 2] + [2] * 7  # the 2nd run, then the 3rd after it; no third look
    (figures,) = info.stats.trials.values()
    assert figures.startswith("untried") and "at its second look 2" in figures
    assert info.stats.host_reasons == {} and len(info.cached_plans) == 1
