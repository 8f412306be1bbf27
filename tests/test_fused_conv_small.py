"""FusedConv's and MaxPool's paths for small inputs (the window gathers of ``gather_plan`` and
``_window_indices``, the 1-D twin), against onnxruntime on the unfused model: strides, dilations,
asymmetric pads, biases (zero and not), residuals, activations, infinities next to the padding,
and the same layers above the gather limits, which take the strided-copy paths."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import onnxhal
from onnxhal.hal import GraphOptimizationLevel as Level
from onnxhal.runtime.providers.cpu.kernels import conv, fused_conv
from tests.models import make, vi

RNG = np.random.default_rng(31)


def ort_run(model, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def hal_session(model):
    so = onnxhal.SessionOptions()
    so.graph_optimization_level = Level.ORT_ENABLE_ALL
    return onnxhal.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def conv_model(x_shape, w_shape, attrs, bias="random", residual=False, act=None):
    """x -> Conv [+ bias] [+ Add(r)] [-> act] -> y, static shapes so the optimizer fuses all of it."""
    inits = [numpy_helper.from_array(RNG.standard_normal(w_shape).astype(np.float32), "w")]
    inputs = ["x", "w"]
    if bias is not None:
        b = np.zeros(w_shape[0], np.float32) if bias == "zero" else RNG.standard_normal(w_shape[0]).astype(np.float32)
        inits.append(numpy_helper.from_array(b, "b"))
        inputs.append("b")
    nodes = [helper.make_node("Conv", inputs, ["c"], **attrs)]
    y_shape = [d for d in ort_shape(x_shape, w_shape, attrs)]
    graph_inputs = [vi("x", list(x_shape))]
    last = "c"
    if residual:
        nodes.append(helper.make_node("Add", ["c", "r"], ["s"]))
        graph_inputs.append(vi("r", y_shape))
        last = "s"
    if act == "Relu":
        nodes.append(helper.make_node("Relu", [last], ["y"]))
    elif act == "Clip":
        inits += [numpy_helper.from_array(np.array(0, np.float32), "lo"), numpy_helper.from_array(np.array(6, np.float32), "hi")]
        nodes.append(helper.make_node("Clip", [last, "lo", "hi"], ["y"]))
    else:
        nodes.append(helper.make_node("Identity", [last], ["y"]))
    return make(nodes, graph_inputs, [vi("y", y_shape)], inits, opset=17), y_shape


def ort_shape(x_shape, w_shape, attrs):
    nd = len(x_shape) - 2
    k, s = w_shape[2:], attrs.get("strides", [1] * nd)
    d, p = attrs.get("dilations", [1] * nd), attrs.get("pads", [0] * (2 * nd))
    if attrs.get("auto_pad") == "SAME_UPPER":
        return [x_shape[0], w_shape[0]] + [-(-x_shape[2 + i] // s[i]) for i in range(nd)]
    return [x_shape[0], w_shape[0]] + [(x_shape[2 + i] + p[i] + p[nd + i] - (k[i] - 1) * d[i] - 1) // s[i] + 1
                                       for i in range(nd)]


CASES = [
    # depthwise: MobileNet's 3x3 at unit stride and at stride 2 with TF's end-only padding
    ((2, 24, 4, 4), (24, 1, 3, 3), {"group": 24, "pads": [1, 1, 1, 1]}),
    ((2, 24, 8, 8), (24, 1, 3, 3), {"group": 24, "pads": [0, 0, 1, 1], "strides": [2, 2]}),
    ((1, 5, 7, 6), (5, 1, 3, 2), {"group": 5, "pads": [2, 0, 1, 1], "strides": [2, 1], "dilations": [2, 1]}),
    ((2, 96, 1, 1), (96, 1, 3, 3), {"group": 96, "pads": [1, 1, 1, 1]}),  # every tap but the centre in padding
    ((1, 3, 5, 5), (3, 1, 5, 5), {"group": 3}),  # one output, no padding
    ((2, 16, 2, 2), (16, 1, 3, 3), {"group": 16, "pads": [0, 0, 1, 1], "strides": [2, 2]}),  # 4 taps live
    # ungrouped: ResNet's 3x3, the stem, a 1x1 downsample, a ViT patch embedding, a SAME conv
    ((2, 16, 8, 8), (16, 16, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 3, 16, 16), (4, 3, 3, 3), {"pads": [0, 0, 1, 1], "strides": [2, 2]}),
    ((2, 16, 8, 8), (32, 16, 1, 1), {"strides": [2, 2]}),
    ((2, 3, 16, 16), (8, 3, 4, 4), {"strides": [4, 4]}),
    ((1, 4, 7, 9), (6, 4, 3, 3), {"auto_pad": "SAME_UPPER", "dilations": [1, 1], "strides": [2, 2]}),
    ((1, 4, 9, 7), (6, 4, 3, 2), {"pads": [1, 2, 0, 1], "dilations": [2, 3]}),
    ((2, 8, 1, 1), (16, 8, 3, 3), {"pads": [1, 1, 1, 1]}),  # the centre taps alone read the input
    # 1-D (Whisper's Conv1d pair) through the 2-D twin
    ((2, 16, 32), (32, 16, 3), {"pads": [1, 1]}),
    ((2, 8, 15), (8, 8, 3), {"pads": [1, 2], "strides": [2], "dilations": [2]}),
    ((1, 4, 9), (6, 4, 4), {"auto_pad": "SAME_UPPER"}),
]


@pytest.mark.parametrize("native", [False, True], ids=["gathers", "native"])
@pytest.mark.parametrize("bias", ["random", "zero", None])
@pytest.mark.parametrize("x_shape,w_shape,attrs", CASES)
def test_small_fused_convs_match_onnxruntime(monkeypatch, x_shape, w_shape, attrs, bias, native):
    """With the C routes switched off every small layer gathers; with them on (where built), small
    depthwise ones of at least NATIVE_DEPTHWISE_MIN_OUTPUTS outputs a plane take the depthwise one,
    ungrouped 3x3 ones of at least NATIVE_FEW_MIN_OUTPUTS direct_native_few (ResNet's at 8x8, unit
    stride, direct_native_shifted), and
    ungrouped ones of at most NATIVE_SMALL_MAX_OUTPUTS (ResNet's at 4x4) im2col_native."""
    monkeypatch.setattr(fused_conv, "NATIVE_DEPTHWISE_ENABLED", native)
    monkeypatch.setattr(fused_conv, "NATIVE_DIRECT_ENABLED", native)
    monkeypatch.setattr(fused_conv, "NATIVE_SMALL_ENABLED", native)
    taken = (("gather", fused_conv.DEPTHWISE_NATIVE, fused_conv.DIRECT_NATIVE_FEW, fused_conv.IM2COL_NATIVE,
              fused_conv.DIRECT_NATIVE_SHIFTED) if native else ("gather",))
    for residual, act in ((False, None), (True, "Relu"), (False, "Clip")):
        model, y_shape = conv_model(x_shape, w_shape, attrs, bias=bias, residual=residual, act=act)
        sess = hal_session(model)
        assert [n.op_type for n in sess.assigned_nodes()] == ["FusedConv"]
        x = RNG.standard_normal(x_shape).astype(np.float32)
        feeds = {"x": x}
        if residual:
            feeds["r"] = RNG.standard_normal(y_shape).astype(np.float32)
        for _ in range(2):  # the second run reads what the first cached per shape
            np.testing.assert_allclose(sess.run(None, feeds)[0], ort_run(model, feeds)[0], rtol=1e-4, atol=1e-4)
        assert all(p.startswith(taken) for p in paths(sess)), paths(sess)


def paths(sess) -> list[str]:
    """The paths the session's FusedConv took, per input shape (its 2-D twin's for a 1-D one)."""
    kernel = next(s.fn.__self__ for s in sess.plan.generated.line_to_step.values() if s.node.op_type == "FusedConv")
    return [v[3] for v in (kernel._as_2d or kernel)._geometries.values()]


@pytest.mark.parametrize("x_shape,w_shape,attrs", [c for c in CASES if len(c[0]) == 4])
def test_the_conv_kernel_gathers_small_layers_too(x_shape, w_shape, attrs):
    """Unoptimized sessions (and QLinearConv's codes) run the Conv kernel, which shares the gather."""
    model, _ = conv_model(x_shape, w_shape, attrs)
    so = onnxhal.SessionOptions()
    so.graph_optimization_level = Level.ORT_DISABLE_ALL
    sess = onnxhal.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    x = RNG.standard_normal(x_shape).astype(np.float32)
    for _ in range(2):
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], ort_run(model, {"x": x})[0], rtol=1e-4, atol=1e-4)
    kernel = next(s.fn.__self__ for s in sess.plan.generated.line_to_step.values() if s.node.op_type == "Conv")
    assert all(kernel._plans.values()), kernel._plans


