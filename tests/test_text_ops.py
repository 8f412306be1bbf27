"""The text kernels (com.microsoft Tokenizer, TfIdfVectorizer, StringNormalizer) against onnxruntime:
hand-picked edge cases (the ones onnxruntime's own kernels and docs single out: character tokens,
marks, padding, mincharnum, leftmost-longest expressions, empty strings and inputs, skips, weights,
pool kinds) and random ones. A refusal by onnxruntime must be a typed refusal by onnxhal."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnxhal
from onnxhal.hal import Node
from onnxhal.hal.errors import InvalidArgument, OrtError
from onnxhal.runtime.providers.cpu.kernel_factory import ReferenceKernel, create_cpu_kernel
from onnxhal.runtime.providers.cpu.kernels.tfidf_vectorizer import KEYED, SCAN
from onnxhal.runtime.providers.cpu.kernels.tokenizer import (
    GENERAL,
    GREEDY,
    STEPWISE,
    WHOLE,
    LongestMatch,
    greedy_is_longest,
    greedy_min_length,
)

MS = "com.microsoft"
S, I64, I32 = TensorProto.STRING, TensorProto.INT64, TensorProto.INT32


def _model(op: str, in_elem: int, out_elem: int, domain: str = "", **attrs) -> onnx.ModelProto:
    node = helper.make_node(op, ["x"], ["y"], domain=domain or None, **attrs)
    graph = helper.make_graph([node], op.lower(), [helper.make_tensor_value_info("x", in_elem, None)],
                              [helper.make_tensor_value_info("y", out_elem, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    model.ir_version = 10  # onnxruntime 1.32 refuses the IR onnx 1.23 writes
    return model


def check(model: onnx.ModelProto, x: np.ndarray, what: str) -> None:
    node = Node.from_proto(model.graph.node[0])
    try:
        kernel = create_cpu_kernel(node, None, {"": 17, MS: 1})
    except InvalidArgument:
        kernel = None
    assert not isinstance(kernel, ReferenceKernel), f"{what}: no native kernel"
    data = model.SerializeToString()
    try:
        want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    except Exception as exc:  # noqa: BLE001 - a refusal is compared, not raised
        want = exc
    try:
        got = onnxhal.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    except OrtError as exc:
        got = exc
    if isinstance(want, Exception):
        assert isinstance(got, OrtError), (what, "onnxruntime refused", str(want)[:200], "onnxhal ran", got)
        return
    assert not isinstance(got, Exception), (what, str(got))
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    if want.dtype.kind == "f":
        assert got.dtype == want.dtype, (what, got.dtype)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=what)
    else:
        assert got.tolist() == want.tolist(), (what, got.tolist(), want.tolist())


def _tok(x, **attrs) -> tuple[onnx.ModelProto, np.ndarray]:
    attrs.setdefault("pad_value", "#")
    attrs.setdefault("mincharnum", 1)
    attrs.setdefault("mark", 0)
    return _model("Tokenizer", S, S, domain=MS, **attrs), np.array(x, dtype=object)


TEXT = ["Hello, world  foo", "a bb ccc", ""]
TOKENIZER_CASES = {
    "space_separator": (TEXT, dict(separators=[" "])),
    "space_separator_marked": (TEXT, dict(separators=[" "], mark=1)),
    "characters_marked": (TEXT, dict(separators=[""], mark=1)),
    "characters_utf8": (["héllo wörld", "ab"], dict(separators=[""])),
    "tokenexp_dot_is_characters": (["héllo wörld", "ab"], dict(tokenexp=".", mark=1)),
    "two_separators_2d": ([TEXT], dict(separators=[" ", ","])),
    "separators_in_order": (["a,b;c d", ";;"], dict(separators=[",", ";", " "])),
    "separator_mincharnum": (TEXT, dict(separators=[" "], mincharnum=2)),
    "separator_longest_alternative": (["aXbXXc", "XX"], dict(separators=["X|XX"])),
    "separator_regex_class": (["a1b22c", "9"], dict(separators=["[0-9]+"])),
    "separator_empty_match_consumes": (["ab", "xyz"], dict(separators=["x*"])),
    "separator_empty_then_b": (["abc"], dict(separators=["", "b"])),
    "tokenexp_case_sensitive": (TEXT, dict(tokenexp="[a-z]+")),
    "tokenexp_mincharnum_marked": (TEXT, dict(tokenexp="[a-z]+", mincharnum=3, mark=1)),
    "tokenexp_skl2onnx": (["the Cat_9 sat, on-the mat", "", "x"], dict(tokenexp="[a-zA-Z0-9_]+")),
    "tokenexp_leftmost_longest": (["ab ab a"], dict(tokenexp="a|ab")),
    "tokenexp_optional_group": (["xaab", "ab"], dict(tokenexp="a*(ab)?")),
    "tokenexp_end_assertion_sees_the_rest": (["abc ab", "ab"], dict(tokenexp=r"ab\b|a")),
    "tokenexp_lookahead_refused": (["abab", "ab"], dict(tokenexp=r"a(?=b)|ab")),
    "separator_backreference_refused": (["aa b"], dict(separators=[r"(a)\1"])),
    "lookahead_text_in_a_class": (["a(?=b"], dict(separators=["[(?=]"])),
    "tokenexp_ascii_word": (["héllo wörld"], dict(tokenexp=r"\w+")),
    "tokenexp_word_boundary": (["Ab_9 x-y zz"], dict(tokenexp=r"\b\w\w+\b")),
    "tokenexp_utf8_mincharnum": (["dé x ééé"], dict(tokenexp="[^ ]+", mincharnum=2)),
    "tokenexp_end_of_text": (["ab cd", "x", ""], dict(tokenexp=r"[a-z]+\z")),
    "tokenexp_posix_class": (["ab12 cd"], dict(tokenexp="[[:alpha:]]+")),
    "all_empty_marked": (["", ""], dict(tokenexp="[a-z]+", mark=1)),
    "all_separators": ([" ,", ","], dict(separators=[" ", ","], mark=1)),
    "characters_all_empty": (["", ""], dict(separators=[""], mark=1)),
    "2d_marked_padded": ([["a b", "c"], ["", "d e f"]], dict(separators=[" "], mark=1, pad_value="<pad>")),
    "empty_1d": (np.zeros((0,), object), dict(separators=[" "], mark=1)),
    "empty_2d": (np.zeros((2, 0), object), dict(separators=[" "], mark=1)),
    "rank_3_refused": ([[["a"]]], dict(separators=[" "])),
    "separators_beat_tokenexp": (["ab c"], dict(separators=[" "], tokenexp="b")),
}
TOKENIZER_REFUSED = {
    "mincharnum_zero": dict(separators=[" "], mincharnum=0),
    "neither_separators_nor_tokenexp": dict(),
    "empty_tokenexp": dict(tokenexp=""),
    "characters_with_mincharnum_2": dict(separators=[""], mincharnum=2),
    "bad_separator": dict(separators=["("]),
}


@pytest.mark.parametrize("case", sorted(TOKENIZER_CASES))
def test_tokenizer_matches_onnxruntime(case):
    x, attrs = TOKENIZER_CASES[case]
    check(*_tok(x, **attrs), case)


@pytest.mark.parametrize("case", sorted(TOKENIZER_REFUSED))
def test_tokenizer_refuses_what_onnxruntime_refuses_with_a_typed_error(case):
    model, x = _tok(["a b"], **TOKENIZER_REFUSED[case])
    check(model, x, case)
    with pytest.raises(InvalidArgument, match="Tokenizer node"):
        create_cpu_kernel(Node.from_proto(model.graph.node[0]), None, {"": 17, MS: 1})


ALPHABET = list("ab ,.-xé")


def _random_texts(rng: np.random.Generator, n: int) -> list[str]:
    return ["".join(rng.choice(ALPHABET, int(rng.integers(0, 12)))) for _ in range(n)]


@pytest.mark.parametrize("seed", range(6))
def test_tokenizer_random_against_onnxruntime(seed):
    rng = np.random.default_rng(seed)
    for trial in range(8):
        shape = [int(rng.integers(1, 4))] + ([int(rng.integers(1, 4))] if rng.random() < 0.5 else [])
        x = np.array(_random_texts(rng, int(np.prod(shape))), dtype=object).reshape(shape)
        kind = trial % 4
        if kind == 0:
            attrs = dict(separators=[str(s) for s in rng.choice([" ", ",", "-", "a+", "[.,]", "b|ab"],
                                                                 int(rng.integers(1, 4)), replace=False)])
        elif kind == 1:
            attrs = dict(tokenexp=str(rng.choice(["[a-z]+", "a|ab|b", "[^ ,]+", r"\w+", "(ab)*b?", "x.?"])))
        elif kind == 2:
            attrs = dict(separators=[""])
        else:
            attrs = dict(tokenexp="[a-zé]+", pad_value="")
        attrs.update(mark=int(rng.integers(0, 2)))
        if kind != 2:
            attrs["mincharnum"] = int(rng.integers(1, 3))
        check(*_tok(x, **attrs), f"seed {seed} trial {trial} {attrs}")


@pytest.mark.parametrize("pattern,greedy", [
    ("[a-zA-Z0-9_]+", True), (r"\b\w\w+\b", True), ("[^ ]+", True), (".", True), ("ab?", True), ("x{2}y+", True),
    ("a|ab", False), ("a*(ab)?", False), ("a+b+", False), ("a+?", False), ("(ab)+", False), (r"(\w)\s", False),
])
def test_greedy_path_condition(pattern, greedy):
    assert greedy_is_longest(pattern) is greedy
    assert LongestMatch(pattern, "test").path == (GREEDY if greedy else GENERAL)


@pytest.mark.parametrize("pattern", ["[a-zA-Z0-9_]+", r"\b\w\w+\b", "[^ ,]+", "a?", "x{2}[ab]*", r"\s+", "."])
def test_greedy_path_matches_general(pattern):
    """The ``greedy`` path against the canonical ``general`` search on random strings."""
    rx = LongestMatch(pattern, "test")
    assert rx.path == GREEDY
    rng = np.random.default_rng(0)
    for _ in range(200):
        s = "".join(rng.choice(list("abx 9_,é"), int(rng.integers(0, 14))))
        pos = int(rng.integers(0, len(s) + 1))
        assert rx.search(s, pos) == rx.search_longest(s, pos), (pattern, s, pos)


@pytest.mark.parametrize("pattern", [r"\pL+", r"\p{Lu}", r"[\PN ]+", r"a\\\pN"])
def test_unicode_classes_are_a_typed_refusal_where_onnxruntime_runs(pattern):
    """A known difference (see tokenizer.py: no exact translation into Python's re exists)."""
    model, x = _tok(["héllo Wörld 42"], tokenexp=pattern)
    ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    with pytest.raises(InvalidArgument, match="Unicode class"):
        LongestMatch(pattern, "test")
    with pytest.raises(OrtError):
        onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})


