"""Conv (im2col over a strided window view + batched BLAS matmul; depthwise as a per-channel
product over kernel taps) and ConvTranspose (matmul then col2im as strided adds, or as one gather: col2im.py). N-d throughout."""

from __future__ import annotations

import functools
import math

import numpy as np
from numpy.lib.stride_tricks import as_strided

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.hal.run_control import check_terminate
from onnxhal.runtime.providers.cpu.kernels import col2im
from onnxhal.runtime.providers.cpu.kernels import half_via_float as half
from onnxhal.runtime.providers.cpu.kernels.dead_taps import TrimmedTaps
from onnxhal.runtime.providers.cpu.kernels.kernel_paths import path_table
from onnxhal.runtime.providers.cpu.kernels.registry import register
from onnxhal.runtime.providers.op_geometry import ConvGeometry


def strided_view(a: np.ndarray, shape: tuple, strides: tuple, offset: int = 0) -> np.ndarray:
    """A read-only view of ``a`` with ``shape`` and byte ``strides``, starting ``offset`` elements
    along ``a``'s last axis (its flat start, as ``a`` is contiguous in every caller's hot path):
    ``as_strided`` without its per-call cost (1.3 against 5.1 us here, paid several times per
    depthwise layer). numpy still checks the view stays inside ``a``."""
    if not a.flags.c_contiguous:
        return as_strided(a[(slice(None),) * (a.ndim - 1) + (slice(offset, None),)] if offset else a, shape,
                          strides, writeable=False)
    view = np.ndarray(shape, a.dtype, a, offset * a.itemsize, strides)
    view.flags.writeable = False
    return view


def per_shape(cache: dict, key: tuple, build):
    """``cache``'s entry for ``key`` (input shapes and dtype), built once by ``build()``: per-shape
    work of a kernel (geometry, divisors, matrices) leaves the run loop after a node's first run.
    The cache is emptied past 64 keys (dynamic axes), and kernels shared by concurrent runs see a
    whole entry or none."""
    value = cache.get(key)
    if value is None:
        if len(cache) > 64:
            cache.clear()
        value = cache[key] = build()
    return value


def window_view(xp: np.ndarray, kernel, strides, dilations, out_spatial) -> np.ndarray:
    """View (N, C, *out, *kernel) of a padded input: no copy."""
    nd = len(kernel)
    sp = xp.strides[2:]
    shape = xp.shape[:2] + tuple(out_spatial) + tuple(kernel)
    strides = xp.strides[:2] + tuple(sp[i] * strides[i] for i in range(nd)) + tuple(
        sp[i] * dilations[i] for i in range(nd))
    return strided_view(xp, shape, strides)


def pad_spatial(x: np.ndarray, pb, pe, value=0) -> np.ndarray:
    """``x`` with ``pb``/``pe`` cells of ``value`` before/after each spatial axis (np.pad costs
    tens of microseconds of Python per call; this is one copy and a fill of the border)."""
    if not any(pb) and not any(pe):
        return x
    xp = np.empty(x.shape[:2] + tuple(s + b + e for s, b, e in zip(x.shape[2:], pb, pe)), dtype=x.dtype)
    xp[(slice(None), slice(None)) + tuple(slice(b, b + s) for b, s in zip(pb, x.shape[2:]))] = x
    for a in range(len(pb)):  # only the border is filled: the interior is written once, above
        lead = (slice(None),) * (2 + a)
        if pb[a]:
            xp[lead + (slice(0, pb[a]),)] = value
        if pe[a]:
            xp[lead + (slice(xp.shape[2 + a] - pe[a], None),)] = value
    return xp


