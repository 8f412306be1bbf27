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
def capture(profile: str, binding_memory: str = "device", values: str = "") -> dict:
    """Capture on the first IOBinding run (run option gpu_graph_id = 1), then replays with new values
    written into the same bound input buffer; the same runs on a session without capture and on
    onnxruntime's CPU EP. ``values``: keep each run's output (as lists) in the result."""
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
        y = r.pop("y")
        if values:
            r["values"] = y.tolist()
    return {"api": API, "device_bound": device_bound, "runs": runs, "opted_out": opted_out,
            "backend": dev.ep_metadata.get("backend")}


def threads(profile: str, n: str = "4") -> dict:
    """``n`` threads on one capturing session, each with its own binding in device memory and graph id,
    every capture run started before any computes (a barrier in OnRunStart): per thread, whether
    each run equals the session without capture bit for bit; the EP calls in all."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import onnxhal.ort_plugin as plugin
    from onnxhal.ort_plugin import dispatch, library  # noqa: F401 - library registers the handlers

    count = int(n)
    calls: collections.Counter = collections.Counter()
    barrier = threading.Barrier(count, timeout=60)
    started: set = set()
    lock = threading.Lock()
    armed = False  # the barrier waits for the pool's threads only

    def spy(call: int):
        handler = dispatch.HANDLERS[call]

        def counted(target, args):
            with lock:
                calls[dispatch._CALL_NAMES[call]] += 1
                first = armed and call == dispatch.E_ON_RUN_START and threading.get_ident() not in started
                if first:
                    started.add(threading.get_ident())
            result = handler(target, args)
            if first:
                barrier.wait()
            return result
        return counted

    for call in (dispatch.C_COMPUTE, dispatch.G_REPLAY_GRAPH, dispatch.E_ON_RUN_START):
        dispatch.HANDLERS[call] = spy(call)
    plugin.configure(profiles=[profile])
    ort.register_execution_provider_library(plugin.REGISTRATION_NAME, plugin.library_path())
    dev = next(d for d in ort.get_ep_devices() if d.ep_vendor == "onnxhal")
    info = dev.memory_info(ort.OrtDeviceMemoryType.DEFAULT)

    def session(options: dict) -> ort.InferenceSession:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.add_provider_for_devices([dev], options)
        return ort.InferenceSession(_model(), so)

    captured, plain = session({"enable_graph_capture": "1"}), session({})
    expected = {(k, j): plain.run(None, {"x": _inputs(10 * k + j)})[0] for k in range(count) for j in range(3)}
    calls.clear()
    armed = True

    def bound(k: int) -> tuple:
        x_dev = ort.OrtValue.ortvalue_from_shape_and_type(SHAPE, np.float32, memory_info=info)
        y_dev = ort.OrtValue.ortvalue_from_shape_and_type(SHAPE, np.float32, memory_info=info)
        binding = captured.io_binding()
        binding.bind_ortvalue_input("x", x_dev)
        binding.bind_ortvalue_output("y", y_dev)
        run_options = ort.RunOptions()
        run_options.add_run_config_entry("gpu_graph_id", str(k + 1))
        return x_dev, y_dev, binding, run_options

    # bound before the threads start, so that every thread's capture run starts together
    # (concurrent binding has its own test: test_ort_plugin_binding_threads.py)
    setups = [bound(k) for k in range(count)]

    def worker(k: int) -> list:
        x_dev, y_dev, binding, run_options = setups[k]
        equal = []
        for j in range(3):
            x = _inputs(10 * k + j)
            ort.copy_tensors([ort.OrtValue.ortvalue_from_numpy(x)], [x_dev], None)
            captured.run_with_iobinding(binding, run_options)
            host = ort.OrtValue.ortvalue_from_shape_and_type(SHAPE, np.float32)
            ort.copy_tensors([y_dev], [host], None)
            equal.append(bool(np.array_equal(host.numpy(), expected[k, j])))
        return equal

    with ThreadPoolExecutor(count) as pool:
        equal = list(pool.map(worker, range(count)))
    return {"api": API, "equal": equal, "calls": dict(calls)}


def release_at_session_end(profile: str) -> dict:
    """Graphs 1 and 2 captured (one IOBinding run each), then the session deleted: whether
    onnxruntime calls ``OrtEp::ReleaseCapturedGraph`` (API 27) on the way."""
    import gc

    import onnxhal.ort_plugin as plugin
    from onnxhal.ort_plugin import dispatch, library  # noqa: F401 - library registers the handlers

    calls: collections.Counter = collections.Counter()
    captured: set = set()

    def spy(call: int):
        handler = dispatch.HANDLERS[call]

        def counted(target, args):
            calls[dispatch._CALL_NAMES[call]] += 1
            result = handler(target, args)
            if call == dispatch.G_IS_GRAPH_CAPTURED and result:
                captured.add(args[0])
            return result
        return counted

    for call in (dispatch.G_IS_GRAPH_CAPTURED, dispatch.G_RELEASE_CAPTURED_GRAPH):
        dispatch.HANDLERS[call] = spy(call)
    plugin.configure(profiles=[profile])
    ort.register_execution_provider_library(plugin.REGISTRATION_NAME, plugin.library_path())
    dev = next(d for d in ort.get_ep_devices() if d.ep_vendor == "onnxhal")
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.add_provider_for_devices([dev], {"enable_graph_capture": "1"})
    sess = ort.InferenceSession(_model(), so)
    arrays = [_inputs(0), np.zeros(SHAPE, np.float32)]  # kept: the OrtValues view them
    binding = sess.io_binding()
    binding.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(arrays[0]))
    binding.bind_ortvalue_output("y", ort.OrtValue.ortvalue_from_numpy(arrays[1]))
    for gid in ("1", "2"):
        run_options = ort.RunOptions()
        run_options.add_run_config_entry("gpu_graph_id", gid)
        if API >= 26:
            sess.run_with_iobinding(binding, run_options)
    del binding, sess
    gc.collect()
    return {"api": API, "captured": sorted(captured), "calls": dict(calls)}


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


# -- onnxhal's own session ------------------------------------------------------------------------------
def _python_calls(fn) -> int:
    """Python and builtin function calls made by ``fn()``: the work of a run, counted, not timed."""
    count = [0]

    def profile(frame, event, arg):
        if event in ("call", "c_call"):
            count[0] += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count[0]


def _own_runs(device, options: dict, inputs: list, graph_id: str = "") -> dict:
    """IOBinding runs of onnxhal's own session on ``device``, input and output bound to OrtValues in
    the device's memory, each input written into the same bound buffer: per run, the EP hooks
    called, the Python calls made and the output."""
    import onnxhal
    from onnxhal.hal.enums import OrtDeviceMemoryType

    so = onnxhal.SessionOptions()
    so.add_provider_for_devices([device], options)
    sess = onnxhal.InferenceSession(_model(), so)
    ep = sess.eps[device.ep_name]
    calls: collections.Counter = collections.Counter()
    def spy(hook: str):
        method = getattr(ep, hook)

        def counted(*args):
            calls[hook] += 1
            return method(*args)
        return counted

    for hook in ("on_run_start", "on_run_end", "replay_graph", "compute_partition"):
        setattr(ep, hook, spy(hook))  # on the instance: the session and the EP's compute call it there
    info = device.memory_info(OrtDeviceMemoryType.DEFAULT)
    x = onnxhal.OrtValue.ortvalue_from_shape_and_type(SHAPE, np.float32, memory_info=info)
    y = onnxhal.OrtValue.ortvalue_from_shape_and_type(SHAPE, np.float32, memory_info=info)
    binding = sess.io_binding()
    binding.bind_ortvalue_input("x", x)
    binding.bind_ortvalue_output("y", y)
    run_options = onnxhal.RunOptions()
    if graph_id:
        run_options.add_run_config_entry("gpu_graph_id", graph_id)
    runs = []
    for value in inputs:
        x.update_inplace(value)
        calls.clear()
        python_calls = _python_calls(lambda: sess.run_with_iobinding(binding, run_options))
        runs.append({"calls": dict(calls), "python_calls": python_calls, "y": y.numpy().copy()})
    return {"capture_ep": sess.graph_capture_ep, "runs": runs}


@pytest.mark.parametrize("profile, tolerance", [("generic-gpu", 1e-5), ("generic-npu", 3e-2)])
def test_onnxhals_own_session_captures_its_first_iobinding_run_and_replays_the_next(profile, tolerance, monkeypatch):
    """As onnxruntime drives a capturing EP: the first run_with_iobinding captures (the session gives
    the EP the bound output buffers as destinations), each later one is replay_graph alone, into the
    bound output, following the values written into the bound input."""
    pytest.importorskip("pyopencl")
    from onnxhal.runtime.session import executor

    # plans generate their run function when built, as before the first-run loop: with no driver the
    # host backend's plan generates it at its second run, in the replay and the plain run alike,
    # and the Python calls compared below would count that generation on both sides
    monkeypatch.setattr(executor, "FIRST_RUN_LOOP", False)
    from tests.conftest import simulated_or_skip

    inputs = [_inputs(k) for k in range(4)]
    cpu = ort.InferenceSession(_model(), providers=["CPUExecutionProvider"])
    with simulated_or_skip(profile, by="profile") as devices:
        captured = _own_runs(devices[profile], {"enable_graph_capture": "1"}, inputs)
        plain = _own_runs(devices[profile], {}, inputs)
    for k, (run, normal) in enumerate(zip(captured["runs"], plain["runs"])):
        np.testing.assert_array_equal(run["y"], normal["y"])  # bit for bit: the same kernels
        assert np.abs(run["y"] - cpu.run(None, {"x": inputs[k]})[0]).max() <= tolerance
    first, *replays = captured["runs"]
    assert first["calls"] == {"on_run_start": 1, "compute_partition": 1, "on_run_end": 1}, first
    for k, run in enumerate(replays, 1):
        # the partition runs again inside replay_graph; no run hooks, no plan, no copies
        assert run["calls"] == {"replay_graph": 1, "compute_partition": 1}, run
        assert not np.array_equal(run["y"], first["y"])  # the new input values, not the capture run's
        assert run["python_calls"] < 0.8 * plain["runs"][k]["python_calls"], (run, plain["runs"][k])


def test_onnxhals_own_session_and_onnxruntime_through_the_bridge_agree_on_capture_and_replay():
    """The same runs (graph id 1, new values written into the bound input each time) in onnxhal's
    own session and inside onnxruntime through the bridge: the same EP calls, the same outputs."""
    pytest.importorskip("pyopencl")
    from tests.conftest import simulated_or_skip

    r = run_check("capture", "generic-gpu", "device", "values")
    if API < 28 or not r["device_bound"]:
        pytest.skip("onnxruntime's Python API makes OrtValues in a plugin EP's memory from 1.28")
    with simulated_or_skip("generic-gpu", by="profile") as devices:
        own = _own_runs(devices["generic-gpu"], {"enable_graph_capture": "1"}, [_inputs(k) for k in range(4)], "1")
    names = {"OrtEp::OnRunStart": "on_run_start", "OrtNodeComputeInfo::Compute": "compute_partition",
             "OrtEp::ReplayGraph": "replay_graph"}
    for theirs, ours in zip(r["runs"], own["runs"]):
        # onnxruntime calls OnRunEnd and the partition's compute inside ReplayGraph without the spy seeing them
        seen = {names[k]: v for k, v in theirs["calls"].items()}
        assert {k: v for k, v in ours["calls"].items() if k in ("on_run_start", "replay_graph")} == {
            k: v for k, v in seen.items() if k in ("on_run_start", "replay_graph")}, (theirs, ours)
        assert (("compute_partition" in seen) == ("on_run_start" in ours["calls"])), (theirs, ours)
        np.testing.assert_array_equal(np.asarray(theirs["values"], np.float32), ours["y"])


def test_a_replay_through_other_buffers_than_its_capture_runs_is_a_typed_error():
    """A replay reads and writes the buffers of its capture run only: onnxhal's own session refuses
    one whose binding holds others, as the bridge refuses one through buffers onnxruntime freed."""
    pytest.importorskip("pyopencl")
    import onnxhal
    from onnxhal.hal.enums import OrtDeviceMemoryType
    from tests.conftest import simulated_or_skip

    with simulated_or_skip("generic-gpu", by="profile") as devices:
        device = devices["generic-gpu"]
        so = onnxhal.SessionOptions()
        so.add_provider_for_devices([device], {"enable_graph_capture": "1"})
        sess = onnxhal.InferenceSession(_model(), so)
        info = device.memory_info(OrtDeviceMemoryType.DEFAULT)
        x, y, other = (onnxhal.OrtValue.ortvalue_from_shape_and_type(SHAPE, np.float32, memory_info=info)
                       for _ in range(3))
        x.update_inplace(_inputs(0))
        binding = sess.io_binding()
        binding.bind_ortvalue_input("x", x)
        binding.bind_ortvalue_output("y", y)
        sess.run_with_iobinding(binding)  # captures graph 0
        expected = y.numpy().copy()
        binding.bind_ortvalue_input("x", other)
        with pytest.raises(onnxhal.errors.InvalidArgument,
                           match="cannot replay graph 0: input 'x' is bound to another value than at capture"):
            sess.run_with_iobinding(binding)
        binding.bind_ortvalue_input("x", x)
        binding.bind_output("y")  # a new host array each run: the capture wrote the device buffer
        with pytest.raises(onnxhal.errors.InvalidArgument, match="output 'y' is not bound to an OrtValue"):
            sess.run_with_iobinding(binding)
        # a run opting out runs normally, and the capture stays
        skip = onnxhal.RunOptions()
        skip.add_run_config_entry("gpu_graph_id", "-1")
        sess.run_with_iobinding(binding, skip)
        np.testing.assert_array_equal(binding.copy_outputs_to_cpu()[0], expected)
        # an output bound in host memory at capture: the replay would leave it as it was
        sess.release_captured_graph(0)
        binding.bind_ortvalue_output("y", onnxhal.OrtValue.ortvalue_from_numpy(np.zeros(SHAPE, np.float32)))
        sess.run_with_iobinding(binding)
        np.testing.assert_array_equal(binding.copy_outputs_to_cpu()[0], expected)
        with pytest.raises(onnxhal.errors.InvalidArgument, match="output 'y' was not bound to an OrtValue in the EP's"):
            sess.run_with_iobinding(binding)


def test_threads_capture_their_own_graphs_and_every_thread_replays_the_eps(monkeypatch):
    """Concurrent runs on one session: each thread's capture run records only its own partition run
    (every capture run starts before any computes here), the captured graphs are the EP's by graph id
    (one captured on a thread replays on another), and every output equals a run without capture."""
    pytest.importorskip("pyopencl")
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import onnxhal
    from onnxhal.hal.enums import OrtDeviceMemoryType
    from tests.conftest import simulated_or_skip

    n = 4
    with simulated_or_skip("generic-gpu", by="profile") as devices:
        device = devices["generic-gpu"]
        so = onnxhal.SessionOptions()
        so.add_provider_for_devices([device], {"enable_graph_capture": "1"})
        sess = onnxhal.InferenceSession(_model(), so)
        so = onnxhal.SessionOptions()
        so.add_provider_for_devices([device], {})
        plain = onnxhal.InferenceSession(_model(), so)
        ep = sess.eps[device.ep_name]
        info = device.memory_info(OrtDeviceMemoryType.DEFAULT)
        calls: collections.Counter = collections.Counter()
        lock = threading.Lock()
        barrier = threading.Barrier(n, timeout=60)
        started: set = set()

        def spy(hook: str, wait: bool = False):
            method = getattr(ep, hook)

            def counted(*args):
                with lock:
                    calls[hook] += 1
                    first = wait and len(started) < n and threading.get_ident() not in started
                    started.add(threading.get_ident())
                result = method(*args)
                if first:  # every thread's capture run has started before any thread computes
                    barrier.wait()
                return result
            return counted

        monkeypatch.setattr(ep, "on_run_start", spy("on_run_start", wait=True))
        monkeypatch.setattr(ep, "replay_graph", spy("replay_graph"))
        monkeypatch.setattr(ep, "compute_partition", spy("compute_partition"))

        def bound(graph_id: int):
            x, y = (onnxhal.OrtValue.ortvalue_from_shape_and_type(SHAPE, np.float32, memory_info=info)
                    for _ in range(2))
            binding = sess.io_binding()
            binding.bind_ortvalue_input("x", x)
            binding.bind_ortvalue_output("y", y)
            run_options = onnxhal.RunOptions()
            run_options.add_run_config_entry("gpu_graph_id", str(graph_id))
            return x, y, binding, run_options

        def runs(k: int, setup=None) -> list:
            x, y, binding, run_options = setup or bound(k + 1)
            equal = []
            for j in range(3):
                value = _inputs(10 * k + j)
                x.update_inplace(value)
                sess.run_with_iobinding(binding, run_options)
                equal.append(bool(np.array_equal(y.numpy(), plain.run(None, {"x": value})[0])))
            return equal

        with ThreadPoolExecutor(n) as pool:
            equal = list(pool.map(runs, range(n)))
        assert equal == [[True] * 3] * n
        # one capture run per thread, each recording one partition run: the replays run one each
        assert calls == {"on_run_start": n, "compute_partition": 3 * n, "replay_graph": 2 * n}, calls
        assert all(ep.is_graph_captured(k + 1) for k in range(n))
        # graph 9, captured here, replays on another thread through the same binding
        setup = bound(9)
        x, y, binding, run_options = setup
        x.update_inplace(_inputs(90))
        sess.run_with_iobinding(binding, run_options)
        calls.clear()
        with ThreadPoolExecutor(1) as pool:
            assert pool.submit(runs, 9, setup).result() == [True] * 3
        assert calls == {"replay_graph": 3, "compute_partition": 3}, calls


@pytest.mark.skipif(API < 28, reason="onnxruntime's Python API makes OrtValues in a plugin EP's memory from 1.28; "
                    "bound in host memory, a replay is the typed error (test above)")
def test_threads_on_one_onnxruntime_session_capture_and_replay_through_the_bridge():
    r = run_check("threads", "generic-gpu")
    assert r["equal"] == [[True] * 3] * 4, r
    assert r["calls"] == {"OrtEp::OnRunStart": 4, "OrtNodeComputeInfo::Compute": 4, "OrtEp::ReplayGraph": 8}, r


def test_onnxruntime_does_not_release_captured_graphs_when_the_session_ends():
    # ReleaseCapturedGraph (API 27) is wired in the bridge; onnxruntime's C API reaches it through
    # OrtApi::SessionReleaseCapturedGraph (1.27), which its Python API lacks, and a session's end does
    # not call it: the EP is released, and its captures with it (CaptureRecorder belongs to the EP)
    r = run_check("release_at_session_end", "generic-gpu")
    assert "OrtEp::ReleaseCapturedGraph" not in r["calls"], r
    if API >= 26:
        assert r["captured"] == [1, 2], r


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    result = globals()[sys.argv[1]](*sys.argv[2:])
    print(json.dumps(result))

