"""The recurrent kernels' fast paths (``kernels/recurrent.py``) against their plain forms and
onnxruntime, on random and edge inputs: a bidirectional LSTM's (and DynamicQuantizeLSTM's) two
directions stepped together (``both_directions_apply``) against the directions one after the
other; GRU and RNN's default form on transposed states (``TRANSPOSED_ENABLED``) against the plain
loop."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxhal
from onnxhal.runtime.providers.cpu.kernels import recurrent
from tests.threads import assert_threads_agree

_TYPES = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE}


def _lstm(rng: np.random.Generator, seq: int, batch: int, k: int, h: int, *, direction: str = "bidirectional",
          layout: int = 0, dtype: type = np.float32, bias: bool = True, h0: str = "random", c0: bool = True,
          scale: float = 1.0, **attrs) -> tuple[bytes, dict]:
    """An LSTM node with W, R (and B) as initializers; X and the initial states fed. ``h0``:
    "random", "zero" (exporters' ConstantOfShape) or "none"; ``scale`` multiplies the weights."""
    nd = 2 if direction == "bidirectional" else 1
    t = _TYPES[dtype]
    inits = [numpy_helper.from_array((rng.standard_normal((nd, 4 * h, k)) * scale / np.sqrt(k)).astype(dtype), "w"),
             numpy_helper.from_array((rng.standard_normal((nd, 4 * h, h)) * scale / np.sqrt(h)).astype(dtype), "r")]
    if bias:
        inits.append(numpy_helper.from_array((rng.standard_normal((nd, 8 * h)) * 0.5).astype(dtype), "b"))
    state = (batch, nd, h) if layout else (nd, batch, h)
    feeds = {"x": rng.standard_normal((batch, seq, k) if layout else (seq, batch, k)).astype(dtype)}
    if h0 != "none":
        feeds["h0"] = np.zeros(state, dtype) if h0 == "zero" else rng.standard_normal(state).astype(dtype)
    if c0:
        feeds["c0"] = rng.standard_normal(state).astype(dtype)
    names = ["x", "w", "r", "b" if bias else "", "", "h0" if "h0" in feeds else "", "c0" if c0 else ""]
    node = helper.make_node("LSTM", names, ["y", "y_h", "y_c"], hidden_size=h, direction=direction, layout=layout,
                            **attrs)
    graph = helper.make_graph([node], "lstm", [helper.make_tensor_value_info(n, t, None) for n in feeds],
                              [helper.make_tensor_value_info(n, t, None) for n in ("y", "y_h", "y_c")], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 10
    return model.SerializeToString(), feeds


def _run(model: bytes, feeds: dict, paired: bool, monkeypatch) -> list[np.ndarray]:
    monkeypatch.setattr(recurrent, "PAIR_ENABLED", paired)
    monkeypatch.setattr(recurrent, "NATIVE_LSTM_ENABLED", False)  # the numpy paths (test_lstm_native.py has the C one)
    sess = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"])
    first = sess.run(None, feeds)
    kept = [a.copy() for a in first]
    again = sess.run(None, feeds)  # the second run reads the prepared weights and kept scratch arrays
    other = sess.run(None, {k: v * 0.5 for k, v in feeds.items()})
    for a, b, c in zip(first, kept, again):  # a later run leaves an earlier run's outputs alone
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(c, b)
    assert not all(np.array_equal(a, b) for a, b in zip(other, first))
    return first


#: (seq, batch, input, hidden, options): the corpus's CRNN shape, batch 1, seq 1, hidden 1, the
#: limits of the condition, no bias, initial states absent / zero, float64
PAIR_CASES = {
    "crnn": (20, 2, 64, 24, {}),
    "batch1": (9, 1, 16, 32, {}),
    "seq1": (1, 2, 5, 8, {}),
    "hidden1": (6, 3, 4, 1, {}),
    "hidden64": (4, 1, 7, 64, {}),
    "cells512": (5, 8, 3, 64, {}),
    "batch32": (3, 32, 3, 16, {}),
    "no_bias": (7, 2, 6, 12, {"bias": False}),
    "no_states": (7, 2, 6, 12, {"h0": "none", "c0": False}),
    "zero_h0": (7, 3, 6, 12, {"h0": "zero"}),
    "large_weights": (12, 2, 6, 10, {"scale": 4.0}),
    "float64": (8, 2, 5, 9, {"dtype": np.float64}),
}


@pytest.mark.parametrize("case", sorted(PAIR_CASES))
def test_lstm_both_directions_together_match_one_after_other(case, monkeypatch):
    """The paired loop against the directions one after the other (PAIR_ENABLED False) within
    PAIR_ATOL (its block product sums in another order), and both against onnxruntime."""
    seq, batch, k, h, options = PAIR_CASES[case]
    assert recurrent.both_directions_apply(h, batch)  # the case exercises the fast path
    model, feeds = _lstm(np.random.default_rng(len(case)), seq, batch, k, h, **options)
    paired = _run(model, feeds, True, monkeypatch)
    plain = _run(model, feeds, False, monkeypatch)
    f32 = options.get("dtype", np.float32) == np.float32
    # (onnxruntime's LSTM has no float64 kernel: float64 is compared with the plain loop alone)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds) if f32 else plain
    atol = recurrent.PAIR_ATOL if f32 else 1e-12
    for i, (p, q, w) in enumerate(zip(paired, plain, want)):
        assert p.shape == q.shape == w.shape and p.dtype == q.dtype == w.dtype, (case, i, p.shape, w.shape)
        np.testing.assert_allclose(p, q, rtol=0, atol=atol, err_msg=f"{case} output {i}: paired vs plain")
        np.testing.assert_allclose(p, w, rtol=1e-5, atol=1e-5, err_msg=f"{case} output {i}: paired vs onnxruntime")


def test_lstm_both_directions_together_layout1(monkeypatch):
    """layout 1 (batch first; onnxruntime declines it): the paired loop's outputs are the layout-0
    outputs of the same inputs transposed, and match the directions one after the other."""
    rng = np.random.default_rng(11)
    model1, feeds1 = _lstm(rng, 6, 3, 5, 8, layout=1)
    paired = _run(model1, feeds1, True, monkeypatch)
    plain = _run(model1, feeds1, False, monkeypatch)
    for p, q in zip(paired, plain):
        np.testing.assert_allclose(p, q, rtol=0, atol=recurrent.PAIR_ATOL)
    model0, _ = _lstm(np.random.default_rng(11), 6, 3, 5, 8)  # the same weights, layout 0
    feeds0 = {"x": feeds1["x"].transpose(1, 0, 2), "h0": feeds1["h0"].transpose(1, 0, 2),
              "c0": feeds1["c0"].transpose(1, 0, 2)}
    want = ort.InferenceSession(model0, providers=["CPUExecutionProvider"]).run(None, feeds0)
    np.testing.assert_allclose(paired[0], want[0].transpose(2, 0, 1, 3), rtol=1e-5, atol=1e-5)
    for p, w in zip(paired[1:], want[1:]):
        np.testing.assert_allclose(p, w.transpose(1, 0, 2), rtol=1e-5, atol=1e-5)


def test_both_directions_condition():
    """The paired loop's condition: small hidden sizes and batches only (beyond them its block
    product's doubled work costs more than the calls it saves)."""
    assert recurrent.both_directions_apply(24, 2)
    assert recurrent.both_directions_apply(recurrent.PAIR_MAX_HIDDEN, 1)
    assert not recurrent.both_directions_apply(recurrent.PAIR_MAX_HIDDEN + 1, 1)
    assert not recurrent.both_directions_apply(16, recurrent.PAIR_MAX_CELLS // 16 + 1)


OTHER_FORMS = {  # bidirectional forms the paired loop leaves to the general loop, with their results
    "sequence_lens": {"lens": True},
    "clip": {"clip": 0.7},
    "activations": {"activations": ["HardSigmoid", "Relu", "Softsign", "Sigmoid", "Tanh", "Tanh"]},
    "input_forget": {"input_forget": 1},
}


@pytest.mark.parametrize("case", sorted(OTHER_FORMS))
def test_lstm_other_bidirectional_forms_match_onnxruntime(case, monkeypatch):
    """Bidirectional LSTMs the condition leaves out (shorter sequences, clip, other activations,
    input_forget) keep onnxruntime's results with the paired loop enabled."""
    rng = np.random.default_rng(5)
    options = dict(OTHER_FORMS[case])
    lens = options.pop("lens", False)
    model, feeds = _lstm(rng, 6, 3, 5, 8, **options)
    if lens:  # rebuild with sequence_lens wired as input 4
        from onnx import load_from_string
        m = load_from_string(model)
        m.graph.node[0].input[4] = "lens"
        m.graph.input.append(helper.make_tensor_value_info("lens", TensorProto.INT32, None))
        model = m.SerializeToString()
        feeds["lens"] = np.array([6, 2, 4], np.int32)
    monkeypatch.setattr(recurrent, "PAIR_ENABLED", True)
    got = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=f"{case} output {i}")


def test_terminate_stops_a_long_bidirectional_lstm(monkeypatch):
    """RunOptions.terminate stops the paired loop in bounded time (it checks the flag every step),
    and the session then runs as before. (12 short runs long, not more: the whole sequence's input
    projection comes before the first step, and under load it alone could pass the bound.)"""
    from tests.test_terminate_in_kernels import STOP_AFTER_S, assert_stopped, terminated_run, timed

    monkeypatch.setattr(recurrent, "PAIR_ENABLED", True)
    monkeypatch.setattr(recurrent, "NATIVE_LSTM_ENABLED", False)
    rng = np.random.default_rng(34)
    model, feeds = _lstm(rng, 10_000, 1, 4, 8, h0="none", c0=False, scale=0.3)
    sess = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"])
    expected = sess.run(None, feeds)
    t_short = timed(lambda: sess.run(None, feeds))
    err, seconds = terminated_run(sess, {"x": np.tile(feeds["x"], (12, 1, 1))})  # about 12 short runs
    assert_stopped(err, seconds, STOP_AFTER_S + 4 * t_short)
    for a, e in zip(sess.run(None, feeds), expected):
        np.testing.assert_array_equal(a, e)


def _quantized_lstm(rng: np.random.Generator, seq: int, batch: int, k: int, h: int, *, codes: type = np.int8,
                    per_column: bool = False, h0: str = "random", bias: bool = True) -> tuple[bytes, dict]:
    """A bidirectional com.microsoft DynamicQuantizeLSTM (quantize_dynamic's LSTM): W [2, input,
    4 * hidden] and R [2, hidden, 4 * hidden] 8-bit codes with per-direction (or per-column) scales
    and zero points, as initializers; X and the initial states fed."""
    info = np.iinfo(codes)
    shape = (2, 4 * h) if per_column else (2,)
    zp = 0 if codes == np.int8 and per_column else int(rng.integers(-5, 5) if codes == np.int8 else rng.integers(120, 136))
    arrays = {"w": rng.integers(info.min, int(info.max) + 1, (2, k, 4 * h)).astype(codes),
              "r": rng.integers(info.min, int(info.max) + 1, (2, h, 4 * h)).astype(codes),
              "ws": rng.uniform(0.002, 0.01, shape).astype(np.float32), "wz": np.full(shape, zp, codes),
              "rs": rng.uniform(0.002, 0.01, shape).astype(np.float32), "rz": np.full(shape, zp, codes)}
    if bias:
        arrays["b"] = (rng.standard_normal((2, 8 * h)) * 0.5).astype(np.float32)
    feeds = {"x": rng.standard_normal((seq, batch, k)).astype(np.float32)}
    if h0 != "none":
        feeds["h0"] = (np.zeros if h0 == "zero" else rng.standard_normal)((2, batch, h)).astype(np.float32)
    feeds["c0"] = rng.standard_normal((2, batch, h)).astype(np.float32)
    names = ["x", "w", "r", "b" if bias else "", "", "h0" if "h0" in feeds else "", "c0", "", "ws", "wz", "rs", "rz"]
    node = helper.make_node("DynamicQuantizeLSTM", names, ["y", "y_h", "y_c"], domain="com.microsoft", hidden_size=h,
                            direction="bidirectional")
    graph = helper.make_graph([node], "qlstm", [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in feeds],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "y_h", "y_c")],
                              [numpy_helper.from_array(v, n) for n, v in arrays.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return model.SerializeToString(), feeds


#: (seq, batch, input, hidden, options)
QUANTIZED_PAIR_CASES = {
    "crnn": (20, 2, 64, 24, {}),
    "batch1_uint8": (9, 1, 16, 32, {"codes": np.uint8}),
    "seq1": (1, 2, 5, 8, {}),
    "hidden64": (4, 1, 7, 64, {"per_column": True}),
    "cells512": (3, 8, 5, 64, {}),
    "per_column_uint8": (6, 2, 5, 12, {"per_column": True, "codes": np.uint8}),
    "batch4": (5, 4, 3, 16, {}),
    "zero_h0_no_bias": (7, 2, 6, 12, {"h0": "zero", "bias": False}),
    "no_h0": (7, 2, 6, 12, {"h0": "none"}),
}


@pytest.mark.parametrize("case", sorted(QUANTIZED_PAIR_CASES))
def test_dynamic_quantize_lstm_both_directions_together(case, monkeypatch):
    """DynamicQuantizeLSTM's paired loop against its directions one after the other (each
    direction's hidden state quantized on its own ranges: the codes are the same, the multipliers
    within an ulp), and against onnxruntime on two threads (one hidden-state row per thread at
    batches up to 2, the kernel's row-by-row ranges)."""
    seq, batch, k, h, options = QUANTIZED_PAIR_CASES[case]
    assert recurrent.both_directions_apply(h, batch)
    model, feeds = _quantized_lstm(np.random.default_rng(len(case) + 40), seq, batch, k, h, **options)
    paired = _run(model, feeds, True, monkeypatch)
    plain = _run(model, feeds, False, monkeypatch)
    for i, (p, q) in enumerate(zip(paired, plain)):
        assert p.shape == q.shape and p.dtype == q.dtype, (case, i, p.shape, q.shape)
        np.testing.assert_allclose(p, q, rtol=0, atol=recurrent.PAIR_ATOL, err_msg=f"{case} output {i}: paired vs plain")
    if batch <= 2:
        so = ort.SessionOptions()
        so.intra_op_num_threads = 2
        want = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feeds)
        for i, (p, w) in enumerate(zip(paired, want)):
            np.testing.assert_allclose(p, w, rtol=1e-4, atol=1e-5, err_msg=f"{case} output {i}: paired vs onnxruntime")


def _gru_rnn(rng: np.random.Generator, op: str, seq: int, batch: int, k: int, h: int, *,
             direction: str = "forward", layout: int = 0, dtype: type = np.float32, bias: bool = True,
             h0: bool = True, fed_weights: bool = False, lens: list | None = None, **attrs) -> tuple[bytes, dict]:
    """A GRU or RNN node: W, R (and B) initializers, or fed with ``fed_weights``; X, initial_h and
    sequence_lens fed."""
    g = {"RNN": 1, "GRU": 3}[op]
    nd = 2 if direction == "bidirectional" else 1
    t = _TYPES[dtype]
    weights = {"w": (rng.standard_normal((nd, g * h, k)) / np.sqrt(k)).astype(dtype),
               "r": (rng.standard_normal((nd, g * h, h)) / np.sqrt(h)).astype(dtype)}
    if bias:
        weights["b"] = (rng.standard_normal((nd, 2 * g * h)) * 0.5).astype(dtype)
    feeds = {"x": rng.standard_normal((batch, seq, k) if layout else (seq, batch, k)).astype(dtype)}
    if h0:
        feeds["h0"] = rng.standard_normal((batch, nd, h) if layout else (nd, batch, h)).astype(dtype)
    if lens is not None:
        feeds["lens"] = np.array(lens, np.int32)
    if fed_weights:
        feeds.update(weights)
    names = ["x", "w", "r", "b" if bias else "", "lens" if lens is not None else "", "h0" if h0 else ""]
    node = helper.make_node(op, names, ["y", "y_h"], hidden_size=h, direction=direction, layout=layout, **attrs)
    graph = helper.make_graph(
        [node], op.lower(), [helper.make_tensor_value_info(n, TensorProto.INT32 if n == "lens" else t, None)
                             for n in feeds],
        [helper.make_tensor_value_info(n, t, None) for n in ("y", "y_h")],
        [] if fed_weights else [numpy_helper.from_array(v, n) for n, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 10
    return model.SerializeToString(), feeds


def _run_transposed(model: bytes, feeds: dict, enabled: bool, monkeypatch) -> list[np.ndarray]:
    monkeypatch.setattr(recurrent, "TRANSPOSED_ENABLED", enabled)
    sess = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"])
    first = sess.run(None, feeds)
    for a, b in zip(first, sess.run(None, feeds)):  # the second run reads the prepared weights
        np.testing.assert_array_equal(a, b)
    return first


#: (op, seq, batch, input, hidden, options)
TRANSPOSED_CASES = {
    "rnn_forward": ("RNN", 7, 2, 5, 8, {}),
    "rnn_reverse_no_bias": ("RNN", 7, 3, 5, 8, {"direction": "reverse", "bias": False}),
    "rnn_bidirectional_batch1": ("RNN", 6, 1, 4, 9, {"direction": "bidirectional"}),
    "rnn_seq1_no_h0": ("RNN", 1, 2, 3, 5, {"h0": False}),
    "rnn_fed_weights": ("RNN", 5, 2, 4, 6, {"fed_weights": True}),
    "gru_forward": ("GRU", 8, 2, 6, 12, {}),
    "gru_linear_before_reset": ("GRU", 8, 2, 6, 12, {"linear_before_reset": 1}),
    "gru_reverse_no_bias": ("GRU", 6, 3, 4, 7, {"direction": "reverse", "bias": False}),
    "gru_lbr_no_bias_no_h0": ("GRU", 6, 3, 4, 7, {"linear_before_reset": 1, "bias": False, "h0": False}),
    "gru_bidirectional_lbr": ("GRU", 9, 2, 5, 16, {"direction": "bidirectional", "linear_before_reset": 1}),
    "gru_bidirectional_batch1": ("GRU", 9, 1, 5, 16, {"direction": "bidirectional"}),
    "gru_seq1_hidden1": ("GRU", 1, 2, 3, 1, {}),
    "gru_fed_weights": ("GRU", 5, 2, 4, 6, {"fed_weights": True, "linear_before_reset": 1}),
    "gru_sequence_lens_full": ("GRU", 4, 2, 3, 5, {"lens": [4, 4]}),
    # sequences of several lengths (masked steps): forward, reverse, both directions one after the
    # other (batch x hidden above the paired loop's bound), a zero length, no initial state
    "gru_ragged_forward": ("GRU", 7, 4, 3, 5, {"lens": [7, 2, 5, 3], "linear_before_reset": 1}),
    "gru_ragged_reverse": ("GRU", 7, 3, 3, 5, {"lens": [3, 7, 1], "direction": "reverse"}),
    "gru_ragged_bidirectional_apart": ("GRU", 6, 12, 3, 48, {"lens": [6, 1, 4, 2, 6, 5, 3, 6, 1, 2, 4, 5],
                                                              "direction": "bidirectional"}),
    "gru_ragged_zero_no_h0": ("GRU", 5, 3, 3, 4, {"lens": [5, 0, 2], "h0": False}),
    "rnn_ragged_reverse": ("RNN", 6, 3, 4, 6, {"lens": [6, 1, 3], "direction": "reverse"}),
    "gru_float64": ("GRU", 6, 2, 4, 7, {"dtype": np.float64, "linear_before_reset": 1}),
    "rnn_float64": ("RNN", 6, 2, 4, 7, {"dtype": np.float64, "direction": "bidirectional"}),
}


@pytest.mark.parametrize("case", sorted(TRANSPOSED_CASES))
def test_gru_rnn_transposed_form_matches_plain_loop(case, monkeypatch):
    """GRU and RNN's default form on transposed states against the plain loop (within
    TRANSPOSED_ATOL: its bias sums and GRU's update round in another order) and onnxruntime."""
    op, seq, batch, k, h, options = TRANSPOSED_CASES[case]
    model, feeds = _gru_rnn(np.random.default_rng(len(case)), op, seq, batch, k, h, **options)
    monkeypatch.setattr(recurrent, "NATIVE_GRU_ENABLED", False)  # the numpy loop (tests/test_gru_native.py: the C one)
    monkeypatch.setattr(recurrent, "NATIVE_RNN_ENABLED", False)
    fast = _run_transposed(model, feeds, True, monkeypatch)
    plain = _run_transposed(model, feeds, False, monkeypatch)
    f32 = options.get("dtype", np.float32) == np.float32
    # (onnxruntime has no float64 GRU or RNN: float64 is compared with the plain loop alone)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds) if f32 else plain
    for i, (f, p, w) in enumerate(zip(fast, plain, want)):
        assert f.shape == p.shape == w.shape and f.dtype == p.dtype == w.dtype, (case, i, f.shape, w.shape)
        np.testing.assert_allclose(f, p, rtol=0, atol=recurrent.TRANSPOSED_ATOL if f32 else 1e-12,
                                   err_msg=f"{case} output {i}: transposed vs plain")
        np.testing.assert_allclose(f, w, rtol=1e-5, atol=1e-5, err_msg=f"{case} output {i}: vs onnxruntime")


PAIRED_TRANSPOSED_CASES = {  # bidirectional GRU and RNN: (op, seq, batch, input, hidden, options)
    "gru": ("GRU", 9, 2, 5, 16, {}),
    "gru_lbr": ("GRU", 9, 2, 5, 16, {"linear_before_reset": 1}),
    "gru_lbr_no_bias_no_h0": ("GRU", 6, 3, 4, 7, {"linear_before_reset": 1, "bias": False, "h0": False}),
    "gru_seq1_hidden1": ("GRU", 1, 1, 3, 1, {}),
    "gru_limits": ("GRU", 3, 8, 4, 64, {}),
    "gru_fed_weights": ("GRU", 5, 2, 4, 6, {"fed_weights": True}),
    "rnn": ("RNN", 8, 4, 5, 12, {}),
    "rnn_no_bias_batch1": ("RNN", 8, 1, 5, 12, {"bias": False}),
    "gru_float64": ("GRU", 6, 2, 4, 7, {"dtype": np.float64, "linear_before_reset": 1}),
    "gru_ragged": ("GRU", 9, 3, 5, 16, {"lens": [9, 2, 5], "linear_before_reset": 1}),  # pt_gru's form
    "gru_ragged_zero_no_h0": ("GRU", 6, 3, 4, 7, {"lens": [0, 6, 3], "h0": False}),
    "rnn_ragged": ("RNN", 8, 4, 5, 12, {"lens": [1, 8, 4, 7]}),
}


@pytest.mark.parametrize("case", sorted(PAIRED_TRANSPOSED_CASES))
def test_gru_rnn_both_directions_together(case, monkeypatch):
    """GRU and RNN's paired loop (both directions in one step) against the transposed loop one
    direction after the other (within PAIR_ATOL: the block product's order) and onnxruntime."""
    op, seq, batch, k, h, options = PAIRED_TRANSPOSED_CASES[case]
    assert recurrent.both_directions_apply(h, batch)
    model, feeds = _gru_rnn(np.random.default_rng(len(case) + 7), op, seq, batch, k, h, direction="bidirectional",
                            **options)
    monkeypatch.setattr(recurrent, "NATIVE_GRU_ENABLED", False)
    monkeypatch.setattr(recurrent, "NATIVE_RNN_ENABLED", False)
    monkeypatch.setattr(recurrent, "PAIR_ENABLED", True)
    paired = _run_transposed(model, feeds, True, monkeypatch)
    monkeypatch.setattr(recurrent, "PAIR_ENABLED", False)
    apart = _run_transposed(model, feeds, True, monkeypatch)
    f32 = options.get("dtype", np.float32) == np.float32
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds) if f32 else apart
    for i, (p, q, w) in enumerate(zip(paired, apart, want)):
        assert p.shape == q.shape == w.shape and p.dtype == q.dtype == w.dtype, (case, i, p.shape, w.shape)
        np.testing.assert_allclose(p, q, rtol=0, atol=recurrent.PAIR_ATOL if f32 else 1e-12,
                                   err_msg=f"{case} output {i}: paired vs apart")
        np.testing.assert_allclose(p, w, rtol=1e-5, atol=1e-5, err_msg=f"{case} output {i}: vs onnxruntime")


@pytest.mark.parametrize("op", ["GRU", "RNN"])
def test_gru_rnn_transposed_form_layout1(op, monkeypatch):
    """layout 1 (onnxruntime declines it): the layout-0 outputs of the same inputs transposed."""
    monkeypatch.setattr(recurrent, "NATIVE_GRU_ENABLED", False)  # the numpy loop (tests/test_gru_native.py: the C one)
    monkeypatch.setattr(recurrent, "NATIVE_RNN_ENABLED", False)
    options = {"direction": "bidirectional", "linear_before_reset": 1} if op == "GRU" else {"direction": "bidirectional"}
    model1, feeds1 = _gru_rnn(np.random.default_rng(3), op, 5, 3, 4, 6, layout=1, **options)
    fast = _run_transposed(model1, feeds1, True, monkeypatch)
    plain = _run_transposed(model1, feeds1, False, monkeypatch)
    for f, p in zip(fast, plain):
        np.testing.assert_allclose(f, p, rtol=0, atol=recurrent.TRANSPOSED_ATOL)
    model0, _ = _gru_rnn(np.random.default_rng(3), op, 5, 3, 4, 6, **options)
    feeds0 = {"x": feeds1["x"].transpose(1, 0, 2), "h0": feeds1["h0"].transpose(1, 0, 2)}
    want = ort.InferenceSession(model0, providers=["CPUExecutionProvider"]).run(None, feeds0)
    np.testing.assert_allclose(fast[0], want[0].transpose(2, 0, 1, 3), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(fast[1], want[1].transpose(1, 0, 2), rtol=1e-5, atol=1e-5)


GRU_RNN_OTHER_FORMS = {  # forms the transposed loop leaves to the plain one, with their results
    "gru_clip": ("GRU", {"clip": 0.6}),
    "gru_activations": ("GRU", {"activations": ["HardSigmoid", "Softsign"]}),
    "rnn_relu": ("RNN", {"activations": ["Relu"]}),
}


def test_ragged_lengths_condition():
    """sequence_lens the transposed loops take (one length per batch row within [0, seq]) and
    those left to the plain loop, which names the problem."""
    ok = recurrent.ragged_lengths_apply
    assert ok(np.array([3, 0, 5], np.int32), 5, 3)
    assert not ok(np.array([3, 6, 5], np.int32), 5, 3)  # past the sequence
    assert not ok(np.array([3, -1, 5], np.int64), 5, 3)
    assert not ok(np.array([3, 5], np.int32), 5, 3)  # not one per row
    assert recurrent.ragged_lengths(np.array([5, 5], np.int32), 5) is None  # nothing to mask
    assert recurrent.ragged_lengths(np.array([5, 2], np.int32), 5).tolist() == [5, 2]


@pytest.mark.parametrize("case", sorted(GRU_RNN_OTHER_FORMS))
def test_gru_rnn_other_forms_match_onnxruntime(case, monkeypatch):
    """Forms outside the transposed loop's condition keep onnxruntime's results with it enabled."""
    op, options = GRU_RNN_OTHER_FORMS[case]
    model, feeds = _gru_rnn(np.random.default_rng(9), op, 6, 3, 5, 8, **options)
    got = _run_transposed(model, feeds, True, monkeypatch)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=f"{case} output {i}")


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_terminate_stops_a_long_gru(direction, monkeypatch):
    """RunOptions.terminate stops GRU's transposed loop (and paired loop) in bounded time; the
    session then runs as before."""
    from tests.test_terminate_in_kernels import STOP_AFTER_S, assert_stopped, terminated_run, timed

    monkeypatch.setattr(recurrent, "TRANSPOSED_ENABLED", True)
    monkeypatch.setattr(recurrent, "PAIR_ENABLED", True)
    monkeypatch.setattr(recurrent, "NATIVE_GRU_ENABLED", False)  # (tests/test_gru_native.py: the C steps' blocks)
    monkeypatch.setattr(recurrent, "NATIVE_RNN_ENABLED", False)
    model, feeds = _gru_rnn(np.random.default_rng(34), "GRU", 10_000, 1, 4, 8, h0=False, direction=direction)
    sess = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"])
    expected = sess.run(None, feeds)
    t_short = timed(lambda: sess.run(None, feeds))
    err, seconds = terminated_run(sess, {"x": np.tile(feeds["x"], (12, 1, 1))})  # about 12 short runs
    assert_stopped(err, seconds, STOP_AFTER_S + 4 * t_short)
    for a, e in zip(sess.run(None, feeds), expected):
        np.testing.assert_array_equal(a, e)


@pytest.mark.parametrize("route", ["paired", "lstm_native"])
@pytest.mark.parametrize("name", ["crnn_ts", "crnn_ts_qdyn"])
def test_paired_loop_runs_at_once_on_threads(name, route, monkeypatch):
    """The paired loop keeps its scratch arrays per shape between runs, and the C steps
    (``lstm_native``, where the extension is built) their transposed weights: runs of one session
    on four threads at once (different inputs, batches 1 and 2) give each its own result, as the
    same runs one after another."""
    from pathlib import Path

    monkeypatch.setattr(recurrent, "PAIR_ENABLED", True)
    monkeypatch.setattr(recurrent, "NATIVE_LSTM_ENABLED", route == "lstm_native")
    path = Path(__file__).parent / "real_models" / f"{name}.onnx"
    sess = onnxhal.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    inputs = [rng.standard_normal((1 + i % 2, 1, 16, 40)).astype(np.float32) for i in range(8)]
    assert_threads_agree(sess, "image", inputs, rounds=100)


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("case", ["crnn", "batch1", "seq1", "no_bias", "no_states", "float64"])
def test_lstm_default_path_matches_the_plain_loop_and_onnxruntime(direction, case, monkeypatch):
    """``RECURRENT_PATHS["lstm_default"]`` (``LSTM._run_default``: prepared weights, nine calls a
    step) against the canonical loop, directions apart, and onnxruntime."""
    seq, batch, k, h, opts = PAIR_CASES[case]
    model, feeds = _lstm(np.random.default_rng(len(case) + len(direction)), seq, batch, k, h, direction=direction,
                         **opts)
    monkeypatch.setattr(recurrent, "PAIR_ENABLED", False)
    fast = _run(model, feeds, False, monkeypatch)
    monkeypatch.setattr(recurrent, "LSTM_DEFAULT_ENABLED", False)
    plain = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    for f, p in zip(fast, plain):
        np.testing.assert_allclose(f, p, rtol=0, atol=recurrent.PAIR_ATOL)
    if case != "float64":  # onnxruntime's LSTM has no double kernel ("does not support double yet")
        theirs = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
        for f, t in zip(fast, theirs):
            np.testing.assert_allclose(f, t, rtol=1e-5, atol=1e-5)


def _with_lens(model: bytes, feeds: dict, lens: list[int]) -> tuple[bytes, dict]:
    """``model``'s recurrent node with sequence_lens wired as input 4 and fed ``lens``."""
    from onnx import load_from_string
    m = load_from_string(model)
    m.graph.node[0].input[4] = "lens"
    m.graph.input.append(helper.make_tensor_value_info("lens", TensorProto.INT32, None))
    return m.SerializeToString(), {**feeds, "lens": np.array(lens, np.int32)}


#: (seq, batch, input, hidden, direction, lens, options): sequences of several lengths, as a packed
#: sequence exports; a zero length; no initial states; float64
LSTM_RAGGED_CASES = {
    "forward": (7, 4, 5, 8, "forward", [7, 2, 5, 3], {}),
    "reverse": (7, 3, 5, 8, "reverse", [3, 7, 1], {}),
    "bidirectional": (6, 3, 5, 24, "bidirectional", [6, 2, 4], {}),
    "zero_length_no_states": (5, 3, 4, 6, "bidirectional", [5, 0, 2], {"h0": "none", "c0": False}),
    "float64": (6, 2, 4, 7, "forward", [6, 3], {"dtype": np.float64}),
}


@pytest.mark.parametrize("case", sorted(LSTM_RAGGED_CASES))
def test_lstm_default_path_masks_shorter_sequences(case, monkeypatch):
    """``LSTM._run_default`` with sequence_lens of several lengths (the ended rows keep their
    hidden and cell states, their Y is zero) against the plain loop and onnxruntime; the C steps
    and the paired loop, which have no mask, leave such runs to it."""
    seq, batch, k, h, direction, lens, options = LSTM_RAGGED_CASES[case]
    model, feeds = _lstm(np.random.default_rng(len(case)), seq, batch, k, h, direction=direction, **options)
    model, feeds = _with_lens(model, feeds, lens)
    calls = []
    masked = recurrent.masked_step
    monkeypatch.setattr(recurrent, "masked_step", lambda *a: calls.append(1) or masked(*a))
    monkeypatch.setattr(recurrent, "PAIR_ENABLED", True)
    monkeypatch.setattr(recurrent, "NATIVE_LSTM_ENABLED", True)
    fast = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    assert calls, "the ragged run did not take LSTM._run_default"
    monkeypatch.setattr(recurrent, "LSTM_DEFAULT_ENABLED", False)
    plain = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    f32 = options.get("dtype", np.float32) == np.float32
    for i, (f, p) in enumerate(zip(fast, plain)):
        assert f.shape == p.shape and f.dtype == p.dtype
        np.testing.assert_allclose(f, p, rtol=0, atol=recurrent.PAIR_ATOL if f32 else 1e-12,
                                   err_msg=f"{case} output {i}: masked vs plain")
    if f32:  # onnxruntime's LSTM has no double kernel
        theirs = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
        for i, (f, t) in enumerate(zip(fast, theirs)):
            np.testing.assert_allclose(f, t, rtol=1e-5, atol=1e-5, err_msg=f"{case} output {i}: vs onnxruntime")


@pytest.mark.parametrize("route", ["default", "numpy", "plain"])
@pytest.mark.parametrize("op", ["GRU", "RNN", "LSTM"])
def test_a_zero_length_sequence_ends_at_zero_states(op, route, monkeypatch):
    """A batch row whose sequence_lens is 0 has zero final states (Y_h, and LSTM's Y_c), as
    onnxruntime returns them, with an initial state given, on every path: the C steps, the numpy
    loops and the plain loop (each of which leaves such a row at its initial state)."""
    if route != "default":
        for switch in ("NATIVE_GRU_ENABLED", "NATIVE_RNN_ENABLED", "NATIVE_LSTM_ENABLED"):
            monkeypatch.setattr(recurrent, switch, False)
    if route == "plain":
        monkeypatch.setattr(recurrent, "TRANSPOSED_ENABLED", False)
        monkeypatch.setattr(recurrent, "LSTM_DEFAULT_ENABLED", False)
    for direction in ("forward", "reverse", "bidirectional"):
        if op == "LSTM":
            model, feeds = _lstm(np.random.default_rng(1), 5, 3, 3, 4, direction=direction)
            model, feeds = _with_lens(model, feeds, [5, 0, 2])
        else:
            model, feeds = _gru_rnn(np.random.default_rng(1), op, 5, 3, 3, 4, lens=[5, 0, 2], direction=direction)
        got = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
        want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
        for i, (g, w) in enumerate(zip(got, want)):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=f"{direction} output {i}")
        assert not got[1][:, 1].any()


def assert_stops_at_the_third_check(sess, feeds: dict, monkeypatch) -> None:
    """A run whose ``check_terminate`` raises at its third call (between the C steps' blocks) stops
    there: the C loops read the terminate flag once a block."""
    from onnxhal.hal.run_control import Terminated

    checks: list[int] = []

    def check() -> None:
        checks.append(1)
        if len(checks) == 3:
            raise Terminated("Exiting due to terminate flag being set to true.")

    monkeypatch.setattr(recurrent, "check_terminate", check)
    with pytest.raises(Terminated):
        sess.run(None, feeds)
    assert len(checks) == 3
