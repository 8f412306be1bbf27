"""The com.microsoft QOperator ops of onnxruntime's static quantizer that the corpus's ResNet does
not use, on the CPU EP against onnxruntime: QLinearConcat (inputs on other scales, and on the
output's), QLinearWhere, QLinearAveragePool (NCHW and channels_last), QGemm (float and quantized
outputs, transposes, alpha, int32 bias, per-column weight scales), QLinearSoftmax, and the
default domain's ConvInteger that quantize_dynamic writes for convolutions."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import onnxhal
from tests.test_ms_attention import check
from tests.threads import assert_threads_agree


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


@pytest.mark.parametrize("seed", range(6))
def test_qlinear_softmax_codes_as_onnxruntime_table_kernel(seed):
    """onnxruntime computes QLinearSoftmax from a float32 table of exp over the codes, sums in
    MLAS's lane order and scales by floor(1 / y_scale): with y_scale 1/255 (quantize_static's for a
    uint8 softmax output) or any other, a float softmax of the dequantized values is one code off
    here and there (a QDQ ViT run with onnxruntime's fusions: 13 of 1156 codes). Rows of lengths
    around the 16-element blocks, int8 and uint8, Y zero points at and off the range's end."""
    rng = np.random.default_rng(seed)
    for dtype in (np.int8, np.uint8):
        info = np.iinfo(dtype)
        for d in (1, 7, 16, 17, 33, 50):
            x = _q(rng, (3, d), dtype)
            x[0] = np.clip(x[0], info.max - 12, info.max)  # a row of close codes
            y_zero = int(rng.choice([info.min, 0 if dtype == np.uint8 else 5]))
            for y_scale in (1 / 255, 1 / 256, float(rng.uniform(0.002, 0.05))):
                feeds = {"x": x, "xs": _s(10 ** rng.uniform(-2.5, 0.3)), "xz": np.array(0, dtype), "ys": _s(y_scale),
                         "yz": np.array(y_zero, dtype)}
                check("QLinearSoftmax", feeds, 1, f"QLinearSoftmax {dtype.__name__} D={d} y_scale={y_scale:.5f} "
                      f"y_zp={y_zero} seed {seed}", axis=-1, opset=13)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qlinear_softmax_with_an_infinite_or_non_positive_x_scale_as_onnxruntime(dtype):
    """quantize_static gives the attention scores an infinite scale where a -inf mask was added to
    them (a QOperator GPT-2 was 38% off): onnxruntime writes code 0 everywhere, whatever Y's scale
    and zero point; a scale of 0, below 0 or NaN it refuses at run."""
    rng = np.random.default_rng(0)
    x = _q(rng, (3, 6), dtype)
    x[1] = x[1, 0]  # a row of equal codes
    for y_zero in ((-128, 5) if dtype == np.int8 else (0, 128)):
        for y_scale in (1 / 256, 0.1):
            feeds = {"x": x, "xs": _s(np.inf), "xz": np.array(0, dtype), "ys": _s(y_scale), "yz": np.array(y_zero, dtype)}
            check("QLinearSoftmax", feeds, 1, f"QLinearSoftmax x_scale inf y_zp {y_zero}", axis=-1, opset=13)
    for bad in (0.0, -1.0, np.nan):
        feeds = {"x": x, "xs": _s(bad), "xz": np.array(0, dtype), "ys": _s(1 / 256), "yz": np.array(0, dtype)}
        node = helper.make_node("QLinearSoftmax", list(feeds), ["y"], domain="com.microsoft", axis=-1, opset=13)
        graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype),
                                                                              v.shape) for k, v in feeds.items()],
                                  [onnx.ValueInfoProto(name="y")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                                  ir_version=10).SerializeToString()
        for lib in (ort, onnxhal):
            with pytest.raises(Exception, match="x_scale must be positive"):
                lib.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)


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


