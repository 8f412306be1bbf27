"""The tree kernels' C route (``ml_trees.TREE_PATHS["native"]``, kernels/_native.c) against their
numpy routes, bit for bit, and both against onnxruntime: random forests built with onnx.helper
(every node mode, NaN with and without missing-value tracking, one and several targets, every
aggregate, classifiers of two and more classes, float32 / float64 / integer inputs, no row, one
row and many), and the committed corpus's tree models against their stored outputs."""

from __future__ import annotations

import copy
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnxhal
from onnxhal.hal.graph import Node
from onnxhal.ort_plugin.build import compiler
from onnxhal.runtime.providers.cpu.kernel_factory import create_cpu_kernel
from onnxhal.runtime.providers.cpu.kernels import ml_trees, normalization, numerics

try:  # the extension itself (built where the install had a C compiler)
    from onnxhal.runtime.providers.cpu.kernels import _native
except ImportError:
    _native = None
from tests.test_ml_ops import _legacy_tree_attrs
from tests.test_real_models import check_outputs, load

ML = "ai.onnx.ml"
MODES = ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"]
TRANSFORMS = ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT"]
ROWS = [0, 1, 5, 300]

# skipped only where no C compiler exists (the install could not build the extension); where one
# does, a missing extension fails test_the_extension_is_built_where_a_compiler_is
pytestmark = pytest.mark.skipif(_native is None and compiler() is None,
                                reason="no C compiler: the optional extension _native could not be built")


def test_the_extension_is_built_where_a_compiler_is():
    from onnxhal.runtime.providers.cpu.kernels.native_kernels import STALE, native_module

    assert not STALE, STALE
    assert _native is not None and native_module() is not None, (
        f"a C compiler ({compiler()}) is on this machine but the CPU EP's C extension _native is not built: "
        "pip install --no-deps -e .")


def _grow(rng: np.random.Generator, nodes: list[dict], feats: int, level: int, depth: int, modes: list[str]) -> int:
    k = len(nodes)
    nodes.append({"leaf": True})
    if level == depth or (level > 0 and rng.random() < 0.25):
        return k
    # integer thresholds half the time, so that BRANCH_EQ / NEQ meet equal values of integer inputs
    value = float(rng.integers(-2, 3)) if rng.random() < 0.5 else float(np.float32(rng.standard_normal()))
    nodes[k] = {"leaf": False, "feature": int(rng.integers(0, feats)), "value": value,
                "mode": str(rng.choice(modes)), "missing": int(rng.integers(0, 2))}
    nodes[k]["true"] = _grow(rng, nodes, feats, level + 1, depth, modes)
    nodes[k]["false"] = _grow(rng, nodes, feats, level + 1, depth, modes)
    return k


def _forest(rng: np.random.Generator, n_trees: int, feats: int, depth: int, modes: list[str]) -> list[list[dict]]:
    trees = []
    for _ in range(n_trees):
        nodes: list[dict] = []
        _grow(rng, nodes, feats, 0, depth, modes)
        trees.append(nodes)
    return trees


