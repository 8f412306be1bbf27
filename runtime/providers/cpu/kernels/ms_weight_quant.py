"""com.microsoft weight-only quantized MatMuls, as onnxruntime's CPU kernels compute them:
MatMulNBits (onnxruntime's block quantizer: 2-, 4- or 8-bit codes with scales and zero points)
and MatMulBnb4 (bitsandbytes' FP4 / NF4 code books). Constant weights are dequantized once."""

from __future__ import annotations

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels.registry import register

MS = "com.microsoft"


@register("MatMulNBits", since=1, domain=MS)
class MatMulNBits(Kernel):
    """A [..., K] @ W.T + bias, W [N, K] stored as ``bits``-bit codes (2, 4 or 8) in blocks of
    ``block_size`` along K, low bits first, each block with its scale and zero point (packed
    codes, or floats; 2^(bits-1) by default). The dequantized weights are built once for a constant
    B (kept by the kernel), otherwise per run."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.what = f"MatMulNBits node {node.name!r}"
        self.k, self.n = int(node.attr("K", 0)), int(node.attr("N", 0))
        self.bits, self.block = int(node.attr("bits", 4)), int(node.attr("block_size", 0))
        if self.bits not in (2, 4, 8) or self.block < 1 or self.k < 1 or self.n < 1:
            raise InvalidArgument(f"{self.what}: bits {self.bits}, block_size {self.block}, K {self.k}, N {self.n}; "
                                  "bits is 2, 4 or 8 and the others positive.")
        self.blocks = -(-self.k // self.block)
        names = list(node.inputs) + [""] * 6
        self.constant = ctx is not None and all(not name or ctx.is_constant_initializer(name)
                                                for name in (names[1], names[2], names[3]))
        self._weights: np.ndarray | None = None

    def _codes(self, packed: np.ndarray, count: int) -> np.ndarray:
        """[rows, bytes] packed codes as [rows, count] values, low bits first."""
        per = 8 // self.bits
        shifts = (np.arange(per, dtype=np.uint8) * self.bits)
        vals = (packed[..., None] >> shifts) & np.uint8((1 << self.bits) - 1)
        return vals.reshape(packed.shape[0], -1)[:, :count]

    def _dequantize(self, b: np.ndarray, scales: np.ndarray, zp: np.ndarray | None) -> np.ndarray:
        n, blocks, bs = self.n, self.blocks, self.block
        if b.size * 8 // self.bits < n * blocks * bs:
            raise InvalidArgument(f"{self.what}: B of shape {list(b.shape)} holds fewer than N * blocks * block_size "
                                  f"= {n * blocks * bs} {self.bits}-bit codes.")
        q = self._codes(b.reshape(n, -1), blocks * bs).reshape(n, blocks, bs).astype(np.float32)
        scale = scales.reshape(n, blocks).astype(np.float32)
        if zp is None:
            zero = np.full((n, blocks), float(1 << (self.bits - 1)), np.float32)
        elif zp.dtype == np.uint8:
            zero = self._codes(zp.reshape(n, -1), blocks).astype(np.float32)
        else:
            zero = zp.reshape(n, blocks).astype(np.float32)
        w = (q - zero[:, :, None]) * scale[:, :, None]
        return np.ascontiguousarray(w.reshape(n, blocks * bs)[:, : self.k].T)  # [K, N]

    def compute(self, inputs: list) -> list:
        args = list(inputs) + [None] * (6 - len(inputs))
        a, b, scales, zp, g_idx, bias = args[:6]
        if g_idx is not None:
            raise InvalidArgument(f"{self.what}: g_idx (act-order) is not implemented by the CPU EP.")
        if a.shape[-1] != self.k:
            raise InvalidArgument(f"{self.what}: A of shape {list(a.shape)} for K = {self.k}; its last axis must be K.")
        w = self._weights
        if w is None:
            w = self._dequantize(b, scales, zp).astype(a.dtype, copy=False)
            if self.constant:
                self._weights = w  # the same constant codes every run
        y = np.matmul(a, w)
        return [y if bias is None else y + bias]


#: bitsandbytes' 4-bit code books (quant_type 0: FP4, 1: NF4).
_BNB4_TABLES = (
    np.array([0.0, 0.0052083333, 0.6666667, 1.0, 0.3333333, 0.5, 0.1666667, 0.25,
              -0.0, -0.0052083333, -0.6666667, -1.0, -0.3333333, -0.5, -0.1666667, -0.25], np.float32),
    np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
              -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
              0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
              0.7229568362236023, 1.0], np.float32),
)


@register("MatMulBnb4", since=1, domain=MS)
class MatMulBnb4(Kernel):
    """A [..., K] @ W.T, W [N, K] as bitsandbytes' 4-bit codes (two a byte, the first in the high
    half) through the FP4 or NF4 code book, times each block's absmax."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.what = f"MatMulBnb4 node {node.name!r}"
        self.k, self.n = int(node.attr("K", 0)), int(node.attr("N", 0))
        self.block = int(node.attr("block_size", 0))
        kind = int(node.attr("quant_type", 1))
        if self.k < 1 or self.n < 1 or self.block < 1 or kind not in (0, 1):
            raise InvalidArgument(f"{self.what}: K {self.k}, N {self.n}, block_size {self.block}, quant_type {kind}; "
                                  "the first three positive, quant_type 0 (FP4) or 1 (NF4).")
        self.table = _BNB4_TABLES[kind]
        names = list(node.inputs) + ["", ""]
        self.constant = ctx is not None and all(ctx.is_constant_initializer(x) for x in names[1:3] if x)
        self._weights: np.ndarray | None = None

    def compute(self, inputs: list) -> list:
        a, b, absmax = inputs[:3]
        if a.shape[-1] != self.k:
            raise InvalidArgument(f"{self.what}: A of shape {list(a.shape)} for K = {self.k}; its last axis must be K.")
        w = self._weights
        if w is None:
            count = self.k * self.n
            if b.size * 2 < count or absmax.size * self.block < count:
                raise InvalidArgument(f"{self.what}: B ({b.size} bytes) or absmax ({absmax.size} blocks) too small for "
                                      f"N * K = {count} weights in blocks of {self.block}.")
            codes = np.stack([b.reshape(-1) >> 4, b.reshape(-1) & 15], axis=1).reshape(-1)[:count]
            scale = np.repeat(absmax.reshape(-1).astype(np.float32), self.block)[:count]
            w = np.ascontiguousarray((self.table[codes] * scale).reshape(self.n, self.k).T).astype(a.dtype, copy=False)
            if self.constant:
                self._weights = w
        return [np.matmul(a, w)]

