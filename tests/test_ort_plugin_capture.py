"""Graph capture and replay of a simulated device inside real onnxruntime (onnxruntime 1.26 on:
``OrtEp::IsGraphCaptureEnabled`` / ``IsGraphCaptured`` / ``ReplayGraph``), and which custom-op domains
a session selected by policy gets. Each check runs in its own process
(``python -m tests.test_ort_plugin_capture NAME`` prints a JSON line last)."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
import onnxruntime as ort  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
API = int(ort.__version__.split(".")[1])
SHAPE = [2, 4]
W = (np.arange(16, dtype=np.float32).reshape(4, 4) - 7.5) / 8


def run_check(name: str, *args: str, backend: str = "") -> dict:
    """Check ``name`` in a child process; ``backend="host"`` runs it without OpenCL (ONNXHAL_OPENCL=off),
    on the simulators' host backend."""
    env = {**os.environ, "ONNXHAL_OPENCL": "off"} if backend == "host" else None
    done = subprocess.run([sys.executable, "-m", "tests.test_ort_plugin_capture", name, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, f"check {name} exited with {done.returncode}:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def _model() -> bytes:
    # y = relu(x) @ w + x, every node on the simulated device, static shapes
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("MatMul", ["r", "w"], ["m"], name="mm"),
         helper.make_node("Add", ["m", "x"], ["y"], name="add")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)], [numpy_helper.from_array(W, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10).SerializeToString()


def _inputs(k: int) -> np.ndarray:
    return np.random.default_rng(k).standard_normal(SHAPE).astype(np.float32)


# -- the checks, in a child process -------------------------------------------------------------------
def capture(profile: str, binding_memory: str = "device") -> dict:
    """Capture on the first IOBinding run (run option gpu_graph_id = 1), then replays with new values
    written into the same bound input buffer; the same runs on a session without capture and on
    onnxruntime's CPU EP."""
    import onnxhal.ort_plugin as plugin
    from onnxhal.ort_plugin import dispatch, library  # noqa: F401 - library registers the handlers

    calls: collections.Counter = collections.Counter()
    for call in (dispatch.C_COMPUTE, dispatch.G_REPLAY_GRAPH, dispatch.E_ON_RUN_START):
        def spy(target, args, _h=dispatch.HANDLERS[call], _c=call):
            calls[dispatch._CALL_NAMES[_c]] += 1
            return _h(target, args)

        dispatch.HANDLERS[call] = spy
    plugin.configure(profiles=[profile])
    ort.register_execution_provider_library(plugin.REGISTRATION_NAME, plugin.library_path())
    dev = next(d for d in ort.get_ep_devices() if d.ep_vendor == "onnxhal")
    info = dev.memory_info(ort.OrtDeviceMemoryType.DEFAULT)
    model = _model()
    cpu = ort.InferenceSession(model, providers=["CPUExecutionProvider"])

    def session(options: dict) -> ort.InferenceSession:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.add_provider_for_devices([dev], options)
        return ort.InferenceSession(model, so)

    captured, plain = session({"enable_graph_capture": "1"}), session({})
    try:  # OrtValues in a plugin EP's memory: onnxruntime's Python API has memory_info= in 1.32, not 1.26
        if binding_memory != "device":
            raise TypeError("bind host OrtValues")
        x_dev = ort.OrtValue.ortvalue_from_shape_and_type(SHAPE, np.float32, memory_info=info)
        y_dev = ort.OrtValue.ortvalue_from_shape_and_type(SHAPE, np.float32, memory_info=info)
        device_bound = True
    except TypeError:  # bound in host memory: onnxruntime's copies of them on the device live one run
        host_arrays = [np.zeros(SHAPE, np.float32), np.zeros(SHAPE, np.float32)]  # kept: the OrtValues view them
        x_dev, y_dev = (ort.OrtValue.ortvalue_from_numpy(a) for a in host_arrays)
        device_bound = False

    def write(value: ort.OrtValue, array: np.ndarray) -> None:
        if value.device_name().lower() == "cpu":
            value.update_inplace(array)
        else:
            ort.copy_tensors([ort.OrtValue.ortvalue_from_numpy(array)], [value], None)

    def read(value: ort.OrtValue) -> np.ndarray:
        if value.device_name().lower() == "cpu":
            return value.numpy().copy()
        host = ort.OrtValue.ortvalue_from_shape_and_type(SHAPE, np.float32)
        ort.copy_tensors([value], [host], None)
        return host.numpy()
    binding = captured.io_binding()
    binding.bind_ortvalue_input("x", x_dev)
    binding.bind_ortvalue_output("y", y_dev)
    run_options = ort.RunOptions()
    run_options.add_run_config_entry("gpu_graph_id", "1")
    runs = []
    for k in range(4):
        x = _inputs(k)
        calls.clear()
        if API < 26:  # no graph-capture member: a plain run is the whole check
            y = captured.run(None, {"x": x}, run_options)[0]
        else:
            write(x_dev, x)  # same buffer, new values
            try:
                captured.run_with_iobinding(binding, run_options)
            except Exception as e:  # noqa: BLE001 - onnxruntime's error types vary by version
                runs.append({"calls": dict(calls), "error": str(e)})
                break
            y = read(y_dev)
        runs.append({"calls": dict(calls),
                     "vs_plain": float(np.abs(y - plain.run(None, {"x": x})[0]).max()),
                     "vs_cpu": float(np.abs(y - cpu.run(None, {"x": x})[0]).max()),
                     "vs_capture_run": float(np.abs(y - runs[0]["y"]).max()) if runs else 0.0,
                     "y": y})
    if not device_bound and API >= 26:
        for r in runs:
            r.pop("y", None)
        return {"api": API, "device_bound": False, "runs": runs, "backend": dev.ep_metadata.get("backend")}
    # a run opting out of capture (gpu_graph_id = -1) runs normally
    opt_out = ort.RunOptions()
    opt_out.add_run_config_entry("gpu_graph_id", "-1")
    x = _inputs(9)
    calls.clear()
    if API < 26:
        y = captured.run(None, {"x": x}, opt_out)[0]
    else:
        write(x_dev, x)
        captured.run_with_iobinding(binding, opt_out)
        y = read(y_dev)
    opted_out = {"calls": dict(calls), "vs_cpu": float(np.abs(y - cpu.run(None, {"x": x})[0]).max())}
    for r in runs:
        del r["y"]
    return {"api": API, "device_bound": device_bound, "runs": runs, "opted_out": opted_out,
            "backend": dev.ep_metadata.get("backend")}


def bad_option() -> dict:
    import onnxhal.ort_plugin as plugin

    plugin.configure(profiles=["generic-gpu"])
    ort.register_execution_provider_library(plugin.REGISTRATION_NAME, plugin.library_path())
    dev = next(d for d in ort.get_ep_devices() if d.ep_vendor == "onnxhal")
    so = ort.SessionOptions()
    so.add_provider_for_devices([dev], {"enable_graph_capture": "yes"})
    try:
        sess = ort.InferenceSession(_model(), so)
    except Exception as e:  # noqa: BLE001 - onnxruntime's error types vary by version
        return {"error": str(e)}
    return {"error": None, "providers": sess.get_providers()}


def _custom_model(custom: bool) -> bytes:
    # Triple, Relu, ScaleShift(alpha, beta) of tests/plugins/custom_op_ep.py, or the same in standard ops
    if custom:
        nodes = [helper.make_node("Triple", ["x"], ["t"], name="triple", domain="com.example"),
                 helper.make_node("Relu", ["t"], ["r"], name="relu"),
                 helper.make_node("ScaleShift", ["r"], ["y"], name="scale_shift", domain="com.example", alpha=0.5,
                                  beta=1.25)]
        inits = []
    else:
        nodes = [helper.make_node("Mul", ["x", "three"], ["t"]), helper.make_node("Relu", ["t"], ["r"]),
                 helper.make_node("Mul", ["r", "alpha"], ["s"]), helper.make_node("Add", ["s", "beta"], ["y"])]
        inits = [numpy_helper.from_array(np.float32(v), n) for n, v in (("three", 3), ("alpha", 0.5), ("beta", 1.25))]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)], inits)
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid("com.example", 1)] if custom else [])
    return helper.make_model(g, opset_imports=opsets, ir_version=10).SerializeToString()


