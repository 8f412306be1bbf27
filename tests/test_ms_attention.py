"""com.microsoft attention operators on the CPU EP against onnxruntime: seeded random one-node
models of Attention (every mask form, past and present, causal, attention_bias, unequal Q/K/V
widths, scale), QAttention, MultiHeadAttention (self- and cross-attention, bias, key padding,
past), GroupQueryAttention, RotaryEmbedding, DecoderMaskedMultiHeadAttention, SparseAttention,
EmbedLayerNormalization and QEmbedLayerNormalization; outputs within 1e-4 relative."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

import onnxhal

MS = "com.microsoft"
SEEDS = range(4)


def _model(op: str, feeds: dict, n_out: int, **attrs) -> onnx.ModelProto:
    names = [k if v is not None else "" for k, v in feeds.items()]
    node = helper.make_node(op, names, [f"y{i}" for i in range(n_out)], domain=MS, **attrs)
    inputs = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
              for k, v in feeds.items() if v is not None]
    outputs = [onnx.ValueInfoProto(name=f"y{i}") for i in range(n_out)]  # types inferred
    graph = helper.make_graph([node], op.lower(), inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    model.ir_version = 10
    return model


def check(op: str, feeds: dict, n_out: int, what: str, **attrs) -> None:
    model = _model(op, feeds, n_out, **attrs)
    given = {k: v for k, v in feeds.items() if v is not None}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, given)
    got = onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, given)
    assert len(got) == len(want), what
    for i, (w, g) in enumerate(zip(want, got)):
        g = np.asarray(g)
        assert g.shape == w.shape and g.dtype == w.dtype, (what, i, g.dtype, g.shape, w.dtype, w.shape)
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=f"{what} output {i}")
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"{what} output {i}")


def _f(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _masks(rng: np.random.Generator, b: int, s: int, total: int) -> dict:
    raw = (rng.random((b, total)) > 0.3).astype(np.int32)
    raw[:, 0] = 1
    return {"none": None, "end": rng.integers(1, total + 1, b).astype(np.int32),
            "end_start": np.concatenate([rng.integers(total // 2 + 1, total + 1, b),
                                         rng.integers(0, max(1, total // 2), b)]).astype(np.int32),
            "raw": raw, "3d": np.broadcast_to(raw[:, None, :], (b, s, total)).copy()}


@pytest.mark.parametrize("seed", SEEDS)
def test_attention(seed):
    rng = np.random.default_rng(seed)
    b, s, d, n = int(rng.integers(1, 4)), int(rng.integers(1, 7)), 16, 4
    for past_len in (0, 3):
        total = past_len + s
        for mask_name, mask in _masks(rng, b, s, total).items():
            for causal in (0, 1):
                feeds = {"x": _f(rng, b, s, d), "w": _f(rng, d, 3 * d) * 0.3, "bias": _f(rng, 3 * d), "mask": mask}
                n_out = 1
                if past_len:
                    feeds["past"] = _f(rng, 2, b, n, past_len, d // n)
                    n_out = 2
                check("Attention", feeds, n_out, f"Attention past={past_len} mask={mask_name} causal={causal} "
                      f"seed {seed}", num_heads=n, unidirectional=causal)
    # attention_bias, unequal Q/K/V widths, scale, a custom mask_filter_value
    feeds = {"x": _f(rng, b, s, d), "w": _f(rng, d, 8 + 8 + 16) * 0.3, "bias": _f(rng, 32),
             "mask": _masks(rng, b, s, s)["raw"], "past": None, "attention_bias": _f(rng, 1, n, s, s)}
    check("Attention", feeds, 1, f"Attention attention_bias qkv_hidden_sizes seed {seed}", num_heads=n,
          qkv_hidden_sizes=[8, 8, 16], scale=0.7, mask_filter_value=-500.0)


@pytest.mark.parametrize("seed", SEEDS)
def test_qattention(seed):
    rng = np.random.default_rng(seed)
    b, s, d, n = int(rng.integers(1, 4)), int(rng.integers(1, 7)), 16, 4
    feeds = {"x": rng.integers(0, 256, (b, s, d)).astype(np.uint8),
             "w": rng.integers(-128, 128, (d, 3 * d)).astype(np.int8), "bias": _f(rng, 3 * d),
             "x_scale": np.array(0.02, np.float32), "w_scale": np.array(0.01, np.float32),
             "mask": rng.integers(1, s + 1, b).astype(np.int32), "x_zp": np.array(rng.integers(100, 150), np.uint8),
             "w_zp": np.array(0, np.int8)}
    check("QAttention", feeds, 1, f"QAttention seed {seed}", num_heads=n)
    feeds["mask"] = None
    check("QAttention", feeds, 1, f"QAttention causal seed {seed}", num_heads=n, unidirectional=1)


@pytest.mark.parametrize("seed", SEEDS)
def test_multi_head_attention(seed):
    rng = np.random.default_rng(seed)
    b, s, d, n = int(rng.integers(1, 4)), int(rng.integers(1, 6)), 16, 4
    for kv_len in (s, s + 3):  # self-attention, cross-attention
        mask = (rng.random((b, kv_len)) > 0.3).astype(np.int32)
        mask[:, 0] = 1
        feeds = {"q": _f(rng, b, s, d), "k": _f(rng, b, kv_len, d), "v": _f(rng, b, kv_len, d), "bias": _f(rng, 3 * d),
                 "mask": mask}
        check("MultiHeadAttention", feeds, 1, f"MultiHeadAttention L={kv_len} seed {seed}", num_heads=n)
    # keys and values already split into heads [B, N, L, H] (cross-attention reusing the encoder's)
    feeds = {"q": _f(rng, b, s, d), "k": _f(rng, b, n, s + 2, d // n), "v": _f(rng, b, n, s + 2, d // n)}
    check("MultiHeadAttention", feeds, 1, f"MultiHeadAttention BNSH keys seed {seed}", num_heads=n)
    feeds = {"q": _f(rng, b, s, d), "k": _f(rng, b, s, d), "v": _f(rng, b, s, d), "bias": None, "mask": None,
             "attention_bias": None, "past_k": _f(rng, b, n, 2, d // n), "past_v": _f(rng, b, n, 2, d // n)}
    check("MultiHeadAttention", feeds, 3, f"MultiHeadAttention past seed {seed}", num_heads=n)


@pytest.mark.parametrize("seed", SEEDS)
def test_embed_layer_normalization(seed):
    rng = np.random.default_rng(seed)
    b, s, h, vocab = int(rng.integers(1, 4)), int(rng.integers(1, 9)), 16, 30
    mask = (rng.random((b, s)) > 0.3).astype(np.int32)
    feeds = {"ids": rng.integers(0, vocab, (b, s)).astype(np.int32),
             "seg": rng.integers(0, 2, (b, s)).astype(np.int32), "word": _f(rng, vocab, h), "pos": _f(rng, 16, h),
             "segment": _f(rng, 2, h), "gamma": _f(rng, h), "beta": _f(rng, h), "mask": mask}
    check("EmbedLayerNormalization", feeds, 3, f"EmbedLayerNormalization seed {seed}", epsilon=1e-5)
    no_segment = dict(feeds, seg=None, segment=None, mask=None)
    check("EmbedLayerNormalization", no_segment, 2, f"EmbedLayerNormalization no segment seed {seed}")
    quant = {"ids": feeds["ids"], "seg": feeds["seg"]}
    scales, zps = {}, {}
    for name in ("word", "pos", "segment", "gamma", "beta"):
        quant[name] = rng.integers(0, 256, feeds[name].shape).astype(np.uint8)
        scales[name + "_s"] = np.array(rng.uniform(0.005, 0.02), np.float32)
        zps[name + "_zp"] = np.array(rng.integers(110, 140), np.uint8)
    quant["mask"] = mask
    check("QEmbedLayerNormalization", {**quant, **scales, **zps}, 2, f"QEmbedLayerNormalization seed {seed}")


@pytest.mark.parametrize("seed", SEEDS)
def test_rotary_embedding(seed):
    rng = np.random.default_rng(seed)
    b, s, n, h = int(rng.integers(1, 3)), int(rng.integers(1, 6)), 2, 8
    for interleaved in (0, 1):
        for rotary in (h, h // 2):
            cos, sin = _f(rng, 16, rotary // 2), _f(rng, 16, rotary // 2)
            pos = rng.integers(0, 16 - s, (b, s)).astype(np.int64)
            feeds = {"x": _f(rng, b, s, n * h), "pos": pos, "cos": cos, "sin": sin}
            attrs = {"num_heads": n, "rotary_embedding_dim": rotary} if rotary != h else {}
            check("RotaryEmbedding", feeds, 1, f"RotaryEmbedding 3-D interleaved={interleaved} R={rotary} seed {seed}",
                  interleaved=interleaved, **attrs)
            feeds = {"x": _f(rng, b, n, s, h), "pos": np.array([3], np.int64), "cos": cos, "sin": sin}
            check("RotaryEmbedding", feeds, 1, f"RotaryEmbedding 4-D interleaved={interleaved} R={rotary} seed {seed}",
                  interleaved=interleaved, **attrs)


@pytest.mark.parametrize("seed", SEEDS)
def test_group_query_attention(seed):
    rng = np.random.default_rng(seed)
    b, n, kvn, h = int(rng.integers(1, 3)), 4, 2, 16  # onnxruntime's rotary needs head_size % 16 == 0
    for rotary in (0, 1):
        cos, sin = (_f(rng, 32, h // 2), _f(rng, 32, h // 2)) if rotary else (None, None)
        attrs = dict(num_heads=n, kv_num_heads=kvn, do_rotary=rotary, rotary_interleaved=int(seed % 2))
        # first prompt: no past
        s = int(rng.integers(1, 6))
        feeds = {"q": _f(rng, b, s, n * h), "k": _f(rng, b, s, kvn * h), "v": _f(rng, b, s, kvn * h), "pk": None,
                 "pv": None, "seqlens_k": np.full(b, s - 1, np.int32), "total": np.array([s], np.int32),
                 "cos": cos, "sin": sin}
        check("GroupQueryAttention", feeds, 3, f"GQA prompt rotary={rotary} seed {seed}", **attrs)
        # right-padded prompt: the second row shorter than the sequence
        if b > 1 and s > 2:
            feeds["seqlens_k"] = np.array([s - 1] + [s - 3] * (b - 1), np.int32)
            check("GroupQueryAttention", feeds, 3, f"GQA padded prompt rotary={rotary} seed {seed}", **attrs)
        # generation: one or a few new tokens after P cached ones
        p, s = int(rng.integers(1, 8)), int(rng.integers(1, 3)) if b == 1 else 1  # onnxruntime: several new
        # tokens after a past only for one row
        feeds = {"q": _f(rng, b, s, n * h), "k": _f(rng, b, s, kvn * h), "v": _f(rng, b, s, kvn * h),
                 "pk": _f(rng, b, kvn, p, h), "pv": _f(rng, b, kvn, p, h),
                 "seqlens_k": np.full(b, p + s - 1, np.int32), "total": np.array([p + s], np.int32),
                 "cos": cos, "sin": sin}
        check("GroupQueryAttention", feeds, 3, f"GQA generation P={p} S={s} rotary={rotary} seed {seed}", **attrs)
        # packed QKV
        packed = np.concatenate([feeds["q"], feeds["k"], feeds["v"]], axis=-1)
        feeds = dict(feeds, q=packed, k=None, v=None)
        check("GroupQueryAttention", feeds, 3, f"GQA packed rotary={rotary} seed {seed}", **attrs)


#: docs/cpu-ep-operators.md lists these com.microsoft ops as native on the CPU EP.
NATIVE_MS_OPS = ["SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization",
                 "BiasGelu", "Gelu", "FastGelu", "QuickGelu", "BiasAdd", "FusedMatMul", "Attention",
                 "EmbedLayerNormalization", "MultiHeadAttention", "GroupQueryAttention", "RotaryEmbedding", "QAttention",
                 "QEmbedLayerNormalization", "DynamicQuantizeLSTM", "MatMulIntegerToFloat", "DynamicQuantizeMatMul",
                 "QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearGlobalAveragePool",
                 "QLinearConcat", "QLinearAveragePool", "QLinearSoftmax", "QLinearWhere", "QGemm", "MatMulNBits",
                 "DecoderMaskedMultiHeadAttention", "MatMulBnb4", "SparseAttention", "FusedConv", "FusedGemm"]


def test_the_documented_com_microsoft_ops_have_native_kernels():
    from onnxhal.runtime.providers.cpu.kernels.registry import lookup

    missing = [op for op in NATIVE_MS_OPS if lookup(MS, op, 1) is None]
    assert not missing, missing
    with open(os.path.join(os.path.dirname(__file__), "..", "docs", "cpu-ep-operators.md")) as f:
        doc = f.read()
    assert all(op in doc for op in NATIVE_MS_OPS)


@pytest.mark.parametrize("seed", SEEDS)
def test_decoder_masked_multi_head_attention(seed):
    rng = np.random.default_rng(seed)
    batch, beams, n, h, max_len = 2, int(rng.integers(1, 3)), 4, 8, 10
    b, d, p = batch * beams, n * h, int(rng.integers(1, 8))
    mask = (rng.random((b, p + 1)) > 0.2).astype(np.int32)
    mask[:, -1] = 1
    feeds = {"q": _f(rng, b, 1, d), "k": _f(rng, b, 1, d), "v": _f(rng, b, 1, d), "mask": mask, "attention_bias": None,
             "pk": _f(rng, b, n, max_len, h), "pv": _f(rng, b, n, max_len, h), "past_len": np.array(p, np.int32),
             "beam_width": np.array(beams, np.int32),
             "cache_indir": rng.integers(0, beams, (batch, beams, max_len)).astype(np.int32)}
    # (no bias input: onnxruntime 1.32's CPU kernel fails broadcasting it)
    check("DecoderMaskedMultiHeadAttention", feeds, 3, f"DMMHA self beams={beams} P={p} seed {seed}", num_heads=n,
          past_present_share_buffer=1)
    no_beams = dict(feeds, mask=None, beam_width=None, cache_indir=None)
    check("DecoderMaskedMultiHeadAttention", no_beams, 3, f"DMMHA no beams P={p} seed {seed}", num_heads=n,
          past_present_share_buffer=1)
    cross = {"q": _f(rng, b, 1, d), "k": _f(rng, b, n, 6, h), "v": _f(rng, b, n, 6, h)}
    check("DecoderMaskedMultiHeadAttention", cross, 1, f"DMMHA cross seed {seed}", num_heads=n)


@pytest.mark.parametrize("seed", SEEDS)
def test_group_query_attention_variants(seed):
    """GroupQueryAttention's sliding window, softcap, smooth softmax and per-head sinks."""
    rng = np.random.default_rng(seed)
    b, n, kvn, h, p = 1, 4, 2, 16, int(rng.integers(3, 9))
    feeds = {"q": _f(rng, b, 1, n * h) * 3, "k": _f(rng, b, 1, kvn * h), "v": _f(rng, b, 1, kvn * h),
             "pk": _f(rng, b, kvn, p, h), "pv": _f(rng, b, kvn, p, h), "seqlens_k": np.full(b, p, np.int32),
             "total": np.array([p + 1], np.int32)}
    base = dict(num_heads=n, kv_num_heads=kvn)
    check("GroupQueryAttention", feeds, 3, f"GQA window seed {seed}", local_window_size=2, **base)
    check("GroupQueryAttention", feeds, 3, f"GQA softcap seed {seed}", softcap=1.5, **base)
    check("GroupQueryAttention", feeds, 3, f"GQA smooth softmax seed {seed}", smooth_softmax=1, **base)
    sinks = dict(feeds, cos=None, sin=None, position_ids=None, attention_bias=None, head_sink=_f(rng, n))
    check("GroupQueryAttention", sinks, 3, f"GQA head sinks seed {seed}", **base)
    prompt = {"q": _f(rng, b, 5, n * h), "k": _f(rng, b, 5, kvn * h), "v": _f(rng, b, 5, kvn * h), "pk": None,
              "pv": None, "seqlens_k": np.full(b, 4, np.int32), "total": np.array([5], np.int32)}
    check("GroupQueryAttention", prompt, 3, f"GQA prompt window seed {seed}", local_window_size=1, **base)


