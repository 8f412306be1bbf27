"""EPContext round trip: ModelCompiler saves the simulated EPs' compiled partitions in the model; a
session on that file takes them without planning, gives the same results, and the compatibility
info is checked on load."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxhal
from onnxhal.hal import GraphOptimizationLevel, OrtCompiledModelCompatibility
from onnxhal.hal.errors import Fail, NotImplemented
from onnxhal.simulators.ep_context import ModelCompiler, OrtCompileApiFlags, decode_partition
from onnxhal.simulators.testing import simulated_devices
from tests.conftest import simulated_or_skip

pytest.importorskip("pyopencl")

RNG = np.random.default_rng(9)
W1 = RNG.standard_normal((16, 32)).astype(np.float32)
W2 = RNG.standard_normal((32, 8)).astype(np.float32)
X = RNG.standard_normal((4, 16)).astype(np.float32)


def model_bytes() -> bytes:
    """MatMul -> Relu -> Erf -> MatMul: generic-npu has no Erf, so it gets two partitions."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"), helper.make_node("Relu", ["h"], ["r"], name="relu"),
         helper.make_node("Erf", ["r"], ["e"], name="erf"), helper.make_node("MatMul", ["e", "w2"], ["y"], name="mm2")],
        "ctx", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
        [numpy_helper.from_array(W1, "w1"), numpy_helper.from_array(W2, "w2")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.fixture(scope="module")
def sims():
    with simulated_or_skip("generic-npu,generic-gpu") as devices:
        yield devices


def options(device, **config) -> onnxhal.SessionOptions:
    so = onnxhal.SessionOptions()
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    for k, v in config.items():
        so.add_session_config_entry(k, v)
    if device is not None:
        so.add_provider_for_devices([device])
    return so


def test_compile_to_file_and_run_without_planning(sims, tmp_path):
    npu = sims["VirtualNpuExecutionProvider"]
    path = tmp_path / "ctx.onnx"
    ModelCompiler(options(npu), model_bytes(), embed_compiled_data_into_model=True).compile_to_file(path)
    saved = onnx.load(path)
    ops = [(n.op_type, n.domain) for n in saved.graph.node]
    assert ops == [("EPContext", "com.microsoft"), ("Erf", ""), ("EPContext", "com.microsoft")]
    assert not saved.graph.initializer  # the weights live in the EPContext blobs
    meta = {p.key: p.value for p in saved.metadata_props}
    info = meta["ep_compatibility_info.VirtualNpuExecutionProvider"]
    assert "profile=generic-npu" in info and "fp16=1" in info
    ctx_node = saved.graph.node[0]
    attrs = {a.name: a for a in ctx_node.attribute}
    assert attrs["source"].s == b"VirtualNpuExecutionProvider" and attrs["embed_mode"].i == 1
    plan, cost, compat = decode_partition(attrs["ep_cache_context"].s)
    assert compat == info and plan.input_names == ["x"] and cost.work > 0

    loaded = onnxhal.InferenceSession(str(path), options(npu))
    ep = loaded.eps["VirtualNpuExecutionProvider"]
    assert ep.contexts_loaded == 2 and loaded.partition_summary == {"VirtualNpuExecutionProvider": 2,
                                                                    "CPUExecutionProvider": 1}
    so = options(npu)
    so.graph_optimization_level = GraphOptimizationLevel.ORT_DISABLE_ALL  # what the compiler used
    direct = onnxhal.InferenceSession(model_bytes(), so)
    np.testing.assert_array_equal(loaded.run(None, {"x": X})[0], direct.run(None, {"x": X})[0])
    assert ep.meter.last_run.kernel_seconds == pytest.approx(
        direct.eps["VirtualNpuExecutionProvider"].meter.last_run.kernel_seconds)  # the cost came along
    assert npu.factory.validate_compiled_model_compatibility_info([npu.device], info) == \
        OrtCompiledModelCompatibility.EP_SUPPORTED_OPTIMAL


def test_a_context_for_another_device_is_not_taken(sims, tmp_path):
    npu, gpu = sims["VirtualNpuExecutionProvider"], sims["VirtualGpuExecutionProvider"]
    data = ModelCompiler(options(npu), model_bytes(), embed_compiled_data_into_model=True).compile_to_bytes()
    info = {p.key: p.value for p in onnx.load_from_string(data).metadata_props}[
        "ep_compatibility_info.VirtualNpuExecutionProvider"]
    with pytest.raises(NotImplemented, match="EPContext"):
        onnxhal.InferenceSession(data, options(gpu))  # nobody can run the NPU's partitions
    assert gpu.factory.validate_compiled_model_compatibility_info([gpu.device], info) == \
        OrtCompiledModelCompatibility.EP_UNSUPPORTED
    with simulated_devices("mobile-npu") as (other_npu,):  # same EP, another profile
        # ORT's load-time check: the factory rules the compatibility info UNSUPPORTED.
        with pytest.raises(Fail, match="not compatible"):
            onnxhal.InferenceSession(data, options(other_npu))
        assert other_npu.factory.validate_compiled_model_compatibility_info([other_npu.device], info) == \
            OrtCompiledModelCompatibility.EP_UNSUPPORTED


def test_compiler_flags(sims, tmp_path):
    with pytest.raises(Fail, match="Unable to compile any nodes"):
        ModelCompiler(options(None), model_bytes(), flags=OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED).compile_to_bytes()
    path = tmp_path / "exists.onnx"
    path.write_bytes(b"keep me")
    with pytest.raises(Fail, match="exists already"):  # onnxruntime's words
        ModelCompiler(options(sims["VirtualGpuExecutionProvider"]), model_bytes(),
                      flags=OrtCompileApiFlags.ERROR_IF_OUTPUT_FILE_EXISTS).compile_to_file(path)
    assert path.read_bytes() == b"keep me"


def dynamic_model_bytes() -> bytes:
    """MatMul -> Relu -> MatMul over a symbolic batch: one partition with symbolic dimensions."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"), helper.make_node("Relu", ["h"], ["r"], name="relu"),
         helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")],
        "dyn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
        [numpy_helper.from_array(W1, "w1"), numpy_helper.from_array(W2, "w2")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_a_partition_with_symbolic_dimensions_is_saved_and_specialised_again_on_load(sims, tmp_path):
    from onnxhal.runtime.providers.opencl.dynamic_partition import DynamicNodeComputeInfo, DynamicPartitionPlan

    gpu = sims["VirtualGpuExecutionProvider"]
    if gpu.ep_metadata.get("backend") != "opencl":
        pytest.skip("partitions with symbolic dimensions are specialised per shape only on the OpenCL backend; the "
                    f"host backend (here: {gpu.ep_metadata.get('backend_reason')}) saves every partition as its graph")
    path = tmp_path / "dyn_ctx.onnx"
    ModelCompiler(options(gpu), dynamic_model_bytes(), embed_compiled_data_into_model=True).compile_to_file(path)
    saved = onnx.load(path)
    assert [n.op_type for n in saved.graph.node] == ["EPContext"] and not saved.graph.initializer
    plan, _, _ = decode_partition({a.name: a for a in saved.graph.node[0].attribute}["ep_cache_context"].s)
    assert isinstance(plan, DynamicPartitionPlan)

    loaded = onnxhal.InferenceSession(str(path), options(gpu))
    ep = loaded.eps["VirtualGpuExecutionProvider"]
    assert ep.contexts_loaded == 1 and loaded.partition_summary == {"VirtualGpuExecutionProvider": 1}
    (info,) = [i for i in ep.dynamic_partitions.values() if isinstance(i, DynamicNodeComputeInfo)]
    so = options(gpu)
    so.graph_optimization_level = GraphOptimizationLevel.ORT_DISABLE_ALL  # what the compiler used
    direct = onnxhal.InferenceSession(dynamic_model_bytes(), so)
    for batch in (4, 2, 4):
        x = RNG.standard_normal((batch, 16)).astype(np.float32)
        np.testing.assert_array_equal(loaded.run(None, {"x": x})[0], direct.run(None, {"x": x})[0])
    assert (info.stats.misses, info.stats.hits, info.stats.host_runs) == (2, 1, 0)  # one specialisation per batch


@pytest.mark.parametrize("case", ["reordered", "unread"])
def test_reloaded_partition_takes_and_returns_values_by_name(sims, case):
    """An EPContext node listing its values in another order than its saved partition (or with an
    output nobody reads): the results match a plain session's, value by value."""
    from tests.models import multi_output_model, multi_output_reordered

    model, feeds = multi_output_model()
    ref = dict(zip(["r", "n", "s"], onnxhal.InferenceSession(model.SerializeToString()).run(None, feeds)))
    for ep_name in ("VirtualNpuExecutionProvider", "VirtualGpuExecutionProvider"):
        dev = sims[ep_name]
        compiled = ModelCompiler(options(dev), model.SerializeToString(),
                                 embed_compiled_data_into_model=True).compile_to_bytes()
        proto = multi_output_reordered(onnx.load_from_string(compiled))[case]
        sess = onnxhal.InferenceSession(proto.SerializeToString(), options(dev))
        assert sess.eps[ep_name].contexts_loaded == 1
        got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
        tol = 2e-2 if ep_name == "VirtualNpuExecutionProvider" else 1e-6  # generic-npu stores fp16
        for name, value in got.items():
            np.testing.assert_allclose(value, ref[name], atol=tol, err_msg=f"{ep_name} {case} {name}")


def test_every_field_of_a_partition_plan_is_saved_and_read_back():
    """A plan's fields of every kind a blob holds (sets among them: the zero-filled workspace
    buffers of rule conv_lanes_padded_output) come back equal, and the same plan makes the same
    bytes, so a new field of a new kind fails here rather than as a model saved without its
    contexts."""
    from onnxhal.runtime.providers.opencl.partition_plan import PartitionPlan
    from onnxhal.simulators.ep_context import encode_partition

    plan = PartitionPlan(["x"], ["y"], {"x": (2, 3), "y": (2, 3)}, {"x": np.dtype(np.float32), "y": np.dtype(np.float32)},
                         constants={"w": np.arange(3, dtype=np.float32)}, temps={"t1": 24, "t2": 24, "t3": 24})
    plan.zeroed_temps.update({"t3", "t1", "t2"})
    blob = encode_partition(plan, None, "compat")
    again, _, compat = decode_partition(blob)
    assert compat == "compat" and again.zeroed_temps == {"t1", "t2", "t3"}
    assert again.shapes == plan.shapes and again.dtypes == plan.dtypes and again.temps == plan.temps
    np.testing.assert_array_equal(again.constants["w"], plan.constants["w"])
    assert encode_partition(again, None, "compat") == blob
