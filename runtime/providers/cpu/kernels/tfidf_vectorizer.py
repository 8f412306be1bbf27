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

from itertools import chain, repeat

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels.kernel_paths import path_table
from onnxhal.runtime.providers.cpu.kernels.registry import register

_MODES = ("TF", "IDF", "TFIDF")

COUNT_PATHS = path_table("TfIdfVectorizer.count", "TfIdfVectorizer._row_values: each row scanned in onnxruntime's "
                                                  "order, n-grams looked up as tuples one by one")
KEYED = COUNT_PATHS.add("keyed", "the pool's items numbered 1..V and every n-gram's key sum(id_k * (V+1)**k) fits "
                                 "int64, the pool holds n-grams of the counted lengths, and not IDF with pool n-grams sharing an output column (there the last "
                                 "hit in scan order decides): items map to ids once, n-grams of each length and "
                                 "skip become keys for the whole batch at once, looked up in a sorted key table per length "
                                 "and counted with bincount")
SCAN = COUNT_PATHS.add("scan", "any other pool or mode: canonical")
# Keys are built in int64; below this bound no sum of products can overflow.
_KEY_LIMIT = 2 ** 62


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
        self.grams, by_length = _pool_grams(what, pool, counts, indexes, weights, self.min_n, self.max_n)
        self._build_keys(by_length)

    def _build_keys(self, by_length: dict[int, tuple[list, list, list]]) -> None:
        """The ``keyed`` path's tables, or ``self.path = SCAN`` when its condition does not hold.
        ``by_length``: per counted length its n-grams' items, output columns and weights (``_pool_grams``)."""
        self.path = SCAN
        columns = [col for _, cols, _ in by_length.values() for col in cols]
        if not columns or (self.mode == "IDF" and len(set(columns)) < len(columns)):
            return  # no n-gram of the counted lengths: the scan finds nothing at no cost
        items = sorted(set(chain.from_iterable(seg for seg, _, _ in by_length.values())))
        base = len(items) + 1  # id 0 is an item outside the pool: no key holding it is in the table
        if base ** self.max_n >= _KEY_LIMIT:
            return
        self.ids = dict(zip(items, range(1, len(items) + 1)))
        if self.pool_kind == "string":
            # bytes items decode with surrogateescape in the scan path; the same bytes map to the same id
            self.ids.update(zip(map(str.encode, items, repeat("utf-8"), repeat("surrogateescape")),
                                range(1, len(items) + 1)))
        else:
            self.int_items = np.array(items, dtype=np.int64)
        self.base = base
        # one sorted table per length: an n-gram ending in items outside the pool (id 0) has the key
        # of a shorter one
        self.tables: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        for n, (seg, cols, ws) in by_length.items():
            # per n-gram its items' ids [G, n] times the powers of base, summed: exact in int64 below
            # _KEY_LIMIT, one product for the pool instead of a Python sum per n-gram
            ids = np.fromiter(map(self.ids.__getitem__, seg), np.int64, len(seg))
            keys_n = ids.reshape(len(cols), n) @ np.array([base ** k for k in range(n)], np.int64)
            order = np.argsort(keys_n)
            self.tables[n] = (keys_n[order], np.array(cols, dtype=np.int64)[order],
                              np.array(ws, dtype=np.float64)[order])
        self.path = KEYED

    def _item_ids(self, rows: np.ndarray) -> np.ndarray:
        """[B, C] int64 ids of the items (0 for items outside the pool)."""
        if self.pool_kind == "string":
            return np.fromiter(map(self.ids.get, rows.reshape(-1).tolist(), repeat(0)), dtype=np.int64,
                               count=rows.size).reshape(rows.shape)
        vals = rows.astype(np.int64, copy=False)
        pos = np.searchsorted(self.int_items, vals)
        pos = np.minimum(pos, len(self.int_items) - 1)
        return np.where(self.int_items[pos] == vals, pos + 1, 0)

    def _keyed(self, rows: np.ndarray) -> np.ndarray:
        """The ``keyed`` path: [B, width] for [B, C] rows of the pool's kind."""
        ids = self._item_ids(rows)
        b, c = ids.shape
        found_cols, found_w, found_rows = [], [], []
        row_of = np.broadcast_to(np.arange(b, dtype=np.int64)[:, None], (b, c))
        for n, (keys, cols, weights) in self.tables.items():
            for dist in range(1, (self.max_skip + 2) if n > 1 else 2):  # 1-grams are counted once
                span = dist * (n - 1)
                if span >= c:
                    break
                m = c - span
                key = ids[:, :m].copy()
                for k in range(1, n):
                    key += ids[:, k * dist:k * dist + m] * self.base ** k
                pos = np.minimum(np.searchsorted(keys, key), len(keys) - 1)
                hit = keys[pos] == key
                found_cols.append(cols[pos[hit]])
                found_w.append(weights[pos[hit]])
                found_rows.append(row_of[:, :m][hit])
        size = b * self.width
        if not found_rows:  # every row shorter than the shortest n-gram
            return np.zeros((b, self.width), dtype=np.float32)
        flat = np.concatenate(found_rows) * self.width + np.concatenate(found_cols)
        size = b * self.width
        if self.mode == "TF":
            out = np.bincount(flat, minlength=size)
        elif self.mode == "TFIDF":
            out = np.bincount(flat, weights=np.concatenate(found_w), minlength=size)
        else:  # IDF: the columns are distinct, so every hit of a column carries the same weight
            out = np.zeros(size, dtype=np.float64)
            out[flat] = np.concatenate(found_w)
        return out.astype(np.float32).reshape(b, self.width)

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
        if kind == self.pool_kind and rows.size and self.path == KEYED:
            y = self._keyed(rows)
        elif kind == self.pool_kind and rows.size:
            for b in range(rows.shape[0]):
                items = rows[b].tolist()
                if kind == "string":
                    items = [v.decode("utf-8", errors="surrogateescape") if isinstance(v, bytes) else v
                             for v in items]
                y[b] = self._row_values(items)
        return [y if x.ndim == 2 else y[0]]


