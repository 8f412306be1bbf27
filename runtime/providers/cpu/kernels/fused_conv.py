"""``com.onnxhal`` FusedConv: Conv + optional residual Z + activation, run as one im2col GEMM.

2-D float convolutions run here, by a path chosen once per input shape (``_resolve``); every path
is named in ``CONV_PATHS`` with the condition that selects it, and a run records its own in
``last_path`` (tests/test_fused_conv_paths.py holds each to the plain Conv plus epilogue). 1x1
convolutions with unit stride and no padding take the input in place as the product's right side
(``_pointwise``: one batched product over the groups, one epilogue), or, with a bias and fewer
input than output channels, a copy of it under a row of ones per group, the bias in the product.
Depthwise ones take their own path (below). Others copy the windows once (stride-2 ones half as
wide as an even input from its four stride phases as flat planes, other 7x7/5x5 strided ones from
the padded stride phases, unit-stride ones as wide as their input as contiguous slices of the
flattened planes), then the product runs per block of output channels (or per group), split between
the workers when BLAS is single-threaded, and bias, residual and activation are applied to each
block while it is still in cache. A copied, ungrouped convolution carries its bias inside the
product instead (a row of ones under the windows, a column [W | b]), which saves a pass over the
output. With several images and fewer output positions per image than output channels (ResNet's
deep layers), all images' windows lie side by side for one product that reads the weights once
(``_batched_columns``); small ungrouped im2col layers are kept per shape (``_remember``). One
image's ungrouped products over planes of at most ``PACKED_MAX_COLUMNS`` outputs (ResNet's and
MobileNet's 7x7 stages), while BLAS runs on one thread, take the C extension's packed product
instead (``_packed_product``: the weights packed once, the bias added in C). A unit-stride convolution as wide as its input with at most half as many outputs as inputs
(DenseNet's 3x3 layers) skips im2col: one product of all taps' weights with the padded input, then
the taps' products added at their offsets (``_tap_products``). With ``channel_shuffle`` = G (the
optimizer's fold of a following ShuffleNet shuffle), output channel g * C/G + j goes to channel j *
G + g: a grouped convolution with G groups writes each group's product straight into its shuffled
channels (BLAS takes the strided rows), anything else is shuffled by one copy. With the C
extension built, depthwise convolutions run there: at unit stride with 3, 5 or 7 kernel rows by
blocks of output rows that share each loaded input row (``_native.depthwise_unit``), others on
planes of at most 64 outputs over a channel-last copy, eight vectors of channels summed per output
(``_native.depthwise_channels``), the rest one tap at a time over the plane (``_native.direct_conv``); so do ungrouped convolutions of a few input
channels (stems: ``direct_native``) and 3x3 ones of up to 128 over planes of 64 outputs and more
(VGG-style stacks: ``direct_native_few``), blocks of output channels summed in registers over
tiles of the plane, split between the workers (``native_split``); and small ungrouped 1x1 ones
(``pointwise_native``: ``_native.pointwise_conv``, bias, residual and Relu/Clip/HardSwish in the
same call). Other small ungrouped ones (at most 16 outputs a plane) copy their windows into a
stack buffer in C and run the same product (``im2col_native``: ``_native.small_conv``). Without it, depthwise convolutions copy
their taps as contiguous rows of the input's stride phases (flat planes without a border when the
output keeps the input's width at unit stride or halves it at stride 2) tap-major
and reduce them with one batched BLAS product (``depthwise_rows``); the bias is added in the copy
that cuts the outputs from those rows, where there is one. Small ungrouped and depthwise ones
(``conv.gather_plan``: up to 32k window elements) gather all their windows in one take instead,
then one product, or one multiply and one sum over the taps; small grouped ones gather the same
rows and run one product batched over the groups. With constant weights, a small
layer's path is remembered per input shape as one function with its derived weights bound in
(``_remember``); a constant all-zero bias is left out. A convolution whose end taps read only
padding for this input size runs as its twin with the weight cut to the live taps
(``dead_taps``: DeepLabV3's dilated 3x3 layers over small maps become 1x1 ones). A 1-D convolution runs as its 2-D twin
over (N, C, 1, L). Anything else (3-D, integer) runs through the CPU EP's Conv kernel, then the
same epilogue.
"""

from __future__ import annotations

import threading

import numpy as np
from onnx import helper

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.run_control import check_terminate
from onnxhal.runtime.providers.cpu.kernels import conv as _conv
from onnxhal.runtime.providers.cpu.kernels import half_via_float as half
from onnxhal.runtime.providers.cpu.kernels import worker_pool
from onnxhal.runtime.providers.cpu.kernels.blas_threads import get_blas_threads
from onnxhal.runtime.providers.cpu.kernels.clamp import clip_ufunc
from onnxhal.runtime.providers.cpu.kernels.conv import (
    APPENDED,
    DEPTHWISE_LAYOUTS,
    depthwise_layout,
    depthwise_rows,
    gather_plan,
    gathered_weights,
    pad_spatial,
    per_shape,
    rows_to_output,
    rows_view,
    same_width,
)
from onnxhal.runtime.providers.cpu.kernels.conv3d import FramesAs2d
from onnxhal.runtime.providers.cpu.kernels.dead_taps import TrimmedTaps
from onnxhal.runtime.providers.cpu.kernels.fused import DOMAIN, FusedBase, writable
from onnxhal.runtime.providers.cpu.kernels.kernel_paths import path_table
from onnxhal.runtime.providers.cpu.kernels.native_kernels import native_module
from onnxhal.runtime.providers.cpu.kernels.registry import register
from onnxhal.runtime.providers.cpu.kernels.worker_pool import parallel_ranges
from onnxhal.runtime.providers.op_geometry import output_sizes, resolve_pads

#: Every path of ``FusedConv``, by name; a kernel's ``last_path`` names the one its last 2-D run took.
#: The canonical form of every path is the plain convolution (the CPU EP's Conv) followed by bias,
#: residual, activation and shuffle; tests/test_fused_conv_paths.py runs each against it.
CONV_PATHS = path_table("FusedConv", "the CPU EP's Conv followed by bias, residual, activation and shuffle")
_path = CONV_PATHS.add


TAPS = _path("taps", "ungrouped, more than one tap, at most half as many outputs as inputs, unit stride "
                     "and the output as wide as the input (conv.same_width), windows above conv.gather_plan's limit, "
                     "at most TAPS_MAX_WASTED_ROWS product rows spent on the padding (taps_wasted_rows)")
#: Depthwise convolutions above the gather limit (group == C == M, one input channel per group) run
#: through ``conv.depthwise_rows``, one path per ``conv.DEPTHWISE_LAYOUTS`` entry.
DEPTHWISE_PATHS = {_path(f"depthwise_{layout.name}", "depthwise above the gather limit, conv.depthwise_rows "
                         f"layout {layout.name!r}: {layout.condition}"): layout.name
                   for layout in DEPTHWISE_LAYOUTS.values()}
POINTWISE = _path("pointwise", "1x1, unit stride, no padding, and either products are not split between "
                               "workers or the work is under worker_pool.PARALLEL_MIN_WORK")
GATHER = _path("gather", "ungrouped, not pointwise, windows within conv.gather_plan's limit")
GATHER_DEPTHWISE = _path("gather_depthwise", "depthwise within conv.gather_plan's limit")
DIRECT_NATIVE = _path("direct_native", "ungrouped, more than one tap, at most NATIVE_DIRECT_MAX_CHANNELS input "
                                       "channels and NATIVE_DIRECT_MAX_K input values per output, at least "
                                       "NATIVE_DIRECT_MIN_OUTPUTS outputs a plane, the C extension "
                                       "_native built, ONNXHAL_NATIVE_KERNELS not 0 and NATIVE_DIRECT_ENABLED (ahead "
                                       "of every other ungrouped path): _native.direct_conv, then residual and "
                                       "activation (without a residual, native_activation's in C)")
DIRECT_NATIVE_FEW = _path("direct_native_few", "ungrouped 3x3, dilations 1, "
                                               "more than NATIVE_DIRECT_MAX_CHANNELS and at most "
                                               "NATIVE_FEW_MAX_CHANNELS input channels at unit stride (at most "
                                               "NATIVE_FEW_MAX_STRIDED_CHANNELS at stride 2 or under "
                                               "NATIVE_FEW_FULL_OUTPUTS outputs a plane), at least "
                                               "NATIVE_FEW_MIN_OUTPUTS outputs a plane, the C extension _native "
                                               "built, ONNXHAL_NATIVE_KERNELS not 0 and NATIVE_DIRECT_ENABLED "
                                               "(after direct_native, ahead of the gather and im2col): "
                                               "direct_native's C convolution, split between the workers "
                                               "(native_split)")
DIRECT_NATIVE_SHIFTED = _path("direct_native_shifted", "ungrouped, more than one tap, unit strides and dilations, "
                                                       "shifted_applies (NATIVE_SHIFTED_MIN_OUTPUTS to "
                                                       "NATIVE_SHIFTED_MAX_OUTPUTS outputs a plane, "
                                                       "NATIVE_SHIFTED_MIN_SUMS to NATIVE_SHIFTED_MAX_SUMS products an "
                                                       "output), _native.shifted_conv built, ONNXHAL_NATIVE_KERNELS "
                                                       "not 0, NATIVE_DIRECT_ENABLED and NATIVE_SHIFTED_ENABLED "
                                                       "(after direct_native, ahead of direct_native_few): the input "
                                                       "as kw column-shifted copies, so tiles of the plane sum only "
                                                       "outputs, split between the workers as direct_native_few")
DEPTHWISE_NATIVE_ROWS = _path("depthwise_native_rows", "depthwise at unit strides and dilations with a kernel of "
                                                       "NATIVE_ROWS_KERNEL_HEIGHTS rows, every tap reaching the input "
                                                       "for some output, at least NATIVE_ROWS_MIN_OUTPUTS (16) "
                                                       "outputs a plane where depthwise_native_channels and "
                                                       "ROWS_YIELD_SMALL_PLANES are on, "
                                                       "at least NATIVE_DEPTHWISE_MIN_OUTPUTS "
                                                       "outputs a plane, _native.depthwise_unit built, "
                                                       "ONNXHAL_NATIVE_KERNELS not 0 and NATIVE_DEPTHWISE_ENABLED and "
                                                       "NATIVE_DEPTHWISE_ROWS_ENABLED (ahead of depthwise_native): "
                                                       "blocks of output rows summed together in C, each input row "
                                                       "loaded once for every output row it feeds, then the residual "
                                                       "and activation as depthwise_native's")
DEPTHWISE_NATIVE_CHANNELS = _path("depthwise_native_channels", "depthwise that depthwise_native_rows does not take, "
                                                               "at least NATIVE_CHANNELS_MIN_OUTPUTS and at most "
                                                               "NATIVE_CHANNELS_MAX_OUTPUTS outputs a plane, "
                                                               "_native.depthwise_channels built, ONNXHAL_NATIVE_KERNELS "
                                                               "not 0 and NATIVE_DEPTHWISE_ENABLED and "
                                                               "NATIVE_DEPTHWISE_CHANNELS_ENABLED (ahead of "
                                                               "depthwise_native and the gather): a channel-last copy, "
                                                               "each output's taps summed across channels in C, then "
                                                               "the residual and activation as depthwise_native's")
