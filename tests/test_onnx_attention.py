"""ai.onnx Attention and RotaryEmbedding (opset 23) on the CPU EP's native kernels
(runtime/providers/cpu/kernels/onnx_attention.py) against the plain path, onnx.reference, and
against onnxruntime where it runs the case: seeded random one-node models over 3-D and 4-D inputs,
grouped key-value heads, boolean, additive and short masks, is_causal with and without past keys
and values, softcap, rows with every key masked, and the rotary forms (halves, interleaved, a
partial rotary dim, position ids, caches of batch 1)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

import onnxhal
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu import kernel_factory
from onnxhal.runtime.providers.cpu.kernels import onnx_attention
from onnxhal.runtime.providers.cpu.kernels.ms_decoder_attention import rotate, rotate_whole_halves
from onnxhal.runtime.providers.cpu.kernels.native_kernels import native_module

_native = native_module()


def _model(op: str, feeds: dict, n_out: int, **attrs) -> onnx.ModelProto:
    names = [k if v is not None else "" for k, v in feeds.items()]
    node = helper.make_node(op, names, [f"y{i}" for i in range(n_out)], **attrs)
    inputs = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
              for k, v in feeds.items() if v is not None]
    outputs = [onnx.ValueInfoProto(name=f"y{i}") for i in range(n_out)]
    model = helper.make_model(helper.make_graph([node], op.lower(), inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    return model


def _run(op: str, feeds: dict, n_out: int, monkeypatch=None, **attrs) -> tuple[list, list]:
    """onnxhal's outputs and onnx.reference's; the native kernel is asserted to be the one used."""
    model = _model(op, feeds, n_out, **attrs)
    given = {k: v for k, v in feeds.items() if v is not None}
    built: list[str] = []
    if monkeypatch is not None:
        init = kernel_factory.ReferenceKernel.__init__
        monkeypatch.setattr(kernel_factory.ReferenceKernel, "__init__",
                            lambda self, node, *a, **k: built.append(node.op_type) or init(self, node, *a, **k))
    got = onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, given)
    assert not built, f"{op} ran on onnx.reference"
    want = ReferenceEvaluator(model).run(None, given)
    return got, want


def _close(got: list, want: list, what: str, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g)
        assert g.shape == w.shape and g.dtype == w.dtype, (what, i, g.shape, w.shape, g.dtype, w.dtype)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"{what} output {i}")


def _f(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _attention_cases():
    for seed in range(3):
        for layout in ("4d", "3d"):
            for heads, kv_heads in ((4, 4), (4, 2), (6, 1)):
                for mask in ("none", "bool", "float", "short"):
                    for causal, past in ((0, 0), (1, 0), (1, 3), (0, 2)):
                        yield seed, layout, heads, kv_heads, mask, causal, past


def _attention_feeds(seed: int, layout: str, heads: int, kv_heads: int, mask: str, past: int, b: int = 2,
                     s: int = 5, d: int = 8) -> tuple[dict, dict]:
    rng = np.random.default_rng(seed)
    t = past + s
    if layout == "4d":
        q, k, v = _f(rng, b, heads, s, d), _f(rng, b, kv_heads, s, d), _f(rng, b, kv_heads, s, d)
        attrs = {}
    else:
        q, k, v = _f(rng, b, s, heads * d), _f(rng, b, s, kv_heads * d), _f(rng, b, s, kv_heads * d)
        attrs = {"q_num_heads": heads, "kv_num_heads": kv_heads}
    width = t - 2 if mask == "short" else t
    m = None
    if mask in ("bool", "short"):
        m = rng.random((b, 1, s, width)) > 0.3
        m[..., 0] = True
    elif mask == "float":
        m = (rng.standard_normal((1, heads, s, t)) * 2).astype(np.float32)
    feeds = {"Q": q, "K": k, "V": v, "attn_mask": m}
    if past:
        feeds["past_key"], feeds["past_value"] = _f(rng, b, kv_heads, past, d), _f(rng, b, kv_heads, past, d)
    return feeds, attrs


@pytest.mark.parametrize("seed,layout,heads,kv_heads,mask,causal,past", list(_attention_cases()))
def test_attention_matches_the_reference(seed, layout, heads, kv_heads, mask, causal, past, monkeypatch):
    feeds, attrs = _attention_feeds(seed, layout, heads, kv_heads, mask, past)
    n_out = 3 if past else 1
    got, want = _run("Attention", feeds, n_out, monkeypatch, is_causal=causal, **attrs)
    _close(got, want, f"{layout} {heads}/{kv_heads} heads, mask {mask}, causal {causal}, past {past}")


@pytest.mark.parametrize("layout,heads,kv_heads,mask,causal,past",
                         [("4d", 4, 2, "bool", 0, 3), ("3d", 4, 2, "none", 1, 0), ("4d", 4, 4, "float", 0, 0),
                          ("3d", 6, 1, "bool", 0, 2), ("4d", 4, 2, "none", 0, 3)])
def test_attention_matches_onnxruntime(layout, heads, kv_heads, mask, causal, past):
    feeds, attrs = _attention_feeds(7, layout, heads, kv_heads, mask, past)
    n_out = 3 if past else 1
    model = _model("Attention", feeds, n_out, is_causal=causal, **attrs).SerializeToString()
    given = {k: v for k, v in feeds.items() if v is not None}
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, given)
    got = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, given)
    _close(got, want, f"{layout} {heads}/{kv_heads} heads, mask {mask}, causal {causal}, past {past}", 1e-4, 1e-5)


@pytest.mark.parametrize("scale,softcap", [(0.3, 0.0), (None, 1.5), (0.5, 0.7)])
def test_attention_scale_and_softcap(scale, softcap, monkeypatch):
    feeds, _ = _attention_feeds(3, "4d", 4, 2, "bool", 0)
    attrs = {"softcap": softcap} | ({} if scale is None else {"scale": scale})
    got, want = _run("Attention", feeds, 1, monkeypatch, **attrs)
    _close(got, want, f"scale {scale} softcap {softcap}")


def test_a_row_with_every_key_masked_gives_zeros(monkeypatch):
    feeds, _ = _attention_feeds(4, "4d", 2, 2, "bool", 0)
    feeds["attn_mask"][0, 0, 1, :] = False  # query 1 of batch 0 sees no key
    got, want = _run("Attention", feeds, 1, monkeypatch)
    _close(got, want, "fully masked row")
    assert not np.isnan(got[0]).any() and np.all(got[0][0, :, 1] == 0)


def test_the_scores_output_still_runs_as_the_reference_computes_it():
    feeds, _ = _attention_feeds(5, "4d", 4, 2, "none", 0)
    got, want = _run("Attention", feeds, 4, qk_matmul_output_mode=0)
    _close(got, want, "qk_matmul_output")


def test_attention_names_inconsistent_heads():
    feeds, _ = _attention_feeds(6, "4d", 4, 3, "none", 0)
    model = _model("Attention", feeds, 1)
    given = {k: v for k, v in feeds.items() if v is not None}
    sess = onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with pytest.raises(InvalidArgument, match="multiple of the key-value heads"):
        sess.run(None, given)


def _rotary_cases():
    for seed in range(2):
        for layout in ("4d", "3d"):
            for interleaved in (0, 1):
                for rotary_dim in (0, 4):
                    for positions in ("ids", "per_batch", "batch_one"):
                        yield seed, layout, interleaved, rotary_dim, positions


def _rotary_feeds(seed: int, layout: str, rotary_dim: int, positions: str, b: int = 2, n: int = 3, s: int = 5,
                  h: int = 8) -> tuple[dict, dict]:
    rng = np.random.default_rng(seed)
    x = _f(rng, b, n, s, h) if layout == "4d" else _f(rng, b, s, n * h)
    half = (rotary_dim or h) // 2
    attrs = {"num_heads": n} if layout == "3d" else {}
    if rotary_dim:
        attrs["rotary_embedding_dim"] = rotary_dim
    if positions == "ids":
        angles = rng.uniform(-3, 3, (16, half)).astype(np.float32)
        feeds = {"X": x, "cos_cache": np.cos(angles), "sin_cache": np.sin(angles),
                 "position_ids": rng.integers(0, 16, (b, s)).astype(np.int64)}
    else:
        angles = rng.uniform(-3, 3, (b if positions == "per_batch" else 1, s, half)).astype(np.float32)
        feeds = {"X": x, "cos_cache": np.cos(angles), "sin_cache": np.sin(angles)}
    return feeds, attrs


@pytest.mark.parametrize("seed,layout,interleaved,rotary_dim,positions", list(_rotary_cases()))
def test_rotary_embedding_matches_the_reference(seed, layout, interleaved, rotary_dim, positions, monkeypatch):
    feeds, attrs = _rotary_feeds(seed, layout, rotary_dim, positions)
    got, want = _run("RotaryEmbedding", feeds, 1, monkeypatch, interleaved=interleaved, **attrs)
    _close(got, want, f"{layout} interleaved {interleaved} rotary dim {rotary_dim} {positions}")


@pytest.mark.parametrize("layout,interleaved,positions", [("4d", 0, "ids"), ("3d", 1, "per_batch"), ("4d", 1, "per_batch")])
def test_rotary_embedding_matches_onnxruntime(layout, interleaved, positions):
    feeds, attrs = _rotary_feeds(3, layout, 0, positions)
    model = _model("RotaryEmbedding", feeds, 1, interleaved=interleaved, **attrs).SerializeToString()
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    _close(got, want, f"{layout} interleaved {interleaved} {positions}", 1e-5, 1e-6)


def test_rotary_embedding_names_caches_of_the_wrong_width_and_positions_past_them():
    feeds, attrs = _rotary_feeds(1, "4d", 0, "per_batch")
    feeds["cos_cache"] = feeds["sin_cache"] = feeds["cos_cache"][..., :3]
    sess = onnxhal.InferenceSession(_model("RotaryEmbedding", feeds, 1).SerializeToString(),
                                    providers=["CPUExecutionProvider"])
    with pytest.raises(InvalidArgument, match="both caches need 4 values a row"):
        sess.run(None, feeds)
    feeds, attrs = _rotary_feeds(1, "4d", 0, "ids")
    feeds["position_ids"] = feeds["position_ids"] + 16
    sess = onnxhal.InferenceSession(_model("RotaryEmbedding", feeds, 1).SerializeToString(),
                                    providers=["CPUExecutionProvider"])
    with pytest.raises(InvalidArgument, match="outside the 16 rows of cos_cache"):
        sess.run(None, feeds)


def _grouped_cases():
    for layout in ("4d", "3d"):
        for heads, kv_heads in ((4, 4), (4, 2), (6, 1)):
            for mask in ("none", "bool", "bool2d", "row", "dead", "short", "float"):
                for causal, past in ((0, 0), (1, 0), (1, 3), (0, 2)):
                    yield layout, heads, kv_heads, mask, causal, past


@pytest.mark.parametrize("layout,heads,kv_heads,mask,causal,past", list(_grouped_cases()))
def test_grouped_rows_path_matches_the_plain_path(layout, heads, kv_heads, mask, causal, past, monkeypatch):
    """onnx_attention.GROUPED_ROWS_ENABLED on against off, same inputs; taken exactly where its
    condition holds (boolean masks of one head or 2-D, none; a float mask stays on the plain path).
    The session is built with the native_small path off (it would take these cases first)."""
    feeds, attrs = _attention_feeds(11, layout, heads, kv_heads, "float" if mask == "float" else
                                    "short" if mask == "short" else "none" if mask == "none" else "bool", past)
    if mask == "bool2d":
        feeds["attn_mask"] = np.ascontiguousarray(feeds["attn_mask"][0, 0])
    elif mask == "row":  # one row of keys for every query: [B, 1, 1, T]
        feeds["attn_mask"] = np.ascontiguousarray(feeds["attn_mask"][:, :, :1])
    elif mask == "dead":
        feeds["attn_mask"][1, 0, 2, :] = False  # query 2 of batch 1 sees no key: zeros
    n_out = 3 if past else 1
    model = _model("Attention", feeds, n_out, is_causal=causal, **attrs).SerializeToString()
    given = {k: v for k, v in feeds.items() if v is not None}
    monkeypatch.setattr(onnx_attention, "NATIVE_SMALL_ENABLED", False)
    sess = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"])
    taken: list[int] = []
    grouped = onnx_attention.Attention._grouped_rows
    monkeypatch.setattr(onnx_attention.Attention, "_grouped_rows",
                        lambda self, *a: taken.append(1) or grouped(self, *a))
    monkeypatch.setattr(onnx_attention, "GROUPED_ROWS_ENABLED", False)
    plain = sess.run(None, given)
    assert not taken
    monkeypatch.setattr(onnx_attention, "GROUPED_ROWS_ENABLED", True)
    got = sess.run(None, given)
    assert bool(taken) == (mask != "float"), (mask, taken)
    _close(got, plain, f"grouped rows {layout} {heads}/{kv_heads} mask {mask} causal {causal} past {past}", 1e-5, 1e-6)
    if mask == "dead":
        assert not np.isnan(got[0]).any()


@pytest.mark.parametrize("seed,shape,half", [(0, (2, 3, 5, 8), 4), (1, (1, 4, 1, 16), 8), (2, (3, 2, 7, 2), 1)])
def test_rotate_whole_halves_equals_rotate_to_the_bit(seed, shape, half):
    rng = np.random.default_rng(seed)
    x = _f(rng, *shape)
    angles = rng.uniform(-3, 3, (shape[0], 1, shape[2], half)).astype(np.float32)
    cos, sin = np.cos(angles), np.sin(angles)
    np.testing.assert_array_equal(rotate_whole_halves(x, cos, sin), rotate(x, cos, sin, False))


@pytest.mark.parametrize("layout,interleaved,rotary_dim", [("4d", 0, 0), ("3d", 0, 0), ("4d", 0, 4), ("4d", 1, 0)])
def test_rotary_whole_halves_switch_matches_the_plain_path(layout, interleaved, rotary_dim, monkeypatch):
    feeds, attrs = _rotary_feeds(4, layout, rotary_dim, "ids")
    model = _model("RotaryEmbedding", feeds, 1, interleaved=interleaved, **attrs).SerializeToString()
    monkeypatch.setattr(onnx_attention, "NATIVE_ROTARY_ENABLED", False)  # (it would take these cases first)
    sess = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"])
    taken: list[int] = []
    monkeypatch.setattr(onnx_attention, "rotate_whole_halves",
                        lambda *a: taken.append(1) or rotate_whole_halves(*a))
    monkeypatch.setattr(onnx_attention, "WHOLE_HALVES_ENABLED", False)
    plain = sess.run(None, feeds)
    monkeypatch.setattr(onnx_attention, "WHOLE_HALVES_ENABLED", True)
    got = sess.run(None, feeds)
    assert bool(taken) == (not interleaved and not rotary_dim)
    np.testing.assert_array_equal(got[0], plain[0])


@pytest.mark.parametrize("layout,heads,kv_heads,mask,causal,past", list(_grouped_cases()))
@pytest.mark.skipif(_native is None, reason="the C extension _native is not built (or switched off)")
def test_native_small_path_matches_the_plain_path(layout, heads, kv_heads, mask, causal, past, monkeypatch):
    """ATTENTION_PATHS["native_small"] (onnx_attention.NATIVE_SMALL_ENABLED, read when the kernel is
    built) against the plain path (both numpy paths off), same inputs; taken exactly where its
    condition holds (no mask or a boolean one of every key; a short or float mask is not)."""
    feeds, attrs = _attention_feeds(12, layout, heads, kv_heads, "float" if mask == "float" else
                                    "short" if mask == "short" else "none" if mask == "none" else "bool", past)
    if mask == "bool2d":
        feeds["attn_mask"] = np.ascontiguousarray(feeds["attn_mask"][0, 0])
    elif mask == "row":
        feeds["attn_mask"] = np.ascontiguousarray(feeds["attn_mask"][:, :, :1])
    elif mask == "dead":
        feeds["attn_mask"][1, 0, 2, :] = False
    n_out = 3 if past else 1
    model = _model("Attention", feeds, n_out, is_causal=causal, **attrs).SerializeToString()
    given = {k: v for k, v in feeds.items() if v is not None}
    monkeypatch.setattr(onnx_attention, "GROUPED_ROWS_ENABLED", False)
    monkeypatch.setattr(onnx_attention, "NATIVE_SMALL_ENABLED", False)
    plain = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, given)
    monkeypatch.setattr(onnx_attention, "NATIVE_SMALL_ENABLED", True)
    calls: list[int] = []
    monkeypatch.setattr(onnx_attention, "native_module", lambda: SimpleNamespace(
        attention_small=lambda *a: calls.append(1) or _native.attention_small(*a)))
    got = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, given)
    assert bool(calls) == (mask not in ("float", "short")), (mask, calls)
    _close(got, plain, f"native small {layout} {heads}/{kv_heads} mask {mask} causal {causal} past {past}", 1e-5, 1e-6)
    if mask == "dead":
        assert not np.isnan(got[0]).any()


@pytest.mark.skipif(_native is None, reason="the C extension _native is not built (or switched off)")
def test_native_small_path_leaves_large_and_non_finite_cases(monkeypatch):
    """More work than NATIVE_SMALL_WORK goes the numpy way; an infinite query (a score not finite)
    makes the C routine give up, and the numpy way's result (NaN, as the reference) comes back."""
    feeds, attrs = _attention_feeds(13, "4d", 4, 2, "bool", 0)
    model = _model("Attention", feeds, 1, **attrs).SerializeToString()
    plain_feeds = dict(feeds)
    monkeypatch.setattr(onnx_attention, "NATIVE_SMALL_ENABLED", False)
    plain = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"])
    monkeypatch.setattr(onnx_attention, "NATIVE_SMALL_ENABLED", True)
    results: list[bool] = []
    monkeypatch.setattr(onnx_attention, "native_module", lambda: SimpleNamespace(
        attention_small=lambda *a: results.append(_native.attention_small(*a)) or results[-1]))
    sess = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"])
    monkeypatch.setattr(onnx_attention, "NATIVE_SMALL_WORK", 64)
    _close(sess.run(None, feeds), plain.run(None, feeds), "past the work limit")
    assert results == []
    monkeypatch.setattr(onnx_attention, "NATIVE_SMALL_WORK", 1 << 16)
    plain_feeds["Q"] = feeds["Q"].copy()
    plain_feeds["Q"][0, 1, 2, 3] = np.inf
    got, want = sess.run(None, plain_feeds), plain.run(None, plain_feeds)
    assert results == [False]
    np.testing.assert_array_equal(np.isnan(got[0]), np.isnan(want[0]))
    _close([np.nan_to_num(got[0])], [np.nan_to_num(want[0])], "an infinite query")


