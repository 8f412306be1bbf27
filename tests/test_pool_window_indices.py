"""MaxPool's gather plan (``pooling._window_indices``) against indices written out one window tap at
a time: every tap of every window of every plane, the appended cell for a tap in the padding, the
flag that says whether any tap reads it, and None past ``POOL_GATHER_MAX``."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest

from onnxhal.runtime.providers.cpu.kernels import pooling


def _by_taps(shape, kernel, strides, dil, pb, out):
    planes, spatial = shape[0] * shape[1], shape[2:]
    plane = math.prod(spatial)
    rows, padded = [], False
    for tap in itertools.product(*(range(k) for k in kernel)):
        row = []
        for p in range(planes):
            for o in itertools.product(*(range(v) for v in out)):
                at = [o[a] * strides[a] + tap[a] * dil[a] - pb[a] for a in range(len(spatial))]
                if all(0 <= at[a] < spatial[a] for a in range(len(spatial))):
                    flat = 0
                    for a in range(len(spatial)):
                        flat = flat * spatial[a] + at[a]
                    row.append(p * plane + flat)
                else:
                    row.append(planes * plane)
                    padded = True
        rows.append(row)
    return np.array(rows, np.intp).reshape(math.prod(kernel), -1), padded


def _geometries(count: int, seed: int):
    rng = random.Random(seed)
    for _ in range(count):
        nd = rng.choice((1, 2, 3))
        shape = (rng.randint(1, 2), rng.randint(1, 4)) + tuple(rng.randint(1, 6) for _ in range(nd))
        kernel = [rng.randint(1, 3) for _ in range(nd)]
        strides = [rng.randint(1, 3) for _ in range(nd)]
        dil = [rng.randint(1, 2) for _ in range(nd)]
        pb = [rng.randint(0, k - 1) for k in kernel]
        out = [(shape[2 + a] + 2 * pb[a] - dil[a] * (kernel[a] - 1) - 1) // strides[a] + 1 for a in range(nd)]
        if min(out) > 0:
            yield shape, kernel, strides, dil, pb, out


@pytest.mark.parametrize("seed", range(4))
def test_window_indices_match_taps_written_out(seed):
    for geo in _geometries(40, seed):
        got = pooling._window_indices(*geo)
        idx, padded = _by_taps(*geo)
        assert got is not None, geo
        assert got[0].dtype == np.intp and got[0].flags.c_contiguous
        np.testing.assert_array_equal(got[0], idx, err_msg=str(geo))
        assert got[1] == padded, geo


def test_window_indices_stop_past_the_limit():
    # 9 taps x 64 planes x 64 outputs = 36864 elements, past POOL_GATHER_MAX (32768)
    assert pooling._window_indices((1, 64, 8, 8), [3, 3], [1, 1], [1, 1], [1, 1], [8, 8]) is None
    assert pooling._window_indices((1, 32, 8, 8), [3, 3], [1, 1], [1, 1], [1, 1], [8, 8]) is not None
