"""Models in the QDQ format that onnxruntime's ``quantize_static`` writes, on the CPU EP against
onnxruntime: QuantizeLinear / DequantizeLinear at their corners (NaN, infinities, values past the
code range, an infinite scale), and whole models quantized at test time.

A BERT's additive attention mask holds -inf; calibration then gives its QuantizeLinear an infinite
scale, and -inf / inf is NaN. onnxruntime's MLAS turns a NaN into the code type's minimum, so the
mask survives as -inf through the DequantizeLinear; a NaN cast to int8 gives 0 instead, the mask
is lost (the corpus BERT: 1.6% of its largest output off)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxhal

REAL_MODELS = Path(__file__).parent / "real_models"
_CORNERS = np.array([np.nan, np.inf, -np.inf, 0, 1, -1, 2.5, -3.5, 1e30, -1e30, 70000, -70000], np.float32)


def _both(model: onnx.ModelProto, feeds: dict, level: str = "ORT_ENABLE_ALL") -> tuple[list, list]:
    data = model.SerializeToString()
    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    expected = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"]).run(None, feeds)
    so = onnxhal.SessionOptions()
    so.graph_optimization_level = getattr(onnxhal.GraphOptimizationLevel, level)
    got = onnxhal.InferenceSession(data, so, providers=["CPUExecutionProvider"]).run(None, feeds)
    return expected, got


@pytest.mark.parametrize("code", [TensorProto.UINT8, TensorProto.INT8, TensorProto.UINT16, TensorProto.INT16])
@pytest.mark.parametrize("scale", [1.0, 0.5, np.inf])
@pytest.mark.parametrize("zero_point", [0, 3])
def test_quantize_dequantize_corners_match_onnxruntime(code, scale, zero_point):
    n = len(_CORNERS)
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
         helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])], "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
        [helper.make_tensor_value_info("q", code, [n]), helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])],
        [helper.make_tensor("s", TensorProto.FLOAT, [], [scale]), helper.make_tensor("z", code, [], [zero_point])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    (q0, y0), (q1, y1) = _both(model, {"x": _CORNERS})
    np.testing.assert_array_equal(q1, q0)
    np.testing.assert_array_equal(y1, y0)


def _masked_attention() -> onnx.ModelProto:
    """One attention head as an exporter writes it: scores = q k^T / sqrt(d), plus a mask that is 0
    where attended and -inf where padded (Where on the 0/1 mask), Softmax, the values, and the
    residual connection."""
    rng = np.random.default_rng(0)
    d = 8
    w = {n: numpy_helper.from_array(rng.standard_normal((d, d)).astype(np.float32) / 3, n) for n in ("wq", "wk", "wv")}
    consts = [numpy_helper.from_array(np.array(-np.inf, np.float32), "neg"),
              numpy_helper.from_array(np.array(0, np.float32), "zero"),
              numpy_helper.from_array(np.array(1 / np.sqrt(d), np.float32), "rsd")]
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"]),
        helper.make_node("MatMul", ["x", "wk"], ["k"]),
        helper.make_node("MatMul", ["x", "wv"], ["v"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["qk"]),
        helper.make_node("Mul", ["qk", "rsd"], ["scores"]),
        helper.make_node("Cast", ["mask"], ["keep"], to=TensorProto.BOOL),
        helper.make_node("Unsqueeze", ["keep", "axis1"], ["keep3"]),
        helper.make_node("Where", ["keep3", "zero", "neg"], ["bias"]),
        helper.make_node("Add", ["scores", "bias"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["context"]),
        helper.make_node("Add", ["x", "context"], ["y"]),  # the residual: the output is not all context
    ]
    axis = numpy_helper.from_array(np.array([1], np.int64), "axis1")
    graph = helper.make_graph(
        nodes, "attention",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", d]),
         helper.make_tensor_value_info("mask", TensorProto.INT64, ["b", "s"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", d])],
        list(w.values()) + consts + [axis])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _feeds(rng: np.random.Generator, batch: int = 2, seq: int = 6) -> dict:
    mask = np.ones((batch, seq), np.int64)
    mask[0, seq - 2:] = 0
    return {"x": rng.standard_normal((batch, seq, 8)).astype(np.float32), "mask": mask}


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("activation", ["QUInt8", "QInt8"])
def test_quantize_static_qdq_attention_matches_onnxruntime(tmp_path, per_channel, activation):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class _Reader(CalibrationDataReader):
        def __init__(self) -> None:
            rng = np.random.default_rng(1)
            self.items = iter([_feeds(rng) for _ in range(3)])

        def get_next(self):
            return next(self.items, None)

    src, dst = tmp_path / "attention.onnx", tmp_path / "attention_qdq.onnx"
    onnx.save(_masked_attention(), src)
    quantize_static(str(src), str(dst), _Reader(), quant_format=QuantFormat.QDQ, per_channel=per_channel,
                    activation_type=getattr(QuantType, activation), weight_type=QuantType.QInt8)
    model = onnx.load(dst)
    scales = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer if i.name.endswith("_scale")}
    assert any(np.isinf(s).any() for s in scales.values()), "the mask's QuantizeLinear should get an infinite scale"
    feeds = _feeds(np.random.default_rng(2))
    for level in ("ORT_DISABLE_ALL", "ORT_ENABLE_ALL"):
        (expected,), (got,) = _both(model, feeds, level)
        assert np.isfinite(expected).all()
        err = np.abs(got - expected).max() / np.abs(expected).max()
        assert err <= 1e-2, f"{level}: {err:.3g} of the output's largest value off onnxruntime"


def _quantized(tmp_path, name: str, fmt: str, per_channel: bool) -> tuple[onnx.ModelProto, list]:
    """The corpus model ``name`` after onnxruntime's pre-processing (which folds the exporter's
    Constant nodes into initializers, so that the MatMul weights get quantized too) and
    ``quantize_static`` (int8 activations and weights), calibrated on its two stored signatures;
    with those signatures."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    stored = np.load(REAL_MODELS / f"{name}.npz")
    signatures = [{k.split(".", 1)[1]: stored[k] for k in stored.files if k.startswith(f"{sig}.") and "__" not in k}
                  for sig in ("a", "b")]

    class _Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.items = iter(signatures)

        def get_next(self):
            return next(self.items, None)

    pre, dst = tmp_path / "pre.onnx", tmp_path / "quantized.onnx"
    quant_pre_process(str(REAL_MODELS / f"{name}.onnx"), str(pre), skip_symbolic_shape=True)
    quantize_static(str(pre), str(dst), _Reader(), quant_format=getattr(QuantFormat, fmt), per_channel=per_channel,
                    weight_type=QuantType.QInt8)
    model = onnx.load(dst)
    model.ir_version = min(model.ir_version, 10)
    assert sum(n.op_type == "QuantizeLinear" for n in model.graph.node) > 10
    return model, signatures


