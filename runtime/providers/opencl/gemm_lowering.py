"""Lowering of the GEMM family (Gemm, MatMul, Conv and the optimizer's Fused* forms) to launches.

A mixin of ``PartitionPlanBuilder``: it uses the builder's ``plan``, ``data``, ``shape``, ``output`` and
``temp``. Operand B is always packed into 16-column panels (per run, or once at ``create_state``
for constant weights); operand A is read in place when it is a row-major activation, else packed
into 8-row panels. Conv with constant weights and output rows that fill 16-wide panels (or rows of
7 or 8, two a vector: rule ``conv_row_pairs``) is an implicit GEMM reading B from the input in
place (rule ``conv_pad``: ``conv_unpadded_*``, padding as bounds checks; without it
``pad_planes`` + ``conv_implicit_*``), no im2col workspace; other Convs are im2col (written straight
into B's panel layout) + the same GEMM, batched over images x groups; groups of fewer than 4 output
channels (depthwise) use a direct kernel.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from onnxhal.hal.errors import NotImplemented as OrtNotImplemented
from onnxhal.hal.graph import Node
from onnxhal.runtime.providers import op_geometry
from onnxhal.runtime.providers.opencl import kernel_sources as ks
from onnxhal.runtime.providers.opencl.op_support import FUSED_DOMAIN, fused_activation_spec
from onnxhal.runtime.providers.opencl.partition_plan import Buf, Launch, PartitionPlan

RM, RN = ks.GEMM_RM, ks.GEMM_RN
I32, F = np.int32, np.float32


@dataclass
class Epilogue:
    """What a GEMM/Conv kernel does after the dot products: write ``out``, adding ``bias`` (a
    per-column vector) and ``residual`` (a value of the output's shape), then activation ``act``
    with parameters ``p0``, ``p1``."""

    out: str
    act: int = 0
    p0: float = 0.0
    p1: float = 0.0
    residual: str | None = None
    bias: str | None = None  # a per-column bias folded from a following Add (MatMul/Gemm only)
    source: str | None = None  # the GEMM program with a generated epilogue (act EPILOGUE_EXPR_CODE)

    @property
    def code(self) -> int:
        return self.act + (16 if self.residual else 0)


def prod(shape) -> int:
    """Number of elements of a shape (1 for a scalar)."""
    return int(math.prod(shape))


def contiguous_strides(shape) -> list[int]:
    """Row-major element strides of a shape."""
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return list(reversed(out))


def collapse_batch(dims, strides) -> int | None:
    """The stride of the flattened index over ``dims`` when element (i0, i1, ...) sits at
    flat_index * stride (size-1 dims ignored), else None. 0 when every dim has size 1."""
    stride = expect = None
    for d, s in reversed(list(zip(dims, strides))):
        if d == 1:
            continue
        if stride is None:
            stride = s
        elif s != expect:
            return None
        expect = s * d
    return stride or 0


def transposed_view(in_shape, perm) -> tuple[tuple[int, ...], list[int]]:
    """(dims, element strides) of Transpose(perm) of a contiguous tensor, read in place."""
    st = contiguous_strides(in_shape)
    return tuple(in_shape[p] for p in perm), [st[p] for p in perm]


def transpose_output_strides(out_shape, perm) -> list[int]:
    """Element strides, inside the contiguous Transpose(perm) output, of the Transpose's input dims:
    where a producer must write so that the Transpose needs no copy."""
    st = contiguous_strides(out_shape)
    inverse = {p: k for k, p in enumerate(perm)}
    return [st[inverse[d]] for d in range(len(perm))]


def _reads(step, name: str) -> bool:
    """Whether plan step ``step`` (a Launch or a CopyStep) uses buffer ``name``."""
    if isinstance(step, Launch):
        return any(isinstance(a, Buf) and a.name == name for a in step.args)
    return name in (getattr(step, "src", None), getattr(step, "dst", None))


def _padded_reader(step, x: str, H: int, W: int, inputs: bool) -> str | None:
    """How a reader of ``x`` (H x W planes) can read it from a Conv's zero-padded planes instead
    (``pads_into_producers``): "residual" (a conv_lanes launch reading it as arg 4 only),
    "input" (``inputs``: a conv_lanes launch reading it as its input, arg 1 only, as a 1x1 Conv over
    the unpadded planes), else None."""
    if not (isinstance(step, Launch) and step.kernel_name.startswith("conv_lanes_r")):
        return None
    at = [k for k, a in enumerate(step.args) if isinstance(a, Buf) and a.name == x]
    if at == [4]:
        return "residual"
    # Args 9, 10 are KH, KW; 14, 15 the planes' height and row length (those of x: read in place).
    if inputs and at == [1] and [int(a) for a in step.args[9:11]] == [1, 1] and [
            int(a) for a in step.args[14:16]] == [H, W]:
        return "input"
    return None


class GemmLowering:
    """GEMM-family lowering methods of ``PartitionPlanBuilder``.

    ``operand_views`` maps a value to (buffer value, dims, strides) when it is read in place through
    strides (a Transpose folded into the MatMul reading it); ``output_views`` maps id(MatMul) to
    (value written, row stride, batch stride) when a Transpose of its result is folded into its stores.
    """

    plan: PartitionPlan
    operand_views: dict[str, tuple[str, tuple[int, ...], list[int]]]
    output_views: dict[int, tuple[str, int, int]]
    #: Rule conv_lanes_padded_output: a value written by a conv_lanes launch -> that launch,
    #: whose output layout a padded conv_lanes Conv reading the value may still redirect.
    lanes_outputs: dict[str, Launch]
    #: Rule pool_padded_output: the same for a value written by a pool_rows MaxPool launch.
    pool_outputs: dict[str, Launch]
    _consumers: dict[str, list[Node]]
    #: Rule conv_siblings: Convs (ids) lowered in an earlier Conv's launch; the builder's epilogues,
    #: node positions and skipped nodes (ids) it reads
    merged_convs: set[int]
    node_epilogues: dict[int, Epilogue]
    node_positions: dict[int, int]
    skipped_nodes: set[int]

    def _operand(self, name: str) -> tuple[str, tuple[int, ...], list[int]]:
        if name in self.operand_views:
            return self.operand_views[name]
        buf = self.data(name)
        shape = self.shape(buf)
        return buf, shape, contiguous_strides(shape)

    def _prepacked_name(self, stem: str, elements: int) -> str:
        """A fresh name for a prepacked weight buffer (packed once, at create_state)."""
        if elements >= 2**31 - 1:
            raise OrtNotImplemented(f"OpenCL EP: a {elements}-element {stem} weight exceeds 32-bit indexing")
        return self._fresh(stem)

    def _packed_a(self, src: str, M: int, K: int, rs: int, cs: int, batches: int, bstride: int) -> str:
        return self._packed("a", RM, src, M, K, rs, cs, batches, bstride)

    def _packed_b(self, src: str, K: int, N: int, rs: int, cs: int, batches: int, bstride: int) -> str:
        return self._packed("b", RN, src, N, K, rs, cs, batches, bstride)

    def _packed(self, side: str, tile: int, src: str, rows: int, K: int, rs: int, cs: int, batches: int,
                bstride: int) -> str:
        """``src`` packed for the GEMM kernel (``pack_a``: M x K rows in RM tiles, ``pack_b``: N x K
        columns in RN tiles). Constant weights are packed once, at create_state."""
        blocks = -(-rows // tile)
        total = batches * blocks * K * tile
        work = batches * blocks * K
        kernel = f"pack_{side}"
        args = [np.int32(rows), np.int32(K), np.int32(blocks), np.int32(rs), np.int32(cs), np.int32(bstride)]
        if src in self.plan.constants:
            name = self._prepacked_name(f"packed_{side}", total)
            self.plan.prepacked[name] = total * 4
            self.plan.add_launch_1d(ks.GEMM_SOURCE, kernel, work, [Buf(name), Buf(src), *args], init=True)
            return name
        name = self.temp(f"packed_{side}", total * 4)
        self.plan.add_launch_1d(ks.GEMM_SOURCE, kernel, work, [Buf(name), Buf(src), *args])
        return name

    def _gemm(self, ap: str, bp: str, out: str, M: int, N: int, K: int, batches: int, a_mod: int,
              c_bstride: int, bias: str | None, bias_mode: int, bias_bstride: int, alpha: float, beta: float,
              epi: Epilogue, a_rowmajor: tuple[int, int] | None = None, ldc: int | None = None) -> None:
        """C = GEMM of packed B with A: packed (``ap`` from ``_packed_a``) or, when ``a_rowmajor`` =
        (batch stride, row stride) is given, ``ap`` is A itself read in place. C rows are ``ldc``
        (default N) apart."""
        if M == 0 or N == 0:
            return  # an empty output: nothing to compute
        Mb, Nb = -(-M // RM), -(-N // RN)
        bias_buf = Buf(bias) if bias else Buf(ap)  # any valid buffer when unused
        args = [Buf(ap), Buf(bp), Buf(out), bias_buf, Buf(epi.residual or ap), I32(M), I32(N), I32(K), I32(a_mod),
                I32(c_bstride), I32(bias_bstride), I32(bias_mode if bias else 0), F(alpha), F(beta), I32(epi.code),
                F(epi.p0), F(epi.p1), I32(N if ldc is None else ldc)]
        kernel = "gemm_packed"
        if a_rowmajor is not None:
            kernel = "gemm_rowmajor_a"
            args += [I32(a_rowmajor[0]), I32(a_rowmajor[1])]
        jt_max = ks.GEMM_JT
        # Rule gemm_wide_tile: two 16-column panels a work-item where at most one panel in 9 is the
        # recomputed copy that an odd count leaves (two or more panels; an odd count of at least 9),
        # and the launch keeps enough work-items for the device's threads.
        if (self.rule("gemm_wide_tile") and Nb >= 2 and (Nb % 2 == 0 or Nb >= 9)
                and Mb * -(-Nb // 2) * batches >= ks.WIDE_TILE_MIN_ITEMS):
            kernel += "_x2"
            Nb, jt_max = -(-Nb // 2), ks.GEMM_JT_X2
        jt = min(jt_max, Nb)
        groups = -(-Nb // jt)
        self.plan.steps.append(Launch(epi.source or ks.GEMM_SOURCE, kernel, (groups * jt * Mb, batches), (1, 1), args))

    def _a_operand(self, a: str, M: int, K: int, rs: int, cs: int, batches: int, bstride: int
                   ) -> tuple[str, tuple[int, int] | None]:
        """(buffer, (batch stride, row stride) or None): activations with unit column stride are read
        in place, weights and other layouts are packed."""
        if a not in self.plan.constants and cs == 1:
            return a, (bstride, rs)
        return self._packed_a(a, M, K, rs, cs, batches, bstride), None

    def _lower_Gemm(self, n: Node, epi: Epilogue) -> None:
        a, b = self.data(n.inputs[0]), self.data(n.inputs[1])
        (a0, a1), (b0, b1) = self.shape(a), self.shape(b)
        ta, tb = n.attr("transA", 0), n.attr("transB", 0)
        M, K = (a1, a0) if ta else (a0, a1)
        N = b0 if tb else b1
        ap, a_rm = self._a_operand(a, M, K, 1 if ta else K, M if ta else 1, 1, 0)
        bp = self._packed_b(b, K, N, 1 if tb else N, K if tb else 1, 1, 0)
        bias, mode, beta = None, 0, n.attr("beta", 1.0)
        if epi.bias:  # a following Add folded in (this Gemm has no C): added as is
            bias, mode, beta = self.data(epi.bias), 1, 1.0
        elif len(n.inputs) > 2 and n.inputs[2]:
            bias = self.data(n.inputs[2])
            cs = self.shape(bias)
            if prod(cs) == 1:
                mode = 4
            elif prod(cs) == M * N and (len(cs) == 2 and cs == (M, N)):
                mode = 3
            elif cs[-1] == N and prod(cs) == N:
                mode = 1
            else:
                mode = 2
        out = self.output(epi.out)
        self._gemm(ap, bp, out, M, N, K, 1, 1, 0, bias, mode, 0, n.attr("alpha", 1.0), beta, epi, a_rm)

    _lower_FusedGemm = _lower_Gemm

    def _lower_MatMul(self, n: Node, epi: Epilogue) -> None:
        a, sa, ast = self._operand(n.inputs[0])
        b, sb, bst = self._operand(n.inputs[1])
        K, N = sb[-2], sb[-1]
        bias_name = n.inputs[2] if len(n.inputs) > 2 and n.inputs[2] else epi.bias  # FusedMatMul's, or folded
        bias = self.data(bias_name) if bias_name else None
        mode = 0 if bias is None else 4 if prod(self.shape(bias)) == 1 else 1
        if len(sb) == 2:  # batch dims of A fold into M (A is never a strided view here)
            out = self.output(epi.out)
            M = prod(sa[:-1])
            ap, a_rm = self._a_operand(a, M, K, K, 1, 1, 0)
            bp = self._packed_b(b, K, N, bst[0], bst[1], 1, 0)
            return self._gemm(ap, bp, out, M, N, K, 1, 1, 0, bias, mode, 0, 1.0, 1.0, epi, a_rm)
        batches = prod(sb[:-2])
        M = sa[-2]
        a_batches = 1 if len(sa) == 2 else batches
        a_bstride = collapse_batch(sa[:-2], ast[:-2]) if len(sa) > 2 else 0
        ap, a_rm = self._a_operand(a, M, K, ast[-2], ast[-1], a_batches, a_bstride)
        bp = self._packed_b(b, K, N, bst[-2], bst[-1], batches, collapse_batch(sb[:-2], bst[:-2]))
        folded = self.output_views.get(id(n))
        if folded is not None:  # the Transpose after this MatMul: write its output directly
            target, ldc, c_bstride = folded
            self._gemm(ap, bp, self.output(target), M, N, K, batches, a_batches, c_bstride, bias, mode, 0, 1.0,
                       1.0, Epilogue(target), a_rm, ldc)
            return
        self._gemm(ap, bp, self.output(epi.out), M, N, K, batches, a_batches, M * N, bias, mode, 0, 1.0, 1.0, epi,
                   a_rm)

    _lower_FusedMatMul = _lower_MatMul

    def _conv_geometry(self, n: Node, x_shape, w_shape, y_shape) -> dict:
        spatial = len(x_shape) - 2
        k = list(w_shape[2:]) or [1]
        strides = list(n.attr("strides", [1] * spatial))
        dil = list(n.attr("dilations", [1] * spatial))
        pads = list(n.attr("pads", [0] * (2 * spatial)))
        auto = n.attr("auto_pad", "NOTSET")
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            pads = [0] * (2 * spatial)
            for d in range(spatial):
                total = max(0, (y_shape[2 + d] - 1) * strides[d] + (k[d] - 1) * dil[d] + 1 - x_shape[2 + d])
                pads[d] = total // 2 if auto == "SAME_UPPER" else total - total // 2
                pads[d + spatial] = total - pads[d]
        elif auto == "VALID":
            pads = [0] * (2 * spatial)
        if spatial == 1:  # 1-D runs as 2-D with H = 1
            return dict(H=1, W=x_shape[2], KH=1, KW=k[0], OH=1, OW=y_shape[2], sh=1, sw=strides[0], ph=0,
                        pw=pads[0], dh=1, dw=dil[0], ph_end=0, pw_end=pads[1])
        return dict(H=x_shape[2], W=x_shape[3], KH=k[0], KW=k[1], OH=y_shape[2], OW=y_shape[3], sh=strides[0],
                    sw=strides[1], ph=pads[0], pw=pads[1], dh=dil[0], dw=dil[1], ph_end=pads[2], pw_end=pads[3])

    def _lower_Conv(self, n: Node, epi: Epilogue) -> None:
        x, w = self.data(n.inputs[0]), self.data(n.inputs[1])
        xs, ws = self.shape(x), self.shape(w)
        ys = self.shape(n.outputs[0])
        out = self.output(epi.out)
        g = self._conv_geometry(n, xs, ws, ys)
        if w in self.plan.constants and self.rule("conv_dead_taps"):
            w, ws = self._live_taps(w, xs, ws, g)
        G = int(n.attr("group", 1))
        Nimg, Cin, Cout = xs[0], xs[1], ws[0]
        Cg, Mg = Cin // G, Cout // G
        bias = self.data(n.inputs[2]) if len(n.inputs) > 2 and n.inputs[2] else None
        geo = [I32(g[k]) for k in ("H", "W")]
        if Mg < 4:  # thin groups (depthwise): direct convolution
            self.plan.add_launch_1d(ks.CONV_SOURCE, "conv_direct", prod(ys), [
                Buf(out), Buf(x), Buf(w), Buf(bias or w), I32(1 if bias else 0), Buf(epi.residual or w),
                I32(epi.code), F(epi.p0), F(epi.p1), I32(Cin), *geo, I32(Cout),
                I32(Cg), I32(Mg), *(I32(g[k]) for k in ("KH", "KW", "OH", "OW", "sh", "sw", "ph", "pw", "dh", "dw"))])
            return
        if (self._conv_lanes(x, w, xs, ws, g, G, out, bias, epi)
                or self._conv_implicit(x, w, xs, ws, g, G, out, bias, epi)
                or self._conv_flat(x, w, xs, ws, g, G, out, bias, epi, n)):
            return
        Kdim = Cg * g["KH"] * g["KW"]
        P = g["OH"] * g["OW"]
        ap = self._packed_a(w, Mg, Kdim, Kdim, 1, G, Mg * Kdim)
        Nb = -(-P // RN)
        batches = Nimg * G
        total = batches * Nb * Kdim * RN
        bp = self.temp("im2col", total * 4)
        self.plan.add_launch_1d(ks.CONV_SOURCE, "im2col_packed", batches * Kdim, [
            Buf(bp), Buf(x), I32(Cin), *geo, I32(Cg),
            *(I32(g[k]) for k in ("KH", "KW", "OH", "OW", "sh", "sw", "ph", "pw", "dh", "dw")),
            I32(G), I32(Kdim), I32(Nb)])
        self._gemm(ap, bp, out, Mg, P, Kdim, batches, G, Mg * P, bias, 2, Mg, 1.0, 1.0, epi)

    _lower_FusedConv = _lower_Conv

    def _conv_a_panels(self, w: str, G: int, Mg: int, Cg: int, KH: int, KW: int) -> str:
        """The constant weight ``w`` as A panels in (kh, kw, ci) order, [G][Mb][K][RM], a new constant."""
        Mb = -(-Mg // RM)
        wt = np.asarray(self.plan.constants[w], np.float32).reshape(G, Mg, Cg, KH, KW)
        wt = wt.transpose(0, 1, 3, 4, 2).reshape(G, Mg, KH * KW * Cg)
        wt = np.pad(wt, ((0, 0), (0, Mb * RM - Mg), (0, 0))).reshape(G, Mb, RM, -1).transpose(0, 1, 3, 2)
        ap = self._prepacked_name("conv_a", wt.size)
        self.plan.constants[ap] = np.ascontiguousarray(wt)
        return ap

    def _sibling_taps(self, n: Node, g: dict, G: int) -> tuple[Node, Epilogue, np.ndarray] | None:
        """Rule conv_siblings: a later Conv of ``n``'s input (not yet lowered, constant weights, one group,
        no residual) with ``n``'s output plane and strides whose every tap reads where one of ``n``'s
        taps reads (a 1x1 downsample beside a 3x3 Conv of the same stride): that Conv, its epilogue and
        its weights placed in ``n``'s kernel grid (zeros elsewhere). None where there is none."""
        if G != 1 or not self.rule("conv_siblings"):
            return None
        xs, ys = self.shape(n.inputs[0]), self.shape(n.outputs[0])
        for s in self._consumers.get(n.inputs[0], []):
            if (s is n or s.inputs[0] != n.inputs[0] or id(s) in self.merged_convs or id(s) in self.skipped_nodes
                    or self.node_positions.get(id(s), -1) <= self.node_positions[id(n)]
                    or not (s.op_type == "Conv" and not s.domain or s.op_type == "FusedConv" and s.domain == FUSED_DOMAIN)
                    or int(s.attr("group", 1)) != 1 or len(s.inputs) > 3 and s.inputs[3]):
                continue
            wname = self.data(s.inputs[1])
            if wname not in self.plan.constants or self.shape(s.outputs[0])[2:] != ys[2:]:
                continue
            epi = self.node_epilogues.get(id(s)) or Epilogue(s.outputs[0], *fused_activation_spec(s))
            if epi.residual or epi.source or len(self.shape(wname)) != 4:
                continue
            ws = self.shape(wname)
            sg = self._conv_geometry(s, xs, ws, self.shape(s.outputs[0]))
            place = []  # per axis: n's tap index of each of s's taps
            for k, st, d, pb in (("KH", "sh", "dh", "ph"), ("KW", "sw", "dw", "pw")):
                if sg[st] != g[st]:
                    break
                taps = [(t * sg[d] - sg[pb] + g[pb]) for t in range(sg[k])]
                if any(u % g[d] or not 0 <= u // g[d] < g[k] for u in taps):
                    break
                place.append([u // g[d] for u in taps])
            if len(place) != 2:
                continue
            w = np.asarray(self.plan.constants[wname], np.float32)
            grid = np.zeros((ws[0], ws[1], g["KH"], g["KW"]), np.float32)
            grid[:, :, np.ix_(place[0], place[1])[0], np.ix_(place[0], place[1])[1]] = w
            return s, epi, grid
        return None

    def _conv_flat(self, x: str, w: str, xs, ws, g: dict, G: int, out: str, bias: str | None,
                   epi: Epilogue, n: Node | None = None) -> bool:
        """Rule conv_flat: ``conv_flat`` (16 consecutive positions of the flattened output plane a
        work-item, gathered) in place of im2col + GEMM, where the weights are constant and the Conv
        takes at most ``ks.CONV_FLAT_MAX_MACS`` multiply-adds (small planes, launch-bound: resnet_ts's
        4x4 stage). Rule conv_siblings: a later Conv of the same input that fits ``n``'s kernel grid
        (``_sibling_taps``) runs in the same launch, within the same bound for both. Returns False
        where it does not apply."""
        Nimg, Cin, Cout = xs[0], xs[1], ws[0]
        Cg, Mg = Cin // G, Cout // G
        KH, KW, OH, OW = g["KH"], g["KW"], g["OH"], g["OW"]
        per_channel = Nimg * Cg * KH * KW * OH * OW
        if not (self.rule("conv_flat") and w in self.plan.constants and Cout * per_channel <= ks.CONV_FLAT_MAX_MACS):
            return False
        sibling = self._sibling_taps(n, g, G) if n is not None else None
        if sibling is not None and (Cout + sibling[2].shape[0]) * per_channel > ks.CONV_FLAT_MAX_MACS:
            sibling = None
        ap = self._conv_a_panels(w, G, Mg, Cg, KH, KW)
        args = [Buf(ap), Buf(x), Buf(out), Buf(bias or ap), Buf(epi.residual or ap), I32(Mg), I32(OH), I32(OW),
                I32(Cg), I32(KH), I32(KW), *(I32(g[k]) for k in ("sh", "sw", "dh", "dw", "H", "W", "ph", "pw")),
                I32(G), I32(2 if bias else 0), I32(epi.code), F(epi.p0), F(epi.p1)]
        M2 = 0
        if sibling is None:
            args += [Buf(out), Buf(bias or ap), I32(0), I32(0), I32(0), F(0), F(0)]
        else:
            s, sepi, grid = sibling
            M2 = grid.shape[0]
            sw_name = self._fresh("conv_sibling_w")
            self.plan.constants[sw_name] = grid
            second = self.plan.constants.pop(self._conv_a_panels(sw_name, 1, M2, Cg, KH, KW))
            del self.plan.constants[sw_name]
            self.plan.constants[ap] = np.concatenate([self.plan.constants[ap].reshape(-1), second.reshape(-1)])
            sbias = self.data(s.inputs[2]) if len(s.inputs) > 2 and s.inputs[2] else None
            args += [Buf(self.output(sepi.out)), Buf(sbias or ap), I32(M2), I32(2 if sbias else 0), I32(sepi.code),
                     F(sepi.p0), F(sepi.p1)]
            self.merged_convs.add(id(s))
        Nb = -(-OH * OW // RN)
        jt = min(ks.GEMM_JT, Nb)
        blocks = -(-Mg // RM) + -(-M2 // RM)
        self.plan.steps.append(Launch(ks.GEMM_SOURCE, "conv_flat", (-(-Nb // jt) * jt * blocks, Nimg * G), (1, 1),
                                      args))
        return True

    def _live_taps(self, w: str, xs, ws, g: dict) -> tuple[str, tuple]:
        """Rule conv_dead_taps: the constant weight ``w`` cut to the taps that read the input for some
        output (``op_geometry.trim``), as a new constant, and ``g`` (``_conv_geometry``'s, 1-D as 2-D)
        updated to the cut kernel and its pads; ``w`` and ``ws`` unchanged where no tap dies. Every
        kernel loops over all taps, and the padded-plane ones copy the padding too: DeepLabV3's 3x3
        at dilation 36 over 8x8 pads each plane to 80x80 for one live tap."""
        axes = ("W",) if len(xs) == 3 else ("H", "W")
        keys = {"H": ("KH", "sh", "dh", "ph", "ph_end", "OH"), "W": ("KW", "sw", "dw", "pw", "pw_end", "OW")}
        spatial = [g[a] for a in axes]
        kernel, strides, dil, pb, pe, out = ([g[keys[a][i]] for a in axes] for i in range(6))
        cut = op_geometry.trim(spatial, kernel, strides, dil, pb, pe, out)
        if cut is None:
            return w, ws
        live = np.ascontiguousarray(np.asarray(self.plan.constants[w], np.float32).reshape(ws)[cut.weight_index()])
        name = self._prepacked_name("conv_live_taps", live.size)
        self.plan.constants[name] = live
        nd = len(axes)
        for i, a in enumerate(axes):
            k, _, _, begin, end, _ = keys[a]
            g[k], g[begin], g[end] = cut.kernel[i], cut.pads[i], cut.pads[nd + i]
        return name, live.shape

    def _conv_lanes(self, x: str, w: str, xs, ws, g: dict, G: int, out: str, bias: str | None,
                    epi: Epilogue) -> bool:
        """Rule conv_lanes: ``pad_planes`` + ``conv_lanes_r14_s{1,2}`` (output channels in the vector
        lanes) where the horizontal stride is 1 or 2, constant weights give a whole number of
        32-channel blocks per group from at least ``ks.CONV_LANES_MIN_CG`` input channels (not an
        RGB stem) and the output rows a whole number of 14-position tiles up to
        ``ks.CONV_LANES_MAX_OW`` (a 224-pixel ResNet's rows from 112 down to 14; its rows of 7 keep
        conv_rows2). Returns False where it does not apply."""
        OW, OH = g["OW"], g["OH"]
        Nimg, Cin, Cout = xs[0], xs[1], ws[0]
        Cg, Mg = Cin // G, Cout // G
        rp = next((r for r in ks.CONV_LANES_POSITIONS if OW % r == 0 and OW <= ks.CONV_LANES_MAX_OW), 0)
        nr = 1
        # Rule conv_lanes_row_pairs: rows of 7 (a ResNet's last stage) take two whole rows a work-item,
        # the 14-position tile of the wider rows, in place of conv_rows2 or im2col + GEMM.
        if not rp and OW == ks.CONV_LANES_PAIR_OW and self.rule("conv_lanes_row_pairs"):
            rp, nr = OW, ks.CONV_LANES_POSITIONS[0] // OW
        if not (self.rule("conv_lanes") and w in self.plan.constants and rp and g["sw"] in (1, 2)
                and Mg % ks.CONV_LANES_CHANNELS == 0 and Cg >= ks.CONV_LANES_MIN_CG):
            return False
        KH, KW = g["KH"], g["KW"]
        Hp, Wp = g["H"] + g["ph"] + g["ph_end"], g["W"] + g["pw"] + g["pw_end"]
        Mb = Mg // ks.CONV_LANES_CHANNELS
        # Weights [G][Mb][Cg][KH][KW][32], packed here once.
        wt = np.asarray(self.plan.constants[w], np.float32).reshape(G, Mb, ks.CONV_LANES_CHANNELS, Cg, KH, KW)
        wt = wt.transpose(0, 1, 3, 4, 5, 2)
        ap = self._prepacked_name("conv_lanes_w", wt.size)
        self.plan.constants[ap] = np.ascontiguousarray(wt)
        if (Hp, Wp) == (g["H"], g["W"]) and self.rule("conv_lanes_unpadded"):
            # Rule conv_lanes_unpadded: with no padding the padded planes are the input itself (a
            # 1x1 downsample, whose stride 2 reads a quarter of the copy pad_planes would write).
            xp = x
        else:
            planes = Nimg * Cin
            xp = self.temp("conv_pad", planes * Hp * Wp * 4)
            self.plan.add_launch_1d(ks.CONV_SOURCE, "pad_planes", planes * Hp, [
                Buf(xp), Buf(x), I32(g["H"]), I32(g["W"]), I32(Hp), I32(Wp), I32(g["ph"]), I32(g["pw"])])
        args = [Buf(ap), Buf(xp), Buf(out), Buf(bias or ap), Buf(epi.residual or ap), I32(Mg), I32(OH), I32(OW),
                I32(Cg), I32(KH), I32(KW), *(I32(g[k]) for k in ("sh", "dh", "dw")), I32(Hp), I32(Wp), I32(0),
                I32(G), I32(2 if bias else 0), I32(epi.code), F(epi.p0), F(epi.p1)]
        # Rule conv_lanes_weight_order: where a group's weights outweigh its input planes (the
        # deeper stages), consecutive work-items take one channel block's row tiles, so its weights
        # are read from cache once per thread rather than once per row tile.
        wmajor = KH * KW * Mg > Hp * Wp and self.rule("conv_lanes_weight_order")
        # Rule conv_lanes_row_stores: each channel's positions of the tile stored as a run of vectors
        # (the tile transposed in registers) rather than a scalar store a lane.
        args.append(I32(1 if self.rule("conv_lanes_row_stores") else 0))
        args.append(I32(1 if wmajor else 0))
        kernel = f"conv_lanes_r{rp}_s{g['sw']}" if nr == 1 else f"conv_lanes_r{rp}x{nr}_s{g['sw']}"
        if KW == ks.CONV_LANES_UNROLLED_KW and nr == 1 and self.rule("conv_lanes_k3"):
            # Rule conv_lanes_k3: kernel rows of 3 take the kernel with its tap loop unrolled (not the
            # row pairs, whose two loops ran slower unrolled).
            kernel += f"_k{KW}"
        nt = -(-OH // nr) * (OW // rp)
        if (nr > 1 and nt > 1 and Mb * Nimg * G >= ks.CONV_LANES_CHUNK_MIN_ITEMS
                and self.rule("conv_lanes_weight_chunks")):
            # Rule conv_lanes_weight_chunks: a work-item runs one channel block over every row tile,
            # a chunk of input channels at a time, so the chunk's weights are read from memory once
            # for all the tiles (a 7x7 stage's weights outweigh its input 50 times).
            chunk = max(1, ks.CONV_LANES_CHUNK_BYTES // (KH * KW * ks.CONV_LANES_CHANNELS * 4))
            scratch = self.temp("conv_lanes_acc", Nimg * G * Mb * nt * rp * nr * ks.CONV_LANES_CHANNELS * 4)
            args[-1] = I32(chunk)
            args.append(Buf(scratch))
            kernel, grid = kernel + "_wc", (Mb, Nimg * G)
        else:
            grid = (Mb * nt, Nimg * G)
        # The output's and the residual's layouts (plane stride, row stride, offset): plain unless
        # rule conv_lanes_padded_output redirects them.
        args += [I32(OH * OW), I32(OW), I32(0)] * 2
        launch = Launch(ks.GEMM_SOURCE, kernel, grid, (1, 1), args)
        self.plan.steps.append(launch)
        self.lanes_outputs[out] = launch
        return True

    def pads_into_producers(self) -> None:
        """Rule conv_lanes_padded_output, once every node is lowered: a ``pad_planes`` copy of a value
        written by a one-tile conv_lanes launch (rule ``conv_lanes_padded_pairs``: or a row-pair one,
        chunked or not; rule ``pool_padded_output``: or a pool_rows MaxPool launch) of this plan goes,
        where every other reader of the value is a conv_lanes launch (row pairs as for the producer)
        reading it as its residual or (rule
        ``conv_lanes_padded_input``) an unpadded 1x1 conv_lanes launch reading it as its input (a
        ResNet stage's downsample; no plan output, no view, no copy): the producer writes the
        interior of the padded planes (zeroed once when the workspace is allocated; no launch writes
        their border), the readers read it there (the 1x1 from an offset, with the padded row
        length), and the value's own buffer is dropped."""
        plan = self.plan
        for pad in [s for s in plan.steps if isinstance(s, Launch) and s.kernel_name == "pad_planes"]:
            xp, x = pad.args[0].name, pad.args[1].name
            producer = self.lanes_outputs.get(x)
            pool = producer is None and self.rule("pool_padded_output")
            if pool:  # rule pool_padded_output: a pool_rows MaxPool's output, as a conv_lanes one
                producer = self.pool_outputs.get(x)
            if (producer is None or x not in plan.temps or x in plan.output_names or x in plan.aliases
                    or x in plan.aliases.values()):
                continue
            readers = [s for s in plan.steps if s is not pad and s is not producer and _reads(s, x)]
            H, W = (int(a) for a in pad.args[2:4])
            kinds = [_padded_reader(s, x, H, W, self.rule("conv_lanes_padded_input")) for s in readers]
            if None in kinds:
                continue
            stores = [producer] + [s for s, kind in zip(readers, kinds) if kind == "residual"]
            if not self.rule("conv_lanes_padded_pairs") and any(
                    s.kernel_name.startswith("conv_lanes_r") and "x" in s.kernel_name.split("_")[2] for s in stores):
                continue  # a row-pair tile (conv_lanes_r7x2_*) writing or reading a tile of the padded planes
            Hp, Wp, ph, pw = (int(a) for a in pad.args[4:8])
            layout = [I32(Hp * Wp), I32(Wp), I32(ph * Wp + pw)]
            if pool:  # arg 0 is Y; its layout the three before the work-item count
                producer.args[0] = Buf(xp)
                producer.args[-4:-1] = layout
            else:  # arg 2 is C, 4 is R; the last six are C's and R's layouts (plane stride, row stride, offset)
                producer.args[2] = Buf(xp)
                producer.args[-6:-3] = layout
            for s, kind in zip(readers, kinds):
                if kind == "residual":
                    s.args[4] = Buf(xp)
                    s.args[-3:] = layout
                else:  # arg 1 is X, 14-16 its plane height, row length and offset
                    s.args[1] = Buf(xp)
                    s.args[14:17] = [I32(Hp), I32(Wp), I32(ph * Wp + pw)]
            plan.steps.remove(pad)
            plan.zeroed_temps.add(xp)
            del plan.temps[x]

    def downsamples_into_readers(self) -> None:
        """Rule conv_lanes_downsample, once every node is lowered (after ``pads_into_producers``): a
        1x1 conv_lanes launch (one group, no activation, no residual, plain output layout) whose output
        only one later conv_lanes launch reads, as its residual, with the same output channels, plane
        and images (a ResNet stage's downsample and the block's second 3x3 Conv) runs inside that
        launch: the ``_ds`` kernel (``ks.conv_lanes_downsample_source``) adds the 1x1's products to
        the same accumulators after its own taps, its bias summed into the reader's, so the 1x1's
        launch, its output buffer and the residual's reads go. The 1x1's input must be unchanged
        until the reader runs: any launch between them reads it as a conv_lanes input or residual only."""
        plan, steps = self.plan, self.plan.steps
        for d in [s for s in steps if isinstance(s, Launch) and s.kernel_name.startswith("conv_lanes_r")]:
            m = re.fullmatch(r"conv_lanes_r\d+(?:x\d+)?_s([12])(?:_wc)?", d.kernel_name)
            y, x2 = d.args[2].name, d.args[1].name
            OH, OW = int(d.args[6]), int(d.args[7])
            if (m is None or [int(a) for a in d.args[9:11]] != [1, 1] or int(d.args[19]) != 0
                    or int(d.args[17]) != 1 or [int(a) for a in d.args[-6:-3]] != [OH * OW, OW, 0]
                    or y not in plan.temps or y in plan.output_names or y in plan.aliases
                    or y in plan.aliases.values()):
                continue
            readers = [s for s in steps if s is not d and _reads(s, y)]
            if len(readers) != 1:
                continue
            r = readers[0]
            if not (isinstance(r, Launch) and re.fullmatch(r"conv_lanes_r\d+(?:x\d+)?_s[12](?:_k\d+)?(?:_wc)?",
                                                           r.kernel_name)):
                continue
            first, last = steps.index(d), steps.index(r)
            if ([k for k, a in enumerate(r.args) if isinstance(a, Buf) and a.name == y] != [4] or last < first
                    or int(r.args[19]) < 16 or int(r.args[17]) != 1 or r.global_size[1] != d.global_size[1]
                    or [int(a) for a in r.args[5:8]] != [int(a) for a in d.args[5:8]]):
                continue
            if any(isinstance(s, Launch) and not s.kernel_name.startswith("conv_lanes_r") and _reads(s, x2)
                   or isinstance(s, Launch) and [k for k, a in enumerate(s.args) if isinstance(a, Buf)
                                                 and a.name == x2 and k not in (1, 4)]
                   or not isinstance(s, Launch) and _reads(s, x2) for s in steps[first + 1:last]):
                continue
            biases = [a.name for a, mode in ((r.args[3], r.args[18]), (d.args[3], d.args[18])) if int(mode) == 2]
            if any(b not in plan.constants for b in biases):
                continue
            if len(biases) == 2:
                total = (np.asarray(plan.constants[biases[0]], np.float32).reshape(-1)
                         + np.asarray(plan.constants[biases[1]], np.float32).reshape(-1))
                bias = self._prepacked_name("conv_lanes_bias", total.size)
                plan.constants[bias] = total
                biases = [bias]
            args = list(r.args)
            args[3] = Buf(biases[0]) if biases else args[0]
            args[4] = args[0]  # any valid buffer: no residual read
            args[18], args[19] = I32(2 if biases else 0), I32(int(r.args[19]) - 16)
            args += [d.args[0], d.args[1], d.args[8], d.args[11], d.args[14], d.args[15], d.args[16]]
            sw2 = int(m[1])
            steps[last] = Launch(ks.conv_lanes_downsample_source(r.kernel_name, sw2), f"{r.kernel_name}_ds{sw2}",
                                 r.global_size, r.local_size, args)
            steps.remove(d)
            for a in d.args:  # its output and any scratch of its own
                if isinstance(a, Buf) and a.name in plan.temps and not any(_reads(s, a.name) for s in steps):
                    del plan.temps[a.name]

    def _conv_implicit(self, x: str, w: str, xs, ws, g: dict, G: int, out: str, bias: str | None,
                       epi: Epilogue) -> bool:
        """Conv as an implicit GEMM (``conv_unpadded_*``/``conv_rows2_*`` reading the input in place,
        or ``pad_planes`` + ``conv_implicit_*`` with rule ``conv_pad`` off) when it pays: constant
        weights, horizontal stride 1 or 2, and output rows that fill 16-wide panels to at least 7/8
        (or, rule ``conv_row_pairs``, rows of 7 or 8 two a vector). Returns False to use im2col."""
        sw, OW, OH = g["sw"], g["OW"], g["OH"]
        npb = -(-OW // RN)
        # Rule conv_row_pairs: rows of 7 or 8 outputs fill two 8-lane halves of a vector (7/8 as well).
        # Not for stride 2 with several taps: its two 16-float loads and even-lane shuffles a channel
        # run slower than im2col + GEMM (PoCL, 3x3, 512 channels).
        pairs = (OW in (7, 8) and (sw == 1 or g["KH"] * g["KW"] == 1) and self.rule("conv_pad")
                 and self.rule("conv_row_pairs"))
        if w not in self.plan.constants or sw not in (1, 2) or 8 * OW < 7 * npb * RN and not pairs:
            return False
        Nimg, Cin, Cout = xs[0], xs[1], ws[0]
        Cg, Mg = Cin // G, Cout // G
        KH, KW, dh, dw = g["KH"], g["KW"], g["dh"], g["dw"]
        Hp = g["H"] + g["ph"] + g["ph_end"]
        # Every lane of every panel reads inside its padded row: the last panel's lanes past OW read
        # padding (computed, never stored); stride 2 loads 32 floats per panel.
        Wp = max(g["W"] + g["pw"] + g["pw_end"], (npb * RN - 1) * sw + (KW - 1) * dw + 1 + (sw - 1))
        Mb = -(-Mg // RM)
        ap = self._conv_a_panels(w, G, Mg, Cg, KH, KW)  # packed here once
        if self.rule("conv_pad"):
            # Rule conv_pad: the kernel reads x in place, zero padding by bounds checks (no pad_planes
            # copy). Rule conv_wide_tile: 32 positions a work-item where the rows fill 32-wide panels
            # as well as 16-wide ones (7/8), so the wider tile computes no more padding lanes.
            npb2 = -(-OW // (2 * RN))
            wide = (self.rule("conv_wide_tile") and 8 * OW >= 7 * npb2 * 2 * RN
                    and OH * npb2 * Mb * Nimg * G >= ks.WIDE_TILE_MIN_ITEMS)
            nv = 2 if wide else 1
            npb = -(-OW // (nv * RN))
            Nb = -(-OH // 2) if pairs else OH * npb
            jt = min(ks.GEMM_JT, Nb)
            macs = Nimg * G * Mg * Cg * KH * KW * OH * OW
            if (sw == 2 and dw == 1 and not pairs and KW >= ks.CONV_PHASES_MIN_KW
                    and macs >= ks.CONV_PHASES_MIN_MACS and self.rule("conv_phases")):
                # Rule conv_phases: stride 2 over pad_phases' copy (each padded row as its even columns
                # then its odd ones), so each tap loads whole vectors instead of two and a shuffle.
                Wh = max(-(-(g["W"] + g["pw"] + g["pw_end"]) // 2), npb * nv * RN + (KW - 1) // 2)
                planes = Nimg * Cin
                xd = self.temp("conv_phases", planes * Hp * 2 * Wh * 4)
                self.plan.add_launch_1d(ks.CONV_SOURCE, "pad_phases", planes * Hp, [
                    Buf(xd), Buf(x), I32(g["H"]), I32(g["W"]), I32(Hp), I32(Wh), I32(g["ph"]), I32(g["pw"])])
                args = [Buf(ap), Buf(xd), Buf(out), Buf(bias or ap), Buf(epi.residual or ap), I32(Mg), I32(OH),
                        I32(OW), I32(npb), I32(Cg), I32(KH), I32(KW), I32(g["sh"]), I32(dh), I32(Hp), I32(Wh),
                        I32(G), I32(2 if bias else 0), I32(epi.code), F(epi.p0), F(epi.p1)]
                kernel = "conv_phases_s2" + ("_x2" if nv == 2 else "")
                self.plan.steps.append(Launch(ks.GEMM_SOURCE, kernel, (-(-Nb // jt) * jt * Mb, Nimg * G), (1, 1),
                                              args))
                return True
            args = [Buf(ap), Buf(x), Buf(out), Buf(bias or ap), Buf(epi.residual or ap), I32(Mg), I32(OH), I32(OW),
                    I32(npb), I32(Cg), I32(KH), I32(KW), I32(g["sh"]), I32(dh), I32(dw), I32(g["H"]), I32(g["W"]),
                    I32(g["ph"]), I32(g["pw"]), I32(G), I32(2 if bias else 0), I32(epi.code), F(epi.p0), F(epi.p1),
                    I32(prod(xs))]
            kernel = f"conv_rows2_s{sw}" if pairs else f"conv_unpadded_s{sw}" + ("_x2" if nv == 2 else "")
            self.plan.steps.append(Launch(ks.GEMM_SOURCE, kernel, (-(-Nb // jt) * jt * Mb, Nimg * G), (1, 1), args))
            return True
        planes = Nimg * Cin
        xp = self.temp("conv_pad", planes * Hp * Wp * 4)
        self.plan.add_launch_1d(ks.CONV_SOURCE, "pad_planes", planes * Hp, [
            Buf(xp), Buf(x), I32(g["H"]), I32(g["W"]), I32(Hp), I32(Wp), I32(g["ph"]), I32(g["pw"])])
        Nb = OH * npb
        jt = min(ks.GEMM_JT, Nb)
        args = [Buf(ap), Buf(xp), Buf(out), Buf(bias or ap), Buf(epi.residual or ap), I32(Mg), I32(OH), I32(OW),
                I32(npb), I32(Cg), I32(KH), I32(KW), I32(g["sh"]), I32(dh), I32(dw), I32(Hp), I32(Wp), I32(G),
                I32(2 if bias else 0), I32(epi.code), F(epi.p0), F(epi.p1)]
        self.plan.steps.append(Launch(ks.GEMM_SOURCE, f"conv_implicit_s{sw}", (-(-Nb // jt) * jt * Mb, Nimg * G),
                                      (1, 1), args))
        return True

