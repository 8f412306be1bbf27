"""The OpenCL EP's kernels for onnxruntime's com.microsoft SkipLayerNormalization, BiasGelu, FastGelu
and Gelu and ONNX InstanceNormalization (rule ``norm_gelu_ops``; runtime/providers/opencl/norm_lowering.py):
random cases against the CPU EP's kernels and onnxruntime, every input and output form the corpus
uses, and each form the EP declines, declined with its reason."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("pyopencl")

import onnxhal  # noqa: E402
from tests.opencl_support import require_opencl  # noqa: E402

OPENCL_INDEX = require_opencl(module_level=True)
RNG = np.random.default_rng(4747)
OCL = ("OpenCLExecutionProvider", {"cost_rule": "off"})


def _f(*shape: int, scale: float = 1.0, shift: float = 0.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale + shift).astype(np.float32)


def _model(nodes, inputs: dict, weights: dict, outputs: list[str]) -> bytes:
    """Every value declared with the first input's shape: onnx's shape inference knows no com.microsoft
    op, and the EP claims no value of unknown rank (onnxruntime-optimized exports declare them)."""
    shape = next(iter(inputs.values())).shape
    values = [o for n in nodes for o in n.output if o and o not in outputs]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape)
                                           for k, v in inputs.items()],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, shape) for o in outputs],
                              [numpy_helper.from_array(v, k) for k, v in weights.items()],
                              value_info=[helper.make_tensor_value_info(v, TensorProto.FLOAT, shape) for v in values])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return model.SerializeToString()


def _run(data: bytes, inputs: dict, providers) -> tuple[list[np.ndarray], onnxhal.InferenceSession]:
    sess = onnxhal.InferenceSession(data, providers=providers)
    return sess.run(None, inputs), sess


def _check(nodes, inputs: dict, weights: dict, outputs: list[str], atol: float = 2e-5) -> onnxhal.InferenceSession:
    """The OpenCL EP computes every node, within ``atol`` of the CPU EP and of onnxruntime, and equal
    to the CPU EP's result with the rule off (which leaves the nodes to it)."""
    data = _model(nodes, inputs, weights, outputs)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, inputs)
    cpu, _ = _run(data, inputs, ["CPUExecutionProvider"])
    got, sess = _run(data, inputs, [OCL, "CPUExecutionProvider"])
    assert set(sess.partition_summary) == {"OpenCLExecutionProvider"}, sess.eps["OpenCLExecutionProvider"].declined
    off, off_sess = _run(data, inputs, [("OpenCLExecutionProvider", {"cost_rule": "off", "disable_fusions": "norm_gelu_ops"}),
                                        "CPUExecutionProvider"])
    for name, g, c, w, o in zip(outputs, got, cpu, want, off):
        assert g.shape == w.shape, name
        np.testing.assert_allclose(g, w, rtol=0, atol=atol, err_msg=f"{name} vs onnxruntime")
        np.testing.assert_allclose(g, c, rtol=0, atol=atol, err_msg=f"{name} vs the CPU EP")
        np.testing.assert_allclose(o, w, rtol=0, atol=atol, err_msg=f"{name} (rule off) vs onnxruntime")
    return sess


def _declined(nodes, inputs: dict, weights: dict, outputs: list[str]) -> str:
    """The OpenCL EP's reason for declining the graph's only node."""
    sess = onnxhal.InferenceSession(_model(nodes, inputs, weights, outputs), providers=[OCL, "CPUExecutionProvider"])
    assert "OpenCLExecutionProvider" not in sess.partition_summary
    (reason,) = sess.eps["OpenCLExecutionProvider"].declined.values()
    return reason


@pytest.mark.parametrize("skip_shape", ["same", "rows", "one_batch"])
@pytest.mark.parametrize("beta,bias,total", [(True, True, False), (True, False, True), (False, True, True),
                                             (False, False, False)])
