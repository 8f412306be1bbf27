"""The OpenCL EP's kernels for opset 23's decoder ops (rule ``opset23_ops``;
runtime/providers/opencl/opset23_lowering.py): Sin, Cos, RMSNormalization and RotaryEmbedding on
random inputs over their attributes against the CPU EP, and equal to it with the rule off; each form
the EP declines is declined with its reason."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("pyopencl")

import onnxhal  # noqa: E402
from tests.opencl_support import require_opencl  # noqa: E402

OPENCL_INDEX = require_opencl(module_level=True)
RNG = np.random.default_rng(2323)
OCL = ("OpenCLExecutionProvider", {"cost_rule": "off"})
OFF = ("OpenCLExecutionProvider", {"cost_rule": "off", "disable_fusions": "opset23_ops"})


def _f(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _model(node, inputs: dict, weights: dict, out_shape) -> bytes:
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape)
                                            for k, v in inputs.items()],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
                              [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 11
    return model.SerializeToString()


def _check(node, inputs: dict, weights: dict | None = None, atol: float = 2e-5) -> None:
    """The OpenCL EP computes the node, within ``atol`` of the CPU EP; with the rule off the CPU EP
    computes it."""
    out_shape = next(iter(inputs.values())).shape
    data = _model(node, inputs, weights or {}, out_shape)
    (want,) = onnxhal.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, inputs)
    sess = onnxhal.InferenceSession(data, providers=[OCL, "CPUExecutionProvider"])
    assert set(sess.partition_summary) == {"OpenCLExecutionProvider"}, sess.eps["OpenCLExecutionProvider"].declined
    (got,) = sess.run(None, inputs)
    # a kernel that fails to build runs its signature on the host: the device must have computed it
    for info in sess.eps["OpenCLExecutionProvider"].dynamic_partitions.values():
        assert not info.stats.host_runs, info.stats.host_reasons
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=atol)
    off = onnxhal.InferenceSession(data, providers=[OFF, "CPUExecutionProvider"])
    assert "OpenCLExecutionProvider" not in off.partition_summary
    np.testing.assert_array_equal(off.run(None, inputs)[0], want)


def _declined(node, inputs: dict, weights: dict | None = None) -> str:
    data = _model(node, inputs, weights or {}, next(iter(inputs.values())).shape)
    sess = onnxhal.InferenceSession(data, providers=[OCL, "CPUExecutionProvider"])
    assert "OpenCLExecutionProvider" not in sess.partition_summary
    (reason,) = sess.eps["OpenCLExecutionProvider"].declined.values()
    return reason


@pytest.mark.parametrize("op", ["Sin", "Cos"])
def test_sin_and_cos_match_the_cpu_ep(op):
    x = (_f(3, 7, 33) * 20).astype(np.float32)  # past a few periods, where argument reduction matters
    _check(helper.make_node(op, ["x"], ["y"]), {"x": x}, atol=1e-5)


@pytest.mark.parametrize(("shape", "axis", "scale_shape"), [
    ((2, 5, 32), -1, (32,)), ((2, 4, 3, 8), 3, (1, 8)), ((2, 3, 4, 5), 2, (4, 5)), ((6, 16), 0, (6, 16))])
def test_rms_normalization_matches_the_cpu_ep(shape, axis, scale_shape):
    node = helper.make_node("RMSNormalization", ["x", "scale"], ["y"], axis=axis, epsilon=1e-6)
    _check(node, {"x": _f(*shape)}, {"scale": _f(*scale_shape)})


def test_rms_normalization_with_a_runtime_scale_matches_the_cpu_ep():
    _check(helper.make_node("RMSNormalization", ["x", "scale"], ["y"]), {"x": _f(3, 16), "scale": _f(16)})


def test_rms_normalization_declines_a_broadcast_scale_and_another_stash_type():
    x = {"x": _f(2, 3, 8)}
    assert "not of the normalized shape" in _declined(
        helper.make_node("RMSNormalization", ["x", "scale"], ["y"]), x, {"scale": _f(1)})
    assert "stash_type 0" in _declined(
        helper.make_node("RMSNormalization", ["x", "scale"], ["y"], stash_type=0), x, {"scale": _f(8)})


@pytest.mark.parametrize(("interleaved", "rotary_dim", "cache_batch"), [(0, 0, 1), (1, 0, 2), (0, 4, 2), (1, 6, 1)])
def test_rotary_embedding_on_4d_input_matches_the_cpu_ep(interleaved, rotary_dim, cache_batch):
    b, n, s, h = 2, 3, 5, 8
    half = (rotary_dim or h) // 2
    node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin"], ["y"], interleaved=interleaved,
                            rotary_embedding_dim=rotary_dim)
    _check(node, {"x": _f(b, n, s, h), "cos": _f(cache_batch, s, half), "sin": _f(cache_batch, s, half)})


@pytest.mark.parametrize("interleaved", [0, 1])
def test_rotary_embedding_on_3d_input_with_num_heads_matches_the_cpu_ep(interleaved):
    b, s, n, h = 2, 4, 3, 6
    node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin"], ["y"], interleaved=interleaved, num_heads=n)
    _check(node, {"x": _f(b, s, n * h), "cos": _f(1, s, h // 2), "sin": _f(1, s, h // 2)})


def test_rotary_embedding_declines_position_ids():
    node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin", "pos"], ["y"])
    data = {"x": _f(1, 2, 3, 4)}
    weights = {"cos": _f(8, 2), "sin": _f(8, 2), "pos": np.array([[0, 1, 2]], np.int64)}
    assert "position_ids" in _declined(node, data, weights)


def _attention_model(attrs: dict, inputs: dict, n_out: int) -> bytes:
    """One ai.onnx Attention node over ``inputs`` (in input order; "" skips an optional one)."""
    names = list(inputs)
    outs = ["y", "present_key", "present_value", "scores"][:n_out]
    node = helper.make_node("Attention", names, outs, **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for k, v in inputs.items() if k],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in node.output])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 11
    return model.SerializeToString()


def _check_attention(attrs: dict, inputs: dict, n_out: int = 1) -> None:
    """As ``_check``: every output of the OpenCL EP's Attention within 2e-5 of the CPU EP's, and the
    CPU EP's with rule opset23_ops off."""
    data = _attention_model(attrs, inputs, n_out)
    feeds = {k: v for k, v in inputs.items() if k}
    want = onnxhal.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    sess = onnxhal.InferenceSession(data, providers=[OCL, "CPUExecutionProvider"])
    assert set(sess.partition_summary) == {"OpenCLExecutionProvider"}, sess.eps["OpenCLExecutionProvider"].declined
    got = sess.run(None, feeds)
    for info in sess.eps["OpenCLExecutionProvider"].dynamic_partitions.values():
        assert not info.stats.host_runs, info.stats.host_reasons
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=0, atol=2e-5)
    off = onnxhal.InferenceSession(data, providers=[OFF, "CPUExecutionProvider"])
    assert "OpenCLExecutionProvider" not in off.partition_summary
    for g, w in zip(off.run(None, feeds), want, strict=True):
        np.testing.assert_array_equal(g, w)


