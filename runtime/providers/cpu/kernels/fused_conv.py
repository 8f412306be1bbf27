"""``com.onnxhal`` FusedConv: Conv + optional residual Z + activation, run as one im2col GEMM.

2-D float convolutions run here: 1x1 convolutions read the input in place (no im2col), others
copy the windows once (split over channels between the workers), then each worker multiplies its
block of output channels (or its groups) and applies bias, residual and activation to that block
while it is still in cache. Depthwise convolutions are one multiply-add per kernel tap over
long contiguous rows (stride phases of the padded input, flattened per channel). Anything else (1-D/3-D, integer) runs through the CPU EP's Conv
kernel, then the same epilogue.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from onnxhal.hal import KernelCreateContext, Node
from onnxhal.runtime.providers.cpu.kernels.fused import DOMAIN, FusedBase, parallel_ranges, writable
from onnxhal.runtime.providers.cpu.kernels.registry import register

#: Accumulator elements per channel block of a depthwise convolution (measured: larger blocks cut
#: the per-call overhead more than they lose in cache misses, up to about this size).
DEPTHWISE_BLOCK = 1 << 18


def _padding(node: Node, in_hw: tuple[int, int], k: tuple[int, int], s: tuple[int, int],
             d: tuple[int, int]) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) from ``pads`` or ``auto_pad``."""
    auto = node.attr("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        out = []
        for i in range(2):
            o = -(-in_hw[i] // s[i])
            total = max((o - 1) * s[i] + (k[i] - 1) * d[i] + 1 - in_hw[i], 0)
            small, big = total // 2, total - total // 2
            out.append((small, big) if auto == "SAME_UPPER" else (big, small))
        return out[0][0], out[1][0], out[0][1], out[1][1]
    pads = node.attr("pads") if auto != "VALID" else None
    return tuple(pads) if pads else (0, 0, 0, 0)


@register("FusedConv", since=1, domain=DOMAIN)
class FusedConv(FusedBase):
    """Inputs X, W, B (optional, '' if absent), Z (optional residual); Conv attributes plus
    ``activation``/``activation_params``."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        super().__init__(node, ctx)
        self.node = node
        self.group = node.attr("group", 1)
        self.kernel_shape = node.attr("kernel_shape")
        self.strides = tuple(node.attr("strides") or (1, 1))
        self.dilations = tuple(node.attr("dilations") or (1, 1))
        self.has_bias = len(node.inputs) > 2 and bool(node.inputs[2])
        self.has_residual = len(node.inputs) > 3 and bool(node.inputs[3])
        self._fallback = None
        from onnxhal.runtime.providers.cpu.kernel_factory import create_cpu_kernel

        conv_attrs = [a for k, a in node.attribute_protos.items() if k not in ("activation", "activation_params")]
        conv = Node("Conv", node.inputs[:3], node.outputs[:1], name=node.name, attribute_protos=conv_attrs)
        conv.since_version = 11
        self._fallback = create_cpu_kernel(conv, ctx, 11)

    def compute(self, inputs: list) -> list:
        x, w = inputs[0], inputs[1]
        b = inputs[2] if self.has_bias else None
        z = inputs[3] if self.has_residual else None
        if x.ndim != 4 or x.dtype.kind != "f" or w.dtype != x.dtype:
            y = writable(self._fallback.compute(inputs[:3])[0], x.dtype)
            if z is not None:
                y += z
            if self.act is not None:
                self.act(y)
            return [y]
        return [self._conv2d(x, w, b, z)]

    def _conv2d(self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None, z: np.ndarray | None) -> np.ndarray:
        n, c, h, wd = x.shape
        m, cg, kh, kw = w.shape
        g = self.group
        mg = m // g
        (sh, sw), (dh, dw) = self.strides, self.dilations
        top, left, bottom, right = _padding(self.node, (h, wd), (kh, kw), (sh, sw), (dh, dw))
        oh = (h + top + bottom - ((kh - 1) * dh + 1)) // sh + 1
        ow = (wd + left + right - ((kw - 1) * dw + 1)) // sw + 1
        p = oh * ow
        padded = bool(top or left or bottom or right)
        xp = x
        if padded:
            xp = np.zeros((n, c, h + top + bottom, wd + left + right), dtype=x.dtype)
            xp[:, :, top:top + h, left:left + wd] = x
        y = np.empty((n, m, p), dtype=x.dtype)
        bias = b.reshape(m, 1) if b is not None else None
        res = z.reshape(n, m, p) if z is not None else None
        act = self.act

        def epilogue(out: np.ndarray, i: int, r0: int, r1: int) -> None:
            if bias is not None:
                out += bias[r0:r1]
            if res is not None:
                out += res[i, r0:r1]
            if act is not None:
                act(out)

        if g == c == m and cg == 1:
            self._depthwise(xp, w, y.reshape(n, m, oh, ow), (kh, kw), (sh, sw), (dh, dw), epilogue)
            return y.reshape(n, m, oh, ow)
        k = cg * kh * kw
        if kh == kw == 1 and not padded:
            cols = np.ascontiguousarray(x if sh == sw == 1 else x[:, :, ::sh, ::sw]).reshape(n, c, p)
        else:
            st = xp.strides
            win = as_strided(xp, (n, c, kh, kw, oh, ow),
                             (st[0], st[1], st[2] * dh, st[3] * dw, st[2] * sh, st[3] * sw), writeable=False)
            cols = np.empty((n, c, kh, kw, oh, ow), dtype=x.dtype)
            parallel_ranges(c, lambda c0, c1: np.copyto(cols[:, c0:c1], win[:, c0:c1]), work=n * c * kh * kw * p)
        cols = cols.reshape(n, g, k, p)  # channel-major im2col rows split evenly between groups
        w3 = w.reshape(g, mg, k)
        yg = y.reshape(n, g, mg, p)
        if g == 1:
            def rows(r0: int, r1: int) -> None:
                for i in range(n):
                    out = yg[i, 0, r0:r1]
                    np.matmul(w3[0, r0:r1], cols[i, 0], out=out)
                    epilogue(out, i, r0, r1)

            parallel_ranges(m, rows, work=n * m * k * p)
        else:
            def groups(g0: int, g1: int) -> None:
                for gi in range(g0, g1):
                    for i in range(n):
                        out = yg[i, gi]
                        np.matmul(w3[gi], cols[i, gi], out=out)
                        epilogue(out, i, gi * mg, (gi + 1) * mg)

            parallel_ranges(g, groups, work=n * m * k * p)
        return y.reshape(n, m, oh, ow)

    @staticmethod
    def _depthwise(xp: np.ndarray, w: np.ndarray, y: np.ndarray, kernel: tuple[int, int], strides: tuple[int, int],
                   dilations: tuple[int, int], epilogue) -> None:
        """Depthwise conv as one multiply-add per kernel tap over long contiguous rows.

        The padded input is split into stride phases (x[a::sh, b::sw], one copy when strided), each
        flattened per channel; a tap then reads one contiguous shifted slice of its phase, so the
        accumulator is computed on a grid as wide as a phase row and the extra columns dropped."""
        n, c, oh, ow = y.shape
        (kh, kw), (sh, sw), (dh, dw) = kernel, strides, dilations
        hp, wp = xp.shape[2:]
        hq, wq = -(-hp // sh), -(-wp // sw)
        taps = []
        phases: dict[tuple[int, int], np.ndarray] = {}
        for i in range(kh):
            for j in range(kw):
                key = ((i * dh) % sh, (j * dw) % sw)
                if key not in phases:
                    if sh == sw == 1:
                        phase = np.ascontiguousarray(xp)
                    else:
                        sub = xp[:, :, key[0]::sh, key[1]::sw]
                        phase = np.zeros((n, c, hq, wq), dtype=xp.dtype)
                        phase[:, :, :sub.shape[2], :sub.shape[3]] = sub
                    phases[key] = phase.reshape(n, c, hq * wq)
                taps.append((key, (i * dh // sh) * wq + (j * dw // sw), i, j))
        length = (oh - 1) * wq + ow
        acc = np.empty((n, c, oh * wq), dtype=y.dtype)
        block = max(1, DEPTHWISE_BLOCK // (oh * wq * n))

        def channels(c0: int, c1: int) -> None:
            for cb in range(c0, c1, block):
                ce = min(cb + block, c1)
                a = acc[:, cb:ce, :length]
                tmp = np.empty_like(a)
                for t, (key, offset, i, j) in enumerate(taps):
                    src = phases[key][:, cb:ce, offset:offset + length]
                    weight = w[cb:ce, 0, i, j].reshape(1, -1, 1)
                    if t == 0:
                        np.multiply(src, weight, out=a)
                    else:
                        np.multiply(src, weight, out=tmp)
                        a += tmp
                yb = y[:, cb:ce]
                np.copyto(yb, acc[:, cb:ce].reshape(n, ce - cb, oh, wq)[..., :ow])
                for b in range(n):
                    epilogue(yb[b].reshape(ce - cb, oh * ow), b, cb, ce)

        parallel_ranges(c, channels, work=n * c * oh * ow * kh * kw)