DEPTHWISE_NATIVE = _path("depthwise_native", "depthwise with at least NATIVE_DEPTHWISE_MIN_OUTPUTS outputs a plane, "
                                             "the C extension _native built, ONNXHAL_NATIVE_KERNELS not 0 and "
                                             "NATIVE_DEPTHWISE_ENABLED (ahead of the gather and the rows): "
                                             "_native.direct_conv, each tap summed over the plane in C, then the "
                                             "residual and activation (without a residual, native_activation's "
                                             "in C)")
GATHER_GROUPED = _path("gather_grouped", "grouped but not depthwise, not pointwise, windows within conv.gather_plan's "
                                         "limit: the ungrouped gather's rows, one product batched over the groups")
IM2COL_1X1 = _path("im2col_1x1", "1x1 without padding that no path above takes (strided, grouped-and-split, or "
                                 "a pointwise product large enough to split): the input, subsampled, is the product's "
                                 "right side")
IM2COL_SAME_WIDTH = _path("im2col_same_width", "im2col where the output is as wide as the input at unit stride: "
                                               "conv.same_width_taps")
IM2COL_HALF_WIDTH = _path("im2col_half_width", "im2col at stride 2 over an even input, output half as wide: "
                                               "conv.half_width_taps")
IM2COL_VIEW = _path("im2col_view", "im2col that neither flat-plane layout takes, with fewer than 25 taps, unit "
                                   "stride, or windows that tile the input: one strided window view copied")
IM2COL_PHASES = _path("im2col_phases", "im2col of 5x5 and larger strided windows that do not tile the input: "
                                       "conv.im2col_from_phases")
PACKED_POINTWISE = _path("pointwise_packed", "pointwise's conditions, and packed_applies (float32, one image, at most "
                                             "PACKED_MAX_COLUMNS outputs a plane, at least PACKED_MIN_CHANNELS output "
                                             "channels, _native.packed_gemm built and the CPU has "
                                             "AVX-512, ONNXHAL_NATIVE_KERNELS not 0 and NATIVE_PACKED_ENABLED) and "
                                             "BLAS on one thread at the run: _native.packed_gemm with the weights "
                                             "packed (once, when constant), then residual and activation")
PACKED_IM2COL = _path("im2col_packed", "ungrouped im2col (above the gather limit, not taps) and packed_applies, BLAS "
                                       "on one thread at the run: the windows copied as _im2col's layouts (1x1 ones "
                                       "subsampled), then pointwise_packed's product")
POINTWISE_NATIVE = _path("pointwise_native", "pointwise's conditions, ungrouped, at most NATIVE_POINTWISE_MAX_COLUMNS (16) "
                                             "outputs a plane and a product under worker_pool.PARALLEL_MIN_WORK "
                                             "multiply-adds (ahead of pointwise), float32 or float64, the C extension "
                                             "_native built, ONNXHAL_NATIVE_KERNELS not 0 and NATIVE_POINTWISE_ENABLED: "
                                             "_native.pointwise_conv with the weights transposed (once, when "
                                             "constant), the bias, residual and a Relu, Clip or HardSwish applied in C, "
                                             "other activations after it")
IM2COL_NATIVE = _path("im2col_native", "ungrouped, dilations 1, not pointwise_native's, at most NATIVE_SMALL_MAX_OUTPUTS "
                                       "outputs a plane, C kh kw x oh ow at most _native.SMALL_CONV_MAX_CELLS, a "
                                       "product under worker_pool.PARALLEL_MIN_WORK multiply-adds, float32 or float64 "
                                       "at the run, the C extension _native built, ONNXHAL_NATIVE_KERNELS not 0 and "
                                       "NATIVE_SMALL_ENABLED (after pointwise_native, ahead of the gather and "
                                       "im2col): _native.small_conv, the windows copied into a stack buffer and "
                                       "pointwise_conv's product with the transposed weights, bias, residual and a "
                                       "Relu, Clip or HardSwish in C, other activations after it")
IM2COL_BATCHED = _path("im2col_batched", "ungrouped im2col (not 1x1 unpadded, above the gather limit) of at least "
                                         "BATCHED_MIN_IMAGES images with fewer output positions per image than output "
                                         "channels: all images' windows side by side, one product")

#: The switch of ``DEPTHWISE_NATIVE`` (read when a kernel is built): False keeps depthwise
#: convolutions on the numpy paths (the tests compare them).
NATIVE_DEPTHWISE_ENABLED = True
#: The switch of ``PACKED_POINTWISE`` and ``PACKED_IM2COL`` (read when a kernel is built): False
#: keeps their layers on BLAS's products (the tests compare them).
NATIVE_PACKED_ENABLED = True
#: The most output positions per plane the packed product takes: it beats OpenBLAS's sgemm on
#: products of few columns, whose weights sgemm repacks each call, and loses on wider ones (one
#: thread each, CPU time, alternating, the product alone: M x K x P 512x2048x49 0.78,
#: 2048x512x49 0.78, 512x4608x49 0.76; 256x2304x196 1.07).
PACKED_MAX_COLUMNS = 64
#: The fewest output channels the packed product takes: one block of ``_native.PACKED_GEMM_BLOCK``.
PACKED_MIN_CHANNELS = 64
#: The switch of ``POINTWISE_NATIVE`` (read when a kernel is built): False keeps small 1x1 layers
#: on ``POINTWISE``'s BLAS product and numpy epilogue (the tests compare them).
NATIVE_POINTWISE_ENABLED = True
#: The most output positions per plane ``POINTWISE_NATIVE`` takes: it sums PW_COLS columns at a
#: time in registers and writes each output channel's row at a stride of the plane, where BLAS's
#: product over a wider plane runs at full width (one thread, alternating, the layer with its
#: epilogue, C against the BLAS path: 1x1 planes 0.52-0.95, 24 to 144 channels at 4x4 0.71, 40
#: to 16 at 2x2 0.20; at 8x8, 80 to 16 0.86 and 16 to 3 0.82 but 48 to 24 1.26, 168 to 40 1.55,
#: 240 to 40 1.6-2.5: DeepLabV3-LRASPP's 8x8 stage, 1.06 of the model's time with them).
NATIVE_POINTWISE_MAX_COLUMNS = 16
#: The switch of ``IM2COL_NATIVE`` (read when a kernel is built): False keeps small dense layers
#: on the gather and im2col (the tests compare them).
NATIVE_SMALL_ENABLED = True
#: The most output positions per plane ``IM2COL_NATIVE`` takes: pointwise_conv's product sums
#: PW_COLS columns at a time and writes each output channel's row at a stride of the plane, which
#: pays over the gather's take and BLAS product on small planes (NATIVE_POINTWISE_MAX_COLUMNS').
NATIVE_SMALL_MAX_OUTPUTS = 16
#: The switch of ``DEPTHWISE_NATIVE_ROWS`` (read when a layer's path is chosen): False leaves its
#: layers to ``DEPTHWISE_NATIVE`` (the tests compare them).
NATIVE_DEPTHWISE_ROWS_ENABLED = True
#: The switch of ``DEPTHWISE_NATIVE_CHANNELS`` (read when a layer's path is chosen): False leaves its
#: layers to ``DEPTHWISE_NATIVE`` and the gather (the tests compare them).
NATIVE_DEPTHWISE_CHANNELS_ENABLED = True
#: ``DEPTHWISE_NATIVE_CHANNELS``' bounds on the outputs a plane. direct_conv sums a whole tile of
#: DW_TILE outputs per channel and lays each channel's plane out alone, most of its work on small
#: planes; depthwise_channels sums eight vectors of channels per output. The C calls alone, one
#: thread, CPU time alternating, depthwise_channels against direct_conv (float32, bias): 144 channels
#: 5x5/2 to 2x2 0.33, 288 5x5 at 4x4 0.56, 96 and 144 3x3 at 8x8 0.87, 0.77, 576 5x5 at 7x7 0.81, 960
#: 3x3 at 7x7 0.93, 672 5x5/2 to 7x7 1.01; larger planes lose (240 5x5 at 14x14 0.92 but 480 3x3
#: 1.63, 120 5x5 at 28x28 2.18). Against depthwise_unit, which keeps its layers ahead, 1.3-2.4 at
#: 6x6 to 8x8 (0.84 at 4x4). The FusedConv layers of the corpus's mobile nets (two images, with
#: their epilogues; benchmarks/depthwise_paths.py): at 2x2 and 4x4 outputs 0.32-0.86, at 8x8 0.98
#: (48 channels 3x3/2) and 1.34 (24 channels 5x5/2): hence at most 6x6.
NATIVE_CHANNELS_MAX_OUTPUTS = 36
NATIVE_CHANNELS_MIN_OUTPUTS = 4
#: The kernel heights _native.depthwise_unit is built for (each unrolled over the rows of a block).
NATIVE_ROWS_KERNEL_HEIGHTS = (3, 5, 7)
#: The fewest outputs a plane ``DEPTHWISE_NATIVE_ROWS`` takes; smaller planes go to
#: ``DEPTHWISE_NATIVE_CHANNELS`` (where it is on and they have at least NATIVE_CHANNELS_MIN_OUTPUTS).
#: depthwise_unit's blocks of output rows hold one row or two there, so its per-channel work is
#: mostly the call's setup; depthwise_channels sums eight vectors of channels an output. The C
#: calls alone, one thread, CPU time alternating, depthwise_channels against depthwise_unit
#: (float32, bias, Relu; load 8): 288 3x3 at 2x2 0.52, 576 3x3 at 2x2 0.49, 96 3x3 at 3x3 0.81; at
#: 4x4 0.85-1.09 (144 and 240 channels gain, 16-96 lose), 5x5 and 6x6 1.25-1.49: hence under 4x4.
NATIVE_ROWS_MIN_OUTPUTS = 16
#: The switch of that bound (read when a layer's path is chosen): False keeps every plane
#: depthwise_unit takes on it, as before.
ROWS_YIELD_SMALL_PLANES = True
_NATIVE_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))  # the types _native.direct_conv takes
#: The fewest outputs per plane (oh x ow) the C route takes: with one, its per-call setup and the
#: whole tile of sums it computes per channel outweigh the gather's one product per channel, which
#: holds only the taps that reach the input (FusedConv with Relu, CPU time alternating, C against
#: numpy: 1x1 outputs of 256 channels 1.43; 2x2 0.19-0.86, from 16 to 960 channels, 3x3 to 7x7
#: taps, dilated or not; 4x4 0.14-0.87; 7x7 0.18-0.39). The C kernel leaves out the taps that read
#: only padding too, as the gather does.
NATIVE_DEPTHWISE_MIN_OUTPUTS = 4
#: ``DIRECT_NATIVE``'s bounds: at most this many input channels (a stem's RGB), input values per
#: output (C x kh x kw) and at least this many outputs a plane. A few input channels make
#: im2col's product thin and its window copy most of the work; more channels or smaller planes
#: favour BLAS's products and the gather (per layer, CPU time, C against numpy: 3 channels with
#: 16x16 and 32x32 outputs 0.66-0.95, the 7x7/2 stem of 3 channels 0.86; 16 channels at 8x8 1.3,
#: 32 at 4x4 3.5; the gather keeps 3-channel layers of 8x8 outputs).
#: The switch of ``DIRECT_NATIVE`` (read when a kernel is built): False keeps those layers on numpy.
NATIVE_DIRECT_ENABLED = True
#: The output channels _native.direct_conv sums together (its DC_BLOCK): ``native_split`` splits one
#: image's channels at multiples of it, so every part keeps whole blocks.
DIRECT_CONV_BLOCK = 4
NATIVE_DIRECT_MAX_CHANNELS = 4
#: A kept run (``FusedConv._remember``) of an ungrouped C layer too small to split
#: (``never_split``) calls ``_native.direct_conv`` itself, not ``native_split``, whose reading of
#: the work, workers and thread name came to about a microsecond a layer decided the same way at
#: every run. False (read when a run is kept): through ``native_split`` as before (the tests
#: compare them).
DIRECT_BOUND_UNSPLIT = True
NATIVE_DIRECT_MAX_K = 160
NATIVE_DIRECT_MIN_OUTPUTS = 256
#: ``DIRECT_NATIVE_FEW``'s bounds. VGG-style stacks of 3x3 layers with up to 128 channels over large
#: planes: im2col's product is thin (K = 9 C) and its window copy, nine times the input, is most of
#: the memory traffic, where direct_conv reads each input row from cache for four or six output
#: channels at a time. FusedConv with Relu, one thread, CPU time alternating, C against im2col
#: (N = 1; N = 2 alike): 8 to 16 at 32x32 0.39, 16 to 16 at 64x64 0.36, 16 to 32 at 16x16 0.54,
#: 32 to 32 at 16x16 0.52, 32 to 64 at 32x32 0.63, 64 to 64 at 32x32 0.63, 56x56 0.72 and 112x112
#: 0.61, 128 to 128 at 56x56 0.69, 96 to 96 at 28x28 0.92 (N = 2 0.75), 128 to 128 at 28x28 0.93
#: (0.80), 256 to 256 at 16x16 1.02 (0.93); stride 2: 16 to 32 from 32x32 0.55, 32 to 32 from
#: 64x64 0.56, 64 to 128 from 56x56 0.97. With direct_conv's blocks of 8 on small planes, against
#: the gather, the packed product and im2col (N = 1, N = 2): 64 to 64 at 14x14 0.68, 0.74, 128 to
#: 128 at 14x14 0.88, 0.93, 32 to 32 at 12x12 0.67, 0.58; at 8x8 16 to 32 0.73, 0.83, 32 to 64
#: 0.84, 0.79, 64 to 64 0.70, 0.87, but 128 to 128 1.05, 1.18 (so under NATIVE_FEW_FULL_OUTPUTS
#: outputs a plane, at most NATIVE_FEW_MAX_STRIDED_CHANNELS channels); 64 to 64 at 4x4 1.66, 1.69.
NATIVE_FEW_MAX_CHANNELS = 128
#: ``DIRECT_NATIVE_SHIFTED``'s bounds and switch (read when a kernel is built; False leaves those
#: layers to direct_native_few, the gather and im2col). direct_conv's layout keeps each row's
#: padding columns, so its tiles sum 96 cells for an 8x8 plane's 64 outputs; shifted_conv's sum
#: only outputs. One thread, CPU time, shifted_conv against direct_conv, alternating (3x3 with
#: Relu; load 8): 64 to 64 at 8x8 0.80-0.89 (N = 2 0.69-0.83), 32 to 64 at 8x8 0.79-0.95, 128 to
#: 128 at 8x8 0.74-0.80, 96 to 96 at 12x12 0.89-0.94, 32 to 48 at 6x6 0.90; no gain or a loss
#: outside: 4x4 planes 0.82-1.21, 16x16 0.96-1.07, 14x14 1.13-1.56, 256 to 256 at 7x7 (2304
#: products an output, its weight block past L1) 1.33-1.83.
NATIVE_SHIFTED_ENABLED = True
NATIVE_SHIFTED_MIN_OUTPUTS = 36
NATIVE_SHIFTED_MAX_OUTPUTS = 144
NATIVE_SHIFTED_MIN_SUMS = 128
NATIVE_SHIFTED_MAX_SUMS = 1152
NATIVE_FEW_MAX_STRIDED_CHANNELS = 64
NATIVE_FEW_MIN_OUTPUTS = 64
NATIVE_FEW_FULL_OUTPUTS = 128

