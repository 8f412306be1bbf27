"""Record once, replay: a compiled OpenCL partition's later runs replay its recorded launches,
setting again only the kernel arguments that are the run's inputs and outputs (the intermediates
stay bound in a workspace kept per queue), and give what a first run gives; a new input shape is a
new recording. onnxruntime judges the numbers. Every test runs on both replay paths (``native_replay``:
the recorded list enqueued by the C extension; ``python_replay``: one pyopencl call per step)."""

from __future__ import annotations

import logging
import threading

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("pyopencl")

import pyopencl as cl  # noqa: E402

import onnxhal  # noqa: E402
from onnxhal import hal  # noqa: E402
from onnxhal.runtime.providers.opencl import create_ep_factories, native_replay  # noqa: E402
from onnxhal.runtime.providers.opencl.partition_plan import Buf, Launch, PartitionState  # noqa: E402
from tests.opencl_support import compute_on_device, require_opencl  # noqa: E402

OPENCL_INDEX = require_opencl(module_level=True)
HW = hal.OrtHardwareDevice(hal.OrtHardwareDeviceType.CPU, "AMD", 0x1022, 0, {"opencl_devices": OPENCL_INDEX})
RNG = np.random.default_rng(11)


def attention_block(batch: int | str) -> onnx.ModelProto:
    """x @ Wq, x @ Wk -> scores -> Softmax -> @ (x @ Wv) -> Tanh: several launches with intermediates."""
    w = {k: (RNG.standard_normal((16, 16)) * 0.3).astype(np.float32) for k in ("wq", "wk", "wv")}
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q"]), helper.make_node("MatMul", ["x", "wk"], ["k"]),
             helper.make_node("MatMul", ["x", "wv"], ["v"]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Softmax", ["s"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["o"]), helper.make_node("Tanh", ["o"], ["y"])]
    graph = helper.make_graph(nodes, "attn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 8, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 8, 16])],
                              [numpy_helper.from_array(v, k) for k, v in w.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10  # what onnxruntime accepts
    return onnx.shape_inference.infer_shapes(model)


@pytest.fixture(autouse=True, params=[native_replay.PYTHON_REPLAY, native_replay.NATIVE_REPLAY])
def replay_path(request, monkeypatch) -> str:
    """The replay path the partition states created in the test take."""
    monkeypatch.setenv(native_replay.NATIVE_SWITCH, "1" if request.param == native_replay.NATIVE_REPLAY else "0")
    if request.param == native_replay.NATIVE_REPLAY and native_replay.replay_module() is None:
        pytest.skip(f"native replay unavailable: {native_replay.unavailable}")
    return request.param


def native_set_args() -> int:
    """``set_arg`` calls the native replay made in this process so far (0 where it is not built)."""
    native = native_replay.replay_module()
    return native.counters()[2] if native is not None else 0


@pytest.fixture()
def compiled():
    factory = create_ep_factories("opencl", hal.EpApi(), logging.getLogger("test"))[0]
    (ep_device,) = factory.get_supported_devices([HW])
    ep = factory.create_ep([HW], [ep_device.ep_metadata], None, logging.getLogger("test"))
    mem = ep_device.memory_info(hal.OrtDeviceMemoryType.DEFAULT)
    model = attention_block(2)
    graph = hal.Graph.from_proto(model.graph, {"": 17})
    info = hal.EpGraphSupportInfo(graph)
    ep.get_capability(graph, info)
    (group, options), = info.fused_groups
    fg = info.filtered_graph(group, options)
    (cinfo,) = ep.compile([fg], [None])
    return factory, ep, mem, model, cinfo


class SetArgCount:
    """Counts ``cl.Kernel.set_arg`` calls (each goes on to the real one) and the native replay's."""

    def __init__(self, monkeypatch) -> None:
        self.python_calls = 0
        self.native_start = native_set_args()
        real = cl.Kernel.set_arg

        def counted(kernel, i, value):
            self.python_calls += 1
            return real(kernel, i, value)
        monkeypatch.setattr(cl.Kernel, "set_arg", counted)

    @property
    def calls(self) -> int:
        return self.python_calls + native_set_args() - self.native_start


def _run(factory, mem, cinfo, state, x: np.ndarray, stream) -> np.ndarray:
    return compute_on_device(factory.create_allocator(mem), factory.create_data_transfer(), cinfo, state, x, stream)


def test_replayed_runs_equal_first_runs_and_rebind_only_inputs_and_outputs(compiled, monkeypatch, replay_path):
    factory, ep, mem, model, cinfo = compiled
    plan = cinfo.plan
    assert plan.temps, "the block must have intermediates for the workspace to matter"
    io = set(plan.input_names) | set(plan.output_names)
    io_slots = sum(1 for s in plan.steps if isinstance(s, Launch) for a in s.args
                   if isinstance(a, Buf) and plan.base(a.name) in io | {plan.base(n) for n in io})
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    stream = factory.create_sync_stream_for_device(mem.memory_device)
    warm = cinfo.create_state(None)
    assert (warm.recording is not None) == (replay_path == native_replay.NATIVE_REPLAY)
    _run(factory, mem, cinfo, warm, RNG.standard_normal((2, 8, 16)).astype(np.float32), stream)  # records
    count = SetArgCount(monkeypatch)
    for _ in range(4):
        x = RNG.standard_normal((2, 8, 16)).astype(np.float32)
        before = count.calls
        replayed = _run(factory, mem, cinfo, warm, x, stream)
        replay_sets = count.calls - before
        fresh = cinfo.create_state(None)  # binds its constants, then its first run sets the rest
        before = count.calls
        first = _run(factory, mem, cinfo, fresh, x, stream)
        first_sets = count.calls - before
        cinfo.release_state(fresh)
        np.testing.assert_array_equal(replayed, first)
        np.testing.assert_allclose(replayed, ref.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
        # a replay sets the input and output arguments only; the first run also binds the workspace
        assert replay_sets <= io_slots < first_sets, (replay_sets, io_slots, first_sets)
    cinfo.release_state(warm)


def test_each_queue_gets_its_own_workspace_and_release_frees_them(compiled):
    factory, ep, mem, model, cinfo = compiled
    alloc = factory.create_allocator(mem)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    streams = [factory.create_sync_stream_for_device(mem.memory_device) for _ in range(2)]
    start = alloc.stats()["InUse"]
    state: PartitionState = cinfo.create_state(None)
    for k in range(6):  # alternating queues: each rebinds its own workspace
        x = RNG.standard_normal((2, 8, 16)).astype(np.float32)
        y = _run(factory, mem, cinfo, state, x, streams[k % 2])
        np.testing.assert_allclose(y, ref.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
    workspace = sum(cinfo.plan.temps.values())
    assert alloc.stats()["InUse"] - start == 2 * workspace
    cinfo.release_state(state)
    assert alloc.stats()["InUse"] == start


def test_a_new_input_shape_records_anew_and_each_shape_replays_correctly(register):
    register("onnxhal.runtime.providers.opencl", "opencl")
    model = attention_block("batch")
    data = model.SerializeToString()
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    sess = onnxhal.InferenceSession(data, providers=["OpenCLExecutionProvider", "CPUExecutionProvider"])
    assert sess.partition_summary == {"OpenCLExecutionProvider": len(model.graph.node)}
    for batch in (2, 3, 2, 3, 1, 2):
        x = RNG.standard_normal((batch, 8, 16)).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
    (info,) = sess.eps["OpenCLExecutionProvider"].dynamic_partitions.values()
    assert (info.stats.misses, info.stats.hits, info.stats.host_runs) == (3, 3, 0)


def test_a_released_state_gives_its_kernel_objects_to_the_next(compiled):
    factory, ep, mem, model, cinfo = compiled
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    stream = factory.create_sync_stream_for_device(mem.memory_device)
    x = RNG.standard_normal((2, 8, 16)).astype(np.float32)
    first = cinfo.create_state(None)
    y1 = _run(factory, mem, cinfo, first, x, stream)
    kernels = {id(b.kernel): b.kernel for b in first.launches if hasattr(b, "kernel")}  # held: ids stay unique
    created = ep.device.stats.kernels_created
    cinfo.release_state(first)
    second = cinfo.create_state(None)  # binds every argument of the kernels it takes again
    assert ep.device.stats.kernels_created == created
    assert {id(b.kernel) for b in second.launches if hasattr(b, "kernel")} <= kernels.keys()
    y2 = _run(factory, mem, cinfo, second, x, stream)
    np.testing.assert_array_equal(y1, y2)
    np.testing.assert_allclose(y2, ref.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
    cinfo.release_state(second)


def test_a_state_released_by_a_finalizer_during_an_allocation_does_not_deadlock(compiled):
    """A session the garbage collector finalizes releases its partition states, freeing their
    workspaces, on whatever thread the collection interrupts: here, inside another partition's
    allocation from the same allocator (with its lock held)."""
    from onnxhal.runtime.providers.opencl.memory import OpenCLAllocator

    factory, ep, mem, model, cinfo = compiled

    class InterruptedAllocator(OpenCLAllocator):
        on_alloc = None

        def _alloc(self, size):
            buf = super()._alloc(size)
            callback, self.on_alloc = self.on_alloc, None
            if callback is not None:
                callback()  # as a finalizer run by a collection triggered here would
            return buf

    alloc = InterruptedAllocator(ep.device, mem)
    queue = ep.device.new_queue()
    x = RNG.standard_normal((2, 8, 16)).astype(np.float32)
    xd = alloc.tensor(x.shape, np.float32)
    factory.create_data_transfer().copy_tensors([x], [xd])
    old = PartitionState(cinfo.plan, ep.device, alloc)
    old.run([xd], queue)  # its workspace now holds buffers of this allocator
    new = PartitionState(cinfo.plan, ep.device, alloc)
    alloc.on_alloc = old.release
    result: list = []
    worker = threading.Thread(target=lambda: result.append(new.run([xd], queue)), daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "allocating while a finalizer frees on the same thread deadlocked"
    queue.finish()
    y = np.empty(x.shape, np.float32)
    factory.create_data_transfer().copy_tensors(result[0], [y])
    np.testing.assert_allclose(y, ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
                               .run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
    new.release()