@pytest.mark.parametrize("x_shape,w_shape,attrs", [CASES[0], CASES[1], CASES[6], CASES[7], CASES[12], CASES[13]])
def test_an_infinite_input_next_to_the_padding_gives_what_onnxruntime_gives(x_shape, w_shape, attrs):
    """Padding reads an appended zero, so 0 * inf never enters a sum the padding is in."""
    model, _ = conv_model(x_shape, w_shape, attrs)
    x = RNG.standard_normal(x_shape).astype(np.float32)
    x[(0, 0) + (0,) * (len(x_shape) - 2)] = np.inf
    x[(-1, -1) + (-1,) * (len(x_shape) - 2)] = -np.inf
    got, want = hal_session(model).run(None, {"x": x})[0], ort_run(model, {"x": x})[0]
    assert np.isinf(want).any()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("x_shape,w_shape,attrs", [CASES[0], CASES[6], CASES[13]])
def test_layers_past_the_gather_limits_take_the_copy_paths_and_agree(monkeypatch, x_shape, w_shape, attrs):
    model, _ = conv_model(x_shape, w_shape, attrs, act="Relu")
    x = RNG.standard_normal(x_shape).astype(np.float32)
    gathered = hal_session(model).run(None, {"x": x})[0]
    monkeypatch.setattr(conv, "GATHER_MAX", 0)
    monkeypatch.setattr(conv, "DEPTHWISE_GATHER_MAX", 0)
    copied = hal_session(model)
    np.testing.assert_allclose(copied.run(None, {"x": x})[0], gathered, rtol=1e-5, atol=1e-5)
    taken = paths(copied)
    assert taken and not any(p.startswith("gather") for p in taken), taken


