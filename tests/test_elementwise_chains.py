"""Elementwise chains (optimizer/elementwise_chains.py -> com.onnxhal ElementwiseChain, kernel in
cpu/kernels/elementwise_chain.py): which nodes are fused, and the fused results against the
unfused nodes (the pass disabled) and the kernel's ``native`` path against its ``numpy`` form."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxhal
from onnxhal.hal import Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.loader.model_loader import load_model
from onnxhal.runtime.optimizer.passes import optimize
from onnxhal.runtime.providers.cpu.kernels import elementwise_chain as ec
from onnxhal.runtime.providers.cpu.kernels.native_kernels import native_module

UNARY = ["Neg", "Abs", "Sqrt", "Exp", "Log", "Tanh", "Sigmoid", "Relu", "Reciprocal"]
BINARY = ["Add", "Sub", "Mul", "Div", "Max", "Min", "Sum"]
F = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE, np.float16: TensorProto.FLOAT16,
     np.int64: TensorProto.INT64}


def _model(nodes, inputs, outputs, opset=17, initializers=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _chains(model: onnx.ModelProto, disabled: tuple = ()) -> list[Node]:
    """The ElementwiseChain nodes of the optimized graph, its subgraphs' included."""
    graph = optimize(load_model(model).graph, 99, disabled=disabled)
    found = []

    def walk(g):
        for n in g.nodes:
            if n.op_type == "ElementwiseChain":
                found.append(n)
            for sg in n.subgraph_list():
                walk(sg)
    walk(graph)
    return found


def _run(model: onnx.ModelProto, feeds: dict, fused: bool) -> list:
    so = onnxhal.SessionOptions()
    if not fused:
        so.add_session_config_entry("optimization.disable_passes", "fuse_elementwise_chains")
    s = onnxhal.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


def _random_chain(rng: np.random.Generator, dtype, shapes: list[tuple]) -> tuple[onnx.ModelProto, dict]:
    """A random DAG of elementwise ops over inputs of ``shapes`` (broadcasting), every value it
    makes a graph output where the draw says so."""
    et = F[dtype]
    inputs = [helper.make_tensor_value_info(f"x{k}", et, list(s)) for k, s in enumerate(shapes)]
    values, nodes, outputs = [f"x{k}" for k in range(len(shapes))], [], []
    for k in range(int(rng.integers(3, 9))):
        if rng.random() < 0.4:
            op, args = str(rng.choice(UNARY)), [str(rng.choice(values))]
        else:
            op, args = str(rng.choice(BINARY)), [str(v) for v in rng.choice(values, 2)]
        nodes.append(helper.make_node(op, args, [f"v{k}"]))
        values.append(f"v{k}")
        if rng.random() < 0.25:
            outputs.append(f"v{k}")
    if values[-1] not in outputs:
        outputs.append(values[-1])
    feeds = {}
    for k, s in enumerate(shapes):
        x = np.asarray(rng.standard_normal(s) * 2, dtype)
        flat = x.reshape(-1)
        if flat.size > 3:  # NaN, inf and -inf where there is room
            flat[rng.choice(flat.size, 3, replace=False)] = [np.nan, np.inf, -np.inf]
        feeds[f"x{k}"] = x
    outs = [helper.make_tensor_value_info(o, et, None) for o in outputs]
    return _model(nodes, inputs, outs), feeds


SHAPES = [[(2, 16), (2, 16), (2, 16)], [(3, 1, 5), (4, 5), (1,)], [(7,), (), (1, 7)], [(2, 3, 300), (300,), (2, 3, 1)]]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", range(len(SHAPES)))
def test_random_chains_match_the_unfused_nodes(dtype, case):
    rng = np.random.default_rng(44 + case)
    made = 0
    for _ in range(6):
        model, feeds = _random_chain(rng, dtype, SHAPES[case])
        made += len(_chains(model))
        with np.errstate(all="ignore"):
            want = _run(model, feeds, fused=False)
            got = _run(model, feeds, fused=True)
        for w, g in zip(want, got):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=0, equal_nan=True)
    assert made > 0


