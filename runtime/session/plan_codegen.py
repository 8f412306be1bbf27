"""An execution plan's steps as one generated Python function, and its source for reading.

The plan (``executor.ExecutionPlan``) is a list of steps, each a callable with input and output
slot numbers. Running that list in a loop costs, per step, indexing the list, building the
argument list from an index tuple, and looping over outputs and frees: for small kernels that
overhead is as large as the kernel (a chain of tiny elementwise nodes costs about half as much per
node straight-line). So the plan is also written out as one function, a line per step, values in
local variables. The interpreted loop stays the reference: it runs under the profiler, and
``tests/test_plan_codegen.py`` checks that both give the same outputs.

``plan_source`` is what ``ExecutionPlan.explain()`` and ``onnxhal explain --plan`` print: the
generated function with each step's node, op and EP beside its line.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import CodeType
from typing import Any

import numpy as np

from onnxhal.hal.run_control import TERMINATED_MSG, Terminated
from onnxhal.runtime.session.shape_memo import ShapeMemo

#: Distinct plan sources whose code objects a process keeps (``compiled_plan``).
PLAN_CODE_CACHE_SIZE = 128
#: Feeds and constants are loaded into locals this many to a line (a long tuple unpacking per line).
_LOAD_CHUNK = 64


@functools.lru_cache(maxsize=PLAN_CODE_CACHE_SIZE)
def compiled_plan(source: str) -> CodeType:
    """The code object of a generated plan function, kept per process by its source: compiling
    is a large part of building a plan, and every session of one model (several per process in
    tests, one per worker, a failover's rebuild) generates the very same source. The source
    names only slots and step indices; what they hold is bound per plan at ``exec``."""
    return compile(source, "<onnxhal plan>", "exec")


@dataclass(frozen=True)
class GeneratedRun:
    """``fn(slots, fns, run_options) -> outputs`` with its step callables ``fns``, and the step
    each source line runs (to name the failing node from a traceback)."""

    fn: Callable
    fns: tuple
    line_to_step: dict[int, Any]
    source: str


def plan_source(steps: Sequence[Any], output_slots: Sequence[int], check_terminate: bool,
                names: Mapping[int, str] | None = None) -> tuple[str, dict[int, Any]]:
    """The source of the run function for ``steps`` (``executor.Step``), and line -> step.

    The function takes the initial slot list (feeds, constants) and returns the graph outputs.
    ``check_terminate`` adds onnxruntime's check of ``RunOptions.terminate`` between nodes.
    ``names`` (slot -> value name) adds a comment naming each step's node, op, EP and values, for
    reading (the cached code is compiled from the plain source, which names only slots and step
    indices)."""
    read_first: set[int] = set()
    written: set[int] = set()
    for st in steps:
        read_first.update(i for i in st.ins if i not in written)
        written.update(st.outs)
    read_first.update(i for i in output_slots if i not in written)
    lines = ["def _run(slots, fns, ro):"]
    pre = sorted(read_first)
    for k in range(0, len(pre), _LOAD_CHUNK):
        chunk = pre[k:k + _LOAD_CHUNK]
        lines.append("    " + ", ".join(f"s{i}" for i in chunk) + ", = " + ", ".join(f"slots[{i}]" for i in chunk) + ",")
    lines.append("    " + ", ".join(f"f{k}" for k in range(len(steps))) + ", = fns" if steps else "    pass")
    line_to_step: dict[int, Any] = {}
    for k, st in enumerate(steps):
        if check_terminate:
            lines.append("    if ro.terminate: raise Terminated(MSG)")
        if names is not None:
            where = f"{st.node.op_type} {st.node.name!r}" if st.node is not None else st.label
            values = ", ".join(f"s{i}={names.get(i, '?')}" for i in (*st.ins, *st.outs) if i)
            lines.append(f"    # step {k}: {where} on {st.ep_name or 'the host'}; {values}")
        line_to_step[len(lines) + 1] = st
        lines.extend(_step_lines(k, st))
        if st.frees:
            lines.append("    " + ", ".join(f"s{f}" for f in st.frees) + " = " + ", ".join("None" for _ in st.frees))
    lines.append("    return (" + "".join(f"s{i}, " for i in output_slots) + ")")
    return "\n".join(lines), line_to_step


def _step_lines(k: int, st: Any) -> list[str]:
    """The lines that run step ``k``: a call with a list of inputs, or, for a kernel with a
    positional ``inline_fn``, a direct call (a shape memo's cache read in line: a shape value
    costs a dict lookup, not a call; anything but an ndarray source goes through the memo, which
    says what is wrong)."""
    ins = st.ins
    if isinstance(st.inline_fn, ShapeMemo) and ins:
        o = st.outs[0]
        arrays = " and ".join(f"s{i}.__class__ is ndarray" for i in ins)
        key = f"s{ins[0]}.shape" if len(ins) == 1 else "(" + "".join(f"s{i}.shape, " for i in ins) + ")"
        return [f"    s{o} = m{k}.get({key}) if {arrays} else None",
                f"    if s{o} is None:",
                f"        s{o} = f{k}({', '.join(f's{i}' for i in ins)})",
                f"        if s{o}.__class__ is not ndarray: s{o} = asarray(s{o})"]
    if st.inline_fn is not None:
        o = st.outs[0]
        return [f"    s{o} = f{k}({', '.join(f's{i}' for i in ins)})",
                f"    if s{o}.__class__ is not ndarray: s{o} = asarray(s{o})"]
    args = "[" + ", ".join(f"s{i}" for i in ins) + "]"
    if len(st.outs) == 1:
        return [f"    s{st.outs[0]} = f{k}({args})[0]"]
    return [f"    _r = f{k}({args})"] + [f"    s{o} = _r[{j}] if len(_r) > {j} else None" for j, o in enumerate(st.outs)]


def generate(steps: Sequence[Any], output_slots: Sequence[int], check_terminate: bool) -> GeneratedRun:
    """The plan's run function, compiled (once per process per source) and bound to ``steps``."""
    source, line_to_step = plan_source(steps, output_slots, check_terminate)
    namespace: dict = {"Terminated": Terminated, "MSG": TERMINATED_MSG, "ndarray": np.ndarray, "asarray": np.asarray}
    namespace.update({f"m{k}": st.inline_fn.cache for k, st in enumerate(steps)
                      if isinstance(st.inline_fn, ShapeMemo) and st.ins})
    exec(compiled_plan(source), namespace)  # noqa: S102 - generated from the plan
    # taken out of its own globals: left there, the function and its namespace would be a reference
    # cycle holding every kernel, which only the garbage collector frees (collector_pause.py)
    return GeneratedRun(namespace.pop("_run"), tuple(st.inline_fn or st.fn for st in steps), line_to_step, source)
