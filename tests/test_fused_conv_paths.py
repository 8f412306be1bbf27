"""Every path of the CPU EP's FusedConv (``fused_conv.CONV_PATHS``) against the canonical form: the
plain convolution (a float64 reference written here) followed by bias, residual, activation and
channel shuffle. Each case builds inputs that select one path, asserts the kernel took it
(``last_path``), and compares on random and edge values; onnxruntime's Conv(+Add)(+Relu) judges
the same cases side by side. A path that diverges fails here."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from onnxhal.hal import KernelCreateContext, Node
from onnxhal.runtime.providers.cpu.kernels import fused_conv, worker_pool
from onnxhal.runtime.providers.cpu.kernels.blas_threads import get_blas_threads, set_blas_threads
from onnxhal.runtime.providers.cpu.kernels.conv import APPENDED, gather_plan
from onnxhal.runtime.providers.cpu.kernels.fused import DOMAIN
from onnxhal.runtime.providers.cpu.kernels.fused_conv import CONV_PATHS, FusedConv
from onnxhal.runtime.providers.cpu.kernels.native_kernels import native_module
from tests.models import make, vi

# (path, x shape, w shape, Conv attributes): every registered path, on 1x1, strided, dilated,
# grouped, depthwise, asymmetrically padded and odd shapes
CASES = [
    ("taps", (1, 16, 20, 20), (8, 16, 3, 3), {"pads": [1, 1, 1, 1]}),
    ("taps", (2, 12, 19, 21), (5, 12, 3, 3), {"pads": [2, 2, 2, 2], "dilations": [2, 2]}),
    ("taps", (1, 16, 23, 20), (8, 16, 5, 3), {"pads": [0, 1, 3, 1]}),  # asymmetric rows
    ("depthwise_same_width", (2, 32, 40, 40), (32, 1, 3, 3), {"group": 32, "pads": [1, 1, 1, 1]}),
    ("depthwise_same_width", (1, 16, 30, 29), (16, 1, 3, 3), {"group": 16, "pads": [0, 2, 4, 2], "dilations": [2, 2]}),
    ("depthwise_half_width", (2, 24, 40, 40), (24, 1, 3, 3), {"group": 24, "pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ("depthwise_half_width", (1, 16, 48, 44), (16, 1, 5, 5), {"group": 16, "pads": [2, 2, 1, 1], "strides": [2, 2]}),
    ("depthwise_phases", (1, 24, 41, 39), (24, 1, 3, 3), {"group": 24, "pads": [0, 0, 1, 1], "strides": [2, 2]}),
    ("depthwise_phases", (1, 16, 35, 33), (16, 1, 5, 3), {"group": 16, "pads": [4, 1, 3, 2], "dilations": [2, 1]}),
    ("gather_depthwise", (1, 8, 5, 5), (8, 1, 3, 3), {"group": 8, "pads": [1, 1, 1, 1]}),
    ("gather_depthwise", (2, 6, 7, 6), (6, 1, 3, 2), {"group": 6, "pads": [0, 1, 1, 0], "strides": [2, 1]}),
    # a kernel larger than the plane: the limit counts the 9 taps that read the input, not 25
    ("gather_depthwise", (2, 144, 2, 2), (144, 1, 5, 5), {"group": 144, "pads": [2, 2, 2, 2]}),
    # strided: within fused_conv.STRIDED_DEPTHWISE_GATHER_MAX (38k elements), above conv.GATHER_MAX
    ("gather_depthwise", (2, 48, 8, 8), (48, 1, 5, 5), {"group": 48, "pads": [2, 2, 2, 2], "strides": [2, 2]}),
    # the C route: unit and other strides, dilations, asymmetric pads, rows and columns wholly in
    # the padding, a plane smaller than the kernel, non-square kernels
    ("depthwise_native", (2, 32, 40, 40), (32, 1, 3, 3), {"group": 32, "pads": [1, 1, 1, 1]}),
    ("depthwise_native", (1, 16, 30, 29), (16, 1, 3, 3), {"group": 16, "pads": [0, 2, 4, 2], "dilations": [2, 2]}),
    ("depthwise_native", (1, 16, 48, 44), (16, 1, 5, 5), {"group": 16, "pads": [2, 2, 1, 1], "strides": [2, 2]}),
    ("depthwise_native", (1, 16, 35, 33), (16, 1, 5, 3), {"group": 16, "pads": [4, 1, 3, 2], "dilations": [2, 1]}),
    ("depthwise_native", (2, 6, 13, 6), (6, 1, 3, 2), {"group": 6, "pads": [0, 1, 1, 0], "strides": [2, 1]}),
    ("depthwise_native", (2, 16, 2, 3), (16, 1, 3, 3), {"group": 16, "pads": [3, 3, 3, 3]}),
    # unit strides without vertical dilation (the C row-blocked route): rows not a multiple of its
    # four, several column tiles, horizontal dilation, uneven pads
    ("depthwise_native", (1, 6, 7, 70), (6, 1, 7, 7), {"group": 6, "pads": [3, 3, 3, 3]}),
    ("depthwise_native", (2, 10, 9, 13), (10, 1, 5, 3), {"group": 10, "pads": [2, 3, 1, 2], "dilations": [1, 3]}),
    # stride 2 across short rows (both column phases copied in one pass): odd and even left pads and widths
    ("depthwise_native", (2, 12, 15, 13), (12, 1, 5, 5), {"group": 12, "pads": [2, 1, 2, 2], "strides": [2, 2]}),
    ("depthwise_native", (1, 10, 12, 14), (10, 1, 3, 3), {"group": 10, "pads": [1, 2, 1, 1], "strides": [2, 2]}),
    # small planes where most taps read only padding (left out in C) and one tile covers the plane
    ("depthwise_native", (2, 24, 2, 2), (24, 1, 5, 5), {"group": 24, "pads": [4, 4, 4, 4], "dilations": [2, 2]}),
    ("depthwise_native", (1, 20, 4, 4), (20, 1, 5, 5), {"group": 20, "pads": [4, 4, 4, 4], "dilations": [2, 2]}),
    ("depthwise_native", (1, 8, 3, 5), (8, 1, 7, 7), {"group": 8, "pads": [3, 3, 3, 3], "strides": [2, 2]}),
    ("depthwise_native", (2, 12, 5, 3), (12, 1, 3, 5), {"group": 12, "pads": [0, 4, 1, 0], "strides": [1, 2],
                                                         "dilations": [2, 1]}),
    ("depthwise_native", (1, 8, 24, 11), (8, 1, 3, 3), {"group": 8, "strides": [3, 2]}),
    ("depthwise_native", (2, 4, 14, 9), (4, 1, 2, 2), {"group": 4, "pads": [3, 0, 0, 3], "strides": [2, 3],
                                                      "dilations": [1, 2]}),
    # the channel-vectorised C route of small planes: MnasNet's 5x5/2 to 2x2, channels not a multiple
    # of a vector (37), dilated, asymmetric pads, taps reading only padding, two images, 6x6 outputs
    # (the most it takes)
    ("depthwise_native_channels", (1, 144, 4, 4), (144, 1, 5, 5), {"group": 144, "pads": [2, 2, 2, 2],
                                                                   "strides": [2, 2]}),
    ("depthwise_native_channels", (2, 37, 7, 5), (37, 1, 3, 3), {"group": 37, "pads": [1, 0, 2, 1],
                                                                 "strides": [2, 1], "dilations": [1, 2]}),
    ("depthwise_native_channels", (1, 24, 2, 2), (24, 1, 5, 5), {"group": 24, "pads": [4, 4, 4, 4],
                                                                 "dilations": [2, 2]}),
    ("depthwise_native_channels", (2, 136, 12, 12), (136, 1, 3, 3), {"group": 136, "pads": [1, 1, 1, 1],
                                                                     "strides": [2, 2]}),
    ("depthwise_native_channels", (1, 20, 5, 6), (20, 1, 3, 5), {"group": 20, "pads": [0, 4, 1, 0],
                                                                 "strides": [1, 2]}),
    # the C route of few-channel layers: stems (3x3/2, 7x7/2), dilated, asymmetric pads, non-square
    # the C row blocks: ConvNeXt's 7x7, 5x5 and 3x3 kernels; planes shorter and narrower than a
    # block (7 rows, 7 and 9 columns: the narrow and the wide block), rows past whole blocks,
    # asymmetric and zero pads, a non-square kernel, a pad past the kernel's reach on the right
    ("depthwise_native_rows", (2, 12, 7, 7), (12, 1, 7, 7), {"group": 12, "pads": [3, 3, 3, 3]}),
    ("depthwise_native_rows", (1, 8, 19, 37), (8, 1, 7, 7), {"group": 8, "pads": [3, 3, 3, 3]}),
    ("depthwise_native_rows", (1, 6, 17, 9), (6, 1, 5, 5), {"group": 6, "pads": [1, 2, 3, 2]}),
    ("depthwise_native_rows", (2, 10, 12, 20), (10, 1, 3, 3), {"group": 10, "pads": [0, 0, 0, 0]}),
    ("depthwise_native_rows", (1, 5, 9, 23), (5, 1, 7, 3), {"group": 5, "pads": [2, 1, 4, 4]}),
    ("direct_native", (2, 3, 32, 32), (16, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),
    ("direct_native", (1, 3, 33, 31), (8, 3, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ("direct_native", (2, 4, 24, 22), (5, 4, 3, 2), {"pads": [0, 1, 2, 0], "dilations": [2, 1]}),
    ("direct_native", (1, 4, 30, 60), (6, 4, 2, 3), {"pads": [2, 0, 0, 1], "strides": [1, 3]}),
    ("direct_native", (1, 3, 20, 40), (5, 3, 3, 3), {"pads": [1, 2, 0, 1]}),  # a channel past the blocks of 4
    # the C route of 3x3 layers with more channels (VGG-style stacks): output channels past the blocks of
    # 4, stride 2 with uneven pads, no padding
    ("direct_native_few", (1, 8, 18, 17), (6, 8, 3, 3), {"pads": [1, 1, 1, 1]}),
    ("direct_native_few", (2, 16, 33, 32), (9, 16, 3, 3), {"pads": [1, 0, 1, 1], "strides": [2, 2]}),
    ("direct_native_few", (1, 64, 18, 18), (4, 64, 3, 3), {}),
    ("direct_native_few", (2, 32, 8, 8), (12, 32, 3, 3), {"pads": [1, 1, 1, 1]}),  # blocks of 8 on a small plane
    ("direct_native_shifted", (2, 64, 8, 8), (64, 64, 3, 3), {"pads": [1, 1, 1, 1]}),  # VGG's 8x8 layers
    ("direct_native_shifted", (1, 32, 8, 8), (13, 32, 3, 3), {"pads": [1, 1, 1, 1]}),  # a block of 6 and single channels
    ("direct_native_shifted", (1, 24, 11, 9), (14, 24, 3, 2), {"pads": [0, 1, 2, 0]}),  # asymmetric pads, 3x2
    ("direct_native_shifted", (2, 16, 10, 10), (7, 16, 3, 3), {}),  # no padding: tiles of 2 vectors
    # long sums over a plane of 1024 (the C kernel's blocks of 6 channels, then one of 4)
    ("direct_native_few", (1, 16, 32, 30), (10, 16, 3, 3), {"pads": [1, 1, 1, 1]}),
    ("pointwise", (2, 16, 9, 7), (24, 16, 1, 1), {}),
    ("pointwise", (1, 1, 1, 1), (3, 1, 1, 1), {}),
    ("pointwise", (1, 16, 15, 15), (64, 4, 1, 1), {"group": 4}),  # bias in the product: g * k < m
    ("pointwise", (1, 32, 11, 11), (16, 16, 1, 1), {"group": 2}),
    ("gather", (1, 3, 7, 7), (4, 3, 3, 3), {"strides": [2, 2]}),
    ("gather", (2, 4, 6, 5), (3, 4, 2, 3), {"pads": [1, 0, 0, 2], "dilations": [2, 1]}),
    ("gather", (2, 256, 2, 2), (160, 256, 5, 5), {"pads": [2, 2, 2, 2]}),
    # taps' conditions, but within the gather limit (YOLOv8's neck at 4x4 and 2x2)
    ("gather", (2, 32, 4, 4), (16, 32, 3, 3), {"pads": [1, 1, 1, 1]}),
    ("gather", (2, 32, 2, 2), (16, 32, 3, 3), {"pads": [1, 1, 1, 1]}),
    ("gather_grouped", (2, 8, 16, 16), (8, 4, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2], "group": 2}),
    ("gather_grouped", (2, 32, 2, 2), (32, 4, 5, 5), {"pads": [2, 2, 2, 2], "group": 8}),  # taps reading padding alone
    ("gather_grouped", (1, 12, 7, 6), (9, 4, 2, 3), {"pads": [1, 0, 0, 2], "dilations": [2, 1], "group": 3}),
    ("gather_grouped", (2, 16, 5, 5), (8, 4, 1, 1), {"strides": [2, 2], "group": 4}),  # 1x1 strided
    ("im2col_1x1", (2, 64, 40, 40), (32, 64, 1, 1), {"strides": [2, 2]}),
    ("im2col_1x1", (2, 16, 81, 79), (32, 8, 1, 1), {"strides": [2, 3], "group": 2}),
    ("im2col_same_width", (1, 16, 20, 20), (32, 16, 3, 3), {"pads": [1, 1, 1, 1]}),
    ("im2col_same_width", (2, 16, 17, 15), (16, 4, 3, 3), {"pads": [1, 1, 1, 1], "group": 4}),
    ("im2col_same_width", (1, 8, 18, 21), (16, 8, 5, 5), {"pads": [0, 2, 4, 2]}),
    ("im2col_half_width", (2, 16, 32, 32), (16, 16, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ("im2col_half_width", (1, 3, 64, 64), (8, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),
    ("im2col_view", (2, 16, 33, 33), (16, 16, 3, 3), {"pads": [0, 1, 1, 0], "strides": [2, 2]}),
    ("im2col_view", (1, 8, 30, 29), (16, 4, 3, 3), {"dilations": [2, 3], "group": 2}),
    ("im2col_view", (2, 3, 128, 128), (16, 3, 8, 8), {"strides": [8, 8]}),  # patches that tile the input
    ("im2col_phases", (1, 3, 65, 65), (8, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),
    ("im2col_phases", (1, 4, 47, 50), (8, 2, 5, 5), {"pads": [1, 2, 2, 1], "strides": [3, 2], "group": 2}),
    # several images, fewer output positions than output channels, each window layout of _im2col
    # the C packed product (one image, few outputs a plane): channels past whole blocks of 64,
    # columns past whole blocks of 7, K past whole passes of 256
    ("pointwise_packed", (1, 600, 6, 9), (80, 600, 1, 1), {}),
    # the C route of small 1x1 layers: planes of one position (squeeze-excitation), a last column
    # block of fewer than 4 positions, output channels past whole blocks of 64 and of 16, one channel
    ("pointwise_native", (2, 144, 1, 1), (40, 144, 1, 1), {}),
    ("pointwise_native", (2, 24, 3, 3), (150, 24, 1, 1), {}),
    ("pointwise_native", (1, 40, 2, 2), (16, 40, 1, 1), {}),
    ("pointwise_native", (3, 5, 4, 4), (1, 5, 1, 1), {}),
    # the C route of small dense layers: ResNet's 3x3 layers at 4x4 outputs (strided from 8x8, and
    # at unit stride), its strided 1x1 shortcut, output channels past whole blocks of 64 and of 16,
    # asymmetric pads past the kernel's reach, a plane of one position, a non-square kernel
    ("im2col_native", (1, 16, 8, 8), (32, 16, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ("im2col_native", (2, 32, 4, 4), (32, 32, 3, 3), {"pads": [1, 1, 1, 1]}),
    ("im2col_native", (2, 16, 8, 8), (32, 16, 1, 1), {"strides": [2, 2]}),
    ("im2col_native", (1, 24, 3, 3), (90, 24, 3, 3), {"pads": [0, 2, 3, 1]}),
    ("im2col_native", (3, 6, 5, 5), (7, 6, 3, 2), {"strides": [3, 2], "pads": [1, 0, 0, 1]}),
    ("im2col_native", (2, 64, 2, 2), (20, 64, 3, 3), {"pads": [1, 1, 1, 1]}),
    ("im2col_native", (1, 8, 1, 1), (4, 8, 1, 1), {"pads": [0, 0, 0, 0], "strides": [2, 2]}),
    ("im2col_packed", (1, 160, 7, 5), (96, 160, 3, 3), {"pads": [1, 1, 1, 1]}),
    ("im2col_batched", (2, 64, 6, 6), (96, 64, 3, 3), {"pads": [1, 1, 1, 1]}),  # same width
    ("im2col_batched", (3, 64, 12, 10), (48, 64, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),  # half width
    ("im2col_batched", (2, 32, 13, 13), (64, 32, 5, 5), {"pads": [2, 2, 2, 2], "strides": [2, 2]}),  # phases
    ("im2col_batched", (3, 64, 9, 8), (48, 64, 3, 2), {"pads": [0, 1, 2, 0], "dilations": [2, 3]}),  # view
    ("im2col_batched", (4, 384, 9, 9), (128, 384, 1, 1), {"pads": [1, 0, 0, 1], "strides": [2, 2]}),  # padded 1x1
]

@pytest.fixture(autouse=True)
def _depthwise_route(request, monkeypatch):
    """A case built for ``depthwise_native`` or ``direct_native`` takes the C route (skipped where it
    was not built); every other case keeps it off, so the cases reach the numpy paths they name."""
    callspec = getattr(request.node, "callspec", None)
    case = callspec.params.get("case") if callspec is not None else None
    rows = bool(case) and case[0] == fused_conv.DEPTHWISE_NATIVE_ROWS
    channels = bool(case) and case[0] == fused_conv.DEPTHWISE_NATIVE_CHANNELS
    native = rows or channels or bool(case) and case[0] in (fused_conv.DEPTHWISE_NATIVE, fused_conv.DIRECT_NATIVE,
                                                            fused_conv.DIRECT_NATIVE_FEW, fused_conv.POINTWISE_NATIVE,
                                                            fused_conv.IM2COL_NATIVE, fused_conv.DIRECT_NATIVE_SHIFTED)
    if native and native_module() is None:
        pytest.skip("the optional extension _native was not built (or ONNXHAL_NATIVE_KERNELS is 0)")
    if rows and not hasattr(native_module(), "depthwise_unit"):
        pytest.skip("the extension was built without depthwise_unit (a compiler without GNU C vectors)")
    packed = bool(case) and case[0] in (fused_conv.PACKED_POINTWISE, fused_conv.PACKED_IM2COL)
    if packed and not fused_conv.packed_gemm_supported(native_module()):
        pytest.skip("_native.packed_gemm was not built or this CPU lacks AVX-512")
    if packed and get_blas_threads() is None:
        pytest.skip("BLAS is not OpenBLAS: its threads cannot be set to the one the packed product needs")
    monkeypatch.setattr(fused_conv, "NATIVE_PACKED_ENABLED", packed)
    if packed and get_blas_threads() != 1:  # the packed product runs where BLAS runs on one thread
        before = get_blas_threads()
        set_blas_threads(1)
        request.addfinalizer(lambda: set_blas_threads(before))
    monkeypatch.setattr(fused_conv, "NATIVE_DEPTHWISE_ENABLED", native)
    monkeypatch.setattr(fused_conv, "NATIVE_DIRECT_ENABLED", native)
    monkeypatch.setattr(fused_conv, "NATIVE_POINTWISE_ENABLED", native)
    monkeypatch.setattr(fused_conv, "NATIVE_SMALL_ENABLED", bool(case) and case[0] == fused_conv.IM2COL_NATIVE)
    # the direct_native_few cases on small planes reach direct_conv, not shifted_conv
    monkeypatch.setattr(fused_conv, "NATIVE_SHIFTED_ENABLED", bool(case) and case[0] == fused_conv.DIRECT_NATIVE_SHIFTED)
    # the depthwise_native cases at unit stride reach direct_conv, not the row blocks ahead of it
    monkeypatch.setattr(fused_conv, "NATIVE_DEPTHWISE_ROWS_ENABLED", rows)
    # and the small-plane depthwise_native cases reach direct_conv, not depthwise_channels
    monkeypatch.setattr(fused_conv, "NATIVE_DEPTHWISE_CHANNELS_ENABLED", channels)


VARIANTS = [  # (bias, residual, activation, activation_params)
    ("random", False, "", []),
    ("random", True, "Relu", []),
    (None, True, "", []),
    ("zero", False, "Clip", [0.0, 6.0]),
    ("random", False, "LeakyRelu", [0.1]),
    # without a residual, the C routes apply these as they write the outputs
    ("random", False, "Relu", []),
    (None, False, "HardSwish", [0.2, 0.5]),
]


def _attrs(attrs: dict, w_shape: tuple) -> dict:
    full = {"kernel_shape": list(w_shape[2:]), "group": 1, "strides": [1, 1], "dilations": [1, 1], "pads": [0] * 4}
    full.update(attrs)
    return full


def _out_shape(x_shape: tuple, w_shape: tuple, a: dict) -> tuple:
    k, s, d, p = w_shape[2:], a["strides"], a["dilations"], a["pads"]
    return (x_shape[0], w_shape[0]) + tuple((x_shape[2 + i] + p[i] + p[2 + i] - (k[i] - 1) * d[i] - 1) // s[i] + 1
                                            for i in range(2))


def reference_conv(x: np.ndarray, w: np.ndarray, a: dict) -> np.ndarray:
    """The canonical convolution in float64: a sum over the taps of strided views of the padded
    input, per group."""
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    g, (sh, sw), (dh, dw), p = a["group"], a["strides"], a["dilations"], a["pads"]
    oh, ow = _out_shape(x.shape, w.shape, a)[2:]
    xp = np.zeros((n, c, h + p[0] + p[2], wd + p[1] + p[3]))
    xp[:, :, p[0]:p[0] + h, p[1]:p[1] + wd] = x
    y = np.zeros((n, m, oh, ow))
    mg = m // g
    for gi in range(g):
        xg = xp[:, gi * cg:(gi + 1) * cg]
        wg = w[gi * mg:(gi + 1) * mg].astype(np.float64)
        for i in range(kh):
            for j in range(kw):
                win = xg[:, :, i * dh:i * dh + (oh - 1) * sh + 1:sh, j * dw:j * dw + (ow - 1) * sw + 1:sw]
                y[:, gi * mg:(gi + 1) * mg] += np.einsum("nchw,mc->nmhw", win, wg[:, :, i, j])
    return y


def canonical(x, w, b, z, a, act, params, shuffle):
    """Conv, then bias, residual and activation, then the shuffle; and the sum of the terms'
    magnitudes, which bounds float32's rounding of any summation order."""
    y = reference_conv(x, w, a)
    mag = reference_conv(np.abs(x), np.abs(w), a)
    if b is not None:
        y += b.reshape(1, -1, 1, 1)
        mag += np.abs(b).reshape(1, -1, 1, 1)
    if z is not None:
        y += z
        mag += np.abs(z)
    if act == "Relu":
        y = np.maximum(y, 0)
    elif act == "Clip":
        y = np.clip(y, *params)
    elif act == "LeakyRelu":
        y = np.where(y < 0, y * params[0], y)
    elif act == "HardSwish":
        y = y * np.clip(y * params[0] + params[1], 0, 1)
    if shuffle:
        n, m = y.shape[:2]
        y = y.reshape(n, shuffle, m // shuffle, *y.shape[2:]).swapaxes(1, 2).reshape(y.shape)
        mag = mag.reshape(n, shuffle, m // shuffle, *mag.shape[2:]).swapaxes(1, 2).reshape(mag.shape)
    return y, mag


class _Initializers(KernelCreateContext):
    """Weights and bias are constant initializers: the kernel may keep what it derives from them
    and remember a small layer's path per shape (``_remember``)."""

    def is_constant_initializer(self, name: str) -> bool:
        return name in ("w", "b")


def fused_kernel(w_shape: tuple, a: dict, bias: bool, residual: bool, act: str, params: list,
                 shuffle: int = 0, constant: bool = False) -> FusedConv:
    inputs = ["x", "w", "b" if bias else "", "z" if residual else ""]
    protos = [helper.make_attribute(k, v) for k, v in a.items()]
    if act:
        protos.append(helper.make_attribute("activation", act))
        if params:
            protos.append(helper.make_attribute("activation_params", [float(v) for v in params]))
    if shuffle:
        protos.append(helper.make_attribute("channel_shuffle", shuffle))
    node = Node("FusedConv", inputs, ["y"], domain=DOMAIN, attribute_protos=protos)
    node.since_version = 1
    return FusedConv(node, _Initializers() if constant else None)


def _inputs(rng, x_shape, w_shape, a, bias, residual, edge):
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    if edge:  # zeros, large and tiny magnitudes, and exact cancellations side by side
        x.reshape(-1)[::7] = 0.0
        x.reshape(-1)[1::11] = 3.0e4
        x.reshape(-1)[2::13] = -3.0e4
        x.reshape(-1)[3::5] = 1.0e-30
        w.reshape(-1)[::3] = 0.0
    b = None if bias is None else (np.zeros(w_shape[0], np.float32) if bias == "zero"
                                   else rng.standard_normal(w_shape[0]).astype(np.float32))
    z = rng.standard_normal(_out_shape(x_shape, w_shape, a)).astype(np.float32) if residual else None
    return x, w, b, z


def _check(kernel, path, x, w, b, z, a, act, params, shuffle=0):
    want, mag = canonical(x, w, b, z, a, act, params, shuffle)
    for _ in range(2):  # the second run takes the path kept per shape (``_remember``) where there is one
        y = kernel.compute([x, w, b, z])[0]
        assert kernel.last_path == path, f"selected {kernel.last_path}, the case is built for {path}"
        assert y.shape == want.shape and y.dtype == np.float32
        err = np.abs(y.astype(np.float64) - want)
        bound = 1e-5 * mag + 1e-6
        worst = np.unravel_index(np.argmax(err - bound), err.shape)
        assert np.all(err <= bound), f"path {path} diverges at {worst}: {y[worst]} against {want[worst]}"


def test_every_path_has_a_case():
    assert {c[0] for c in CASES} == set(CONV_PATHS)
    assert all(p.condition for p in CONV_PATHS.values())


@pytest.mark.parametrize("constant", [False, True], ids=["fed", "initializers"])
@pytest.mark.parametrize("edge", [False, True], ids=["random", "edge"])
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: f"{v[0]}-{'z' if v[1] else 'noz'}-{v[2] or 'none'}")
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{'x'.join(map(str, c[1]))}-{'x'.join(map(str, c[2]))}")
def test_path_matches_canonical(case, variant, edge, constant):
    path, x_shape, w_shape, attrs = case
    bias, residual, act, params = variant
    a = _attrs(attrs, w_shape)
    rng = np.random.default_rng(CASES.index(case) * 100 + VARIANTS.index(variant) * 2 + edge)
    x, w, b, z = _inputs(rng, x_shape, w_shape, a, bias, residual, edge)
    _check(fused_kernel(w_shape, a, b is not None, residual, act, params, constant=constant), path, x, w, b, z, a, act,
           params)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{'x'.join(map(str, c[1]))}-{'x'.join(map(str, c[2]))}")
def test_kept_path_follows_new_values(case):
    """With constant weights a layer's path may be kept per input shape (``_remember``): later runs
    of that shape with other inputs and residuals still match the canonical convolution."""
    path, x_shape, w_shape, attrs = case
    a = _attrs(attrs, w_shape)
    rng = np.random.default_rng(CASES.index(case) + 5000)
    kernel = fused_kernel(w_shape, a, True, True, "Relu", [], constant=True)
    x, w, b, z = _inputs(rng, x_shape, w_shape, a, "random", True, False)
    for edge in (False, True, False):
        x, _, _, z = _inputs(rng, x_shape, w_shape, a, "random", True, edge)
        _check(kernel, path, x, w, b, z, a, "Relu", [])


@pytest.mark.parametrize("case", [c for c in CASES if c[3].get("group", 1) > 1
                                  and "depthwise" not in c[0]], ids=lambda c: f"{c[0]}-{c[3]['group']}")
@pytest.mark.parametrize("residual", [False, True])
def test_shuffled_groups_match_canonical(case, residual):
    """A fused ShuffleNet shuffle of as many groups as the convolution: written in place without a
    residual, by one copy with one."""
    path, x_shape, w_shape, attrs = case
    a = _attrs(attrs, w_shape)
    rng = np.random.default_rng(7)
    x, w, b, z = _inputs(rng, x_shape, w_shape, a, "random", residual, False)
    kernel = fused_kernel(w_shape, a, True, residual, "Relu", [], shuffle=a["group"], constant=True)
    _check(kernel, path, x, w, b, z, a, "Relu", [], shuffle=a["group"])


def test_split_pointwise_takes_im2col_1x1():
    """A pointwise product large enough to split between workers leaves ``pointwise`` for the
    general path's in-place right side."""
    old = (worker_pool.WORKERS, worker_pool.SPLIT_PRODUCTS)
    worker_pool.set_workers(2, True)
    try:
        a = _attrs({}, (64, 64, 1, 1))
        rng = np.random.default_rng(3)
        x, w, b, z = _inputs(rng, (1, 64, 32, 33), (64, 64, 1, 1), a, "random", True, False)
        _check(fused_kernel((64, 64, 1, 1), a, True, True, "Relu", []), "im2col_1x1", x, w, b, z, a, "Relu", [])
    finally:
        worker_pool.set_workers(*old)


def _ort_conv(x, w, b, z, a, relu):
    inits = [numpy_helper.from_array(w, "w")]
    inputs = ["x", "w"]
    if b is not None:
        inits.append(numpy_helper.from_array(b, "b"))
        inputs.append("b")
    y_shape = list(_out_shape(x.shape, w.shape, a))
    nodes = [helper.make_node("Conv", inputs, ["c"], **a)]
    graph_inputs = [vi("x", list(x.shape))]
    last = "c"
    feeds = {"x": x}
    if z is not None:
        nodes.append(helper.make_node("Add", ["c", "z"], ["s"]))
        graph_inputs.append(vi("z", y_shape))
        feeds["z"] = z
        last = "s"
    nodes.append(helper.make_node("Relu" if relu else "Identity", [last], ["y"]))
    model = make(nodes, graph_inputs, [vi("y", y_shape)], inits, opset=17)
    model.ir_version = 10
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{'x'.join(map(str, c[1]))}-{'x'.join(map(str, c[2]))}")
def test_path_matches_onnxruntime(case, relu):
    path, x_shape, w_shape, attrs = case
    a = _attrs(attrs, w_shape)
    rng = np.random.default_rng(11)
    x, w, b, z = _inputs(rng, x_shape, w_shape, a, "random", True, False)
    kernel = fused_kernel(w_shape, a, True, True, "Relu" if relu else "", [])
    y = kernel.compute([x, w, b, z])[0]
    assert kernel.last_path == path
    want = _ort_conv(x, w, b, z, a, relu)
    _, mag = canonical(x, w, b, z, a, "", [], 0)
    assert np.all(np.abs(y.astype(np.float64) - want) <= 2e-5 * mag + 1e-6)


@pytest.mark.parametrize("x_shape, path", [((1, 4, 50), "gather"), ((2, 32, 900), "im2col_same_width")])
def test_1d_runs_its_2d_twins_path(x_shape, path):
    """A 1-D convolution runs as its 2-D twin over (N, C, 1, L) and records the twin's path."""
    w_shape = (24, x_shape[1], 3)
    a1 = {"kernel_shape": [3], "pads": [2, 0], "strides": [1], "dilations": [1], "group": 1}
    a2 = _attrs({"pads": [0, 2, 0, 0]}, w_shape[:2] + (1, 3))
    rng = np.random.default_rng(5)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    b = rng.standard_normal(w_shape[0]).astype(np.float32)
    kernel = fused_kernel(w_shape, a1, True, False, "Relu", [])
    y = kernel.compute([x, w, b, None])[0]
    assert kernel.last_path == path
    want, mag = canonical(x[:, :, None, :], w[:, :, None, :], b, None, a2, "Relu", [], 0)
    assert np.all(np.abs(y.astype(np.float64) - want[:, :, 0, :]) <= 1e-5 * mag[:, :, 0, :] + 1e-6)


@pytest.mark.parametrize("case", [c for c in CASES if c[0].startswith("gather")],
                         ids=lambda c: f"{c[0]}-{'x'.join(map(str, c[1]))}-{'x'.join(map(str, c[2]))}")
@pytest.mark.parametrize("bias", [False, True])
def test_gather_indices_in_range(case, bias):
    """The gather paths take with mode="wrap" (faster than numpy's bounds-checked default), which
    is only the same take while every index falls inside the flat input and its appended cells."""
    path, x_shape, w_shape, attrs = case
    a = _attrs(attrs, w_shape)
    out_hw = _out_shape(x_shape, w_shape, a)[2:]
    p = a["pads"]
    pads = (p[0], p[1], p[2], p[3])
    depthwise = path == "gather_depthwise"
    limit = None if not depthwise or tuple(a["strides"]) == (1, 1) else fused_conv.STRIDED_DEPTHWISE_GATHER_MAX
    plan = gather_plan(x_shape, w_shape, pads, out_hw, tuple(a["strides"]), tuple(a["dilations"]), depthwise,
                       bias and path != "gather_grouped", limit)
    assert plan is not None
    idx, appended = plan[:2]
    size = int(np.prod(x_shape)) + (len(APPENDED) if appended else 0)
    assert idx.min() >= 0 and idx.max() < size


def test_depthwise_native_float64_and_its_switches(monkeypatch):
    """The C depthwise route in float64 against the canonical convolution (within float64's
    rounding), its argument checks, and ONNXHAL_NATIVE_KERNELS=0 / NATIVE_DEPTHWISE_ENABLED
    keeping the numpy paths."""
    from onnxhal.runtime.providers.cpu.kernels.native_kernels import NATIVE_SWITCH

    native = native_module()
    if native is None:
        pytest.skip("the optional extension _native was not built (or ONNXHAL_NATIVE_KERNELS is 0)")
    a = _attrs({"group": 12, "pads": [1, 2, 0, 1], "strides": [2, 1], "dilations": [1, 2]}, (12, 1, 3, 3))
    rng = np.random.default_rng(8)
    x, w = rng.standard_normal((2, 12, 11, 9)), rng.standard_normal((12, 1, 3, 3))
    b, z = rng.standard_normal(12), rng.standard_normal(_out_shape(x.shape, w.shape, a))
    monkeypatch.setattr(fused_conv, "NATIVE_DEPTHWISE_ENABLED", True)
    monkeypatch.setattr(fused_conv, "NATIVE_DEPTHWISE_CHANNELS_ENABLED", False)  # its 6x8 outputs: direct_conv
    kernel = fused_kernel(w.shape, a, True, True, "Relu", [])
    y = kernel.compute([x, w, b, z])[0]
    assert kernel.last_path == fused_conv.DEPTHWISE_NATIVE and y.dtype == np.float64
    want, _ = canonical(x, w, b, z, a, "Relu", [], 0)
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)
    y32 = np.empty((2, 12, 6, 8), np.float32)
    with pytest.raises(ValueError):  # mixed types
        native.direct_conv(x, w.astype(np.float32), None, y32, (2, 1), (1, 2), (1, 2), 12)
    with pytest.raises(ValueError):  # weights of another channel count
        native.direct_conv(x, w[:6], None, y32.astype(np.float64), (2, 1), (1, 2), (1, 2), 12)
    with pytest.raises(ValueError):  # a zero stride
        native.direct_conv(x, w, None, y32.astype(np.float64), (0, 1), (1, 2), (1, 2), 12)
    with pytest.raises(ValueError):  # a group that does not divide the channels
        native.direct_conv(x, w, None, y32.astype(np.float64), (2, 1), (1, 2), (1, 2), 5)
    small = _attrs({"group": 12, "pads": [1, 1, 1, 1]}, (12, 1, 3, 3))  # one output a plane: the gather's
    kernel = fused_kernel(w.shape, small, True, False, "Relu", [])
    kernel.compute([x[:, :, :1, :1].astype(np.float32), w.astype(np.float32), b.astype(np.float32), None])
    assert kernel.last_path == fused_conv.GATHER_DEPTHWISE
    monkeypatch.setattr(fused_conv, "NATIVE_DEPTHWISE_ENABLED", False)
    kernel = fused_kernel(w.shape, a, True, True, "Relu", [])
    kernel.compute([x, w, b, z])
    assert kernel.last_path != fused_conv.DEPTHWISE_NATIVE
    monkeypatch.setattr(fused_conv, "NATIVE_DEPTHWISE_ENABLED", True)
    monkeypatch.setenv(NATIVE_SWITCH, "0")
    kernel = fused_kernel(w.shape, a, True, True, "Relu", [])
    kernel.compute([x, w, b, z])
    assert kernel.last_path != fused_conv.DEPTHWISE_NATIVE


