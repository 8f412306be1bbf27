"""Random shape and indexing operator cases for ``tests/test_ops_random.py`` (see random_ops.py).

These reach what fixed cases rarely do: negative and out-of-range axes and indices, Slice's
clamping and negative steps, empty tensors, parameters fed at run time as well as stored as
initializers (an initializer lets the optimizer fold and the OpenCL EP specialise), and every
dtype the kernels copy rather than compute.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tests.random_ops import OpCase, array, pick, registrar, shape, strided

GENERATORS: dict[str, Callable] = {}
ANY = ["float32", "float32", "float64", "float16", "int64", "int32", "int8", "uint8", "bool"]
I64_MAX, I64_MIN = np.iinfo(np.int64).max, np.iinfo(np.int64).min

generator = registrar(GENERATORS)


def _data(rng, s, dtypes=ANY) -> np.ndarray:
    return strided(rng, array(rng, s, pick(rng, dtypes)))


def _param(rng) -> set:
    """Parameter inputs stored as initializers most of the time (the fed form is the slow path)."""
    return {1, 2, 3, 4} if rng.random() < 0.7 else set()


def _full(rng, rank: int, hi: int = 5) -> tuple:
    """A shape without zero-sized dimensions."""
    return tuple(int(d) for d in rng.integers(1, hi + 1, size=rank))


def _i64(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64).reshape(-1)


@generator("Reshape")
def _reshape(rng, op):
    s = shape(rng, max_rank=4)
    x = _data(rng, s)
    size = int(np.prod(s))
    # a new shape of the same size: regroup the factors of the old one
    factors = [d for d in s if d != 1] or [1]
    rng.shuffle(factors)
    target = []
    while factors:
        k = int(rng.integers(1, len(factors) + 1))
        target.append(int(np.prod(factors[:k])))
        factors = factors[k:]
    if rng.random() < 0.3:
        target.insert(int(rng.integers(0, len(target) + 1)), 1)
    attrs, opset = {}, pick(rng, [5, 13, 14])
    if size and rng.random() < 0.4:
        target[int(rng.integers(0, len(target)))] = -1
    if rng.random() < 0.3:  # 0 copies the input's dimension at that position (unless allowzero)
        i = int(rng.integers(0, min(len(target), len(s)) + 1)) if s else 0
        if i < len(target) and i < len(s) and target[i] == s[i]:
            target[i] = 0
    if opset == 14 and rng.random() < 0.3:
        attrs["allowzero"] = 1
        if 0 in target and -1 in target:
            target[target.index(-1)] = 1
    return OpCase(op, [x, _i64(target)], attrs, opset=opset, const=_param(rng))


@generator("Transpose")
def _transpose(rng, op):
    x = _data(rng, shape(rng, max_rank=5))
    attrs = {"perm": [int(p) for p in rng.permutation(x.ndim)]} if rng.random() < 0.8 else {}
    return OpCase(op, [x], attrs, opset=pick(rng, [1, 13, 21]))


@generator("Concat")
def _concat(rng, op):
    s = shape(rng, rank=int(rng.integers(1, 5)))
    dtype = pick(rng, ANY)
    axis = int(rng.integers(-len(s), len(s)))
    ins = []
    for _ in range(int(rng.integers(1, 5))):
        t = list(s)
        t[axis] = int(rng.integers(0, 4))
        ins.append(array(rng, tuple(t), dtype))
    return OpCase(op, ins, {"axis": axis}, opset=pick(rng, [4, 11, 13]), const={i for i in range(1, len(ins)) if rng.random() < 0.3})


@generator("Split")
def _split(rng, op):
    s = shape(rng, rank=int(rng.integers(1, 4)))
    x = _data(rng, s)
    axis = int(rng.integers(-len(s), len(s)))
    n = s[axis]
    opset = pick(rng, [11, 13, 18])
    outs = int(rng.integers(1, 4))
    if opset == 18 and rng.random() < 0.5:  # num_outputs: equal parts, the last one smaller
        outs = int(rng.integers(1, max(n, 1) + 1))
        return OpCase(op, [x], {"axis": axis, "num_outputs": outs}, opset=18, n_outputs=outs)
    if rng.random() < 0.3 and n % outs == 0:  # no split: equal parts
        return OpCase(op, [x], {"axis": axis} if opset < 18 else {"axis": axis, "num_outputs": outs}, opset=opset,
                      n_outputs=outs)
    parts = [int(p) for p in rng.multinomial(n, np.ones(outs) / outs)]
    if opset == 11:
        return OpCase(op, [x], {"axis": axis, "split": parts}, opset=11, n_outputs=outs)
    return OpCase(op, [x, _i64(parts)], {"axis": axis}, opset=opset, const=_param(rng), n_outputs=outs)


@generator("Slice")
def _slice(rng, op):
    s = shape(rng, rank=int(rng.integers(1, 5)), hi=7)
    x = _data(rng, s)
    with_axes = rng.random() < 0.8
    if with_axes:  # a subset of the axes in any order, some of them negative
        axes = [int(a) for a in rng.permutation(len(s))[:int(rng.integers(1, len(s) + 1))]]
        axes = [a - len(s) if rng.random() < 0.3 else a for a in axes]
    else:  # no axes input: the first len(starts) axes
        axes = list(range(int(rng.integers(1, len(s) + 1))))

    def bound(d):
        r = rng.random()  # INT64_MAX and INT64_MIN mean "to the end" in exported models
        return I64_MAX if r < 0.07 else I64_MIN if r < 0.14 else int(rng.integers(-d - 3, d + 4))
    starts = [bound(s[a]) for a in axes]
    ends = [bound(s[a]) for a in axes]
    steps = [int(pick(rng, [1, 1, 1, 2, 3, -1, -1, -2])) for _ in axes]
    ins = [x, _i64(starts), _i64(ends)]
    if with_axes:
        ins.append(_i64(axes))
    if rng.random() < 0.7:
        ins += [None] * (4 - len(ins)) + [_i64(steps)]
    return OpCase(op, ins, opset=pick(rng, [10, 11, 13]), const=_param(rng))


def _indices(rng, n: int, s: tuple, dtype=None, negative=True) -> np.ndarray:
    """Indices into an axis of length n, negative ones among them."""
    dtype = dtype or pick(rng, [np.int64, np.int32])
    if n == 0:
        return np.zeros(s, dtype)
    lo = -n if negative and rng.random() < 0.5 else 0
    return rng.integers(lo, n, size=s).astype(dtype)


@generator("Gather")
def _gather(rng, op):
    s = shape(rng, rank=int(rng.integers(1, 4)))
    x = _data(rng, s)
    axis = int(rng.integers(-len(s), len(s)))
    idx = _indices(rng, s[axis], shape(rng, max_rank=2, hi=4) if s[axis] else (0,))
    if idx.size and rng.random() < 0.05:  # out of range: both runtimes must refuse
        idx.flat[0] = pick(rng, [s[axis], -s[axis] - 1])
    return OpCase(op, [x, idx], {"axis": axis}, opset=pick(rng, [1, 11, 13]), const={1} if rng.random() < 0.4 else set())


@generator("GatherElements")
def _gather_elements(rng, op):
    s = _full(rng, int(rng.integers(1, 4)))
    x = _data(rng, s)
    axis = int(rng.integers(-len(s), len(s)))
    t = tuple(int(rng.integers(1 if d else 0, d + 1)) if i != axis % len(s) else int(rng.integers(0, 4))
              for i, d in enumerate(s))
    return OpCase(op, [x, _indices(rng, s[axis], t)], {"axis": axis}, opset=pick(rng, [11, 13]))


@generator("GatherND")
def _gather_nd(rng, op):
    b = int(rng.integers(0, 2))
    s = _full(rng, int(rng.integers(b + 1, 4)))
    x = _data(rng, s)
    last = int(rng.integers(1, len(s) - b + 1))
    lead = s[:b] + _full(rng, int(rng.integers(0, 3)), hi=3)
    idx = np.stack([_indices(rng, s[b + k], lead, np.int64) for k in range(last)], axis=-1) if last else None
    # constant indices in some cases: the OpenCL EP takes GatherND by indices that are constants of its plan
    return OpCase(op, [x, idx], {"batch_dims": b}, opset=pick(rng, [12, 13]) if b else pick(rng, [11, 12, 13]),
                  const={1} if rng.random() < 0.4 else set())


def _unique_positions(rng, n_total: int, k: int) -> np.ndarray:
    return rng.permutation(n_total)[:k]


@generator("ScatterElements")
def _scatter_elements(rng, op):
    s = _full(rng, int(rng.integers(1, 4)))
    dtype = pick(rng, ["float32", "float64", "int64", "int32"])
    x = array(rng, s, dtype)
    axis = int(rng.integers(-len(s), len(s)))
    opset = pick(rng, [11, 13, 16, 18])
    reduction = pick(rng, ["none", "add", "mul"] + (["max", "min"] if opset >= 18 else [])) if opset >= 16 else "none"
    t = tuple(int(rng.integers(1, d + 1)) for d in s)
    if reduction == "none":  # distinct targets along the axis: duplicates have no defined order
        ax = axis % len(s)
        t = t[:ax] + (min(t[ax], s[ax]),) + t[ax + 1:]
        idx = np.empty(t, np.int64)
        for pos in np.ndindex(*(t[:ax] + (1,) + t[ax + 1:])):
            sl = pos[:ax] + (slice(None),) + pos[ax + 1:]
            idx[sl] = _unique_positions(rng, s[ax], t[ax])
    else:
        idx = _indices(rng, s[axis], t, np.int64, negative=False)
    if rng.random() < 0.3:
        idx = np.where(idx > 0, idx - s[axis], idx)  # negative forms of the same positions
    attrs = {"axis": axis} | ({"reduction": reduction} if opset >= 16 else {})
    upd = array(rng, t, dtype, special=False)
    return OpCase(op, [x, idx, upd], attrs, opset=opset)


@generator("ScatterND")
def _scatter_nd(rng, op):
    s = _full(rng, int(rng.integers(1, 4)))
    dtype = pick(rng, ["float32", "float64", "int64", "int32"])
    x = array(rng, s, dtype)
    opset = pick(rng, [11, 13, 16, 18])
    reduction = pick(rng, ["none", "add", "mul"] + (["max", "min"] if opset >= 18 else [])) if opset >= 16 else "none"
    last = int(rng.integers(1, len(s) + 1))
    cells = int(np.prod(s[:last]))
    k = int(rng.integers(1, cells + 1)) if reduction == "none" else int(rng.integers(1, 6))
    flat = _unique_positions(rng, cells, k) if reduction == "none" else rng.integers(0, cells, size=k)
    idx = np.stack(np.unravel_index(flat, s[:last]), axis=-1).astype(np.int64)
    if rng.random() < 0.3:
        idx = idx - np.asarray(s[:last]) * (rng.random(idx.shape) < 0.5)
    upd = array(rng, (k,) + s[last:], dtype, special=False)
    attrs = {"reduction": reduction} if opset >= 16 else {}
    return OpCase(op, [x, idx, upd], attrs, opset=opset)


@generator("Expand")
def _expand(rng, op):
    s = shape(rng, max_rank=3)
    x = _data(rng, s)
    target = [d if d != 1 or rng.random() < 0.5 else int(rng.integers(0, 4)) for d in s]
    target = [1 if d == t and rng.random() < 0.2 else t for d, t in zip(s, target)]  # 1 keeps the input's dim
    if rng.random() < 0.4:
        target = [int(rng.integers(1, 4)) for _ in range(int(rng.integers(1, 3)))] + target
    return OpCase(op, [x, _i64(target)], opset=pick(rng, [8, 13]), const=_param(rng))


@generator("Tile")
def _tile(rng, op):
    x = _data(rng, shape(rng, rank=int(rng.integers(1, 4))))
    reps = [int(r) for r in rng.integers(0 if rng.random() < 0.1 else 1, 4, size=x.ndim)]
    return OpCase(op, [x, _i64(reps)], opset=pick(rng, [6, 13]), const=_param(rng))


@generator("Pad")
def _pad(rng, op):
    s = _full(rng, int(rng.integers(1, 5)))
    dtype = pick(rng, ["float32", "float64", "int64", "int32", "float16", "uint8"])
    x = strided(rng, array(rng, s, dtype))
    opset = pick(rng, [11, 13, 18, 19])
    mode = pick(rng, ["constant", "reflect", "edge"] + (["wrap"] if opset >= 19 else []))
    axes = list(range(len(s)))
    if opset >= 18 and rng.random() < 0.4:
        axes = [int(a) for a in rng.permutation(len(s))[:int(rng.integers(1, len(s) + 1))]]
        axes = [a - len(s) if rng.random() < 0.3 else a for a in axes]

    def amount(d):
        if mode == "reflect":  # pads must stay below the dimension: sometimes they do not
            return int(rng.integers(0, max(d, 1))) if rng.random() < 0.9 else d
        if mode == "wrap":
            return int(rng.integers(0, 2 * d + 1))
        return int(rng.integers(-min(d, 2) if rng.random() < 0.3 else 0, 4))
    pads = [amount(s[a]) for a in axes] + [amount(s[a]) for a in axes]
    ins = [x, _i64(pads)]
    if mode == "constant" and rng.random() < 0.6:
        ins.append(array(rng, (), dtype, special=False))
    if len(axes) != len(s) or (opset >= 18 and rng.random() < 0.2):
        ins += [None] * (3 - len(ins)) + [_i64(axes)]
    elif len(ins) == 2 and rng.random() < 0.2:
        ins.append(None)
    return OpCase(op, ins, {"mode": mode}, opset=opset, const=_param(rng))


@generator("Squeeze", "Unsqueeze")
def _squeeze(rng, op):
    opset = pick(rng, [11, 13, 21])
    if op == "Squeeze":
        s = tuple(d if rng.random() < 0.5 else 1 for d in shape(rng, max_rank=4))
        x = _data(rng, s)
        ones = [i for i, d in enumerate(s) if d == 1]
        axes = [int(a) for a in ones if rng.random() < 0.6]
        axes = [a - len(s) if rng.random() < 0.3 else a for a in axes]
        if not axes and rng.random() < 0.5:
            return OpCase(op, [x], opset=opset)  # every 1-dimension
    else:
        x = _data(rng, shape(rng, max_rank=3))
        r = x.ndim + int(rng.integers(1, 3))
        axes = [int(a) for a in rng.permutation(r)[:r - x.ndim]]
        axes = [a - r if rng.random() < 0.3 else a for a in axes]
    if opset == 11:
        return OpCase(op, [x], {"axes": axes}, opset=11)
    return OpCase(op, [x, _i64(axes)], opset=opset, const=_param(rng))


@generator("Flatten")
def _flatten(rng, op):
    x = _data(rng, shape(rng, max_rank=4))
    return OpCase(op, [x], {"axis": int(rng.integers(-x.ndim, x.ndim + 1))}, opset=pick(rng, [11, 13, 21]))


@generator("DepthToSpace", "SpaceToDepth")
def _depth_space(rng, op):
    b = int(rng.integers(1, 4))
    n, h, w = (int(d) for d in rng.integers(1, 4, size=3))
    c = int(rng.integers(1, 4))
    s = (n, c * b * b, h, w) if op == "DepthToSpace" else (n, c, h * b, w * b)
    attrs = {"blocksize": b}
    if op == "DepthToSpace" and rng.random() < 0.5:
        attrs["mode"] = pick(rng, ["DCR", "CRD"])
    return OpCase(op, [_data(rng, s, ["float32", "float64", "float16", "uint8", "int32"])], attrs, opset=13)


@generator("OneHot")
def _one_hot(rng, op):
    depth = int(rng.integers(1, 6))
    s = shape(rng, rank=int(rng.integers(1, 3)), hi=4)  # indices of rank 0 fail shape inference
    idx = rng.integers(-depth, depth + 2, size=s).astype(pick(rng, [np.int64, np.int64, np.int32, np.float32]))
    values = array(rng, (2,), pick(rng, ["float32", "int64", "int64", "int32"]), special=False)
    axis = int(rng.integers(-len(s) - 1, len(s) + 1))
    return OpCase(op, [idx, np.array(depth, pick(rng, [np.int64, np.float32])), values], {"axis": axis},
                  opset=pick(rng, [9, 11]), const=_param(rng))


@generator("Range")
def _range(rng, op):
    dtype = pick(rng, ["float32", "float64", "int64", "int32"])
    start, limit = (float(v) for v in rng.uniform(-10, 10, size=2))
    delta = float(pick(rng, [1, 2, -1, -3, 0.5, -0.75, 1.5]))
    if np.dtype(dtype).kind == "i":
        start, limit, delta = round(start), round(limit), round(delta) or 1
    vals = [np.array(v, dtype) for v in (start, limit, delta)]
    return OpCase(op, vals, opset=11, const={i for i in range(3) if rng.random() < 0.5})


@generator("Shape", "Size")
def _shape(rng, op):
    x = _data(rng, shape(rng, max_rank=4))
    if op == "Shape" and rng.random() < 0.5:
        attrs = {"start": int(rng.integers(-x.ndim - 2, x.ndim + 3))}
        if rng.random() < 0.7:
            attrs["end"] = int(rng.integers(-x.ndim - 2, x.ndim + 3))
        return OpCase(op, [x], attrs, opset=pick(rng, [15, 19, 21]))
    return OpCase(op, [x], opset=pick(rng, [13, 19, 21]) if op == "Shape" else pick(rng, [13, 19, 21]))


@generator("NonZero")
def _non_zero(rng, op):
    s = shape(rng, max_rank=3)
    dtype = pick(rng, ["float32", "int64", "int32", "bool", "uint8", "float64"])
    x = array(rng, s, dtype, -1, 1)
    if np.dtype(dtype).kind == "f":
        x[np.abs(x) < 0.5] = 0
    return OpCase(op, [x], opset=pick(rng, [9, 13]))


@generator("TopK")
def _topk(rng, op):
    s = shape(rng, rank=int(rng.integers(1, 4)), hi=6)
    dtype = pick(rng, ["float32", "float64", "int64", "int32"])
    x = strided(rng, np.round(array(rng, s, dtype, -3, 3, special=False)))  # rounded: ties
    axis = int(rng.integers(-len(s), len(s)))
    k = np.array([int(rng.integers(0, s[axis] + 1))], np.int64)
    opset = pick(rng, [10, 11])
    attrs = {"axis": axis}
    if opset == 11:
        attrs["largest"] = int(rng.integers(0, 2))  # sorted=0 leaves the order to the runtime
    return OpCase(op, [x, k], attrs, opset=opset, const={1} if rng.random() < 0.6 else set(), n_outputs=2)


@generator("Compress")
def _compress(rng, op):
    s = shape(rng, rank=int(rng.integers(1, 4)))
    x = _data(rng, s)
    attrs = {}
    if rng.random() < 0.7:
        axis = int(rng.integers(-len(s), len(s)))
        attrs["axis"] = axis
        n = s[axis]
    else:
        n = int(np.prod(s))
    cond = rng.random(int(rng.integers(0, n + 1))) < 0.5  # may be shorter than the axis
    return OpCase(op, [x, cond], attrs, opset=pick(rng, [9, 11]), const={1} if rng.random() < 0.5 else set())


@generator("ReverseSequence")
def _reverse_sequence(rng, op):
    b, t = (int(d) for d in rng.integers(1, 5, size=2))
    rest = _full(rng, int(rng.integers(0, 3)), hi=3)
    batch_axis = int(rng.integers(0, 2))
    s = ((b, t) if batch_axis == 0 else (t, b)) + rest
    x = _data(rng, s, ["float32", "float64", "int64", "int32", "bool"])
    lens = rng.integers(0, t + 1, size=b).astype(np.int64)
    return OpCase(op, [x, lens], {"batch_axis": batch_axis, "time_axis": 1 - batch_axis}, opset=10)


@generator("Unique")
def _unique(rng, op):
    s = shape(rng, rank=int(rng.integers(1, 3)), hi=6)
    dtype = pick(rng, ["float32", "int64", "int8", "float64"])
    x = np.round(array(rng, s, dtype, -2, 2, special=False))
    attrs = {"sorted": int(rng.integers(0, 2))}
    if rng.random() < 0.5 and 0 not in s:  # onnxruntime 1.32 aborts the process on an empty one
        attrs["axis"] = int(rng.integers(-len(s), len(s)))
    return OpCase(op, [x], attrs, opset=11, n_outputs=4)


@generator("EyeLike")
def _eye_like(rng, op):
    s = tuple(int(d) for d in rng.integers(0 if rng.random() < 0.1 else 1, 6, size=2))
    attrs = {"k": int(rng.integers(-4, 5))}
    if rng.random() < 0.5:
        attrs["dtype"] = int(pick(rng, [1, 6, 7, 11, 9]))  # float, int32, int64, double, bool
    return OpCase(op, [array(rng, s, pick(rng, ["float32", "int64", "int32", "float64"]))], attrs, opset=9)


@generator("ConstantOfShape")
def _constant_of_shape(rng, op):
    target = _i64(rng.integers(0 if rng.random() < 0.1 else 1, 4, size=int(rng.integers(0, 4))))
    attrs = {}
    if rng.random() < 0.7:
        from onnx import numpy_helper

        attrs["value"] = numpy_helper.from_array(array(rng, (1,), pick(rng, ["float32", "int64", "int32", "float64", "bool"]),
                                                       special=False))
    return OpCase(op, [target], attrs, opset=pick(rng, [9, 20, 21]))


@generator("Identity")
def _identity(rng, op):
    return OpCase(op, [_data(rng, shape(rng))], opset=pick(rng, [13, 19, 21]))


@generator("Trilu")
def _trilu(rng, op):
    s = shape(rng, rank=int(rng.integers(2, 4)), hi=6)
    x = _data(rng, s, ["float32", "float64", "int64", "int32", "bool"])
    ins = [x] + ([np.array(int(rng.integers(-6, 7)), np.int64)] if rng.random() < 0.7 else [])
    return OpCase(op, ins, {"upper": int(rng.integers(0, 2))}, opset=14, const=_param(rng))


_EINSUM = [  # (equation, operand ranks)
    ("ij,jk->ik", None), ("bij,bjk->bik", None), ("ij->ji", None), ("ii->i", None), ("ij->", None),
    ("i,i->", None), ("i,j->ij", None), ("bhid,bhjd->bhij", None), ("...ij,...jk->...ik", None),
    ("ijk->kji", None), ("ij,ij->ij", None), ("ijk,ik->ij", None), ("ij", None), ("ba", None),
]


@generator("Einsum")
def _einsum(rng, op):
    eq, _ = pick(rng, _EINSUM)
    lhs = eq.split("->")[0].split(",")
    dims = {c: int(rng.integers(1, 5)) for c in "abcdefghijklmnopqrstuvwxyz"}
    ell = tuple(int(d) for d in rng.integers(1, 4, size=int(rng.integers(0, 3))))
    dtype = pick(rng, ["float32", "float64", "int64", "int32"])
    ins = []
    for term in lhs:
        s = (ell if term.startswith("...") else ()) + tuple(dims[c] for c in term.replace("...", ""))
        ins.append(array(rng, s, dtype, -3, 3, special=False))
    return OpCase(op, ins, {"equation": eq}, opset=12)