def _v5_attrs(rng: np.random.Generator, trees: list, n_out: int, split_type: int) -> dict:
    """ai.onnx.ml opset-5 TreeEnsemble attributes of the same trees (a tree that is one leaf gets a
    root whose both branches are that leaf: opset 5 roots are interior nodes)."""
    modes = {m: i for i, m in enumerate(MODES)}
    feature, splits, mode, true_ids, false_ids, true_leaf, false_leaf, missing = ([] for _ in range(8))
    leaf_targets, leaf_weights, roots = [], [], []
    np_type = np.float64 if split_type == TensorProto.DOUBLE else np.float32

    def leaf_index() -> int:
        leaf_targets.append(int(rng.integers(0, n_out)))
        leaf_weights.append(float(rng.standard_normal()))
        return len(leaf_targets) - 1

    def interior(nodes: list[dict], k: int) -> int:
        nd = nodes[k]
        at = len(feature)
        feature.append(nd["feature"])
        splits.append(nd["value"])
        mode.append(modes[nd["mode"]])
        missing.append(nd["missing"])
        true_ids.append(0), false_ids.append(0), true_leaf.append(0), false_leaf.append(0)
        for side, ids, leafs in (("true", true_ids, true_leaf), ("false", false_ids, false_leaf)):
            child = nd[side]
            if nodes[child]["leaf"]:
                ids[at], leafs[at] = leaf_index(), 1
            else:
                ids[at] = interior(nodes, child)
        return at

    for nodes in trees:
        if nodes[0]["leaf"]:
            roots.append(len(feature))
            w = leaf_index()
            feature.append(0), splits.append(0.0), mode.append(0), missing.append(0)
            true_ids.append(w), false_ids.append(w), true_leaf.append(1), false_leaf.append(1)
        else:
            roots.append(interior(nodes, 0))
    return {"nodes_featureids": feature,
            "nodes_splits": helper.make_tensor("s", split_type, [len(splits)], np.asarray(splits, np_type).tolist()),
            "nodes_modes": helper.make_tensor("m", TensorProto.UINT8, [len(mode)], mode),
            "nodes_truenodeids": true_ids, "nodes_falsenodeids": false_ids,
            "nodes_trueleafs": true_leaf, "nodes_falseleafs": false_leaf,
            "nodes_missing_value_tracks_true": missing, "leaf_targetids": leaf_targets,
            "leaf_weights": helper.make_tensor("w", split_type, [len(leaf_weights)],
                                               np.asarray(leaf_weights, np_type).tolist()),
            "tree_roots": roots, "n_targets": n_out}


def _model(op: str, x_type: int, outputs: list, ml_opset: int, **attrs) -> onnx.ModelProto:
    node = helper.make_node(op, ["X"], [o.name for o in outputs], domain=ML, **attrs)
    graph = helper.make_graph([node], op.lower(), [helper.make_tensor_value_info("X", x_type, None)], outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ML, ml_opset)])
    model.ir_version = 10  # onnxruntime 1.32 refuses the IR onnx 1.23 writes
    return model


def _input(rng: np.random.Generator, rows: int, feats: int, dtype: type) -> np.ndarray:
    """Integers (equal to integer thresholds) and fractions, a NaN in float inputs."""
    x = np.where(rng.random((rows, feats)) < 0.5, rng.integers(-2, 3, (rows, feats)),
                 rng.standard_normal((rows, feats)))
    if np.dtype(dtype).kind == "f" and rows:
        x[rng.random((rows, feats)) < 0.1] = np.nan
        x[0, 0] = np.nan
    return x.astype(dtype)


def _kernels(model: onnx.ModelProto, monkeypatch: pytest.MonkeyPatch) -> tuple:
    """The node's kernel built on the C route and on the numpy routes (the switch off)."""
    node, opset = Node.from_proto(model.graph.node[0]), {ML: model.opset_import[1].version}
    monkeypatch.delenv(ml_trees.NATIVE_SWITCH, raising=False)
    native = create_cpu_kernel(node, None, opset)
    monkeypatch.setenv(ml_trees.NATIVE_SWITCH, "0")
    plain = create_cpu_kernel(node, None, opset)
    monkeypatch.delenv(ml_trees.NATIVE_SWITCH)
    assert native.forest.native is not None and plain.forest.native is None
    return native, plain


def _bit_equal(got: list, want: list, what: str) -> None:
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape, (what, i, g.dtype, w.dtype, g.shape, w.shape)
        if g.dtype.kind == "f":  # the same bits, NaN and the sign of zero included
            assert np.array_equal(g.view(f"u{g.itemsize}"), w.view(f"u{w.itemsize}")), f"{what} output {i}"
        else:
            assert g.tolist() == w.tolist(), f"{what} output {i}"


