"""NonMaxSuppression: greedy suppression per batch and class, in descending score order.

Two routes to the same boxes: ``greedy_keep`` (numpy, in blocks; the plain form) and, where the
CPU EP's C kernels are built, ``native_keep`` (``_native.nms_keep``: each candidate against the boxes
kept so far, as onnxruntime does it, with numpy's float64 steps). tests/test_nms_blocks.py holds
the two to each other and to onnxruntime."""

from __future__ import annotations

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.hal.run_control import check_terminate
from onnxhal.runtime.providers.cpu.kernels.native_kernels import native_module
from onnxhal.runtime.providers.cpu.kernels.registry import register


def _scalar(inputs: list, i: int, default):
    v = inputs[i] if len(inputs) > i else None
    return default if v is None or v.size == 0 else v.reshape(-1)[0].item()


@register("NonMaxSuppression", since=10)
class NonMaxSuppression(Kernel):
    """As onnxruntime: a box is kept when its score is above ``score_threshold`` (when given) and
    its IoU with every box kept before it in its class is at most ``iou_threshold``; corners may
    come in either order; a box of no area overlaps nothing. onnx.reference raised a TypeError
    whenever an optional input was omitted."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.center = bool(node.attr("center_point_box", 0))
        self.native = native_module()

    def compute(self, inputs: list) -> list:
        boxes, scores = inputs[0], inputs[1]
        if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3 or scores.shape[0] != boxes.shape[0] \
                or scores.shape[2] != boxes.shape[1]:  # as onnxruntime checks them
            raise InvalidArgument(f"NonMaxSuppression: boxes {list(boxes.shape)} and scores {list(scores.shape)}; "
                                  "boxes must be [batches, spatial, 4] and scores [batches, classes, spatial].")
        limit = int(_scalar(inputs, 2, 0))
        iou_max = float(_scalar(inputs, 3, 0.0))
        score_min = _scalar(inputs, 4, None)
        if self.center:
            xc, yc, w, h = np.moveaxis(boxes.astype(np.float64), -1, 0)
            y1, x1, y2, x2 = yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2
        else:
            a, b, c, d = np.moveaxis(boxes.astype(np.float64), -1, 0)
            y1, x1, y2, x2 = np.minimum(a, c), np.minimum(b, d), np.maximum(a, c), np.maximum(b, d)
        area = (y2 - y1) * (x2 - x1)
        out = []
        if limit > 0:
            for n in range(scores.shape[0]):
                corners = (y1[n], x1[n], y2[n], x2[n], area[n])
                packed = np.stack(corners) if self.native is not None else None
                for c in range(scores.shape[1]):
                    s = scores[n, c]
                    order = np.argsort(-s, kind="stable")
                    if score_min is not None:
                        order = order[s[order] > score_min]
                    kept = (native_keep(self.native, packed, order, iou_max, limit) if packed is not None
                            else greedy_keep(corners, order, iou_max, limit))
                    out.extend((n, c, i) for i in kept)
        return [np.asarray(out, dtype=np.int64).reshape(-1, 3)]


#: Candidates weighed together: their IoU with the boxes kept so far in one numpy call, then with
#: each other (a BLOCK x BLOCK matrix), so Python touches a candidate once, by a flag read.
BLOCK = 256


def iou(corners: tuple, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """IoU of boxes ``rows`` against boxes ``cols`` (a len(rows) x len(cols) matrix) as onnxruntime
    counts it: a box of no area overlaps nothing."""
    y1, x1, y2, x2, area = corners
    r, k = rows[:, None], cols[None, :]
    ih = np.minimum(y2[r], y2[k]) - np.maximum(y1[r], y1[k])
    iw = np.minimum(x2[r], x2[k]) - np.maximum(x1[r], x1[k])
    inter = np.clip(ih, 0, None) * np.clip(iw, 0, None)
    union = area[r] + area[k] - inter
    valid = (area[r] > 0) & (area[k] > 0) & (union > 0)
    return np.where(valid, inter / np.where(union > 0, union, 1), 0.0)


def greedy_keep(corners: tuple, order: np.ndarray, iou_max: float, limit: int) -> list[int]:
    """The boxes of ``order`` (best first) that greedy suppression keeps: each whose IoU with every
    box kept before it is at most ``iou_max``, at most ``limit`` of them. Block by block: a block's
    candidates are checked against the kept boxes at once, and the survivors against each other."""
    kept: list[int] = []
    for start in range(0, len(order), BLOCK):
        check_terminate()
        block = order[start:start + BLOCK]
        if kept:
            block = block[~(iou(corners, np.asarray(kept), block) > iou_max).any(axis=0)]
        if not block.size:
            continue
        over = iou(corners, block, block) > iou_max
        gone = np.zeros(block.size, dtype=bool)
        for j in range(block.size):
            if gone[j]:
                continue
            kept.append(int(block[j]))
            if len(kept) == limit:
                return kept
            gone |= over[j]  # what box j suppresses among the later candidates (earlier ones are decided)
    return kept


#: Candidates per call of the C route, between which a terminate request is honoured.
NATIVE_CHUNK = 4096


def native_keep(native, packed: np.ndarray, order: np.ndarray, iou_max: float, limit: int) -> list[int]:
    """``greedy_keep``'s boxes by ``native.nms_keep`` over ``packed`` (float64 [5, n]: y1, x1, y2, x2,
    area), ``NATIVE_CHUNK`` candidates a call."""
    order = np.ascontiguousarray(order, dtype=np.int64)
    kept = np.empty(order.size, dtype=np.int64)
    count = 0
    for start in range(0, order.size, NATIVE_CHUNK):
        check_terminate()
        count = native.nms_keep(packed, order[start:start + NATIVE_CHUNK], kept, count, iou_max, min(limit, 2**62))
        if count >= limit:
            break
    return kept[:count].tolist()
