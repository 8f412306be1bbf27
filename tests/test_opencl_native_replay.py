"""The OpenCL EP's two replay paths (``native_replay.REPLAY_PATHS``): ``native_replay``, a partition's
recorded launches and copies enqueued by one call of the C extension ``_replay``, held to
``python_replay``, one pyopencl call per step (the canonical form), and both to onnxruntime: the
same outputs, the same commands per run, the same typed error from a failed launch with the session
usable after it, many threads on one session, a run given RunOptions still stopped by its terminate
flag, and the no-driver environment."""

from __future__ import annotations

import copy
import logging
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("pyopencl")

import pyopencl as cl  # noqa: E402

import onnxhal  # noqa: E402
from onnxhal import hal  # noqa: E402
from onnxhal.hal.run_control import RUN_OPTIONS, Terminated  # noqa: E402
from onnxhal.runtime.providers.opencl import create_ep_factories, native_replay, partition_plan  # noqa: E402
from onnxhal.runtime.providers.opencl.partition_plan import CopyStep, Launch, PartitionState  # noqa: E402
from tests.opencl_support import require_opencl  # noqa: E402
from tests.threads import run_threads  # noqa: E402

OPENCL_INDEX = require_opencl(module_level=True)
if native_replay.replay_module() is None:
    pytest.skip(f"native replay unavailable: {native_replay.unavailable}", allow_module_level=True)

HW = hal.OrtHardwareDevice(hal.OrtHardwareDeviceType.CPU, "AMD", 0x1022, 0, {"opencl_devices": OPENCL_INDEX})
PROVIDERS = ["OpenCLExecutionProvider", "CPUExecutionProvider"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RNG = np.random.default_rng(47)


def block(batch: int | str = 4) -> onnx.ModelProto:
    """MatMul -> Add -> Softmax -> MatMul -> Tanh, with the Tanh's output also returned reshaped (an
    output viewing another output: the plan copies it, a CopyStep). The same weights every call."""
    rng = np.random.default_rng(7)
    w1 = (rng.standard_normal((16, 32)) * 0.3).astype(np.float32)
    w2 = (rng.standard_normal((32, 16)) * 0.3).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"]),
             helper.make_node("Softmax", ["hb"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "w2"], ["o"]),
             helper.make_node("Tanh", ["o"], ["y"]), helper.make_node("Reshape", ["y", "shape"], ["z"])]
    inits = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"), numpy_helper.from_array(b, "b"),
             numpy_helper.from_array(np.array([-1], np.int64), "shape")]
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 16]),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return onnx.shape_inference.infer_shapes(model)


@pytest.fixture()
def compiled():
    """(ep, allocator, compiled info of ``block(4)``'s one fused node)."""
    factory = create_ep_factories("opencl", hal.EpApi(), logging.getLogger("test"))[0]
    (ep_device,) = factory.get_supported_devices([HW])
    ep = factory.create_ep([HW], [ep_device.ep_metadata], None, logging.getLogger("test"))
    mem = ep_device.memory_info(hal.OrtDeviceMemoryType.DEFAULT)
    graph = hal.Graph.from_proto(block(4).graph, {"": 17})
    info = hal.EpGraphSupportInfo(graph)
    ep.get_capability(graph, info)
    (group, options), = info.fused_groups
    (cinfo,) = ep.compile([info.filtered_graph(group, options)], [None])
    return ep, factory.create_allocator(mem), cinfo


def state_on(path: str, monkeypatch, ep, alloc, plan) -> PartitionState:
    monkeypatch.setenv(native_replay.NATIVE_SWITCH, "1" if path == native_replay.NATIVE_REPLAY else "0")
    state = PartitionState(plan, ep.device, alloc)
    assert (state.recording is not None) == (path == native_replay.NATIVE_REPLAY)
    return state


def run_state(state: PartitionState, alloc, queue, x: np.ndarray) -> list[np.ndarray]:
    xd = alloc.tensor(x.shape, np.float32)
    cl.enqueue_copy(queue, xd.buffer, np.ascontiguousarray(x))
    outs = state.run([xd], queue)
    host = [np.empty(o.shape, np.float32) for o in outs]
    for h, o in zip(host, outs):
        cl.enqueue_copy(queue, h, o.buffer)
    queue.finish()
    alloc.free(xd.buffer)
    return host


