"""Models with sparse tensors, side by side with onnxruntime: Constant(sparse_value), sparse graph
outputs, com.microsoft SparseToDenseMatMul on COO and CSR inputs, and what NodeArg shows for them."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxhal

ort = pytest.importorskip("onnxruntime")

VALUES = [1.0, 2.0, 3.0]


def _model(nodes, inputs, outputs, ms: bool = False) -> bytes:
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid("com.microsoft", 1)] if ms else [])
    m = helper.make_model(helper.make_graph(nodes, "sparse", inputs, outputs), opset_imports=opsets)
    m.ir_version = 10  # onnxruntime 1.20 reads up to 10
    return m.SerializeToString()


def _sparse_constant(indices: list[int], dims: list[int]) -> onnx.NodeProto:
    vals = helper.make_tensor("v", TensorProto.FLOAT, [len(VALUES)], VALUES)
    shape = [len(VALUES)] if len(indices) == len(VALUES) else [len(VALUES), len(dims)]
    idx = helper.make_tensor("i", TensorProto.INT64, shape, indices)
    return helper.make_node("Constant", [], ["c"], sparse_value=helper.make_sparse_tensor(vals, idx, dims))


@pytest.mark.parametrize("indices", [[0, 4, 7], [0, 0, 1, 0, 1, 3]], ids=["flat", "coordinates"])
def test_sparse_constant_feeds_a_dense_node(indices):
    model = _model([_sparse_constant(indices, [2, 4]), helper.make_node("Add", ["c", "x"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])])
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    want = ort.InferenceSession(model).run(None, {"x": x})[0]
    np.testing.assert_array_equal(onnxhal.InferenceSession(model).run(None, {"x": x})[0], want)


def test_sparse_graph_output_is_a_sparse_tensor():
    out = helper.make_value_info("c", helper.make_sparse_tensor_type_proto(TensorProto.FLOAT, [2, 4]))
    model = _model([_sparse_constant([0, 4, 7], [2, 4])], [], [out])
    ref_sess, sess = ort.InferenceSession(model), onnxhal.InferenceSession(model)
    ref, got = ref_sess.run(None, {})[0], sess.run(None, {})[0]
    # onnxruntime's NodeArg shows the dense initializer it made of the Constant; onnxhal shows the
    # declared type, which is what run returns (docs/api-parity.md).
    assert (sess.get_outputs()[0].type, ref_sess.get_outputs()[0].type) == ("sparse_tensor(float)", "tensor(float)")
    assert sess.get_outputs()[0].shape == ref_sess.get_outputs()[0].shape == [2, 4]
    assert got.format() == onnxhal.OrtSparseFormat.ORT_SPARSE_COO
    assert got.dense_shape() == ref.dense_shape()
    np.testing.assert_array_equal(got.values(), ref.values())
    np.testing.assert_array_equal(got.get_coo_data().indices(), ref.get_coo_data().indices())


def _matmul_model(alpha: float, trans_a: int, trans_b: int, a_dims, b_dims) -> bytes:
    node = helper.make_node("SparseToDenseMatMul", ["A", "B"], ["Y"], domain="com.microsoft", alpha=alpha,
                            transA=trans_a, transB=trans_b)
    a_in = helper.make_value_info("A", helper.make_sparse_tensor_type_proto(TensorProto.FLOAT, a_dims))
    return _model([node], [a_in, helper.make_tensor_value_info("B", TensorProto.FLOAT, b_dims)],
                  [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [a_dims[0], b_dims[1]])], ms=True)


@pytest.mark.parametrize("fmt", ["coo", "csr"])
@pytest.mark.parametrize("alpha,trans_a,trans_b", [(1.0, 0, 0), (2.5, 1, 0), (0.5, 0, 1)])
def test_sparse_to_dense_matmul_matches_onnxruntime(fmt, alpha, trans_a, trans_b):
    rng = np.random.default_rng(3)
    # Square operands when transposing: onnxruntime's shape inference of this op reads the dims
    # untransposed, and refuses a transposed product of other shapes at load.
    n, k, m = (4, 4, 4) if trans_a or trans_b else (4, 5, 3)
    dense = rng.standard_normal((n, k)).astype(np.float32) * (rng.random((n, k)) < 0.4)
    a_dims = list(dense.shape)
    b = rng.standard_normal((k, m)).astype(np.float32)
    model = _matmul_model(alpha, trans_a, trans_b, a_dims, list(b.shape))
    rows, cols = np.nonzero(dense)

    def feed(mod):
        cpu = mod.OrtDevice.make("cpu", 0)
        if fmt == "coo":
            st = mod.SparseTensor.sparse_coo_from_numpy(a_dims, dense[rows, cols], np.stack([rows, cols], 1).astype(np.int64), cpu)
        else:
            outer = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=a_dims[0]))]).astype(np.int64)
            st = mod.SparseTensor.sparse_csr_from_numpy(a_dims, dense[rows, cols], cols.astype(np.int64), outer, cpu)
        return {"A": mod.OrtValue.ort_value_from_sparse_tensor(st), "B": b}

    want = ort.InferenceSession(model).run(None, feed(ort))[0]
    got = onnxhal.InferenceSession(model).run(None, feed(onnxhal))[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_node_args_of_sparse_unshaped_and_map_values_match_onnxruntime(tmp_path):
    model = _matmul_model(1.0, 0, 0, ["n", 4], [4, 3])
    relu = _model([helper.make_node("Relu", ["a"], ["y"])], [helper.make_tensor_value_info("a", TensorProto.FLOAT, None)],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    for m in (model, relu):
        ref, got = ort.InferenceSession(m), onnxhal.InferenceSession(m)
        for r, g in zip(ref.get_inputs() + ref.get_outputs(), got.get_inputs() + got.get_outputs()):
            assert (g.name, g.type, g.shape) == (r.name, r.type, r.shape)