@pytest.mark.parametrize("act, params", [("Relu", []), ("HardSwish", [0.25, 0.5])])  # float32-exact
def test_depthwise_rows_float64_activation_and_checks(monkeypatch, act, params):
    """The C row blocks (depthwise_native_rows) in float64 against the canonical convolution; their
    activation applied in C to the bit of the numpy epilogue on their own sums, NaN kept; their
    argument checks; and NATIVE_DEPTHWISE_ROWS_ENABLED = False leaving the layer to direct_conv."""
    native = native_module()
    if native is None or not hasattr(native, "depthwise_unit"):
        pytest.skip("the optional extension _native was not built with depthwise_unit")
    monkeypatch.setattr(fused_conv, "NATIVE_DEPTHWISE_ENABLED", True)
    monkeypatch.setattr(fused_conv, "NATIVE_DEPTHWISE_ROWS_ENABLED", True)
    a = _attrs({"group": 6, "pads": [3, 2, 1, 3]}, (6, 1, 7, 5))
    rng = np.random.default_rng(12)
    x, w = rng.standard_normal((2, 6, 13, 21)), rng.standard_normal((6, 1, 7, 5))
    b, z = rng.standard_normal(6), rng.standard_normal(_out_shape(x.shape, w.shape, a))
    kernel = fused_kernel(w.shape, a, True, True, act, params)
    y = kernel.compute([x, w, b, z])[0]
    assert kernel.last_path == fused_conv.DEPTHWISE_NATIVE_ROWS and y.dtype == np.float64
    want, _ = canonical(x, w, b, z, a, act, params, 0)
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)
    x32, w32, b32 = x.astype(np.float32), w.astype(np.float32), b.astype(np.float32)
    x32[1, 2, 5, 7] = np.nan
    kernel = fused_kernel(w.shape, a, True, False, act, params)
    epilogue, kernel.act = kernel.act, None  # the numpy epilogue, which the C row blocks must not need
    y = kernel.compute([x32, w32, b32, None])[0]
    assert kernel.last_path == fused_conv.DEPTHWISE_NATIVE_ROWS
    want = fused_kernel(w.shape, a, True, False, "", []).compute([x32, w32, b32, None])[0].copy()
    epilogue(want)
    np.testing.assert_array_equal(y, want)
    assert np.isnan(y).any()
    y64 = np.empty(want.shape, np.float64)
    with pytest.raises(ValueError):  # mixed types
        native.depthwise_unit(x, w32, None, y64, (3, 2))
    with pytest.raises(ValueError):  # a kernel height it is not built for
        native.depthwise_unit(x, np.zeros((6, 1, 4, 5)), None, y64, (3, 2))
    with pytest.raises(ValueError):  # not depthwise: two input channels per output
        native.depthwise_unit(x, np.zeros((3, 2, 7, 5)), None, y64[:, :3], (3, 2))
    with pytest.raises(ValueError):  # a top pad past the kernel's reach: the last kernel row reads only padding
        native.depthwise_unit(x[:, :, :4], w, None, np.empty((2, 6, 12, 21)), (7, 2))
    monkeypatch.setattr(fused_conv, "NATIVE_DEPTHWISE_ROWS_ENABLED", False)
    kernel = fused_kernel(w.shape, a, True, True, act, params)
    kernel.compute([x, w, b, z])
    assert kernel.last_path == fused_conv.DEPTHWISE_NATIVE


