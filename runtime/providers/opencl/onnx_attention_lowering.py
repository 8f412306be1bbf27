"""Lowering of ai.onnx Attention (opset 23), which torch.onnx's dynamo exporter writes for
``scaled_dot_product_attention`` (hf_llama_past, hf_gemma3, df_vae_decoder): one work-item per
(batch, query head, query row) computes the row's scores, an online softmax and the weighted sum of
values, reading Q, K, V, the mask and the output through strides (3-D [B, S, heads * D] or 4-D
[B, heads, S, D]). Past keys and values are copied before the new ones into the present buffers
(the node's outputs, or temporaries), which the kernel then reads. Semantics are the CPU EP's
(runtime/providers/cpu/kernels/onnx_attention.py): query head h reads key-value head
h // (H / kvH); a bool mask's False or an additive mask's value, keys past a shorter mask masked, and
is_causal's keys past i + past_length masked; a row with every key masked gives zeros. The claim rule
is ``op_support.check_onnx_attention``; claimed under rule ``opset23_ops``. A mixin of
``PartitionPlanBuilder``."""

from __future__ import annotations

import numpy as np

from onnxhal.hal.errors import InvalidArgument
from onnxhal.hal.graph import Node
from onnxhal.runtime.providers.opencl.elementwise_codegen import broadcast_strides
from onnxhal.runtime.providers.opencl.gemm_lowering import contiguous_strides
from onnxhal.runtime.providers.opencl.kernel_sources import ACTIVATION_HELPERS
from onnxhal.runtime.providers.opencl.partition_plan import Buf

I32, F = np.int32, np.float32


def onnx_attention_source(head: int, head_v: int, mask: str, causal: bool) -> str:
    """``onnx_attention_rows`` for head sizes ``head`` (Q, K) and ``head_v`` (V); ``mask``: "none",
    "bool" (uchar, numpy's one-byte bool) or "float" (additive)."""
    mtype = "uchar" if mask == "bool" else "float"
    if mask == "bool":
        mask_term = "if (j >= mT || !M[mb + (size_t)j * ms[3]]) continue;"
    elif mask == "float":
        mask_term = "if (j >= mT) continue;\n    x += M[mb + (size_t)j * ms[3]];"
    else:
        mask_term = ""
    causal_term = "if (j > i + P) break;" if causal else ""
    return ACTIVATION_HELPERS + f"""
#define D {head}
#define DV {head_v}
// meta: B, H, S, T, rep, P (past length), mT (mask keys), strides (b, h, row, col) of Q, K, V, mask, O.
__kernel void onnx_attention_rows(__global float* restrict O, __global const float* restrict Q,
                                  __global const float* restrict K, __global const float* restrict V,
                                  __global const {mtype}* restrict M, __constant int* meta, const float scale,
                                  const int total) {{
  const int gid = get_global_id(0);
  if (gid >= total) return;
  const int H = meta[1], S = meta[2], T = meta[3], rep = meta[4], P = meta[5], mT = meta[6];
  __constant int* qs = meta + 7; __constant int* ks = meta + 11; __constant int* vs = meta + 15;
  __constant int* ms = meta + 19; __constant int* os = meta + 23;
  const int i = gid % S, bh = gid / S, h = bh % H, b = bh / H, kh = h / rep;
  const size_t qb = (size_t)b * qs[0] + (size_t)h * qs[1] + (size_t)i * qs[2];
  const size_t kb = (size_t)b * ks[0] + (size_t)kh * ks[1];
  const size_t vb = (size_t)b * vs[0] + (size_t)kh * vs[1];
  const size_t mb = (size_t)b * ms[0] + (size_t)h * ms[1] + (size_t)i * ms[2];
  float q[D];
  for (int d = 0; d < D; ++d) q[d] = Q[qb + (size_t)d * qs[3]] * scale;
  float o[DV];
  for (int d = 0; d < DV; ++d) o[d] = 0.0f;
  float m = -INFINITY, sum = 0.0f;
  for (int j = 0; j < T; ++j) {{
    {causal_term}
    float x = 0.0f;
    for (int d = 0; d < D; ++d) x += q[d] * K[kb + (size_t)j * ks[2] + (size_t)d * ks[3]];
    {mask_term}
    if (x == -INFINITY) continue;  // a masked key: weight 0
    if (x > m) {{  // online softmax: rescale what was summed against the new maximum
      const float c = ONNXHAL_EXP(m - x);
      sum *= c;
      for (int d = 0; d < DV; ++d) o[d] *= c;
      m = x;
    }}
    const float e = ONNXHAL_EXP(x - m);
    sum += e;
    const size_t vr = vb + (size_t)j * vs[2];
    for (int d = 0; d < DV; ++d) o[d] += e * V[vr + (size_t)d * vs[3]];
  }}
  const float inv = m == -INFINITY ? 0.0f : 1.0f / sum;  // every key masked: zeros, as the CPU EP
  const size_t ob = (size_t)b * os[0] + (size_t)h * os[1] + (size_t)i * os[2];
  for (int d = 0; d < DV; ++d) O[ob + (size_t)d * os[3]] = o[d] * inv;
}}
"""


