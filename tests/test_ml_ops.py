"""ai.onnx.ml operators on the CPU EP against onnxruntime: seeded random one-node models (random
attributes, random inputs with unknown keys, NaNs, zero rows), every output compared: labels and
strings exactly, floats within 1e-5 relative. Each case must run on a native kernel, not
onnx.reference's."""

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

ML = "ai.onnx.ml"
SEEDS = range(6)
F, D, I64, I32, S = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64, TensorProto.INT32, TensorProto.STRING


def _model(op: str, inputs: list, outputs: list, ml_opset: int = 3, **attrs) -> onnx.ModelProto:
    node = helper.make_node(op, [i.name for i in inputs], [o.name for o in outputs], domain=ML, **attrs)
    graph = helper.make_graph([node], op.lower(), inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ML, ml_opset)])
    model.ir_version = 10  # onnxruntime 1.32 refuses the IR onnx 1.23 writes
    return model


def _t(name: str, elem: int, shape: list | None = None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _run_both(model: onnx.ModelProto, feeds: dict) -> tuple[list | Exception, list | Exception]:
    data = model.SerializeToString()
    try:
        want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    except Exception as exc:  # noqa: BLE001 - a refusal is compared, not raised
        want = exc
    try:
        got = onnxhal.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    except OrtError as exc:
        got = exc
    return want, got


def _same(want, got, what: str) -> None:
    assert len(got) == len(want), what
    for i, (w, g) in enumerate(zip(want, got)):
        w, g = np.asarray(w), np.asarray(g)
        assert w.shape == g.shape, (what, i, w.shape, g.shape)
        if w.dtype.kind in "OUS":
            assert g.dtype.kind in "OUS", (what, i, g.dtype)
            assert w.tolist() == g.tolist(), (what, i, w.tolist(), g.tolist())
        elif w.dtype.kind == "f":
            assert g.dtype == w.dtype, (what, i, g.dtype, w.dtype)
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=f"{what} output {i}")
        else:
            assert g.dtype == w.dtype, (what, i, g.dtype, w.dtype)
            np.testing.assert_array_equal(g, w, err_msg=f"{what} output {i}")


def check(model: onnx.ModelProto, feeds: dict, what: str) -> None:
    node = Node.from_proto(model.graph.node[0])
    kernel = create_cpu_kernel(node, None, {ML: model.opset_import[1].version})
    assert not isinstance(kernel, ReferenceKernel), f"{what}: no native kernel"
    want, got = _run_both(model, feeds)
    if isinstance(want, Exception) and "NOT_IMPLEMENTED" in str(want):
        return  # onnxruntime has no kernel for this type (int32 OneHotEncoder ...): onnxhal may run it
    if isinstance(want, Exception):  # onnxruntime refuses the values: onnxhal must refuse too, typed
        assert isinstance(got, OrtError), (what, "onnxruntime refused", str(want)[:200], "onnxhal ran")
        return
    assert not isinstance(got, Exception), (what, str(got))
    _same(want, got, what)


def _words(rng: np.random.Generator, n: int, pool: int = 12) -> list[str]:
    return [f"w{int(v)}" for v in rng.integers(0, pool, n)]


# --- encoders and mappers -----------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_label_encoder(seed):
    rng = np.random.default_rng(seed)
    keys_s = sorted(set(_words(rng, 8)))
    keys_i = np.unique(rng.integers(-5, 20, 8)).tolist()
    keys_f = np.unique(rng.integers(-5, 20, 8)).astype(np.float32).tolist()
    shape = [int(rng.integers(1, 4)), int(rng.integers(1, 6))]
    x_s = np.array(_words(rng, int(np.prod(shape)), 16), dtype=object).reshape(shape)
    x_i = rng.integers(-6, 22, shape).astype(np.int64)
    x_f = rng.integers(-6, 22, shape).astype(np.float32)
    x_f.reshape(-1)[0] = np.nan
    vals_i = rng.integers(0, 100, 16).tolist()
    vals_f = rng.standard_normal(16).astype(np.float32).tolist()
    cases = [
        ("s->i", x_s, S, I64, dict(keys_strings=keys_s, values_int64s=vals_i[:len(keys_s)], default_int64=-7)),
        ("s->f", x_s, S, F, dict(keys_strings=keys_s, values_floats=vals_f[:len(keys_s)], default_float=2.5)),
        ("i->s", x_i, I64, S, dict(keys_int64s=keys_i, values_strings=_words(rng, len(keys_i)),
                                   default_string="none")),
        ("f->f", x_f, F, F, dict(keys_floats=keys_f, values_floats=vals_f[:len(keys_f)])),
        ("s->s", x_s, S, S, dict(keys_strings=keys_s, values_strings=_words(rng, len(keys_s)))),
        ("i->i", x_i, I64, I64, dict(keys_int64s=keys_i, values_int64s=vals_i[:len(keys_i)])),
    ]
    for name, x, tin, tout, attrs in cases:
        model = _model("LabelEncoder", [_t("X", tin, None)], [_t("Y", tout, None)], ml_opset=2, **attrs)
        check(model, {"X": x}, f"LabelEncoder v2 {name} seed {seed}")
    # opset 4: keys and values as tensors, a default tensor
    keys = helper.make_tensor("keys_tensor", I64, [len(keys_i)], keys_i)
    values = helper.make_tensor("values_tensor", F, [len(keys_i)], vals_f[:len(keys_i)])
    default = helper.make_tensor("default_tensor", F, [1], [4.5])
    model = _model("LabelEncoder", [_t("X", I64, None)], [_t("Y", F, None)], ml_opset=4, keys_tensor=keys,
                   values_tensor=values, default_tensor=default)
    check(model, {"X": x_i}, f"LabelEncoder v4 seed {seed}")
    # opset 1: strings to indices and back
    model = _model("LabelEncoder", [_t("X", S, None)], [_t("Y", I64, None)], ml_opset=1, classes_strings=keys_s,
                   default_int64=-3)
    check(model, {"X": x_s}, f"LabelEncoder v1 s->i seed {seed}")
    model = _model("LabelEncoder", [_t("X", I64, None)], [_t("Y", S, None)], ml_opset=1, classes_strings=keys_s,
                   default_string="?")
    check(model, {"X": x_i}, f"LabelEncoder v1 i->s seed {seed}")


@pytest.mark.parametrize("seed", SEEDS)
def test_category_mapper(seed):
    rng = np.random.default_rng(seed)
    strings = sorted(set(_words(rng, 8)))
    ints = rng.permutation(40)[:len(strings)].tolist()
    attrs = dict(cats_strings=strings, cats_int64s=ints, default_int64=-5, default_string="unk")
    x_s = np.array(_words(rng, 10, 16), dtype=object).reshape(2, 5)
    x_i = rng.integers(0, 40, (3, 4)).astype(np.int64)
    check(_model("CategoryMapper", [_t("X", S, None)], [_t("Y", I64, None)], **attrs), {"X": x_s},
          f"CategoryMapper s->i seed {seed}")
    check(_model("CategoryMapper", [_t("X", I64, None)], [_t("Y", S, None)], **attrs), {"X": x_i},
          f"CategoryMapper i->s seed {seed}")


