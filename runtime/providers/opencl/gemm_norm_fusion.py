"""Rule ``gemm_norm``: a row normalisation launch (``layernorm_rows``, or ``rmsnorm_rows`` of rule
``rms_norm``) over the rows a GEMM launch has just written folded into that launch
(``kernel_sources``' ``gemm_rowmajor_a_norm``), a pass over a lowered plan.

Transformer layers end their attention and feed-forward blocks with a GEMM whose epilogue adds the
bias and the residual, followed by a LayerNorm of its rows (post-norm BERT; pre-norm GPT-2, ViT,
Whisper and T5 normalise the same sum before the next block): two launches where one work-item can
compute its rows of the GEMM and then normalise them, as no other work-item writes them. The fused
kernel gives each work-item a whole row block (every column panel), so it keeps the GEMM's
parallelism only over rows: it is chosen where a row holds at most ``MAX_PANELS`` panels, what one
work-group of the plain GEMM walks anyway. The GEMM's result is still stored (pre-norm models read
it again as the next residual) and the norm reads it back with its own kernel's arithmetic."""

from __future__ import annotations

import numpy as np

from onnxhal.runtime.providers.opencl import kernel_sources as ks
from onnxhal.runtime.providers.opencl.partition_plan import Buf, Launch, PartitionPlan

#: the row-major GEMM kernels whose launch (and argument list, the wide tile's included) the rule takes
GEMM_KERNELS = ("gemm_rowmajor_a", "gemm_rowmajor_a_x2")
#: at most this many 16-column panels a row: a work-group of the plain GEMM walks as many
MAX_PANELS = ks.GEMM_JT


def norms_into_gemms(plan: PartitionPlan) -> int:
    """Fold each ``layernorm_rows`` or ``rmsnorm_rows`` launch that directly follows the GEMM launch
    writing its input into that launch; returns how many were folded."""
    steps, folded, k = plan.steps, 0, 0
    while k + 1 < len(steps):
        fused = _fused(plan, steps[k], steps[k + 1])
        if fused is not None:
            steps[k:k + 2] = [fused]
            folded += 1
        k += 1
    return folded


def _norm_args(norm: Launch) -> tuple[Buf, Buf, list, int, int] | None:
    """(Y, X, the fused kernel's norm arguments, row length, rows) of a norm launch, or None."""
    if norm.kernel_name == "layernorm_rows":
        y, x, gamma, beta, has_beta, row, eps, total = norm.args
        return y, x, [gamma, beta, has_beta, np.float32(eps), np.int32(0), np.int32(1)], int(row), int(total)
    if norm.kernel_name == "rmsnorm_rows":
        y, x, w, has_w, row, eps, divide, total = norm.args
        return y, x, [w, w, np.int32(0), np.float32(eps), np.int32(1 + int(divide)), has_w], int(row), int(total)
    return None


def _fused(plan: PartitionPlan, gemm: object, norm: object) -> Launch | None:
    """The launch doing ``gemm`` then ``norm``, or None where the rule's conditions do not hold."""
    if not (isinstance(gemm, Launch) and isinstance(norm, Launch) and gemm.kernel_name in GEMM_KERNELS
            and gemm.global_size[1:] == (1,)):
        return None
    got = _norm_args(norm)
    if got is None:
        return None
    y, x, tail, row, rows = got
    a, bp, c, bias, res = gemm.args[:5]
    (m, n, k, a_mod, _c_bstride, _bias_bstride, bias_mode, alpha, beta, act, p0, p1, ldc, _a_bstride,
     lda) = gemm.args[5:20]
    base = plan.base
    if (int(a_mod) != 1 or int(ldc) != int(n) or -(-int(n) // ks.GEMM_RN) > MAX_PANELS
            or row != int(n) or rows != int(m) or base(x.name) != base(c.name)):
        return None
    # Y is written row block by row block while other work-items still read A, R and bias.
    if base(y.name) in {base(b.name) for b in (a, c, bias, res) if isinstance(b, Buf)}:
        return None
    blocks = -(-int(m) // ks.GEMM_RM)
    return Launch(gemm.source, "gemm_rowmajor_a_norm", (blocks, 1), (1, 1),
                  [a, bp, c, bias, res, m, n, k, bias_mode, alpha, beta, act, p0, p1, lda, y, *tail])
