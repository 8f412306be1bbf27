"""The geometry of Pad and Resize, computed once per plan from their constant inputs: what the claim
rules (``op_support.check_pad``, ``check_resize``) check on static shapes and the lowering
(``pad_resize_lowering``) uploads. Raises NotImplemented with the reason for forms the kernels do
not compute as onnxruntime does."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from onnxhal.hal.errors import NotImplemented as OrtNotImplemented
from onnxhal.hal.graph import Node

F = np.float32


def pad_widths(node: Node, rank: int, const: Callable[[str], np.ndarray | None]) -> list[tuple[int, int]]:
    """Per axis (begin, end) of a Pad (attribute form before opset 11, inputs pads and axes after);
    ``const(name)`` gives a constant input's value or None."""
    if len(node.inputs) > 1 and node.inputs[1]:
        pads = const(node.inputs[1])
        if pads is None:
            raise OrtNotImplemented(f"Pad {node.name!r}: pads are not a constant of the plan")
        pads = [int(p) for p in pads.reshape(-1)]
    else:
        pads = [int(p) for p in node.attr("pads", node.attr("paddings", []))]
    axes = list(range(rank))
    if len(node.inputs) > 3 and node.inputs[3]:
        a = const(node.inputs[3])
        if a is None:
            raise OrtNotImplemented(f"Pad {node.name!r}: axes are not a constant of the plan")
        axes = [int(v) % rank for v in a.reshape(-1)]
    if len(pads) != 2 * len(axes):
        raise OrtNotImplemented(f"Pad {node.name!r}: {len(pads)} pads for {len(axes)} axes (the CPU EP reports it)")
    width = [(0, 0)] * rank
    for k, a in enumerate(axes):
        width[a] = (pads[k], pads[k + len(axes)])
    return width


def check_pad_widths(node: Node, xs: Sequence[int], width: list[tuple[int, int]]) -> None:
    """Edge and reflect extend what is there: no negative pads, reflect pads shorter than the axis
    (onnxruntime refuses longer ones; the CPU EP crops first and reports them)."""
    mode = node.attr("mode", "constant")
    if mode != "constant" and any(b < 0 or e < 0 or (b or e) and (mode == "reflect" and max(b, e) >= d or d == 0)
                                  for d, (b, e) in zip(xs, width)):
        raise OrtNotImplemented(f"Pad {node.name!r}: {mode} pads {width} for input {list(xs)} (negative, or reflect "
                                "pads not shorter than the axis: the CPU EP computes or reports it)")


def resize_scales(node: Node, xs: Sequence[int], ys: Sequence[int],
                  const: Callable[[str], np.ndarray | None]) -> tuple[np.float32, np.float32]:
    """The float32 scales of a Resize's last two axes: its ``scales`` input, or output over input
    length where it gives ``sizes`` (as onnxruntime computes them); only the last two axes may change."""
    if len(xs) < 2 or tuple(xs[:-2]) != tuple(ys[:-2]):
        raise OrtNotImplemented(f"Resize {node.name!r}: {list(xs)} -> {list(ys)} resizes more than the last two axes")
    scales = const(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else None
    if scales is not None and scales.size:
        return F(scales.reshape(-1)[-2]), F(scales.reshape(-1)[-1])
    if len(node.inputs) > 2 and node.inputs[2] and not (len(node.inputs) > 3 and node.inputs[3]):
        raise OrtNotImplemented(f"Resize {node.name!r}: scales are not a constant of the plan")
    return F(ys[-2]) / F(xs[-2]), F(ys[-1]) / F(xs[-1])


def _coords(y: np.ndarray, out_len: int, in_len: int, scale, coord: str, half) -> np.ndarray:
    """The spec's source coordinates (``y``, ``scale`` and ``half`` of one float type)."""
    if coord == "asymmetric":
        return y / scale
    if coord == "align_corners":
        return np.zeros_like(y) if out_len == 1 else y * (in_len - 1) / (out_len - 1)
    if coord == "pytorch_half_pixel" and out_len <= 1:
        return np.zeros_like(y)
    return (y + half) / scale - half  # half_pixel, pytorch_half_pixel


def _nearest(c: np.ndarray, nearest: str, in_len: int) -> np.ndarray:
    """onnxruntime's rounding of source coordinates (upsamplebase.h), clamped into the input."""
    away = np.sign(c) * np.floor(np.abs(c) + 0.5)  # std::round: halves away from zero
    if nearest == "floor":
        idx = np.floor(c)
    elif nearest == "ceil":
        idx = np.ceil(c)
    elif nearest == "round_prefer_ceil":
        idx = away
    else:  # round_prefer_floor: an exact half goes down
        idx = np.where(c == np.trunc(c) + 0.5, np.trunc(c), away)
    return np.clip(idx, 0, in_len - 1).astype(np.int32)


def resize_axis(out_len: int, in_len: int, scale: np.float32, coord: str, linear: bool,
                nearest: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One axis of a Resize: (first source index, second, weight of the second, weight of the first)
    per output index, with onnxruntime's float32 arithmetic (upsamplebase.h's coordinate
    transformations, upsample.cc's bilinear weights: ``dx1``, ``dx2`` 0.5 each at the last input).
    Nearest indices are rounded coordinates: where one lies so near a rounding boundary that float32
    and float64 arithmetic round it apart (onnxruntime's choice there is not the spec's), the node is
    declined rather than risk an index other than onnxruntime's."""
    if out_len == in_len and scale != 1:
        raise OrtNotImplemented(f"Resize keeping a length of {in_len} at scale {float(scale)}")
    half = F(0.5)
    c = _coords(np.arange(out_len, dtype=F), out_len, in_len, F(scale), coord, half).astype(F)
    if not linear:
        idx = _nearest(c, nearest, in_len)
        exact = np.float64(out_len) / in_len if scale == F(out_len) / F(in_len) else np.float64(scale)
        if not np.array_equal(idx, _nearest(_coords(np.arange(out_len, dtype=np.float64), out_len, in_len, exact,
                                                    coord, 0.5), nearest, in_len)):
            raise OrtNotImplemented(f"Resize nearest ({coord}, {nearest}) of length {in_len} to {out_len}: a source "
                                    "coordinate lies on a rounding boundary, where float32 and float64 disagree")
        zero = np.zeros(out_len, F)
        return idx, idx, zero, zero
    c = np.clip(c, F(0), F(in_len - 1)).astype(F)
    i1 = np.minimum(c.astype(np.int32), in_len - 1)
    i2 = np.minimum(i1 + 1, in_len - 1)
    d1, d2 = np.abs(c - i1.astype(F)), np.abs(c - i2.astype(F))
    same = i1 == i2
    return i1, i2, np.where(same, half, d1).astype(F), np.where(same, half, d2).astype(F)
