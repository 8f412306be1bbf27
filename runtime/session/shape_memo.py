"""Shape computations run once per combination of input shapes, not at every run.

Exported transformers compute their reshape targets in the graph: ``Shape`` of a tensor, then
``Gather``, ``Unsqueeze``, ``Concat`` ... on the few integers it gives (in a Hugging Face BERT
exported by the legacy exporter, 105 of 170 nodes). Those values depend only on the shapes of the
tensors the ``Shape``/``Size`` nodes read and on constants; onnxruntime folds them per shape in C++
where a node costs nanoseconds, here each node is a Python call.

The plan marks this *shape region* at session creation: ``Shape``/``Size`` nodes, then every pure
operator (``PURE_OPS``, default domain, run by the CPU EP) whose inputs are all constants or
region values. Each region value that a node outside the region reads (or that is a graph output)
becomes one ``ShapeMemo`` step placed before its first reader: it takes the tensors whose shapes
the value comes from, looks their shapes up in its cache, and on a miss runs the value's region
nodes (the same kernels, so the same results) and keeps it read-only for the next run with those
shapes. Values above ``MAX_CACHED_ELEMENTS`` elements are computed at every run and not kept.
To extend: an operator joins ``PURE_OPS`` only if its outputs are a function of its input values
alone (no randomness, no subgraph, no state).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

#: Read only the shape of their input.
SOURCE_OPS = frozenset({"Shape", "Size"})

#: Default-domain operators whose outputs depend on their input values alone; those that build
#: tensors as large as a shape asks (Expand, Tile, ConstantOfShape) stay outside.
PURE_OPS = frozenset({
    "Abs", "Add", "And", "Cast", "Ceil", "Concat", "Constant", "Div", "Equal", "Floor", "Gather",
    "GatherElements", "Greater", "GreaterOrEqual", "Identity", "Less", "LessOrEqual", "Max", "Min", "Mod",
    "Mul", "Neg", "Not", "Or", "Range", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSum", "Reshape",
    "Slice", "Split", "Sqrt", "Squeeze", "Sub", "Unsqueeze", "Where", "Xor",
})

#: Region values larger than this are recomputed at every run rather than kept between runs.
MAX_CACHED_ELEMENTS = 1 << 16

#: Distinct input-shape combinations one memo keeps; past this its cache starts again.
MAX_SHAPES = 64


def region_steps(steps: Sequence[Any], constant_slots: set[int], ep_name: str) -> set[int]:
    """Indices of the steps in the shape region (``steps`` in plan order; ``constant_slots``: the
    slots holding initializers, and slot 0, the omitted input)."""
    region: set[int] = set()
    derived: set[int] = set()
    for k, st in enumerate(steps):
        node = st.node
        if node is None or node.ep_name != ep_name or node.domain not in ("", "ai.onnx") or node.implicit_inputs:
            continue
        op = node.op_type
        if op in SOURCE_OPS or (op in PURE_OPS and all(i in constant_slots or i in derived for i in st.ins)):
            region.add(k)
            derived.update(st.outs)
    return region


class ShapeMemo:
    """One region value from the tensors whose shapes it comes from: ``memo(*sources) -> value``."""

    __slots__ = ("steps", "sources", "target", "constants", "cache")

    def __init__(self, steps: list[Any], sources: tuple[int, ...], target: int, constants: dict[int, Any]) -> None:
        self.steps = steps  # the region steps the value needs, in plan order
        self.sources = sources  # slots of the tensors the region's Shape/Size nodes read
        self.target = target
        self.constants = constants  # slot -> initializer the steps read
        #: sources' shapes (one source: its shape alone) -> value; the plan's generated code reads it
        self.cache: dict[tuple, Any] = {}

    def __call__(self, *sources: Any) -> Any:
        try:  # one source (the common case) keys by its shape alone: no generator per call
            key = sources[0].shape if len(sources) == 1 else tuple([s.shape for s in sources])
        except AttributeError:  # not a tensor (a sequence, an omitted input): the kernels say what is wrong
            return self.evaluate(sources)
        value = self.cache.get(key)
        if value is None:
            value = self.evaluate(sources)
            if isinstance(value, np.ndarray) and value.size <= MAX_CACHED_ELEMENTS:
                value.flags.writeable = False  # shared by every later run with these shapes
                if len(self.cache) >= MAX_SHAPES:
                    self.cache.clear()
                self.cache[key] = value
        return value

    def evaluate(self, sources: Sequence[Any]) -> Any:
        """Run the value's region steps on ``sources``. A kernel's error leaves with the failing
        step and its inputs attached (``failed_step``), for the executor's message."""
        values = dict(self.constants)
        values.update(zip(self.sources, sources))
        for st in self.steps:
            args = [values.get(i) for i in st.ins]
            try:
                if st.inline_fn is not None:
                    r = st.inline_fn(*args)
                    res = (r if r.__class__ is np.ndarray else np.asarray(r),)
                else:
                    res = st.fn(args)
            except Exception as e:
                e.onnxhal_failed_step = (st, args)
                raise
            for j, v in zip(st.outs, res):
                values[j] = v
        return values.get(self.target)


def memo_steps(steps: Sequence[Any], template: Sequence[Any], output_slots: Sequence[int], ep_name: str,
               make_step: Any) -> list[Any] | None:
    """``steps`` with the shape region replaced by ``ShapeMemo`` steps (``make_step(memo, ins, out)``
    builds one), or None when there is no region worth it."""
    constant = {i for i, v in enumerate(template) if v is not None} | {0}
    region = region_steps(steps, constant, ep_name)
    if not any(steps[k].node.op_type in SOURCE_OPS for k in region):
        return None  # constants the optimizer left: nothing depends on shapes
    producer: dict[int, int] = {}
    for k in sorted(region):
        for o in steps[k].outs:
            producer[o] = k

    def memo_for(slot: int) -> ShapeMemo:
        needed: set[int] = set()
        stack = [producer[slot]]
        while stack:
            k = stack.pop()
            if k in needed:
                continue
            needed.add(k)
            stack.extend(producer[i] for i in steps[k].ins if i in producer)
        sub = [steps[k] for k in sorted(needed)]
        sources = tuple(sorted({i for st in sub if st.node.op_type in SOURCE_OPS
                                for i in st.ins if i not in producer and i not in constant}))
        consts = {i: template[i] for st in sub for i in st.ins if i in constant and template[i] is not None}
        return ShapeMemo(sub, sources, slot, consts)

    out: list[Any] = []
    made: set[int] = set()
    for k, st in enumerate(steps):
        if k in region:
            continue
        for i in st.ins:
            if i in producer and i not in made:
                memo = memo_for(i)
                out.append(make_step(memo, memo.sources, i))
                made.add(i)
        out.append(st)
    for i in output_slots:
        if i in producer and i not in made:
            memo = memo_for(i)
            out.append(make_step(memo, memo.sources, i))
            made.add(i)
    return out
