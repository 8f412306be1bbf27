"""The numerics the CPU EP's kernels share, each in one canonical plain form: softmax and
log-softmax, erf and GELU, and rounding to quantized codes. A kernel that needs a faster form
calls a fast path registered here (``FAST_PATHS``) with the condition under which it is chosen;
tests/test_numerics.py runs every registered fast path against its canonical form on random and
edge inputs and fails when one diverges.

Summation order. The float softmaxes here match onnxruntime within a few float32 ulps, not to the
bit: MLAS vectorizes its sums, numpy's ``add.reduce`` adds in order up to 8 elements and pairwise
beyond, BLAS's row sums (``row_sums``) in yet another order; the tests compare within tolerance.
Bit-exactness needs onnxruntime's order only where a sum is rounded to integer codes, since one
code of difference moves every later value: QLinearSoftmax's row sums, which ``mlas_lane_sums``
adds in the order of MLAS's AVX2 kernel.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from onnxhal.runtime.providers.cpu.kernels.clamp import CONSTANT_MAX, clamp_, constant
from onnxhal.runtime.providers.cpu.kernels.native_kernels import native_module


@dataclass(frozen=True)
class FastPath:
    """A faster form of a canonical function, and when the kernels choose it."""

    name: str
    fn: Callable
    canonical: str  #: the name of the canonical function in this module
    condition: str  #: when the kernels call it, in words
    applies: Callable[[np.ndarray], bool]  #: the inputs it takes (the tests draw from these)
    in_place: bool  #: it writes its result into its argument (and returns None or the argument)
    atol: float  #: the largest absolute difference from the canonical form it is allowed
    declines: bool  #: it may return None for an input it leaves to the canonical form


#: Every fast path, by name.
FAST_PATHS: dict[str, FastPath] = {}


def fast_path(name: str, *, canonical: str, condition: str, applies: Callable[[np.ndarray], bool],
              in_place: bool = False, atol: float = 1e-6, declines: bool = False) -> Callable[[Callable], Callable]:
    """Register the decorated function as a fast path of ``canonical`` (see ``FastPath``)."""
    def register(fn: Callable) -> Callable:
        FAST_PATHS[name] = FastPath(name, fn, canonical, condition, applies, in_place, atol, declines)
        return fn
    return register


# -- softmax -------------------------------------------------------------------------------------

def softmax(x: np.ndarray, axis: int = -1, out: np.ndarray | None = None) -> np.ndarray:
    """exp(x - max(x)) / sum(exp(x - max(x))) along ``axis``, in ``out`` when given (which may be
    ``x`` itself). The maximum keeps exp from overflowing."""
    if x.size == 0:  # numpy's maximum has no identity for an empty row
        return x.copy() if out is None else out
    # ufunc.reduce, not ndarray.max/sum: their Python wrappers cost more than a small row pass
    e = np.subtract(x, np.maximum.reduce(x, axis=axis, keepdims=True), out=out)
    np.exp(e, out=e)
    return np.divide(e, np.add.reduce(e, axis=axis, keepdims=True), out=e)


def log_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """(x - max(x)) - log(sum(exp(x - max(x)))) along ``axis``."""
    if x.size == 0:
        return x.copy()
    e = np.subtract(x, np.maximum.reduce(x, axis=axis, keepdims=True))
    return e - np.log(np.add.reduce(np.exp(e), axis=axis, keepdims=True))


def row_sums(rows: np.ndarray) -> np.ndarray:
    """The sums of the rows of a 2-D float array as one BLAS matrix-vector product with a cached
    vector of ones, where numpy's sum along the last axis runs one reduction loop per row (rows
    longer than the longest cached constant are few: numpy sums them)."""
    n = rows.shape[1]
    if n > CONSTANT_MAX:
        return rows.sum(axis=1)
    return np.dot(rows, constant(1.0, rows.dtype, n))


#: Largest input the max-free softmax takes: n * e^60 stays far below float32's 3.4e38.
SOFTMAX_MAX_INPUT = 60.0
#: Smallest row sum the max-free softmax keeps (e^-60): a row whose sum is below it has its max
#: under -60 - ln n, so exp may have flushed some of its elements, and it is redone the usual way.
SOFTMAX_MIN_SUM = float(np.exp(-60.0))
_F32 = np.dtype(np.float32)


def _rows_of_floats(x: np.ndarray, least: int = 1, most: int | None = None) -> bool:
    return (x.dtype == _F32 and x.ndim >= 1 and x.size > 0 and x.flags.c_contiguous
            and x.shape[-1] >= least and (most is None or x.shape[-1] <= most))


#: The switch of ``FAST_PATHS["softmax_native"]``: False keeps the numpy forms.
NATIVE_SOFTMAX_ENABLED = True


@fast_path("softmax_native", canonical="softmax", declines=True,
           condition="float32, C-contiguous, softmax over the last axis, the C extension _native built, "
                     "ONNXHAL_NATIVE_KERNELS not 0 and NATIVE_SOFTMAX_ENABLED (read at each call); declines (None) "
                     "where a row holds a NaN or +inf or is -inf throughout",
           applies=lambda x: _rows_of_floats(x))
def softmax_native(x: np.ndarray) -> np.ndarray | None:
    """Softmax over the last axis in C (``_native.softmax_rows``): x - max per row, exp by a
    polynomial (2^n exp(f), Taylor to f^7: within a few float32 ulps), the row sums in float64, as a
    new array; one call where numpy's max-free form makes six to eight. None where the C extension
    is off or a row holds what only the canonical form answers (NaN, +inf, all -inf)."""
    native = native_module() if NATIVE_SOFTMAX_ENABLED else None
    if native is None:
        return None
    y = np.empty(x.shape, _F32)
    return y if native.softmax_rows(x, y, x.shape[-1]) else None


@fast_path("softmax_max_free", canonical="softmax", declines=True,
           condition="float32, C-contiguous, the last axis of at least 8 elements (Softmax opset 13 on the last "
                     "axis, attention probabilities, ML rows of more than 8 classes); declines (None) when an "
                     "input is >= 60 or NaN, or more than half the rows sum below e^-60 (or to NaN)",
           applies=lambda x: _rows_of_floats(x, 8))
def softmax_max_free(x: np.ndarray) -> np.ndarray | None:
    """Softmax over the last axis without subtracting row maxima, as a new array, or None when
    an input is >= 60 (or NaN), or most rows would need a redo, and the canonical form must run.

    The row maxima only guard exp against overflow; with every input below 60 no exp or row sum
    can overflow, and softmax does not change when every row is shifted. Skipping them saves the
    max reduction and the broadcast subtraction, whose numpy loops run once per row, and the row
    sums are one BLAS product (``row_sums``). exp(x) is as exact as exp(x - max) (more so: x - max
    is itself rounded). Rows whose sum is below e^-60 (exp may have flushed their elements to
    zero), or not finite, are redone with their own maxima."""
    n = x.shape[-1]
    rows = x.reshape(-1, n)
    if not np.maximum.reduce(rows, axis=None) < SOFTMAX_MAX_INPUT:  # also a NaN
        return None
    e = np.exp(rows)
    sums = row_sums(e)
    if not np.minimum.reduce(sums) >= SOFTMAX_MIN_SUM:  # also NaN (a NaN row) and -inf rows (sum 0)
        redo = ~(sums >= SOFTMAX_MIN_SUM)
        if 2 * np.count_nonzero(redo) > redo.size:  # mostly such rows (a QDQ model's -inf mask): the
            return None  # canonical form's four passes cost less than picking them out and back
        bad = rows[redo]
        shifted = np.exp(bad - bad.max(axis=1, keepdims=True))
        e[redo] = shifted
        sums[redo] = shifted.sum(axis=1)
    e /= sums[:, None]
    return e.reshape(x.shape)


@fast_path("softmax_few_classes", canonical="softmax", declines=True,
           condition="2-D float32 C-contiguous rows of at most 8 classes (the ML post transform SOFTMAX); "
                     "declines (None) when an input is >= 60 or NaN or a row's sum is below e^-60",
           applies=lambda x: x.ndim == 2 and _rows_of_floats(x, 1, 8))
def softmax_few_classes(scores: np.ndarray) -> np.ndarray | None:
    """``softmax_max_free`` for rows of a few classes, in fewer calls: no redo of single rows,
    and the sums by ``add.reduce``, which adds up to 8 elements in order, as onnxruntime."""
    if not np.maximum.reduce(scores, axis=None) < SOFTMAX_MAX_INPUT:  # also a NaN
        return None
    e = np.exp(scores)
    sums = np.add.reduce(e, axis=1, keepdims=True)
    if not np.minimum.reduce(sums, axis=None) >= SOFTMAX_MIN_SUM:
        return None
    return np.divide(e, sums, out=e)


_MAX_INPUT = np.array(SOFTMAX_MAX_INPUT, _F32)  # 0-d operands: the ufuncs' cheapest on tiny arrays


def _within(x: np.ndarray, bound: np.ndarray) -> bool:
    # count_nonzero is no ufunc reduction: cheaper than a maximum on tiny arrays (NaN < b is False)
    return np.count_nonzero(np.less(np.abs(x), bound)) == x.size


@fast_path("softmax_rows_by_dot", canonical="softmax", in_place=True, declines=True,
           condition="2-D float32 rows of a few classes, every |input| < 60 (LinearClassifier's small-batch "
                     "SOFTMAX); the row sums are a product with a square of ones; declines (None) otherwise",
           applies=lambda x: x.ndim == 2 and _rows_of_floats(x))
def softmax_rows_by_dot(scores: np.ndarray, ones: np.ndarray | None = None) -> np.ndarray | None:
    """Softmax of the rows of ``scores`` in place, the sums (already broadcast along each row)
    from ``scores @ ones``, ``ones`` the [C, C] matrix of ones; None, and ``scores`` untouched,
    when an |input| is 60 or more, or NaN."""
    if not _within(scores, _MAX_INPUT):
        return None
    if ones is None:
        ones = np.ones((scores.shape[1], scores.shape[1]), scores.dtype)
    np.exp(scores, out=scores)
    return np.divide(scores, np.dot(scores, ones), out=scores)


#: Scores whose |values| stay under this have a softmax without the guards: exp can neither
#: overflow nor leave a row's sum near 0.
SOFTMAX_BOUND = 50.0
_BOUND = np.array(SOFTMAX_BOUND, _F32)


@fast_path("softmax_bounded", canonical="softmax", in_place=True,
           condition="rows whose |values| are known to stay below SOFTMAX_BOUND (tree ensembles' summed "
                     "leaf weights, bounded when the kernel is built): no check at run time",
           applies=lambda x: x.ndim == 2 and x.dtype.kind == "f" and x.size > 0 and _within(x, _BOUND))
def softmax_bounded(scores: np.ndarray) -> np.ndarray:
    """Softmax of the rows in place, without the row maxima, for scores known to be bounded."""
    np.exp(scores, out=scores)
    return np.divide(scores, np.add.reduce(scores, axis=1, keepdims=True), out=scores)


def softmax_last_axis(x: np.ndarray) -> np.ndarray:
    """``softmax(x)`` over the last axis as a new array, by ``softmax_native`` or
    ``softmax_max_free`` where they apply."""
    if x.dtype == _F32 and x.ndim and x.size and x.flags.c_contiguous:
        y = softmax_native(x)
        if y is None and x.shape[-1] >= 8:
            y = softmax_max_free(x)
        if y is not None:
            return y
    return softmax(x)


def softmax_rows_into(scores: np.ndarray) -> np.ndarray:
    """``softmax(scores, axis=1)`` for 2-D rows the caller owns and no longer needs: in place, or
    a new array from ``softmax_few_classes``/``softmax_max_free`` where they apply."""
    if scores.size and scores.dtype == _F32 and scores.flags.c_contiguous:
        y = softmax_few_classes(scores) if scores.shape[1] <= 8 else softmax_max_free(scores)
        if y is not None:
            return y
    return softmax(scores, axis=1, out=scores)


_LANES, _LANE_BLOCK = 8, 16


def mlas_lane_sums(t: np.ndarray) -> np.ndarray:
    """[rows] float32 sums of [rows, D] float32 values in the order of MLAS's AVX2 softmax
    kernel (``qsoftmax_kernel_avx2.cpp``): 8 lanes over the first multiple of 16 elements, each
    lane in order, the remaining elements in order from the first, then the lanes added to that
    one by one."""
    rows, d = t.shape
    vector = d // _LANE_BLOCK * _LANE_BLOCK
    total = np.zeros(rows, _F32)
    if vector < d:  # the tail, in order from 0
        total = np.add.accumulate(t[:, vector:], axis=1)[:, -1]
    if vector:
        lanes = np.add.accumulate(t[:, :vector].reshape(rows, -1, _LANES), axis=1)[:, -1]
        for j in range(_LANES):
            total = total + lanes[:, j]
    return total


# -- erf and GELU --------------------------------------------------------------------------------

_math_erf = np.frompyfunc(math.erf, 1, 1)
# Abramowitz & Stegun 7.1.26 (absolute error < 1.5e-7) for |x| >= 1; below it the Taylor series to
# x**27 (truncation < 1e-12), which keeps the relative error small near zero. Evaluated in
# float32 the result is within 2e-7 (about 3 float32 ULPs) of erf everywhere.
_AS_P = 0.3275911
_AS_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
_TAYLOR = tuple(2.0 / math.sqrt(math.pi) * (-1) ** n / (math.factorial(n) * (2 * n + 1)) for n in range(14))


def erf(x: np.ndarray) -> np.ndarray:
    """Vectorized erf: exact (math.erf) for float64, float32-accurate approximation otherwise."""
    if x.dtype == np.float64:
        return np.asarray(_math_erf(x), dtype=np.float64)  # frompyfunc gives a bare float for a 0-d x
    dt = x.dtype
    xf = x.astype(np.float32, copy=False)
    a = np.abs(xf)
    t = 1.0 / (1.0 + np.float32(_AS_P) * a)
    poly = t * (_AS_A[0] + t * (_AS_A[1] + t * (_AS_A[2] + t * (_AS_A[3] + t * _AS_A[4]))))
    big = np.copysign(1.0 - poly * np.exp(-a * a), xf)
    z = xf * xf
    small = _TAYLOR[-1]
    for c in _TAYLOR[-2::-1]:
        small = small * z + c
    small = small * xf
    return np.where(a < 1.0, small, big).astype(dt, copy=False)


#: erf on [0, _ERF_END] at steps of 1 / _ERF_STEPS: at the grid point nearest |x|, erf's cubic
#: Taylor polynomial (coefficients erf and its first three derivatives over k!, from math.erf and
#: erf' = 2 / sqrt(pi) exp(-x^2)). Truncation is at most (h / 2)^4 / 24 max|erf''''| = 4e-15; float32
#: evaluation keeps the result within about 2 float32 ULPs of erf (the canonical form: 3). Past 4,
#: erf is 1 in float32. Built at first use.
_ERF_STEPS = 1024
_ERF_END = 4.0
_ERF_TABLE: tuple[np.ndarray, ...] | None = None


def _erf_table() -> tuple[np.ndarray, ...]:
    global _ERF_TABLE
    x = np.arange(int(_ERF_END * _ERF_STEPS) + 1, dtype=np.float64) / _ERF_STEPS
    d1 = 2.0 / math.sqrt(math.pi) * np.exp(-x * x)
    f = np.array([math.erf(v) for v in x])
    _ERF_TABLE = tuple(np.ascontiguousarray(c, dtype=np.float32) for c in (f, d1, -x * d1, (4 * x * x - 2) * d1 / 6))
    return _ERF_TABLE


@fast_path("erf_table", canonical="erf", atol=3e-7,
           condition="float32 arrays: the Erf kernel (12 numpy calls against the canonical form's 40)",
           applies=lambda x: x.dtype == np.float32)
def erf_table(x: np.ndarray) -> np.ndarray:
    """erf of a float32 array by the cubic table (see ``_ERF_STEPS``)."""
    if x.ndim == 0:  # ufuncs give 0-d inputs numpy scalars, which take no out=
        return erf_table(x.reshape(1)).reshape(())
    f, d1, d2, d3 = _ERF_TABLE or _erf_table()
    a = np.abs(x)
    k = np.fmin(a, np.float32(_ERF_END))  # fmin: a NaN becomes the end, and stays NaN through a - x_i
    k *= np.float32(_ERF_STEPS)
    np.rint(k, out=k)
    i = k.astype(np.intp)
    k *= np.float32(1.0 / _ERF_STEPS)
    d = np.subtract(a, k, out=k)
    np.minimum(d, np.float32(0.5 / _ERF_STEPS), out=d)  # past the end (infinity too): erf = 1
    r = d3.take(i)
    r *= d
    r += d2.take(i)
    r *= d
    r += d1.take(i)
    r *= d
    r += f.take(i)
    return np.copysign(r, x, out=r)


def erf_inv_ort(x: np.ndarray) -> np.ndarray:
    """onnxruntime's approximation of the inverse of erf (``ErfInv`` in ``ml_common.h``), not the
    exact inverse: the ML post transform PROBIT matches onnxruntime with it."""
    sgn = np.where(x < 0, np.float32(-1), np.float32(1))
    x = (1 - x) * (1 + x)
    log = np.log(x)
    v = np.float32(2 / (np.pi * 0.147)) + np.float32(0.5) * log
    v2 = np.float32(1 / 0.147) * log
    return sgn * np.sqrt(-v + np.sqrt(v * v - v2))


def gelu(x: np.ndarray) -> np.ndarray:
    """0.5 x (1 + erf(x / sqrt 2)) (ONNX Gelu), in x's float type."""
    return np.asarray((0.5 * x * (1.0 + erf(x * (1.0 / math.sqrt(2.0))))).astype(x.dtype, copy=False))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) (ONNX Gelu, approximate="tanh")."""
    inner = np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x))
    return np.asarray((0.5 * x * (1.0 + inner)).astype(x.dtype, copy=False))


# gelu(x) = relu(x) - c(|x|) with c(a) = a/2 erfc(a / sqrt 2) for both signs, and c(a) = a / q(a)^16:
# q is a degree-7 polynomial fitted to (2 / erfc(a / sqrt 2))^(1/16) on [0, 10] (weighted least
# squares iterated towards the minimax error of c: benchmarks/fit_gelu.py refits it). In exact
# arithmetic |c - a / q^16| < 4e-8; in float32 the four squarings amplify rounding to 3.6e-7 at
# most (A&S 7.1.26 with exp: 3.3e-7). No exp: numpy's float32 exp has no SIMD loop on AVX2 and
# costs about 14 multiplies an element, more than this form's extra passes.
GELU_Q = (1.0442735324878507, 0.05207936647734886, 0.022055102299206215, 0.0034721028666757922,
          -1.5265737558401923e-05, 8.244375360123499e-05, -3.132870595234233e-06, 9.38215053439273e-07)
#: |x| is clamped here: c(15) = 8e-50 is 0 in float32, q (increasing on [0, 15]) stays below
#: 205 so q^16 does not overflow (it would from 15.5 on), and |x| = inf gives relu(x) instead of
#: inf / inf = NaN.
_GELU_FLAT = 15.0


@fast_path("gelu_polynomial", canonical="gelu", in_place=True, atol=4e-7,
           condition="float arrays, except float32 ones of at most GELU_TABLE_MAX values: the Gelu of the "
                     "fused ops (com.onnxhal Gelu, com.microsoft Gelu and BiasGelu, fused activations); "
                     "float16 the same way in its own precision",
           applies=lambda x: x.dtype in (np.float32, np.float64))
def gelu_polynomial_inplace(y: np.ndarray) -> None:
    """gelu(x) = relu(x) - |x| / q(|x|)^16 in place, absolute error below 4e-7 (float32)."""
    a = np.abs(y)
    clamp_(a, None, _GELU_FLAT)
    q = a * GELU_Q[7]
    for c in GELU_Q[6:0:-1]:
        q += c
        q *= a
    q += GELU_Q[0]
    for _ in range(4):  # q^16
        np.multiply(q, q, out=q)
    np.divide(a, q, out=q)
    clamp_(y, 0)
    y -= q


#: The switch of ``FAST_PATHS["gelu_native"]``: False keeps the numpy forms.
NATIVE_GELU_ENABLED = True
_GELU_Q32 = np.array(GELU_Q, np.float32)


@fast_path("gelu_native", canonical="gelu", in_place=True, atol=4e-7, declines=True,
           condition="C- or Fortran-contiguous (a transposed view), writable float32 arrays (the same callers), "
                     "the C extension _native built, ONNXHAL_NATIVE_KERNELS not 0 and NATIVE_GELU_ENABLED (read "
                     "at each call); declines (None, y untouched) otherwise",
           applies=lambda x: x.dtype == np.float32 and (x.flags.c_contiguous or x.flags.f_contiguous)
           and x.flags.writeable)
def gelu_native(y: np.ndarray) -> np.ndarray | None:
    """``gelu_polynomial_inplace`` in one C pass (``_native.gelu``: its float32 operations in its
    order, so its bits); y when done, None (y untouched) where the C extension is off."""
    native = native_module() if NATIVE_GELU_ENABLED else None
    if native is None:
        return None
    native.gelu(y if y.flags.c_contiguous else y.T, _GELU_Q32)  # (element by element: any dense order)
    return y


#: Small float32 arrays take c(|x|) from a table of c at steps of 1/1024 on [0, 6], linearly
#: interpolated (c(6) = 6e-9: 0 past it): 11 numpy calls instead of 23; from about 3000 values
#: the table's gathers cost more than the polynomial (benchmarks measure it). The
#: interpolation error is at most h^2/8 max|c''| = 0.1 h^2 = 1e-7, 2.4e-7 in all on a dense scan
#: of [-8, 8] (the polynomial: 3.6e-7). ``_GELU_TABLE``: (values, slopes), built at first use.
GELU_TABLE_MAX = 2048
_GELU_STEPS = 1024
_GELU_TABLE: tuple[np.ndarray, np.ndarray] | None = None


@fast_path("gelu_table", canonical="gelu", in_place=True, atol=3e-7,
           condition="float32 arrays of at most GELU_TABLE_MAX values (the same callers, small tensors)",
           applies=lambda x: x.dtype == np.float32 and x.size <= GELU_TABLE_MAX)
def gelu_table_inplace(y: np.ndarray) -> None:
    """``gelu_polynomial_inplace`` for small float32 arrays, by the interpolated table."""
    global _GELU_TABLE
    table = _GELU_TABLE
    if table is None:
        grid = [i / _GELU_STEPS for i in range(6 * _GELU_STEPS + 1)]
        values = np.array([a * 0.5 * math.erfc(a / math.sqrt(2.0)) for a in grid])
        values[-1] = 0.0
        slopes = np.zeros_like(values)
        slopes[:-1] = np.diff(values)
        slopes[-1] = 0.0  # past the table (and for inf and NaN, sent to its end): c = 0
        table = _GELU_TABLE = (values, slopes)
    t = np.multiply(np.abs(y), float(_GELU_STEPS), dtype=np.float64)
    np.fmin(t, float(6 * _GELU_STEPS), out=t)  # fmin: a NaN becomes the end, relu keeps the NaN
    i = t.astype(np.intp)
    t -= i
    c = table[0].take(i)
    t *= table[1].take(i)
    c += t
    np.maximum(y, 0, out=y)
    y -= c


# -- quantization --------------------------------------------------------------------------------

_CODES = (np.uint8, np.int8, np.uint16, np.int16)
_BOUNDS = {np.dtype(t).char: (np.array(np.iinfo(t).min, _F32), np.array(np.iinfo(t).max, _F32)) for t in _CODES}


def saturate_codes(y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Rounded float32 codes (in place) clamped to dtype's range, as dtype. A NaN becomes the
    type's minimum and an infinity its bound, as MLAS's quantize kernels, whose lower clamp
    (SSE ``maxps``) returns the bound for a NaN (onnxruntime's
    ``core/mlas/lib/quantize.cpp``); a plain clip would leave the NaN to the cast."""
    low, high = _BOUNDS[np.dtype(dtype).char]
    np.fmax(y, low, out=y)
    np.minimum(y, high, out=y)
    return y.astype(dtype)


def round_to_codes(y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """saturate(round_half_to_even(y)) as dtype, for float32 values the caller owns (rounded in
    place): the rounding of QuantizeLinear and of every quantized op's requantization."""
    np.rint(y, out=y)
    return saturate_codes(y, dtype)
