"""NonMaxSuppression's block-wise greedy selection (kernels/detection.greedy_keep) against the plain
one-candidate-at-a-time loop it replaced, and against onnxruntime on detector-sized inputs (the
random-op tests cover up to 8 boxes; a detector gives hundreds, past one block)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper

import onnxhal
from onnxhal.runtime.providers.cpu.kernels.detection import BLOCK, NATIVE_CHUNK, greedy_keep, iou, native_keep
from onnxhal.runtime.providers.cpu.kernels.native_kernels import native_module

NATIVE = native_module()


def _plain(corners, order, iou_max, limit):
    """The reference: each candidate against every kept box, one at a time."""
    kept = []
    for i in order:
        if kept and (iou(corners, np.asarray([i]), np.asarray(kept)) > iou_max).any():
            continue
        kept.append(int(i))
        if len(kept) == limit:
            break
    return kept


def _boxes(rng, n):
    """Clustered boxes (heavy overlap, as a detector's anchors), some duplicated, some of no area."""
    centres = rng.uniform(0, 100, size=(max(n // 20, 1), 2))
    xy = centres[rng.integers(0, len(centres), n)] + rng.normal(0, 3, size=(n, 2))
    wh = rng.uniform(2, 20, size=(n, 2))
    wh[rng.random(n) < 0.05] = 0.0
    boxes = np.concatenate([xy, xy + wh], 1)
    dup = rng.random(n) < 0.05
    boxes[dup] = boxes[rng.integers(0, n, dup.sum())]
    return boxes


@pytest.mark.parametrize("n", [0, 1, 7, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 17])
@pytest.mark.parametrize("iou_max", [0.0, 0.3, 0.7, 1.0])
def test_blocks_keep_what_the_plain_loop_keeps(n, iou_max):
    rng = np.random.default_rng(n * 7 + int(iou_max * 10))
    b = _boxes(rng, n)
    y1, x1, y2, x2 = np.minimum(b[:, 0], b[:, 2]), np.minimum(b[:, 1], b[:, 3]), np.maximum(b[:, 0], b[:, 2]), \
        np.maximum(b[:, 1], b[:, 3])
    corners = (y1, x1, y2, x2, (y2 - y1) * (x2 - x1))
    scores = np.round(rng.random(n), 2)  # ties, kept in index order by the stable sort
    order = np.argsort(-scores, kind="stable")
    for limit in (1, 5, n + 1, 10**9):
        want = _plain(corners, order, iou_max, limit)
        assert greedy_keep(corners, order, iou_max, limit) == want
        if NATIVE is not None:
            assert native_keep(NATIVE, np.stack(corners), order, iou_max, limit) == want


@pytest.mark.skipif(NATIVE is None, reason="the CPU EP's C kernels are not built (no compiler at install)")
@pytest.mark.parametrize("n", [50, NATIVE_CHUNK + 300])
def test_the_c_route_keeps_the_numpy_boxes_with_nan_inf_and_ties(n):
    """Non-finite corners (NaN areas overlap nothing; numpy's minimum keeps a NaN, C's fmin would not),
    duplicated boxes and equal scores, over more than one call of the C route."""
    rng = np.random.default_rng(n)
    b = _boxes(rng, n)
    b[rng.random(b.shape) < 0.02] = np.nan
    b[rng.random(b.shape) < 0.01] = np.inf
    y1, x1, y2, x2 = np.minimum(b[:, 0], b[:, 2]), np.minimum(b[:, 1], b[:, 3]), np.maximum(b[:, 0], b[:, 2]), \
        np.maximum(b[:, 1], b[:, 3])
    with np.errstate(invalid="ignore"):
        corners = (y1, x1, y2, x2, (y2 - y1) * (x2 - x1))
        order = np.argsort(-np.round(rng.random(n), 1), kind="stable")
        for iou_max, limit in [(0.5, 10**9), (0.2, 7), (-0.5, 10**9), (0.7, n // 2)]:
            want = greedy_keep(corners, order, iou_max, limit)
            assert native_keep(NATIVE, np.stack(corners), order, iou_max, limit) == want


@pytest.mark.skipif(NATIVE is None, reason="the CPU EP's C kernels are not built (no compiler at install)")
def test_the_c_route_refuses_indices_outside_the_boxes():
    corners = np.zeros((5, 4))
    kept = np.empty(8, np.int64)
    with pytest.raises(ValueError, match="within n"):
        NATIVE.nms_keep(corners, np.array([0, 4], np.int64), kept, 0, 0.5, 10)
    with pytest.raises(ValueError, match="count"):
        NATIVE.nms_keep(corners, np.arange(4, dtype=np.int64), np.empty(3, np.int64), 0, 0.5, 10)


def _model(center):
    node = helper.make_node("NonMaxSuppression", ["boxes", "scores", "k", "iou", "th"], ["y"],
                            center_point_box=center)
    g = helper.make_graph([node], "nms", [
        helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [None, None, 4]),
        helper.make_tensor_value_info("scores", TensorProto.FLOAT, [None, None, None]),
        helper.make_tensor_value_info("k", TensorProto.INT64, [1]),
        helper.make_tensor_value_info("iou", TensorProto.FLOAT, [1]),
        helper.make_tensor_value_info("th", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [None, 3])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)], ir_version=7)


@pytest.mark.parametrize("center", [0, 1])
def test_detector_sized_inputs_match_onnxruntime(center, monkeypatch):
    rng = np.random.default_rng(center)
    n, classes = 2 * BLOCK + 99, 3
    boxes = np.stack([_boxes(rng, n) for _ in range(2)]).astype(np.float32)
    if center:  # as (x centre, y centre, width, height)
        boxes = np.concatenate([(boxes[..., :2] + boxes[..., 2:]) / 2, boxes[..., 2:] - boxes[..., :2]], -1)
    scores = rng.random((2, classes, n)).astype(np.float32)
    blob = _model(center).SerializeToString()
    ort = onnxruntime.InferenceSession(blob, providers=["CPUExecutionProvider"])
    hal = onnxhal.InferenceSession(blob)
    monkeypatch.setenv("ONNXHAL_NATIVE_KERNELS", "0")  # read when a kernel is built: the numpy route
    plain = onnxhal.InferenceSession(blob)
    for k, iou_max, th in [(10**6, 0.5, 0.0), (50, 0.45, 0.25), (3, 0.9, 0.5), (0, 0.5, 0.0)]:
        feeds = {"boxes": boxes, "scores": scores, "k": np.array([k], np.int64),
                 "iou": np.array([iou_max], np.float32), "th": np.array([th], np.float32)}
        want = ort.run(None, feeds)[0]
        np.testing.assert_array_equal(hal.run(None, feeds)[0], want)
        np.testing.assert_array_equal(plain.run(None, feeds)[0], want)
    assert onnx.checker.check_model(_model(center)) is None