@pytest.mark.parametrize("pattern,least", [
    ("[a-zA-Z0-9_]+", 1), (r"\b\w\w+\b", 2), ("a?", 0), ("x{2}[ab]*", 2), ("x{3,5}y{0,2}", 3), (r"\s*$", 0),
    ("ab?", 1), (".", 1),
])
def test_greedy_min_length(pattern, least):
    assert greedy_min_length(pattern) == least


@pytest.mark.parametrize("seed", range(4))
def test_tokenizer_whole_string_path_matches_stepwise(seed):
    """The ``whole_string`` path against the canonical ``stepwise`` scan on random strings, and the
    condition that selects it."""
    rng = np.random.default_rng(200 + seed)
    exprs = ["[a-z]+", r"\b\w\w+\b", "[^ ,]+", "a?", "x{2}[ab]*", r"\s+", ",", "[.,]", "b|ab", "ab?", r"\w\b"]
    for trial in range(40):
        picked = [str(e) for e in rng.choice(exprs, int(rng.integers(1, 3)), replace=False)]
        attrs = dict(tokenexp=picked[0]) if trial % 2 else dict(separators=picked)
        attrs.update(pad_value="#", mincharnum=int(rng.integers(1, 4)), mark=0)
        kernel = create_cpu_kernel(Node.from_proto(helper.make_node("Tokenizer", ["x"], ["y"], domain=MS, **attrs)),
                                   None, {"": 17, MS: 1})
        used = picked[:1] if trial % 2 else picked
        whole = all(greedy_is_longest(e) and greedy_min_length(e) >= 1 for e in used)
        assert (kernel.scan_path == WHOLE) == whole, (attrs, kernel.scan_path)
        texts = ["".join(rng.choice(list("abx 9_,.é"), int(rng.integers(0, 16)))) for _ in range(12)]
        for text in texts:
            kernel.scan_path = WHOLE if whole else STEPWISE
            got = kernel.tokens(text)
            kernel.scan_path = STEPWISE
            assert got == kernel.tokens(text), (attrs, text)
        batch = np.array(texts, dtype=object).reshape(3, 4)
        kernel.scan_path = WHOLE if whole else STEPWISE
        got = kernel.compute([batch])[0]
        kernel.scan_path = STEPWISE
        assert got.tolist() == kernel.compute([batch])[0].tolist(), attrs


