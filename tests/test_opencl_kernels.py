"""Each OpenCL EP kernel against numpy (or onnx.reference, itself numpy), through the EP contract:
get_capability -> compile -> create_state -> compute on the EP's stream. Tiny shapes: the cost is
program builds, one per kernel family or fused expression, cached in memory and on disk."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import onnx.reference
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("pyopencl")

import onnxhal  # noqa: E402
from onnxhal import hal  # noqa: E402
from onnxhal.runtime.providers.opencl import create_ep_factories  # noqa: E402
from tests.opencl_support import require_opencl  # noqa: E402

OPENCL_INDEX = require_opencl(module_level=True)

HW = hal.OrtHardwareDevice(hal.OrtHardwareDeviceType.CPU, "AMD", 0x1022, 0, {"opencl_devices": OPENCL_INDEX})
RNG = np.random.default_rng(1234)


@pytest.fixture(scope="module")
def ocl():
    factory = create_ep_factories("opencl", hal.EpApi(), logging.getLogger("test"))[0]
    (ep_device,) = factory.get_supported_devices([HW])
    ep = factory.create_ep([HW], [ep_device.ep_metadata], None, logging.getLogger("test"))
    mem = ep_device.memory_info(hal.OrtDeviceMemoryType.DEFAULT)
    return factory, ep, mem


def run_on_opencl(ocl, nodes, inputs: dict, initializers: dict | None = None, opset: int = 17,
                  expect_groups: int = 1):
    """Run a graph through the OpenCL EP; returns (outputs, reference outputs, plans)."""
    factory, ep, mem = ocl
    initializers = initializers or {}
    model = helper.make_model(helper.make_graph(
        nodes, "t", [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                     for k, v in inputs.items()],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in nodes[-1].output],
        [numpy_helper.from_array(v, k) for k, v in initializers.items()]),
        opset_imports=[helper.make_opsetid("", opset)])
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    graph = hal.Graph.from_proto(model.graph, {"": opset})
    info = hal.EpGraphSupportInfo(graph)
    ep.get_capability(graph, info)
    assert len(info.fused_groups) == expect_groups, ep.declined
    assert sum(len(g) for g, _ in info.fused_groups) == len(nodes), ep.declined
    fgs = [info.filtered_graph(g, options) for g, options in info.fused_groups]
    (cinfo,) = ep.compile(fgs, [None] * len(fgs))
    state = cinfo.create_state(None)
    alloc, dt = factory.create_allocator(mem), factory.create_data_transfer()
    stream = factory.create_sync_stream_for_device(mem.memory_device)
    start = alloc.stats()["InUse"]
    dev_inputs = []
    for i, vi in enumerate(fgs[0].inputs):
        arr = inputs[vi.name]
        if i in cinfo.host_inputs:  # the EP asked for this input in host memory (runtime Gather indices)
            dev_inputs.append(arr)
            continue
        t = alloc.tensor(arr.shape, arr.dtype)
        dt.copy_tensors([arr], [t], [stream])
        dev_inputs.append(t)
    ctx = hal.KernelContext(dev_inputs, len(fgs[0].outputs), stream)
    outs = cinfo.compute(state, ctx)
    assert ctx.outputs == outs
    host = [np.empty(o.shape, np.float32) for o in outs]
    dt.copy_tensors(outs, host, [stream] * len(outs))
    stream.finish()
    for t in (*dev_inputs, *outs):
        if not isinstance(t, np.ndarray):  # host inputs are the caller's
            alloc.free(t.buffer)
    cinfo.release_state(state)
    assert alloc.stats()["InUse"] == start
    ref = onnx.reference.ReferenceEvaluator(model).run(None, inputs)
    return host, ref, state.plan


def f32(*shape, scale=1.0):
    return np.asarray(RNG.standard_normal(shape) * scale, dtype=np.float32)


def check(ocl, nodes, inputs, inits=None, rtol=1e-4, atol=1e-4, **kw):
    got, ref, plan = run_on_opencl(ocl, nodes, inputs, inits, **kw)
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, rtol=rtol, atol=atol)
    return plan


# -- GEMM family -------------------------------------------------------------------------------
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 5, 17), (13, 33, 40)])
def test_matmul_2d_against_numpy(ocl, m, k, n):
    a, b = f32(m, k), f32(k, n)
    got, _, _ = run_on_opencl(ocl, [helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": a, "b": b})
    np.testing.assert_allclose(got[0], a @ b, rtol=1e-4, atol=1e-4)


def test_matmul_batched_and_constant_weight(ocl):
    a, b = f32(2, 3, 5, 7), f32(2, 3, 7, 9)
    got, _, _ = run_on_opencl(ocl, [helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": a, "b": b})
    np.testing.assert_allclose(got[0], a @ b, rtol=1e-4, atol=1e-4)
    w = f32(7, 11)
    got, _, plan = run_on_opencl(ocl, [helper.make_node("MatMul", ["a", "w"], ["y"])], {"a": a[0]}, {"w": w})
    np.testing.assert_allclose(got[0], a[0] @ w, rtol=1e-4, atol=1e-4)
    assert [s.kernel_name for s in plan.init_steps] == ["pack_b"]  # weights packed once, not per run


@pytest.mark.parametrize("trans_a,trans_b,c_shape", [(0, 0, (9,)), (1, 1, (5, 9)), (0, 1, (5, 1)), (1, 0, ())])
def test_gemm_transposes_and_bias(ocl, trans_a, trans_b, c_shape):
    a = f32(*((6, 5) if trans_a else (5, 6)))
    b = f32(*((9, 6) if trans_b else (6, 9)))
    c = f32(*c_shape)
    node = helper.make_node("Gemm", ["a", "b", "c"], ["y"], transA=trans_a, transB=trans_b, alpha=0.5, beta=2.0)
    got, _, _ = run_on_opencl(ocl, [node], {"a": a, "b": b, "c": c})
    expect = 0.5 * ((a.T if trans_a else a) @ (b.T if trans_b else b)) + 2.0 * c
    np.testing.assert_allclose(got[0], expect, rtol=1e-4, atol=1e-4)


def test_gemm_relu_folds_into_epilogue(ocl):
    a, w = f32(4, 8), f32(8, 6)
    plan = check(ocl, [helper.make_node("Gemm", ["a", "w"], ["g"]), helper.make_node("Relu", ["g"], ["y"])],
                 {"a": a}, {"w": w})
    assert [s.kernel_name for s in plan.steps] == ["gemm_rowmajor_a"]  # A read in place, Relu in the epilogue


@pytest.mark.parametrize("group,cout,kernel,stride,pads,dil", [
    (1, 8, 3, 1, [1, 1, 1, 1], 1),
    (2, 8, 3, 2, [0, 1, 1, 0], 1),
    (4, 4, 3, 1, [1, 1, 1, 1], 2),   # depthwise: direct kernel
    (1, 6, 1, 1, [0, 0, 0, 0], 1),
])
def test_conv2d(ocl, group, cout, kernel, stride, pads, dil):
    x, w, b = f32(2, 4, 7, 6), f32(cout, 4 // group, kernel, kernel), f32(cout)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], group=group, strides=[stride] * 2, pads=pads,
                            dilations=[dil] * 2)
    check(ocl, [node], {"x": x}, {"w": w, "b": b})


def test_conv1d_same_upper_with_relu(ocl):
    x, w = f32(1, 3, 10), f32(6, 3, 4)
    check(ocl, [helper.make_node("Conv", ["x", "w"], ["c"], auto_pad="SAME_UPPER"),
                helper.make_node("Relu", ["c"], ["y"])], {"x": x}, {"w": w})


# -- elementwise -------------------------------------------------------------------------------
def test_binary_broadcasting_fuses_into_one_kernel(ocl):
    x, y, z = f32(2, 3, 4), f32(3, 1), f32(1, 1, 4)
    s = np.array(0.5, np.float32)
    nodes = [helper.make_node("Add", ["x", "y"], ["a"]), helper.make_node("Mul", ["a", "z"], ["b"]),
             helper.make_node("Sub", ["b", "s"], ["c"]), helper.make_node("Div", ["c", "x"], ["d"]),
             helper.make_node("Max", ["d", "y"], ["e"])]
    plan = check(ocl, nodes, {"x": x + 3.0, "y": y, "z": z}, {"s": s}, rtol=1e-3)
    assert [s.kernel_name for s in plan.steps] == ["fused_elementwise"]


def test_activations_fused_chain(ocl):
    x = f32(3, 17, scale=3.0)
    nodes = [helper.make_node("Sigmoid", ["x"], ["a"]), helper.make_node("Tanh", ["x"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["c"]), helper.make_node("Erf", ["c"], ["d"]),
             helper.make_node("LeakyRelu", ["x"], ["e"], alpha=0.1), helper.make_node("Mul", ["d", "e"], ["f"]),
             helper.make_node("Clip", ["f", "lo", "hi"], ["g"]), helper.make_node("Exp", ["g"], ["h"]),
             helper.make_node("Abs", ["h"], ["i"]), helper.make_node("Sqrt", ["i"], ["j"]),
             helper.make_node("Neg", ["j"], ["k"]), helper.make_node("Elu", ["k"], ["y"])]
    plan = check(ocl, nodes, {"x": x}, {"lo": np.array(-1.5, np.float32), "hi": np.array(2.0, np.float32)},
                 rtol=1e-3, atol=1e-5)
    assert len(plan.steps) == 1


def test_gelu_and_hard_activations(ocl):
    x = f32(4, 9, scale=3.0)
    nodes = [helper.make_node("Gelu", ["x"], ["a"]), helper.make_node("HardSigmoid", ["a"], ["b"]),
             helper.make_node("HardSwish", ["b"], ["c"]), helper.make_node("Softplus", ["c"], ["d"]),
             helper.make_node("Relu", ["d"], ["y"])]
    check(ocl, nodes, {"x": x}, opset=20, rtol=1e-3)


def test_batchnorm_then_relu(ocl):
    x = f32(2, 3, 4, 5)
    inits = {"s": f32(3), "b": f32(3), "m": f32(3), "v": np.abs(f32(3)) + 0.5}
    plan = check(ocl, [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["n"], epsilon=1e-3),
                       helper.make_node("Relu", ["n"], ["y"])], {"x": x}, inits)
    assert len(plan.steps) == 1


# -- pooling, normalisation, softmax, reductions -----------------------------------------------
@pytest.mark.parametrize("op,attrs", [
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("AveragePool", dict(kernel_shape=[2, 3], strides=[1, 2], pads=[0, 1, 1, 1], count_include_pad=1)),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("MaxPool", dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)),
])
def test_pooling(ocl, op, attrs):
    check(ocl, [helper.make_node(op, ["x"], ["y"], **attrs)], {"x": f32(2, 3, 7, 7)})


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pooling(ocl, op):
    check(ocl, [helper.make_node(op, ["x"], ["y"])], {"x": f32(2, 5, 4, 3)})


@pytest.mark.parametrize("op,axis", [("Softmax", -1), ("Softmax", 1), ("LogSoftmax", -1)])
def test_softmax(ocl, op, axis):
    check(ocl, [helper.make_node(op, ["x"], ["y"], axis=axis)], {"x": f32(2, 5, 6, scale=3.0)}, rtol=1e-3)


def test_layernorm(ocl):
    x, g, b = f32(2, 3, 16), f32(16), f32(16)
    check(ocl, [helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], epsilon=1e-5)], {"x": x},
          {"g": g, "b": b}, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("op,axes,keep", [("ReduceSum", [1], 1), ("ReduceMean", [2, 3], 0), ("ReduceMax", [-1], 1),
                                          ("ReduceMin", [0], 0), ("ReduceSumSquare", None, 1),
                                          ("ReduceL2", [1, 2], 1), ("ReduceLogSumExp", [3], 0)])
def test_reductions(ocl, op, axes, keep):
    x = f32(2, 3, 4, 5)
    inputs, inits = ["x"], {}
    if axes is not None:
        inputs.append("axes")
        inits["axes"] = np.array(axes, np.int64)
    check(ocl, [helper.make_node(op, inputs, ["y"], keepdims=keep)], {"x": x}, inits, opset=18, rtol=1e-3)


# -- data movement and views -------------------------------------------------------------------
def test_transpose_concat_slice_gather(ocl):
    x, y = f32(2, 3, 4), f32(2, 5, 4)
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
             helper.make_node("Transpose", ["t"], ["u"], perm=[0, 2, 1]),
             helper.make_node("Concat", ["u", "y"], ["c"], axis=1),
             helper.make_node("Slice", ["c", "st", "en", "ax", "sp"], ["s"]),
             helper.make_node("Gather", ["s", "idx"], ["y_out"], axis=1)]
    inits = {"st": np.array([7, 0], np.int64), "en": np.array([0, 4], np.int64), "ax": np.array([1, 2], np.int64),
             "sp": np.array([-2, 2], np.int64), "idx": np.array([[0, -1], [1, 2]], np.int64)}
    check(ocl, nodes, {"x": x, "y": y}, inits)


def test_gather_with_runtime_indices_and_expand(ocl):
    data, idx = f32(6, 4), np.array([5, 0, 2], np.int64)
    nodes = [helper.make_node("Gather", ["d", "i"], ["g"], axis=0),
             helper.make_node("Expand", ["g", "shape"], ["y"])]
    check(ocl, nodes, {"d": data, "i": idx}, {"shape": np.array([2, 3, 4], np.int64)})


def test_gather_runtime_index_out_of_range_is_an_error_and_the_session_stays_usable(opencl_devices):
    """The kernel cannot raise, so the EP takes runtime indices in host memory and checks them
    (a kernel would write zeros for an out-of-range index: a silent wrong output)."""
    nodes = [helper.make_node("Gather", ["d", "i"], ["g"], axis=0), helper.make_node("Relu", ["g"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [
        helper.make_tensor_value_info("d", TensorProto.FLOAT, [6, 4]), helper.make_tensor_value_info("i", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])]), opset_imports=[helper.make_opsetid("", 13)])
    sess = onnxhal.InferenceSession(model.SerializeToString(), providers=["OpenCLExecutionProvider", "CPUExecutionProvider"])
    assert sess.partition_summary == {"OpenCLExecutionProvider": 2}
    d = np.arange(24, dtype=np.float32).reshape(6, 4)
    with pytest.raises(hal.errors.InvalidArgument, match=r"index 6 in 'i' is out of range for an axis of length 6"):
        sess.run(None, {"d": d, "i": np.array([5, 6, 2])})
    np.testing.assert_array_equal(sess.run(None, {"d": d, "i": np.array([5, -6, 2])})[0], d[[5, 0, 2]])


def test_reshape_and_flatten_are_views(ocl):
    x = f32(2, 3, 4)
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("Relu", ["r"], ["a"]),
             helper.make_node("Flatten", ["a"], ["f"], axis=1), helper.make_node("Unsqueeze", ["f", "ax"], ["u"]),
             helper.make_node("Squeeze", ["u", "ax"], ["s"]), helper.make_node("Sigmoid", ["s"], ["y"])]
    plan = check(ocl, nodes, {"x": x}, {"shape": np.array([4, 6], np.int64), "ax": np.array([0], np.int64)})
    assert [s.kernel_name for s in plan.steps] == ["fused_elementwise", "fused_elementwise"]
    assert plan.aliases  # the views share buffers, no kernel


# -- epilogues and the runtime optimizer's com.onnxhal ops -------------------------------------
def _conv_ref(x, w, b, **attrs):
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)], "ref",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, a.shape) for n, a in (("x", x), ("w", w), ("b", b))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]), opset_imports=[helper.make_opsetid("", 17)])
    return onnx.reference.ReferenceEvaluator(model).run(None, {"x": x, "w": w, "b": b})[0]


def _run_fused_domain(ocl, node, inputs, inits, out_shape):
    factory, ep, mem = ocl
    model = helper.make_model(helper.make_graph(
        [node], "t", [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape) for k, v in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.onnxhal", 1)])
    graph = hal.Graph.from_proto(model.graph, {"": 17, "com.onnxhal": 1})
    info = hal.EpGraphSupportInfo(graph)
    ep.get_capability(graph, info)
    assert len(info.fused_groups) == 1, ep.declined
    fg = info.filtered_graph(*info.fused_groups[0])
    (cinfo,) = ep.compile([fg], [None])
    state = cinfo.create_state(None)
    alloc, dt = factory.create_allocator(mem), factory.create_data_transfer()
    dev = [alloc.tensor(inputs[v.name].shape, np.float32) for v in fg.inputs]
    dt.copy_tensors([inputs[v.name] for v in fg.inputs], dev)
    (out,) = cinfo.compute(state, hal.KernelContext(dev, 1, None))
    y = np.empty(out.shape, np.float32)
    dt.copy_tensors([out], [y])
    for t in (*dev, out):
        alloc.free(t.buffer)
    return y, state.plan


@pytest.mark.parametrize("cout,group,act", [(8, 1, "LeakyRelu"), (4, 4, "LeakyRelu"), (8, 1, "Relu"), (8, 1, "")])
def test_fused_conv_residual_and_activation(ocl, cout, group, act):
    """36 output columns: two full 16-column panels (vector epilogue for Relu/none) and a partial one."""
    x, w, b, z = f32(1, 4, 6, 6), f32(cout, 4 // group, 3, 3), f32(cout), f32(1, cout, 6, 6)
    params = {"activation_params": [0.2]} if act == "LeakyRelu" else {}
    node = helper.make_node("FusedConv", ["x", "w", "b", "z"], ["y"], domain="com.onnxhal", pads=[1, 1, 1, 1],
                            group=group, activation=act, **params)
    y, plan = _run_fused_domain(ocl, node, {"x": x, "z": z}, {"w": w, "b": b}, [1, cout, 6, 6])
    v = _conv_ref(x, w, b, pads=[1, 1, 1, 1], group=group) + z
    expect = np.where(v >= 0, v, 0.2 * v) if act == "LeakyRelu" else np.maximum(v, 0) if act == "Relu" else v
    np.testing.assert_allclose(y, expect, rtol=1e-4, atol=1e-4)
    assert "fused_elementwise" not in [s.kernel_name for s in plan.steps]


def test_fused_gemm_and_fused_matmul_activations(ocl):
    a, w, c = f32(5, 7), f32(9, 7), f32(9)
    node = helper.make_node("FusedGemm", ["a", "w", "c"], ["y"], domain="com.onnxhal", transB=1,
                            activation="HardSigmoid", activation_params=[0.3, 0.4])
    y, _ = _run_fused_domain(ocl, node, {"a": a}, {"w": w, "c": c}, [5, 9])
    np.testing.assert_allclose(y, np.clip(0.3 * (a @ w.T + c) + 0.4, 0, 1), rtol=1e-4, atol=1e-5)
    x, w2, bias = f32(2, 3, 7), f32(7, 10), f32(10)
    node = helper.make_node("FusedMatMul", ["x", "w", "bias"], ["y"], domain="com.onnxhal", activation="Gelu")
    y, _ = _run_fused_domain(ocl, node, {"x": x}, {"w": w2, "bias": bias}, [2, 3, 10])
    from math import erf
    v = (x @ w2 + bias).astype(np.float64)
    np.testing.assert_allclose(y, 0.5 * v * (1 + np.vectorize(erf)(v / np.sqrt(2))), rtol=1e-4, atol=1e-5)


def test_fused_matmul_gelu_vector_epilogue(ocl):
    """Full 16-column panels take the float8 epilogue (onnxhal_gelu8); the last 4 columns the scalar
    one: both match erf's GELU, and NaN stays NaN."""
    from math import erf
    x, w2, bias = f32(3, 5, 9, scale=3.0), f32(9, 36), f32(36)
    x[0, 0, 0] = np.nan
    node = helper.make_node("FusedMatMul", ["x", "w", "bias"], ["y"], domain="com.onnxhal", activation="Gelu")
    y, plan = _run_fused_domain(ocl, node, {"x": x}, {"w": w2, "bias": bias}, [3, 5, 36])
    v = (x @ w2 + bias).astype(np.float64)
    np.testing.assert_allclose(y, 0.5 * v * (1 + np.vectorize(erf)(v / np.sqrt(2))), rtol=1e-4, atol=1e-5)
    assert np.isnan(y[0, 0]).all() and not np.isnan(y[1:]).any()