def _pool_grams(what: str, pool: list, counts: list[int], indexes: list[int], weights: object | None,
                min_n: int, max_n: int) -> tuple[dict[tuple, tuple[int, float]], dict[int, tuple[list, list, list]]]:
    """The pool's n-grams of the counted lengths: n-gram (a tuple of items) -> (output column, weight),
    and per length (its n-grams' items flat, columns, weights) in pool order. Each length's n-grams
    are cut from the pool by slicing and zipping, one C-level pass per length rather than a Python
    step per n-gram (session creation builds this; docs/benchmarks.md has the figures). Pool n-gram
    j takes ngram_indexes[j] and weights[j], j counted over every length, the uncounted ones
    included."""
    grams: dict[tuple, tuple[int, float]] = {}
    by_length: dict[int, tuple[list, list, list]] = {}
    gram_id = 0
    for k, start in enumerate(counts):
        n = k + 1
        end = counts[k + 1] if k + 1 < len(counts) else len(pool)
        if not start <= end <= len(pool) or (end - start) % n:
            raise InvalidArgument(f"{what}: ngram_counts {counts} gives {n}-grams items {start}..{end} of a "
                                  f"pool of {len(pool)}; each length needs whole n-grams inside the pool")
        g = (end - start) // n
        if min_n <= n <= max_n:
            if g and gram_id + g > len(indexes):
                raise InvalidArgument(f"{what}: the pool holds more n-grams than the {len(indexes)} "
                                      "ngram_indexes; give one index per pool n-gram")
            seg = pool[start:end]
            keys = list(zip(*(seg[i::n] for i in range(n))))
            cols = indexes[gram_id:gram_id + g]
            ws = [1.0] * g if weights is None else list(map(float, weights[gram_id:gram_id + g]))
            size = len(grams)
            grams.update(zip(keys, zip(cols, ws)))
            if len(grams) - size < g:  # a repeated n-gram (only one of the same length can be): name it
                seen: set = set()
                for key in keys:
                    if key in seen:
                        raise InvalidArgument(f"{what}: the {n}-gram {key} is twice in the pool; remove one")
                    seen.add(key)
            if keys:
                by_length[n] = (seg, cols, ws)
        gram_id += g
    return grams, by_length
