"""The OpenCL EP's rule ``conv_dead_taps`` (runtime/providers/opencl/fusion_rules.py): a Conv with
constant weights whose end taps read only padding runs with the weight cut to its live taps (the
CPU EP's ``dead_taps.trim``). Held to the plan with the rule off and to onnxruntime, on DeepLabV3's
ASPP geometry, taps dying on one axis, strides, groups and depthwise (the direct kernel), 1-D,
a residual with Relu, and a Conv where no tap dies (the plan keeps the weight)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("pyopencl")

import onnxhal  # noqa: E402
from tests.opencl_support import require_opencl  # noqa: E402

OPENCL_INDEX = require_opencl(module_level=True)
RULE = "conv_dead_taps"


def _model(x_shape, w_shape, residual: bool, attrs: dict) -> tuple[onnx.ModelProto, dict]:
    rng = np.random.default_rng(sum(x_shape) + sum(w_shape))
    w = (rng.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))).astype(np.float32)
    b = rng.standard_normal(w_shape[0]).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs)]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))]
    feeds = {"x": rng.standard_normal(x_shape).astype(np.float32)}
    last = "c"
    if residual:
        probe = onnxhal.InferenceSession(helper.make_model(
            helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("c", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]),
            opset_imports=[helper.make_opsetid("", 17)], ir_version=10).SerializeToString(),
            providers=["CPUExecutionProvider"])
        dims = list(probe.run(None, feeds)[0].shape)
        nodes += [helper.make_node("Add", ["c", "z"], ["s"]), helper.make_node("Relu", ["s"], ["r"])]
        inputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, dims))
        feeds["z"] = rng.standard_normal(dims).astype(np.float32)
        last = "r"
    nodes.append(helper.make_node("Identity", [last], ["y"]))
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), feeds


def _run(model: onnx.ModelProto, feeds: dict, disabled: str) -> tuple[np.ndarray, list]:
    sess = onnxhal.InferenceSession(model.SerializeToString(),
                                    providers=[("OpenCLExecutionProvider", {"disable_fusions": disabled}),
                                               "CPUExecutionProvider"])
    assert set(sess.partition_summary) == {"OpenCLExecutionProvider"}, sess.partition_summary
    (y,) = sess.run(None, feeds)
    cut = [v.shape for p in sess.eps["OpenCLExecutionProvider"].compiled_plans for k, v in p.constants.items()
           if "conv_live_taps" in k]
    return y, cut


CASES = [  # x shape, w shape, attributes, the cut weight's shape (None: nothing cut)
    ((2, 16, 8, 8), (8, 16, 3, 3), dict(dilations=[36, 36], pads=[36] * 4), (8, 16, 1, 1)),  # ASPP
    ((1, 16, 8, 8), (32, 16, 3, 3), dict(dilations=[12, 12], pads=[12] * 4), (32, 16, 1, 1)),
    ((1, 4, 2, 9), (8, 4, 5, 3), dict(pads=[2, 1, 2, 1]), (8, 4, 3, 3)),  # one axis
    ((1, 3, 5, 5), (8, 3, 7, 7), dict(strides=[2, 2], dilations=[3, 3], pads=[9] * 4), (8, 3, 3, 3)),
    ((1, 8, 5, 5), (8, 4, 5, 5), dict(group=2, dilations=[3, 3], pads=[6] * 4), (8, 4, 3, 3)),  # Mg 4
    ((1, 6, 6, 6), (6, 1, 3, 3), dict(group=6, dilations=[6, 6], pads=[6] * 4), (6, 1, 1, 1)),  # conv_direct
    ((2, 3, 6), (8, 3, 5), dict(dilations=[4], pads=[8, 8]), (8, 3, 3)),  # 1-D
    ((1, 3, 4, 6), (8, 3, 5, 5), dict(dilations=[2, 1], pads=[6, 0, 1, 3]), (8, 3, 3, 5)),  # uneven pads after the cut
    ((1, 2, 2, 2), (8, 2, 3, 3), dict(strides=[5, 5], dilations=[2, 2], pads=[3, 3, 5, 5]), (8, 2, 2, 2)),
    ((1, 8, 12, 12), (16, 8, 3, 3), dict(pads=[1] * 4), None),  # every tap reads the input
]


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[0])) + "-" + "x".join(map(str, c[1])))
def test_conv_dead_taps_against_every_tap_and_onnxruntime(opencl, case, residual):
    x_shape, w_shape, attrs, cut = case
    model, feeds = _model(x_shape, w_shape, residual, attrs)
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    on, cut_on = _run(model, feeds, "")
    off, cut_off = _run(model, feeds, RULE)
    assert cut_on == ([cut] if cut else []) and cut_off == []
    np.testing.assert_allclose(on, want, rtol=1e-4, atol=1e-4, err_msg="rule on")
    np.testing.assert_allclose(off, want, rtol=1e-4, atol=1e-4, err_msg="rule off")
    np.testing.assert_allclose(on, off, rtol=1e-5, atol=1e-5, err_msg="rule on against every tap")