def _tfidf(x: np.ndarray, **attrs) -> tuple[onnx.ModelProto, np.ndarray]:
    elem = S if x.dtype.kind == "O" else I64 if x.dtype == np.int64 else I32
    return _model("TfIdfVectorizer", elem, TensorProto.FLOAT, **attrs), x


X = np.array([1, 2, 3, 1, 2, 4, 1], np.int64)
BASE = dict(min_gram_length=1, max_gram_length=2, max_skip_count=1, ngram_counts=[0, 3],
            pool_int64s=[1, 2, 3, 1, 2, 2, 3], ngram_indexes=[4, 3, 2, 1, 0])
SHARED = dict(min_gram_length=1, max_gram_length=2, max_skip_count=0, ngram_counts=[0, 3],
              pool_int64s=[1, 2, 3, 1, 2, 2, 3], ngram_indexes=[0, 0, 1, 1, 2])
ONE = dict(min_gram_length=1, max_gram_length=1, max_skip_count=0, ngram_counts=[0], pool_int64s=[1, 2])
W5 = [1.0, 2.0, 3.0, 4.0, 5.0]
TFIDF_CASES = {
    "tf_skip": (X, dict(BASE, mode="TF")),
    "tfidf_weights_by_pool": (X, dict(BASE, mode="TFIDF", weights=W5)),
    "idf_weights": (X, dict(BASE, mode="IDF", weights=W5)),
    "idf_no_weights": (X, dict(BASE, mode="IDF")),
    "tfidf_no_weights": (X, dict(BASE, mode="TFIDF")),
    "bigrams_only_skip_2": (X, dict(BASE, mode="TF", min_gram_length=2, max_gram_length=2, max_skip_count=2)),
    "unigrams_skip_ignored": (X, dict(BASE, mode="TF", max_gram_length=1, max_skip_count=3)),
    "trigrams": (X, dict(mode="TF", min_gram_length=1, max_gram_length=3, max_skip_count=1, ngram_counts=[0, 2, 4],
                         pool_int64s=[1, 2, 1, 2, 1, 2, 3], ngram_indexes=[0, 1, 2, 3])),
    "shared_columns_tf": (X, dict(SHARED, mode="TF")),
    "shared_columns_tfidf": (X, dict(SHARED, mode="TFIDF", weights=W5)),
    "shared_columns_idf": (X, dict(SHARED, mode="IDF", weights=W5)),
    "int32_input": (np.array([[1, 2, 3], [2, 3, 3]], np.int32), dict(BASE, mode="TF")),
    "2d_int64_skip_5": (np.array([[1, 2], [2, 2]], np.int64), dict(mode="TF", min_gram_length=1, max_gram_length=2,
                                                                   max_skip_count=5, ngram_counts=[0, 2],
                                                                   pool_int64s=[1, 2, 2, 2], ngram_indexes=[0, 1, 2])),
    "strings_2d": (np.array([["a", "b", "a"], ["b", "a", "#"]], object),
                   dict(mode="TFIDF", min_gram_length=1, max_gram_length=2, max_skip_count=0, ngram_counts=[0, 2],
                        pool_strings=["a", "b", "a", "b"], ngram_indexes=[0, 1, 2], weights=[0.5, 2.0, 3.0])),
    "strings_1d_utf8": (np.array(["é", "b", "é", "b"], object),
                        dict(mode="TF", min_gram_length=2, max_gram_length=2, max_skip_count=1, ngram_counts=[0, 0],
                             pool_strings=["é", "b", "b", "é"], ngram_indexes=[1, 0])),
    "more_indexes_than_pool": (X, dict(ONE, mode="TF", ngram_indexes=[0, 1, 2])),
    "sparse_columns": (X, dict(ONE, mode="TF", ngram_indexes=[0, 7])),
    "no_bigrams_in_pool": (X, dict(mode="TF", min_gram_length=2, max_gram_length=2, max_skip_count=0,
                                   ngram_counts=[0, 2], pool_int64s=[1, 2], ngram_indexes=[0])),
    "int_input_string_pool": (X.astype(np.int32), dict(mode="TF", min_gram_length=1, max_gram_length=1,
                                                       max_skip_count=0, ngram_counts=[0], pool_strings=["1", "2"],
                                                       ngram_indexes=[0, 1])),
    "string_input_int_pool": (np.array(["1", "2"], object), dict(ONE, mode="TF", ngram_indexes=[0, 1])),
    "empty_1d": (np.zeros((0,), np.int64), dict(BASE, mode="TF")),
    "empty_rows": (np.zeros((2, 0), np.int64), dict(BASE, mode="TF")),
    "no_rows_refused": (np.zeros((0, 3), np.int64), dict(BASE, mode="TF")),
    "rank_3_refused": (np.ones((1, 1, 1), np.int64), dict(ONE, mode="TF", ngram_indexes=[0, 1])),
    "bad_mode": (X, dict(ONE, mode="XX", ngram_indexes=[0, 1])),
    "min_above_max": (X, dict(ONE, mode="TF", min_gram_length=2, ngram_indexes=[0, 1])),
    "max_beyond_counts": (X, dict(ONE, mode="TF", max_gram_length=2, ngram_indexes=[0, 1])),
    "negative_skip": (X, dict(ONE, mode="TF", max_skip_count=-1, ngram_indexes=[0, 1])),
    "negative_index": (X, dict(ONE, mode="TF", ngram_indexes=[0, -1])),
    "duplicate_pool": (X, dict(ONE, mode="TF", pool_int64s=[1, 1], ngram_indexes=[0, 1])),
    "partial_bigram": (X, dict(mode="TF", min_gram_length=1, max_gram_length=2, max_skip_count=0, ngram_counts=[0, 2],
                               pool_int64s=[1, 2, 3], ngram_indexes=[0, 1, 2])),
    "weights_wrong_length": (X, dict(ONE, mode="TFIDF", ngram_indexes=[0, 1], weights=[1.0])),
}


