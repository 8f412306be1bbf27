"""Seeded random ONNX graphs aimed at onnxhal's optimizer passes and fused kernels.

``build(seed, tiny=False)`` -> (model bytes, feeds, meta). CNNs chain blocks of Conv (every group,
stride, dilation and padding form) with BatchNormalization, constant Mul/Add, activations,
residuals, channel shuffles, pools and Concat; MLPs chain MatMul/Gemm with biases, scales, Gelu
and LayerNorm patterns; some values are also graph outputs. Every graph is small (spatial <= 24,
channels <= 16). ``tiny`` gives 2-4 pixel CNN inputs and mostly dilated pools, whose windows may
hold padding only. Written for a differential test, which found
six bugs; ``tests/test_optimizer_random.py`` runs it against onnxruntime.
"""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto, helper, numpy_helper, shape_inference


class GenFail(Exception):
    pass


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


class Builder:
    def __init__(self, rng: np.random.Generator, opset: int, dtype, tiny: bool = False):
        self.rng = rng
        self.tiny = tiny
        self.opset = opset
        self.dtype = np.dtype(dtype)
        self.elem = TensorProto.DOUBLE if self.dtype == np.float64 else TensorProto.FLOAT
        self.nodes: list = []
        self.inits: list = []
        self.inputs: list = []
        self.outputs: list[str] = []
        self.feeds: dict[str, np.ndarray] = {}
        self.shapes: dict[str, tuple] = {}
        self.count = 0
        self.tags: list[str] = []
        self.weights: list[str] = []  # float initializer names, for reuse

    # ------------------------------------------------------------------ basics
    def fresh(self, p):
        self.count += 1
        return f"{p}_{self.count}"

    def snapshot(self):
        return (len(self.nodes), len(self.inits), len(self.inputs), list(self.outputs), dict(self.feeds),
                dict(self.shapes), list(self.tags), list(self.weights))

    def restore(self, s):
        self.nodes = self.nodes[:s[0]]
        self.inits = self.inits[:s[1]]
        self.inputs = self.inputs[:s[2]]
        self.outputs, self.feeds, self.shapes, self.tags, self.weights = s[3], s[4], s[5], s[6], s[7]

    def r(self, a, b=None):
        return float(self.rng.uniform(a, b))

    def ri(self, a, b):  # inclusive
        return int(self.rng.integers(a, b + 1))

    def p(self, prob):
        return bool(self.rng.random() < prob)

    def choice(self, seq, probs=None):
        if probs is not None:
            probs = np.asarray(probs, dtype=float)
            probs = probs / probs.sum()
        return seq[int(self.rng.choice(len(seq), p=probs))]

    def const(self, arr, p="c", dtype=None):
        name = self.fresh(p)
        arr = np.asarray(arr)
        if dtype is not None:
            arr = arr.astype(dtype)
        elif arr.dtype.kind == "f":
            arr = arr.astype(self.dtype)
        self.inits.append(numpy_helper.from_array(arr, name))
        self.shapes[name] = arr.shape
        if arr.dtype.kind == "f":
            self.weights.append(name)
        return name

    def ints(self, vals, p="shape"):
        return self.const(np.asarray(vals, dtype=np.int64), p, dtype=np.int64)

    def rand_const(self, shape, lo=-1.0, hi=1.0, p="c"):
        return self.const(self.rng.uniform(lo, hi, size=shape), p)

    def graph_input(self, shape, p="in"):
        name = self.fresh(p)
        self.inputs.append(helper.make_tensor_value_info(name, self.elem, list(shape)))
        self.feeds[name] = self.rng.uniform(-2, 2, size=shape).astype(self.dtype)
        self.shapes[name] = tuple(shape)
        return name

    def model(self, outputs=None):
        outs = outputs if outputs is not None else self.outputs
        seen, uniq = set(), []
        for o in outs:
            if o not in seen:
                seen.add(o)
                uniq.append(o)
        g = helper.make_graph(self.nodes, "fuzz", self.inputs,
                              [helper.make_tensor_value_info(o, self.elem, None) for o in uniq], self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", self.opset)])
        m.ir_version = 8
        return m

    def node(self, op, inputs, nout=1, **attrs):
        outs = [self.fresh(op.lower()) for _ in range(nout)]
        n = helper.make_node(op, list(inputs), outs, name=self.fresh("n_" + op), **attrs)
        self.nodes.append(n)
        try:
            m = shape_inference.infer_shapes(self.model(outs), strict_mode=True, data_prop=True)
        except Exception as exc:
            raise GenFail(f"{op}: {exc}") from None
        vi = {v.name: v for v in list(m.graph.value_info) + list(m.graph.output)}
        for o in outs:
            t = vi[o].type.tensor_type
            if not t.HasField("shape"):
                raise GenFail(f"{op}: no shape")
            dims = []
            for d in t.shape.dim:
                if not d.HasField("dim_value"):
                    raise GenFail(f"{op}: symbolic dim")
                dims.append(d.dim_value)
            if any(d == 0 for d in dims):
                raise GenFail(f"{op}: empty")
            self.shapes[o] = tuple(dims)
        return outs[0] if nout == 1 else outs

    def expose(self, name, prob=0.12):
        """Make ``name`` also a graph output, or give it a second reader that is an output."""
        u = self.rng.random()
        if u < prob:
            self.outputs.append(name)
            self.tags.append("expose_out")
        elif u < 2 * prob:
            self.outputs.append(self.node(self.choice(["Neg", "Abs", "Sigmoid"]), [name]))
            self.tags.append("expose_reader")

    # ------------------------------------------------------------------ activations
    def activation(self, x, allow_none=True, kinds=None):
        if allow_none and self.p(0.35):
            return x
        if self.dtype != np.float64 and kinds is None and self.p(0.08):
            return self.gelu(x)
        kinds = kinds or (["Relu", "LeakyRelu", "Clip", "Sigmoid", "Tanh", "HardSigmoid"] if self.dtype != np.float64
                          else ["Relu", "Clip", "Sigmoid", "Tanh"])  # ORT: float-only LeakyRelu/HardSigmoid
        op = self.choice(kinds)
        self.tags.append("act_" + op)
        if op == "LeakyRelu":
            return self.node(op, [x], alpha=self.choice([0.01, 0.1, 0.3, -0.5, 1.5]))
        if op == "HardSigmoid":
            return self.node(op, [x], alpha=self.r(0.05, 0.5), beta=self.r(0.2, 0.8))
        if op == "Clip":
            if self.opset < 11:
                return self.node(op, [x], min=-0.5, max=1.0)
            lo = self.choice([None, -1.0, 0.0, 0.3, -0.2])
            hi = self.choice([None, 1.0, 0.5, 6.0, 2.0])
            if self.p(0.05):
                lo, hi = 1.0, 0.5
                self.tags.append("clip_min_gt_max")
            ins = [x]
            mode = self.choice(["const", "const", "input"])
            def bound(v):
                if mode == "input":
                    self.tags.append("clip_input_bound")
                    name = self.fresh("clipb")
                    self.inputs.append(helper.make_tensor_value_info(name, self.elem, []))
                    self.feeds[name] = np.array(v, dtype=self.dtype)
                    return name
                return self.const(np.array(v), "clipb")
            if lo is not None or hi is not None:
                ins.append(bound(lo) if lo is not None else "")
            if hi is not None:
                ins.append(bound(hi))
            return self.node(op, ins)
        return self.node(op, [x])

    # ------------------------------------------------------------------ CNN
    def conv_params(self, x, m=None, groups=None, shape_keep=False, k=None):
        n, c = self.shapes[x][:2]
        sp = self.shapes[x][2:]
        nd = len(sp)
        attrs = {}
        if groups is None:
            opts = divisors(c)
            groups = self.choice([1, c] + opts, [4, 2] + [1] * len(opts))
        if m is None:
            if groups == c and self.p(0.7):
                m = c * self.choice([1, 1, 1, 2])
            else:
                m = groups * self.ri(1, max(1, 16 // groups))
            m = max(groups, min(m, 16 - 16 % groups if groups <= 16 else groups))
        if shape_keep:
            ks = [k or self.choice([1, 3, 3, 5])] * nd
            dil = [1] * nd
            strides = [1] * nd
            if self.p(0.5):
                attrs["auto_pad"] = self.choice(["SAME_UPPER", "SAME_LOWER"])
            else:
                pads = []
                for kk in ks:
                    t = kk - 1
                    a = self.ri(0, t) if self.p(0.3) else t // 2
                    pads.append(a)
                attrs["pads"] = pads + [kk - 1 - a for kk, a in zip(ks, pads)]
        else:
            base = k or self.choice([1, 3, 3, 5, 7], [3, 4, 0, 2, 1])
            ks = [base] * nd
            if nd == 2 and self.p(0.15):
                ks = [self.choice([1, 3, 5]), self.choice([1, 3, 5])]
            dil = [self.choice([1, 1, 1, 2, 3]) for _ in range(nd)] if self.p(0.3) else [1] * nd
            strides = [self.choice([1, 1, 2, 3])] * nd
            if self.p(0.2):
                strides = [self.ri(1, 3) for _ in range(nd)]
            mode = self.choice(["pads", "sym", "SAME_UPPER", "SAME_LOWER", "VALID", "none"], [4, 3, 2, 2, 1, 1])
            if mode in ("SAME_UPPER", "SAME_LOWER", "VALID"):
                attrs["auto_pad"] = mode
            elif mode == "pads":
                attrs["pads"] = [self.ri(0, kk - 1) for kk in ks] + [self.ri(0, kk - 1) for kk in ks]
            elif mode == "sym":
                h = [(kk - 1) * d // 2 for kk, d in zip(ks, dil)]
                attrs["pads"] = h + h
            # shrink the kernel where it does not fit
            for i in range(nd):
                pads = attrs.get("pads", [0] * (2 * nd))
                total = sp[i] + (pads[i] + pads[i + nd] if attrs.get("auto_pad") is None else 0)
                while (ks[i] - 1) * dil[i] + 1 > total and ks[i] > 1:
                    if dil[i] > 1:
                        dil[i] = 1
                    else:
                        ks[i] -= 2 if ks[i] > 2 else 1
                        if "pads" in attrs:
                            attrs["pads"][i] = min(attrs["pads"][i], ks[i] - 1)
                            attrs["pads"][i + nd] = min(attrs["pads"][i + nd], ks[i] - 1)
                            total = sp[i] + attrs["pads"][i] + attrs["pads"][i + nd]
        if attrs.get("auto_pad", "").startswith("SAME") and self.p(0.9):
            dil = [1] * nd  # onnxruntime rejects dilated SAME convolutions
        if any(d != 1 for d in dil):
            attrs["dilations"] = dil
        if any(s != 1 for s in strides) or self.p(0.2):
            attrs["strides"] = strides
        if self.p(0.5):
            attrs["kernel_shape"] = ks
        if groups != 1 or self.p(0.1):
            attrs["group"] = groups
        return m, groups, ks, attrs

    def conv(self, x, m=None, groups=None, bias=None, shape_keep=False, k=None):
        c = self.shapes[x][1]
        m, groups, ks, attrs = self.conv_params(x, m, groups, shape_keep, k)
        fan_in = (c // groups) * int(np.prod(ks))
        if self.p(0.04):
            self.tags.append("conv_weight_input")
            w = self.graph_input((m, c // groups, *ks), "Win")
            self.feeds[w] = (self.feeds[w] / math.sqrt(fan_in)).astype(self.dtype)
        else:
            w = self.const(self.rng.normal(0, 1.0 / math.sqrt(fan_in), size=(m, c // groups, *ks)), "W")
        ins = [x, w]
        if bias is None:
            bias = self.p(0.6)
        if bias:
            ins.append(self.rand_const((m,), -1, 1, "B"))
        tag = "conv"
        if groups == c and groups > 1:
            tag += "_dw"
        elif groups > 1:
            tag += "_grp"
        self.tags.append(tag)
        return self.node("Conv", ins, **attrs)

    def bn(self, x):
        c = self.shapes[x][1]
        scale = self.rng.uniform(0.5, 1.5, c) * np.where(self.rng.random(c) < 0.2, -1, 1)
        ins = [x, self.const(scale, "bn_s"), self.rand_const((c,), -1, 1, "bn_b"),
               self.rand_const((c,), -1, 1, "bn_m"), self.rand_const((c,), 0.1, 2.0, "bn_v")]
        self.tags.append("bn")
        return self.node("BatchNormalization", ins, epsilon=self.choice([1e-5, 1e-3, 0.1]))

    def affine_const(self, x, op=None):
        shp = self.shapes[x]
        n, c = shp[:2]
        sp = shp[2:]
        nd = len(sp)
        per = [(c,) + (1,) * nd, (1, c) + (1,) * nd, (1,), (), (1,) * (nd + 2), (1,) * (nd + 1), (c,) + (1,) * nd]
        if nd == 0:
            sp = (c,)  # (N, C): the broadcast shapes below then stand for (C,)-wide rows
        non = [(1, 1) + sp, (sp[-1],), (1,) * (nd + 1) + (sp[-1],), (1, c) + sp[:-1] + (1,), (n, c) + (1,) * nd,
               (n, 1) + (1,) * nd, (c,) + sp, (1,) * (nd + 3), (1, c, 1) + (1,) * nd]
        if self.p(0.6):
            shape = self.choice(per)
            self.tags.append("affine_per_channel")
        else:
            shape = self.choice(non)
            self.tags.append("affine_non_per_channel" + str(len(shape)))
        op = op or self.choice(["Mul", "Add"])
        v = self.rng.uniform(-1.5, 1.5, size=shape)
        if op == "Mul" and self.p(0.1):
            v = np.zeros(shape)
        cname = self.const(v, "k")
        ins = [x, cname] if self.p(0.6) else [cname, x]
        return self.node(op, ins)

    def block_conv(self, x):
        y = self.conv(x)
        if self.p(0.45):
            self.expose(y)
            y = self.bn(y)
        for _ in range(self.choice([0, 1, 1, 2])):
            self.expose(y)
            y = self.affine_const(y)
        self.expose(y)
        return self.activation(y)

    def block_bias_forward(self, x):
        a = self.conv(x, bias=True)
        self.tags.append("bias_forward")
        if self.p(0.15):
            self.expose(a)
        m = self.shapes[a][1]
        g = self.choice(divisors(m))
        mo = g * self.ri(1, max(1, 16 // g))
        attrs = {"group": g} if g > 1 or self.p(0.2) else {}
        u = self.rng.random()
        if u < 0.2:
            attrs["pads"] = [self.ri(0, 1) for _ in range(4)]
        elif u < 0.35:
            attrs["strides"] = [self.ri(1, 3)] * 2
        elif u < 0.45:
            attrs["auto_pad"] = self.choice(["SAME_UPPER", "SAME_LOWER", "VALID"])
        elif u < 0.5:
            attrs["dilations"] = [2, 2]
        k = (1, 1) if self.p(0.85) else (3, 3)
        if k == (3, 3):
            attrs.setdefault("pads", [1, 1, 1, 1]) if "auto_pad" not in attrs else None
        w = self.const(self.rng.normal(0, 1 / math.sqrt(m // g), size=(mo, m // g, *k)), "W1x1")
        ins = [a, w] + ([self.rand_const((mo,), -1, 1, "B")] if self.p(0.6) else [])
        y = self.node("Conv", ins, **attrs)
        return self.activation(y)

    def block_residual(self, x):
        c = self.shapes[x][1]
        y = self.conv(x, m=c, shape_keep=True)
        if self.p(0.3):
            y = self.bn(y)
        self.expose(y)
        kind = self.choice(["add", "add_rev", "sum", "sum_rev", "bcast_in", "bcast_const", "self", "two_convs", "sum3"],
                           [3, 3, 1, 1, 2, 1, 1, 2, 1])
        self.tags.append("residual_" + kind)
        sp = self.shapes[x][2:]
        if kind == "add":
            z = self.node("Add", [y, x])
        elif kind == "add_rev":
            z = self.node("Add", [x, y])
        elif kind == "sum":
            z = self.node("Sum", [y, x])
        elif kind == "sum_rev":
            z = self.node("Sum", [x, y])
        elif kind == "bcast_in":
            shape = self.choice([(1, c, 1, 1), (c, 1, 1), (1, 1) + tuple(sp), tuple(sp)[-1:], (1,) * 5])
            if len(sp) == 1:
                shape = self.choice([(1, c, 1), (c, 1), (1, 1) + tuple(sp)])
            r = self.graph_input(shape, "res")
            z = self.node("Add", [y, r] if self.p(0.5) else [r, y])
        elif kind == "bcast_const":
            z = self.affine_const(y, "Add")
        elif kind == "two_convs":
            y2 = self.conv(x, m=c, shape_keep=True)
            z = self.node("Add", [y, y2] if self.p(0.5) else [y2, y])
        elif kind == "sum3":
            z = self.node("Sum", [y, x, x])
        else:
            z = self.node("Add", [y, y])
        return self.activation(z)

    def shape_keeping_branch(self, x, kind):
        if kind == "conv":
            return self.conv(x, shape_keep=True)
        if kind == "relu":
            return self.node("Relu", [x])
        if kind == "maxpool_relu":
            r = self.node("Relu", [x])
            k = self.choice([1, 2, 3])
            if self.p(0.5):
                return self.node("MaxPool", [r], kernel_shape=[k] * self.nd(x), auto_pad=self.choice(["SAME_UPPER", "SAME_LOWER"]))
            pads = [(k - 1) // 2] * self.nd(x) + [k - 1 - (k - 1) // 2] * self.nd(x)
            return self.node("MaxPool", [r], kernel_shape=[k] * self.nd(x), pads=pads)
        if kind == "avgpool_relu":
            r = self.node("Relu", [x])
            return self.node("AveragePool", [r], kernel_shape=[3] * self.nd(x), pads=[1] * (2 * self.nd(x)),
                             count_include_pad=self.ri(0, 1))
        if kind == "raw":
            return x
        if kind == "sigmoid":
            return self.node("Sigmoid", [x])
        if kind == "conv_relu":
            return self.node("Relu", [self.conv(x, shape_keep=True)])
        raise AssertionError(kind)

    def nd(self, x):
        return len(self.shapes[x]) - 2

    def block_concat_relu(self, x):
        kinds = ["conv", "relu", "maxpool_relu", "avgpool_relu", "raw", "sigmoid", "conv_relu"]
        nb = self.ri(2, 3)
        probs = [5, 2, 2, 2, 1, 1, 1]
        branches = []
        for _ in range(nb):
            kind = self.choice(kinds, probs)
            self.tags.append("concat_" + kind)
            branches.append(self.shape_keeping_branch(x, kind))
        if self.p(0.15):
            self.expose(self.choice(branches), prob=0.5)
        if sum(self.shapes[b][1] for b in branches) > 24:
            branches = branches[:2]
        axis = 1 if self.p(0.85) else self.choice([2, -1])
        cat = self.node("Concat", branches, axis=axis)
        self.expose(cat, prob=0.08)
        y = self.node("Relu", [cat])
        self.tags.append("relu_concat")
        if self.shapes[y][1] > 16:
            y = self.conv(y, m=self.ri(4, 12), groups=1, k=1)
        return y

    def pool_attrs(self, x, allow_stride1=True):
        nd = self.nd(x)
        k = [self.choice([1, 2, 3, 3, 4, 5])] * nd
        if self.p(0.15):
            k = [self.choice([1, 2, 3]) for _ in range(nd)]
        attrs = {"kernel_shape": k}
        s = [self.choice([1, 2, 2, 3] if allow_stride1 else [2, 2, 3])] * nd
        if self.p(0.15):
            s = [self.ri(1, 3) for _ in range(nd)]
        if s != [1] * nd or self.p(0.3):
            attrs["strides"] = s
        mode = self.choice(["pads", "none", "SAME_UPPER", "SAME_LOWER", "VALID"], [5, 2, 2, 1, 1])
        if mode == "pads":
            attrs["pads"] = [self.ri(0, kk - 1) for kk in k] + [self.ri(0, kk - 1) for kk in k]
        elif mode != "none":
            attrs["auto_pad"] = mode
            if mode.startswith("SAME") and any(ss > kk for ss, kk in zip(s, k)) and self.p(0.8):
                attrs["strides"] = s = [min(ss, kk) for ss, kk in zip(s, k)]  # ORT: negative SAME pads
        if self.p(0.3):
            attrs["ceil_mode"] = 1
        return attrs, k

    def fit_pool(self, x, attrs, k, dil=None):
        sp = self.shapes[x][2:]
        nd = len(sp)
        pads = attrs.get("pads", [0] * (2 * nd))
        for i in range(nd):
            total = sp[i] + (pads[i] + pads[i + nd] if "auto_pad" not in attrs else 0)
            d = (dil or [1] * nd)[i]
            if (k[i] - 1) * d + 1 > total:
                return False
        return True

    def block_maxpool(self, x):
        kind = self.choice(["relu", "concat", "conv_relu", "plain"], [5, 2, 2, 1])
        self.tags.append("maxpool_" + kind)
        if kind == "relu":
            r = self.node("Relu", [x])
        elif kind == "concat":
            a = self.node("Relu", [x])
            b = self.node("Relu", [self.conv(x, shape_keep=True, m=self.ri(1, 6), groups=1)])
            if self.p(0.2):
                b = self.node("Sigmoid", [b])
                self.tags.append("maxpool_concat_nonrelu")
            r = self.node("Concat", [a, b] if self.p(0.5) else [b, a], axis=1)
        elif kind == "conv_relu":
            r = self.node("Relu", [self.conv(x)])
        else:
            r = x
        self.expose(r, prob=0.08)
        for _ in range(10):
            attrs, k = self.pool_attrs(r)
            if self.opset >= 10 and self.p(0.8 if self.tiny else 0.25) and not attrs.get("auto_pad", "").startswith("SAME"):
                # (ORT sizes dilated SAME pools without the dilation: a known ORT/spec difference)
                attrs["dilations"] = [self.choice([1, 2, 3])] * self.nd(r)
                self.tags.append("maxpool_dil")
            if self.fit_pool(r, attrs, k, attrs.get("dilations")):
                break
        else:
            raise GenFail("pool fit")
        if "pads" in attrs and any(attrs["pads"]):
            self.tags.append("maxpool_pads")
        if attrs.get("ceil_mode"):
            self.tags.append("maxpool_ceil")
        if self.p(0.1):
            y, idx = self.node("MaxPool", [r], nout=2, **attrs)
            self.tags.append("maxpool_indices")
            if self.p(0.5):
                self.outputs.append(self.node("Cast", [idx], to=self.elem))
        else:
            y = self.node("MaxPool", [r], **attrs)
        return y

    def block_avgpool(self, x):
        self.tags.append("avgpool")
        if self.p(0.5):
            x = self.node("Relu", [x])
        for _ in range(10):
            attrs, k = self.pool_attrs(x)
            if self.fit_pool(x, attrs, k):
                break
        else:
            raise GenFail("pool fit")
        attrs["count_include_pad"] = self.ri(0, 1)
        if attrs["count_include_pad"]:
            self.tags.append("avgpool_cip")
        return self.node("AveragePool", [x], **attrs)

    def block_shuffle(self, x):
        n, c = self.shapes[x][:2]
        if self.nd(x) != 2:
            raise GenFail("shuffle 2d only")
        gs = [d for d in divisors(c) if d > 1] or [1]
        g = self.choice(gs)
        mg = self.ri(1, max(1, 16 // g))
        m = g * mg
        y = self.conv(x, m=m, groups=g, shape_keep=self.p(0.5), k=self.choice([1, 1, 3]))
        if self.p(0.4):
            y = self.activation(y, allow_none=False, kinds=["Relu", "Clip", "LeakyRelu"])
        if self.p(0.2):
            y = self.bn(y)
        self.expose(y, prob=0.06)
        _, m, h, w = self.shapes[y]
        gd = [d for d in divisors(m) if d > 1]
        if not gd:
            raise GenFail("no shuffle groups")
        G = g if (g in gd and self.p(0.6)) else self.choice(gd)
        self.tags.append("shuffle_match" if G == g else "shuffle_mismatch")
        r1 = self.node("Reshape", [y, self.ints([n, G, m // G, h, w] if self.p(0.7) else [-1, G, m // G, h, w])])
        perm = [0, 2, 1, 3, 4] if self.p(0.9) else [0, 1, 2, 4, 3]
        t = self.node("Transpose", [r1], perm=perm)
        r2 = self.node("Reshape", [t, self.ints([n, m, h, w] if self.p(0.8) else [n, -1, h, w])])
        return r2

    def block_noop(self, x):
        op = self.choice(["Identity", "Dropout", "Cast", "CastChain", "DropoutRatio"])
        self.tags.append("noop_" + op)
        if op == "Cast":
            return self.node("Cast", [x], to=self.elem)
        if op == "CastChain":
            other = TensorProto.FLOAT16 if self.p(0.5) else (TensorProto.DOUBLE if self.elem == TensorProto.FLOAT else TensorProto.FLOAT)
            return self.node("Cast", [self.node("Cast", [x], to=other)], to=self.elem)
        if op == "DropoutRatio":
            if self.opset < 12:
                return self.node("Dropout", [x])
            return self.node("Dropout", [x, self.const(np.array(0.3)), self.const(np.array(False), dtype=np.bool_)])
        return self.node(op, [x])

    def block_transpose(self, x):
        """A layout change whose result onnxhal may hold as a non-contiguous view."""
        r = len(self.shapes[x])
        self.tags.append("transpose_view")
        perm = list(range(r))
        if r >= 4:
            perm[-1], perm[-2] = perm[-2], perm[-1]
        elif r >= 2:
            perm[-1], perm[-2] = perm[-2], perm[-1]
        else:
            raise GenFail("rank 1")
        return self.node("Transpose", [x], perm=perm)

    def block_folded_weights(self, x):
        """A Conv whose weights come from constant arithmetic (folded first, then fused)."""
        self.tags.append("const_chain")
        c = self.shapes[x][1]
        m = self.ri(2, 12)
        w0 = self.rand_const((m, c, 3, 3), -0.3, 0.3, "W0")
        w1 = self.rand_const((m, c, 3, 3), -0.3, 0.3, "W1")
        w = self.node("Add", [w0, w1])
        y = self.node("Conv", [x, w, self.rand_const((m,), -1, 1, "B")], pads=[1, 1, 1, 1])
        s = self.node("Mul", [self.rand_const((m, 1, 1), -1, 1), self.const(np.array(2.0))])
        y = self.node("Mul", [y, s])
        return self.activation(y)

    def block_bn(self, x):
        y = self.bn(x)
        if self.p(0.5):
            self.expose(y)
            y = self.affine_const(y)
        return self.activation(y)

    def cnn(self):
        nd = 2 if self.p(0.9) else 1
        n = self.choice([1, 1, 2, 3])
        c = self.ri(1, 8)
        lo_, hi_ = (2, 6) if self.p(0.2) else (5, 24)
        if self.tiny:
            lo_, hi_ = 2, 4
        sp = [self.ri(lo_, hi_)] + ([self.ri(lo_, hi_) if self.p(0.4) else None] if nd == 2 else [])
        if nd == 2 and sp[1] is None:
            sp[1] = sp[0]
        x = self.graph_input((n, c, *sp), "x")
        blocks = [self.block_conv, self.block_bias_forward, self.block_residual, self.block_concat_relu,
                  self.block_maxpool, self.block_avgpool, self.block_shuffle, self.block_noop,
                  self.block_folded_weights, self.block_bn, self.block_transpose]
        weights = [6, 3, 3, 3, 3, 1, 2, 1, 1, 1, 1]
        x = self.chain(x, blocks, weights, self.ri(1, 5),
                       lambda shape: int(np.prod(shape)) > 3 * 16 * 24 * 24 or shape[1] > 16)
        if self.p(0.35) and nd == 2:
            # classifier tail: GlobalAveragePool -> Flatten -> MLP
            g = self.node(self.choice(["GlobalAveragePool", "GlobalMaxPool"]), [x])
            x = self.node("Flatten", [g])
            self.tags.append("tail")
            for _ in range(self.ri(1, 2)):
                s = self.snapshot()
                try:
                    x = self.choice([self.block_matmul_bias, self.block_gemm])(x)
                except GenFail:
                    self.restore(s)
        self.outputs.append(x)

    # ------------------------------------------------------------------ MLP / attention
    def weight(self, k, n, p="Wm"):
        return self.const(self.rng.normal(0, 1 / math.sqrt(k), size=(k, n)), p)

    def block_matmul_bias(self, x):
        shp = self.shapes[x]
        k = shp[-1]
        n = self.ri(2, 16)
        w = self.weight(k, n)
        if self.p(0.15):
            self.tags.append("weights_shared")
            self.outputs.append(self.node("MatMul", [x, w]))
        mm = self.node("MatMul", [x, w])
        self.expose(mm, prob=0.06)
        if self.p(0.15):
            return self.activation(mm)
        lead = self.shapes[mm][:-1]
        bias_shapes = [(n,), (n,), (1, n), (1,), ()] + ([lead + (n,)] if lead else []) + \
                      ([(1, 1, n)] if len(lead) >= 1 else []) + ([(lead[-1], 1)] if lead else [])
        bshape = self.choice(bias_shapes)
        self.tags.append(f"mm_bias_rank{len(bshape)}_x{len(shp)}")
        if self.p(0.1):
            b = self.graph_input(bshape, "bias_in")
            self.tags.append("mm_bias_input")
        else:
            b = self.rand_const(bshape, -1, 1, "bias")
        y = self.node("Add", [mm, b] if self.p(0.6) else [b, mm])
        self.expose(y, prob=0.06)
        u = self.rng.random()
        if u < 0.3 and self.dtype != np.float64:
            return self.gelu(y)
        if u < 0.5:
            self.tags.append("mm_relu")
            return self.node("Relu", [y])
        return self.activation(y)

    def block_gemm(self, x):
        shp = self.shapes[x]
        if len(shp) != 2:
            raise GenFail("gemm 2-D")
        m, k = shp
        ta, tb = self.ri(0, 1) if self.p(0.3) else 0, self.ri(0, 1)
        rows, inner = (k, m) if ta else (m, k)
        n = self.ri(2, 16)
        wshape = (n, inner) if tb else (inner, n)
        w = self.const(self.rng.normal(0, 1 / math.sqrt(inner), size=wshape), "Wg")
        ins = [x, w]
        attrs = {}
        if ta:
            attrs["transA"] = 1
        if tb:
            attrs["transB"] = 1
        if self.p(0.3):
            attrs["alpha"] = self.choice([0.5, 2.0, -1.0, 0.125])
        if self.p(0.3):
            attrs["beta"] = self.choice([0.5, 2.0, 0.0, -1.0])
        if self.p(0.8):
            cshape = self.choice([(n,), (1, n), (rows, 1), (rows, n), (), (1,), (1, 1)])
            ins.append(self.rand_const(cshape, -1, 1, "C") if self.p(0.9) else self.graph_input(cshape, "Cin"))
        self.tags.append(f"gemm_ta{ta}_tb{tb}")
        y = self.node("Gemm", ins, **attrs)
        self.expose(y, prob=0.06)
        return self.activation(y)

    def gelu(self, x):
        variant = self.choice(["div", "mul"])
        order = self.choice(["outer_half", "inner_half"])
        self.tags.append(f"gelu_{variant}_{order}")
        s2 = math.sqrt(2.0)
        cshape = () if self.p(0.85) else self.choice([(1,), (1, 1, 1, 1, 1)])
        if variant == "div":
            t = self.node("Div", [x, self.const(np.full(cshape, s2))])
        else:
            c = self.const(np.full(cshape, 1 / s2))
            t = self.node("Mul", [x, c] if self.p(0.5) else [c, x])
        if cshape and len(cshape) > 1:
            self.tags.append("gelu_highrank_const")
        e = self.node("Erf", [t])
        one = self.const(np.array(1.0))
        a = self.node("Add", [e, one] if self.p(0.5) else [one, e])
        half = self.const(np.array(0.5))
        if order == "outer_half":
            m1 = self.node("Mul", [x, a] if self.p(0.5) else [a, x])
            self.expose(m1, prob=0.05)
            return self.node("Mul", [m1, half] if self.p(0.5) else [half, m1])
        h = self.node("Mul", [x, half] if self.p(0.5) else [half, x])
        return self.node("Mul", [h, a] if self.p(0.5) else [a, h])

    def layer_norm(self, x):
        r = len(self.shapes[x])
        d = self.shapes[x][-1]
        ax = [-1] if self.p(0.6) else [r - 1]
        def rmean(v):
            if self.opset >= 18:
                return self.node("ReduceMean", [v, self.ints(ax)], keepdims=1)
            return self.node("ReduceMean", [v], axes=ax, keepdims=1)
        mu = rmean(x)
        dd = self.node("Sub", [x, mu])
        if self.p(0.5):
            sq = self.node("Pow", [dd, self.const(np.array(2.0))])
        else:
            sq = self.node("Mul", [dd, dd])
        var = rmean(sq)
        eps = self.const(np.array(self.choice([1e-5, 1e-12, 1e-3])) if self.p(0.9)
                         else np.full((1, 1, 1, 1), 1e-5))
        if self.shapes[eps] == (1, 1, 1, 1):
            self.tags.append("ln_eps_highrank")
        v = self.node("Add", [var, eps])
        sd = self.node("Sqrt", [v])
        y = self.node("Div", [dd, sd])
        self.tags.append("layernorm")
        if self.p(0.7):
            g = self.rand_const((d,), 0.5, 1.5, "gamma")
            y = self.node("Mul", [y, g] if self.p(0.5) else [g, y])
            if self.p(0.7):
                b = self.rand_const((d,) if self.p(0.9) else (1, d), -1, 1, "beta")
                y = self.node("Add", [y, b] if self.p(0.5) else [b, y])
        return y

    def block_misc(self, x):
        u = self.rng.random()
        if len(self.shapes[x]) in (2, 3) and self.p(0.15):
            self.tags.append("bn_mlp")
            return self.block_bn(x)
        if u < 0.35 and self.dtype != np.float64:
            return self.gelu(x)
        if u < 0.7:
            return self.layer_norm(x)
        return self.activation(x, allow_none=False)

    def product(self, x, n):
        """x @ W (+ b) via MatMul[+Add] or Gemm (2-D)."""
        k = self.shapes[x][-1]
        if len(self.shapes[x]) == 2 and self.p(0.3):
            tb = self.ri(0, 1)
            w = self.const(self.rng.normal(0, 1 / math.sqrt(k), size=(n, k) if tb else (k, n)), "Wp")
            ins = [x, w] + ([self.rand_const((n,), -1, 1)] if self.p(0.6) else [])
            self.tags.append("scale_src_gemm")
            return self.node("Gemm", ins, transB=tb, alpha=self.choice([1.0, 0.5])), w
        w = self.weight(k, n, "Wq")
        y = self.node("MatMul", [x, w])
        if self.p(0.6):
            y = self.node("Add", [y, self.rand_const((n,), -1, 1)])
            self.tags.append("scale_src_mm_bias")
        else:
            self.tags.append("scale_src_mm")
        return y, w

    def block_attention(self, x):
        shp = self.shapes[x]
        if len(shp) != 3:
            raise GenFail("attention needs 3-D")
        b, s, d = shp
        heads = self.choice([h for h in divisors(d) if d // h >= 1][:4])
        dh = d // heads
        q, wq = self.product(x, d)
        k, wk = self.product(x, d)
        v, _ = self.product(x, d)
        if self.p(0.15):
            self.tags.append("scale_weights_shared")
            self.outputs.append(self.node("MatMul", [x, wq]))
        if self.p(0.1):
            self.tags.append("scale_q_exposed")
            self.outputs.append(q)
        def heads_of(t, perm):
            r = self.node("Reshape", [t, self.ints([b, s, heads, dh])])
            return self.node("Transpose", [r], perm=perm)
        qh = heads_of(q, [0, 2, 1, 3])
        kh = heads_of(k, [0, 2, 3, 1])
        vh = heads_of(v, [0, 2, 1, 3])
        sc = self.node("MatMul", [qh, kh])
        kind = self.choice(["div", "mul", "mul_rev", "nonscalar", "highrank", "neg", "div_rev", "vec1"],
                           [4, 3, 2, 1, 1, 1, 1, 1])
        self.tags.append("scale_" + kind)
        sd = math.sqrt(dh)
        if kind == "div":
            sc = self.node("Div", [sc, self.const(np.array(sd))])
        elif kind == "mul":
            sc = self.node("Mul", [sc, self.const(np.array(1 / sd))])
        elif kind == "mul_rev":
            sc = self.node("Mul", [self.const(np.array(1 / sd)), sc])
        elif kind == "nonscalar":
            sc = self.node("Div", [sc, self.const(self.rng.uniform(1, 3, size=(s,)))])
        elif kind == "highrank":
            sc = self.node("Mul", [sc, self.const(np.full((1, 1, 1, 1, 1), 1 / sd))])
            sc = self.node("Reshape", [sc, self.ints([b, heads, s, s])])
        elif kind == "neg":
            sc = self.node("Mul", [sc, self.const(np.array(-0.7))])
        elif kind == "div_rev":
            sc = self.node("Div", [self.const(np.array(sd)), sc])
        else:
            sc = self.node("Div", [sc, self.const(np.array([sd]))])
        self.expose(sc, prob=0.05)
        p_ = self.node("Softmax", [sc], axis=-1) if self.opset >= 13 else self.node("Softmax", [sc], axis=3)
        o = self.node("MatMul", [p_, vh])
        o = self.node("Transpose", [o], perm=[0, 2, 1, 3])
        return self.node("Reshape", [o, self.ints([b, s, d])])

    def block_scale_2d(self, x):
        """2-D: MatMul(product(x), other) * s."""
        shp = self.shapes[x]
        if len(shp) != 2:
            raise GenFail("2-D")
        m, k = shp
        a, w = self.product(x, self.ri(2, 8))
        if self.p(0.3):
            a = self.node("Relu", [a])
            self.tags.append("scale_through_relu")
        elif self.p(0.3):
            a = self.node("Identity", [a])
        n2 = self.shapes[a][1]
        if self.p(0.5):
            other = self.graph_input((n2, self.ri(2, 8)), "rhs")
            y = self.node("MatMul", [a, other])
        else:
            bp, _ = self.product(x, n2)
            y = self.node("MatMul", [a, self.node("Transpose", [bp], perm=[1, 0])])
        f = self.choice([0.5, 0.125, -2.0, 3.0, 1e-3])
        op = self.choice(["Div", "Mul"])
        self.tags.append("scale2d_" + op)
        return self.node(op, [y, self.const(np.array(f))])

    def mlp(self):
        rank = self.choice([1, 2, 2, 3, 3], [1, 4, 0, 4, 0])
        if rank == 1:
            shape = (self.ri(2, 16),)
        elif rank == 2:
            shape = (self.ri(1, 8), self.ri(2, 16))
        else:
            shape = (self.ri(1, 3), self.ri(1, 8), self.choice([4, 6, 8, 12, 16]))
        x = self.graph_input(shape, "x")
        blocks = [self.block_matmul_bias, self.block_gemm, self.block_misc, self.block_attention, self.block_scale_2d,
                  self.block_transpose]
        weights = [4, 2, 3, 3 if rank == 3 else 0, 2 if rank == 2 else 0, 1 if rank > 1 else 0]
        x = self.chain(x, blocks, weights, self.ri(1, 4), lambda shape: int(np.prod(shape)) > 4096)
        self.outputs.append(x)  # after chain(): its restore() may replace self.outputs

    def chain(self, x, blocks, weights, nblocks: int, too_big) -> str:
        """Apply ``nblocks`` blocks drawn by ``weights`` to ``x`` (30 draws at most): a block that
        raises GenFail, or whose result's shape is ``too_big``, is undone and does not count."""
        done = tries = 0
        while done < nblocks and tries < 30:
            tries += 1
            blk = self.choice(blocks, weights)
            s = self.snapshot()
            try:
                x2 = blk(x)
                if too_big(self.shapes[x2]):
                    raise GenFail("too big")
                x = x2
                done += 1
            except GenFail:
                self.restore(s)
        return x


def build(seed: int, tiny: bool = False):
    rng = np.random.default_rng(seed)
    opset = int(rng.choice([17, 17, 17, 17, 13, 11, 18]))
    kind = "cnn" if rng.random() < 0.6 else "mlp"
    # onnxruntime's CPU EP has no double Conv, AveragePool or Erf: float64 only for MLPs without Gelu
    dtype = np.float64 if kind == "mlp" and rng.random() < 0.2 else np.float32
    b = Builder(rng, opset, dtype, tiny)
    if kind == "cnn":
        b.cnn()
    else:
        b.mlp()
    m = b.model()
    return m.SerializeToString(), b.feeds, {"seed": seed, "opset": opset, "dtype": str(np.dtype(dtype)),
                                          "kind": kind, "tags": sorted(set(b.tags)), "nodes": len(b.nodes)}
