"""The SVM coupling's C route (``ml_svm.COUPLING_PATHS["native"]``: libsvm's multiclass_probability
row by row in double, kernels/_native.c) against the canonical numpy ``_Coupling`` and libsvm's
loop transcribed, and SVMClassifier with probabilities on both routes against onnxruntime and the
committed corpus's SVC models."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnxhal
from onnxhal.hal.graph import Node
from onnxhal.ort_plugin.build import compiler
from onnxhal.runtime.providers.cpu.kernel_factory import create_cpu_kernel
from onnxhal.runtime.providers.cpu.kernels import ml_svm
from onnxhal.runtime.providers.cpu.kernels.native_kernels import NATIVE_SWITCH
from tests.test_ml_ops import _libsvm_coupling, _svc_attrs
from tests.test_real_models import check_outputs, load

try:  # the extension itself (built where the install had a C compiler)
    from onnxhal.runtime.providers.cpu.kernels import _native
except ImportError:
    _native = None

ML = "ai.onnx.ml"
# skipped only where no C compiler exists (the install could not build the extension); where one
# does, a missing extension fails test_tree_native.py's test_the_extension_is_built_where_a_compiler_is
pytestmark = pytest.mark.skipif(_native is None and compiler() is None,
                                reason="no C compiler: the optional extension _native could not be built")



def _pairwise(rng: np.random.Generator, rows: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Clipped pairwise probabilities spread so that rows stop after 0 to several iterations, with
    uniform rows (stop at once) and a NaN row (p = 1/k, as onnxruntime gives)."""
    pair_i, pair_j = np.triu_indices(k, 1)
    v = rng.uniform(0, 1, (rows, len(pair_i))) ** rng.uniform(0.1, 8, (rows, 1))
    v[:3] = 0.5
    v[3, 0] = np.nan
    return np.clip(v, 1e-7, 1 - 1e-7).astype(np.float32), pair_i, pair_j


@pytest.mark.parametrize("k", [3, 4, 6, 9])
def test_native_coupling_against_numpy_and_libsvm(k, monkeypatch):
    """The C route follows libsvm's loop: against the transcription within float32 rounding, and
    against the numpy route (the same iterations computed in another order) within 1e-6."""
    rng = np.random.default_rng(k)
    v, pair_i, pair_j = _pairwise(rng, 300, k)
    monkeypatch.delenv(NATIVE_SWITCH, raising=False)
    native = ml_svm._NativeCoupling.build(pair_i, pair_j, k)
    assert native is not None
    got = native(v)
    want = ml_svm._Coupling(pair_i, pair_j, k)(v)
    assert got.shape == (300, k) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    for n in range(0, 300, 7):
        r = np.zeros((k, k))
        r[pair_i, pair_j] = v[n]
        r[pair_j, pair_i] = 1 - v[n].astype(np.float64)
        np.testing.assert_allclose(got[n], _libsvm_coupling(r), rtol=1e-6, atol=1e-7, err_msg=f"row {n}")
    np.testing.assert_array_equal(got[3], np.float32(1 / k))
    native.CHUNK = 7  # rows a chunk at a time: the same result
    np.testing.assert_array_equal(native(v), got)
    assert native(v[:0]).shape == (0, k)


def test_native_coupling_of_two_classes_against_the_closed_form(monkeypatch):
    """Two classes (a binary SVC with probabilities) take the C loop too: against ``_coupling_two``,
    the canonical closed form of the same iterations, and libsvm's loop transcribed, on values
    that stop at once, after one or two iterations, near the clip's ends and NaN."""
    rng = np.random.default_rng(2)
    v, pair_i, pair_j = _pairwise(rng, 400, 2)
    v[4:40, 0] = np.linspace(0.49, 0.51, 36)  # around the first stopping rule's edge
    v[40:44, 0] = [1e-7, 1 - 1e-7, 2e-7, 1 - 2e-7]
    monkeypatch.delenv(NATIVE_SWITCH, raising=False)
    native = ml_svm._NativeCoupling.build(pair_i, pair_j, 2)
    assert native is not None
    got = native(v)
    want = ml_svm._coupling_two(v[:, 0])
    assert got.shape == (400, 2) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(got[3], np.float32(0.5))
    for n in range(0, 400, 5):
        r = np.array([[0, v[n, 0]], [1 - np.float64(v[n, 0]), 0]])
        np.testing.assert_allclose(got[n], _libsvm_coupling(r), rtol=1e-6, atol=1e-7, err_msg=f"row {n}")


