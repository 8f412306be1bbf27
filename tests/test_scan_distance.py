"""Scan whose body is skl2onnx's pairwise distance (k-NN's ``onnx_cdist``): the CPU kernel runs it
for all steps at once. Against onnxruntime and numpy, for the body's variants, chunked steps and
float64; a body of another form and a body whose declared shapes the input breaks still take the
step-by-step run (and its error)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnxhal
from onnxhal.hal.errors import OrtError
from onnxhal.runtime.providers.cpu.kernels import control_flow


def _model(elem: int = TensorProto.FLOAT, width: int | str = 4, reduce: str = "ReduceSumSquare",
           swap: bool = False) -> onnx.ModelProto:
    """Scan(X [N, D] state, C [T, D] scanned) -> (X, distances [T, N]), the body as skl2onnx writes it."""
    sub_inputs = ["next", "next_in"] if swap else ["next_in", "next"]
    body = helper.make_graph(
        [helper.make_node("Identity", ["next_in"], ["next_out"]),
         helper.make_node("Sub", sub_inputs, ["diff"]),
         helper.make_node(reduce, ["diff"], ["reduced"], axes=[1], keepdims=0),
         helper.make_node("Identity", ["reduced"], ["scan_out"])],
        "cdist",
        [helper.make_tensor_value_info("next_in", elem, [None, width]),
         helper.make_tensor_value_info("next", elem, [None])],
        [helper.make_tensor_value_info("next_out", elem, [None, None]),
         helper.make_tensor_value_info("scan_out", elem, [None])])
    graph = helper.make_graph(
        [helper.make_node("Scan", ["X", "C"], ["X_out", "D"], body=body, num_scan_inputs=1)], "knn",
        [helper.make_tensor_value_info("X", elem, [None, None]), helper.make_tensor_value_info("C", elem, [None, None])],
        [helper.make_tensor_value_info("X_out", elem, None), helper.make_tensor_value_info("D", elem, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    model.ir_version = 10  # onnxruntime 1.32 refuses the IR onnx 1.23 writes
    return model


def _run(model: onnx.ModelProto, x: np.ndarray, c: np.ndarray) -> tuple[list, list, object]:
    data = model.SerializeToString()
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"X": x, "C": c})
    sess = onnxhal.InferenceSession(data, providers=["CPUExecutionProvider"])
    got = sess.run(None, {"X": x, "C": c})
    scan = [st for st in sess.plan.generated.line_to_step.values() if st.node is not None and st.node.op_type == "Scan"]
    return want, got, scan[0].fn.__self__


@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pairwise_distance_scan(swap, dtype):
    rng = np.random.default_rng(7)
    elem = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE
    x = rng.standard_normal((16, 4)).astype(dtype)
    c = np.concatenate([rng.standard_normal((40, 4)), x[:3]]).astype(dtype)  # rows of X among C: distance 0
    want, got, kernel = _run(_model(elem, swap=swap), x, c)
    assert kernel.distance is not None  # the one-pass form
    np.testing.assert_array_equal(got[0], x)
    assert got[1].dtype == dtype and got[1].shape == (len(c), len(x))
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[1], ((x[None, :, :] - c[:, None, :]) ** 2).sum(axis=2), rtol=1e-5, atol=1e-5)
    assert (got[1][40 + np.arange(3), np.arange(3)] == 0).all()


def test_pairwise_distance_scan_in_chunks(monkeypatch):
    monkeypatch.setattr(control_flow, "_DISTANCE_CELLS", 50)  # a few steps a chunk
    rng = np.random.default_rng(8)
    x, c = rng.standard_normal((5, 4)).astype(np.float32), rng.standard_normal((23, 4)).astype(np.float32)
    want, got, kernel = _run(_model(), x, c)
    assert kernel.distance is not None
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-5)


def test_other_bodies_run_step_by_step():
    rng = np.random.default_rng(9)
    x, c = rng.standard_normal((6, 4)).astype(np.float32), rng.standard_normal((9, 4)).astype(np.float32)
    want, got, kernel = _run(_model(reduce="ReduceL2"), x, c)  # a distance, not its square
    assert kernel.distance is None
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-5)


def test_declared_shapes_still_checked():
    """The body declares rows of 4: rows of 3 are refused, as by the step-by-step run."""
    rng = np.random.default_rng(10)
    x, c = rng.standard_normal((6, 3)).astype(np.float32), rng.standard_normal((9, 3)).astype(np.float32)
    sess = onnxhal.InferenceSession(_model(width=4).SerializeToString(), providers=["CPUExecutionProvider"])
    with pytest.raises(OrtError, match="declared"):
        sess.run(None, {"X": x, "C": c})
    # an empty scan input has no steps: the step-by-step run's empty output
    got = sess.run(None, {"X": rng.standard_normal((6, 4)).astype(np.float32), "C": np.zeros((0, 4), np.float32)})
    assert got[1].shape[0] == 0