@pytest.mark.skipif(_native is None, reason="the C extension _native is not built (or switched off)")
def test_native_small_path_keeps_a_masked_keys_nan_and_leaves_other_value_types(monkeypatch):
    """A NaN in the value of a masked key (a padded or unwritten cache) gives NaN, as the plain path
    and onnxruntime multiply every value by its weight (0 * NaN); values of another type than float32
    (T2 of Attention-23) go the numpy way, where the C routine would refuse their buffer."""
    feeds, attrs = _attention_feeds(14, "4d", 4, 2, "bool", 0)
    feeds["attn_mask"][0, 0, :, 3] = False  # key 3 of batch 0 masked for every query row
    feeds["V"] = feeds["V"].copy()
    feeds["V"][0, :, 3, :] = np.nan
    model = _model("Attention", feeds, 1, **attrs).SerializeToString()
    monkeypatch.setattr(onnx_attention, "GROUPED_ROWS_ENABLED", False)
    monkeypatch.setattr(onnx_attention, "NATIVE_SMALL_ENABLED", False)
    plain = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    monkeypatch.setattr(onnx_attention, "NATIVE_SMALL_ENABLED", True)
    results: list[bool] = []
    monkeypatch.setattr(onnx_attention, "native_module", lambda: SimpleNamespace(
        attention_small=lambda *a: results.append(_native.attention_small(*a)) or results[-1]))
    got = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    assert results == [True]
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    for ours in (got, plain):
        np.testing.assert_array_equal(np.isnan(ours[0]), np.isnan(want[0]))
    assert np.isnan(got[0][0]).all() and not np.isnan(got[0][1]).any()
    wide = {**feeds, "V": feeds["V"].astype(np.float64)}
    model = _model("Attention", wide, 1, **attrs).SerializeToString()
    results.clear()
    got = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, wide)
    assert results == []
    monkeypatch.setattr(onnx_attention, "NATIVE_SMALL_ENABLED", False)
    plain = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, wide)
    np.testing.assert_array_equal(got[0], plain[0])