@pytest.mark.parametrize("x_shape,attrs,dtype", [
    ((2, 16, 16, 16), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, np.float32),
    ((1, 3, 7, 8), {"kernel_shape": [3, 2], "strides": [2, 3], "ceil_mode": 1}, np.float32),
    ((1, 3, 9, 9), {"kernel_shape": [3, 3], "dilations": [2, 2], "pads": [1, 2, 2, 1]}, np.float32),
    ((2, 4, 11), {"kernel_shape": [4], "strides": [3], "pads": [1, 2]}, np.float32),
    ((1, 2, 4, 5, 6), {"kernel_shape": [2, 3, 2], "strides": [2, 1, 2], "pads": [1, 0, 1, 0, 1, 1]}, np.float32),
    ((2, 3, 6, 6), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, np.int8),
    ((2, 3, 6, 6), {"kernel_shape": [2, 2], "strides": [2, 2]}, np.uint8),
])
def test_small_maxpools_match_onnxruntime(x_shape, attrs, dtype):
    from onnx import TensorProto
    elem = {np.float32: TensorProto.FLOAT, np.int8: TensorProto.INT8, np.uint8: TensorProto.UINT8}[dtype]
    model = make([helper.make_node("MaxPool", ["x"], ["y"], **attrs)], [vi("x", list(x_shape), elem)],
                 [vi("y", None, elem)], opset=17)
    if dtype == np.float32:
        x = RNG.standard_normal(x_shape).astype(dtype)
        x.reshape(-1)[::7] = -np.inf  # windows of -inf next to the padding stay -inf
    else:
        x = RNG.integers(np.iinfo(dtype).min, np.iinfo(dtype).max, x_shape, endpoint=True).astype(dtype)
    sess = hal_session(model)
    for _ in range(2):
        got = sess.run(None, {"x": x})[0]
        want = ort_run(model, {"x": x})[0]
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("residual_dims,fused", [(["N", 4, 6, 6], True), (["M", 4, 6, 6], False),
                                                 ([None, 4, 6, 6], False), ([1, 4, 6, 6], False)])
