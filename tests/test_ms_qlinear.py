"""The com.microsoft QOperator ops of onnxruntime's static quantizer that the corpus's ResNet does
not use, on the CPU EP against onnxruntime: QLinearConcat (inputs on other scales, and on the
output's), QLinearWhere, QLinearAveragePool (NCHW and channels_last), QGemm (float and quantized
outputs, transposes, alpha, int32 bias, per-column weight scales), QLinearSoftmax, and the
default domain's ConvInteger that quantize_dynamic writes for convolutions."""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_ms_attention import check


def _q(rng: np.random.Generator, shape, dtype=np.uint8) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(info.min, int(info.max) + 1, shape).astype(dtype)


def _s(v: float) -> np.ndarray:
    return np.array(v, np.float32)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qlinear_concat_and_where(seed, dtype):
    rng = np.random.default_rng(seed)
    zp = lambda: np.array(rng.integers(-10, 10) + (128 if dtype == np.uint8 else 0), dtype)  # noqa: E731
    y_s, y_zp = _s(rng.uniform(0.01, 0.1)), zp()
    feeds = {"ys": y_s, "yz": y_zp}
    for i in range(3):
        same = i == 1  # one input already on the output's scale
        feeds[f"x{i}"] = _q(rng, (2, int(rng.integers(1, 4)), 3), dtype)
        feeds[f"s{i}"] = y_s if same else _s(rng.uniform(0.01, 0.1))
        feeds[f"z{i}"] = y_zp if same else zp()
    check("QLinearConcat", feeds, 1, f"QLinearConcat {dtype.__name__} seed {seed}", axis=1)
    shape = (3, 4)
    feeds = {"c": rng.random(shape) > 0.5, "x": _q(rng, shape, dtype), "xs": _s(0.05), "xz": zp(),
             "y": _q(rng, shape, dtype), "ys": _s(0.02), "yz": zp(), "zs": _s(0.03), "zz": zp()}
    check("QLinearWhere", feeds, 1, f"QLinearWhere {dtype.__name__} seed {seed}")


@pytest.mark.parametrize("seed", range(4))
def test_qlinear_average_pool(seed):
    rng = np.random.default_rng(seed)
    for channels_last in (0, 1):
        shape = (2, 5, 6, 3) if channels_last else (2, 3, 5, 6)
        feeds = {"x": _q(rng, shape), "xs": _s(0.05), "xz": np.array(120, np.uint8), "ys": _s(0.04),
                 "yz": np.array(130, np.uint8)}
        check("QLinearAveragePool", feeds, 1, f"QLinearAveragePool channels_last={channels_last} seed {seed}",
              kernel_shape=[2, 3], strides=[1, 2], pads=[0, 1, 1, 0], count_include_pad=int(seed % 2),
              channels_last=channels_last)


@pytest.mark.parametrize("seed", range(4))
def test_qgemm(seed):
    rng = np.random.default_rng(seed)
    m, k, n = 3, 7, 5
    for trans_a, trans_b in ((0, 0), (1, 1)):
        a = _q(rng, (k, m) if trans_a else (m, k))
        b = _q(rng, (n, k) if trans_b else (k, n), np.int8)
        per_column = seed % 2
        feeds = {"a": a, "as": _s(0.02), "az": np.array(128, np.uint8), "b": b,
                 "bs": rng.uniform(0.01, 0.03, n).astype(np.float32) if per_column else _s(0.02),
                 "bz": np.zeros(n, np.int8) if per_column else np.array(0, np.int8),
                 "c": rng.integers(-500, 500, n).astype(np.int32)}
        check("QGemm", feeds, 1, f"QGemm float out trans={trans_a}{trans_b} seed {seed}", transA=trans_a,
              transB=trans_b, alpha=0.5 if seed >= 2 else 1.0)
        feeds.update(ys=_s(0.3), yz=np.array(128, np.uint8))
        check("QGemm", feeds, 1, f"QGemm quantized out trans={trans_a}{trans_b} seed {seed}", transA=trans_a,
              transB=trans_b)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qlinear_softmax(seed, dtype):
    rng = np.random.default_rng(seed)
    zero = 0 if dtype == np.int8 else 128
    for opset, axis in ((13, -1), (13, 1), (12, 1)):
        feeds = {"x": _q(rng, (2, 3, 4), dtype), "xs": _s(rng.uniform(0.02, 0.2)), "xz": np.array(zero, dtype),
                 "ys": _s(1 / 256), "yz": np.array(-128 if dtype == np.int8 else 0, dtype)}
        check("QLinearSoftmax", feeds, 1, f"QLinearSoftmax opset={opset} axis={axis} {dtype.__name__} seed {seed}",
              axis=axis, opset=opset)


@pytest.mark.parametrize("seed", range(4))
def test_conv_integer(seed):
    """ConvInteger (default domain; quantize_dynamic writes it for Conv): 8-bit codes less their
    zero points, int32 out, padded with the zero point."""
    from tests.test_ms_transformer import run_both_default

    rng = np.random.default_rng(seed)
    for w_dtype in (np.uint8, np.int8):
        feeds = {"x": _q(rng, (2, 3, 7, 6)), "w": _q(rng, (4, 3, 3, 3), w_dtype),
                 "xz": np.array(rng.integers(100, 150), np.uint8),
                 "wz": np.array(rng.integers(0, 20), w_dtype)}  # onnxruntime: per-tensor only
        run_both_default("ConvInteger", feeds, pads=[1, 0, 1, 2], strides=[1, 2])
