"""fp16 that holds on the simulated NPUs: every op an fp16 profile claims agrees with the CPU EP on
realistic values; reduction results (statistics) stay float32 as an NPU compiler keeps them; a value
fp16 storage overflows is reported, once. Runs on whichever backend the devices have (OpenCL, or
the host)."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxhal
from onnxhal.decline_summary import decline_lines
from tests.conftest import simulated_or_skip

RNG = np.random.default_rng(11)


def _x(*shape, scale=1.0, positive=False):
    a = RNG.standard_normal(shape).astype(np.float32) * scale
    return np.abs(a) + 0.25 if positive else a


def _case(op: str):
    """(node, inputs {name: array}, initializers {name: array}, extra attrs) for a single-op model."""
    x = _x(2, 8, 6, 6)
    m = _x(4, 16)
    cases = {
        "Conv": ({"x": x}, {"w": _x(8, 8, 3, 3, scale=0.2), "b": _x(8, scale=0.1)}, {"pads": [1, 1, 1, 1]}),
        "Gemm": ({"a": m}, {"b": _x(16, 12, scale=0.3), "c": _x(12, scale=0.1)}, {}),
        "MatMul": ({"a": m}, {"b": _x(16, 12, scale=0.3)}, {}),
        "Add": ({"a": m, "b": _x(4, 16)}, {}, {}), "Sub": ({"a": m, "b": _x(4, 16)}, {}, {}),
        "Mul": ({"a": m, "b": _x(4, 16)}, {}, {}), "Div": ({"a": m, "b": _x(4, 16, positive=True)}, {}, {}),
        "Pow": ({"a": _x(4, 16, positive=True)}, {"b": np.array(2.0, np.float32)}, {}),
        "Sqrt": ({"a": _x(4, 16, positive=True)}, {}, {}),
        "Clip": ({"a": m}, {"lo": np.array(-0.5, np.float32), "hi": np.array(0.5, np.float32)}, {}),
        "LeakyRelu": ({"a": m}, {}, {"alpha": 0.1}), "HardSigmoid": ({"a": m}, {}, {}),
        "HardSwish": ({"a": m}, {}, {}), "Relu": ({"a": m}, {}, {}), "Sigmoid": ({"a": m}, {}, {}),
        "Tanh": ({"a": m}, {}, {}), "Softmax": ({"a": m * 3}, {}, {"axis": -1}),
        "MaxPool": ({"x": x}, {}, {"kernel_shape": [2, 2], "strides": [2, 2]}),
        "AveragePool": ({"x": x}, {}, {"kernel_shape": [2, 2], "strides": [2, 2]}),
        "GlobalAveragePool": ({"x": x}, {}, {}),
        "BatchNormalization": ({"x": x}, {"s": _x(8, positive=True), "bb": _x(8), "mu": _x(8, scale=0.1),
                                          "var": _x(8, positive=True)}, {}),
        "LayerNormalization": ({"a": m * 4 + 2}, {"g": _x(16, positive=True), "be": _x(16, scale=0.1)}, {"axis": -1}),
        "ReduceMean": ({"a": m}, {}, {"axes": [-1], "keepdims": 1}),  # opset 17: axes is an attribute
        "Transpose": ({"a": m}, {}, {"perm": [1, 0]}),
        "Concat": ({"a": m, "b": _x(4, 16)}, {}, {"axis": 1}),
        "Reshape": ({"a": m}, {"s": np.array([8, 8], np.int64)}, {}),
        "Flatten": ({"x": x}, {}, {"axis": 1}),
        "Unsqueeze": ({"a": m}, {"axes": np.array([0], np.int64)}, {}),
        "Squeeze": ({"a": _x(4, 1, 16)}, {"axes": np.array([1], np.int64)}, {}),
    }
    inputs, inits, attrs = cases[op]
    return helper.make_node(op, [*inputs, *inits], ["y"], **attrs), inputs, inits


FP16_OPS = ["Add", "AveragePool", "BatchNormalization", "Clip", "Concat", "Conv", "Div", "Flatten", "Gemm",
            "GlobalAveragePool", "HardSigmoid", "HardSwish", "LayerNormalization", "LeakyRelu", "MatMul", "MaxPool",
            "Mul", "Pow", "ReduceMean", "Relu", "Reshape", "Sigmoid", "Softmax", "Sqrt", "Squeeze", "Sub", "Tanh",
            "Transpose", "Unsqueeze"]
FP16_PROFILES = "generic-npu,mobile-npu"
NHWC_OPS = {"Conv", "MaxPool", "AveragePool", "GlobalAveragePool"}


def ep_layout(device) -> str:
    return device.device.metadata.get("preferred_layout", "NCHW")


def _model(node, inputs: dict, inits: dict) -> bytes:
    graph = helper.make_graph([node], node.op_type,
                              [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape) for k, v in inputs.items()],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return onnx.shape_inference.infer_shapes(model).SerializeToString()


def _session(device, model: bytes) -> onnxhal.InferenceSession:
    so = onnxhal.SessionOptions()
    so.add_provider_for_devices([device])
    return onnxhal.InferenceSession(model, so)


def test_the_op_list_covers_every_fp16_profile_op():
    from onnxhal.simulators.profiles import parse_profile_list

    profiles = parse_profile_list(FP16_PROFILES)
    assert all(p.compute_dtype == "float16" for p in profiles)
    claimed = {op for p in profiles for op in p.ops}
    assert claimed <= set(FP16_OPS), sorted(claimed - set(FP16_OPS))


@pytest.mark.parametrize("op", FP16_OPS)
def test_each_op_an_fp16_profile_claims_agrees_with_the_cpu_ep(op):
    from onnxhal.simulators.profiles import parse_profile_list

    node, inputs, inits = _case(op)
    model = _model(node, inputs, inits)
    want = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, inputs)[0]
    ops = {p.name: set(p.ops) for p in parse_profile_list(FP16_PROFILES)}
    with simulated_or_skip(FP16_PROFILES, by="profile") as sims:
        for name, device in sims.items():
            if op not in ops[name]:
                continue
            sess = _session(device, model)
            on_device = sess.partition_summary.get(device.ep_name, 0)
            # A lone view computes nothing: never worth a partition of its own.
            if op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze"):
                assert on_device == 0, (op, name)
            else:  # NHWC profiles add the two Transposes at the edges of the NHWC region
                assert on_device == (3 if ep_layout(device) == "NHWC" and op in NHWC_OPS else 1), (op, name)
            ep = sess.eps[device.ep_name]
            got = sess.run(None, inputs)[0]
            np.testing.assert_allclose(got, want, rtol=ep.profile.rtol, atol=ep.profile.atol, err_msg=f"{op} on {name}")


def _rms_normalize() -> bytes:
    """y = x / sqrt(ReduceSum(x * x)): the sum of squares of realistic activations passes 65504,
    and ReduceSum is not on generic-npu, so it reaches the NPU from the CPU EP (Magika v3.3's
    LayerNorm_1 reaches 1.3e5 the same way)."""
    nodes = [helper.make_node("Mul", ["x", "x"], ["sq"]),
             helper.make_node("ReduceSum", ["sq", "axes"], ["ss"], keepdims=1),
             helper.make_node("Sqrt", ["ss"], ["norm"]),
             helper.make_node("Div", ["x", "norm"], ["y"])]
    graph = helper.make_graph(nodes, "rms", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 512])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 512])],
                              [numpy_helper.from_array(np.array([-1], np.int64), "axes")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_reduction_results_stay_float32_on_an_fp16_npu():
    model = _rms_normalize()
    x = _x(4, 512, scale=16.0)
    assert float(np.max(np.sum(x * x, axis=-1))) > 65504  # the statistic fp16 cannot hold
    want = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    with simulated_or_skip("generic-npu") as sims:
        sess = _session(sims["VirtualNpuExecutionProvider"], model)
        assert sess.partition_summary == {"VirtualNpuExecutionProvider": 3, "CPUExecutionProvider": 1}
        got = sess.run(None, {"x": x})[0]
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-3)  # not zeros: sqrt(inf) was
        assert not sess.eps["VirtualNpuExecutionProvider"].fp16_overflows


def test_an_fp16_overflow_is_reported_once(caplog):
    # computed at run time: 3e4 * 4 leaves the partition as 1.2e5, which fp16 storage makes inf
    scale = numpy_helper.from_array(np.array(4.0, np.float32), "s")
    graph = helper.make_graph([helper.make_node("Mul", ["x", "s"], ["y"]), helper.make_node("Relu", ["y"], ["z"])],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [4, 8])], [scale])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    with simulated_or_skip("generic-npu") as sims, caplog.at_level(logging.WARNING):
        sess = _session(sims["VirtualNpuExecutionProvider"], model)
        x = np.full((4, 8), 3e4, np.float32)
        for _ in range(3):
            z = sess.run(None, {"x": x})[0]
        assert np.isinf(z).all()  # what fp16 storage really gives
    reports = [r.getMessage() for r in caplog.records if "exceeds float16's range" in r.getMessage()]
    assert len(reports) == 1 and "generic-npu" in reports[0], reports


def _masked_softmax(additive: bool) -> bytes:
    """Attention scores masked with float32's lowest value, then Softmax: as T5 masks them
    (scores + (1 - mask) * lowest, every node on the device) or as DeBERTa-v2 does
    (Where(mask, lowest, scores): on the host where the profile has no float Where)."""
    lowest = numpy_helper.from_array(np.array(np.finfo(np.float32).min, np.float32), "lowest")
    one = numpy_helper.from_array(np.array(1.0, np.float32), "one")
    if additive:
        nodes = [helper.make_node("Sub", ["one", "mask"], ["keep_out"]),
                 helper.make_node("Mul", ["keep_out", "lowest"], ["bias"]),
                 helper.make_node("Add", ["scores", "bias"], ["masked"])]
        mask = helper.make_tensor_value_info("mask", TensorProto.FLOAT, [4, 8])
    else:
        nodes = [helper.make_node("Where", ["mask", "lowest", "scores"], ["masked"])]
        mask = helper.make_tensor_value_info("mask", TensorProto.BOOL, [4, 8])
    nodes.append(helper.make_node("Softmax", ["masked"], ["p"], axis=-1))
    graph = helper.make_graph(nodes, "masked", [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [4, 8]), mask],
                              [helper.make_tensor_value_info("p", TensorProto.FLOAT, [4, 8])], [lowest, one])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


@pytest.mark.parametrize("profile", ["generic-npu", "mobile-npu", "qualcomm-htp"])
def test_weights_beyond_the_fp16_range_are_clamped_as_device_compilers_clamp_them(profile, caplog):
    # stored as -inf, float32's lowest made (1 - mask) * lowest NaN wherever the mask keeps a score
    model = _masked_softmax(additive=True)
    mask = np.ones((4, 8), np.float32)
    mask[:, 5:] = 0  # the last three positions of each row masked
    feeds = {"scores": _x(4, 8), "mask": mask}
    want = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    with simulated_or_skip(profile) as sims, caplog.at_level(logging.WARNING):
        ep = next(iter(sims))
        sess = _session(sims[ep], model)
        assert sess.partition_summary == {ep: 4}, sess.partition_summary  # every node on the device
        got = sess.run(None, feeds)[0]
        assert np.isfinite(got).all(), got
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-3)
        assert sess.eps[ep].fp16_clamped == {"lowest"}
    reports = [r.getMessage() for r in caplog.records if "were clamped" in r.getMessage()]
    assert len(reports) == 1 and "'lowest'" in reports[0], reports


def test_a_value_beyond_the_fp16_range_made_on_the_device_is_clamped_as_a_weight(caplog):
    """qualcomm-htp lists Where (the OpenCL rule typed_values computes it with a bool condition):
    the mask and the Softmax both run on the device, the lowest clamped to fp16's as a weight, and a
    fully masked row comes out uniform, as onnxruntime's."""
    model = _masked_softmax(additive=False)
    mask = np.zeros((4, 8), bool)
    mask[1] = True
    feeds = {"scores": _x(4, 8), "mask": mask}
    want = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    with simulated_or_skip("qualcomm-htp") as sims, caplog.at_level(logging.WARNING):
        ep = next(iter(sims))
        sess = _session(sims[ep], model)
        assert sess.partition_summary == {ep: 2} and not sess.eps[ep].declined, sess.eps[ep].declined
        got = sess.run(None, feeds)[0]
    assert "weight 'lowest' holds values beyond float16's range" in caplog.text
    np.testing.assert_allclose(got[1], np.full(8, 1 / 8), rtol=1e-3)
    np.testing.assert_allclose(got, want, atol=1e-3)


