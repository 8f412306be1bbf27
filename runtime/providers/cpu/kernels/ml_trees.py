"""TreeEnsembleClassifier and TreeEnsembleRegressor, vectorized: every row walks every tree at
once, one numpy step per tree level (an index array [rows, trees] into the flattened nodes), and the
leaves' weights are summed as rows of a dense [nodes, targets] matrix. Semantics as onnxruntime's
(``tree_ensemble_aggregator.h``): node comparisons in float32, a NaN feature takes the true branch
where ``nodes_missing_value_tracks_true`` says so, base values added after the aggregation (SUM,
AVERAGE, MIN, MAX), a class without any score ignored by the argmax, two classes by onnxruntime's
binary rules; and the opset-5 TreeEnsemble on the same walk.

Routes (``TREE_PATHS``): the numpy kernel is the canonical one (the walk a level at a time, or the
leaf bits); where the optional C extension ``_native`` was built (pyproject.toml's ext-modules), a
forest it takes is walked there, tree by tree over blocks of rows, to the same bits (tests/test_tree_native.py)."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from types import ModuleType

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.ep import INLINE_APPLY
from onnxhal.hal.errors import InvalidArgument
from onnxhal.hal.run_control import check_terminate
from onnxhal.runtime.providers.cpu.kernels.kernel_paths import path_table
from onnxhal.runtime.providers.cpu.kernels.ml_common import (
    ML,
    as_float_rows,
    logistic_into,
    post_transform_name,
    reference_kernel,
    score_transform,
    transform_scores,
)
from onnxhal.runtime.providers.cpu.kernels.ml_tree_lists import ListNodeIndex, forest_links, tree_shape_lists
from onnxhal.runtime.providers.cpu.kernels.native_kernels import NATIVE_SWITCH, native_module
from onnxhal.runtime.providers.cpu.kernels.numerics import SOFTMAX_BOUND, softmax_bounded
from onnxhal.runtime.providers.cpu.kernels.registry import register

_MODES = {"BRANCH_LEQ": 0, "BRANCH_LT": 1, "BRANCH_GTE": 2, "BRANCH_GT": 3, "BRANCH_EQ": 4, "BRANCH_NEQ": 5,
          "LEAF": 6}


def _floats(node: Node, name: str) -> np.ndarray | None:
    v = node.attr_array(name, np.float32)
    if v is not None:
        return v
    v = node.attr(name)
    if v is None:
        v = node.attr(name + "_as_tensor")
    return None if v is None else np.asarray(v, np.float32).reshape(-1)


def _ints(node: Node, name: str) -> np.ndarray:
    """An ints attribute as int64 (``Node.attr_array``: tree attributes hold one int per node)."""
    v = node.attr_array(name, np.int64)
    return v if v is not None else np.asarray(node.attr(name), np.int64)


def _thresholds(node: Node) -> np.ndarray | None:
    """``nodes_values`` as float32, or ``nodes_values_as_tensor`` in its own precision (float64 for
    a double tensor, which onnxruntime compares in double: ``TreeEnsembleCommon``'s ThresholdType)."""
    v = node.attr_array("nodes_values", np.float32)
    if v is not None:
        return v
    v = node.attr("nodes_values")
    if v is None:
        v = node.attr("nodes_values_as_tensor")
        if v is not None and np.asarray(v).dtype == np.float64:
            return np.asarray(v, np.float64).reshape(-1)
    return None if v is None else np.asarray(v, np.float32).reshape(-1)


def _compared_rows(x: np.ndarray, threshold: np.ndarray, op: str) -> np.ndarray:
    """The input as rows [N, C] in the comparisons' precision, as onnxruntime's legacy tree kernels:
    a double input against its thresholds widened to double (exact), any other input in float32.
    Double thresholds are read for a double input only: onnxruntime fails to load them for a
    float32 or integer X, and so does this."""
    if isinstance(x, np.ndarray) and x.dtype == np.float64:
        return x.reshape(1, -1) if x.ndim == 1 else x.reshape(x.shape[0], -1)
    if threshold.dtype == np.float64:
        raise InvalidArgument(f"{op}: nodes_values_as_tensor is a double tensor but X is "
                              f"{getattr(x, 'dtype', type(x).__name__)}; onnxruntime reads double thresholds "
                              "for a double X only. Feed X as float64, or store the thresholds as float "
                              "(nodes_values).")
    return as_float_rows(x, op)


LEAF, MEMBER = 6, 7

#: [[-1, 1]]: a column s times it is the columns [-s, s]
_NEGATED_AND_AS_IS = np.array([[-1, 1]], np.float32)
#: [[1, 0]]: added to the columns [-s, s], the columns [1 - s, s]
_ONE_AND_ZERO = np.array([[1, 0]], np.float32)

def _compare(v: np.ndarray, th: np.ndarray, mode: int) -> np.ndarray:
    """The branch test of one node mode for every element: BRANCH_LEQ, LT, GTE, GT (0-3)."""
    if mode == 0:
        return v <= th
    if mode == 1:
        return v < th
    if mode == 2:
        return v >= th
    return v > th


def _tree_sum(w: np.ndarray) -> np.ndarray:
    """[trees, rows, outputs] weights summed over the trees in tree order, as onnxruntime adds
    them: numpy's reduce adds a contiguous run of over 8 elements pairwise, which it is where
    there is one output of one row."""
    if w.shape[1] * w.shape[2] == 1:
        return np.add.accumulate(w, axis=0)[-1]
    return np.add.reduce(w, axis=0)


#: (row, tree) pairs walked between two reads of RunOptions.terminate (``aggregate``).
_CHUNK = 1 << 18


def _depth(what: str, mode: np.ndarray, true_next: np.ndarray, false_next: np.ndarray, roots: np.ndarray) -> int:
    """The longest root-to-leaf walk of trees that may share nodes (a walk longer than the node
    count is a cycle)."""
    depth = 0
    frontier = np.unique(roots)
    while frontier.size:
        frontier = frontier[mode[frontier] != LEAF]
        if not frontier.size:
            break
        depth += 1
        if depth > mode.size:
            raise InvalidArgument(f"{what}: the trees have a cycle.")
        frontier = np.unique(np.concatenate([true_next[frontier], false_next[frontier]]))
    return depth


#: The routes of the tree kernels, by name; a ``_Forest``'s ``native`` is its C route or None.
TREE_PATHS = path_table("TreeEnsemble", "the walk a level at a time (numpy)")
TREE_PATHS.add("walk", "canonical: every row walks every tree a level at a time (numpy calls per level)")
TREE_PATHS.add("leaf_bits", "numpy, for forests of trees of at most 64 leaves, one comparison kind (BRANCH_LEQ-GT) "
                             "and no shared node, where the rows' (row, node) cells fit _BITS_CELLS a chunk")
TREE_PATHS.add("native", "the C extension _native is built and ONNXHAL_NATIVE_KERNELS is not 0; node modes "
                       "BRANCH_LEQ-BRANCH_NEQ (no BRANCH_MEMBER), float32 or float64 leaf weights, one "
                       "missing-value flag per node; per run X float32 or float64 rows wider than the largest "
                       "feature an interior node reads (else the numpy routes)")

#: How a forest's tables are built at kernel creation (node index, tree shape), by node count.
TREE_BUILD_PATHS = path_table("TreeEnsemble.build", "numpy calls per tree level and per lookup "
                              "(_NodeIndex, _links, _tree_shape)")
TREE_BUILD_PATHS.add("lists", "a forest of at most SMALL_FOREST_NODES nodes: the node index as a dict, the "
                              "children's positions and roots and the tree walk as loops over lists "
                              "(_links_lists, ml_tree_lists.py), the same tables")
TREE_BUILD_PATHS.add("native", "the C extension _native is built, ONNXHAL_NATIVE_KERNELS is not 0 and NATIVE_BUILD "
                               "is on; nodes_truenodeids / nodes_falsenodeids one per node where an interior node "
                               "reads them: index, links, roots, leaf positions and tree walk in one C call "
                               "(_native.forest_build, _links_native), the same tables, whatever the node count")

#: Node count up to which a forest is indexed and walked on Python lists (``TREE_BUILD_PATHS``; 0:
#: never). A numpy call costs 1-2 us whatever its size, a list loop about 0.1 us a node.
SMALL_FOREST_NODES = 64

#: ``TREE_BUILD_PATHS["native"]`` on (False: the list or numpy build; benchmarks/creation_ab.py's switch)
NATIVE_BUILD = True

__all__ = ["NATIVE_BUILD", "NATIVE_SWITCH", "SMALL_FOREST_NODES", "TREE_BUILD_PATHS", "TREE_PATHS"]


def _shape_of(is_leaf: np.ndarray, true_next: np.ndarray, false_next: np.ndarray, roots: np.ndarray,
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """``_tree_shape`` by ``TREE_BUILD_PATHS``, as ``_flat_shape`` gives it."""
    if is_leaf.size <= SMALL_FOREST_NODES:
        return _flat_shape(tree_shape_lists(is_leaf, true_next, false_next, roots), roots.size)
    return _flat_shape(_tree_shape(is_leaf, true_next, false_next, roots), roots.size)


def _flat_shape(shape: tuple | None, trees: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                                          np.ndarray] | None:
    """A ``_tree_shape`` as the forest keeps it: per node its tree's slot, leaf count and first
    leaf's number, the visited nodes level by level in one array, and per tree its longest
    root-to-leaf walk (the levels where it has an interior node); None stays None."""
    if shape is None:
        return None
    owner, count, first, levels, inners = shape
    tree_depth = np.zeros(trees, np.int64)
    for i, inner in enumerate(inners):
        tree_depth[owner[inner]] = i + 1
    return owner, count, first, np.concatenate(levels), tree_depth


class _Forest:
    """The trees of a node flattened: per node its feature, threshold, mode and the indices of its
    two children (a leaf points at itself), the roots, the depth to walk, and per node a dense row
    of its leaf weights over the outputs (``has`` says which outputs a leaf writes)."""

    def __init__(self, what: str, feature: np.ndarray, threshold: np.ndarray, mode: np.ndarray,
                 true_next: np.ndarray, false_next: np.ndarray, missing_true: np.ndarray, roots: np.ndarray,
                 weights: np.ndarray, has: np.ndarray, members: dict[int, np.ndarray] | None = None,
                 shape: tuple | None | bool = False) -> None:
        """``shape``: the trees' ``_flat_shape`` where the build made it (None: they share a node),
        False: made here."""
        self.feature = np.where(mode == LEAF, 0, feature).astype(np.int64)
        self.threshold, self.mode, self.roots = threshold, mode, roots
        self.missing_true = missing_true
        self.weights, self.has = weights, has
        self.members = members or {}
        # [node, false/true] flattened, filled by two strided writes (np.stack costs several calls more)
        self._children = children = np.empty(2 * mode.size, np.int64)
        children[0::2], children[1::2] = false_next, true_next
        inner = mode[mode != LEAF]
        self.uniform_mode = int(inner[0]) if inner.size and (inner == inner[0]).all() and inner[0] != MEMBER else -1
        self.any_missing = bool(missing_true.any())
        # trees that share no node (as converters write them): their levels give the depth, and the
        # leaf bits are built from the same walk
        if shape is False:
            shape = _shape_of(mode == LEAF, true_next, false_next, roots) if roots.size else None
        if shape is not None:
            # the longest root-to-leaf walk
            self.depth = int(shape[4].max()) if shape[4].size else 0
        else:
            self.depth = _depth(what, mode, true_next, false_next, roots)
        # the leaf bits are built at their first use (``_bits``): where the C route takes the rows
        # they are never read, and their tables are most of a small forest's build
        self._shape, self._true_next = shape, true_next
        self._leaf_bits: _LeafBits | None = None
        self._bits_built = False
        self._bits_per_row = False
        #: which outputs the trees write, where that is the same for every row (else None)
        #: ``_written_outputs`` (the leaves, which outputs they write), kept for the leaf bits and the
        #: classifier's score bound; None where the leaf bits do not apply
        self.leaves_written = _written_outputs(self, shape) if _LeafBits.applies(self, shape) else None
        self.written_const = None if self.leaves_written is None else self.leaves_written[1]
        #: every output is written by some tree for every row (known when the leaves say so)
        self.all_written = self.written_const is not None and bool(self.written_const.all())
        #: the C route (``TREE_PATHS["native"]``), or None
        self.native = _NativeTrees.build(self, true_next, false_next, weights, shape)

    @property
    def _bits(self) -> _LeafBits | None:
        """The leaf bits (``TREE_PATHS["leaf_bits"]``), built at the first call; None where they
        do not apply."""
        if not self._bits_built:
            # threads running one session may build them at once: each builds the same bits, and
            # the flag is set last, so that a thread that reads it finds them and ``_bits_per_row``
            bits = _LeafBits.build(self, self._shape, self._true_next)
            # Past one chunk, per row the leaf bits cost about their columns (nodes) and the walk its
            # trees x (depth + outputs): many nodes a tree over a shallow walk to few outputs (a
            # forest regressor's) go by the walk (measured on sklearn forests of 10-300 trees, 1000 rows)
            self._bits_per_row = bits is not None and \
                bits.columns <= (5 + self.weights.shape[1]) * self.roots.size * max(1, self.depth)
            self._leaf_bits = bits
            self._bits_built = True
        return self._leaf_bits

    def leaves(self, x: np.ndarray) -> np.ndarray:
        """[rows, trees] index of the leaf each row reaches in each tree: per level one gather of
        the nodes' features from the flat input, one comparison, one gather of the next node from
        the [node, false/true] children table (few numpy calls: the rows are usually few)."""
        n, width = x.shape
        flat = np.ascontiguousarray(x).reshape(-1)
        offsets = (np.arange(n, dtype=np.int64) * width)[:, None]
        idx = np.broadcast_to(self.roots, (n, self.roots.size)).copy()
        mode = self.uniform_mode
        for _ in range(self.depth):
            check_terminate()  # one level of every tree for a chunk of rows: bounded work per read
            v = flat[offsets + self.feature[idx]]
            th = self.threshold[idx]
            if 0 <= mode <= 3:
                go = _compare(v, th, mode)
            else:
                m = self.mode[idx]
                go = np.select([m == 0, m == 1, m == 2, m == 3, m == 4, m == 5],
                               [v <= th, v < th, v >= th, v > th, v == th, v != th], False)
                for k, values in self.members.items():
                    at = idx == k
                    if at.any():
                        # exact membership, as the spec (onnxruntime takes integer sets only and
                        # agrees on integer inputs)
                        go[at] = np.isin(v[at], values)
            if self.any_missing:
                go |= self.missing_true[idx] & np.isnan(v)
            idx = self._children[2 * idx + go]
        return idx

    def aggregate(self, x: np.ndarray, how: str = "SUM", written: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """The trees' leaf weights per row aggregated (SUM, AVERAGE, MIN, MAX: an output no tree
        wrote is 0), and which outputs any tree wrote ([rows, outputs]; with ``written`` False, where
        that is the same for every row, one row of it). Rows go in chunks, so that the work between
        two terminate checks is bounded: about ``_BITS_CELLS`` (row, node) cells by the leaf bits,
        else about ``_CHUNK`` (row, tree) pairs a level of the walk (by the C route, about
        ``_NATIVE_VISITS`` node visits)."""
        native = self.native
        if native is not None and native.takes(x):
            return native.aggregate(x, how)
        step = self._bits_rows(x)
        by_bits = step is not None
        if not by_bits:
            step = max(1, _CHUNK // max(1, self.roots.size))
        if x.shape[0] <= step:
            return self._aggregate(x, how, written, by_bits)
        parts = [self._aggregate(x[i:i + step], how, True, by_bits) for i in range(0, x.shape[0], step)]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def _bits_rows(self, x: np.ndarray) -> int | None:
        """How many rows of ``x`` go at once by the leaf bits; None where they do not apply (or
        ``_BITS_CELLS`` is 0)."""
        bits = self._bits
        if bits is None or x.shape[1] <= bits.max_feature or not _BITS_CELLS or \
                (x.shape[0] * bits.columns > _BITS_CELLS and not self._bits_per_row):
            return None
        return max(1, _BITS_CELLS // bits.columns)

    def sums(self, x: np.ndarray, how: str, leaf_bits: Callable[[], _LeafBits] | None = None,
             native: _NativeTrees | None = None) -> np.ndarray | None:
        """``aggregate``'s scores for SUM or AVERAGE by the C route or straight from the leaf bits
        (``leaf_bits``, which makes them, and ``native``: copies of them with other weights), where the trees write the
        same outputs for every row (``written_const``) and the rows are few (they then fit one
        chunk); None where ``aggregate`` must decide."""
        if leaf_bits is None:
            native = self.native
        if native is not None and self.written_const is not None and native.takes(x):
            return native.sums(x, how)  # None past one call's rows: ``aggregate`` takes them in chunks
        bits = self._bits if leaf_bits is None else leaf_bits()
        if bits is None or self.written_const is None or x.shape[0] * bits.columns > _BITS_CELLS or \
                x.shape[1] <= bits.max_feature:
            return None
        # one chunk of rows: the executor reads the terminate flag around it
        scores = bits.sums(x)
        return scores if how == "SUM" else scores / scores.dtype.type(self.roots.size)

    def _aggregate(self, x: np.ndarray, how: str, written: bool, by_bits: bool) -> tuple[np.ndarray, np.ndarray]:
        bits = self._bits
        if by_bits:
            check_terminate()
            if bits.written is not None and how in ("SUM", "AVERAGE"):  # the same outputs for every row
                # [trees, rows, outputs] summed over the trees in tree order, as onnxruntime adds them
                scores = _tree_sum(bits.tree_weights(x))
                if how == "AVERAGE":
                    scores = scores / scores.dtype.type(self.roots.size)
                # which outputs were written: asked for, else the one row (the same for every row)
                return scores, bits.written_row.repeat(scores.shape[0], axis=0) if written else bits.written_row
            leaves = bits.leaves(x)
        else:
            leaves = self.leaves(x)
        has = self.has[leaves]
        written = has.any(axis=1)
        if how in ("SUM", "AVERAGE"):
            scores = _tree_sum(self.weights.take(leaves.T, axis=0))
            if how == "AVERAGE":
                scores = scores / scores.dtype.type(self.roots.size)
            return scores, written
        w = self.weights[leaves]
        fill = np.inf if how == "MIN" else -np.inf
        pick = np.where(has, w, w.dtype.type(fill))
        scores = pick.min(axis=1) if how == "MIN" else pick.max(axis=1)
        return np.where(written, scores, 0).astype(w.dtype), written

    def scores(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.aggregate(x, "SUM")


#: node visits (rows x trees x depth) of one call of the C route: the terminate flag is read between two
_NATIVE_VISITS = 1 << 22
_NATIVE_X = (np.dtype(np.float32), np.dtype(np.float64))
_NATIVE_HOW = {"SUM": 0, "AVERAGE": 1, "MIN": 2, "MAX": 3}


class _NativeTrees:
    """A forest in the C kernel (``_native.Forest``: nodes, roots and leaf weights copied once),
    walked tree by tree over blocks of 8 rows, to the same scores as the numpy routes (``_native.c`` says how)."""

    def __init__(self, forest: _Forest, true_next: np.ndarray, false_next: np.ndarray, weights: np.ndarray,
                 tree_depth: np.ndarray, native: ModuleType) -> None:
        inner = forest.mode != LEAF
        self.trees = native.Forest(
            forest.feature, forest.threshold.astype(np.float64),  # widened: exact, and the same comparisons
            forest.mode.astype(np.int8), np.asarray(true_next, np.int64), np.asarray(false_next, np.int64),
            np.asarray(forest.missing_true, bool), np.asarray(forest.roots, np.int64),
            np.ascontiguousarray(weights), np.ascontiguousarray(forest.has), weights.shape[1], tree_depth)
        #: the largest column an interior node reads (-1: none)
        self.max_feature = int(forest.feature[inner].max()) if inner.any() else -1
        self.dtype, self.outputs = weights.dtype, weights.shape[1]
        self.chunk_rows = max(1, _NATIVE_VISITS // max(1, forest.roots.size * max(1, forest.depth)))
        self._true_next, self._false_next, self._tree_depth = true_next, false_next, tree_depth
        self._native = native

    @classmethod
    def build(cls, forest: _Forest, true_next: np.ndarray, false_next: np.ndarray,
              weights: np.ndarray, shape: tuple | None) -> _NativeTrees | None:
        """The C route of ``forest`` with leaf ``weights`` [nodes, outputs]; None where
        ``TREE_PATHS["native"]``'s build condition does not hold."""
        n = forest.mode.size
        native = native_module()
        if native is None or forest.members or (forest.mode > LEAF).any() or \
                weights.dtype not in _NATIVE_X or weights.ndim != 2 or weights.shape[1] < 1 or \
                forest.missing_true.size != n or forest.threshold.size != n or n >= 1 << 31:
            return None
        # per tree its longest walk (the C walk takes that many steps, a leaf's children being
        # itself), from ``_flat_shape``; trees that share nodes take the forest's depth
        tree_depth = shape[4] if shape is not None else np.full(forest.roots.size, forest.depth, np.int64)
        return cls(forest, true_next, false_next, weights, tree_depth, native)

    def with_weights(self, forest: _Forest, weights: np.ndarray) -> _NativeTrees:
        """The same trees with other leaf weights [nodes, outputs]."""
        return _NativeTrees(forest, self._true_next, self._false_next, weights, self._tree_depth, self._native)

    def takes(self, x: np.ndarray) -> bool:
        """Whether a run's rows [N, C] go by this route."""
        return x.dtype in _NATIVE_X and x.ndim == 2 and x.shape[1] > self.max_feature

    def sums(self, x: np.ndarray, how: str) -> np.ndarray | None:
        """SUM or AVERAGE of rows this route ``takes``, where they fit one call; else None."""
        if x.shape[0] > self.chunk_rows:
            return None
        if not x.flags.c_contiguous:
            x = np.ascontiguousarray(x)
        scores = np.empty((x.shape[0], self.outputs), self.dtype)
        self.trees.evaluate(x, _NATIVE_HOW[how], scores, None)
        return scores

    def aggregate(self, x: np.ndarray, how: str) -> tuple[np.ndarray, np.ndarray]:
        """``_Forest.aggregate``'s scores and which outputs a tree wrote, per row."""
        x = np.ascontiguousarray(x)
        scores = np.empty((x.shape[0], self.outputs), self.dtype)
        written = np.empty((x.shape[0], self.outputs), bool)
        code, step = _NATIVE_HOW[how], self.chunk_rows
        if x.shape[0] <= step:  # one call: the executor reads the terminate flag around it
            self.trees.evaluate(x, code, scores, written)
            return scores, written
        for i in range(0, x.shape[0], step):
            check_terminate()
            self.trees.evaluate(x[i:i + step], code, scores[i:i + step], written[i:i + step])
        return scores, written


#: (row, interior node) cells of one chunk of rows by the leaf bits (0: the walk only); inputs up to
#: one chunk always go by the leaf bits (a few numpy calls against several per level).
_BITS_CELLS = 1 << 16

#: (row, node) cells up to which a forest of trees over 8 interior nodes selects each node's mask
#: (one call) instead of reading its groups' masks from a table (three calls, less work per cell)
_SELECT_CELLS = 1 << 11

#: the most weights (bytes x outputs) a table of one-group trees' leaf weights holds (16 MB of
#: float32: a boosted multi-class model of thousands of trees reads slots, then weights)
_TABLE_WEIGHTS = 1 << 22


class _LeafBits:
    """The leaf each row reaches in each tree in a fixed number of numpy calls, whatever the depth
    (the walk costs several per level, and a run of a few rows is all call overhead): every
    interior node is compared at once, and each comparison keeps, in a bit mask over its tree's
    leaves, the leaves its outcome still allows; AND over a tree's nodes leaves exactly one bit set,
    the leaf the walk reaches (a node off the row's path only clears leaves of its own subtree).
    The AND of 8 nodes is read from a table: a tree's nodes go in groups of 8 (the last padded
    with nodes that keep every leaf), np.packbits makes each group's comparisons a byte, and a
    [group, byte] table holds the group's AND (a tree of at most 8 interior nodes, one group: its
    leaf's slot and weights). Per element the table read is cheaper than selecting one of two masks
    per node, and a group's byte is a quarter to an eighth of the cells the per-tree AND reduces.
    For forests whose trees have at most 64 leaves each, one comparison kind and no shared nodes."""

    def __init__(self, feature: np.ndarray, threshold: np.ndarray, missing: np.ndarray, mask_true: np.ndarray,
                 mask_false: np.ndarray, starts: np.ndarray, leaf: np.ndarray, mode: int, any_missing: bool,
                 written: np.ndarray | None, weights: np.ndarray) -> None:
        self.feature = feature
        # which outputs some tree writes, where that does not depend on the row (each tree's leaves
        # all write the same outputs, as sklearn's do): [1, outputs], repeated for the rows
        self.written = written
        self.written_row = None if written is None else written[None, :]
        self.leaf = leaf
        self.mode, self.any_missing = mode, any_missing
        self.plain = mode == 0 and not any_missing  # BRANCH_LEQ, no missing values: one comparison
        self.columns = feature.size
        self.max_feature = int(feature.max())
        self.threshold, self.missing = threshold, missing
        groups = feature.size // 8
        trees = starts.size
        #: per group the offset of its 256 entries in the tables, added to its byte
        self.group_base = np.arange(groups, dtype=np.intp) * 256
        #: one group a tree: per [group, byte] the slot (index into ``leaf``) its leaf has
        self.single = groups == trees
        # np.frexp(2**b) has exponent b + 1: per tree a row of 65 leaf node indices, entry b + 1
        self.base = np.arange(trees, dtype=np.int32) * 65
        #: [group x byte]: the AND of the group's masks, each node's by its bit; for trees of
        #: several groups made by a call of enough cells to read it (``_group_masks``)
        self._table: np.ndarray | None = None
        self._table_asked = False
        if self.single:
            table = _group_table(mask_true.reshape(groups, 8), mask_false.reshape(groups, 8))
            self.group_slot = (np.frexp(table)[1] + self.base[:, None]).reshape(-1)
            #: per [group, byte] its leaf's weights (None past _TABLE_WEIGHTS: then by group_slot)
            self.group_weights = weights[leaf[self.group_slot]] if self.group_slot.size * weights.shape[1] <= \
                _TABLE_WEIGHTS else None
        else:
            # the narrowest unsigned type that holds a tree's leaves (less to gather and AND): a
            # node's two masks together are its tree's leaves
            most = int(np.bitwise_or.reduce(mask_true | mask_false)).bit_length()
            dtype = np.dtype(np.uint16 if most <= 16 else np.uint32 if most <= 32 else np.uint64)
            self.group_starts = starts // 8
            self.starts = starts
            self.mask_true, self.mask_false = mask_true.astype(dtype), mask_false.astype(dtype)
            self.group_weights = None
        self.slot_weights = weights[leaf]  # per (tree, slot) its leaf's weights
        self.sums = self._sums_function()

    @staticmethod
    def applies(forest: _Forest, shape: tuple | None) -> bool:
        """Whether ``forest`` (with its ``_tree_shape``) has leaf bits: one comparison kind, no
        shared node, at most 64 leaves a tree."""
        return 0 <= forest.uniform_mode <= 3 and shape is not None and not (shape[1][forest.roots] > 64).any()

    @classmethod
    def build(cls, forest: _Forest, shape: tuple | None, true_next: np.ndarray) -> _LeafBits | None:
        """The leaf bits of ``forest`` from its ``_tree_shape`` (None: they do not apply)."""
        if not cls.applies(forest, shape):
            return None
        owner, count, first = shape[:3]
        trees = forest.roots.size
        total = count[forest.roots]
        # each node's leaves are the leaves [first, first + count) of its tree, numbered left to
        # right with the true branch first (the walk's order)
        (leaves, written), inner = forest.leaves_written, _inner_nodes(forest, shape)
        leaf = np.zeros((trees, 65), np.int64)
        leaf[owner[leaves], first[leaves] + 1] = leaves
        # interior nodes tree by tree, each tree's padded to whole groups of 8 with nodes whose
        # outcomes both keep every leaf (a tree that is one leaf: one group of them)
        inner = inner[np.argsort(owner[inner], kind="stable")]
        per_tree = np.bincount(owner[inner], minlength=trees)
        padded = np.where(per_tree == 0, 8, per_tree + (-per_tree % 8))
        starts = np.zeros(trees, np.int64)
        np.cumsum(padded[:-1], out=starts[1:])
        rank = np.arange(inner.size) - np.repeat(np.cumsum(per_tree) - per_tree, per_tree)
        at = starts[owner[inner]] + rank
        full = _low_bits(total)
        cols = np.full(int(padded.sum()), -1, np.int64)
        m_true = np.repeat(full, padded)
        m_false = m_true.copy()
        cols[at] = inner
        lo = first[inner]
        mid = lo + count[true_next[inner]]
        hi = lo + count[inner]
        # a true outcome rules out the false subtree's leaves [mid, hi), a false one the true's [lo, mid)
        m_true[at] = full[owner[inner]] & ~(_low_bits(hi - mid) << mid.astype(np.uint64))
        m_false[at] = full[owner[inner]] & ~(_low_bits(mid - lo) << lo.astype(np.uint64))
        real = np.maximum(cols, 0)
        return cls(np.where(cols >= 0, forest.feature[real], 0), forest.threshold[real],
                   np.where(cols >= 0, forest.missing_true[real], False), m_true, m_false, starts, leaf.reshape(-1),
                   forest.uniform_mode, forest.any_missing, written, forest.weights)

    def leaves(self, x: np.ndarray) -> np.ndarray:
        """[rows, trees] index of the leaf each row reaches in each tree (as ``_Forest.leaves``)."""
        return self.leaf.take(self.slots(x).T)

    def _compared(self, x: np.ndarray) -> np.ndarray:
        """[rows, columns] the outcome of every node's comparison (True: the true branch)."""
        # each node's feature column gathered along the rows: as fast as a flat gather by a
        # [rows, nodes] index, with no index to build per input shape (the callers check that
        # every feature is a column of x: "wrap" only skips the bounds check)
        v = x.take(self.feature, axis=1, mode="wrap")
        if self.plain:
            return v <= self.threshold
        go = _compare(v, self.threshold, self.mode)
        if self.any_missing:
            go |= self.missing & np.isnan(v)
        return go

    def _slots(self, go: np.ndarray) -> np.ndarray:
        """[rows, trees] slot of each row's leaf in each tree, from the comparisons."""
        if self.single:
            return self.group_slot.take(np.add(np.packbits(go, axis=1), self.group_base))
        # few cells: one select of each node's mask costs less than the table's 3 calls
        table = None if go.size <= _SELECT_CELLS else self._group_masks(go.size)
        if table is None:
            bits = np.bitwise_and.reduceat(np.where(go, self.mask_true, self.mask_false), self.starts, axis=1)
        else:
            masks = table.take(np.add(np.packbits(go, axis=1), self.group_base))
            bits = np.bitwise_and.reduceat(masks, self.group_starts, axis=1)
        slots = np.frexp(bits)[1]
        slots += self.base
        return slots

    def _group_masks(self, cells: int) -> np.ndarray | None:
        """The [group x byte] table of the groups' ANDs, built once; None (the caller selects each
        node's mask) at the first call for fewer (row, node) ``cells`` than the table has entries:
        its build costs about as much as selecting several times that many cells, so a session run
        once on a few rows (a command, a test) never builds it, and a second such call does."""
        table = self._table
        if table is None:
            if not self._table_asked and cells < self.group_base.size * 256:
                self._table_asked = True
                return None
            groups = self.group_base.size
            table = _group_table(self.mask_true.reshape(groups, 8), self.mask_false.reshape(groups, 8)).reshape(-1)
            self._table = table
        return table

    def slots(self, x: np.ndarray) -> np.ndarray:
        """[trees, rows] slot (index into ``leaf``) of the leaf each row reaches in each tree."""
        return self._slots(self._compared(x)).T

    def _sums_function(self) -> Callable[[np.ndarray], np.ndarray]:
        """``sums``: x -> [rows, outputs] the weights of each row's leaves summed over the trees in
        tree order, as onnxruntime adds them (``_tree_sum``). The same numpy calls as
        ``tree_weights`` and ``_tree_sum``, with the route (comparison, weights table or slots)
        chosen here once and every constant a local: a run of a few rows is mostly the calls
        between its numpy steps."""
        feature, threshold, missing, mode = self.feature, self.threshold, self.missing, self.mode
        plain, any_missing = self.plain, self.any_missing
        group_base, group_weights, slot_weights = self.group_base, self.group_weights, self.slot_weights
        one_tree = self.base.size == 1
        take, packbits, add = np.ndarray.take, np.packbits, np.add
        if group_weights is None and not self.single:
            # as ``_slots`` for trees of several groups
            tree_base, starts, group_starts = self.base, self.starts, self.group_starts
            mask_true, mask_false = self.mask_true, self.mask_false
            reduceat, group_masks = np.bitwise_and.reduceat, self._group_masks

            def slots_of(go: np.ndarray) -> np.ndarray:
                table = None if go.size <= _SELECT_CELLS else group_masks(go.size)
                if table is None:
                    bits = reduceat(np.where(go, mask_true, mask_false), starts, axis=1)
                else:
                    bits = reduceat(take(table, add(packbits(go, axis=1), group_base)), group_starts, axis=1)
                slots = np.frexp(bits)[1]
                slots += tree_base
                return slots
        else:
            slots_of = self._slots

        def sums(x: np.ndarray) -> np.ndarray:
            v = take(x, feature, axis=1, mode="wrap")  # as ``_compared``
            if plain:
                go = v <= threshold
            else:
                go = _compare(v, threshold, mode)
                if any_missing:
                    go |= missing & np.isnan(v)
            if group_weights is not None:
                w = take(group_weights, add(packbits(go, axis=1), group_base).T, axis=0)
            else:
                w = take(slot_weights, slots_of(go).T, axis=0)
            if one_tree:
                return w[0]  # its weights, a fresh array
            if w.shape[1] * w.shape[2] == 1:
                return np.add.accumulate(w, axis=0)[-1]
            return np.add.reduce(w, axis=0)

        return sums

    def signed_pair(self) -> _LeafBits:
        """These leaf bits with weights [-w, w] where they were [w, 0] (two outputs, the second
        written by no tree): their sums are [-s, s], the two columns a one-score two-class result
        is made of (negation is exact, and a sum of negated weights is the negated sum)."""
        pair = copy.copy(self)
        pair.slot_weights = _negated_and_as_is(self.slot_weights)
        if self.group_weights is not None:
            pair.group_weights = _negated_and_as_is(self.group_weights)
        pair.sums = pair._sums_function()
        return pair

    def tree_weights(self, x: np.ndarray) -> np.ndarray:
        """[trees, rows, outputs] the weights of the leaf each row reaches in each tree."""
        go = self._compared(x)
        if self.group_weights is not None:
            return self.group_weights.take(np.add(np.packbits(go, axis=1), self.group_base).T, axis=0)
        return self.slot_weights.take(self._slots(go).T, axis=0)


def _written_outputs(forest: _Forest, shape: tuple) -> tuple[np.ndarray, np.ndarray | None]:
    """The leaves of trees that share no node (``_tree_shape``), and which outputs the trees write
    where each tree's leaves all write the same outputs (then the same for every row): its first
    leaf's; else None."""
    owner, _, first, visited = shape[:4]
    leaves = visited[forest.mode[visited] == LEAF]
    # per tree its first leaf (every walk ends at a leaf, so each tree has one numbered 0)
    heads = leaves[first[leaves] == 0]
    head = np.empty(forest.roots.size, np.int64)
    head[owner[heads]] = heads
    has = forest.has
    written = np.logical_or.reduce(has[head], axis=0) if (has[leaves] == has[head[owner[leaves]]]).all() else None
    return leaves, written


def _inner_nodes(forest: _Forest, shape: tuple) -> np.ndarray:
    """The interior nodes of trees that share no node (``_flat_shape``), level by level."""
    visited = shape[3]
    return visited[forest.mode[visited] != LEAF]


def _group_table(mask_true: np.ndarray, mask_false: np.ndarray) -> np.ndarray:
    """[group, byte] the AND of each group's 8 node masks ([group, 8]), node j's by the byte's bit
    j (most significant first): the table doubled a bit at a time, its entries so far ANDed with
    the next node's false mask (bit 0) and its true mask (bit 1), about 2 x 256 ANDs a group
    against 8 x 256 selections and ANDs."""
    groups, dtype = mask_true.shape[0], mask_true.dtype
    table = np.full((groups, 1), np.iinfo(dtype).max, dtype)
    for j in range(8):
        width = table.shape[1]
        doubled = np.empty((groups, width, 2), dtype)
        np.bitwise_and(table, mask_false[:, j:j + 1], out=doubled[:, :, 0])
        np.bitwise_and(table, mask_true[:, j:j + 1], out=doubled[:, :, 1])
        table = doubled.reshape(groups, 2 * width)
    return table


def _negated_and_as_is(w: np.ndarray) -> np.ndarray:
    """[n, 2] rows [-w, w] of the first column of ``w``."""
    return np.multiply(w[:, :1], _NEGATED_AND_AS_IS)


def _low_bits(n: np.ndarray) -> np.ndarray:
    """Per entry of ``n`` (1 to 64) a uint64 with its ``n`` low bits set."""
    return np.right_shift(np.uint64(0xFFFFFFFFFFFFFFFF), (64 - np.asarray(n)).astype(np.uint64))


def _tree_shape(is_leaf: np.ndarray, true_next: np.ndarray, false_next: np.ndarray, roots: np.ndarray,
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[np.ndarray], list[np.ndarray]] | None:
    """The trees walked from ``roots`` a level at a time (numpy calls per level, not per node):
    per node its tree's slot, its leaf count and the number of its first leaf in its tree (leaves
    numbered left to right, true branch first), the nodes of each level and the interior nodes of
    each level; None where a node is reached twice (shared between trees, or a cycle).

    A node reached twice is found once, after the walk (one count over the visited nodes), not
    per level: the walk stops as soon as it has visited more nodes than there are, which a cycle
    makes it do, and every level's children are kept for the counts below."""
    n = is_leaf.size
    frontier, slots = roots, np.arange(roots.size, dtype=np.int64)
    levels: list[np.ndarray] = []
    level_slots: list[np.ndarray] = []
    inners: list[np.ndarray] = []
    children: list[tuple[np.ndarray, np.ndarray]] = []
    visited = 0
    while frontier.size:
        visited += frontier.size
        if visited > n:
            return None
        levels.append(frontier)
        level_slots.append(slots)
        interior = ~is_leaf[frontier]
        inner = frontier[interior]
        t, f = true_next[inner], false_next[inner]
        inners.append(inner)
        children.append((t, f))
        frontier = np.concatenate([t, f])
        kept = slots[interior]
        slots = np.concatenate([kept, kept])
    order = np.concatenate(levels)
    # (a negative index names the node counted from the end, as the indexing above read it)
    if np.bincount(np.remainder(order, n), minlength=n).max() > 1:
        return None
    owner = np.full(n, -1, np.int64)
    owner[order] = np.concatenate(level_slots)
    count = is_leaf.astype(np.int64)
    for inner, (t, f) in zip(reversed(inners), reversed(children)):
        count[inner] = count[t] + count[f]
    first = np.zeros(n, np.int64)
    for inner, (t, f) in zip(inners, children):
        at = first[inner]
        first[t] = at
        first[f] = at + count[t]
    return owner, count, first, levels, inners


class _NodeIndex:
    """(tree id, node id) pairs to node positions, for arrays of them at once: the last position
    of a pair given twice, -1 for a pair not given. Ids are ranked among the given ones first, so
    the combined key stays below the square of the node count whatever the ids' magnitudes."""

    def __init__(self, trees: np.ndarray, ids: np.ndarray) -> None:
        #: where the nodes come tree by tree in ascending tree id, each tree's ids 0, 1, ... in
        #: order (as the converters write them), a pair's position is its tree's start plus its id
        #: (no sort): per tree id its first position and node count; else None
        self.dense = self._dense(trees, ids)
        if self.dense is not None:
            return
        self.tree_values, self.id_values = np.unique(trees), np.unique(ids)
        self.span = max(1, self.id_values.size)
        key = np.searchsorted(self.tree_values, trees) * self.span + np.searchsorted(self.id_values, ids)
        self.order = np.argsort(key, kind="stable")
        self.keys = key[self.order]

    @staticmethod
    def _dense(trees: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        if not trees.size or (trees[1:] < trees[:-1]).any():
            return None
        # dense: each tree's first id is 0 and every other is the one before it plus 1
        new = np.empty(trees.size, bool)
        new[0] = True
        np.not_equal(trees[1:], trees[:-1], out=new[1:])
        expected = np.empty_like(ids)
        expected[0] = 0
        np.add(ids[:-1], 1, out=expected[1:])
        expected[new] = 0
        if not np.array_equal(ids, expected):
            return None
        starts = np.flatnonzero(new)
        counts = np.empty_like(starts)
        np.subtract(starts[1:], starts[:-1], out=counts[:-1])
        counts[-1] = trees.size - starts[-1]
        return trees[starts], starts, counts

    @staticmethod
    def _ranks(values: np.ndarray, query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each query's rank among ``values`` and whether it is one of them."""
        if not values.size:
            return np.zeros(query.shape, np.int64), np.zeros(query.shape, bool)
        # the array's method: np.searchsorted's Python wrapper costs as much again on a small forest
        rank = np.minimum(values.searchsorted(query), values.size - 1)
        return rank, values[rank] == query

    def find(self, trees: np.ndarray, ids: np.ndarray) -> np.ndarray:
        if self.dense is not None:
            tree_values, starts, counts = self.dense
            t, t_ok = self._ranks(tree_values, trees)
            found = t_ok & (ids >= 0) & (ids < counts[t])
            return np.where(found, starts[t] + ids, -1)
        t, t_ok = self._ranks(self.tree_values, trees)
        i, i_ok = self._ranks(self.id_values, ids)
        if not self.keys.size:
            return np.full(trees.shape, -1, np.int64)
        key = t * self.span + i
        pos = np.maximum(self.keys.searchsorted(key, side="right") - 1, 0)
        found = t_ok & i_ok & (self.keys[pos] == key)
        return np.where(found, self.order[pos], -1)


def _links(node: Node, what: str, trees: np.ndarray, ids: np.ndarray, mode: np.ndarray,
           ) -> tuple[_NodeIndex, np.ndarray, np.ndarray, np.ndarray]:
    """The canonical links of ``_legacy_forest`` (``TREE_BUILD_PATHS``' numpy build): the node
    index, per node the positions of its true and false children (a leaf's are its own), the roots."""
    index = _NodeIndex(trees, ids)
    n = len(ids)
    inner = np.flatnonzero(mode != LEAF)
    true_next = np.arange(n)
    false_next = np.arange(n)
    if inner.size:
        true_ids = _ints(node, "nodes_truenodeids")[inner]
        false_ids = _ints(node, "nodes_falsenodeids")[inner]
        t_at, f_at = index.find(trees[inner], true_ids), index.find(trees[inner], false_ids)
        bad = (t_at < 0) | (f_at < 0)
        if bad.any():
            i = int(np.argmax(bad))
            k, child = int(inner[i]), int(true_ids[i] if t_at[i] < 0 else false_ids[i])
            raise InvalidArgument(f"{what}: tree {int(trees[k])} node {int(ids[k])} points at missing node "
                                  f"{child}.")
        true_next[inner], false_next[inner] = t_at, f_at
    # per tree id its first node that is no node's child, trees in id order
    free = np.ones(n, bool)
    free[true_next[inner]] = False
    free[false_next[inner]] = False
    candidates = np.flatnonzero(free)
    if index.dense is not None and candidates.size:
        # tree ids ascending (a dense index): each tree's first candidate starts a run of its id
        owners = trees[candidates]
        first = np.empty(owners.size, bool)
        first[0] = True
        np.not_equal(owners[1:], owners[:-1], out=first[1:])
        roots = candidates[first]
    else:
        _, first = np.unique(trees[candidates], return_index=True)
        roots = candidates[first]
    return index, true_next, false_next, roots


def _links_lists(node: Node, what: str, trees: np.ndarray, ids: np.ndarray, mode: np.ndarray,
                 ) -> tuple[ListNodeIndex, np.ndarray, np.ndarray, np.ndarray]:
    """``_links`` by loops over lists (``TREE_BUILD_PATHS["lists"]``): the same index, links and roots."""
    tree_list = trees.tolist()
    index = ListNodeIndex(tree_list, ids.tolist())
    inner = (mode != LEAF).tolist()
    some = any(inner)  # (the child attributes are read only where an interior node needs them, as _links)
    true_ids = _ints(node, "nodes_truenodeids").tolist() if some else None
    false_ids = _ints(node, "nodes_falsenodeids").tolist() if some else None
    true_next, false_next, roots, bad = forest_links(index, tree_list, inner, true_ids, false_ids)
    if bad is not None:
        k, child = bad
        raise InvalidArgument(f"{what}: tree {int(trees[k])} node {int(ids[k])} points at missing node {child}.")
    return index, np.array(true_next, np.int64), np.array(false_next, np.int64), np.array(roots, np.int64)


def _links_native(node: Node, what: str, trees: np.ndarray, ids: np.ndarray, mode: np.ndarray,
                  leaf_trees: np.ndarray, leaf_ids: np.ndarray, native: ModuleType) -> tuple | None:
    """``_links``, the leaf weights' node positions and ``_shape_of`` in one C call
    (``TREE_BUILD_PATHS["native"]``): true_next, false_next, roots, the positions, the shape (None
    where a node is reached twice); None where the child ids are not one per node (the other
    builds read them as they are)."""
    n = ids.size
    if (mode != LEAF).any():
        true_ids, false_ids = _ints(node, "nodes_truenodeids"), _ints(node, "nodes_falsenodeids")
        if true_ids.size != n or false_ids.size != n:
            return None
    else:  # (not read where no interior node needs them, as _links)
        true_ids = false_ids = np.zeros(n, np.int64)
    # every int64 output in one block: 7 tables of n, the positions of the leaf weights
    block = np.empty(7 * n + leaf_ids.size, np.int64)
    t_next, f_next, roots, owner, count, first, visited = (block[i * n:(i + 1) * n] for i in range(7))
    at = block[7 * n:]
    tree_depth = np.empty(n, np.int64)
    status, a, b = native.forest_build(np.ascontiguousarray(trees), np.ascontiguousarray(ids), mode == LEAF,
                                       np.ascontiguousarray(true_ids), np.ascontiguousarray(false_ids), leaf_trees,
                                       leaf_ids, t_next, f_next, roots, at, owner, count, first, visited, tree_depth)
    if status:
        raise InvalidArgument(f"{what}: tree {int(trees[a])} node {int(ids[a])} points at missing node {b}.")
    shape = None if b < 0 else (owner, count, first, visited[:b], tree_depth[:a])
    return t_next, f_next, roots[:a], at, shape


def _build_native() -> ModuleType | None:
    """The C module where ``TREE_BUILD_PATHS["native"]`` holds, else None."""
    return native_module() if NATIVE_BUILD else None


def _legacy_forest(node: Node, prefix: str, n_out: int) -> _Forest:
    """A forest from the opset-1/3 attributes: nodes named by (tree id, node id), leaves among
    the nodes, weights in ``{prefix}_treeids/_nodeids/_ids/_weights``."""
    what = f"{node.op_type} node {node.name!r}"
    trees = _ints(node, "nodes_treeids")
    ids = _ints(node, "nodes_nodeids")
    feature = _ints(node, "nodes_featureids")
    threshold = _thresholds(node)
    modes = node.attr("nodes_modes")
    if threshold is None or modes is None or not (len(trees) == len(ids) == len(feature) == len(modes)
                                                  == len(threshold)):
        raise InvalidArgument(f"{what}: the nodes_* attributes must all be given with one entry per tree node.")
    try:
        mode = np.fromiter(map(_MODES.__getitem__, modes), np.int8, len(modes))
    except KeyError as exc:
        raise InvalidArgument(f"{what}: unknown node mode {exc.args[0]!r}; expected one of {sorted(_MODES)}.") from None
    n = len(ids)
    missing = node.attr_array("nodes_missing_value_tracks_true", bool)
    if missing is None or not missing.size:
        missing = np.zeros(n, bool)
    leaf_trees = _ints(node, f"{prefix}_treeids")
    leaf_ids = _ints(node, f"{prefix}_nodeids")
    targets = _ints(node, f"{prefix}_ids")
    weights = _floats(node, f"{prefix}_weights")
    m = min(leaf_trees.size, leaf_ids.size, targets.size, weights.size) if weights is not None else 0
    leaf_trees, leaf_ids = np.ascontiguousarray(leaf_trees[:m]), np.ascontiguousarray(leaf_ids[:m])
    native = _build_native()
    built = None if native is None else _links_native(node, what, trees, ids, mode, leaf_trees, leaf_ids, native)
    shape: tuple | None | bool = False
    if built is not None:  # TREE_BUILD_PATHS["native"]
        true_next, false_next, roots, at, shape = built
    elif n <= SMALL_FOREST_NODES:  # TREE_BUILD_PATHS["lists"]
        index, true_next, false_next, roots = _links_lists(node, what, trees, ids, mode)
    else:
        index, true_next, false_next, roots = _links(node, what, trees, ids, mode)
    if weights is None:
        raise InvalidArgument(f"{what}: {prefix}_weights is not given; the leaves' weights are needed.")
    targets, weights = targets[:m], weights[:m]
    if built is None:
        at = index.find(leaf_trees, leaf_ids)
    bad = (at < 0) | (targets < 0) | (targets >= n_out)
    if bad.any():
        i = int(np.argmax(bad))
        raise InvalidArgument(f"{what}: weight for tree {int(leaf_trees[i])} node {int(leaf_ids[i])} target "
                              f"{int(targets[i])}: no such leaf or target (of {n_out}).")
    dense = np.zeros((n, n_out), np.float32)
    has = np.zeros((n, n_out), bool)
    np.add.at(dense, (at, targets), weights)  # in the given order, as onnxruntime adds a leaf's weights
    has[at, targets] = True
    return _Forest(what, feature, threshold, mode, true_next, false_next, np.asarray(missing, bool), roots,
                   dense, has, shape=shape)


@register("TreeEnsembleRegressor", since=1, domain=ML)
class TreeEnsembleRegressor(Kernel):
    inline_fn = INLINE_APPLY

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.n_targets = int(node.attr("n_targets", 1))
        self.forest = _legacy_forest(node, "target", self.n_targets)
        self.how = node.attr("aggregate_function", "SUM")
        if self.how not in ("SUM", "AVERAGE", "MIN", "MAX"):
            raise InvalidArgument(f"TreeEnsembleRegressor node {node.name!r}: aggregate_function {self.how!r} is "
                                  "none of SUM, AVERAGE, MIN, MAX.")
        base = _floats(node, "base_values")
        #: the base values added after the aggregation; None where they are all 0 (adding 0 changes
        #: no sum but the sign of a zero one)
        self.base = base if base is not None and base.size == self.n_targets and base.any() else None
        self.transform = post_transform_name(node)
        self.post = score_transform(self.transform, self.n_targets)

    def compute(self, inputs: list) -> list:
        return [self.apply(inputs[0])]

    def apply(self, x: np.ndarray) -> np.ndarray:
        x = _compared_rows(x, self.forest.threshold, "TreeEnsembleRegressor")
        scores = self.forest.sums(x, self.how) if self.how in ("SUM", "AVERAGE") else None
        if scores is None:
            scores, written = self.forest.aggregate(x, self.how, self.n_targets > 1)
        else:
            written = self.forest.written_const[None, :]
        if self.base is not None:
            scores = np.add(scores, self.base, out=scores)
        if self.n_targets > 1:  # onnxruntime writes 0 for a target no tree wrote, base value or not
            scores = np.where(written, scores, np.float32(0))
        return self.post(scores)


#: TreeEnsemble (opset 5) writes its enums as integers. onnxruntime reads post_transform as its own
#: enum (1 LOGISTIC, 2 SOFTMAX), where the spec says 1 SOFTMAX, 2 LOGISTIC: onnxruntime's order here.
_V5_AGGREGATES = ("AVERAGE", "SUM", "MIN", "MAX")
_V5_TRANSFORMS = ("NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT")


@register("TreeEnsemble", since=5, domain=ML)
class TreeEnsemble(Kernel):
    """ai.onnx.ml opset 5: interior nodes indexed from tree_roots, leaves in their own arrays
    (``nodes_trueleafs`` / ``nodes_falseleafs`` say which child is a leaf), set membership
    (BRANCH_MEMBER, the sets in ``membership_values`` split by NaN), integer enums; the output has
    the input's type."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        what = f"TreeEnsemble node {node.name!r}"
        agg, post = int(node.attr("aggregate_function", 1)), int(node.attr("post_transform", 0))
        if not 0 <= agg < 4 or not 0 <= post < 5:
            raise InvalidArgument(f"{what}: aggregate_function {agg} / post_transform {post} out of range "
                                  "(0-3 / 0-4).")
        self.how, self.transform = _V5_AGGREGATES[agg], _V5_TRANSFORMS[post]
        self.n_targets = int(node.attr("n_targets", 1))
        splits = node.attr("nodes_splits")
        modes = node.attr("nodes_modes")
        feature = _ints(node, "nodes_featureids")
        true_ids = _ints(node, "nodes_truenodeids")
        false_ids = _ints(node, "nodes_falsenodeids")
        n = feature.size
        if splits is None or modes is None or not (np.size(splits) == np.size(modes) == n == true_ids.size
                                                   == false_ids.size):
            raise InvalidArgument(f"{what}: nodes_splits, nodes_modes, nodes_featureids, nodes_truenodeids and "
                                  "nodes_falsenodeids must all be given with one entry per interior node.")
        true_leaf = np.asarray(node.attr("nodes_trueleafs", [0] * n), bool)
        false_leaf = np.asarray(node.attr("nodes_falseleafs", [0] * n), bool)
        leaf_targets = _ints(node, "leaf_targetids")
        leaf_weights = np.asarray(node.attr("leaf_weights")).reshape(-1)
        n_leaves = leaf_targets.size
        self.dtype = leaf_weights.dtype if leaf_weights.dtype.kind == "f" else np.dtype(np.float32)
        splits = np.asarray(splits).reshape(-1)
        if splits.dtype not in (np.float32, np.float64):
            splits = splits.astype(np.float32)
        threshold = np.concatenate([splits, np.zeros(n_leaves, splits.dtype)])
        mode = np.concatenate([np.asarray(modes, np.int8).reshape(-1), np.full(n_leaves, LEAF, np.int8)])
        mode[:n][mode[:n] == 6] = MEMBER
        if (mode[:n] > MEMBER).any() or (mode[:n] < 0).any():
            raise InvalidArgument(f"{what}: nodes_modes must be 0-6, got {sorted(set(mode[:n].tolist()))}.")
        true_next = np.where(true_leaf, true_ids + n, true_ids)
        false_next = np.where(false_leaf, false_ids + n, false_ids)
        total = n + n_leaves
        if ((true_next < 0) | (true_next >= total) | (false_next < 0) | (false_next >= total)).any():
            raise InvalidArgument(f"{what}: a node points at a child outside the {n} nodes / {n_leaves} leaves.")
        if ((leaf_targets < 0) | (leaf_targets >= self.n_targets)).any():
            raise InvalidArgument(f"{what}: leaf_targetids must be in [0, {self.n_targets}).")
        weights = np.zeros((total, self.n_targets), self.dtype)
        has = np.zeros((total, self.n_targets), bool)
        weights[n + np.arange(n_leaves), leaf_targets] = leaf_weights
        has[n + np.arange(n_leaves), leaf_targets] = True
        members: dict[int, np.ndarray] = {}
        values = np.asarray(node.attr("membership_values", []) if node.attr("membership_values") is not None else [],
                            np.float64).reshape(-1)
        sets = np.split(values, np.nonzero(np.isnan(values))[0] + 1) if values.size else []
        sets = [v[~np.isnan(v)] for v in sets]
        for k, i in enumerate(np.nonzero(mode[:n] == MEMBER)[0]):
            members[int(i)] = sets[k] if k < len(sets) else np.zeros(0)
        missing = np.concatenate([np.asarray(node.attr("nodes_missing_value_tracks_true", [0] * n), bool),
                                  np.zeros(n_leaves, bool)])
        roots = _ints(node, "tree_roots")
        self.forest = _Forest(what, np.concatenate([feature, np.zeros(n_leaves, np.int64)]), threshold, mode,
                              np.concatenate([true_next, n + np.arange(n_leaves)]),
                              np.concatenate([false_next, n + np.arange(n_leaves)]), missing, roots, weights, has,
                              members)

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        if not isinstance(x, np.ndarray) or x.dtype.kind != "f":
            raise InvalidArgument(f"TreeEnsemble: X must be a float tensor, got {getattr(x, 'dtype', type(x))}.")
        dtype = x.dtype
        # the columns named, not -1: numpy cannot infer them for no row
        rows = x.reshape(1, -1) if x.ndim == 1 else x.reshape(x.shape[0], int(math.prod(x.shape[1:])))
        # comparisons in the splits' type (the model's T: float32 splits for float16 inputs)
        scores, _ = self.forest.aggregate(rows.astype(self.forest.threshold.dtype, copy=False), self.how)
        if self.transform != "NONE":
            scores = transform_scores(scores, self.transform)
        return [scores.astype(dtype, copy=False)]


def _repeated(row: np.ndarray, n: int, cache: dict[int, np.ndarray]) -> np.ndarray:
    """``row`` ([C] or [1, C]) repeated to [n, C], read-only, kept in ``cache`` per n (at most 8
    counts): a ufunc on operands of one shape runs its plain loop, cheaper than a broadcast on the
    few rows a small model scores."""
    rows = cache.get(n)
    if rows is None:
        rows = np.repeat(row.reshape(1, -1), n, axis=0)
        rows.flags.writeable = False
        if len(cache) < 8:
            cache[n] = rows
    return rows


@register("TreeEnsembleClassifier", since=1, domain=ML)
class TreeEnsembleClassifier(Kernel):
    def __new__(cls, node: Node, ctx: KernelCreateContext) -> Kernel:
        # one string label: onnxruntime's rule gives labels "1" / "0" it cannot name; onnx.reference's
        if node.attr("classlabels_strings") and len(node.attr("classlabels_strings")) < 2:
            return reference_kernel(node, ctx)
        return super().__new__(cls)

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        strings = node.attr("classlabels_strings")
        self.labels = np.array(strings, dtype=object) if strings else \
            _ints(node, "classlabels_int64s")
        k = len(self.labels)
        self.forest = _legacy_forest(node, "class", k)
        base = _floats(node, "base_values")
        self.raw_base = base if base is not None else np.zeros(0, np.float32)
        self.base = base if base is not None and base.size == k else None
        self.transform = post_transform_name(node)
        weights = _floats(node, "class_weights")
        self.binary_case = k == 2 and len(set(node.attr("class_ids"))) == 1
        self.all_positive = bool((weights >= 0).all())
        self.post = score_transform(self.transform, k)
        #: int64 labels 0, 1, ..., k - 1: a class's index is its label
        self.labels_are_indices = self.labels.dtype == np.int64 and self.labels.tolist() == list(range(k))
        if self.transform == "SOFTMAX" and 2 < k <= 8 and self.forest.all_written and \
                self._score_bound() < SOFTMAX_BOUND:
            self.post = softmax_bounded
        self._pair_bits: _LeafBits | None = None
        self._pair = self._signed_pair()
        # row count -> the base values repeated to that many rows (``_repeated``): compute's, _two_pair's
        self._base_rows: dict[int, np.ndarray] = {}
        self._pair_base_rows: dict[int, np.ndarray] = {}

    def _score_bound(self) -> float:
        """A bound on any row's |score|: per tree its largest |leaf weight|, summed, plus the base
        values' largest (whatever the input: NaN features route like any value)."""
        forest = self.forest
        w = np.abs(forest.weights.astype(np.float64))
        if forest.written_const is not None:  # trees that share no node: per tree its leaves' largest
            leaves, _ = forest.leaves_written
            largest = np.zeros(forest.roots.size)
            np.maximum.at(largest, forest._shape[0][leaves], w[leaves].max(axis=1))
            per_tree = largest.sum()
        else:
            per_tree = forest.roots.size * (w.max() if w.size else 0.0)
        return float(per_tree + (np.abs(self.base).max() if self.base is not None else 0.0))

    def _signed_pair(self) -> tuple | None:
        """For two classes where the trees write the first class alone and one score makes the
        result (``_two_classes_constant``'s one-score rows, "positive" or "mixed", no PROBIT): leaf
        bits whose sums are [-s, s], with what turns them into the result in place (base values
        [-b, b] added, the label's threshold, the transform); None elsewhere."""
        written = self.forest.written_const  # None where the trees have no leaf bits
        if len(self.labels) != 2 or written is None or not written[0] or written[1] or \
                self.raw_base.size > 1 or self.transform == "PROBIT":
            return None
        if self.binary_case and self.all_positive:  # [1 - s, s]
            post = logistic_into if self.transform == "LOGISTIC" else _one_minus_first
        elif self.binary_case or self.raw_base.size == 0:  # [-s, s]
            post = logistic_into if self.transform == "LOGISTIC" else None
        else:
            return None
        base = self.raw_base[0] * _NEGATED_AND_AS_IS if self.raw_base.size else None
        # a 0-d array: a ufunc converts a numpy scalar operand on every call
        threshold = np.array(0.5 if self.binary_case and self.all_positive else 0.0, np.float32)
        # the labels by the positive score (else onnxruntime's 1 / 0, which labels [0, 1] also are)
        take = (self.labels.dtype == object or self.binary_case) and not self.labels_are_indices
        native = self.forest.native
        native_pair = None if native is None else native.with_weights(self.forest, _negated_and_as_is(
            self.forest.weights))
        # not the bound _signed_bits (compute passes it): kept on the kernel, it is a reference cycle
        return native_pair, base, threshold, take, post

    def _signed_bits(self) -> _LeafBits:
        """The forest's leaf bits with weights [-w, w] (``_LeafBits.signed_pair``), made at the first
        call: a run the C route takes never reads them."""
        if self._pair_bits is None:
            self._pair_bits = self.forest._bits.signed_pair()
        return self._pair_bits

    def _two_pair(self, scores: np.ndarray) -> list:
        """``_two_classes_constant``'s one-score result from the sums [-s, s] (``_signed_pair``)."""
        _, base, threshold, take, post = self._pair
        if base is not None:
            np.add(scores, _repeated(base, scores.shape[0], self._pair_base_rows), out=scores)
        positive = np.greater(scores[:, 1], threshold)
        # take casts the booleans to indices 0 / 1 (cheaper than fancy indexing by an int8 view)
        label = self.labels.take(positive) if take else positive.astype(np.int64)
        return [label, scores if post is None else post(scores)]

    def compute(self, inputs: list) -> list:
        x = _compared_rows(inputs[0], self.forest.threshold, "TreeEnsembleClassifier")
        if self._pair is not None:
            scores = self.forest.sums(x, "SUM", self._signed_bits, self._pair[0])
            if scores is not None:
                return self._two_pair(scores)
        scores = self.forest.sums(x, "SUM")
        if scores is None:
            scores, has = self.forest.scores(x)
        else:
            has = self.forest.written_const[None, :]  # the same for every row
        if len(self.labels) == 1:  # onnxruntime: one score, label 1 where it is positive (else 0)
            s = scores[:, :1] + (self.raw_base[0] if self.raw_base.size else np.float32(0))
            z = transform_scores(s, "PROBIT") if self.transform == "PROBIT" else s
            return [np.where(s[:, 0] > 0, np.int64(1), np.int64(0)), z.astype(np.float32)]
        if len(self.labels) == 2:
            return self._two_classes(scores, has)
        # the first highest score among the classes that have one (every class has one with base
        # values, or where the trees write every class whatever the row)
        if self.base is not None:
            np.add(scores, _repeated(self.base, scores.shape[0], self._base_rows), out=scores)
            top = scores.argmax(axis=1)
        elif self.forest.all_written:
            top = scores.argmax(axis=1)
        else:
            top = np.argmax(np.where(has, scores, -np.inf), axis=1)
        label = top.astype(np.int64, copy=False) if self.labels_are_indices else self.labels[top]
        return [label, self.post(scores.astype(np.float32, copy=False))]

    def _two_classes(self, scores: np.ndarray, has: np.ndarray) -> list:
        """onnxruntime's rules for two classes (TreeAggregatorClassifier::FinalizeScores and
        _set_score_binary), row by row in arrays: the scores' second column may be dropped (one
        score), the label comes from the positive score's sign or 0.5, and one score is written as
        two columns by the rule its label took."""
        written = self.forest.written_const
        if written is not None and scores.dtype == np.float32:
            return self._two_classes_constant(scores, bool(written[0]), bool(written[1]))
        s0, s1 = scores[:, 0], scores[:, 1]  # views: every step below makes a new array
        base = self.raw_base
        if base.size == 0 and self.forest.all_written:
            # both scores written in every row (sklearn's forests): the positive score is the second,
            # its sign (or 0.5) gives the label, and the two columns are transformed as they are
            label_index = (s1 > (0.5 if self.binary_case and self.all_positive else 0.0)).astype(np.int64)
            label = self.labels[label_index] if self.labels.dtype == object or self.binary_case else label_index
            return [label, transform_scores(scores, self.transform).astype(np.float32)]
        h0, h1 = has[:, 0], has[:, 1]
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
        ones = None
        if one_score.any():
            ones = self._one_score_rows(s0[:, None], mode)
            if one_score.all():  # every row has one score: the two-score transform is not needed
                return [label, ones]
        # two scores: a class no tree wrote counts 0 in the written scores, whatever base value its
        # raw score took (onnxruntime's ScoreValue reads as 0 without has_score; the label above
        # took the raw scores)
        two = transform_scores(np.stack([np.where(h0, s0, 0), np.where(h1, s1, 0)], axis=1), self.transform)
        if ones is None:
            return [label, two.astype(np.float32)]
        return [label, np.where(one_score[:, None], ones, two).astype(np.float32)]

    def _two_classes_constant(self, scores: np.ndarray, h0: bool, h1: bool) -> list:
        """``_two_classes`` where the trees write the same classes for every row (h0, h1): its
        per-row choices are then one choice, made here once, with the scores (which this kernel
        owns) updated in place."""
        base = self.raw_base
        s0, s1 = scores[:, 0], scores[:, 1]
        if base.size == 2:
            if h1:  # tied: s1 = base[1] + s0, then s0 = -s1
                np.add(s0, base[1], out=s1)
                np.negative(s1, out=s0)
            else:
                np.add(scores, base, out=scores)
            one_score = False
        else:
            if base.size == 1:
                np.add(s0, base[0], out=s0)
            one_score = not h1
        if self.binary_case:
            threshold = 0.5 if self.all_positive else 0.0
        else:
            threshold = 0.0
        positive = ((s1 if h1 else s0) > threshold) if h1 or h0 else np.zeros(len(scores), bool)
        if self.labels.dtype == object or self.binary_case:
            label = self.labels.take(positive.view(np.int8))
        else:
            label = positive.astype(np.int64)  # onnxruntime's positive (1) and negative (0) labels
        if not one_score:
            if not h0:  # a class no tree wrote counts 0 in the written scores (as ``_two_classes``)
                s0.fill(0)
            if not h1:
                s1.fill(0)
            return [label, self.post(scores)]
        return [label, self._one_score_rows(s0[:, None], "positive" if self.binary_case and self.all_positive else
                                            "mixed" if self.binary_case or base.size == 0 else "none")]

    def _one_score_rows(self, single: np.ndarray, mode: str) -> np.ndarray:
        """Rows of one score written as two columns by the rule their label took."""
        if self.transform == "PROBIT":
            # onnxruntime writes the one probit and leaves the second column as the buffer held it
            # (uninitialised memory): 0 here, a defined value in its place
            ones = np.concatenate([transform_scores(single, "PROBIT"), np.zeros_like(single)], axis=1)
        elif mode in ("positive", "mixed") and self.transform == "LOGISTIC" and single.dtype == np.float32:
            # [logistic(-s), logistic(s)]: the logistic of the columns [-s, s] (one exact product), in place
            return logistic_into(np.multiply(single, _NEGATED_AND_AS_IS))
        elif mode in ("positive", "mixed") and self.transform == "LOGISTIC":
            ones = _logistic_pair(single)
        elif mode == "positive":
            ones = np.concatenate([1 - single, single], axis=1)
        elif mode == "mixed":
            ones = np.concatenate([-single, single], axis=1)
        else:
            ones = np.concatenate([single, np.zeros_like(single)], axis=1)
        return ones.astype(np.float32, copy=False)


def _one_minus_first(pair: np.ndarray) -> np.ndarray:
    """The columns [-s, s] made [1 - s, s], in place."""
    return np.add(pair, _ONE_AND_ZERO, out=pair)


def _logistic_pair(single: np.ndarray) -> np.ndarray:
    """[logistic(-s), logistic(s)] for a column s, as two ``logistic`` calls give it, from one exp."""
    v = 1 / (1 + np.exp(-np.abs(single)))
    w = 1 - v
    return np.concatenate([np.where(single > 0, w, v), np.where(single < 0, w, v)], axis=1).astype(np.float32)
