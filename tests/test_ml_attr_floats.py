"""``ml_common.attr_floats``: the float attributes the SVM and linear kernels read (from the
attribute's protobuf field where it is long) equal ``np.asarray`` of the parsed list, and a missing
required one is a typed error naming it."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxhal
from onnxhal.hal import Graph
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels.ml_common import attr_floats


def _node(**attrs):
    proto = helper.make_node("SVMRegressor", ["x"], ["y"], domain="ai.onnx.ml", **attrs)
    graph = helper.make_graph([proto], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 1])])
    return Graph.from_proto(graph, {"": 17, "ai.onnx.ml": 3}).nodes[0]


@pytest.mark.parametrize("count", [1, 5, 63, 64, 65, 1000])
def test_attr_floats_equal_the_parsed_list(count):
    values = np.random.default_rng(count).standard_normal(count).astype(np.float32).tolist()
    node = _node(coefficients=values, kernel_params=[0.5, 0.0, 3.0])
    got = attr_floats(node, "coefficients", [])
    assert got.dtype == np.float32 and got.ndim == 1
    np.testing.assert_array_equal(got, np.asarray(node.attr("coefficients", []), np.float32).reshape(-1))


def test_attr_floats_default_and_missing():
    node = _node(kernel_params=[0.5, 0.0, 3.0])
    np.testing.assert_array_equal(attr_floats(node, "coefficients", [1.5]), np.array([1.5], np.float32))
    with pytest.raises(InvalidArgument, match="'coefficients' is missing"):
        attr_floats(node, "coefficients")


@pytest.mark.parametrize("op, attrs", [("SVMRegressor", {"n_supports": 0, "kernel_type": "LINEAR"}),
                                       ("LinearRegressor", {"targets": 1})])
def test_missing_coefficients_fail_at_creation_with_a_typed_error(op, attrs):
    proto = helper.make_node(op, ["x"], ["y"], domain="ai.onnx.ml", **attrs)
    graph = helper.make_graph([proto], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    with pytest.raises(InvalidArgument, match=f"{op} node .*'coefficients' is missing"):
        onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