@pytest.mark.parametrize("seed", SEEDS)
def test_one_hot_encoder(seed):
    rng = np.random.default_rng(seed)
    cats = np.unique(rng.integers(0, 12, 6)).tolist()
    shape = [int(rng.integers(1, 4)), int(rng.integers(1, 4))]
    for elem, dtype in ((I64, np.int64), (I32, np.int32), (F, np.float32), (D, np.float64)):
        x = rng.integers(0, 12, shape).astype(dtype)
        for zeros in (1, 0):
            model = _model("OneHotEncoder", [_t("X", elem, None)], [_t("Y", F, None)], cats_int64s=cats, zeros=zeros)
            check(model, {"X": x}, f"OneHotEncoder {dtype.__name__} zeros={zeros} seed {seed}")
    words = sorted(set(_words(rng, 6)))
    x = np.array(_words(rng, 6, 14), dtype=object).reshape(2, 3)
    check(_model("OneHotEncoder", [_t("X", S, None)], [_t("Y", F, None)], cats_strings=words), {"X": x},
          f"OneHotEncoder strings seed {seed}")
    known = np.array([words[int(i)] for i in rng.integers(0, len(words), 6)], dtype=object).reshape(3, 2)
    check(_model("OneHotEncoder", [_t("X", S, None)], [_t("Y", F, None)], cats_strings=words), {"X": known},
          f"OneHotEncoder known strings seed {seed}")


def test_one_hot_encoder_values_far_outside_the_categories():
    # negative categories, and values whose distance to them wraps around int64's range
    info = np.iinfo(np.int64)
    x = np.array([[-3, 5, info.max], [info.min, -1, 0], [info.min + 1, info.max - 1, 2]], np.int64)
    for cats in ([-3, 0, 2, 5], [2, -1], [info.max - 1, 7]):
        model = _model("OneHotEncoder", [_t("X", I64, None)], [_t("Y", F, None)], cats_int64s=cats, zeros=1)
        check(model, {"X": x}, f"OneHotEncoder cats {cats}")
    strings = np.array([["a", b"b".decode(), "zz"], ["", "c", "a"]], dtype=object)
    check(_model("OneHotEncoder", [_t("X", S, None)], [_t("Y", F, None)], cats_strings=["a", "b", "c"], zeros=0),
          {"X": strings}, "OneHotEncoder strings zeros=0")


@pytest.mark.parametrize("seed", SEEDS)
def test_imputer(seed):
    rng = np.random.default_rng(seed)
    cols = int(rng.integers(1, 6))
    x = rng.standard_normal((4, cols)).astype(np.float32)
    x[rng.random(x.shape) < 0.3] = np.nan
    per_col = rng.standard_normal(cols).astype(np.float32).tolist()
    for values in (per_col, [1.5]):
        model = _model("Imputer", [_t("X", F, None)], [_t("Y", F, None)], imputed_value_floats=values,
                       replaced_value_float=float("nan"))
        check(model, {"X": x}, f"Imputer NaN {len(values)} seed {seed}")
    xi = rng.integers(-2, 3, (3, cols)).astype(np.int64)
    model = _model("Imputer", [_t("X", I64, None)], [_t("Y", I64, None)],
                   imputed_value_int64s=rng.integers(10, 20, cols).tolist(), replaced_value_int64=0)
    check(model, {"X": xi}, f"Imputer int64 seed {seed}")
    model = _model("Imputer", [_t("X", F, None)], [_t("Y", F, None)], imputed_value_floats=per_col,
                   replaced_value_float=0.0)
    check(model, {"X": np.where(rng.random(x.shape) < 0.4, 0, x).astype(np.float32)}, f"Imputer zero seed {seed}")


def test_imputer_one_session_several_shapes():
    """Imputer keeps the imputed values of the last input shape it checked: runs of one session on
    other shapes (and back) must still impute each column's value."""
    rng = np.random.default_rng(7)
    per_col = [1.5, -2.0, 3.25]
    model = _model("Imputer", [_t("X", F, None)], [_t("Y", F, None)], imputed_value_floats=per_col,
                   replaced_value_float=float("nan"))
    data = model.SerializeToString()
    want_sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    got_sess = onnxhal.InferenceSession(data, providers=["CPUExecutionProvider"])
    for rows in (4, 2, 4, 1):
        x = rng.standard_normal((rows, 3)).astype(np.float32)
        x[rng.random(x.shape) < 0.5] = np.nan
        _same(want_sess.run(None, {"X": x}), got_sess.run(None, {"X": x}), f"Imputer rows {rows}")


@pytest.mark.parametrize("seed", SEEDS)
def test_array_feature_extractor(seed):
    rng = np.random.default_rng(seed)
    for shape, elem, dtype in (([3, 7], F, np.float32), ([2, 3, 5], I64, np.int64), ([6], D, np.float64),
                               ([2, 4], S, object)):
        x = (np.array(_words(rng, int(np.prod(shape))), dtype=object).reshape(shape) if dtype is object
             else (rng.standard_normal(shape) * 10).astype(dtype))
        y = rng.integers(0, shape[-1], int(rng.integers(1, 5))).astype(np.int64)
        model = _model("ArrayFeatureExtractor", [_t("X", elem, None), _t("Y", I64, None)], [_t("Z", elem, None)])
        check(model, {"X": x, "Y": y}, f"ArrayFeatureExtractor {shape} seed {seed}")
    model = _model("ArrayFeatureExtractor", [_t("X", F, None), _t("Y", I64, None)], [_t("Z", F, None)])
    check(model, {"X": np.ones((2, 3), np.float32), "Y": np.array([3], np.int64)}, "ArrayFeatureExtractor out of range")


@pytest.mark.parametrize("seed", SEEDS)
def test_feature_vectorizer(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 4))
    widths = [int(w) for w in rng.integers(1, 5, 3)]
    dims = [max(1, w + int(d)) for w, d in zip(widths, rng.integers(-1, 2, 3))]
    types = [(F, np.float32), (I64, np.int64), (D, np.float64)]
    inputs = [_t(f"X{i}", types[i][0], None) for i in range(3)]
    feeds = {f"X{i}": (rng.standard_normal((n, w)) * 5).astype(types[i][1]) for i, w in enumerate(widths)}
    model = _model("FeatureVectorizer", inputs, [_t("Y", F, None)], inputdimensions=dims)
    check(model, feeds, f"FeatureVectorizer {widths} -> {dims} seed {seed}")


def test_dict_vectorizer_and_cast_map():
    rng = np.random.default_rng(0)
    vocab = _words(rng, 6, 6)
    vocab = sorted(set(vocab))
    m_type = helper.make_map_type_proto(S, helper.make_tensor_type_proto(F, None))
    model = _model("DictVectorizer", [helper.make_value_info("X", m_type)], [_t("Y", F, None)],
                   string_vocabulary=vocab)
    check(model, {"X": {vocab[0]: 1.5, "zz": 2.0, vocab[-1]: -3.25}}, "DictVectorizer string->float")
    m_type = helper.make_map_type_proto(I64, helper.make_tensor_type_proto(F, None))
    model = _model("DictVectorizer", [helper.make_value_info("X", m_type)], [_t("Y", F, None)],
                   int64_vocabulary=[3, 1, 7, 9])
    check(model, {"X": {1: 0.5, 9: 2.0, 4: 8.0}}, "DictVectorizer int64->float")
    m_type = helper.make_map_type_proto(I64, helper.make_tensor_type_proto(F, None))
    for form, cast in (("DENSE", "TO_FLOAT"), ("SPARSE", "TO_FLOAT"), ("DENSE", "TO_INT64")):
        out_type = F if cast == "TO_FLOAT" else I64
        model = _model("CastMap", [helper.make_value_info("X", m_type)], [_t("Y", out_type, None)],
                       cast_to=cast, map_form=form, max_map=6)
        check(model, {"X": {4: 1.5, 1: 2.0, 2: -3.0}}, f"CastMap {form} {cast}")


