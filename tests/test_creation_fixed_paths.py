"""Session creation's per-process shortcuts against the plain paths they stand for: a tensor's
typed field read without ``numpy_helper``'s lookups, the optimizer's pass selection kept per
process, the model path's one ``stat``, and BLAS's thread count set only on a change."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxhal
from onnxhal.hal.errors import InvalidArgument, InvalidGraph, NoSuchFile
from onnxhal.hal.graph import tensor_to_array
from onnxhal.runtime.optimizer import passes
from onnxhal.runtime.providers.cpu.kernels import blas_threads

_EDGES = {
    TensorProto.FLOAT: [1.5, -2.0, 3e38, float("nan"), float("-inf"), 1e-45],
    TensorProto.DOUBLE: [1e300, -1.0, 0.0, 2.5, float("inf"), 5e-324],
    TensorProto.INT64: [2**63 - 1, -(2**63), 0, 1, -1, 7],
    TensorProto.INT32: [2**31 - 1, -(2**31), 0, 1, -1, 7],
    TensorProto.INT8: [127, -128, 0, 1, -1, 7],
    TensorProto.UINT8: [255, 0, 1, 2, 128, 7],
    TensorProto.UINT32: [2**32 - 1, 0, 1, 2, 2**31, 7],
    TensorProto.UINT64: [2**64 - 1, 0, 1, 2, 2**63, 7],
}


@pytest.mark.parametrize("data_type", sorted(_EDGES))
@pytest.mark.parametrize("dims", [[2, 3], [6], [], [0, 3]])
def test_typed_field_read_equals_numpy_helper(data_type: int, dims: list[int]) -> None:
    size = int(np.prod(dims)) if dims else 1
    t = helper.make_tensor("w", data_type, dims, _EDGES[data_type][:size])
    assert not t.HasField("raw_data")
    got, want = tensor_to_array(t, "initializer"), numpy_helper.to_array(t)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_typed_field_shorter_than_dims_is_an_invalid_graph() -> None:
    t = helper.make_tensor("w", TensorProto.FLOAT, [4], [1.0, 2.0, 3.0, 4.0])
    del t.float_data[3]
    with pytest.raises(InvalidGraph, match="'w'.*cannot be decoded"):
        tensor_to_array(t, "initializer")


def test_other_typed_fields_still_read_by_numpy_helper() -> None:
    for t in (helper.make_tensor("h", TensorProto.FLOAT16, [2], np.array([1.5, -2], np.float16)),
              helper.make_tensor("b", TensorProto.BOOL, [3], [True, False, True]),
              helper.make_tensor("s", TensorProto.STRING, [2], [b"a", b"bc"])):
        got, want = tensor_to_array(t, "initializer"), numpy_helper.to_array(t)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def _fresh_selection(*args) -> list:
    passes._SELECTED_FROM = ()  # forgets what was kept: the selection is made again
    return passes._selected(*args)


@pytest.mark.parametrize("level", list(passes.GraphOptimizationLevel))
@pytest.mark.parametrize("fuse, cpu_only", [(True, True), (False, True), (True, False)])
def test_kept_pass_selection_equals_a_fresh_one(level: int, fuse: bool, cpu_only: bool) -> None:
    disabled = frozenset({"fold_constants"})
    kept = passes._selected(level, fuse, cpu_only, disabled)
    assert passes._selected(level, fuse, cpu_only, disabled) is kept  # kept, not made again
    assert kept == _fresh_selection(level, fuse, cpu_only, disabled)
    assert "fold_constants" not in {p[0] for p in kept}


def test_pass_selection_follows_a_replaced_pass_list(monkeypatch: pytest.MonkeyPatch) -> None:
    before = passes._selected(2, True, True, frozenset())
    assert any(p[0] == "fold_constants" for p in before)
    monkeypatch.setattr(passes, "PASSES", [p for p in passes.PASSES if p[0] != "fold_constants"])
    after = passes._selected(2, True, True, frozenset())
    assert not any(p[0] == "fold_constants" for p in after) and len(after) == len(before) - 1
    monkeypatch.setattr(passes, "CPU_EP_PASSES", frozenset(p[0] for p in passes.PASSES))
    assert passes._selected(2, True, False, frozenset()) == []


def test_bad_selection_raises_every_time() -> None:
    for _ in range(2):
        with pytest.raises(InvalidArgument, match="no optimizer pass is named"):
            passes._selected(2, True, True, frozenset({"no_such_pass"}))
        with pytest.raises(InvalidArgument, match="graph optimization level"):
            passes._selected(7, True, True, frozenset())


def test_model_path_checks_after_one_stat(tmp_path) -> None:
    with pytest.raises(NoSuchFile, match="is a folder"):
        onnxhal.InferenceSession(str(tmp_path))
    with pytest.raises(NoSuchFile, match="does not exist"):
        onnxhal.InferenceSession(str(tmp_path / "missing.onnx"))
    with pytest.raises(NoSuchFile, match="does not exist"):
        onnxhal.InferenceSession(str(tmp_path) + "/bad\0name.onnx")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    out = onnxhal.InferenceSession(str(path)).run(None, {"x": np.array([-1, 2], np.float32)})[0]
    np.testing.assert_array_equal(out, [0, 2])


def test_blas_threads_set_only_on_a_change(monkeypatch: pytest.MonkeyPatch) -> None:
    count, calls = [3], []

    def setter(n) -> None:
        calls.append(n.value)
        count[0] = n.value

    monkeypatch.setattr(blas_threads, "_symbol",
                        lambda names: setter if names == blas_threads._SETTERS else (lambda: count[0]))
    monkeypatch.setattr(blas_threads, "startup_blas_threads", lambda: 3)
    assert blas_threads.set_blas_threads(3) and calls == []
    assert blas_threads.set_blas_threads(2) and calls == [2] and blas_threads.get_blas_threads() == 2
    assert blas_threads.set_blas_threads(2) and calls == [2]
    with pytest.raises(InvalidArgument):
        blas_threads.set_blas_threads(0)