def _with_initializers(op: str, feeds: dict, constant: set, n_out: int, **attrs) -> tuple[bytes, dict]:
    """A one-node com.microsoft model whose inputs named in ``constant`` are initializers (as
    onnxruntime requires of some weights), and the feeds of the others."""
    names = [k if v is not None else "" for k, v in feeds.items()]
    node = helper.make_node(op, names, [f"y{i}" for i in range(n_out)], domain="com.microsoft", **attrs)
    inputs = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
              for k, v in feeds.items() if v is not None and k not in constant]
    inits = [numpy_helper.from_array(v, k) for k, v in feeds.items() if v is not None and k in constant]
    graph = helper.make_graph([node], op.lower(), inputs, [onnx.ValueInfoProto(name=f"y{i}") for i in range(n_out)],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return model.SerializeToString(), {k: v for k, v in feeds.items() if v is not None and k not in constant}


@pytest.mark.parametrize("seed", range(6))
def test_dynamic_quantize_lstm(seed):
    """DynamicQuantizeLSTM (quantize_dynamic's LSTM): int8/uint8 W [dirs, input, 4H] and R
    [dirs, H, 4H] with per-direction or per-column scales and zero points, every direction, with
    and without bias and initial states, and sequence_lens (the general loop). Batches of 1 and 2
    with onnxruntime on two threads: it quantizes each thread's block of hidden-state rows on its
    own range, one row each here, as the kernel does for every batch."""
    rng = np.random.default_rng(seed)
    for direction in ("forward", "reverse", "bidirectional"):
        nd = 2 if direction == "bidirectional" else 1
        seq, batch, k, h = int(rng.integers(1, 6)), int(rng.integers(1, 3)), int(rng.integers(2, 9)), 4 * int(
            rng.integers(1, 3))
        w_dtype = np.int8 if seed % 2 else np.uint8
        per_column = seed % 3 == 0
        scale_shape = zp_shape = (nd, 4 * h) if per_column else (nd,)
        zp_lo, zp_hi = (-5, 5) if w_dtype == np.int8 else (120, 136)
        # onnxruntime takes one zero point for every direction and column, 0 for int8 columns
        w_zp, r_zp = (np.full(zp_shape, 0 if per_column and w_dtype == np.int8 else rng.integers(zp_lo, zp_hi), w_dtype)
                      for _ in range(2))
        feeds = {"x": rng.standard_normal((seq, batch, k)).astype(np.float32),
                 "w": _q(rng, (nd, k, 4 * h), w_dtype), "r": _q(rng, (nd, h, 4 * h), w_dtype),
                 "b": (rng.standard_normal((nd, 8 * h)) * 0.5).astype(np.float32) if seed % 2 == 0 else None,
                 "lens": rng.integers(1, seq + 1, batch).astype(np.int32) if seed == 5 else None,
                 "h0": rng.standard_normal((nd, batch, h)).astype(np.float32) if seed >= 2 else None,
                 "c0": rng.standard_normal((nd, batch, h)).astype(np.float32) if seed >= 3 else None,
                 "p": None,
                 "ws": rng.uniform(0.002, 0.01, scale_shape).astype(np.float32),
                 "wz": w_zp, "rs": rng.uniform(0.002, 0.01, scale_shape).astype(np.float32), "rz": r_zp}
        what = f"DynamicQuantizeLSTM {direction} per_column={per_column} {w_dtype.__name__} seed {seed}"
        model, given = _with_initializers("DynamicQuantizeLSTM", feeds, {"w", "r", "b", "ws", "wz", "rs", "rz"}, 3,
                                          hidden_size=h, direction=direction)
        options = ort.SessionOptions()
        options.intra_op_num_threads = 2  # one hidden-state row per thread at batch 2, on any machine
        want = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"]).run(None, given)
        sess = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"])
        for _ in range(2):  # the second run reads the weights the first prepared
            got = sess.run(None, given)
            for i, (w, g) in enumerate(zip(want, got)):
                assert g.shape == w.shape and g.dtype == w.dtype, (what, i, g.shape, w.shape)
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=f"{what} output {i}")


@pytest.mark.parametrize("case", ["clamp", "zero_and_tiny_rows", "wide_hidden"])
def test_dynamic_quantize_lstm_hidden_state_edges(case):
    """The hidden state's row-by-row quantization where it is delicate, against onnxruntime:
    a row whose codes reach 256 (max / scale and -min / scale both 127.5, rounded up: the clamp
    to 255 changes one code); an all-zero row (onnxruntime's scale 1, the kernel's tiny range)
    and a row of ~1e-30 values; and a hidden size of 260, whose products with R are summed in
    float64 (8-bit products over 260 terms pass float32's 2^24)."""
    rng = np.random.default_rng(7)
    h = 260 if case == "wide_hidden" else 8
    seq, batch, k = 3, 1 if case == "wide_hidden" else 2, 5  # (batch 1: one range, however onnxruntime splits)
    h0 = rng.uniform(-0.9, 0.9, (1, batch, h)).astype(np.float32)
    if case == "clamp":
        edge = np.float32(127.5 * 2 ** -7)  # range 255 * 2^-7: scale exactly 2^-7
        h0[0, 0, :2] = edge, -edge
        scale = (edge - -edge) / np.float32(255)
        assert np.rint(edge / scale) - np.rint(-edge / scale) == 256  # the clamp binds
    elif case == "zero_and_tiny_rows":
        h0[0, 0] = 0
        h0[0, 1] = rng.uniform(-1e-30, 1e-30, h).astype(np.float32)
    feeds = {"x": rng.standard_normal((seq, batch, k)).astype(np.float32),
             "w": _q(rng, (1, k, 4 * h), np.int8), "r": _q(rng, (1, h, 4 * h), np.int8),
             "b": (rng.standard_normal((1, 8 * h)) * 0.5).astype(np.float32), "lens": None, "h0": h0,
             "c0": rng.standard_normal((1, batch, h)).astype(np.float32), "p": None,
             "ws": np.full(1, 0.004, np.float32), "wz": np.zeros(1, np.int8),
             "rs": np.full(1, 0.003 if h > 8 else 0.01, np.float32), "rz": np.zeros(1, np.int8)}
    model, given = _with_initializers("DynamicQuantizeLSTM", feeds, {"w", "r", "b", "ws", "wz", "rs", "rz"}, 3,
                                      hidden_size=h)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2  # one hidden-state row per thread at batch 2
    want = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"]).run(None, given)
    got = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, given)
    for i, (w, g) in enumerate(zip(want, got)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=f"{case} output {i}")


@pytest.mark.parametrize("name", ["lstm_ts", "lstm_ts_qdyn"])
def test_lstm_runs_at_once_on_threads(name):
    """LSTM and DynamicQuantizeLSTM keep their scratch arrays per shape between runs: runs of one
    session on four threads at once (different inputs, batches 2 and 3) give each its own result,
    as the same runs one after another."""
    from pathlib import Path

    path = Path(__file__).parent / "real_models" / f"{name}.onnx"
    sess = onnxhal.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    inputs = [rng.standard_normal((5, 2 + i % 2, 16)).astype(np.float32) for i in range(8)]
    assert_threads_agree(sess, "x", inputs, rounds=30)