@pytest.mark.parametrize("act, params", [("Relu", []), ("Clip", [-0.5, 0.75]), ("HardSwish", [0.2, 0.5])])
def test_native_activation_applied_in_c(monkeypatch, act, params):
    """Without a residual, depthwise_native and direct_native apply Relu, Clip and HardSwish in C
    (native_activation): the numpy epilogue is not called, and the outputs are its, to the bit
    (float32, each operation rounded alike), NaN kept; with a residual the epilogue runs after it."""
    if native_module() is None:
        pytest.skip("the optional extension _native was not built (or ONNXHAL_NATIVE_KERNELS is 0)")
    monkeypatch.setattr(fused_conv, "NATIVE_DEPTHWISE_ENABLED", True)
    monkeypatch.setattr(fused_conv, "NATIVE_DIRECT_ENABLED", True)
    rng = np.random.default_rng(11)
    for x_shape, w_shape, attrs in (((2, 8, 9, 10), (8, 1, 3, 3), {"group": 8, "pads": [1, 1, 1, 1]}),
                                    ((1, 3, 40, 36), (6, 3, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]})):
        a = _attrs(attrs, w_shape)
        x = rng.standard_normal(x_shape).astype(np.float32)
        x[0, 0, 1, 1] = np.nan
        w, b = rng.standard_normal(w_shape).astype(np.float32), rng.standard_normal(w_shape[0]).astype(np.float32)
        kernel = fused_kernel(w_shape, a, True, False, act, params)
        epilogue = kernel.act
        kernel.act = None  # the numpy epilogue, which the C route must not need
        y = kernel.compute([x, w, b, None])[0]
        assert kernel.last_path in (fused_conv.DEPTHWISE_NATIVE, fused_conv.DIRECT_NATIVE)
        plain = fused_kernel(w_shape, a, True, False, "", [])
        want = plain.compute([x, w, b, None])[0].copy()
        epilogue(want)
        np.testing.assert_array_equal(y, want)
        assert np.isnan(y).any()
        z = rng.standard_normal(y.shape).astype(np.float32)
        with_z = fused_kernel(w_shape, a, True, True, act, params).compute([x, w, b, z])[0]
        want = plain.compute([x, w, b, None])[0] + z
        epilogue(want)
        np.testing.assert_array_equal(with_z, want)
    with pytest.raises(ValueError):  # an activation code the C kernel does not have
        native_module().direct_conv(x, w, b, np.empty_like(y), (1, 1), (1, 1), (1, 1), 1, 3, 0.0, 1.0)


