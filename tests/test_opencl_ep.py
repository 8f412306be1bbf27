"""The OpenCL EP at the hal contract: what get_capability claims and fuses, what it declines, and
compile/compute on small hal.Graphs (after ONNX shape inference), on real OpenCL."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("pyopencl")

from onnxhal import hal  # noqa: E402
from onnxhal.hal.fused_groups import convex_groups  # noqa: E402
from onnxhal.runtime.providers.opencl import create_ep_factories  # noqa: E402
from onnxhal.runtime.providers.opencl.device_context import ProgramBuildError  # noqa: E402
from onnxhal.runtime.providers.opencl.ep import OpenCLEp  # noqa: E402
from tests.opencl_support import compute_on_device, require_opencl  # noqa: E402
from tests.threads import run_threads

OPENCL_INDEX = require_opencl(module_level=True)

HW = hal.OrtHardwareDevice(hal.OrtHardwareDeviceType.CPU, "AMD", 0x1022, 0, {"opencl_devices": OPENCL_INDEX})
RNG = np.random.default_rng(7)


@pytest.fixture()
def ocl():
    factory = create_ep_factories("opencl", hal.EpApi(), logging.getLogger("test"))[0]
    (ep_device,) = factory.get_supported_devices([HW])
    ep = factory.create_ep([HW], [ep_device.ep_metadata], None, logging.getLogger("test"))
    return factory, ep, ep_device.memory_info(hal.OrtDeviceMemoryType.DEFAULT)


def make_graph(nodes, inputs, inits=None, outputs=("y",), opset=17) -> tuple[hal.Graph, onnx.ModelProto]:
    model = helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(k, TensorProto.FLOAT, s) for k, s in inputs.items()],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()]),
        opset_imports=[helper.make_opsetid("", opset)])
    model = onnx.shape_inference.infer_shapes(model)
    return hal.Graph.from_proto(model.graph, {"": opset}), model


def capability(ep, graph):
    info = hal.EpGraphSupportInfo(graph)
    ep.get_capability(graph, info)
    assert not info.single_nodes
    for _, opts in info.fused_groups:
        assert opts.drop_constant_initializers
    return [[n.name for n in g] for g, _ in info.fused_groups]


def test_factory_identity(ocl):
    factory, ep, _ = ocl
    assert (factory.name, factory.vendor, factory.version) == ("OpenCLExecutionProvider", "onnxhal", "0.1.0")
    assert factory.is_stream_aware() and isinstance(ep, OpenCLEp) and ep.name == factory.name


def test_unsupported_node_splits_groups_without_a_path_through_it(ocl):
    """a -> TopK(unclaimed) -> c and a -> c directly: a and c cannot share a group."""
    _, ep, _ = ocl
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="a"),
             helper.make_node("TopK", ["a", "k"], ["t", "ti"], name="topk", axis=1),
             helper.make_node("Add", ["a", "t"], ["c"], name="c"),
             helper.make_node("Sigmoid", ["c"], ["y"], name="d")]
    graph, _ = make_graph(nodes, {"x": [2, 4]}, {"k": np.array([4], np.int64)})
    groups = capability(ep, graph)
    assert groups == [["a"], ["c", "d"]]
    assert "topk" in ep.declined


def test_dynamic_shapes_are_claimed_and_other_dtypes_declined(ocl):
    _, ep, _ = ocl
    # Symbolic dims: claimed on the node's structure, specialised per shape at run time
    # (tests/test_opencl_dynamic.py); an unknown rank is not claimable.
    graph, _ = make_graph([helper.make_node("Relu", ["x"], ["y"], name="r")], {"x": ["batch", 4]})
    assert capability(ep, graph) == [["r"]]
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="ru")], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]), opset_imports=[helper.make_opsetid("", 17)])
    unranked = hal.Graph.from_proto(model.graph, {"": 17})
    assert capability(ep, unranked) == [] and "rank" in ep.declined["ru"]
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="r64")], "g",
        [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [3])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [3])]), opset_imports=[helper.make_opsetid("", 17)])
    g64 = hal.Graph.from_proto(onnx.shape_inference.infer_shapes(model).graph, {"": 17})
    assert capability(ep, g64) == [] and "float64" in ep.declined["r64"]


def test_lone_view_is_not_claimed(ocl):
    _, ep, _ = ocl
    graph, _ = make_graph([helper.make_node("Reshape", ["x", "s"], ["y"])], {"x": [2, 3]},
                          {"s": np.array([3, 2], np.int64)})
    assert capability(ep, graph) == []


def _loop_bodies() -> onnx.ModelProto:
    """x [3, 4] through a Scan over its rows (body: Sub, Sigmoid) and an If (then: Relu)."""
    f = TensorProto.FLOAT
    body = helper.make_graph(
        [helper.make_node("Sub", ["row", "c_in"], ["d"], name="body_sub"),
         helper.make_node("Sigmoid", ["d"], ["s"], name="body_sigmoid"),
         helper.make_node("Identity", ["c_in"], ["c_out"], name="body_id")],
        "scan_body", [helper.make_tensor_value_info("c_in", f, [4]), helper.make_tensor_value_info("row", f, [4])],
        [helper.make_tensor_value_info("c_out", f, [4]), helper.make_tensor_value_info("s", f, [4])])
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["t"], name="then_relu")], "then", [],
                               [helper.make_tensor_value_info("t", f, [3, 4])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"], name="else_neg")], "else", [],
                               [helper.make_tensor_value_info("e", f, [3, 4])])
    return helper.make_model(helper.make_graph(
        [helper.make_node("Scan", ["c", "x"], ["c_final", "ys"], name="scan", body=body, num_scan_inputs=1),
         helper.make_node("If", ["cond"], ["branch"], name="if", then_branch=then_g, else_branch=else_g),
         helper.make_node("Add", ["ys", "branch"], ["y"], name="add")],
        "g", [helper.make_tensor_value_info("c", f, [4]), helper.make_tensor_value_info("x", f, [3, 4]),
              helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", f, [3, 4])]), opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_loop_body_stays_on_the_host_and_an_if_branch_does_not(ocl):
    """A Scan or Loop runs on the host (nodes with subgraphs are not this EP's), so a body
    partition would cross to the device and back at every iteration: the body is declined with
    the reason; an If's branch runs once a run and is claimed."""
    _, ep, _ = ocl
    graph = hal.Graph.from_proto(_loop_bodies().graph, {"": 17})
    scan, cond = graph.nodes[0], graph.nodes[1]
    body = scan.subgraph_list()[0]
    assert capability(ep, body) == []
    assert "body of Scan node 'scan'" in ep.declined["body_sub"] and "every iteration" in ep.declined["body_sigmoid"]
    (then_g,) = [g for g in cond.subgraph_list() if g.name == "then"]
    assert capability(ep, then_g) == [["then_relu"]]


def test_fusion_groups_respect_convexity():
    graph, _ = make_graph([helper.make_node("Relu", ["x"], ["a"], name="a"),
                           helper.make_node("Neg", ["a"], ["b"], name="b"),
                           helper.make_node("Add", ["a", "b"], ["y"], name="c")], {"x": [3]})
    a, b, c = graph.nodes
    assert [[n.name for n in g] for g in convex_groups(graph, [a, c])] == [["a"], ["c"]]
    assert [[n.name for n in g] for g in convex_groups(graph, [a, b, c])] == [["a", "b", "c"]]


def test_a_partition_whose_programs_fail_to_build_runs_on_the_host(ocl, monkeypatch, caplog):
    """get_capability claims by rules and compile builds, so a compiler failure shows at compile. It
    cannot be caused on purpose with valid kernels: a test double makes the pooling program fail to
    build. The partition then runs on the host inside the EP, its reason in ``declined`` and the
    log, with onnxruntime's result."""
    factory, ep, mem = ocl
    real = ep.device.program

    def failing(source, *args, **kwargs):
        if "pool2d" in source:
            raise ProgramBuildError("injected build failure", "log")
        return real(source, *args, **kwargs)

    monkeypatch.setattr(ep.device, "program", failing)
    graph, model = make_graph([helper.make_node("Relu", ["x"], ["a"], name="relu"),
                               helper.make_node("MaxPool", ["a"], ["y"], name="pool", kernel_shape=[2, 2])],
                              {"x": [1, 1, 4, 4]})
    assert capability(ep, graph) == [["relu", "pool"]]  # rules only: nothing built yet
    with caplog.at_level(logging.WARNING, logger="test"):
        cinfo, state, _ = _run(factory, ep, mem, graph)
    assert "injected" in ep.declined["pool"] and "injected" in ep.declined["relu"]
    assert any("on the host" in r.getMessage() for r in caplog.records) and ep.compiled_plans == []
    x = RNG.standard_normal((1, 1, 4, 4)).astype(np.float32)
    stream = factory.create_sync_stream_for_device(mem.memory_device)
    got = compute_on_device(factory.create_allocator(mem), factory.create_data_transfer(), cinfo, state, x, stream)
    model.ir_version = 10
    want = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(got, want[0])
    assert cinfo.stats.host_runs == 1


def _run(factory, ep, mem, graph):
    info = hal.EpGraphSupportInfo(graph)
    ep.get_capability(graph, info)
    (group, options), = info.fused_groups
    fg = info.filtered_graph(group, options)
    (cinfo,) = ep.compile([fg], [None])
    state = cinfo.create_state(None)
    return cinfo, state, fg


def test_compile_compute_mlp_matches_reference_and_frees(ocl):
    factory, ep, mem = ocl
    w1, b1, w2 = (RNG.standard_normal(s).astype(np.float32) for s in ((16, 32), (32,), (32, 8)))
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["h2"]),
             helper.make_node("Relu", ["h2"], ["h3"]), helper.make_node("MatMul", ["h3", "w2"], ["o"]),
             helper.make_node("Softmax", ["o"], ["y"], axis=-1)]
    graph, model = make_graph(nodes, {"x": [4, 16]}, {"w1": w1, "b1": b1, "w2": w2})
    alloc, dt = factory.create_allocator(mem), factory.create_data_transfer()
    for use_stream in (True, False):
        stream = factory.create_sync_stream_for_device(mem.memory_device) if use_stream else None
        cinfo, state, fg = _run(factory, ep, mem, graph)
        assert [v.name for v in fg.inputs] == ["x"] and state.plan.constants  # weights uploaded once
        # packed weights stay on the device, the raw copies only packing read are released
        assert "w1" not in state.const_buffers and "b1" in state.const_buffers
        # GEMM with bias + Relu in its epilogue, GEMM, Softmax
        assert state.plan.launches_per_run == 3
        start = alloc.stats()["InUse"]
        x = RNG.standard_normal((4, 16)).astype(np.float32)
        xd = alloc.tensor(x.shape, np.float32)
        dt.copy_tensors([x], [xd], [stream])
        for _ in range(3):
            (out,) = cinfo.compute(state, hal.KernelContext([xd], 1, stream))
            assert out.memory_device == mem.memory_device and out.allocator is alloc
            y = np.empty(out.shape, np.float32)
            dt.copy_tensors([out], [y], [stream])
            if stream is not None:
                stream.finish()
            alloc.free(out.buffer)
        h = np.maximum(x @ w1 + b1, 0) @ w2
        e = np.exp(h - h.max(-1, keepdims=True))
        np.testing.assert_allclose(y, e / e.sum(-1, keepdims=True), rtol=1e-4, atol=1e-6)
        alloc.free(xd.buffer)
        cinfo.release_state(state)  # its workspace of temporaries goes with it
        assert alloc.stats()["InUse"] == start