def _gru_gates(dtype) -> onnx.ModelProto:
    """A GRU cell's gates, as jax2onnx writes them."""
    et = F[dtype]
    names = ["xz", "hz", "xr", "hr", "xn", "hn", "h"]
    nodes = [helper.make_node("Add", ["xz", "hz"], ["a0"]), helper.make_node("Sigmoid", ["a0"], ["z"]),
             helper.make_node("Add", ["xr", "hr"], ["a1"]), helper.make_node("Sigmoid", ["a1"], ["r"]),
             helper.make_node("Sub", ["one", "z"], ["omz"]), helper.make_node("Mul", ["r", "hn"], ["rh"]),
             helper.make_node("Add", ["xn", "rh"], ["a2"]), helper.make_node("Tanh", ["a2"], ["n"]),
             helper.make_node("Mul", ["omz", "n"], ["m0"]), helper.make_node("Mul", ["z", "h"], ["m1"]),
             helper.make_node("Add", ["m0", "m1"], ["y"])]
    one = helper.make_tensor("one", et, [], [1.0])
    return _model(nodes, [helper.make_tensor_value_info(n, et, [2, 16]) for n in names],
                  [helper.make_tensor_value_info("y", et, [2, 16])], initializers=[one])


def test_a_gru_cell_becomes_one_chain():
    model = _gru_gates(np.float32)
    chains = _chains(model)
    assert len(chains) == 1 and len(chains[0].attr("ops")) == 11
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal((2, 16)).astype(np.float32) for n in ["xz", "hz", "xr", "hr", "xn", "hn", "h"]}
    np.testing.assert_allclose(_run(model, feeds, True)[0], _run(model, feeds, False)[0], rtol=1e-6, atol=1e-6)


def _three_ops(dtype) -> onnx.ModelProto:
    et = F[dtype]
    nodes = [helper.make_node("Add", ["a", "b"], ["c"]), helper.make_node("Mul", ["c", "b"], ["d"]),
             helper.make_node("Sub", ["d", "a"], ["e"])]
    return _model(nodes, [helper.make_tensor_value_info(n, et, [4]) for n in "ab"],
                  [helper.make_tensor_value_info("e", et, [4])])


@pytest.mark.parametrize("dtype", [np.float16, np.int64])
def test_float16_and_integer_chains_decline(dtype):
    """Their plain kernels compute differently (float16 via float32 tables, integer Div truncates)."""
    model = _three_ops(dtype)
    assert _chains(model, disabled=("run_float16_regions",)) == []


def test_a_float16_region_is_fused_in_float32():
    """A CPU-only session computes float16 regions in float32 (onnxruntime's inserted Casts):
    the chain runs between those Casts, and gives the unfused nodes' results."""
    model = _three_ops(np.float16)
    (chain,) = _chains(model)
    assert list(chain.inputs) == ["a_float32", "b_float32"]
    feeds = {n: np.linspace(-3, 3, 4).astype(np.float16) + k for k, n in enumerate("ab")}
    np.testing.assert_array_equal(_run(model, feeds, True)[0], _run(model, feeds, False)[0])


def test_mixed_types_variadic_and_lone_nodes_decline():
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Max", ["a", "b", "c"], ["m"]),  # three inputs: not a binary op
             helper.make_node("Cast", ["m"], ["d"], to=TensorProto.DOUBLE),
             helper.make_node("Add", ["d", "e"], ["y"])]  # one fusible node alone
    model = _model(nodes, [helper.make_tensor_value_info(n, f, [4]) for n in "abc"]
                   + [helper.make_tensor_value_info("e", TensorProto.DOUBLE, [4])],
                   [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [4])])
    assert _chains(model) == []