# --- row transforms -------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_normalizer_binarizer_scaler(seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((4, 5)).astype(np.float32)
    x[1] = 0  # a zero row
    x[2] = -np.abs(x[2])  # a row whose max is negative
    for norm in ("MAX", "L1", "L2"):
        for elem, dtype in ((F, np.float32), (D, np.float64), (I64, np.int64)):
            model = _model("Normalizer", [_t("X", elem, None)], [_t("Y", F, None)], norm=norm)
            check(model, {"X": (x * 3).astype(dtype)}, f"Normalizer {norm} {dtype.__name__} seed {seed}")
    xb = x.copy()
    xb[0, 0] = np.nan
    check(_model("Binarizer", [_t("X", F, None)], [_t("Y", F, None)], threshold=0.2), {"X": xb},
          f"Binarizer seed {seed}")
    for elem, dtype in ((F, np.float32), (D, np.float64), (I64, np.int64)):
        model = _model("Scaler", [_t("X", elem, None)], [_t("Y", F, None)],
                       offset=rng.standard_normal(5).tolist(), scale=rng.standard_normal(5).tolist())
        check(model, {"X": (x * 4).astype(dtype)}, f"Scaler {dtype.__name__} seed {seed}")


# --- linear models and SVMs -----------------------------------------------------------------------

TRANSFORMS = ("NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO")


@pytest.mark.parametrize("seed", SEEDS)
def test_linear_classifier(seed):
    rng = np.random.default_rng(seed)
    feats = 4
    x = rng.standard_normal((5, feats)).astype(np.float32)
    for classes in (1, 2, 3):
        for labels in ("ints", "strings"):
            label_list = list(range(10, 10 + max(2, classes)))
            attrs = ({"classlabels_ints": label_list} if labels == "ints"
                     else {"classlabels_strings": [f"c{v}" for v in label_list]})
            for transform in TRANSFORMS:
                model = _model("LinearClassifier", [_t("X", F, None)],
                               [_t("Y", I64 if labels == "ints" else S, None), _t("Z", F, None)],
                               coefficients=rng.standard_normal(classes * feats).tolist(),
                               intercepts=rng.standard_normal(classes).tolist(), post_transform=transform, **attrs)
                check(model, {"X": x}, f"LinearClassifier {classes} {labels} {transform} seed {seed}")


def _svc_attrs(rng: np.random.Generator, k: int, feats: int, proba: bool, kernel: str) -> dict:
    per_class = rng.integers(1, 4, k).tolist()
    count = sum(per_class)
    pairs = k * (k - 1) // 2
    attrs = dict(vectors_per_class=per_class, support_vectors=rng.standard_normal(count * feats).tolist(),
                 coefficients=rng.standard_normal((k - 1) * count).tolist(), rho=rng.standard_normal(pairs).tolist(),
                 kernel_type=kernel, kernel_params=[0.3, 0.1, 2.0], classlabels_ints=list(range(k)))
    if proba:
        attrs.update(prob_a=(-np.abs(rng.standard_normal(pairs)) - 0.5).tolist(),
                     prob_b=rng.standard_normal(pairs).tolist())
    return attrs


@pytest.mark.parametrize("seed", SEEDS)
def test_svm_classifier(seed):
    rng = np.random.default_rng(seed)
    feats = 3
    x = rng.standard_normal((6, feats)).astype(np.float32)
    # for the probabilities, rows enough (and spread enough) that the coupling's rows stop at
    # different iterations; 2 classes take its closed form (raw scores of such rows differ from
    # onnxruntime's float32 sums by more than the tolerance: they keep the 6 rows)
    wide = (rng.standard_normal((24, feats)) * rng.uniform(0.2, 3.0, (24, 1))).astype(np.float32)
    out = [_t("Y", I64, None), _t("Z", F, None)]
    for k in (2, 3, 5):
        for proba in (False, True):
            for kernel in ("RBF", "LINEAR", "POLY", "SIGMOID"):
                for transform in ("NONE", "LOGISTIC"):
                    model = _model("SVMClassifier", [_t("X", F, None)], out, post_transform=transform,
                                   **_svc_attrs(rng, k, feats, proba, kernel))
                    check(model, {"X": wide if proba else x},
                          f"SVMClassifier k={k} proba={proba} {kernel} {transform} seed {seed}")
    for k in (2, 3):  # liblinear form: no support vectors
        for transform in TRANSFORMS:
            coef = rng.standard_normal(k * feats)
            if seed % 2:
                coef = np.abs(coef)  # all weights positive: onnxruntime's other two-class rule
            model = _model("SVMClassifier", [_t("X", F, None)], out, coefficients=coef.tolist(), kernel_type="LINEAR",
                           kernel_params=[0.0, 0.0, 1.0],
                           rho=rng.standard_normal(1).tolist(), classlabels_ints=list(range(k)),
                           post_transform=transform)
            check(model, {"X": x}, f"SVMClassifier linear k={k} {transform} seed {seed}")


def _libsvm_coupling(r: np.ndarray) -> np.ndarray:
    """libsvm's multiclass_probability (svm.cpp) for one row, transcribed: r [k, k] the pairwise
    probabilities; Qp and pQp updated within an iteration as libsvm updates them."""
    k = len(r)
    q = -r.T * r
    q[np.arange(k), np.arange(k)] = [sum(r[j, t] ** 2 for j in range(k) if j != t) for t in range(k)]
    p = np.full(k, 1.0 / k)
    for _ in range(100):
        qp = q @ p
        pqp = p @ qp
        max_error = 0.0
        for error in np.abs(qp - pqp):
            if error > max_error:  # as libsvm and onnxruntime: a NaN error is passed over
                max_error = error
        if max_error < 0.005 / k:
            break
        for t in range(k):
            diff = (pqp - qp[t]) / q[t, t]
            p[t] += diff
            pqp = (pqp + diff * (diff * q[t, t] + 2 * qp[t])) / (1 + diff) / (1 + diff)
            qp = (qp + diff * q[t]) / (1 + diff)
            p /= 1 + diff
    return p


@pytest.mark.parametrize("k", [2, 3, 4, 6, 9])
def test_svm_coupling_matches_libsvm_per_row(k):
    """The coupling on all rows at once against libsvm's loop run row by row: the rows stop after 0
    (uniform pairwise probabilities) to 4 iterations, so most iterations run with some rows stopped."""
    from onnxhal.runtime.providers.cpu.kernels.ml_svm import _Coupling, _coupling_two

    rng = np.random.default_rng(k)
    pair_i, pair_j = np.triu_indices(k, 1)
    rows = 300
    v = rng.uniform(0, 1, (rows, len(pair_i))) ** rng.uniform(0.1, 8, (rows, 1))
    v[:3] = 0.5  # uniform: stops before any step
    v[3, 0] = np.nan  # (Platt of a NaN score) stops before any step: p = 1/k, as onnxruntime gives
    v = np.clip(v, 1e-7, 1 - 1e-7).astype(np.float32)
    coupling = (lambda v: _coupling_two(v[:, 0])) if k == 2 else _Coupling(pair_i, pair_j, k)
    got = coupling(v)
    assert got.shape == (rows, k) and got.dtype == np.float32
    for n in range(rows):
        r = np.zeros((k, k))
        r[pair_i, pair_j] = v[n]
        r[pair_j, pair_i] = 1 - v[n].astype(np.float64)
        np.testing.assert_allclose(got[n], _libsvm_coupling(r), rtol=1e-6, atol=1e-7, err_msg=f"row {n}")
    np.testing.assert_array_equal(got[3], np.float32(1 / k))
    np.testing.assert_array_equal(coupling(v[3:4]), np.float32(1 / k)[None].repeat(k)[None])
    if k > 2:  # large batches go a chunk of rows at a time: the same rows, the same result
        coupling.chunk = 7
        np.testing.assert_array_equal(coupling(v), got)
    assert coupling(v[:0]).shape == (0, k)


# --- tree ensembles -------------------------------------------------------------------------------


def _grow(rng: np.random.Generator, nodes: list[dict], feats: int, level: int, depth: int) -> int:
    k = len(nodes)
    nodes.append({"leaf": True})
    if level == depth or (level > 0 and rng.random() < 0.3):
        return k
    nodes[k] = {"leaf": False, "feature": int(rng.integers(0, feats)), "value": float(np.float32(rng.standard_normal())),
                "mode": str(rng.choice(["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT"])),
                "missing": int(rng.integers(0, 2))}
    nodes[k]["true"] = _grow(rng, nodes, feats, level + 1, depth)
    nodes[k]["false"] = _grow(rng, nodes, feats, level + 1, depth)
    return k


