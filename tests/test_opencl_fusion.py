"""The OpenCL EP's fusion rules (runtime/providers/opencl/fusion_rules.py): each one turned off by the
provider option ``disable_fusions`` gives the unfused plan, with more launches and the same outputs;
onnxruntime's CPU EP judges both on random inputs."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("pyopencl")

import onnxhal  # noqa: E402
from onnxhal.hal.errors import InvalidArgument  # noqa: E402
from tests.opencl_support import require_opencl  # noqa: E402

OPENCL_INDEX = require_opencl(module_level=True)
RNG = np.random.default_rng(47)


@pytest.fixture
def opencl(register):
    register("onnxhal.runtime.providers.opencl", "opencl")


def _model(nodes, inputs, outputs, weights) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
                              [numpy_helper.from_array(w, n) for n, w in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def _weight(*shape: int) -> np.ndarray:
    return (RNG.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)


def _compare(model: onnx.ModelProto, feeds: dict, rule: str, rtol: float = 1e-5, atol: float = 1e-5
             ) -> tuple[int, int]:
    """Launches per run with every rule and with ``rule`` off; both runs' outputs against onnxruntime."""
    data = model.SerializeToString()
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    launches = []
    for disabled in ("", rule):
        sess = onnxhal.InferenceSession(data, providers=[("OpenCLExecutionProvider", {"disable_fusions": disabled}),
                                                         "CPUExecutionProvider"])
        assert set(sess.partition_summary) == {"OpenCLExecutionProvider"}, sess.partition_summary
        for got, ref in zip(sess.run(None, feeds), want):
            np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol, err_msg=f"disable_fusions={disabled!r}")
        launches.append(sum(p.launches_per_run for p in sess.eps["OpenCLExecutionProvider"].compiled_plans))
    return launches[0], launches[1]


def test_a_residual_add_after_a_matmul_is_its_epilogue(opencl):
    # x -> MatMul -> (+ bias) -> + x: the bias and the residual in the GEMM's epilogue, one launch;
    # then LayerNorm-free FFN tail: Relu(h @ w2 + b2) + y, whose Add comes after an activation and stays.
    n, k = 24, 40
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Add", ["x", "hb"], ["y"]),
             helper.make_node("MatMul", ["y", "w2"], ["g"]), helper.make_node("Add", ["g", "y"], ["z"]),
             helper.make_node("MatMul", ["z", "w3"], ["u"]), helper.make_node("Relu", ["u"], ["r"]),
             helper.make_node("Add", ["r", "z"], ["out"])]
    weights = {"w1": _weight(k, k), "b1": _weight(k), "w2": _weight(k, k), "w3": _weight(k, k)}
    model = _model(nodes, [("x", [2, n, k])], ["out", "y"], weights)
    feeds = {"x": RNG.standard_normal((2, n, k)).astype(np.float32)}
    fused, unfused = _compare(model, feeds, "gemm_residual")
    assert (fused, unfused) == (4, 6)


def test_an_unknown_rule_is_an_error_naming_the_rules(opencl):
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [("x", [4])], ["y"], {})
    with pytest.raises(InvalidArgument, match=r"disable_fusions='tiling'.*unknown rule.*'attention'"):
        onnxhal.InferenceSession(model.SerializeToString(),
                                 providers=[("OpenCLExecutionProvider", {"disable_fusions": "tiling"})])
