"""TfIdfVectorizer (ai.onnx 9): n-gram counts of int32, int64 or string rows, weighted.

The ONNX operator spec (onnx/docs/Operators.md, TfIdfVectorizer) with onnxruntime's choices where
the spec is silent (onnxruntime/core/providers/cpu/nn/tfidfvectorizer.cc, read for behaviour only,
and checked against onnxruntime 1.32 in tests/test_text_ops.py):

- input ``[C]`` (or a scalar, one item) gives ``[K]``; ``[B, C]`` with B >= 1 gives ``[B, K]``;
  K = max(ngram_indexes) + 1. An input with no items gives zeros.
- the pool holds only the n-grams of lengths min_gram_length..max_gram_length; pool n-gram j counts
  into output column ngram_indexes[j] with weight weights[j].
- 1-grams are counted once (the skip does not apply); an n-gram of n >= 2 is counted once for each
  skip s in 0..max_skip_count at each start, its items s + 1 apart.
- TF: the count; TFIDF: the count times the weight (each hit adds its pool n-gram's weight, so
  pool n-grams sharing a column add up); IDF: the weight when counted (1 without weights). Where
  pool n-grams share a column, IDF takes the weight of the last hit in onnxruntime's scan order
  (1-grams left to right, then for each skip, each start, n-grams by length).
- an input of another kind than the pool (int against pool_strings) matches nothing.
"""

from __future__ import annotations

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels.registry import register

_MODES = ("TF", "IDF", "TFIDF")


@register("TfIdfVectorizer", since=9)
class TfIdfVectorizer(Kernel):
    """See the module docstring for the semantics and their source."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        what = self.what = f"TfIdfVectorizer node {node.name!r}"
        self.mode = node.attr("mode")
        if self.mode not in _MODES:
            raise InvalidArgument(f"{what}: mode {self.mode!r}; use TF, IDF or TFIDF")
        self.min_n = int(node.attr("min_gram_length", 0))
        self.max_n = int(node.attr("max_gram_length", 0))
        self.max_skip = int(node.attr("max_skip_count", 0))
        if self.min_n < 1 or self.max_n < self.min_n:
            raise InvalidArgument(f"{what}: min_gram_length {self.min_n}, max_gram_length {self.max_n}; they "
                                  "need 1 <= min_gram_length <= max_gram_length")
        if self.max_skip < 0:
            raise InvalidArgument(f"{what}: max_skip_count {self.max_skip}; it must be 0 or more")
        counts = [int(c) for c in node.attr("ngram_counts", []) or []]
        if not counts or self.max_n > len(counts):
            raise InvalidArgument(f"{what}: ngram_counts {counts} has no start for {self.max_n}-grams; give "
                                  "one start per n-gram length up to max_gram_length")
        indexes = [int(i) for i in node.attr("ngram_indexes", []) or []]
        if not indexes or min(indexes) < 0:
            raise InvalidArgument(f"{what}: ngram_indexes {indexes[:8]}...; give a non-negative output column "
                                  "per pool n-gram")
        self.width = max(indexes) + 1
        weights = node.attr("weights")
        if weights is not None and len(weights) != len(indexes):
            raise InvalidArgument(f"{what}: {len(weights)} weights for {len(indexes)} ngram_indexes; give one "
                                  "weight per n-gram")
        strings = node.attr("pool_strings")
        ints = node.attr("pool_int64s")
        if strings:
            pool: list = list(strings)
            self.pool_kind = "string"
        elif ints is not None and len(ints):
            pool = [int(v) for v in ints]
            self.pool_kind = "int"
        else:
            raise InvalidArgument(f"{what}: no pool_strings or pool_int64s; give the n-gram pool")
        # n-gram (a tuple of items) -> (output column, weight), only for the lengths counted
        self.grams: dict[tuple, tuple[int, float]] = {}
        gram_id = 0
        for k, start in enumerate(counts):
            n = k + 1
            end = counts[k + 1] if k + 1 < len(counts) else len(pool)
            if not start <= end <= len(pool) or (end - start) % n:
                raise InvalidArgument(f"{what}: ngram_counts {counts} gives {n}-grams items {start}..{end} of a "
                                      f"pool of {len(pool)}; each length needs whole n-grams inside the pool")
            for g in range(start, end, n):
                if self.min_n <= n <= self.max_n:
                    if gram_id >= len(indexes):
                        raise InvalidArgument(f"{what}: the pool holds more n-grams than the {len(indexes)} "
                                              "ngram_indexes; give one index per pool n-gram")
                    key = tuple(pool[g:g + n])
                    if key in self.grams:
                        raise InvalidArgument(f"{what}: the {n}-gram {key} is twice in the pool; remove one")
                    w = 1.0 if weights is None else float(weights[gram_id])
                    self.grams[key] = (indexes[gram_id], w)
                gram_id += 1

    def _hits(self, row: list) -> list[tuple[int, float]]:
        """(column, weight) of every pool n-gram found in ``row``, in onnxruntime's scan order."""
        grams, hits = self.grams, []
        lo = self.min_n
        if lo == 1:
            hits += [grams[(v,)] for v in row if (v,) in grams]
            lo = 2
        if lo > self.max_n:
            return hits
        c = len(row)
        for dist in range(1, self.max_skip + 2):
            for i in range(c - dist * (lo - 1)):
                for n in range(lo, self.max_n + 1):
                    last = i + dist * (n - 1)
                    if last >= c:
                        break
                    key = tuple(row[i:last + 1:dist])
                    if key in grams:
                        hits.append(grams[key])
        return hits

    def _row_values(self, row: list) -> np.ndarray:
        out = np.zeros(self.width, dtype=np.float32)
        hits = self._hits(row)
        if self.mode == "TF":
            for col, _ in hits:
                out[col] += 1
        elif self.mode == "TFIDF":
            acc = np.zeros(self.width, dtype=np.float64)
            for col, w in hits:
                acc[col] += w
            out[:] = acc
        else:
            for col, w in hits:
                out[col] = w
        return out

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        if x.ndim > 2 or (x.ndim == 2 and x.shape[0] < 1):
            raise InvalidArgument(f"{self.what}: input shape {list(x.shape)}; it takes [C] or [B, C] with B >= 1")
        rows = x.reshape(1, -1) if x.ndim < 2 else x
        kind = "string" if x.dtype.kind in "OUS" else "int" if x.dtype.kind in "iu" else None
        if kind is None:
            raise InvalidArgument(f"{self.what}: input dtype {x.dtype}; it takes int32, int64 or string")
        y = np.zeros((rows.shape[0], self.width), dtype=np.float32)
        if kind == self.pool_kind and rows.size:
            for b in range(rows.shape[0]):
                items = rows[b].tolist()
                if kind == "string":
                    items = [v.decode("utf-8", errors="surrogateescape") if isinstance(v, bytes) else v
                             for v in items]
                y[b] = self._row_values(items)
        return [y if x.ndim == 2 else y[0]]
