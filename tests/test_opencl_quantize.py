"""The OpenCL EP's quantization ops (quant_support.py, quant_lowering.py, quant_codegen.py,
quant_decompose.py): QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, QLinearMatMul and
com.microsoft MatMulIntegerToFloat on random inputs, against the CPU EP's kernels (the same bits)
and onnxruntime; the forms left out are declined with their reason and give onnxruntime's results."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import onnxhal

EP = "OpenCLExecutionProvider"
RNG = np.random.default_rng(4747)
CODES = {T.INT8: np.int8, T.UINT8: np.uint8}


@pytest.fixture
def opencl(register):
    pytest.importorskip("pyopencl")
    from tests.opencl_support import require_opencl

    require_opencl()
    register("onnxhal.runtime.providers.opencl", "opencl")


def _model(nodes, inputs, outputs, consts, opset=13, ms=False) -> bytes:
    graph = helper.make_graph(nodes, "q", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in consts.items()])
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("com.microsoft", 1)] if ms else [])
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=imports))
    model.ir_version = 8
    return model.SerializeToString()


def _sessions(data: bytes, optimize: bool = True):
    """CPU EP and OpenCL EP sessions; ``optimize`` False keeps the graph as written (the optimizer
    folds a DequantizeLinear of constants itself)."""
    so = onnxhal.SessionOptions()
    if not optimize:
        so.graph_optimization_level = onnxhal.GraphOptimizationLevel.ORT_DISABLE_ALL
    cpu = onnxhal.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    ocl = onnxhal.InferenceSession(data, so, providers=[(EP, {"cost_rule": "off"}), "CPUExecutionProvider"])
    return cpu, ocl


def _on_device(sess, *ops) -> None:
    placed = {n.op_type: n.ep_name for n in sess.assigned_nodes()}
    for op in ops:
        assert placed.get(op) == EP, (op, placed, sess.eps[EP].declined)


def _near_ties(shape, scale) -> np.ndarray:
    """Values around code boundaries: (k + 0.5) * scale (ties that x * (1 / scale) moves), random
    values, and the edges: NaN, +-inf, values past saturation."""
    n = int(np.prod(shape))
    k = RNG.integers(-140, 140, n).astype(np.float32)
    x = np.where(RNG.random(n) < 0.6, (k + np.float32(0.5)) * np.float32(scale),
                 (RNG.standard_normal(n) * 80 * scale).astype(np.float32)).astype(np.float32)
    x[:4] = [np.nan, np.inf, -np.inf, 1e30]
    return x.reshape(shape)


def _qdq_model(codes: int, per_axis: bool, scales: np.ndarray, zps: np.ndarray) -> bytes:
    """x -> QuantizeLinear -> (codes out) -> DequantizeLinear -> Relu (a fused tree), with one more
    Quantize of the Relu's result to the other code type, per tensor or along axis 1."""
    axis = {"axis": 1} if per_axis else {}
    consts = {"s": scales, "z": zps, "s2": np.array(0.0371, np.float32), "z2": np.array(7, np.int8)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], **axis),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], **axis),
             helper.make_node("Relu", ["d"], ["r"]),
             helper.make_node("QuantizeLinear", ["r", "s2", "z2"], ["q2"])]
    return _model(nodes, [helper.make_tensor_value_info("x", T.FLOAT, [3, 16, 256])],
                  [helper.make_tensor_value_info(n, t, None) for n, t in (("q", codes), ("r", T.FLOAT), ("q2", T.INT8))],
                  consts)