def _block_layout(blocks: int, local: int, stride: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR rows and columns of a lower-triangular block layout: the last ``local`` blocks of each
    row and every ``stride``-th block before them."""
    rows, cols = [0], []
    for r in range(blocks):
        picked = [c for c in range(r + 1) if r - c < local or c % stride == 0]
        cols += picked
        rows.append(len(cols))
    return np.array(rows, np.int32), np.array(cols, np.int32)


def check_shared_buffer(op: str, feeds: dict, what: str, **attrs) -> None:
    """``check`` for ops that onnxruntime runs only with present written into past's buffer: its
    run binds outputs 1 and 2 to the past_key / past_value arrays (inputs 3 and 4)."""
    model = _model(op, feeds, 3, **attrs)
    given = {k: np.ascontiguousarray(v) for k, v in feeds.items() if v is not None}
    got = onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, given)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    binding = sess.io_binding()
    shared = {name: given[name].copy() for name in ("pk", "pv")}
    for name, value in given.items():
        value = shared.get(name, value)
        binding.bind_cpu_input(name, value)
    binding.bind_output("y0", "cpu")
    for out, name in (("y1", "pk"), ("y2", "pv")):
        binding.bind_output(out, "cpu", 0, np.float32, list(shared[name].shape), shared[name].ctypes.data)
    sess.run_with_iobinding(binding)
    want = [binding.copy_outputs_to_cpu()[0], shared["pk"], shared["pv"]]
    for i, (w, g) in enumerate(zip(want, got)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=f"{what} output {i}")


@pytest.mark.parametrize("seed", SEEDS)
def test_sparse_attention(seed):
    rng = np.random.default_rng(seed)
    b, n, kvn, h, block, max_cache = 1, 4, 2, 16, 4, 32
    blocks = max_cache // block
    dense_rows, dense_cols = _block_layout(blocks, blocks, 1)
    sparse_rows, sparse_cols = _block_layout(blocks, 2, 3)
    rows = np.stack([sparse_rows, dense_rows])
    cols = np.zeros((2, max(len(sparse_cols), len(dense_cols))), np.int32)
    cols[0, :len(sparse_cols)], cols[1, :len(dense_cols)] = sparse_cols, dense_cols
    attrs = dict(num_heads=n, kv_num_heads=kvn, sparse_block_size=block)
    s = int(rng.integers(12, 24))  # a prompt over several blocks
    feeds = {"q": _f(rng, b, s, n * h), "k": _f(rng, b, s, kvn * h), "v": _f(rng, b, s, kvn * h),
             "pk": np.zeros((b, kvn, max_cache, h), np.float32), "pv": np.zeros((b, kvn, max_cache, h), np.float32),
             "rows": rows, "cols": cols, "total": np.array([s], np.int32), "key_totals": np.full(b, s, np.int32)}
    check_shared_buffer("SparseAttention", feeds, f"SparseAttention prompt S={s} seed {seed}", **attrs)
    p = s  # then one generated token after it
    step = dict(feeds, q=_f(rng, b, 1, n * h), k=_f(rng, b, 1, kvn * h), v=_f(rng, b, 1, kvn * h),
                pk=_f(rng, b, kvn, max_cache, h), pv=_f(rng, b, kvn, max_cache, h),
                total=np.array([p + 1], np.int32), key_totals=np.full(b, p + 1, np.int32))
    check_shared_buffer("SparseAttention", step, f"SparseAttention step P={p} seed {seed}", **attrs)
    rotary = dict(step, cos=_f(rng, max_cache, h // 2), sin=_f(rng, max_cache, h // 2))
    check_shared_buffer("SparseAttention", rotary, f"SparseAttention rotary seed {seed}", do_rotary=1,
                        rotary_interleaved=int(seed % 2), **attrs)
    packed = dict(step, q=np.concatenate([step["q"], step["k"], step["v"]], axis=-1), k=None, v=None)
    check_shared_buffer("SparseAttention", packed, f"SparseAttention packed seed {seed}", **attrs)


def test_embed_ids_outside_the_table_are_refused():
    """input_ids below 0 or past the word table, and a sequence longer than the position table:
    InvalidArgument naming the input, the value and the table's size."""
    from onnxhal.hal.errors import InvalidArgument

    rng = np.random.default_rng(0)
    for ids, pos_rows, name, value in (([[0, -1]], 16, "input_ids", -1), ([[3, 30]], 16, "input_ids", 30),
                                       ([[1, 2, 3]], 2, "position_ids", 2)):
        feeds = {"ids": np.array(ids, np.int32), "seg": None, "word": _f(rng, 30, 8), "pos": _f(rng, pos_rows, 8),
                 "segment": None, "gamma": _f(rng, 8), "beta": _f(rng, 8)}
        model = _model("EmbedLayerNormalization", feeds, 2)
        sess = onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        with pytest.raises(InvalidArgument, match=f"{name}.* holds {value}, outside the"):
            sess.run(None, {k: v for k, v in feeds.items() if v is not None})


@pytest.mark.parametrize("keys", [7, 12])
def test_attention_softmax_falls_back_row_by_row(keys):
    """The attention softmax skips the row maxima where that is safe (numerics' max-free
    form, 8 keys or more): rows masked entirely, rows far below the rest, NaN and infinite scores
    agree with the row-by-row softmax (float64 reference) all the same."""
    from onnxhal.runtime.providers.cpu.kernels.numerics import softmax_last_axis as _softmax_rows

    rng = np.random.default_rng(0)
    base = rng.standard_normal((2, 3, 5, keys)).astype(np.float32)
    masked, far, lowest = base.copy(), base.copy(), base.copy()
    masked[0, 1, 2] -= 10000  # a row masked entirely
    far[1, 0, :, 0] += 60  # other rows 60 below this column's
    lowest[0, 0, :, 4:] = np.finfo(np.float32).min  # causal-style fill
    for x in (base, masked, far, lowest, base * 30):
        w = np.exp(x.astype(np.float64) - x.max(axis=-1, keepdims=True))
        np.testing.assert_allclose(_softmax_rows(x.copy()), w / w.sum(axis=-1, keepdims=True), rtol=2e-6, atol=1e-7)
    special = base.copy()
    special[0, 0, 0, 0], special[1, 1, 1, 1] = np.nan, np.inf
    with np.errstate(invalid="ignore"):
        got = _softmax_rows(special.copy())
    assert np.isnan(got[0, 0, 0]).all() and np.isnan(got[1, 1, 1]).all()  # as the row-by-row softmax
    assert np.isfinite(got[0, 0, 1:]).all() and np.isfinite(got[1, 2]).all()
