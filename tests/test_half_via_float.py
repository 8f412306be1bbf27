"""The float16 fast path of the CPU EP's products (``kernels/half_via_float.py``): MatMul, Gemm,
Conv, their fused forms and the recurrent ops on float16 inputs computed in float32, as onnxruntime's CPU EP computes
them; against the plain float16 kernels and onnxruntime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxhal
from onnxhal.hal import KernelCreateContext, Node
from onnxhal.runtime.optimizer import passes
from onnxhal.runtime.providers.cpu.kernels import half_via_float as half

H = TensorProto.FLOAT16


def _model(kind: str, rng: np.random.Generator) -> tuple[bytes, dict]:
    """A float16 graph of one kind of product (with what the optimizer fuses into it)."""
    names = iter(f"w{i}" for i in range(9))

    def w(*shape: int):
        return numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(shape[-1] * 3)).astype(np.float16),
                                       next(names))

    if kind == "conv":  # Conv + bias + Relu, then a depthwise Conv: FusedConv at the extended level
        inits = [w(16, 8, 3, 3), numpy_helper.from_array(rng.standard_normal(16).astype(np.float16), "b"),
                 w(16, 1, 3, 3)]
        nodes = [helper.make_node("Conv", ["x", inits[0].name, "b"], ["c"], pads=[1, 1, 1, 1]),
                 helper.make_node("Relu", ["c"], ["r"]),
                 helper.make_node("Conv", ["r", inits[2].name], ["y"], pads=[1, 1, 1, 1], group=16, strides=[2, 2])]
        x = rng.standard_normal((2, 8, 12, 12)).astype(np.float16)
    elif kind == "matmul":  # MatMul + Add bias, then a MatMul of two activations
        inits = [w(24, 40), numpy_helper.from_array(rng.standard_normal(40).astype(np.float16), "b")]
        nodes = [helper.make_node("MatMul", ["x", inits[0].name], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
                 helper.make_node("Transpose", ["a"], ["t"], perm=[0, 2, 1]),
                 helper.make_node("MatMul", ["a", "t"], ["y"])]
        x = rng.standard_normal((2, 5, 24)).astype(np.float16)
    else:  # Gemm with transB and alpha, then Gemm + Relu
        inits = [w(32, 24), w(32, 16), numpy_helper.from_array(rng.standard_normal(16).astype(np.float16), "c")]
        nodes = [helper.make_node("Gemm", ["x", inits[0].name], ["g"], transB=1, alpha=0.5),
                 helper.make_node("Gemm", ["g", inits[1].name, "c"], ["p"]), helper.make_node("Relu", ["p"], ["y"])]
        x = rng.standard_normal((6, 24)).astype(np.float16)
    graph = helper.make_graph(nodes, kind, [helper.make_tensor_value_info("x", H, list(x.shape))],
                              [helper.make_tensor_value_info("y", H, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    return model.SerializeToString(), {"x": x}


def _run(data: bytes, feeds: dict, level: str) -> np.ndarray:
    so = onnxhal.SessionOptions()
    so.graph_optimization_level = getattr(onnxhal.GraphOptimizationLevel, level)
    return onnxhal.InferenceSession(data, so).run(None, feeds)[0]


@pytest.mark.parametrize("kind", ["conv", "matmul", "gemm"])
@pytest.mark.parametrize("level", ["ORT_DISABLE_ALL", "ORT_ENABLE_ALL"])
def test_float16_products_go_through_float32_and_match_the_plain_kernels(kind, level, monkeypatch):
    # the kernels' own float16 path is under test: without the pass that computes float16 regions
    # in float32 (tests/test_float16_regions.py), which would hand them float32 inputs
    monkeypatch.setattr(passes, "PASSES", [p for p in passes.PASSES if p[0] != "run_float16_regions"])
    data, feeds = _model(kind, np.random.default_rng(0))
    calls = []
    through = half.via_float32
    monkeypatch.setattr(half, "via_float32", lambda *a: calls.append(1) or through(*a))
    fast = _run(data, feeds, level)
    assert calls, "the float16 products did not take the float32 path"
    monkeypatch.setattr(half, "ENABLED", False)
    plain = _run(data, feeds, level)
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert fast.dtype == plain.dtype == theirs.dtype == np.float16
    scale = float(np.abs(theirs.astype(np.float32)).max())
    # float16 rounding: a few units of its last place (2**-10) of the output's scale
    for name, got in (("fast path", fast), ("plain kernel", plain)):
        err = float(np.abs(got.astype(np.float32) - theirs.astype(np.float32)).max()) / scale
        assert err < 4e-3, f"{kind} at {level}, {name}: {err:.2e} of the output's scale off onnxruntime"
    err = float(np.abs(fast.astype(np.float32) - plain.astype(np.float32)).max()) / scale
    assert err < 4e-3, f"{kind} at {level}: the fast path is {err:.2e} of the output's scale off the plain kernel"


def _recurrent(op: str, rng: np.random.Generator) -> tuple[bytes, dict]:
    """A float16 LSTM or GRU of 2 directions over a sequence of 7, as a float16 conversion of an
    exported CRNN writes it (W, R, B constant; X and the initial state fed)."""
    gates, hidden, width = (4 if op == "LSTM" else 3), 6, 5
    w = (rng.standard_normal((2, gates * hidden, width)) / 3).astype(np.float16)
    r = (rng.standard_normal((2, gates * hidden, hidden)) / 3).astype(np.float16)
    b = (rng.standard_normal((2, 2 * gates * hidden)) / 3).astype(np.float16)
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(r, "R"), numpy_helper.from_array(b, "B")]
    node = helper.make_node(op, ["x", "W", "R", "B", "", "h0"], ["y"], hidden_size=hidden, direction="bidirectional")
    graph = helper.make_graph([node], op, [helper.make_tensor_value_info("x", H, [7, 3, width]),
                                           helper.make_tensor_value_info("h0", H, [2, 3, hidden])],
                              [helper.make_tensor_value_info("y", H, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=10)
    feeds = {"x": rng.standard_normal((7, 3, width)).astype(np.float16),
             "h0": (rng.standard_normal((2, 3, hidden)) / 2).astype(np.float16)}
    return model.SerializeToString(), feeds


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_float16_recurrent_ops_go_through_float32_and_match_onnxruntime(op, monkeypatch):
    # numpy's float16 products made a float16 CRNN's LSTM 15x onnxruntime's time
    monkeypatch.setattr(passes, "PASSES", [p for p in passes.PASSES if p[0] != "run_float16_regions"])
    data, feeds = _recurrent(op, np.random.default_rng(1))
    calls = []
    through = half.via_float32
    monkeypatch.setattr(half, "via_float32", lambda *a: calls.append(1) or through(*a))
    fast = _run(data, feeds, "ORT_ENABLE_ALL")
    assert calls, f"the float16 {op} did not take the float32 path"
    monkeypatch.setattr(half, "ENABLED", False)
    plain = _run(data, feeds, "ORT_ENABLE_ALL")
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert fast.dtype == plain.dtype == theirs.dtype == np.float16 and fast.shape == theirs.shape
    for name, got in (("fast path", fast), ("plain kernel", plain)):
        err = float(np.abs(got.astype(np.float32) - theirs.astype(np.float32)).max())
        assert err < 4e-3, f"{op}, {name}: {err:.2e} off onnxruntime"


class _Constants(KernelCreateContext):
    def __init__(self, names: set[str]) -> None:
        self.names = names

    def is_constant_initializer(self, name: str) -> bool:
        return name in self.names


def test_a_constant_weight_is_widened_once_and_a_feed_each_run():
    widen = half.WidenedInputs(Node("MatMul", ["x", "w"], ["y"]), _Constants({"w"}))
    x, w = np.ones((2, 3), np.float16), np.full((3, 4), 0.5, np.float16)
    first, second = widen([x, w]), widen([x, w])
    assert first[1] is second[1] and first[1].dtype == np.float32  # the weight: one copy
    assert first[0] is not second[0] and first[0].dtype == np.float32  # the feed: widened each run
    w2 = w.copy()
    assert widen([x, w2])[1] is not first[1]  # another array under that name: widened again


def test_float16_max_pool_takes_the_largest_tap_in_float32_exactly():
    # the small-input gather path reduces the taps in float32 (numpy's float16 maximum widens each
    # element); the largest value is the same number, NaN (which onnxruntime drops in some
    # windows, docs/cpu-ep-random-cases.md) and the padding included
    x = np.random.default_rng(2).standard_normal((2, 3, 9, 11)).astype(np.float16)
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    graph = helper.make_graph([node], "pool", [helper.make_tensor_value_info("x", H, list(x.shape))],
                              [helper.make_tensor_value_info("y", H, None)])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10).SerializeToString()
    got = onnxhal.InferenceSession(data).run(None, {"x": x})[0]
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, theirs)
    x[0, 0, 0, 0] = np.nan
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))[:, :, ::2, ::2]
    want = np.max(windows, axis=(-2, -1))  # in float16: numpy's own, slow arithmetic
    np.testing.assert_array_equal(onnxhal.InferenceSession(data).run(None, {"x": x})[0], want)


# Every float16 bit pattern: NaNs, both infinities, 65504, subnormals and both zeros among them.
_EVERY_HALF = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).reshape(256, 256)
_TABLE_CASES = [("Sigmoid", {}, 17), ("Erf", {}, 17), ("Gelu", {}, 20), ("Gelu", {"approximate": "tanh"}, 20),
                ("LeakyRelu", {"alpha": 0.1}, 17), ("LeakyRelu", {"alpha": 0.3}, 17), ("Elu", {"alpha": 0.7}, 17),
                ("Selu", {}, 17), ("HardSigmoid", {}, 17), ("HardSwish", {}, 17), ("Softplus", {}, 17),
                ("Softsign", {}, 17)]


def _one_node(op: str, attrs: dict, opset: int, elem: int) -> bytes:
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"], **attrs)], op,
                              [helper.make_tensor_value_info("x", elem, [256, 256])],
                              [helper.make_tensor_value_info("y", elem, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10).SerializeToString()


@pytest.mark.parametrize("op, attrs, opset", _TABLE_CASES, ids=lambda v: str(v))
def test_float16_tables_are_the_float32_kernel_rounded_once(op, attrs, opset, monkeypatch):
    # the plain float16 formulas of Gelu, Elu, Selu, HardSigmoid, HardSwish and Sigmoid round every
    # step (up to thousands of units of the last place off onnxruntime near their small results).
    # The kernels' own float16 path is under test, as a session with another EP runs it: without
    # the float16-regions pass, which would hand the kernel float32 values at every level
    monkeypatch.setattr(passes, "PASSES", [p for p in passes.PASSES if p[0] != "run_float16_regions"])
    data = _one_node(op, attrs, opset, H)
    before = len(half.TABLES)
    got = _run(data, {"x": _EVERY_HALF}, "ORT_DISABLE_ALL")
    assert len(half.TABLES) >= before and any(k[1] == op for k in half.TABLES), f"{op} took no table"
    with np.errstate(all="ignore"):
        want = _run(_one_node(op, attrs, opset, TensorProto.FLOAT), {"x": _EVERY_HALF.astype(np.float32)},
                    "ORT_DISABLE_ALL").astype(np.float16)
    assert got.dtype == np.float16 and got.shape == want.shape
    np.testing.assert_array_equal(got, want)  # NaN where NaN, infinities equal, every value equal
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": _EVERY_HALF})[0]
    # onnxruntime's float32 kernels (MLAS's logistic, erf and tanh) are not ours: a few float16 steps
    # apart at most (8 for the tanh Gelu), where the plain float16 formulas were up to 2047 apart
    g, t = got.astype(np.float32), theirs.astype(np.float32)
    assert np.array_equal(np.isnan(g), np.isnan(t)) and np.array_equal(g[np.isinf(t)], t[np.isinf(t)])
    ok = np.isfinite(t)
    with np.errstate(over="ignore"):  # the step above 65504 is infinite
        steps = np.abs(g[ok] - t[ok]) / np.spacing(np.abs(theirs[ok])).astype(np.float32)
    assert steps.max() <= 8, f"{op} {attrs}: {steps.max():.0f} float16 steps off onnxruntime"


def test_float16_tables_follow_the_attributes():
    a = _run(_one_node("LeakyRelu", {"alpha": 0.1}, 17, H), {"x": _EVERY_HALF}, "ORT_DISABLE_ALL")
    b = _run(_one_node("LeakyRelu", {"alpha": 0.3}, 17, H), {"x": _EVERY_HALF}, "ORT_DISABLE_ALL")
    neg = _EVERY_HALF < -1
    assert np.array_equal(a[neg], (_EVERY_HALF[neg].astype(np.float32) * np.float32(0.1)).astype(np.float16))
    assert np.array_equal(b[neg], (_EVERY_HALF[neg].astype(np.float32) * np.float32(0.3)).astype(np.float16))