@pytest.mark.skipif(_native is None, reason="the C extension _native is not built (or switched off)")
@pytest.mark.parametrize("layout,interleaved,rotary_dim,positions", [
    (layout, interleaved, rotary_dim, positions) for layout in ("4d", "3d") for interleaved in (0, 1)
    for rotary_dim in (0, 4) for positions in ("ids", "per_batch", "batch_one")])
def test_rotary_native_rows_path_matches_the_plain_path_to_the_bit(layout, interleaved, rotary_dim, positions,
                                                                   monkeypatch):
    """ROTARY_PATHS["native_rows"] (NATIVE_ROTARY_ENABLED, read when the kernel is built) against the
    plain path (whole halves off too), equal to the bit; taken in every one of these float32 cases."""
    feeds, attrs = _rotary_feeds(5, layout, rotary_dim, positions)
    model = _model("RotaryEmbedding", feeds, 1, interleaved=interleaved, **attrs).SerializeToString()
    monkeypatch.setattr(onnx_attention, "WHOLE_HALVES_ENABLED", False)
    monkeypatch.setattr(onnx_attention, "NATIVE_ROTARY_ENABLED", False)
    plain = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    monkeypatch.setattr(onnx_attention, "NATIVE_ROTARY_ENABLED", True)
    calls: list[int] = []
    monkeypatch.setattr(onnx_attention, "native_module", lambda: SimpleNamespace(
        rotary=lambda *a: calls.append(1) or _native.rotary(*a)))
    got = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    assert calls == [1]
    np.testing.assert_array_equal(got[0], plain[0])