def _against_ort(model: onnx.ModelProto, x: np.ndarray, got: list, what: str, rtol: float = 1e-5,
                 atol: float = 1e-6, first_column: bool = False) -> None:
    if x.dtype.kind in "iu":  # onnxruntime's opset-3 tree kernels take float and double only; both cast to float32
        x = x.astype(np.float32)
    model = copy.deepcopy(model)  # X declared as the type fed
    model.graph.input[0].type.tensor_type.elem_type = helper.np_dtype_to_tensor_dtype(x.dtype)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"X": x})
    for i, (g, w) in enumerate(zip(got, want)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape, (what, i, g.shape, w.shape)
        if first_column and g.ndim == 2:
            g, w = g[:, :1], w[:, :1]
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"{what} output {i}")
        else:
            assert g.astype(w.dtype).tolist() == w.tolist(), f"{what} output {i}"


def _both(model: onnx.ModelProto, xs: list[np.ndarray], monkeypatch: pytest.MonkeyPatch, what: str,
          ort_check: bool = True, rtol: float = 1e-5, atol: float = 1e-6, first_column: bool = False) -> None:
    native, plain = _kernels(model, monkeypatch)
    for x in xs:
        label = f"{what} X {x.dtype} {x.shape}"
        got = native.compute([x])
        _bit_equal(got, plain.compute([x]), label)
        if ort_check and x.shape[0]:
            _against_ort(model, x, got, label, rtol, atol, first_column)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("how", ["SUM", "AVERAGE", "MIN", "MAX"])
def test_regressor_native_equals_numpy_and_onnxruntime(seed, how, monkeypatch):
    rng = np.random.default_rng(seed)
    feats, n_out = 5, [1, 3][seed % 2]
    # one mode for every node (the numpy leaf bits' route) or every mode mixed (the walk's)
    modes = MODES if seed % 3 else [MODES[seed % len(MODES)]]
    trees = _forest(rng, int(rng.integers(1, 12)), feats, int(rng.integers(0, 6)), modes)
    for every_target in (True, False):
        attrs = _legacy_tree_attrs(rng, trees, n_out, "target", every_target)
        base = {"base_values": rng.standard_normal(n_out).tolist()} if seed % 2 else {}
        model = _model("TreeEnsembleRegressor", TensorProto.FLOAT,
                       [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], 3, n_targets=n_out,
                       aggregate_function=how, **attrs, **base)
        xs = [_input(rng, r, feats, np.float32) for r in ROWS] + [_input(rng, 7, feats, np.float64),
                                                                  _input(rng, 7, feats, np.int64)]
        _both(model, xs, monkeypatch, f"regressor {how} seed {seed} every_target={every_target}")


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("transform", TRANSFORMS)
def test_classifier_native_equals_numpy_and_onnxruntime(seed, transform, monkeypatch):
    rng = np.random.default_rng(100 + seed)
    feats = 4
    modes = MODES if seed % 2 else ["BRANCH_LEQ"]
    trees = _forest(rng, int(rng.integers(1, 10)), feats, int(rng.integers(1, 6)), modes)
    cases = []
    for k in (2, 4):
        cases.append((k, _legacy_tree_attrs(rng, trees, k, "class", True), "every class"))
        cases.append((k, _legacy_tree_attrs(rng, trees, k, "class", False), "some classes"))
    # sklearn's binary boosting: every leaf writes class 0 only (one score), base value or not
    binary = _legacy_tree_attrs(rng, trees, 1, "class", True)
    cases.append((2, binary, "one score"))
    cases.append((2, {**binary, "base_values": [float(rng.standard_normal())]}, "one score, one base value"))
    for k, attrs, kind in cases:
        model = _model("TreeEnsembleClassifier", TensorProto.FLOAT,
                       [helper.make_tensor_value_info("Y", TensorProto.INT64, None),
                        helper.make_tensor_value_info("Z", TensorProto.FLOAT, None)], 3,
                       classlabels_int64s=list(range(k)), post_transform=transform, **attrs)
        xs = [_input(rng, r, feats, np.float32) for r in ROWS] + [_input(rng, 6, feats, np.int32)]
        # PROBIT of a score near 1 magnifies onnxruntime's erf-inverse approximation (both routes share it)
        _both(model, xs, monkeypatch, f"classifier {k} classes ({kind}) {transform} seed {seed}",
              **({"rtol": 2e-4, "atol": 2e-5} if transform == "PROBIT" else {}),
              # onnxruntime leaves a one-score row's second PROBIT column unwritten (ml_trees' _one_score_rows)
              first_column=transform == "PROBIT" and k == 2)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("split_type", [TensorProto.FLOAT, TensorProto.DOUBLE])