@pytest.mark.parametrize("codes", [T.INT8, T.UINT8])
@pytest.mark.parametrize("per_axis", [False, True])
def test_quantize_and_dequantize_give_the_cpu_eps_bits(opencl, codes, per_axis):
    """Codes and values equal to the CPU EP's bit for bit (ties rounded half to even after an IEEE
    division, NaN to the lowest code, saturation) and to onnxruntime's."""
    dt = CODES[codes]
    lo, hi = np.iinfo(dt).min, np.iinfo(dt).max
    shape = (16,) if per_axis else ()
    scales = (RNG.random(shape) * 0.05 + 0.001).astype(np.float32)
    scales.reshape(-1)[0] = 0.0123456  # x * (1/s) moved ~0.25% of these ties by one code on PoCL
    zps = RNG.integers(lo, hi, shape).astype(dt)
    data = _qdq_model(codes, per_axis, scales, zps)
    cpu, ocl = _sessions(data)
    _on_device(ocl, "QuantizeLinear", "DequantizeLinear")
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for _ in range(2):
        x = _near_ties((3, 16, 256), float(scales.reshape(-1)[0]))
        want, got, ort_out = cpu.run(None, {"x": x}), ocl.run(None, {"x": x}), ref.run(None, {"x": x})
        for w, g, o in zip(want, got, ort_out):
            assert g.dtype == w.dtype
            np.testing.assert_array_equal(g, w)
            np.testing.assert_array_equal(g, o)


def test_a_dequantize_of_constant_codes_folds_into_the_gemms_weight(opencl):
    """DequantizeLinear of constant per-channel int8 weights (and an int32 bias) is computed once at
    planning: the MatMul packs it as a float32 weight; no launch dequantizes it. Same bits as the
    CPU EP, whose own DequantizeLinear computes it per run (the optimizer, which folds such nodes
    itself, off); a dequantized constant that is also a partition output runs in a kernel instead:
    the same values."""
    w = RNG.integers(-127, 127, (32, 24)).astype(np.int8)
    consts = {"w": w, "ws": (RNG.random(24) * 0.01).astype(np.float32), "wz": np.zeros(24, np.int8),
              "b": RNG.integers(-5000, 5000, 24).astype(np.int32), "bs": np.array(1e-4, np.float32)}
    nodes = [helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=1),
             helper.make_node("DequantizeLinear", ["b", "bs"], ["bd"]),
             helper.make_node("MatMul", ["x", "wd"], ["h"]),
             helper.make_node("Add", ["h", "bd"], ["y"])]
    outs = [helper.make_tensor_value_info("y", T.FLOAT, None)]
    for extra in ([], [helper.make_tensor_value_info("wd", T.FLOAT, None)]):
        data = _model(nodes, [helper.make_tensor_value_info("x", T.FLOAT, [8, 32])], outs + extra, consts)
        cpu, ocl = _sessions(data, optimize=False)
        _on_device(ocl, "DequantizeLinear", "MatMul")
        x = RNG.standard_normal((8, 32)).astype(np.float32)
        for want, got in zip(cpu.run(None, {"x": x}), ocl.run(None, {"x": x})):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        if extra:
            np.testing.assert_array_equal(ocl.run(["wd"], {"x": x})[0], cpu.run(["wd"], {"x": x})[0])
        else:
            (plan,) = ocl.eps[EP].compiled_plans
            assert "DequantizeLinear" in plan.op_types and plan.launches_per_run <= 2, plan.launches_per_run


def _dynamic_model() -> bytes:
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "ys", "yz"])]
    return _model(nodes, [helper.make_tensor_value_info("x", T.FLOAT, [4, 200])],
                  [helper.make_tensor_value_info("y", T.UINT8, None), helper.make_tensor_value_info("ys", T.FLOAT, None),
                   helper.make_tensor_value_info("yz", T.UINT8, None)], {}, opset=11)


