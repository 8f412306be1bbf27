"""com.microsoft attention operators that onnxruntime's transformer optimizer and quantizer write
into BERT-like graphs, as its CPU kernels compute them: Attention, QAttention, MultiHeadAttention,
EmbedLayerNormalization and QEmbedLayerNormalization (the decoder and LLM ones are in
``ms_decoder_attention.py``).

Attention runs on all batches and heads at once: one BLAS product for Q, K and V, batched
products for the scores and the context, the mask added to the scores (``PrepareMask`` in
onnxruntime's ``attention_helper.h``: ``mask_filter_value`` where a key is masked, the lowest float
where causal attention hides a later key), a softmax over the keys."""

from __future__ import annotations

import math

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels.linalg import exact_float_dtype
from onnxhal.runtime.providers.cpu.kernels.normalization import layer_norm
from onnxhal.runtime.providers.cpu.kernels.numerics import softmax_last_axis
from onnxhal.runtime.providers.cpu.kernels.registry import register

MS = "com.microsoft"
_FLOAT32 = np.dtype(np.float32)


def _opt(inputs: list, i: int):
    return inputs[i] if len(inputs) > i else None


def _mask_bias(mask: np.ndarray | None, batch: int, seq: int, total: int, past: int, causal: bool, fill: float,
               what: str) -> np.ndarray | None:
    """The additive mask [B, 1, S, T] over T keys (the first ``past`` of them from earlier steps)
    from onnxruntime's mask forms: 1-D end positions [B] (or end and start positions [2B]), a raw
    0/1 mask [B, T], or [B, S, T]."""
    if mask is None and not causal:
        return None
    add = np.zeros((batch, seq, total), np.float32)
    f = np.float32(fill)
    if mask is not None:
        mask = np.asarray(mask)
        if mask.ndim == 1 and mask.shape[0] in (batch, 2 * batch):
            keys = np.arange(total)
            hidden = keys[None, :] >= mask[:batch, None]
            if mask.shape[0] == 2 * batch:
                hidden |= keys[None, :] < np.minimum(mask[batch:], total)[:, None]
            add[:] = np.where(hidden, f, np.float32(0))[:, None, :]
        elif mask.ndim == 2 and mask.shape == (batch, total):
            add[:] = np.where(mask > 0, np.float32(0), f)[:, None, :]
        elif mask.ndim == 3 and mask.shape == (batch, seq, total):
            add[:] = np.where(mask > 0, np.float32(0), f)
        else:
            raise InvalidArgument(f"{what}: mask_index of shape {list(mask.shape)} for batch {batch}, sequence {seq} "
                                  f"and {total} keys; give [B], [2B], [B, {total}] or [B, {seq}, {total}] "
                                  "(4-D masks are not implemented on the CPU EP, as in onnxruntime).")
    if causal:
        later = np.arange(total)[None, :] > (past + np.arange(seq))[:, None]
        add[:, later] = np.finfo(np.float32).min
    return add[:, None]



def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, add: np.ndarray | None,
           bias: np.ndarray | None) -> np.ndarray:
    """softmax(scale * q @ k^T + mask + bias) @ v over [B, N, S, H] heads; the context as
    [B, S, N * Hv]."""
    scores = np.matmul(q, k.swapaxes(-1, -2))
    scores *= np.float32(scale)
    if add is not None:
        scores += add
    if bias is not None:
        scores += bias
    probs = softmax_last_axis(scores)
    ctx = np.matmul(probs, v)
    b, n, s, h = ctx.shape
    return np.ascontiguousarray(ctx.transpose(0, 2, 1, 3)).reshape(b, s, n * h)


class _MaskBiases:
    """``_mask_bias`` kept per mask value and shapes, for one attention node: a model hands every
    layer the same mask, and every run of a batch usually the same one (the bias is read, never
    written)."""

    def __init__(self, causal: bool, fill: float, what: str) -> None:
        self.causal, self.fill, self.what = causal, fill, what
        self._cache: dict[tuple, np.ndarray | None] = {}

    def __call__(self, mask: np.ndarray | None, b: int, s: int, total: int, past: int) -> np.ndarray | None:
        if mask is None:
            if not self.causal:
                return None
            key = (None, b, s, total, past)
        elif mask.size > 4096:  # a large mask: building its bias costs less than keeping a copy as key
            return _mask_bias(mask, b, s, total, past, self.causal, self.fill, self.what)
        else:
            key = (mask.tobytes(), mask.shape, mask.dtype.char, b, s, total, past)
        add = self._cache.get(key)
        if add is None:
            add = _mask_bias(mask, b, s, total, past, self.causal, self.fill, self.what)
            if add is not None:
                add.flags.writeable = False
            if len(self._cache) >= 64:  # masks that change every run: keep few
                self._cache.clear()
            self._cache[key] = add
        return add