def test_tree_ensemble_v5_native_equals_numpy_and_onnxruntime(seed, split_type, monkeypatch):
    rng = np.random.default_rng(200 + seed)
    feats, n_out = 4, 1 + seed % 3
    trees = _forest(rng, int(rng.integers(1, 8)), feats, int(rng.integers(0, 5)), MODES)
    x_type, dtype = (TensorProto.DOUBLE, np.float64) if split_type == TensorProto.DOUBLE else \
        (TensorProto.FLOAT, np.float32)
    for agg in range(4):
        model = _model("TreeEnsemble", x_type, [helper.make_tensor_value_info("Y", x_type, None)], 5,
                       aggregate_function=agg, **_v5_attrs(rng, trees, n_out, split_type))
        _both(model, [_input(rng, r, feats, dtype) for r in ROWS], monkeypatch, f"v5 agg {agg} seed {seed}")


def test_double_thresholds_compare_in_double(monkeypatch):
    """A double input against double thresholds one float32 ulp apart from its values: the
    comparisons must be made in double on both routes (float32 would call them equal)."""
    rng = np.random.default_rng(7)
    trees = _forest(rng, 6, 3, 4, ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_EQ"])
    attrs = _legacy_tree_attrs(rng, trees, 1, "target", True)
    values = np.asarray(attrs.pop("nodes_values"), np.float64) + 1e-12  # not float32 values
    model = _model("TreeEnsembleRegressor", TensorProto.DOUBLE,
                   [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], 3, n_targets=1,
                   nodes_values_as_tensor=helper.make_tensor("v", TensorProto.DOUBLE, [values.size], values.tolist()),
                   **attrs)
    x = np.repeat(values[None, :3], 4, axis=0) + np.array([[-1e-12], [0], [1e-12], [1e-13]])
    native, plain = _kernels(model, monkeypatch)
    _bit_equal(native.compute([x]), plain.compute([x]), "double thresholds")


def test_columns_that_are_not_contiguous_and_1d_input(monkeypatch):
    rng = np.random.default_rng(9)
    trees = _forest(rng, 5, 4, 4, MODES)
    model = _model("TreeEnsembleRegressor", TensorProto.FLOAT,
                   [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], 3, n_targets=2,
                   **_legacy_tree_attrs(rng, trees, 2, "target", False))
    wide = _input(rng, 9, 8, np.float32)
    native, plain = _kernels(model, monkeypatch)
    for x in (wide[:, ::2], wide[::3, :4], wide[0, :4]):
        _bit_equal(native.compute([x]), plain.compute([x]), f"strides {x.strides}")


def test_the_native_route_declines_what_it_does_not_take(monkeypatch):
    """BRANCH_MEMBER (opset 5) stays on numpy; so does a run whose rows are narrower than a
    feature the trees read; and the switch keeps every forest on numpy."""
    rng = np.random.default_rng(11)
    trees = _forest(rng, 3, 4, 3, ["BRANCH_LEQ"])
    attrs = _v5_attrs(rng, trees, 1, TensorProto.FLOAT)
    modes = onnx.numpy_helper.to_array(attrs["nodes_modes"]).copy()
    modes[0] = 6  # BRANCH_MEMBER
    attrs["nodes_modes"] = helper.make_tensor("m", TensorProto.UINT8, [modes.size], modes.tolist())
    attrs["membership_values"] = helper.make_tensor("mv", TensorProto.FLOAT, [3], [0.0, 1.0, np.nan])
    model = _model("TreeEnsemble", TensorProto.FLOAT, [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
                   5, **attrs)
    monkeypatch.delenv(ml_trees.NATIVE_SWITCH, raising=False)
    kernel = create_cpu_kernel(Node.from_proto(model.graph.node[0]), None, {ML: 5})
    assert kernel.forest.native is None
    x = _input(rng, 6, 4, np.float32)
    _against_ort(model, x, kernel.compute([x]), "BRANCH_MEMBER on numpy")
    legacy = _model("TreeEnsembleRegressor", TensorProto.FLOAT,
                    [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], 3, n_targets=1,
                    **_legacy_tree_attrs(rng, trees, 1, "target", True))
    kernel = create_cpu_kernel(Node.from_proto(legacy.graph.node[0]), None, {ML: 3})
    assert kernel.forest.native is not None
    narrow = np.zeros((2, kernel.forest.native.max_feature), np.float32)
    assert not kernel.forest.native.takes(narrow)
    monkeypatch.setenv(ml_trees.NATIVE_SWITCH, "0")
    assert create_cpu_kernel(Node.from_proto(legacy.graph.node[0]), None, {ML: 3}).forest.native is None


def test_native_route_in_row_chunks(monkeypatch):
    """Past one call's rows the C route goes a chunk at a time (a terminate check between two):
    chunks of one row give what one call gives, for SUM (by ``sums``) and MAX (by ``aggregate``)."""
    rng = np.random.default_rng(13)
    trees = _forest(rng, 7, 4, 5, MODES)
    x = _input(rng, 50, 4, np.float32)
    for how in ("SUM", "MAX"):
        model = _model("TreeEnsembleRegressor", TensorProto.FLOAT,
                       [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], 3, n_targets=2,
                       aggregate_function=how, **_legacy_tree_attrs(rng, trees, 2, "target", how == "SUM"))
        native, plain = _kernels(model, monkeypatch)
        whole = native.compute([x])
        native.forest.native.chunk_rows = 1
        _bit_equal(native.compute([x]), whole, f"{how} a row a chunk")
        _bit_equal(whole, plain.compute([x]), f"{how} numpy")


def test_native_forest_refuses_malformed_arrays():
    """The C type checks what it is given (a child outside the nodes, a bad mode, a bad dtype)."""
    one = np.ones(1, np.int64)
    good = dict(feature=np.zeros(1, np.int64), threshold=np.zeros(1), mode=np.full(1, 6, np.int8),
                true_next=np.zeros(1, np.int64), false_next=np.zeros(1, np.int64), missing=np.zeros(1, bool),
                roots=np.zeros(1, np.int64), weights=np.ones((1, 1), np.float32), has=np.ones((1, 1), bool),
                outputs=1, tree_depth=np.zeros(1, np.int64))
    forest = _native.Forest(**good)
    out = np.empty((2, 1), np.float32)
    forest.evaluate(np.zeros((2, 1), np.float32), 0, out, None)
    assert out.tolist() == [[1.0], [1.0]]
    for bad in ({"true_next": one}, {"mode": np.full(1, 7, np.int8)}, {"roots": one},
                {"weights": np.ones((1, 1), np.float16)}, {"threshold": np.zeros(1, np.float32)},
                {"tree_depth": np.full(1, 2, np.int64)}):
        with pytest.raises(ValueError):
            _native.Forest(**{**good, **bad})
    with pytest.raises(ValueError):
        forest.evaluate(np.zeros((2, 1), np.float32), 2, out, None)  # MIN needs the written array


CORPUS_TREES = ["sk_forest", "sk_forest_binary", "sk_forest_reg", "sk_forest_zipmap", "sk_gboost",
                "sk_gboost_binary", "sk_gboost_reg", "sk_gboost_zipmap", "sk_tree", "sk_tree_zipmap", "lgbm_clf",
                "lgbm_reg", "xgb_clf", "xgb_reg", "catboost_clf", "catboost_reg", "hb_tree_trav",
                "hb_perf_tree_trav", "hb_gemm"]


@pytest.mark.parametrize("name", CORPUS_TREES)
def test_corpus_tree_models_on_the_native_route(name, monkeypatch):
    """Each committed tree model against onnxruntime's stored outputs on the C route, and bit for
    bit against the numpy routes; the C route must have run where the model has a tree node."""
    path, signatures = load(name)
    model = onnx.load(path)
    trees = sum(n.op_type.startswith("TreeEnsemble") for n in model.graph.node)
    calls: list[int] = []
    # the C paths of other kernels that the same switch turns off and that round differently from
    # their numpy forms (a post-tree Softmax) stay off both times: the trees' routes are compared
    monkeypatch.setattr(numerics, "NATIVE_SOFTMAX_ENABLED", False)
    monkeypatch.setattr(numerics, "NATIVE_GELU_ENABLED", False)
    monkeypatch.setattr(normalization, "NATIVE_LAYER_NORM_ENABLED", False)
    for method in ("sums", "aggregate"):
        real = getattr(ml_trees._NativeTrees, method)
        monkeypatch.setattr(ml_trees._NativeTrees, method,
                            lambda self, *a, _real=real, **k: calls.append(1) or _real(self, *a, **k))
    for sig, (feeds, want) in signatures.items():
        monkeypatch.delenv(ml_trees.NATIVE_SWITCH, raising=False)
        got = onnxhal.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
        check_outputs(got, want, what=f"{name} {sig}")
        monkeypatch.setenv(ml_trees.NATIVE_SWITCH, "0")
        before = len(calls)
        plain = onnxhal.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
        assert len(calls) == before
        for i, (g, p) in enumerate(zip(got, plain)):
            if isinstance(g, list):  # ZipMap: a list of dicts
                assert g == p, (name, i)
            else:
                _bit_equal([g], [p], f"{name} {sig} output {i}")
    assert bool(calls) == bool(trees), (name, trees, len(calls))


def test_install_keeps_the_source_beside_the_kernel():
    """The C source ships with the package (package-data), as the bridge's does."""
    here = os.path.dirname(ml_trees.__file__)
    assert os.path.exists(os.path.join(here, "_native.c"))


@pytest.mark.parametrize("op", ["TreeEnsembleRegressor", "TreeEnsembleClassifier"])
def test_runs_the_native_route_takes_never_build_the_leaf_bits(op, monkeypatch):
    """The leaf bits (``TREE_PATHS["leaf_bits"]``) are built at their first use: a session whose
    runs the C route takes never builds them (nor a two-class classifier's signed copy), and the
    numpy route that does build them gives the same bits."""
    rng = np.random.default_rng(5)
    trees = _forest(rng, 6, 4, 3, ["BRANCH_LEQ"])
    if op == "TreeEnsembleRegressor":
        attrs = dict(_legacy_tree_attrs(rng, trees, 1, "target", True), n_targets=1)
        outputs = [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)]
    else:  # two classes, the trees writing the first alone: the one-score route of a signed pair
        attrs = dict(_legacy_tree_attrs(rng, trees, 1, "class", True), classlabels_int64s=[0, 1],
                     post_transform="LOGISTIC")
        outputs = [helper.make_tensor_value_info("L", TensorProto.INT64, None),
                   helper.make_tensor_value_info("P", TensorProto.FLOAT, None)]
    model = _model(op, TensorProto.FLOAT, outputs, 3, **attrs)
    native, plain = _kernels(model, monkeypatch)
    x = _input(rng, 7, 4, np.float32)
    got = native.compute([x])
    assert not native.forest._bits_built
    assert op == "TreeEnsembleRegressor" or (native._pair is not None and native._pair_bits is None)
    assert not plain.forest._bits_built
    _bit_equal(got, plain.compute([x]), op)
    assert plain.forest._bits is not None
    _against_ort(model, x, got, op)
