"""The N-d Conv's paths (``conv.ND_PATHS``): ``nd_flat_taps`` against the canonical ``nd_im2col``
and onnxruntime, on 3-D convolutions of every kind it takes (dilated, padded unevenly, grouped,
several images, float64, blocks that split the positions); ``nd_frame_taps`` likewise on k x 1 x 1
ones (frame padding and dilation, taps in the padding, no tap reaching every output);
``nd_gather`` likewise on the ungrouped ones and strided ones; ``nd_frame_im2col`` likewise on
ungrouped 3-D ones (frame strides and pads, every 2-D window layout of ``im2col_2d``). ``nd_gather`` takes every small
ungrouped convolution first, so the other paths' tests turn it off (``_no_gather``)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from onnxhal.hal import KernelCreateContext, Node
from onnxhal.runtime.providers.cpu.kernels import conv

CASES = [
    # (x shape, w shape, attributes)
    ((1, 4, 5, 6, 7), (6, 4, 3, 3, 3), {"pads": [1, 1, 1, 1, 1, 1]}),
    ((2, 3, 4, 9, 8), (5, 3, 3, 2, 3), {"pads": [0, 1, 2, 1, 0, 1]}),
    ((1, 4, 6, 10, 9), (4, 4, 2, 3, 3), {"pads": [1, 2, 2, 0, 2, 1], "dilations": [2, 1, 3]}),
    ((2, 6, 3, 7, 7), (9, 2, 1, 3, 3), {"pads": [0, 1, 1, 0, 1, 1], "group": 3}),
    ((1, 2, 4, 5, 6), (3, 2, 3, 3, 3), {}),
    ((1, 2, 3, 4, 5, 4), (3, 2, 2, 2, 3, 2), {"pads": [1, 0, 1, 0, 0, 1, 0, 1]}),  # 4-D
    ((1, 3, 13, 8, 3), (4, 3, 1, 1, 1), {}),  # 1x1x1, no padding: the output cut is contiguous already
]


@pytest.fixture(autouse=True)
def _no_gather(monkeypatch):
    monkeypatch.setattr(conv, "ND_GATHER_MAX", 0)


def _kernel(attrs: dict) -> conv.Conv:
    node = Node("Conv", ["x", "w", "b"], ["y"], attribute_protos=[helper.make_attribute(k, v) for k, v in attrs.items()])
    node.since_version = 11
    return conv.Conv(node, KernelCreateContext())


def _onnxruntime(x: np.ndarray, w: np.ndarray, b: np.ndarray, attrs: dict) -> np.ndarray:
    elem = onnx.TensorProto.FLOAT
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)], "conv",
                              [helper.make_tensor_value_info("x", elem, x.shape)],
                              [helper.make_tensor_value_info("y", elem, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("block", [1 << 20, 7])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[0])) + "-" + "x".join(map(str, c[1])))
def test_nd_flat_taps_matches_nd_im2col_and_onnxruntime(monkeypatch, case, block, dtype):
    xs, ws, attrs = case
    rng = np.random.default_rng(sum(xs) + sum(ws))
    x, w, b = rng.standard_normal(xs).astype(dtype), rng.standard_normal(ws).astype(dtype), rng.standard_normal(ws[0]).astype(dtype)
    monkeypatch.setattr(conv, "ND_BLOCK_ELEMENTS", block)  # 7: a block of one position, or a few
    monkeypatch.setattr(conv, "ND_FLAT_MAX_WASTE", float("inf"))
    monkeypatch.setattr(conv, "ND_FRAME_TAPS_ENABLED", False)  # the 1x1x1 case's own path
    kernel = _kernel(attrs)
    got = kernel.compute([x, w, b])[0]
    assert kernel.last_path == conv.ND_FLAT_TAPS
    monkeypatch.setattr(conv, "ND_FLAT_MAX_WASTE", 0.0)
    monkeypatch.setattr(conv, "ND_FRAME_IM2COL_ENABLED", False)
    plain = _kernel(attrs)
    want = plain.compute([x, w, b])[0]
    assert plain.last_path == conv.ND_IM2COL
    tol = 1e-12 if dtype == np.float64 else 1e-4
    assert got.shape == want.shape and got.dtype == want.dtype and got.flags.c_contiguous
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    if len(xs) == 5 and dtype == np.float32:  # onnxruntime's CPU Conv: float32, 1-D to 3-D
        np.testing.assert_allclose(got, _onnxruntime(x, w, b, attrs), rtol=tol, atol=tol)


def test_nd_flat_taps_condition():
    """Strided, small-plane (more padding columns than ND_FLAT_MAX_WASTE allows) and 2-D
    convolutions keep the canonical path; a large unit-stride 3-D one takes the flat taps."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, 2, 3, 3, 3)).astype(np.float32)
    b = np.zeros(4, np.float32)
    big = rng.standard_normal((1, 2, 4, 30, 30)).astype(np.float32)
    kernel = _kernel({"pads": [1] * 6})
    kernel.compute([big, w, b])
    assert conv.flat_taps_waste((4, 30, 30), (1, 1, 1), (1, 1, 1), (4, 30, 30)) <= conv.ND_FLAT_MAX_WASTE
    assert kernel.last_path == conv.ND_FLAT_TAPS
    kernel.compute([rng.standard_normal((1, 2, 4, 6, 6)).astype(np.float32), w, b])
    assert kernel.last_path == conv.ND_FRAME_IM2COL
    strided = _kernel({"pads": [1] * 6, "strides": [1, 2, 2]})
    strided.compute([big, w, b])
    assert strided.last_path == conv.ND_FRAME_IM2COL


