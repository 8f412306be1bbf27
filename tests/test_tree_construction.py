"""The tree kernels' construction shortcuts against their plain forms: ``_NodeIndex``'s dense index
(tree ids ascending, each tree's ids 0, 1, ...) against a dictionary of the pairs, the roots read
from a dense layout against ``np.unique``'s, and ``Node.attr_array``'s two reads (the parsed list
below ``_FIELD_READ_FROM`` values, the proto's field from it) against each other."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from onnxhal.hal import graph
from onnxhal.hal.graph import Node
from onnxhal.runtime.providers.cpu.kernels import ml_trees
from tests.test_ml_ops import _legacy_tree_attrs, _random_trees


def _layouts(rng: np.random.Generator) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(name, tree ids, node ids): dense, dense but for one id, trees descending, shuffled, a pair
    given twice, ids offset by 1."""
    counts = rng.integers(1, 6, int(rng.integers(1, 5)))
    trees = np.repeat(np.arange(counts.size) * 3, counts)  # tree ids with gaps
    ids = np.concatenate([np.arange(c) for c in counts])
    gap = ids.copy()
    gap[-1] += 1
    order = rng.permutation(ids.size)
    twice = np.concatenate([ids, ids[:1]]), np.concatenate([trees, trees[:1]])
    return [("dense", trees, ids), ("gap", trees, gap), ("descending", trees[::-1].copy(), ids[::-1].copy()),
            ("shuffled", trees[order], ids[order]), ("twice", twice[1], twice[0]), ("offset", trees, ids + 1)]


def _reference_find(trees: np.ndarray, ids: np.ndarray, qt: np.ndarray, qi: np.ndarray) -> np.ndarray:
    at = {}
    for k, pair in enumerate(zip(trees.tolist(), ids.tolist())):
        at[pair] = k  # the last position of a pair given twice
    return np.array([at.get(p, -1) for p in zip(qt.tolist(), qi.tolist())], np.int64)


@pytest.mark.parametrize("seed", range(40))
def test_node_index_finds_what_a_dictionary_finds(seed):
    rng = np.random.default_rng(seed)
    for name, trees, ids in _layouts(rng):
        index = ml_trees._NodeIndex(trees.astype(np.int64), ids.astype(np.int64))
        if name in ("dense", "gap", "offset"):  # the others may be dense by chance (one node)
            assert (index.dense is not None) == (name == "dense"), name
        # every pair, pairs off by one in either id, negative and absent ids
        qt = np.concatenate([trees, trees, trees + 1, trees, [-1, 99]]).astype(np.int64)
        qi = np.concatenate([ids, ids + 1, ids, ids - 1, [0, 0]]).astype(np.int64)
        np.testing.assert_array_equal(index.find(qt, qi), _reference_find(trees, ids, qt, qi), err_msg=name)


@pytest.mark.parametrize("seed", range(20))
def test_roots_of_a_dense_layout_are_those_of_any_order(seed):
    """The same trees written dense (roots from the runs of tree ids) and with their nodes shuffled
    (roots by ``np.unique``): the same root nodes, tree by tree, and the same forest walk."""
    rng = np.random.default_rng(seed)
    attrs = _legacy_tree_attrs(rng, _random_trees(rng, int(rng.integers(1, 5)), 4, int(rng.integers(0, 4))),
                               2, "target")
    dense = Node.from_proto(helper.make_node("TreeEnsembleRegressor", ["x"], ["y"], domain="ai.onnx.ml",
                                             n_targets=2, **attrs))
    order = rng.permutation(len(attrs["nodes_treeids"]))
    shuffled_attrs = {k: ([v[i] for i in order] if k.startswith("nodes_") else v) for k, v in attrs.items()}
    shuffled = Node.from_proto(helper.make_node("TreeEnsembleRegressor", ["x"], ["y"], domain="ai.onnx.ml",
                                                n_targets=2, **shuffled_attrs))
    a = ml_trees._legacy_forest(dense, "target", 2)
    b = ml_trees._legacy_forest(shuffled, "target", 2)
    ids = np.array(attrs["nodes_nodeids"])
    pairs = list(zip(attrs["nodes_treeids"], attrs["nodes_nodeids"]))
    position = {pairs[i]: k for k, i in enumerate(order)}
    assert [position[pairs[r]] for r in a.roots.tolist()] == b.roots.tolist()
    assert (ids[a.roots] == 0).all()  # a converter's tree starts at node 0
    x = rng.standard_normal((9, 4)).astype(np.float32)
    np.testing.assert_array_equal(a.aggregate(x)[0], b.aggregate(x)[0])


@pytest.mark.parametrize("count", [1, 5, 63, 64, 65, 300])
def test_attr_array_reads_the_list_and_the_proto_alike(count, monkeypatch):
    rng = np.random.default_rng(count)
    ints = rng.integers(-2**63, 2**63 - 1, count, dtype=np.int64).tolist()
    floats = rng.standard_normal(count).astype(np.float32).tolist()
    node = Node.from_proto(helper.make_node("X", ["a"], ["b"], ints=ints, floats=floats))
    got = {}
    for read_from in (0, 10**9):  # every list from its proto; every list as parsed
        monkeypatch.setattr(graph, "_FIELD_READ_FROM", read_from)
        got[read_from] = node.attr_array("ints", np.int64), node.attr_array("floats", np.float32), \
            node.attr_array("ints", bool)
    for a, b in zip(got[0], got[10**9]):
        assert a.dtype == b.dtype and a.shape == (count,)
        np.testing.assert_array_equal(a, b)
    assert got[0][0].tolist() == ints