def test_rotary_native_rows_keeps_its_condition():
    """What the C path does not take: a strided input other than transposed heads, float16,
    positions of another batch or length or type, caches of another batch; what it takes: both
    forms of the caches, heads transposed from [B, S, N, H]."""
    apply = onnx_attention.RotaryEmbedding._native_rows_apply
    x = np.zeros((2, 3, 5, 8), np.float32)
    cache, pos = np.zeros((16, 4), np.float32), np.zeros((2, 5), np.int64)
    steps = np.zeros((1, 5, 4), np.float32)
    assert apply(x, cache, cache, pos, 2, 5) and apply(x, steps, steps, None, 2, 5)
    assert apply(x, cache, cache, pos[:1], 2, 5)
    assert apply(np.zeros((2, 5, 3, 8), np.float32).transpose(0, 2, 1, 3), cache, cache, pos, 2, 5)
    assert not apply(np.zeros((2, 3, 8, 5), np.float32).transpose(0, 1, 3, 2), cache, cache, pos, 2, 5)
    assert not apply(x.astype(np.float16), cache, cache, pos, 2, 5)
    assert not apply(x, cache, cache, np.zeros((3, 5), np.int64), 2, 5)
    assert not apply(x, cache, cache, np.zeros((2, 4), np.int64), 2, 5)
    assert not apply(x, cache, cache, pos.astype(np.int32), 2, 5)
    assert not apply(x, cache, cache, pos[:, ::-1], 2, 5)
    assert not apply(x, np.zeros((3, 5, 4), np.float32), np.zeros((3, 5, 4), np.float32), None, 2, 5)