def test_threads_running_one_compiled_partition_agree(ocl):
    factory, ep, mem = ocl
    w = RNG.standard_normal((8, 8)).astype(np.float32)
    graph, _ = make_graph([helper.make_node("Gemm", ["x", "w"], ["g"]), helper.make_node("Tanh", ["g"], ["y"])],
                          {"x": [5, 8]}, {"w": w})
    cinfo, state, _ = _run(factory, ep, mem, graph)
    alloc, dt = factory.create_allocator(mem), factory.create_data_transfer()
    start = alloc.stats()["InUse"]
    errors: list[str] = []

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        stream = factory.create_sync_stream_for_device(mem.memory_device)
        for _ in range(20):
            x = rng.standard_normal((5, 8)).astype(np.float32)
            y = compute_on_device(alloc, dt, cinfo, state, x, stream)
            if not np.allclose(y, np.tanh(x @ w), rtol=1e-4, atol=1e-5):
                errors.append(f"thread {seed}")

    run_threads(worker, 4)
    assert not errors
    assert state.runs == 80
    cinfo.release_state(state)  # one workspace per stream goes with it
    assert alloc.stats()["InUse"] == start


def test_out_of_memory_in_compute_leaves_the_allocator_as_it_was(ocl):
    from onnxhal.hal.errors import OutOfMemory
    from onnxhal.runtime.providers.opencl.memory import OpenCLAllocator
    from onnxhal.runtime.providers.opencl.partition_plan import PartitionState

    factory, ep, mem = ocl
    w = RNG.standard_normal((64, 64)).astype(np.float32)
    graph, _ = make_graph([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Tanh", ["h"], ["t"]),
                           helper.make_node("Transpose", ["t"], ["y"])], {"x": [64, 64]}, {"w": w})
    cinfo, state, _ = _run(factory, ep, mem, graph)
    small = OpenCLAllocator(ep.device, mem, limit=64 * 64 * 4 * 2 + 100)  # input + output, no room for temps
    tight = PartitionState(state.plan, ep.device, small)
    xd = small.tensor((64, 64), np.float32)
    factory.create_data_transfer().copy_tensors([np.ones((64, 64), np.float32)], [xd])
    before = small.stats()["InUse"]
    with pytest.raises(OutOfMemory):
        tight.run([xd], ep.device.queue)
    assert small.stats()["InUse"] == before
    tight.release()
    cinfo.release_state(state)


