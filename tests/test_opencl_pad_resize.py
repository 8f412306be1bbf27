"""The OpenCL EP's Pad and Resize kernels (rule ``pad_resize_ops``; runtime/providers/opencl/pad_resize_lowering.py):
random cases against the CPU EP and onnxruntime for every mode the kernels take, the pads and scales
forms the corpus uses (inputs, negative pads, axes, sizes or scales), and each attribute value they do
not take, declined with its reason."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("pyopencl")

import onnxhal  # noqa: E402
from tests.opencl_support import require_opencl  # noqa: E402

OPENCL_INDEX = require_opencl(module_level=True)
RNG = np.random.default_rng(4748)
OCL = ("OpenCLExecutionProvider", {"cost_rule": "off"})
OFF = ("OpenCLExecutionProvider", {"cost_rule": "off", "disable_fusions": "pad_resize_ops"})


def _model(node, x: np.ndarray, weights: dict, opset: int = 18) -> bytes:
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model.SerializeToString()


def _check(node, x: np.ndarray, weights: dict, opset: int = 18, kernel: str = "") -> None:
    data = _model(node, x, weights, opset)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    cpu = onnxhal.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    sess = onnxhal.InferenceSession(data, providers=[OCL, "CPUExecutionProvider"])
    got = sess.run(None, {"x": x})[0]
    assert set(sess.partition_summary) == {"OpenCLExecutionProvider"}, sess.eps["OpenCLExecutionProvider"].declined
    assert [s.kernel_name for p in sess.eps["OpenCLExecutionProvider"].compiled_plans for s in p.steps] == [kernel]
    off = onnxhal.InferenceSession(data, providers=[OFF, "CPUExecutionProvider"])
    assert "OpenCLExecutionProvider" not in off.partition_summary
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5, err_msg="vs onnxruntime")
    np.testing.assert_allclose(got, cpu, rtol=0, atol=1e-5, err_msg="vs the CPU EP")


def _declined(node, x: np.ndarray, weights: dict, opset: int = 18) -> str:
    sess = onnxhal.InferenceSession(_model(node, x, weights, opset), providers=[OCL, "CPUExecutionProvider"])
    assert "OpenCLExecutionProvider" not in sess.partition_summary
    (reason,) = sess.eps["OpenCLExecutionProvider"].declined.values()
    return reason


def _i64(*v: int) -> np.ndarray:
    return np.array(v, dtype=np.int64)


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect"])
@pytest.mark.parametrize("pads", [(0, 1, 2, 1, 0, 2, 1, 0), (1, 0, 0, 3, 1, 0, 1, 1)])
def test_pad_modes_match(opencl, mode, pads):
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    w = {"pads": _i64(*pads), "v": np.array(1.5, np.float32)}
    node = helper.make_node("Pad", ["x", "pads", "v" if mode == "constant" else ""], ["y"], mode=mode)
    _check(node, x, w if mode == "constant" else {"pads": w["pads"]}, kernel="pad_nd")


def test_pad_negative_pads_and_axes(opencl):
    x = RNG.standard_normal((3, 6, 7)).astype(np.float32)
    node = helper.make_node("Pad", ["x", "pads", "", "axes"], ["y"])  # constant 0, crop and pad
    _check(node, x, {"pads": _i64(-2, 3, 1, -1), "axes": _i64(1, -1)}, kernel="pad_nd")


def test_pad_attribute_form_before_opset_11(opencl):
    x = RNG.standard_normal((2, 5)).astype(np.float32)
    _check(helper.make_node("Pad", ["x"], ["y"], pads=[1, 2, 0, 3], value=-4.0), x, {}, opset=10, kernel="pad_nd")


def test_pad_forms_without_a_kernel_are_declined(opencl):
    x = RNG.standard_normal((2, 5)).astype(np.float32)
    wrap = helper.make_node("Pad", ["x", "pads"], ["y"], mode="wrap")
    assert "Pad mode 'wrap' has no OpenCL kernel" in _declined(wrap, x, {"pads": _i64(1, 1, 1, 1)}, opset=19)
    # reflect pads as long as the axis: onnxruntime and the CPU EP refuse them, so the device does not answer
    long = helper.make_node("Pad", ["x", "pads"], ["y"], mode="reflect")
    assert "reflect pads not shorter than the axis" in _declined(long, x, {"pads": _i64(0, 5, 0, 0)})


@pytest.mark.parametrize("coord", ["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel"])
@pytest.mark.parametrize("mode,nearest", [("linear", "floor"), ("nearest", "floor"), ("nearest", "round_prefer_floor"),
                                          ("nearest", "round_prefer_ceil"), ("nearest", "ceil")])
@pytest.mark.parametrize("by", ["sizes", "scales_up", "scales_down"])
def test_resize_matches(opencl, coord, mode, nearest, by):
    x = RNG.standard_normal((2, 3, 5, 7)).astype(np.float32)
    if by == "sizes":
        ins, w = ["x", "", "", "sizes"], {"sizes": _i64(2, 3, 9, 3)}
    else:
        s = [1.0, 1.0, 2.5, 1.75] if by == "scales_up" else [1.0, 1.0, 0.6, 0.45]
        ins, w = ["x", "", "scales"], {"scales": np.array(s, np.float32)}
    node = helper.make_node("Resize", ins, ["y"], mode=mode, coordinate_transformation_mode=coord, nearest_mode=nearest)
    _check(node, x, w, kernel="resize2d")


@pytest.mark.parametrize("attrs,reason", [
    ({"mode": "cubic"}, "mode 'cubic' has no OpenCL kernel"),
    ({"coordinate_transformation_mode": "tf_crop_and_resize"}, "'tf_crop_and_resize' has no OpenCL kernel"),
    ({"coordinate_transformation_mode": "tf_half_pixel_for_nn"}, "'tf_half_pixel_for_nn' has no OpenCL kernel"),
    ({"antialias": 1, "mode": "linear"}, "antialias"),
    ({"keep_aspect_ratio_policy": "not_larger"}, "keep_aspect_ratio_policy"),
    ({"axes": [2, 3]}, "axes"),
])
def test_resize_forms_without_a_kernel_are_declined(opencl, attrs, reason):
    x = RNG.standard_normal((1, 2, 4, 4)).astype(np.float32)
    sizes = _i64(6, 6) if "axes" in attrs else _i64(1, 2, 6, 6)
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], **attrs)
    assert reason in _declined(node, x, {"sizes": sizes})


def test_resize_nearest_on_a_rounding_boundary_is_declined(opencl):
    """7 -> 4 asymmetric: output 2 samples 2 / (4/7), 3.4999998 in float32, 3.5 in float64 (and in
    onnxruntime's answer): rounding it either way risks an index other than onnxruntime's."""
    x = RNG.standard_normal((1, 1, 3, 7)).astype(np.float32)
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="nearest",
                            coordinate_transformation_mode="asymmetric", nearest_mode="round_prefer_ceil")
    assert "rounding boundary" in _declined(node, x, {"sizes": _i64(1, 1, 3, 4)})


def test_resize_of_an_outer_axis_is_declined(opencl):
    x = RNG.standard_normal((1, 2, 4, 4)).astype(np.float32)
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="nearest")
    assert "resizes more than the last two axes" in _declined(node, x, {"sizes": _i64(1, 4, 4, 4)})
