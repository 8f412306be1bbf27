"""The opset-23 attention operators of the ai.onnx domain, which torch.onnx's dynamo exporter writes
for ``scaled_dot_product_attention`` and rotary embeddings from opset 23 on (Llama, Gemma 3,
diffusers' VAE): Attention (3-D or 4-D inputs, grouped key-value heads, a boolean or additive mask,
is_causal, past keys and values, softcap) and RotaryEmbedding. onnx.reference ran them, 3-4x
slower than onnxruntime on the small decoders; the cases these kernels leave out (the fourth
output, ``nonpad_kv_seqlen``, opset 25's windows) still run there, as the specification's
reference computes them."""

from __future__ import annotations

import math

import numpy as np
from onnx import helper

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels.ms_decoder_attention import rotate, rotate_whole_halves
from onnxhal.runtime.providers.cpu.kernels.native_kernels import native_module
from onnxhal.runtime.providers.cpu.kernels.numerics import softmax_last_axis
from onnxhal.runtime.providers.cpu.kernels.registry import register
from onnxhal.runtime.providers.path_tables import path_table

#: Attention's other ways to run, against its plain path.
ATTENTION_PATHS = path_table("onnx_attention.Attention", "the plain path: broadcast products over the grouped "
                                                         "heads, the additive bias, softmax_last_axis")
ATTENTION_PATHS.add("native_small", "float32, no softcap or other softmax precision, no mask or a boolean one of "
                                    "every key ([S, T] or [B or 1, 1, S or 1, T]), no axis empty, B * H * S * T * (D + Dv) "
                                    "at most NATIVE_SMALL_WORK; the C extension _native built, "
                                    "ONNXHAL_NATIVE_KERNELS not 0 and NATIVE_SMALL_ENABLED (both read when the "
                                    "kernel is built): _native.attention_small, every query row's scores, softmax "
                                    "and weighted sum in one call (a score that is not finite: the paths below)")
ATTENTION_PATHS.add("grouped_rows", "float32, no softcap or other softmax precision, no mask or a boolean one of "
                                    "one head, GROUPED_ROWS_ENABLED (read at each call): the query heads sharing a "
                                    "key-value head as rows of one head, 4-D products (``Attention._grouped_rows``)")
#: The switch of ``ATTENTION_PATHS["native_small"]``: False keeps the numpy paths.
NATIVE_SMALL_ENABLED = True
#: native_small's limit on the multiply-adds of the scores and the weighted sum, B * H * S * T * (D + Dv):
#: its scalar loops against BLAS's products, measured on one thread (causal, no past): 1/4/4/16/16 heads,
#: queries, keys, head 16 (32K) 17 against 27 us, 32 (64K) 21 against 28, 8/2/16/16/64 (256K) 67 against 35
NATIVE_SMALL_WORK = 1 << 16
# the grouped-rows path of Attention (Attention._grouped_rows); off: the plain broadcast products
GROUPED_ROWS_ENABLED = True

#: RotaryEmbedding's other ways to run, against its plain path.
ROTARY_PATHS = path_table("onnx_attention.RotaryEmbedding", "the plain path: the caches indexed by the positions, "
                                                            "ms_decoder_attention.rotate")
ROTARY_PATHS.add("native_rows", "float32 input, caches and result, all C-contiguous; int64 position_ids [B or 1, S] "
                                "C-contiguous, or none with caches [B or 1, S, R / 2]; the C extension _native "
                                "built, ONNXHAL_NATIVE_KERNELS not 0 and NATIVE_ROTARY_ENABLED (both read when the "
                                "kernel is built): _native.rotary, each head's row rotated by its position's cache "
                                "row in one call, rotate's arithmetic to the bit, positions checked as it goes")
ROTARY_PATHS.add("whole_halves", "not interleaved, the rotary dim all of the head, WHOLE_HALVES_ENABLED (read at each "
                                 "call): rotate_whole_halves, x * [cos, cos] + [x2, x1] * [-sin, sin], to the bit")
#: The switch of ``ROTARY_PATHS["native_rows"]``: False keeps the numpy paths.
NATIVE_ROTARY_ENABLED = True
# RotaryEmbedding's whole-head halves by rotate_whole_halves; off: rotate's halves by slices
WHOLE_HALVES_ENABLED = True
#: float32, the dtype of the C paths
_F32 = np.dtype(np.float32)
#: the float types numpy computes in their own type (matmul included)
_NUMPY_FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def _opt(inputs: list, i: int) -> np.ndarray | None:
    return inputs[i] if len(inputs) > i else None