@pytest.mark.parametrize("case", ["random", "positive", "negative", "zeros", "nan", "ties"])
def test_dynamic_quantize_linear_gives_the_cpu_eps_bits(opencl, case):
    """Scale, zero point and codes equal to the CPU EP's (onnxruntime's GetQuantizationParameter):
    ranges widened to 0, NaNs left out of the range and coded 0, a zero range scaled by 1."""
    x = (RNG.standard_normal((4, 200)) * 3).astype(np.float32)
    if case == "positive":
        x = np.abs(x) + 1
    elif case == "negative":
        x = -np.abs(x) - 1
    elif case == "zeros":
        x[:] = 0
    elif case == "nan":
        x[0, :5] = np.nan
    elif case == "ties":
        x = ((RNG.integers(-100, 100, x.shape) + 0.5) * (6.0 / 255)).astype(np.float32)
        x[0, 0], x[0, 1] = -3.0, 3.0
    cpu, ocl = _sessions(_dynamic_model())
    _on_device(ocl, "DynamicQuantizeLinear")
    ref = ort.InferenceSession(_dynamic_model(), providers=["CPUExecutionProvider"])
    for want, got, o in zip(cpu.run(None, {"x": x}), ocl.run(None, {"x": x}), ref.run(None, {"x": x})):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got, o)


def _qlinear_matmul_model(k: int, per_column: bool, b_const: bool = True) -> tuple[bytes, dict]:
    n = 24
    consts = {"as": np.array(0.02, np.float32), "az": np.array(131, np.uint8),
              "bs": (RNG.random(n) * 0.01 + 1e-3).astype(np.float32) if per_column else np.array(0.004, np.float32),
              "bz": RNG.integers(-3, 3, n).astype(np.int8) if per_column else np.array(2, np.int8),
              "ys": np.array(0.09, np.float32), "yz": np.array(120, np.uint8)}
    b = RNG.integers(-128, 127, (k, n)).astype(np.int8)
    inputs = [helper.make_tensor_value_info("a", T.UINT8, [2, 5, k])]
    if b_const:
        consts["b"] = b
    else:
        inputs.append(helper.make_tensor_value_info("b", T.INT8, [k, n]))
    nodes = [helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])]
    feeds = {"a": RNG.integers(0, 256, (2, 5, k)).astype(np.uint8)}
    if not b_const:
        feeds["b"] = b
    return _model(nodes, inputs, [helper.make_tensor_value_info("y", T.UINT8, None)], consts), feeds


@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("b_const", [True, False])
def test_qlinear_matmul_gives_the_cpu_eps_codes(opencl, per_column, b_const):
    """Exact integer sums in float32 (K * 255^2 < 2^24), the CPU EP's combined scale, rounding and
    saturation: the same codes as the CPU EP and onnxruntime."""
    data, feeds = _qlinear_matmul_model(64, per_column, b_const)
    cpu, ocl = _sessions(data)
    _on_device(ocl, "QLinearMatMul")
    want, got = cpu.run(None, feeds)[0], ocl.run(None, feeds)[0]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)[0])


@pytest.mark.parametrize("codes_out", [False, True])
def test_matmul_integer_to_float_after_dynamic_quantize(opencl, codes_out):
    """DynamicQuantizeLinear -> com.microsoft MatMulIntegerToFloat (the quantize_dynamic form): on the
    device with a_scale and a_zero_point computed at run time, within 1 ulp of the CPU EP (the
    kernel may contract * scale + bias into one fma) and of onnxruntime. The product quantizes x
    itself; where the codes are also an output, the codes kernel runs too: the same codes."""
    k, n = 48, 16
    consts = {"b": RNG.integers(-128, 127, (k, n)).astype(np.int8), "bs": (RNG.random(n) * 0.01).astype(np.float32),
              "bz": np.zeros(n, np.int8), "bias": RNG.standard_normal(n).astype(np.float32)}
    consts["b"] = RNG.integers(0, 255, (k, n)).astype(np.uint8)
    consts["bz"] = RNG.integers(100, 150, n).astype(np.uint8)
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("MatMulIntegerToFloat", ["xq", "b", "xs", "bs", "xz", "bz", "bias"], ["y"],
                              domain="com.microsoft")]
    outs = [helper.make_tensor_value_info("y", T.FLOAT, None)]
    if codes_out:
        outs.append(helper.make_tensor_value_info("xq", T.UINT8, None))
    data = _model(nodes, [helper.make_tensor_value_info("x", T.FLOAT, [3, 7, k])], outs, consts, ms=True)
    cpu, ocl = _sessions(data)
    _on_device(ocl, "DynamicQuantizeLinear", "MatMulIntegerToFloat")
    x = RNG.standard_normal((3, 7, k)).astype(np.float32)
    want, got = cpu.run(None, {"x": x}), ocl.run(None, {"x": x})
    if codes_out:
        np.testing.assert_array_equal(got[1], want[1])
    want, got = want[0], got[0]
    np.testing.assert_allclose(got, want, rtol=2e-7, atol=1e-6)
    o = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, o, rtol=1e-6, atol=1e-5)