def _random_trees(rng: np.random.Generator, n_trees: int, feats: int, depth: int) -> list[list[dict]]:
    """Trees as lists of nodes {feature, value, mode, true, false} (indices in the tree) or leaves."""
    trees = []
    for _ in range(n_trees):
        nodes: list[dict] = []
        _grow(rng, nodes, feats, 0, depth)
        trees.append(nodes)
    return trees


def _legacy_tree_attrs(rng: np.random.Generator, trees: list, n_out: int, prefix: str,
                       every_target: bool = False) -> dict:
    """Opset-1/3 attributes of ``trees``; each leaf writes every target (``every_target``) or a
    random subset."""
    a: dict[str, list] = {k: [] for k in ("nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_values",
                                          "nodes_modes", "nodes_truenodeids", "nodes_falsenodeids",
                                          "nodes_missing_value_tracks_true", f"{prefix}_treeids",
                                          f"{prefix}_nodeids", f"{prefix}_ids", f"{prefix}_weights")}
    for t, nodes in enumerate(trees):
        for i, nd in enumerate(nodes):
            a["nodes_treeids"].append(t)
            a["nodes_nodeids"].append(i)
            if nd["leaf"]:
                a["nodes_featureids"].append(0)
                a["nodes_values"].append(0.0)
                a["nodes_modes"].append("LEAF")
                a["nodes_truenodeids"].append(0)
                a["nodes_falsenodeids"].append(0)
                a["nodes_missing_value_tracks_true"].append(0)
                targets = range(n_out) if every_target else \
                    rng.choice(n_out, size=int(rng.integers(1, n_out + 1)), replace=False)
                for j in targets:
                    a[f"{prefix}_treeids"].append(t)
                    a[f"{prefix}_nodeids"].append(i)
                    a[f"{prefix}_ids"].append(int(j))
                    a[f"{prefix}_weights"].append(float(rng.standard_normal()))
            else:
                a["nodes_featureids"].append(nd["feature"])
                a["nodes_values"].append(nd["value"])
                a["nodes_modes"].append(nd["mode"])
                a["nodes_truenodeids"].append(nd["true"])
                a["nodes_falsenodeids"].append(nd["false"])
                a["nodes_missing_value_tracks_true"].append(nd["missing"])
    return a


def _tree_input(rng: np.random.Generator, feats: int) -> np.ndarray:
    x = rng.standard_normal((7, feats)).astype(np.float32)
    x[0, 0] = np.nan
    return x


@pytest.mark.parametrize("seed", SEEDS)
def test_tree_ensemble_regressor_aggregates(seed):
    rng = np.random.default_rng(seed)
    feats, n_out = 4, int(rng.integers(1, 4))
    trees = _random_trees(rng, int(rng.integers(1, 5)), feats, int(rng.integers(1, 5)))
    attrs = _legacy_tree_attrs(rng, trees, n_out, "target")
    x = _tree_input(rng, feats)
    for agg in ("SUM", "AVERAGE", "MIN", "MAX"):
        for base in (None, rng.standard_normal(n_out).tolist()):
            extra = {"base_values": base} if base else {}
            model = _model("TreeEnsembleRegressor", [_t("X", F, None)], [_t("Y", F, None)], n_targets=n_out,
                           aggregate_function=agg, **attrs, **extra)
            check(model, {"X": x}, f"TreeEnsembleRegressor {agg} base={bool(base)} seed {seed}")


@pytest.mark.parametrize("seed", SEEDS)
def test_tree_ensemble_classifier(seed):
    rng = np.random.default_rng(seed)
    feats, k = 4, int(rng.integers(3, 5))
    trees = _random_trees(rng, int(rng.integers(1, 5)), feats, int(rng.integers(1, 5)))
    attrs = _legacy_tree_attrs(rng, trees, k, "class")
    for transform in TRANSFORMS:
        model = _model("TreeEnsembleClassifier", [_t("X", F, None)], [_t("Y", I64, None), _t("Z", F, None)],
                       classlabels_int64s=list(range(k)), post_transform=transform, **attrs)
        check(model, {"X": _tree_input(rng, feats)}, f"TreeEnsembleClassifier {transform} seed {seed}")
    # one class label: one score column, labels 1 / 0 by its sign
    one = _legacy_tree_attrs(rng, trees, 1, "class")
    for transform in ("NONE", "LOGISTIC"):
        for base in (None, [0.25]):
            extra = {"base_values": base} if base else {}
            model = _model("TreeEnsembleClassifier", [_t("X", F, None)], [_t("Y", I64, None), _t("Z", F, None)],
                           classlabels_int64s=[7], post_transform=transform, **one, **extra)
            check(model, {"X": _tree_input(rng, feats)}, f"TreeEnsembleClassifier one label {transform} seed {seed}")


@pytest.mark.parametrize("seed", SEEDS)
def _walk(nodes: list[dict], row: np.ndarray) -> int:
    """The leaf one row reaches in a tree of ``_random_trees`` (a NaN goes where ``missing`` says)."""
    k = 0
    while not nodes[k]["leaf"]:
        nd = nodes[k]
        v, th = row[nd["feature"]], np.float32(nd["value"])
        go = bool(nd["missing"]) if np.isnan(v) else \
            {"BRANCH_LEQ": v <= th, "BRANCH_LT": v < th, "BRANCH_GTE": v >= th, "BRANCH_GT": v > th}[nd["mode"]]
        k = nd["true"] if go else nd["false"]
    return k


def _check_two_classes(model: onnx.ModelProto, x: np.ndarray, one_score: np.ndarray, what: str) -> None:
    """``check`` for a two-class TreeEnsembleClassifier whose rows in ``one_score`` get one score:
    where onnxruntime then writes a single value (PROBIT; or no label rule, ``add_second_class``
    -1) its second column is uninitialised memory, so there only the first column is compared and
    onnxhal's second column must be 0 (docs/ml-operators.md)."""
    kernel = create_cpu_kernel(Node.from_proto(model.graph.node[0]), None, {ML: 3})
    base = kernel.raw_base.size
    single = one_score & (base != 2) & (kernel.transform == "PROBIT" or (not kernel.binary_case and base == 1))
    if not single.any():
        check(model, {"X": x}, what)
        return
    with np.errstate(all="ignore"):
        want, got = _run_both(model, {"X": x})
    assert not isinstance(want, Exception) and not isinstance(got, Exception), (what, want, got)
    _same([want[0]], [got[0]], what)
    w, g = np.asarray(want[1]), np.asarray(got[1])
    assert g.dtype == w.dtype and g.shape == w.shape, (what, g.dtype, g.shape, w.shape)
    keep = np.ones(w.shape, bool)
    keep[single, 1] = False
    np.testing.assert_allclose(g[keep], w[keep], rtol=1e-5, atol=1e-6, err_msg=what)
    assert (g[single, 1] == 0).all(), what