def _bool_mask(*shape: int) -> np.ndarray:
    mask = RNG.random(shape) < 0.7
    mask[..., 0, :] = False  # a row with every key masked: zeros, as the CPU EP
    return mask


@pytest.mark.parametrize(("heads", "kv_heads", "mask", "causal"), [
    (4, 4, None, 0), (4, 2, "bool", 0), (4, 1, "float", 0), (6, 3, None, 1), (4, 2, "bool", 1),
    (2, 2, "float_short", 0)])
def test_attention_4d_matches_the_cpu_ep(heads, kv_heads, mask, causal):
    b, s, t, d = 2, 5, 5, 8
    inputs = {"q": _f(b, heads, s, d), "k": _f(b, kv_heads, t, d), "v": _f(b, kv_heads, t, 12)}
    if mask == "bool":
        inputs["mask"] = _bool_mask(b, 1, s, t)
    elif mask == "float":
        inputs["mask"] = np.where(_bool_mask(s, t), 0, -np.inf).astype(np.float32) + _f(s, t)
    elif mask == "float_short":  # fewer keys than T: the rest masked
        inputs["mask"] = _f(1, heads, 1, t - 2)
    _check_attention({"is_causal": causal}, inputs)


@pytest.mark.parametrize(("heads", "kv_heads", "mask"), [(4, 2, "bool"), (3, 3, None)])
def test_attention_3d_with_num_heads_and_scale_matches_the_cpu_ep(heads, kv_heads, mask):
    b, s, d = 2, 4, 6
    inputs = {"q": _f(b, s, heads * d), "k": _f(b, s + 1, kv_heads * d), "v": _f(b, s + 1, kv_heads * d)}
    if mask:
        inputs["mask"] = _bool_mask(s, s + 1)
    _check_attention({"q_num_heads": heads, "kv_num_heads": kv_heads, "scale": 0.3}, inputs)


@pytest.mark.parametrize(("rank", "causal"), [(4, 0), (4, 1), (3, 1)])
def test_attention_with_past_and_presents_matches_the_cpu_ep(rank, causal):
    b, h, kvh, s, p, d = 1, 4, 2, 3, 4, 8
    if rank == 4:
        inputs = {"q": _f(b, h, s, d), "k": _f(b, kvh, s, d), "v": _f(b, kvh, s, d)}
        attrs = {"is_causal": causal}
    else:
        inputs = {"q": _f(b, s, h * d), "k": _f(b, s, kvh * d), "v": _f(b, s, kvh * d)}
        attrs = {"is_causal": causal, "q_num_heads": h, "kv_num_heads": kvh}
    inputs.update({"mask": _bool_mask(b, 1, s, p + s), "past_key": _f(b, kvh, p, d), "past_value": _f(b, kvh, p, d)})
    _check_attention(attrs, inputs, n_out=3)


def test_attention_declines_softcap_precision_and_the_scores_output():
    inputs = {"q": _f(1, 2, 3, 4), "k": _f(1, 2, 3, 4), "v": _f(1, 2, 3, 4)}

    def reason(attrs: dict, n_out: int = 1) -> str:
        data = _attention_model(attrs, inputs, n_out)
        sess = onnxhal.InferenceSession(data, providers=[OCL, "CPUExecutionProvider"])
        assert "OpenCLExecutionProvider" not in sess.partition_summary
        (why,) = sess.eps["OpenCLExecutionProvider"].declined.values()
        return why
    assert "softcap" in reason({"softcap": 5.0})
    assert "softmax_precision 11" in reason({"softmax_precision": 11})
    assert "scores output" in reason({}, n_out=4)
    inputs["mask"] = np.zeros((), np.float32)
    assert "mask of rank 0" in reason({})