def _phases(x: np.ndarray, pads: tuple[int, int, int, int], value, out_hw: tuple[int, int],
            kernel: tuple[int, int], strides: tuple[int, int],
            dilations: tuple[int, int]) -> tuple[dict, tuple, tuple[int, ...] | None, int, int]:
    """The stride phases of ``x`` (N, C, H, W) padded by ``pads`` (top, left, bottom, right) cells
    of ``value`` that the kernel taps read, each flattened per channel to (N, C, hq * wq); the
    taps of each phase as grids and their order (``_phase_layout``); the row pitch ``wq``; and
    the row length L = (oh - 1) * wq + ow every tap reads from its offset. Strided phases are
    filled straight from ``x`` (no padded copy first)."""
    n, c, h, w = x.shape
    top, left, bottom, right = pads
    oh, ow = out_hw
    sh, sw = strides
    hq, wq = -(-(h + top + bottom) // sh), -(-(w + left + right) // sw)
    grids, order = _phase_layout(kernel, strides, dilations, wq)
    phases: dict[tuple[int, int], np.ndarray] = {}
    for key, *_ in grids:
        if sh == sw == 1:
            phase = np.ascontiguousarray(pad_spatial(x, (top, left), (bottom, right), value))
        else:  # phase cell (u, v) is padded-input cell (a + u sh, b + v sw)
            a, b = key
            u0, v0 = max(0, -(-(top - a) // sh)), max(0, -(-(left - b) // sw))
            u1, v1 = min(hq, (h - 1 + top - a) // sh + 1), min(wq, (w - 1 + left - b) // sw + 1)
            phase = np.full((n, c, hq, wq), value, dtype=x.dtype)
            if u1 > u0 and v1 > v0:
                r0, c0 = a + u0 * sh - top, b + v0 * sw - left
                phase[:, :, u0:u1, v0:v1] = x[:, :, r0:r0 + (u1 - u0 - 1) * sh + 1:sh,
                                              c0:c0 + (v1 - v0 - 1) * sw + 1:sw]
        phases[key] = phase.reshape(n, c, hq * wq)
    return phases, grids, order, wq, (oh - 1) * wq + ow


@functools.lru_cache(maxsize=256)
def _phase_layout(kernel: tuple[int, int], strides: tuple[int, int], dilations: tuple[int, int],
                  wq: int) -> tuple[tuple, tuple[int, ...] | None]:
    """``_phases``' taps, fixed per layer and so computed once: each stride phase's taps as one
    ``_tap_grids`` grid, and the kernel-row-major tap index of each copied tap in grid order (None
    when that is already 0, 1, 2, ...), by which a depthwise layer permutes its weights."""
    (kh, kw), (sh, sw), (dh, dw) = kernel, strides, dilations
    taps = [(i, j, ((i * dh) % sh, (j * dw) % sw), (i * dh // sh) * wq + (j * dw // sw))
            for i in range(kh) for j in range(kw)]
    grids = tuple(_tap_grids(taps))
    order = tuple(i * kw + j for _, rows, columns, *_ in grids for i in rows for j in columns)
    return grids, (None if order == tuple(sorted(order)) else order)


def rows_view(acc: np.ndarray, out_hw: tuple[int, int], wq: int) -> np.ndarray:
    """The (N, C, oh, ow) outputs inside an (N, C, >= (oh - 1) * wq + ow) row-pitched result, as a
    read-only view."""
    n, c = acc.shape[:2]
    oh, ow = out_hw
    return strided_view(acc, (n, c, oh, ow), acc.strides[:2] + (wq * acc.strides[2], acc.strides[2]))


def rows_to_output(acc: np.ndarray, out_hw: tuple[int, int], wq: int) -> np.ndarray:
    """A contiguous (N, C, oh, ow) array from an (N, C, >= (oh - 1) * wq + ow) row-pitched result."""
    n, c = acc.shape[:2]
    oh, ow = out_hw
    if ow == wq:
        return acc[..., :oh * ow].reshape(n, c, oh, ow)
    out = np.empty((n, c, oh, ow), dtype=acc.dtype)
    np.copyto(out, rows_view(acc, out_hw, wq))
    return out


def _tap_grids(taps: list[tuple[int, int, tuple[int, int], int]]):
    """Per stride phase, the taps reading it as a grid: (phase key, kernel rows, kernel columns,
    offset of the first tap, offset step per grid row, per grid column, index of the grid's taps
    in an (N, C, kh, kw, ...) window array). The taps of one phase are the rows i with
    i * dh = a (mod sh) and the columns likewise, at evenly spaced offsets, so one strided view
    covers them all. Its callers cache the grids per layer."""
    grids: dict[tuple[int, int], dict[tuple[int, int], int]] = {}
    for i, j, key, off in taps:
        grids.setdefault(key, {})[i, j] = off
    for key, grid in grids.items():
        rows, columns = sorted({i for i, _ in grid}), sorted({j for _, j in grid})
        off0 = grid[rows[0], columns[0]]
        du = grid[rows[1], columns[0]] - off0 if len(rows) > 1 else 0
        dv = grid[rows[0], columns[1]] - off0 if len(columns) > 1 else 0
        ri = rows[1] - rows[0] if len(rows) > 1 else 1
        ci = columns[1] - columns[0] if len(columns) > 1 else 1
        window = (slice(None), slice(None), slice(rows[0], rows[-1] + 1, ri), slice(columns[0], columns[-1] + 1, ci))
        yield key, rows, columns, off0, du, dv, window


def im2col_from_phases(x: np.ndarray, pads: tuple[int, int, int, int], out_hw: tuple[int, int],
                       kernel: tuple[int, int], strides: tuple[int, int], dilations: tuple[int, int],
                       cols: np.ndarray) -> None:
    """Fill ``cols`` (N, C, kh, kw, oh, ow) with the windows of a strided convolution over ``x``
    zero-padded by ``pads``, reading the input's stride phases, where every tap is a block of
    unit-stride rows, instead of a window view whose rows step by the stride. Pays off for large
    kernels (7x7 stride 2: 0.72 against 1.15 ms); at 3x3 the phase copies cost more than they save."""
    n, c = x.shape[:2]
    oh, ow = out_hw
    phases, grids, _, wq, _ = _phases(x, pads, 0, out_hw, kernel, strides, dilations)
    for key, rows, columns, off0, du, dv, window in grids:
        phase = phases[key]
        st = phase.strides
        view = strided_view(phase, (n, c, len(rows), len(columns), oh, ow),
                            (st[0], st[1], du * st[2], dv * st[2], wq * st[2], st[2]), off0)
        np.copyto(cols[window], view)


def depthwise_taps(x: np.ndarray, w: np.ndarray, pads: tuple[int, int, int, int], out_hw: tuple[int, int],
                   kernel: tuple[int, int], strides: tuple[int, int], dilations: tuple[int, int]) -> np.ndarray:
    """Depthwise 2-D convolution of ``x`` (N, C, H, W), zero-padded by ``pads`` (top, left, bottom,
    right), with ``w`` (C, 1, kh, kw), no bias: a contiguous (N, C, oh, ow) array."""
    acc, wq = depthwise_rows(x, w, pads, out_hw, kernel, strides, dilations)
    return rows_to_output(acc, out_hw, wq)


#: Every layout of ``depthwise_rows``, by name, in the order ``depthwise_layout`` tries them. Every
#: layout computes the same convolution; tests/test_depthwise_layouts.py holds each to a float64
#: convolution and onnxruntime.
DEPTHWISE_LAYOUTS = path_table("conv.depthwise_rows", "a float64 convolution (every layout computes the same one)")
_layout = DEPTHWISE_LAYOUTS.add


SAME_WIDTH = _layout("same_width", "unit stride, the output as wide as the input (same_width): flat planes "
                                   "without a border, row pitch W, the outputs are the rows")
HALF_WIDTH = _layout("half_width", "stride 2 over an even input, the output half as wide (half_width): the four "
                                   "stride phases as flat planes, row pitch W / 2, the outputs are the rows")
PHASES = _layout("phases", "any other: the padded stride phases, row pitch ceil((W + pads) / stride), the "
                           "outputs cut from the pitched rows")


def depthwise_layout(shape: tuple[int, ...], pads: tuple[int, int, int, int], out_hw: tuple[int, int],
                     kernel: tuple[int, int], strides: tuple[int, int], dilations: tuple[int, int]) -> str:
    """The ``DEPTHWISE_LAYOUTS`` name ``depthwise_rows`` takes for an input of ``shape``."""
    if same_width(pads, out_hw, kernel, strides, dilations, shape[3]):
        return SAME_WIDTH
    if half_width(shape, out_hw, strides):
        return HALF_WIDTH
    return PHASES


def depthwise_rows(x: np.ndarray, w: np.ndarray, pads: tuple[int, int, int, int], out_hw: tuple[int, int],
                   kernel: tuple[int, int], strides: tuple[int, int], dilations: tuple[int, int],
                   layout: str | None = None) -> tuple[np.ndarray, int]:
    """``depthwise_taps`` before its outputs are cut from the rows: the row-pitched (N, C, L)
    result and its row pitch (``rows_view``), so a caller that adds a bias does it in the copy
    that cuts them. When the pitch is ow, the rows are the outputs. ``layout`` names the
    ``DEPTHWISE_LAYOUTS`` entry to take (``depthwise_layout``'s choice when None); ``phases``
    holds for every convolution, the flat-plane layouts only where their condition does.

    numpy has no fused multiply-add, so a loop over taps costs two full passes per tap. Instead the
    tap rows are copied tap-major into (N, C, taps, L) and one batched matmul (1 x taps) @
    (taps x L) per channel does the multiply-adds in BLAS (``_reduce_taps``): measured 3-4x faster
    than the tap loop on ShuffleNet's layers. The tap rows are contiguous slices of flat planes
    without a border when the output keeps the input's width at unit stride (``same_width_taps``)
    or halves it at stride 2 (``half_width_taps``), and otherwise of the padded stride phases
    (``_phases``), each phase's taps copied with one strided view (``_tap_grids``) and the weights
    permuted to that tap order."""
    n, c, _, wd = x.shape
    kh, kw = kernel
    chosen = depthwise_layout(x.shape, pads, out_hw, kernel, strides, dilations)
    if layout is None:
        layout = chosen
    elif layout not in DEPTHWISE_LAYOUTS or (layout != PHASES and layout != chosen):
        condition = DEPTHWISE_LAYOUTS[layout].condition if layout in DEPTHWISE_LAYOUTS else "unknown layout"
        raise InvalidArgument(f"depthwise layout {layout!r} does not hold for input {list(x.shape)}, pads {pads}, "
                              f"kernel {kernel}, strides {strides} ({condition}); use {chosen!r} or 'phases'")
    if layout != PHASES:
        fill = same_width_taps if layout == SAME_WIDTH else half_width_taps
        cols = np.empty((n, c, kh, kw, out_hw[0] * out_hw[1]), dtype=x.dtype)
        fill(x, pads, out_hw, kernel, dilations, cols)
        return _reduce_taps(w.reshape(c, kh * kw), cols.reshape(n, c, kh * kw, -1)), out_hw[1]
    phases, grids, order, wq, length = _phases(x, pads, 0, out_hw, kernel, strides, dilations)
    cols = np.empty((n, c, kh * kw, length), dtype=x.dtype)
    t = 0  # the grids' taps go tap-major in grid order; ``order`` maps them back to the weights
    for key, rows, columns, off0, du, dv, _ in grids:
        nu, nv = len(rows), len(columns)
        phase = phases[key]
        assert off0 + (nu - 1) * du + (nv - 1) * dv + length <= phase.shape[2]  # reads stay in the phase
        st = phase.strides
        view = strided_view(phase, (n, c, nu, nv, length), (st[0], st[1], du * st[2], dv * st[2], st[2]), off0)
        np.copyto(cols[:, :, t:t + nu * nv].reshape(n, c, nu, nv, length), view)
        t += nu * nv
    wk = w.reshape(c, kh * kw)
    if order is not None:
        wk = wk[:, order]
    return _reduce_taps(wk, cols), wq


def _reduce_taps(wk: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """(N, C, L): per channel, the weights ``wk`` (C, taps) times its tap rows ``cols`` (N, C,
    taps, L), one batched BLAS product."""
    n, c, taps, length = cols.shape
    acc = np.empty((n, c, 1, length), dtype=cols.dtype)
    np.matmul(wk.reshape(c, 1, taps), cols, out=acc)
    return acc.reshape(n, c, length)


@functools.lru_cache(maxsize=1024)  # called per tap column on every run: the same few arguments
def _wrapped(shift: int, width: int) -> tuple[int, ...]:
    """The output columns s of a row of ``width`` whose tap column s + ``shift`` falls off the
    row: in a flat plane those taps read the neighbouring row, so their copies are zeroed."""
    return (*range(min(max(0, -shift), width)), *range(max(0, width - shift), width))


def same_width(pads: tuple[int, int, int, int], out_hw: tuple[int, int], kernel: tuple[int, int],
               strides: tuple[int, int], dilations: tuple[int, int], width: int) -> bool:
    """Whether a convolution's windows can be read by ``same_width_taps``: unit stride, and the
    output as wide as the input (3x3 with pads 1, 5x5 with pads 2, ...)."""
    return strides == (1, 1) and pads[1] + pads[3] == (kernel[1] - 1) * dilations[1] and out_hw[1] == width


def same_width_taps(x: np.ndarray, pads: tuple[int, int, int, int], out_hw: tuple[int, int],
                    kernel: tuple[int, int], dilations: tuple[int, int], cols: np.ndarray) -> None:
    """Fill ``cols`` (N, C, kh, kw, oh * W) with the windows of a ``same_width`` convolution
    over ``x`` (N, C, H, W) zero-padded by ``pads``. Each plane is copied whole between ``top``
    rows (+ ``left`` cells) of zeros and ``bottom`` rows (+ ``right``) of zeros, so with a row
    pitch of W every tap is a contiguous slice of oh * W cells (one long inner loop, where a
    window view's rows are W cells each), and the result needs no cutting from pitched rows. The
    taps that would read across a row end are zeroed in the copied rows instead (``_wrapped``).
    Against the padded-plane copy: 0.03 against 0.12 ms at 136x28x28 (depthwise), 0.53 against
    1.04 ms at 128x56x56 with 3x3 taps."""
    n, c, h, wd = x.shape
    top, left, bottom, right = pads
    oh = out_hw[0]
    kh, kw = kernel
    dh, dw = dilations
    head, plane = top * wd + left, h * wd
    flat = np.empty((n, c, head + plane + bottom * wd + right), dtype=x.dtype)
    flat[:, :, :head] = 0
    flat[:, :, head + plane:] = 0
    flat[:, :, head:head + plane] = x.reshape(n, c, plane)
    st = flat.strides
    np.copyto(cols, strided_view(flat, (n, c, kh, kw, oh * wd), (st[0], st[1], dh * wd * st[2], dw * st[2], st[2])))
    for j, col in _same_width_wrapped(kw, dw, left, wd):
        cols[:, :, :, j, col::wd] = 0


@functools.lru_cache(maxsize=256)
def _same_width_wrapped(kw: int, dw: int, left: int, width: int) -> tuple[tuple[int, int], ...]:
    """``same_width_taps``' (kernel column, output column) pairs to zero, fixed per layer."""
    return tuple((j, col) for j in range(kw) for col in _wrapped(j * dw - left, width))


def flat_plane_filler(shape: tuple[int, ...], pads: tuple[int, int, int, int], out_hw: tuple[int, int],
                      kernel: tuple[int, int], strides: tuple[int, int], dilations: tuple[int, int]):
    """The function that fills (N, C, kh, kw, oh * ow) windows from flat planes without a border
    for a convolution of an input of ``shape``: ``same_width_taps`` at unit stride with the
    output as wide as the input, ``half_width_taps`` at stride 2 with it half as wide, else None.
    Both take (x, pads, out_hw, kernel, dilations, cols); the depthwise and im2col paths share it."""
    if same_width(pads, out_hw, kernel, strides, dilations, shape[3]):
        return same_width_taps
    if half_width(shape, out_hw, strides):
        return half_width_taps
    return None


def half_width(shape: tuple[int, ...], out_hw: tuple[int, int], strides: tuple[int, int]) -> bool:
    """Whether a convolution's windows can be read by ``half_width_taps``: stride 2 over an
    input of even height and width, and the output half as wide (3x3 with pads 1, ...)."""
    return strides == (2, 2) and shape[2] % 2 == 0 and shape[3] % 2 == 0 and out_hw[1] == shape[3] // 2


@functools.lru_cache(maxsize=256)
def _half_width_layout(h: int, top: int, left: int, out_hw: tuple[int, int], kernel: tuple[int, int],
                       dilations: tuple[int, int]) -> tuple[tuple, tuple, int, int]:
    """``half_width_taps``' layout, fixed per layer and so computed once: the taps of each stride
    phase as one grid (``_tap_grids``: phase 2a + b, kernel rows, kernel columns, offset of the
    first tap in the phase plane, offset step per grid row and column), the copied rows to zero
    as (kernel rows, kernel column, output column) with the rows a slice, and the zeros the flat
    phase planes need before and after."""
    (oh, ow), (kh, kw), (dh, dw) = out_hw, kernel, dilations
    plane, length = (h // 2) * ow, oh * ow
    taps, wrapped = [], {}
    for i in range(kh):
        a, du = (i * dh - top) % 2, (i * dh - top) // 2
        for j in range(kw):
            b, dv = (j * dw - left) % 2, (j * dw - left) // 2
            taps.append((i, j, 2 * a + b, du * ow + dv))
            for col in _wrapped(dv, ow):
                wrapped.setdefault((j, col), []).append(i)
    head = max(0, -min(t[3] for t in taps))
    tail = max(0, max(t[3] for t in taps) + length - plane)
    zeros = []
    for (j, col), rows in wrapped.items():  # the kernel rows sharing a column as one slice where they can
        if rows == list(range(kh)):
            zeros.append((slice(None), j, col))
        else:
            zeros.extend((slice(i, i + 1), j, col) for i in rows)
    return tuple(_tap_grids(taps)), tuple(zeros), head, tail


def half_width_taps(x: np.ndarray, pads: tuple[int, int, int, int], out_hw: tuple[int, int],
                    kernel: tuple[int, int], dilations: tuple[int, int], cols: np.ndarray) -> None:
    """Fill ``cols`` (N, C, kh, kw, oh * ow) with the windows of a ``half_width`` convolution
    over ``x`` (N, C, H, W) zero-padded by ``pads``.

    The four stride phases (input rows a::2, columns b::2) are copied into flat planes with a row
    pitch of ow = W / 2 and zeros before and after, in one copy. A tap then reads one phase at a
    fixed offset for every output, so it is one contiguous slice of oh * ow cells, as in
    ``same_width_taps``, and the taps of one phase are evenly spaced slices, copied together
    through one strided view (4 copies for 3x3 taps, not 9: 0.41 against 0.45 ms at 112x56x56);
    the outputs whose column falls off the phase's row are zeroed in the copied rows, one pass per
    kernel column. Depthwise, against the padded phases (rows of ow + 1 with a border, and the
    outputs cut from the pitched rows): 0.46 against 0.62 ms at 112x56x56, 0.17 against 0.31 at
    136x28x28."""
    n, c, h, wd = x.shape
    oh, ow = out_hw
    plane, length = (h // 2) * ow, oh * ow
    grids, zeros, head, tail = _half_width_layout(h, pads[0], pads[1], out_hw, kernel, dilations)
    pitch = head + plane + tail
    flat = np.empty((n, c, 4, pitch), dtype=x.dtype)
    flat[..., :head] = 0
    flat[..., head + plane:] = 0
    np.copyto(flat[..., head:head + plane].reshape(n, c, 2, 2, h // 2, ow),
              x.reshape(n, c, h // 2, 2, ow, 2).transpose(0, 1, 3, 5, 2, 4))
    st = flat.strides
    for phase, rows, columns, off0, du, dv, window in grids:
        view = strided_view(flat, (n, c, len(rows), len(columns), length), (st[0], st[1], du * st[3], dv * st[3], st[3]),
                            phase * pitch + head + off0)
        np.copyto(cols[window], view)
    for rows, j, col in zeros:
        cols[:, :, rows, j, col::ow] = 0


def im2col_2d(x: np.ndarray, pads: tuple[int, int, int, int], out_hw: tuple[int, int], kernel: tuple[int, int],
              strides: tuple[int, int], dilations: tuple[int, int], cols: np.ndarray) -> str:
    """Copy the windows of ``x`` (N, C, H, W) zero-padded by ``pads`` into ``cols`` (N, C, kh, kw,
    oh, ow); the name of the layout that copied them: "same_width", "half_width", "phases" or
    "view" (FusedConv's im2col paths and ``frame_im2col_conv`` share it)."""
    (kh, kw), (sh, sw), (dh, dw), (oh, ow) = kernel, strides, dilations, out_hw
    # Unit-stride 3x3 with pads 1, ..., and stride-2 ones half as wide (3x3 and 7x7 stems,
    # ResNet's 3x3/2 layers): taps as contiguous rows of flat planes, where the window view's rows
    # step by the stride (cheaper than building them from padded phases)
    fill = flat_plane_filler(x.shape, pads, out_hw, kernel, strides, dilations)
    if fill is not None:
        # a view, also of FusedConv's transposed batched windows (a copy would be filled in vain)
        fill(x, pads, out_hw, kernel, dilations, np.reshape(cols, cols.shape[:4] + (oh * ow,), copy=False))
        return "same_width" if fill is same_width_taps else "half_width"
    # Patches that tile the input (a ViT's patch embedding: 8x8 or 16x16 windows at their own
    # stride, no padding) are one strided view of it: a single copy below, where building them
    # from phases takes a copy per tap.
    tiles = (sh, sw) == (kh, kw) and (dh, dw) == (1, 1) and not any(pads)
    if kh * kw >= 25 and (sh > 1 or sw > 1) and not tiles:  # e.g. a 7x7 stride-2 stem over an odd size
        im2col_from_phases(x, pads, out_hw, kernel, strides, dilations, cols)
        return "phases"
    xp = pad_spatial(x, pads[:2], pads[2:])
    st = xp.strides
    n, c = x.shape[:2]
    win = strided_view(xp, (n, c, kh, kw, oh, ow), (st[0], st[1], st[2] * dh, st[3] * dw, st[2] * sh, st[3] * sw))
    np.copyto(cols, win)  # memory-bound: measured slower split over two threads
    return "view"


#: Largest number of gathered window elements (taps x outputs, all images) a convolution takes the
#: gather paths for (``gather_plan``); unit-stride depthwise ones stop at DEPTHWISE_GATHER_MAX. A
#: take moves each element more slowly than the strided copies, but the gather paths make 4-5
#: numpy calls where the others make 10-20: below these limits the calls saved outweigh the slower
#: moves (unit-stride depthwise layers reach the crossover sooner, since their flat-plane copies
#: are cheap; strided ones later, since their half-width phase copies cost more).
GATHER_MAX = 1 << 15
DEPTHWISE_GATHER_MAX = 1 << 14
#: The gather paths take with mode="wrap": their indices are in range by construction (built per
#: input shape), and numpy's wrap mode skips the per-element bounds error path of "raise" (none is
#: out of range, so none wraps).


def gather_plan(x_shape: tuple, w_shape: tuple, pads: tuple[int, int, int, int], out_hw: tuple[int, int],
                 strides: tuple[int, int], dilations: tuple[int, int], depthwise: bool,
                 has_bias: bool, limit: int | None = None
                 ) -> tuple[np.ndarray, bool, tuple[int, int, int, int], np.ndarray | None] | None:
    """For a small ungrouped or depthwise 2-D convolution: the flat indices that gather all its
    windows from the input in one ``take``; whether they read the two cells (0, then 1) appended
    after the input (padding reads the 0, a bias the 1: it rides in the product as a weight
    column); the output shape; and the taps kept (``gathered_weights``; None: all). None past
    ``limit`` (by default ``GATHER_MAX``, ``DEPTHWISE_GATHER_MAX`` for unit-stride depthwise ones)
    elements of the taps that read the input.

    Ungrouped: (N, C kh kw [+ 1], oh ow), the product's right side per image. Depthwise: (kh kw
    [+ 1], N, C, oh ow), tap-major, so weighting the taps is one multiply and summing them one
    reduction over the leading axis; the bias is the last tap, reading the 1. A convolution of
    ShuffleNet or MobileNet at 2x2 to 16x16 runs in 4-5 numpy calls instead of 10-20."""
    if limit is None:
        limit = DEPTHWISE_GATHER_MAX if depthwise and tuple(strides) == (1, 1) else GATHER_MAX
    return _gather_plan(tuple(x_shape), tuple(w_shape), tuple(pads), tuple(out_hw), tuple(strides),
                        tuple(dilations), bool(depthwise), bool(has_bias), limit)


#: Sessions' first runs plan each small convolution's gather; one model repeats a geometry over
#: its blocks (MobileNet: 14 plans, 7 distinct), and sessions of one model repeat them all. The
#: plans kept are read-only; each holds fewer indices than its limit.
@functools.lru_cache(maxsize=128)
def _gather_plan(x_shape: tuple, w_shape: tuple, pads: tuple[int, int, int, int], out_hw: tuple[int, int],
                 strides: tuple[int, int], dilations: tuple[int, int], depthwise: bool, has_bias: bool, limit: int
                 ) -> tuple[np.ndarray, bool, tuple[int, int, int, int], np.ndarray | None] | None:
    n, c, h, wd = x_shape
    kh, kw = w_shape[2:]
    oh, ow = out_hw
    (sh, sw), (dh, dw) = strides, dilations
    taps, p = kh * kw, oh * ow
    rows = np.arange(oh)[None, :] * sh + np.arange(kh)[:, None] * dh - pads[0]  # (kh, oh)
    cols = np.arange(ow)[None, :] * sw + np.arange(kw)[:, None] * dw - pads[1]  # (kw, ow)
    row_in, col_in = (rows >= 0) & (rows < h), (cols >= 0) & (cols < wd)
    # The limit counts the taps that read the input somewhere (those left out below cost
    # nothing): a 5x5 kernel over a 2x2 plane gathers its 9 live taps, not 25.
    live_taps = int(row_in.any(axis=1).sum()) * int(col_in.any(axis=1).sum())
    if live_taps * n * c * p + (has_bias and n * c * p) > limit or not n * c * p:
        return None
    inside = (row_in[:, None, :, None] & col_in[None, :, None, :]).reshape(taps, p)
    at = (rows[:, None, :, None] * wd + cols[None, :, None, :]).reshape(taps, p)  # (taps, P) in a plane
    # Taps (rows of the product) that read padding alone for every output are left out: a 1x1
    # input under a 3x3 kernel padded by 1 keeps its centre tap, and needs no appended cells.
    # Whether a tap reads the input is the same for every image and channel: the taps are chosen
    # before the indices are spread over them.
    live = inside.any(axis=1)
    keep = None
    if live.any() and not live.all():
        kept = np.flatnonzero(live)
        at, inside = at[kept], inside[kept]
        # the kept rows of the product: per channel its kept taps (ungrouped), or the taps (depthwise)
        keep = kept if depthwise else (np.arange(c)[:, None] * taps + kept).reshape(-1)
    zero = n * c * h * wd  # the appended 0; the 1 follows it
    planes = (np.arange(n)[:, None] * c + np.arange(c)[None, :]) * (h * wd)  # (N, C) plane starts
    kept_taps = at.shape[0]
    if depthwise:
        idx = np.where(inside[:, None, None, :], at[:, None, None, :] + planes[None, :, :, None], zero)
    else:
        idx = np.where(inside[None, None], at[None, None] + planes[:, :, None, None], zero)
        idx = idx.reshape(n, c * kept_taps, p)
    axis = 0 if depthwise else 1
    if has_bias:
        shape = list(idx.shape)
        shape[axis] = 1
        idx = np.concatenate([idx, np.full(shape, zero + 1)], axis=axis)
    # only padding reads the appended 0 (every index into the input is below it)
    appended = has_bias or not inside.all()
    idx = np.ascontiguousarray(idx, dtype=np.intp)
    for kept_array in (idx, keep):
        if kept_array is not None:
            kept_array.flags.writeable = False
    return idx, appended, (n, w_shape[0], oh, ow), keep


def gathered_weights(w: np.ndarray, keep: np.ndarray | None, depthwise: bool) -> np.ndarray:
    """The weights a ``gather_plan`` product or tap sum reads: (M, C kh kw) for an ungrouped
    convolution, (kh kw, C) tap-major for a depthwise one, less the taps ``keep`` leaves out."""
    wk = w.reshape(w.shape[0], -1)
    if depthwise:
        wk = wk.T
        return wk if keep is None else wk[keep]
    return wk if keep is None else wk[:, keep]


#: The cells the gather paths append after the input: padding reads the 0, a bias the 1.
APPENDED = np.array([0.0, 1.0])


#: The N-d Conv's paths (3-D and more; 2-D float ones run as FusedConv's paths).
ND_PATHS = path_table("conv.Conv", "im2col over the strided window view, then one batched product")
ND_IM2COL = ND_PATHS.add("nd_im2col", "canonical: the window view copied whole as im2col's rows, then one "
                                      "product over the groups")
ND_FLAT_TAPS = ND_PATHS.add("nd_flat_taps", "float, 3-D or more, unit strides, not depthwise, at most "
                                            "ND_FLAT_MAX_WASTE positions computed per output: flat_taps_conv, "
                                            "the taps as contiguous slices of the flattened padded input, copied "
                                            "and multiplied in blocks of ND_BLOCK_ELEMENTS")
ND_FRAME_TAPS = ND_PATHS.add("nd_frame_taps", "float, 3-D, not grouped, kernel k x 1 x 1, unit strides, no "
                                              "row or column padding: frame_taps_conv, one product per frame "
                                              "tap over the input's frames as they lie, no window copy")
ND_FRAME_IM2COL = ND_PATHS.add("nd_frame_im2col", "float, 3-D, not grouped, unit frame dilation, "
                                                  "ND_FRAME_IM2COL_ENABLED, where nd_im2col would run: "
                                                  "frame_im2col_conv, each frame's 2-D windows copied once "
                                                  "(im2col_2d) and every output frame one product over the "
                                                  "kernel's run of consecutive window frames")
ND_GATHER = ND_PATHS.add("nd_gather", "float, 3-D or more, not grouped, the windows of all images at most "
                                      "ND_GATHER_MAX elements: nd_gather_plan's indices, one take of the "
                                      "windows and one product")
#: Whether the k x 1 x 1 convolutions take ``frame_taps_conv`` (tests turn it off to reach the
#: other paths with them)
ND_FRAME_TAPS_ENABLED = True
#: Whether 3-D convolutions that would take ``nd_im2col`` take ``frame_im2col_conv`` (tests turn
#: it off to compare them)
ND_FRAME_IM2COL_ENABLED = True
#: The most window elements (N C taps outputs) ``nd_gather`` takes: below it one ``take`` of
#: precomputed indices copies the windows, where im2col transposes a window view of the padded
#: input (a copy of the input first, then a strided copy of 2 + 2 nd axes).
ND_GATHER_MAX = 1 << 17
#: The size (elements) of flat_taps_conv's window buffer: a block of output positions whose
#: windows stay in (a large) cache between their copy and the product. Whole, a 64-channel 3x3x3
#: layer's windows are tens of megabytes written to memory and read back; MLAS blocks its im2col
#: over output positions for the same reason (onnxruntime onnxruntime/core/mlas/lib/convolve.cpp,
#: MlasConvOperation's working buffer). 64 channels at 8x28x28, CPU time: 2^18 elements 22.9 ms,
#: 2^20 19.2, 2^22 22.1, unblocked 28.6; smaller layers are as fast unblocked as at 2^20.
ND_BLOCK_ELEMENTS = 1 << 20
#: The most positions ``flat_taps_conv`` computes per output (``flat_taps_waste``) where it is
#: taken: its product also runs over the padding's columns, which outweighs the copy it saves on
#: small planes (3x3x3, CPU time against nd_im2col alternating: 64 channels at 8x28x28, waste
#: 1.14, 0.69; 32 at 8x32x32 1.12, 0.64; 64 at 16x56x56 0.56; 128 at 4x14x14, waste 1.26, 1.26;
#: 8x14x14 1.28, 1.11; 256 at 2x7x7 1.45, 1.32; 64 at 4x8x8 1.48, 1.21).
ND_FLAT_MAX_WASTE = 1.2


def flat_taps_waste(spatial: tuple, pb: tuple, pe: tuple, out: tuple) -> float:
    """Positions ``flat_taps_conv`` computes per output of a unit-stride convolution of input
    ``spatial`` padded by ``pb``/``pe`` to ``out``."""
    dims = [s + b + e for s, b, e in zip(spatial, pb, pe)]
    pitches = [int(math.prod(dims[i + 1:])) for i in range(len(dims))]
    return (sum((o - 1) * p for o, p in zip(out, pitches)) + 1) / max(1, int(math.prod(out)))


def flat_taps_conv(x: np.ndarray, w: np.ndarray, pb: tuple, pe: tuple, out: tuple, dilations: tuple,
                   group: int) -> np.ndarray:
    """A unit-stride N-d convolution (no bias) whose windows are slices of the flattened padded
    input: output position (o1, ..., od) sits at sum(oi * pitch_i) of the padded volume (pitch_i
    its row-major strides), and tap (k1, ..., kd) reads from there plus sum(ki * dil_i * pitch_i),
    so each tap of each channel is one contiguous slice, the positions between the outputs' rows
    (the padding's columns) computed and dropped. Blocks of positions are copied into a buffer of
    ``ND_BLOCK_ELEMENTS`` and multiplied while it is in cache; the outputs are then cut from the
    padded pitch in one copy."""
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    kernel = w.shape[2:]
    xp = np.ascontiguousarray(pad_spatial(x, pb, pe))
    dims = xp.shape[2:]
    pitches = [int(math.prod(dims[i + 1:])) for i in range(len(dims))]
    length = sum((o - 1) * p for o, p in zip(out, pitches)) + 1
    offsets = [sum(k * d * p for k, d, p in zip(tap, dilations, pitches)) for tap in np.ndindex(*kernel)]
    taps, mg = len(offsets), m // group
    k = cg * taps
    wk = w.reshape(group, mg, k)
    flat = xp.reshape(n, group, cg, -1)
    block = max(1, min(length, ND_BLOCK_ELEMENTS // (c * taps)))
    buf = np.empty(c * taps * block, dtype=x.dtype)
    total = out[0] * pitches[0]  # whole padded rows of the outer axis: the cut below stays inside
    acc = np.empty((n, group, mg, total), dtype=x.dtype)
    for i in range(n):
        check_terminate()  # one image's blocks per read
        for p0 in range(0, length, block):
            p1 = min(length, p0 + block)
            cols = buf[:c * taps * (p1 - p0)].reshape(group, cg, taps, p1 - p0)
            for t, off in enumerate(offsets):
                np.copyto(cols[:, :, t], flat[i, :, :, off + p0:off + p1])
            np.matmul(wk, cols.reshape(group, k, p1 - p0), out=acc[i, :, :, p0:p1])
    st = acc.strides[-1]
    view = strided_view(acc, (n, m) + tuple(out), (acc.strides[0], acc.strides[2]) + tuple(p * st for p in pitches))
    # a copy always: where the cut is already contiguous (no padding columns to drop) the view itself
    # is read-only, and the caller adds the bias in place
    return np.array(view, order="C")


def nd_gather_plan(x_shape: tuple, kernel: tuple, strides: tuple, dilations: tuple, pb: tuple,
                   out: tuple) -> tuple[np.ndarray, bool] | None:
    """For a small N-d convolution of input ``x_shape``: the flat indices (N, C taps, outputs)
    that gather every window from the input in one ``take``, padding reading the cell appended
    after the input (index ``x.size``), and whether any does; None past ``ND_GATHER_MAX``
    elements. Rows are channel-major then tap, as the weights (M, C, *kernel) flatten."""
    size = x_shape[0] * x_shape[1] * math.prod(kernel) * math.prod(out)
    if size > ND_GATHER_MAX or not size:
        return None
    return _nd_gather_plan(tuple(x_shape), tuple(kernel), tuple(strides), tuple(dilations), tuple(pb), tuple(out))


#: Kept per process (read-only): a network repeats its geometries, and sessions of one model all
#: of them. At most 32 plans of at most ND_GATHER_MAX indices: 32 MiB, as ``_gather_plan``'s 128.
@functools.lru_cache(maxsize=32)
def _nd_gather_plan(x_shape: tuple, kernel: tuple, strides: tuple, dilations: tuple, pb: tuple,
                    out: tuple) -> tuple[np.ndarray, bool]:
    n, c = x_shape[:2]
    spatial = x_shape[2:]
    taps, outputs = int(math.prod(kernel)), int(math.prod(out))
    at = np.zeros(tuple(kernel) + tuple(out), np.intp)  # the offset in a plane, per (tap, output)
    inside = np.ones(at.shape, bool)
    nd = len(kernel)
    for a in range(nd):
        pos = np.arange(kernel[a])[:, None] * dilations[a] + np.arange(out[a])[None, :] * strides[a] - pb[a]
        shape = [1] * (2 * nd)
        shape[a], shape[nd + a] = kernel[a], out[a]
        pos = pos.reshape(shape)
        inside &= (pos >= 0) & (pos < spatial[a])
        at = at * spatial[a] + pos
    at, inside = at.reshape(taps, outputs), inside.reshape(taps, outputs)
    plane = int(math.prod(spatial))
    starts = (np.arange(n * c) * plane).reshape(n, c, 1, 1)
    idx = np.where(inside, at, 0) + starts
    padded = not inside.all()
    if padded:
        idx = np.where(inside, idx, n * c * plane)
    idx = np.ascontiguousarray(idx.reshape(n, c * taps, outputs), dtype=np.intp)
    idx.flags.writeable = False
    return idx, padded


def nd_gather_conv(x: np.ndarray, w: np.ndarray, plan: tuple[np.ndarray, bool], out: tuple) -> np.ndarray:
    """A small ungrouped N-d convolution (no bias) from its gathered windows: one take, one product."""
    idx, padded = plan
    flat = x.reshape(-1)
    if padded:
        flat = np.concatenate((flat, np.zeros(1, x.dtype)))
    y = np.matmul(w.reshape(w.shape[0], -1), flat.take(idx, mode="wrap"))
    return y.reshape((x.shape[0], w.shape[0]) + tuple(out))


def frame_taps_conv(x: np.ndarray, w: np.ndarray, pb: int, out: int, dil: int) -> np.ndarray:
    """A unit-stride convolution (no bias, not grouped) whose kernel spans frames alone (k x 1 x 1,
    R(2+1)D's temporal half), over an input unpadded in its rows and columns: each frame tap is one
    product of its weights (M, C) with the run of input frames it reads, which lies in x as a
    (C, frames x rows x columns) matrix, added into the outputs' run; taps whose frames fall in
    the padding are left out. im2col would first copy every tap's frames."""
    n, c, d = x.shape[:3]
    plane = int(math.prod(x.shape[3:]))
    m, k = w.shape[0], w.shape[2]
    xf = x.reshape(n, c, d * plane)
    wt = [np.ascontiguousarray(w[:, :, t].reshape(m, c)) for t in range(k)]
    runs = []
    for t in range(k):
        off = t * dil - pb
        i0, i1 = max(0, -off), min(out, d - off)
        if i1 > i0:
            runs.append((t, i0, i1, off))
    y = np.empty((n, m, out * plane), dtype=x.dtype)
    full = next((r for r in runs if r[1] == 0 and r[2] == out), None)
    if full is None:
        y.fill(0)
    else:  # a tap that reaches every output frame writes the outputs first, sparing a zero fill
        t, i0, i1, off = full
        np.matmul(wt[t], xf[:, :, (i0 + off) * plane:(i1 + off) * plane], out=y)
        runs.remove(full)
    for t, i0, i1, off in runs:
        y[:, :, i0 * plane:i1 * plane] += np.matmul(wt[t], xf[:, :, (i0 + off) * plane:(i1 + off) * plane])
    return y.reshape((n, m, out) + x.shape[3:])


def frame_weights(w: np.ndarray) -> np.ndarray:
    """3-D weights (M, C, kt, kh, kw) as ``frame_im2col_conv`` multiplies them: (M, kt C kh kw),
    frame tap major, as its run of window frames lies."""
    return np.ascontiguousarray(w.transpose(0, 2, 1, 3, 4)).reshape(w.shape[0], -1)


def frame_im2col_conv(x: np.ndarray, wk: np.ndarray, kernel: tuple, pb: tuple, pe: tuple, out: tuple,
                      strides: tuple, dilations: tuple) -> np.ndarray:
    """An ungrouped 3-D convolution (no bias) at unit frame dilation, from 2-D windows: each input
    frame's (C, kh, kw) windows are copied once (``im2col_2d``, its flat-plane layouts included)
    into a buffer of frames (N, pt + T + et, C kh kw, P) whose padding frames are zeros, so an
    output frame's kt window frames are kt consecutive blocks, one contiguous (kt C kh kw, P)
    matrix: one product with ``frame_weights`` per output frame, batched over an image's frames
    through a strided view (no copy). im2col over the 3-D window view copies every input value kt
    kh kw times, each through a transpose of 2 + 2 x 3 axes; this copies it kh kw times."""
    n, c, t = x.shape[:3]
    kt, kh, kw = kernel
    ot, oh, ow = out
    p, k2, m = oh * ow, c * kh * kw, wk.shape[0]
    head = pb[0]
    cols = np.empty((n, head + t + pe[0], c, kh, kw, oh, ow), dtype=x.dtype)
    cols[:, :head] = 0
    cols[:, head + t:] = 0
    pads = (pb[1], pb[2], pe[1], pe[2])
    y = np.empty((n, m, ot, p), dtype=x.dtype)
    item = cols.itemsize
    for i in range(n):
        check_terminate()
        im2col_2d(x[i].transpose(1, 0, 2, 3), pads, (oh, ow), (kh, kw), tuple(strides[1:]), tuple(dilations[1:]),
                  cols[i, head:head + t])
        runs = as_strided(cols[i], (ot, kt * k2, p), (strides[0] * k2 * p * item, p * item, item), writeable=False)
        np.matmul(wk, runs, out=y[i].transpose(1, 0, 2))
    return y.reshape((n, m) + tuple(out))


@register("Conv", since=1)
class Conv(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.geo = ConvGeometry(node)
        self.group = node.attr("group", 1)
        self._plans: dict[tuple, tuple | bool] = {}  # per (input, weight shapes); kernels are shared by runs
        self._geometries: dict[tuple, tuple] = {}  # ``geo.resolve``'s, per (input, weight shapes), as tuples
        self.widen = half.WidenedInputs(node, ctx)
        self.last_path: str | None = None  #: the ``ND_PATHS`` name of the last im2col run
        self._frame_w: tuple | None = None  # (w, frame_weights(w)) of the last 3-D run, constant weights only
        # a graph input may be the same array on every run with new values written into it
        constant = getattr(ctx, "is_constant_initializer", lambda name: False)  # ctx None: constant folding
        self._w_const = len(node.inputs) > 1 and constant(node.inputs[1])
        self.taps = TrimmedTaps(node, ctx, lambda twin: Conv(twin, ctx))  #: taps reading only padding, cut

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        if x.dtype is half.F16 and half.applies(x, inputs[1]):
            return half.via_float32(self.compute, inputs, self.widen)
        if x.dtype.itemsize < 4 and x.dtype.kind != "i":  # float16/bfloat16: accumulate in float32
            y = self.compute([None if v is None else v.astype(np.float32) for v in inputs])[0]
            return [y.astype(x.dtype)]
        trimmed = self.taps.run(inputs)
        if trimmed is not None:
            return trimmed[0]
        w = inputs[1]
        b = inputs[2] if len(inputs) > 2 else None
        if x.ndim == 4 and x.dtype.kind == "f" and w.dtype == x.dtype:
            plan = per_shape(self._plans, (x.shape, w.shape), lambda: self._gather_plan(x.shape, w.shape))
            if plan:
                return [self._gathered(x, w, b, plan)]
        n, c = x.shape[:2]
        m = w.shape[0]
        g = self.group
        kernel, strides, dil, pb, pe, out = per_shape(self._geometries, (x.shape, w.shape), lambda: tuple(
            tuple(v) for v in self.geo.resolve(x.shape[2:], w.shape[2:])))
        nd = len(kernel)
        cg, mg = c // g, m // g
        if cg == 1 and mg == 1 and g > 1 and nd == 2:
            y = depthwise_taps(x, w, (pb[0], pb[1], pe[0], pe[1]), tuple(out), tuple(kernel), tuple(strides),
                               tuple(dil))
        elif cg == 1 and mg == 1 and g > 1:
            y = self._depthwise(window_view(pad_spatial(x, pb, pe), kernel, strides, dil, out), w, kernel, nd)
        elif (g == 1 and nd >= 3 and x.dtype.kind == "f" and w.dtype == x.dtype
              and (plan := nd_gather_plan(x.shape, kernel, strides, dil, pb, out)) is not None):
            self.last_path = ND_GATHER
            y = nd_gather_conv(np.ascontiguousarray(x), w, plan, out)
        elif (ND_FRAME_TAPS_ENABLED and nd == 3 and g == 1 and x.dtype.kind == "f" and w.dtype == x.dtype and tuple(kernel[1:]) == (1, 1)
              and all(s == 1 for s in strides) and not any(pb[1:]) and not any(pe[1:])):
            self.last_path = ND_FRAME_TAPS
            y = frame_taps_conv(np.ascontiguousarray(x), w, pb[0], out[0], dil[0])
        elif (nd >= 3 and x.dtype.kind == "f" and w.dtype == x.dtype and all(s == 1 for s in strides)
              and flat_taps_waste(x.shape[2:], pb, pe, out) <= ND_FLAT_MAX_WASTE):
            self.last_path = ND_FLAT_TAPS
            y = flat_taps_conv(x, w, tuple(pb), tuple(pe), tuple(out), tuple(dil), g)
        elif (ND_FRAME_IM2COL_ENABLED and nd == 3 and g == 1 and dil[0] == 1 and x.dtype.kind == "f"
              and w.dtype == x.dtype):
            self.last_path = ND_FRAME_IM2COL
            y = frame_im2col_conv(x, self._frame_weights(w), tuple(kernel), tuple(pb), tuple(pe), tuple(out),
                                  tuple(strides), tuple(dil))
        else:
            self.last_path = ND_IM2COL
            win = window_view(pad_spatial(x, pb, pe), kernel, strides, dil, out)  # (N, C, *out, *kernel)
            kprod = int(math.prod(kernel))
            oprod = int(math.prod(out))
            win = win.reshape((n, g, cg) + tuple(out) + tuple(kernel))
            perm = (0, 1, 2) + tuple(range(3 + nd, 3 + 2 * nd)) + tuple(range(3, 3 + nd))
            cols = np.ascontiguousarray(win.transpose(perm)).reshape(n, g, cg * kprod, oprod)  # im2col
            y = np.matmul(w.reshape(g, mg, cg * kprod), cols).reshape((n, m) + tuple(out))
        if b is not None:
            y += b.reshape((1, m) + (1,) * nd)
        return [y]

    def _frame_weights(self, w: np.ndarray) -> np.ndarray:
        """``frame_weights(w)``, kept while the same constant initializer's array comes back."""
        kept = self._frame_w
        if kept is not None and kept[0] is w:
            return kept[1]
        wk = frame_weights(w)
        if self._w_const:
            self._frame_w = (w, wk)
        return wk

    def _gather_plan(self, x_shape: tuple, w_shape: tuple) -> tuple | bool:
        """``gather_plan``'s indices for a small ungrouped or depthwise 2-D convolution, with
        whether it is depthwise; False for the other paths."""
        kernel, strides, dil, pb, pe, out = self.geo.resolve(x_shape[2:], w_shape[2:])
        c, m, g = x_shape[1], w_shape[0], self.group
        depthwise = g > 1 and m == g == c and w_shape[1] == 1
        if not (depthwise or g == 1 and w_shape[1] == c) or len(kernel) != 2:
            return False
        plan = gather_plan(x_shape, w_shape, (pb[0], pb[1], pe[0], pe[1]), tuple(out), tuple(strides), tuple(dil),
                           depthwise, False)
        return False if plan is None else (*plan, depthwise)

    @staticmethod
    def _gathered(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, plan: tuple) -> np.ndarray:
        """A small convolution from its gathered windows: one product per image, or for a
        depthwise one a multiply by each tap's weights and a sum over the taps (QLinearConv's
        codes take this too)."""
        idx, appended, out_shape, keep, depthwise = plan
        flat = x.reshape(-1)
        if appended:
            flat = np.concatenate((flat, APPENDED), dtype=x.dtype)
        wk = gathered_weights(w, keep, depthwise)
        if depthwise:
            taps = flat.take(idx, mode="wrap")
            taps *= wk.reshape(idx.shape[0], 1, -1, 1)
            y = np.add.reduce(taps, axis=0)
        else:
            y = np.matmul(wk, flat.take(idx, mode="wrap"))
        y = y.reshape(out_shape)
        if b is not None:
            y += b.reshape(1, -1, 1, 1)
        return y

    @staticmethod
    def _depthwise(win: np.ndarray, w: np.ndarray, kernel, nd: int) -> np.ndarray:
        """One multiply-add over the whole tensor per kernel tap."""
        wk = w.reshape(w.shape[0], -1)
        y = None
        for t, idx in enumerate(np.ndindex(*kernel)):
            check_terminate()  # one pass over the whole output per tap
            term = win[(Ellipsis,) + idx] * wk[:, t].reshape((1, -1) + (1,) * nd)
            if y is None:
                y = term
            else:
                y += term
        return y


#: ConvTranspose's paths: the plain col2im (one strided add per tap) and its gather.
TRANSPOSE_PATHS = path_table("ConvTranspose", "ConvTranspose's product then col2im as one strided add per "
                                              "kernel tap, cropped or zero-extended to the output")
COL2IM_ADDS = TRANSPOSE_PATHS.add("col2im_adds", "canonical: every geometry the gather does not take")
COL2IM_GATHER = TRANSPOSE_PATHS.add("col2im_gather", "each output cell sums at most col2im.MAX_TERMS "
                                                     "columns and the gathered block (N M terms cells) is at "
                                                     "most col2im.GATHER_MAX elements: col2im_plan's indices, "
                                                     "one take of the columns and one sum over the terms")


@register("ConvTranspose", since=1)
class ConvTranspose(Kernel):
    """Batched matmul then col2im as one strided add per kernel tap. ``output_shape`` and
    ``auto_pad`` place the output as onnxruntime does (``_placement``); onnx.reference differs
    where ``output_shape`` crops (it keeps the start) and where a SAME output is longer than the
    full one (it zero-extends).
    Where few columns reach each output cell, col2im is one gather instead (``COL2IM_GATHER``):
    a profile of pt_codec, pt_unet and hf_dpt had the per-tap adds at 4-10x onnxruntime's time."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.group = node.attr("group", 1)
        self.kernel_shape = node.attr("kernel_shape")
        self.strides = node.attr("strides")
        self.dilations = node.attr("dilations")
        self.pads = node.attr("pads")
        self.output_padding = node.attr("output_padding")
        self.output_shape = node.attr("output_shape")
        self.auto_pad = node.attr("auto_pad", "NOTSET")
        self.name = node.name
        self.last_path: str | None = None  #: the ``TRANSPOSE_PATHS`` name of the last run

    def _placement(self, ins, kernel, strides, dil, opad, full):
        """Per spatial axis: (start in the full col2im output, output length), as onnxruntime's CPU
        EP places them (conv_transpose_attributes.h, ComputeTransposePadAndOutputShape): with
        ``output_shape``, or SAME padding and an output of ``stride * input``, the total padding
        ``max(0, full - output)`` is split with its floor half at the start for SAME_UPPER and its
        ceiling half there otherwise (NOTSET, SAME_LOWER, VALID), and explicit pads are not read;
        a SAME output longer than the full one is the full one. Otherwise the pads (or zeros)."""
        nd = len(ins)
        same = self.auto_pad in ("SAME_UPPER", "SAME_LOWER")
        if self.output_shape:
            out_shape = list(self.output_shape[-nd:])
        elif same:
            out_shape = [ins[i] * strides[i] for i in range(nd)]
        else:
            pads = self.pads or [0] * (2 * nd)
            return list(pads[:nd]), [full[i] - pads[i] - pads[i + nd] for i in range(nd)]
        starts, lengths = [], []
        for i in range(nd):
            total = max(0, full[i] - out_shape[i])
            starts.append(total // 2 if self.auto_pad == "SAME_UPPER" else total - total // 2)
            # an explicit output_shape past the full output is zero-extended at the end (onnxruntime
            # refuses it); a SAME one is cut to the full output, as onnxruntime does
            lengths.append(out_shape[i] if self.output_shape else full[i] - total)
        return starts, lengths

    def compute(self, inputs: list) -> list:
        x, w = inputs[0], inputs[1]
        b = inputs[2] if len(inputs) > 2 else None
        n, c = x.shape[:2]
        ins = x.shape[2:]
        nd = len(ins)
        kernel = list(self.kernel_shape or w.shape[2:])
        strides = self.strides or [1] * nd
        dil = self.dilations or [1] * nd
        opad = (self.output_padding or [0] * nd)[-nd:]
        g = self.group
        cg, mg = c // g, w.shape[1]
        m = mg * g
        kprod, iprod = int(math.prod(kernel)), int(math.prod(ins))
        full = [(ins[i] - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1 + opad[i] for i in range(nd)]
        starts, lengths = self._placement(ins, kernel, strides, dil, opad, full)
        if any(ln <= 0 for ln in lengths):  # as onnxruntime refuses it
            raise InvalidArgument(f"ConvTranspose node {self.name!r}: input spatial shape {list(ins)} gives output "
                                  f"spatial shape {lengths}; every output dimension must be 1 or more.")
        wt = w.reshape(g, cg, mg * kprod).transpose(0, 2, 1)
        plan = None
        if n * m * math.prod(lengths) <= col2im.GATHER_MAX:  # at least one term a cell: plan no block past it
            plan = col2im.col2im_plan(tuple(ins), tuple(kernel), tuple(strides), tuple(dil), tuple(starts),
                                      tuple(lengths))
        if plan is not None and n * m * plan.size <= col2im.GATHER_MAX:
            self.last_path = COL2IM_GATHER
            xz = np.zeros((n, g, cg, iprod + 1), dtype=x.dtype)  # the zero the plan reads at iprod
            xz[..., :iprod] = x.reshape(n, g, cg, iprod)
            cols = np.matmul(wt, xz).reshape(n, m, kprod * (iprod + 1))
            terms = cols.take(plan, axis=-1)  # (N, M, terms, cells)
            y = terms[:, :, 0] if plan.shape[0] == 1 else terms.sum(axis=2)
            if b is not None:
                y += b.reshape(1, m, 1)
            return [y.reshape((n, m) + tuple(lengths))]
        self.last_path = COL2IM_ADDS
        cols = np.matmul(wt, x.reshape(n, g, cg, iprod))  # (N, G, Mg*K, I)
        cols = cols.reshape((n, m) + tuple(kernel) + tuple(ins))
        y = np.zeros((n, m) + tuple(full), dtype=cols.dtype)
        for idx in np.ndindex(*kernel):
            check_terminate()  # one strided add over the whole output per tap
            sl = tuple(slice(idx[i] * dil[i], idx[i] * dil[i] + (ins[i] - 1) * strides[i] + 1, strides[i])
                       for i in range(nd))
            y[(slice(None), slice(None)) + sl] += cols[(slice(None), slice(None)) + idx]
        before = [max(0, -s) for s in starts]
        after = [max(0, s + ln - f) for s, ln, f in zip(starts, lengths, full)]
        if any(before) or any(after):  # the requested window reaches past the computed output
            y = np.pad(y, [(0, 0), (0, 0)] + list(zip(before, after)))
        crop = tuple(slice(s + bf, s + bf + ln) for s, bf, ln in zip(starts, before, lengths))
        y = y[(slice(None), slice(None)) + crop]
        if b is not None:
            y = y + b.reshape((1, m) + (1,) * nd)
        return [np.ascontiguousarray(y)]