def test_packed_gemm_blocks_checks_and_when_it_runs(monkeypatch):
    """_native.packed_gemm alone against a float64 product: two images, a range of its channel
    blocks (the others left as they were), no bias; its argument checks; and the layer leaving the
    packed path where BLAS runs on more than one thread, for float64, several images, or with
    NATIVE_PACKED_ENABLED off."""
    native = native_module()
    if not fused_conv.packed_gemm_supported(native):
        pytest.skip("_native.packed_gemm was not built or this CPU lacks AVX-512")
    block = native.PACKED_GEMM_BLOCK
    rng = np.random.default_rng(11)
    m, k, p = block + 9, 300, 10
    w = rng.standard_normal((m, k)).astype(np.float32)
    x = rng.standard_normal((2, k, p)).astype(np.float32)
    padded = np.zeros((2 * block, k), np.float32)
    padded[:m] = w
    wp = np.ascontiguousarray(padded.reshape(2, block, k).transpose(0, 2, 1))
    y = np.full((2, m, p), 7.0, np.float32)
    native.packed_gemm(wp, x, None, y, (1, 2))
    want = np.matmul(w.astype(np.float64), x.astype(np.float64))
    np.testing.assert_allclose(y[:, block:], want[:, block:], rtol=1e-4, atol=1e-4)
    assert np.all(y[:, :block] == 7.0)
    with pytest.raises(ValueError):  # blocks past the weights'
        native.packed_gemm(wp, x, None, y, (0, 3))
    with pytest.raises(ValueError):  # weights packed for another K
        native.packed_gemm(wp[:, :-1], x, None, y, (0, 2))
    with pytest.raises(ValueError):  # float64
        native.packed_gemm(wp, x.astype(np.float64), None, y, (0, 2))

    if get_blas_threads() is None:
        return
    a = _attrs({}, (80, 600, 1, 1))
    x, w, b, z = _inputs(rng, (1, 600, 6, 9), (80, 600, 1, 1), a, "random", False, False)
    before = get_blas_threads()
    monkeypatch.setattr(fused_conv, "NATIVE_PACKED_ENABLED", True)
    monkeypatch.setattr(worker_pool, "SPLIT_PRODUCTS", False)
    try:
        for threads, path in ((1, "pointwise_packed"), (2, "pointwise")):
            set_blas_threads(threads)
            _check(fused_kernel(w.shape, a, True, False, "", []), path, x, w, b, None, a, "", [])
        set_blas_threads(1)
        _check(fused_kernel(w.shape, a, True, False, "", []), "pointwise", np.concatenate([x, x]), w, b, None, a, "",
               [])
        y64 = fused_kernel(w.shape, a, True, False, "", []).compute([x.astype(np.float64), w.astype(np.float64),
                                                                    b.astype(np.float64), None])[0]
        assert y64.dtype == np.float64
        monkeypatch.setattr(fused_conv, "NATIVE_PACKED_ENABLED", False)
        _check(fused_kernel(w.shape, a, True, False, "", []), "pointwise", x, w, b, None, a, "", [])
    finally:
        set_blas_threads(before)