@pytest.mark.parametrize("case", sorted(TFIDF_CASES))
def test_tfidf_vectorizer_matches_onnxruntime(case):
    x, attrs = TFIDF_CASES[case]
    check(*_tfidf(x, **attrs), case)


@pytest.mark.parametrize("seed", range(8))
def test_tfidf_vectorizer_random_against_onnxruntime(seed):
    rng = np.random.default_rng(seed)
    for trial in range(6):
        max_n = int(rng.integers(1, 4))
        min_n = int(rng.integers(1, max_n + 1))
        vocab = 5
        counts, pool, n_grams = [], [], 0
        for n in range(1, max_n + 1):
            counts.append(len(pool))
            grams = {tuple(int(v) for v in rng.integers(0, vocab, n)) for _ in range(int(rng.integers(1, 6)))}
            for g in sorted(grams):
                pool += list(g)
                n_grams += 1
        indexes = [int(i) for i in rng.permutation(n_grams + int(rng.integers(0, 3)))[:n_grams]]
        attrs = dict(mode=str(rng.choice(["TF", "IDF", "TFIDF"])), min_gram_length=min_n, max_gram_length=max_n,
                     max_skip_count=int(rng.integers(0, 3)), ngram_counts=counts, ngram_indexes=indexes)
        if rng.random() < 0.6:
            attrs["weights"] = [float(w) for w in rng.uniform(0.1, 3.0, n_grams).astype(np.float32)]
        shape = [int(rng.integers(0, 12))] if rng.random() < 0.5 else [int(rng.integers(1, 4)), int(rng.integers(0, 10))]
        x = rng.integers(0, vocab, shape)
        kind = trial % 3
        if kind == 0:
            attrs["pool_int64s"], x = pool, x.astype(np.int64)
        elif kind == 1:
            attrs["pool_int64s"], x = pool, x.astype(np.int32)
        else:
            attrs["pool_strings"], x = [f"w{v}" for v in pool], np.vectorize(lambda v: f"w{v}", otypes=[object])(x)
        check(*_tfidf(x, **attrs), f"seed {seed} trial {trial} {attrs} shape {shape}")