def custom_ops_by_policy() -> dict:
    """A model using a factory's custom ops in a session whose EPs a selection policy picks: without
    and with the bridge registered as the session's custom-op library."""
    import onnxhal.ort_plugin as plugin

    path = plugin.library_path()
    out: dict = {}

    def policy_session(with_library: bool) -> ort.InferenceSession:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        if with_library:
            so.register_custom_ops_library(path)
        so.set_provider_selection_policy(ort.OrtExecutionProviderDevicePolicy.PREFER_CPU)
        return ort.InferenceSession(_custom_model(True), so)

    try:  # the EP library not registered yet: RegisterCustomOps has no factory to ask
        policy_session(True)
        out["unregistered"] = None
    except Exception as e:  # noqa: BLE001 - onnxruntime's error types vary by version
        out["unregistered"] = str(e)
    plugin.configure(library=str(ROOT / "tests" / "plugins" / "custom_op_ep.py"))
    ort.register_execution_provider_library("custom", path)
    x = _inputs(3)
    reference = ort.InferenceSession(_custom_model(False), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    for with_library in (False, True):
        try:
            sess = policy_session(with_library)
            y = sess.run(None, {"x": x})[0]
            out[str(with_library)] = {"error": None, "providers": sess.get_providers(),
                                      "max_abs_err": float(np.abs(y - reference).max())}
        except Exception as e:  # noqa: BLE001
            out[str(with_library)] = {"error": str(e)}
    return out


def tensor_attributes(with_graph: str = "") -> dict:
    """Custom ops with a tensor attribute and a graph attribute (tests/plugins/tensor_attr_ep.py) on
    onnxruntime's CPU EP, the bridge as the session's custom-op library."""
    import onnxhal.ort_plugin as plugin

    path = plugin.library_path()
    plugin.configure(library=str(ROOT / "tests" / "plugins" / "tensor_attr_ep.py"))
    ort.register_execution_provider_library("tensor_attr", path)
    mod = next(m for m in list(sys.modules.values()) if getattr(m, "__file__", None)
               and Path(m.__file__).resolve() == ROOT / "tests" / "plugins" / "tensor_attr_ep.py")
    bias = np.array([0.5, -1.0, 2.0, 0.25], np.float32)
    body = helper.make_graph([helper.make_node("Identity", ["a"], ["b"])], "body",
                             [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1])],
                             [helper.make_tensor_value_info("b", TensorProto.FLOAT, [1])])
    def model(node) -> bytes:
        g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)])
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)],
                                 ir_version=10).SerializeToString()

    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.register_custom_ops_library(path)
    x = _inputs(5)
    reference = ort.InferenceSession(_add_model(bias), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    out: dict = {}
    add = helper.make_node("AddTensor", ["x"], ["y"], name="add_tensor", domain="com.example",
                           bias=numpy_helper.from_array(bias, "bias"))
    y = ort.InferenceSession(model(add), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    out["tensor"] = {"max_abs_err": float(np.abs(y - reference).max()), "read": mod.READ[-1]}
    if with_graph:
        try:
            ort.InferenceSession(model(helper.make_node("HasBody", ["x"], ["y"], name="has_body", domain="com.example",
                                                        body=body)), so, providers=["CPUExecutionProvider"])
            out["graph"] = None
        except Exception as e:  # noqa: BLE001
            out["graph"] = str(e)
    return out


def scalar_custom_op() -> dict:
    """A custom op (tests/plugins/custom_op_ep.py's Triple) on a 0-d input, on onnxruntime's CPU EP
    with the bridge as the session's custom-op library: its 0-d result."""
    import onnxhal.ort_plugin as plugin

    path = plugin.library_path()
    plugin.configure(library=str(ROOT / "tests" / "plugins" / "custom_op_ep.py"))
    ort.register_execution_provider_library("custom", path)
    g = helper.make_graph([helper.make_node("Triple", ["x"], ["y"], domain="com.example")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)],
                              ir_version=10)
    so = ort.SessionOptions()
    so.register_custom_ops_library(path)
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    y = sess.run(None, {"x": np.array(2.0, np.float32)})[0]
    return {"shape": list(y.shape), "values": y.reshape(-1).tolist()}


def _add_model(bias: np.ndarray) -> bytes:
    g = helper.make_graph([helper.make_node("Add", ["x", "bias"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)],
                          [numpy_helper.from_array(bias, "bias")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10).SerializeToString()


# -- the tests ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["opencl", "host"])
@pytest.mark.parametrize("profile, tolerance", [("generic-gpu", 1e-5), ("generic-npu", 3e-2)])
def test_replayed_runs_follow_the_bound_inputs_and_equal_normal_runs(profile, tolerance, backend):
    # on both backends of the simulated devices: OpenCL where a driver works, else the host backend
    # (numpy), whose partition runs are recorded and replayed the same way
    r = run_check("capture", profile, backend=backend)
    if r["backend"] != backend:
        pytest.skip(f"simulated devices run on {r['backend']!r} here, not {backend!r}")
    runs = r["runs"]
    if API >= 26 and not r["device_bound"]:  # (the values of host-bound outputs are not compared here)
        # no device OrtValues in this Python API: the inputs and outputs onnxruntime copies to and from
        # the device live one run, and the replay is refused with onnxhal's typed error, not a crash
        assert runs[0]["calls"] == {"OrtEp::OnRunStart": 1, "OrtNodeComputeInfo::Compute": 1}, runs[0]
        error = runs[1]["error"]
        assert ("OrtEp::ReplayGraph: InvalidArgument: " in error and "onnxruntime freed the device buffer of " in error
                and "bind every input and output with IOBinding" in error), error
        return
    for run in runs:
        assert run["vs_plain"] == 0.0, run  # the same kernels as the session without capture
        assert run["vs_cpu"] <= tolerance, run  # onnxruntime's CPU EP is the judge
    assert r["opted_out"]["vs_cpu"] <= tolerance
    if API < 26:  # no graph-capture members before 1.26
        assert all(run["calls"] == {"OrtEp::OnRunStart": 1, "OrtNodeComputeInfo::Compute": 1} for run in runs), runs
        return
    # the first run captures (a normal run, onnxruntime's OnRunStart and Compute); the next ones are
    # ReplayGraph alone, and each follows the values written into the bound input buffer
    assert runs[0]["calls"] == {"OrtEp::OnRunStart": 1, "OrtNodeComputeInfo::Compute": 1}, runs[0]
    for run in runs[1:]:
        assert run["calls"] == {"OrtEp::ReplayGraph": 1}, run
        assert run["vs_capture_run"] > 0.1, run  # new inputs, new outputs: not the capture run's values
    assert r["opted_out"]["calls"] == {"OrtEp::OnRunStart": 1, "OrtNodeComputeInfo::Compute": 1}


@pytest.mark.parametrize("backend", ["opencl", "host"])
def test_a_replay_whose_capture_run_used_buffers_onnxruntime_freed_is_a_typed_error(backend):
    # inputs and outputs bound in host memory: onnxruntime's device copies of them live one run, so
    # the capture run's buffers are gone at the replay (a replay through them crashed the process)
    r = run_check("capture", "generic-gpu", "host", backend=backend)
    if r["backend"] != backend:
        pytest.skip(f"simulated devices run on {r['backend']!r} here, not {backend!r}")
    runs = r["runs"]
    if API < 26:
        assert all(run["calls"].get("OrtEp::ReplayGraph", 0) == 0 for run in runs), runs
        return
    assert runs[0]["calls"] == {"OrtEp::OnRunStart": 1, "OrtNodeComputeInfo::Compute": 1}, runs[0]
    assert runs[1]["calls"] == {"OrtEp::ReplayGraph": 1}
    assert ("OrtEp::ReplayGraph: InvalidArgument: VirtualGpuExecutionProvider: cannot replay graph 1: onnxruntime "
            "freed the device buffer of " in runs[1]["error"]), runs[1]


def test_graph_capture_option_takes_one_or_zero():
    r = run_check("bad_option")
    if r["error"] is None:  # older Python APIs print an EP's error and fall back to the CPU EP alone
        assert r["providers"] == ["CPUExecutionProvider"], r
    else:
        assert "enable_graph_capture='yes'; use '1' or '0'" in r["error"]


def test_custom_ops_reach_a_policy_session_through_register_custom_ops_library():
    r = run_check("custom_ops_by_policy")
    # onnxruntime's Python InferenceSession does not ask the factories for their domains when a policy
    # picks the EPs: the model fails to load
    assert "com.example:Triple(-1) is not a registered function/op" in r["False"]["error"]
    # with the bridge as the session's custom-op library, its RegisterCustomOps adds them
    with_library = r["True"]
    assert with_library["error"] is None, with_library
    assert with_library["providers"][0] == "CustomOpsExecutionProvider"
    assert with_library["max_abs_err"] <= 1e-6
    # before the EP library is registered there is no factory: onnxhal's typed error, with the remedy
    assert ("RegisterCustomOps: InvalidArgument: onnxhal's EP library is not registered" in r["unregistered"]
            and "register_execution_provider_library" in r["unregistered"])



def test_custom_op_tensor_attributes_reach_the_kernel():
    r = run_check("tensor_attributes")
    # the tensor attribute arrives as a numpy array, as in onnxhal's own session; the result equals
    # onnxruntime's Add of the same constant
    assert r["tensor"]["read"] == ["add_tensor", "ndarray", "float32", [4]]
    assert r["tensor"]["max_abs_err"] == 0.0


def test_a_custom_ops_scalar_result_stays_a_scalar():
    assert run_check("scalar_custom_op") == {"shape": [], "values": [6.0]}


@pytest.mark.skipif(API < 31, reason="onnxruntime 1.24 accepts a custom-op node with a graph attribute, 1.25-1.30 "
                    "fail its session with std::bad_alloc (1.27 crashes), with or without the kernel reading it")
def test_a_custom_op_node_with_a_graph_attribute_is_onnxruntimes_refusal():
    r = run_check("tensor_attributes", "with_graph")
    assert "has a subgraph but is not a control flow node" in r["graph"]


@pytest.mark.parametrize("backend", ["opencl", "host"])
def test_onnxhals_own_session_runs_a_capturing_simulated_device_once_per_run(caplog, monkeypatch, backend):
    """onnxhal's own session gives no output destinations: the simulated device turns capture off
    after its first run, which then is the only run (not repeated until the capture limit), on
    OpenCL and on the host backend (no driver: the factory finds no OpenCL device)."""
    pytest.importorskip("pyopencl")
    import logging

    import onnxhal
    import onnxhal.simulators.factory as factory
    from tests.conftest import simulated_or_skip

    if backend == "host":
        monkeypatch.setattr(factory, "find_opencl_device", lambda hardware_devices: None)
    with simulated_or_skip("generic-gpu") as devices:
        device = devices["VirtualGpuExecutionProvider"]
        if device.ep_metadata.get("backend") != backend:
            pytest.skip(f"simulated devices run on {device.ep_metadata.get('backend')!r} here, not {backend!r}")
        so = onnxhal.SessionOptions()
        so.add_provider_for_devices([device], {"enable_graph_capture": "1"})
        with caplog.at_level(logging.WARNING, logger="onnxhal"):
            sess = onnxhal.InferenceSession(_model(), so)
        ep = sess.graph_capture_ep
        assert ep is not None and ep.name == "VirtualGpuExecutionProvider"
        starts = []
        original = ep.on_run_start
        ep.on_run_start = lambda run_options: (starts.append(1), original(run_options))[1]
        cpu = ort.InferenceSession(_model(), providers=["CPUExecutionProvider"])
        for k in range(3):
            x = _inputs(k)
            binding = sess.io_binding()
            binding.bind_cpu_input("x", x)
            binding.bind_output("y")
            with caplog.at_level(logging.INFO, logger="onnxhal"):
                sess.run_with_iobinding(binding)
            y = binding.copy_outputs_to_cpu()[0]
            assert np.abs(y - cpu.run(None, {"x": x})[0]).max() <= 1e-5
        assert len(starts) == 3  # one run each: no repeat while waiting for a capture that cannot come
        assert "the runtime gave no output destinations" in caplog.text
        assert not ep.is_graph_capture_enabled() and not ep.is_graph_captured(0)

if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    result = globals()[sys.argv[1]](*sys.argv[2:])
    print(json.dumps(result))

