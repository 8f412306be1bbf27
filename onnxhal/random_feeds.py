"""Random inputs that respect what the model says, for ``onnxhal run`` and ``onnxhal matrix``.

- An integer input that indexes a table (it reaches the indices of a Gather whose data is an
  initializer, through value-preserving ops: Cast, Unsqueeze, Squeeze, Reshape, Flatten, Identity,
  Expand) takes values in [0, rows) of the smallest such table: token-type ids stay below 2, token
  ids below the vocabulary size. Other integer inputs take values in [0, 4), bools are random.
- Symbolic dimensions take the sizes given (``--dim name=size``, also set on the session as
  onnxruntime's free dimension overrides), else 1; the caller prints which.
- ``feed_rows`` describes what was fed (name, dtype, shape, value range, why that range) for the
  table the CLI prints.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx

from onnxhal.hal.errors import InvalidArgument

#: Ops whose output holds the same values as their first input (for following an index to its table).
VALUE_PRESERVING = frozenset({"Cast", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Identity", "Expand"})
#: Values of an integer input that indexes nothing known: small, non-negative (counts, masks, ids).
DEFAULT_INT_HIGH = 4

_DTYPES = {"float": np.float32, "double": np.float64, "float16": np.float16, "int64": np.int64, "int32": np.int32,
           "int16": np.int16, "int8": np.int8, "uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32,
           "uint64": np.uint64, "bool": np.bool_}


@dataclass(frozen=True)
class IndexTable:
    """An initializer an input indexes: its name and how many rows it has along the Gather's axis."""

    table: str
    rows: int


def index_tables(model: onnx.ModelProto) -> dict[str, IndexTable]:
    """{graph input: the smallest table it indexes} for inputs that reach a Gather's indices."""
    g = model.graph
    dims = {t.name: list(t.dims) for t in g.initializer}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in g.node:
        for name in n.input:
            readers.setdefault(name, []).append(n)
    out: dict[str, IndexTable] = {}
    for vi in g.input:
        if vi.name in dims:
            continue
        seen, todo = {vi.name}, [vi.name]
        while todo:
            value = todo.pop()
            for n in readers.get(value, []):
                if n.domain in ("", "ai.onnx") and n.op_type == "Gather" and len(n.input) > 1 \
                        and n.input[1] == value and n.input[0] in dims:
                    axis = next((a.i for a in n.attribute if a.name == "axis"), 0)
                    shape = dims[n.input[0]]
                    rows = shape[axis] if -len(shape) <= axis < len(shape) else 0
                    if rows > 0 and (vi.name not in out or rows < out[vi.name].rows):
                        out[vi.name] = IndexTable(n.input[0], rows)
                elif n.domain in ("", "ai.onnx") and n.op_type in VALUE_PRESERVING and n.input[0] == value:
                    for o in n.output:
                        if o and o not in seen:
                            seen.add(o)
                            todo.append(o)
    return out


def symbolic_input_dims(sess_inputs: list) -> list[str]:
    """The names of the inputs' symbolic dimensions, in order of appearance."""
    names: list[str] = []
    for i in sess_inputs:
        for d in i.shape or []:
            if isinstance(d, str) and d not in names:
                names.append(d)
    return names


def unnamed_input_shapes(sess_inputs: list) -> list[tuple[str, list]]:
    """The inputs with a dimension that has no name (None in their shapes), as (name, shape):
    ``fix-shapes --shape`` fixes those."""
    return [(i.name, list(i.shape)) for i in sess_inputs if i.shape and any(d is None for d in i.shape)]


def input_dim_hints(sess_inputs: list) -> tuple[list[str], list[tuple[str, list]]]:
    """(``symbolic_input_dims``, ``unnamed_input_shapes``) of the inputs: what a dynamic-shapes
    remedy names (``decline_summary``'s ``input_dims`` and ``unnamed``)."""
    return symbolic_input_dims(sess_inputs), unnamed_input_shapes(sess_inputs)


def check_dim_names(dims: Mapping[str, int], sess_inputs: list, model: str) -> None:
    """Every name of ``--dim`` must be a symbolic dimension of an input."""
    known = symbolic_input_dims(sess_inputs)
    unknown = [k for k in dims if k not in known]
    if unknown:
        raise InvalidArgument(f"--dim {', '.join(unknown)}: {model} has no input dimension of that name; its symbolic "
                              f"input dimensions are {', '.join(known) or 'none'}")


@dataclass
class FeedRow:
    """One input as fed: for the table the CLI prints."""

    name: str
    dtype: str
    shape: list[int]
    low: float
    high: float
    why: str


def random_feeds(sess_inputs: list, model: onnx.ModelProto | None, dims: Mapping[str, int] | None = None,
                 seed: int = 0) -> tuple[dict[str, np.ndarray], list[FeedRow], list[str]]:
    """(feeds, what was fed, the symbolic dimensions that became 1 because no size was given)."""
    rng = np.random.default_rng(seed)
    dims = dict(dims or {})
    tables = index_tables(model) if model is not None else {}
    feeds: dict[str, np.ndarray] = {}
    rows: list[FeedRow] = []
    defaulted: list[str] = []
    for i in sess_inputs:
        shape = []
        for d in i.shape or []:
            if isinstance(d, int) and d > 0:
                shape.append(d)
            elif isinstance(d, str) and d in dims:
                shape.append(dims[d])
            else:
                shape.append(1)
                label = d if isinstance(d, str) else f"{i.name}[{len(shape) - 1}]"
                if label not in defaulted:
                    defaulted.append(label)
        t = i.type[len("tensor("):-1] if i.type.startswith("tensor(") else ""
        dtype = _DTYPES.get(t)
        if dtype is None:  # strings, maps, sequences: no random value means anything to the model
            remedy = (f"give its values with --inputs FILE.npz (numpy.savez(FILE, {i.name}=array_of_str, ...))"
                      if t == "string" else "an .npz holds tensors only: feed it from Python (InferenceSession.run)")
            raise InvalidArgument(f"input {i.name!r} is {i.type}: random inputs are drawn for numeric and bool "
                                  f"tensors only; {remedy}")
        if dtype == np.bool_:
            feeds[i.name] = rng.random(shape) > 0.5
            why = f"random True/False (seed {seed})"
        elif np.issubdtype(dtype, np.integer):
            table = tables.get(i.name)
            high = table.rows if table is not None else DEFAULT_INT_HIGH
            why = (f"indexes {table.table!r} ({table.rows} rows)" if table is not None
                   else f"integers in [0, {high}): no table it indexes was found (seed {seed})")
            feeds[i.name] = rng.integers(0, high, size=shape).astype(dtype)
        else:
            feeds[i.name] = rng.standard_normal(shape).astype(dtype)
            why = f"standard normal (seed {seed})"
        rows.append(feed_row(i.name, feeds[i.name], why))
    return feeds, rows, defaulted


def feed_row(name: str, value: np.ndarray, why: str = "") -> FeedRow:
    a = np.asarray(value)
    numeric = a.dtype.kind in "fiub" and a.size
    low = float(a.min()) if numeric else float("nan")
    high = float(a.max()) if numeric else float("nan")
    return FeedRow(name, str(a.dtype), list(a.shape), low, high, why)
