"""The tree kernels' build on Python lists, for small forests (``TREE_BUILD_PATHS["lists"]``).

The canonical build (``ml_trees._NodeIndex``, ``_links``, ``_tree_shape``) makes a few numpy calls per
tree level and per lookup, whatever the node count: on a forest of a few dozen nodes (an AdaBoost
stump, a decision tree) those calls, 1-2 us each, are most of the kernel's creation, which is then
as long as onnxruntime's whole session creation. Here the same results come from loops over the
nodes as Python lists, which cost about a tenth of a microsecond a node: cheaper up to about 100
nodes (``ml_trees.SMALL_FOREST_NODES``). Each function returns what its canonical form returns (same values, same dtypes);
tests/test_tree_build_lists.py holds them to it."""

from __future__ import annotations

import numpy as np


class ListNodeIndex:
    """``ml_trees._NodeIndex`` as a dict: (tree id, node id) pairs to node positions, the last
    position of a pair given twice, -1 for a pair not given."""

    def __init__(self, trees: list[int], ids: list[int]) -> None:
        # a later pair overwrites an earlier one: the last position, as the canonical index
        self.at = dict(zip(zip(trees, ids), range(len(trees))))

    def find(self, trees: np.ndarray, ids: np.ndarray) -> np.ndarray:
        get = self.at.get
        return np.array([get(k, -1) for k in zip(trees.tolist(), ids.tolist())], np.int64).reshape(trees.shape)


def forest_links(index: ListNodeIndex, trees: list[int], inner: list[bool], true_ids: list[int] | None,
                 false_ids: list[int] | None) -> tuple[list[int], list[int], list[int], tuple[int, int] | None]:
    """``ml_trees._legacy_forest``'s links by loops: per node the positions of its true and false
    children (a leaf's are its own), the roots (per tree id, in ascending order, its first node that
    is no interior node's child) and, where an interior node names a child no node is, (that
    node's position, the child's id) for the error, the first such node; the lists then are None."""
    n = len(trees)
    true_next, false_next = list(range(n)), list(range(n))
    child = [False] * n
    get = index.at.get
    for k in range(n):
        if not inner[k]:
            continue
        tree, t_id, f_id = trees[k], true_ids[k], false_ids[k]
        t, f = get((tree, t_id), -1), get((tree, f_id), -1)
        if t < 0 or f < 0:
            return [], [], [], (k, t_id if t < 0 else f_id)
        true_next[k], false_next[k] = t, f
        child[t] = child[f] = True
    first: dict[int, int] = {}
    for k in range(n):
        if not child[k]:
            first.setdefault(trees[k], k)
    return true_next, false_next, [first[t] for t in sorted(first)], None


def tree_shape_lists(is_leaf: np.ndarray, true_next: np.ndarray, false_next: np.ndarray, roots: np.ndarray,
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[np.ndarray], list[np.ndarray]] | None:
    """``ml_trees._tree_shape`` by loops over lists: per node its tree's slot, its leaf count and
    the number of its first leaf in its tree, the nodes of each level and the interior nodes of
    each level; None where a node is reached twice. Indices are read as numpy reads them (a
    negative one from the end; one out of range raises IndexError)."""
    n = is_leaf.size
    leaf, t_of, f_of = is_leaf.tolist(), true_next.tolist(), false_next.tolist()
    frontier, slots = roots.tolist(), list(range(roots.size))
    levels: list[list[int]] = []
    level_slots: list[list[int]] = []
    inners: list[list[int]] = []
    children: list[tuple[list[int], list[int]]] = []
    visited = 0
    while frontier:
        visited += len(frontier)
        if visited > n:
            return None
        levels.append(frontier)
        level_slots.append(slots)
        inner = [v for v in frontier if not leaf[v]]
        kept = [s for v, s in zip(frontier, slots) if not leaf[v]]
        t, f = [t_of[v] for v in inner], [f_of[v] for v in inner]
        inners.append(inner)
        children.append((t, f))
        frontier = t + f
        slots = kept + kept
    order = [v % n for level in levels for v in level]  # Python's % is numpy's remainder: 0..n-1
    if len(set(order)) != len(order):
        return None
    owner = [-1] * n
    for level, level_slot in zip(levels, level_slots):
        for v, s in zip(level, level_slot):
            owner[v] = s
    count = [1 if x else 0 for x in leaf]
    for inner, (t, f) in zip(reversed(inners), reversed(children)):
        for v, a, b in zip(inner, t, f):
            count[v] = count[a] + count[b]
    first = [0] * n
    for inner, (t, f) in zip(inners, children):
        for v, a, b in zip(inner, t, f):
            at = first[v]
            first[a] = at
            first[b] = at + count[a]
    return (np.array(owner, np.int64), np.array(count, np.int64), np.array(first, np.int64),
            [np.array(level, np.int64) for level in levels], [np.array(inner, np.int64) for inner in inners])
