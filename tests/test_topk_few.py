"""TopK of a few along the last axis (k <= n / 4: the k-th value by partition, then a small stable
sort) against onnxruntime: ties at and around the k-th value, NaN, integers, leading axes."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnxhal

_ELEM = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
         np.dtype(np.int64): TensorProto.INT64, np.dtype(np.int32): TensorProto.INT32}


def _model(dtype: np.dtype, rank: int, largest: int) -> bytes:
    node = helper.make_node("TopK", ["X", "K"], ["V", "I"], axis=-1, largest=largest, sorted=1)
    graph = helper.make_graph([node], "topk", [helper.make_tensor_value_info("X", _ELEM[dtype], [None] * rank),
                                               helper.make_tensor_value_info("K", TensorProto.INT64, [1])],
                              [helper.make_tensor_value_info("V", _ELEM[dtype], None),
                               helper.make_tensor_value_info("I", TensorProto.INT64, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 10  # onnxruntime 1.32 refuses the IR onnx 1.23 writes
    return model.SerializeToString()


@pytest.mark.parametrize("seed", range(4))
def test_topk_few_of_many(seed):
    rng = np.random.default_rng(seed)
    for trial in range(40):
        n = int(rng.integers(4, 80))
        k = int(rng.integers(1, n // 4 + 1))
        shape = tuple(int(d) for d in rng.integers(1, 4, int(rng.integers(0, 3)))) + (n,)
        kind = trial % 4
        if kind == 0:
            x = rng.standard_normal(shape).astype(np.float32)
        elif kind == 1:  # many ties
            x = rng.integers(0, 4, shape).astype(np.float64)
        else:
            x = rng.integers(-3, 3, shape).astype(np.int64 if kind == 2 else np.int32)
        if kind < 2 and trial % 3 == 0:
            x[..., int(rng.integers(0, n))] = np.nan
        for largest in (0, 1):
            data = _model(x.dtype, x.ndim, largest)
            feeds = {"X": x, "K": np.array([k], np.int64)}
            want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
            got = onnxhal.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
            what = f"seed {seed} trial {trial} {x.dtype} {shape} k={k} largest={largest}"
            np.testing.assert_array_equal(got[0], want[0], err_msg=what)
            np.testing.assert_array_equal(got[1], want[1], err_msg=what)
            assert got[0].dtype == want[0].dtype and got[1].dtype == np.int64, what