@pytest.mark.parametrize("profile", ["generic-npu", "mobile-npu"])
def test_a_value_beyond_the_fp16_range_made_off_the_device_is_declined_with_the_reason(profile):
    # DeBERTa-v2 on the fp16 NPUs: the Where ran on the host and its float32 lowest reached the
    # NPU's Softmax as -inf; a fully masked row came back NaN where onnxruntime's is uniform
    model = _masked_softmax(additive=False)
    mask = np.zeros((4, 8), bool)
    mask[1] = True          # a fully masked row
    mask[2, :5] = True
    feeds = {"scores": _x(4, 8), "mask": mask}
    want = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    with simulated_or_skip(profile) as sims:
        ep = next(iter(sims))
        sess = _session(sims[ep], model)
        reason = sess.eps[ep].declined.get("Softmax", "")
        assert "beyond the float16 range" in reason and "'lowest'" in reason, sess.eps[ep].declined
        kinds = decline_lines([reason])  # as the sweep and partition reports group it
        assert kinds == ["a value may hold values beyond the float16 range and reaches "
                         f"{profile} from another EP, where float16 storage would make them inf; computed on "
                         "the host in float32: 1 node(s)"], kinds
        got = sess.run(None, feeds)[0]
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("profile", ["intel-npu", "qualcomm-htp"])
def test_a_comparison_of_float_values_is_declined_on_fp16_devices(profile):
    """Tree ensembles as tensors (hummingbird) compare features with thresholds: stored in fp16,
    1.00005 < 1.0001 becomes 1.0 < 1.0 and the sample takes another branch, an error no tolerance
    covers. The comparison stays on the host in float32; the integer arithmetic after it need not."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    thr = numpy_helper.from_array(np.full((4,), 1.0001, np.float32), "thr")
    nodes = [helper.make_node("Less", ["x", "thr"], ["below"]),
             helper.make_node("Cast", ["below"], ["k"], to=TensorProto.INT64),
             helper.make_node("Add", ["k", "k"], ["y"])]
    graph = helper.make_graph(nodes, "tree", [x], [helper.make_tensor_value_info("y", TensorProto.INT64, [2, 4])],
                              [thr])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    feeds = {"x": np.array([[1.00005, 0.5, 2.0, 1.0001], [1.0, 1.00009, 1.0002, -3.0]], np.float32)}
    want = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    with simulated_or_skip(profile) as sims:
        ep = next(iter(sims))
        sess = _session(sims[ep], model)
        reason = sess.eps[ep].declined.get("Less", "")
        assert reason.startswith("decision threshold on an fp16 device: Less compares 'x' in fp16 storage"), \
            sess.eps[ep].declined
        np.testing.assert_array_equal(sess.run(None, feeds)[0], want)


@pytest.mark.parametrize("profile", ["intel-npu", "qualcomm-htp"])
def test_what_an_argmax_picks_from_is_declined_on_fp16_devices(profile):
    """A vector quantizer's nearest code (ArgMin of distances from the whole encoder), a stacked
    classifier's label (ArgMax of probabilities): fp16 storage makes 1.00005 and 1.0001 both 1.0 and
    the pick takes the first, an integer output no tolerance covers (the tenth wave's codec and
    StackingClassifier on the fp16 profiles). Every float value the pick is computed from stays on
    the host; a float output beside it does not."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    one = numpy_helper.from_array(np.ones((3,), np.float32), "one")
    nodes = [helper.make_node("Mul", ["x", "one"], ["m"]), helper.make_node("Relu", ["m"], ["h"]),
             helper.make_node("ArgMax", ["h"], ["k"], axis=1, keepdims=0),
             helper.make_node("Sigmoid", ["x"], ["side"])]
    graph = helper.make_graph(nodes, "pick", [x], [helper.make_tensor_value_info("k", TensorProto.INT64, [2]),
                                                   helper.make_tensor_value_info("side", TensorProto.FLOAT, [2, 3])],
                              [one])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    feeds = {"x": np.array([[1.00005, 1.0001, 0.5], [0.25, 1.0002, 1.0003]], np.float32)}
    want = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    assert want[0].tolist() == [1, 2]
    with simulated_or_skip(profile) as sims:
        ep = next(iter(sims))
        sess = _session(sims[ep], model)
        declined = sess.eps[ep].declined
        assert declined.get("Mul", "").startswith("a pick on an fp16 device: 'ArgMax' picks an index from 'm'"), \
            declined  # two nodes up: the walk over what the pick is computed from
        for op in ("Relu", "ArgMax"):  # the pick and its direct input: decision_reason's own rules
            assert declined.get(op, "").startswith("decision threshold on an fp16 device: ArgMax"), declined
        assert not declined.get("Sigmoid", "").startswith(("a pick", "decision")), declined  # not picked from
        got = sess.run(None, feeds)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_allclose(got[1], want[1], rtol=2e-3)


