"""The tree kernels' build in C (``ml_trees.TREE_BUILD_PATHS["native"]``, ``_native.forest_build``)
against the canonical numpy build: the same child positions, roots, leaf-weight positions and tree
walk tables (or the same error, or None for shared and cyclic trees) on random node graphs in every
layout, the same forest tables and outputs from kernels built either way, and the corpus's tree
models either way against onnxruntime's stored outputs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import onnxhal
from onnxhal.hal.errors import InvalidArgument
from onnxhal.hal.graph import Graph, Node
from onnxhal.ort_plugin.build import compiler
from onnxhal.runtime.providers.cpu.kernels import ml_trees
from onnxhal.runtime.providers.cpu.kernels.native_kernels import NATIVE_SWITCH

try:  # the extension itself (built where the install had a C compiler)
    from onnxhal.runtime.providers.cpu.kernels import _native as native_ext
except ImportError:
    native_ext = None
from tests.test_ml_ops import _legacy_tree_attrs, _random_trees
from tests.test_real_models import check_outputs, load

# skipped only where no C compiler exists; where one does, a missing extension fails
# test_the_native_build_is_registered_with_its_condition
pytestmark = pytest.mark.skipif(native_ext is None and compiler() is None,
                                reason="no C compiler: the optional extension _native could not be built")


@pytest.fixture(autouse=True)
def _native_kernels_on(monkeypatch):
    """The C routes on whatever the environment says (the tests compare them with numpy's)."""
    monkeypatch.delenv(NATIVE_SWITCH, raising=False)


def test_the_native_build_is_registered_with_its_condition():
    assert "native" in ml_trees.TREE_BUILD_PATHS
    assert "NATIVE_BUILD" in ml_trees.TREE_BUILD_PATHS["native"].condition
    assert ml_trees.NATIVE_BUILD is True
    assert native_ext is not None  # built here: the path is the one sessions take


def _graph_node(rng: np.random.Generator, layout: str) -> Node:
    """A regressor whose nodes are a random graph: per tree ids 0..k-1 (dense), shuffled, trees
    descending, a pair given twice, ids offset; children anywhere in the tree (shared nodes and
    cycles), sometimes a missing one; leaf weights naming some pairs that do not exist."""
    n_trees = int(rng.integers(1, 5))
    counts = rng.integers(1, 9, n_trees)
    trees = np.repeat(np.arange(n_trees) * 2, counts)
    ids = np.concatenate([np.arange(c) for c in counts])
    leaf = rng.random(ids.size) < 0.4
    true_ids, false_ids = ids.copy(), ids.copy()
    for k in range(ids.size):
        if not leaf[k]:
            c = int(counts[trees[k] // 2])
            true_ids[k], false_ids[k] = rng.integers(0, c + (layout == "missing"), 2)
    if layout == "offset":
        ids, true_ids, false_ids = ids + 1, true_ids + 1, false_ids + 1
    order = {"shuffled": rng.permutation(ids.size), "descending": np.arange(ids.size)[::-1],
             "twice": np.concatenate([np.arange(ids.size), [0]])}.get(layout, np.arange(ids.size))
    pick = rng.integers(0, ids.size, int(rng.integers(1, 12)))
    return Node.from_proto(helper.make_node(
        "TreeEnsembleRegressor", ["x"], ["y"], domain="ai.onnx.ml", n_targets=1,
        nodes_treeids=trees[order].tolist(), nodes_nodeids=ids[order].tolist(),
        nodes_modes=["LEAF" if leaf[k] else "BRANCH_LEQ" for k in order],
        nodes_truenodeids=true_ids[order].tolist(), nodes_falsenodeids=false_ids[order].tolist(),
        nodes_featureids=[0] * order.size, nodes_values=[0.0] * order.size,
        target_treeids=trees[pick].tolist(), target_nodeids=(ids[pick] + (rng.random(pick.size) < 0.2)).tolist(),
        target_ids=[0] * pick.size, target_weights=rng.standard_normal(pick.size).tolist()))


def _canonical(node: Node) -> tuple:
    """true_next, false_next, roots, leaf positions and flat shape by the numpy build, or the error."""
    trees, ids = ml_trees._ints(node, "nodes_treeids"), ml_trees._ints(node, "nodes_nodeids")
    mode = np.array([ml_trees._MODES[m] for m in node.attr("nodes_modes")], np.int8)
    try:
        index, t, f, roots = ml_trees._links(node, "w", trees, ids, mode)
    except InvalidArgument as exc:
        return (str(exc),)
    shape = ml_trees._flat_shape(ml_trees._tree_shape(mode == ml_trees.LEAF, t, f, roots), roots.size) \
        if roots.size else None
    at = index.find(ml_trees._ints(node, "target_treeids"), ml_trees._ints(node, "target_nodeids"))
    return t, f, roots, at, shape


def _native(node: Node) -> tuple:
    trees, ids = ml_trees._ints(node, "nodes_treeids"), ml_trees._ints(node, "nodes_nodeids")
    mode = np.array([ml_trees._MODES[m] for m in node.attr("nodes_modes")], np.int8)
    try:
        return ml_trees._links_native(node, "w", trees, ids, mode, ml_trees._ints(node, "target_treeids"),
                                      ml_trees._ints(node, "target_nodeids"), native_ext)
    except InvalidArgument as exc:
        return (str(exc),)


@pytest.mark.parametrize("layout", ["dense", "shuffled", "descending", "twice", "offset", "missing"])
@pytest.mark.parametrize("seed", range(25))
def test_native_tables_are_the_numpy_tables(seed, layout):
    node = _graph_node(np.random.default_rng(seed), layout)
    want, got = _canonical(node), _native(node)
    assert len(want) == len(got), (want, got)
    if len(want) == 1:  # the same error
        assert want == got
        return
    for name, a, b in zip(("true_next", "false_next", "roots", "leaf positions"), want[:4], got[:4]):
        assert b.dtype == np.int64, name
        np.testing.assert_array_equal(b, a, err_msg=name)
    assert (want[4] is None) == (got[4] is None), (want[4], got[4])
    if want[4] is not None:
        for name, a, b in zip(("owner", "count", "first", "visited", "tree_depth"), want[4], got[4]):
            np.testing.assert_array_equal(b, a, err_msg=name)


def test_the_walk_refuses_a_node_reached_twice_and_a_cycle():
    """A tree whose two branches meet (a shared node) and one whose node is its own child (a
    cycle): the links, and no shape."""
    for true_ids, false_ids in (([1, 2, 2], [2, 2, 2]), ([1, 1, 2], [2, 2, 2])):
        node = Node.from_proto(helper.make_node(
            "TreeEnsembleRegressor", ["x"], ["y"], domain="ai.onnx.ml", nodes_treeids=[0, 0, 0],
            nodes_nodeids=[0, 1, 2], nodes_modes=["BRANCH_LEQ", "BRANCH_LEQ", "LEAF"],
            nodes_truenodeids=true_ids, nodes_falsenodeids=false_ids, nodes_featureids=[0, 0, 0],
            nodes_values=[0.0] * 3, target_treeids=[0], target_nodeids=[2], target_ids=[0], target_weights=[1.0]))
        want, got = _canonical(node), _native(node)
        assert len(want) == len(got) == 5 and want[4] is None and got[4] is None
        for a, b in zip(want[:4], got[:4]):
            np.testing.assert_array_equal(b, a)


@pytest.mark.parametrize("seed", range(10))
def test_kernels_built_natively_compute_what_the_numpy_built_ones_do(seed, monkeypatch):
    """Random forests, a regressor and a classifier, built in C and by numpy: the same forest
    tables, depth and outputs."""
    rng = np.random.default_rng(seed)
    trees = _random_trees(rng, int(rng.integers(1, 6)), 4, int(rng.integers(0, 5)))
    reg = Node.from_proto(helper.make_node("TreeEnsembleRegressor", ["x"], ["y"], domain="ai.onnx.ml", n_targets=2,
                                           **_legacy_tree_attrs(rng, trees, 2, "target")))
    clf = Node.from_proto(helper.make_node("TreeEnsembleClassifier", ["x"], ["label", "p"], domain="ai.onnx.ml",
                                           classlabels_int64s=[0, 1, 2], **_legacy_tree_attrs(rng, trees, 3, "class")))
    x = rng.standard_normal((7, 4)).astype(np.float32)
    x[0, 1] = np.nan
    monkeypatch.setattr(ml_trees, "SMALL_FOREST_NODES", 0)  # the other build: numpy's
    results = {}
    for on in (False, True):
        monkeypatch.setattr(ml_trees, "NATIVE_BUILD", on)
        r, c = ml_trees.TreeEnsembleRegressor(reg, None), ml_trees.TreeEnsembleClassifier(clf, None)
        # the leaf bits (built at their first use) from either build's shape
        bits = r.forest._bits
        results[on] = (r.forest, bits, [r.compute([x])[0], *c.compute([x]), r.forest.aggregate(x, "MAX")[0]])
    (fa, ba, ya), (fb, bb, yb) = results[False], results[True]
    for field in ("feature", "threshold", "mode", "roots", "weights", "has", "_children"):
        np.testing.assert_array_equal(getattr(fb, field), getattr(fa, field), err_msg=field)
    assert fa.depth == fb.depth and (ba is None) == (bb is None)
    if ba is not None:
        np.testing.assert_array_equal(bb.feature, ba.feature)
        np.testing.assert_array_equal(bb.leaf, ba.leaf)
    for a, b in zip(ya, yb):
        np.testing.assert_array_equal(b, a)


@pytest.mark.parametrize("name", ["sk_gboost", "lgbm_reg", "xgb_clf", "skh_adaboost", "catboost_clf"])
def test_corpus_tree_models_built_either_way(name, monkeypatch):
    """Whole sessions with the C build on and off: onnxruntime's stored outputs either way."""
    path, signatures = load(name)
    model = onnx.load(path)
    graph = Graph.from_proto(model.graph, {o.domain: o.version for o in model.opset_import})
    assert any(n.op_type.startswith("TreeEnsemble") for n in graph.nodes)
    for on in (True, False):
        monkeypatch.setattr(ml_trees, "NATIVE_BUILD", on)
        sess = onnxhal.InferenceSession(path, providers=["CPUExecutionProvider"])
        for sig, (feeds, want) in signatures.items():
            check_outputs(sess.run(None, feeds), want, what=f"{name} {sig} native build={on}")
