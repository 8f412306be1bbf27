"""Rule ``typed_values`` (runtime/providers/opencl/op_support.typed_reason): int64, int32 and bool
values computed from the feeds (an attention mask built from ``attention_mask``'s values: Cast,
comparisons, And, Expand, Gather by position indices, Where) are claimed on the device, where the
CPU EP ran them around the partition at every run.

A mask is data: new mask values at one shape must reuse the specialisation (no miss, the mask not
in the signature) and give onnxruntime's outputs, with the rule on and off."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxhal

RNG = np.random.default_rng(4748)
RULE = "typed_values"
EP = "OpenCLExecutionProvider"


@pytest.fixture
def opencl(register):
    pytest.importorskip("pyopencl")
    from tests.opencl_support import require_opencl

    require_opencl()
    register("onnxhal.runtime.providers.opencl", "opencl")


def _mask_model(dims: tuple = ("B", "S")) -> bytes:
    """A TorchScript-style mask chain over ``h = x @ w`` with symbolic [B, S]: the mask cast to bool,
    gathered by position ids (Range over S: a value of the specialisation), expanded to the scores'
    shape, And-ed with a causal mask (from shapes alone) and turned into an additive bias by Where;
    beside it integer arithmetic on the mask (Sub, Cast to float) scaling h, and a bool tree of
    comparisons and logic cast to float."""
    f, i64, b = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
    c = {"w": RNG.standard_normal((8, 8)).astype(np.float32), "zero": np.array(0, np.int64),
         "one": np.array(1, np.int64), "five": np.array(5, np.int64), "ax0": np.array([0], np.int64),
         "ax1": np.array([1], np.int64), "ax12": np.array([1, 2], np.int64), "axm1": np.array([-1], np.int64),
         "big": np.array(-1e4, np.float32), "fzero": np.array(0.0, np.float32)}
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Transpose", ["h"], ["hT"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["h", "hT"], ["scores"]),
        helper.make_node("Unsqueeze", ["scores", "ax1"], ["s4"]),
        # position ids and a causal mask, from the shape of the ids alone
        helper.make_node("Shape", ["mask"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["seq"], axis=0),
        helper.make_node("Range", ["zero", "seq", "one"], ["pos"]),
        helper.make_node("Unsqueeze", ["pos", "ax0"], ["row"]),
        helper.make_node("Unsqueeze", ["pos", "ax1"], ["col"]),
        helper.make_node("LessOrEqual", ["row", "col"], ["causal"]),
        # the mask's values: data
        helper.make_node("Cast", ["mask"], ["mb"], to=b),
        helper.make_node("Gather", ["mb", "pos"], ["mg"], axis=1),
        helper.make_node("Unsqueeze", ["mg", "ax12"], ["m4"]),
        helper.make_node("Shape", ["s4"], ["s4shape"]),
        helper.make_node("Expand", ["m4", "s4shape"], ["mx"]),
        helper.make_node("And", ["causal", "mx"], ["keep"]),
        helper.make_node("Where", ["keep", "fzero", "big"], ["bias"]),
        helper.make_node("Add", ["s4", "bias"], ["y1"]),
        helper.make_node("Sub", ["one", "mask"], ["inv"]),
        helper.make_node("Cast", ["inv"], ["invf"], to=f),
        helper.make_node("Unsqueeze", ["invf", "axm1"], ["inv3"]),
        helper.make_node("Mul", ["h", "inv3"], ["y2"]),
        helper.make_node("Equal", ["mask", "zero"], ["eq"]),
        helper.make_node("Not", ["eq"], ["ne"]),
        helper.make_node("Greater", ["mask", "five"], ["gt"]),
        helper.make_node("Or", ["ne", "gt"], ["o"]),
        helper.make_node("Less", ["mask", "one"], ["lt"]),
        helper.make_node("Xor", ["o", "lt"], ["xo"]),
        helper.make_node("Cast", ["xo"], ["xi"], to=TensorProto.INT32),
        helper.make_node("Cast", ["xi"], ["xf"], to=f),
        helper.make_node("Unsqueeze", ["xf", "axm1"], ["x3"]),
        helper.make_node("Mul", ["h", "x3"], ["y3"]),
    ]
    graph = helper.make_graph(nodes, "mask", [helper.make_tensor_value_info("x", f, [*dims, 8]),
                                              helper.make_tensor_value_info("mask", i64, list(dims))],
                              [helper.make_tensor_value_info(n, f, None) for n in ("y1", "y2", "y3")],
                              [numpy_helper.from_array(v, k) for k, v in c.items()])
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    model.ir_version = 10
    return model.SerializeToString()


def _feeds(b: int, s: int) -> dict:
    return {"x": RNG.standard_normal((b, s, 8)).astype(np.float32),
            "mask": RNG.integers(0, 8, (b, s)).astype(np.int64)}


def test_a_mask_chain_runs_on_the_device_as_onnxruntime(opencl):
    """With the rule every node is on the device; the outputs match onnxruntime's on new masks at
    one shape and on other shapes, with the rule on and off; new masks reuse the specialisation."""
    data = _mask_model()
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    sessions = {rule: onnxhal.InferenceSession(data, providers=[(EP, {"disable_fusions": off}), "CPUExecutionProvider"])
                for rule, off in (("on", ""), ("off", RULE))}
    host = {rule: s.partition_summary.get("CPUExecutionProvider", 0) for rule, s in sessions.items()}
    assert host["on"] == 0 and host["off"] > 0, host
    declined = sessions["off"].eps[EP].declined
    assert "rule typed_values is off" in declined["Where"] or "typed_values" in str(declined), declined
    for feeds in [_feeds(2, 6), _feeds(2, 6), _feeds(1, 3)]:
        want = ref.run(None, feeds)
        for rule, s in sessions.items():
            for w, g in zip(want, s.run(None, feeds)):
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-4, err_msg=rule)
    (info,) = sessions["on"].eps[EP].dynamic_partitions.values()
    misses, cached = info.stats.misses, info.cached_signatures
    for _ in range(2):
        feeds = _feeds(2, 6)
        got = sessions["on"].run(None, feeds)
        for w, g in zip(ref.run(None, feeds), got):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-4)
    assert info.stats.misses == misses and info.cached_signatures == cached, info.stats
    assert info.stats.host_runs == 0, info.stats.host_reasons
    assert info.graph.input_names.index("mask") not in info.params


def test_a_simulated_device_without_integers_declines_the_mask_chain():
    """generic-gpu computes float32/float16 only: the int64 and bool nodes are declined with that
    reason (the profile's rules come before the kernels'), and the outputs are onnxruntime's."""
    from tests.conftest import simulated_or_skip

    data = _mask_model()
    feeds = _feeds(2, 6)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    with simulated_or_skip("generic-gpu") as sims:
        (device,) = sims.values()
        so = onnxhal.SessionOptions()
        so.add_provider_for_devices([device])
        sess = onnxhal.InferenceSession(data, so)
        for w, g in zip(want, sess.run(None, feeds)):
            np.testing.assert_allclose(g, w, rtol=2e-2, atol=2e-1)
        declined = sess.eps[device.ep_name].declined
        sub = next(n for n in sess.assigned_nodes() if n.op_type == "Sub")  # generic-gpu has Sub, no Cast
        assert sub.ep_name == "CPUExecutionProvider"
        assert "does not compute int64" in declined[sub.name or sub.op_type], declined