class Commands:
    """Launches, copies and set_arg calls made through pyopencl and through the native replay."""

    def __init__(self, monkeypatch) -> None:
        self.py = {"launches": 0, "copies": 0, "set_args": 0}
        self.native0 = native_replay.replay_module().counters()

        def counting(owner, name, key):
            real = getattr(owner, name)

            def wrapper(*a, **k):
                self.py[key] += 1
                return real(*a, **k)
            monkeypatch.setattr(owner, name, wrapper)
        counting(cl, "enqueue_nd_range_kernel", "launches")
        counting(cl, "enqueue_copy", "copies")
        counting(cl.Kernel, "set_arg", "set_args")

    def total(self) -> dict[str, int]:
        native = [b - a for a, b in zip(self.native0, native_replay.replay_module().counters())]
        return {k: self.py[k] + n for k, n in zip(("launches", "copies", "set_args"), native)}


def test_native_replay_gives_python_replays_outputs_and_commands(compiled, monkeypatch):
    ep, alloc, cinfo = compiled
    plan = cinfo.plan
    assert any(isinstance(s, CopyStep) for s in plan.steps) and sum(isinstance(s, Launch) for s in plan.steps) >= 3
    ref = ort.InferenceSession(block(4).SerializeToString(), providers=["CPUExecutionProvider"])
    queue = ep.device.new_queue()
    states = {p: state_on(p, monkeypatch, ep, alloc, plan)
              for p in (native_replay.PYTHON_REPLAY, native_replay.NATIVE_REPLAY)}
    counts = {}
    for k in range(4):
        x = RNG.standard_normal((4, 16)).astype(np.float32)
        outs = {}
        for path, state in states.items():
            commands = Commands(monkeypatch)
            outs[path] = run_state(state, alloc, queue, x)
            counts[path, k] = commands.total()
            monkeypatch.undo()
        for a, b in zip(outs[native_replay.NATIVE_REPLAY], outs[native_replay.PYTHON_REPLAY]):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(outs[native_replay.NATIVE_REPLAY], ref.run(None, {"x": x})):
            np.testing.assert_allclose(a, b.reshape(a.shape), rtol=1e-5, atol=1e-6)
        # the same commands: run_state's own copies (input, outputs) plus the plan's steps; the
        # arguments a run rebinds (the input and outputs), the first run also the workspace's
        assert counts[native_replay.NATIVE_REPLAY, k] == counts[native_replay.PYTHON_REPLAY, k]
        assert counts[native_replay.NATIVE_REPLAY, k]["launches"] == sum(isinstance(s, Launch) for s in plan.steps)
    assert counts[native_replay.NATIVE_REPLAY, 1]["set_args"] < counts[native_replay.NATIVE_REPLAY, 0]["set_args"]
    for state in states.values():
        state.release()


def bad_plan(plan):
    """``plan`` with its last launch given a work-group larger than any device takes: its enqueue
    fails (CL_INVALID_WORK_GROUP_SIZE) after the launches before it were enqueued."""
    bad = copy.copy(plan)
    bad.steps = list(plan.steps)
    k = max(i for i, s in enumerate(bad.steps) if isinstance(s, Launch))
    s = bad.steps[k]
    big = 1 << 20
    bad.steps[k] = Launch(s.source, s.kernel_name, (big,) + s.global_size[1:], (big,) + (1,) * (len(s.global_size) - 1),
                          s.args)
    return bad


