"""com.microsoft attention operators of decoders and LLM exports, as onnxruntime's CPU kernels
compute them: RotaryEmbedding, GroupQueryAttention (grouped kv heads, past and present, sliding
window, softcap, sinks), DecoderMaskedMultiHeadAttention (one step into a shared past buffer, beam
cache indirection) and SparseAttention (block-sparse layouts)."""

from __future__ import annotations

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels.ms_attention import MS
from onnxhal.runtime.providers.cpu.kernels.numerics import softmax_last_axis
from onnxhal.runtime.providers.cpu.kernels.registry import register


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool) -> np.ndarray:
    """Rotary embedding of the first 2 * cos.shape[-1] features of x [..., H] (cos and sin
    broadcast over x's leading axes), the rest unchanged: halves (x1, x2) -> (x1 cos - x2 sin,
    x2 cos + x1 sin), or adjacent pairs when interleaved."""
    half = cos.shape[-1]
    out = x.copy()
    if interleaved:
        a, b = x[..., 0:2 * half:2], x[..., 1:2 * half:2]
        out[..., 0:2 * half:2] = a * cos - b * sin
        out[..., 1:2 * half:2] = b * cos + a * sin
    else:
        a, b = x[..., :half], x[..., half:2 * half]
        out[..., :half] = a * cos - b * sin
        out[..., half:2 * half] = b * cos + a * sin
    return out


