"""A seeded fuzzer of model loading and running: valid models, mutated, loaded and run in a child
process (so that a crash or a hang is found, not suffered), by onnxhal and, for comparison, by
onnxruntime.

``campaign(seed, count, ...)`` returns one ``Outcome`` per mutant. A mutant is fixed by (seed,
index): ``mutant(seed, index)`` rebuilds it in any process. Used by ``tests/test_fuzz_models.py``
(bounded, in the suite) and ``benchmarks/fuzz_campaign.py`` (thousands of mutants).
"""

from __future__ import annotations

import json
import os
import queue
import random
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper, numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, inits=(), opset=17, functions=()) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    ops = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("local", 1)] if functions else [])
    return helper.make_model(g, opset_imports=ops, ir_version=10, functions=list(functions))


def _f(name, *shape):
    return numpy_helper.from_array(np.linspace(-1, 1, int(np.prod(shape))).astype(np.float32).reshape(shape), name)


def _i64(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


# -- the valid models mutants start from -------------------------------------------------------------
def _seeds() -> dict[str, Callable[[], onnx.ModelProto]]:
    h = helper.make_node
    seeds: dict[str, Callable[[], onnx.ModelProto]] = {}
    seeds["add_mul"] = lambda: _model(
        [h("Add", ["x", "one"], ["a"], name="add"), h("Mul", ["a", "x"], ["y"], name="mul")],
        [_vi("x", [2, 3])], [_vi("y", [2, 3])], [_f("one", 3)])
    seeds["conv_relu_pool"] = lambda: _model(
        [h("Conv", ["x", "w", "b"], ["c"], name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
         h("Relu", ["c"], ["r"], name="relu"), h("MaxPool", ["r"], ["y"], name="pool", kernel_shape=[2, 2], strides=[2, 2])],
        [_vi("x", [1, 2, 4, 4])], [_vi("y", [1, 3, 2, 2])], [_f("w", 3, 2, 3, 3), _f("b", 3)])
    seeds["matmul_softmax"] = lambda: _model(
        [h("MatMul", ["x", "w"], ["m"], name="mm"), h("Add", ["m", "b"], ["a"], name="bias"),
         h("Softmax", ["a"], ["y"], name="sm", axis=-1)],
        [_vi("x", ["batch", 4])], [_vi("y", ["batch", 3])], [_f("w", 4, 3), _f("b", 3)])
    seeds["layer_norm"] = lambda: _model(
        [h("LayerNormalization", ["x", "s", "b"], ["y", "mean", "isd"], name="ln", axis=-1, epsilon=1e-5)],
        [_vi("x", [2, 3, 4])], [_vi("y", [2, 3, 4]), _vi("mean", None), _vi("isd", None)], [_f("s", 4), _f("b", 4)])
    seeds["gemm"] = lambda: _model(
        [h("Gemm", ["x", "w", "b"], ["y"], name="gemm", transB=1, alpha=0.5)],
        [_vi("x", [2, 4])], [_vi("y", [2, 3])], [_f("w", 3, 4), _f("b", 3)])
    seeds["shape_ops"] = lambda: _model(
        [h("Reshape", ["x", "shape"], ["r"], name="reshape"), h("Transpose", ["r"], ["t"], name="tr", perm=[1, 0]),
         h("Concat", ["t", "t"], ["c"], name="cat", axis=0),
         h("Slice", ["c", "starts", "ends", "axes"], ["y"], name="slice")],
        [_vi("x", [2, 3])], [_vi("y", None)],
        [_i64("shape", [3, 2]), _i64("starts", [1]), _i64("ends", [2**63 - 1]), _i64("axes", [0])])
    seeds["gather_reduce"] = lambda: _model(
        [h("Gather", ["x", "idx"], ["g"], name="gather", axis=1), h("ReduceMean", ["g"], ["y"], name="rm", axes=[1],
                                                                    keepdims=0)],
        [_vi("x", [2, 5])], [_vi("y", None)], [_i64("idx", [0, 4, 2])], opset=13)
    seeds["cast_split"] = lambda: _model(
        [h("Cast", ["x"], ["c"], name="cast", to=TensorProto.INT64),
         h("Split", ["c"], ["y0", "y1"], name="split", axis=1, num_outputs=2)],
        [_vi("x", [2, 4])], [_vi("y0", None, TensorProto.INT64), _vi("y1", None, TensorProto.INT64)], opset=18)
    seeds["einsum"] = lambda: _model(
        [h("Einsum", ["a", "b"], ["y"], name="es", equation="bij,bjk->bik")],
        [_vi("a", [2, 3, 4]), _vi("b", [2, 4, 5])], [_vi("y", None)])

    def if_model():
        then = helper.make_graph([h("Relu", ["x"], ["t"], name="then_relu")], "then", [], [_vi("t", [2])])
        other = helper.make_graph([h("Neg", ["x"], ["e"], name="else_neg")], "else", [], [_vi("e", [2])])
        return _model([h("If", ["c"], ["y"], name="if", then_branch=then, else_branch=other)],
                      [_vi("c", [], TensorProto.BOOL), _vi("x", [2])], [_vi("y", [2])])

    def loop_model():
        body = helper.make_graph(
            [h("Identity", ["cin"], ["cout"], name="keep"), h("Add", ["v", "x"], ["v2"], name="acc"),
             h("Mul", ["v2", "v2"], ["sq"], name="sq")],
            "body", [_vi("i", [], TensorProto.INT64), _vi("cin", [], TensorProto.BOOL), _vi("v", [2])],
            [_vi("cout", [], TensorProto.BOOL), _vi("v2", [2]), _vi("sq", [2])])
        return _model([h("Loop", ["n", "", "x"], ["y", "scan"], name="loop", body=body)],
                      [_vi("n", [], TensorProto.INT64), _vi("x", [2])], [_vi("y", [2]), _vi("scan", None)])

    def scan_model():
        body = helper.make_graph([h("Add", ["s", "r"], ["s2"], name="acc"), h("Identity", ["s2"], ["o"], name="out")],
                                 "body", [_vi("s", [3]), _vi("r", [3])], [_vi("s2", [3]), _vi("o", [3])])
        return _model([h("Scan", ["s0", "xs"], ["sf", "ys"], name="scan", body=body, num_scan_inputs=1)],
                      [_vi("s0", [3]), _vi("xs", [4, 3])], [_vi("sf", [3]), _vi("ys", None)])

    def function_model():
        fn = helper.make_function("local", "double_relu", ["a"], ["b"],
                                  [h("Add", ["a", "a"], ["t"]), h("Relu", ["t"], ["b"])], [helper.make_opsetid("", 17)])
        return _model([h("double_relu", ["x"], ["y"], domain="local", name="call")], [_vi("x", [3])], [_vi("y", [3])],
                      functions=[fn])

    seeds["pad_resize"] = lambda: _model(
        [h("Pad", ["x", "pads"], ["p"], name="pad", mode="reflect"),
         h("Resize", ["p", "", "scales"], ["y"], name="resize", mode="linear")],
        [_vi("x", [1, 1, 3, 3])], [_vi("y", None)],
        [_i64("pads", [0, 0, 1, 1, 0, 0, 1, 1]), numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")])
    seeds["topk_argmax"] = lambda: _model(
        [h("TopK", ["x", "k"], ["v", "i"], name="topk", axis=1), h("ArgMax", ["v"], ["y"], name="am", axis=0,
                                                                      keepdims=1)],
        [_vi("x", [3, 5])], [_vi("y", None, TensorProto.INT64), _vi("i", None, TensorProto.INT64)], [_i64("k", [2])])
    seeds["scatter_gather_elements"] = lambda: _model(
        [h("GatherElements", ["x", "idx"], ["g"], name="ge", axis=1),
         h("ScatterElements", ["x", "idx", "g"], ["y"], name="se", axis=1)],
        [_vi("x", [2, 3])], [_vi("y", None)], [_i64("idx", [[0, 2], [1, 0]])])
    seeds["lstm"] = lambda: _model(
        [h("LSTM", ["x", "w", "r", "b"], ["yall", "yh"], name="lstm", hidden_size=2)],
        [_vi("x", [3, 1, 2])], [_vi("yall", None), _vi("yh", None)], [_f("w", 1, 8, 2), _f("r", 1, 8, 2), _f("b", 1, 16)])
    seeds["quantize"] = lambda: _model(
        [h("QuantizeLinear", ["x", "s", "z"], ["q"], name="q"), h("DequantizeLinear", ["q", "s", "z"], ["y"], name="dq")],
        [_vi("x", [2, 3])], [_vi("y", None)],
        [numpy_helper.from_array(np.array(0.05, np.float32), "s"), numpy_helper.from_array(np.array(3, np.uint8), "z")])
    seeds["convtranspose_bn"] = lambda: _model(
        [h("ConvTranspose", ["x", "w"], ["c"], name="ct", strides=[2, 2]),
         h("BatchNormalization", ["c", "g", "b", "m", "v"], ["y"], name="bn")],
        [_vi("x", [1, 2, 3, 3])], [_vi("y", None)],
        [_f("w", 2, 3, 2, 2), _f("g", 3), _f("b", 3), _f("m", 3), numpy_helper.from_array(np.ones(3, np.float32), "v")])
    seeds["expand_tile_range"] = lambda: _model(
        [h("Range", ["start", "limit", "delta"], ["r"], name="range"), h("Expand", ["r", "shape"], ["e"], name="expand"),
         h("Tile", ["e", "reps"], ["y"], name="tile")],
        [], [_vi("y", None, TensorProto.INT64)],
        [_i64("start", 0), _i64("limit", 4), _i64("delta", 1), _i64("shape", [2, 4]), _i64("reps", [1, 2])])
    seeds["onehot_cumsum_where"] = lambda: _model(
        [h("OneHot", ["idx", "depth", "values"], ["o"], name="onehot", axis=-1),
         h("CumSum", ["o", "axis"], ["c"], name="cumsum"), h("Greater", ["c", "half"], ["m"], name="gt"),
         h("Where", ["m", "c", "half"], ["y"], name="where")],
        [_vi("idx", [3], TensorProto.INT64)], [_vi("y", None)],
        [_i64("depth", [4]), numpy_helper.from_array(np.array([0, 1], np.float32), "values"), _i64("axis", 1),
         numpy_helper.from_array(np.array(0.5, np.float32), "half")])
    seeds["space_trilu"] = lambda: _model(
        [h("DepthToSpace", ["x"], ["d"], name="d2s", blocksize=2, mode="CRD"), h("Trilu", ["d", "k"], ["y"], name="trilu",
                                                                                   upper=0)],
        [_vi("x", [1, 4, 2, 3])], [_vi("y", None)], [_i64("k", 1)])
    seeds["nonzero_unique"] = lambda: _model(
        [h("NonZero", ["x"], ["nz"], name="nonzero"), h("Unique", ["nz"], ["u", "i", "inv", "c"], name="unique", sorted=1)],
        [_vi("x", [3, 4])], [_vi("u", None, TensorProto.INT64), _vi("c", None, TensorProto.INT64)])
    seeds["clip_mod"] = lambda: _model(
        [h("Clip", ["x", "lo", "hi"], ["c"], name="clip"), h("Mod", ["c", "m"], ["y"], name="mod", fmod=1)],
        [_vi("x", [2, 3])], [_vi("y", None)],
        [numpy_helper.from_array(np.array(-0.5, np.float32), "lo"), numpy_helper.from_array(np.array(0.5, np.float32), "hi"),
         numpy_helper.from_array(np.full(3, 0.3, np.float32), "m")])
    seeds["sequence"] = lambda: _model(
        [h("SplitToSequence", ["x"], ["seq"], name="split", axis=1),
         h("SequenceAt", ["seq", "pos"], ["at"], name="at"),
         h("ConcatFromSequence", ["seq"], ["cat"], name="cat", axis=0, new_axis=1),
         h("Add", ["cat", "at"], ["y"], name="add")],
        [_vi("x", [2, 3])], [_vi("y", None)], [_i64("pos", -1)])
    seeds["reduce_norms"] = lambda: _model(
        [h("ReduceL2", ["x", "axes"], ["l2"], name="l2", keepdims=1), h("ReduceLogSumExp", ["x", "axes"], ["lse"],
                                                                         name="lse", keepdims=1),
         h("Sub", ["lse", "l2"], ["y"], name="sub")],
        [_vi("x", [2, 3, 4])], [_vi("y", None)], [_i64("axes", [1, -1])], opset=18)
    seeds["nms"] = lambda: _model(
        [h("NonMaxSuppression", ["boxes", "scores", "k", "iou", "th"], ["y"], name="nms", center_point_box=0)],
        [_vi("boxes", [1, 4, 4]), _vi("scores", [1, 1, 4])], [_vi("y", None, TensorProto.INT64)],
        [_i64("k", [3]), numpy_helper.from_array(np.array([0.5], np.float32), "iou"),
         numpy_helper.from_array(np.array([0.0], np.float32), "th")])
    seeds["if"] = if_model
    seeds["loop"] = loop_model
    seeds["scan"] = scan_model
    seeds["function"] = function_model
    return seeds


SEEDS = _seeds()


# -- mutations ---------------------------------------------------------------------------------------
def _all_graphs(g: onnx.GraphProto) -> list[onnx.GraphProto]:
    out = [g]
    for n in g.node:
        for a in n.attribute:
            if a.type == AttributeProto.GRAPH:
                out += _all_graphs(a.g)
            for sub in a.graphs:
                out += _all_graphs(sub)
    return out


def _nodes(m: onnx.ModelProto) -> list[onnx.NodeProto]:
    nodes = [n for g in _all_graphs(m.graph) for n in g.node]
    return nodes + [n for f in m.functions for n in f.node]


def _names(m: onnx.ModelProto) -> list[str]:
    return sorted({x for n in _nodes(m) for x in (*n.input, *n.output) if x})


HUGE = [2**31, -2**31, 2**62, -2**62, 2**63 - 1, -2**63, 7, -7, -1, 0, 2**40]


def m_truncate(m, r):
    data = m.SerializeToString()
    return data[:r.randrange(len(data))]


def m_byte_flips(m, r):
    data = bytearray(m.SerializeToString())
    for _ in range(r.randint(1, 6)):
        data[r.randrange(len(data))] = r.randrange(256)
    return bytes(data)


def m_unknown_op(m, r):
    r.choice(_nodes(m)).op_type = r.choice(["NoSuchOp", "", "Relu\x00", "conv", "\xff\xfe"])


def m_unknown_domain(m, r):
    r.choice(_nodes(m)).domain = r.choice(["com.nowhere", "ai.onnx.ml", "local", "ai.onnx"])


def m_undefined_input(m, r):
    n = r.choice([n for n in _nodes(m) if n.input] or _nodes(m))
    if n.input:
        n.input[r.randrange(len(n.input))] = "undefined_value"


def m_duplicate_output(m, r):
    names = _names(m)
    n = r.choice(_nodes(m))
    n.output[r.randrange(len(n.output))] = r.choice(names + [m.graph.input[0].name])


def m_cycle(m, r):
    nodes = list(m.graph.node)
    if len(nodes) < 2:
        nodes[0].input.append(nodes[0].output[0])
        return
    i, j = sorted(r.sample(range(len(nodes)), 2))
    if nodes[i].input:
        nodes[i].input[0] = nodes[j].output[0]


def m_self_loop(m, r):
    n = r.choice(_nodes(m))
    if n.input:
        n.input[0] = n.output[0]


def m_attribute_type(m, r):
    attrs = [a for n in _nodes(m) for a in n.attribute]
    if not attrs:
        return m_extra_attribute(m, r)
    a = r.choice(attrs)
    kind = r.randrange(5)
    if kind == 0:
        a.type = r.choice([t for t in AttributeProto.AttributeType.values() if t != a.type])
    elif kind == 1:
        a.ClearField("i"), a.ClearField("ints"), a.ClearField("s")
        a.type, a.f = AttributeProto.FLOAT, 1.5
    elif kind == 2:
        a.ClearField("i"), a.ClearField("ints")
        a.type, a.s = AttributeProto.STRING, r.choice([b"x", b"\xff\xfe", b""])
    elif kind == 3:
        a.f = 2.5  # a second value field
    else:
        a.name = r.choice(["", "no_such_attribute", a.name + "\x00"])


def m_extra_attribute(m, r):
    n = r.choice(_nodes(m))
    n.attribute.append(helper.make_attribute(r.choice(["axis", "perm", "foo", "kernel_shape"]),
                                             r.choice([3, [1, 0], 1.0, "s"])))


def m_duplicate_attribute(m, r):
    n = r.choice([n for n in _nodes(m) if n.attribute] or _nodes(m))
    if n.attribute:
        a = onnx.AttributeProto()
        a.CopyFrom(r.choice(n.attribute))
        n.attribute.append(a)


def m_drop_attribute(m, r):
    n = r.choice([n for n in _nodes(m) if n.attribute] or _nodes(m))
    if n.attribute:
        del n.attribute[r.randrange(len(n.attribute))]


def m_int_attribute_values(m, r):
    attrs = [a for n in _nodes(m) for a in n.attribute if a.type in (AttributeProto.INT, AttributeProto.INTS)]
    if not attrs:
        return m_extra_attribute(m, r)
    a = r.choice(attrs)
    if a.type == AttributeProto.INT:
        a.i = r.choice(HUGE)
    else:
        vals = list(a.ints) or [0]
        vals[r.randrange(len(vals))] = r.choice(HUGE)
        if r.random() < 0.3:
            vals = vals + vals[:1]
        del a.ints[:]
        a.ints.extend(vals)


def m_string_attribute_values(m, r):
    attrs = [a for n in _nodes(m) for a in n.attribute if a.type == AttributeProto.STRING]
    if not attrs:
        return m_int_attribute_values(m, r)
    r.choice(attrs).s = r.choice([b"", b"\x18", b"...", b"a,b->", b"bij,bjk->bikk", b"\xff", b"NOTSET", b"bij.,bjk"])


def m_dims(m, r):
    vis = [v for g in _all_graphs(m.graph) for v in (*g.input, *g.output)
           if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape")]
    if not vis:
        return
    v = r.choice(vis)
    dims = v.type.tensor_type.shape.dim
    if dims and r.random() < 0.8:
        dims[r.randrange(len(dims))].dim_value = r.choice(HUGE)
    else:
        dims.add().dim_value = r.choice([1, 2, 2**40])


def m_elem_type(m, r):
    vis = [v for g in _all_graphs(m.graph) for v in (*g.input, *g.output) if v.type.HasField("tensor_type")]
    if vis:
        r.choice(vis).type.tensor_type.elem_type = r.choice([0, 2, 6, 7, 8, 9, 10, 11, 16, 40, 999])


def m_initializer(m, r):
    inits = [t for g in _all_graphs(m.graph) for t in g.initializer]
    if not inits:
        return m_dims(m, r)
    t = r.choice(inits)
    kind = r.randrange(5)
    if kind == 0 and t.raw_data:
        t.raw_data = t.raw_data[:r.randrange(len(t.raw_data))]
    elif kind == 1:
        t.dims[r.randrange(len(t.dims))] = r.choice(HUGE) if t.dims else 3
    elif kind == 2:
        t.data_type = r.choice([0, 8, 16, 40, 999])
    elif kind == 3:
        raw = t.raw_data
        t.ClearField("raw_data")
        t.float_data.extend([1.0] * (len(raw) // 8))
    else:
        t.name = r.choice(["", t.name + "_renamed"])


def m_opset(m, r):
    m.opset_import[0].version = r.choice([0, 1, 5, 999, -1, 2**40])


def m_ir_version(m, r):
    m.ir_version = r.choice([0, 1, 3, 999, -5])


def m_node_arity(m, r):
    n = r.choice(_nodes(m))
    kind = r.randrange(4)
    if kind == 0 and n.input:
        del n.input[-1]
    elif kind == 1:
        n.input.append(r.choice(list(n.input) or ["x"]))
    elif kind == 2 and len(n.output) > 0:
        n.output.append(n.output[0] + "_extra")
    else:
        if n.input:
            n.input[r.randrange(len(n.input))] = ""


def m_graph_io(m, r):
    kind = r.randrange(4)
    g = m.graph
    if kind == 0 and g.input:
        del g.input[r.randrange(len(g.input))]
    elif kind == 1 and g.output:
        del g.output[r.randrange(len(g.output))]
    elif kind == 2:
        g.output.append(_vi("not_produced", [1]))
    else:
        g.input.append(g.input[0] if g.input else _vi("extra", [1]))


def m_subgraph(m, r):
    subs = [(n, a) for n in _nodes(m) for a in n.attribute if a.type == AttributeProto.GRAPH]
    if not subs:
        return m_node_arity(m, r)
    n, a = r.choice(subs)
    kind = r.randrange(5)
    if kind == 0:
        del a.g.output[:]
    elif kind == 1:
        a.g.input.append(_vi("extra_in", [1]))
    elif kind == 2:
        n.attribute.remove(a)
    elif kind == 3:
        a.g.node[0].input[0] = "not_in_scope" if a.g.node and a.g.node[0].input else ""
    else:
        del a.g.node[:]


def m_function(m, r):
    if not m.functions:
        fn = helper.make_function("local", "f", ["a"], ["b"], [helper.make_node("Relu", ["a"], ["b"])],
                                  [helper.make_opsetid("", 17)])
        m.functions.append(fn)
        return
    f = m.functions[0]
    kind = r.randrange(4)
    if kind == 0:
        f.node[0].op_type, f.node[0].domain = f.name, f.domain  # recursion
    elif kind == 1:
        del f.output[:]
    elif kind == 2:
        f.node[0].input[0] = "undefined_in_function"
    else:
        del f.opset_import[:]


def m_node_order(m, r):
    nodes = list(m.graph.node)
    r.shuffle(nodes)
    del m.graph.node[:]
    m.graph.node.extend(nodes)


def m_symbolic_dims(m, r):
    """Every declared input dimension made symbolic: the feeds (2 wherever a dimension is symbolic)
    then meet the kernels with shapes the model did not plan for."""
    for v in m.graph.input:
        for d in v.type.tensor_type.shape.dim:
            d.dim_param = r.choice(["n", "m", "batch"])


def m_swap_inputs(m, r):
    n = r.choice([n for n in _nodes(m) if len(n.input) > 1] or _nodes(m))
    if len(n.input) > 1:
        i, j = r.sample(range(len(n.input)), 2)
        n.input[i], n.input[j] = n.input[j], n.input[i]


MUTATIONS: dict[str, Callable] = {f.__name__[2:]: f for f in (
    m_truncate, m_byte_flips, m_unknown_op, m_unknown_domain, m_undefined_input, m_duplicate_output, m_cycle,
    m_self_loop, m_attribute_type, m_extra_attribute, m_duplicate_attribute, m_drop_attribute,
    m_int_attribute_values, m_string_attribute_values, m_dims, m_elem_type, m_initializer, m_opset, m_ir_version,
    m_node_arity, m_graph_io, m_subgraph, m_function, m_node_order, m_symbolic_dims, m_swap_inputs)}


def mutant(seed: int, index: int) -> tuple[str, str, bytes]:
    """(seed model, mutation names joined by '+', the mutant's bytes) for a (seed, index)."""
    r = random.Random(seed * 1_000_003 + index)
    base = r.choice(sorted(SEEDS))
    m = SEEDS[base]()
    names = [r.choice(sorted(MUTATIONS)) for _ in range(1 if r.random() < 0.7 else 2)]
    data = None
    for name in names:
        if data is not None:  # a byte-level mutant takes no model-level mutation after it
            break
        try:
            out = MUTATIONS[name](m, r)
        except (ValueError, TypeError, IndexError):  # protobuf refused the change: the model stays as it was
            continue
        if isinstance(out, bytes):
            data = out
    return base, "+".join(names), data if data is not None else m.SerializeToString()


# -- external data -------------------------------------------------------------------------------
EXTERNAL_LOCATIONS = ["weights.bin", "../weights.bin", "/etc/hostname", "missing.bin", "sub/../weights.bin",
                      "link.bin", "\udcff.bin", "", "weights.bin\x00x", "."]


def external_mutant(folder: str, index: int) -> str:
    """A model whose initializer ``w`` lives in external data at a hostile location or range; its path."""
    r = random.Random(index)
    w = np.linspace(-1, 1, 6).astype(np.float32)
    with open(os.path.join(folder, "weights.bin"), "wb") as f:
        f.write(w.tobytes())
    if not os.path.lexists(os.path.join(folder, "link.bin")):
        os.symlink("weights.bin", os.path.join(folder, "link.bin"))
    m = _model([helper.make_node("Add", ["x", "w"], ["y"], name="add")], [_vi("x", [6])], [_vi("y", [6])])
    t = m.graph.initializer.add()
    t.name, t.data_type = "w", TensorProto.FLOAT
    t.dims.append(6)
    t.data_location = TensorProto.EXTERNAL
    location = EXTERNAL_LOCATIONS[index % len(EXTERNAL_LOCATIONS)]
    raw = location.encode("utf-8", "surrogateescape")
    placeholder = "Z" * len(raw) if raw else ""  # protobuf's Python API takes only valid UTF-8: patched below
    entries = {"location": placeholder}
    if r.random() < 0.5:
        entries["offset"] = str(r.choice([0, 4, 24, -4, 2**62, "x"]))
        entries["length"] = str(r.choice([24, 8, 0, -1, 2**40, "y"]))
    for k, v in entries.items():
        e = t.external_data.add()
        e.key, e.value = k, v
    data = m.SerializeToString()
    if raw:
        data = data.replace(placeholder.encode(), raw, 1)
    path = os.path.join(folder, f"model{index}.onnx")
    with open(path, "wb") as f:
        f.write(data)
    return path


# -- running a mutant ----------------------------------------------------------------------------
def _feeds_for(proto_bytes: bytes) -> dict[str, np.ndarray]:
    m = onnx.ModelProto()
    try:
        m.ParseFromString(proto_bytes)
    except Exception:
        return {}
    inits = {t.name for t in m.graph.initializer}
    feeds = {}
    for v in m.graph.input:
        if v.name in inits or not v.type.HasField("tensor_type"):
            continue
        tt = v.type.tensor_type
        try:
            dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        except Exception:
            dtype = np.dtype(np.float32)
        dims = [d.dim_value if d.HasField("dim_value") and 0 <= d.dim_value <= 16 else 2 for d in tt.shape.dim]
        if dtype == np.bool_:
            feeds[v.name] = np.ones(dims, np.bool_) if v.name != "c" else np.array(True)
        elif dtype.kind in "iu":
            feeds[v.name] = np.full(dims, 3, dtype)
        elif dtype.kind in "fc":
            feeds[v.name] = np.linspace(-1, 1, int(np.prod(dims))).astype(dtype).reshape(dims)
        else:
            feeds[v.name] = np.full(dims, "a", object)
    return feeds


#: Seconds after which a mutant's run is told to terminate (RunOptions.terminate).
RUN_SECONDS = 5.0


def _outcome(runtime, model, feeds) -> list[str]:
    """[phase, kind, class, message]: phase load/run/done; kind typed/untyped/ok."""
    from onnxhal.errors import OrtError

    typed = OrtError if runtime.__name__ == "onnxhal" else Exception
    phase = "load"
    run_options = runtime.RunOptions()
    # A valid model may loop for ever (Loop without a trip count or condition): the run must stop
    # when told to, within a bounded time, as onnxruntime's does.
    stop = threading.Timer(RUN_SECONDS, lambda: setattr(run_options, "terminate", True))
    try:
        sess = runtime.InferenceSession(model, providers=["CPUExecutionProvider"])
        phase = "run"
        stop.start()
        sess.run(None, feeds, run_options)
        return ["done", "ok", "", ""]
    except Exception as e:  # the point: what escapes, and whether it is typed
        return [phase, "typed" if isinstance(e, typed) else "untyped", type(e).__name__, str(e)[:300]]
    finally:
        stop.cancel()


def _worker(seed: int, start: int, count: int, with_ort: bool, external_folder: str | None) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))  # a mutant asking for terabytes fails, typed
    import onnxhal

    ort = None
    if with_ort:
        import onnxruntime as ort

        ort.set_default_logger_severity(4)
    for k in range(start, start + count):
        if external_folder is not None:
            base, mutation, model = "external", "external_data", external_mutant(external_folder, k)
            feeds = {"x": np.ones(6, np.float32)}
        else:
            base, mutation, data = mutant(seed, k)
            model, feeds = data, _feeds_for(data)
        print("START", k, "onnxhal", flush=True)
        ours = _outcome(onnxhal, model, feeds)
        print("OURS", json.dumps(ours), flush=True)  # kept if onnxruntime then crashes or hangs
        theirs = None
        if ort is not None:
            print("START", k, "onnxruntime", flush=True)
            theirs = _outcome(ort, model, feeds)
        print("RESULT", json.dumps([k, base, mutation, ours, theirs]), flush=True)


def _pump(proc: subprocess.Popen, lines: queue.Queue) -> None:
    for line in proc.stdout:
        lines.put(line)
    lines.put(None)


@dataclass
class Outcome:
    index: int
    seed_model: str
    mutation: str
    onnxhal: list  # [phase, kind, class, message]; kind: ok, typed, untyped, crash, hang
    onnxruntime: list | None


def campaign(seed: int, count: int, with_ort: bool = True, hang_seconds: float = 20.0, external: bool = False,
             progress: Callable[[int], None] | None = None, worker: str = "tests.fuzz_models") -> list[Outcome]:
    """Run mutants ``0..count-1`` of ``seed`` in child processes, restarting the child after a crash
    or a hang (a mutant that gives no result for ``hang_seconds``). ``worker``: the module whose
    ``_worker`` runs them (tests/fuzz_bridge.py runs them inside onnxruntime through the bridge)."""
    results: list[Outcome] = []
    start = 0
    folder = tempfile.mkdtemp(prefix="onnxhal-fuzz-") if external else None
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONPATH=ROOT)
    while start < count:
        cmd = [sys.executable, "-c", f"from {worker} import _worker; _worker({seed}, {start}, {count - start}, "
                                     f"{with_ort}, {folder!r})"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT, env=env)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=_pump, args=(proc, lines), daemon=True).start()
        current: tuple[int, str] | None = None
        ours: list | None = None
        while True:
            try:
                line = lines.get(timeout=hang_seconds)
            except queue.Empty:
                proc.kill()
                proc.wait()
                failure = "hang"
                break
            if line is None:
                proc.wait()
                failure = f"crash {proc.returncode}" if current is not None else ""
                break
            if line.startswith("START "):
                _, k, who = line.split()
                current = (int(k), who)
            elif line.startswith("OURS "):
                ours = json.loads(line[5:])
            elif line.startswith("RESULT "):
                k, base, mutation, ours, theirs = json.loads(line[7:])
                results.append(Outcome(k, base, mutation, ours, theirs))
                current = None
                if progress is not None:
                    progress(len(results))
        if current is None:
            done = max((o.index for o in results), default=start - 1)
            if done >= count - 1:
                break
            # The child died between two mutants: the next one is recorded as its crash.
            current = (done + 1, "onnxhal")
            failure = f"crash {proc.returncode}"
        k, who = current
        base, mutation = ("external", "external_data") if external else mutant(seed, k)[:2]
        died = [who and "load", failure.split()[0], failure, ""]
        results.append(Outcome(k, base, mutation, died if who == "onnxhal" else ours,
                               died if who == "onnxruntime" else None))
        start = k + 1
    return results


#: Words of a message that is about onnxhal's code rather than the user's model: a typed error that
#: wraps an internal exception.
INTERNAL_WORDS = ("AttributeError", "TypeError:", "IndexError", "KeyError", "'NoneType'", "UnboundLocalError",
                  "NameError", "object has no attribute", "not subscriptable", "not iterable")


def ort_refused(r: Outcome) -> bool:
    return r.onnxruntime is not None and r.onnxruntime[1] in ("typed", "untyped")


def summary(results: list[Outcome]) -> dict[str, int]:
    """The campaign's figures."""
    ours = [r.onnxhal[1] for r in results]
    return {
        "mutants": len(results),
        "ran to completion": ours.count("ok"),
        "typed errors": ours.count("typed"),
        "typed errors whose message names an internal exception": sum(
            r.onnxhal[1] == "typed" and any(w in r.onnxhal[3] for w in INTERNAL_WORDS) for r in results),
        "runs stopped by RunOptions.terminate": sum(r.onnxhal[3].startswith("Exiting due to terminate")
                                                    for r in results),
        "untyped errors": ours.count("untyped"),
        "crashes": ours.count("crash"),
        "hangs": ours.count("hang"),
        "onnxruntime refused": sum(ort_refused(r) for r in results),
        "onnxruntime crashed or hung": sum(r.onnxruntime is not None and r.onnxruntime[1] in ("crash", "hang")
                                           for r in results),
        "accepted here where onnxruntime refuses": sum(r.onnxhal[1] == "ok" and ort_refused(r) for r in results),
    }


if __name__ == "__main__":
    seed_, count_ = int(sys.argv[1]), int(sys.argv[2])
    res = campaign(seed_, count_)
    print(json.dumps(summary(res), indent=1))