@pytest.mark.parametrize("seed", SEEDS)
def test_tree_ensemble_two_classes_written_alike(seed):
    """Two classes where every leaf writes the same classes (only class 1, only class 0, or both;
    sklearn writes the first and the last, LightGBM/XGBoost converters and hand-built models the
    others): the kernel decides the per-row rules once for all rows. As onnxruntime for every
    written set, base values (none, one, two), weight signs, labels and transforms (a class no
    tree wrote reads 0 in the scores; one score under LOGISTIC is [logistic(-s), logistic(s)]);
    and bit for bit as the per-row rules."""
    rng = np.random.default_rng(seed)
    feats = 4
    trees = _random_trees(rng, int(rng.integers(1, 5)), feats, int(rng.integers(1, 5)))
    for nodes in trees:
        for nd in nodes:
            nd["mode"] = "BRANCH_LEQ"  # one comparison kind: the leaf-bits walk
    attrs = _legacy_tree_attrs(rng, trees, 1, "class")
    n_leaves = len(attrs["class_ids"])
    x = _tree_input(rng, feats)
    for written in ([1], [0], [0, 1]):
        a = dict(attrs)
        a["class_treeids"] = [t for t in attrs["class_treeids"] for _ in written]
        a["class_nodeids"] = [i for i in attrs["class_nodeids"] for _ in written]
        a["class_ids"] = written * n_leaves
        for model, what in _two_class_models(rng, a, f"written {written} seed {seed}"):
            node = Node.from_proto(model.graph.node[0])
            alike = create_cpu_kernel(node, None, {ML: 3})
            per_row = create_cpu_kernel(node, None, {ML: 3})
            assert alike.forest.written_const is not None, what
            per_row.forest.written_const = None
            with np.errstate(all="ignore"):
                got, want = alike.compute([x]), per_row.compute([x])
            assert got[0].tolist() == want[0].tolist(), what
            assert got[1].dtype == want[1].dtype and got[1].shape == want[1].shape, what
            np.testing.assert_array_equal(got[1], want[1], err_msg=what)
            _check_two_classes(model, x, np.full(len(x), 1 not in written), what)


def _two_class_models(rng: np.random.Generator, attrs: dict, what: str):
    """(model, description) of a two-class TreeEnsembleClassifier over ``attrs`` for each weight
    sign, base values, label type and transform."""
    for positive in (True, False):
        w = rng.standard_normal(len(attrs["class_ids"]))
        a = dict(attrs, class_weights=[float(v) for v in (np.abs(w) if positive else w)])
        for base in (None, [0.25], [0.25, -0.5]):
            extra = {"base_values": base} if base else {}
            for labels in ({"classlabels_int64s": [3, 8]}, {"classlabels_strings": ["no", "yes"]}):
                out = I64 if "classlabels_int64s" in labels else S
                for transform in TRANSFORMS + ("PROBIT",):
                    model = _model("TreeEnsembleClassifier", [_t("X", F, None)], [_t("Y", out, None), _t("Z", F, None)],
                                   post_transform=transform, **labels, **a, **extra)
                    yield model, f"{what} positive {positive} base {base} {labels} {transform}"


@pytest.mark.parametrize("seed", SEEDS)
def test_tree_ensemble_two_classes_written_per_row(seed):
    """Two classes where the leaves write different classes (only class 0 or both, only class 0 or
    only class 1, only class 1 or both): the rows differ in which classes have a score, so the
    per-row rules run; as onnxruntime for every base values, weight signs, labels and transforms."""
    rng = np.random.default_rng(seed)
    feats = 4
    trees = _random_trees(rng, int(rng.integers(1, 4)), feats, int(rng.integers(2, 5)))
    attrs = _legacy_tree_attrs(rng, trees, 1, "class")
    n_leaves = len(attrs["class_ids"])
    x = rng.standard_normal((60, feats)).astype(np.float32)  # rows enough to reach both kinds of leaves
    x[rng.random(x.shape) < 0.1] = np.nan
    for kinds in (([0], [0, 1]), ([0], [1]), ([1], [0, 1])):
        per_leaf = [kinds[j % 2] for j in range(n_leaves)]
        a = dict(attrs)
        a["class_treeids"] = [t for t, wr in zip(attrs["class_treeids"], per_leaf) for _ in wr]
        a["class_nodeids"] = [i for i, wr in zip(attrs["class_nodeids"], per_leaf) for _ in wr]
        a["class_ids"] = [c for wr in per_leaf for c in wr]
        # which rows reach a leaf writing class 1, from the nodes' own walk of each tree
        leaf_of = {(t, i): 1 in wr for t, i, wr in zip(attrs["class_treeids"], attrs["class_nodeids"], per_leaf)}
        one_score = ~np.array([any(leaf_of[(t, _walk(trees[t], row))] for t in range(len(trees))) for row in x])
        for model, what in _two_class_models(rng, a, f"leaves write {kinds} seed {seed}"):
            _check_two_classes(model, x, one_score, what)


@pytest.mark.parametrize("seed", SEEDS)
def test_tree_ensemble_leaf_bits(seed):
    """One comparison kind per forest, as exporters write them: the leaves are found by leaf
    bitmasks (``_LeafBits``), which must agree with onnxruntime and, leaf for leaf, with the level
    walk (NaN features with and without missing-value tracking, a one-leaf tree); a tree of more
    than 64 leaves takes the walk."""
    rng = np.random.default_rng(seed)
    feats, n_out = 4, 3
    for mode in ("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT"):
        trees = _random_trees(rng, int(rng.integers(1, 6)), feats, int(rng.integers(1, 6))) + [[{"leaf": True}]]
        for nodes in trees:
            for nd in nodes:
                nd["mode"] = mode
        attrs = _legacy_tree_attrs(rng, trees, n_out, "target")
        model = _model("TreeEnsembleRegressor", [_t("X", F, None)], [_t("Y", F, None)], n_targets=n_out, **attrs)
        x = rng.standard_normal((40, feats)).astype(np.float32)
        x[rng.random(x.shape) < 0.15] = np.nan
        x[:5] = np.float32(attrs["nodes_values"][0])  # on a threshold: the comparison kind decides
        check(model, {"X": x}, f"TreeEnsembleRegressor {mode} seed {seed}")
        forest = create_cpu_kernel(Node.from_proto(model.graph.node[0]), None, {ML: 3}).forest
        assert forest._bits is not None, mode
        np.testing.assert_array_equal(forest._bits.leaves(x), forest.leaves(x), err_msg=f"{mode} seed {seed}")
    big = _random_trees(rng, 2, feats, 7)
    while max(sum(nd["leaf"] for nd in t) for t in big) <= 64:  # a tree of 7 levels; make one with > 64 leaves
        big = _random_trees(rng, 2, feats, 8)
    for nodes in big:
        for nd in nodes:
            nd["mode"] = "BRANCH_LEQ"
    attrs = _legacy_tree_attrs(rng, big, n_out, "target")
    model = _model("TreeEnsembleRegressor", [_t("X", F, None)], [_t("Y", F, None)], n_targets=n_out, **attrs)
    forest = create_cpu_kernel(Node.from_proto(model.graph.node[0]), None, {ML: 3}).forest
    assert forest._bits is None
    check(model, {"X": _tree_input(rng, feats)}, f"TreeEnsembleRegressor > 64 leaves seed {seed}")


def test_tree_ensemble_built_at_once_keeps_the_walks_leaf_numbering():
    """The forest is built with a few numpy calls per tree level (not per node): trees given last
    first, a one-leaf tree and a weight given twice for one leaf (added in order) agree with
    onnxruntime; leaf bits and level walk find the same leaves."""
    rng = np.random.default_rng(7)
    trees = _random_trees(rng, 5, 4, 5) + [[{"leaf": True}]]
    for nodes in trees:
        for nd in nodes:
            nd["mode"] = "BRANCH_LEQ"
    a = _legacy_tree_attrs(rng, trees, 2, "target")
    order = np.argsort(-np.asarray(a["nodes_treeids"]), kind="stable")  # the last tree's nodes first
    shuffled = {k: [v[i] for i in order] for k, v in a.items() if k.startswith("nodes_")}
    shuffled.update({k: list(a[k]) for k in ("target_treeids", "target_nodeids", "target_ids", "target_weights")})
    for k in ("target_treeids", "target_nodeids", "target_ids", "target_weights"):
        shuffled[k].append(shuffled[k][0])  # a second weight for one (leaf, target)
    model = _model("TreeEnsembleRegressor", [_t("X", F, None)], [_t("Y", F, None)], n_targets=2, **shuffled)
    x = rng.standard_normal((50, 4)).astype(np.float32)
    check(model, {"X": x}, "shuffled nodes")
    forest = create_cpu_kernel(Node.from_proto(model.graph.node[0]), None, {ML: 3}).forest
    assert forest._bits is not None
    np.testing.assert_array_equal(forest._bits.leaves(x), forest.leaves(x))


