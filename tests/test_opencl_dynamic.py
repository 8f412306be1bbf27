"""Models with symbolic dimensions on the OpenCL EP: claimed on their structure, specialised per
concrete input signature at run time (runtime/providers/opencl/dynamic_partition.py), shape
subgraphs left to the CPU EP, results equal to the CPU EP's for every shape."""

from __future__ import annotations

import json
import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("pyopencl")

import onnxhal  # noqa: E402
from onnxhal.hal.errors import NotImplemented as OrtNotImplemented  # noqa: E402
from onnxhal.runtime.providers.opencl import dynamic_partition  # noqa: E402
from tests.opencl_support import require_opencl  # noqa: E402

OPENCL_INDEX = require_opencl(module_level=True)
PROVIDERS = ["OpenCLExecutionProvider", "CPUExecutionProvider"]
RNG = np.random.default_rng(7)


def mlp(batch: str = "batch") -> bytes:
    w1 = RNG.standard_normal((16, 32)).astype(np.float32) * 0.3
    w2 = RNG.standard_normal((32, 8)).astype(np.float32) * 0.3
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["l"]), helper.make_node("Softmax", ["l"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 8])],
                              [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    return model.SerializeToString()


def attention_heads() -> bytes:
    """[batch, seq, 32] -> heads [batch, 4, seq, 8] with the Reshape target computed from Shape at
    run time, as exporters write it: Shape/Gather/Concat stay on the CPU EP, the rest on OpenCL."""
    w = RNG.standard_normal((32, 32)).astype(np.float32) * 0.2
    c = {"i0": np.array([0], np.int64), "i1": np.array([1], np.int64), "hd": np.array([4, 8], np.int64)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["q"]),
             helper.make_node("Shape", ["q"], ["s"]),  # of a value in device memory
             helper.make_node("Gather", ["s", "i0"], ["b"], axis=0),
             helper.make_node("Gather", ["s", "i1"], ["t"], axis=0),
             helper.make_node("Concat", ["b", "t", "hd"], ["shape4"], axis=0),
             helper.make_node("Reshape", ["q", "shape4"], ["q4"]),
             helper.make_node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
             helper.make_node("Relu", ["qt"], ["y"])]
    graph = helper.make_graph(nodes, "heads", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, "seq", 8])],
                              [numpy_helper.from_array(w, "w"), *(numpy_helper.from_array(v, k) for k, v in c.items())])
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    return model.SerializeToString()


def split_then_merge() -> bytes:
    """MatMul -> Reshape to heads -> Reshape back -> Relu, each Reshape's target computed from the
    Shape of its input (as a GPT-2 export's head merge): the first Reshape lands alone between two
    shape chains, its own partition of one view."""
    w = RNG.standard_normal((32, 32)).astype(np.float32) * 0.2
    c = {"i0": np.array([0], np.int64), "i1": np.array([1], np.int64), "hd": np.array([4, 8], np.int64),
         "d": np.array([32], np.int64)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["q"]),
             helper.make_node("Shape", ["q"], ["s"]),
             helper.make_node("Gather", ["s", "i0"], ["b"], axis=0),
             helper.make_node("Gather", ["s", "i1"], ["t"], axis=0),
             helper.make_node("Concat", ["b", "t", "hd"], ["shape4"], axis=0),
             helper.make_node("Reshape", ["q", "shape4"], ["q4"]),
             helper.make_node("Shape", ["q4"], ["s4"]),
             helper.make_node("Gather", ["s4", "i0"], ["b4"], axis=0),
             helper.make_node("Gather", ["s4", "i1"], ["t4"], axis=0),
             helper.make_node("Concat", ["b4", "t4", "d"], ["shape3"], axis=0),
             helper.make_node("Reshape", ["q4", "shape3"], ["q3"]),
             helper.make_node("Relu", ["q3"], ["y"])]
    graph = helper.make_graph(nodes, "merge", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 32])],
                              [numpy_helper.from_array(w, "w"), *(numpy_helper.from_array(v, k) for k, v in c.items())])
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    return model.SerializeToString()


def _no_opt() -> onnxhal.SessionOptions:
    so = onnxhal.SessionOptions()
    so.graph_optimization_level = onnxhal.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep the nodes as written
    return so


def _dynamic_infos(sess) -> list:
    return list(sess.eps["OpenCLExecutionProvider"].dynamic_partitions.values())


