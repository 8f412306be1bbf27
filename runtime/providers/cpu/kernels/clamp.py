"""Clamping against a constant (Relu, Clip, the fused activations) at SIMD speed.

numpy 2.x runs ``np.maximum``/``np.minimum`` with a scalar operand through a scalar loop, and
with two contiguous arrays through its SIMD loop. Measured here on 800k float32: ``np.maximum(y,
0)`` 0.56 ms, ``np.maximum(y, zeros)`` 0.12 ms, where ``zeros`` is a contiguous array of y's
shape; a broadcast (1, C, 1, 1) operand is not enough (0.29 ms). So large clamps read a cached
read-only array of the constant. A zero constant comes from ``np.zeros`` (calloc), whose pages
are never written and so map the kernel's shared zero page: reading it costs cache, not memory
bandwidth. NaN propagates exactly as with the scalar form (it is the same ufunc). A float clamp
with both bounds is numpy's clip ufunc instead, which has a SIMD loop for scalar bounds."""

from __future__ import annotations

import numpy as np

try:
    from numpy._core.umath import clip as clip_ufunc  # numpy 2
except ImportError:  # numpy 1.x
    from numpy.core.umath import clip as clip_ufunc

MIN_SIZE = 1 << 12  # below this the scalar loop is cheaper than fetching the constant's view
CONSTANT_MAX = 1 << 22  # elements per constant array (16 MiB of float32); larger inputs go in chunks
_constants: dict[tuple[str, bytes], np.ndarray] = {}


#: Views handed out for non-zero constants of up to ``SMALL_MAX`` elements, by (n, dtype, value):
#: a small row-sum product (the tiny models' normalizations) costs less than the general lookup.
#: Only Python numbers other than 0 and NaN: 0.0 and -0.0 are equal keys but different constants,
#: NaN is no key at all, and a 0-d array is not hashable.
_small: dict[tuple, np.ndarray] = {}
SMALL_MAX = 4096


def constant(value, dtype: np.dtype, n: int) -> np.ndarray:
    """A read-only contiguous 1-D array of ``n`` <= 2**22 copies of ``value`` as ``dtype``."""
    small = n <= SMALL_MAX and value.__class__ in (float, int) and value and value == value
    if small:
        hit = _small.get((n, dtype, value))
        if hit is not None:
            return hit
    view = _constant(value, dtype, n)
    if small:
        _small[(n, dtype, value)] = view  # bounded by the shapes and constants a process meets
    return view


def _constant(value, dtype: np.dtype, n: int) -> np.ndarray:
    dtype = np.dtype(dtype)
    scalar = np.array(value, dtype=dtype)
    key = (dtype.str, scalar.tobytes())  # by bytes: 0.0 and -0.0 are different constants
    buf = _constants.get(key)
    if buf is None or buf.size < n:
        size = min(CONSTANT_MAX, max(n, 1 << 16, 0 if buf is None else 2 * buf.size))
        buf = np.zeros(size, dtype) if not key[1].strip(b"\0") else np.full(size, scalar, dtype)
        buf.flags.writeable = False
        _constants[key] = buf  # one reference swap: concurrent readers keep the array they hold
    return buf[:n]


def clamp_(y: np.ndarray, lo=None, hi=None) -> None:
    """``y`` clamped to [lo, hi] in place (either bound may be None)."""
    if lo is not None and hi is not None and y.dtype.kind == "f":
        # numpy's clip ufunc (the maximum-then-minimum of its docs, NaN included) runs one SIMD
        # pass with scalar bounds, where maximum then minimum are two passes without SIMD.
        clip_ufunc(y, lo, hi, out=y)
        return
    if y.size < MIN_SIZE or not y.flags.c_contiguous:
        if lo is not None:
            np.maximum(y, lo, out=y)
        if hi is not None:
            np.minimum(y, hi, out=y)
        return
    flat = y.reshape(-1)
    for s in range(0, flat.size, CONSTANT_MAX):
        part = flat[s:s + CONSTANT_MAX]
        if lo is not None:
            np.maximum(part, constant(lo, y.dtype, part.size), out=part)
        if hi is not None:
            np.minimum(part, constant(hi, y.dtype, part.size), out=part)


def clip(x: np.ndarray, lo=None, hi=None) -> np.ndarray:
    """``x`` clamped to [lo, hi] (either bound may be None) as a new array."""
    if x.size < MIN_SIZE or not x.flags.c_contiguous or x.size > CONSTANT_MAX:
        y = x if lo is None else np.maximum(x, x.dtype.type(lo))
        y = y if hi is None else np.minimum(y, x.dtype.type(hi))
        return x.copy() if y is x else np.asarray(y, dtype=x.dtype)  # a 0-d input gives a numpy scalar
    out = np.empty_like(x)
    src = x
    for bound, fn in ((lo, np.maximum), (hi, np.minimum)):
        if bound is not None:
            fn(src, constant(bound, x.dtype, x.size).reshape(x.shape), out=out)
            src = out
    if src is x:
        np.copyto(out, x)
    return out