@pytest.mark.parametrize("act,params", [("HardSwish", [0.2, 0.5]), ("Clip", [-1.0, 1.5]), ("LeakyRelu", [0.1])])
def test_pointwise_native_against_pointwise(monkeypatch, act, params):
    """pointwise_native against the plain pointwise path on the same inputs, switched by
    NATIVE_POINTWISE_ENABLED: float64 and float32, a strided (non-contiguous) input, a residual,
    an activation applied in C (HardSwish, Clip) or after it in numpy (LeakyRelu); and the
    argument checks of _native.pointwise_conv."""
    native = native_module()
    if native is None or not hasattr(native, "pointwise_conv"):
        pytest.skip("the optional extension _native was not built (or ONNXHAL_NATIVE_KERNELS is 0)")
    rng = np.random.default_rng(21)
    a = _attrs({}, (70, 48, 1, 1))
    for dtype in (np.float64, np.float32):
        x = rng.standard_normal((2, 96, 3, 5)).astype(dtype)[:, ::2]  # every other channel: a strided view
        w = rng.standard_normal((70, 48, 1, 1)).astype(dtype)
        b = rng.standard_normal(70).astype(dtype)
        z = rng.standard_normal((2, 70, 3, 5)).astype(dtype)
        outs = {}
        for enabled in (False, True):
            monkeypatch.setattr(fused_conv, "NATIVE_POINTWISE_ENABLED", enabled)
            kernel = fused_kernel(w.shape, a, True, True, act, params, constant=True)
            for _ in range(2):  # the second run through the path kept per shape
                outs[enabled] = kernel.compute([x, w, b, z])[0]
                assert kernel.last_path == ("pointwise_native" if enabled else "pointwise")
                assert outs[enabled].dtype == dtype
        tol = 1e-12 if dtype == np.float64 else 1e-5
        np.testing.assert_allclose(outs[True], outs[False], rtol=tol, atol=tol)
    wt = np.zeros((48, native.POINTWISE_BLOCK))
    x3, y3 = np.ones((2, 48, 4)), np.empty((2, 40, 4))
    native.pointwise_conv(wt, x3, None, None, y3)
    assert np.all(y3 == 0)
    with pytest.raises(ValueError):  # padded width not a multiple of POINTWISE_BLOCK
        native.pointwise_conv(wt[:, :50], x3, None, None, y3)
    with pytest.raises(ValueError):  # more output channels than the padded width
        native.pointwise_conv(wt, x3, None, None, np.empty((2, native.POINTWISE_BLOCK + 1, 4)))
    with pytest.raises(ValueError):  # weights of another type than x
        native.pointwise_conv(wt.astype(np.float32), x3, None, None, y3)
    with pytest.raises(ValueError):  # a residual of another shape
        native.pointwise_conv(wt, x3, None, np.ones((2, 40, 3)), y3)