def test_symbolic_batch_is_claimed_and_specialised_per_shape(opencl):
    model = mlp()
    sess = onnxhal.InferenceSession(model, providers=PROVIDERS)
    cpu = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"])
    assert sess.partition_summary == {"OpenCLExecutionProvider": 4}  # all of it, as the static model
    for batch in (1, 5, 1, 5, 3):
        x = RNG.standard_normal((batch, 16)).astype(np.float32)
        (y,) = sess.run(None, {"x": x})
        assert y.shape == (batch, 8)
        np.testing.assert_allclose(y, cpu.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
    (info,) = _dynamic_infos(sess)
    assert (info.stats.misses, info.stats.hits, info.stats.host_runs) == (3, 2, 0)


def test_shape_subgraph_stays_on_the_cpu_and_feeds_the_reshape(opencl):
    # With rule shape_values off (tests/test_opencl_shape_values.py has it on: one partition).
    model = attention_heads()
    providers = [("OpenCLExecutionProvider", {"disable_fusions": "shape_values"}), "CPUExecutionProvider"]
    sess = onnxhal.InferenceSession(model, _no_opt(), providers=providers)
    cpu = onnxhal.InferenceSession(model, _no_opt(), providers=["CPUExecutionProvider"])
    on = {n.op_type: n.ep_name for n in sess.assigned_nodes()}
    assert {op for op, ep in on.items() if ep == "OpenCLExecutionProvider"} == {"MatMul", "Reshape", "Transpose", "Relu"}
    assert {op for op, ep in on.items() if ep == "CPUExecutionProvider"} == {"Shape", "Gather", "Concat"}
    for shape in ((2, 5), (1, 9), (2, 5)):
        x = RNG.standard_normal((*shape, 32)).astype(np.float32)
        (y,) = sess.run(None, {"x": x})
        np.testing.assert_allclose(y, cpu.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
    # MatMul, then Reshape/Transpose/Relu: the Shape chain on the CPU EP lies between them.
    first, second = _dynamic_infos(sess)
    assert second.host_inputs  # the Reshape target arrives in host memory, its value in the signature
    assert [(i.stats.misses, i.stats.hits) for i in (first, second)] == [(2, 1), (2, 1)]
    # Shape reads only the shape of the MatMul's output: nothing is copied to the host for it.
    copies = [s.label for s in sess.plan.steps if s.node is None]
    assert not any(label.startswith("copy q ") for label in copies), copies


def test_the_cache_is_bounded_and_evicts_the_least_recent(opencl):
    sess = onnxhal.InferenceSession(mlp(), providers=PROVIDERS)
    (info,) = _dynamic_infos(sess)
    info.max_signatures = 2
    for batch in (1, 2, 3, 1):  # 3 evicts 1, so 1 misses again
        sess.run(None, {"x": np.ones((batch, 16), np.float32)})
    assert (info.stats.misses, info.stats.hits, info.stats.evictions) == (4, 0, 2)
    assert len(info._cache) == 2


def test_a_shape_whose_plan_cannot_be_built_runs_on_the_host(opencl, monkeypatch):
    real = dynamic_partition.build_plan

    def refuse_batch_3(graph, lookup, *rest):  # a test double: a lowering limit no real shape here reaches
        if lookup.shape(graph.input_names[0])[0] == 3:
            raise OrtNotImplemented("no kernel for batch 3")
        return real(graph, lookup, *rest)

    monkeypatch.setattr(dynamic_partition, "build_plan", refuse_batch_3)
    model = mlp()
    sess = onnxhal.InferenceSession(model, providers=PROVIDERS)
    cpu = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"])
    for batch in (3, 2, 3):
        x = RNG.standard_normal((batch, 16)).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], cpu.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
    (info,) = _dynamic_infos(sess)
    assert info.stats.host_runs == 2 and info.stats.misses == 2
    assert list(info.stats.host_reasons.values()) == ["NotImplemented: no kernel for batch 3"]


def test_profiling_trace_carries_the_shape_cache_figures(opencl, tmp_path):
    so = onnxhal.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "prof")
    sess = onnxhal.InferenceSession(mlp(), so, providers=PROVIDERS)
    for batch in (2, 2, 4):
        sess.run(None, {"x": np.ones((batch, 16), np.float32)})
    trace = json.loads(open(sess.end_profiling()).read())
    args = [e.get("args", {}) for e in trace if e.get("args", {}).get("shape_cache_misses") is not None]
    assert args and args[-1]["shape_cache_misses"] == 2 and args[-1]["shape_cache_hits"] == 1
    assert args[-1]["shape_build_ms"] > 0


