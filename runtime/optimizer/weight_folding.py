"""Passes that fold constant arithmetic into a neighbour's weights, or lay weights out for the kernels.

- Conv + BatchNormalization (inference) -> Conv with scaled weights and shifted bias.
- Conv + Mul(per-channel constant) -> Conv with scaled weights and bias.
- Conv + Add(per-channel constant) -> Conv with shifted bias.
- BatchNormalization + Mul/Add(per-channel constant) -> BatchNormalization with new scale/bias.
- Conv with a bias and no activation + a 1x1 Conv without padding -> the first Conv without its
  bias, the second with that bias carried through its weights (``fold_conv_bias_forward``).
- MatMul(2-D A, constant 2-D B) + Add(constant bias broadcastable to [M, N]) -> Gemm.
- Extended level: MatMul(A, B) / scalar (or * scalar), where A or B comes through layout-only ops
  from a product with constant weights -> the MatMul alone, with those weights scaled
  (``fold_matmul_scale``: attention's Q K^T / sqrt(d)).
- Layout level, CPU EP only: FusedGemm with transB = 1 and a constant B -> transB = 0 and B stored
  transposed (``pretranspose_gemm_weights``).

The folded arithmetic runs in float64 and is cast back to the weights' dtype, so results agree
with the unfolded graph to float rounding. The fused node takes the second node's output name.
"""

from __future__ import annotations

import numpy as np

from onnxhal.hal.graph import Graph, Node
from onnxhal.runtime.optimizer.rewrite import (
    FUSED_DOMAIN,
    add_initializer,
    constant,
    live_nodes,
    make_node,
    rank,
    replace_nodes,
    rewired,
    scalar_constant,
    sole_consumer,
)


def _conv_parts(graph: Graph, conv: Node) -> tuple[np.ndarray, np.ndarray] | None:
    """(W, B) of a Conv with constant float weights (B zeros when absent), or None."""
    if conv.op_type != "Conv" or conv.domain != "":
        return None
    w = constant(graph, conv.inputs[1]) if len(conv.inputs) > 1 else None
    if w is None or w.dtype.kind != "f":
        return None
    b_name = conv.inputs[2] if len(conv.inputs) > 2 else ""
    b = constant(graph, b_name) if b_name else np.zeros(w.shape[0], dtype=w.dtype)
    if b is None:
        return None
    return w, b


def _replace_conv(graph: Graph, conv: Node, follower: Node, w: np.ndarray, b: np.ndarray) -> None:
    """Swap Conv + follower for one Conv with new weights ``w``/``b`` writing the follower's output."""
    dtype = graph.initializers[conv.inputs[1]].dtype
    w_name = add_initializer(graph, f"{conv.inputs[1]}_folded", w.astype(dtype))
    b_name = add_initializer(graph, f"{conv.name or conv.outputs[0]}_bias_folded", b.astype(dtype))
    new = rewired(graph, conv, [conv.inputs[0], w_name, b_name], [follower.outputs[0]], conv.name or follower.name)
    replace_nodes(graph, [conv, follower], [new])


def _unused_extra_outputs(graph: Graph, node: Node) -> bool:
    return all(not o or (not graph.consumers(o) and o not in {v.name for v in graph.outputs})
               for o in node.outputs[1:])


def fold_conv_batchnorm(graph: Graph) -> bool:
    """Conv followed by an inference BatchNormalization with constant statistics."""
    changed = False
    for conv in live_nodes(graph, "Conv"):
        parts = _conv_parts(graph, conv)
        bn = sole_consumer(graph, conv.outputs[0]) if parts else None
        stats = batchnorm_stats(graph, bn) if bn is not None and bn.inputs[0] == conv.outputs[0] else None
        if stats is None:
            continue
        w, b = parts
        scale, bias, mean, var = (s.astype(np.float64).reshape(-1) for s in stats)
        factor = scale / np.sqrt(var + bn.attr("epsilon", 1e-5))
        if factor.shape[0] != w.shape[0]:
            continue
        new_w = w.astype(np.float64) * factor.reshape((-1,) + (1,) * (w.ndim - 1))
        new_b = (b.astype(np.float64) - mean) * factor + bias
        _replace_conv(graph, conv, bn, new_w, new_b)
        changed = True
    return changed


