"""TreeEnsembleClassifier and TreeEnsembleRegressor, vectorized: every row walks every tree at
once, one numpy step per tree level (an index array [rows, trees] into the flattened nodes), and the
leaves' weights are summed as rows of a dense [nodes, targets] matrix. Semantics as onnxruntime's
(``tree_ensemble_aggregator.h``): node comparisons in float32, a NaN feature takes the true branch
where ``nodes_missing_value_tracks_true`` says so, base values added after the aggregation, a class
without any score ignored by the argmax, two classes by onnxruntime's binary rules. MIN/MAX
aggregation keeps onnx.reference's kernel."""

from __future__ import annotations

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.hal.run_control import check_terminate
from onnxhal.runtime.providers.cpu.kernels.ml_common import (
    ML,
    as_float_rows,
    logistic,
    post_transform_name,
    reference_kernel,
    transform_scores,
)
from onnxhal.runtime.providers.cpu.kernels.registry import register

_MODES = {"BRANCH_LEQ": 0, "BRANCH_LT": 1, "BRANCH_GTE": 2, "BRANCH_GT": 3, "BRANCH_EQ": 4, "BRANCH_NEQ": 5,
          "LEAF": 6}
#: (row, tree) pairs walked at once: 2**18 keeps a level's gathers within a few ms.
_CHUNK = 1 << 18


def _floats(node: Node, name: str) -> np.ndarray | None:
    v = node.attr(name)
    if v is None:
        v = node.attr(name + "_as_tensor")
    return None if v is None else np.asarray(v, np.float32).reshape(-1)


#: Rows times tree nodes up to which ``_Forest.leaves`` builds a table of every node's test for
#: every row (a few MB at most) rather than walking the trees level by level.
_TABLE_ELEMENTS = 1 << 18


