"""The tree kernels' build on lists (``ml_trees.TREE_BUILD_PATHS["lists"]``, ml_tree_lists.py)
against the canonical numpy build: the node index finds the same positions, the tree walk gives
the same tables (values and dtypes, None for the same shared or cyclic trees), and kernels built
either way give the same results, on random forests and on the corpus's small tree models."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import onnxhal
from onnxhal.hal.errors import InvalidArgument
from onnxhal.hal.graph import Graph, Node
from onnxhal.runtime.providers.cpu.kernels import ml_tree_lists, ml_trees
from tests.test_ml_ops import _legacy_tree_attrs, _random_trees
from tests.test_real_models import check_outputs, load
from tests.test_tree_construction import _layouts


def test_the_lists_path_is_registered_with_its_condition():
    assert "lists" in ml_trees.TREE_BUILD_PATHS
    assert "SMALL_FOREST_NODES" in ml_trees.TREE_BUILD_PATHS["lists"].condition
    assert ml_trees.SMALL_FOREST_NODES > 0


@pytest.mark.parametrize("seed", range(40))
def test_list_index_finds_what_the_numpy_index_finds(seed):
    rng = np.random.default_rng(seed)
    for name, trees, ids in _layouts(rng):
        trees, ids = trees.astype(np.int64), ids.astype(np.int64)
        plain, lists = ml_trees._NodeIndex(trees, ids), ml_tree_lists.ListNodeIndex(trees.tolist(), ids.tolist())
        qt = np.concatenate([trees, trees, trees + 1, trees, [-1, 99]]).astype(np.int64)
        qi = np.concatenate([ids, ids + 1, ids, ids - 1, [0, 0]]).astype(np.int64)
        got = lists.find(qt, qi)
        assert got.dtype == np.int64, name
        np.testing.assert_array_equal(got, plain.find(qt, qi), err_msg=name)
        empty = np.zeros(0, np.int64)
        assert lists.find(empty, empty).shape == plain.find(empty, empty).shape == (0,)


def _links_node(rng: np.random.Generator, layout: str) -> Node:
    """A regressor of random trees whose nodes come in a layout of ``_layouts``' kinds (dense,
    shuffled, tree ids descending, a pair given twice) or point at a missing child."""
    trees = _random_trees(rng, int(rng.integers(1, 5)), 4, int(rng.integers(0, 4)))
    attrs = _legacy_tree_attrs(rng, trees, 2, "target")
    count = len(attrs["nodes_treeids"])
    order = {"dense": np.arange(count), "shuffled": rng.permutation(count),
             "descending": np.arange(count)[::-1], "twice": np.concatenate([np.arange(count), [0]])}.get(layout)
    if order is None:  # "missing": an interior node's child id that no node has (or every node a leaf)
        order = np.arange(count)
        inner = [k for k, m in enumerate(attrs["nodes_modes"]) if m != "LEAF"]
        if inner:
            attrs["nodes_falsenodeids"][inner[int(rng.integers(len(inner)))]] = 77
    attrs = {k: ([v[i] for i in order] if k.startswith("nodes_") else v) for k, v in attrs.items()}
    return Node.from_proto(helper.make_node("TreeEnsembleRegressor", ["x"], ["y"], domain="ai.onnx.ml",
                                            n_targets=2, **attrs))


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("layout", ["dense", "shuffled", "descending", "twice", "missing"])
def test_list_links_are_the_numpy_links(seed, layout):
    """``_links_lists`` against ``_links``: the same child positions and roots, or the same error."""
    rng = np.random.default_rng(seed)
    node = _links_node(rng, layout)
    trees, ids = ml_trees._ints(node, "nodes_treeids"), ml_trees._ints(node, "nodes_nodeids")
    mode = np.array([ml_trees._MODES[m] for m in node.attr("nodes_modes")], np.int8)
    outcome = []
    for links in (ml_trees._links, ml_trees._links_lists):
        try:
            _, t, f, roots = links(node, "what", trees, ids, mode)
            outcome.append((t.dtype, t.tolist(), f.tolist(), roots.dtype, roots.tolist()))
        except InvalidArgument as e:
            outcome.append(str(e))
    assert outcome[0] == outcome[1]


def _random_links(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Nodes with arbitrary children (shared, cyclic, negative indices as numpy reads them) and roots."""
    is_leaf = rng.random(n) < 0.4
    true_next = rng.integers(-n, n, n)
    false_next = rng.integers(-n, n, n)
    idx = np.arange(n)
    true_next[is_leaf], false_next[is_leaf] = idx[is_leaf], idx[is_leaf]
    roots = rng.choice(n, int(rng.integers(1, min(n, 4) + 1)), replace=False).astype(np.int64)
    return is_leaf, true_next.astype(np.int64), false_next.astype(np.int64), roots