def test_threads_with_different_shapes_agree(opencl):
    model = mlp()
    sess = onnxhal.InferenceSession(model, providers=PROVIDERS)
    cpu = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"])
    xs = [RNG.standard_normal((b, 16)).astype(np.float32) for b in (1, 2, 3, 4)]
    want = [cpu.run(None, {"x": x})[0] for x in xs]
    errors: list = []

    def work(k: int) -> None:
        try:
            for i in range(20):
                x = xs[(k + i) % 4]
                np.testing.assert_allclose(sess.run(None, {"x": x})[0], want[(k + i) % 4], rtol=1e-5, atol=1e-6)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_simulated_gpu_takes_symbolic_shapes_and_the_static_npu_declines():
    from tests.conftest import simulated_or_skip

    model = mlp()
    x = RNG.standard_normal((3, 16)).astype(np.float32)
    want = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    with simulated_or_skip("generic-npu,generic-gpu") as sims:
        for name, taken in (("VirtualGpuExecutionProvider", 4), ("VirtualNpuExecutionProvider", 0)):
            so = onnxhal.SessionOptions()
            so.add_provider_for_devices([sims[name]])
            sess = onnxhal.InferenceSession(model, so)
            assert sess.partition_summary.get(name, 0) == taken
            np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=2e-2, atol=2e-2)
            if not taken:
                reasons = set(sess.eps[name].declined.values())
                assert any("static shapes only" in r for r in reasons), reasons


def test_a_lone_view_between_device_partitions_stays_on_the_device(opencl):
    """A view alone in its partition is left to the CPU EP where that saves nothing, but between two
    OpenCL partitions it would send the value to the host and back: it is taken (a dynamic GPT-2
    export's head-merge Reshape; with it, the dynamic export has as many nodes on OpenCL as the
    same model with its dims fixed)."""
    model = split_then_merge()
    sess = onnxhal.InferenceSession(model, _no_opt(), providers=PROVIDERS)
    cpu = onnxhal.InferenceSession(model, _no_opt(), providers=["CPUExecutionProvider"])
    on = [(n.name or n.op_type, n.op_type, n.ep_name) for n in sess.assigned_nodes()]
    assert sorted(ep for _, op, ep in on if op in ("MatMul", "Reshape", "Relu")) == ["OpenCLExecutionProvider"] * 4
    for shape in ((2, 5), (1, 3)):
        x = RNG.standard_normal((*shape, 32)).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], cpu.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
    copies = [s.label for s in sess.plan.steps if s.node is None]
    assert not any(label.startswith(("copy q4 ", "copy q ")) for label in copies), copies



def test_run_time_slice_bounds_in_device_memory_are_read_at_every_run():
    """Slice starts/ends fed at run time from device memory (IOBinding, updated in place between
    runs): each run's values pick the plan, not the tensor object that holds them."""
    from tests.conftest import simulated_or_skip
    from tests.models import make, vi

    nodes = [helper.make_node("Slice", ["x", "s", "e"], ["t"], name="slice"),
             helper.make_node("Add", ["t", "t"], ["y"], name="add")]
    model = make(nodes, [vi("x", [10]), vi("s", [1], TensorProto.INT64), vi("e", [1], TensorProto.INT64)],
                 [vi("y", ["n"])]).SerializeToString()
    x = np.arange(10, dtype=np.float32)
    gpu = "VirtualGpuExecutionProvider"
    with simulated_or_skip("generic-gpu") as sims:
        so = onnxhal.SessionOptions()
        so.add_provider_for_devices([sims[gpu]])
        sess = onnxhal.InferenceSession(model, so)
        assert sess.partition_summary == {gpu: 2}
        info = sims[gpu].memory_info(onnxhal.OrtDeviceMemoryType.DEFAULT)
        starts, ends = (onnxhal.OrtValue.ortvalue_from_shape_and_type([1], np.int64, memory_info=info) for _ in "se")
        binding = sess.io_binding()
        binding.bind_cpu_input("x", x)
        binding.bind_ortvalue_input("s", starts)
        binding.bind_ortvalue_input("e", ends)
        binding.bind_output("y")
        for k in range(6):
            starts.update_inplace(np.array([k]))
            ends.update_inplace(np.array([k + 1 + k % 2]))
            sess.run_with_iobinding(binding)
            np.testing.assert_array_equal(binding.copy_outputs_to_cpu()[0], x[k:k + 1 + k % 2] * 2, err_msg=f"run {k}")