@pytest.mark.skipif(_native is None, reason="the C extension _native is not built (or switched off)")
def test_rotary_native_rows_names_a_position_past_the_caches():
    """The C path checks the positions as it goes: one past the cache or negative is named."""
    feeds, attrs = _rotary_feeds(6, "4d", 0, "ids")
    sess = onnxhal.InferenceSession(_model("RotaryEmbedding", feeds, 1).SerializeToString(),
                                    providers=["CPUExecutionProvider"])
    for bad in (16, -1):
        pos = feeds["position_ids"].copy()
        pos[1, 3] = bad
        with pytest.raises(InvalidArgument, match=f"position {bad} is outside the 16 rows of cos_cache"):
            sess.run(None, dict(feeds, position_ids=pos))


@pytest.mark.skipif(_native is None, reason="the C extension _native is not built (or switched off)")
@pytest.mark.parametrize("interleaved", [0, 1])
def test_rotary_native_rows_reads_transposed_heads(interleaved, monkeypatch):
    """The exporters' heads: a Transpose of [B, S, N, H] (a view) into RotaryEmbedding; the C path
    reads the view's storage, equal to the bit to the plain path, its output C-contiguous."""
    feeds, _ = _rotary_feeds(7, "4d", 0, "ids")
    feeds["X"] = np.ascontiguousarray(feeds["X"].transpose(0, 2, 1, 3))  # [B, S, N, H]
    names = list(feeds)
    inputs = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in feeds.items()]
    nodes = [helper.make_node("Transpose", ["X"], ["heads"], perm=[0, 2, 1, 3]),
             helper.make_node("RotaryEmbedding", ["heads", *names[1:]], ["y"], interleaved=interleaved)]
    model = helper.make_model(helper.make_graph(nodes, "rope", inputs, [onnx.ValueInfoProto(name="y")]),
                              opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    data = model.SerializeToString()
    monkeypatch.setattr(onnx_attention, "NATIVE_ROTARY_ENABLED", False)
    plain = onnxhal.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    monkeypatch.setattr(onnx_attention, "NATIVE_ROTARY_ENABLED", True)
    calls: list[bool] = []
    monkeypatch.setattr(onnx_attention, "native_module", lambda: SimpleNamespace(
        rotary=lambda *a: calls.append(a[0].flags.c_contiguous) or _native.rotary(*a)))
    got = onnxhal.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    assert calls == [True]
    assert got[0].flags.c_contiguous
    np.testing.assert_array_equal(got[0], plain[0])


def test_attention_with_no_new_tokens_runs_on_every_path(monkeypatch):
    """Zero new queries and keys after a past (an empty step): the C path's condition leaves it to
    numpy, which returns an empty output and the past as the presents, the switch on or off."""
    feeds, attrs = _attention_feeds(1, "4d", 4, 2, "none", 3)
    for name in ("Q", "K", "V"):
        feeds[name] = feeds[name][:, :, :0]
    model = _model("Attention", feeds, 3, is_causal=1, **attrs).SerializeToString()
    given = {k: v for k, v in feeds.items() if v is not None}
    for on in (False, True):
        monkeypatch.setattr(onnx_attention, "NATIVE_SMALL_ENABLED", on)
        out, present_k, present_v = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, given)
        assert out.shape == (2, 4, 0, 8)
        np.testing.assert_array_equal(present_k, feeds["past_key"])
        np.testing.assert_array_equal(present_v, feeds["past_value"])