@pytest.mark.parametrize("name, fmt, per_channel", [
    ("bert_ts", "QDQ", False), ("bert_ts", "QDQ", True), ("gpt2_ts", "QDQ", True), ("vit_ts", "QDQ", False),
    ("gpt2_ts", "QOperator", False),  # QLinearSoftmax on the masked scores' infinite scale
])
@pytest.mark.parametrize("level", ["ORT_ENABLE_BASIC", "ORT_ENABLE_ALL"])
def test_quantize_static_corpus_transformers_match_onnxruntime(tmp_path, name, fmt, per_channel, level):
    """At the basic level onnxruntime runs the QDQ nodes as written; at its default level it fuses
    QDQ groups into integer kernels (a ViT: 9e-2 of the output's scale apart from the basic level),
    and so does the optimizer (``opt_qdq_fusions``)."""
    model, signatures = _quantized(tmp_path, name, fmt, per_channel)
    for feeds in signatures:
        (expected,), (got,) = _both(model, feeds, level)
        err = np.abs(got - expected).max() / np.abs(expected).max()
        assert err <= 1e-6, f"{err:.3g} of the output's largest value off onnxruntime"


@pytest.mark.parametrize("name", ["bert_ts", "gpt2_ts", "vit_ts"])
def test_the_qdq_groups_fused_are_those_onnxruntime_fuses(tmp_path, name):
    """The fused nodes, by the name of the op they replace, in onnxruntime's optimized model at the
    extended level and in onnxhal's: int8 activations are fused only where onnxruntime turns them
    into uint8 first, and groups with an infinite scale (the attention mask) not at all."""
    model, _ = _quantized(tmp_path, name, "QDQ", False)
    data = model.SerializeToString()
    fused = {}
    for lib in (ort, onnxhal):
        so = lib.SessionOptions()
        so.graph_optimization_level = lib.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        so.optimized_model_filepath = str(tmp_path / f"{lib.__name__}.onnx")
        lib.InferenceSession(data, so, providers=["CPUExecutionProvider"])
        nodes = onnx.load(so.optimized_model_filepath).graph.node
        fused[lib.__name__] = sorted((n.op_type, n.name.removesuffix("_quant")) for n in nodes
                                     if n.op_type.startswith("QLinear"))
    assert fused["onnxhal"] == fused["onnxruntime"]
    assert fused["onnxhal"], "nothing fused"


@pytest.mark.parametrize("op", ["DequantizeLinear", "QuantizeLinear"])
@pytest.mark.parametrize("scale_shape, zp_shape", [((1,), ()), ((), (1,)), ((1,), (1,))])
def test_one_element_scales_and_zero_points_are_per_tensor_natively(op, scale_shape, zp_shape, monkeypatch):
    """quantize_static writes a bias's scale as [1] and its zero point as a scalar: per tensor, as
    onnxruntime reads it; the native kernel takes it (onnx.reference, 10-200x slower, is not built)
    and agrees with onnx.reference."""
    from onnx.reference import ReferenceEvaluator

    from onnxhal.runtime.providers.cpu import kernel_factory

    built = []
    monkeypatch.setattr(kernel_factory.ReferenceKernel, "__init__",
                        lambda self, *a, **k: built.append(a) or (_ for _ in ()).throw(AssertionError("reference")))
    rng = np.random.default_rng(1)
    if op == "DequantizeLinear":
        x = rng.integers(-100, 100, (16,)).astype(np.int32)
        zp_dtype, zp_type = np.int32, TensorProto.INT32
    else:
        x = rng.standard_normal(16).astype(np.float32) * 3
        zp_dtype, zp_type = np.int8, TensorProto.INT8
    scale = np.full(scale_shape, 0.05, np.float32)
    zp = np.full(zp_shape, 3, zp_dtype)
    node = helper.make_node(op, ["x", "s", "z"], ["y"])
    graph = helper.make_graph([node], "q", [helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(x.dtype), [16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT if op == "DequantizeLinear" else zp_type, [16])],
                              [numpy_helper.from_array(scale, "s"), numpy_helper.from_array(zp, "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])  # onnx.reference's lowest
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    got = onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert not built
    np.testing.assert_array_equal(got, want)