@pytest.mark.parametrize("act,params", [("HardSwish", [0.2, 0.5]), ("Relu", []), ("LeakyRelu", [0.1])])
def test_im2col_native_against_the_gather(monkeypatch, act, params):
    """im2col_native against the path it replaces (the gather) on the same inputs, switched by
    NATIVE_SMALL_ENABLED: float64 and float32, a strided (non-contiguous) input, a residual, an
    activation in C (HardSwish, Relu as a clamp) or after it (LeakyRelu); a layer over the stack
    buffer's bound keeps the gather; and the argument checks of _native.small_conv."""
    native = native_module()
    if native is None or not hasattr(native, "small_conv"):
        pytest.skip("the optional extension _native was not built (or ONNXHAL_NATIVE_KERNELS is 0)")
    monkeypatch.setattr(fused_conv, "NATIVE_DIRECT_ENABLED", True)
    rng = np.random.default_rng(47)
    a = _attrs({"pads": [1, 1, 1, 1], "strides": [2, 2]}, (32, 16, 3, 3))
    for dtype in (np.float64, np.float32):
        x = rng.standard_normal((2, 32, 8, 8)).astype(dtype)[:, ::2]  # every other channel: a strided view
        w = rng.standard_normal((32, 16, 3, 3)).astype(dtype)
        b = rng.standard_normal(32).astype(dtype)
        z = rng.standard_normal((2, 32, 4, 4)).astype(dtype)
        outs = {}
        for enabled in (False, True):
            monkeypatch.setattr(fused_conv, "NATIVE_SMALL_ENABLED", enabled)
            kernel = fused_kernel(w.shape, a, True, True, act, params, constant=True)
            for _ in range(2):  # the second run through the path kept per shape
                outs[enabled] = kernel.compute([x, w, b, z])[0]
                assert kernel.last_path == ("im2col_native" if enabled else "gather")
                assert outs[enabled].dtype == dtype
        tol = 1e-12 if dtype == np.float64 else 1e-5
        np.testing.assert_allclose(outs[True], outs[False], rtol=tol, atol=tol)
    monkeypatch.setattr(fused_conv, "NATIVE_SMALL_ENABLED", True)
    big = fused_kernel((8, 256, 3, 3), _attrs({"pads": [1, 1, 1, 1]}, (8, 256, 3, 3)), False, False, "", [])
    big.compute([np.ones((1, 256, 4, 4), np.float32), np.ones((8, 256, 3, 3), np.float32)])
    assert big.last_path != "im2col_native"  # 256 x 9 x 16 cells: above SMALL_CONV_MAX_CELLS
    wt = np.zeros((16 * 9, native.POINTWISE_BLOCK))
    x4, y4 = np.ones((2, 16, 4, 4)), np.empty((2, 40, 4, 4))
    native.small_conv(wt, x4, None, None, y4, (1, 1), (1, 1), (3, 3))
    assert np.all(y4 == 0)
    with pytest.raises(ValueError):  # weight rows not C kh kw
        native.small_conv(wt, x4, None, None, y4, (1, 1), (1, 1), (1, 1))
    with pytest.raises(ValueError):  # padded width not a multiple of POINTWISE_BLOCK
        native.small_conv(wt[:, :50], x4, None, None, y4, (1, 1), (1, 1), (3, 3))
    with pytest.raises(ValueError):  # a zero stride
        native.small_conv(wt, x4, None, None, y4, (0, 1), (1, 1), (3, 3))
    with pytest.raises(ValueError):  # weights of another type than x
        native.small_conv(wt.astype(np.float32), x4, None, None, y4, (1, 1), (1, 1), (3, 3))
    with pytest.raises(ValueError):  # windows above the stack buffer
        native.small_conv(np.zeros((256 * 9, 64)), np.ones((1, 256, 4, 4)), None, None, np.empty((1, 8, 4, 4)),
                          (1, 1), (1, 1), (3, 3))


def test_taps_leaves_small_planes_of_many_outputs_to_im2col():
    """taps' other conditions, but its product over the padded plane would cost more than
    im2col's window copy (fused_conv.TAPS_MAX_WASTED_ROWS): im2col, against the canonical form."""
    a = _attrs({"pads": [1, 1, 1, 1]}, (96, 192, 3, 3))
    x, w, b, z = _inputs(np.random.default_rng(12), (1, 192, 5, 5), (96, 192, 3, 3), a, "random", True, False)
    assert fused_conv.taps_wasted_rows(96, (7, 7), (5, 5)) > fused_conv.TAPS_MAX_WASTED_ROWS
    _check(fused_kernel(w.shape, a, True, True, "Relu", []), "im2col_same_width", x, w, b, z, a, "Relu", [])


