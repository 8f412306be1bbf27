"""The rules of a profile that models a real accelerator: per-op constraints, each with its source.

A generic profile lists op types and device-wide limits. A profile of a real device also states
what the vendor's EP checks per op (its supported-operator table and its op builders): the dtypes
each input and output may have, the rank, attribute values, inputs that must be constant
initializers, broadcasting, static shapes. Every such rule names a ``[sources.ID]`` entry: where
the fact was read (URL, document version or commit) and when, or that it is an estimate.

TOML form (all keys but ``source`` optional; ``[[op.Conv]]`` repeats a table for rules with
different sources)::

    [sources.qnn-doc]
    url = "https://github.com/onnxruntime/onnxruntime-qnn/blob/<commit>/docs/..."
    version = "commit 0131740f"
    read = "2026-12-06"
    note = "supported-operator table"         # optional
    estimate = false                          # true: a figure or rule not found in any source

    [op.Conv]
    source = "qnn-doc"
    input_dtypes = [["float32", "float16"], ["float32", "float16"]]   # per input position; "*" = any
    output_dtypes = [["float32", "float16"]]
    min_rank = 3                              # of input 0 (the data input)
    max_rank = 4
    attributes = { group = { max = 1 }, auto_pad = { in = ["NOTSET", "VALID"] }, dilations = { max = 1 } }
    constant_inputs = [1, 2]                  # inputs that must be constant initializers (when present)
    broadcast = "none"                        # "none": data inputs of one shape; "same_rank"; "numpy" (default)
    static_shapes = true                      # this op needs static shapes (false: allows dynamic ones)
    note = "..."
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: Element types a rule may name for a node's inputs and outputs (numpy names, plus bool/string).
IO_DTYPES = ("float32", "float16", "bfloat16", "float64", "int8", "uint8", "int16", "uint16", "int32", "uint32",
             "int64", "uint64", "bool", "string")
BROADCAST = ("none", "same_rank", "numpy")
_ATTR_KEYS = ("in", "min", "max", "default")
_RULE_KEYS = ("source", "note", "input_dtypes", "output_dtypes", "min_rank", "max_rank", "attributes",
              "constant_inputs", "broadcast", "static_shapes")

Fail = Callable[[str, str], Exception]


@dataclass(frozen=True)
class Source:
    """Where a rule was read: ``url`` at ``version`` on ``read`` (a date), or an estimate."""

    id: str
    url: str = ""
    version: str = ""
    read: str = ""
    note: str = ""
    estimate: bool = False

    def cite(self) -> str:
        if self.estimate:
            return f"{self.id}: estimate" + (f" ({self.note})" if self.note else "")
        return f"{self.id}: {self.url}" + (f" @ {self.version}" if self.version else "") + (
            f", read {self.read}" if self.read else "")


@dataclass(frozen=True)
class AttributeRule:
    """Allowed values of one attribute: ``allowed`` (exact values), ``lo``/``hi`` (bounds on a
    number or on each element of a list); ``default`` when the node does not set it."""

    name: str
    allowed: tuple | None = None
    lo: float | None = None
    hi: float | None = None
    default: Any = None

    def describe(self) -> str:
        parts = []
        if self.allowed is not None:
            parts.append(f"in {list(self.allowed)}")
        if self.lo is not None:
            parts.append(f">= {self.lo:g}")
        if self.hi is not None:
            parts.append(f"<= {self.hi:g}")
        return f"{self.name} " + " and ".join(parts)

    def violated(self, value: Any) -> bool:
        if self.allowed is not None and _norm(value) not in [_norm(a) for a in self.allowed]:
            return True
        items = value if isinstance(value, (list, tuple)) else [value]
        nums = [v for v in items if isinstance(v, (int, float)) and not isinstance(v, bool)]
        return any((self.lo is not None and v < self.lo) or (self.hi is not None and v > self.hi) for v in nums)


@dataclass(frozen=True)
class OpRule:
    """What a device requires of one op type, from one source."""

    op: str
    source: Source
    note: str = ""
    input_dtypes: tuple[tuple[str, ...] | None, ...] = ()
    output_dtypes: tuple[tuple[str, ...] | None, ...] = ()
    min_rank: int | None = None
    max_rank: int | None = None
    attributes: tuple[AttributeRule, ...] = ()
    constant_inputs: frozenset[int] = frozenset()
    broadcast: str = "numpy"
    static_shapes: bool | None = None

    def lines(self) -> list[str]:
        """The rule in words, one constraint a line (``onnxhal profiles show``)."""
        out = []
        for what, spec in (("input", self.input_dtypes), ("output", self.output_dtypes)):
            for k, allowed in enumerate(spec):
                if allowed is not None:
                    out.append(f"{what} {k} dtype in {list(allowed)}")
        if self.min_rank is not None or self.max_rank is not None:
            out.append(f"input 0 rank {self.min_rank or 0}..{self.max_rank if self.max_rank is not None else 'any'}")
        out += [f"attribute {a.describe()}" for a in self.attributes]
        if self.constant_inputs:
            out.append(f"inputs {sorted(self.constant_inputs)} must be constant initializers")
        if self.broadcast != "numpy":
            out.append(f"broadcast: {self.broadcast}")
        if self.static_shapes is not None:
            out.append("static shapes only" if self.static_shapes else "dynamic shapes allowed")
        return out


@dataclass(frozen=True)
class Float32Option:
    """A provider option that chooses how float32 is computed (the QNN EP's fp16 switch):
    option value -> ``float32_as``."""

    name: str
    values: Mapping[str, str] = field(default_factory=dict)


# -- parsing -----------------------------------------------------------------------------------------
def parse_sources(data: Any, fail: Fail) -> dict[str, Source]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise fail("sources", "must be a table of [sources.ID] tables")
    out = {}
    for sid, t in data.items():
        key = f"sources.{sid}"
        if not isinstance(t, dict):
            raise fail(key, "must be a table with url, version, read (or estimate = true)")
        unknown = set(t) - {"url", "version", "read", "note", "estimate"}
        if unknown:
            raise fail(f"{key}.{sorted(unknown)[0]}", "unknown key; known: estimate, note, read, url, version")
        for k in ("url", "version", "read", "note"):
            if not isinstance(t.get(k, ""), str):
                raise fail(f"{key}.{k}", f"must be str, got {type(t[k]).__name__}")
        estimate = t.get("estimate", False)
        if not isinstance(estimate, bool):
            raise fail(f"{key}.estimate", "must be true or false")
        if not estimate and not (t.get("url") and t.get("read")):
            raise fail(key, "a source needs url and read (the date it was read), or estimate = true")
        out[sid] = Source(sid, t.get("url", ""), t.get("version", ""), t.get("read", ""), t.get("note", ""), estimate)
    return out


def source_ref(value: Any, sources: Mapping[str, Source], key: str, fail: Fail) -> Source:
    if not isinstance(value, str) or value not in sources:
        known = ", ".join(sorted(sources)) or "none declared"
        raise fail(key, f"{value!r} is not a [sources.ID] of this profile (declared: {known})")
    return sources[value]


def parse_op_rules(data: Any, sources: Mapping[str, Source], known_ops: frozenset[str],
                   fail: Fail) -> dict[str, tuple[OpRule, ...]]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise fail("op", "must be a table of [op.TYPE] tables")
    out: dict[str, tuple[OpRule, ...]] = {}
    for op, tables in data.items():
        if op not in known_ops:
            raise fail(f"op.{op}", "not an ONNX op type")
        tables = tables if isinstance(tables, list) else [tables]
        out[op] = tuple(_op_rule(op, t, f"op.{op}" + (f"[{i}]" if len(tables) > 1 else ""), sources, fail)
                        for i, t in enumerate(tables))
    return out


def _op_rule(op: str, t: Any, key: str, sources: Mapping[str, Source], fail: Fail) -> OpRule:
    if not isinstance(t, dict):
        raise fail(key, "must be a table")
    unknown = set(t) - set(_RULE_KEYS)
    if unknown:
        raise fail(f"{key}.{sorted(unknown)[0]}", f"unknown key; known: {', '.join(sorted(_RULE_KEYS))}")
    if "source" not in t:
        raise fail(f"{key}.source", "missing required key: every rule names its [sources.ID]")
    src = source_ref(t["source"], sources, f"{key}.source", fail)
    note = t.get("note", "")
    if not isinstance(note, str):
        raise fail(f"{key}.note", "must be str")
    ranks = {}
    for k in ("min_rank", "max_rank"):
        v = t.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 8):
            raise fail(f"{key}.{k}", f"must be an integer 0..8, got {v!r}")
        ranks[k] = v
    const = t.get("constant_inputs", [])
    if not isinstance(const, list) or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in const):
        raise fail(f"{key}.constant_inputs", f"must be a list of input positions (0-based), got {const!r}")
    broadcast = t.get("broadcast", "numpy")
    if broadcast not in BROADCAST:
        raise fail(f"{key}.broadcast", f"{broadcast!r} is not one of {', '.join(BROADCAST)}")
    static = t.get("static_shapes")
    if static is not None and not isinstance(static, bool):
        raise fail(f"{key}.static_shapes", "must be true or false")
    return OpRule(op=op, source=src, note=note,
                  input_dtypes=_dtype_spec(t.get("input_dtypes", []), f"{key}.input_dtypes", fail),
                  output_dtypes=_dtype_spec(t.get("output_dtypes", []), f"{key}.output_dtypes", fail),
                  min_rank=ranks["min_rank"], max_rank=ranks["max_rank"],
                  attributes=_attributes(t.get("attributes", {}), f"{key}.attributes", fail),
                  constant_inputs=frozenset(const), broadcast=broadcast, static_shapes=static)


def _dtype_spec(v: Any, key: str, fail: Fail) -> tuple[tuple[str, ...] | None, ...]:
    if not isinstance(v, list):
        raise fail(key, "must be a list, one entry per position: a list of dtypes or \"*\"")
    out: list[tuple[str, ...] | None] = []
    for k, allowed in enumerate(v):
        if allowed == "*":
            out.append(None)
            continue
        if not isinstance(allowed, list) or not allowed:
            raise fail(f"{key}[{k}]", f"must be a non-empty list of dtypes or \"*\", got {allowed!r}")
        bad = [d for d in allowed if d not in IO_DTYPES]
        if bad:
            raise fail(f"{key}[{k}]", f"unknown dtype(s) {bad}; known: {', '.join(IO_DTYPES)}")
        out.append(tuple(allowed))
    return tuple(out)


def _attributes(v: Any, key: str, fail: Fail) -> tuple[AttributeRule, ...]:
    if not isinstance(v, dict):
        raise fail(key, "must be a table: attribute name -> { in = [...], min = N, max = N, default = V }")
    out = []
    for name, spec in v.items():
        k = f"{key}.{name}"
        if isinstance(spec, list):  # shorthand: the allowed values
            spec = {"in": spec}
        if not isinstance(spec, dict) or not spec:
            raise fail(k, "must be a list of allowed values or a table with in/min/max/default")
        unknown = set(spec) - set(_ATTR_KEYS)
        if unknown:
            raise fail(f"{k}.{sorted(unknown)[0]}", f"unknown key; known: {', '.join(_ATTR_KEYS)}")
        for b in ("min", "max"):
            if b in spec and (isinstance(spec[b], bool) or not isinstance(spec[b], (int, float))):
                raise fail(f"{k}.{b}", f"must be a number, got {spec[b]!r}")
        allowed = spec.get("in")
        if allowed is not None and not isinstance(allowed, list):
            raise fail(f"{k}.in", "must be a list of allowed values")
        if allowed is None and "min" not in spec and "max" not in spec:
            raise fail(k, "states no constraint: give in, min or max")
        out.append(AttributeRule(name, tuple(allowed) if allowed is not None else None, spec.get("min"),
                                 spec.get("max"), spec.get("default")))
    return tuple(out)


def parse_float32_option(v: Any, dtypes: list[str], fail: Fail) -> tuple[Float32Option, ...]:
    """``{ name, values }`` or a list of them: provider options that pick ``float32_as``."""
    if v is None:
        return ()
    out = []
    for k, t in enumerate(v if isinstance(v, list) else [v]):
        key = "compute.float32_option" + (f"[{k}]" if isinstance(v, list) else "")
        if not isinstance(t, dict) or set(t) != {"name", "values"} or not isinstance(t["name"], str) \
                or not isinstance(t["values"], dict) or not t["values"]:
            raise fail(key, "must be { name = \"provider option\", values = { \"VALUE\" = \"float16\" | \"bfloat16\" | "
                            "\"float32\" | \"none\" | \"unchanged\", ... } }")
        for val, as_ in t["values"].items():
            if as_ != "unchanged" and (as_ not in ("float32", "float16", "bfloat16", "none")
                                       or as_ not in ("none", *dtypes)):
                raise fail(f"{key}.values.{val}", f"{as_!r} must be float32, float16, bfloat16, none or unchanged, "
                                                  f"and a compute dtype ({dtypes})")
        out.append(Float32Option(t["name"], dict(t["values"])))
    return tuple(out)


# -- checking a node ---------------------------------------------------------------------------------
def dtype_name(dtype: Any) -> str | None:
    if dtype is None:
        return None
    d = np.dtype(dtype)
    if d.kind in "USO":
        return "string"
    return "bool" if d == np.bool_ else d.name


def _norm(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, (list, tuple, np.ndarray)):
        return [_norm(x) for x in v]
    if isinstance(v, np.generic):
        return v.item()
    return v


def schema_default(op: str, name: str) -> Any:
    """The ONNX schema's default of attribute ``name`` of ``op`` (None if it has none)."""
    import onnx.defs
    from onnx import helper

    try:
        attr = onnx.defs.get_schema(op).attributes.get(name)
    except onnx.defs.SchemaError:
        return None
    if attr is None or not attr.default_value.name:
        return None
    return _norm(helper.get_attribute_value(attr.default_value))


def _info(graph: Any, name: str) -> tuple[str | None, tuple | None, bool]:
    """(dtype name, shape, constant) of a value; unknowns as None."""
    if graph.is_constant_initializer(name):
        arr = np.asarray(graph.initializer(name))
        return dtype_name(arr.dtype), tuple(arr.shape), True
    vi = graph.value_info(name)
    shape = tuple(vi.shape) if vi.shape is not None else None
    return dtype_name(vi.dtype), shape, False


def rule_reason(device: str, rule: OpRule, node: Any, graph: Any) -> str | None:
    """None if ``node`` obeys ``rule``, else the decline reason, naming the rule and its source."""
    broken = _broken(rule, node, graph)
    if broken is None:
        return None
    return f"{device} rule for {rule.op}: {broken} (source {rule.source.cite()})"


def _broken(rule: OpRule, node: Any, graph: Any) -> str | None:
    inputs = list(node.inputs)
    for what, names, spec in (("input", inputs, rule.input_dtypes), ("output", list(node.outputs), rule.output_dtypes)):
        for k, allowed in enumerate(spec):
            if allowed is None or k >= len(names) or not names[k]:
                continue
            dt = _info(graph, names[k])[0]
            if dt is not None and dt not in allowed:
                return f"{what} {k} ({names[k]!r}) is {dt}, allowed: {', '.join(allowed)}"
    if (rule.min_rank is not None or rule.max_rank is not None) and inputs and inputs[0]:
        shape = _info(graph, inputs[0])[1]
        if shape is not None:
            r = len(shape)
            if (rule.min_rank is not None and r < rule.min_rank) or (rule.max_rank is not None and r > rule.max_rank):
                hi = rule.max_rank if rule.max_rank is not None else "any"
                return f"input 0 ({inputs[0]!r}) has rank {r}, allowed {rule.min_rank or 0}..{hi}"
    for a in rule.attributes:
        value = node.attr(a.name, None)
        if value is None:
            value = a.default if a.default is not None else schema_default(rule.op, a.name)
        if value is not None and a.violated(_norm(value)):
            return f"attribute {a.name}={_norm(value)!r}, allowed: {a.describe()}"
    for k in sorted(rule.constant_inputs):
        if k < len(inputs) and inputs[k] and not graph.is_constant_initializer(inputs[k]):
            return f"input {k} ({inputs[k]!r}) must be a constant initializer"
    if rule.broadcast != "numpy":
        shapes = [s for s in (_info(graph, n)[1] for n in inputs if n) if s is not None]
        if rule.broadcast == "none" and len({tuple(s) for s in shapes}) > 1:
            return f"inputs of different shapes {[list(s) for s in shapes]}: this op does not broadcast"
        if rule.broadcast == "same_rank" and len({len(s) for s in shapes}) > 1:
            return f"inputs of different ranks {[len(s) for s in shapes]}: this op broadcasts only at equal rank"
    if rule.static_shapes:
        for n in (*inputs, *node.outputs):
            if n and not graph.is_constant_initializer(n) and not graph.value_info(n).has_static_shape:
                return f"{n!r} has a dynamic shape; this op needs static shapes"
    return None