def test_skip_layernorm_matches_cpu_and_onnxruntime(opencl, skip_shape, beta, bias, total):
    b, s, h = 3, 5, 24
    x = _f(b, s, h, scale=2.0, shift=0.5)
    skip = {"same": _f(b, s, h), "rows": _f(s, h), "one_batch": _f(1, s, h)}[skip_shape]
    weights = {"gamma": _f(h), "beta": _f(h), "bias": _f(h)}
    ins = ["x", "skip", "gamma", "beta" if beta else "", "bias" if bias else ""]
    outs = ["y", "", "", "sum"] if total else ["y"]
    node = helper.make_node("SkipLayerNormalization", ins, outs, domain="com.microsoft", epsilon=1e-5)
    used = {k: v for k, v in weights.items() if k in ins}
    sess = _check([node], {"x": x, "skip": skip}, used, [o for o in outs if o])
    kernels = [st.kernel_name for p in sess.eps["OpenCLExecutionProvider"].compiled_plans for st in p.steps]
    assert kernels == ["skip_layernorm_rows"]


def test_skip_layernorm_default_epsilon_and_2d_input(opencl):
    x, skip = _f(7, 16, scale=1e-3), _f(7, 16, scale=1e-3)  # tiny variance: epsilon 1e-12 shows
    node = helper.make_node("SkipLayerNormalization", ["x", "skip", "gamma", "beta"], ["y"], domain="com.microsoft")
    _check([node], {"x": x, "skip": skip}, {"gamma": _f(16), "beta": _f(16)}, ["y"], atol=5e-5)


def test_skip_layernorm_forms_without_a_kernel_are_declined_with_the_reason(opencl):
    x, skip = _f(2, 3, 8), _f(2, 3, 8)
    w = {"gamma": _f(8), "beta": _f(8)}
    stats = helper.make_node("SkipLayerNormalization", ["x", "skip", "gamma", "beta"], ["y", "mean", "inv"],
                             domain="com.microsoft")
    assert "mean/inv_std_var outputs" in _declined([stats], {"x": x, "skip": skip}, w, ["y", "mean", "inv"])
    node = helper.make_node("SkipLayerNormalization", ["x", "skip", "gamma", "beta"], ["y"], domain="com.microsoft")
    four = _f(2, 3, 2, 8)
    assert "rank 4 input" in _declined([node], {"x": four, "skip": four}, w, ["y"])
    # a skip that does not repeat over the input's rows (onnxruntime refuses it too)
    assert "does not repeat" in _declined([node], {"x": _f(4, 3, 8), "skip": _f(2, 3, 8)}, w, ["y"])
    assert "rule norm_gelu_ops only (off)" in onnxhal.InferenceSession(
        _model([node], {"x": x, "skip": skip}, w, ["y"]),
        providers=[("OpenCLExecutionProvider", {"cost_rule": "off", "disable_fusions": "norm_gelu_ops"}),
                   "CPUExecutionProvider"]).eps["OpenCLExecutionProvider"].declined[node.name or node.op_type]


@pytest.mark.parametrize("op,bias", [("BiasGelu", True), ("FastGelu", True), ("FastGelu", False), ("Gelu", False)])
def test_gelu_ops_match_cpu_and_onnxruntime(opencl, op, bias):
    x = _f(2, 6, 40, scale=3.0)
    ins = ["x", "bias"] if bias else ["x"]
    node = helper.make_node(op, ins, ["y"], domain="com.microsoft")
    _check([node], {"x": x}, {"bias": _f(40)} if bias else {}, ["y"])


def test_bias_gelu_fuses_with_its_elementwise_neighbours(opencl):
    x, r = _f(4, 32), _f(4, 32)
    nodes = [helper.make_node("Add", ["x", "r"], ["a"]),
             helper.make_node("BiasGelu", ["a", "bias"], ["g"], domain="com.microsoft"),
             helper.make_node("Mul", ["g", "r"], ["y"])]
    sess = _check(nodes, {"x": x, "r": r}, {"bias": _f(32)}, ["y"])
    kernels = [st.kernel_name for p in sess.eps["OpenCLExecutionProvider"].compiled_plans for st in p.steps]
    assert kernels == ["fused_elementwise"]