def _per_channel(value: np.ndarray, channels: int, out_rank: int) -> np.ndarray | None:
    """``value`` as a [channels] vector if it broadcasts along the channel axis (1) of an
    [N, C, ...] tensor of rank ``out_rank`` and nowhere else; else None."""
    if value.ndim > out_rank or value.dtype.kind != "f":
        return None
    shape = (1,) * (out_rank - value.ndim) + value.shape
    if any(d != 1 for i, d in enumerate(shape) if i != 1) or shape[1] not in (1, channels):
        return None
    return np.broadcast_to(value.astype(np.float64).reshape(-1), (channels,))


def _per_channel_follower(graph: Graph, node: Node, channels: int, out_rank: int) -> tuple[Node | None, np.ndarray | None]:
    """(follower, per-channel vector) when ``node``'s only consumer is a Mul or Add by a constant
    with one value per channel (or one value), else (None, None)."""
    follower = sole_consumer(graph, node.outputs[0])
    if follower is None or follower.op_type not in ("Mul", "Add") or follower.domain != "":
        return None, None
    other = [i for i in follower.inputs if i != node.outputs[0]]
    value = constant(graph, other[0]) if len(other) == 1 else None
    vec = _per_channel(value, channels, out_rank) if value is not None else None
    return (follower, vec) if vec is not None else (None, None)


def fold_conv_mul_add(graph: Graph) -> bool:
    """Conv followed by Mul or Add with a per-channel constant."""
    changed = False
    for conv in live_nodes(graph, "Conv"):
        parts = _conv_parts(graph, conv)
        if parts is None:
            continue
        w, b = parts
        follower, vec = _per_channel_follower(graph, conv, w.shape[0], w.ndim)
        if vec is None:
            continue
        if follower.op_type == "Mul":
            new_w = w.astype(np.float64) * vec.reshape((-1,) + (1,) * (w.ndim - 1))
            new_b = b.astype(np.float64) * vec
        else:
            new_w, new_b = w, b.astype(np.float64) + vec
        _replace_conv(graph, conv, follower, new_w, new_b)
        changed = True
    return changed


def _pointwise(conv: Node, w: np.ndarray) -> bool:
    """Whether every output of ``conv`` reads exactly one input position: a 1x1 kernel without
    padding (explicit zeros, VALID, or SAME, which pads a 1x1 kernel by nothing)."""
    return (w.ndim >= 3 and all(k == 1 for k in w.shape[2:])
            and (conv.attr("auto_pad", "NOTSET") != "NOTSET" or not any(conv.attr("pads") or [])))


