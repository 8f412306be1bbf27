"""CPU EP elementwise, activation and Cast kernels: the semantics that bite (integer division,
Mod, Pow types, Clip by opset, Erf accuracy, string/bfloat16/float8 casts), ndarray results for
0-d inputs and no float32 -> float64 upcasts."""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import TensorProto

from tests.test_cpu_kernels_nn import RNG, check, randn, run_native, run_reference, single_node_model

UNARY_FLOAT_OPS = ["Abs", "Neg", "Exp", "Log", "Sqrt", "Floor", "Ceil", "Reciprocal", "Sin", "Cos", "Tan",
                   "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Atanh", "Sign", "Round", "Tanh", "Relu",
                   "Sigmoid", "Erf", "LeakyRelu", "Elu", "Selu", "HardSigmoid", "HardSwish", "Softplus",
                   "Softsign"]
BINARY_OPS = ["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum"]


@pytest.mark.parametrize("op", UNARY_FLOAT_OPS)
def test_unary_float32_matches_reference_and_stays_float32(op):
    x = (RNG.uniform(-0.9, 0.9, (3, 4))).astype(np.float32)
    if op in ("Log", "Sqrt"):
        x = np.abs(x) + 0.1
    (y,) = check(op, [x], 20, rtol=1e-5, atol=1e-6)
    assert y.dtype == np.float32


@pytest.mark.parametrize("op", UNARY_FLOAT_OPS + ["Not", "IsNaN"])
def test_unary_zero_d_input_gives_ndarray(op):
    x = np.array(True) if op == "Not" else np.array(0.25, dtype=np.float32)
    (y,) = run_native(op, [x], 20)
    assert type(y) is np.ndarray and y.shape == ()


@pytest.mark.parametrize("op", BINARY_OPS + ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
def test_binary_broadcasting_and_zero_d(op):
    a, b = np.abs(randn(2, 1, 4)) + 0.5, np.abs(randn(3, 1)) + 0.5
    (y,) = check(op, [a, b], 14, rtol=1e-5, atol=1e-6)
    assert y.shape == (2, 3, 4)
    (z,) = run_native(op, [np.array(2.0, np.float32), np.array(3.0, np.float32)], 14)
    assert type(z) is np.ndarray and z.shape == ()
    if z.dtype != np.bool_:
        assert z.dtype == np.float32


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int8])
def test_integer_div_truncates_toward_zero(dtype):
    a = np.array([7, -7, 7, -7, 6, 0], dtype=dtype)
    b = np.array([2, 2, -2, -2, 3, 5], dtype=dtype)
    (y,) = run_native("Div", [a, b], 14)
    np.testing.assert_array_equal(y, np.array([3, -3, -3, 3, 2, 0], dtype=dtype))
    assert y.dtype == dtype


def test_mod_fmod_attribute():
    a = np.array([-4, 7, 5, 4, -7, 8], dtype=np.int64)
    b = np.array([2, -3, 8, -2, 3, 5], dtype=np.int64)
    (python_mod,) = run_native("Mod", [a, b], 13)
    np.testing.assert_array_equal(python_mod, [0, -2, 5, 0, 2, 3])
    (c_mod,) = run_native("Mod", [a, b], 13, fmod=1)
    np.testing.assert_array_equal(c_mod, [0, 1, 5, 0, -1, 3])
    check("Mod", [randn(5), randn(5)], 13, fmod=1)


def test_pow_result_has_base_type():
    (y,) = check("Pow", [randn(4), np.array([2, 3, 1, 0], dtype=np.int64)], 15)
    assert y.dtype == np.float32
    (z,) = run_native("Pow", [np.array([2, 3], dtype=np.int64), np.array([2.0, 0.5], dtype=np.float32)], 15)
    assert z.dtype == np.int64
    np.testing.assert_array_equal(z, [4, 1])


def test_clip_attribute_and_input_forms():
    x = np.array([-3.0, -1.0, 0.5, 2.0, 9.0], dtype=np.float32)
    (y6,) = run_native("Clip", [x], 6, min=-1.5, max=2.5)
    np.testing.assert_array_equal(y6, [-1.5, -1.0, 0.5, 2.0, 2.5])
    lo, hi = np.array(-1.5, np.float32), np.array(2.5, np.float32)
    (y11,) = run_native("Clip", [x, lo, hi], 13)
    np.testing.assert_array_equal(y11, y6)
    (only_max,) = run_native("Clip", [x, None, hi], 13)
    np.testing.assert_array_equal(only_max, [-3.0, -1.0, 0.5, 2.0, 2.5])
    (none,) = run_native("Clip", [x], 13)
    np.testing.assert_array_equal(none, x)
    (i8,) = run_native("Clip", [np.array([-100, 5, 100], np.int8), np.array(-10, np.int8), None], 13)
    np.testing.assert_array_equal(i8, [-10, 5, 100])
    assert i8.dtype == np.int8


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int32, np.int8])
def test_relu_and_clip_on_large_arrays_match_numpy_clip(dtype):
    # Large inputs clamp against a cached constant array (numpy's scalar form has no SIMD loop):
    # the results, NaN included, must be those of the scalar form.
    x = (RNG.standard_normal((3, 70, 50)) * 50).astype(dtype)
    if x.dtype.kind == "f":
        x.reshape(-1)[::97] = np.nan
    (r,) = run_native("Relu", [x], 14)
    np.testing.assert_array_equal(r, np.maximum(x, dtype(0)))
    assert r.dtype == x.dtype
    lo, hi = np.array(-7, dtype), np.array(9, dtype)
    (c,) = run_native("Clip", [x, lo, hi], 13)
    np.testing.assert_array_equal(c, np.minimum(np.maximum(x, lo), hi))
    (c_max,) = run_native("Clip", [x, None, hi], 13)
    np.testing.assert_array_equal(c_max, np.minimum(x, hi))
    assert not np.shares_memory(c_max, x)