class _Forest:
    """The trees of a node flattened: per node its feature, threshold, mode and the indices of its
    two children (a leaf points at itself), the roots, and the depth to walk."""

    def __init__(self, node: Node, prefix: str, n_out: int) -> None:
        trees = np.asarray(node.attr("nodes_treeids"), np.int64)
        ids = np.asarray(node.attr("nodes_nodeids"), np.int64)
        self.feature = np.asarray(node.attr("nodes_featureids"), np.int64)
        self.threshold = _floats(node, "nodes_values")
        modes = node.attr("nodes_modes")
        if self.threshold is None or modes is None or not (len(trees) == len(ids) == len(self.feature) == len(modes)
                                                             == len(self.threshold)):
            raise InvalidArgument(f"{node.op_type} node {node.name!r}: the nodes_* attributes must all be given "
                                  "with one entry per tree node.")
        try:
            self.mode = np.array([_MODES[m] for m in modes], np.int8)
        except KeyError as exc:
            raise InvalidArgument(f"{node.op_type} node {node.name!r}: unknown node mode {exc.args[0]!r}; "
                                  f"expected one of {sorted(_MODES)}.") from None
        # Built on Python ints (numpy scalars cost about 0.1 us per element access): 888 nodes in
        # 0.5 ms rather than 5.
        trees_l, ids_l, mode_l = trees.tolist(), ids.tolist(), self.mode.tolist()
        index = {(t, i): k for k, (t, i) in enumerate(zip(trees_l, ids_l))}
        true_ids = node.attr("nodes_truenodeids")
        false_ids = node.attr("nodes_falsenodeids")
        missing = node.attr("nodes_missing_value_tracks_true") or [0] * len(ids)
        self.missing_true = np.asarray(missing, bool)
        n = len(ids)
        true_next = list(range(n))
        false_next = list(range(n))
        children = set()
        for k in range(n):
            if mode_l[k] != 6:
                try:
                    tk = index[(trees_l[k], int(true_ids[k]))]
                    fk = index[(trees_l[k], int(false_ids[k]))]
                except KeyError as exc:
                    raise InvalidArgument(f"{node.op_type} node {node.name!r}: tree {exc.args[0][0]} node "
                                          f"{ids_l[k]} points at missing node {exc.args[0][1]}.") from None
                true_next[k], false_next[k] = tk, fk
                children.add(tk)
                children.add(fk)
        self.true_next = np.array(true_next, dtype=np.int_)
        self.false_next = np.array(false_next, dtype=np.int_)
        self.feature[self.mode == 6] = 0
        self._children = np.stack([self.false_next, self.true_next], axis=1).reshape(-1)
        roots: dict[int, int] = {}
        for k in range(n):
            if k not in children:
                roots.setdefault(trees_l[k], k)
        self.roots = np.array([roots[t] for t in sorted(roots)], np.int64)
        self.uniform_mode = int(self.mode[self.mode != 6][0]) if (self.mode != 6).any() and \
            len(set(self.mode[self.mode != 6].tolist())) == 1 else -1
        self.any_missing = bool(self.missing_true.any())
        # depth: the longest root-to-leaf walk
        frontier = self.roots.tolist()
        self.depth = 0
        while frontier:
            nxt = []
            for k in frontier:
                if mode_l[k] != 6:
                    nxt.append(true_next[k])
                    nxt.append(false_next[k])
            if nxt:
                self.depth += 1
            frontier = nxt
            if self.depth > n:
                raise InvalidArgument(f"{node.op_type} node {node.name!r}: the trees have a cycle.")
        #: rows -> (row offsets, true_next and false_next offset by row) for _leaves_by_table
        self._offset_tables: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        # leaf weights, accumulated in the order given (np.add.at adds one entry after another)
        leaf_trees = np.asarray(node.attr(f"{prefix}_treeids"), np.int64).tolist()
        leaf_ids = np.asarray(node.attr(f"{prefix}_nodeids"), np.int64).tolist()
        targets = np.asarray(node.attr(f"{prefix}_ids"), np.int64).tolist()
        weights = _floats(node, f"{prefix}_weights")
        self.weights = np.zeros((n, n_out), np.float32)
        self.has = np.zeros((n, n_out), bool)
        rows, cols = [], []
        for t, i, j, _ in zip(leaf_trees, leaf_ids, targets, weights):
            k = index.get((t, i))
            if k is None or not 0 <= j < n_out:
                raise InvalidArgument(f"{node.op_type} node {node.name!r}: weight for tree {t} node {i} "
                                      f"target {j}: no such leaf or target (of {n_out}).")
            rows.append(k)
            cols.append(j)
        np.add.at(self.weights, (rows, cols), weights[:len(rows)])
        self.has[rows, cols] = True

    def leaves(self, x: np.ndarray) -> np.ndarray:
        """[rows, trees] index of the leaf each row reaches in each tree: per level one gather of
        the nodes' features from the flat input, one comparison, one gather of the next node from
        the [node, false/true] children table (few numpy calls: the rows are usually few)."""
        n, width = x.shape
        if n * self.mode.size <= _TABLE_ELEMENTS:
            return self._leaves_by_table(x)
        flat = np.ascontiguousarray(x).reshape(-1)
        offsets = (np.arange(n, dtype=np.int64) * width)[:, None]
        idx = np.broadcast_to(self.roots, (n, self.roots.size)).copy()
        mode = self.uniform_mode
        for _ in range(self.depth):
            check_terminate()  # one level of every tree for a chunk of rows: bounded work per read
            v = flat[offsets + self.feature[idx]]
            th = self.threshold[idx]
            if mode == 0:
                go = v <= th
            elif mode == 1:
                go = v < th
            elif mode == 2:
                go = v >= th
            elif mode == 3:
                go = v > th
            else:
                m = self.mode[idx]
                go = np.select([m == 0, m == 1, m == 2, m == 3, m == 4, m == 5],
                               [v <= th, v < th, v >= th, v > th, v == th, v != th], False)
            if self.any_missing:
                go |= self.missing_true[idx] & np.isnan(v)
            idx = self._children[2 * idx + go]
        return idx

    def _leaves_by_table(self, x: np.ndarray) -> np.ndarray:
        """``leaves`` for few rows times nodes: every node's test for every row at once, as a
        [rows, nodes] table of the next node (rows offset into one flat table), then one gather per
        level. The same comparisons as the level walk; a small model runs in a handful of numpy calls."""
        n = x.shape[0]
        nodes = self.mode.size
        offset_tables = self._offset_tables.get(n)
        if offset_tables is None:
            offsets = np.arange(0, n * nodes, nodes, dtype=np.int64)[:, None]
            offset_tables = (offsets, self.true_next + offsets, self.false_next + offsets)
            if len(self._offset_tables) < 8:  # a few batch sizes; the tables are read-only
                self._offset_tables[n] = offset_tables
        offsets, true_next, false_next = offset_tables
        v = x.take(self.feature, axis=1)
        th = self.threshold
        mode = self.uniform_mode
        if mode == 0:
            go = v <= th
        elif mode == 1:
            go = v < th
        elif mode == 2:
            go = v >= th
        elif mode == 3:
            go = v > th
        else:
            m = self.mode
            go = np.select([m == 0, m == 1, m == 2, m == 3, m == 4, m == 5],
                           [v <= th, v < th, v >= th, v > th, v == th, v != th], False)
        if self.any_missing:
            go |= self.missing_true & np.isnan(v)
        table = np.where(go, true_next, false_next).reshape(-1)
        idx = (self.roots + offsets).reshape(-1)
        for _ in range(self.depth):
            idx = table[idx]
        return idx.reshape(n, self.roots.size) - offsets

    def scores(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per row, the summed leaf weights and whether any leaf had one; rows in chunks of about
        ``_CHUNK`` (row, tree) pairs, so that one level's work (and the terminate check between
        levels) stays bounded and the [rows, trees, targets] gather does not grow with the batch."""
        step = max(1, _CHUNK // max(1, self.roots.size))
        if x.shape[0] <= step:
            return self._scores(x)
        parts = [self._scores(x[s:s + step]) for s in range(0, x.shape[0], step)]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def _scores(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        leaves = self.leaves(x)
        return self._weight_sums(leaves), np.logical_or.reduce(self.has.take(leaves.T, axis=0), axis=0)

    def sums(self, x: np.ndarray) -> np.ndarray:
        """The first of ``scores``: the sum of the leaf weights per row and target."""
        return self._weight_sums(self.leaves(x))

    def _weight_sums(self, leaves: np.ndarray) -> np.ndarray:
        """[rows, targets]: the weights of each row's leaves summed over the trees in tree order.
        With more than one target, numpy sums [rows, trees, targets] over its trees one tree
        after another; [trees, rows, targets] over its first axis adds the same terms in the same
        order in a quarter of the time (16 rows, 30 trees: 10 against 3 us). One target's sum
        over the trees is numpy's pairwise one, kept as it is."""
        if self.weights.shape[1] > 1:
            return np.add.reduce(self.weights.take(leaves.T, axis=0), axis=0)
        return self.weights[leaves].sum(axis=1)