FRAME_CASES = [
    ((1, 5, 6, 7, 9), (4, 5, 3, 1, 1), {"pads": [1, 0, 0, 1, 0, 0]}),
    ((2, 3, 5, 4, 3), (6, 3, 2, 1, 1), {"pads": [2, 0, 0, 3, 0, 0]}),  # no tap reaches every output
    ((1, 4, 7, 3, 5), (3, 4, 3, 1, 1), {"pads": [2, 0, 0, 1, 0, 0], "dilations": [2, 3, 1]}),
    ((1, 3, 4, 5, 5), (2, 3, 1, 1, 1), {}),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", FRAME_CASES, ids=lambda c: "x".join(map(str, c[0])) + "-" + "x".join(map(str, c[1])))
def test_nd_frame_taps_matches_nd_im2col_and_onnxruntime(monkeypatch, case, dtype):
    xs, ws, attrs = case
    rng = np.random.default_rng(sum(xs) + sum(ws))
    x, w, b = rng.standard_normal(xs).astype(dtype), rng.standard_normal(ws).astype(dtype), rng.standard_normal(ws[0]).astype(dtype)
    kernel = _kernel(attrs)
    got = kernel.compute([x, w, b])[0]
    assert kernel.last_path == conv.ND_FRAME_TAPS
    monkeypatch.setattr(conv, "ND_FRAME_TAPS_ENABLED", False)
    monkeypatch.setattr(conv, "ND_FLAT_MAX_WASTE", 0.0)
    monkeypatch.setattr(conv, "ND_FRAME_IM2COL_ENABLED", False)
    plain = _kernel(attrs)
    want = plain.compute([x, w, b])[0]
    assert plain.last_path == conv.ND_IM2COL
    tol = 1e-12 if dtype == np.float64 else 1e-4
    assert got.shape == want.shape and got.dtype == want.dtype and got.flags.c_contiguous
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    if dtype == np.float32:
        np.testing.assert_allclose(got, _onnxruntime(x, w, b, attrs), rtol=tol, atol=tol)


def test_nd_frame_taps_condition():
    """Row or column padding, strides, groups and kernels wider than one row keep the other paths."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 4, 5, 6, 6)).astype(np.float32)
    w = rng.standard_normal((4, 4, 3, 1, 1)).astype(np.float32)
    b = np.zeros(4, np.float32)
    for attrs, wk in (({"pads": [1, 1, 0, 1, 1, 0]}, w), ({"strides": [2, 1, 1]}, w), ({"group": 2}, w[:, :2]),
                      ({}, rng.standard_normal((4, 4, 3, 1, 2)).astype(np.float32))):
        kernel = _kernel(attrs)
        kernel.compute([x, wk, b])
        assert kernel.last_path in (conv.ND_IM2COL, conv.ND_FLAT_TAPS, conv.ND_FRAME_IM2COL), attrs


GATHER_CASES = [c for c in CASES if c[2].get("group", 1) == 1] + [
    ((2, 3, 5, 7, 6), (4, 3, 3, 3, 2), {"strides": [2, 1, 3], "pads": [1, 0, 1, 2, 1, 0]}),
    ((1, 4, 4, 4, 4), (5, 4, 3, 3, 3), {"strides": [2, 2, 2], "pads": [1, 1, 1, 1, 1, 1], "dilations": [1, 2, 1]}),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", GATHER_CASES, ids=lambda c: "x".join(map(str, c[0])) + "-" + "x".join(map(str, c[1])))
def test_nd_gather_matches_nd_im2col_and_onnxruntime(monkeypatch, case, dtype):
    xs, ws, attrs = case
    rng = np.random.default_rng(sum(xs) + sum(ws))
    x, w, b = rng.standard_normal(xs).astype(dtype), rng.standard_normal(ws).astype(dtype), rng.standard_normal(ws[0]).astype(dtype)
    monkeypatch.setattr(conv, "ND_GATHER_MAX", 1 << 17)
    kernel = _kernel(attrs)
    got = kernel.compute([x, w, b])[0]
    assert kernel.last_path == conv.ND_GATHER
    again = kernel.compute([x * 2, w, b])[0]  # the plan kept for the shape, on new values
    monkeypatch.setattr(conv, "ND_GATHER_MAX", 0)
    monkeypatch.setattr(conv, "ND_FLAT_MAX_WASTE", 0.0)
    monkeypatch.setattr(conv, "ND_FRAME_TAPS_ENABLED", False)
    monkeypatch.setattr(conv, "ND_FRAME_IM2COL_ENABLED", False)
    plain = _kernel(attrs)
    want = plain.compute([x, w, b])[0]
    assert plain.last_path == conv.ND_IM2COL
    tol = 1e-12 if dtype == np.float64 else 1e-4
    assert got.shape == want.shape and got.dtype == want.dtype and got.flags.c_contiguous
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    np.testing.assert_allclose(again, plain.compute([x * 2, w, b])[0], rtol=tol, atol=tol)
    if len(xs) == 5 and dtype == np.float32:
        np.testing.assert_allclose(got, _onnxruntime(x, w, b, attrs), rtol=tol, atol=tol)


def test_nd_gather_condition(monkeypatch):
    """Grouped convolutions and windows past ND_GATHER_MAX elements keep the other paths."""
    monkeypatch.setattr(conv, "ND_GATHER_MAX", 1 << 17)
    rng = np.random.default_rng(6)
    w = rng.standard_normal((4, 2, 3, 3, 3)).astype(np.float32)
    b = np.zeros(4, np.float32)
    grouped = _kernel({"pads": [1] * 6, "group": 2})
    grouped.compute([rng.standard_normal((1, 4, 3, 4, 4)).astype(np.float32), w, b])
    assert grouped.last_path == conv.ND_IM2COL
    big = rng.standard_normal((1, 2, 8, 30, 30)).astype(np.float32)  # 2 x 27 x 7200 window elements
    kernel = _kernel({"pads": [1] * 6})
    kernel.compute([big, w, b])
    assert kernel.last_path == conv.ND_FLAT_TAPS
    assert conv.nd_gather_plan(big.shape, (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), (8, 30, 30)) is None


FRAME_IM2COL_CASES = [
    ((2, 4, 4, 8, 8), (5, 4, 3, 3, 3), {"pads": [1, 1, 1, 1, 1, 1]}),  # same_width planes, two images
    ((1, 3, 4, 16, 12), (4, 3, 3, 7, 7), {"strides": [1, 2, 2], "pads": [1, 3, 3, 1, 3, 3]}),  # a 7x7/2 stem: phases
    ((1, 2, 5, 8, 8), (3, 2, 3, 3, 3), {"strides": [2, 2, 2], "pads": [1, 1, 1, 1, 1, 1]}),  # half_width, frames /2
    ((1, 3, 6, 7, 5), (4, 3, 2, 3, 2), {"strides": [3, 1, 2], "pads": [2, 0, 1, 1, 2, 0], "dilations": [1, 2, 1]}),
    ((2, 2, 3, 5, 6), (3, 2, 3, 2, 2), {"pads": [0, 0, 0, 2, 1, 1]}),  # frame pads at the end only: view
    ((1, 2, 4, 5, 5), (3, 2, 4, 1, 1), {"pads": [3, 0, 0, 3, 0, 0], "strides": [2, 1, 1]}),  # taps in the pads
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", FRAME_IM2COL_CASES,
                         ids=lambda c: "x".join(map(str, c[0])) + "-" + "x".join(map(str, c[1])))
def test_nd_frame_im2col_matches_nd_im2col_and_onnxruntime(monkeypatch, case, dtype):
    xs, ws, attrs = case
    rng = np.random.default_rng(sum(xs) + sum(ws))
    x, w, b = rng.standard_normal(xs).astype(dtype), rng.standard_normal(ws).astype(dtype), rng.standard_normal(ws[0]).astype(dtype)
    monkeypatch.setattr(conv, "ND_FLAT_MAX_WASTE", 0.0)
    kernel = _kernel(attrs)
    got = kernel.compute([x, w, b])[0]
    assert kernel.last_path == conv.ND_FRAME_IM2COL
    again = kernel.compute([x * 2, w, b])[0]  # the reordered weights kept for the same array
    monkeypatch.setattr(conv, "ND_FRAME_IM2COL_ENABLED", False)
    plain = _kernel(attrs)
    want = plain.compute([x, w, b])[0]
    assert plain.last_path == conv.ND_IM2COL
    tol = 1e-12 if dtype == np.float64 else 1e-4
    assert got.shape == want.shape and got.dtype == want.dtype and got.flags.c_contiguous
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    np.testing.assert_allclose(again, plain.compute([x * 2, w, b])[0], rtol=tol, atol=tol)
    w2 = w + 1  # new weights (a graph input's): reordered again, not the kept ones
    np.testing.assert_allclose(kernel.compute([x, w2, b])[0], plain.compute([x, w2, b])[0], rtol=tol, atol=tol)
    if dtype == np.float32:
        np.testing.assert_allclose(got, _onnxruntime(x, w, b, attrs), rtol=tol, atol=tol)


def test_nd_frame_im2col_condition(monkeypatch):
    """Grouped ones, a frame dilation and 4-D ones keep nd_im2col."""
    monkeypatch.setattr(conv, "ND_FLAT_MAX_WASTE", 0.0)
    rng = np.random.default_rng(7)
    b = np.zeros(4, np.float32)
    x = rng.standard_normal((1, 4, 6, 5, 5)).astype(np.float32)
    for attrs, ws in (({"group": 2}, (4, 2, 3, 3, 3)), ({"dilations": [2, 1, 1]}, (4, 4, 3, 3, 3))):
        kernel = _kernel(attrs)
        kernel.compute([x, rng.standard_normal(ws).astype(np.float32), b])
        assert kernel.last_path == conv.ND_IM2COL, attrs
    four = _kernel({})
    four.compute([rng.standard_normal((1, 2, 3, 4, 5, 4)).astype(np.float32),
                  rng.standard_normal((4, 2, 2, 2, 3, 2)).astype(np.float32), b])
    assert four.last_path == conv.ND_IM2COL


class _ConstantWeights(KernelCreateContext):
    def is_constant_initializer(self, name: str) -> bool:
        return name == "w"


def test_nd_frame_im2col_keeps_only_constant_weights(monkeypatch):
    """Reordered weights are kept for a constant initializer; a graph input's array written over
    in place between runs is reordered again (not the kept copy of its old values)."""
    monkeypatch.setattr(conv, "ND_FLAT_MAX_WASTE", 0.0)
    rng = np.random.default_rng(8)
    x = rng.standard_normal((1, 3, 4, 5, 5)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3, 3)).astype(np.float32)
    b = np.zeros(4, np.float32)
    node = Node("Conv", ["x", "w", "b"], ["y"], attribute_protos=[helper.make_attribute("pads", [1] * 6)])
    node.since_version = 11
    kept = conv.Conv(node, _ConstantWeights())
    kept.compute([x, w, b])
    assert kept.last_path == conv.ND_FRAME_IM2COL and kept._frame_w[0] is w
    fed = _kernel({"pads": [1] * 6})
    first = fed.compute([x, w, b])[0]
    w *= -1  # the same array, new values
    np.testing.assert_allclose(fed.compute([x, w, b])[0], -first, rtol=1e-5, atol=1e-5)