def test_clamp_in_place_chunks_and_keeps_signed_zero(monkeypatch):
    from onnxhal.runtime.providers.cpu.kernels import clamp

    monkeypatch.setattr(clamp, "CONSTANT_MAX", 5000)  # force the chunked path on a test-sized array
    x = RNG.standard_normal(12_345).astype(np.float32)
    y = x.copy()
    clamp.clamp_(y, -0.5, 0.25)
    np.testing.assert_array_equal(y, np.clip(x, -0.5, 0.25))
    neg = np.full(8192, -1.0, np.float32)
    clamp.clamp_(neg, -0.0)
    assert np.signbit(neg).all()  # -0.0 is its own constant, not the cached +0.0 one
    assert not clamp.constant(0, np.float32, 10).flags.writeable



    x = np.linspace(-6, 6, 20001).astype(np.float32)
    (y,) = run_native("Erf", [x], 13)
    exact = np.array([math.erf(float(v)) for v in x])
    assert y.dtype == np.float32
    assert np.max(np.abs(y - exact)) < 2e-7  # about 3 float32 ULPs
    small = np.abs(x) < 1.0
    nonzero = small & (x != 0)
    assert np.max(np.abs(y[nonzero] - exact[nonzero]) / np.abs(exact[nonzero])) < 1e-6


def test_erf_float64_is_exact():
    x = np.linspace(-3, 3, 101)
    (y,) = run_native("Erf", [x], 13)
    np.testing.assert_array_equal(y, [math.erf(v) for v in x])


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(approximate):
    (y,) = check("Gelu", [randn(3, 7)], 20, approximate=approximate, rtol=1e-5, atol=1e-6)
    assert y.dtype == np.float32


def test_sigmoid_extreme_values_without_overflow():
    x = np.array([-1000.0, -20.0, 0.0, 20.0, 1000.0], dtype=np.float32)
    with np.errstate(all="raise"):
        (y,) = run_native("Sigmoid", [x], 13)
    np.testing.assert_allclose(y, [0.0, 2.0611537e-09, 0.5, 1.0, 1.0], atol=1e-7)


def test_sigmoid_with_a_typed_half_is_the_formula_with_a_scalar_bit_for_bit():
    # The kernel multiplies and adds a 0-d float32 array (no scalar conversion per call); the values
    # must be those of 0.5 * (1 + tanh(x / 2)) written with a numpy scalar, dtype and shape kept.
    half = np.float32(0.5)
    cases = [randn(2, 16) * 10, RNG.standard_normal((3, 5)), np.array(2.5), randn(4, 8)[:, ::2],
             np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-45], np.float32)]
    for x in cases:
        (y,) = run_native("Sigmoid", [x], 13)
        want = (np.tanh(x * half) * half + half).astype(x.dtype)
        assert y.dtype == x.dtype and y.shape == x.shape
        np.testing.assert_array_equal(y, want)
        assert np.array_equal(np.signbit(y), np.signbit(want))

def test_prelu_broadcasts_slope():
    check("PRelu", [randn(2, 3, 4), randn(3, 1)], 16)


def test_equal_on_strings():
    a = np.array(["a", "b", "c"], dtype=object)
    (y,) = run_native("Equal", [a, np.array(["a", "x", "c"], dtype=object)], 19)
    np.testing.assert_array_equal(y, [True, False, True])
    assert y.dtype == np.bool_


def test_bitshift_and_bitwise():
    a = np.array([16, 4, 1], dtype=np.uint32)
    (left,) = run_native("BitShift", [a, np.array([1, 2, 3], np.uint32)], 11, direction="LEFT")
    np.testing.assert_array_equal(left, [32, 16, 8])
    (right,) = run_native("BitShift", [a, np.array([1, 2, 3], np.uint32)], 11, direction="RIGHT")
    np.testing.assert_array_equal(right, [8, 1, 0])
    check("BitwiseXor", [a, np.array([3, 3, 3], np.uint32)], 18)