@pytest.mark.parametrize("path", [native_replay.PYTHON_REPLAY, native_replay.NATIVE_REPLAY])
def test_a_failed_launch_raises_pyopencls_error_and_leaves_the_device_usable(compiled, monkeypatch, path):
    ep, alloc, cinfo = compiled
    queue = ep.device.new_queue()
    x = RNG.standard_normal((4, 16)).astype(np.float32)
    good = state_on(path, monkeypatch, ep, alloc, cinfo.plan)
    expected = run_state(good, alloc, queue, x)
    in_use = alloc.stats()["InUse"]
    broken = state_on(path, monkeypatch, ep, alloc, bad_plan(cinfo.plan))
    xd = alloc.tensor(x.shape, np.float32)
    cl.enqueue_copy(queue, xd.buffer, x)
    for _ in range(2):  # the second run replays from a recording whose earlier launches are bound
        with pytest.raises(cl.LogicError) as err:
            broken.run([xd], queue)
        assert (err.value.code, err.value.routine) == (-54, "clEnqueueNDRangeKernel"), err.value
        assert str(err.value) == "clEnqueueNDRangeKernel failed: INVALID_WORK_GROUP_SIZE"
    queue.finish()
    alloc.free(xd.buffer)
    broken.release()
    assert alloc.stats()["InUse"] == in_use  # the failed runs' outputs went back
    for a, b in zip(run_state(good, alloc, queue, x), expected):
        np.testing.assert_array_equal(a, b)
    good.release()


def test_the_raised_error_classes_are_pyopencls():
    cases = {-4: cl.MemoryError, -5: cl.RuntimeError, -38: cl.LogicError, -54: cl.LogicError}
    for code, cls in cases.items():
        with pytest.raises(cls) as err:
            native_replay.raise_cl_error(code, "clEnqueueNDRangeKernel")
        assert err.value.code == code and err.value.routine == "clEnqueueNDRangeKernel"
        assert str(err.value) == f"clEnqueueNDRangeKernel failed: {cl.status_code.to_string(code)}"


def test_many_threads_share_a_session_on_the_native_replay(register, monkeypatch):
    monkeypatch.setenv(native_replay.NATIVE_SWITCH, "1")
    register("onnxhal.runtime.providers.opencl", "opencl")
    model = block("batch")
    data = model.SerializeToString()
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    sess = onnxhal.InferenceSession(data, providers=PROVIDERS)
    assert sess.get_providers()[0] == "OpenCLExecutionProvider"
    feeds = [RNG.standard_normal((1 + k % 3, 16)).astype(np.float32) for k in range(8)]
    expected = [ref.run(None, {"x": x}) for x in feeds]
    failures: list = []
    launches = native_replay.replay_module().counters()[0]

    def worker(k: int) -> None:
        for _ in range(10):
            got = sess.run(None, {"x": feeds[k]})
            for a, b in zip(got, expected[k]):
                if not np.allclose(a, b, rtol=1e-5, atol=1e-6):
                    failures.append(k)

    run_threads(worker, 8)
    assert not failures
    assert native_replay.replay_module().counters()[0] - launches >= 8 * 10  # the runs went native


@pytest.mark.parametrize("path", [native_replay.PYTHON_REPLAY, native_replay.NATIVE_REPLAY])
def test_a_run_given_run_options_replays_in_batches_and_stops_when_asked(register, monkeypatch, path):
    """With RunOptions the steps go in batches of IN_FLIGHT with the terminate flag read between them
    (IN_FLIGHT made 2 here, so a run is several batches): the outputs are the plain replay's, and a
    set flag stops the run with the session usable after."""
    monkeypatch.setenv(native_replay.NATIVE_SWITCH, "1" if path == native_replay.NATIVE_REPLAY else "0")
    monkeypatch.setattr(partition_plan, "IN_FLIGHT", 2)
    register("onnxhal.runtime.providers.opencl", "opencl")
    data = block(4).SerializeToString()
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    sess = onnxhal.InferenceSession(data, providers=PROVIDERS)
    x = RNG.standard_normal((4, 16)).astype(np.float32)
    plain = sess.run(None, {"x": x})
    batched = sess.run(None, {"x": x}, onnxhal.RunOptions())
    for a, b, c in zip(plain, batched, ref.run(None, {"x": x})):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6)
    ro = onnxhal.RunOptions()
    ro.terminate = True
    with pytest.raises(Terminated):
        sess.run(None, {"x": x}, ro)
    for a, b in zip(sess.run(None, {"x": x}), plain):
        np.testing.assert_array_equal(a, b)