def test_native_platt_against_platt_pairs():
    """``_native.platt`` against ``_platt_pairs`` (the canonical numpy form): random scores over
    the sigmoid's range, zeros (x = 0 exactly: 1 - w), values past both clip ends, +-inf and NaN."""
    rng = np.random.default_rng(6)
    scores = (rng.standard_normal((500, 3)) * rng.uniform(0.1, 40, (500, 1))).astype(np.float32)
    scores[:4] = [[0, 0, 0], [np.inf, -np.inf, np.nan], [1e30, -1e30, 3], [-0.0, 1e-30, -1e-30]]
    prob_a = np.array([-2.5, 0.7, -1.0], np.float32)
    prob_b = np.array([0.3, 0.0, -0.2], np.float32)
    got = np.empty_like(scores)
    _native.platt(scores, prob_a, prob_b, got)
    want = ml_svm._platt_pairs(scores.copy(), prob_a, prob_b)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert got[~np.isnan(got)].min() >= np.float32(1e-7) and got[~np.isnan(got)].max() <= np.float32(1 - 1e-7)
    with pytest.raises(ValueError):
        _native.platt(scores, prob_a[:2], prob_b[:2], got)  # scores of 3 pairs


def test_native_coupling_condition(monkeypatch):
    pair_i, pair_j = np.triu_indices(4, 1)
    monkeypatch.setenv(NATIVE_SWITCH, "0")
    assert ml_svm._NativeCoupling.build(pair_i, pair_j, 4) is None
    monkeypatch.delenv(NATIVE_SWITCH)
    assert ml_svm._NativeCoupling.build(pair_i[:-1], pair_j[:-1], 4) is None  # not every pair
    assert ml_svm._NativeCoupling.build(pair_i, pair_j, 4) is not None
    assert ml_svm._NativeCoupling.build(np.array([0]), np.array([1]), 2) is not None  # a binary SVC too
    with pytest.raises(ValueError):
        _native.coupling(np.zeros((2, 6), np.float32), pair_i, pair_j[::-1].copy() * 0, 4, np.empty((2, 4), np.float32))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("k", [2, 3, 5])
def test_svc_probabilities_on_both_routes(seed, k, monkeypatch):
    rng = np.random.default_rng(seed)
    feats = 3
    x = (rng.standard_normal((24, feats)) * rng.uniform(0.2, 3.0, (24, 1))).astype(np.float32)
    out = [helper.make_tensor_value_info("Y", TensorProto.INT64, None),
           helper.make_tensor_value_info("Z", TensorProto.FLOAT, None)]
    for kernel in ("RBF", "LINEAR", "POLY", "SIGMOID"):
        node = helper.make_node("SVMClassifier", ["X"], ["Y", "Z"], domain=ML, **_svc_attrs(rng, k, feats, True, kernel))
        graph = helper.make_graph([node], "svc", [helper.make_tensor_value_info("X", TensorProto.FLOAT, None)], out)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ML, 1)])
        model.ir_version = 10
        kernels = {}
        for route in ("native", "numpy"):
            if route == "numpy":
                monkeypatch.setenv(NATIVE_SWITCH, "0")
            else:
                monkeypatch.delenv(NATIVE_SWITCH, raising=False)
            kernels[route] = create_cpu_kernel(Node.from_proto(node), None, {ML: 1})
        monkeypatch.delenv(NATIVE_SWITCH)
        assert isinstance(kernels["native"].coupling, ml_svm._NativeCoupling)
        assert isinstance(kernels["numpy"].coupling, ml_svm._Coupling) if k > 2 else kernels["numpy"].coupling is None
        got, plain = kernels["native"].compute([x]), kernels["numpy"].compute([x])
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"X": x})
        what = f"k={k} {kernel} seed {seed}"
        assert got[0].tolist() == plain[0].tolist() == want[0].tolist(), what
        np.testing.assert_allclose(got[1], plain[1], rtol=1e-6, atol=1e-7, err_msg=what)
        np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-6, err_msg=what)


@pytest.mark.parametrize("name", ["sk_svc", "sk_svc_zipmap", "sk_svc_binary"])
def test_corpus_svc_on_the_native_route(name, monkeypatch):
    path, signatures = load(name)
    assert any(n.op_type == "SVMClassifier" for n in onnx.load(path).graph.node)
    calls: list[int] = []
    real = ml_svm._NativeCoupling.__call__
    monkeypatch.setattr(ml_svm._NativeCoupling, "__call__", lambda self, v: calls.append(1) or real(self, v))
    monkeypatch.delenv(NATIVE_SWITCH, raising=False)
    for sig, (feeds, want) in signatures.items():
        got = onnxhal.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
        check_outputs(got, want, what=f"{name} {sig}")
    assert calls