@pytest.mark.parametrize("act,attrs,inits", [("Sigmoid", {}, {}), ("Tanh", {}, {}),
                                              ("Clip", {}, {"lo": np.array(-0.5, np.float32),
                                                            "hi": np.array(0.5, np.float32)})])
def test_matmul_activation_epilogue(ocl, act, attrs, inits):
    a, w = f32(6, 5), f32(5, 4)
    inputs = ["m", *inits]
    plan = check(ocl, [helper.make_node("MatMul", ["a", "w"], ["m"]), helper.make_node(act, inputs, ["y"], **attrs)],
                 {"a": a}, {"w": w, **inits}, rtol=1e-4, atol=1e-5)
    assert [s.kernel_name for s in plan.steps] == ["gemm_rowmajor_a"]


def test_lrn_against_numpy(ocl):
    """numpy, not onnx.reference: its LRN loops over the batch axis instead of channels (wrong when N != C)."""
    x = f32(2, 7, 3, 4, scale=4.0)
    got, _, _ = run_on_opencl(ocl, [helper.make_node("LRN", ["x"], ["y"], size=4, alpha=1e-3, beta=0.75, bias=2.0)],
                              {"x": x})
    x64 = x.astype(np.float64)
    sq = np.stack([(x64[:, max(0, c - 1):min(7, c + 3)] ** 2).sum(1) for c in range(7)], axis=1)
    np.testing.assert_allclose(got[0], x64 / (2.0 + 1e-3 / 4 * sq) ** 0.75, rtol=1e-5)