def _num_heads(node: Node, what: str) -> int:
    heads = int(node.attr("num_heads", 0))
    if heads <= 0:
        raise InvalidArgument(f"{what}: num_heads must be a positive integer, got {heads}.")
    return heads


class _AttentionBase(Kernel):
    """What Attention and QAttention share: the heads, the Q/K/V split, past and present, masks."""

    op = "Attention"
    mask_input, past_input, bias_input = 3, 4, 5

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.what = f"{self.op} node {node.name!r}"
        self.heads = _num_heads(node, self.what)
        self.causal = bool(node.attr("unidirectional", 0))
        self.sizes = [int(v) for v in node.attr("qkv_hidden_sizes", [])]
        self.fill = float(node.attr("mask_filter_value", -10000.0))
        self.scale = float(node.attr("scale", 0.0))
        if node.attr("do_rotary", 0):
            raise InvalidArgument(f"{self.what}: do_rotary=1 is not implemented by the CPU EP; export without "
                                  "rotary fusion.")
        self.n_out = len(node.outputs)
        self._splits: dict[int, tuple[int, int]] = {}
        self._mask = _MaskBiases(self.causal, self.fill, self.what)

    def _split_points(self, width: int) -> tuple[int, int]:
        """Where Q ends and K ends in a projection of ``width`` columns (checked once per width)."""
        points = self._splits.get(width)
        if points is None:
            sizes = self.sizes or [width // 3] * 3
            if sum(sizes) != width or any(v % self.heads for v in sizes):
                raise InvalidArgument(f"{self.what}: Q/K/V widths {sizes} for a projection of width {width} and "
                                      f"{self.heads} heads; they must add up to it and divide by num_heads.")
            points = self._splits[width] = (sizes[0], sizes[0] + sizes[1])
        return points

    def _attention(self, qkv: np.ndarray, inputs: list) -> list:
        b, s, width = qkv.shape
        end_q, end_k = self._split_points(width)
        q, k, v = qkv[..., :end_q], qkv[..., end_q:end_k], qkv[..., end_k:]
        n = self.heads
        q = q.reshape(b, s, n, -1).transpose(0, 2, 1, 3)
        k = k.reshape(b, s, n, -1).transpose(0, 2, 1, 3)
        v = v.reshape(b, s, n, -1).transpose(0, 2, 1, 3)
        past = _opt(inputs, self.past_input)
        p = 0
        if past is not None and past.size:
            if past.ndim != 5 or past.shape[:3] != (2, b, n):
                raise InvalidArgument(f"{self.what}: past of shape {list(past.shape)}; it must be "
                                      f"[2, {b}, {n}, past_sequence, head_size].")
            p = past.shape[3]
            k = np.concatenate([past[0], k], axis=2)
            v = np.concatenate([past[1], v], axis=2)
        head = q.shape[-1]
        scale = self.scale or 1.0 / math.sqrt(head)
        mask = _opt(inputs, self.mask_input)
        add = self._mask(None if mask is None else np.asarray(mask), b, s, p + s, p)
        out = attend(q, k, v, scale, add, _opt(inputs, self.bias_input))
        if self.n_out > 1:
            return [out, np.stack([k, v])]
        return [out]


@register("Attention", since=1, domain=MS)
class Attention(_AttentionBase):
    """Self-attention of input [B, S, D] with weights [D, Q + K + V] and bias: num_heads heads,
    optional mask_index, past [2, B, N, P, H] (present is past and this step's keys and values),
    attention_bias added to the scores, causal with unidirectional=1."""

    def compute(self, inputs: list) -> list:
        x, w = inputs[0], inputs[1]
        bias = _opt(inputs, 2)
        if x.ndim != 3 or w.ndim != 2 or w.shape[0] != x.shape[2]:
            raise InvalidArgument(f"{self.what}: input {list(x.shape)} and weights {list(w.shape)}; input must be "
                                  "[batch, sequence, hidden] and weights [hidden, Q + K + V].")
        qkv = np.matmul(x.reshape(-1, x.shape[2]), w)  # one 2-D product, not a batch of them
        if bias is not None:
            qkv += bias
        return self._attention(qkv.reshape(x.shape[0], x.shape[1], -1), inputs)


@register("QAttention", since=1, domain=MS)
class QAttention(_AttentionBase):
    """Attention whose input (uint8) and weights (int8/uint8) are quantized: the integer product
    held exactly in a float type, scaled by input_scale * weight_scale, the float bias added;
    mask_index is input 5, past input 8."""

    op = "QAttention"
    mask_input, past_input, bias_input = 5, 8, 99

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        super().__init__(node, ctx)
        names = list(node.inputs) + [""] * 8
        self.constant_w = ctx is not None and bool(names[1]) and ctx.is_constant_initializer(names[1]) and (
            not names[7] or ctx.is_constant_initializer(names[7]))
        self._w: tuple | None = None  # (weights, their zero point, weights less it as float)

    def _centered_weights(self, w: np.ndarray, w_zp: np.ndarray | None) -> np.ndarray:
        cached = self._w
        if cached is not None and cached[0] is w and cached[1] is w_zp:
            return cached[2]
        ft = exact_float_dtype(w.shape[0])
        wf = w.astype(ft) if w_zp is None else np.subtract(w, np.asarray(w_zp), dtype=ft)
        if self.constant_w:
            self._w = (w, w_zp, wf)  # one swap: a concurrent run sees the old entry or this one
        return wf

    def compute(self, inputs: list) -> list:
        x, w, bias, x_scale, w_scale = inputs[:5]
        x_zp, w_zp = _opt(inputs, 6), _opt(inputs, 7)
        if x.ndim != 3 or w.ndim != 2 or w.shape[0] != x.shape[2]:
            raise InvalidArgument(f"{self.what}: input {list(x.shape)} and weights {list(w.shape)}; input must be "
                                  "[batch, sequence, hidden] and weights [hidden, Q + K + V].")
        wf = self._centered_weights(w, w_zp)
        xf = x.astype(wf.dtype) if x_zp is None else np.subtract(x, np.asarray(x_zp), dtype=wf.dtype)
        acc = np.matmul(xf, wf)
        scale = np.float32(x_scale.reshape(-1)[0] if x_scale.ndim else x_scale) * w_scale.astype(np.float32, copy=False)
        qkv = np.multiply(acc, scale, dtype=np.float32)
        if bias is not None:
            qkv += bias
        return self._attention(qkv, inputs)


@register("MultiHeadAttention", since=1, domain=MS)
class MultiHeadAttention(Kernel):
    """query [B, S, D] with key and value [B, L, D] (projected here by the optional bias, then split
    into heads) or already in heads [B, N, L, H]; key_padding_mask [B] / [B, L] / [B, S, L];
    attention_bias; past_key / past_value [B, N, P, H] prepended to self-attention keys; outputs the
    context and the present keys and values."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.what = f"MultiHeadAttention node {node.name!r}"
        self.heads = _num_heads(node, self.what)
        self.causal = bool(node.attr("unidirectional", 0))
        self.fill = float(node.attr("mask_filter_value", -10000.0))
        self.scale = float(node.attr("scale", 0.0))
        self.n_out = len(node.outputs)
        self._mask = _MaskBiases(self.causal, self.fill, self.what)

    def compute(self, inputs: list) -> list:
        q, k, v = inputs[0], _opt(inputs, 1), _opt(inputs, 2)
        bias, mask, attn_bias = _opt(inputs, 3), _opt(inputs, 4), _opt(inputs, 5)
        past_k, past_v = _opt(inputs, 6), _opt(inputs, 7)
        if k is None or v is None or q.ndim != 3:
            raise InvalidArgument(f"{self.what}: the CPU EP takes query [B, S, D] with separate key and value "
                                  "inputs (packed QKV / KV forms are not implemented).")
        b, s, d = q.shape
        n = self.heads
        if bias is not None:
            qb, kb, vb = np.split(bias, [d, 2 * d])
            q = q + qb
            if k.ndim == 3:
                k, v = k + kb, v + vb
        q = q.reshape(b, s, n, -1).transpose(0, 2, 1, 3)
        if k.ndim == 3:
            k = k.reshape(b, k.shape[1], n, -1).transpose(0, 2, 1, 3)
            v = v.reshape(b, v.shape[1], n, -1).transpose(0, 2, 1, 3)
            if past_k is not None and past_k.size:
                k = np.concatenate([past_k, k], axis=2)
                v = np.concatenate([past_v, v], axis=2)
        total = k.shape[2]
        add = self._mask(None if mask is None else np.asarray(mask), b, s, total, total - s)
        scale = self.scale or 1.0 / math.sqrt(q.shape[-1])
        out = attend(q, k, v, scale, add, attn_bias)
        return [out, k, v][: self.n_out]


def _lookup(table: np.ndarray, ids: np.ndarray, name: str, what: str) -> np.ndarray:
    """table's rows at ids, which must lie in [0, rows)."""
    if ids.dtype == np.int32:
        try:  # one call: read as uint32, a negative id is past 2^31 and out of range as well
            return table.take(ids.view(np.uint32), 0)
        except IndexError:
            pass
    elif not ids.size or (np.minimum.reduce(ids, None) >= 0 and np.maximum.reduce(ids, None) < table.shape[0]):
        return table.take(ids, 0)
    bad = int(ids.max() if ids.max() >= table.shape[0] else ids.min())
    raise InvalidArgument(f"{what}: {name} holds {bad}, outside the {table.shape[0]} rows of its embedding table.")


class _EmbedBase(Kernel):
    op = "EmbedLayerNormalization"

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.what = f"{self.op} node {node.name!r}"
        self.epsilon = float(node.attr("epsilon", 1e-12))
        self.n_out = len(node.outputs)

    def _embed(self, ids, segment_ids, word, position, segment, gamma, beta, mask, position_ids) -> list:
        if ids.ndim != 2:
            raise InvalidArgument(f"{self.what}: input_ids of shape {list(ids.shape)}; it must be [batch, sequence].")
        b, s = ids.shape
        total = _lookup(word, ids, "input_ids", self.what)
        if position_ids is None:  # positions 0..S-1: the table's first S rows, for every batch row
            if s > position.shape[0]:
                raise InvalidArgument(f"{self.what}: position_ids (or the sequence length) holds {s - 1}, outside "
                                      f"the {position.shape[0]} rows of its embedding table.")
            total = total + position[:s]
        else:
            total = total + _lookup(position, np.broadcast_to(position_ids, (b, s)),
                                    "position_ids (or the sequence length)", self.what)
        if segment is not None and segment_ids is not None:
            total += _lookup(segment, segment_ids, "segment_ids", self.what)
        total = total.astype(np.float32, copy=False)
        y = layer_norm(total, gamma, beta, -1, self.epsilon, _FLOAT32, stats=False)[0]
        count = (np.zeros(b, np.int32) if mask is None else np.add.reduce(np.asarray(mask) == 1, 1, dtype=np.int32))
        return [y, count, total][: self.n_out]


@register("EmbedLayerNormalization", since=1, domain=MS)
class EmbedLayerNormalization(_EmbedBase):
    """LayerNormalization(word[input_ids] + position[position_ids or 0..S-1] + segment[segment_ids])
    * gamma + beta; the mask index (the count of ones in each mask row, int32 [B]); the sum."""

    def compute(self, inputs: list) -> list:
        args = list(inputs) + [None] * (9 - len(inputs))
        ids, seg_ids, word, position, segment, gamma, beta, mask, pos_ids = args[:9]
        return self._embed(ids, seg_ids, word, position, segment, gamma, beta, mask, pos_ids)


@register("QEmbedLayerNormalization", since=1, domain=MS)
class QEmbedLayerNormalization(_EmbedBase):
    """EmbedLayerNormalization over uint8/int8 tables, gamma and beta, each dequantized with its
    scale and zero point (inputs 8-12 and 13-17)."""

    op = "QEmbedLayerNormalization"

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        super().__init__(node, ctx)
        names = list(node.inputs) + [""] * 18
        #: per table: whether its codes, scale and zero point are all constant initializers
        self.constant = [ctx is not None and all(not names[j] or ctx.is_constant_initializer(names[j])
                                                 for j in (2 + i, 8 + i, 13 + i)) for i in range(5)]
        self._tables: list[tuple | None] = [None] * 5  # per table: (codes, scale, zero point, floats)

    def compute(self, inputs: list) -> list:
        args = list(inputs) + [None] * (18 - len(inputs))
        ids, seg_ids = args[0], args[1]
        tables = []
        for i in range(5):
            q, scale, zp = args[2 + i], args[8 + i], args[13 + i]
            if q is None:
                tables.append(None)
                continue
            kept = self._tables[i]
            if kept is not None and kept[0] is q and kept[1] is scale and kept[2] is zp:
                tables.append(kept[3])
                continue
            zero = np.int32(0) if zp is None else np.asarray(zp).astype(np.int32)
            table = (q.astype(np.int32) - zero).astype(np.float32) * np.float32(np.asarray(scale).reshape(-1)[0])
            if self.constant[i]:
                self._tables[i] = (q, scale, zp, table)  # one item swap: a concurrent run sees either
            tables.append(table)
        word, position, segment, gamma, beta = tables
        return self._embed(ids, seg_ids, word, position, segment, gamma, beta, args[7], None)
