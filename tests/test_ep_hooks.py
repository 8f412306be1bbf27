"""The OrtEp members onnxruntime added since 1.24, each called by the session where onnxruntime
calls it: is_concurrent_run_supported, sync, on_session_initialization_end, create_profiler,
get_default_memory_device, graph capture (is_graph_capture_enabled, is_graph_captured,
replay_graph, release_captured_graph, the node assignment policy), set_dynamic_options and the
factory's get_hardware_device_incompatibility_details."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
from onnx import helper, numpy_helper

import onnxhal
from onnxhal import errors
from tests.conftest import library_module
from tests.models import make, vi

HOOK_EP = '''
import threading
import time

import numpy as np

from onnxhal import hal

LOG = []
ACTIVE = {"now": 0, "max": 0}
_lock = threading.Lock()


class _Kernel(hal.Kernel):
    def __init__(self, ep, op):
        self.ep, self.op = ep, op

    def compute(self, inputs):
        with _lock:
            ACTIVE["now"] += 1
            ACTIVE["max"] = max(ACTIVE["max"], ACTIVE["now"])
        time.sleep(float(self.ep.options.get("sleep", "0")))
        with _lock:
            ACTIVE["now"] -= 1
        LOG.append(("compute", self.op))
        x = inputs[0]
        return [np.maximum(x, 0) if self.op == "Relu" else x * 2]


class _Profiler(hal.EpProfiler):
    def start_profiling(self, start_time_ns):
        LOG.append(("start_profiling",))

    def end_profiling(self):
        return [{"name": "hook_kernel", "cat": "Kernel", "ts": 1.0, "dur": 2.0, "args": {"op": "Relu"}}]


class HookEp(hal.Ep):
    name = "HookExecutionProvider"

    def __init__(self, options):
        self.options = options
        self.runs_ended = 0
        self.captured = set()

    def get_capability(self, graph, support_info):
        for n in graph.nodes:
            if n.op_type in self.options.get("ops", "Relu").split(","):
                support_info.add_single_node(n)

    def create_kernel(self, node, context):
        return _Kernel(self, node.op_type)

    def is_concurrent_run_supported(self):
        return self.options.get("concurrent", "1") == "1"

    def sync(self):
        LOG.append(("sync",))

    def on_session_initialization_end(self):
        LOG.append(("init_end",))

    def create_profiler(self):
        return _Profiler() if self.options.get("profiler") == "1" else None

    def get_default_memory_device(self):
        if self.options.get("memory") == "bogus":
            return hal.OrtMemoryDevice(hal.OrtMemoryInfoDeviceType.NPU, hal.OrtDeviceMemoryType.DEFAULT, 0xBEEF, 7)
        return None

    def set_dynamic_options(self, options):
        LOG.append(("dynamic", dict(options)))

    def is_graph_capture_enabled(self):
        return self.options.get("capture") == "1"

    def get_graph_capture_node_assignment_policy(self):
        return hal.OrtGraphCaptureNodeAssignmentPolicy(int(self.options.get("policy", "0")))

    def on_run_end(self, run_options, sync_stream):
        # captures after `capture_after` runs of a graph, as CUDA's EP after its warm-up runs
        gid = int(run_options.get_run_config_entry("gpu_graph_id")) if run_options is not None and \\
            "gpu_graph_id" in run_options._config else 0
        self.runs_ended += 1
        if self.runs_ended >= int(self.options.get("capture_after", "2")):
            self.captured.add(gid)

    def is_graph_captured(self, graph_annotation_id):
        return graph_annotation_id in self.captured

    def replay_graph(self, graph_annotation_id):
        LOG.append(("replay", graph_annotation_id))

    def release_captured_graph(self, graph_annotation_id):
        LOG.append(("release", graph_annotation_id))
        self.captured.discard(graph_annotation_id)


class HookFactory(hal.EpFactory):
    name = "HookExecutionProvider"; vendor = "Hook"; version = "1.0.0"

    def __init__(self, api):
        self.api = api

    def get_supported_devices(self, hardware_devices):
        return [self.api.create_ep_device(self, d) for d in hardware_devices if d.type == hal.OrtHardwareDeviceType.CPU]

    def create_ep(self, devices, ep_metadata, session_options, logger):
        LOG.append(("create_ep",))
        return HookEp(session_options.provider_options_for(self.name))

    def get_hardware_device_incompatibility_details(self, device):
        return 2, "no such driver"


def create_ep_factories(registration_name, api, logger):
    return [HookFactory(api)]


def release_ep_factory(factory):
    pass
'''

X = np.array([[-1.0, 2.0, -3.0]], np.float32)


def relu_double() -> bytes:
    """y = Relu(x) * 2 (Mul by a constant): Relu on the hook EP, Mul on it or on the CPU EP."""
    two = helper.make_tensor("two", 1, [1], [2.0])
    return make([helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Mul", ["r", "two"], ["y"],
                                                                                      name="mul")],
                [vi("x", [1, 3])], [vi("y", [1, 3])], [two]).SerializeToString()


@pytest.fixture
def hook(register, plugin_file):
    mod = library_module(register(plugin_file(HOOK_EP, "hook_ep")))
    mod.LOG.clear()
    mod.ACTIVE.update(now=0, max=0)
    return mod


def session(options: dict, **config) -> onnxhal.InferenceSession:
    so = onnxhal.SessionOptions()
    so.graph_optimization_level = onnxhal.GraphOptimizationLevel.ORT_DISABLE_ALL
    for k, v in config.items():
        so.add_session_config_entry(k, v)
    return onnxhal.InferenceSession(relu_double(), so, providers=[("HookExecutionProvider", options)])


def events(hook, name):
    return [e for e in hook.LOG if e[0] == name]


def test_initialization_end_comes_once_after_the_session_is_built(hook):
    s = session({})
    assert events(hook, "init_end") == [("init_end",)] and hook.LOG.index(("create_ep",)) < hook.LOG.index(
        ("init_end",))
    assert not events(hook, "compute")  # before any run
    np.testing.assert_array_equal(s.run(None, {"x": X})[0], np.maximum(X, 0) * 2)


def test_sync_at_the_end_of_each_run_unless_disabled(hook):
    s = session({})
    s.run(None, {"x": X})
    s.run(None, {"x": X})
    assert len(events(hook, "sync")) == 2
    ro = onnxhal.RunOptions()
    ro.add_run_config_entry("disable_synchronize_execution_providers", "1")
    s.run(None, {"x": X}, ro)
    assert len(events(hook, "sync")) == 2
    binding = s.io_binding()
    binding.bind_cpu_input("x", X)
    binding.bind_output("y")
    s.run_with_iobinding(binding)
    binding.synchronize_outputs()
    binding.synchronize_inputs()
    assert len(events(hook, "sync")) == 5  # the run's, and one per synchronize


@pytest.mark.parametrize("concurrent, most", [("0", 1)])
def test_an_ep_that_cannot_run_concurrently_gets_one_run_at_a_time(hook, concurrent, most):
    s = session({"concurrent": concurrent, "sleep": "0.02"})
    threads = [threading.Thread(target=lambda: s.run(None, {"x": X})) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert hook.ACTIVE["max"] == most and len(events(hook, "compute")) == 4


def test_concurrent_runs_overlap_when_the_ep_allows_them(hook):
    s = session({"sleep": "0.05"})
    start = threading.Barrier(4)

    def run():
        start.wait()
        s.run(None, {"x": X})

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert hook.ACTIVE["max"] > 1  # two runs were inside the EP's kernel at once (each stays there 50 ms)


def test_the_eps_profiler_events_join_the_trace(hook, tmp_path):
    so = onnxhal.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "p")
    s = onnxhal.InferenceSession(relu_double(), so, providers=[("HookExecutionProvider", {"profiler": "1"})])
    assert events(hook, "start_profiling") == [("start_profiling",)]
    s.run(None, {"x": X})
    trace = json.load(open(s.end_profiling()))
    mine = [e for e in trace if e["name"] == "hook_kernel"]
    assert mine == [{"cat": "Kernel", "pid": mine[0]["pid"], "tid": 0, "ph": "X", "args": {"op": "Relu"},
                     "name": "hook_kernel", "ts": 1.0, "dur": 2.0}]
    assert any(e["name"] == "model_run" for e in trace)


def test_default_memory_device_must_be_declared(hook):
    with pytest.raises(errors.Fail, match="get_default_memory_device.*do not declare"):
        session({"memory": "bogus"})
    session({})  # None: the EP device's DEFAULT memory (host here)


def test_dynamic_options_reach_the_ep(hook):
    session({}).set_ep_dynamic_options({"ep.dynamic.workload_type": "Efficient"})
    assert events(hook, "dynamic") == [("dynamic", {"ep.dynamic.workload_type": "Efficient"})]


def test_incompatibility_details_come_from_the_factory(hook):
    details = onnxhal.get_hardware_device_ep_incompatibility_details("HookExecutionProvider",
                                                                     onnxhal.get_hardware_devices()[0])
    assert details == {"reasons_bitmask": 2, "notes": "no such driver", "error_code": 0}


# -- graph capture -----------------------------------------------------------------------------
def bound(s):
    binding = s.io_binding()
    x = onnxhal.OrtValue.ortvalue_from_numpy(X.copy())
    y = onnxhal.OrtValue.ortvalue_from_numpy(np.zeros_like(X))
    binding.bind_ortvalue_input("x", x)
    binding.bind_ortvalue_output("y", y)
    return binding, y


def test_the_first_run_repeats_until_captured_then_replays(hook):
    s = session({"capture": "1", "ops": "Relu,Mul", "capture_after": "3"})
    binding, y = bound(s)
    s.run_with_iobinding(binding)
    assert len(events(hook, "compute")) == 2 * 3  # two kernels, run three times until captured
    np.testing.assert_array_equal(y.numpy(), np.maximum(X, 0) * 2)
    s.run_with_iobinding(binding)
    assert events(hook, "replay") == [("replay", 0)] and len(events(hook, "compute")) == 6
    assert binding.get_outputs()[0] is y
    s.release_captured_graph(0)
    assert events(hook, "release") == [("release", 0)]
    s.run_with_iobinding(binding)  # not captured any more: runs (and captures) again
    assert len(events(hook, "compute")) == 8 and len(events(hook, "replay")) == 1


def test_graph_ids_are_captured_apart_and_minus_one_skips(hook):
    s = session({"capture": "1", "ops": "Relu,Mul", "capture_after": "1"})
    binding, _ = bound(s)
    ro = onnxhal.RunOptions()
    ro.add_run_config_entry("gpu_graph_id", "5")
    s.run_with_iobinding(binding, ro)
    s.run_with_iobinding(binding, ro)
    assert events(hook, "replay") == [("replay", 5)]
    skip = onnxhal.RunOptions()
    skip.add_run_config_entry("gpu_graph_id", "-1")
    np.testing.assert_array_equal(s.run(None, {"x": X}, skip)[0], np.maximum(X, 0) * 2)
    with pytest.raises(ValueError, match="graph capture requires fixed device OrtValues and run_with_iobinding"):
        s.run(None, {"x": X})
    bad = onnxhal.RunOptions()
    bad.add_run_config_entry("gpu_graph_id", "x")
    with pytest.raises(ValueError, match="'gpu_graph_id' must be an integer"):
        s.run_with_iobinding(binding, bad)


def test_a_node_on_another_ep_fails_the_session_unless_the_policy_allows_cpu_nodes(hook):
    # as onnxruntime 1.32 with this EP through the bridge: ALL_NODES_ON_EP and Mul on the CPU EP fail
    # the session; ALLOW_CPU_FOR_SHAPES accepts CPU nodes when no value is copied between memories
    with pytest.raises(onnxhal.errors.Fail, match="This session cannot use the graph capture feature as requested by "
                       "the user as all the graph nodes have not been assigned to HookExecutionProvider: node 'mul' "
                       r"\(Mul\) runs on CPUExecutionProvider"):
        session({"capture": "1", "ops": "Relu", "policy": "0"})
    s = session({"capture": "1", "ops": "Relu", "policy": "1"})
    assert s.graph_capture_ep is not None and s.graph_capture_ep.name == "HookExecutionProvider"


@pytest.mark.parametrize("policy", ["0", "1"])
def test_cpu_nodes_that_compute_shapes_are_allowed_by_the_shapes_policy(hook, policy):
    model = make([helper.make_node("Relu", ["x"], ["y"], name="relu"), helper.make_node("Shape", ["x"], ["s"],
                                                                                       name="shape")],
                 [vi("x", [1, 3])], [vi("y", [1, 3]), vi("s", [2], 7)]).SerializeToString()
    so = onnxhal.SessionOptions()
    providers = [("HookExecutionProvider", {"capture": "1", "policy": policy})]
    if policy == "0":
        with pytest.raises(onnxhal.errors.Fail, match="all the graph nodes have not been assigned"):
            onnxhal.InferenceSession(model, so, providers=providers)
        return
    assert onnxhal.InferenceSession(model, so, providers=providers).graph_capture_ep is not None


def test_control_flow_nodes_fail_a_capturing_session(hook):
    # onnxruntime 1.32 through the bridge: "... as the model has control flow nodes which can't be supported by"
    then = helper.make_graph([helper.make_node("Identity", ["r"], ["t"])], "then", [], [vi("t", [1, 3])])
    other = helper.make_graph([helper.make_node("Neg", ["r"], ["e"])], "else", [], [vi("e", [1, 3])])
    model = make([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                  helper.make_node("If", ["c"], ["y"], name="if", then_branch=then, else_branch=other)],
                 [vi("x", [1, 3])], [vi("y", [1, 3])], [numpy_helper.from_array(np.array(True), "c")]).SerializeToString()
    so = onnxhal.SessionOptions()
    so.graph_optimization_level = onnxhal.GraphOptimizationLevel.ORT_DISABLE_ALL
    with pytest.raises(onnxhal.errors.Fail, match="as the model has control flow nodes which can't be supported by "
                       r"HookExecutionProvider: node 'if' \(If\)"):
        onnxhal.InferenceSession(model, so, providers=[("HookExecutionProvider", {"capture": "1", "policy": "1"})])
    onnxhal.InferenceSession(model, so, providers=[("HookExecutionProvider", {"capture": "0", "policy": "1"})])


# -- custom-op domains from a factory --------------------------------------------------------------
CUSTOM_EP = '''
import numpy as np

from onnxhal import hal

CREATED = []


class _Triple(hal.Kernel):
    def compute(self, inputs):
        return [inputs[0] * 3]


class Triple(hal.CustomOp):
    op_type = "Triple"  # no execution_provider: the CPU EP runs it, as onnxruntime's default

    def create_kernel(self, node):
        CREATED.append(node.name)
        return _Triple()


class CustomEp(hal.Ep):
    name = "CustomOpsExecutionProvider"


class CustomFactory(hal.EpFactory):
    name = "CustomOpsExecutionProvider"; vendor = "Custom"; version = "1.0.0"

    def __init__(self, api):
        self.api = api

    def get_supported_devices(self, hardware_devices):
        return [self.api.create_ep_device(self, d) for d in hardware_devices if d.type == hal.OrtHardwareDeviceType.CPU]

    def create_ep(self, devices, ep_metadata, session_options, logger):
        return CustomEp()

    def get_custom_op_domains(self):
        return [hal.CustomOpDomain("com.example", [Triple()])]


def create_ep_factories(registration_name, api, logger):
    return [CustomFactory(api)]


def release_ep_factory(factory):
    pass
'''


def triple_model() -> bytes:
    node = helper.make_node("Triple", ["x"], ["y"], name="triple", domain="com.example")
    model = make([node], [vi("x", [1, 3])], [vi("y", [1, 3])])
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    return model.SerializeToString()


@pytest.fixture
def custom(register, plugin_file):
    mod = library_module(register(plugin_file(CUSTOM_EP, "custom_ep")))
    mod.CREATED.clear()
    return mod


def test_a_factorys_custom_ops_run_in_sessions_that_use_its_ep(custom):
    s = onnxhal.InferenceSession(triple_model(), providers=["CustomOpsExecutionProvider"])
    np.testing.assert_array_equal(s.run(None, {"x": X})[0], X * 3)
    assert custom.CREATED == ["triple"]
    so = onnxhal.SessionOptions()
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    so.add_provider_for_devices([d for d in onnxhal.get_ep_devices() if d.ep_name == "CustomOpsExecutionProvider"])
    s = onnxhal.InferenceSession(triple_model(), so)
    assert [(a.ep_name, [n.op_type for n in a.get_nodes()]) for a in s.get_provider_graph_assignment_info()] == \
        [("CPUExecutionProvider", ["Triple"])]


def test_a_policy_session_gets_every_factorys_custom_ops(custom):
    so = onnxhal.SessionOptions()
    so.set_provider_selection_policy(onnxhal.OrtExecutionProviderDevicePolicy.PREFER_CPU)
    np.testing.assert_array_equal(onnxhal.InferenceSession(triple_model(), so).run(None, {"x": X})[0], X * 3)


def test_without_the_library_in_the_session_the_op_has_no_kernel(custom):
    with pytest.raises(errors.NotImplemented, match="Triple"):
        onnxhal.InferenceSession(triple_model())
