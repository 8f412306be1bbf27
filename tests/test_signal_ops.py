"""The signal-processing kernels (DFT, STFT, the windows, MelWeightMatrix), CenterCropPad and the
antialiased Resize against onnxruntime on the same inputs, over their attributes' forms: the
eleventh held-out wave's audio front ends and image preprocessing ran them on onnx.reference."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxhal

ort = pytest.importorskip("onnxruntime")
F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _model(node: onnx.NodeProto, inputs: list[tuple[str, int]], opset: int) -> bytes:
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, t, None) for n, t in inputs],
                              [helper.make_tensor_value_info(o, F, None) for o in node.output])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9).SerializeToString()


def _both(model: bytes, feeds: dict) -> tuple[list, list]:
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    return got, want


def _close(model: bytes, feeds: dict, rtol: float = 1e-4, atol: float = 1e-4) -> None:
    got, want = _both(model, feeds)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


RNG = np.random.default_rng(0)


@pytest.mark.parametrize("opset", [17, 20])
# a one-sided transform of a real signal only, as onnxruntime takes it
@pytest.mark.parametrize("inverse,onesided,parts", [(0, 0, 1), (0, 0, 2), (0, 1, 1), (1, 0, 1), (1, 0, 2)])
@pytest.mark.parametrize("length", [None, 6, 12])
def test_dft_matches_onnxruntime(opset, inverse, onesided, parts, length):
    names = ["x", "n" if length is not None else ""]
    attrs = {"inverse": inverse, "onesided": onesided}
    if opset == 17:
        attrs["axis"] = 1
    else:
        names.append("axis")
    node = helper.make_node("DFT", names, ["y"], **attrs)
    feeds = {"x": RNG.standard_normal((2, 9, 3, parts)).astype(np.float32)}
    inputs = [("x", F)]
    if length is not None:
        feeds["n"] = np.array(length, np.int64)
        inputs.append(("n", I64))
    if opset == 20:
        feeds["axis"] = np.array(1, np.int64)
        inputs.append(("axis", I64))
    _close(_model(node, inputs, opset), feeds)


@pytest.mark.parametrize("onesided,parts", [(0, 1), (1, 1), (0, 2)])  # one-sided: a real signal only
@pytest.mark.parametrize("window,frame", [(True, None), (True, 16), (False, 10)])
def test_stft_matches_onnxruntime(onesided, window, frame, parts):
    names = ["x", "step", "w" if window else "", "len" if frame else ""]
    node = helper.make_node("STFT", names, ["y"], onesided=onesided)
    feeds = {"x": RNG.standard_normal((2, 67, parts)).astype(np.float32), "step": np.array(5, np.int64)}
    inputs = [("x", F), ("step", I64)]
    if window:
        feeds["w"] = np.hanning(16).astype(np.float32)
        inputs.append(("w", F))
    if frame:
        feeds["len"] = np.array(frame, np.int64)
        inputs.append(("len", I64))
    _close(_model(node, inputs, 17), feeds)


def test_stft_names_a_window_of_the_wrong_length():
    node = helper.make_node("STFT", ["x", "step", "w", "len"], ["y"])
    model = _model(node, [("x", F), ("step", I64), ("w", F), ("len", I64)], 17)
    sess = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"])
    with pytest.raises(Exception, match="window of shape \\[8\\] for frame_length 16"):
        sess.run(None, {"x": np.zeros((1, 40, 1), np.float32), "step": np.array(4, np.int64),
                        "w": np.ones(8, np.float32), "len": np.array(16, np.int64)})


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
@pytest.mark.parametrize("size", [1, 8, 17])
def test_windows_match_onnxruntime(op, periodic, size):
    node = helper.make_node(op, ["n"], ["y"], periodic=periodic)
    _close(_model(node, [("n", I64)], 17), {"n": np.array(size, np.int64)}, atol=1e-6)


@pytest.mark.parametrize("mels,length,rate,low,high", [(16, 64, 16000, 0.0, 8000.0), (10, 512, 22050, 20.0, 8000.0),
                                                       (40, 400, 16000, 125.0, 7600.0), (8, 32, 8000, 0.0, 200.0)])
def test_mel_weight_matrix_matches_onnxruntime(mels, length, rate, low, high):
    node = helper.make_node("MelWeightMatrix", ["m", "n", "r", "lo", "hi"], ["y"])
    model = _model(node, [("m", I64), ("n", I64), ("r", I64), ("lo", F), ("hi", F)], 17)
    _close(model, {"m": np.array(mels, np.int64), "n": np.array(length, np.int64), "r": np.array(rate, np.int64),
                   "lo": np.array(low, np.float32), "hi": np.array(high, np.float32)}, atol=1e-6)


@pytest.mark.parametrize("shape,axes", [([4, 7], [1, 2]), ([9, 10], [1, 2]), ([3, 11], [-2, -1]), ([5, 6, 7], None)])
def test_center_crop_pad_matches_onnxruntime(shape, axes):
    attrs = {"axes": axes} if axes else {}
    node = helper.make_node("CenterCropPad", ["x", "s"], ["y"], **attrs)
    x = RNG.standard_normal((5, 6, 8)).astype(np.float32)
    _close(_model(node, [("x", F), ("s", I64)], 18), {"x": x, "s": np.array(shape, np.int64)}, atol=0)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("exclude", [0, 1])
@pytest.mark.parametrize("coord", ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"])
@pytest.mark.parametrize("sizes", [[7, 9], [5, 30], [13, 17], [3, 4]])
def test_antialiased_resize_matches_onnxruntime_and_the_reference(mode, exclude, coord, sizes):
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode=mode, antialias=1, exclude_outside=exclude,
                            coordinate_transformation_mode=coord, axes=[2, 3])
    model = _model(node, [("x", F), ("sizes", I64)], 19)
    feeds = {"x": RNG.standard_normal((1, 2, 13, 17)).astype(np.float32), "sizes": np.array(sizes, np.int64)}
    _close(model, feeds, atol=1e-5)
    from onnx.reference import ReferenceEvaluator  # the plain path: the specification's reference

    got = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, ReferenceEvaluator(model).run(None, feeds)[0], rtol=1e-5, atol=1e-5)


def test_antialiased_resize_keeps_the_aspect_ratio_as_onnxruntime():
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="linear", antialias=1, axes=[2, 3],
                            keep_aspect_ratio_policy="not_smaller")
    feeds = {"x": RNG.standard_normal((2, 3, 48, 64)).astype(np.float32), "sizes": np.array([20, 20], np.int64)}
    _close(_model(node, [("x", F), ("sizes", I64)], 19), feeds, atol=1e-5)


@pytest.mark.parametrize("lo,hi", [(-0.5, 31.5), (0.0, 31.0), (-0.5, 0.5), (0.0, 0.0), (-0.5, 2.5)])
def test_reflect_folded_matches_reflect_by_borders(lo, hi):
    """GridSample's ``reflect_folded`` path against the canonical reflection: random positions far
    outside the range, its borders and their multiples, and integer taps."""
    from onnxhal.runtime.providers.cpu.kernels import grid_sample

    span = max(hi - lo, 1.0)
    x = np.concatenate([RNG.uniform(lo - 7 * span, hi + 7 * span, 2000), lo - np.arange(-4, 5) * (hi - lo),
                        hi + np.arange(-4, 5) * (hi - lo), np.arange(-70, 70, dtype=np.float64)])
    np.testing.assert_allclose(grid_sample.reflect_folded(x, lo, hi), grid_sample.reflect_by_borders(x, lo, hi),
                               rtol=0, atol=1e-9)


@pytest.mark.parametrize("padding", ["reflection", "zeros", "border"])
@pytest.mark.parametrize("align", [0, 1])
@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
def test_grid_sample_with_reflect_folded_matches_onnxruntime(monkeypatch, padding, align, mode):
    from onnxhal.runtime.providers.cpu.kernels import grid_sample

    node = helper.make_node("GridSample", ["x", "g"], ["y"], mode=mode, padding_mode=padding, align_corners=align)
    model = _model(node, [("x", F), ("g", F)], 20)
    feeds = {"x": RNG.standard_normal((2, 3, 7, 9)).astype(np.float32),
             "g": RNG.uniform(-2.5, 2.5, (2, 5, 6, 2)).astype(np.float32)}
    _close(model, feeds, atol=1e-5)
    monkeypatch.setattr(grid_sample, "REFLECT_FOLDED_ENABLED", False)
    plain = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    monkeypatch.setattr(grid_sample, "REFLECT_FOLDED_ENABLED", True)
    fast = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(fast, plain, rtol=1e-6, atol=1e-6)


def test_dft_names_an_axis_that_is_the_real_imaginary_dim():
    node = helper.make_node("DFT", ["x", "", "axis"], ["y"])
    sess = onnxhal.InferenceSession(_model(node, [("x", F), ("axis", I64)], 20), providers=["CPUExecutionProvider"])
    with pytest.raises(Exception, match="axis -1 for an input of rank 3"):
        sess.run(None, {"x": np.zeros((2, 8, 1), np.float32), "axis": np.array(-1, np.int64)})
