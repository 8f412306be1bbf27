"""Seeded random single-operator models, for the differential test against onnxruntime.

A generator takes a ``numpy.random.Generator`` and returns an :class:`OpCase`: one node of one
operator with random shapes, dtypes and attributes, and its input arrays. Some inputs are stored
as initializers (``const``), which sends them through the optimizer's constant paths; the rest are
fed. ``build(case)`` makes the model; ``tests/test_ops_random.py`` runs it in onnxruntime and in
onnxhal and compares. The node conformance cases check each operator at a handful of fixed
shapes; these reach the native kernels' other paths (broadcast forms, negative axes, strided and
empty tensors, integer dtypes), where a fast path can go wrong without any fixed case noticing.

Generators live in ``GENERATORS`` (numeric operators, this file) and in
``tests/random_ops_shape.py`` (shape and indexing operators) and ``tests/random_ops_control.py`` (If, Loop,
Scan: random bodies reading the outer scope); ``all_generators()`` merges them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper

IR_VERSION = 8  # onnxruntime 1.32 refuses onnx 1.23's default IR version 14


@dataclass
class OpCase:
    op: str
    inputs: list  # arrays; None for an omitted optional input
    attrs: dict = field(default_factory=dict)
    opset: int = 17
    const: set = field(default_factory=set)  # indices of inputs stored as initializers
    n_outputs: int = 1
    #: Graph inputs the node does not take but its subgraphs read from the outer scope (fed).
    outer: dict = field(default_factory=dict)
    #: Nodes run before the operator's, reading ``outer``; an input given as a string names one
    #: of their outputs (values no graph input can carry, such as optionals).
    prelude: list = field(default_factory=list)

    def describe(self) -> str:
        def one(i, a):
            if a is None:
                return "-"
            if isinstance(a, str):
                return next(f"{n.op_type}({', '.join(n.input)})" for n in self.prelude if a in n.output)
            if isinstance(a, list):
                return "seq[" + ", ".join(f"{t.dtype}{list(t.shape)}" for t in a) + "]"
            return f"{a.dtype}{list(a.shape)}{'c' if i in self.const else ''}"
        ins = ", ".join(one(i, a) for i, a in enumerate(self.inputs))
        outer = "".join(f" {k}={v.dtype}{list(v.shape)}" for k, v in self.outer.items())
        attrs = {k: (f"<graph {len(v.node)} nodes: {', '.join(n.op_type for n in v.node)}>"
                     if isinstance(v, onnx.GraphProto) else v) for k, v in self.attrs.items()}
        return f"{self.op}-{self.opset}({ins}){outer} {attrs}"


def build(case: OpCase) -> tuple[bytes, dict]:
    """The case as a one-node model (serialized) and its feeds."""
    names, graph_inputs, inits, feeds = [], [], [], {}
    present = [i for i, a in enumerate(case.inputs) if a is not None and not isinstance(a, (list, str))]
    const = set(case.const) - ({present[0]} if present and set(present) <= set(case.const) else set())
    for i, a in enumerate(case.inputs):
        if a is None:
            names.append("")
            continue
        if isinstance(a, str):  # a prelude node's output
            names.append(a)
            continue
        name = f"in{i}"
        names.append(name)
        if isinstance(a, list):  # a sequence of tensors, fed as a list
            elem = helper.np_dtype_to_tensor_dtype(a[0].dtype if a else np.dtype(np.float32))
            graph_inputs.append(helper.make_tensor_sequence_value_info(name, elem, None))
            feeds[name] = a
            continue
        if i in const:
            inits.append(onnx.numpy_helper.from_array(a, name))
        else:
            elem = helper.np_dtype_to_tensor_dtype(a.dtype)
            graph_inputs.append(helper.make_tensor_value_info(name, elem, list(a.shape)))
            feeds[name] = a
    for name, a in case.outer.items():
        graph_inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape)))
        feeds[name] = a
    while names and names[-1] == "":
        names.pop()
    outs = [f"out{k}" for k in range(case.n_outputs)]
    node = helper.make_node(case.op, names, outs, **case.attrs)
    graph = helper.make_graph([*case.prelude, node], "op", graph_inputs, [helper.make_empty_tensor_value_info(o) for o in outs],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", case.opset)], ir_version=IR_VERSION)
    model = onnx.shape_inference.infer_shapes(model)
    return model.SerializeToString(), feeds


# ---------------------------------------------------------------------------------- helpers
def shape(rng, rank=None, lo=0, hi=5, max_rank=4) -> tuple:
    """A random shape; a zero-sized dimension about one time in twenty."""
    rank = int(rng.integers(0, max_rank + 1)) if rank is None else rank
    return tuple(int(d) if rng.random() > 0.05 else 0 for d in rng.integers(max(lo, 1), hi + 1, size=rank))


def broadcast_partner(rng, s: tuple) -> tuple:
    """A shape that broadcasts with ``s``: a suffix of it, with some dimensions set to 1."""
    k = int(rng.integers(0, len(s) + 1))
    out = [d if rng.random() > 0.35 else 1 for d in s[len(s) - k:]]
    if k == len(s) and rng.random() < 0.2:  # a leading dimension ``s`` does not have
        out = [int(rng.integers(1, 4))] + out
    return tuple(out)


def array(rng, s, dtype, lo=-4.0, hi=4.0, special=True, nan=True) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return np.asarray(rng.random(s) < 0.5)  # an array even for shape (): feeds must be arrays
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.asarray(rng.integers(max(int(lo), info.min), min(int(hi), info.max) + 1, size=s), dtype=dtype)
    a = np.asarray(rng.uniform(lo, hi, size=s))
    if special and a.size and rng.random() < 0.15:  # a NaN, an inf or a signed zero
        a.flat[int(rng.integers(0, a.size))] = rng.choice([np.nan, np.inf, -np.inf, -0.0] if nan else [np.inf, -np.inf, -0.0])
    return np.asarray(a, dtype=dtype)


def pick(rng, seq):
    return seq[int(rng.integers(0, len(seq)))]


def strided(rng, a: np.ndarray) -> np.ndarray:
    """Sometimes a non-contiguous view with the same values (feeds may be views)."""
    if a.ndim >= 2 and a.size and rng.random() < 0.2:
        return np.asfortranarray(a)
    return a


FLOATS = ["float32", "float32", "float32", "float64", "float16"]
NUMERIC = FLOATS + ["int32", "int64", "int8", "uint8"]

def registrar(table: dict[str, Callable]) -> Callable:
    """A ``@generator("Op", ...)`` decorator that files a generator under each op name in ``table``."""
    def generator(*ops: str):
        def wrap(fn):
            for op in ops:
                table[op] = (lambda rng, _op=op: fn(rng, _op))
            return fn
        return wrap
    return generator


GENERATORS: dict[str, Callable] = {}
generator = registrar(GENERATORS)


def all_generators() -> dict[str, Callable]:
    from tests.random_ops_control import GENERATORS as CONTROL
    from tests.random_ops_shape import GENERATORS as SHAPE

    return {**GENERATORS, **SHAPE, **CONTROL}


# ---------------------------------------------------------------------------------- numeric
def _binary_shapes(rng):
    a = shape(rng)
    b = broadcast_partner(rng, a)
    return (a, b) if rng.random() < 0.5 else (b, a)


def _const(rng, n_inputs: int) -> set:
    """Some inputs as initializers, never all of them (a fed input keeps the node in the graph)."""
    return {i for i in range(n_inputs) if rng.random() < 0.25} if n_inputs > 1 else set()


@generator("Add", "Sub", "Mul", "Div")
def _arith(rng, op):
    dtype = pick(rng, NUMERIC)
    a, b = _binary_shapes(rng)
    x, y = array(rng, a, dtype), array(rng, b, dtype)
    if op == "Div" and np.dtype(dtype).kind in "iu":
        y[y == 0] = 1  # integer division by zero is undefined
    return OpCase(op, [strided(rng, x), y], opset=pick(rng, [7, 13, 14]), const=_const(rng, 2))


@generator("Max", "Min", "Sum", "Mean")
def _variadic(rng, op):
    dtype = pick(rng, FLOATS if op in ("Sum", "Mean") else NUMERIC)
    base = shape(rng)
    shapes = [base] + [broadcast_partner(rng, base) for _ in range(int(rng.integers(0, 3)))]
    rng.shuffle(shapes)
    ins = [array(rng, s, dtype) for s in shapes]
    return OpCase(op, ins, opset=pick(rng, [8, 13]), const=_const(rng, len(ins)))


@generator("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual")
def _compare(rng, op):
    dtype = pick(rng, NUMERIC)
    a, b = _binary_shapes(rng)
    x, y = array(rng, a, dtype, -2, 2), array(rng, b, dtype, -2, 2)
    return OpCase(op, [x, y], opset=pick(rng, [13, 16, 19] if op != "Equal" else [13, 19]), const=_const(rng, 2))


@generator("And", "Or", "Xor")
def _logic(rng, op):
    a, b = _binary_shapes(rng)
    return OpCase(op, [array(rng, a, bool), array(rng, b, bool)], opset=7, const=_const(rng, 2))


@generator("Pow")
def _pow(rng, op):
    dtype = pick(rng, ["float32", "float64", "int32", "int64"])
    edtype = dtype if rng.random() < 0.6 else pick(rng, ["float32", "int64", "int32"])
    a, b = _binary_shapes(rng)
    x = array(rng, a, dtype, -3, 3)
    y = array(rng, b, edtype, 0 if np.dtype(dtype).kind in "iu" else -3, 3)
    if rng.random() < 0.4:  # a scalar exponent, as the optimizer rewrites x^2 and x^0.5
        y = np.array(pick(rng, [2, 0.5, 3, 1, -1] if edtype.startswith("float") else [2, 3, 1, 0]), dtype=edtype)
    return OpCase(op, [x, y], opset=pick(rng, [13, 15]), const=_const(rng, 2))


@generator("Mod")
def _mod(rng, op):
    fmod = int(rng.random() < 0.5)
    dtype = pick(rng, ["float32", "float64"] if fmod else ["int32", "int64", "int8"])
    a, b = _binary_shapes(rng)
    x, y = array(rng, a, dtype, -9, 9, special=False), array(rng, b, dtype, -5, 5, special=False)
    y[y == 0] = 3
    return OpCase(op, [x, y], {"fmod": fmod}, opset=13, const=_const(rng, 2))


@generator("Where")
def _where(rng, op):
    dtype = pick(rng, NUMERIC)
    s = shape(rng)
    shapes = [s, broadcast_partner(rng, s), broadcast_partner(rng, s)]
    rng.shuffle(shapes)
    return OpCase(op, [array(rng, shapes[0], bool), array(rng, shapes[1], dtype), array(rng, shapes[2], dtype)],
                  opset=16, const=_const(rng, 3))


@generator("Abs", "Neg", "Sqrt", "Exp", "Log", "Reciprocal", "Floor", "Ceil", "Round", "Sign", "Tanh",
           "Sigmoid", "Relu", "Erf", "Sin", "Cos", "Softsign", "Softplus", "HardSwish", "IsNaN")
def _unary(rng, op):
    kinds = {"Abs": NUMERIC, "Neg": FLOATS + ["int32", "int64", "int8"], "Sign": NUMERIC, "Relu": FLOATS + ["int32", "int8"]}
    dtype = pick(rng, kinds.get(op, FLOATS))
    opset = {"HardSwish": 14, "Relu": 14, "IsNaN": 13}.get(op, 13)
    # onnxruntime's float16 Sign gives 0 for NaN (its float32 and float64 Sign give NaN, as numpy)
    special = not (op == "Sign" and dtype == "float16")
    return OpCase(op, [strided(rng, array(rng, shape(rng), dtype, special=special))], opset=opset)


@generator("LeakyRelu", "Elu", "Selu", "HardSigmoid", "Celu", "ThresholdedRelu")
def _activation(rng, op):
    attrs = {}
    if rng.random() < 0.7:
        name = {"LeakyRelu": "alpha", "Elu": "alpha", "Celu": "alpha", "ThresholdedRelu": "alpha",
                "Selu": "gamma", "HardSigmoid": "beta"}[op]
        attrs[name] = float(np.float32(rng.uniform(0.05, 2.0)))
    dtype = "float32" if op == "Celu" else pick(rng, FLOATS)
    return OpCase(op, [array(rng, shape(rng), dtype)], attrs, opset=pick(rng, [6, 16]) if op == "LeakyRelu" else 12)


@generator("Clip")
def _clip(rng, op):
    dtype = pick(rng, ["float32", "float64", "int32", "int64", "int8", "uint8", "float16"])
    x = array(rng, shape(rng), dtype, -5, 5)
    lo = np.array(rng.integers(-3, 1), dtype=dtype) if rng.random() < 0.7 else None
    hi = np.array(rng.integers(0, 4), dtype=dtype) if rng.random() < 0.7 else None
    if lo is not None and hi is not None and rng.random() < 0.2:
        lo, hi = hi, lo  # min above max: every element becomes max
    ins = [x, lo, hi]
    const = {i for i in (1, 2) if ins[i] is not None and rng.random() < 0.6}
    return OpCase(op, ins, opset=13, const=const)


@generator("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
           "ReduceLogSumExp", "ReduceSumSquare", "ReduceLogSum")
def _reduce(rng, op):
    dtype = pick(rng, FLOATS + (["int32", "int64"] if op in ("ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd") else []))
    s = shape(rng, lo=1)
    if op == "ReduceMean":  # the mean of no values is undefined in the spec: onnxruntime 0, numpy NaN
        s = tuple(d or 1 for d in s)
    # onnxruntime's ReduceMax and ReduceMin skip NaN (numpy and onnx.reference keep it; the spec is
    # silent), and ReduceLogSum is the log of a sum of positive values
    special = op not in ("ReduceLogSum", "ReduceMax", "ReduceMin")
    x = array(rng, s, dtype, 0.5 if op == "ReduceLogSum" else -3, 3, special=special)
    rank = len(s)
    axes = sorted({int(a) for a in rng.integers(-rank, rank, size=int(rng.integers(0, rank + 1)))}) if rank else []
    axes = [a for i, a in enumerate(axes) if (a % rank) not in {b % rank for b in axes[:i]}] if rank else []
    attrs = {}
    if rng.random() < 0.5:
        attrs["keepdims"] = int(rng.integers(0, 2))
    opset = pick(rng, [13, 18])
    as_input = opset >= 18 or op == "ReduceSum"
    if as_input and opset < 13:
        opset = 13
    if as_input:
        if rng.random() < 0.3:
            attrs["noop_with_empty_axes"] = int(rng.integers(0, 2))
        ins = [x, np.array(axes, np.int64) if axes or rng.random() < 0.5 else None]
        return OpCase(op, ins, attrs, opset=opset, const={1} if rng.random() < 0.7 else set())
    if axes:
        attrs["axes"] = axes
    return OpCase(op, [x], attrs, opset=13)


@generator("ArgMax", "ArgMin")
def _arg(rng, op):
    dtype = pick(rng, ["float32", "float64", "int32", "int64", "uint8"])
    s = shape(rng, rank=int(rng.integers(1, 5)), lo=1)
    x = array(rng, s, dtype, -2, 2, special=False)  # small values: ties, for select_last_index
    attrs = {"axis": int(rng.integers(-len(s), len(s)))}
    if rng.random() < 0.5:
        attrs["keepdims"] = int(rng.integers(0, 2))
    if rng.random() < 0.5:
        attrs["select_last_index"] = int(rng.integers(0, 2))
    return OpCase(op, [x], attrs, opset=13)


@generator("Softmax", "LogSoftmax")
def _softmax(rng, op):
    opset = pick(rng, [11, 13])
    s = shape(rng, rank=int(rng.integers(1, 5)), lo=1)
    attrs = {"axis": int(rng.integers(-len(s), len(s)))} if rng.random() < 0.7 else {}
    # onnxruntime's LogSoftmax row max skips a NaN, which leaves the row's other values finite
    x = array(rng, s, pick(rng, FLOATS), -6, 6, special=op == "Softmax")
    return OpCase(op, [strided(rng, x)], attrs, opset=opset)


@generator("MatMul")
def _matmul(rng, op):
    dtype = pick(rng, ["float32", "float32", "float64", "int32", "int64", "float16"])
    m, k, n = (int(v) for v in rng.integers(1, 7, size=3))
    a_batch = shape(rng, max_rank=2, hi=3)
    b_batch = broadcast_partner(rng, a_batch)
    if rng.random() < 0.5:
        a_batch, b_batch = b_batch, a_batch
    a = (*a_batch, m, k) if rng.random() > 0.15 else (k,)
    b = (*b_batch, k, n) if rng.random() > 0.15 else (k,)
    x, y = array(rng, a, dtype, -2, 2, special=False), array(rng, b, dtype, -2, 2, special=False)
    return OpCase(op, [strided(rng, x), y], opset=13, const=_const(rng, 2))


@generator("Gemm")
def _gemm(rng, op):
    dtype = pick(rng, ["float32", "float32", "float64"])
    m, k, n = (int(v) for v in rng.integers(1, 7, size=3))
    attrs = {}
    ta, tb = int(rng.integers(0, 2)), int(rng.integers(0, 2))
    if ta:
        attrs["transA"] = 1
    if tb:
        attrs["transB"] = 1
    for name in ("alpha", "beta"):
        if rng.random() < 0.3:
            attrs[name] = float(pick(rng, [0.0, 0.5, -1.0, 2.0]))
    a = array(rng, (k, m) if ta else (m, k), dtype, -2, 2, special=False)
    b = array(rng, (n, k) if tb else (k, n), dtype, -2, 2, special=False)
    c = None
    if rng.random() < 0.7:
        c = array(rng, pick(rng, [(m, n), (n,), (1, n), (m, 1), (), (1,)]), dtype, -2, 2, special=False)
    return OpCase(op, [a, b, c], attrs, opset=13, const={i for i in (1, 2) if rng.random() < 0.6})


@generator("LayerNormalization")
def _layernorm(rng, op):
    s = shape(rng, rank=int(rng.integers(1, 5)), lo=1)
    axis = int(rng.integers(-len(s), len(s)))
    norm = s[axis % len(s):]
    dtype = pick(rng, ["float32", "float32", "float64", "float16"])
    ins = [array(rng, s, dtype, special=False), array(rng, norm, dtype, special=False)]
    ins.append(array(rng, norm, dtype, special=False) if rng.random() < 0.7 else None)
    attrs = {"axis": axis}
    if rng.random() < 0.3:
        attrs["epsilon"] = float(pick(rng, [1e-3, 1e-12, 0.5]))
    n_out = int(rng.integers(1, 4))
    return OpCase(op, ins, attrs, opset=17, const={i for i in (1, 2) if rng.random() < 0.6}, n_outputs=n_out)


@generator("BatchNormalization")
def _batchnorm(rng, op):
    s = shape(rng, rank=int(rng.integers(2, 5)), lo=1)
    c = s[1]
    dtype = pick(rng, ["float32", "float32", "float64", "float16"])
    ins = [array(rng, s, dtype, special=False)] + [array(rng, (c,), dtype, -1, 1, special=False) for _ in range(3)]
    ins.append(array(rng, (c,), dtype, 0.1, 2.0, special=False))
    attrs = {"epsilon": float(pick(rng, [1e-5, 1e-3]))}
    return OpCase(op, ins, attrs, opset=15, const={i for i in range(1, 5) if rng.random() < 0.7})


@generator("CumSum")
def _cumsum(rng, op):
    s = shape(rng, rank=int(rng.integers(1, 4)), lo=1)
    x = array(rng, s, pick(rng, ["float32", "float64", "int32", "int64"]), special=False)
    axis = np.array(int(rng.integers(-len(s), len(s))), pick(rng, [np.int64, np.int32]))
    attrs = {k: 1 for k in ("exclusive", "reverse") if rng.random() < 0.4}
    return OpCase(op, [x, axis], attrs, opset=14, const={1} if rng.random() < 0.5 else set())


@generator("Cast")
def _cast(rng, op):
    src = pick(rng, NUMERIC + ["bool"])
    dst = pick(rng, NUMERIC + ["bool"])
    x = array(rng, shape(rng), src, -300, 300, special=False)
    if np.dtype(src).kind == "f" and np.dtype(dst).kind in "iu":
        x = np.asarray(np.clip(x, np.iinfo(dst).min, np.iinfo(dst).max), dtype=src)  # out-of-range float to int is undefined
    if np.dtype(src).kind == "f" and np.dtype(dst) == np.uint8:
        x = np.abs(x)
    to = helper.np_dtype_to_tensor_dtype(np.dtype(dst))
    return OpCase(op, [x], {"to": to}, opset=pick(rng, [13, 19]))


@generator("PRelu")
def _prelu(rng, op):
    s = shape(rng, rank=int(rng.integers(1, 5)))
    slope = broadcast_partner(rng, s)[-len(s):] if s else ()
    dtype = pick(rng, ["float32", "float64", "float16"])
    return OpCase(op, [array(rng, s, dtype), array(rng, slope, dtype, -1, 1)], opset=16, const=_const(rng, 2))


@generator("Gelu", "Mish", "Hardmax", "Shrink", "IsInf", "Not", "BitwiseNot")
def _unary_more(rng, op):
    s = shape(rng, rank=int(rng.integers(1, 5)) if op == "Hardmax" else None)
    attrs, opset, dtype = {}, 13, pick(rng, FLOATS)
    if op == "Gelu":
        opset, attrs = 20, ({"approximate": "tanh"} if rng.random() < 0.5 else {})
    elif op == "Mish":
        opset, dtype = 18, pick(rng, ["float32", "float64"])
    elif op == "Hardmax":
        attrs = {"axis": int(rng.integers(-len(s), len(s)))} if rng.random() < 0.7 else {}
        return OpCase(op, [array(rng, s, dtype, -2, 2, special=False).round(1)], attrs, opset=13)  # ties
    elif op == "Shrink":  # not float64: onnxruntime's float64 Shrink is 1e-7 off (float32 arithmetic)
        dtype = pick(rng, ["float32", "int32", "int8"])
        attrs = {"lambd": float(pick(rng, [0.5, 1.0, 2.0])), "bias": float(pick(rng, [0.0, 1.5]))}
        opset = 9
    elif op == "IsInf":
        opset = 20 if rng.random() < 0.5 else 10
        dtype = "float32" if opset == 10 else pick(rng, ["float32", "float64"])
        attrs = {k: int(rng.integers(0, 2)) for k in ("detect_negative", "detect_positive") if rng.random() < 0.5}
        x = array(rng, s, dtype)
        if x.size:
            x.flat[int(rng.integers(0, x.size))] = pick(rng, [np.inf, -np.inf, np.nan])
        return OpCase(op, [x], attrs, opset=opset)
    elif op == "Not":
        return OpCase(op, [array(rng, s, bool)], opset=1)
    elif op == "BitwiseNot":
        return OpCase(op, [array(rng, s, pick(rng, ["int32", "int64", "uint8", "int8"]), -100, 100)], opset=18)
    return OpCase(op, [array(rng, s, dtype)], attrs, opset=opset)


@generator("BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor")
def _bitwise(rng, op):
    a, b = _binary_shapes(rng)
    if op == "BitShift":
        dtype = pick(rng, ["uint8", "uint32", "uint64"])
        bits = np.iinfo(dtype).bits
        return OpCase(op, [array(rng, a, dtype, 0, 200), array(rng, b, dtype, 0, bits - 1)],
                      {"direction": pick(rng, ["LEFT", "RIGHT"])}, opset=11, const=_const(rng, 2))
    dtype = pick(rng, ["int32", "int64", "uint8", "int8"])
    return OpCase(op, [array(rng, a, dtype, -100, 100), array(rng, b, dtype, -100, 100)], opset=18, const=_const(rng, 2))


@generator("CastLike")
def _castlike(rng, op):
    src, dst = pick(rng, NUMERIC), pick(rng, NUMERIC)
    x = array(rng, shape(rng), src, 0, 100, special=False)
    return OpCase(op, [x, array(rng, (int(rng.integers(0, 3)),), dst)], opset=15, const=_const(rng, 2))


@generator("InstanceNormalization", "MeanVarianceNormalization", "LRN")
def _norms(rng, op):
    s = shape(rng, rank=int(rng.integers(3, 5)), lo=1)
    dtype = pick(rng, ["float32", "float32", "float64", "float16"] if op != "LRN" else ["float32"])
    x = array(rng, s, dtype, special=False)
    if op == "InstanceNormalization":
        c = s[1]
        x = array(rng, tuple(d or 1 for d in s), dtype, special=False)  # onnxruntime segfaults on empty x
        return OpCase(op, [x, array(rng, (c,), dtype, special=False), array(rng, (c,), dtype, special=False)],
                      {"epsilon": float(pick(rng, [1e-5, 1e-2]))}, opset=6, const={1, 2})
    if op == "MeanVarianceNormalization":
        # Normalized over at least two values: onnxruntime leaves out the spec's epsilon, so a
        # constant row is NaN there and 0 in onnx.reference and here (the function body's result).
        x = array(rng, tuple(max(d, 2) for d in s), "float32", special=False)
        if len(s) < 4 or rng.random() < 0.6:  # the default axes [0, 2, 3] need a 4-D input
            attrs = {"axes": sorted(set(int(a) for a in rng.choice(len(s), size=int(rng.integers(1, len(s) + 1)),
                                                                    replace=False)))}
        else:
            attrs = {}
        return OpCase(op, [x], attrs, opset=13)
    attrs = {"size": int(pick(rng, [1, 2, 3, 5]))}
    for name, vals in (("alpha", [1e-4, 0.5]), ("beta", [0.75, 0.5]), ("bias", [1.0, 2.0])):
        if rng.random() < 0.5:
            attrs[name] = float(pick(rng, vals))
    return OpCase(op, [x], attrs, opset=13)


@generator("MatMulInteger")
def _matmul_integer(rng, op):
    m, k, n = (int(v) for v in rng.integers(1, 6, size=3))
    batch = shape(rng, max_rank=1, hi=3)
    at, bt = pick(rng, ["uint8", "int8"]), pick(rng, ["uint8", "int8"])
    a = array(rng, (*batch, m, k), at, -128, 255)
    b = array(rng, (k, n), bt, -128, 255)
    ins = [a, b]
    if rng.random() < 0.5:
        ins.append(array(rng, pick(rng, [(), (m,)]) if rng.random() < 0.5 else (), at, -128, 255))
        if rng.random() < 0.5:
            ins.append(array(rng, pick(rng, [(), (n,)]), bt, -128, 255))
    return OpCase(op, ins, opset=10, const=_const(rng, len(ins)))


@generator("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear")
def _quant(rng, op):
    s = shape(rng, rank=int(rng.integers(1, 5)), lo=1)
    if op == "DynamicQuantizeLinear":
        return OpCase(op, [array(rng, s, "float32", -5, 5, special=False)], opset=11, n_outputs=3)
    zdtype = pick(rng, ["uint8", "int8"])
    attrs, sshape = {}, ()
    if rng.random() < 0.4:  # per axis
        axis = int(rng.integers(-len(s), len(s)))
        attrs["axis"] = axis
        sshape = (s[axis],)
    scale = array(rng, sshape, "float32", 0.01, 0.5, special=False)
    zp = array(rng, sshape, zdtype, -20, 20) if rng.random() < 0.8 else None
    if op == "QuantizeLinear":
        x = array(rng, s, "float32", -40, 40, special=False)
        if rng.random() < 0.3:
            x = np.round(x * 2) / 2  # halves: round to nearest even
        return OpCase(op, [x, scale, zp], attrs, opset=pick(rng, [13, 19]), const={1, 2} if rng.random() < 0.7 else set())
    x = array(rng, s, zdtype if zp is not None else pick(rng, ["uint8", "int8", "int32"]), -128, 255)
    if x.dtype == np.int32:
        zp = None
    return OpCase(op, [x, scale, zp], attrs, opset=pick(rng, [13, 19]), const={1, 2} if rng.random() < 0.7 else set())


def _conv_attrs(rng, nd: int, k: tuple, transpose: bool = False) -> dict:
    attrs = {"kernel_shape": list(k)} if rng.random() < 0.5 else {}
    if rng.random() < 0.5:
        attrs["strides"] = [int(v) for v in rng.integers(1, 3, size=nd)]
    if rng.random() < 0.3:
        attrs["dilations"] = [int(v) for v in rng.integers(1, 3, size=nd)]
    mode = pick(rng, ["pads", "pads", "none", "SAME_UPPER", "SAME_LOWER", "VALID"])
    if mode == "pads":
        attrs["pads"] = [int(v) for v in rng.integers(0, 3, size=2 * nd)]
    elif mode != "none":
        attrs["auto_pad"] = mode
    if transpose and rng.random() < 0.3 and max(attrs.get("strides", [1])) > 1:
        attrs["output_padding"] = [int(rng.integers(0, s)) for s in attrs["strides"]]
    if transpose and attrs.get("auto_pad", "").startswith("SAME"):
        # SAME with a total padding below zero (kernel extent + output_padding < stride): the spec's
        # output is input * stride, onnxruntime's one less (docs/cpu-ep-random-cases.md); not compared here
        st, dl = attrs.get("strides", [1] * nd), attrs.get("dilations", [1] * nd)
        op_ = attrs.get("output_padding", [0] * nd)
        if any((k[i] - 1) * dl[i] + 1 + op_[i] < st[i] for i in range(nd)):
            del attrs["auto_pad"]
    return attrs


@generator("Conv", "ConvTranspose")
def _conv(rng, op):
    nd = pick(rng, [1, 2, 2, 2, 3])
    group = pick(rng, [1, 1, 2, 3])
    c = group * int(rng.integers(1, 3))
    m = group * int(rng.integers(1, 3))
    k = tuple(int(v) for v in rng.integers(1, 4, size=nd))
    sp = tuple(int(v) for v in rng.integers(3, 8 if nd < 3 else 5, size=nd))
    n = int(rng.integers(1, 3))
    dtype = pick(rng, ["float32", "float32", "float64"] if op == "Conv" else ["float32"])
    attrs = _conv_attrs(rng, nd, k, transpose=op == "ConvTranspose")
    if group > 1:
        attrs["group"] = group
    if op == "Conv":
        w = array(rng, (m, c // group, *k), dtype, -1, 1, special=False)
    else:
        w = array(rng, (c, m // group, *k), dtype, -1, 1, special=False)
    x = array(rng, (n, c, *sp), dtype, -2, 2, special=False)
    b = array(rng, (m,), dtype, -1, 1, special=False) if rng.random() < 0.6 else None
    return OpCase(op, [strided(rng, x), w, b], attrs, opset=pick(rng, [11, 13]), const={1, 2} if rng.random() < 0.8 else set())


@generator("MaxPool", "AveragePool", "LpPool")
def _pool(rng, op):
    nd = pick(rng, [1, 2, 2, 3])
    k = tuple(int(v) for v in rng.integers(1, 4, size=nd))
    sp = tuple(int(v) for v in rng.integers(3, 8, size=nd))
    # MaxPool with a NaN: onnxruntime keeps it in some windows and not others, onnx.reference
    # drops it, onnxhal keeps it (docs/cpu-ep.md); infinities are compared
    x = array(rng, (int(rng.integers(1, 3)), int(rng.integers(1, 4)), *sp), pick(rng, ["float32", "float32", "float64"]),
              special=op == "MaxPool", nan=False)
    attrs = _conv_attrs(rng, nd, k)
    if attrs.get("auto_pad", "").startswith("SAME"):  # onnxruntime's SAME pads ignore dilations (spec: kept)
        attrs.pop("dilations", None)
    attrs["kernel_shape"] = list(k)
    if "pads" in attrs:  # onnxruntime refuses a pad as large as the kernel
        attrs["pads"] = [min(p, k[i % nd] - 1) for i, p in enumerate(attrs["pads"])]
    if op == "LpPool":
        attrs.pop("dilations", None) if rng.random() < 0.5 else None
        attrs["p"] = int(pick(rng, [1, 2, 3]))
        return OpCase(op, [x], attrs, opset=18)
    if rng.random() < 0.3 and attrs.get("auto_pad", "NOTSET") in ("NOTSET", "VALID") and "dilations" not in attrs:
        attrs["ceil_mode"] = 1
    if op == "AveragePool":
        attrs.pop("dilations", None)
        if rng.random() < 0.5:
            attrs["count_include_pad"] = 1
    n_out = 2 if op == "MaxPool" and rng.random() < 0.3 else 1
    if n_out == 2:
        attrs.pop("dilations", None)  # onnxruntime's Indices output path has no dilation
        x = x.astype(np.float32)
    return OpCase(op, [x], attrs, opset=pick(rng, [12, 19]) if op == "MaxPool" else 19, n_outputs=n_out)


@generator("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool")
def _global_pool(rng, op):
    s = shape(rng, rank=int(rng.integers(3, 5)), lo=1)
    attrs = {"p": int(pick(rng, [1, 2, 3]))} if op == "GlobalLpPool" and rng.random() < 0.5 else {}
    x = array(rng, s, pick(rng, ["float32", "float64"]), special=op == "GlobalMaxPool", nan=False)
    return OpCase(op, [x], attrs, opset=2 if op == "GlobalLpPool" else 1)


@generator("Resize")
def _resize(rng, op):
    s = (int(rng.integers(1, 3)), int(rng.integers(1, 3)), *(int(v) for v in rng.integers(1, 7, size=2)))
    if rng.random() < 0.2:
        s = s[:2] + (s[2],)  # 3-D
    mode = pick(rng, ["nearest", "linear", "cubic"])
    attrs = {"mode": mode}
    ctm = pick(rng, ["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel", "tf_crop_and_resize", "half_pixel_symmetric"])
    if ctm != "half_pixel" or rng.random() < 0.3:
        attrs["coordinate_transformation_mode"] = ctm
    if mode == "nearest" and rng.random() < 0.7:
        attrs["nearest_mode"] = pick(rng, ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
    if mode == "cubic" and rng.random() < 0.4:
        attrs["cubic_coeff_a"] = -0.5
    if mode == "cubic" and rng.random() < 0.3:
        attrs["exclude_outside"] = 1
    x = array(rng, s, "float32", -3, 3, special=False)
    roi = None
    if ctm == "tf_crop_and_resize":
        lo = rng.uniform(0, 0.4, size=len(s))
        hi = lo + rng.uniform(0.3, 0.6, size=len(s))
        lo[:2], hi[:2] = 0, 1  # N and C are not resized: their crop is the whole axis
        roi = np.concatenate([lo, hi]).astype(np.float32)
        if rng.random() < 0.5:
            attrs["extrapolation_value"] = 0.5
    spatial = len(s) - 2
    if rng.random() < 0.5:
        scales = np.array([1.0, 1.0] + [float(pick(rng, [0.5, 2.0, 1.5, 0.75, 3.0, 1.0])) for _ in range(spatial)], np.float32)
        ins = [x, roi if roi is not None else np.zeros(0, np.float32), scales]
    else:
        sizes = np.array(list(s[:2]) + [int(rng.integers(1, 10)) for _ in range(spatial)], np.int64)
        ins = [x, roi, None, sizes]
        if roi is None and rng.random() < 0.5:
            ins[1] = np.zeros(0, np.float32)
        if rng.random() < 0.2 and spatial == 2:
            attrs["keep_aspect_ratio_policy"] = pick(rng, ["not_larger", "not_smaller"])
    if mode != "nearest" and rng.random() < 0.2 and "keep_aspect_ratio_policy" not in attrs:
        attrs["antialias"] = 1
    return OpCase(op, ins, attrs, opset=19, const={i for i in (1, 2, 3) if rng.random() < 0.8})


@generator("GridSample")
def _grid_sample(rng, op):
    n, c, h, w = (int(v) for v in rng.integers(1, 5, size=4))
    ho, wo = (int(v) for v in rng.integers(1, 5, size=2))
    attrs = {"mode": pick(rng, ["linear", "nearest", "cubic"]), "padding_mode": pick(rng, ["zeros", "border", "reflection"])}
    if rng.random() < 0.5:
        attrs["align_corners"] = 1
    x = array(rng, (n, c, h, w), "float32", special=False)
    grid = array(rng, (n, ho, wo, 2), "float32", -1.3, 1.3, special=False)
    return OpCase(op, [x, grid], attrs, opset=20)


@generator("RoiAlign")
def _roi_align(rng, op):
    n, c, h, w = 1, int(rng.integers(1, 4)), int(rng.integers(3, 9)), int(rng.integers(3, 9))
    r = int(rng.integers(1, 4))
    x1, y1 = rng.uniform(0, w - 1, size=r), rng.uniform(0, h - 1, size=r)
    rois = np.stack([x1, y1, x1 + rng.uniform(0.5, 4, size=r), y1 + rng.uniform(0.5, 4, size=r)], 1).astype(np.float32)
    attrs = {"output_height": int(rng.integers(1, 4)), "output_width": int(rng.integers(1, 4)),
             "sampling_ratio": int(rng.integers(0, 3)), "mode": pick(rng, ["avg", "max"]),
             "spatial_scale": float(pick(rng, [1.0, 0.5])),
             "coordinate_transformation_mode": pick(rng, ["half_pixel", "output_half_pixel"])}
    x = array(rng, (n, c, h, w), "float32", special=False)
    return OpCase(op, [x, rois, np.zeros(r, np.int64)], attrs, opset=16, const={1, 2} if rng.random() < 0.5 else set())


@generator("GroupNormalization", "RMSNormalization")
def _group_norm(rng, op):
    if op == "RMSNormalization":
        s = shape(rng, rank=int(rng.integers(1, 4)), lo=1)
        axis = int(rng.integers(-len(s), len(s)))
        dtype = pick(rng, ["float32", "float64", "float16"])
        scale = array(rng, s[axis % len(s):], dtype, special=False)
        return OpCase(op, [array(rng, s, dtype, special=False), scale], {"axis": axis}, opset=23, const=_const(rng, 2))
    g = int(rng.integers(1, 4))
    c = g * int(rng.integers(1, 3))
    s = (int(rng.integers(1, 3)), c, *(int(v) for v in rng.integers(1, 5, size=int(rng.integers(1, 3)))))
    x = array(rng, s, "float32", special=False)
    return OpCase(op, [x, array(rng, (c,), "float32", special=False), array(rng, (c,), "float32", special=False)],
                  {"num_groups": g, "epsilon": 1e-5}, opset=21, const=_const(rng, 3))


@generator("Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh")
def _trig(rng, op):
    lo, hi = {"Asin": (-1, 1), "Acos": (-1, 1), "Atanh": (-0.99, 0.99), "Acosh": (1, 5)}.get(op, (-3, 3))
    return OpCase(op, [array(rng, shape(rng), pick(rng, ["float32", "float64"]), lo, hi)], opset=9)


@generator("LpNormalization")
def _lp_norm(rng, op):
    s = shape(rng, rank=int(rng.integers(1, 4)), lo=1)
    attrs = {"axis": int(rng.integers(-len(s), len(s))), "p": int(pick(rng, [1, 2]))}
    return OpCase(op, [array(rng, s, pick(rng, ["float32", "float64"]), special=False)], attrs, opset=1)


@generator("RNN", "GRU", "LSTM")
def _recurrent(rng, op):
    seq, batch, inp, hidden = (int(v) for v in rng.integers(1, 5, size=4))
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[op]
    direction = pick(rng, ["forward", "reverse", "bidirectional"])
    nd = 2 if direction == "bidirectional" else 1
    layout = int(rng.random() < 0.25)
    x = array(rng, (batch, seq, inp) if layout else (seq, batch, inp), "float32", -1, 1, special=False)
    w = array(rng, (nd, gates * hidden, inp), "float32", -0.5, 0.5, special=False)
    r = array(rng, (nd, gates * hidden, hidden), "float32", -0.5, 0.5, special=False)
    b = array(rng, (nd, 2 * gates * hidden), "float32", -0.5, 0.5, special=False) if rng.random() < 0.7 else None
    lens = None
    if rng.random() < 0.3:
        lens = rng.integers(1, seq + 1, size=batch).astype(np.int32)
    h0 = array(rng, (batch, nd, hidden) if layout else (nd, batch, hidden), "float32", -1, 1, special=False) \
        if rng.random() < 0.5 else None
    ins = [x, w, r, b, lens, h0]
    if op == "LSTM" and rng.random() < 0.4:
        ins.append(array(rng, (batch, nd, hidden) if layout else (nd, batch, hidden), "float32", -1, 1, special=False))
        if rng.random() < 0.5:
            ins.append(array(rng, (nd, 3 * hidden), "float32", -0.5, 0.5, special=False))  # peepholes
    attrs = {"hidden_size": hidden, "direction": direction}
    if layout:
        attrs["layout"] = 1
    if op == "GRU" and rng.random() < 0.5:
        attrs["linear_before_reset"] = 1
    if rng.random() < 0.2:
        attrs["clip"] = 0.5
    if rng.random() < 0.4:
        names = ["Tanh", "Relu", "Sigmoid", "Affine", "LeakyRelu", "HardSigmoid", "ScaledTanh", "Softsign", "Elu"]
        k = {"RNN": 1, "GRU": 2, "LSTM": 3}[op]
        acts = attrs["activations"] = [pick(rng, names) for _ in range(k * nd)]
        n_alpha = sum(a in ("Affine", "LeakyRelu", "HardSigmoid", "ScaledTanh", "Elu") for a in acts)
        n_beta = sum(a in ("Affine", "HardSigmoid", "ScaledTanh") for a in acts)
        # Affine and ScaledTanh left without a value: onnxruntime takes 0, the spec the ONNX
        # operator's default (docs/cpu-ep-random-cases.md); those cases always get every value
        full = any(a in ("Affine", "ScaledTanh") for a in acts)
        if n_alpha and (full or rng.random() < 0.5):
            attrs["activation_alpha"] = [float(pick(rng, [0.5, 0.1, 1.5]))
                                         for _ in range(n_alpha if full else int(rng.integers(1, n_alpha + 1)))]
        if n_beta and (full or rng.random() < 0.5):
            attrs["activation_beta"] = [float(pick(rng, [0.5, 0.2]))
                                        for _ in range(n_beta if full else int(rng.integers(1, n_beta + 1)))]
    n_out = int(rng.integers(1, 4 if op == "LSTM" else 3))
    return OpCase(op, ins, attrs, opset=14, const={1, 2, 3} if rng.random() < 0.7 else set(), n_outputs=n_out)


@generator("QLinearMatMul", "QLinearConv", "ConvInteger")
def _qlinear(rng, op):
    qt = pick(rng, ["uint8", "int8"])
    wt = pick(rng, ["uint8", "int8"]) if op != "QLinearMatMul" else qt

    def q(s, t):
        return array(rng, s, t, -128, 255)

    def sc():
        return np.array(rng.uniform(0.01, 0.1), np.float32)

    def zp(t):
        return np.array(rng.integers(0, 20) if t == "uint8" else rng.integers(-10, 10), t)

    if op == "QLinearMatMul":
        m, k, n = (int(v) for v in rng.integers(1, 6, size=3))
        batch = shape(rng, max_rank=1, hi=3)
        ins = [q((*batch, m, k), qt), sc(), zp(qt), q((k, n), wt), sc(), zp(wt), sc(), zp(qt)]
        return OpCase(op, ins, opset=10, const={i for i in range(1, 8) if rng.random() < 0.7})
    c, m = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    k = tuple(int(v) for v in rng.integers(1, 4, size=2))
    x = q((1, c, int(rng.integers(3, 7)), int(rng.integers(3, 7))), qt)
    attrs = {}
    if rng.random() < 0.5:
        attrs["pads"] = [int(v) for v in rng.integers(0, 2, size=4)]
    if rng.random() < 0.4:
        attrs["strides"] = [int(v) for v in rng.integers(1, 3, size=2)]
    w = q((m, c, *k), wt)
    if op == "ConvInteger":
        ins = [x, w, zp(qt) if rng.random() < 0.6 else None]
        return OpCase(op, ins, attrs, opset=10, const={1, 2} if rng.random() < 0.7 else set())
    bias = rng.integers(-500, 500, size=m).astype(np.int32) if rng.random() < 0.6 else None
    ins = [x, sc(), zp(qt), w, sc(), zp(wt), sc(), zp(qt), bias]
    return OpCase(op, ins, attrs, opset=10, const={i for i in range(1, 9) if rng.random() < 0.7})


@generator("NonMaxSuppression")
def _nms(rng, op):
    b, c, n = int(rng.integers(1, 3)), int(rng.integers(1, 3)), int(rng.integers(1, 9))
    xy = rng.uniform(0, 10, size=(b, n, 2))
    wh = rng.uniform(1, 5, size=(b, n, 2))
    center = int(rng.random() < 0.3)
    boxes = np.concatenate([xy, wh], -1) if center else np.concatenate([xy, xy + wh], -1)
    scores = rng.permutation(b * c * n).reshape(b, c, n) / (b * c * n)  # distinct: no ties to order
    ins = [boxes.astype(np.float32), scores.astype(np.float32),
           np.array([int(rng.integers(0, n + 2))], np.int64) if rng.random() < 0.8 else None,
           np.array([float(rng.uniform(0.1, 0.8))], np.float32) if rng.random() < 0.8 else None,
           np.array([float(rng.uniform(0.0, 0.5))], np.float32) if rng.random() < 0.5 else None]
    return OpCase(op, ins, {"center_point_box": center} if center or rng.random() < 0.3 else {}, opset=11,
                  const={2, 3, 4} if rng.random() < 0.7 else set())


@generator("Det")
def _det(rng, op):
    n = int(rng.integers(1, 5))
    batch = shape(rng, max_rank=2, lo=1, hi=3)
    return OpCase(op, [array(rng, (*batch, n, n), pick(rng, ["float32", "float64"]), -2, 2, special=False)], opset=11)


@generator("SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss")
def _losses(rng, op):
    n, c = int(rng.integers(1, 5)), int(rng.integers(2, 5))
    # no empty batch: the mean over no element is 0 in onnxruntime, NaN (0 / 0) by the spec's formula
    extra = tuple(d or 1 for d in shape(rng, max_rank=2, lo=1, hi=3))
    x = array(rng, (n, c, *extra), "float32", -3, 3, special=False)
    labels = rng.integers(0, c, size=(n, *extra)).astype(np.int64)
    attrs = {"reduction": pick(rng, ["mean", "sum", "none"])}
    if rng.random() < 0.3:
        attrs["ignore_index"] = int(rng.integers(0, c))
        if labels.size:
            labels.flat[0] = attrs["ignore_index"]
    weights = array(rng, (c,), "float32", 0.1, 2, special=False) if rng.random() < 0.4 else None
    n_out = 2 if op == "SoftmaxCrossEntropyLoss" and rng.random() < 0.4 else 1
    return OpCase(op, [x, labels, weights], attrs, opset=13, const={2} if rng.random() < 0.5 else set(), n_outputs=n_out)


@generator("Attention")
def _attention(rng, op):
    b, sq, skv, h, d = (int(v) for v in rng.integers(1, 4, size=5))
    kv_heads = h if rng.random() < 0.6 else 1
    dt = pick(rng, ["float32", "float32", "float16"])
    if rng.random() < 0.5:  # 4-D (B, heads, S, D)
        q, k, v = (b, h, sq, d), (b, kv_heads, skv, d), (b, kv_heads, skv, d)
        attrs = {}
    else:  # 3-D (B, S, heads * D)
        q, k, v = (b, sq, h * d), (b, skv, kv_heads * d), (b, skv, kv_heads * d)
        attrs = {"q_num_heads": h, "kv_num_heads": kv_heads}
    ins = [array(rng, q, dt, -1, 1, special=False), array(rng, k, dt, -1, 1, special=False),
           array(rng, v, dt, -1, 1, special=False)]
    if rng.random() < 0.4:
        ins.append(array(rng, (sq, skv), dt, -1, 1, special=False) if rng.random() < 0.5
                   else np.asarray(rng.random((sq, skv)) < 0.8))
    if rng.random() < 0.3:
        attrs["is_causal"] = 1
    if rng.random() < 0.3:
        attrs["scale"] = float(pick(rng, [0.5, 0.125]))
    if rng.random() < 0.2:
        attrs["softcap"] = 2.0
    return OpCase(op, ins, attrs, opset=23)


@generator("DFT")
def _dft(rng, op):
    n = int(rng.integers(1, 9))
    batch = int(rng.integers(1, 3))
    complex_in = rng.random() < 0.4
    x = array(rng, (batch, n, 2 if complex_in else 1), "float32", special=False)
    attrs = {}
    if rng.random() < 0.3:
        attrs["inverse"] = 1
    if not complex_in and rng.random() < 0.4 and not attrs.get("inverse"):
        attrs["onesided"] = 1
    length = np.array(int(rng.integers(1, 10)), np.int64) if rng.random() < 0.4 else None
    axis = np.array(pick(rng, [1, -2]), np.int64) if rng.random() < 0.5 else None
    return OpCase(op, [x, length, axis], attrs, opset=20, const={1, 2})


@generator("Swish")
def _swish(rng, op):
    attrs = {"alpha": float(pick(rng, [0.5, 1.0, 1.702]))} if rng.random() < 0.6 else {}
    return OpCase(op, [array(rng, shape(rng), pick(rng, ["float32", "float64", "float16"]))], attrs, opset=24)


@generator("RotaryEmbedding")
def _rotary(rng, op):
    b, s, heads = (int(v) for v in rng.integers(1, 4, size=3))
    d = 2 * int(rng.integers(1, 4))
    rot = d if rng.random() < 0.6 else 2 * int(rng.integers(1, d // 2 + 1))
    max_pos = s + int(rng.integers(0, 4))
    attrs = {"interleaved": int(rng.integers(0, 2))}
    if rot != d:
        attrs["rotary_embedding_dim"] = rot
    if rng.random() < 0.5:  # 4-D (B, heads, S, D)
        x = array(rng, (b, heads, s, d), "float32", -1, 1, special=False)
    else:  # 3-D (B, S, heads * D)
        x = array(rng, (b, s, heads * d), "float32", -1, 1, special=False)
        attrs["num_heads"] = heads
    if rng.random() < 0.5:  # caches indexed by position_ids
        cos = array(rng, (max_pos, rot // 2), "float32", -1, 1, special=False)
        sin = array(rng, (max_pos, rot // 2), "float32", -1, 1, special=False)
        pos = rng.integers(0, max_pos, size=(b, s)).astype(np.int64)
        ins = [x, cos, sin, pos]
    else:  # caches per batch and position
        ins = [x, array(rng, (b, s, rot // 2), "float32", -1, 1, special=False),
               array(rng, (b, s, rot // 2), "float32", -1, 1, special=False)]
    return OpCase(op, ins, attrs, opset=23, const={1, 2} if rng.random() < 0.5 else set())


@generator("AffineGrid")
def _affine_grid(rng, op):
    n = int(rng.integers(1, 3))
    if rng.random() < 0.6:
        size = np.array([n, int(rng.integers(1, 3)), int(rng.integers(1, 5)), int(rng.integers(1, 5))], np.int64)
        theta = array(rng, (n, 2, 3), "float32", -1, 1, special=False)
    else:
        size = np.array([n, 1, *(int(v) for v in rng.integers(1, 4, size=3))], np.int64)
        theta = array(rng, (n, 3, 4), "float32", -1, 1, special=False)
    attrs = {"align_corners": 1} if rng.random() < 0.5 else {}
    if attrs:  # a 1-pixel axis with align_corners: onnxruntime puts it at 1, onnx.reference at -1, PyTorch
        size[2:] = np.maximum(size[2:], 2)  # and onnxhal at 0 (docs/cpu-ep-random-cases.md)
    return OpCase(op, [theta, size], attrs, opset=20, const={1})


@generator("HannWindow", "HammingWindow", "BlackmanWindow")
def _window(rng, op):
    attrs = {"periodic": int(rng.integers(0, 2))} if rng.random() < 0.6 else {}
    if rng.random() < 0.3:
        attrs["output_datatype"] = pick(rng, [1, 11])
    return OpCase(op, [np.array(int(rng.integers(1, 12)), pick(rng, [np.int64, np.int32]))], attrs, opset=17)


@generator("CenterCropPad")
def _center_crop_pad(rng, op):
    s = shape(rng, rank=int(rng.integers(1, 4)), lo=1)
    if rng.random() < 0.5:
        axes = sorted(set(int(a) for a in rng.integers(-len(s), len(s), size=int(rng.integers(1, len(s) + 1)))))
        axes = [a for i, a in enumerate(axes) if a % len(s) not in {b % len(s) for b in axes[:i]}]
        target = np.array([int(rng.integers(1, 7)) for _ in axes], np.int64)
        attrs = {"axes": axes}
    else:
        target = np.array([int(rng.integers(1, 7)) for _ in s], np.int64)
        attrs = {}
    return OpCase(op, [array(rng, s, pick(rng, ["float32", "int64"])), target], attrs, opset=18, const={1})


@generator("Col2Im")
def _col2im(rng, op):
    img = [int(v) for v in rng.integers(3, 7, size=2)]
    block = [int(v) for v in rng.integers(1, 3, size=2)]
    attrs = {}
    strides = [int(v) for v in rng.integers(1, 3, size=2)] if rng.random() < 0.5 else [1, 1]
    dil = [int(v) for v in rng.integers(1, 3, size=2)] if rng.random() < 0.3 else [1, 1]
    pads = [int(v) for v in rng.integers(0, 2, size=4)] if rng.random() < 0.4 else [0, 0, 0, 0]
    for k, v, d in (("strides", strides, [1, 1]), ("dilations", dil, [1, 1]), ("pads", pads, [0, 0, 0, 0])):
        if v != d:
            attrs[k] = v
    blocks = 1
    for i in range(2):
        blocks *= (img[i] + pads[i] + pads[i + 2] - (dil[i] * (block[i] - 1) + 1)) // strides[i] + 1
    c = int(rng.integers(1, 3))
    x = array(rng, (int(rng.integers(1, 3)), c * block[0] * block[1], max(blocks, 0)), "float32", special=False)
    return OpCase(op, [x, np.array(img, np.int64), np.array(block, np.int64)], attrs, opset=18, const={1, 2})


@generator("MaxUnpool")
def _max_unpool(rng, op):
    n, c, h, w = 1, int(rng.integers(1, 3)), int(rng.integers(1, 4)), int(rng.integers(1, 4))
    k = [2, 2]
    extra = int(rng.random() < 0.3)  # an output_shape one row taller (MaxPool's input had an odd height)
    out_h, out_w = h * 2, w * 2  # the indices are flat in the shape the attributes imply (the spec)
    x = array(rng, (n, c, h, w), "float32", special=False)
    # one index per window (as MaxPool's Indices, flat in the output): no place written twice
    ii = rng.integers(0, 2, size=(n, c, h, w)) + 2 * np.arange(h)[:, None]
    jj = rng.integers(0, 2, size=(n, c, h, w)) + 2 * np.arange(w)[None, :]
    idx = ((np.arange(n)[:, None, None, None] * c + np.arange(c)[None, :, None, None]) * out_h + ii) * out_w + jj
    ins = [x, idx.astype(np.int64)]
    if extra:
        ins.append(np.array([n, c, out_h + 1, out_w], np.int64))
    return OpCase(op, ins, {"kernel_shape": k, "strides": [2, 2]}, opset=11, const={2} if len(ins) > 2 else set())


@generator("Dropout")
def _dropout(rng, op):
    x = array(rng, shape(rng), pick(rng, ["float32", "float64"]))
    ins = [x]
    if rng.random() < 0.5:
        ins.append(np.array(pick(rng, [0.0, 0.5]), np.float32))
        if rng.random() < 0.5:
            ins.append(np.array(False))  # training_mode off: the output is x, the mask all true
    return OpCase(op, ins, opset=13, const={1, 2}, n_outputs=int(rng.integers(1, 3)))


@generator("DeformConv")
def _deform_conv(rng, op):
    n, c, h, w = 1, int(rng.integers(1, 3)), int(rng.integers(3, 6)), int(rng.integers(3, 6))
    m, k = int(rng.integers(1, 3)), [int(v) for v in rng.integers(1, 3, size=2)]
    oh, ow = h - k[0] + 1, w - k[1] + 1
    x = array(rng, (n, c, h, w), "float32", special=False)
    wt = array(rng, (m, c, *k), "float32", -1, 1, special=False)
    off = array(rng, (n, 2 * k[0] * k[1], oh, ow), "float32", -1.5, 1.5, special=False)
    ins = [x, wt, off, array(rng, (m,), "float32", special=False) if rng.random() < 0.5 else None]
    if rng.random() < 0.4:
        ins.append(array(rng, (n, k[0] * k[1], oh, ow), "float32", 0, 1, special=False))
    return OpCase(op, ins, {"kernel_shape": k}, opset=19, const={1} if rng.random() < 0.5 else set())


@generator("MaxRoiPool")
def _max_roi_pool(rng, op):
    c, h, w = int(rng.integers(1, 3)), int(rng.integers(3, 8)), int(rng.integers(3, 8))
    r = int(rng.integers(1, 4))
    x1, y1 = rng.integers(0, w - 1, size=r), rng.integers(0, h - 1, size=r)
    rois = np.stack([np.zeros(r), x1, y1, x1 + rng.integers(0, 3, size=r), y1 + rng.integers(0, 3, size=r)], 1)
    attrs = {"pooled_shape": [int(v) for v in rng.integers(1, 3, size=2)]}
    if rng.random() < 0.3:
        attrs["spatial_scale"] = 0.5
    return OpCase(op, [array(rng, (1, c, h, w), "float32", special=False), rois.astype(np.float32)], attrs, opset=1)


@generator("STFT")
def _stft(rng, op):
    length = int(rng.integers(4, 17))
    frame = int(rng.integers(2, length + 1))
    step = int(rng.integers(1, frame + 1))
    x = array(rng, (int(rng.integers(1, 3)), length, 1), "float32", special=False)
    ins = [x, np.array(step, np.int64)]
    if rng.random() < 0.5:
        ins += [array(rng, (frame,), "float32", 0, 1, special=False), None]
    else:
        ins += [None, np.array(frame, np.int64)]
    attrs = {"onesided": int(rng.integers(0, 2))} if rng.random() < 0.6 else {}
    return OpCase(op, ins, attrs, opset=17, const={1, 2, 3})


@generator("Upsample")
def _upsample(rng, op):
    s = (1, int(rng.integers(1, 3)), int(rng.integers(1, 5)), int(rng.integers(1, 5)))
    scales = np.array([1, 1, float(pick(rng, [1, 2, 3])), float(pick(rng, [1, 2, 1.5]))], np.float32)
    mode = pick(rng, ["nearest", "linear"])
    return OpCase(op, [array(rng, s, "float32", special=False), scales], {"mode": mode}, opset=9, const={1})


@generator("StringNormalizer", "RegexFullMatch", "StringConcat", "StringSplit")
def _strings(rng, op):
    words = ["Hello", "world", "ONNX", "hal", "a1b2", "", "  spaced ", "MiXeD", "stop", "x,y"]
    s = shape(rng, rank=int(rng.integers(1, 3)), lo=1, max_rank=2)
    x = np.array(rng.choice(words, size=s), dtype=object)
    if op == "StringNormalizer":
        x = x.reshape(-1) if rng.random() < 0.7 else x.reshape(1, -1)
        attrs = {"case_change_action": pick(rng, ["NONE", "LOWER", "UPPER"])}
        if rng.random() < 0.5:
            attrs["stopwords"] = ["stop", "world"]
            attrs["is_case_sensitive"] = int(rng.integers(0, 2))
        return OpCase(op, [x], attrs, opset=10)
    if op == "RegexFullMatch":
        return OpCase(op, [x], {"pattern": pick(rng, [r"[a-z]+", r"\w+\d", r".*o.*", r"[A-Z]\w*"])}, opset=20)
    if op == "StringConcat":
        y = np.array(rng.choice(words, size=broadcast_partner(rng, s)), dtype=object)
        return OpCase(op, [x, y], opset=20)
    attrs = {}
    if rng.random() < 0.6:
        attrs["delimiter"] = pick(rng, [",", "o", "l"])
    if rng.random() < 0.4:
        attrs["maxsplit"] = int(rng.integers(1, 3))
    return OpCase(op, [x], attrs, opset=20, n_outputs=2)


@generator("CumProd")
def _cumprod(rng, op):
    s = shape(rng, rank=int(rng.integers(1, 4)), lo=1)
    x = array(rng, s, pick(rng, ["float32", "float64", "int32", "int64"]), -2, 2, special=False)
    axis = np.array(int(rng.integers(-len(s), len(s))), pick(rng, [np.int64, np.int32]))
    attrs = {k: 1 for k in ("exclusive", "reverse") if rng.random() < 0.4}
    return OpCase(op, [x, axis], attrs, opset=26, const={1} if rng.random() < 0.5 else set())


@generator("BitCast")
def _bitcast(rng, op):
    src = pick(rng, ["float32", "int32", "uint32", "float16", "int16", "uint8", "int8", "float64", "int64"])
    same = [t for t in ["float32", "int32", "uint32", "float16", "int16", "uint8", "int8", "float64", "int64",
                        "uint16", "uint64"] if np.dtype(t).itemsize == np.dtype(src).itemsize]
    dst = pick(rng, same)
    x = array(rng, shape(rng), src, -100, 100, special=False)
    return OpCase(op, [x], {"to": helper.np_dtype_to_tensor_dtype(np.dtype(dst))}, opset=26)


@generator("TensorScatter")
def _tensor_scatter(rng, op):
    b, s, h, d = (int(v) for v in rng.integers(1, 4, size=4))
    max_len = s + int(rng.integers(1, 5))
    past = array(rng, (b, h, max_len, d), "float32", special=False)
    seq = int(rng.integers(1, max_len + 1))
    upd = array(rng, (b, h, seq, d), "float32", special=False)
    mode = pick(rng, ["linear", "circular"])
    hi = max_len - seq if mode == "linear" else max_len - 1
    idx = rng.integers(0, hi + 1, size=b).astype(np.int64) if rng.random() < 0.7 else None
    attrs = {"mode": mode} if mode != "linear" or rng.random() < 0.5 else {}
    if rng.random() < 0.3:
        attrs["axis"] = -2
    return OpCase(op, [past, upd, idx], attrs, opset=24)


@generator("MelWeightMatrix")
def _mel(rng, op):
    bins, dft = int(rng.integers(1, 9)), int(pick(rng, [8, 16, 32]))
    rate = int(pick(rng, [8000, 16000]))
    lo = float(rng.uniform(0, 500))
    hi = float(rng.uniform(lo + 500, rate / 2))
    ins = [np.array(bins, np.int64), np.array(dft, np.int64), np.array(rate, np.int64),
           np.array(lo, np.float32), np.array(hi, np.float32)]
    return OpCase(op, ins, {"output_datatype": 1} if rng.random() < 0.5 else {}, opset=17)


@generator("TfIdfVectorizer")
def _tfidf(rng, op):
    pool = [2, 3, 5, 7, 2, 3, 5, 7, 8, 9]  # unigrams then bigrams, one entry per ngram element
    attrs = {"max_gram_length": int(rng.integers(1, 3)), "min_gram_length": 1, "max_skip_count": int(rng.integers(0, 3)),
             "mode": pick(rng, ["TF", "IDF", "TFIDF"]), "ngram_counts": [0, 4], "ngram_indexes": list(range(7)),
             "pool_int64s": pool}
    if attrs["mode"] != "TF" or rng.random() < 0.3:
        attrs["weights"] = [float(w) for w in rng.uniform(0.5, 2, size=7)]
    s = (int(rng.integers(1, 4)), int(rng.integers(1, 9))) if rng.random() < 0.5 else (int(rng.integers(1, 9)),)
    x = rng.choice([2, 3, 5, 7, 8, 9, 11], size=s).astype(pick(rng, [np.int64, np.int32]))
    return OpCase(op, [x], attrs, opset=9)


def _sequence(rng, n=None, same_shape=True):
    dtype = pick(rng, ["float32", "int64", "float64"])
    base = shape(rng, rank=int(rng.integers(1, 3)), lo=1)
    n = int(rng.integers(1, 4)) if n is None else n
    return [array(rng, base if same_shape else tuple(int(d) for d in rng.integers(1, 4, size=len(base))), dtype)
            for _ in range(n)]


@generator("SequenceAt", "SequenceLength", "SequenceErase", "SequenceInsert", "ConcatFromSequence",
           "SplitToSequence", "SequenceConstruct")
def _sequences(rng, op):
    if op == "SplitToSequence":
        s = shape(rng, rank=int(rng.integers(1, 4)), lo=1)
        x = array(rng, s, pick(rng, ["float32", "int64"]))
        axis = int(rng.integers(-len(s), len(s)))
        attrs = {"axis": axis}
        n = s[axis]
        if rng.random() < 0.5:
            attrs["keepdims"] = int(rng.integers(0, 2))
            return OpCase(op, [x], attrs, opset=11)
        if rng.random() < 0.5 and n:
            return OpCase(op, [x, np.array(int(rng.integers(1, n + 1)), np.int64)], attrs, opset=11, const={1})
        parts = rng.multinomial(n, [0.5, 0.5]).astype(np.int64) if n else np.zeros(0, np.int64)
        return OpCase(op, [x, parts], attrs, opset=11, const={1})
    if op == "SequenceConstruct":
        return OpCase(op, _sequence(rng), opset=11)
    seq = _sequence(rng)
    n = len(seq)
    if op == "SequenceAt":
        return OpCase(op, [seq, np.array(int(rng.integers(-n, n)), pick(rng, [np.int64, np.int32]))], opset=11,
                      const={1})
    if op == "SequenceLength":
        return OpCase(op, [seq], opset=11)
    if op == "SequenceErase":
        pos = np.array(int(rng.integers(-n, n)), np.int64) if rng.random() < 0.7 else None
        return OpCase(op, [seq, pos], opset=11, const={1})
    if op == "SequenceInsert":
        t = array(rng, seq[0].shape, seq[0].dtype)
        pos = np.array(int(rng.integers(-n, n + 1)), np.int64) if rng.random() < 0.7 else None
        return OpCase(op, [seq, t, pos], opset=11, const={2})
    axis = int(rng.integers(-seq[0].ndim, seq[0].ndim))
    attrs = {"axis": axis}
    if rng.random() < 0.4:
        attrs["new_axis"] = 1
        attrs["axis"] = int(rng.integers(-seq[0].ndim - 1, seq[0].ndim + 1))
    return OpCase(op, [seq], attrs, opset=11)