def test_fused_batchnorm_with_activation(ocl):
    x, mult, shift = f32(2, 3, 4, 4), f32(3), f32(3)
    node = helper.make_node("FusedBatchNormalization", ["x", "m", "s"], ["y"], domain="com.onnxhal",
                            activation="Clip", activation_params=[-0.5, 0.7])
    y, plan = _run_fused_domain(ocl, node, {"x": x}, {"m": mult, "s": shift}, [2, 3, 4, 4])
    ref = np.clip(x * mult.reshape(1, 3, 1, 1) + shift.reshape(1, 3, 1, 1), -0.5, 0.7)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
    assert [s.kernel_name for s in plan.steps] == ["fused_elementwise"]


@pytest.mark.parametrize("width,pads", [(37, [1, 1, 1, 1]), (16, [0, 0, 0, 0]), (33, [0, 2, 1, 0])])
def test_conv_wide_rows_take_the_copy_path(ocl, width, pads):
    """Rows of 16+ outputs: im2col copies whole 16-column panels; edges still take the checked path."""
    x, w, b = f32(1, 3, 5, width), f32(6, 3, 3, 3), f32(6)
    check(ocl, [helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=pads)], {"x": x}, {"w": w, "b": b})


@pytest.mark.parametrize("n,cin,cout,group,hw,kernel,stride,pads,dil", [
    (1, 5, 8, 1, (6, 16), 3, 1, [1, 1, 1, 1], 1),      # one full panel per row
    (2, 4, 7, 1, (5, 28), 3, 1, [1, 1, 1, 1], 1),      # two panels, the second partly padding; batch 2
    (1, 3, 6, 1, (9, 32), 7, 2, [3, 3, 3, 3], 1),      # a 7x7 stride-2 stem
    (1, 8, 12, 2, (6, 30), 3, 1, [0, 2, 1, 0], 2),     # groups, asymmetric pads, dilation
    (1, 4, 6, 1, (4, 32), 1, 2, [0, 0, 0, 0], 1),      # 1x1 stride 2 (a ResNet downsample)
])
def test_conv_implicit_gemm(ocl, n, cin, cout, group, hw, kernel, stride, pads, dil):
    """Rows that fill 16-wide panels take the implicit GEMM (B read from the input in place, no im2col;
    rule conv_pad: no padded copy either)."""
    x, w, b = f32(n, cin, *hw), f32(cout, cin // group, kernel, kernel), f32(cout)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], group=group, strides=[stride] * 2, pads=pads,
                            dilations=[dil] * 2)
    plan = check(ocl, [node], {"x": x}, {"w": w, "b": b})
    (step,) = plan.steps
    assert step.kernel_name in (f"conv_unpadded_s{stride}", f"conv_unpadded_s{stride}_x2")