def fold_conv_bias_forward(graph: Graph) -> bool:
    """Conv A with a constant bias b, read only by a pointwise (1x1, unpadded) Conv C with
    constant weights W and bias c -> A without its bias, and C with bias c + W b (per group of C).
    C is linear and reads A's outputs one position at a time, so A's per-channel shift becomes a
    per-channel shift of C's outputs, exactly up to float rounding. ShuffleNet's depthwise layers
    have no activation before their 1x1 convolution: each then skips its bias pass over the
    output."""
    changed = False
    for a in live_nodes(graph, "Conv"):
        parts = _conv_parts(graph, a)
        if parts is None or len(a.inputs) < 3 or not a.inputs[2]:
            continue
        c = sole_consumer(graph, a.outputs[0])
        c_parts = _conv_parts(graph, c) if c is not None and c.inputs[0] == a.outputs[0] else None
        if c_parts is None or c.inputs[1] == a.outputs[0] or not _pointwise(c, c_parts[0]):
            continue
        (wa, ba), (wc, bc) = parts, c_parts
        groups = c.attr("group", 1)
        m, cin = wc.shape[0], wc.shape[1] * groups
        if cin != wa.shape[0] or m % groups or wc.dtype != wa.dtype:
            continue
        wg = wc.astype(np.float64).reshape(groups, m // groups, cin // groups)
        shift = np.matmul(wg, ba.astype(np.float64).reshape(groups, cin // groups, 1)).reshape(m)
        b_name = add_initializer(graph, f"{c.name or c.outputs[0]}_bias_folded",
                                 (bc.astype(np.float64) + shift).astype(wc.dtype))
        replace_nodes(graph, [a, c], [rewired(graph, a, list(a.inputs[:2]), list(a.outputs), a.name),
                                      rewired(graph, c, [*c.inputs[:2], b_name], list(c.outputs), c.name)])
        changed = True
    return changed


def batchnorm_stats(graph: Graph, bn: Node) -> list[np.ndarray] | None:
    """[scale, bias, mean, var] of an inference BatchNormalization with constant statistics."""
    if bn.op_type != "BatchNormalization" or bn.domain != "" or bn.attr("training_mode", 0):
        return None
    if not _unused_extra_outputs(graph, bn) or len(bn.inputs) != 5:
        return None
    stats = [constant(graph, name) for name in bn.inputs[1:5]]
    return None if any(s is None or s.dtype.kind != "f" for s in stats) else stats


def fold_batchnorm_mul_add(graph: Graph) -> bool:
    """BatchNormalization followed by Mul or Add with a per-channel constant (DenseNet's exported
    scale layers) -> BatchNormalization with new scale and bias."""
    changed = False
    for bn in live_nodes(graph, "BatchNormalization"):
        stats = batchnorm_stats(graph, bn)
        out_rank = rank(graph, bn.inputs[0]) if stats else None
        if not out_rank:
            continue
        follower, vec = _per_channel_follower(graph, bn, stats[0].reshape(-1).shape[0], out_rank)
        if vec is None:
            continue
        dtype = stats[0].dtype
        scale, bias = stats[0].astype(np.float64).reshape(-1), stats[1].astype(np.float64).reshape(-1)
        if follower.op_type == "Mul":
            scale, bias = scale * vec, bias * vec
        else:
            bias = bias + vec
        names = [add_initializer(graph, f"{bn.inputs[1]}_folded", scale.astype(dtype)),
                 add_initializer(graph, f"{bn.inputs[2]}_folded", bias.astype(dtype))]
        new = rewired(graph, bn, [bn.inputs[0], *names, *bn.inputs[3:5]], [follower.outputs[0]],
                       bn.name or follower.name)
        replace_nodes(graph, [bn, follower], [new])
        changed = True
    return changed


def matmul_add_to_gemm(graph: Graph) -> bool:
    """MatMul of a 2-D input and constant 2-D weights followed by a constant bias Add -> Gemm."""
    changed = False
    for mm in live_nodes(graph, "MatMul"):
        if mm.op_type != "MatMul" or mm.domain != "" or len(mm.inputs) != 2 or rank(graph, mm.inputs[0]) != 2:
            continue
        weights = constant(graph, mm.inputs[1])
        add = sole_consumer(graph, mm.outputs[0])
        if weights is None or weights.ndim != 2 or weights.dtype.kind != "f" or add is None:
            continue
        if add.op_type != "Add" or add.domain != "":
            continue
        other = [i for i in add.inputs if i != mm.outputs[0]]
        bias = constant(graph, other[0]) if len(other) == 1 else None
        n = weights.shape[1]
        if bias is None or bias.dtype != weights.dtype or bias.shape not in ((n,), (1, n), (1,), ()):
            continue
        gemm = make_node(graph, "Gemm", [mm.inputs[0], mm.inputs[1], other[0]], [add.outputs[0]],
                         name=mm.name or add.name)
        replace_nodes(graph, [mm, add], [gemm])
        changed = True
    return changed


#: Rows of A from which a product with B stored (K, N) beats B stored (N, K) and read transposed.
#: With numpy's OpenBLAS, (K, N) wins from two rows up; at one row (a matrix-vector product) the
#: (N, K) rows win while the weights fit in cache and lose beyond, so a static single row keeps the
#: layout it has.
PRETRANSPOSE_MIN_ROWS = 2


def pretranspose_gemm_weights(graph: Graph) -> bool:
    """FusedGemm(A, B, C?) with transB = 1 and a constant 2-D float B read by no other node ->
    transB = 0 with B stored transposed, once, as ORT's CPU Gemm pre-packs its weights: OpenBLAS
    packs a (K, N) B faster than it reads an (N, K) one transposed. A whose row count is a static
    1 keeps its layout (see ``PRETRANSPOSE_MIN_ROWS``); a symbolic row count is taken as a batch."""
    changed = False
    for gemm in live_nodes(graph, "FusedGemm"):
        if gemm.op_type != "FusedGemm" or gemm.domain != FUSED_DOMAIN or not gemm.attr("transB", 0):
            continue
        b = gemm.inputs[1]
        weights = constant(graph, b)
        # B read by no other node (A included: a Gemm of a constant with itself keeps its layout)
        if weights is None or weights.ndim != 2 or weights.dtype.kind != "f" \
                or sole_consumer(graph, b) is not gemm or gemm.inputs[0] == b:
            continue
        shape = graph.value_info(gemm.inputs[0]).shape
        rows = shape[1 if gemm.attr("transA", 0) else 0] if shape is not None and len(shape) == 2 else None
        if isinstance(rows, int) and rows < PRETRANSPOSE_MIN_ROWS:
            continue
        name = add_initializer(graph, b + "_kn", weights.T)
        new = make_node(graph, "FusedGemm", [gemm.inputs[0], name, *gemm.inputs[2:]], gemm.outputs,
                        name=gemm.name, domain=FUSED_DOMAIN, **{**gemm.attributes, "transB": 0})
        replace_nodes(graph, [gemm], [new])  # B, read by nothing now, goes in the optimizer's last sweep
        changed = True
    return changed


#: Ops a scalar factor passes through unchanged: they only move or relabel elements.
_LAYOUT_OPS = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity"})
#: Products whose output a scalar can scale through their constant weights: op -> (weight input
#: indices that must be constant; a missing optional input is fine, except the first).
_SCALABLE = {("", "MatMul"): (1,), ("", "Gemm"): (1, 2), (FUSED_DOMAIN, "FusedMatMul"): (1, 2),
             (FUSED_DOMAIN, "FusedGemm"): (1, 2)}


def _scalable_product(graph: Graph, name: str, reader: Node) -> Node | None:
    """The product ``name`` comes from, through layout-only ops, if every value on the way is read
    by the next node alone and the product's weights are constant floats with no activation after
    them (Gelu, Relu of a negative factor, ... do not commute with a factor)."""
    while sole_consumer(graph, name) is reader:
        node = graph.producer(name)
        if node is None:
            return None
        if node.domain == "" and node.op_type in _LAYOUT_OPS:
            reader, name = node, node.inputs[0]
            continue
        slots = _SCALABLE.get((node.domain, node.op_type))
        if slots is None or node.attr("activation", "") or not _unused_extra_outputs(graph, node):
            return None
        for k, i in enumerate(slots):
            if len(node.inputs) <= i or not node.inputs[i]:
                if k == 0:
                    return None
                continue  # no bias
            value = constant(graph, node.inputs[i])
            if value is None or value.dtype.kind != "f":
                return None
        return node
    return None


def fold_matmul_scale(graph: Graph) -> bool:
    """MatMul(A, B) followed by Div or Mul by a one-element float constant s, where A or B is,
    through layout-only ops read by nothing else (``_LAYOUT_OPS``), the output of a MatMul, Gemm,
    FusedMatMul or FusedGemm with constant weights and no activation: those weights (and bias) are
    scaled by 1/s (or s) once and the Div goes. Attention's scores Q K^T / sqrt(d) are the case:
    ORT folds the factor into its FusedMatMul's alpha, which numpy's matmul lacks, so the factor
    moves into Q's projection instead, and the scores (12x128x128 in BERT-base) lose one pass
    (0.07-0.12 ms). A power-of-two factor (sqrt(64) = 8) scales the weights exactly."""
    changed = False
    for mm in live_nodes(graph, "MatMul"):
        if mm.op_type != "MatMul" or mm.domain != "":
            continue
        follower = sole_consumer(graph, mm.outputs[0])
        if follower is None or follower.domain != "" or follower.op_type not in ("Div", "Mul"):
            continue
        if follower.op_type == "Div" and follower.inputs[0] != mm.outputs[0]:
            continue  # s / (A B) is not a scaling
        other = [i for i in follower.inputs if i != mm.outputs[0]]
        s = scalar_constant(graph, other[0], mm.outputs[0], kinds="f") if len(other) == 1 else None
        if s is None:
            continue  # not a float scalar, or one of higher rank, which would broadcast the result up
        factor = 1.0 / s if follower.op_type == "Div" else s
        if not np.isfinite(factor) or factor == 0.0:
            continue
        for side in mm.inputs[:2]:
            product = _scalable_product(graph, side, mm)
            if product is not None:
                break
        else:
            continue
        inputs = list(product.inputs)
        for i in _SCALABLE[(product.domain, product.op_type)]:
            if len(inputs) > i and inputs[i]:
                old = inputs[i]
                w = graph.initializers[old]
                inputs[i] = add_initializer(graph, f"{old}_scaled", (w.astype(np.float64) * factor).astype(w.dtype))
        # the unscaled weights, if nothing else reads them, go in the optimizer's last sweep
        replace_nodes(graph, [product], [rewired(graph, product, inputs, product.outputs, product.name)])
        replace_nodes(graph, [mm, follower], [rewired(graph, mm, mm.inputs, follower.outputs, mm.name)])
        changed = True
    return changed