@pytest.mark.parametrize("n, m, blas", [(1, 9, 2), (3, 8, 2), (3, 8, 1)])
def test_native_split_parts_match_one_call(monkeypatch, n, m, blas):
    """``native_split`` over two workers: one image in parts of whole blocks of output channels (a
    last block short of 4), several images in parts of images; each part one C call, together equal
    to one call over everything, bias and Relu in C included. Where BLAS has one thread for the run
    (the load governor's choice), one call."""
    native = native_module()
    if native is None:
        pytest.skip("the optional extension _native was not built (or ONNXHAL_NATIVE_KERNELS is 0)")
    monkeypatch.setattr(worker_pool, "WORKERS", 2)
    monkeypatch.setattr(worker_pool, "PARALLEL_MIN_WORK", 1)
    monkeypatch.setattr(worker_pool, "SPLIT_PRODUCTS", False)
    monkeypatch.setattr(fused_conv, "get_blas_threads", lambda: blas)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((n, 12, 11, 10)).astype(np.float32)
    w = rng.standard_normal((m, 12, 3, 3)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    geometry, act = ((1, 1), (1, 1), (1, 1), 1), fused_conv.native_activation("Relu", [])
    want = np.empty((n, m, 11, 10), np.float32)
    native.direct_conv(x, w, b, want, *geometry, *act)
    calls = []

    def direct(*args):
        calls.append(args[3].shape[:2])
        native.direct_conv(*args)

    got = np.full_like(want, np.nan)
    fused_conv.native_split(direct, x, w, b, got, geometry, act)
    if blas == 1:
        assert calls == [(n, m)]
    else:
        assert sorted(calls) == ([(1, 4), (1, 5)] if n == 1 else [(1, m), (2, m)])  # in either order
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("x_shape, w_shape, attrs, residual", [
    ((2, 3, 32, 32), (16, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}, False),  # resnet_ts's stem
    ((2, 16, 8, 8), (16, 16, 3, 3), {"pads": [1, 1, 1, 1]}, True),  # its few-channel layer with a residual
])
def test_a_kept_unsplit_direct_layer_calls_the_kernel_itself(monkeypatch, x_shape, w_shape, attrs, residual):
    """A layer under ``worker_pool.PARALLEL_MIN_WORK`` (``never_split``): its kept run calls
    ``_native.direct_conv`` without ``native_split`` (fused_conv.DIRECT_BOUND_UNSPLIT), and gives
    what the run through ``native_split`` gives (the switch off), bit for bit."""
    if native_module() is None:
        pytest.skip("the optional extension _native was not built (or ONNXHAL_NATIVE_KERNELS is 0)")
    monkeypatch.setattr(fused_conv, "NATIVE_DIRECT_ENABLED", True)  # the fixture turns it off for cases without one
    a = _attrs(attrs, w_shape)
    x, w, b, z = _inputs(np.random.default_rng(5), x_shape, w_shape, a, "random", residual, False)
    oh, ow = _out_shape(x_shape, w_shape, a)[2:]
    assert fused_conv.never_split(x_shape[0] * w.size * oh * ow)
    split_calls = []
    real_split = fused_conv.native_split
    monkeypatch.setattr(fused_conv, "native_split", lambda *args: (split_calls.append(1), real_split(*args)))
    outputs = {}
    for bound in (False, True):
        monkeypatch.setattr(fused_conv, "DIRECT_BOUND_UNSPLIT", bound)
        kernel = fused_kernel(w_shape, a, True, residual, "Relu", [], constant=True)
        kernel.compute([x, w, b, z])  # the first run resolves the path and keeps its run
        split_calls.clear()
        outputs[bound] = kernel.compute([x, w, b, z])[0]
        assert kernel.last_path in ("direct_native", "direct_native_few")
        assert split_calls == ([] if bound else [1])
    np.testing.assert_array_equal(outputs[True], outputs[False])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_direct_conv_wide_blocks(dtype):
    """_native.direct_conv's blocks of 6 output channels (at least 128 products per output over a
    plane of at least 1024) and what is left after them: 14 channels as 6 + 4 + 4, 7 as 6 + 1, 4
    as one block of 4; its blocks of 8 on smaller planes: 12 as 8 + 4, 11 as 8 + 3 single ones;
    against a float64 convolution, with a stride-2 layer and two images."""
    native = native_module()
    if native is None:
        pytest.skip("the optional extension _native was not built (or ONNXHAL_NATIVE_KERNELS is 0)")
    rng = np.random.default_rng(8)
    for hw, m, strides, pads in (((34, 64), 14, [1, 1], [1, 1, 1, 1]), ((34, 64), 7, [1, 1], [1, 0, 1, 2]),
                                 ((34, 64), 4, [1, 1], [0, 0, 0, 0]), ((34, 64), 13, [2, 2], [1, 1, 1, 1]),
                                 ((8, 8), 12, [1, 1], [1, 1, 1, 1]), ((7, 9), 11, [1, 1], [0, 1, 2, 1])):
        x = rng.standard_normal((2, 16) + hw).astype(dtype)
        w = rng.standard_normal((m, 16, 3, 3)).astype(dtype)
        b = rng.standard_normal(m).astype(dtype)
        a = _attrs({"pads": pads, "strides": strides}, w.shape)
        want = reference_conv(x, w, a) + b.reshape(1, -1, 1, 1)
        y = np.empty(want.shape, dtype)
        native.direct_conv(x, w, b, y, tuple(strides), tuple(pads[:2]), (1, 1), 1)
        tol = 1e-4 if dtype == np.float32 else 1e-11
        np.testing.assert_allclose(y, want, rtol=tol, atol=tol)


def test_few_channels_bounds():
    """direct_native_few's condition at its bounds: 3x3 alone, dilation 1, the channel bounds at unit
    stride and stride 2, the fewest outputs a plane; direct_native keeps 4 channels and fewer."""
    few, top, strided = fused_conv.few_channels_apply, fused_conv.NATIVE_FEW_MAX_CHANNELS, fused_conv.NATIVE_FEW_MAX_STRIDED_CHANNELS
    least = fused_conv.NATIVE_FEW_MIN_OUTPUTS
    assert few((top, 3, 3), (16, 16), (1, 1), (1, 1)) and not few((top + 1, 3, 3), (16, 16), (1, 1), (1, 1))
    assert few((strided, 3, 3), (16, 16), (2, 2), (1, 1)) and not few((strided + 1, 3, 3), (16, 16), (2, 2), (1, 1))
    assert not few((16, 3, 3), (16, 16), (2, 1), (1, 1)) and not few((16, 3, 3), (16, 16), (1, 1), (2, 2))
    assert not few((16, 5, 5), (16, 16), (1, 1), (1, 1)) and not few((16, 3, 1), (16, 16), (1, 1), (1, 1))
    assert not few((16, 3, 3), (1, least - 1), (1, 1), (1, 1)) and few((16, 3, 3), (1, least), (1, 1), (1, 1))
    full = fused_conv.NATIVE_FEW_FULL_OUTPUTS  # smaller planes take at most the strided bound at unit stride too
    assert few((top, 3, 3), (1, full), (1, 1), (1, 1)) and not few((top, 3, 3), (1, full - 1), (1, 1), (1, 1))
    assert few((strided, 3, 3), (1, full - 1), (1, 1), (1, 1))
    assert not few((fused_conv.NATIVE_DIRECT_MAX_CHANNELS, 3, 3), (16, 16), (1, 1), (1, 1))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_depthwise_channels_matches_direct_conv(monkeypatch, dtype):
    """_native.depthwise_channels sums the same products in the same order as direct_conv (bias,
    then the live taps row-major, a padding cell as a zero): equal bit for bit on strides,
    dilations, asymmetric pads, channels not a multiple of a vector, with and without bias and
    activation; its argument checks; and its switch leaving the layer to direct_conv."""
    native = native_module()
    if native is None:
        pytest.skip("the optional extension _native was not built (or ONNXHAL_NATIVE_KERNELS is 0)")
    rng = np.random.default_rng(44)
    cases = [((1, 144, 4, 4), 5, (2, 2), (2, 2), (1, 1)), ((2, 37, 7, 5), 3, (2, 1), (1, 0), (1, 2)),
             ((1, 288, 2, 2), 3, (1, 1), (1, 1), (1, 1)), ((1, 17, 6, 6), 3, (1, 1), (2, 2), (2, 2)),
             ((1, 40, 3, 3), 3, (1, 1), (0, 0), (1, 1))]
    for x_shape, k, strides, pads, dil in cases:
        c = x_shape[1]
        x = rng.standard_normal(x_shape).astype(dtype)
        w = rng.standard_normal((c, 1, k, k)).astype(dtype)
        b = rng.standard_normal(c).astype(dtype)
        a = _attrs({"group": c, "pads": [*pads, *pads], "strides": list(strides), "dilations": list(dil)}, w.shape)
        out = _out_shape(x_shape, w.shape, a)
        for bias, act in [(b, ()), (None, ()), (b, (1, 0.0, 6.0)), (b, (2, 1 / 6, 0.5))]:
            want, got = np.empty(out, dtype), np.empty(out, dtype)
            native.direct_conv(x, w, bias, want, strides, pads, dil, c, *act)
            native.depthwise_channels(x, w, bias, got, strides, pads, dil, *act)
            np.testing.assert_array_equal(got, want)
    x = rng.standard_normal((1, 12, 4, 4))
    y = np.empty((1, 12, 4, 4))
    with pytest.raises(ValueError):  # mixed types
        native.depthwise_channels(x, np.zeros((12, 1, 3, 3), np.float32), None, y, (1, 1), (1, 1), (1, 1))
    with pytest.raises(ValueError):  # not depthwise weights
        native.depthwise_channels(x, np.zeros((12, 2, 3, 3)), None, y, (1, 1), (1, 1), (1, 1))
    with pytest.raises(ValueError):  # a zero dilation
        native.depthwise_channels(x, np.zeros((12, 1, 3, 3)), None, y, (1, 1), (1, 1), (0, 1))
    with pytest.raises(ValueError):  # an unknown activation
        native.depthwise_channels(x, np.zeros((12, 1, 3, 3)), None, y, (1, 1), (1, 1), (1, 1), 7, 0.0, 0.0)
    a = _attrs({"group": 144, "pads": [2, 2, 2, 2], "strides": [2, 2]}, (144, 1, 5, 5))
    for enabled, path in [(True, fused_conv.DEPTHWISE_NATIVE_CHANNELS), (False, fused_conv.DEPTHWISE_NATIVE)]:
        monkeypatch.setattr(fused_conv, "NATIVE_DEPTHWISE_ENABLED", True)
        monkeypatch.setattr(fused_conv, "NATIVE_DEPTHWISE_CHANNELS_ENABLED", enabled)
        kernel = fused_kernel((144, 1, 5, 5), a, True, False, "Relu", [])
        kernel.compute([rng.standard_normal((1, 144, 4, 4)).astype(dtype), rng.standard_normal((144, 1, 5, 5)).astype(
            dtype), rng.standard_normal(144).astype(dtype), None])
        assert kernel.last_path == path


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_shifted_conv_matches_direct_conv(monkeypatch, dtype):
    """_native.shifted_conv sums the same products in the same order as direct_conv (bias, then
    each channel's live taps row-major): equal bit for bit over kernel shapes, pads (none,
    asymmetric, wider than the kernel reaches), planes of one, two and four vectors a tile,
    channels past the blocks, with and without bias and activation; its argument checks; and its
    switch leaving the layer to direct_native_few."""
    native = native_module()
    if native is None or not hasattr(native, "shifted_conv"):
        pytest.skip("the optional extension _native was not built (or ONNXHAL_NATIVE_KERNELS is 0)")
    rng = np.random.default_rng(44)
    cases = [((2, 64, 8, 8), (64, 3, 3), (1, 1, 1, 1)), ((1, 9, 4, 4), (25, 3, 3), (1, 1, 1, 1)),
             ((1, 7, 12, 13), (8, 5, 5), (2, 1, 2, 3)), ((1, 5, 6, 6), (3, 3, 2), (0, 0, 0, 0)),
             ((2, 3, 5, 7), (31, 3, 3), (3, 0, 1, 2)), ((1, 4, 1, 20), (6, 1, 3), (0, 1, 0, 1))]
    for x_shape, (m, kh, kw), pads in cases:
        x = rng.standard_normal(x_shape).astype(dtype)
        w = rng.standard_normal((m, x_shape[1], kh, kw)).astype(dtype)
        b = rng.standard_normal(m).astype(dtype)
        out = _out_shape(x_shape, w.shape, _attrs({"pads": list(pads)}, w.shape))
        for bias, act in [(b, ()), (None, ()), (b, (1, 0.0, np.inf)), (b, (2, 1 / 6, 0.5))]:
            want, got = np.empty(out, dtype), np.empty(out, dtype)
            native.direct_conv(x, w, bias, want, (1, 1), pads[:2], (1, 1), 1, *act)
            native.shifted_conv(x, w, bias, got, pads[:2], *act)
            np.testing.assert_array_equal(got, want)
    x = rng.standard_normal((1, 12, 4, 4))
    y = np.empty((1, 8, 4, 4))
    with pytest.raises(ValueError):  # mixed types
        native.shifted_conv(x, np.zeros((8, 12, 3, 3), np.float32), None, y, (1, 1))
    with pytest.raises(ValueError):  # weights of another channel count
        native.shifted_conv(x, np.zeros((8, 6, 3, 3)), None, y, (1, 1))
    with pytest.raises(ValueError):  # a negative pad
        native.shifted_conv(x, np.zeros((8, 12, 3, 3)), None, y, (-1, 1))
    with pytest.raises(ValueError):  # an unknown activation
        native.shifted_conv(x, np.zeros((8, 12, 3, 3)), None, y, (1, 1), 7, 0.0, 0.0)
    a = _attrs({"pads": [1, 1, 1, 1]}, (64, 64, 3, 3))
    for enabled, path in [(True, fused_conv.DIRECT_NATIVE_SHIFTED), (False, fused_conv.DIRECT_NATIVE_FEW)]:
        monkeypatch.setattr(fused_conv, "NATIVE_DIRECT_ENABLED", True)
        monkeypatch.setattr(fused_conv, "NATIVE_SHIFTED_ENABLED", enabled)
        kernel = fused_kernel((64, 64, 3, 3), a, True, False, "Relu", [])
        kernel.compute([rng.standard_normal((1, 64, 8, 8)).astype(dtype),
                        rng.standard_normal((64, 64, 3, 3)).astype(dtype), rng.standard_normal(64).astype(dtype), None])
        assert kernel.last_path == path


def test_shifted_bounds():
    """direct_native_shifted's condition at its bounds: unit strides and dilations, more than one
    tap, the products an output and the outputs a plane."""
    ok, lo, hi = fused_conv.shifted_applies, fused_conv.NATIVE_SHIFTED_MIN_SUMS, fused_conv.NATIVE_SHIFTED_MAX_SUMS
    least, most = fused_conv.NATIVE_SHIFTED_MIN_OUTPUTS, fused_conv.NATIVE_SHIFTED_MAX_OUTPUTS
    assert ok((64, 3, 3), (8, 8), (1, 1), (1, 1))
    assert not ok((64, 3, 3), (8, 8), (2, 2), (1, 1)) and not ok((64, 3, 3), (8, 8), (1, 1), (1, 2))
    assert not ok((hi, 1, 1), (8, 8), (1, 1), (1, 1))
    assert ok((hi // 9, 3, 3), (8, 8), (1, 1), (1, 1)) and not ok((hi // 9 + 1, 3, 3), (8, 8), (1, 1), (1, 1))
    assert ok((-(-lo // 9), 3, 3), (8, 8), (1, 1), (1, 1)) and not ok((lo // 9 - 1, 3, 3), (8, 8), (1, 1), (1, 1))
    assert ok((64, 3, 3), (1, least), (1, 1), (1, 1)) and not ok((64, 3, 3), (1, least - 1), (1, 1), (1, 1))
    assert ok((64, 3, 3), (1, most), (1, 1), (1, 1)) and not ok((64, 3, 3), (1, most + 1), (1, 1), (1, 1))


def test_small_planes_leave_rows_to_channels(monkeypatch):
    """Unit-stride depthwise layers under NATIVE_ROWS_MIN_OUTPUTS outputs a plane take
    depthwise_native_channels, larger ones depthwise_native_rows, and with the channels path off
    the small ones keep the rows; every route equal bit for bit (the same products in the same
    order as direct_conv); ROWS_YIELD_SMALL_PLANES off keeps them on the rows."""
    native = native_module()
    if native is None or not hasattr(native, "depthwise_unit") or not hasattr(native, "depthwise_channels"):
        pytest.skip("the optional extension _native was not built with its depthwise kernels")
    rng = np.random.default_rng(45)
    monkeypatch.setattr(fused_conv, "NATIVE_DEPTHWISE_ENABLED", True)
    monkeypatch.setattr(fused_conv, "NATIVE_DEPTHWISE_ROWS_ENABLED", True)
    for hw, k, c in [((2, 2), 3, 288), ((3, 3), 3, 40), ((4, 4), 5, 24), ((2, 3), 3, 17)]:
        a = _attrs({"group": c, "pads": [k // 2] * 4}, (c, 1, k, k))
        feeds = [rng.standard_normal((2, c) + hw).astype(np.float32), rng.standard_normal((c, 1, k, k)).astype(
            np.float32), rng.standard_normal(c).astype(np.float32), None]
        outs = {}
        for channels in (True, False):
            monkeypatch.setattr(fused_conv, "NATIVE_DEPTHWISE_CHANNELS_ENABLED", channels)
            kernel = fused_kernel((c, 1, k, k), a, True, False, "Relu", [])
            outs[channels] = kernel.compute(feeds)[0]
            small = hw[0] * hw[1] < fused_conv.NATIVE_ROWS_MIN_OUTPUTS
            want = fused_conv.DEPTHWISE_NATIVE_CHANNELS if channels and small else fused_conv.DEPTHWISE_NATIVE_ROWS
            assert kernel.last_path == want, (hw, channels)
        np.testing.assert_array_equal(outs[True], outs[False])
        monkeypatch.setattr(fused_conv, "NATIVE_DEPTHWISE_CHANNELS_ENABLED", True)
        monkeypatch.setattr(fused_conv, "ROWS_YIELD_SMALL_PLANES", False)
        kernel = fused_kernel((c, 1, k, k), a, True, False, "Relu", [])
        np.testing.assert_array_equal(kernel.compute(feeds)[0], outs[True])
        assert kernel.last_path == fused_conv.DEPTHWISE_NATIVE_ROWS
        monkeypatch.setattr(fused_conv, "ROWS_YIELD_SMALL_PLANES", True)