@pytest.mark.parametrize("act", ["Relu", "LeakyRelu"])
def test_conv_implicit_with_residual_and_activation(ocl, act):
    x, w, b, z = f32(1, 4, 5, 16), f32(8, 4, 3, 3), f32(8), f32(1, 8, 5, 16)
    params = {"activation_params": [0.2]} if act == "LeakyRelu" else {}
    node = helper.make_node("FusedConv", ["x", "w", "b", "z"], ["y"], domain="com.onnxhal", pads=[1, 1, 1, 1],
                            activation=act, **params)
    y, plan = _run_fused_domain(ocl, node, {"x": x, "z": z}, {"w": w, "b": b}, [1, 8, 5, 16])
    v = _conv_ref(x, w, b, pads=[1, 1, 1, 1]) + z
    np.testing.assert_allclose(y, np.where(v >= 0, v, 0.2 * v if act == "LeakyRelu" else 0), rtol=1e-4, atol=1e-4)
    assert [s.kernel_name for s in plan.steps] == ["conv_unpadded_s1"]


def test_conv1d_implicit(ocl):
    x, w = f32(2, 3, 32), f32(6, 3, 5)
    plan = check(ocl, [helper.make_node("Conv", ["x", "w"], ["y"], pads=[2, 2])], {"x": x}, {"w": w})
    assert [s.kernel_name for s in plan.steps] == ["conv_unpadded_s1"]