@pytest.mark.parametrize("shape", [(2, 3, 17), (2, 4, 5, 6), (1, 2, 3, 4, 5)])
def test_instance_norm_matches_cpu_and_onnxruntime(opencl, shape):
    x = _f(*shape, scale=3.0, shift=1.0)
    c = shape[1]
    node = helper.make_node("InstanceNormalization", ["x", "scale", "b"], ["y"], epsilon=1e-3)
    sess = _check([node], {"x": x}, {"scale": _f(c), "b": _f(c)}, ["y"])
    kernels = [st.kernel_name for p in sess.eps["OpenCLExecutionProvider"].compiled_plans for st in p.steps]
    assert kernels == ["instance_norm_rows"]


def test_instance_norm_with_computed_scale_and_default_epsilon(opencl):
    x, scale, b = _f(2, 3, 10), _f(3), _f(3)
    node = helper.make_node("InstanceNormalization", ["x", "scale", "b"], ["y"])
    _check([node], {"x": x, "scale": scale, "b": b}, {}, ["y"])


def test_instance_norm_forms_without_a_kernel_are_declined_with_the_reason(opencl):
    node = helper.make_node("InstanceNormalization", ["x", "scale", "b"], ["y"])
    assert "rank 2 input" in _declined([node], {"x": _f(3, 4)}, {"scale": _f(4), "b": _f(4)}, ["y"])
    assert "is not [3]" in _declined([node], {"x": _f(2, 3, 4)}, {"scale": _f(4), "b": _f(3)}, ["y"])


def test_an_undeclared_contrib_chain_is_claimed_whole(opencl):
    """onnx infers nothing after a com.microsoft node; the loader's stand-in pass (contrib_shapes.py)
    gives the values after it their ranks, so the MatMul and GELUs after a SkipLayerNormalization join
    its partition, a dynamic batch included."""
    from tests.test_contrib_shapes import _model

    model = _model().SerializeToString()
    feeds = {"x": _f(3, 5, 8), "skip": _f(3, 5, 8)}
    got, sess = _run(model, feeds, [OCL, "CPUExecutionProvider"])
    assert set(sess.partition_summary) == {"OpenCLExecutionProvider"}, sess.eps["OpenCLExecutionProvider"].declined
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=0, atol=2e-5)


@pytest.mark.parametrize("rows", [(6,), (2, 3)])
def test_matmul_then_bias_gelu_is_one_gemm_with_its_epilogue(opencl, rows):
    """Rules gemm_bias + gemm_activation: a BiasGelu of a MatMul by a 2-D weight (the optimizer's
    FusedMatMul without bias) and a constant bias is the GEMM's bias and erf GELU; with the rules
    off it is its own launch."""
    x = _f(*rows, 16)
    node, w = helper.make_node("MatMul", ["x", "w"], ["h"]), _f(16, 24)
    nodes = [node, helper.make_node("BiasGelu", ["h", "b"], ["y"], domain="com.microsoft")]
    data = _model(nodes, {"x": x}, {"w": w, "b": _f(24)}, ["y"])
    # the declared shapes are x's: give y and h theirs
    import onnx
    model = onnx.load_from_string(data)
    for v in (*model.graph.output, *model.graph.value_info):
        v.type.tensor_type.shape.dim[-1].dim_value = 24
    data = model.SerializeToString()
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    for disabled, launches in (("", 1), ("gemm_bias", 2)):
        sess = onnxhal.InferenceSession(data, providers=[("OpenCLExecutionProvider", {"cost_rule": "off",
                                                                                   "disable_fusions": disabled}),
                                                         "CPUExecutionProvider"])
        got = sess.run(None, {"x": x})[0]
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)
        plans = sess.eps["OpenCLExecutionProvider"].compiled_plans
        assert sum(p.launches_per_run for p in plans) == launches, [s.kernel_name for p in plans for s in p.steps]