def test_the_native_replay_enqueues_in_batches_that_read_the_flag(compiled, monkeypatch):
    """The flag is read before each batch of IN_FLIGHT steps: set while the second batch is being
    enqueued, the run stops before a third."""
    ep, alloc, cinfo = compiled
    monkeypatch.setattr(partition_plan, "IN_FLIGHT", 1)
    state = state_on(native_replay.NATIVE_REPLAY, monkeypatch, ep, alloc, cinfo.plan)
    assert state.recording.steps >= 3
    queue = ep.device.new_queue()
    ro = onnxhal.RunOptions()
    batches = []
    real = state.recording

    class Watching:
        steps = real.steps

        def replay(self, q, slots, start=0, stop=-1):
            batches.append(start)
            if len(batches) == 2:
                ro.terminate = True
            return real.replay(q, slots, start, stop)

    state.recording = Watching()
    x = RNG.standard_normal((4, 16)).astype(np.float32)
    xd = alloc.tensor(x.shape, np.float32)
    cl.enqueue_copy(queue, xd.buffer, x)
    token = RUN_OPTIONS.set(ro)
    try:
        with pytest.raises(Terminated):
            state.run([xd], queue)
    finally:
        RUN_OPTIONS.reset(token)
    assert batches == [0, 1]
    queue.finish()
    alloc.free(xd.buffer)
    state.recording = real
    state.release()


def test_without_a_driver_sessions_run_and_the_opencl_tests_skip(tmp_path):
    """No OpenCL platform (an empty vendor folder, PoCL told to show no device): the OpenCL modules
    import, the native replay loads its entry points all the same (no device is needed for that), a
    session runs on the CPU EP, and this file's tests skip, saying why."""
    empty = tmp_path / "icd"
    empty.mkdir()
    env = dict(os.environ, OCL_ICD_VENDORS=str(empty), POCL_DEVICES="none", PYTHONDONTWRITEBYTECODE="1")
    model = tmp_path / "block.onnx"
    model.write_bytes(block(2).SerializeToString())
    script = ("import numpy as np, onnxhal; "
              "from onnxhal.runtime.providers.opencl import partition_plan, native_replay; "
              f"s = onnxhal.InferenceSession({str(model)!r}); "
              "print(s.get_providers()[0], s.run(None, {'x': np.ones((2, 16), np.float32)})[0].shape, "
              "native_replay.replay_module() is not None)")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[0] == "CPUExecutionProvider" and out.stdout.split()[-1] == "True", out.stdout
    for name in (__file__, os.path.join(ROOT, "tests", "test_opencl_replay.py")):
        tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", name],
                               env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
        # 5: pytest's "no tests collected", what a module-level skip leaves
        assert tests.returncode == 5, tests.stdout[-2000:]
        assert "1 skipped" in tests.stdout and "needs a working OpenCL device" in tests.stdout, tests.stdout[-2000:]


def test_slot_buffers_are_the_buffers_the_python_replay_binds(compiled, monkeypatch):
    """The native replay's slots come from sources resolved when the state is made
    (``partition_plan._slot_sources``); for every slot, the buffer the Python replay's lookup gives
    that name (inputs, outputs, the workspace's temporaries, constants; ``z``, a view of ``y``,
    is a copy step's destination)."""
    ep, alloc, cinfo = compiled
    state = state_on(native_replay.NATIVE_REPLAY, monkeypatch, ep, alloc, cinfo.plan)
    plan = state.plan
    assert plan.temps and state.slot_names and any(isinstance(s, CopyStep) for s in plan.steps)
    ins = [object() for _ in plan.input_names]
    outs = [SimpleNamespace(buffer=object()) for _ in plan.output_names]
    temps = {name: object() for name in plan.temps}
    bufs = state.buffers(ins, outs, temps)
    slots = state.slot_buffers(ins, outs, temps)
    assert len(slots) == len(state.slot_names)
    assert all(got is bufs[name] for got, name in zip(slots, state.slot_names))
    state.release()
