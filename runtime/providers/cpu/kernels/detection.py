"""NonMaxSuppression: greedy suppression per batch and class, in descending score order."""

from __future__ import annotations

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.hal.run_control import check_terminate
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
                for c in range(scores.shape[1]):
                    s = scores[n, c]
                    order = np.argsort(-s, kind="stable")
                    if score_min is not None:
                        order = order[s[order] > score_min]
                    kept: list[int] = []
                    for i in order:  # a few numpy calls per candidate: the flag read costs ~1% of one
                        check_terminate()
                        if kept:
                            k = np.asarray(kept)
                            ih = np.minimum(y2[n, i], y2[n, k]) - np.maximum(y1[n, i], y1[n, k])
                            iw = np.minimum(x2[n, i], x2[n, k]) - np.maximum(x1[n, i], x1[n, k])
                            inter = np.clip(ih, 0, None) * np.clip(iw, 0, None)
                            union = area[n, i] + area[n, k] - inter
                            valid = (area[n, i] > 0) & (area[n, k] > 0) & (union > 0)
                            iou = np.where(valid, inter / np.where(union > 0, union, 1), 0.0)
                            if (iou > iou_max).any():
                                continue
                        kept.append(int(i))
                        if len(kept) == limit:
                            break
                    out.extend((n, c, i) for i in kept)
        return [np.asarray(out, dtype=np.int64).reshape(-1, 3)]