# -- Transposes folded into batched MatMuls (attention) ----------------------------------------
@pytest.mark.parametrize("b", [1, 2])
def test_attention_transposes_cost_no_copies(ocl, b):
    """Heads split with Reshape+Transpose before Q@K^T and merged after probs@V: no strided copy when
    the (batch, head) dims flatten to one stride (batch 1); with batch 2 the copies stay, still right."""
    s, h, d = 5, 3, 4
    q, k, v = f32(b, s, h * d), f32(b, s, h * d), f32(b, s, h * d)
    shape = {"split": np.array([b, s, h, d], np.int64), "merge": np.array([b, s, h * d], np.int64)}
    nodes = [helper.make_node("Reshape", ["q", "split"], ["q4"]), helper.make_node("Reshape", ["k", "split"], ["k4"]),
             helper.make_node("Reshape", ["v", "split"], ["v4"]),
             helper.make_node("Transpose", ["q4"], ["qh"], perm=[0, 2, 1, 3]),
             helper.make_node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
             helper.make_node("Transpose", ["v4"], ["vh"], perm=[0, 2, 1, 3]),
             helper.make_node("MatMul", ["qh", "kt"], ["scores"]),
             helper.make_node("Softmax", ["scores"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "vh"], ["ctx"]),
             helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["ctx_t", "merge"], ["y"])]
    plan = check(ocl, nodes, {"q": q, "k": k, "v": v}, shape, rtol=1e-4, atol=1e-5)
    assert [s.kernel_name for s in plan.steps] == ["attention_rows"]  # rule attention: all of it, one launch
    ep = ocl[1]
    ep.backend.disabled_fusions = frozenset({"attention"})  # the Transpose rules alone
    try:
        plan = check(ocl, nodes, {"q": q, "k": k, "v": v}, shape, rtol=1e-4, atol=1e-5)
    finally:
        ep.backend.disabled_fusions = frozenset()
    # no strided copy, and the last MatMul writes the merged output itself (no trailing copy either)
    kernels = [getattr(s, "kernel_name", "copy") for s in plan.steps]
    if b == 1:
        assert kernels == ["pack_b", "gemm_rowmajor_a", "softmax_rows", "pack_b", "gemm_rowmajor_a"]
    else:
        assert kernels.count("strided_copy") == 4


