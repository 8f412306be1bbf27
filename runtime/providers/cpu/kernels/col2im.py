"""col2im as one gather: for a ConvTranspose of a given geometry, the flat indices into its
product's columns that every output cell sums, so the scatter-add of the columns (one strided add
per kernel tap in ``ConvTranspose.compute``) becomes one ``take`` and one reduction over the few
columns each cell receives (at most ceil(k / s) per axis: 2 x 2 for a 4x4 kernel of stride 2, 1 where
kernel and stride are equal). Pads, ``output_padding``, ``output_shape``, SAME padding and
dilations are folded into the indices: a cell that no column reaches, or that lies past the
computed output, reads a zero appended to each column row."""

from __future__ import annotations

import functools
import math

import numpy as np

#: The gathered block (output cells x columns summed per cell, per image and output channel) past
#: which the plain strided adds are kept: the gather copies that many elements once more.
GATHER_MAX = 1 << 22
#: Columns summed per output cell past which the plain adds are kept: the gather copies the output
#: that many times. Single-threaded BLAS, load 3.7, gather against adds: 3x3x3 stride 1 (27 terms),
#: 8 channels at 8^3, 155 against 369 us; 3x3 stride 1 (9), 32 at 16x16, 151 / 212; 1-D k7 stride 1
#: (7), 32 at 256, 117 / 113, even.
MAX_TERMS = 27


def col2im_plan(ins: tuple, kernel: tuple, strides: tuple, dil: tuple, starts: tuple, lengths: tuple
                ) -> np.ndarray | None:
    """(terms, output cells) indices into a product's (K, I + 1) columns of one output channel
    (K kernel taps, I input cells, then the zero at I): the cell at output position ``o`` sums the
    columns (tap t, input i) with ``i * s + t * d == start + o``, axis by axis. None where a cell
    sums more than ``MAX_TERMS`` columns. Read-only; cached per geometry."""
    return _col2im_plan(tuple(ins), tuple(kernel), tuple(strides), tuple(dil), tuple(starts), tuple(lengths),
                        MAX_TERMS)


#: Sessions' first runs plan each geometry; a decoder repeats one over its upsampling blocks. The
#: kernel plans only outputs of at most GATHER_MAX cells (N M cells), so a plan holds at most that
#: many indices (32 MiB); a corpus model holds 1-2 geometries.
@functools.lru_cache(maxsize=32)
def _col2im_plan(ins: tuple, kernel: tuple, strides: tuple, dil: tuple, starts: tuple, lengths: tuple,
                 max_terms: int) -> np.ndarray | None:
    nd = len(ins)
    taps_ax, cells_ax, terms_ax = [], [], []
    for a in range(nd):
        pos = starts[a] + np.arange(lengths[a])
        t = np.arange(kernel[a])
        num = pos[:, None] - t[None, :] * dil[a]  # (length, k): i * s if tap t reaches the cell
        ok = (num % strides[a] == 0) & (num >= 0) & (num // strides[a] < ins[a])
        r = max(1, int(ok.sum(axis=1).max(initial=0)))
        order = np.argsort(~ok, axis=1, kind="stable")[:, :r]  # the reaching taps first
        valid = np.take_along_axis(ok, order, axis=1)
        i = np.where(valid, np.take_along_axis(num, order, axis=1) // strides[a], -1)
        taps_ax.append(np.where(valid, order, -1).T)  # (r, length)
        cells_ax.append(i.T)
        terms_ax.append(r)
    if int(math.prod(terms_ax)) > max_terms:
        return None
    iprod = int(math.prod(ins))
    tap = np.zeros(tuple(terms_ax) + tuple(lengths), dtype=np.int64)
    cell = np.zeros_like(tap)
    valid = np.ones(tap.shape, dtype=bool)
    for a in range(nd):
        shape = [1] * (2 * nd)
        shape[a], shape[nd + a] = terms_ax[a], lengths[a]
        t, i = taps_ax[a].reshape(shape), cells_ax[a].reshape(shape)
        tap = tap * kernel[a] + t
        cell = cell * ins[a] + i
        valid &= t >= 0
    flat = np.where(valid, tap * (iprod + 1) + cell, iprod)  # iprod: tap 0's appended zero
    flat = flat.reshape(int(math.prod(terms_ax)), int(math.prod(lengths)))
    flat.flags.writeable = False
    return flat
