"""Lowering of one fused partition (a filtered graph) to a ``PartitionPlan``.

Order of decisions: view ops (Reshape, Flatten, Squeeze, Unsqueeze) become aliases; an activation
that is the only consumer of a Gemm/MatMul/Conv is folded into that kernel's epilogue (as are the
activation and residual of the optimizer's ``com.onnxhal`` FusedConv/FusedGemm/FusedMatMul); trees of elementwise
nodes whose intermediates have no other consumer become one generated kernel; every other node
lowers to launches of the fixed kernel families in ``kernel_sources``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from onnxhal.hal.errors import NotImplemented as OrtNotImplemented
from onnxhal.hal.graph import Graph, Node
from onnxhal.runtime.providers.opencl import kernel_sources as ks
from onnxhal.runtime.providers.opencl.elementwise_codegen import (
    ELEMENTWISE_OPS,
    broadcast_strides,
    generate_fused_kernel,
)
from onnxhal.runtime.providers.opencl.op_support import (
    F32,
    REDUCE_OPS,
    VIEW_OPS,
    GraphLookup,
    activation_spec,
    fused_activation_spec,
    reduce_layout,
)
from onnxhal.runtime.providers.opencl.partition_plan import Buf, CopyStep, Launch, PartitionPlan

RM, RN = ks.GEMM_RM, ks.GEMM_RN
I32, F = np.int32, np.float32


@dataclass
class Epilogue:
    """What a GEMM/Conv kernel does after the dot products: write ``out``, adding ``residual`` (a
    value of the output's shape) and then activation ``act`` with parameters ``p0``, ``p1``."""

    out: str
    act: int = 0
    p0: float = 0.0
    p1: float = 0.0
    residual: str | None = None

    @property
    def code(self) -> int:
        return self.act + (16 if self.residual else 0)


def _prod(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _strides(shape) -> list[int]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return list(reversed(out))


class PlanBuilder:
    """Builds the plan of one filtered graph. ``lookup`` gives shapes, dtypes and constants."""

    def __init__(self, graph: Graph, lookup: GraphLookup) -> None:
        self.graph = graph
        self.lookup = lookup
        inputs = [v.name for v in graph.inputs]
        outputs = [v.name for v in graph.outputs]
        self.plan = PartitionPlan(inputs, outputs, {}, {})
        self._counter = 0
        for name in inputs + outputs:
            self._record(name)

    # -- helpers ---------------------------------------------------------------------------
    def _record(self, name: str) -> tuple[int, ...]:
        shape = self.lookup.shape(name)
        if shape is None:
            raise OrtNotImplemented(f"OpenCL EP: value {name!r} has no static shape")
        self.plan.shapes[name] = tuple(shape)
        self.plan.dtypes[name] = np.dtype(self.lookup.dtype(name) or F32)
        return self.plan.shapes[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return self.plan.shapes[name] if name in self.plan.shapes else self._record(name)

    def _fresh(self, stem: str) -> str:
        self._counter += 1
        return f"::{stem}{self._counter}"

    def constant(self, stem: str, arr: np.ndarray) -> str:
        name = self._fresh(stem)
        self.plan.constants[name] = np.ascontiguousarray(arr)
        return name

    def data(self, name: str) -> str:
        """A buffer name for value ``name``: a fed input, an intermediate, or an uploaded constant."""
        if name in self.plan.input_names or name in self.plan.constants:
            return name
        const = self.lookup.const(name)
        if const is not None and self.graph.producer(name) is None:
            arr = const.astype(np.float32) if const.dtype == np.float64 else const
            self.plan.constants[name] = np.ascontiguousarray(arr)
            self.plan.shapes[name] = tuple(const.shape)
            self.plan.dtypes[name] = np.dtype(arr.dtype)
            return name
        self.shape(name)
        return name

    def output(self, name: str) -> str:
        """Declare ``name`` as produced here: an output of the plan, or a per-run intermediate."""
        self.shape(name)
        if name not in self.plan.output_names:
            self.plan.temps[name] = self.plan.nbytes(name)
        return name

    def temp(self, stem: str, nbytes: int) -> str:
        name = self._fresh(stem)
        self.plan.temps[name] = nbytes
        return name

    # -- driver ----------------------------------------------------------------------------
    def build(self) -> PartitionPlan:
        nodes = self.graph.nodes
        consumers: dict[str, list[Node]] = {}
        for n in nodes:
            for i in n.inputs:
                if i:
                    consumers.setdefault(i, []).append(n)
        outputs = set(self.plan.output_names)
        epilogues: dict[int, Epilogue] = {}
        skip: set[int] = set()
        for n in nodes:
            if n.op_type not in ("Gemm", "MatMul", "Conv") or n.domain:
                continue
            epi = Epilogue(n.outputs[0])
            users = consumers.get(n.outputs[0], [])
            if len(users) == 1 and n.outputs[0] not in outputs and users[0].inputs[0] == n.outputs[0]:
                spec = activation_spec(users[0], self.lookup)
                if spec is not None:
                    epi = Epilogue(users[0].outputs[0], *spec)
                    skip.add(id(users[0]))
            epilogues[id(n)] = epi
        clusters = self._elementwise_clusters(nodes, consumers, outputs, skip)
        for n in nodes:
            self.plan.op_types.append(n.op_type)
            if id(n) in skip:
                continue
            if id(n) in clusters:
                members = clusters[id(n)]
                if members:
                    self._lower_fused(members)
                continue
            self._lower(n, epilogues.get(id(n)))
        return self.plan

    def _elementwise_clusters(self, nodes, consumers, outputs, skip) -> dict[int, list[Node]]:
        """id(root node) -> member nodes in order; id(non-root member) -> [] (emitted with its root)."""
        cluster_of: dict[int, list[Node]] = {}
        result: dict[int, list[Node]] = {}
        for n in nodes:
            if n.op_type not in ELEMENTWISE_OPS or id(n) in skip:
                continue
            out_shape = self.shape(n.outputs[0])
            members = [n]
            for i in n.inputs:
                prod = self.graph.producer(i) if i else None
                if prod is None or id(prod) not in cluster_of or i in outputs:
                    continue
                if len(consumers.get(i, [])) != 1 or self.shape(i) != out_shape:
                    continue
                sub = cluster_of[id(prod)]
                if sub[-1] is not prod:
                    continue
                members = [m for m in sub if m not in members] + members
            for m in members:
                cluster_of[id(m)] = members
        for members in {id(m): m for m in cluster_of.values()}.values():
            root = members[-1]
            if cluster_of.get(id(root)) is not members:
                continue
            result[id(root)] = members
            for m in members[:-1]:
                result[id(m)] = []
        return result

    # -- fused elementwise -----------------------------------------------------------------
    def _elementwise_args(self, n: Node) -> tuple[list[str], dict]:
        """The node's data inputs as value names (constants synthesized where the op needs them)."""
        if n.op_type == "BatchNormalization":
            x = n.inputs[0]
            c = [self.lookup.const(i).astype(np.float64) for i in n.inputs[1:5]]
            scale = c[0] / np.sqrt(c[3] + float(n.attr("epsilon", 1e-5)))
            shift = c[1] - c[2] * scale
            tail = (1,) * (len(self.shape(x)) - 2)
            s_name = self.constant("bn_scale", scale.astype(np.float32).reshape((-1, *tail)))
            b_name = self.constant("bn_shift", shift.astype(np.float32).reshape((-1, *tail)))
            for name in (s_name, b_name):
                self.plan.shapes[name] = self.plan.constants[name].shape
                self.plan.dtypes[name] = F32
            return [x, s_name, b_name], {}
        if n.op_type == "FusedBatchNormalization":
            x = n.inputs[0]
            tail = (1,) * (len(self.shape(x)) - 2)
            names = []
            for i in n.inputs[1:3]:
                name = self.constant("fbn", self.lookup.const(i).astype(np.float32).reshape((-1, *tail)))
                self.plan.shapes[name] = self.plan.constants[name].shape
                self.plan.dtypes[name] = F32
                names.append(name)
            return [x, *names], {"act": fused_activation_spec(n)}
        if n.op_type == "Clip":
            extra = {"min": n.attr("min"), "max": n.attr("max")}
            for key, idx in (("min", 1), ("max", 2)):
                if len(n.inputs) > idx and n.inputs[idx]:
                    extra[key] = float(self.lookup.const(n.inputs[idx]).reshape(-1)[0])
            return [n.inputs[0]], extra
        return [i for i in n.inputs if i], {}

    def _lower_fused(self, members: list[Node]) -> None:
        root = members[-1]
        out = root.outputs[0]
        out_shape = self.shape(out)
        internal = {m.outputs[0] for m in members[:-1]}
        ext: list[str] = []
        exprs: dict[str, str] = {}
        statements: list[tuple[str, str]] = []
        for k, m in enumerate(members):
            args, extra = self._elementwise_args(m)
            refs = []
            for a in args:
                if a in internal:
                    refs.append(exprs[a])
                else:
                    if a not in ext:
                        ext.append(a)
                    refs.append(f"in{ext.index(a)}")
            local = f"v{k}"
            statements.append((local, ELEMENTWISE_OPS[m.op_type](m, refs, extra)))
            exprs[m.outputs[0]] = local
        inputs = [broadcast_strides(self.shape(self.data(a)), out_shape) for a in ext]
        fused = generate_fused_kernel(statements, exprs[out], inputs, out_shape)
        meta = self.constant("meta", fused.meta)
        self.plan.add_launch_1d(fused.source, "fused_elementwise", _prod(out_shape),
                                [Buf(self.output(out)), *(Buf(self.data(a)) for a in ext), Buf(meta)])

    # -- single nodes ----------------------------------------------------------------------
    def _lower(self, n: Node, epi: Epilogue | None) -> None:
        op = n.op_type
        if op in VIEW_OPS:
            return self._view(n.outputs[0], n.inputs[0])
        if op in ELEMENTWISE_OPS:
            return self._lower_fused([n])
        method = getattr(self, f"_lower_{op}", None)
        if op in REDUCE_OPS:
            method = self._lower_reduce
        if method is None:
            raise OrtNotImplemented(f"OpenCL EP has no lowering for {op}")
        if op in ("Gemm", "MatMul", "Conv", "FusedGemm", "FusedMatMul", "FusedConv"):
            if epi is None:  # the optimizer's fused ops carry their activation as attributes
                epi = Epilogue(n.outputs[0], *fused_activation_spec(n))
                if op == "FusedConv" and len(n.inputs) > 3 and n.inputs[3]:
                    epi.residual = self.data(n.inputs[3])
            return method(n, epi)
        return method(n)

    def _view(self, out: str, src: str) -> None:
        self.shape(out)
        src = self.data(src)
        if out in self.plan.output_names or src in self.plan.constants and out in self.plan.output_names:
            self.plan.steps.append(CopyStep(out, src, self.plan.nbytes(out)))
        else:
            self.plan.aliases[out] = src

    def _strided_copy(self, dst: str, src: str, dims, src_strides, dst_strides, src_off=0, dst_off=0) -> None:
        rank = len(dims)
        pad = 6 - rank
        meta = [rank, *dims, *([1] * pad), *src_strides, *([0] * pad), *dst_strides, *([0] * pad), src_off, dst_off]
        m = self.constant("copymeta", np.array(meta, dtype=np.int32))
        last = dims[-1] if rank else 1
        work = (_prod(dims) // last if last else 0) * -(-last // 64)  # rows x 64-element chunks
        self.plan.add_launch_1d(ks.MOVEMENT_SOURCE, "strided_copy", work, [Buf(dst), Buf(src), Buf(m)])

    # GEMM family ---------------------------------------------------------------------------
    def _packed_a(self, src: str, M: int, K: int, rs: int, cs: int, batches: int, bstride: int) -> str:
        Mb = -(-M // RM)
        total = batches * Mb * K * RM
        work = batches * Mb * K
        args = [np.int32(M), np.int32(K), np.int32(Mb), np.int32(rs), np.int32(cs), np.int32(bstride)]
        if src in self.plan.constants:  # weights: packed once, at create_state
            name = self._fresh("packed_a")
            self.plan.prepacked[name] = total * 4
            self.plan.add_launch_1d(ks.GEMM_SOURCE, "pack_a", work, [Buf(name), Buf(src), *args], init=True)
            return name
        name = self.temp("packed_a", total * 4)
        self.plan.add_launch_1d(ks.GEMM_SOURCE, "pack_a", work, [Buf(name), Buf(src), *args])
        return name

    def _packed_b(self, src: str, K: int, N: int, rs: int, cs: int, batches: int, bstride: int) -> str:
        Nb = -(-N // RN)
        total = batches * Nb * K * RN
        work = batches * Nb * K
        args = [np.int32(N), np.int32(K), np.int32(Nb), np.int32(rs), np.int32(cs), np.int32(bstride)]
        if src in self.plan.constants:
            name = self._fresh("packed_b")
            self.plan.prepacked[name] = total * 4
            self.plan.add_launch_1d(ks.GEMM_SOURCE, "pack_b", work, [Buf(name), Buf(src), *args], init=True)
            return name
        name = self.temp("packed_b", total * 4)
        self.plan.add_launch_1d(ks.GEMM_SOURCE, "pack_b", work, [Buf(name), Buf(src), *args])
        return name

    def _gemm(self, ap: str, bp: str, out: str, M: int, N: int, K: int, batches: int, a_mod: int,
              c_bstride: int, bias: str | None, bias_mode: int, bias_bstride: int, alpha: float, beta: float,
              epi: Epilogue, a_rowmajor_bstride: int | None = None) -> None:
        """C = GEMM of packed B with A: packed (``ap`` from ``_packed_a``) or, when
        ``a_rowmajor_bstride`` is given, ``ap`` is the row-major A itself (batch stride as given)."""
        if M == 0 or N == 0:
            return  # an empty output: nothing to compute
        Mb, Nb = -(-M // RM), -(-N // RN)
        bias_buf = Buf(bias) if bias else Buf(ap)  # any valid buffer when unused
        args = [Buf(ap), Buf(bp), Buf(out), bias_buf, Buf(epi.residual or ap), I32(M), I32(N), I32(K), I32(a_mod),
                I32(c_bstride), I32(bias_bstride), I32(bias_mode if bias else 0), F(alpha), F(beta), I32(epi.code),
                F(epi.p0), F(epi.p1)]
        kernel = "gemm_packed"
        if a_rowmajor_bstride is not None:
            kernel = "gemm_rowmajor_a"
            args.append(I32(a_rowmajor_bstride))
        self.plan.steps.append(Launch(ks.GEMM_SOURCE, kernel, (Mb, Nb, batches), (1, 1, 1), args))

    def _a_operand(self, a: str, M: int, K: int, rs: int, cs: int, batches: int, bstride: int
                   ) -> tuple[str, int | None]:
        """(buffer, row-major batch stride or None): activations already row-major are read in place,
        weights and transposed operands are packed."""
        if a not in self.plan.constants and cs == 1 and rs == K:
            return a, bstride
        return self._packed_a(a, M, K, rs, cs, batches, bstride), None

    def _lower_Gemm(self, n: Node, epi: Epilogue) -> None:
        a, b = self.data(n.inputs[0]), self.data(n.inputs[1])
        (a0, a1), (b0, b1) = self.shape(a), self.shape(b)
        ta, tb = n.attr("transA", 0), n.attr("transB", 0)
        M, K = (a1, a0) if ta else (a0, a1)
        N = b0 if tb else b1
        ap, a_rm = self._a_operand(a, M, K, 1 if ta else K, M if ta else 1, 1, 0)
        bp = self._packed_b(b, K, N, 1 if tb else N, K if tb else 1, 1, 0)
        bias, mode = None, 0
        if len(n.inputs) > 2 and n.inputs[2]:
            bias = self.data(n.inputs[2])
            cs = self.shape(bias)
            if _prod(cs) == 1:
                mode = 4
            elif _prod(cs) == M * N and (len(cs) == 2 and cs == (M, N)):
                mode = 3
            elif cs[-1] == N and _prod(cs) == N:
                mode = 1
            else:
                mode = 2
        out = self.output(epi.out)
        self._gemm(ap, bp, out, M, N, K, 1, 1, 0, bias, mode, 0, n.attr("alpha", 1.0), n.attr("beta", 1.0), epi, a_rm)

    _lower_FusedGemm = _lower_Gemm

    def _lower_MatMul(self, n: Node, epi: Epilogue) -> None:
        a, b = self.data(n.inputs[0]), self.data(n.inputs[1])
        sa, sb = self.shape(a), self.shape(b)
        K, N = sb[-2], sb[-1]
        out = self.output(epi.out)
        bias = self.data(n.inputs[2]) if len(n.inputs) > 2 and n.inputs[2] else None  # FusedMatMul
        mode = 0 if bias is None else 4 if _prod(self.shape(bias)) == 1 else 1
        if len(sb) == 2:  # batch dims of A fold into M
            M = _prod(sa[:-1])
            ap, a_rm = self._a_operand(a, M, K, K, 1, 1, 0)
            bp = self._packed_b(b, K, N, N, 1, 1, 0)
            return self._gemm(ap, bp, out, M, N, K, 1, 1, 0, bias, mode, 0, 1.0, 1.0, epi, a_rm)
        batches = _prod(sb[:-2])
        M = sa[-2]
        a_batches = 1 if len(sa) == 2 else batches
        ap, a_rm = self._a_operand(a, M, K, K, 1, a_batches, M * K)
        bp = self._packed_b(b, K, N, N, 1, batches, K * N)
        self._gemm(ap, bp, out, M, N, K, batches, a_batches, M * N, bias, mode, 0, 1.0, 1.0, epi, a_rm)

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
        G = int(n.attr("group", 1))
        Nimg, Cin, Cout = xs[0], xs[1], ws[0]
        Cg, Mg = Cin // G, Cout // G
        bias = self.data(n.inputs[2]) if len(n.inputs) > 2 and n.inputs[2] else None
        geo = [I32(g[k]) for k in ("H", "W")]
        if Mg < 4:  # thin groups (depthwise): direct convolution
            self.plan.add_launch_1d(ks.CONV_SOURCE, "conv_direct", _prod(ys), [
                Buf(out), Buf(x), Buf(w), Buf(bias or w), I32(1 if bias else 0), Buf(epi.residual or w),
                I32(epi.code), F(epi.p0), F(epi.p1), I32(Cin), *geo, I32(Cout),
                I32(Cg), I32(Mg), *(I32(g[k]) for k in ("KH", "KW", "OH", "OW", "sh", "sw", "ph", "pw", "dh", "dw"))])
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

    # Other families ------------------------------------------------------------------------
    def _pool(self, n: Node, mode: int) -> None:
        x = self.data(n.inputs[0])
        xs, ys = self.shape(x), self.shape(n.outputs[0])
        k = list(n.attr("kernel_shape"))
        g = self._conv_geometry(n, xs, (0, 0, *k), ys)
        out = self.output(n.outputs[0])
        self.plan.add_launch_1d(ks.POOL_SOURCE, "pool2d", _prod(ys), [
            Buf(out), Buf(x), *(I32(g[key]) for key in ("H", "W", "OH", "OW", "KH", "KW", "sh", "sw", "ph", "pw",
                                                          "dh", "dw")),
            I32(mode), I32(n.attr("count_include_pad", 0)), I32(g["H"] + g["ph_end"]), I32(g["W"] + g["pw_end"])])

    def _lower_MaxPool(self, n: Node) -> None:
        self._pool(n, 0)

    def _lower_AveragePool(self, n: Node) -> None:
        self._pool(n, 1)

    def _rows(self, kernel: str, n: Node, outer: int, r: int, inner: int, extra: list) -> None:
        x = self.data(n.inputs[0])
        out = self.output(n.outputs[0])
        self.plan.add_launch_1d(ks.ROWWISE_SOURCE, kernel, outer * inner, [Buf(out), Buf(x), I32(r), I32(inner),
                                                                           *extra])

    def _lower_GlobalAveragePool(self, n: Node) -> None:
        xs = self.shape(n.inputs[0])
        self._rows("reduce_rows", n, xs[0] * xs[1], _prod(xs[2:]), 1, [I32(1)])

    def _lower_GlobalMaxPool(self, n: Node) -> None:
        xs = self.shape(n.inputs[0])
        self._rows("reduce_rows", n, xs[0] * xs[1], _prod(xs[2:]), 1, [I32(2)])

    def _lower_reduce(self, n: Node) -> None:
        outer, r, inner = reduce_layout(n, self.lookup)
        self._rows("reduce_rows", n, outer, r, inner, [I32(REDUCE_OPS[n.op_type])])

    def _softmax(self, n: Node, log: int) -> None:
        xs = self.shape(n.inputs[0])
        rank = len(xs)
        opset = self.graph.opset_version("") or 13
        axis = n.attr("axis", -1 if opset >= 13 else 1) % max(rank, 1)
        if opset >= 13:
            outer, r, inner = _prod(xs[:axis]), xs[axis], _prod(xs[axis + 1:])
        else:
            outer, r, inner = _prod(xs[:axis]), _prod(xs[axis:]), 1
        self._rows("softmax_rows", n, outer, r, inner, [I32(log)])

    def _lower_Softmax(self, n: Node) -> None:
        self._softmax(n, 0)

    def _lower_LogSoftmax(self, n: Node) -> None:
        self._softmax(n, 1)

    def _lower_LayerNormalization(self, n: Node) -> None:
        x = self.data(n.inputs[0])
        xs = self.shape(x)
        axis = n.attr("axis", -1) % len(xs)
        r = _prod(xs[axis:])
        gamma = self.data(n.inputs[1])
        beta = self.data(n.inputs[2]) if len(n.inputs) > 2 and n.inputs[2] else None
        out = self.output(n.outputs[0])
        self.plan.add_launch_1d(ks.ROWWISE_SOURCE, "layernorm_rows", _prod(xs[:axis]), [
            Buf(out), Buf(x), Buf(gamma), Buf(beta or gamma), I32(1 if beta else 0), I32(r),
            F(n.attr("epsilon", 1e-5))])

    def _lower_LRN(self, n: Node) -> None:
        x = self.data(n.inputs[0])
        xs = self.shape(x)
        out = self.output(n.outputs[0])
        self.plan.add_launch_1d(ks.POOL_SOURCE, "lrn", _prod(xs), [
            Buf(out), Buf(x), I32(xs[1]), I32(_prod(xs[2:])), I32(n.attr("size")), F(n.attr("alpha", 1e-4)),
            F(n.attr("beta", 0.75)), F(n.attr("bias", 1.0))])

    def _lower_Transpose(self, n: Node) -> None:
        x = self.data(n.inputs[0])
        xs = self.shape(x)
        perm = n.attr("perm") or list(range(len(xs)))[::-1]
        ys = self.shape(n.outputs[0])
        st = _strides(xs)
        self._strided_copy(self.output(n.outputs[0]), x, ys, [st[p] for p in perm], _strides(ys))

    def _lower_Expand(self, n: Node) -> None:
        x = self.data(n.inputs[0])
        ys = self.shape(n.outputs[0])
        fi = broadcast_strides(self.shape(x), ys)
        src = list(fi.strides) if fi.mode == "bcast" else _strides(ys) if fi.mode == "same" else [0] * len(ys)
        self._strided_copy(self.output(n.outputs[0]), x, ys, src, _strides(ys))

    def _lower_Concat(self, n: Node) -> None:
        out = self.output(n.outputs[0])
        ys = self.shape(out)
        axis = n.attr("axis") % len(ys)
        ost = _strides(ys)
        offset = 0
        for i in n.inputs:
            xs = self.shape(self.data(i))
            self._strided_copy(out, self.data(i), xs, _strides(xs), ost, 0, offset * ost[axis])
            offset += xs[axis]

    def _lower_Slice(self, n: Node) -> None:
        x = self.data(n.inputs[0])
        xs = self.shape(x)
        rank = len(xs)

        def param(idx, attr):
            if len(n.inputs) > idx and n.inputs[idx]:
                return [int(v) for v in self.lookup.const(n.inputs[idx]).reshape(-1)]
            return n.attr(attr)
        starts, ends = param(1, "starts"), param(2, "ends")
        axes = param(3, "axes") or list(range(len(starts)))
        steps = param(4, "steps") or [1] * len(starts)
        st = _strides(xs)
        src_st, off = list(st), 0
        for s, e, a, step in zip(starts, ends, axes, steps):
            a %= rank
            begin = range(*slice(s, e, step).indices(xs[a])).start
            off += begin * st[a]
            src_st[a] = st[a] * step
        ys = self.shape(n.outputs[0])
        self._strided_copy(self.output(n.outputs[0]), x, ys, src_st, _strides(ys), off, 0)

    def _lower_Gather(self, n: Node) -> None:
        x = self.data(n.inputs[0])
        xs = self.shape(x)
        axis = n.attr("axis", 0) % len(xs)
        idx_name = n.inputs[1]
        const = self.lookup.const(idx_name)
        if const is not None:
            idx = self.constant("gather_idx", const.astype(np.int64).reshape(-1))
            nidx = int(const.size)
        else:
            idx = self.data(idx_name)
            nidx = _prod(self.shape(idx))
        out = self.output(n.outputs[0])
        self.plan.add_launch_1d(ks.MOVEMENT_SOURCE, "gather_rows", _prod(self.shape(out)), [
            Buf(out), Buf(x), Buf(idx), I32(xs[axis]), I32(nidx), I32(_prod(xs[axis + 1:]))])


def build_plan(graph: Graph, lookup: GraphLookup) -> PartitionPlan:
    """The launches of one fused partition."""
    return PlanBuilder(graph, lookup).build()
