"""The OpenCL EP's cost rule (runtime/providers/opencl/cost_rule.py, provider option cost_rule, on by
default; the suite's conftest turns the default off): a partition whose work is smaller than its
launches and copies, both measured, stays on the host and says why; one worth the device is
claimed; one with symbolic dims is weighed at cost_rule_dim. onnxruntime judges the outputs."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("pyopencl")

import onnxhal  # noqa: E402
from onnxhal.hal.errors import InvalidArgument  # noqa: E402
from onnxhal.runtime.providers.opencl.cost_rule import crossings, host_rates, host_reason  # noqa: E402
from tests.opencl_support import require_opencl  # noqa: E402

OPENCL_INDEX = require_opencl(module_level=True)
RNG = np.random.default_rng(5)


def _model(n: int | str, k: int) -> onnx.ModelProto:
    """x [n, k] -> MatMul by a constant [k, k] -> Relu -> TopK (never on OpenCL) -> Sigmoid of the values."""
    w = (RNG.standard_normal((k, k)) / np.sqrt(k)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("TopK", ["r", "kk"], ["t", "ti"], name="topk", axis=1),
             helper.make_node("Sigmoid", ["t"], ["y"], name="sig")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, 4])],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array([4], np.int64), "kk")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def _session(model: onnx.ModelProto, rule: str | None, **options: str) -> onnxhal.InferenceSession:
    if rule is not None:
        options["cost_rule"] = rule
    return onnxhal.InferenceSession(model.SerializeToString(),
                                    providers=[("OpenCLExecutionProvider", options), "CPUExecutionProvider"])


def test_a_partition_smaller_than_its_launches_and_copies_stays_on_the_host(opencl):
    model = _model(2, 8)
    x = RNG.standard_normal((2, 8)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    off, on = _session(model, "off"), _session(model, "on")
    assert off.partition_summary == {"OpenCLExecutionProvider": 3, "CPUExecutionProvider": 1}
    assert on.partition_summary == {"CPUExecutionProvider": 4}
    declined = on.eps["OpenCLExecutionProvider"].declined
    by_rule = {k for k, v in declined.items() if "kept on the host by the cost rule" in v and "measured on this device" in v}
    assert by_rule == set(declined) - {"topk"} and "sig" in by_rule and len(by_rule) >= 2
    for sess in (off, on):
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-6)


def test_a_partition_worth_the_device_is_claimed_with_the_rule_on(opencl):
    model = _model(256, 512)  # 67 MFLOP: far more than a launch and two copies anywhere
    x = RNG.standard_normal((256, 512)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    on = _session(model, "on")
    declined = on.eps["OpenCLExecutionProvider"].declined
    # the GEMM and its Relu are claimed; the Sigmoid of 256 x 4 values after TopK is not worth it
    assert {k for k, v in declined.items() if "cost rule" in v} == {"sig"}
    assert on.partition_summary == {"OpenCLExecutionProvider": 2, "CPUExecutionProvider": 2}
    np.testing.assert_allclose(on.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-5)


def test_a_bad_cost_rule_value_is_an_error_naming_it(opencl):
    with pytest.raises(InvalidArgument, match=r"cost_rule='sometimes'.*'on'.*'off'"):
        _session(_model(2, 8), "sometimes")


def test_the_device_and_host_costs_are_measured_once(opencl):
    sess = _session(_model(2, 8), "on")
    device = sess.eps["OpenCLExecutionProvider"].device
    costs = device.launch_costs()
    assert device.launch_costs() is costs and 0 < costs.launch_s < 0.1 and 0 < costs.copy_s < 0.1
    rates = host_rates()
    # (a matmul that woke OpenBLAS's pool measured 1e8 flop/s on a loaded machine: 1000 times slow)
    assert host_rates() is rates and rates.flops_per_s > 1e9 and rates.bytes_per_s > 1e8


def _check(sess: onnxhal.InferenceSession, model: onnx.ModelProto, x: np.ndarray) -> None:
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-5)


def test_a_tiny_partition_with_symbolic_dims_is_declined_and_a_big_one_kept(opencl):
    # x [n, k]: weighed with n at cost_rule_dim (64): 8 x 8 weights are microseconds of host work,
    # less than a launch and two copies; 1024 x 1024 are 134 MFLOP, far more anywhere
    tiny, big = _model("n", 8), _model("n", 1024)
    on = _session(tiny, "on")
    declined = on.eps["OpenCLExecutionProvider"].declined
    by_rule = {k for k, v in declined.items() if "kept on the host by the cost rule" in v}
    assert by_rule == {"mm_fused", "relu", "sig"}, declined  # (the optimizer names the MatMul mm_fused)
    assert "with each symbolic dim at 64 (provider option cost_rule_dim)" in declined["mm_fused"]
    assert on.partition_summary == {"CPUExecutionProvider": 4}
    _check(on, tiny, RNG.standard_normal((3, 8)).astype(np.float32))
    kept = _session(big, "on")
    declined = kept.eps["OpenCLExecutionProvider"].declined
    assert {k for k, v in declined.items() if "cost rule" in v} == {"sig"}  # 64 x 4 values after TopK
    assert kept.partition_summary == {"OpenCLExecutionProvider": 2, "CPUExecutionProvider": 2}
    _check(kept, big, RNG.standard_normal((3, 1024)).astype(np.float32))
    # weighed at a million rows, the tiny MatMul's 128 MFLOP and 128 MB outweigh its launch and copies
    assert "mm_fused" not in _session(tiny, "on", cost_rule_dim="1000000").eps["OpenCLExecutionProvider"].declined
    # the rule off claims the tiny one anyway, with the same results
    off = _session(tiny, "off")
    assert off.partition_summary == {"OpenCLExecutionProvider": 3, "CPUExecutionProvider": 1}
    _check(off, tiny, RNG.standard_normal((5, 8)).astype(np.float32))


def test_the_rule_is_on_by_default_and_the_environment_sets_the_default(opencl, monkeypatch):
    monkeypatch.delenv("ONNXHAL_OPENCL_COST_RULE", raising=False)
    assert _session(_model("n", 8), None).partition_summary == {"CPUExecutionProvider": 4}
    monkeypatch.setenv("ONNXHAL_OPENCL_COST_RULE", "off")
    assert _session(_model("n", 8), None).partition_summary == {"OpenCLExecutionProvider": 3,
                                                                 "CPUExecutionProvider": 1}
    monkeypatch.setenv("ONNXHAL_OPENCL_COST_RULE", "maybe")
    with pytest.raises(InvalidArgument, match=r"cost_rule='maybe' \(or \$ONNXHAL_OPENCL_COST_RULE\)"):
        _session(_model("n", 8), None)


@pytest.mark.parametrize("value", ["0", "-3", "big"])
def test_a_bad_cost_rule_dim_is_an_error_naming_it(opencl, value):
    with pytest.raises(InvalidArgument, match=rf"cost_rule_dim='{value}'.*positive integer"):
        _session(_model("n", 8), "on", cost_rule_dim=value)


def test_a_declined_piece_counts_as_host_for_the_pieces_weighed_after_it():
    from onnxhal import hal

    model = _model(2, 8)
    graph = hal.Graph.from_proto(onnx.shape_inference.infer_shapes(model).graph, {"": 17})
    by_name = {n.name: n for n in graph.nodes}
    claimed = {id(by_name[k]) for k in ("mm", "relu")}
    assert crossings(graph, [by_name["relu"]], claimed) == 1  # h from mm on the device: no copy
    claimed.discard(id(by_name["mm"]))  # mm declined: h now crosses from the host
    assert crossings(graph, [by_name["relu"]], claimed) == 2


def test_crossings_count_values_moving_between_host_and_device():
    from onnxhal import hal

    model = _model(2, 8)
    graph = hal.Graph.from_proto(onnx.shape_inference.infer_shapes(model).graph, {"": 17})
    by_name = {n.name: n for n in graph.nodes}
    claimed = {id(by_name[k]) for k in ("mm", "relu", "sig")}
    # x comes from the host, r goes to TopK on the host; w is a resident constant; h stays inside
    assert crossings(graph, [by_name["mm"], by_name["relu"]], claimed) == 2
    # alone, mm's output h feeds relu, claimed too: no copy for it
    assert crossings(graph, [by_name["mm"]], claimed) == 1
    assert crossings(graph, [by_name["sig"]], claimed) == 2  # t from TopK, y a graph output
    assert host_reason(1e-6, 1, 2, 5e-6, 5e-6) is not None and host_reason(1e-3, 1, 2, 5e-6, 5e-6) is None


def _island_model(source: str = "cast", tail: str = "cast", matmul: bool = False) -> onnx.ModelProto:
    """T5's relative-position shape: integer nodes on the host around float work the EP could claim.
    ``source``: "cast" (the float chain reads a Cast of an int16 input, made on the host: no OpenCL
    kernel takes int16, where rule typed_values would cast int64 on the device) or "input"
    (a float graph input); ``tail``: "cast" (a Cast back to int16 on the host reads the result) or
    "output" (the result is a graph output); ``matmul``: a MatMul by a constant in the chain."""
    nodes, inputs, inits = [], [], [numpy_helper.from_array(np.float32(2.0), "c"),
                                    numpy_helper.from_array(np.float32(3.5), "d")]
    if source == "cast":
        inputs.append(helper.make_tensor_value_info("i", TensorProto.INT16, ["n", 8]))
        nodes.append(helper.make_node("Cast", ["i"], ["f"], name="cast_in", to=TensorProto.FLOAT))
    else:
        inputs.append(helper.make_tensor_value_info("f", TensorProto.FLOAT, ["n", 8]))
    nodes += [helper.make_node("Div", ["f", "c"], ["q"], name="div"),
              helper.make_node("Log", ["q"], ["l"], name="log")]
    last = "l"
    if matmul:
        inits.append(numpy_helper.from_array(RNG.standard_normal((8, 8)).astype(np.float32), "w"))
        nodes.append(helper.make_node("MatMul", ["l", "w"], ["m"], name="mm"))
        last = "m"
    nodes.append(helper.make_node("Mul", [last, "d"], ["s"], name="mul"))
    if tail == "cast":
        nodes.append(helper.make_node("Cast", ["s"], ["y"], name="cast_out", to=TensorProto.INT16))
        out = helper.make_tensor_value_info("y", TensorProto.INT16, ["n", 8])
    else:
        nodes.append(helper.make_node("Identity", ["s"], ["y"], name="ident"))
        out = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8])
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, [out], inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def _island_run(model: onnx.ModelProto, disabled: str) -> tuple[dict, dict, np.ndarray, np.ndarray]:
    name = model.graph.input[0].name
    feeds = {name: (RNG.integers(1, 40, (3, 8)) if name == "i" else RNG.uniform(1, 40, (3, 8))).astype(
        np.int16 if name == "i" else np.float32)}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    sess = onnxhal.InferenceSession(model.SerializeToString(), providers=[
        ("OpenCLExecutionProvider", {"disable_fusions": disabled}), "CPUExecutionProvider"])
    return sess.partition_summary, sess.eps["OpenCLExecutionProvider"].declined, sess.run(None, feeds)[0], want


def test_a_piece_of_a_host_chain_stays_on_the_host(opencl):
    # Div, Log, Mul between two Casts on the host (symbolic dims: the cost rule has no size to weigh).
    model = _island_model()
    on_summary, declined, on, want = _island_run(model, "")
    off_summary, _, off, want_off = _island_run(model, "host_islands")
    assert "OpenCLExecutionProvider" not in on_summary, on_summary
    assert {k for k, v in declined.items() if "rule host_islands" in v} == {"div", "log", "mul"}
    assert off_summary.get("OpenCLExecutionProvider") == 3, off_summary
    np.testing.assert_array_equal(on, want)
    np.testing.assert_array_equal(off, want_off)


@pytest.mark.parametrize("source,tail,matmul", [("input", "cast", False), ("cast", "output", False),
                                                ("cast", "cast", True)])
def test_a_partition_reading_an_input_writing_an_output_or_with_a_gemm_is_claimed(opencl, source, tail, matmul):
    model = _island_model(source, tail, matmul)
    summary, declined, got, want = _island_run(model, "")
    assert summary.get("OpenCLExecutionProvider", 0) >= 3, summary
    assert not any("host_islands" in v for v in declined.values())
    if want.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    else:
        np.testing.assert_array_equal(got, want)


def _gather_reduce_model() -> onnx.ModelProto:
    """x [n, 6] -> four products of two gathered columns, concatenated (skl2onnx's
    PolynomialFeatures): a CPU-only session fuses them into one GatherReduce (fuse_gather_reduce)."""
    pairs = [[0, 1], [2, 3], [4, 5], [1, 4]]
    nodes, inits = [], []
    for i, cols in enumerate(pairs):
        inits.append(numpy_helper.from_array(np.array(cols, np.int64), f"idx{i}"))
        nodes += [helper.make_node("Gather", ["x", f"idx{i}"], [f"g{i}"], name=f"gather{i}", axis=1),
                  helper.make_node("ReduceProd", [f"g{i}"], [f"p{i}"], name=f"prod{i}", axes=[1], keepdims=1)]
    nodes.append(helper.make_node("Concat", [f"p{i}" for i in range(len(pairs))], ["y"], name="concat", axis=1))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def test_a_model_whose_opencl_share_is_declined_runs_as_a_cpu_only_session(opencl):
    model = _gather_reduce_model()
    x = RNG.standard_normal((5, 6)).astype(np.float32)
    cpu = onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    on, off = _session(model, "on"), _session(model, "off")
    assert "GatherReduce" in {n.op_type for n in cpu.graph.nodes}
    # the cost rule declines every node: the graph then gets the CPU EP's own passes too
    assert on.partition_summary == {"CPUExecutionProvider": 1}, on.partition_summary
    assert [n.op_type for n in on.graph.nodes] == [n.op_type for n in cpu.graph.nodes]
    assert all("cost rule" in v for v in on.eps["OpenCLExecutionProvider"].declined.values())
    # with the OpenCL EP's share kept, the passes that make ops only the CPU EP runs stay off
    assert off.partition_summary.get("OpenCLExecutionProvider", 0) >= 5, off.partition_summary
    assert "GatherReduce" not in {n.op_type for n in off.graph.nodes}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    for sess in (cpu, on, off):
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-6, atol=1e-7)