def test_tree_node_index_finds_pairs_as_a_dict_does_whatever_the_ids():
    # (tree id, node id) -> position for arrays of pairs: the last of a repeated pair, -1 for an
    # absent one; ids of any magnitude (ranked first: a key from the raw ids could overflow int64)
    from onnxhal.runtime.providers.cpu.kernels.ml_trees import _NodeIndex

    rng = np.random.default_rng(0)
    for trial in range(200):
        n = int(rng.integers(0, 30))
        tscale, iscale = (10**12 if trial % 3 == 0 else 1), (2**50 if trial % 5 == 0 else 1)
        trees, ids = rng.integers(-3, 4, n) * tscale, rng.integers(-5, 6, n) * iscale
        if trial % 2:  # trees in ascending id order, ids 0, 1, ... in each (the converters' layout)
            trees = np.sort(trees)
            ids = np.concatenate([np.arange((trees == t).sum()) for t in np.unique(trees)]).astype(np.int64) \
                if n else ids
            if trial % 4 == 3 and n > 1:  # one id off the layout: the general index
                ids[-1] += 1 + int(rng.integers(0, 2)) * 5
        index = _NodeIndex(trees, ids)
        by_pair = {(int(t), int(i)): k for k, (t, i) in enumerate(zip(trees, ids))}
        qt = np.concatenate([trees, rng.integers(-4, 5, 10) * tscale]).astype(np.int64)
        qi = np.concatenate([ids, rng.integers(-6, 7, 10) * iscale]).astype(np.int64)
        want = [by_pair.get((int(t), int(i)), -1) for t, i in zip(qt, qi)]
        assert index.find(qt, qi).tolist() == want, trial


@pytest.mark.parametrize("attr,value,match", [
    ("nodes_truenodeids", 99, "points at missing node 99"),
    ("target_ids", 5, "target 5: no such leaf or target"),
])
def test_tree_ensemble_bad_links_are_typed_errors(attr, value, match):
    rng = np.random.default_rng(3)
    trees = _random_trees(rng, 2, 3, 3)
    trees[0][0]["leaf"] = False if not trees[0][0]["leaf"] else trees[0][0]["leaf"]
    a = _legacy_tree_attrs(rng, trees, 2, "target")
    inner = [i for i, m in enumerate(a["nodes_modes"]) if m != "LEAF"]
    a[attr] = list(a[attr])
    a[attr][inner[0] if attr.startswith("nodes_") else 0] = value
    node = Node.from_proto(_model("TreeEnsembleRegressor", [_t("X", F, None)], [_t("Y", F, None)], n_targets=2,
                                  **a).graph.node[0])
    with pytest.raises(InvalidArgument, match=match):
        create_cpu_kernel(node, None, {ML: 3})


@pytest.mark.parametrize("seed", SEEDS)
def test_tree_ensemble_leaf_bits_routes(seed, monkeypatch):
    """The leaf bits' routes find the walk's leaves and sums: trees of at most 8 interior nodes
    (one byte each: a table of leaf weights, or of leaf slots past ``_TABLE_WEIGHTS``), and larger
    trees by each node's mask selected (few cells) or by 8 nodes' masks read from a table (many
    cells); with NaN features, tracked and not, and row counts around the table's groups of 8."""
    from onnxhal.runtime.providers.cpu.kernels import ml_trees

    rng = np.random.default_rng(seed)
    feats, n_out = 5, 2
    for depth, single, table_weights in ((3, True, 1 << 22), (3, True, 0), (6, False, 1 << 22)):
        trees = _random_trees(rng, int(rng.integers(2, 6)), feats, depth)
        for nodes in trees:
            for nd in nodes:
                nd["mode"] = "BRANCH_LT"
        model = _model("TreeEnsembleRegressor", [_t("X", F, None)], [_t("Y", F, None)], n_targets=n_out,
                       **_legacy_tree_attrs(rng, trees, n_out, "target"))
        monkeypatch.setattr(ml_trees, "_TABLE_WEIGHTS", table_weights)
        forest = create_cpu_kernel(Node.from_proto(model.graph.node[0]), None, {ML: 3}).forest
        bits = forest._bits
        assert bits is not None and bits.single == single, (depth, seed)
        assert (bits.group_weights is not None) == (single and table_weights > 0), (depth, seed)
        for rows in (1, 8, 33):
            x = rng.standard_normal((rows, feats)).astype(np.float32)
            x[rng.random(x.shape) < 0.1] = np.nan
            walk = forest.leaves(x)
            for cells in (0, 1 << 30):
                monkeypatch.setattr(ml_trees, "_SELECT_CELLS", cells)
                what = f"depth {depth} weights table {table_weights} rows {rows} select cells {cells} seed {seed}"
                np.testing.assert_array_equal(bits.leaves(x), walk, err_msg=what)
                want = np.add.accumulate(forest.weights[walk], axis=1)[:, -1]  # in tree order
                np.testing.assert_array_equal(bits.sums(x), want, err_msg=what)


def _v5_attrs(rng: np.random.Generator, trees: list, n_out: int, member_every: int) -> dict:
    """The opset-5 form of random trees: interior nodes numbered over all trees, leaves in their
    own arrays, every ``member_every``-th interior node turned into a set-membership test."""
    a: dict[str, list] = {k: [] for k in ("nodes_featureids", "nodes_splits", "nodes_modes", "nodes_truenodeids",
                                          "nodes_falsenodeids", "nodes_trueleafs", "nodes_falseleafs",
                                          "nodes_missing_value_tracks_true", "leaf_targetids", "leaf_weights",
                                          "tree_roots", "membership_values")}
    for nodes in trees:
        interior = {i: None for i, nd in enumerate(nodes) if not nd["leaf"]}
        leaves = {i: None for i, nd in enumerate(nodes) if nd["leaf"]}
        if not interior:  # opset 5 has no single-leaf trees: give it one split
            continue
        base = len(a["nodes_featureids"])
        for n, i in enumerate(interior):
            interior[i] = base + n
        for i in leaves:
            leaves[i] = len(a["leaf_targetids"])
            a["leaf_targetids"].append(int(rng.integers(0, n_out)))
            a["leaf_weights"].append(float(rng.standard_normal()))
        a["tree_roots"].append(interior[0])
        for i in interior:
            nd = nodes[i]
            mode = {"BRANCH_LEQ": 0, "BRANCH_LT": 1, "BRANCH_GTE": 2, "BRANCH_GT": 3}[nd["mode"]]
            if member_every and len(a["nodes_modes"]) % member_every == 0:
                mode = 6
                # onnxruntime implements sets of integers only
                a["membership_values"] += [float(v) for v in rng.integers(-3, 4, 3)] + [float("nan")]
            a["nodes_featureids"].append(nd["feature"])
            a["nodes_splits"].append(nd["value"])
            a["nodes_modes"].append(mode)
            a["nodes_missing_value_tracks_true"].append(nd["missing"])
            for side in ("true", "false"):
                child = nd[side]
                is_leaf = nodes[child]["leaf"]
                a[f"nodes_{side}nodeids"].append(leaves[child] if is_leaf else interior[child])
                a[f"nodes_{side}leafs"].append(int(is_leaf))
    return a


