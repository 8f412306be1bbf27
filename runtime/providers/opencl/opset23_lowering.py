"""Lowering of opset 23's decoder ops that today's dynamo LLM exports hold (hf_llama_past,
hf_gemma3): RMSNormalization (one row kernel, ``kernel_sources.rmsnorm_rows``) and
RotaryEmbedding (one work-item per element). Their claim rules are ``op_support.check_rms_norm``
and ``check_rotary``; claimed under rule ``opset23_ops``. A mixin of ``PartitionPlanBuilder``."""

from __future__ import annotations

import numpy as np

from onnxhal.hal.errors import InvalidArgument
from onnxhal.hal.graph import Node
from onnxhal.runtime.providers.opencl import kernel_sources as ks
from onnxhal.runtime.providers.opencl.gemm_lowering import prod
from onnxhal.runtime.providers.opencl.partition_plan import Buf

I32, F = np.int32, np.float32

#: ONNX RotaryEmbedding (opset 23) without position_ids: X [B, N, S, H] (``seq_major`` 0) or
#: [B, S, N * H] (1); the first 2 * hw features of each head rotated by the caches [CB, S, hw]
#: (CB 1 broadcasts over the batch; ``hw``: half the rotary dim, ``half`` being an OpenCL type), halves (x1, x2) -> (x1 c - x2 s, x2 c + x1 s) or adjacent
#: pairs when interleaved; the rest copied. The same products and sums as the CPU EP's ``rotate``.
ROTARY_SOURCE = """
__kernel void rotary_embedding(__global float* Y, __global const float* X, __global const float* Cc,
                               __global const float* Sc, const int H, const int N, const int S, const int hw,
                               const int interleaved, const int seq_major, const int cache_batch, const int total) {
  const int gid = get_global_id(0);
  if (gid >= total) return;
  const int h = gid % H;
  int rem = gid / H, s, b;
  if (seq_major) { rem /= N; s = rem % S; b = rem / S; } else { s = rem % S; b = rem / (S * N); }
  const float v = X[gid];
  if (h >= 2 * hw) { Y[gid] = v; return; }
  const int row = (cache_batch == 1 ? 0 : b) * S + s;
  int i;
  float partner, sign;
  if (interleaved) {
    i = h >> 1;
    if (h & 1) { partner = X[gid - 1]; sign = 1.0f; } else { partner = X[gid + 1]; sign = -1.0f; }
  } else if (h < hw) {
    i = h; partner = X[gid + hw]; sign = -1.0f;
  } else {
    i = h - hw; partner = X[gid - hw]; sign = 1.0f;
  }
  const float c = Cc[row * hw + i], sn = Sc[row * hw + i];
  Y[gid] = sign < 0.0f ? v * c - partner * sn : v * c + partner * sn;
}
"""


class Opset23Lowering:
    """``_lower_RMSNormalization`` and ``_lower_RotaryEmbedding`` for the plan builder (which
    provides ``data``, ``output``, ``shape``, ``constant`` and ``plan``)."""

    def _lower_RMSNormalization(self, n: Node) -> None:
        xs = self.shape(n.inputs[0])
        axis = n.attr("axis", -1) % len(xs)
        r = prod(xs[axis:])
        scale = self.data(n.inputs[1])
        out = self.output(n.outputs[0])
        # the claim checked that scale holds one value per normalized element, in row order
        self.plan.add_launch_1d(ks.RMSNORM_SOURCE, "rmsnorm_rows", prod(xs[:axis]), [
            Buf(out), Buf(self.data(n.inputs[0])), Buf(scale), I32(1), I32(r), F(n.attr("epsilon", 1e-5)), I32(0)])

    def _lower_RotaryEmbedding(self, n: Node) -> None:
        x = self.data(n.inputs[0])
        xs = self.shape(x)
        cos, sin = self.data(n.inputs[1]), self.data(n.inputs[2])
        cs, ss = self.shape(cos), self.shape(sin)
        heads = int(n.attr("num_heads", 0))
        what = f"RotaryEmbedding node {n.name!r}"
        if len(xs) == 4:
            b, nh, s, h = xs
        elif len(xs) == 3 and heads > 0 and xs[2] % heads == 0:
            b, s, nh, h = xs[0], xs[1], heads, xs[2] // heads
        else:
            raise InvalidArgument(f"{what}: input of shape {list(xs)} with num_heads {heads}; it must be "
                                  "[B, N, S, head_size], or [B, S, hidden] with num_heads dividing hidden.")
        rdim = int(n.attr("rotary_embedding_dim", 0)) or h
        if cs != ss or len(cs) != 3 or cs[-1] * 2 != rdim or rdim > h or cs[0] not in (1, b) or cs[1] != s:
            raise InvalidArgument(f"{what}: cos_cache {list(cs)} and sin_cache {list(ss)} for batch {b}, sequence "
                                  f"{s} and a rotary dim of {rdim} (head size {h}); they must be "
                                  f"[{b} or 1, {s}, {rdim // 2}].")
        out = self.output(n.outputs[0])
        self.plan.add_launch_1d(ROTARY_SOURCE, "rotary_embedding", prod(xs), [
            Buf(out), Buf(x), Buf(cos), Buf(sin), I32(h), I32(nh), I32(s), I32(rdim // 2),
            I32(int(bool(n.attr("interleaved", 0)))), I32(1 if len(xs) == 3 else 0), I32(cs[0])])