def test_a_path_out_and_back_keeps_the_graph_acyclic():
    """Add -> ReduceSum -> Mul with the Add: the Mul may not join the Add's group through the
    ReduceSum (the fused node would read its own output); values read outside stay outputs."""
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Exp", ["s"], ["e"]),
             helper.make_node("ReduceSum", ["e"], ["r"], keepdims=1),
             helper.make_node("Mul", ["e", "r"], ["m"]), helper.make_node("Tanh", ["m"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info(n, f, [3, 4]) for n in "ab"],
                   [helper.make_tensor_value_info("y", f, [3, 4]), helper.make_tensor_value_info("s", f, [3, 4])])
    chains = _chains(model)
    assert sorted(tuple(c.attr("ops")) for c in chains) == [("Add", "Exp"), ("Mul", "Tanh")]
    rng = np.random.default_rng(1)
    feeds = {n: rng.standard_normal((3, 4)).astype(np.float32) for n in "ab"}
    for g, w in zip(_run(model, feeds, True), _run(model, feeds, False)):
        np.testing.assert_allclose(g, w, rtol=1e-6)


def test_a_loop_body_chain_is_fused():
    """The gates inside a Loop body, where each node's cost is paid per iteration."""
    f = TensorProto.FLOAT
    body = helper.make_graph(
        [helper.make_node("Sigmoid", ["h"], ["s"]), helper.make_node("Mul", ["s", "w"], ["m"]),
         helper.make_node("Add", ["m", "h"], ["h2"]), helper.make_node("Identity", ["c"], ["c2"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("h", f, [2, 8])],
        [helper.make_tensor_value_info("c2", TensorProto.BOOL, []), helper.make_tensor_value_info("h2", f, [2, 8])])
    loop = helper.make_node("Loop", ["n", "", "h0"], ["hT"], body=body)
    model = _model([loop], [helper.make_tensor_value_info("n", TensorProto.INT64, []),
                            helper.make_tensor_value_info("h0", f, [2, 8]),
                            helper.make_tensor_value_info("w", f, [8])],
                   [helper.make_tensor_value_info("hT", f, [2, 8])])
    chains = _chains(model)
    assert [tuple(c.attr("ops")) for c in chains] == [("Sigmoid", "Mul", "Add")]
    rng = np.random.default_rng(2)
    feeds = {"n": np.array(5, np.int64), "h0": rng.standard_normal((2, 8)).astype(np.float32),
             "w": rng.standard_normal(8).astype(np.float32)}
    np.testing.assert_allclose(_run(model, feeds, True)[0], _run(model, feeds, False)[0], rtol=1e-6)


def _kernel(ops, operands, results, n_in, **attrs):
    node = Node.from_proto(helper.make_node("ElementwiseChain", [f"i{k}" for k in range(n_in)],
                                            [f"y{k}" for k in range(len(results))], domain="com.onnxhal",
                                            name="chain", ops=ops, operands=operands, results=results, **attrs))
    return ec.ElementwiseChain(node, None)


@pytest.mark.skipif(native_module() is None, reason="the C kernels are not built")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_native_path_matches_numpy_path(dtype):
    """Path "native" (one C call) against path "numpy" (the canonical form), every op, strided
    and broadcast inputs, NaN and infinities."""
    rng = np.random.default_rng(3)
    ops = ["Add", "Sub", "Mul", "Div", "Max", "Min", "Neg", "Abs", "Sqrt", "Exp", "Log", "Tanh", "Sigmoid", "Relu",
           "Reciprocal"]
    operands, reg = [0, 1], 4  # a + b first: every result has the whole broadcast shape
    for op in ops[1:]:
        operands += [reg - 1, 2 if op in ("Sub", "Div", "Max") else 1][:ec.OPS[op][1]]
        reg += 1
    k = _kernel(ops, operands, [3, reg - 1], 3)
    base = rng.standard_normal((3, 700)).astype(dtype)
    a = base[:, ::2]  # strided
    b = rng.standard_normal((350,)).astype(dtype)
    c = np.array(0.5, dtype)
    a[0, :4] = [np.nan, np.inf, -np.inf, 0.0]
    b[5:8] = [np.nan, np.inf, -np.inf]
    with np.errstate(all="ignore"):
        got = k.compute([a, b, c])
        want = k.compute_numpy([a, b, c])
    for g, w in zip(got, want):
        assert g.dtype == w.dtype == dtype and g.shape == w.shape == (3, 350)
        np.testing.assert_allclose(g, w, rtol=2e-6 if dtype == np.float32 else 1e-14, equal_nan=True)
    assert k.native is not None


def test_native_declines_to_numpy():
    """Mixed dtypes, an output whose inputs broadcast to less than the whole shape, integer
    inputs: the numpy form's results (and numpy's promotion and shapes)."""
    k = _kernel(["Add", "Mul"], [0, 0, 2, 1], [2, 3], 2)  # y0 = a + a (shape of a), y1 = y0 * b
    a32 = np.arange(3, dtype=np.float32).reshape(3, 1)
    b = np.ones((3, 4), np.float32)
    y0, y1 = k.compute([a32, b])
    assert y0.shape == (3, 1) and y1.shape == (3, 4)
    y0, y1 = k.compute([a32, b.astype(np.float64)])
    assert y1.dtype == np.float64
    y0, y1 = k.compute([np.arange(3), np.arange(3)])
    assert y1.tolist() == [0, 2, 8]
    with pytest.raises(ValueError):
        k.compute([np.ones(3, np.float32), np.ones(4, np.float32)])  # shapes that do not broadcast


def test_a_malformed_chain_is_refused_by_name():
    with pytest.raises(InvalidArgument, match="'Erf'.*fuse_elementwise_chains"):
        _kernel(["Erf"], [0], [1], 1)
    with pytest.raises(InvalidArgument, match="reads registers"):
        _kernel(["Add"], [0, 5], [1], 1)


@pytest.mark.skipif(native_module() is None, reason="the C kernels are not built")
def test_native_exp_and_tanh_at_their_range_ends():
    """Path "native"'s vectorized exp (+inf above 88.72, 0 below -86.5) and tanh against numpy's."""
    x = np.float32([-np.inf, -200, -103, -87.5, -86.4, -20, -1e-3, 0, -0.0, 1e-6, 0.2, 3, 9.5, 80, 88.5, 88.72,
                    88.8, 200, np.inf, np.nan])
    for op in ("Exp", "Tanh", "Sigmoid"):
        k = _kernel([op, "Add"], [0, 2, 1], [2, 3], 2)
        with np.errstate(all="ignore"):
            got = k.compute([x, np.zeros_like(x)])
            want = k.compute_numpy([x, np.zeros_like(x)])
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=2e-6, atol=3e-38, equal_nan=True, err_msg=op)


@pytest.mark.skipif(native_module() is None, reason="the C kernels are not built")
def test_native_ops_of_one_element_inputs_run_once():
    """Path "native" runs the ops of one-element inputs alone once (sqrt of an epsilon, 1 - c)
    before the blocks; an output among them stays in the blocks and gets the whole shape."""
    k = _kernel(["Sqrt", "Sub", "Div", "Mul"], [1, 2, 1, 0, 3, 5, 4], [3, 6], 3)
    x = np.random.default_rng(5).standard_normal((3, 300)).astype(np.float32)
    ins = [x, np.array(4.0, np.float32), np.ones((1, 1), np.float32)]
    got, want = k.compute(ins), k.compute_numpy(ins)
    assert got[0].shape == want[0].shape == ()  # sqrt(4) alone: its own input's shape, by the numpy form
    got = k.native.elementwise_chain(k.code, ins, np.array([6], np.int32).tobytes(), k.n_regs, np.empty)
    np.testing.assert_allclose(got[0], want[1], rtol=1e-6)
    k2 = _kernel(["Sqrt", "Div", "Add"], [1, 0, 2, 3, 1], [3, 4], 2)
    ins = [x, np.array(9.0, np.float32)]
    for g, w in zip(k2.compute(ins), k2.compute_numpy(ins)):
        np.testing.assert_allclose(g, w, rtol=1e-6)


def _mask_model(mask_type=TensorProto.BOOL, exponent=2.0) -> onnx.ModelProto:
    """An attention block's mask and a hand-written norm's square: Cast of a mask to float, 1 - m,
    times -10000, added to the scores; a Where of a bool condition; a Pow of a constant."""
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Cast", ["mask"], ["m"], to=f), helper.make_node("Sub", ["one", "m"], ["inv"]),
             helper.make_node("Mul", ["inv", "big"], ["bias"]), helper.make_node("Add", ["s", "bias"], ["t"]),
             helper.make_node("Where", ["keep", "t", "s"], ["w"]), helper.make_node("Pow", ["w", "e"], ["p"]),
             helper.make_node("Add", ["p", "w"], ["y"])]
    inits = [helper.make_tensor("one", f, [], [1.0]), helper.make_tensor("big", f, [], [-10000.0]),
             helper.make_tensor("e", f, [], [exponent])]
    return _model(nodes, [helper.make_tensor_value_info("mask", mask_type, [2, 1, 8]),
                          helper.make_tensor_value_info("keep", TensorProto.BOOL, [8]),
                          helper.make_tensor_value_info("s", f, [2, 3, 8])],
                  [helper.make_tensor_value_info("y", f, [2, 3, 8])], initializers=inits)