@pytest.mark.parametrize("a_shape,perm_a,b_shape,perm_b,folded", [
    ((2, 3, 5, 4), [0, 1, 3, 2], (2, 3, 5, 6), [0, 1, 2, 3], 2),  # A^T per batch: packed through strides
    ((1, 5, 3, 4), [0, 2, 1, 3], (1, 3, 6, 4), [0, 1, 3, 2], 2),  # A rows 12 apart read in place; B^T
    ((2, 3, 5, 4), [1, 0, 2, 3], (2, 3, 4, 6), [1, 0, 2, 3], 0),  # batch dims swapped: not one stride
])
def test_transposed_matmul_operands(ocl, a_shape, perm_a, b_shape, perm_b, folded):
    nodes = [helper.make_node("Transpose", ["a"], ["at"], perm=perm_a),
             helper.make_node("Transpose", ["b"], ["bt"], perm=perm_b),
             helper.make_node("MatMul", ["at", "bt"], ["m"]), helper.make_node("Relu", ["m"], ["y"])]
    plan = check(ocl, nodes, {"a": f32(*a_shape), "b": f32(*b_shape)}, rtol=1e-4, atol=1e-5)
    assert [s.kernel_name for s in plan.steps].count("strided_copy") == 2 - folded


def test_transpose_also_read_elsewhere_is_materialized(ocl):
    x = f32(2, 3, 4)
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["xt", "w"], ["m"]),
             helper.make_node("Neg", ["xt"], ["n"]),
             helper.make_node("MatMul", ["n", "w"], ["m2"]),
             helper.make_node("Add", ["m", "m2"], ["y"])]
    plan = check(ocl, nodes, {"x": x}, {"w": f32(2, 3, 5)})
    assert "strided_copy" in [s.kernel_name for s in plan.steps]  # Neg needs the transposed values