@pytest.mark.parametrize("read", ["indices", "values"])
def test_a_topk_read_for_its_indices_is_a_pick_on_fp16_devices(read):
    """TopK's indices are a pick as ArgMax's are (a mixture of experts' routing, a detector's top
    boxes): fp16 storage makes 1.00005 and 1.0001 equal and the tie goes to the lower index, so
    what its indices are computed from stays on the host. Read for its values only, TopK keeps
    them sorted and near values swapped by rounding are equal within tolerance: not declined."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    one = numpy_helper.from_array(np.ones((3,), np.float32), "one")
    k = numpy_helper.from_array(np.array([1], np.int64), "k")
    out = "idx" if read == "indices" else "vals"
    nodes = [helper.make_node("Mul", ["x", "one"], ["m"]), helper.make_node("Relu", ["m"], ["h"]),
             helper.make_node("TopK", ["h", "k"], ["vals", "idx"], axis=1)]  # indices unread for "values"
    elem = TensorProto.INT64 if read == "indices" else TensorProto.FLOAT
    graph = helper.make_graph(nodes, "topk", [x], [helper.make_tensor_value_info(out, elem, [2, 1])], [one, k])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()
    feeds = {"x": np.array([[1.00005, 1.0001, 0.5], [0.25, 1.0002, 1.0003]], np.float32)}
    want = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    with simulated_or_skip("intel-npu") as sims:
        ep = next(iter(sims))
        sess = _session(sims[ep], model)
        declined = sess.eps[ep].declined
        picks = [op for op in ("Mul", "Relu", "TopK")
                 if declined.get(op, "").startswith(("a pick on an fp16 device", "decision threshold on an fp16"))]
        if read == "indices":
            assert want.ravel().tolist() == [1, 2]
            assert picks == ["Mul", "Relu", "TopK"], declined
            np.testing.assert_array_equal(sess.run(None, feeds)[0], want)
        else:
            assert picks == [], declined
            np.testing.assert_allclose(sess.run(None, feeds)[0], want, rtol=2e-3)