@pytest.mark.parametrize("seed", range(6))
def test_tfidf_keyed_path_matches_scan(seed):
    """The ``keyed`` path against the canonical ``scan`` on random pools and rows (items outside the
    pool included), and the condition that selects it."""
    rng = np.random.default_rng(100 + seed)
    for trial in range(20):
        max_n = int(rng.integers(1, 5))
        min_n = int(rng.integers(1, max_n + 1))
        vocab = int(rng.integers(2, 9))
        counts, pool, lengths = [], [], []
        for n in range(1, max_n + 1):
            counts.append(len(pool))
            grams = {tuple(int(v) for v in rng.integers(0, vocab, n)) for _ in range(int(rng.integers(0, 8)))}
            for g in sorted(grams):
                pool += list(g)
                lengths.append(n)
        n_grams = len(lengths)
        if not n_grams:
            continue
        indexes = [int(i) for i in rng.integers(0, n_grams + 2, n_grams)]  # columns often shared
        mode = str(rng.choice(["TF", "IDF", "TFIDF"]))
        attrs = dict(mode=mode, min_gram_length=min_n, max_gram_length=max_n,
                     max_skip_count=int(rng.integers(0, 4)), ngram_counts=counts, ngram_indexes=indexes,
                     weights=[float(w) for w in rng.uniform(0.1, 3.0, n_grams)])
        strings = trial % 2 == 0
        if strings:
            attrs["pool_strings"] = [f"w{v}" for v in pool]
        else:
            attrs["pool_int64s"] = pool
        node = Node.from_proto(helper.make_node("TfIdfVectorizer", ["x"], ["y"], **attrs))
        kernel = create_cpu_kernel(node, None, {"": 17})
        columns = [col for col, n in zip(indexes, lengths) if min_n <= n <= max_n]
        counted, shared = bool(columns), len(set(columns)) < len(columns)
        assert (kernel.path == KEYED) == (counted and not (mode == "IDF" and shared)), (attrs, kernel.path)
        shape = [int(rng.integers(1, 4)), int(rng.integers(0, 14))]
        x = rng.integers(-1, vocab + 2, shape)  # -1 and vocab.. are outside the pool
        x = np.vectorize(lambda v: f"w{v}", otypes=[object])(x) if strings else x.astype(np.int64)
        got = kernel.compute([x])[0]
        kernel.path = SCAN
        want = kernel.compute([x])[0]
        np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=f"{attrs} {x.tolist()}")
        if strings:  # bytes items count as their UTF-8 text
            kernel.path = KEYED if counted and not (mode == "IDF" and shared) else SCAN
            as_bytes = np.vectorize(lambda v: v.encode(), otypes=[object])(x)
            np.testing.assert_allclose(kernel.compute([as_bytes])[0], want, rtol=1e-6)