def _heads(x: np.ndarray, heads: int, what: str, name: str) -> np.ndarray:
    """[B, S, heads * D] -> [B, heads, S, D]; a 4-D input as it is."""
    if x.ndim == 4:
        return x
    if x.ndim != 3 or heads <= 0 or x.shape[2] % heads:
        raise InvalidArgument(f"{what}: {name} of shape {list(x.shape)} with {heads} heads; a 3-D input needs "
                              "q_num_heads and kv_num_heads dividing its last axis, or pass 4-D [B, heads, S, D].")
    b, s, hidden = x.shape
    return x.reshape(b, s, heads, hidden // heads).transpose(0, 2, 1, 3)


def _steps_first(x: np.ndarray) -> bool:
    """Whether 4-D x [B, N, S, H] is the transposed view of a C-contiguous [B, S, N, H] (the
    exporters' Transpose of the projected heads)."""
    return x.ndim == 4 and x.transpose(0, 2, 1, 3).flags.c_contiguous


@register("Attention", since=23)
class Attention(Kernel):
    """softmax(Q K^T * scale (softcapped) + mask) V over [B, H, S, D] heads, key-value heads shared
    by H / kv_heads query heads each (query head h reads kv head h // (H / kv_heads), the
    specification's interleaved repeat); past keys and values concatenated before the new ones and
    returned as the presents. A query row with every key masked gives zeros, as the reference does."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.what = f"Attention node {node.name!r}"
        self.node, self.ctx = node, ctx
        self.scale = node.attr("scale", None)
        self.causal = bool(node.attr("is_causal", 0))
        self._causal: dict[tuple, np.ndarray] = {}
        self.q_heads = int(node.attr("q_num_heads", 0))
        self.kv_heads = int(node.attr("kv_num_heads", 0))
        self.softcap = float(node.attr("softcap", 0.0))
        precision = node.attr("softmax_precision", None)
        self.precision = None if precision is None else np.dtype(helper.tensor_dtype_to_np_dtype(int(precision)))
        windows = int(node.attr("left_window_size", -1)) >= 0 or int(node.attr("right_window_size", -1)) >= 0
        wants_scores = len(node.outputs) > 3 and bool(node.outputs[3])
        # the cases left to onnx.reference: the scores output, per-batch key lengths, windows
        self.reference = None
        self.native = native_module() if NATIVE_SMALL_ENABLED else None
        if wants_scores or (len(node.inputs) > 6 and node.inputs[6]) or windows:
            from onnxhal.runtime.providers.cpu.kernel_factory import ReferenceKernel

            self.reference = ReferenceKernel(node, ctx, node.since_version or 23)

    def compute(self, inputs: list) -> list:
        if self.reference is not None:
            return self.reference.compute(inputs)
        dtype = inputs[0].dtype
        if dtype not in _NUMPY_FLOATS:
            # bfloat16 (ml_dtypes): numpy's matmul of two bfloat16 arrays gives float32, so the
            # outputs would come back float32; compute in float32 (as onnxruntime casts around
            # its float kernels) and round each output to the input's type once
            wide = [x.astype(np.float32) if x is not None and x.dtype == dtype else x for x in inputs]
            return [o.astype(dtype) for o in self._compute(wide)]
        return self._compute(inputs)

    def _compute(self, inputs: list) -> list:
        q, k, v = inputs[:3]
        mask, past_k, past_v = _opt(inputs, 3), _opt(inputs, 4), _opt(inputs, 5)
        if not q.ndim == k.ndim == v.ndim:
            raise InvalidArgument(f"{self.what}: Q, K and V of ranks {q.ndim}, {k.ndim}, {v.ndim}; they must all be "
                                  "3-D or all 4-D.")
        if (past_k is None) != (past_v is None):
            raise InvalidArgument(f"{self.what}: past_key and past_value must be given together.")
        three_d = q.ndim == 3
        q4 = _heads(q, self.q_heads, self.what, "Q")
        k4 = _heads(k, self.kv_heads, self.what, "K")
        v4 = _heads(v, self.kv_heads, self.what, "V")
        if past_k is not None:
            k4 = np.concatenate((past_k, k4), axis=2)
            v4 = np.concatenate((past_v, v4), axis=2)
        b, h, s, d = q4.shape
        kvh, t = k4.shape[1], k4.shape[2]
        if kvh == 0 or h % kvh or v4.shape[1] != kvh or v4.shape[2] != t or k4.shape[3] != d:
            raise InvalidArgument(f"{self.what}: Q heads {list(q4.shape)}, keys {list(k4.shape)}, values "
                                  f"{list(v4.shape)}; the query heads must be a multiple of the key-value heads, "
                                  "keys and values of one length, queries and keys of one head size.")
        # math.sqrt, not np.sqrt: the same correctly rounded double, without numpy's scalar call
        scale = q.dtype.type(1.0 / math.sqrt(d) if self.scale is None else self.scale)
        rep = h // kvh
        dv = v4.shape[3]
        if (self.native is not None and 0 < b * h * s * t * d * dv and b * h * s * t * (d + dv) <= NATIVE_SMALL_WORK
                and self._grouped_rows_apply(mask, q.dtype) and k4.dtype == v4.dtype == np.float32
                and (mask is None or (mask.shape[-1] == t and mask.shape[-2] in (1, s)
                                      and (mask.ndim == 2 or mask.shape[0] in (1, b))))):
            k4, v4 = np.ascontiguousarray(k4), np.ascontiguousarray(v4)
            out = np.empty((b, h, s, dv), np.float32)
            mb = 1 if mask is None or mask.ndim == 2 else mask.shape[0]
            ms = 1 if mask is None else mask.shape[-2]
            if self.native.attention_small(  # ATTENTION_PATHS["native_small"]
                    np.ascontiguousarray(q4), k4, v4, None if mask is None else np.ascontiguousarray(mask), out,
                    (b, kvh, rep * s, s, t, d, dv, mb, ms), (0 if past_k is None else past_k.shape[2])
                    if self.causal else -1, float(scale)):
                if three_d:
                    out = out.transpose(0, 2, 1, 3).reshape(b, s, h * dv)
                return [out, k4, v4]
        if GROUPED_ROWS_ENABLED and self._grouped_rows_apply(mask, q.dtype):
            out = self._grouped_rows(q4, k4, v4, mask, scale, rep, 0 if past_k is None else past_k.shape[2])
            if three_d:
                out = out.transpose(0, 2, 1, 3).reshape(b, s, h * v4.shape[3])
            return [out, k4, v4]
        # grouped heads without repeating K and V: [B, kvH, rep, S, D] against [B, kvH, 1, D, T]
        scores = np.matmul(q4.reshape(b, kvh, rep, s, d) * scale, k4.transpose(0, 1, 3, 2)[:, :, None])
        scores = scores.reshape(b, h, s, t)
        if self.softcap > 0:
            cap = scores.dtype.type(self.softcap)
            scores = np.tanh(scores / cap) * cap
        bias = self._bias(mask, s, t, 0 if past_k is None else past_k.shape[2], q.dtype)
        dead = None
        if bias is not None:
            # a row with every key masked (left padding's first queries) softmaxes to NaN, which
            # sends the whole softmax to its slow canonical form; the specification gives it zeros:
            # such rows get a bias of 0 here and zeros after. Found on the bias, which broadcasts
            # over the heads (one reduction of [B, 1, S, T]).
            dead = np.maximum.reduce(bias, axis=-1, keepdims=True) == -np.inf
            if dead.any():
                bias = np.where(dead, bias.dtype.type(0), bias)
            else:
                dead = None
            scores = scores + bias
        if self.precision is not None and scores.dtype != self.precision:
            scores = scores.astype(self.precision)
        probs = softmax_last_axis(np.ascontiguousarray(scores))
        if dead is not None:
            probs = np.where(dead, probs.dtype.type(0), probs)
        probs = probs.astype(q.dtype, copy=False)
        out = np.matmul(probs.reshape(b, kvh, rep, s, t), v4[:, :, None]).reshape(b, h, s, v4.shape[3])
        if three_d:
            out = out.transpose(0, 2, 1, 3).reshape(b, s, h * v4.shape[3])
        return [out, k4, v4]

    def _grouped_rows_apply(self, mask: np.ndarray | None, dtype: np.dtype) -> bool:
        """The grouped-rows path's condition: float32 without softcap or another softmax precision,
        no mask, or a boolean mask [S, T] or [B or 1, 1, S or 1, T] (the exporters' forms: its bias
        broadcasts over the heads)."""
        return (dtype == np.float32 and self.softcap <= 0 and self.precision in (None, dtype)
                and (mask is None or (mask.dtype == np.bool_
                                      and (mask.ndim == 2 or (mask.ndim == 4 and mask.shape[1] == 1)))))

    def _grouped_rows(self, q4: np.ndarray, k4: np.ndarray, v4: np.ndarray, mask: np.ndarray | None,
                      scale: np.generic, rep: int, offset: int) -> np.ndarray:
        """The plain path's result in fewer numpy calls: the rep query heads sharing a key-value head
        read as rep * S rows of one head ([B, kvH, rep * S, D], a view of 4-D queries), so the scores
        and the weighted sum are 4-D matmuls over [B, kvH] with no broadcast batch axis, the scale and
        the bias go in place, and a boolean mask's fully masked rows are found on the mask. For one query token or a short sequence the plain path's cost is
        numpy's per-call overhead, not arithmetic."""
        b, h, s, d = q4.shape
        kvh, t, dv = k4.shape[1], k4.shape[2], v4.shape[3]
        scores = np.matmul(q4.reshape(b, kvh, rep * s, d), k4.transpose(0, 1, 3, 2))
        scores *= scale
        dead = None
        if mask is not None and not self.causal and mask.shape[-1] == t and mask.shape[-2] in (1, s):
            # a boolean mask of every key alone: its fully masked rows are the rows with no key
            # seen, found on the mask and seen (bias 0) in the bias, as the plain path does
            dead = ~np.logical_or.reduce(mask, axis=-1, keepdims=True)
            if dead.any():
                bias = np.where(mask | dead, q4.dtype.type(0), q4.dtype.type(-np.inf))
                dead = dead if dead.ndim == 2 else dead[:, :, None]
            else:
                bias, dead = np.where(mask, q4.dtype.type(0), q4.dtype.type(-np.inf)), None
        else:
            bias = self._bias(mask, s, t, offset, q4.dtype)
            if bias is not None:
                dead = np.maximum.reduce(bias, axis=-1, keepdims=True) == -np.inf
                if dead.any():
                    bias = np.where(dead, bias.dtype.type(0), bias)
                    dead = dead if dead.ndim == 2 else dead[:, :, None]
                else:
                    dead = None
        if bias is not None:
            grouped = scores.reshape(b, kvh, rep, s, t)  # a view; a 4-D bias has one head: over rep
            np.add(grouped, bias if bias.ndim == 2 else bias[:, :, None], out=grouped)
        probs = softmax_last_axis(scores)
        if dead is not None:
            np.copyto(probs.reshape(b, kvh, rep, s, t), probs.dtype.type(0), where=dead)
        return np.matmul(probs, v4).reshape(b, h, s, dv)

    def _bias(self, mask: np.ndarray | None, s: int, t: int, offset: int, dtype: np.dtype) -> np.ndarray | None:
        """The additive bias broadcasting to [B, H, S, T]: the mask (True or 0 where a key is seen, a
        mask shorter than T padded as masked) plus, when causal, -inf past key i + offset."""
        if mask is None and not self.causal:
            return None
        bias = None
        if mask is not None:
            if mask.ndim >= 2 and mask.shape[-2] not in (1, s):
                raise InvalidArgument(f"{self.what}: attn_mask of shape {list(mask.shape)} for {s} queries and {t} "
                                      "keys; it must broadcast to [B, H, S, T].")
            if mask.shape[-1] > t:
                raise InvalidArgument(f"{self.what}: attn_mask covers {mask.shape[-1]} keys, more than the {t} "
                                      "keys (past and new); trim it to the keys.")
            if mask.dtype == np.bool_:
                bias = np.where(mask, dtype.type(0), dtype.type(-np.inf))
            else:
                bias = mask.astype(dtype, copy=False)
            if mask.shape[-1] < t:
                pad = [(0, 0)] * (bias.ndim - 1) + [(0, t - mask.shape[-1])]
                bias = np.pad(bias, pad, constant_values=-np.inf)
        if self.causal:
            key = (s, t, offset, dtype)
            causal = self._causal.get(key)
            if causal is None:  # one per shape: built once, read-only after (threads share it)
                allowed = np.arange(t)[None, :] <= np.arange(s)[:, None] + offset
                causal = np.where(allowed, dtype.type(0), dtype.type(-np.inf))
                causal.flags.writeable = False
                self._causal[key] = causal
            bias = causal if bias is None else bias + causal
        return bias


@register("RotaryEmbedding", since=23)
class RotaryEmbedding(Kernel):
    """X [B, N, S, H] or [B, S, N * H] (num_heads) rotated on its first rotary_embedding_dim (all H
    when 0) features: halves, or adjacent pairs when interleaved, by cos_cache / sin_cache, which
    are [max_position, R / 2] indexed by position_ids [B, S], or without position_ids [B, S, R / 2].
    Caches of batch 1 broadcast over X's batch, as the specification's reference computes them (the
    dynamo exporter writes them so; onnxruntime 1.32 refuses a batch above 1)."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.what = f"RotaryEmbedding node {node.name!r}"
        self.interleaved = bool(node.attr("interleaved", 0))
        self.heads = int(node.attr("num_heads", 0))
        self.rotary_dim = int(node.attr("rotary_embedding_dim", 0))
        self.native = native_module() if NATIVE_ROTARY_ENABLED else None

    def compute(self, inputs: list) -> list:
        x, cos, sin = inputs[:3]
        pos = _opt(inputs, 3)
        if x.ndim == 4:
            b, _, s, h = x.shape
            heads = x
        elif x.ndim == 3 and self.heads > 0 and x.shape[2] % self.heads == 0:
            b, s, hidden = x.shape
            h = hidden // self.heads
            heads = x.reshape(b, s, self.heads, h).transpose(0, 2, 1, 3)
        else:
            raise InvalidArgument(f"{self.what}: input of shape {list(x.shape)} with num_heads {self.heads}; it must "
                                  "be [B, N, S, head_size], or [B, S, hidden] with num_heads dividing hidden.")
        rdim = self.rotary_dim or h
        if cos.shape != sin.shape or cos.shape[-1] * 2 != rdim or rdim > h:
            raise InvalidArgument(f"{self.what}: cos_cache {list(cos.shape)} and sin_cache {list(sin.shape)} for a "
                                  f"rotary dim of {rdim} (head size {h}); both caches need {rdim // 2} values a row.")
        if self.native is not None and self._native_rows_apply(x, cos, sin, pos, b, s):
            return [self._native_rows(x, cos, sin, pos, b, s, h, rdim)]
        if pos is not None:
            if pos.size and (pos.min() < 0 or pos.max() >= cos.shape[0]):
                raise InvalidArgument(f"{self.what}: position {int(pos.max())} is outside the {cos.shape[0]} rows "
                                      "of cos_cache; extend the caches.")
            cos, sin = cos[pos], sin[pos]
        if cos.ndim != 3 or cos.shape[0] not in (1, b) or cos.shape[1] != s:
            raise InvalidArgument(f"{self.what}: caches of shape {list(cos.shape)} for batch {b} and sequence {s}; "
                                  f"they must be [{b} or 1, {s}, {rdim // 2}] (or index them by position_ids).")
        cos, sin = cos[:, None].astype(x.dtype, copy=False), sin[:, None].astype(x.dtype, copy=False)
        if WHOLE_HALVES_ENABLED and not self.interleaved and rdim == h:
            out = rotate_whole_halves(heads, cos, sin)
        else:
            out = rotate(heads, cos, sin, self.interleaved)
        if x.ndim == 3:
            out = out.transpose(0, 2, 1, 3).reshape(x.shape)
        return [out]

    @staticmethod
    def _native_rows_apply(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, pos: np.ndarray | None, b: int,
                           s: int) -> bool:
        """ROTARY_PATHS["native_rows"]'s condition on the inputs."""
        if not (x.dtype == cos.dtype == sin.dtype == _F32 and cos.flags.c_contiguous and sin.flags.c_contiguous
                and x.size and (x.flags.c_contiguous or _steps_first(x))):
            return False
        if pos is None:
            return cos.ndim == 3 and cos.shape[1] == s and cos.shape[0] in (1, b)
        return (pos.dtype == np.int64 and pos.ndim == 2 and pos.shape[1] == s and pos.shape[0] in (1, b)
                and pos.flags.c_contiguous and cos.ndim == 2 and cos.shape[0] > 0)

    def _native_rows(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray, pos: np.ndarray | None, b: int, s: int,
                     h: int, rdim: int) -> np.ndarray:
        out = np.empty(x.shape, _F32)
        n = x.shape[1] if x.ndim == 4 else self.heads
        rows = cos.shape[0] if pos is not None else cos.shape[0] * s
        x_heads_first = x.ndim == 4 and x.flags.c_contiguous
        bad = self.native.rotary(x if x.flags.c_contiguous else x.transpose(0, 2, 1, 3), cos, sin, pos, out,
                                 (b, n, s, h, rdim // 2, rows, cos.shape[0], 0 if pos is None else pos.shape[0]),
                                 x_heads_first, x.ndim == 4, self.interleaved)  # ROTARY_PATHS["native_rows"]
        if bad >= 0:
            raise InvalidArgument(f"{self.what}: position {int(pos.flat[bad])} is outside the {cos.shape[0]} rows "
                                  "of cos_cache; extend the caches.")
        return out