def _declined(data: bytes, feeds: dict, op: str, reason: str) -> None:
    cpu, ocl = _sessions(data)
    node = next(n for n in ocl.assigned_nodes() if n.op_type == op)
    assert node.ep_name == "CPUExecutionProvider"
    why = ocl.eps[EP].declined[node.name or node.op_type]
    assert reason in why, why
    for want, got in zip(cpu.run(None, feeds), ocl.run(None, feeds)):
        np.testing.assert_array_equal(got, want)


def test_forms_without_a_kernel_are_declined_with_their_reason(opencl):
    """int16 codes, blocked quantization, a scale fed at run time, a float16 scale and a
    QLinearMatMul whose sums float32 cannot hold exactly run on the CPU EP, with that reason."""
    x = RNG.standard_normal((4, 8)).astype(np.float32)
    xi = helper.make_tensor_value_info("x", T.FLOAT, [4, 8])

    def q(consts, extra_inputs=(), opset=13, **attrs):
        node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], **attrs)
        out = helper.make_tensor_value_info("q", T.INT16 if consts.get("z", np.int8(0)).dtype == np.int16 else T.INT8, None)
        return _model([node], [xi, *extra_inputs], [out], consts, opset=opset)

    _declined(q({"s": np.array(0.1, np.float32), "z": np.array(0, np.int16)}, opset=21), {"x": x}, "QuantizeLinear",
              "int16 codes has no OpenCL kernel")
    _declined(q({"s": np.full((4, 4), 0.1, np.float32), "z": np.zeros((4, 4), np.int8)}, opset=21, axis=1,
                block_size=2), {"x": x}, "QuantizeLinear", "blocked quantization")
    _declined(q({"z": np.array(0, np.int8)}, [helper.make_tensor_value_info("s", T.FLOAT, [])]),
              {"x": x, "s": np.array(0.1, np.float32)}, "QuantizeLinear", "not a constant initializer")
    dq = _model([helper.make_node("DequantizeLinear", ["c", "s", "z"], ["y"])], [helper.make_tensor_value_info("c", T.INT8, [4, 8])],
                [helper.make_tensor_value_info("y", T.FLOAT16, None)],
                {"s": np.array(0.1, np.float16), "z": np.array(3, np.int8)}, opset=19)
    _declined(dq, {"c": RNG.integers(-128, 127, (4, 8)).astype(np.int8)}, "DequantizeLinear", "not float32")
    data, feeds = _qlinear_matmul_model(300, False)
    _declined(data, feeds, "QLinearMatMul", "not exact in float32")