def test_an_expand_read_only_by_fused_trees_gets_no_launch(opencl):
    """Rule expand_elementwise: the expanded bool mask is read by the And/Where/Add tree through
    broadcast strides of its input: one launch fewer than with the rule off, onnxruntime's outputs."""
    data = _mask_model()
    feeds = _feeds(2, 6)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    launches = {}
    for off in ("", "expand_elementwise"):
        s = onnxhal.InferenceSession(data, providers=[(EP, {"disable_fusions": off}), "CPUExecutionProvider"])
        for w, g in zip(want, s.run(None, feeds)):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-4, err_msg=off)
        (info,) = s.eps[EP].dynamic_partitions.values()
        launches[off] = info.cached_plans[-1].launches_per_run
    assert launches[""] == launches["expand_elementwise"] - 1, launches


def test_a_small_mask_of_fixed_shape_never_keys_a_specialisation(opencl):
    """With fixed dims the mask [2, 6] is as small as a shape value; it is data all the same: new
    masks reuse the one plan (no host run, no new signature) and give onnxruntime's outputs."""
    data = _mask_model((2, 6))
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    s = onnxhal.InferenceSession(data, providers=[EP, "CPUExecutionProvider"])
    assert s.partition_summary.get("CPUExecutionProvider", 0) == 0, s.partition_summary
    for _ in range(3):
        feeds = _feeds(2, 6)
        for w, g in zip(ref.run(None, feeds), s.run(None, feeds)):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-4)
    for info in s.eps[EP].dynamic_partitions.values():
        assert info.stats.misses == 1 and info.stats.host_runs == 0, info.stats
        assert info.graph.input_names.index("mask") not in info.params
