"""TfIdfVectorizer's build (the pool's n-gram table and the ``keyed`` path's key tables, made at
session creation by slicing the pool per length) against the plain build, one Python step per pool
n-gram as the operator spec states it; and its typed errors for a malformed pool."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from onnxhal.hal import Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels.tfidf_vectorizer import KEYED, TfIdfVectorizer


def _plain_grams(pool: list, counts: list[int], indexes: list[int], weights: list[float] | None,
                 min_n: int, max_n: int) -> dict[tuple, tuple[int, float]]:
    grams, gram_id = {}, 0
    for k, start in enumerate(counts):
        n = k + 1
        end = counts[k + 1] if k + 1 < len(counts) else len(pool)
        for g in range(start, end, n):
            if min_n <= n <= max_n:
                grams[tuple(pool[g:g + n])] = (indexes[gram_id], 1.0 if weights is None else float(weights[gram_id]))
            gram_id += 1
    return grams


def _plain_tables(grams: dict[tuple, tuple[int, float]], min_n: int, max_n: int) -> dict[int, tuple]:
    items = sorted({v for key in grams for v in key})
    ids = {v: i + 1 for i, v in enumerate(items)}
    base = len(items) + 1
    tables = {}
    for n in range(min_n, max_n + 1):
        rows = sorted((sum(ids[v] * base ** k for k, v in enumerate(key)), col, w)
                      for key, (col, w) in grams.items() if len(key) == n)
        if rows:
            tables[n] = tuple(np.array(c) for c in zip(*rows))
    return tables


def _kernel(**attrs) -> TfIdfVectorizer:
    return TfIdfVectorizer(Node.from_proto(helper.make_node("TfIdfVectorizer", ["x"], ["y"], **attrs)), None)


@pytest.mark.parametrize("seed", range(4))
def test_tfidf_build_matches_the_plain_build(seed):
    rng = np.random.default_rng(500 + seed)
    for trial in range(25):
        max_n = int(rng.integers(1, 5))
        min_n = int(rng.integers(1, max_n + 1))
        vocab = int(rng.integers(2, 12))
        counts, pool, n_grams = [], [], 0
        for n in range(1, max_n + 1):
            counts.append(len(pool))
            for g in sorted({tuple(int(v) for v in rng.integers(0, vocab, n)) for _ in range(int(rng.integers(0, 9)))}):
                pool += list(g)
                n_grams += 1
        if not n_grams:
            continue
        indexes = [int(i) for i in rng.permutation(n_grams + 2)[:n_grams]]
        # float32 values: the attribute holds float32
        weights = [float(w) for w in rng.uniform(0.1, 3.0, n_grams).astype(np.float32)] if trial % 3 else None
        strings = trial % 2 == 0
        attrs = dict(mode="TFIDF", min_gram_length=min_n, max_gram_length=max_n, max_skip_count=1,
                     ngram_counts=counts, ngram_indexes=indexes)
        if weights is not None:
            attrs["weights"] = weights
        items = [f"w{v}" for v in pool] if strings else pool
        attrs["pool_strings" if strings else "pool_int64s"] = items
        kernel = _kernel(**attrs)
        want = _plain_grams(items, counts, indexes, weights, min_n, max_n)
        assert kernel.grams == want, attrs
        if kernel.path != KEYED:
            assert not want, attrs  # TFIDF: only an empty counted pool leaves the keyed path
            continue
        tables = _plain_tables(want, min_n, max_n)
        assert sorted(kernel.tables) == sorted(tables), attrs
        for n, (keys, cols, ws) in tables.items():
            got = kernel.tables[n]
            np.testing.assert_array_equal(got[0], keys)
            np.testing.assert_array_equal(got[1], cols)
            np.testing.assert_allclose(got[2], ws, rtol=0)


BASE = dict(mode="TF", min_gram_length=1, max_gram_length=2, max_skip_count=0)


@pytest.mark.parametrize("attrs, match", [
    (dict(BASE, ngram_counts=[0, 3], ngram_indexes=[0, 1, 2, 3], pool_int64s=[1, 2, 1, 3, 4]), r"1-gram \(1,\) is twice"),
    (dict(BASE, ngram_counts=[0, 2], ngram_indexes=[0, 1, 2, 3], pool_strings=["a", "b", "x", "y", "x", "y"]),
     r"2-gram \('x', 'y'\) is twice"),
    (dict(BASE, ngram_counts=[0, 2], ngram_indexes=[0, 1, 2], pool_int64s=[1, 2, 3]), "whole n-grams inside the pool"),
    (dict(BASE, ngram_counts=[0, 2], ngram_indexes=[0, 1], pool_int64s=[1, 2, 3, 4]), "more n-grams than the 2"),
])
def test_tfidf_build_keeps_its_typed_errors(attrs, match):
    with pytest.raises(InvalidArgument, match=match):
        _kernel(**attrs)