def _heads_strides(shape, heads: int) -> tuple[tuple[int, int, int, int], list[int]]:
    """[B, heads, S, D] dims and (b, h, row, col) element strides of a contiguous 3-D [B, S, heads * D]
    or 4-D [B, heads, S, D] value."""
    if len(shape) == 4:
        return tuple(shape), list(contiguous_strides(shape))
    b, s, hidden = shape
    d = hidden // heads
    return (b, heads, s, d), [s * hidden, d, hidden, 1]


class OnnxAttentionLowering:
    """``_lower_Attention`` for the plan builder (which provides ``data``, ``output``, ``temp``,
    ``shape``, ``constant``, ``_strided_copy`` and ``plan``)."""

    def _lower_Attention(self, n: Node) -> None:
        what = f"Attention node {n.name!r}"
        ins = list(n.inputs) + [""] * (6 - len(n.inputs))
        q, k, v = (self.data(x) for x in ins[:3])
        qs_, ks_, vs_ = self.shape(q), self.shape(k), self.shape(v)
        if not len(qs_) == len(ks_) == len(vs_) or len(qs_) not in (3, 4):
            raise InvalidArgument(f"{what}: Q, K and V of ranks {len(qs_)}, {len(ks_)}, {len(vs_)}; they must all "
                                  "be 3-D or all 4-D.")
        qh, kvh = int(n.attr("q_num_heads", 0)), int(n.attr("kv_num_heads", 0))
        if len(qs_) == 3 and (qh <= 0 or kvh <= 0 or qs_[2] % qh or ks_[2] % kvh or vs_[2] % kvh):
            raise InvalidArgument(f"{what}: Q {list(qs_)}, K {list(ks_)}, V {list(vs_)} with q_num_heads {qh} and "
                                  f"kv_num_heads {kvh}; a 3-D input needs both dividing its last axis, or pass "
                                  "4-D [B, heads, S, D].")
        qd, qst = _heads_strides(qs_, qh)
        kd, kst = _heads_strides(ks_, kvh)
        vd, vst = _heads_strides(vs_, kvh)
        B, H, S, D = qd
        past = 0
        if ins[4]:
            pk, pv = self.data(ins[4]), self.data(ins[5])
            pks, pvs = self.shape(pk), self.shape(pv)
            if len(pks) != 4 or pks[:2] != kd[:2] or pks[3] != kd[3] or pvs[:2] != vd[:2] or pvs[3] != vd[3] \
                    or pks[2] != pvs[2]:
                raise InvalidArgument(f"{what}: past_key {list(pks)} and past_value {list(pvs)} for keys {list(kd)} "
                                      f"and values {list(vd)}; they must be [B, kv_heads, past, head_size] alike.")
            past = pks[2]
        T = past + kd[2]
        if kd[1] == 0 or H % kd[1] or vd[1] != kd[1] or vd[2] != kd[2] or kd[3] != D or kd[0] != B or vd[0] != B:
            raise InvalidArgument(f"{what}: Q heads {list(qd)}, keys {list(kd)}, values {list(vd)}; the query heads "
                                  "must be a multiple of the key-value heads, keys and values of one length, queries "
                                  "and keys of one head size.")
        outs = list(n.outputs) + [""] * (3 - len(n.outputs))
        if ins[4] or outs[1] or outs[2]:
            # the presents [B, kvH, T, D]: past rows then the new ones; the kernel reads them
            k, kst = self._present(outs[1], ins[4], k, kd, kst, T), list(contiguous_strides((B, kd[1], T, kd[3])))
            v, vst = self._present(outs[2], ins[5], v, vd, vst, T), list(contiguous_strides((B, vd[1], T, vd[3])))
        Dv = vd[3]
        scores = (B, H, S, T)
        mask_kind, mT, mst = "none", T, [0, 0, 0, 0]
        mask = q
        if ins[3]:
            mask = self.data(ins[3])
            msh = self.shape(mask)
            if msh and (msh[-1] > T or (len(msh) >= 2 and msh[-2] not in (1, S))):
                raise InvalidArgument(f"{what}: attn_mask of shape {list(msh)} for {S} queries and {T} keys; it must "
                                      "broadcast to [B, H, S, T] with no more than T keys.")
            mT = msh[-1] if msh else 1
            padded = (1,) * (4 - len(msh)) + tuple(msh)
            if len(msh) > 4 or any(m not in (1, t) for m, t in zip(padded[:3], scores[:3])):
                raise InvalidArgument(f"{what}: attn_mask of shape {list(msh)} does not broadcast to the scores "
                                      f"{list(scores)}; give it [B or 1, H or 1, S or 1, T] or fewer axes.")
            fi = broadcast_strides(msh, (*scores[:-1], mT))
            mst = (list(contiguous_strides((*scores[:-1], mT))) if fi.mode == "same"
                   else [0, 0, 0, 0] if fi.mode == "scalar" else list(fi.strides))
            mst = [0] * (4 - len(mst)) + mst
            mask_kind = "bool" if self.plan.dtypes[mask] == np.bool_ else "float"
        od = self.shape(outs[0])
        ost = list(contiguous_strides(od)) if len(od) == 4 else [S * H * Dv, Dv, H * Dv, 1]
        meta = np.array([B, H, S, T, H // kd[1], past, mT, *qst, *kst, *vst, *mst, *ost], dtype=np.int32)
        scale = n.attr("scale", None)
        scale = F(1.0 / np.sqrt(D)) if scale is None else F(scale)
        out = self.output(outs[0])
        source = onnx_attention_source(D, Dv, mask_kind, bool(n.attr("is_causal", 0)))
        self.plan.add_launch_1d(source, "onnx_attention_rows", B * H * S, [
            Buf(out), Buf(q), Buf(k), Buf(v), Buf(mask), Buf(self.constant("oattnmeta", meta)), scale])

    def _present(self, out: str, past: str, new: str, dims, strides, total: int) -> str:
        """The present buffer [B, kvH, total, D] (output ``out``, or a temporary): ``past`` rows, then
        the new rows of ``new`` (``dims``, read through ``strides``)."""
        B, Hk, Sn, Dh = dims
        dst = self.output(out) if out else self.temp("present", B * Hk * total * Dh * 4)
        dst_strides = list(contiguous_strides((B, Hk, total, Dh)))
        p = total - Sn
        if past:
            self._strided_copy(dst, past, (B, Hk, p, Dh), list(contiguous_strides((B, Hk, p, Dh))), dst_strides)
        self._strided_copy(dst, new, tuple(dims), list(strides), dst_strides, 0, p * Dh)
        return dst