def test_an_internal_error_is_logged_as_one_never_passed_off_as_a_decline_reason(ocl, caplog):
    # A graph that declares a transposed value rank 0 (what onnxruntime's graph said of a value with
    # no shape): lowering the Transpose fails inside onnxhal, which is a bug to report, not a limit
    # of the device.
    _, ep, _ = ocl
    f32 = TensorProto.FLOAT
    gp = helper.make_graph([helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1], name="transpose"),
                            helper.make_node("Relu", ["t"], ["y"], name="relu")], "g",
                           [helper.make_tensor_value_info("x", f32, [])], [helper.make_tensor_value_info("y", f32, [2, 4, 8])],
                           value_info=[helper.make_tensor_value_info("t", f32, [2, 4, 8])])
    graph = hal.Graph.from_proto(gp, {"": 17})
    assert capability(ep, graph) == [["transpose", "relu"]]  # claimed by rules; lowering fails at compile
    with caplog.at_level(logging.WARNING, logger="test"):
        info = hal.EpGraphSupportInfo(graph)
        ep.get_capability(graph, info)
        (group, options), = info.fused_groups
        ep.compile([info.filtered_graph(group, options)], [None])
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert errors and errors[0].exc_info is not None and "internal error" in errors[0].getMessage()
    assert ep.declined["transpose"].startswith("internal error in onnxhal's OpenCL EP (IndexError")