def _mask_feeds(mask_dtype) -> dict:
    rng = np.random.default_rng(7)
    s = rng.standard_normal((2, 3, 8)).astype(np.float32)
    s[0, 0, :3] = [np.nan, np.inf, -np.inf]
    return {"mask": (rng.random((2, 1, 8)) < 0.5).astype(mask_dtype), "keep": rng.random(8) < 0.5, "s": s}


@pytest.mark.parametrize("mask_type, mask_dtype, exponent", [(TensorProto.BOOL, np.bool_, 2.0),
                                                             (TensorProto.INT64, np.int64, 3.0),
                                                             (TensorProto.INT32, np.int32, 2.0)])
def test_casts_wheres_and_constant_powers_join_the_chain(mask_type, mask_dtype, exponent):
    """One chain of the seven nodes, the Pow as products (the Pow kernel's form), equal bit for bit
    to the unfused nodes."""
    model = _mask_model(mask_type, exponent)
    (chain,) = _chains(model)
    ops = list(chain.attr("ops"))
    assert ops.count("Cast") == 1 and ops.count("Where") == 1 and "Pow" not in ops
    assert ops.count("Mul") == (3 if exponent == 3 else 2) and list(chain.attr("to")) == [TensorProto.FLOAT]
    assert "e" not in chain.inputs  # the exponent is the ops it makes, not an input
    feeds = _mask_feeds(mask_dtype)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(_run(model, feeds, True)[0], _run(model, feeds, False)[0])


