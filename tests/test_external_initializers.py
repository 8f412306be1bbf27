"""Initializers and external-data files given from memory (SessionOptions.add_external_initializers,
add_external_initializers_from_files_in_memory) and load cancellation, each run on onnxhal and on
onnxruntime with the same calls."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import onnxhal
from onnxhal import errors
from tests.models import make, vi

ort = pytest.importorskip("onnxruntime")
RUNTIMES = {"onnxhal": onnxhal, "onnxruntime": ort}
W = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
B = np.linspace(-1, 1, 4).astype(np.float32)
X = np.arange(6, dtype=np.float32).reshape(2, 3)


def _model() -> onnx.ModelProto:
    """y = x @ W + B, both weights initializers large enough to be stored externally."""
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Add", ["m", "B"], ["y"])]
    return make(nodes, [vi("x", [2, 3])], [vi("y", [2, 4])], [numpy_helper.from_array(W, "W"),
                                                            numpy_helper.from_array(B, "B")])


def _external(tmp_path) -> tuple[str, str]:
    """The model saved with its weights in ``weights.bin``; (model path, data file path)."""
    path = str(tmp_path / "model.onnx")
    onnx.save(_model(), path, save_as_external_data=True, all_tensors_to_one_file=True, location="weights.bin",
              size_threshold=0)
    return path, str(tmp_path / "weights.bin")


@pytest.mark.parametrize("rt", RUNTIMES)
@pytest.mark.parametrize("form", ["path", "bytes"])
def test_external_initializers_replace_data_the_model_keeps_outside(rt, form, tmp_path):
    path, data = _external(tmp_path)
    os.remove(data)  # nothing on disk: the values come from memory
    m = RUNTIMES[rt]
    so = m.SessionOptions()
    so.add_external_initializers(["W", "B"], [m.OrtValue.ortvalue_from_numpy(W), m.OrtValue.ortvalue_from_numpy(B)])
    model = path if form == "path" else open(path, "rb").read()
    (y,) = m.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, {"x": X})
    np.testing.assert_allclose(y, X @ W + B, rtol=1e-6)


@pytest.mark.parametrize("rt", RUNTIMES)
def test_external_data_files_from_memory(rt, tmp_path):
    path, data = _external(tmp_path)
    contents = open(data, "rb").read()
    os.remove(data)
    m = RUNTIMES[rt]
    so = m.SessionOptions()
    so.add_external_initializers_from_files_in_memory(["weights.bin"], [contents], [len(contents)])
    (y,) = m.InferenceSession(open(path, "rb").read(), so, providers=["CPUExecutionProvider"]).run(None, {"x": X})
    np.testing.assert_allclose(y, X @ W + B, rtol=1e-6)


def test_external_initializer_override_an_inline_one_and_leave_the_callers_proto_alone():
    model = _model()
    so = onnxhal.SessionOptions()
    w2 = np.ones_like(W)
    so.add_external_initializers(["W"], [onnxhal.OrtValue.ortvalue_from_numpy(w2)])
    (y,) = onnxhal.InferenceSession(model, so).run(None, {"x": X})
    np.testing.assert_allclose(y, X @ w2 + B, rtol=1e-6)
    np.testing.assert_array_equal(numpy_helper.to_array(model.graph.initializer[0]), W)


@pytest.mark.parametrize("names,values,match", [
    (["V"], [np.ones((3, 4), np.float32)], r"has no initializer 'V'"),
    (["W"], [np.ones((4, 3), np.float32)], r"float32\[4, 3\] given, the model's initializer is float32\[3, 4\]"),
    (["W"], [np.ones((3, 4), np.float64)], r"float64\[3, 4\] given"),
])
def test_external_initializer_mismatches_fail_session_creation(names, values, match):
    so = onnxhal.SessionOptions()
    so.add_external_initializers(names, [onnxhal.OrtValue.ortvalue_from_numpy(v) for v in values])
    with pytest.raises(errors.InvalidArgument, match=match):
        onnxhal.InferenceSession(_model(), so)
    so_ort = ort.SessionOptions()  # onnxruntime refuses the same calls
    so_ort.add_external_initializers(names, [ort.OrtValue.ortvalue_from_numpy(v) for v in values])
    with pytest.raises(Exception, match="(?i)initializer|type|shape|dim"):
        ort.InferenceSession(_model().SerializeToString(), so_ort, providers=["CPUExecutionProvider"])


def test_files_in_memory_argument_errors(tmp_path):
    so = onnxhal.SessionOptions()
    with pytest.raises(errors.InvalidArgument, match="one length per buffer"):
        so.add_external_initializers_from_files_in_memory(["a.bin"], [b"1234"], [])
    with pytest.raises(errors.InvalidArgument, match=r"length 9 for a buffer of 4 bytes"):
        so.add_external_initializers_from_files_in_memory(["a.bin"], [b"1234"], [9])
    with pytest.raises(errors.InvalidArgument, match="buffer protocol"):
        so.add_external_initializers_from_files_in_memory(["a.bin"], ["text"], [4])
    path, data = _external(tmp_path)
    short = open(data, "rb").read()[:10]
    so.add_external_initializers_from_files_in_memory(["weights.bin"], [short], [len(short)])
    with pytest.raises(errors.InvalidArgument, match=r"in-memory file 'weights.bin', which has 10"):
        onnxhal.InferenceSession(path, so)


@pytest.mark.parametrize("rt", RUNTIMES)
def test_load_cancellation_flag(rt):
    m = RUNTIMES[rt]
    so = m.SessionOptions()
    so.set_load_cancellation_flag(True)
    with pytest.raises(Exception, match="(?i)cancel") as info:
        m.InferenceSession(_model().SerializeToString(), so, providers=["CPUExecutionProvider"])
    if rt == "onnxhal":
        assert isinstance(info.value, errors.ModelLoadCanceled)
    so.set_load_cancellation_flag(False)
    (y,) = m.InferenceSession(_model().SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"x": X})
    np.testing.assert_allclose(y, X @ W + B, rtol=1e-6)


def test_load_cancellation_from_another_thread_stops_a_creation_under_way(monkeypatch):
    """The flag is read between the stages of session creation; here it is set while the model
    loads (a test double around the loader: the real one is too quick to catch mid-way)."""
    import onnxhal.runtime.session.build as session_module

    so = onnxhal.SessionOptions()
    real = session_module.load_model

    def load_then_cancel(*args, **kw):
        loaded = real(*args, **kw)
        so.set_load_cancellation_flag(True)  # as another thread would, while this one loads
        return loaded
    monkeypatch.setattr(session_module, "load_model", load_then_cancel)
    with pytest.raises(errors.ModelLoadCanceled, match="canceled due to user request"):
        onnxhal.InferenceSession(_model(), so)