@pytest.mark.parametrize("seed", SEEDS)
def test_tree_ensemble_opset5(seed):
    rng = np.random.default_rng(seed)
    feats, n_out = 3, int(rng.integers(1, 4))
    trees = _random_trees(rng, int(rng.integers(1, 5)), feats, int(rng.integers(1, 4)))
    for dtype, elem in ((np.float32, F), (np.float64, D)):
        a = _v5_attrs(rng, trees, n_out, member_every=3 if seed % 2 else 0)
        if not a["tree_roots"]:
            continue
        x = _tree_input(rng, feats).astype(dtype)
        if seed % 2:  # onnxruntime tests set membership on integer inputs only (other values: no rule)
            x = np.round(x * 2)
        for agg in range(4):
            for post in (0, 1, 2):
                attrs = dict(a)
                attrs["nodes_modes"] = helper.make_tensor("nodes_modes", TensorProto.UINT8, [len(a["nodes_modes"])],
                                                          a["nodes_modes"])
                attrs["nodes_splits"] = helper.make_tensor("nodes_splits", elem, [len(a["nodes_splits"])],
                                                           a["nodes_splits"])
                attrs["leaf_weights"] = helper.make_tensor("leaf_weights", elem, [len(a["leaf_weights"])],
                                                           a["leaf_weights"])
                members = attrs.pop("membership_values")
                if members:
                    attrs["membership_values"] = helper.make_tensor("membership_values", elem, [len(members)], members)
                model = _model("TreeEnsemble", [_t("X", elem, None)], [_t("Y", elem, None)], ml_opset=5,
                               n_targets=n_out, aggregate_function=agg, post_transform=post, **attrs)
                check(model, {"X": x}, f"TreeEnsemble {dtype.__name__} agg={agg} post={post} seed {seed}")


def _stump(op: str, values: dict, x_elem: int, ml_opset: int) -> onnx.ModelProto:
    """One tree, one split of feature 0 by ``values`` (BRANCH_LEQ): leaf 1 (true) writes 1, leaf 2
    (false) writes 2 (a regressor's target, a classifier's class 1 / 0)."""
    common = dict(nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[0, 0, 0],
                  nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_truenodeids=[1, 0, 0],
                  nodes_falsenodeids=[2, 0, 0], **values)
    if op == "TreeEnsembleRegressor":
        return _model(op, [_t("X", x_elem, [None, 1])], [_t("Y", F, [None, 1])], ml_opset, n_targets=1,
                      target_treeids=[0, 0], target_nodeids=[1, 2], target_ids=[0, 0], target_weights=[1.0, 2.0],
                      **common)
    return _model(op, [_t("X", x_elem, [None, 1])], [_t("L", I64, [None]), _t("P", F, [None, 2])], ml_opset,
                  class_treeids=[0, 0], class_nodeids=[1, 2], class_ids=[1, 0], class_weights=[1.0, 1.0],
                  classlabels_int64s=[0, 1], **common)


@pytest.mark.parametrize("op", ["TreeEnsembleRegressor", "TreeEnsembleClassifier"])
def test_tree_ensemble_compares_in_the_thresholds_precision(op):
    """A double X against double thresholds (``nodes_values_as_tensor``) and against float ones
    widened, as onnxruntime compares them: rows that lie between a threshold and its float32
    rounding (0.1 and float32(0.1); float32(0.1) and a value 2e-9 above it) go where the double
    comparison says, not where their float32 roundings would."""
    th = 0.1
    f32 = float(np.float32(th))
    x = np.array([[f32], [th], [f32 + 2e-9], [f32 - 2e-9], [np.nextafter(th, 1.0)]], np.float64)
    as_tensor = {"nodes_values_as_tensor": helper.make_tensor("v", D, [3], [th, 0, 0])}
    for values, opset in ((as_tensor, 3), ({"nodes_values": [th, 0, 0]}, 3), ({"nodes_values": [th, 0, 0]}, 1)):
        model = _stump(op, values, D, opset)
        want, got = _run_both(model, {"X": x})
        assert not isinstance(want, Exception), want
        assert not isinstance(got, Exception), got
        _same(want, got, f"{op} {sorted(values)} opset {opset}")
    # a float32 X against double thresholds: onnxruntime fails to load them, and so does onnxhal (typed)
    check(_stump(op, as_tensor, F, 3), {"X": x.astype(np.float32)}, f"{op} float32 X, double thresholds")


def test_tree_ensemble_opset5_double_splits_between_float32_roundings():
    """TreeEnsemble (opset 5) on a double X with double splits: rows between a split and its
    float32 rounding, against onnxruntime."""
    th = 0.1
    f32 = float(np.float32(th))
    x = np.array([[f32], [th], [f32 + 2e-9], [np.nextafter(th, 1.0)]], np.float64)
    attrs = dict(nodes_featureids=[0], nodes_modes=helper.make_tensor("m", TensorProto.UINT8, [1], [0]),
                 nodes_splits=helper.make_tensor("s", D, [1], [th]), nodes_truenodeids=[0], nodes_falsenodeids=[1],
                 nodes_trueleafs=[1], nodes_falseleafs=[1], leaf_targetids=[0, 0],
                 leaf_weights=helper.make_tensor("w", D, [2], [1.0, 2.0]), tree_roots=[0])
    model = _model("TreeEnsemble", [_t("X", D, [None, 1])], [_t("Y", D, [None, 1])], ml_opset=5, n_targets=1,
                   aggregate_function=1, post_transform=0, **attrs)
    check(model, {"X": x}, "TreeEnsemble double splits")


def test_tree_ensemble_build_sorts_nothing_per_level(monkeypatch):
    """The build walks the trees once, a few numpy calls a level and no sort among them (the depth
    comes from the leaf bits' walk, a node given twice in a level is found by a scatter): a forest
    of 9 levels costs np.unique no more than a 2-level one; the outputs stay onnxruntime's."""
    rng = np.random.default_rng(11)
    counts = {}
    real_unique = np.unique
    for depth in (2, 9):
        trees = _random_trees(rng, 6, 4, depth)
        for nodes in trees:
            for nd in nodes:
                nd["mode"] = "BRANCH_LEQ"
        model = _model("TreeEnsembleRegressor", [_t("X", F, None)], [_t("Y", F, None)], n_targets=2,
                       **_legacy_tree_attrs(rng, trees, 2, "target"))
        node = Node.from_proto(model.graph.node[0])
        calls = []
        monkeypatch.setattr(np, "unique", lambda *a, _calls=calls, **k: _calls.append(1) or real_unique(*a, **k))
        forest = create_cpu_kernel(node, None, {ML: 3}).forest
        monkeypatch.setattr(np, "unique", real_unique)
        counts[depth] = len(calls)
        assert forest.depth == max(_tree_depth(t) for t in trees), depth
        check(model, {"X": rng.standard_normal((40, 4)).astype(np.float32)}, f"depth {depth}")
    assert counts[9] == counts[2], counts


def _tree_depth(nodes: list[dict], k: int = 0) -> int:
    nd = nodes[k]
    return 0 if nd["leaf"] else 1 + max(_tree_depth(nodes, nd["true"]), _tree_depth(nodes, nd["false"]))


def test_tree_ensemble_shared_nodes_take_the_walk():
    """A tree whose two nodes share a subtree (onnxruntime refuses it at load; onnxhal walks it):
    no leaf bits, the depth of the longest path, each row's leaf as a walk by hand finds it."""
    nodes = [{"leaf": False, "feature": 0, "value": 0.0, "mode": "BRANCH_LEQ", "missing": 0, "true": 1, "false": 2},
             {"leaf": False, "feature": 1, "value": 0.5, "mode": "BRANCH_LEQ", "missing": 0, "true": 4, "false": 3},
             {"leaf": False, "feature": 2, "value": -0.5, "mode": "BRANCH_LEQ", "missing": 0, "true": 3, "false": 5},
             {"leaf": False, "feature": 3, "value": 0.25, "mode": "BRANCH_LEQ", "missing": 0, "true": 6, "false": 7},
             {"leaf": True}, {"leaf": True}, {"leaf": True}, {"leaf": True}]
    rng = np.random.default_rng(5)
    model = _model("TreeEnsembleRegressor", [_t("X", F, None)], [_t("Y", F, None)], n_targets=1,
                   **_legacy_tree_attrs(rng, [nodes], 1, "target"))
    forest = create_cpu_kernel(Node.from_proto(model.graph.node[0]), None, {ML: 3}).forest
    assert forest._bits is None and forest.depth == 3
    x = rng.standard_normal((30, 4)).astype(np.float32)
    assert forest.leaves(x)[:, 0].tolist() == [_walk(nodes, row) for row in x]


