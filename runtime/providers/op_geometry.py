"""Operator geometry both EPs must compute alike: Conv and pool pads and output sizes (``auto_pad``,
``ceil_mode``, onnxruntime's rounding), and index ranges. The CPU EP's kernels and the OpenCL EP's
lowering and claims import it from here, so a model's shapes come out the same on every EP.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from onnxhal.hal import Node
from onnxhal.hal.errors import InvalidArgument


def resolve_pads(in_spatial, kernel, strides, dilations, pads, auto_pad: str) -> tuple[list, list]:
    """(pads at start, pads at end) per spatial axis, from explicit pads or ``auto_pad``."""
    n = len(in_spatial)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for i in range(n):
            out = -(-in_spatial[i] // strides[i])
            total = max((out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - in_spatial[i], 0)
            small, big = total // 2, total - total // 2
            begin.append(small if auto_pad == "SAME_UPPER" else big)
            end.append(big if auto_pad == "SAME_UPPER" else small)
        return begin, end
    if auto_pad == "VALID" or not pads:
        return [0] * n, [0] * n
    return list(pads[:n]), list(pads[n:])


class ConvGeometry:
    """Parsed Conv/Pool attributes; resolves pads and output sizes for an input shape."""

    def __init__(self, node: Node, kernel_shape=None) -> None:
        self.op = node.op_type
        self.kernel_shape = node.attr("kernel_shape", kernel_shape)
        self.strides = node.attr("strides")
        self.dilations = node.attr("dilations")
        self.pads = node.attr("pads")
        self.auto_pad = node.attr("auto_pad", "NOTSET")

    def resolve(self, spatial, kernel=None, pool: bool = False):
        """(kernel, strides, dilations, pads begin, pads end, output size). The output size is ONNX's
        shape-inference formula, (padded - span) / stride + 1 with C's division, which rounds toward
        zero (also for ``auto_pad`` VALID): a pool whose window reaches past the padded input by less
        than a stride still has one output (onnx and onnxruntime; its window is clipped, see
        ``PoolGeometry.geometry``). A Conv whose kernel is longer than its padded input is refused, as
        onnxruntime does."""
        kernel = list(self.kernel_shape or kernel)
        nd = len(kernel)
        strides = self.strides or [1] * nd
        dil = self.dilations or [1] * nd
        pb, pe = resolve_pads(spatial, kernel, strides, dil, self.pads, self.auto_pad)
        return kernel, strides, dil, pb, pe, output_sizes(self.op, spatial, kernel, strides, dil, pb, pe, pool)


def output_sizes(op: str, spatial, kernel, strides, dil, pb, pe, pool: bool = False) -> list[int]:
    """ONNX's output size per spatial axis (see ``ConvGeometry.resolve``); ``InvalidArgument`` where
    onnxruntime refuses the node (numpy's error would name no attribute)."""
    nd = len(kernel)
    spare = [spatial[i] + pb[i] + pe[i] - ((kernel[i] - 1) * dil[i] + 1) for i in range(nd)]
    out = [(n // s if n >= 0 else -(-n // s)) + 1 for n, s in zip(spare, strides)]
    bad = [i for i in range(nd) if out[i] < 0 or (not pool and spare[i] < 0)]
    if bad:
        i = bad[0]
        raise InvalidArgument(
            f"{op}: the kernel spans {(kernel[i] - 1) * dil[i] + 1} cells on spatial axis {i} (kernel "
            f"{kernel[i]}, dilation {dil[i]}), more than the padded input's {spatial[i] + pb[i] + pe[i]} (input "
            f"{spatial[i]}, pads {pb[i]} + {pe[i]})" + (f", giving a negative output size {out[i]}" if pool else "")
            + ". Check kernel_shape, pads, strides and dilations against the input's shape.")
    return out


class PoolGeometry(ConvGeometry):
    """A MaxPool/AveragePool/LpPool node's geometry, ``ceil_mode`` included."""

    def __init__(self, node: Node) -> None:
        super().__init__(node)
        self.ceil = bool(node.attr("ceil_mode", 0)) and node.attr("auto_pad", "NOTSET") in ("NOTSET", "VALID")

    def geometry(self, spatial):
        """kernel, strides, dilations, pads begin, pads end (incl. ceil_mode's extra), output size,
        and the explicit pads end (what counts as padding for count_include_pad)."""
        kernel, strides, dil, pb, pe, out = self.resolve(spatial, pool=True)
        pe_explicit = list(pe)
        if not self.ceil:  # a single window reaching past the padded end: the rest is padding that never counts
            pe = [e + max(0, (k - 1) * d + 1 - (n + b + e)) if o == 1 else e
                  for n, k, d, b, e, o in zip(spatial, kernel, dil, pb, pe, out)]
        else:
            pe = list(pe)
            for i in range(len(kernel)):
                span = (kernel[i] - 1) * dil[i] + 1
                o = -(-(spatial[i] + pb[i] + pe[i] - span) // strides[i]) + 1
                if (o - 1) * strides[i] >= spatial[i] + pb[i]:  # the last window must start inside
                    o -= 1
                out[i] = o
                pe[i] += max(0, (o - 1) * strides[i] + span - (spatial[i] + pb[i] + pe[i]))
        return kernel, strides, dil, pb, pe, out, pe_explicit


def pool_geometry(node: Node, spatial) -> tuple:
    """``PoolGeometry.geometry`` of a pool node over ``spatial`` dims, and whether ceil_mode applies."""
    geo = PoolGeometry(node)
    return geo.geometry(list(spatial)), geo.ceil


def first_out_of_range(idx: np.ndarray, n: int) -> int | None:
    """The first index outside [-n, n), or None (one min/max pass when all are in range)."""
    # ufunc.reduce over all elements: ndarray.min/max's Python wrappers cost as much again on small indices
    if idx.size and (np.minimum.reduce(idx, axis=None) < -n or np.maximum.reduce(idx, axis=None) >= n):
        return int(idx[(idx < -n) | (idx >= n)].reshape(-1)[0])
    return None


# Dead kernel taps (cpu.kernels.dead_taps and the OpenCL EP's rule conv_dead_taps): the taps of a
# convolution that no output reads inside the input, found alike on both EPs.
@dataclass(frozen=True)
class Trim:
    """A convolution's live taps: per spatial axis the kept range [first, stop) of the kernel's
    taps, and the twin's kernel shape and pads (ONNX order: every axis's begin, then every end)."""

    first: tuple[int, ...]
    stop: tuple[int, ...]
    kernel: tuple[int, ...]
    pads: tuple[int, ...]

    def weight_index(self) -> tuple[slice, ...]:
        """The index of the kept taps in a weight (M, C/G, *kernel)."""
        return (slice(None), slice(None)) + tuple(slice(a, b) for a, b in zip(self.first, self.stop))


def live_taps(size: int, out: int, stride: int, pad_begin: int, kernel: int, dilation: int) -> list[bool]:
    """Per tap of one spatial axis, whether some output's read of it lies inside [0, size)."""
    live = []
    for k in range(kernel):
        start = k * dilation - pad_begin  # where output 0 reads; output o reads start + o * stride
        # the first output at or past 0, then whether it is still inside the input and the outputs
        o = max(0, -(start // stride))  # ceil(-start / stride)
        live.append(o < out and start + o * stride < size)
    return live


def trim(spatial: Sequence[int], kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int],
         pads_begin: Sequence[int], pads_end: Sequence[int], out: Sequence[int]) -> Trim | None:
    """The ``Trim`` of a convolution (its geometry resolved for an input of ``spatial``), or None
    where no tap dies at either end of an axis, or where every tap of an axis is dead (the output
    is the bias alone; left to the kernel, as no kernel of one tap would read nothing)."""
    first, stop, new_kernel, pb_new, pe_new = [], [], [], [], []
    for size, k, s, d, pb, pe, o in zip(spatial, kernel, strides, dilations, pads_begin, pads_end, out):
        live = live_taps(size, o, s, pb, k, d)
        if not any(live) or o < 1:
            return None
        k0 = live.index(True)
        k1 = k - live[::-1].index(True)
        # The pads move with the cut: each dropped tap at the start takes a dilation off the begin
        # pad, each at the end one off the end pad, so (padded - span) and with it the output size
        # is unchanged and the first kept tap reads where tap k0 did. A pad that would go negative
        # (a dead tap reached past a stride longer than the input, or an end pad the last outputs
        # never read) keeps the tap next to it, so the twin's pads stay pads.
        while pb - k0 * d < 0:
            k0 -= 1
        while pe - (k - k1) * d < 0:
            k1 += 1
        first.append(k0)
        stop.append(k1)
        new_kernel.append(k1 - k0)
        pb_new.append(pb - k0 * d)
        pe_new.append(pe - (k - k1) * d)
    if all(a == 0 and b == k for a, b, k in zip(first, stop, kernel)):
        return None
    return Trim(tuple(first), tuple(stop), tuple(new_kernel), tuple(pb_new + pe_new))