@pytest.mark.parametrize("locale", ["C", "POSIX", "C.UTF-8"])
@pytest.mark.parametrize("action", ["LOWER", "UPPER", "NONE"])
def test_string_normalizer_case_follows_the_locale_as_onnxruntime(locale, action):
    """"C" and "POSIX" change ASCII letters only; other locales map each character to one character
    ("İ" lowers to "i", "ß" does not upper to "SS"), stopwords compared through the same lowering."""
    x = np.array(["ÉPÉE", "épée", "Straße", "İx", "AbC", "ǅ", ""], dtype=object)
    for stops in ([], ["épée", "abc", "ix"]):
        attrs = dict(case_change_action=action, locale=locale, is_case_sensitive=0)
        if stops:
            attrs["stopwords"] = stops
        model = _model("StringNormalizer", S, S, **attrs)
        try:
            ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        except Exception as exc:  # noqa: BLE001 - onnxruntime needs the locale installed; onnxhal does not
            assert "locale" in str(exc), exc
            continue
        check(model, x, f"{locale} {action} {stops}")


def test_string_normalizer_is_native():
    node = helper.make_node("StringNormalizer", ["x"], ["y"], case_change_action="LOWER")
    assert not isinstance(create_cpu_kernel(Node.from_proto(node), None, 10), ReferenceKernel)