def test_a_residual_with_the_same_symbolic_shape_fuses(residual_dims, fused):
    """Conv + Add + Relu over a dynamic batch: the Add joins the FusedConv when the residual's shape
    is the Conv output's, symbol for symbol; another symbol, an unknown dim or a broadcast stays apart."""
    w = numpy_helper.from_array(RNG.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "r"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    model = make(nodes, [vi("x", ["N", 3, 6, 6]), vi("r", residual_dims)], [vi("y", None)], [w], opset=17)
    sess = hal_session(model)
    ops = [n.op_type for n in sess.assigned_nodes()]
    # left out of the FusedConv, the Add and Relu are one ElementwiseChain (the chain pass)
    assert ops == (["FusedConv"] if fused else ["FusedConv", "ElementwiseChain"]), ops
    x = RNG.standard_normal((2, 3, 6, 6)).astype(np.float32)
    r = RNG.standard_normal((1 if residual_dims[0] == 1 else 2, 4, 6, 6)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x, "r": r})[0], ort_run(model, {"x": x, "r": r})[0],
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("x_shape,w_shape,attrs", [CASES[0], CASES[6], ((2, 16, 2, 2), (96, 16, 1, 1), {})])
def test_weights_fed_as_inputs_are_read_afresh_on_every_run(x_shape, w_shape, attrs):
    """What a small layer keeps between runs (its remembered run, derived weights) is kept only for
    constant initializers: weights fed as a graph input, new values in each run, give new results."""
    b = numpy_helper.from_array(RNG.standard_normal(w_shape[0]).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs), helper.make_node("Relu", ["c"], ["y"])]
    model = make(nodes, [vi("x", list(x_shape)), vi("w", list(w_shape))], [vi("y", None)], [b], opset=17)
    sess = hal_session(model)
    x = RNG.standard_normal(x_shape).astype(np.float32)
    w = RNG.standard_normal(w_shape).astype(np.float32)
    for _ in range(3):
        w *= -1.5  # the same array object, new values
        feeds = {"x": x, "w": w}
        np.testing.assert_allclose(sess.run(None, feeds)[0], ort_run(model, feeds)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("x_shape,w_shape,attrs", [
    ((1, 3, 4, 5, 6), (4, 3, 3, 3, 3), {"pads": [1, 1, 1, 1, 1, 1]}),  # 3-D: the CPU EP's N-d Conv runs it
    ((2, 4, 3, 4, 4), (4, 1, 1, 3, 3), {"group": 4, "strides": [1, 2, 2]}),
])
def test_fused_convs_the_2d_paths_do_not_take_run_the_conv_kernel_as_onnxruntime(x_shape, w_shape, attrs):
    for residual, act in ((False, "Relu"), (True, "Clip")):
        model, y_shape = conv_model(x_shape, w_shape, attrs, residual=residual, act=act)
        sess = hal_session(model)
        assert [n.op_type for n in sess.assigned_nodes()] == ["FusedConv"]
        feeds = {"x": RNG.standard_normal(x_shape).astype(np.float32)}
        if residual:
            feeds["r"] = RNG.standard_normal(y_shape).astype(np.float32)
        for _ in range(2):
            np.testing.assert_allclose(sess.run(None, feeds)[0], ort_run(model, feeds)[0], rtol=1e-4, atol=1e-4)


def test_a_gather_plan_is_kept_read_only_and_given_again_for_its_geometry():
    args = ((1, 8, 6, 6), (8, 1, 3, 3), (1, 1, 1, 1), (6, 6), (1, 1), (1, 1), True, True)
    first, again = conv.gather_plan(*args), conv.gather_plan(*args)
    assert first is not None and again[0] is first[0]
    assert not first[0].flags.writeable
    with pytest.raises(ValueError):
        first[0][0] = 0
    # a limit below the plan's size is a limit of its own: no plan
    assert conv.gather_plan(*args, limit=10) is None