#: ``TAPS``' bound on ``taps_wasted_rows``: its product runs over the padded plane, hp x wq
#: positions for oh x ow outputs, against im2col's copy of the windows, which it saves. Small planes
#: of many output channels lose: taps against im2col, one BLAS thread, CPU time alternating
#: (wasted rows): 128 to 32 at 56x56 (2.2) 0.61, at 28x28 (4.8) 0.71; 512 to 128 at 14x14 (40) 1.00;
#: 256 to 128 at 28x28 (19) 0.99; 512 to 256 at 14x14 (80) 1.17; 1024 to 512 at 14x14 (160) 1.22;
#: 1024 to 256 at 7x7 (166) 1.27; 512 to 256 at 7x7 (166) 1.37.
TAPS_MAX_WASTED_ROWS = 48

#: Images from which an ungrouped im2col convolution with fewer output positions per image than
#: output channels (the weights outweigh one image's windows) lays all images' windows side by
#: side, (K, N * P), for one product that reads the weights once, then transposes the (M, N, P)
#: result into the output (with the residual added in that pass). One BLAS thread, CPU time, the
#: transpose included: 512 to 512 3x3 at 7x7 0.85 of the per-image products' time at 2 images,
#: 0.73 at 4; 256 to 256 at 14x14 0.95 and 0.89; 128 at 28x28 (P > M) 1.06, left per image.
BATCHED_MIN_IMAGES = 2


#: The gather limit (window elements) of strided depthwise convolutions, whose gathered taps one
#: BLAS product per channel sums (``_gathered_depthwise``). Against the half-width or padded-phase
#: rows the gather wins up to about 48k elements and loses from about 55k. Unit-stride ones keep
#: ``conv.DEPTHWISE_GATHER_MAX``: their flat-plane rows are cheaper, so the gather loses sooner.
STRIDED_DEPTHWISE_GATHER_MAX = 3 << 14


#: ``conv.im2col_2d``'s layouts as this table's paths
_IM2COL_LAYOUTS = {"same_width": IM2COL_SAME_WIDTH, "half_width": IM2COL_HALF_WIDTH, "phases": IM2COL_PHASES,
                   "view": IM2COL_VIEW}