def test_text_pipeline_normalizer_tokenizer_tfidf_against_onnxruntime():
    """skl2onnx's text chain, StringNormalizer -> Tokenizer -> Flatten -> TfIdfVectorizer, on one model."""
    nodes = [helper.make_node("StringNormalizer", ["x"], ["n"], case_change_action="LOWER", is_case_sensitive=0, locale="C",
                              stopwords=["the"]),
             helper.make_node("Tokenizer", ["n"], ["t"], domain=MS, mark=0, mincharnum=1, pad_value="#",
                              tokenexp="[a-zA-Z0-9_]+"),
             helper.make_node("Flatten", ["t"], ["f"]),
             helper.make_node("TfIdfVectorizer", ["f"], ["y"], mode="TF", min_gram_length=1, max_gram_length=2,
                              max_skip_count=0, ngram_counts=[0, 3], pool_strings=["cat", "dog", "sat", "cat", "sat"],
                              ngram_indexes=[2, 0, 1, 3])]
    graph = helper.make_graph(nodes, "text", [helper.make_tensor_value_info("x", S, [None])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    model.ir_version = 10
    for x in (["The cat sat", "a Dog, the dog", "THE"], ["the", "the"], ["cat-sat cat"]):
        feed = np.array(x, object)
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": feed})
        got = onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": feed})
        assert np.asarray(got[0]).shape == want[0].shape, x
        np.testing.assert_allclose(got[0], want[0], err_msg=str(x))
