"""Fusion rule ``attention``: scaled dot-product attention as one kernel launch.

The pattern, each intermediate read only by the next step and no partition output::

    Q' = [Mul|Div by a scalar constant](view of Q)        view: the value itself or a Transpose of it
    K' = [Mul|Div by a scalar constant](view of K^T)
    S  = Softmax_last_axis([Add mask]([Mul|Div by a scalar constant](Q' @ K')))
    mask = a value, or Where(bool cond, scalar a, scalar b)   (rule attention_select_mask)
    P  = [ReplaceNaN](S)
    O  = P @ (view of V)            O may be written through a following Transpose (the head merge),
                                    after an identity Reshape or none

becomes ``attention_rows``: one work-item per (batch, head, query row) computes the row's scores
into a private array, its softmax exactly as ``softmax_rows`` does, and the row of ``P @ V``, reading
Q, K, V, the mask and the output through strides. That replaces two GEMMs, the packing of K and V,
the softmax, the Transposes and the elementwise steps between them (6-12 launches a layer). The
row length and head sizes are baked into the source (one program per shape triple), so rows longer
than ``MAX_KEYS`` or heads wider than ``MAX_HEAD`` keep the unfused plan.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from onnxhal.hal.graph import Graph, Node
from onnxhal.runtime.providers.opencl.elementwise_codegen import broadcast_strides, float_literal
from onnxhal.runtime.providers.opencl.gemm_lowering import Epilogue, contiguous_strides, prod, transpose_output_strides
from onnxhal.runtime.providers.opencl.kernel_sources import ACTIVATION_HELPERS
from onnxhal.runtime.providers.opencl.op_support import FUSED_DOMAIN, VIEW_OPS, GraphLookup
from onnxhal.runtime.providers.opencl.partition_plan import Buf, Launch, PartitionPlan

#: Longest key row the private score array holds.
MAX_KEYS = 1024
#: Widest head (Q/K and V) the private accumulators hold.
MAX_HEAD = 256
#: Query rows one work-item of the vector form computes (sharing each K and V load).
ATTENTION_ROWS = 4


@dataclass
class StridedOperand:
    """A value read in place: buffer value ``name``, 4-D ``dims`` and element ``strides`` (batch
    dims padded to two), and an optional scalar op applied on read (``"*"`` or ``"/"``, constant)."""

    name: str
    dims: tuple[int, ...]
    strides: list[int]
    op: str | None = None
    factor: float = 1.0
    offset: int = 0  # elements from the buffer's start (a part of a Split read in place)


@dataclass
class AttentionMatch:
    members: list[Node]  # every node folded, the P @ V MatMul (or its Transpose) last
    q: StridedOperand
    kt: StridedOperand  # K^T: [B, H, D, Sk]
    v: StridedOperand
    score_op: str | None
    score_factor: float
    mask: str | None
    replace_nan: float | None
    out: str  # the value written
    out_strides: list[int]  # of (b, h, i, d) inside ``out``
    splits: list[Node]  # Splits some operands read through: skipped when every part is read so
    #: rule attention_select_mask: ``mask`` is the bool condition of a Where between these two scalar
    #: constants (then, else), which the kernel selects per score instead of reading a float mask
    mask_select: tuple[float, float] | None = None
    #: Expands the mask is read through (broadcast strides of their input): not run once every reader
    #: of theirs is folded
    mask_expands: list[Node] | None = None


#: A view's axis as the (size, element stride) factors it was merged from, outermost first (no unit
#: factors): a Reshape may merge axes that are not contiguous among themselves as long as a later one
#: splits them again before they are read.
Axis = list[tuple[int, int]]


def strided_axes(dims, strides) -> list[Axis]:
    return [[(int(d), int(s))] if d != 1 else [] for d, s in zip(dims, strides)]


def reshape_axes(axes: list[Axis], new_dims) -> list[Axis] | None:
    """``axes`` regrouped into ``new_dims`` (same element order), splitting a factor where a new dim
    divides it, or None where a new dim does not fall on factor boundaries."""
    factors: Axis = []
    for f in (f for ax in axes for f in ax):  # contiguous neighbours as one factor, which any divisor splits
        if factors and factors[-1][1] == f[0] * f[1]:
            factors[-1] = (factors[-1][0] * f[0], f[1])
        else:
            factors.append(f)
    out: list[Axis] = []
    i = 0
    for d in new_dims:
        ax: Axis = []
        need = int(d)
        while need > 1:
            if i >= len(factors):
                return None
            size, stride = factors[i]
            if size <= need:
                if need % size:
                    return None
                ax.append((size, stride))
                need //= size
                i += 1
            else:
                if size % need:
                    return None
                ax.append((need, stride * (size // need)))
                factors[i] = (size // need, stride)
                need = 1
        out.append(ax)
    return out if i == len(factors) else None


def axes_strides(axes: list[Axis]) -> list[int] | None:
    """One element stride per axis, or None where an axis's factors are not contiguous among
    themselves (a strided view cannot hold it)."""
    strides = []
    for ax in axes:
        if any(outer[1] != inner[0] * inner[1] for outer, inner in zip(ax, ax[1:])):
            return None
        strides.append(ax[-1][1] if ax else 0)
    return strides


def reshape_strides(dims, strides, new_dims) -> list[int] | None:
    """The element strides of ``new_dims`` when reshaping a strided view (``dims``, ``strides``)
    to them keeps it a strided view of the same memory (numpy's reshape without a copy), else None."""
    if prod(dims) != prod(new_dims) or prod(dims) == 0:
        return None
    axes = reshape_axes(strided_axes(dims, strides), new_dims)
    return None if axes is None else axes_strides(axes)


def _pad4(dims, strides) -> tuple[tuple[int, ...], list[int]]:
    pad = 4 - len(dims)
    return (1,) * pad + tuple(dims), [0] * pad + list(strides)


def _mask_term(row: str, select: tuple[float, float] | None) -> str:
    """The C expression of score (b, h, ``row``, j)'s mask: the float mask read through its strides, or
    the Where of its bool condition between two constants (``select``), the values the Where would
    have stored."""
    at = f"M[(size_t)b * ms[0] + (size_t)h * ms[1] + (size_t){row} * ms[2] + (size_t)j * ms[3]]"
    if select is None:
        return at
    return f"({at} ? {float_literal(select[0])} : {float_literal(select[1])})"


def _mask_type(select: tuple[float, float] | None) -> str:
    return "float" if select is None else "uchar"  # numpy's one-byte bool


def attention_source(keys: int, head: int, head_v: int, scale: tuple, mask: bool, replace_nan: float | None,
                     q_op: tuple, k_op: tuple, width: int = 1, select: tuple[float, float] | None = None) -> str:
    """``attention_rows`` for one (keys, head, value head) shape and its constant factors. ``width``
    > 1: Q, K, V and the output rows are read and written as ``float{width}`` vectors (their head
    dims contiguous, both head sizes multiples of it), one work-item per row with no cross-item
    vectorisation expected (launched as the GEMM family is: work-groups of one on a CPU). ``select``:
    the mask is a bool condition and these (then, else) constants (rule ``attention_select_mask``)."""
    def scaled(expr: str, op: tuple) -> str:
        return f"({expr} {op[0]} {float_literal(op[1])})" if op[0] else expr
    replace = (f"p = p != p ? {float_literal(replace_nan)} : p;" if replace_nan is not None else "")
    if width > 1:
        return ACTIVATION_HELPERS + _blocked_source(keys, head, head_v, scaled, scale, mask, replace, q_op, k_op, width,
                                                    select)
    load_q = "float q[D];\n  for (int d = 0; d < D; ++d) q[d] = " + scaled("Q[qb + (size_t)d * qs[3]]", q_op) + ";"
    dot = ("float acc = 0.0f;\n    for (int d = 0; d < D; ++d) acc += q[d] * "
           + scaled("KT[kb + (size_t)d * ks[2] + (size_t)j * ks[3]]", k_op) + ";")
    return ACTIVATION_HELPERS + f"""
#define SK {keys}
#define D {head}
#define DV {head_v}
// meta: B, H, Sq, the strides (b, h, row, col) of Q, K^T, V, mask and the output, the offsets of Q, K^T, V.
__kernel void attention_rows(__global float* restrict O, __global const float* restrict Q,
                             __global const float* restrict KT, __global const float* restrict V,
                             __global const {_mask_type(select)}* restrict M, __constant int* meta, const int total) {{
  const int gid = get_global_id(0);
  if (gid >= total) return;
  const int Sq = meta[2], H = meta[1];
  const int i = gid % Sq, bh = gid / Sq, h = bh % H, b = bh / H;
  __constant int* qs = meta + 3; __constant int* ks = meta + 7; __constant int* vs = meta + 11;
  __constant int* ms = meta + 15; __constant int* os = meta + 19;
  const size_t qb = meta[23] + (size_t)b * qs[0] + (size_t)h * qs[1] + (size_t)i * qs[2];
  const size_t kb = meta[24] + (size_t)b * ks[0] + (size_t)h * ks[1];
  const size_t vb = meta[25] + (size_t)b * vs[0] + (size_t)h * vs[1];
  {load_q}
  float s[SK];
  float m = -INFINITY;
  for (int j = 0; j < SK; ++j) {{
    {dot}
    float x = {scaled("acc", scale)};
    {f"x = x + {_mask_term('i', select)};" if mask else ""}
    s[j] = x;
    m = x > m ? x : m;  // as softmax_rows: fmax is a call
  }}
  float sum = 0.0f;
  for (int j = 0; j < SK; ++j) {{ const float e = ONNXHAL_EXP(s[j] - m); s[j] = e; sum += e; }}
  const float inv = 1.0f / sum;
  float o[DV];
  for (int d = 0; d < DV; ++d) o[d] = 0.0f;
  for (int j = 0; j < SK; ++j) {{
    float p = s[j] * inv;
    {replace}
    const size_t vr = vb + (size_t)j * vs[2];
    for (int d = 0; d < DV; ++d) o[d] += p * V[vr + (size_t)d * vs[3]];
  }}
  const size_t ob = (size_t)b * os[0] + (size_t)h * os[1] + (size_t)i * os[2];
  for (int d = 0; d < DV; ++d) O[ob + (size_t)d * os[3]] = o[d];
}}
"""


def _blocked_source(keys, head, head_v, scaled, scale, mask, replace, q_op, k_op, w, select) -> str:
    """The vector form: ``ROWS`` query rows a work-item share each K and V load (head dims
    contiguous, read as ``float{w}``)."""
    halves = {16: "const float8 h8 = a[r].lo + a[r].hi; const float4 h4 = h8.lo + h8.hi;",
              8: "const float4 h4 = a[r].lo + a[r].hi;"}[w]
    mask_add = f"x = x + {_mask_term('row[r]', select)};" if mask else ""
    return f"""
#define SK {keys}
#define D {head}
#define DV {head_v}
#define W {w}
#define ROWS {ATTENTION_ROWS}
typedef float{w} __attribute__((aligned(4))) vecu;
__kernel void attention_rows(__global float* restrict O, __global const float* restrict Q,
                             __global const float* restrict KT, __global const float* restrict V,
                             __global const {_mask_type(select)}* restrict M, __constant int* meta, const int total) {{
  const int gid = get_global_id(0);
  if (gid >= total) return;
  const int Sq = meta[2], H = meta[1];
  const int nb = (Sq + ROWS - 1) / ROWS;
  const int i0 = (gid % nb) * ROWS, bh = gid / nb, h = bh % H, b = bh / H;
  __constant int* qs = meta + 3; __constant int* ks = meta + 7; __constant int* vs = meta + 11;
  __constant int* ms = meta + 15; __constant int* os = meta + 19;
  int row[ROWS];
  __global const float* qp[ROWS];
  for (int r = 0; r < ROWS; ++r) {{
    row[r] = min(i0 + r, Sq - 1);  // a short last block repeats the last row and stores it once
    qp[r] = Q + meta[23] + (size_t)b * qs[0] + (size_t)h * qs[1] + (size_t)row[r] * qs[2];
  }}
  const size_t kb = meta[24] + (size_t)b * ks[0] + (size_t)h * ks[1];
  const size_t vb = meta[25] + (size_t)b * vs[0] + (size_t)h * vs[1];
  float s[ROWS][SK];
  float m[ROWS];
  for (int r = 0; r < ROWS; ++r) m[r] = -INFINITY;
  for (int j = 0; j < SK; ++j) {{
    __global const float* kp = KT + kb + (size_t)j * ks[3];
    float{w} a[ROWS];
    for (int r = 0; r < ROWS; ++r) a[r] = (float{w})(0.0f);
    for (int c = 0; c < D / W; ++c) {{
      const float{w} kv = {scaled("*(__global const vecu*)(kp + c * W)", k_op)};
      for (int r = 0; r < ROWS; ++r) a[r] += {scaled("*(__global const vecu*)(qp[r] + c * W)", q_op)} * kv;
    }}
    for (int r = 0; r < ROWS; ++r) {{
      {halves} const float2 h2 = h4.lo + h4.hi;
      float x = {scaled("(h2.x + h2.y)", scale)};
      {mask_add}
      s[r][j] = x;
      m[r] = x > m[r] ? x : m[r];  // as softmax_rows: fmax is a call
    }}
  }}
  float inv[ROWS];
  for (int r = 0; r < ROWS; ++r) {{
    float sum = 0.0f;
    for (int j = 0; j < SK; ++j) {{ const float e = ONNXHAL_EXP(s[r][j] - m[r]); s[r][j] = e; sum += e; }}
    inv[r] = 1.0f / sum;
  }}
  float{w} o[ROWS][DV / W];
  for (int r = 0; r < ROWS; ++r)
    for (int c = 0; c < DV / W; ++c) o[r][c] = (float{w})(0.0f);
  for (int j = 0; j < SK; ++j) {{
    __global const float* vp = V + vb + (size_t)j * vs[2];
    float pr[ROWS];
    for (int r = 0; r < ROWS; ++r) {{ float p = s[r][j] * inv[r]; {replace} pr[r] = p; }}
    for (int c = 0; c < DV / W; ++c) {{
      const float{w} vv = *(__global const vecu*)(vp + c * W);
      for (int r = 0; r < ROWS; ++r) o[r][c] += pr[r] * vv;
    }}
  }}
  for (int r = 0; r < ROWS && i0 + r < Sq; ++r) {{
    __global float* op = O + (size_t)b * os[0] + (size_t)h * os[1] + (size_t)(i0 + r) * os[2];
    for (int c = 0; c < DV / W; ++c) *(__global vecu*)(op + c * W) = o[r][c];
  }}
}}
"""


class AttentionLowering:
    """The ``attention`` rule's matcher and lowering, methods of ``PartitionPlanBuilder``."""

    graph: Graph
    lookup: GraphLookup
    plan: PartitionPlan
    #: rule qkv_projection: result value -> (the group's first result, its first column), and
    #: first result -> the group's width (the merged buffer's row length)
    projection_parts: dict[str, tuple[str, int]]
    projection_width: dict[str, int]

    def _scalar_const(self, n: Node, value: str) -> tuple[str, float] | None:
        """(op, factor) when ``n`` multiplies or divides ``value`` by a float32 scalar constant."""
        if n.domain or n.op_type not in ("Mul", "Div") or len(n.inputs) != 2:
            return None
        other = n.inputs[1] if n.inputs[0] == value else n.inputs[0] if n.op_type == "Mul" else None
        if other is None or other == value:
            return None
        c = self.lookup.const(other)
        if c is None or c.size != 1 or c.dtype != np.float32:
            return None
        return ("*" if n.op_type == "Mul" else "/"), float(c.reshape(-1)[0])

    def match_attention(self, softmax: Node, sole_user) -> AttentionMatch | None:
        """The attention pattern around ``softmax`` (module docstring), or None."""
        if softmax.domain or len(self.shape(softmax.inputs[0])) not in (3, 4):
            return None
        rank = len(self.shape(softmax.inputs[0]))
        opset = self.graph.opset_version("") or 13
        axis = softmax.attr("axis", -1 if opset >= 13 else 1) % rank
        if axis != rank - 1:
            return None
        members = [softmax]
        x = softmax.inputs[0]
        mask, mask_select, mask_expands = None, None, None
        step = self.graph.producer(x)
        if step is not None and step.op_type == "Add" and not step.domain and sole_user(x) is softmax:
            a, b = step.inputs
            inner = None
            for mine, other in ((a, b), (b, a)):
                p = self.graph.producer(mine)
                if p is not None and p.op_type in ("MatMul", "Mul", "Div") and sole_user(mine) is step:
                    inner, mask = mine, other
                    break
            if inner is None or np.dtype(self.lookup.dtype(mask) or np.float32) != np.float32:
                return None
            where = self._select_mask(mask, step, sole_user) if self.rule("attention_select_mask") else None
            if where is not None:
                members.insert(0, where)
                mask, mask_select = where.inputs[0], self._select_values(where)
                expand = self.graph.producer(mask)
                if (expand is not None and expand.op_type == "Expand" and not expand.domain
                        and self.shape(expand.inputs[0]) is not None):
                    # the attention reads the Expand's input with broadcast strides of the scores: a
                    # broadcast of a broadcast is one
                    mask, mask_expands = expand.inputs[0], [expand]
            mshape = self.shape(self.data(mask))
            if len(mshape) > rank or np.broadcast_shapes(mshape, self.shape(x)) != self.shape(x):
                return None
            members.insert(0, step)
            x, step = inner, self.graph.producer(inner)
        score_op, score_factor = None, 1.0
        if step is not None and step.op_type in ("Mul", "Div") and sole_user(x) is members[0]:
            for cand in step.inputs:
                sc = self._scalar_const(step, cand)
                p = self.graph.producer(cand)
                if sc is not None and p is not None and p.op_type == "MatMul":
                    score_op, score_factor = sc
                    members.insert(0, step)
                    x, step = cand, p
                    break
        if step is None or step.op_type != "MatMul" or step.domain or sole_user(x) is not members[0]:
            return None
        qk = step
        members.insert(0, qk)
        q = self._attention_operand(qk.inputs[0], qk, sole_user, members, scalable=True)
        kt = self._attention_operand(qk.inputs[1], qk, sole_user, members, scalable=True)
        # after the softmax: [ReplaceNaN] then P @ V
        tail = sole_user(softmax.outputs[0])
        replace_nan = None
        last = softmax
        if tail is not None and tail.op_type == "ReplaceNaN" and tail.domain == FUSED_DOMAIN:
            replace_nan = float(tail.attr("value", 0.0))
            members.append(tail)
            last, tail = tail, sole_user(tail.outputs[0])
        if (tail is None or tail.op_type != "MatMul" or tail.domain or tail.inputs[0] != last.outputs[0]
                or q is None or kt is None):
            return None
        pv = tail
        v = self._attention_operand(pv.inputs[1], pv, sole_user, members, scalable=False)
        if v is None:
            return None
        members.append(pv)
        B, H, Sq, D = q.dims
        if kt.dims[:3] != (B, H, D) or v.dims[:2] != (B, H) or v.dims[2] != kt.dims[3]:
            return None
        Sk, Dv = kt.dims[3], v.dims[3]
        if Sk > MAX_KEYS or max(D, Dv) > MAX_HEAD or min(B, H, Sq, Sk, D, Dv) == 0:
            return None
        out = pv.outputs[0]
        out_dims, out_strides = _pad4(self.shape(out), contiguous_strides(self.shape(out)))
        after = sole_user(out)
        view = None
        if (after is not None and after.op_type in VIEW_OPS and not after.domain
                and self.shape(after.outputs[0]) == self.shape(out)):  # an identity Reshape (TorchScript's)
            view, after = after, sole_user(after.outputs[0])
        if after is not None and after.op_type == "Transpose" and not after.domain:
            perm = list(after.attr("perm") or range(rank)[::-1])
            if perm[-1] == rank - 1:
                _, out_strides = _pad4(self.shape(out), transpose_output_strides(self.shape(after.outputs[0]), perm))
                members.extend(m for m in (view, after) if m is not None)
                out = after.outputs[0]
        parts = (self.graph.producer(m.inputs[0]) for m in members if m.op_type == "Reshape")
        splits = list({id(n): n for n in parts if n is not None and n.op_type == "Split"}.values())
        return AttentionMatch(members, q, kt, v, score_op, score_factor, mask, replace_nan, out, out_strides, splits,
                              mask_select, mask_expands)

    def _select_mask(self, mask: str, add: Node, sole_user) -> Node | None:
        """Rule ``attention_select_mask``: the Where that computes ``mask`` when it selects between two
        float32 scalar constants by a bool condition of the mask's shape and the mask Add is its only
        reader (TorchScript exports' per-layer ``Where(mask, 0, min)``), else None."""
        where = self.graph.producer(mask)
        if (where is None or where.op_type != "Where" or where.domain or len(where.inputs) != 3
                or sole_user(mask) is not add):
            return None
        cond = where.inputs[0]
        if (np.dtype(self.lookup.dtype(cond) or np.float32) != np.bool_
                or self.shape(cond) != self.shape(mask) or self._select_values(where) is None):
            return None
        return where

    def _select_values(self, where: Node) -> tuple[float, float] | None:
        """The (then, else) float32 scalar constants of ``where``, or None."""
        values = [self.lookup.const(v) for v in where.inputs[1:]]
        if any(c is None or c.size != 1 or c.dtype != np.float32 for c in values):
            return None
        return float(values[0].reshape(-1)[0]), float(values[1].reshape(-1)[0])

    def _attention_operand(self, value: str, user: Node, sole_user, members: list[Node],
                           scalable: bool) -> StridedOperand | None:
        """How ``user`` reads ``value`` in place: through an optional scalar Mul/Div (Q and K^T
        only) and an optional Transpose, each read only by the next step."""
        op, factor, folded = None, 1.0, []
        producer = self.graph.producer(value)
        if scalable and producer is not None and sole_user(value) is user:
            for cand in producer.inputs:
                sc = self._scalar_const(producer, cand)
                if sc is not None:
                    op, factor = sc
                    folded.append(producer)
                    value, user = cand, producer
                    producer = self.graph.producer(value)
                    break
        if producer is not None and producer.op_type == "Transpose" and not producer.domain and sole_user(value) is user:
            src = producer.inputs[0]
            xs = self.shape(src)
            perm = list(producer.attr("perm") or range(len(xs))[::-1])
            st = contiguous_strides(xs)
            offset = 0
            part = self._split_part(src, producer, sole_user) or self._projection_part(src, producer, sole_user)
            if part is not None:  # a head split of one part of a Split (GPT-2's fused QKV): read in place
                view, value_src, offset, st = part
                folded.append(view)
                src = value_src
            dims, strides = tuple(xs[p] for p in perm), [st[p] for p in perm]
            folded.append(producer)
            value = src
        elif (chain := self._view_chain(value, user, sole_user) if self.rule("attention_view_chain") else None):
            nodes, value, offset, dims, strides = chain
            folded.extend(nodes)
        else:
            dims = self.shape(value)
            strides = contiguous_strides(dims)
            offset = 0
        if len(dims) not in (3, 4) or np.dtype(self.lookup.dtype(value) or np.float32) != np.float32:
            return None
        members[:0] = folded[::-1]
        dims, strides = _pad4(dims, strides)
        return StridedOperand(self.data(value), dims, strides, op, factor, offset)

    def _view_chain(self, value: str, user: Node, sole_user) -> tuple[list[Node], str, int, tuple, list[int]] | None:
        """Rule ``attention_view_chain``: ``value`` made by Reshapes and Transposes (at least one
        Transpose, each result read only by the next step) of a value laid out in memory as a
        contiguous value, a part of a Split or a part of a merged projection (``qkv_projection``),
        where every Reshape keeps the layout a strided view (as numpy's reshape without a copy): (the
        chain's nodes from ``user`` back, the buffer value, offset, ``value``'s dims and element
        strides in it), else None. Dynamo exports transpose K's head split, reshape it to 3-D and
        transpose it again for a 3-D batched MatMul."""
        chain: list[Node] = []
        while True:
            p = self.graph.producer(value)
            if p is None or p.domain or p.op_type not in ("Reshape", "Transpose") or sole_user(value) is not user:
                break
            chain.append(p)
            user, value = p, p.inputs[0]
        if not any(n.op_type == "Transpose" for n in chain):
            return None
        src = self.graph.producer(value)
        if value in self.projection_parts and sole_user(value) is user:
            first, offset = self.projection_parts[value]
            ys = self.shape(value)
            width = self.projection_width[first]
            buf, strides = self.merged_buffer(first), [s * width for s in contiguous_strides(ys[:-1])] + [1]
        elif src is not None and src.op_type == "Split" and not src.domain and sole_user(value) is user:
            buf = src.inputs[0]
            xs = self.shape(buf)
            axis = src.attr("axis", 0) % len(xs)
            k = list(src.outputs).index(value)
            stx = contiguous_strides(xs)
            offset = sum(self.shape(o)[axis] for o in src.outputs[:k] if o) * stx[axis]
            strides = stx
        else:
            buf, offset, strides = self.data(value), 0, contiguous_strides(self.shape(value))
        axes: list[Axis] | None = strided_axes(self.shape(value), strides)
        for n in reversed(chain):
            if n.op_type == "Transpose":
                perm = list(n.attr("perm") or range(len(axes))[::-1])
                axes = [axes[p] for p in perm]
            else:
                axes = reshape_axes(axes, self.shape(n.outputs[0]))
                if axes is None:
                    return None
        out_strides = axes_strides(axes)
        if out_strides is None or 0 in self.shape(value):
            return None
        return chain, buf, offset, tuple(self.shape(chain[0].outputs[0])), out_strides

    def _split_part(self, value: str, user: Node, sole_user) -> tuple[Node, str, int, list[int]] | None:
        """(the Reshape, the Split's input, offset, strides of ``value``'s dims in it) when ``value``
        is a Reshape, read only by ``user``, that splits the last dim of one part of a Split (of a
        value of static shape, contiguous)."""
        view = self.graph.producer(value)
        if view is None or view.op_type != "Reshape" or view.domain or sole_user(value) is not user:
            return None
        part = view.inputs[0]
        split = self.graph.producer(part)
        if split is None or split.op_type != "Split" or split.domain or sole_user(part) is not view:
            return None
        x = split.inputs[0]
        xs, ys, rs = self.shape(x), self.shape(part), self.shape(value)
        lead = len(ys) - 1
        if not ys or tuple(rs[:lead]) != tuple(ys[:lead]) or prod(rs[lead:]) != ys[-1]:
            return None
        axis = split.attr("axis", 0) % len(xs)
        k = list(split.outputs).index(part)
        start = sum(self.shape(o)[axis] for o in split.outputs[:k] if o)
        stx = contiguous_strides(xs)
        strides = list(stx[:lead]) + [s * stx[-1] for s in contiguous_strides(rs[lead:])]
        return view, x, start * stx[axis], strides

    # -- rule qkv_projection -------------------------------------------------------------
    def find_projections(self, nodes: list[Node], sole_user, outputs: set[str]) -> dict[int, list[Node]]:
        """Rule ``qkv_projection``: MatMuls of one input by constant 2-D weights (FusedMatMul with a
        constant bias and no activation, or a plain MatMul), each result read only by a Reshape that
        splits its last dim and is read only by a Transpose (attention's head split), grouped by
        input: id(first) -> the group, for groups of two or more. Each group becomes one GEMM by the
        concatenated weights; attention reads the parts in place (``_projection_part``)."""
        groups: dict[str, list[Node]] = {}
        for n in nodes:
            if n.op_type not in ("MatMul", "FusedMatMul") or (n.domain or "") != (FUSED_DOMAIN if n.op_type[0] == "F" else ""):
                continue
            if n.op_type == "FusedMatMul" and (n.attr("activation", "") or any(n.attr(a) not in (None, d) for a, d in (
                    ("alpha", 1.0), ("transA", 0), ("transB", 0)))):
                continue
            w = self.lookup.const(n.inputs[1])
            bias = n.inputs[2] if len(n.inputs) > 2 and n.inputs[2] else None
            b = self.lookup.const(bias) if bias else None
            out = n.outputs[0]
            if (w is None or w.ndim != 2 or w.dtype != np.float32 or (bias and (b is None or b.dtype != np.float32
                    or b.size != w.shape[1])) or out in outputs or self.shape(out)[-1:] != (w.shape[1],)):
                continue
            view = sole_user(out)
            if view is None or view.op_type != "Reshape" or view.domain:
                continue
            head = sole_user(view.outputs[0])
            ys, rs = self.shape(out), self.shape(view.outputs[0])
            lead = len(ys) - 1
            if (head is None or head.op_type != "Transpose" or tuple(rs[:lead]) != tuple(ys[:lead])
                    or prod(rs[lead:]) != ys[-1]):
                continue
            groups.setdefault(n.inputs[0], []).append(n)
        found = {}
        for group in groups.values():
            if len(group) >= 2 and len({self.lookup.const(n.inputs[1]).shape[0] for n in group}) == 1:
                found[id(group[0])] = group
                start = 0
                for n in group:
                    self.projection_parts[n.outputs[0]] = (group[0].outputs[0], start)
                    start += self.shape(n.outputs[0])[-1]
                self.projection_width[group[0].outputs[0]] = start
                buf = self.merged_buffer(group[0].outputs[0])
                rows = prod(self.shape(group[0].outputs[0])[:-1])
                self.plan.temps[buf] = rows * start * 4
                self.plan.shapes[buf] = (rows, start)
                self.plan.dtypes[buf] = np.dtype(np.float32)
        return found

    def _projection_part(self, value: str, user: Node, sole_user) -> tuple[Node, str, int, list[int]] | None:
        """As ``_split_part``, for a head split of one result of a merged projection group: (the
        Reshape, the merged buffer, offset, strides of ``value``'s dims in it)."""
        view = self.graph.producer(value)
        if view is None or view.op_type != "Reshape" or sole_user(value) is not user:
            return None
        part = view.inputs[0]
        if part not in self.projection_parts:
            return None
        first, start = self.projection_parts[part]
        width = self.projection_width[first]
        ys, rs = self.shape(part), self.shape(value)
        lead = len(ys) - 1
        strides = [s * width for s in contiguous_strides(ys[:lead])] + contiguous_strides(rs[lead:])
        return view, self.merged_buffer(first), start, strides

    def drop_projections(self, group: list[Node]) -> None:
        """Undo ``find_projections`` for a group none of whose parts attention reads in place: its
        GEMMs lower one by one (merged, each part would need a copy out)."""
        buf = self.merged_buffer(group[0].outputs[0])
        for table in (self.plan.temps, self.plan.shapes, self.plan.dtypes):
            table.pop(buf, None)
        for n in group:
            self.projection_parts.pop(n.outputs[0], None)

    def merged_buffer(self, first: str) -> str:
        """The workspace the merged projection whose first result is ``first`` writes."""
        return f"::qkv:{first}"

    def lower_projections(self, group: list[Node], skip: set[int]) -> None:
        """One GEMM for the group, into its merged buffer; a part whose head split attention did
        not take is copied out to its own value."""
        a = self.data(group[0].inputs[0])
        K = self.shape(a)[-1]
        M = prod(self.shape(a)[:-1])
        weights = [self.lookup.const(n.inputs[1]) for n in group]
        biases = [self.lookup.const(n.inputs[2]) if len(n.inputs) > 2 and n.inputs[2] else np.zeros(w.shape[1], np.float32)
                  for n, w in zip(group, weights)]
        width = sum(w.shape[1] for w in weights)
        w_name = self.constant("qkv_w", np.concatenate(weights, axis=1).astype(np.float32))
        b_name = self.constant("qkv_b", np.concatenate([b.reshape(-1) for b in biases]).astype(np.float32))
        for name in (w_name, b_name):
            self.plan.shapes[name] = self.plan.constants[name].shape
            self.plan.dtypes[name] = np.dtype(np.float32)
        out = self.merged_buffer(group[0].outputs[0])  # declared by find_projections
        ap, a_rm = self._a_operand(a, M, K, K, 1, 1, 0)
        bp = self._packed_b(w_name, K, width, width, 1, 1, 0)
        self._gemm(ap, bp, out, M, width, K, 1, 1, 0, b_name, 1, 0, 1.0, 1.0, Epilogue(out), a_rm)
        start = 0
        for n in group:
            N = self.shape(n.outputs[0])[-1]
            view = self._consumers[n.outputs[0]][0]
            if id(view) not in skip:  # its head split is not read in place: the part gets its own copy
                self._strided_copy(self.output(n.outputs[0]), out, (M, N), [width, 1], [N, 1], start, 0)
            start += N

    def lower_attention(self, m: AttentionMatch) -> None:
        B, H, Sq, D = m.q.dims
        Sk, Dv = m.kt.dims[3], m.v.dims[3]
        scores = (B, H, Sq, Sk)
        if m.mask is not None:
            mask = self.data(m.mask)
            fi = broadcast_strides(self.shape(mask), scores)
            mstrides = (list(contiguous_strides(scores)) if fi.mode == "same" else [0, 0, 0, 0] if fi.mode == "scalar"
                        else list(fi.strides))
            mstrides = [0] * (4 - len(mstrides)) + mstrides
        else:
            mask, mstrides = m.q.name, [0, 0, 0, 0]
        meta = np.array([B, H, Sq, *m.q.strides, *m.kt.strides, *m.v.strides, *mstrides, *m.out_strides,
                         m.q.offset, m.kt.offset, m.v.offset], dtype=np.int32)
        meta_name = self.constant("attnmeta", meta)
        unit = m.q.strides[3] == m.kt.strides[2] == m.v.strides[3] == m.out_strides[3] == 1
        width = next((w for w in (16, 8) if unit and D % w == 0 and Dv % w == 0), 1)
        source = attention_source(Sk, D, Dv, (m.score_op, m.score_factor), m.mask is not None, m.replace_nan,
                                  (m.q.op, m.q.factor), (m.kt.op, m.kt.factor), width, m.mask_select)
        out = self.output(m.out)
        args = [Buf(out), Buf(m.q.name), Buf(m.kt.name), Buf(m.v.name), Buf(mask), Buf(meta_name)]
        total = B * H * Sq if width == 1 else B * H * -(-Sq // ATTENTION_ROWS)
        if width == 1:
            self.plan.add_launch_1d(source, "attention_rows", total, args)
        else:  # explicit vectors: one row a work-item, work-groups of one on a CPU (as the GEMM family)
            self.plan.steps.append(Launch(source, "attention_rows", (total, 1), (1, 1), [*args, np.int32(total)]))