def test_other_powers_casts_and_float16_sources_stay_out():
    """A Pow of 0.5, a Cast of a float16 or of a uint64, a Cast of one element, a Cast of float32
    to double: their plain kernels compute otherwise (or the kernel reads no such input)."""
    (chain,) = _chains(_mask_model(exponent=0.5))
    assert chain.attr("ops").count("Mul") == 1  # the Pow of 0.5 stays a node of its own
    for source in (TensorProto.FLOAT16, TensorProto.UINT64):
        (chain,) = _chains(_mask_model(source), disabled=("run_float16_regions",))
        assert "Cast" not in chain.attr("ops")
    f, d = TensorProto.FLOAT, TensorProto.DOUBLE
    # a size cast to float and divided (a shape's arithmetic, of one element): plain nodes
    nodes = [helper.make_node("Cast", ["n"], ["m"], to=f), helper.make_node("Div", ["m", "k"], ["q"]),
             helper.make_node("Mul", ["q", "k"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("n", TensorProto.INT64, []),
                           helper.make_tensor_value_info("k", f, [])], [helper.make_tensor_value_info("y", f, [])])
    (chain,) = _chains(model)
    assert list(chain.attr("ops")) == ["Div", "Mul"]
    nodes = [helper.make_node("Cast", ["a"], ["b"], to=d), helper.make_node("Add", ["b", "c"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("a", f, [4]), helper.make_tensor_value_info("c", d, [4])],
                   [helper.make_tensor_value_info("y", d, [4])])
    assert _chains(model) == []


CAST_SOURCES = [np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64]


@pytest.mark.skipif(native_module() is None, reason="the C kernels are not built")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("source", CAST_SOURCES)
def test_native_casts_and_wheres_match_the_numpy_form(dtype, source):
    """Path "native" against path "numpy": a Cast of a strided and of a broadcast integer input
    (their extremes included: int64's round to the float as numpy's astype), a Where of a bool
    condition broadcast across rows, short rows and long ones, bit for bit."""
    to = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE
    # r3 = cast(i0), r4 = r3 * i2, r5 = where(i1, r4, i2), r6 = cast(i0) again, r7 = r5 + r6
    k = _kernel(["Cast", "Mul", "Where", "Cast", "Add"], [0, 3, 2, 1, 4, 2, 0, 5, 6], [7, 5], 3, to=[to, to])
    rng = np.random.default_rng(11)
    info = np.iinfo(source) if source is not np.bool_ else None
    for width in (5, 300):
        raw = rng.integers(0, 2, (4, 2 * width)) if info is None else rng.integers(info.min, info.max, (4, 2 * width),
                                                                                      dtype=source, endpoint=True)
        ints = raw.astype(source)[:, ::2]  # strided
        if info is not None:
            ints[0, :2] = [info.min, info.max]
        cond = rng.random((1, width)) < 0.5
        x = rng.standard_normal((4, width)).astype(dtype)
        x[1, :3] = [np.nan, np.inf, -np.inf]
        for inputs in ([ints, cond, x], [ints[:1], cond, x]):  # the integer input whole and broadcast
            with np.errstate(all="ignore"):
                got, want = k.compute(inputs), k.compute_numpy(inputs)
            for g, w in zip(got, want):
                assert g.dtype == w.dtype == dtype
                np.testing.assert_array_equal(g, w)
    assert k.native is not None


@pytest.mark.skipif(native_module() is None, reason="the C kernels are not built")
def test_native_declines_integer_inputs_it_would_read_as_floats():
    """An integer input read by an Add (numpy's promotion makes it a float64 sum), a Cast to double
    in a float32 chain, no float input at all: the C call declines, the numpy form's results."""
    k = _kernel(["Cast", "Add"], [0, 2, 1], [3], 2, to=[TensorProto.FLOAT])  # cast(i0) + i1
    ints = np.arange(4, dtype=np.int64)
    assert k.native.elementwise_chain(k.code, [ints, ints], k.out_regs, k.n_regs, np.empty) is None
    (y,) = k.compute([ints, ints])
    assert y.dtype == np.float64 and y.tolist() == [0, 2, 4, 6]
    k = _kernel(["Cast", "Add"], [0, 2, 1], [3], 2, to=[TensorProto.DOUBLE])
    x = np.ones(4, np.float32)
    assert k.native.elementwise_chain(k.code, [ints, x], k.out_regs, k.n_regs, np.empty) is None
    assert k.compute([ints, x])[0].dtype == np.float64
    k = _kernel(["Cast", "Neg"], [0, 1], [2], 1, to=[TensorProto.FLOAT])
    assert k.native.elementwise_chain(k.code, [ints], k.out_regs, k.n_regs, np.empty) is None
    assert k.compute([ints])[0].tolist() == [0, -1, -2, -3]


def test_a_cast_without_its_float_target_is_refused_by_name():
    with pytest.raises(InvalidArgument, match="'to'.*Cast"):
        _kernel(["Cast"], [0], [1], 1)
    with pytest.raises(InvalidArgument, match="'to'.*Cast"):
        _kernel(["Cast"], [0], [1], 1, to=[TensorProto.INT64])