def test_where_and_variadic_sum():
    c = RNG.random((3, 4)) > 0.5
    check("Where", [c, randn(3, 4), randn(1, 4)], 16)
    check("Sum", [randn(3, 4), randn(4), randn(3, 1)], 13)
    (one,) = run_native("Sum", [randn(3)], 13)
    assert one.shape == (3,)
    # onnx.reference's Mean adds in place and cannot broadcast its first input: compare with numpy.
    a, b, c = randn(3, 1), randn(4), randn(3, 4)
    (mean,) = run_native("Mean", [a, b, c], 13)
    np.testing.assert_allclose(mean, (a + b + c) / 3, rtol=1e-6)
    assert mean.dtype == np.float32


@pytest.mark.parametrize("to,dtype", [(TensorProto.FLOAT16, np.float32), (TensorProto.INT32, np.float32),
                                      (TensorProto.BFLOAT16, np.float32), (TensorProto.FLOAT8E4M3FN, np.float32),
                                      (TensorProto.FLOAT8E5M2, np.float16), (TensorProto.STRING, np.float32),
                                      (TensorProto.INT4, np.float32), (TensorProto.DOUBLE, np.int64)])
def test_cast_matches_reference(to, dtype):
    x = (randn(12) * 3).astype(dtype)
    if to != TensorProto.STRING:
        check("Cast", [x], 21, to=to)
        return
    # String tensors are object arrays of str here (onnx.reference returns numpy '<U' arrays).
    (y,) = run_native("Cast", [x], 21, to=to)
    (want,) = run_reference("Cast", [x], 21, to=to)
    assert y.dtype == object and all(type(v) is str for v in y)
    assert y.tolist() == want.tolist()


def test_cast_from_strings():
    x = np.array(["1.5", "-2", "NaN", "INF", "-inf", "1e3"], dtype=object)
    (y,) = run_native("Cast", [x], 21, to=TensorProto.FLOAT)
    np.testing.assert_array_equal(y, np.array([1.5, -2, np.nan, np.inf, -np.inf, 1000], np.float32))
    assert y.dtype == np.float32


def test_cast_float8_saturation():
    x = np.array([1000.0, -1000.0, 1.0], dtype=np.float32)
    check("Cast", [x], 21, to=TensorProto.FLOAT8E4M3FN, saturate=1)
    check("Cast", [x], 21, to=TensorProto.FLOAT8E4M3FN, saturate=0)


def test_castlike_uses_target_type():
    (y,) = run_native("CastLike", [randn(4), np.zeros(1, np.float16)], 19)
    assert y.dtype == np.float16


@pytest.mark.parametrize("op,fn", [("Add", np.add), ("Sub", np.subtract), ("Mul", np.multiply), ("Div", np.divide),
                                   ("Pow", np.power), ("Greater", np.greater)])
def test_opset6_broadcast_aligns_at_axis(op, fn):
    # Before opset 7, broadcast=1 with axis=1 aligns B's dims with A's dims 1.. (not the trailing ones).
    a = np.abs(randn(2, 3, 4, 5)) + 0.5
    b = np.abs(randn(3, 4)) + 0.5
    (y,) = run_native(op, [a, b], 6, broadcast=1, axis=1)
    np.testing.assert_allclose(y, fn(a, b.reshape(3, 4, 1)), rtol=1e-6)
    (z,) = run_native(op, [a, randn(5)], 6, broadcast=1)  # no axis: trailing alignment
    assert z.shape == (2, 3, 4, 5)


def _bernoulli(p: np.ndarray, **attrs) -> np.ndarray:
    """Bernoulli over ``p`` in an onnxhal session (the op runs through onnx.reference)."""
    import onnxhal

    model, feeds = single_node_model("Bernoulli", [p], 15, 1, ir_version=8, **attrs)
    return onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def test_bernoulli_draws_zeros_and_ones_at_the_given_rates():
    # The backend cases can only be xfailed (their expected draws came from numpy's generator at
    # export time), so the distribution is checked here: 0/1 values of the requested type, p = 0
    # and p = 1 exact, each rate within 5 standard deviations over 20,000 draws.
    rates = np.array([0.0, 0.1, 0.5, 0.9, 1.0], np.float32)
    p = np.repeat(rates, 20_000)
    y = _bernoulli(p, dtype=TensorProto.DOUBLE)
    assert y.dtype == np.float64 and y.shape == p.shape and set(np.unique(y)) <= {0.0, 1.0}
    means = y.reshape(len(rates), -1).mean(axis=1)
    assert means[0] == 0.0 and means[-1] == 1.0
    bound = 5 * np.sqrt(rates * (1 - rates) / 20_000)
    assert np.all(np.abs(means - rates) <= bound + 1e-12), (means, rates)
    assert _bernoulli(p[:10]).dtype == np.float32  # default: the input's type


def test_bernoulli_seed_repeats_its_draws():
    p = np.full(1_000, 0.5, np.float32)
    first = _bernoulli(p, seed=3.0)
    assert np.array_equal(first, _bernoulli(p, seed=3.0))
    assert not np.array_equal(first, _bernoulli(p, seed=4.0))