def _im2col(x: np.ndarray, pads: tuple[int, int, int, int], out_hw: tuple[int, int], kernel: tuple[int, int],
            strides: tuple[int, int], dilations: tuple[int, int], cols: np.ndarray) -> str:
    """Copy the windows of ``x`` zero-padded by ``pads`` into ``cols`` (N, C, kh, kw, oh, ow); the
    name of the path (``CONV_PATHS``) that copied them."""
    return _IM2COL_LAYOUTS[_conv.im2col_2d(x, pads, out_hw, kernel, strides, dilations, cols)]


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
        self._wb: tuple | None = None
        self._wt: tuple | None = None
        self._bs: tuple | None = None
        # What is derived from the weights and bias is kept only for constant initializers: a
        # graph input may be the same array on every run with new values written into it.
        constant = getattr(ctx, "is_constant_initializer", lambda name: False)  # ctx None: constant folding
        w_const = constant(node.inputs[1])
        b_const = not self.has_bias or constant(node.inputs[2])
        self._wd: tuple | None = None
        self._wg: tuple | None = None
        self._bz: tuple | None = None
        self._cacheable = {"_wb": w_const and b_const, "_wt": w_const, "_bs": b_const, "_wd": w_const and b_const,
                           "_wg": w_const, "_wp": w_const, "_wq": w_const,
                           "_bz": b_const}
        self._geometries: dict[tuple, tuple] = {}
        self.last_path: str | None = None  #: the ``CONV_PATHS`` name of the last 2-D float run
        self.shuffle = int(node.attr("channel_shuffle", 0))
        self._node, self._ctx = node, ctx
        self._conv_kernel: Kernel | None = None  # ``_fallback``, once made
        self._as_2d = self._twin_2d(node, ctx)
        #: a 3-D convolution that is a 2-D one over a view or a transpose of its input (conv3d), or None
        self.frames_as_2d = (FramesAs2d.for_node(node, ctx, lambda twin: FusedConv(twin, ctx))
                             if self._as_2d is None else None)
        self._w4: tuple | None = None
        self._fast: dict[tuple, tuple] = {}  # per input shape: (W, dtype, B, run), ``_remember``
        self._slow: set[tuple] = set()  # input shapes whose path ``_remember`` does not keep
        # the C convolutions' module, or None where not built or both switched off
        self._native = (native_module() if NATIVE_DEPTHWISE_ENABLED or NATIVE_DIRECT_ENABLED or NATIVE_PACKED_ENABLED
                        or NATIVE_POINTWISE_ENABLED else None)
        self._native_depthwise = self._native is not None and NATIVE_DEPTHWISE_ENABLED
        self._native_dense = self._native is not None and NATIVE_DIRECT_ENABLED
        self._native_packed = NATIVE_PACKED_ENABLED and packed_gemm_supported(self._native)
        self._native_pointwise = (NATIVE_POINTWISE_ENABLED and self._native is not None
                                  and hasattr(self._native, "pointwise_conv"))
        self._native_small = (NATIVE_SMALL_ENABLED and self._native is not None
                              and hasattr(self._native, "small_conv"))
        self._native_shifted = (NATIVE_SHIFTED_ENABLED and self._native_dense
                                and hasattr(self._native, "shifted_conv"))
        self._wq: tuple | None = None
        self._wp: tuple | None = None
        params = node.attr("activation_params") or []
        self._clip_bounds = ((float(params[0]), float(params[1]))
                             if node.attr("activation", "") == "Clip" and len(params) == 2 else None)
        self._native_act = native_activation(node.attr("activation", ""), params)
        self.taps = TrimmedTaps(node, ctx, lambda twin: FusedConv(twin, ctx))  #: taps reading only padding, cut

    @property
    def _fallback(self) -> Kernel:
        """The CPU EP's Conv of this node's convolution, for inputs the paths here do not take
        (another rank, an integer dtype, weights of another dtype); made at the first such run, as
        most FusedConvs never meet one (its constructor only keeps the attributes: what it
        refuses, it refuses when it runs)."""
        kernel = self._conv_kernel
        if kernel is None:
            from onnxhal.runtime.providers.cpu.kernel_factory import create_cpu_kernel

            node = self._node
            conv_attrs = [a for k, a in node.attribute_protos.items()
                          if k not in ("activation", "activation_params", "channel_shuffle")]
            conv = Node("Conv", node.inputs[:3], node.outputs[:1], name=node.name, attribute_protos=conv_attrs)
            conv.since_version = 11
            kernel = self._conv_kernel = create_cpu_kernel(conv, self._ctx, 11)
        return kernel

    @staticmethod
    def _twin_2d(node: Node, ctx: KernelCreateContext) -> FusedConv | None:
        """For a 1-D convolution (its attributes say so), the same convolution over (N, C, 1, L):
        the 2-D paths (one gather and one product for Whisper's small Conv1d layers) take it where
        the CPU EP's N-d Conv would copy a window view and then run the epilogue separately."""
        one_d = {"kernel_shape": 1, "strides": 1, "dilations": 1, "pads": 2}
        if not any(len(node.attr(k) or ()) == n for k, n in one_d.items()):
            return None
        if any(len(node.attr(k) or (0,) * n) != n for k, n in one_d.items()):
            return None  # attributes of mixed ranks: the N-d kernel reports them
        protos = {k: a for k, a in node.attribute_protos.items() if k not in one_d}
        for k, lead in (("kernel_shape", [1]), ("strides", [1]), ("dilations", [1])):
            if node.attr(k):
                protos[k] = helper.make_attribute(k, lead + list(node.attr(k)))
        if node.attr("pads"):
            pb, pe = node.attr("pads")
            protos["pads"] = helper.make_attribute("pads", [0, pb, 0, pe])
        twin = Node("FusedConv", node.inputs, node.outputs, name=node.name, domain=DOMAIN,
                    attribute_protos=list(protos.values()))
        twin.since_version = 1
        return FusedConv(twin, ctx)

    def _weights_2d(self, w: np.ndarray) -> np.ndarray:
        """``w`` (M, C/G, k) as (M, C/G, 1, k), the same view object while ``w`` is: the twin keeps
        what it derives from the weights only for arrays that come back."""
        cached = self._w4
        if cached is not None and cached[0] is w:
            return cached[1]
        w4 = w[:, :, None, :]
        self._w4 = (w, w4)
        return w4

    def _weights_with_bias(self, w: np.ndarray, b: np.ndarray) -> np.ndarray:
        """[W | b] as (M, K + 1)."""
        return self._derived("_wb", (w, b), lambda: np.concatenate(
            [w.reshape(w.shape[0], -1), b.reshape(-1, 1).astype(w.dtype)], axis=1))

    def _derived(self, slot: str, sources: tuple, build) -> np.ndarray:
        """``build()``, kept in attribute ``slot`` while the same ``sources`` arrays come back, when
        they are constant initializers (handed to every run as the same, unchanged objects)."""
        if not self._cacheable[slot]:
            return build()
        cached = getattr(self, slot)
        if cached is not None and all(a is b for a, b in zip(cached[0], sources)):
            return cached[1]
        value = build()
        setattr(self, slot, (sources, value))  # one swap: concurrent runs see an old or a new entry, both valid
        return value

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        if x.dtype is half.F16 and half.applies(x, inputs[1]):
            return half.via_float32(self.compute, inputs, self.widen)
        fast = self._fast.get(x.shape)
        if (fast is not None and inputs[1] is fast[0] and x.dtype is fast[1]
                and (not self.has_bias or inputs[2] is fast[2])):
            return [fast[3](x, inputs[3] if self.has_residual else None)]
        w = inputs[1]
        b = inputs[2] if self.has_bias else None
        z = inputs[3] if self.has_residual else None
        if x.ndim == 3 and self._as_2d is not None and x.dtype.kind == "f" and w.dtype == x.dtype and w.ndim == 3:
            y = self._as_2d.compute([x[:, :, None, :], self._weights_2d(w), b, None if z is None else z[:, :, None, :]])
            self.last_path = self._as_2d.last_path
            return [y[0][:, :, 0, :]]
        frames = self.frames_as_2d
        if frames is not None and frames.applies(x, w):
            y = frames.run(x, w, b, z)
            self.last_path = frames.twin.last_path
            kept = frames.twin._fast.get(frames.shape_2d(x.shape))
            if kept is not None:  # the twin's kept run, reshaped around, straight from the next run
                if len(self._fast) > 64:
                    self._fast.clear()
                self._fast[x.shape] = (w, x.dtype, b, frames.bound(x.shape, kept[3]))
            return [y]
        if x.ndim != 4 or x.dtype.kind != "f" or w.dtype != x.dtype:
            y = writable(self._fallback.compute(inputs[:3])[0], x.dtype)
            if z is not None:
                y += z
            if self.act is not None:
                self.act(y)
            return [shuffle_channels(y, self.shuffle)]
        trimmed = self.taps.run(inputs)
        if trimmed is not None:
            trimmed, twin = trimmed
            self.last_path = twin.last_path
            kept = twin._fast.get(x.shape)
            if kept is not None:  # the twin's kept run, its cut weights bound, straight from the next run
                if len(self._fast) > 64:
                    self._fast.clear()
                self._fast[x.shape] = (w, x.dtype, b, kept[3])
            return trimmed
        y = self._conv2d(x, w, b, z)
        if self._cacheable["_wb"] and not self.shuffle and x.shape not in self._slow:
            self._remember(x, w, b)
        return [y]

    def _remember(self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> None:
        """Keep, for ``x``'s shape, the run of a small layer's path as one function of (x, z) with
        everything derived from the constant weights bound in it, when the path is one of the
        small ones: ``compute`` then checks three identities and calls it. A MobileNet layer is
        3-5 numpy calls, and the calls through ``_conv2d`` and the epilogue helpers were as many
        microseconds again."""
        bias = None if b is None or self._zero_bias(b) else b
        entry = self._geometries.get((x.shape, w.shape, bias is not None))
        if entry is None:
            return
        path, plan = entry[3], entry[4]
        act = self.act
        clip = self._clip_bounds if x.dtype.kind == "f" else None
        if clip is not None:
            act = None
        lo, hi = clip or (None, None)

        def finish(y: np.ndarray, z: np.ndarray | None, shape: tuple) -> np.ndarray:
            """The epilogue on the product y: the residual, then Clip's bounds or the activation."""
            if z is not None:
                y += z.reshape(y.shape)
            if clip is not None:
                clip_ufunc(y, lo, hi, out=y)
            elif act is not None:
                act(y)
            return y.reshape(shape)

        if path == IM2COL_NATIVE and x.dtype in _NATIVE_FLOATS and w.dtype == x.dtype:
            # the C call with the transposed weights, geometry, bias and activation bound
            wt, small, dtype = self._transposed_weights(w), self._native.small_conv, x.dtype
            out = (x.shape[0], w.shape[0]) + entry[1:3]
            geometry = (self.strides, entry[0][:2], w.shape[2:])
            bc = None if bias is None else np.ascontiguousarray(bias, dtype)
            in_c = self._native_act or ()
            after = self.act if self._native_act is None else None

            def run(x: np.ndarray, z: np.ndarray | None) -> np.ndarray:
                y = np.empty(out, dtype)
                small(wt, x if x.flags.c_contiguous else np.ascontiguousarray(x), bc,
                      None if z is None else np.ascontiguousarray(z, dtype), y, *geometry, *in_c)
                if after is not None:
                    after(y)
                return y
        elif path == POINTWISE_NATIVE and x.dtype in _NATIVE_FLOATS and w.dtype == x.dtype:
            # the C call with the transposed weights, the bias and the activation bound
            n, k = x.shape[:2]
            m = w.shape[0]
            xs, ys, out = (n, k, x.shape[2] * x.shape[3]), (n, m, x.shape[2] * x.shape[3]), (n, m) + x.shape[2:]
            wt, pointwise, dtype = self._transposed_weights(w), self._native.pointwise_conv, x.dtype
            bc = None if bias is None else np.ascontiguousarray(bias, dtype)
            in_c = self._native_act or ()
            after = self.act if self._native_act is None else None

            def run(x: np.ndarray, z: np.ndarray | None) -> np.ndarray:
                y = np.empty(out, dtype)
                pointwise(wt, (x if x.flags.c_contiguous else np.ascontiguousarray(x)).reshape(xs), bc,
                          None if z is None else np.ascontiguousarray(z, dtype).reshape(ys), y.reshape(ys), *in_c)
                if after is not None:
                    after(y)
                return y
        elif path == "pointwise" and self.group == 1 and x.size * w.shape[0] < worker_pool.PARALLEL_MIN_WORK and (
                bias is None or x.size < _conv.GATHER_MAX):
            n, k = x.shape[:2]
            m = w.shape[0]
            w2, xs, out = w.reshape(m, k), (n, k, x.shape[2] * x.shape[3]), (n, m) + x.shape[2:]
            b2 = None if bias is None else bias.reshape(m, 1)

            def run(x: np.ndarray, z: np.ndarray | None) -> np.ndarray:
                y = np.matmul(w2, x.reshape(xs))
                if b2 is not None:
                    y += b2
                return finish(y, z, out)
        elif path == GATHER_GROUPED:
            idx, appended, out, keep = plan
            cells = APPENDED.astype(x.dtype) if appended else None
            wg = self._grouped_weights(w, keep)
            cols_shape = (x.shape[0], self.group, wg.shape[2], idx.shape[2])
            b3 = None if bias is None else bias.reshape(1, -1, 1)
            y_shape = (x.shape[0], w.shape[0], idx.shape[2])

            def run(x: np.ndarray, z: np.ndarray | None) -> np.ndarray:
                flat = x.reshape(-1)
                if cells is not None:
                    flat = np.concatenate((flat, cells))
                y = np.matmul(wg, flat.take(idx, mode="wrap").reshape(cols_shape)).reshape(y_shape)
                if b3 is not None:
                    y += b3
                return finish(y, z, out)
        elif path in ("gather", "gather_depthwise"):
            idx, appended, out, keep = plan
            cells = APPENDED.astype(x.dtype) if appended else None
            wk = (self._depthwise_taps(w, bias, keep) if path == "gather_depthwise"
                  else self._gathered_weights(w, bias, keep))

            def run(x: np.ndarray, z: np.ndarray | None) -> np.ndarray:
                flat = x.reshape(-1)
                if cells is not None:
                    flat = np.concatenate((flat, cells))
                return finish(np.matmul(wk, flat.take(idx, mode="wrap")), z, out)
        elif path == "general" and self.group == 1 and self._small_im2col(x.shape, w.shape, entry):
            # A small ungrouped im2col layer (a 3-channel stem, YOLOv8's first layers): the windows'
            # layout, [W | b] and the shapes bound once, one product over the images; the general
            # path's closures, per-image products and epilogues are a large share of such a
            # layer's time
            pads, out_hw = entry[0], entry[1:3]
            n, c = x.shape[:2]
            m, _, kh, kw = w.shape
            k, p = c * kh * kw, out_hw[0] * out_hw[1]
            folded = bias is not None
            wk = self._weights_with_bias(w, bias) if folded else w.reshape(m, k)
            strides, dilations = self.strides, self.dilations
            cols_shape, windows, out = (n, k + folded, p), (n, c, kh, kw) + out_hw, (n, m) + out_hw

            def run(x: np.ndarray, z: np.ndarray | None) -> np.ndarray:
                cols = np.empty(cols_shape, dtype=x.dtype)
                if folded:
                    cols[:, k] = 1
                _im2col(x, pads, out_hw, (kh, kw), strides, dilations, cols[:, :k].reshape(windows))
                return finish(np.matmul(wk, cols), z, out)
        elif path in (DEPTHWISE_NATIVE, DIRECT_NATIVE, DIRECT_NATIVE_FEW, DIRECT_NATIVE_SHIFTED, DEPTHWISE_NATIVE_ROWS,
                      DEPTHWISE_NATIVE_CHANNELS) and x.dtype in _NATIVE_FLOATS:
            # the C call with its contiguous weights, bias, geometry and activation bound: a small
            # depthwise layer's C work is a few microseconds, as much as _native_direct's steps
            dtype, group = x.dtype, self.group
            wc = np.ascontiguousarray(w)
            bc = None if bias is None else np.ascontiguousarray(bias, dtype)
            if path == DEPTHWISE_NATIVE_ROWS:
                direct, geometry = self._native.depthwise_unit, (entry[0][:2],)
            elif path == DEPTHWISE_NATIVE_CHANNELS:
                direct, geometry = self._native.depthwise_channels, (self.strides, entry[0][:2], self.dilations)
            elif path == DIRECT_NATIVE_SHIFTED:
                shifted = self._native.shifted_conv
                geometry = (entry[0][:2],)

                def direct(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, y: np.ndarray, *rest) -> None:
                    native_split(shifted, x, w, b, y, rest[:1], rest[1:])
            elif group == 1 and (not DIRECT_BOUND_UNSPLIT
                                 or not never_split(x.shape[0] * w.size * entry[1] * entry[2])):
                # split between the workers where large (native_split)
                native = self._native.direct_conv
                geometry = (self.strides, entry[0][:2], self.dilations, group)

                def direct(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, y: np.ndarray, *rest) -> None:
                    native_split(native, x, w, b, y, rest[:4], rest[4:])
            else:
                direct, geometry = self._native.direct_conv, (self.strides, entry[0][:2], self.dilations, group)
            out = (x.shape[0], w.shape[0]) + entry[1:3]
            in_c = self._native_act

            def run(x: np.ndarray, z: np.ndarray | None) -> np.ndarray:
                y = np.empty(out, dtype)
                if z is None and in_c is not None:
                    direct(x if x.flags.c_contiguous else np.ascontiguousarray(x), wc, bc, y, *geometry, *in_c)
                    return y
                direct(x if x.flags.c_contiguous else np.ascontiguousarray(x), wc, bc, y, *geometry)
                return finish(y, z, out)
        elif path in DEPTHWISE_PATHS:
            pads, out_hw, layout = entry[0], entry[1:3], DEPTHWISE_PATHS[path]

            def run(x: np.ndarray, z: np.ndarray | None) -> np.ndarray:
                return self._depthwise(x, w, bias, z, pads, out_hw, layout)
        else:
            if len(self._slow) > 64:
                self._slow.clear()
            self._slow.add(x.shape)  # a path that keeps its own steps: not looked at again
            return
        if len(self._fast) > 64:
            self._fast.clear()
        self._fast[x.shape] = (w, x.dtype, b, run)  # one entry swap: concurrent runs see a whole one

    @staticmethod
    def _small_im2col(x_shape: tuple, w_shape: tuple, entry: tuple) -> bool:
        """Whether an ungrouped layer on the general path copies its windows (not a 1x1 without
        padding) and its product is below ``worker_pool.PARALLEL_MIN_WORK``, never split."""
        pads, oh, ow = entry[:3]
        m, c, kh, kw = w_shape
        copied = kh * kw > 1 or any(pads)
        return copied and x_shape[0] * m * (c * kh * kw + 1) * oh * ow < worker_pool.PARALLEL_MIN_WORK

    def _geometry(self, x_shape: tuple, w_shape: tuple,
                  bias: bool) -> tuple[tuple[int, int, int, int], int, int, str, tuple | None]:
        """(pads (top, left, bottom, right), oh, ow, path) for these input and weight shapes,
        resolved once per shape (``per_shape``): resolving costs microseconds that ShuffleNet's 49
        small convolutions would pay on every run. The path is the method that runs them, and the
        plan the gather paths' indices (``gather_plan``)."""
        return per_shape(self._geometries, (x_shape, w_shape, bias), lambda: self._resolve(x_shape, w_shape, bias))

    def _resolve(self, x_shape: tuple, w_shape: tuple,
                 bias: bool) -> tuple[tuple[int, int, int, int], int, int, str, tuple | None]:
        c, h, wd = x_shape[1:]
        m, cg, kh, kw = w_shape
        (sh, sw), (dh, dw) = self.strides, self.dilations
        (top, left), (bottom, right) = resolve_pads((h, wd), (kh, kw), (sh, sw), (dh, dw), self.pads, self.auto_pad)
        pads = (top, left, bottom, right)
        oh, ow = output_sizes("FusedConv", (h, wd), (kh, kw), (sh, sw), (dh, dw), (top, left), (bottom, right))
        # The conditions of CONV_PATHS, in order; "general" is im2col, whose layout ``_im2col`` picks.
        if self.group == c == m and cg == 1 and self._native_depthwise and oh * ow >= NATIVE_DEPTHWISE_MIN_OUTPUTS:
            if (NATIVE_DEPTHWISE_ROWS_ENABLED and hasattr(self._native, "depthwise_unit")
                    and (oh * ow >= NATIVE_ROWS_MIN_OUTPUTS or not ROWS_YIELD_SMALL_PLANES
                         or not NATIVE_DEPTHWISE_CHANNELS_ENABLED
                         or not hasattr(self._native, "depthwise_channels"))
                    and unit_rows_apply((h, wd), (kh, kw), (top, left), (oh, ow), (sh, sw), (dh, dw))):
                return pads, oh, ow, DEPTHWISE_NATIVE_ROWS, None
            if (NATIVE_DEPTHWISE_CHANNELS_ENABLED and hasattr(self._native, "depthwise_channels")
                    and NATIVE_CHANNELS_MIN_OUTPUTS <= oh * ow <= NATIVE_CHANNELS_MAX_OUTPUTS):
                return pads, oh, ow, DEPTHWISE_NATIVE_CHANNELS, None
            return pads, oh, ow, DEPTHWISE_NATIVE, None
        if (self.group == 1 and self._native_dense and kh * kw > 1 and c <= NATIVE_DIRECT_MAX_CHANNELS
                and c * kh * kw <= NATIVE_DIRECT_MAX_K and oh * ow >= NATIVE_DIRECT_MIN_OUTPUTS):
            return pads, oh, ow, DIRECT_NATIVE, None
        if self.group == 1 and self._native_shifted and shifted_applies((c, kh, kw), (oh, ow), (sh, sw), (dh, dw)):
            return pads, oh, ow, DIRECT_NATIVE_SHIFTED, None
        if self.group == 1 and self._native_dense and few_channels_apply((c, kh, kw), (oh, ow), (sh, sw), (dh, dw)):
            return pads, oh, ow, DIRECT_NATIVE_FEW, None
        if (self._native_pointwise and self.group == 1 and kh == kw == 1 and not any(pads) and (sh, sw) == (1, 1)
                and pointwise_native_applies(x_shape, m)):
            return pads, oh, ow, POINTWISE_NATIVE, None
        if (self._native_small and self.group == 1 and (dh, dw) == (1, 1)
                and small_native_applies(x_shape, w_shape, (oh, ow), self._native.SMALL_CONV_MAX_CELLS)):
            return pads, oh, ow, IM2COL_NATIVE, None
        if self.group == c == m and cg == 1:
            path = "depthwise"
        elif kh == kw == 1 and not any(pads) and (sh, sw) == (1, 1):
            path = POINTWISE
        else:
            path = "general"
        plan = None
        if path != POINTWISE and (self.group == 1 or path == "depthwise"):
            limit = STRIDED_DEPTHWISE_GATHER_MAX if path == "depthwise" and (sh, sw) != (1, 1) else None
            plan = gather_plan(x_shape, w_shape, pads, (oh, ow), (sh, sw), (dh, dw), path == "depthwise", bias, limit)
            if plan is not None and path == "depthwise":
                # channel-major, (N, C, taps [+ 1], P): the taps are summed by one product per
                # channel in BLAS, where a multiply and a sum over the leading axis made two passes
                path, plan = GATHER_DEPTHWISE, (np.ascontiguousarray(plan[0].transpose(1, 2, 0, 3)),) + plan[1:]
            elif plan is not None:
                path = GATHER
        elif path == "general":
            # Grouped: the ungrouped gather's rows (channel-major, so each group's are one block),
            # the bias added after the product, as a grouped product folds none.
            plan = gather_plan(x_shape, w_shape, pads, (oh, ow), (sh, sw), (dh, dw), False, False)
            if plan is not None:
                path = GATHER_GROUPED
        # After the gather: within its limit one take and one product beat the taps' products and
        # shifted sums (several times faster on small planes, such as YOLOv8's 4x4 and 2x2 layers)
        if (path == "general" and plan is None and self.group == 1 and kh * kw > 1 and 2 * m <= c
                and same_width(pads, (oh, ow), (kh, kw), (sh, sw), (dh, dw), wd)
                and taps_wasted_rows(m, (h + top + bottom, wd + left + right), (oh, ow)) <= TAPS_MAX_WASTED_ROWS):
            path = TAPS
        if (path == "general" and plan is None and self.group == 1 and x_shape[0] >= BATCHED_MIN_IMAGES
                and oh * ow < m and (kh * kw > 1 or any(pads))):
            path = IM2COL_BATCHED
        if path == "depthwise":
            path = "depthwise_" + depthwise_layout(x_shape, pads, (oh, ow), (kh, kw), (sh, sw), (dh, dw))
        elif ((path == POINTWISE or path == "general" and plan is None) and self.group == 1
              and self._packed_applies(x_shape, w_shape, (oh, ow))):
            path = PACKED_POINTWISE if path == POINTWISE else PACKED_IM2COL
        return pads, oh, ow, path, plan

    def _packed_applies(self, x_shape: tuple, w_shape: tuple, out_hw: tuple[int, int]) -> bool:
        """``packed_applies``' shape conditions, with the packed product built and supported (the
        dtype and BLAS's threads are checked at each run)."""
        return self._native_packed and packed_applies(x_shape, w_shape, out_hw)

    def _conv2d(self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None, z: np.ndarray | None) -> np.ndarray:
        # The paths ShuffleNet, MobileNet and SqueezeNet run most are dispatched before anything
        # else is set up: inside a model every Python step of a small convolution costs more than
        # it does in a loop over one layer (the interpreter's data is out of cache after the
        # previous layer's arrays), so the general path's closures and per-group epilogues are
        # skipped for them.
        if b is not None and self._zero_bias(b):
            b = None
        entry = self._geometries.get((x.shape, w.shape, b is not None))  # ``_geometry``'s lookup, inline
        pads, oh, ow, path, plan = entry if entry is not None else self._geometry(x.shape, w.shape, b is not None)
        if path == GATHER:
            self.last_path = path
            return self._gathered(x, w, b, z, plan)
        if path == POINTWISE_NATIVE:
            if x.dtype in _NATIVE_FLOATS and w.dtype == x.dtype:
                self.last_path = path
                return shuffle_channels(self._native_pointwise_run(x, w, b, z), self.shuffle)
            path = POINTWISE  # another float type: BLAS's product, as without the C
        if path == IM2COL_NATIVE:
            if x.dtype in _NATIVE_FLOATS and w.dtype == x.dtype:
                self.last_path = path
                return shuffle_channels(self._native_small_run(x, w, b, z, pads, (oh, ow)), self.shuffle)
            path = "general"  # another float type: im2col's product, as without the C
        if path == PACKED_POINTWISE or path == PACKED_IM2COL:
            if x.dtype == np.float32 and w.dtype == np.float32 and packed_now():
                self.last_path = path
                return self._packed_product(x, w, b, z, pads, (oh, ow))
            path = POINTWISE if path == PACKED_POINTWISE else "general"  # BLAS's products, as without the C
        if (path == DEPTHWISE_NATIVE or path == DIRECT_NATIVE or path == DIRECT_NATIVE_FEW or path == DEPTHWISE_NATIVE_ROWS
                or path == DEPTHWISE_NATIVE_CHANNELS or path == DIRECT_NATIVE_SHIFTED):
            self.last_path = path
            return self._native_direct(x, w, b, z, pads, (oh, ow), path == DEPTHWISE_NATIVE_ROWS,
                                       path == DEPTHWISE_NATIVE_CHANNELS, path == DIRECT_NATIVE_SHIFTED)
        if path == GATHER_DEPTHWISE:
            self.last_path = path
            return self._gathered_depthwise(x, w, b, z, plan)
        if path == GATHER_GROUPED:
            self.last_path = path
            return self._gathered_grouped(x, w, b, z, plan)
        if path in DEPTHWISE_PATHS:
            self.last_path = path
            return self._depthwise(x, w, b, z, pads, (oh, ow), DEPTHWISE_PATHS[path])
        if path == POINTWISE and (not worker_pool.SPLIT_PRODUCTS or x.size * w.shape[0] < worker_pool.PARALLEL_MIN_WORK):
            self.last_path = path
            return self._pointwise(x, w, b, z, (oh, ow))
        if path == TAPS:
            self.last_path = path
            return shuffle_channels(self._tap_products(x, w, b, z, pads, (oh, ow)), self.shuffle)
        if path == IM2COL_BATCHED:
            self.last_path = path
            return shuffle_channels(self._batched_columns(x, w, b, z, pads, (oh, ow)), self.shuffle)
        n, c, h, wd = x.shape
        m, cg, kh, kw = w.shape
        g = self.group
        mg = m // g
        (sh, sw), (dh, dw) = self.strides, self.dilations
        p = oh * ow
        k = cg * kh * kw
        copied = not (kh == kw == 1 and not any(pads))
        # A copied, ungrouped convolution carries its bias in the product: a row of ones under
        # the windows and a column [W | b], one pass over the output fewer.
        folded = copied and g == 1 and b is not None
        bias = b.reshape(m, 1) if b is not None and not folded else None
        res = z.reshape(n, m, p) if z is not None else None
        act = self.act

        def epilogue(out: np.ndarray, i: int, r0: int, r1: int) -> None:
            if bias is not None:
                out += bias[r0:r1]
            if res is not None:
                out += res[i, r0:r1]
            if act is not None:
                act(out)

        y = np.empty((n, m, p), dtype=x.dtype)
        if not copied:
            self.last_path = IM2COL_1X1
            cols = np.ascontiguousarray(x if sh == sw == 1 else x[:, :, ::sh, ::sw]).reshape(n, c, p)
        else:
            cols = np.empty((n, g * k + folded, p), dtype=x.dtype)
            if folded:
                cols[:, k] = 1
            self.last_path = _im2col(x, pads, (oh, ow), (kh, kw), (sh, sw), (dh, dw),
                                     cols[:, :g * k].reshape(n, c, kh, kw, oh, ow))
        if folded:
            k += 1
            w3 = self._weights_with_bias(w, b).reshape(1, m, k)
        else:
            w3 = w.reshape(g, mg, k)
        cols = cols.reshape(n, g, k, p)  # channel-major im2col rows split evenly between groups
        # With the shuffle written in place (_group_outputs) the epilogue runs once, over the
        # contiguous output.
        shuffled, yg = self._group_outputs(y, z)
        if g == 1:
            def rows(r0: int, r1: int) -> None:
                for i in range(n):
                    out = yg[i, 0, r0:r1]
                    np.matmul(w3[0, r0:r1], cols[i, 0], out=out)
                    epilogue(out, i, r0, r1)

            parallel_ranges(m, rows, work=n * m * k * p)
        else:
            def groups(g0: int, g1: int) -> None:  # one batched product and one epilogue per image
                np.matmul(w3[g0:g1], cols[:, g0:g1], out=yg[:, g0:g1])
                if not shuffled:
                    for i in range(n):
                        epilogue(yg[i, g0:g1].reshape((g1 - g0) * mg, p), i, g0 * mg, g1 * mg)

            parallel_ranges(g, groups, work=n * m * k * p)
            if shuffled:  # no residual here (_group_outputs), and a grouped product folds no bias
                self._finish(y, b, None, shuffled)
        y = y.reshape(n, m, oh, ow)
        return y if shuffled else shuffle_channels(y, self.shuffle)

    def _transposed_weights(self, w: np.ndarray) -> np.ndarray:
        """``w`` (M, C, kh, kw) as ``_native.pointwise_conv`` and ``small_conv`` read it: (C kh kw, MP), w transposed with
        zero columns up to a multiple of its ``POINTWISE_BLOCK``; kept while constant weights come
        back."""
        def build() -> np.ndarray:
            m = w.shape[0]
            block = self._native.POINTWISE_BLOCK
            wt = np.zeros((w[0].size, -(-m // block) * block), dtype=w.dtype)
            wt[:, :m] = w.reshape(m, -1).T
            return wt
        return self._derived("_wq", (w,), build)

    def _native_pointwise_run(self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None,
                              z: np.ndarray | None) -> np.ndarray:
        """``POINTWISE_NATIVE``: one ``_native.pointwise_conv`` with the bias, the residual and
        ``native_activation``'s activation; any other activation after it, in numpy."""
        n, k = x.shape[:2]
        m = w.shape[0]
        p = x.shape[2] * x.shape[3]
        y = np.empty((n, m) + x.shape[2:], dtype=x.dtype)
        xc = x if x.flags.c_contiguous else np.ascontiguousarray(x)
        bc = None if b is None else np.ascontiguousarray(b, x.dtype)
        zc = None if z is None else np.ascontiguousarray(z, x.dtype).reshape(n, m, p)
        act = self._native_act
        self._native.pointwise_conv(self._transposed_weights(w), xc.reshape(n, k, p), bc, zc, y.reshape(n, m, p),
                                    *(act or ()))
        if act is None and self.act is not None:
            self.act(y)
        return y

    def _native_small_run(self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None, z: np.ndarray | None,
                          pads: tuple[int, int, int, int], out_hw: tuple[int, int]) -> np.ndarray:
        """``IM2COL_NATIVE``: one ``_native.small_conv`` with the bias, the residual and
        ``native_activation``'s activation; any other activation after it, in numpy."""
        y = np.empty((x.shape[0], w.shape[0]) + out_hw, dtype=x.dtype)
        xc = x if x.flags.c_contiguous else np.ascontiguousarray(x)
        bc = None if b is None else np.ascontiguousarray(b, x.dtype)
        zc = None if z is None else np.ascontiguousarray(z, x.dtype).reshape(y.shape)
        act = self._native_act
        self._native.small_conv(self._transposed_weights(w), xc, bc, zc, y, self.strides, pads[:2], w.shape[2:],
                                *(act or ()))
        if act is None and self.act is not None:
            self.act(y)
        return y

    def _packed_weights(self, w: np.ndarray) -> np.ndarray:
        """``w`` (M, C, kh, kw) as ``_native.packed_gemm`` reads it: (ceil(M / B), C kh kw, B) for
        its blocks of B output channels, zero rows past M; kept while constant weights come back
        (others are packed per run: a copy of the weights, against a product P times as long)."""
        def build() -> np.ndarray:
            block = self._native.PACKED_GEMM_BLOCK
            m = w.shape[0]
            blocks = -(-m // block)
            padded = np.zeros((blocks * block, w[0].size), dtype=np.float32)
            padded[:m] = w.reshape(m, -1)
            return np.ascontiguousarray(padded.reshape(blocks, block, -1).transpose(0, 2, 1))
        return self._derived("_wp", (w,), build)

    def _packed_product(self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None, z: np.ndarray | None,
                        pads: tuple[int, int, int, int], out_hw: tuple[int, int]) -> np.ndarray:
        """``PACKED_POINTWISE`` and ``PACKED_IM2COL``: the input (a 1x1 unpadded one's, subsampled
        by its strides) or its windows as the product's right side, (N, K, P), one
        ``_native.packed_gemm`` with the bias over blocks of output channels (split between the
        workers as the products of the other paths are), then residual and activation."""
        n, c = x.shape[:2]
        m, _, kh, kw = w.shape
        (sh, sw), (oh, ow) = self.strides, out_hw
        p, k = oh * ow, c * kh * kw
        if kh == kw == 1 and not any(pads):
            cols = np.ascontiguousarray(x if sh == sw == 1 else x[:, :, ::sh, ::sw]).reshape(n, k, p)
        else:
            cols = np.empty((n, k, p), dtype=np.float32)
            _im2col(x, pads, out_hw, (kh, kw), self.strides, self.dilations, cols.reshape(n, c, kh, kw, oh, ow))
        wp = self._packed_weights(w)
        bias = None if b is None else np.ascontiguousarray(b, np.float32)
        y = np.empty((n, m, p), dtype=np.float32)
        gemm = self._native.packed_gemm

        def blocks(b0: int, b1: int) -> None:
            gemm(wp, cols, bias, y, (b0, b1))

        parallel_ranges(wp.shape[0], blocks, work=n * m * k * p)
        self._finish(y, None, z, False)
        return shuffle_channels(y.reshape(n, m, oh, ow), self.shuffle)

    def _batched_columns(self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None, z: np.ndarray | None,
                         pads: tuple[int, int, int, int], out_hw: tuple[int, int]) -> np.ndarray:
        """An ungrouped im2col convolution of several images as one product: the windows of all
        images side by side, (C kh kw [+ 1], N, P), filled through a transposed view by the same
        layouts as ``_im2col`` (a row of ones under them and [W | b] with a bias), the product
        (M, N, P) split over output channels between the workers, then one transposing pass into
        (N, M, P) that adds the residual, then the activation."""
        n, c = x.shape[:2]
        m, _, kh, kw = w.shape
        oh, ow = out_hw
        p, k = oh * ow, c * kh * kw
        folded = b is not None
        cols = np.empty((k + folded, n, p), dtype=x.dtype)
        if folded:
            cols[k] = 1
        windows = np.reshape(cols[:k].transpose(1, 0, 2), (n, c, kh, kw, oh, ow), copy=False)
        _im2col(x, pads, out_hw, (kh, kw), self.strides, self.dilations, windows)
        wk = self._weights_with_bias(w, b) if folded else w.reshape(m, k)
        right = cols.reshape(k + folded, n * p)
        acc = np.empty((m, n * p), dtype=x.dtype)

        def rows(r0: int, r1: int) -> None:
            np.matmul(wk[r0:r1], right, out=acc[r0:r1])

        parallel_ranges(m, rows, work=m * (k + folded) * n * p)
        y = np.empty((n, m, p), dtype=x.dtype)
        per_image = acc.reshape(m, n, p).transpose(1, 0, 2)
        if z is not None:
            np.add(per_image, z.reshape(n, m, p), out=y)
        else:
            np.copyto(y, per_image)
        if self.act is not None:
            self.act(y)
        return y.reshape(n, m, oh, ow)

    def _zero_bias(self, b: np.ndarray) -> bool:
        """Whether a constant bias is all zeros (exports of folded BatchNormalization often carry
        one): its pass over the output is then left out."""
        cached = self._bz
        if cached is not None and cached[0] is b:
            return cached[1]
        zero = not b.any()
        if self._cacheable["_bz"]:
            self._bz = (b, zero)
        return zero

    def _gathered(self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None, z: np.ndarray | None,
                  plan: tuple) -> np.ndarray:
        """A small ungrouped convolution: its windows gathered by ``gather_plan``'s indices in one
        take, one product per image with [W | b], then residual and activation."""
        idx, appended, out_shape, keep = plan
        flat = x.reshape(-1)
        if appended:
            flat = np.concatenate((flat, APPENDED), dtype=x.dtype)
        y = np.matmul(self._gathered_weights(w, b, keep), flat.take(idx, mode="wrap"))
        return self._epilogue(y, z, out_shape)

    def _gathered_grouped(self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None, z: np.ndarray | None,
                          plan: tuple) -> np.ndarray:
        """A small grouped convolution: its windows gathered by ``gather_plan``'s indices in one
        take, one product batched over the images and groups, then bias, residual and activation."""
        idx, appended, out_shape, keep = plan
        flat = x.reshape(-1)
        if appended:
            flat = np.concatenate((flat, APPENDED), dtype=x.dtype)
        wg = self._grouped_weights(w, keep)
        n, g = x.shape[0], self.group
        y = np.matmul(wg, flat.take(idx, mode="wrap").reshape(n, g, wg.shape[2], idx.shape[2])).reshape(n, w.shape[0], -1)
        if b is not None:
            y += b.reshape(1, -1, 1)
        return self._epilogue(y, z, out_shape)

    def _grouped_weights(self, w: np.ndarray, keep: np.ndarray | None) -> np.ndarray:
        """A grouped gathered product's left side, (G, M/G, kept taps x C/G): ``keep`` indexes the
        (channel, tap) rows of all C channels, and the taps it keeps are the same for every
        channel, so a group's columns are the kept rows of its first C/G channels."""
        g = self.group

        def build() -> np.ndarray:
            wk = w.reshape(w.shape[0], -1)
            if keep is not None:
                wk = wk[:, keep[keep < wk.shape[1]]]
            return np.ascontiguousarray(wk).reshape(g, w.shape[0] // g, -1)
        return self._derived("_wg", (w, keep), build)

    def _epilogue(self, y: np.ndarray, z: np.ndarray | None, out_shape: tuple) -> np.ndarray:
        """A gathered product's residual and activation, then its output shape (channels shuffled
        where a ShuffleNet shuffle was fused)."""
        if z is not None:
            y += z.reshape(y.shape)
        if self.act is not None:
            self.act(y)
        y = y.reshape(out_shape)
        return shuffle_channels(y, self.shuffle) if self.shuffle else y

    def _gathered_weights(self, w: np.ndarray, b: np.ndarray | None, keep: np.ndarray | None) -> np.ndarray:
        """An ungrouped gathered product's left side: the kept taps' weights, [W | b] with a bias."""
        if b is None:
            return gathered_weights(w, keep, False)
        wb = self._weights_with_bias(w, b)
        return wb if keep is None else wb[:, np.append(keep, wb.shape[1] - 1)]

    def _depthwise_taps(self, w: np.ndarray, b: np.ndarray | None, keep: np.ndarray | None) -> np.ndarray:
        """Each channel's kept taps' weights (the bias last) as a row, (C, 1, taps [+ 1]): the left
        side of the per-channel product with the gathered (N, C, taps [+ 1], P) taps."""
        cached = self._wd  # checked inline: this runs for every small depthwise layer
        if cached is not None and cached[0] is w and cached[1] is b and cached[3] is keep:
            return cached[2]
        wt = gathered_weights(w, keep, True)
        if b is not None:
            wt = np.concatenate([wt, b.reshape(1, -1).astype(w.dtype)])
        value = np.ascontiguousarray(wt.T)[:, None, :]
        if self._cacheable["_wd"]:
            self._wd = (w, b, value, keep)  # one swap: concurrent runs see an old or a new entry, both valid
        return value

    def _gathered_depthwise(self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None, z: np.ndarray | None,
                            plan: tuple) -> np.ndarray:
        """A small depthwise convolution: its taps (and the bias as one more) gathered channel-major
        by ``gather_plan``'s indices in one take, then summed by one product per channel."""
        idx, appended, out_shape, keep = plan
        flat = x.reshape(-1)
        if appended:
            flat = np.concatenate((flat, APPENDED), dtype=x.dtype)
        return self._epilogue(np.matmul(self._depthwise_taps(w, b, keep), flat.take(idx, mode="wrap")), z, out_shape)

    def _pointwise(self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None, z: np.ndarray | None,
                   out_hw: tuple[int, int]) -> np.ndarray:
        """A 1x1 convolution with unit stride and no padding, grouped or not: the input is the
        product's right side as it is (or, with a bias and fewer input than output channels,
        copied under a row of ones per group and the bias in the product), one batched
        product over the groups, then bias, residual and activation once over the whole output;
        the shuffle as ``_group_outputs`` says."""
        n = x.shape[0]
        m, k = w.shape[:2]
        g = self.group
        mg, p = m // g, out_hw[0] * out_hw[1]
        if g == 1 and (b is None or x.size < _conv.GATHER_MAX):
            # Ungrouped, and the bias (if any) added in a pass: the fewest numpy calls, which is
            # what a small layer's time is (MobileNet's 1x1 layers at 1x1 to 16x16).
            y = np.matmul(w.reshape(m, k), x.reshape(n, k, p))
            self._finish(y, b, z, False)
            return shuffle_channels(y.reshape((n, m) + out_hw), self.shuffle)
        y = np.empty((n, m, p), dtype=x.dtype)
        shuffled, yg = self._group_outputs(y, z)
        if b is not None and g * k < m:
            # Fewer inputs than outputs (SqueezeNet's expand layers, ShuffleNet's first grouped
            # layer): copying the input under a row of ones per group, with the bias as a weight
            # column, costs less than a pass over the output to add it. Alone: 16 to 64 channels
            # at 55x55 0.83, 32 to 128 at 27x27 0.90, ShuffleNet's 24 to 112 at 56x56 0.91 of the
            # time; 13x13 layers even.
            cols = np.empty((n, g, k + 1, p), dtype=x.dtype)
            cols[:, :, k] = 1
            np.copyto(cols[:, :, :k], x.reshape(n, g, k, p))
            np.matmul(self._weights_with_bias(w, b).reshape(g, mg, k + 1), cols, out=yg)
            b = None
        else:
            np.matmul(w.reshape(g, mg, k), np.ascontiguousarray(x).reshape(n, g, k, p), out=yg)
        self._finish(y, b, z, shuffled)
        y = y.reshape((n, m) + out_hw)
        return y if shuffled else shuffle_channels(y, self.shuffle)

    def _group_outputs(self, y: np.ndarray, z: np.ndarray | None) -> tuple[bool, np.ndarray]:
        """Whether the shuffle is written in place, and ``y`` (N, M, P) as the (N, G, M/G, P) group
        outputs the products write: with a shuffle of as many groups as the convolution (and no
        residual), group gi's row j is output channel j * G + gi, a strided view BLAS writes
        directly; otherwise the groups' channels in order, and another shuffle costs one copy."""
        n, m, p = y.shape
        g = self.group
        shuffled = g > 1 and self.shuffle == g and z is None
        return shuffled, (y.reshape(n, m // g, g, p).transpose(0, 2, 1, 3) if shuffled else y.reshape(n, g, m // g, p))

    def _finish(self, y: np.ndarray, b: np.ndarray | None, z: np.ndarray | None, shuffled: bool) -> None:
        """Bias (in the order ``_group_outputs`` wrote the channels), residual and activation over
        the whole (N, M, ...) output ``y``, in place."""
        if b is not None:
            y += (self._shuffled_bias(b) if shuffled else b).reshape((1, -1) + (1,) * (y.ndim - 2))
        if z is not None:
            y += z.reshape(y.shape)
        if self.act is not None:
            self.act(y)

    def _shuffled_bias(self, b: np.ndarray) -> np.ndarray:
        """The bias in the order of outputs written shuffled in place, (M,): channel j * G + g
        takes group g's bias j."""
        g = self.group
        return self._derived("_bs", (b,), lambda: b.reshape(g, -1).T.reshape(-1))

    def _depthwise(self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None, z: np.ndarray | None,
                   pads: tuple[int, int, int, int], out_hw: tuple[int, int], layout: str) -> np.ndarray:
        """A depthwise convolution: one BLAS product per channel over its taps
        (``depthwise_rows`` in ``layout``), the bias added in the copy that cuts the outputs from
        the pitched rows where there is one, then residual and activation."""
        n, m = x.shape[0], w.shape[0]
        oh, ow = out_hw
        acc, wq = depthwise_rows(x, w, pads, out_hw, tuple(w.shape[2:]), self.strides, self.dilations, layout)
        if wq == ow:  # the rows are the outputs
            yd = acc.reshape(n, m, oh, ow)
        else:
            yd = np.empty((n, m, oh, ow), dtype=x.dtype)
            rows = rows_view(acc, out_hw, wq)
            if b is not None:
                np.add(rows, b.reshape(1, m, 1, 1), out=yd)
                b = None
            else:
                np.copyto(yd, rows)
        self._finish(yd, b, z, False)
        return shuffle_channels(yd, self.shuffle)

    def _native_direct(self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None, z: np.ndarray | None,
                       pads: tuple[int, int, int, int], out_hw: tuple[int, int], rows: bool = False,
                       channels: bool = False, shifted: bool = False) -> np.ndarray:
        """``DEPTHWISE_NATIVE``, ``DEPTHWISE_NATIVE_ROWS`` (``rows``), ``DEPTHWISE_NATIVE_CHANNELS``
        (``channels``), ``DIRECT_NATIVE_SHIFTED`` (``shifted``) and ``DIRECT_NATIVE``: the
        convolution and its bias in C, then residual and activation; a type the C kernel lacks
        (float16 that is not widened) takes the numpy paths (the depthwise rows; the CPU EP's Conv)."""
        if x.dtype not in _NATIVE_FLOATS and self.group == 1:  # the CPU EP's Conv, then the epilogue
            y = writable(self._fallback.compute([x, w, b])[0], x.dtype)
            self._finish(y, None, z, False)
            return shuffle_channels(y, self.shuffle)
        if x.dtype not in _NATIVE_FLOATS:
            layout = depthwise_layout(x.shape, pads, out_hw, tuple(w.shape[2:]), self.strides, self.dilations)
            self.last_path = "depthwise_" + layout
            return self._depthwise(x, w, b, z, pads, out_hw, layout)
        y = np.empty((x.shape[0], w.shape[0]) + out_hw, dtype=x.dtype)
        # Without a residual (added before it), the activation is applied in C as the outputs are
        # written (native_activation): one pass over the output fewer
        act = self._native_act if z is None else None
        xc, wc, bc = np.ascontiguousarray(x), np.ascontiguousarray(w), None if b is None else np.ascontiguousarray(
            b, x.dtype)
        if rows:
            self._native.depthwise_unit(xc, wc, bc, y, pads[:2], *(act or ()))
        elif channels:
            self._native.depthwise_channels(xc, wc, bc, y, self.strides, pads[:2], self.dilations, *(act or ()))
        elif shifted:
            native_split(self._native.shifted_conv, xc, wc, bc, y, (pads[:2],), act or ())
        elif self.group == 1:
            native_split(self._native.direct_conv, xc, wc, bc, y, (self.strides, pads[:2], self.dilations, 1),
                         act or ())
        else:
            self._native.direct_conv(xc, wc, bc, y, self.strides, pads[:2], self.dilations, self.group, *(act or ()))
        if act is None:
            self._finish(y, None, z, False)
        return shuffle_channels(y, self.shuffle)

    def _tap_weights(self, w: np.ndarray) -> np.ndarray:
        """The weights tap-major, (kh * kw * M, C): rows t * M + o are tap t of output channel o."""
        m, c, kh, kw = w.shape
        return self._derived("_wt", (w,), lambda: np.ascontiguousarray(w.transpose(2, 3, 0, 1)).reshape(kh * kw * m, c))

    def _tap_products(self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None, z: np.ndarray | None,
                      pads: tuple[int, int, int, int], out_hw: tuple[int, int]) -> np.ndarray:
        """A ``same_width`` convolution with fewer output than input channels as one product per
        image of all taps' weights with the padded input, (kh kw M, C) @ (C, Hp Wp), then the
        taps' products added at their offsets (each a contiguous slice of the row-pitched
        planes): the product writes kh kw M values per position where im2col writes kh kw C and
        the product reads them again. DenseNet's 128-to-32 3x3 layers: 1.8 against 2.4 ms at
        56x56."""
        n = x.shape[0]
        m, _, kh, kw = w.shape
        (dh, dw), (oh, ow) = self.dilations, out_hw
        xp = np.ascontiguousarray(pad_spatial(x, pads[:2], pads[2:]))
        hp, wq = xp.shape[2:]
        flat = xp.reshape(n, -1, hp * wq)
        length = (oh - 1) * wq + ow
        wt = self._tap_weights(w)
        zt = np.empty((kh * kw * m, hp * wq), dtype=x.dtype)
        acc = np.empty((n, m, length), dtype=x.dtype)
        offsets = [i * dh * wq + j * dw for i in range(kh) for j in range(kw)]
        for i in range(n):
            check_terminate()  # one image's product and tap sums per read
            np.matmul(wt, flat[i], out=zt)
            a = acc[i]
            if b is not None:
                np.add(zt[:m, :length], b.reshape(m, 1), out=a)
            else:
                np.copyto(a, zt[:m, :length])
            for t in range(1, kh * kw):
                a += zt[t * m:(t + 1) * m, offsets[t]:offsets[t] + length]
        y = rows_to_output(acc, out_hw, wq)
        if z is not None:
            y += z
        if self.act is not None:
            self.act(y)
        return y


def taps_wasted_rows(m: int, padded_hw: tuple[int, int], out_hw: tuple[int, int]) -> float:
    """``TAPS``' extra product work over the padding, as a share of im2col's (the padded plane's
    positions per output, less one), weighed by the M output channels: im2col's copy of the
    windows, which ``TAPS`` saves, weighs less against a product of more output channels."""
    return m * (padded_hw[0] * padded_hw[1] / (out_hw[0] * out_hw[1]) - 1)


def packed_gemm_supported(native) -> bool:
    """Whether the C extension ``native`` (or None) has ``packed_gemm`` and this CPU runs it."""
    return native is not None and hasattr(native, "packed_gemm") and native.packed_gemm_supported()


def packed_applies(x_shape: tuple, w_shape: tuple, out_hw: tuple[int, int]) -> bool:
    """The shapes ``PACKED_POINTWISE`` and ``PACKED_IM2COL`` take: one image, at most
    ``PACKED_MAX_COLUMNS`` output positions, at least ``PACKED_MIN_CHANNELS`` output channels, and
    a product of at least ``worker_pool.PARALLEL_MIN_WORK`` (smaller ones keep their fewer numpy
    calls, ``_remember``)."""
    p = out_hw[0] * out_hw[1]
    return (x_shape[0] == 1 and p <= PACKED_MAX_COLUMNS and w_shape[0] >= PACKED_MIN_CHANNELS
            and w_shape[0] * w_shape[1] * w_shape[2] * w_shape[3] * p >= worker_pool.PARALLEL_MIN_WORK)


def pointwise_native_applies(x_shape: tuple, m: int) -> bool:
    """The shapes ``POINTWISE_NATIVE`` takes: at most ``NATIVE_POINTWISE_MAX_COLUMNS`` positions a
    plane and a product of fewer than ``worker_pool.PARALLEL_MIN_WORK`` multiply-adds (larger ones
    go to BLAS's products or the packed one, split between the workers)."""
    n, c, h, w = x_shape
    return h * w <= NATIVE_POINTWISE_MAX_COLUMNS and n * c * h * w * m < worker_pool.PARALLEL_MIN_WORK


def small_native_applies(x_shape: tuple, w_shape: tuple, out_hw: tuple[int, int], max_cells: int) -> bool:
    """The shapes ``IM2COL_NATIVE`` takes: at most ``NATIVE_SMALL_MAX_OUTPUTS`` positions a plane,
    windows (C kh kw x oh ow) within ``max_cells`` (the C kernel's stack buffer) and a product of
    fewer than ``worker_pool.PARALLEL_MIN_WORK`` multiply-adds (larger ones are split)."""
    p = out_hw[0] * out_hw[1]
    k = w_shape[1] * w_shape[2] * w_shape[3]
    return (p <= NATIVE_SMALL_MAX_OUTPUTS and k * p <= max_cells
            and x_shape[0] * w_shape[0] * k * p < worker_pool.PARALLEL_MIN_WORK)


def few_channels_apply(in_ckk: tuple[int, int, int], out_hw: tuple[int, int], strides: tuple[int, int],
                       dilations: tuple[int, int]) -> bool:
    """Whether ``DIRECT_NATIVE_FEW`` takes an ungrouped convolution of ``in_ckk`` (input channels,
    kernel rows, kernel columns) to ``out_hw`` outputs a plane (``NATIVE_FEW_MAX_CHANNELS``)."""
    c, kh, kw = in_ckk
    if not (kh == kw == 3 and dilations == (1, 1) and NATIVE_DIRECT_MAX_CHANNELS < c
            and out_hw[0] * out_hw[1] >= NATIVE_FEW_MIN_OUTPUTS):
        return False
    if strides == (1, 1) and out_hw[0] * out_hw[1] >= NATIVE_FEW_FULL_OUTPUTS:
        return c <= NATIVE_FEW_MAX_CHANNELS
    return strides in ((1, 1), (2, 2)) and c <= NATIVE_FEW_MAX_STRIDED_CHANNELS


def shifted_applies(in_ckk: tuple[int, int, int], out_hw: tuple[int, int], strides: tuple[int, int],
                    dilations: tuple[int, int]) -> bool:
    """Whether ``DIRECT_NATIVE_SHIFTED`` takes an ungrouped convolution of ``in_ckk`` (input
    channels, kernel rows, kernel columns) to ``out_hw`` outputs a plane (``NATIVE_SHIFTED_*``)."""
    c, kh, kw = in_ckk
    return (kh * kw > 1 and strides == (1, 1) and dilations == (1, 1)
            and NATIVE_SHIFTED_MIN_SUMS <= c * kh * kw <= NATIVE_SHIFTED_MAX_SUMS
            and NATIVE_SHIFTED_MIN_OUTPUTS <= out_hw[0] * out_hw[1] <= NATIVE_SHIFTED_MAX_OUTPUTS)


def never_split(work: int) -> bool:
    """Whether ``native_split`` calls its kernel as it is for a layer of ``work`` multiply-adds,
    whatever the workers and BLAS's threads then: below ``worker_pool.PARALLEL_MIN_WORK``."""
    return work < worker_pool.PARALLEL_MIN_WORK


def native_split(direct, x: np.ndarray, w: np.ndarray, b: np.ndarray | None, y: np.ndarray, geometry: tuple,
                 act: tuple) -> None:
    """``direct(x, w, b, y, *geometry, *act)`` (``_native.direct_conv``, which releases the GIL),
    split between the workers when there are several and the work (multiply-adds) is at least
    ``worker_pool.PARALLEL_MIN_WORK``: one image by blocks of output channels (its rows of y are
    contiguous), several by images. Unlike BLAS's products, the C convolution runs on one thread,
    so it is split whether or not BLAS threads itself, into as many parts as BLAS has threads for
    this run: the load governor (blas_threads.LoadAwareBlasThreads) lowers that count while other
    processes hold the cores, where a part waits for a core (a 3-channel stem at 224x224 on two
    loaded cores: 2.9 times as long split as on one thread). x, w and y C-contiguous, b contiguous."""
    n, m = y.shape[:2]
    work = n * m * w[0].size * y.shape[2] * y.shape[3]
    workers = worker_pool.WORKERS
    if workers > 1 and work >= worker_pool.PARALLEL_MIN_WORK and not worker_pool.SPLIT_PRODUCTS:
        blas = get_blas_threads()  # read only for work that may be split: a call through ctypes
        if blas is not None:
            workers = min(workers, blas)
    if (workers <= 1 or work < worker_pool.PARALLEL_MIN_WORK
            or threading.current_thread().name.startswith("onnxhal-fused")):
        direct(x, w, b, y, *geometry, *act)
        return
    if n == 1:
        blocks = -(-m // DIRECT_CONV_BLOCK)  # whole blocks of the C kernel's output channels per part

        def part(i0: int, i1: int) -> None:
            c0, c1 = i0 * DIRECT_CONV_BLOCK, min(m, i1 * DIRECT_CONV_BLOCK)
            direct(x, w[c0:c1], None if b is None else b[c0:c1], y[:, c0:c1], *geometry, *act)
        total = blocks
    else:
        def part(i0: int, i1: int) -> None:
            direct(x[i0:i1], w, b, y[i0:i1], *geometry, *act)
        total = n
    parts = min(workers, total)
    bounds = [total * i // parts for i in range(parts + 1)]
    pool = worker_pool.get_pool()
    futures = [pool.submit(part, bounds[i], bounds[i + 1]) for i in range(parts - 1)]
    part(bounds[-2], bounds[-1])
    for f in futures:
        f.result()


def packed_now() -> bool:
    """Whether BLAS runs on one thread for this run (pinned, or the load governor's choice), where
    the packed product, on one thread or split between the workers, beats it; with more, BLAS's
    own threads take the product."""
    return worker_pool.SPLIT_PRODUCTS or get_blas_threads() == 1


def unit_rows_apply(in_hw: tuple[int, int], kernel: tuple[int, int], pads: tuple[int, int], out_hw: tuple[int, int],
                    strides: tuple[int, int], dilations: tuple[int, int]) -> bool:
    """Whether ``_native.depthwise_unit`` takes a depthwise convolution of an ``in_hw`` plane with
    ``kernel``, top and left ``pads``, ``out_hw`` outputs: unit strides and dilations, a kernel
    height it is built for, and every tap reaching the input for some output (the first kernel
    row's last output row and the last kernel row's first within the input, likewise columns)."""
    if strides != (1, 1) or dilations != (1, 1) or kernel[0] not in NATIVE_ROWS_KERNEL_HEIGHTS:
        return False
    return all(k - p <= n and o > p for n, k, p, o in zip(in_hw, kernel, pads, out_hw))


def native_activation(name: str, params: list) -> tuple[int, float, float] | None:
    """``_native.direct_conv``'s (act, p0, p1) for a fused activation it applies itself (none,
    Relu, Clip with both bounds, HardSwish), None for the others (applied after it in numpy)."""
    if name == "":
        return (0, 0.0, 0.0)
    if name == "Relu":
        return (1, 0.0, float("inf"))
    if name == "Clip" and len(params) == 2:
        return (1, float(params[0]), float(params[1]))
    if name == "HardSwish" and len(params) == 2:
        return (2, float(params[0]), float(params[1]))
    return None


def shuffle_channels(y: np.ndarray, groups: int) -> np.ndarray:
    """``y`` (N, C, ...) with channel g * C/G + j moved to j * G + g (ShuffleNet's shuffle);
    ``y`` itself when ``groups`` is 0."""
    if not groups:
        return y
    n, c = y.shape[:2]
    return np.ascontiguousarray(y.reshape((n, groups, c // groups) + y.shape[2:]).swapaxes(1, 2)).reshape(y.shape)