def rotate_whole_halves(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """``rotate(x, cos, sin, False)`` where the rotary dim is all of x's last axis, in five numpy
    calls instead of nine: x * [cos, cos] + [x2, x1] * [-sin, sin]; b * -sin is -(b * sin) exactly,
    so the result is the same to the bit."""
    half = cos.shape[-1]
    swapped = np.concatenate((x[..., half:], x[..., :half]), axis=-1)
    out = x * np.concatenate((cos, cos), axis=-1)
    out += swapped * np.concatenate((-sin, sin), axis=-1)
    return out


def positions(position_ids: np.ndarray | None, batch: int, seq: int, start: np.ndarray | int = 0) -> np.ndarray:
    """[B, S] positions: position_ids ([B, S], or one offset for all), else start + 0..S-1."""
    if position_ids is None:
        return np.asarray(start).reshape(-1, 1) + np.arange(seq)[None, :] + np.zeros((batch, 1), np.int64)
    p = np.asarray(position_ids, np.int64)
    if p.size == 1:
        return p.reshape(1, 1) + np.arange(seq)[None, :] + np.zeros((batch, 1), np.int64)
    return np.broadcast_to(p.reshape(-1, seq), (batch, seq))


@register("RotaryEmbedding", since=1, domain=MS)
class RotaryEmbedding(Kernel):
    """input [B, S, N * H] or [B, N, S, H] rotated by cos_cache / sin_cache [max_position, R / 2]
    at position_ids ([B, S], or one start offset); R = rotary_embedding_dim or 2 * the caches'
    width; features past R unchanged."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.what = f"RotaryEmbedding node {node.name!r}"
        self.interleaved = bool(node.attr("interleaved", 0))
        self.heads = int(node.attr("num_heads", 0))
        self.rotary_dim = int(node.attr("rotary_embedding_dim", 0))
        if node.attr("is_packed_batching", 0):
            raise InvalidArgument(f"{self.what}: is_packed_batching=1 is not implemented by the CPU EP.")

    def compute(self, inputs: list) -> list:
        x, pos_ids, cos_cache, sin_cache = inputs[:4]
        half = cos_cache.shape[-1]
        if x.ndim == 4:
            b, n, s, h = x.shape
            heads = x
        elif x.ndim == 3:
            b, s, hidden = x.shape
            h = hidden // self.heads if self.heads else 2 * half
            n = hidden // h
            heads = x.reshape(b, s, n, h).transpose(0, 2, 1, 3)
        else:
            raise InvalidArgument(f"{self.what}: input of shape {list(x.shape)}; it must be [B, S, hidden] or "
                                  "[B, N, S, head_size].")
        pos = positions(pos_ids, b, s)
        if pos.size and (pos.min() < 0 or pos.max() >= cos_cache.shape[0]):
            raise InvalidArgument(f"{self.what}: position {int(pos.max())} is outside the {cos_cache.shape[0]} rows of "
                                  "cos_cache; extend the caches.")
        cos, sin = cos_cache[pos][:, None], sin_cache[pos][:, None]  # [B, 1, S, R/2]
        out = rotate(heads, cos.astype(x.dtype), sin.astype(x.dtype), self.interleaved)
        if x.ndim == 3:
            out = out.transpose(0, 2, 1, 3).reshape(x.shape)
        return [out]


@register("GroupQueryAttention", since=1, domain=MS)
class GroupQueryAttention(Kernel):
    """Causal attention with num_heads query heads sharing kv_num_heads key/value heads, as
    onnxruntime's CPU kernel: per batch row, seqlens_k + 1 keys in all, the first past_seqlen of
    them from past_key/past_value [B, kv_heads, P, H] (none for the first prompt); present holds
    past and new keys at their positions (max(P, total_sequence_length) long); query and key
    rotated first with do_rotary (positions past_seqlen + s); packed QKV when key is omitted;
    local_window_size, softcap, smooth_softmax and head_sink as onnxruntime."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.what = f"GroupQueryAttention node {node.name!r}"
        self.heads, self.kv_heads = int(node.attr("num_heads", 0)), int(node.attr("kv_num_heads", 0))
        if self.heads <= 0 or self.kv_heads <= 0 or self.heads % self.kv_heads:
            raise InvalidArgument(f"{self.what}: num_heads {self.heads} and kv_num_heads {self.kv_heads}; both "
                                  "positive, num_heads a multiple of kv_num_heads.")
        self.scale = float(node.attr("scale", 0.0))
        self.rotary = bool(node.attr("do_rotary", 0))
        self.interleaved = bool(node.attr("rotary_interleaved", 0))
        self.window = int(node.attr("local_window_size", -1))
        self.softcap = float(node.attr("softcap", 0.0))
        self.smooth = bool(node.attr("smooth_softmax", 0))
        if node.attr("qk_output", 0):
            raise InvalidArgument(f"{self.what}: qk_output is not implemented by the CPU EP; export without it.")
        self.n_out = len(node.outputs)

    def compute(self, inputs: list) -> list:
        args = list(inputs) + [None] * (12 - len(inputs))
        q, k, v, past_k, past_v, seqlens, total_len, cos_cache, sin_cache, pos_ids, attn_bias, sink = args[:12]
        n, kvn = self.heads, self.kv_heads
        b, s = q.shape[:2]
        qh, kh, vh = _heads(q, k, v, n, kvn)
        h = qh.shape[-1]
        total = np.asarray(seqlens, np.int64).reshape(-1) + 1
        buffer = 0 if past_k is None else past_k.shape[2]
        first_prompt = buffer == 0
        past_len = np.zeros(b, np.int64) if first_prompt else total - s
        present_len = max(buffer, int(np.asarray(total_len).reshape(-1)[0]))
        if (past_len < 0).any() or (total > present_len).any():
            raise InvalidArgument(f"{self.what}: seqlens_k {list(total - 1)} for {s} new tokens, a past of {buffer} and "
                                  f"total_sequence_length {present_len}; each row's total must fit.")
        if self.rotary:
            pos = positions(pos_ids, b, s, past_len)
            cos, sin = cos_cache[pos][:, None].astype(q.dtype), sin_cache[pos][:, None].astype(q.dtype)
            qh = rotate(qh, cos, sin, self.interleaved)
            kh = rotate(kh, cos, sin, self.interleaved)
        pk = np.zeros((b, kvn, present_len, h), q.dtype)
        pv = np.zeros((b, kvn, present_len, h), q.dtype)
        out = np.empty((b, s, n * h), q.dtype)
        scale = np.float32(self.scale or 1.0 / np.sqrt(h))
        group = n // kvn
        for i in range(b):
            p, t = int(past_len[i]), int(total[i])
            if p:
                pk[i, :, :p], pv[i, :, :p] = past_k[i, :, :p], past_v[i, :, :p]
            pk[i, :, p:p + s], pv[i, :, p:p + s] = kh[i], vh[i]
            keys = np.repeat(pk[i, :, :t], group, axis=0)  # [N, T, H]
            values = np.repeat(pv[i, :, :t], group, axis=0)
            scores = np.matmul(qh[i], np.swapaxes(keys, -1, -2)) * scale  # [N, S, T]
            if self.softcap > 0:
                scores = np.float32(self.softcap) * np.tanh(scores / np.float32(self.softcap))
            if attn_bias is not None:
                scores += attn_bias[i if attn_bias.shape[0] > 1 else 0][..., :t]
            query_at = (p + np.arange(s))[:, None]
            hidden = np.arange(t)[None, :] > query_at
            if self.window >= 0:  # a sliding window: the query and the local_window_size - 1 keys before it
                hidden |= np.arange(t)[None, :] <= query_at - self.window
            scores[:, hidden] = -np.inf
            if self.smooth or sink is not None:  # softmax with one more logit: 0, or the head's sink
                extra = (np.zeros((n, 1, 1), np.float32) if sink is None
                         else np.asarray(sink, np.float32).reshape(n, 1, 1))
                top = np.maximum(scores.max(axis=-1, keepdims=True), extra)
                e = np.exp(scores - top)
                probs = e / (e.sum(axis=-1, keepdims=True) + np.exp(extra - top))
            else:
                probs = softmax_last_axis(scores)
            out[i] = np.matmul(probs, values).transpose(1, 0, 2).reshape(s, n * h)
        return [out, pk, pv][: self.n_out]


@register("DecoderMaskedMultiHeadAttention", since=1, domain=MS)
class DecoderMaskedMultiHeadAttention(Kernel):
    """One decoding step (sequence length 1). Self-attention: the step's key and value written
    into the shared past buffer [B, N, max_sequence, H] at past_sequence_length (present is that
    buffer), attention over the first past_sequence_length + 1 positions, earlier ones read from
    the beam cache_indirection picks when beam_width > 1. Cross-attention (no past): key and value
    are the encoder's, already in heads [B, N, L, H]. A 2-D key padding mask adds
    mask_filter_value; attention_bias is added; the optional fourth output is the scaled QK."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.what = f"DecoderMaskedMultiHeadAttention node {node.name!r}"
        self.heads = int(node.attr("num_heads", 0))
        if self.heads <= 0:
            raise InvalidArgument(f"{self.what}: num_heads must be a positive integer, got {self.heads}.")
        self.fill = np.float32(node.attr("mask_filter_value", -10000.0))
        self.scale = float(node.attr("scale", 0.0))
        self.n_out = len(node.outputs)

    def compute(self, inputs: list) -> list:
        args = list(inputs) + [None] * (11 - len(inputs))
        q, k, v, mask, attn_bias, past_k, past_v, past_len, beam_width, cache_indir, bias = args[:11]
        b, s, width = q.shape
        if s != 1:
            raise InvalidArgument(f"{self.what}: query of sequence length {s}; this op decodes one token at a time.")
        n = self.heads
        if k is None or v is None:
            raise InvalidArgument(f"{self.what}: packed QKV (no key and value inputs) is not implemented on the CPU "
                                  "EP (nor by onnxruntime's CPU kernel); pass key and value.")
        d = q.shape[-1]
        h = d // n
        if bias is not None:
            q = q + bias[:d]
            if k.ndim == 3:
                k, v = k + bias[d:2 * d], v + bias[2 * d:]
        qh = q.reshape(b, 1, n, h).transpose(0, 2, 1, 3)
        scale = np.float32(self.scale or 1.0 / np.sqrt(h))
        if past_k is None:  # cross-attention over the encoder's keys and values
            keys, values = k, v
            present = []
        else:
            p = int(np.asarray(past_len).reshape(-1)[0])
            pk, pv = past_k.copy(), past_v.copy()
            pk[:, :, p] = k.reshape(b, n, h)
            pv[:, :, p] = v.reshape(b, n, h)
            keys, values = pk[:, :, :p + 1], pv[:, :, :p + 1]
            beams = 1 if beam_width is None else int(np.asarray(beam_width).reshape(-1)[0])
            if beams > 1 and p:
                if cache_indir is None:
                    raise InvalidArgument(f"{self.what}: beam_width {beams} needs cache_indirection.")
                # row r = batch * beams + beam reads position t < p from beam cache_indir[batch, beam, t]
                src = (np.arange(b) // beams * beams)[:, None] + cache_indir.reshape(b, -1)[:, :p]
                t = np.arange(p)[None, :]
                keys = keys.copy()
                values = values.copy()
                keys[:, :, :p] = past_k[src, :, t].transpose(0, 2, 1, 3)
                values[:, :, :p] = past_v[src, :, t].transpose(0, 2, 1, 3)
            present = [pk, pv]
        scores = np.matmul(qh, np.swapaxes(keys, -1, -2)) * scale  # [B, N, 1, T]
        if mask is not None:
            scores += np.where(mask[:, None, None, : scores.shape[-1]] > 0, np.float32(0), self.fill)
        if attn_bias is not None:
            scores += attn_bias[..., : scores.shape[-1]]
        qk = scores.copy() if self.n_out > 3 else None
        out = np.matmul(softmax_last_axis(scores), values).transpose(0, 2, 1, 3).reshape(b, 1, -1)
        outs = [out] + (present if present else [None, None])
        if self.n_out > 3:
            outs.append(qk)
        return outs[: self.n_out]


@register("SparseAttention", since=1, domain=MS)
class SparseAttention(Kernel):
    """Grouped-query causal attention over a block-sparse layout (Phi-3 small), as onnxruntime's
    CPU kernel: head n follows layout n % layouts, given in CSR form (block_row_indices,
    block_col_indices) over blocks of sparse_block_size positions; a query at position q sees key t
    when t <= q and t's block is in q's block row. Past and present share one buffer
    [B, kv_heads, max_cache, H], this step's keys written at key_total_sequence_lengths - S (0 for a
    prompt: total_sequence_length == S); optional rotary as GroupQueryAttention."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.what = f"SparseAttention node {node.name!r}"
        self.heads, self.kv_heads = int(node.attr("num_heads", 0)), int(node.attr("kv_num_heads", 0))
        self.block = int(node.attr("sparse_block_size", 0))
        if self.heads <= 0 or self.kv_heads <= 0 or self.heads % self.kv_heads or self.block <= 0:
            raise InvalidArgument(f"{self.what}: num_heads {self.heads}, kv_num_heads {self.kv_heads}, "
                                  f"sparse_block_size {self.block}; all positive, num_heads a multiple of kv_num_heads.")
        self.scale = float(node.attr("scale", 0.0))
        self.rotary = bool(node.attr("do_rotary", 0))
        self.interleaved = bool(node.attr("rotary_interleaved", 0))
        self.n_out = len(node.outputs)

    def compute(self, inputs: list) -> list:
        args = list(inputs) + [None] * (11 - len(inputs))
        q, k, v, past_k, past_v, rows, cols, total_len, key_totals, cos_cache, sin_cache = args[:11]
        n, kvn = self.heads, self.kv_heads
        b, s = q.shape[:2]
        qh, kh, vh = _heads(q, k, v, n, kvn)
        h = qh.shape[-1]
        totals = np.asarray(key_totals, np.int64).reshape(-1)
        prompt = int(np.asarray(total_len).reshape(-1)[0]) == s
        past_len = np.zeros(b, np.int64) if prompt else totals - s
        if self.rotary:
            pos = positions(None, b, s, past_len)
            cos, sin = cos_cache[pos][:, None].astype(q.dtype), sin_cache[pos][:, None].astype(q.dtype)
            qh, kh = rotate(qh, cos, sin, self.interleaved), rotate(kh, cos, sin, self.interleaved)
        pk, pv = past_k.copy(), past_v.copy()
        rows, cols = np.asarray(rows), np.asarray(cols)
        layouts = rows.shape[0]
        # allowed[layout, query block, key block] from the CSR rows
        blocks = rows.shape[1] - 1
        allowed = np.zeros((layouts, blocks, blocks), bool)
        for lay in range(layouts):
            for r in range(blocks):
                allowed[lay, r, cols[lay, rows[lay, r]:rows[lay, r + 1]]] = True
        out = np.empty((b, s, n * h), q.dtype)
        scale = np.float32(self.scale or 1.0 / np.sqrt(h))
        group = n // kvn
        for i in range(b):
            p, t = int(past_len[i]), int(totals[i])
            pk[i, :, p:p + s], pv[i, :, p:p + s] = kh[i], vh[i]
            keys = np.repeat(pk[i, :, :t], group, axis=0)
            values = np.repeat(pv[i, :, :t], group, axis=0)
            scores = np.matmul(qh[i], np.swapaxes(keys, -1, -2)) * scale  # [N, S, T]
            qpos = p + np.arange(s)
            kpos = np.arange(t)
            see = kpos[None, :] <= qpos[:, None]  # [S, T]
            lay = np.arange(n) % layouts
            sparse = allowed[lay][:, qpos // self.block][:, :, kpos // self.block]  # [N, S, T]
            scores = np.where(see[None] & sparse, scores, -np.inf)
            out[i] = np.matmul(softmax_last_axis(scores), values).transpose(1, 0, 2).reshape(s, n * h)
        return [out, pk, pv][: self.n_out]


def _heads(q: np.ndarray, k: np.ndarray | None, v: np.ndarray | None, n: int, kvn: int
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Query [B, N, S, H] and key/value [B, kvN, S, H] heads from [B, S, *] inputs, or from one packed
    [B, S, (N + 2 kvN) * H] query when key and value are absent (GroupQueryAttention, SparseAttention)."""
    b, s, width = q.shape
    if k is None:
        h = width // (n + 2 * kvn)
        q, k, v = np.split(q, [n * h, (n + kvn) * h], axis=-1)
    h = q.shape[-1] // n
    return (q.reshape(b, s, n, h).transpose(0, 2, 1, 3), k.reshape(b, s, kvn, h).transpose(0, 2, 1, 3),
            v.reshape(b, s, kvn, h).transpose(0, 2, 1, 3))

