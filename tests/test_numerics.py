"""Every fast path registered in the CPU EP's numerics module (``numerics.FAST_PATHS``) against
its canonical form, on random and edge inputs: a fast path that diverges fails here."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from onnxhal.runtime.providers.cpu.kernels import numerics
from onnxhal.runtime.providers.cpu.kernels.numerics import FAST_PATHS, FastPath

# NaN and inf inputs are part of the edge cases: numpy warns, the kernels run with warnings off
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

#: float32's relative rounding: the canonical form is rounded to the output type before comparing
_HALF_ULP = 2.0 ** -23


def _softmax_inputs() -> list[np.ndarray]:
    rng = np.random.default_rng(43)
    out = []
    for shape in [(1, 2), (3, 5), (4, 8), (6, 3), (2, 3, 16), (7, 130), (5, 1), (32, 12)]:
        for scale in (0.1, 1.0, 10.0, 40.0):
            out.append((rng.standard_normal(shape) * scale).astype(np.float32))
    rows = rng.standard_normal((6, 9)).astype(np.float32)
    edge = [
        np.full((3, 9), 59.9, np.float32),  # just under the max-free bound
        np.full((3, 9), 60.0, np.float32),  # at it: declined
        np.array([[1000.0] + [0.0] * 8, [0.0] * 9], np.float32),
        np.full((2, 9), -1000.0, np.float32),  # exp flushes every element: the row is redone
        np.concatenate([rows[:3], rows[3:] - 200.0]),  # some rows' sums under e^-60, some not
        np.array([[-np.inf] + [1.0] * 8, [-np.inf] * 9], np.float32),
        np.array([[np.nan] + [1.0] * 8, [2.0] * 9], np.float32),
        np.array([[np.inf] + [1.0] * 8, [2.0] * 9], np.float32),
        np.zeros((4, 4), np.float32),
        np.array([[49.9, -49.9, 0.0], [-49.9, -49.9, -49.9]], np.float32),
        np.array([[-90.0, -91.0, -92.0]], np.float32),  # a few classes whose sum is under e^-60
        np.full((1, 8), 3.0e-45, np.float32),  # subnormals
    ]
    # rows of 64 and more: softmax_native's vectorized row helpers (its 8-lane sums, their tails)
    wide = [(rng.standard_normal(shape) * scale).astype(np.float32)
            for shape in [(3, 64), (2, 71), (4, 256), (2, 1000)] for scale in (1.0, 10.0)]
    masked = (rng.standard_normal((4, 256)) * 3).astype(np.float32)
    masked[::2, 100:] = -np.inf  # attention's masked keys
    bad = rng.standard_normal((3, 200)).astype(np.float32)
    bad[1, 150], bad[2, 7] = np.nan, np.inf
    dead = rng.standard_normal((2, 96)).astype(np.float32)
    dead[1] = -np.inf  # a row of -inf alone: declined
    return out + edge + wide + [masked, bad, bad[:1].copy(), dead]


def _gelu_inputs() -> list[np.ndarray]:
    rng = np.random.default_rng(20)
    out = [(rng.standard_normal(n) * s).astype(np.float32) for n in (7, 768, 2048, 2049, 70000) for s in (1.0, 5.0)]
    out.append(np.linspace(-20, 20, 40001, dtype=np.float32))
    out.append(np.linspace(-8, 8, 2048, dtype=np.float32))  # the table's range, densely
    out.append(np.array([0.0, -0.0, 6.0, -6.0, 6.0009766, 15.0, -15.0, 15.5, -15.5, 3e38, -3e38, 1e-45, -1e-45,
                         np.inf, np.nan], np.float32))
    out.append(rng.standard_normal((16, 48)).astype(np.float64) * 3)
    return out


def _inputs(fp: FastPath) -> list[np.ndarray]:
    pool = _softmax_inputs() if fp.canonical == "softmax" else _gelu_inputs()
    return [x for x in pool if fp.applies(x)]


def _canonical(fp: FastPath, x: np.ndarray) -> np.ndarray:
    if fp.canonical == "gelu":  # in float64, where the canonical gelu is exact (math.erf)
        return numerics.gelu(x.astype(np.float64))
    return getattr(numerics, fp.canonical)(x)


def _run(fn: Callable, fp: FastPath, x: np.ndarray) -> np.ndarray | None:
    arg = x.copy()
    y = fn(arg)
    if y is None and fp.declines:
        return None
    return arg if fp.in_place and y is None else y


def _compare(fn: Callable, fp: FastPath) -> tuple[int, int]:
    """(inputs taken, inputs declined); raises AssertionError on a divergence."""
    taken = declined = 0
    for x in _inputs(fp):
        y = _run(fn, fp, x)
        if y is None:
            declined += 1
            continue
        taken += 1
        want = _canonical(fp, x)
        assert y.shape == x.shape and y.dtype == x.dtype, (fp.name, y.shape, y.dtype)
        np.testing.assert_allclose(y.astype(np.float64), want, rtol=_HALF_ULP, atol=fp.atol, equal_nan=True,
                                   err_msg=f"{fp.name} diverges from {fp.canonical} on {x.shape} {x.dtype}")
    return taken, declined


@pytest.mark.parametrize("name", sorted(FAST_PATHS))
def test_fast_path_matches_its_canonical_form(name: str) -> None:
    fp = FAST_PATHS[name]
    assert fp.condition and callable(getattr(numerics, fp.canonical))
    taken, _ = _compare(fp.fn, fp)
    assert taken >= 5, f"{name}: only {taken} inputs meet its condition; the test would prove little"


@pytest.mark.parametrize("name", sorted(FAST_PATHS))
def test_a_diverging_fast_path_is_caught(name: str) -> None:
    """The comparison itself: the fast path made slightly wrong (one element of each result off
    by 1e-5) fails it."""
    fp = FAST_PATHS[name]

    def wrong(arg: np.ndarray) -> np.ndarray | None:
        y = _run(fp.fn, fp, arg)
        if y is None:
            return None if fp.declines else y
        flat = y.reshape(-1)
        finite = np.flatnonzero(np.isfinite(flat))
        if finite.size:
            flat[finite[0]] += 1e-5
        if fp.in_place and y is not arg:
            np.copyto(arg, y)
        return y

    with pytest.raises(AssertionError, match="diverges"):
        _compare(wrong, fp)


def test_max_free_softmax_declines_what_it_cannot_take() -> None:
    assert numerics.softmax_max_free(np.full((2, 9), 60.0, np.float32)) is None
    assert numerics.softmax_max_free(np.array([[np.nan] * 9], np.float32)) is None
    # most rows -inf (a QDQ model's mask): the canonical form; one such row of three: redone in place
    masked = np.full((3, 9), -np.inf, np.float32)
    masked[0] = np.arange(9)
    assert numerics.softmax_max_free(masked) is None
    few = np.tile(np.arange(9, dtype=np.float32), (3, 1))
    few[1] = -100.0  # sum below e^-60: redone with its maximum
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(numerics.softmax_max_free(few), numerics.softmax(few), rtol=1e-6)
    assert numerics.softmax_few_classes(np.array([[-90.0, -91.0]], np.float32)) is None
    scores = np.array([[61.0, 0.0]], np.float32)
    assert numerics.softmax_rows_by_dot(scores) is None and scores[0, 0] == 61.0  # untouched


def test_gelu_native_gives_the_polynomial_bits() -> None:
    """gelu_native makes gelu_polynomial_inplace's float32 operations in its order: the same bits,
    NaN, infinities and signed zeros included (where the C extension is built)."""
    x = np.concatenate([np.random.default_rng(9).standard_normal(3001).astype(np.float32) * 6,
                        np.array([0.0, -0.0, 15.0, -15.0, 16.0, 3e38, -3e38, np.inf, -np.inf, np.nan], np.float32)])
    want = x.copy()
    numerics.gelu_polynomial_inplace(want)
    got = x.copy()
    if numerics.gelu_native(got) is None:
        pytest.skip("the C extension _native is not built (test_tree_native.py fails where a compiler exists)")
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))


def test_gelu_fast_paths_at_minus_infinity() -> None:
    """The one input where the fast paths and the canonical formula differ on purpose: at -inf,
    0.5 x (1 + erf(x / sqrt 2)) is -inf * 0 = NaN; the fast paths give the limit, 0."""
    for name in ("gelu_polynomial", "gelu_table"):
        y = np.array([-np.inf, -1.0], np.float32)
        FAST_PATHS[name].fn(y)
        assert abs(y[0]) < 1e-30 and abs(y[1] - (-0.5 * math.erfc(1 / math.sqrt(2)))) < 4e-7
    assert np.isnan(numerics.gelu(np.array([-np.inf]))[0])


def test_rounding_to_codes_is_half_to_even_and_saturates() -> None:
    y = np.array([0.5, 1.5, 2.5, -0.5, 254.5, 255.5, 300.0, -3.0, np.nan, np.inf, -np.inf], np.float32)
    np.testing.assert_array_equal(numerics.round_to_codes(y.copy(), np.uint8),
                                  [0, 2, 2, 0, 254, 255, 255, 0, 0, 255, 0])
    np.testing.assert_array_equal(numerics.round_to_codes(np.array([-128.5, 127.5, -129.0, np.nan], np.float32),
                                                          np.int8), [-128, 127, -128, -128])


def test_mlas_lane_sums_add_in_mlas_order() -> None:
    """The order matters: for 1e8, 1, 1, ... the lanes and the tail give other float32 sums than
    a left-to-right sum, and exactly those of MLAS's kernel, written out here."""
    rng = np.random.default_rng(3)
    for d in (5, 16, 37, 64):
        t = (rng.random((4, d)) * 10.0 ** rng.integers(-3, 8, (4, d))).astype(np.float32)
        want = np.empty(4, np.float32)
        for r in range(4):
            vector = d // 16 * 16
            total = np.float32(0)
            for v in t[r, vector:]:
                total = np.float32(total + v)
            lanes = np.zeros(8, np.float32)
            for i in range(0, vector, 8):
                lanes = (lanes + t[r, i:i + 8]).astype(np.float32)
            for lane in lanes:
                total = np.float32(total + lane)
            want[r] = total
        np.testing.assert_array_equal(numerics.mlas_lane_sums(t), want)