@register("TreeEnsembleRegressor", since=1, domain=ML)
class TreeEnsembleRegressor(Kernel):
    def __new__(cls, node: Node, ctx: KernelCreateContext) -> Kernel:
        if node.attr("aggregate_function", "SUM") not in ("SUM", "AVERAGE"):
            return reference_kernel(node, ctx)
        return super().__new__(cls)

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.n_targets = int(node.attr("n_targets", 1))
        self.forest = _Forest(node, "target", self.n_targets)
        self.average = node.attr("aggregate_function", "SUM") == "AVERAGE"
        base = _floats(node, "base_values")
        self.base = base if base is not None and base.size == self.n_targets else np.zeros(self.n_targets, np.float32)
        self.transform = post_transform_name(node)

    def compute(self, inputs: list) -> list:
        x = as_float_rows(inputs[0], "TreeEnsembleRegressor")
        scores = self.forest.sums(x)
        if self.average:
            scores = scores / np.float32(self.forest.roots.size)
        return [transform_scores(scores + self.base, self.transform)]


@register("TreeEnsembleClassifier", since=1, domain=ML)
class TreeEnsembleClassifier(Kernel):
    def __new__(cls, node: Node, ctx: KernelCreateContext) -> Kernel:
        labels = node.attr("classlabels_strings") or node.attr("classlabels_int64s") or []
        if len(labels) < 2:
            return reference_kernel(node, ctx)
        return super().__new__(cls)

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        strings = node.attr("classlabels_strings")
        self.labels = np.array(strings, dtype=object) if strings else \
            np.asarray(node.attr("classlabels_int64s"), np.int64)
        k = len(self.labels)
        self.forest = _Forest(node, "class", k)
        base = _floats(node, "base_values")
        self.raw_base = base if base is not None else np.zeros(0, np.float32)
        self.base = base if base is not None and base.size == k else None
        self.transform = post_transform_name(node)
        weights = _floats(node, "class_weights")
        self.binary_case = k == 2 and len(set(node.attr("class_ids"))) == 1
        self.all_positive = bool((weights >= 0).all())

    def compute(self, inputs: list) -> list:
        x = as_float_rows(inputs[0], "TreeEnsembleClassifier")
        if len(self.labels) != 2 and self.base is not None:
            # with base values every class has a score: the first highest wins, no leaf flags needed
            scores = self.forest.sums(x) + self.base
            return [self.labels[np.argmax(scores, axis=1)], transform_scores(scores, self.transform)]
        scores, has = self.forest.scores(x)
        if len(self.labels) == 2:
            return self._two_classes(scores, has)
        # the first highest score among the classes that have one
        label = self.labels[np.argmax(np.where(has, scores, -np.inf), axis=1)]
        return [label, transform_scores(scores, self.transform)]

    def _two_classes(self, scores: np.ndarray, has: np.ndarray) -> list:
        """onnxruntime's rules for two classes (TreeAggregatorClassifier::FinalizeScores and
        _set_score_binary), row by row in arrays: the scores' second column may be dropped (one
        score), the label comes from the positive score's sign or 0.5, and one score is written as
        two columns by the rule its label took."""
        s0, s1 = scores[:, 0].copy(), scores[:, 1].copy()
        h0, h1 = has[:, 0].copy(), has[:, 1].copy()
        base = self.raw_base
        if base.size == 2:
            tied = h1.copy()
            s1 = np.where(tied, base[1] + s0, s1 + base[1])
            s0 = np.where(tied, -s1, s0 + base[0])
            h1 = h1 | tied
            one_score = np.zeros_like(h1)
        else:
            if base.size == 1:
                s0 = s0 + base[0]
            one_score = ~h1
        pos = np.where(h1, s1, np.where(h0, s0, 0))
        if self.binary_case:
            threshold = 0.5 if self.all_positive else 0.0
            label_index = (pos > threshold).astype(np.int64)
            mode = "positive" if self.all_positive else "mixed"
        else:
            label_index = (pos > 0).astype(np.int64)  # onnxruntime's positive (1) and negative (0) labels
            mode = "mixed" if base.size == 0 else "none"
        if self.labels.dtype == object:
            label = self.labels[label_index]
        else:
            label = np.where(label_index == 1, np.int64(1), np.int64(0)) if not self.binary_case else \
                self.labels[label_index]
        # rows written from the single score take ``ones`` below: the pair's transform only for the others
        every_one = one_score.size > 0 and bool(one_score.all())
        two = None if every_one else transform_scores(np.stack([s0, s1], axis=1), self.transform)
        if one_score.any():
            single = s0[:, None]
            if self.transform == "PROBIT":
                ones = np.concatenate([transform_scores(single, "PROBIT"), np.zeros_like(single)], axis=1)
            elif mode == "positive":
                ones = np.concatenate([1 - single, single], axis=1)
            elif mode == "mixed" and self.transform == "LOGISTIC":
                ones = np.concatenate([logistic(-single), logistic(single)], axis=1)
            elif mode == "mixed":
                ones = np.concatenate([-single, single], axis=1)
            else:
                ones = np.concatenate([single, np.zeros_like(single)], axis=1)
            two = ones.astype(np.float32) if every_one else np.where(one_score[:, None], ones.astype(np.float32), two)
        return [label, two.astype(np.float32)]