def _shape_by_hand(is_leaf: np.ndarray, true_next: np.ndarray, false_next: np.ndarray,
                   roots: np.ndarray) -> tuple | None:
    """``_tree_shape``'s result by a walk node by node (None where a node is reached twice)."""
    n = is_leaf.size
    # a node no root reaches keeps owner -1, first 0 and count 1 for a leaf, 0 for an interior node
    owner, count, first = np.full(n, -1, np.int64), is_leaf.astype(np.int64), np.zeros(n, np.int64)
    levels, frontier, seen = [], [int(r) for r in roots], 0
    for slot, r in enumerate(roots):
        if owner[r] >= 0:
            return None
        owner[r] = slot
    while frontier:
        levels.append(frontier)
        nxt = []  # the level's true children, then its false children
        for side in (true_next, false_next):
            for k in frontier:
                if not is_leaf[k]:
                    c = int(side[k])
                    seen += 1
                    if owner[c] >= 0 or seen > n:
                        return None
                    owner[c] = owner[k]
                    nxt.append(c)
        frontier = nxt

    def leaves(k: int, start: int) -> int:
        first[k] = start
        count[k] = 1 if is_leaf[k] else leaves(int(true_next[k]), start) + leaves(int(false_next[k]),
                                                                                   start + count[true_next[k]])
        return count[k]

    for r in roots:
        leaves(int(r), 0)
    return owner, count, first, levels, [[k for k in lv if not is_leaf[k]] for lv in levels]


def test_tree_shape_matches_a_walk_node_by_node_and_refuses_shared_nodes_and_cycles():
    """``_tree_shape`` (a level at a time, a node reached twice found after the walk) against a
    walk node by node: random forests as converters write them, the same with a node shared
    between two trees or two parents, with a cycle, and with a root given twice."""
    from onnxhal.runtime.providers.cpu.kernels.ml_trees import _tree_shape

    rng = np.random.default_rng(11)
    for case in range(40):
        is_leaf, true_next, false_next, roots = [], [], [], []
        for _ in range(int(rng.integers(1, 5))):
            roots.append(len(is_leaf))
            pending = [len(is_leaf)]
            is_leaf.append(True), true_next.append(len(is_leaf) - 1), false_next.append(len(is_leaf) - 1)
            while pending:
                k = pending.pop(int(rng.integers(len(pending))))
                if len(is_leaf) - roots[-1] < 15 and rng.random() < 0.7:
                    is_leaf[k], true_next[k], false_next[k] = False, len(is_leaf), len(is_leaf) + 1
                    for c in (len(is_leaf), len(is_leaf) + 1):
                        pending.append(c)
                        is_leaf.append(True), true_next.append(c), false_next.append(c)
        leaf, t, f, r = np.array(is_leaf), np.array(true_next), np.array(false_next), np.array(roots)
        inner = np.flatnonzero(~leaf)
        if case % 4 == 1 and inner.size:  # a child shared: with a node of another place, or a cycle
            k = int(rng.choice(inner))
            t[k] = int(rng.integers(leaf.size)) if case % 8 == 1 else int(rng.choice(r))
        elif case % 4 == 2 and r.size > 1:
            r[1] = r[0]
        want, got = _shape_by_hand(leaf, t, f, r), _tree_shape(leaf, t, f, r)
        assert (want is None) == (got is None), case
        if want is not None:
            for a, b in zip(want[:3], got[:3]):
                assert a.tolist() == b.tolist(), case
            assert [lv.tolist() for lv in got[3]] == want[3] and [lv.tolist() for lv in got[4]] == want[4], case


def test_tree_ensemble_group_table_is_built_when_a_run_would_pay_for_it(monkeypatch):
    """Trees of several groups of 8 nodes read the [group, byte] table only for runs of many cells:
    the build leaves it out, a one-row run does not make it, the first run of fewer cells than the
    table's entries selects each node's mask instead (a session run once on a few rows never pays
    for the table), the second makes it; a first run of more cells makes it at once. Every run
    agrees with onnxruntime."""
    from onnxhal.runtime.providers.cpu.kernels import ml_trees

    monkeypatch.setenv(ml_trees.NATIVE_SWITCH, "0")  # the numpy leaf bits' route, not the C one
    rng = np.random.default_rng(2)
    trees = _random_trees(rng, 4, 5, 6)
    for nodes in trees:
        for nd in nodes:
            nd["mode"] = "BRANCH_LEQ"
    model = _model("TreeEnsembleRegressor", [_t("X", F, None)], [_t("Y", F, None)], n_targets=2,
                   **_legacy_tree_attrs(rng, trees, 2, "target"))
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    one = rng.standard_normal((1, 5)).astype(np.float32)
    many = rng.standard_normal((300, 5)).astype(np.float32)
    kernel = create_cpu_kernel(Node.from_proto(model.graph.node[0]), None, {ML: 3})
    bits = kernel.forest._bits
    assert bits is not None and not bits.single and bits._table is None
    few = rng.standard_normal((31, 5)).astype(np.float32)  # fewer cells than the table's 32 per column
    assert ml_trees._SELECT_CELLS < few.shape[0] * bits.columns < 300 * bits.columns
    _same(ref.run(None, {"X": one}), kernel.compute([one]), "one row")
    assert bits._table is None
    _same(ref.run(None, {"X": few}), kernel.compute([few]), "31 rows, first")
    assert bits._table is None
    _same(ref.run(None, {"X": few}), kernel.compute([few]), "31 rows, second")
    assert bits._table is not None
    _same(ref.run(None, {"X": many}), kernel.compute([many]), "300 rows, by the table")
    kernel = create_cpu_kernel(Node.from_proto(model.graph.node[0]), None, {ML: 3})
    _same(ref.run(None, {"X": many}), kernel.compute([many]), "300 rows, first")
    assert kernel.forest._bits._table is not None


def test_zipmap_sessions_with_as_many_labels_share_one_compiled_function_and_keep_their_labels():
    """ZipMap's row function is compiled once a process for each label count (``_row_maps_factory``),
    not at each session's creation; each session binds its own labels, and the maps equal
    onnxruntime's."""
    from onnxhal.runtime.providers.cpu.kernels import ml_linear

    x = np.array([[0.25, 0.5, 0.25], [0.125, 0.125, 0.75]], np.float32)
    labels = [{"classlabels_int64s": [3, 1, 7]}, {"classlabels_strings": ["b", "a", "c"]},
              {"classlabels_int64s": [0, 1, 2]}]
    ml_linear._row_maps_factory(3)  # compiled by now, whatever ran before
    compiled = ml_linear._row_maps_factory.cache_info().misses
    for attrs in labels:
        kind = I64 if "classlabels_int64s" in attrs else S
        out = helper.make_tensor_value_info("Z", TensorProto.UNDEFINED, None)
        out.type.sequence_type.elem_type.map_type.key_type = kind
        out.type.sequence_type.elem_type.map_type.value_type.tensor_type.elem_type = F
        model = _model("ZipMap", [_t("X", F, [None, 3])], [out], ml_opset=1, **attrs)
        want, got = _run_both(model, {"X": x})
        assert not isinstance(got, Exception), got
        assert got[0] == want[0], (attrs, got, want)
    assert ml_linear._row_maps_factory.cache_info().misses == compiled