@pytest.mark.parametrize("per_channel", [False, True])
def test_conv_integer_after_dynamic_quantize_gives_the_cpu_eps_accumulators(opencl, per_channel):
    """DynamicQuantizeLinear -> ConvInteger (padded: the padding is x's zero point) -> Cast -> Mul, the
    quantize_dynamic form of a Conv: the int32 accumulators equal the CPU EP's and onnxruntime's; a
    per-channel w_zero_point, which onnxruntime refuses, is declined."""
    m = 6
    consts = {"w": RNG.integers(0, 255, (m, 4, 3, 3)).astype(np.uint8),
              "wz": RNG.integers(100, 150, m).astype(np.uint8) if per_channel else np.array(128, np.uint8)}
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("ConvInteger", ["xq", "w", "xz", "wz"], ["acc"], pads=[1, 1, 1, 1], strides=[1, 2]),
             helper.make_node("Cast", ["acc"], ["accf"], to=T.FLOAT),
             helper.make_node("Mul", ["accf", "xs"], ["y"])]
    data = _model(nodes, [helper.make_tensor_value_info("x", T.FLOAT, [2, 4, 9, 10])],
                  [helper.make_tensor_value_info("acc", T.INT32, None), helper.make_tensor_value_info("y", T.FLOAT, None)],
                  consts, opset=11)
    x = RNG.standard_normal((2, 4, 9, 10)).astype(np.float32)
    if per_channel:  # onnxruntime refuses a per-channel w_zero_point: declined, left to the CPU EP
        _declined(data, {"x": x}, "ConvInteger", "onnxruntime refuses it")
        return
    cpu, ocl = _sessions(data)
    _on_device(ocl, "DynamicQuantizeLinear", "ConvInteger")
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for want, got, o in zip(cpu.run(None, {"x": x}), ocl.run(None, {"x": x}), ref):
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got, o)


@pytest.mark.parametrize("name,least", [("resnet_ts_qdq_pt", 29), ("bert_ts_qdyn", 180), ("gpt2_ts_qdyn", 300),
                                        ("resnet_ts_qdq", 29), ("crnn_ts_qdq_pc", 40), ("crnn_ts_qdyn", 30)])
def test_quantized_corpus_models_run_on_the_device_within_the_corpus_tolerance(opencl, name, least):
    """The corpus's QDQ and dynamically quantized exports: their quantization nodes no longer cut the
    partitions (at least ``least`` nodes on OpenCL, cost rule off), and both stored signatures give
    onnxruntime's outputs within the corpus's OpenCL tolerance."""
    from tests.test_real_models import check_outputs, load

    path, sigs = load(name)
    sess = onnxhal.InferenceSession(path, providers=[(EP, {"cost_rule": "off"}), "CPUExecutionProvider"])
    assert sess.partition_summary.get(EP, 0) >= least, (sess.partition_summary, sess.eps[EP].declined)
    for sig, (feeds, want) in sigs.items():
        check_outputs(sess.run(None, feeds), want, atol=2e-5, what=f"{name} signature {sig}")


def test_a_batched_qlinear_matmul_with_symbolic_dims_is_checked_on_each_shape(opencl):
    """Attention's Q @ K^T as a QDQ export quantizes it: both operands activations, batch and sequence
    symbolic. Claimed on its structure; each concrete shape is checked again (K = sequence: 260 is
    past float32's exact sums, so that signature runs on the host), every result the CPU EP's."""
    consts = {"as": np.array(0.02, np.float32), "az": np.array(128, np.uint8), "bs": np.array(0.01, np.float32),
              "bz": np.array(0, np.int8), "ys": np.array(0.5, np.float32), "yz": np.array(100, np.uint8)}
    nodes = [helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])]
    data = _model(nodes, [helper.make_tensor_value_info("a", T.UINT8, ["B", 2, "S", "S"]),
                          helper.make_tensor_value_info("b", T.INT8, ["B", 2, "S", 8])],
                  [helper.make_tensor_value_info("y", T.UINT8, None)], consts)
    cpu, ocl = _sessions(data)
    _on_device(ocl, "QLinearMatMul")
    for b, s in ((2, 12), (1, 5), (1, 260)):
        feeds = {"a": RNG.integers(0, 256, (b, 2, s, s)).astype(np.uint8),
                 "b": RNG.integers(-128, 128, (b, 2, s, 8)).astype(np.int8)}
        np.testing.assert_array_equal(ocl.run(None, feeds)[0], cpu.run(None, feeds)[0])
    (info,) = ocl.eps[EP].dynamic_partitions.values()
    assert info.stats.host_runs == 1 and "not exact in float32" in str(info.stats.host_reasons), info.stats
