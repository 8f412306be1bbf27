"""``com.onnxhal`` FusedConv: Conv + optional residual Z + activation, run as one im2col GEMM.

2-D float convolutions run here: 1x1 convolutions read the input in place (no im2col), others
copy the windows once, then the product runs per block of output channels (or per group), split
between the workers when BLAS is single-threaded, and bias, residual and activation are applied
to each block while it is still in cache. Depthwise convolutions copy contiguous rows of the
stride phases of the padded input tap-major and reduce them with one batched BLAS product
(``depthwise_taps``). Anything else (1-D/3-D, integer) runs through the CPU
EP's Conv kernel, then the same epilogue.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from onnxhal.hal import KernelCreateContext, Node
from onnxhal.runtime.providers.cpu.kernels.conv import depthwise_taps, pad_spatial, resolve_pads
from onnxhal.runtime.providers.cpu.kernels.fused import DOMAIN, FusedBase, parallel_ranges, writable
from onnxhal.runtime.providers.cpu.kernels.registry import register


@register("FusedConv", since=1, domain=DOMAIN)
class FusedConv(FusedBase):
    """Inputs X, W, B (optional, '' if absent), Z (optional residual); Conv attributes plus
    ``activation``/``activation_params``."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        super().__init__(node, ctx)
        self.group = node.attr("group", 1)
        self.kernel_shape = node.attr("kernel_shape")
        self.strides = tuple(node.attr("strides") or (1, 1))
        self.dilations = tuple(node.attr("dilations") or (1, 1))
        self.pads = node.attr("pads")
        self.auto_pad = node.attr("auto_pad", "NOTSET")
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
        (top, left), (bottom, right) = resolve_pads((h, wd), (kh, kw), (sh, sw), (dh, dw), self.pads, self.auto_pad)
        oh = (h + top + bottom - ((kh - 1) * dh + 1)) // sh + 1
        ow = (wd + left + right - ((kw - 1) * dw + 1)) // sw + 1
        p = oh * ow
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

        if g == c == m and cg == 1:  # depthwise: one BLAS product per channel over its taps
            yd = depthwise_taps(x, w, (top, left, bottom, right), (oh, ow), (kh, kw), (sh, sw), (dh, dw))
            for i in range(n):
                epilogue(yd[i].reshape(m, p), i, 0, m)
            return yd
        padded = bool(top or left or bottom or right)
        xp = pad_spatial(x, (top, left), (bottom, right))
        y = np.empty((n, m, p), dtype=x.dtype)
        k = cg * kh * kw
        if kh == kw == 1 and not padded:
            cols = np.ascontiguousarray(x if sh == sw == 1 else x[:, :, ::sh, ::sw]).reshape(n, c, p)
        else:
            st = xp.strides
            win = as_strided(xp, (n, c, kh, kw, oh, ow),
                             (st[0], st[1], st[2] * dh, st[3] * dw, st[2] * sh, st[3] * sw), writeable=False)
            cols = np.empty((n, c, kh, kw, oh, ow), dtype=x.dtype)
            np.copyto(cols, win)  # memory-bound: measured slower split over two threads
        cols = cols.reshape(n, g, k, p)  # channel-major im2col rows split evenly between groups
        w3 = w.reshape(g, mg, k)
        yg = y.reshape(n, g, mg, p)
        if g == 1:
            def rows(r0: int, r1: int) -> None:
                for i in range(n):
                    out = yg[i, 0, r0:r1]
                    np.matmul(w3[0, r0:r1], cols[i, 0], out=out)
                    epilogue(out, i, r0, r1)

            parallel_ranges(m, rows, work=n * m * k * p, product=True)
        else:
            def groups(g0: int, g1: int) -> None:  # one batched product and one epilogue per image
                np.matmul(w3[g0:g1], cols[:, g0:g1], out=yg[:, g0:g1])
                for i in range(n):
                    epilogue(yg[i, g0:g1].reshape((g1 - g0) * mg, p), i, g0 * mg, g1 * mg)

            parallel_ranges(g, groups, work=n * m * k * p, product=True)
        return y.reshape(n, m, oh, ow)