def _trees_links(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Converter-shaped trees (no shared node), flattened: every walk reaches a leaf."""
    trees = _random_trees(rng, int(rng.integers(1, 6)), 4, int(rng.integers(0, 5)))
    is_leaf, t_next, f_next, roots, base = [], [], [], [], 0
    for nodes in trees:
        roots.append(base)
        for i, nd in enumerate(nodes):
            is_leaf.append(nd["leaf"])
            t_next.append(base + (i if nd["leaf"] else nd["true"]))
            f_next.append(base + (i if nd["leaf"] else nd["false"]))
        base += len(nodes)
    return (np.array(is_leaf, bool), np.array(t_next, np.int64), np.array(f_next, np.int64),
            np.array(roots, np.int64))


def _assert_same_shape(a, b, what: str) -> None:
    assert (a is None) == (b is None), what
    if a is None:
        return
    for x, y in zip(a[:3], b[:3]):
        assert x.dtype == y.dtype, what
        np.testing.assert_array_equal(x, y, err_msg=what)
    for xs, ys in zip(a[3:], b[3:]):
        assert len(xs) == len(ys), what
        for x, y in zip(xs, ys):
            assert x.dtype == y.dtype, what
            np.testing.assert_array_equal(x, y, err_msg=what)


@pytest.mark.parametrize("seed", range(60))
def test_list_walk_gives_the_numpy_walks_tables(seed):
    rng = np.random.default_rng(seed)
    links = _trees_links(rng) if seed % 2 else _random_links(rng, int(rng.integers(1, 40)))
    _assert_same_shape(ml_tree_lists.tree_shape_lists(*links), ml_trees._tree_shape(*links), f"seed {seed}")


def test_list_walk_reads_an_index_out_of_range_as_numpy_does():
    is_leaf = np.array([False, True, True])
    links = (is_leaf, np.array([1, 1, 2]), np.array([2, 1, 2]), np.array([5]))
    for walk in (ml_tree_lists.tree_shape_lists, ml_trees._tree_shape):
        with pytest.raises(IndexError):
            walk(*links)


@pytest.mark.parametrize("seed", range(12))
def test_kernels_built_on_lists_compute_what_the_numpy_built_ones_do(seed, monkeypatch):
    """Random forests of a few to about 60 nodes, a regressor and a classifier, both builds: the
    same forest tables and the same outputs."""
    rng = np.random.default_rng(seed)
    trees = _random_trees(rng, int(rng.integers(1, 5)), 4, int(rng.integers(0, 4)))
    reg = Node.from_proto(helper.make_node("TreeEnsembleRegressor", ["x"], ["y"], domain="ai.onnx.ml", n_targets=2,
                                           **_legacy_tree_attrs(rng, trees, 2, "target")))
    clf_attrs = _legacy_tree_attrs(rng, trees, 3, "class")
    clf = Node.from_proto(helper.make_node("TreeEnsembleClassifier", ["x"], ["label", "p"], domain="ai.onnx.ml",
                                           classlabels_int64s=[0, 1, 2], **clf_attrs))
    x = rng.standard_normal((7, 4)).astype(np.float32)
    x[0, 1] = np.nan
    monkeypatch.setattr(ml_trees, "NATIVE_BUILD", False)  # the C build comes first where it is on
    results = {}
    for small in (0, 10**6):
        monkeypatch.setattr(ml_trees, "SMALL_FOREST_NODES", small)
        r = ml_trees.TreeEnsembleRegressor(reg, None)
        c = ml_trees.TreeEnsembleClassifier(clf, None)
        results[small] = (r.forest, [r.compute([x])[0], *c.compute([x])])
    (fa, ya), (fb, yb) = results[0], results[10**6]
    for field in ("feature", "threshold", "mode", "roots", "weights", "has", "_children"):
        np.testing.assert_array_equal(getattr(fa, field), getattr(fb, field), err_msg=field)
    assert fa.depth == fb.depth
    for a, b in zip(ya, yb):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", ["sk_tree", "skh_adaboost", "skh_stacking"])
def test_corpus_tree_models_built_either_way(name, monkeypatch):
    """Whole sessions with the lists path on and off: onnxruntime's stored outputs either way."""
    path, signatures = load(name)
    model = onnx.load(path)
    graph = Graph.from_proto(model.graph, {o.domain: o.version for o in model.opset_import})
    sizes = [len(n.attr("nodes_modes")) for n in graph.nodes if n.op_type.startswith("TreeEnsemble")]
    assert sizes and min(sizes) <= ml_trees.SMALL_FOREST_NODES  # the path is reached
    monkeypatch.setattr(ml_trees, "NATIVE_BUILD", False)
    for small in (0, ml_trees.SMALL_FOREST_NODES):
        monkeypatch.setattr(ml_trees, "SMALL_FOREST_NODES", small)
        sess = onnxhal.InferenceSession(path, providers=["CPUExecutionProvider"])
        for sig, (feeds, want) in signatures.items():
            check_outputs(sess.run(None, feeds), want, what=f"{name} {sig} small={small}")
