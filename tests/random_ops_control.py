"""Random control-flow cases for ``tests/test_ops_random.py`` (see random_ops.py): If, Loop and Scan
with small random bodies that read values of the outer scope (``OpCase.outer``), loop-carried and
scan outputs, early exits, zero trip counts, and Scan's axes and directions; and the optional
operators, their optional inputs made by an ``Optional`` node before them (``OpCase.prelude``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper

from tests.random_ops import OpCase, array, pick, registrar, shape

GENERATORS: dict[str, Callable] = {}
DTYPES = ["float32", "float32", "float64", "int64", "int32"]

generator = registrar(GENERATORS)


def _vi(name: str, dtype, shape=None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape)


def _suffix_partner(rng, s: tuple) -> tuple:
    """A shape that broadcasts into ``s`` without changing it (loop-carried values keep their shape)."""
    k = int(rng.integers(0, len(s) + 1))
    return tuple(d if rng.random() > 0.4 else 1 for d in s[len(s) - k:])


def _binary(rng, a: str, b: str, out: str, dtype) -> onnx.NodeProto:
    ops = ["Add", "Sub", "Mul", "Max", "Min"]
    return helper.make_node(pick(rng, ops), [a, b], [out])


@generator("If")
def _if(rng, op):
    dtype = pick(rng, DTYPES)
    s = shape(rng, max_rank=3)
    x = array(rng, s, dtype, -3, 3, special=False)
    y = array(rng, _suffix_partner(rng, s), dtype, -3, 3, special=False)
    outer = {"x": x, "y": y}
    n_out = int(rng.integers(1, 3))

    def branch(tag: str) -> onnx.GraphProto:
        nodes, outs = [], []
        for k in range(n_out):
            o = f"{tag}_out{k}"
            r = rng.random()
            if r < 0.6:
                nodes.append(_binary(rng, "x", "y", o, dtype))
            elif r < 0.8:  # a value of another shape than the other branch's (allowed)
                nodes.append(helper.make_node("Identity", ["y"], [o]))
            else:  # a constant of the branch's own
                c = array(rng, shape(rng, max_rank=2), dtype, -3, 3, special=False)
                nodes.append(helper.make_node("Constant", [], [o], value=onnx.numpy_helper.from_array(c)))
            outs.append(_vi(o, dtype))
        return helper.make_graph(nodes, tag, [], outs)
    cond = np.array(rng.random() < 0.5) if rng.random() < 0.8 else np.array([rng.random() < 0.5])
    return OpCase(op, [cond], {"then_branch": branch("then"), "else_branch": branch("else")},
                  opset=pick(rng, [11, 13, 16, 19]), n_outputs=n_out, outer=outer)


@generator("Loop")
def _loop(rng, op):
    dtype = pick(rng, DTYPES)
    s = shape(rng, max_rank=3, hi=4)
    v0 = array(rng, s, dtype, -2, 2, special=False)
    x = array(rng, _suffix_partner(rng, s), dtype, -2, 2, special=False)
    trip = np.array(int(rng.integers(0, 5)), np.int64)
    mode = pick(rng, ["count", "count", "cond", "both"])  # what ends the loop
    nodes = [_binary(rng, "v_in", "x", "v_step", dtype)]
    if rng.random() < 0.5:  # the iteration number in the arithmetic
        nodes.append(helper.make_node("Cast", ["iter"], ["iter_c"], to=helper.np_dtype_to_tensor_dtype(np.dtype(dtype))))
        nodes.append(helper.make_node("Add", ["v_step", "iter_c"], ["v_out"]))
    else:
        nodes.append(helper.make_node("Identity", ["v_step"], ["v_out"]))
    limit = np.array(int(rng.integers(0, 5)), np.int64)
    if mode == "count":
        nodes.append(helper.make_node("Identity", ["cond_in"], ["cond_out"]))
    else:  # stop after ``limit`` iterations, read from the outer scope
        nodes.append(helper.make_node("Add", ["iter", "one"], ["next"]))
        nodes.append(helper.make_node("Less", ["next", "limit"], ["cond_out"]))
        nodes.insert(0, helper.make_node("Constant", [], ["one"], value=onnx.numpy_helper.from_array(np.array(1, np.int64))))
    n_scan = int(rng.integers(0, 3))
    scan_outs = []
    for k in range(n_scan):
        nodes.append(helper.make_node(pick(rng, ["Identity", "Neg"]) if dtype != "uint8" else "Identity", ["v_out"], [f"scan{k}"]))
        scan_outs.append(_vi(f"scan{k}", dtype))
    body = helper.make_graph(nodes, "body", [_vi("iter", np.int64, []), _vi("cond_in", np.bool_, []), _vi("v_in", dtype)],
                             [_vi("cond_out", np.bool_, []), _vi("v_out", dtype), *scan_outs])
    outer = {"x": x}
    if mode != "count":
        outer["limit"] = limit
    m_in = trip if mode != "cond" else None
    cond_in = np.array(True) if mode != "count" or rng.random() < 0.5 else None
    return OpCase(op, [m_in, cond_in, v0], {"body": body}, opset=pick(rng, [11, 13, 16, 19]),
                  n_outputs=1 + n_scan, outer=outer, const={0} if rng.random() < 0.5 else set())


@generator("Scan")
def _scan(rng, op):
    dtype = pick(rng, DTYPES)
    slice_shape = shape(rng, max_rank=2, lo=1, hi=4)
    t = int(rng.integers(0, 5))
    n_in = int(rng.integers(1, 3))
    opset = pick(rng, [11, 16, 19])
    in_axes = [int(rng.integers(-len(slice_shape) - 1, len(slice_shape) + 1)) for _ in range(n_in)]
    directions = [int(rng.integers(0, 2)) for _ in range(n_in)]
    xs = []
    for a in in_axes:
        full = list(slice_shape)
        full.insert(a % (len(slice_shape) + 1), t)
        xs.append(array(rng, tuple(full), dtype, -2, 2, special=False))
    state0 = array(rng, slice_shape, dtype, -2, 2, special=False)
    nodes = [_binary(rng, "s_in", "x0", "s_mid", dtype)]
    last = "s_mid"
    if n_in > 1:
        nodes.append(_binary(rng, last, "x1", "s_mid2", dtype))
        last = "s_mid2"
    nodes.append(helper.make_node("Identity", [last], ["s_out"]))
    nodes.append(_binary(rng, "s_out", "x0", "y0", dtype))
    body = helper.make_graph(nodes, "body", [_vi("s_in", dtype), *(_vi(f"x{k}", dtype) for k in range(n_in))],
                             [_vi("s_out", dtype), _vi("y0", dtype)])
    attrs = {"body": body, "num_scan_inputs": n_in}
    if rng.random() < 0.6:
        attrs["scan_input_axes"] = in_axes
    else:  # default axes 0: move the scanned axis first
        xs = [np.moveaxis(x, a % x.ndim, 0) for x, a in zip(xs, in_axes)]
    if rng.random() < 0.5:
        attrs["scan_input_directions"] = directions
    if rng.random() < 0.4:
        attrs["scan_output_axes"] = [int(rng.integers(-len(slice_shape) - 1, len(slice_shape) + 1))]
    if rng.random() < 0.4:
        attrs["scan_output_directions"] = [int(rng.integers(0, 2))]
    return OpCase(op, [state0, *xs], attrs, opset=opset, n_outputs=2)


@generator("Optional", "OptionalHasElement", "OptionalGetElement")
def _optional(rng, op):
    dtype = pick(rng, DTYPES)
    x = array(rng, shape(rng, max_rank=3), dtype, -3, 3, special=False)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    if op == "Optional":  # an optional output is not a graph output onnxruntime returns: read it back
        return OpCase("OptionalGetElement", ["opt"], opset=18, outer={"x": x},
                      prelude=[helper.make_node("Optional", ["x"], ["opt"])])
    form = pick(rng, ["full", "full", "empty", "plain", "omitted"])
    if form == "plain":  # opset 18 takes a plain tensor too
        return OpCase(op, [x], opset=18)
    if form == "omitted" and op == "OptionalHasElement":  # no input at all: false
        return OpCase(op, [], opset=18)
    if form == "empty":
        kind = helper.make_tensor_type_proto(elem, None)
        prelude = [helper.make_node("Optional", [], ["opt"], type=kind)]
        return OpCase(op, ["opt"], opset=18, prelude=prelude)  # OptionalGetElement: both must refuse
    return OpCase(op, ["opt"], opset=pick(rng, [15, 18]), outer={"x": x},
                  prelude=[helper.make_node("Optional", ["x"], ["opt"])])
