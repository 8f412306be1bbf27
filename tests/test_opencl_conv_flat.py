"""The OpenCL EP's rules ``conv_flat`` (a small Conv that would run as im2col + GEMM runs as one
``conv_flat`` launch, 16 consecutive flattened output positions a work-item) and ``conv_siblings``
(a later Conv of the same input whose taps fit the first's kernel grid runs in that launch). Each is
compared with the rule off (the plain plan) and with onnxruntime's CPU EP: rows of 4, strides 1 to 3,
dilations, groups, batches, asymmetric pads, NaN and infinities next to the padding."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("pyopencl")

import onnxhal  # noqa: E402
from tests.opencl_support import require_opencl  # noqa: E402

OPENCL_INDEX = require_opencl(module_level=True)
RNG = np.random.default_rng(4748)


def _weights(shape) -> np.ndarray:
    return (RNG.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)


def _model(x_shape, convs: list[tuple[tuple, dict, bool]]) -> tuple[onnx.ModelProto, dict]:
    """Convs of input ``x``, each (weight shape, attributes, Relu after it), one graph output each, and
    (several Convs) their Concat, which joins them in one partition."""
    nodes, inits, outputs = [], [], []
    for i, (w_shape, attrs, relu) in enumerate(convs):
        inits += [numpy_helper.from_array(_weights(w_shape), f"w{i}"),
                  numpy_helper.from_array(RNG.standard_normal(w_shape[0]).astype(np.float32), f"b{i}")]
        nodes.append(helper.make_node("Conv", ["x", f"w{i}", f"b{i}"], [f"c{i}"], **attrs))
        last = f"c{i}"
        if relu:
            nodes.append(helper.make_node("Relu", [last], [f"r{i}"]))
            last = f"r{i}"
        nodes.append(helper.make_node("Identity", [last], [f"y{i}"]))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None))
    if len(convs) > 1:
        nodes.append(helper.make_node("Concat", [f"y{i}" for i in range(len(convs))], ["joined"], axis=1))
        outputs.append(helper.make_tensor_value_info("joined", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                              outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model, {"x": RNG.standard_normal(x_shape).astype(np.float32)}


def _run(model: onnx.ModelProto, feeds: dict, disabled: str) -> tuple[list[np.ndarray], list[str]]:
    sess = onnxhal.InferenceSession(model.SerializeToString(), providers=[
        ("OpenCLExecutionProvider", {"disable_fusions": disabled, "cost_rule": "off"}), "CPUExecutionProvider"])
    assert set(sess.partition_summary) == {"OpenCLExecutionProvider"}, sess.partition_summary
    ys = sess.run(None, feeds)
    kernels = [s.kernel_name for p in sess.eps["OpenCLExecutionProvider"].compiled_plans for s in p.steps
               if getattr(s, "kernel_name", "").startswith(("conv_", "im2col", "gemm"))]  # the Concat's copies left out
    return ys, kernels


def _check(model, feeds, rule: str) -> tuple[list[str], list[str]]:
    """Outputs with every rule and with ``rule`` off, against onnxruntime and each other; the kernels."""
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    on, k_on = _run(model, feeds, "")
    off, k_off = _run(model, feeds, rule)
    for w, a, b in zip(want, on, off, strict=True):
        np.testing.assert_allclose(a, w, rtol=1e-4, atol=1e-4, err_msg="rules on")
        np.testing.assert_allclose(b, w, rtol=1e-4, atol=1e-4, err_msg=f"{rule} off")
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg="rule on against the plain plan")
    return k_on, k_off


FLAT_CASES = [  # x shape, w shape, attributes: Convs that take im2col + GEMM without the rule
    ((1, 16, 8, 8), (32, 16, 3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2])),    # resnet_ts: into rows of 4
    ((1, 32, 4, 4), (32, 32, 3, 3), dict(pads=[1, 1, 1, 1])),                    # rows of 4, stride 1
    ((2, 5, 9, 11), (12, 5, 3, 3), dict(pads=[0, 2, 1, 0], strides=[3, 3])),     # stride 3, batch 2, odd pads
    ((1, 8, 10, 10), (12, 4, 3, 3), dict(pads=[2, 2, 2, 2], group=2, dilations=[2, 2])),  # groups, dilation
    ((1, 3, 5, 4), (9, 3, 5, 5), dict(pads=[4, 3, 1, 2])),                       # pads wider than the input
    ((1, 4, 2, 3), (8, 4, 1, 1), dict()),                                        # 6 positions, 1x1
    ((1, 6, 12), (10, 6, 3), dict(pads=[1, 1], strides=[2])),                    # 1-D
]


@pytest.mark.parametrize("x_shape,w_shape,attrs", FLAT_CASES)
def test_conv_flat_against_im2col(opencl, x_shape, w_shape, attrs):
    model, feeds = _model(x_shape, [(w_shape, attrs, True)])
    k_on, k_off = _check(model, feeds, "conv_flat")
    assert k_on == ["conv_flat"], k_on
    assert "im2col_packed" in k_off and "conv_flat" not in k_off, k_off


def test_conv_flat_masks_nan_and_infinity_next_to_the_padding(opencl):
    model, feeds = _model((1, 4, 6, 6), [((8, 4, 3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2]), False)])
    x = feeds["x"]
    x[0, 0, 0, 0], x[0, 1, 5, 5], x[0, 2, 0, 5], x[0, 3, 5, 0] = np.nan, np.inf, -np.inf, np.nan
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    (on,), _ = _run(model, feeds, "")
    (off,), _ = _run(model, feeds, "conv_flat")
    np.testing.assert_array_equal(np.isnan(on), np.isnan(want))
    np.testing.assert_array_equal(np.isnan(on), np.isnan(off))
    finite = np.isfinite(want)
    assert finite.any() and not finite.all()  # the poisoned values reach some outputs, not the padded lanes
    np.testing.assert_allclose(on[finite], want[finite], rtol=1e-4, atol=1e-4)


def test_conv_flat_leaves_large_convs_to_im2col(opencl):
    # 64 x 64 channels x 9 taps x 28 x 28 stride-3 outputs: past CONV_FLAT_MAX_MACS
    model, feeds = _model((1, 64, 84, 84), [((64, 64, 3, 3), dict(pads=[1, 1, 1, 1], strides=[3, 3]), False)])
    k_on, _ = _check(model, feeds, "conv_flat")
    assert "conv_flat" not in k_on and "im2col_packed" in k_on, k_on


SIBLING_CASES = [  # x shape, [(w shape, attributes, relu)]: the second's taps fit the first's grid
    ((1, 16, 8, 8), [((32, 16, 3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2]), True),
                     ((32, 16, 1, 1), dict(strides=[2, 2]), False)]),               # resnet_ts's downsample
    ((2, 6, 9, 9), [((12, 6, 3, 3), dict(pads=[2, 2, 2, 2], dilations=[2, 2]), False),
                    ((5, 6, 1, 1), dict(), True)]),                                  # dilated first, odd M2
    ((1, 4, 6, 5), [((8, 4, 3, 3), dict(pads=[1, 1, 1, 1]), True),
                    ((8, 4, 1, 3), dict(pads=[0, 1, 0, 1]), True)]),                 # a 1x3 row of taps
]


@pytest.mark.parametrize("x_shape,convs", SIBLING_CASES)
def test_conv_siblings_in_one_launch(opencl, x_shape, convs):
    model, feeds = _model(x_shape, convs)
    k_on, k_off = _check(model, feeds, "conv_siblings")
    assert k_on == ["conv_flat"], k_on
    assert k_off.count("conv_flat") + k_off.count("conv_unpadded_s2") + k_off.count("conv_unpadded_s1") == 2, k_off


def test_conv_siblings_needs_taps_in_the_first_grid(opencl):
    # a 5x5 Conv beside a 3x3 one of the same output plane: its outer taps read where the 3x3 reads not
    model, feeds = _model((1, 4, 4, 4), [((8, 4, 3, 3), dict(pads=[1, 1, 1, 1]), False),
                                         ((8, 4, 5, 5), dict(pads=[2, 2, 2, 2]), False)])
    k_on, _ = _check(model, feeds, "conv_siblings")
    assert k_on == ["conv_flat", "conv_flat"], k_on