@pytest.mark.parametrize("op,bias_shape,act", [("MatMul", (7,), "Relu"), ("MatMul", (1, 7), None),
                                               ("Gemm", (7,), "Sigmoid")])
def test_bias_add_folds_into_the_gemm_epilogue(ocl, op, bias_shape, act):
    a, w, b = f32(5, 6), f32(6, 7), f32(*bias_shape)
    nodes = [helper.make_node(op, ["a", "w"], ["m"], **({"beta": 0.5} if op == "Gemm" else {})),
             helper.make_node("Add", ["bias", "m"], ["s"])]
    if act:
        nodes.append(helper.make_node(act, ["s"], ["y"]))
    plan = check(ocl, nodes, {"a": a}, {"w": w, "bias": b}, rtol=1e-4, atol=1e-5)
    assert [s.kernel_name for s in plan.steps] == ["gemm_rowmajor_a"]


@pytest.mark.parametrize("c_shape", [(37,), (5, 1), (1,), (5, 37)])
def test_gemm_wide_epilogue_paths(ocl, c_shape):
    """37 columns: two full 16-column panels take the vector epilogue (bias modes column, row, scalar;
    the full-matrix C always takes the per-element path) and the last panel the per-element one."""
    a, b, c = f32(5, 6), f32(6, 37), f32(*c_shape)
    nodes = [helper.make_node("Gemm", ["a", "b", "c"], ["g"], alpha=0.5, beta=2.0),
             helper.make_node("Relu", ["g"], ["y"])]
    got, _, _ = run_on_opencl(ocl, nodes, {"a": a, "b": b, "c": c})
    np.testing.assert_allclose(got[0], np.maximum(0.5 * (a @ b) + 2.0 * c, 0), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("starts,ends,steps,length", [([-3], [-4], [-2], 1), ([-9], [-20], [-1], 5), ([7], [-9], [-3], 5)])
def test_backward_slice_starting_before_the_axis_reads_from_0(opencl_devices, starts, ends, steps, length):
    """ONNX clamps a backward slice's start into [0, dim - 1]; Python's slice.indices, which the
    OpenCL lowering used, gave -1 there and the copy read before the buffer (0 came out where
    onnxruntime and the CPU EP give x[0])."""
    nodes = [helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    inits = [numpy_helper.from_array(np.array(v, np.int64), k)
             for k, v in (("st", starts), ("en", ends), ("ax", [0]), ("sp", steps))]
    model = helper.make_model(helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [length])],
                                                [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits),
                              opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
    x = np.arange(1, length + 1, dtype=np.float32)
    sess = onnxhal.InferenceSession(model, providers=["OpenCLExecutionProvider", "CPUExecutionProvider"])
    assert sess.partition_summary == {"OpenCLExecutionProvider": 2}
    want = onnxhal.InferenceSession(model).run(None, {"x": x})[0]
    assert want.size and want[0] == x[min(max(starts[0] + length if starts[0] < 0 else starts[0], 0), length - 1)]
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], want)


@pytest.mark.parametrize("exponent", [1.0, 2.0, 3.0, 4.0, -1.0, 0.5])
def test_pow_with_a_constant_exponent_matches_numpy_on_special_values(ocl, exponent):
    """Small integer exponents are computed as products (pow() is a slow call on PoCL): exact on NaN,
    inf, -0 and negatives too; other exponents still call pow(). The reference is the CPU EP, which
    follows C's pow (and onnxruntime) where numpy differs: pow(-inf, 0.5) = +inf, pow(-0, 0.5) = +0."""
    x = np.array([[np.nan, np.inf, -np.inf, -0.0, 0.0, 1.5, -2.0, 3.25, -0.5, 7.0, 1e-3, -1e4]], np.float32)
    e = np.array(exponent, np.float32)
    got, _, plan = run_on_opencl(ocl, [helper.make_node("Pow", ["x", "e"], ["y"])], {"x": x}, {"e": e})
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Pow", ["x", "e"], ["y"])], "p", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, x.shape)], [numpy_helper.from_array(e, "e")]),
        opset_imports=[helper.make_opsetid("", 17)])
    want = onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got[0], want, rtol=1e-6, equal_nan=True)
    real = ~np.isnan(want)  # -0 and +0 kept apart (a NaN's sign means nothing)
    np.testing.assert_array_equal(np.signbit(got[0])[real], np.signbit(want)[real])


@pytest.mark.parametrize("split, axis", [([2, 3, 1], 1), (None, 0), ([1, 1, 4], -1)])
def test_split_into_contiguous_runs(ocl, split, axis):
    x = f32(6, 6, 6)
    n_out = 3
    inits = {"s": np.array(split, np.int64)} if split else {}
    node = helper.make_node("Split", ["x", "s"] if split else ["x"], [f"y{i}" for i in range(n_out)], axis=axis)
    got, ref, _ = run_on_opencl(ocl, [node], {"x": x}, inits)
    assert len(got) == n_out
    for g, r in zip(got, ref):
        np.testing.assert_array_equal(g, r)
