"""The execution plan: built once per graph at session creation; ``run`` only indexes and calls.

Every value gets an integer slot per memory device it is needed on. A step is a callable taking
the list of its input values and returning its outputs; copy steps move a value to another memory
device through the registered data transfers. Slots are released right after their last use.
Nothing mutable lives in the plan, so many threads can run one plan at once.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import CodeType
from typing import Any

import numpy as np

from onnxhal.hal import DeviceTensor, Graph, KernelContext, KernelCreateContext, Node
from onnxhal.hal.errors import EPFail, Fail, InvalidGraph, OrtError, OutOfMemory
from onnxhal.hal.memory_info import HOST_MEMORY_DEVICE, OrtMemoryDevice
from onnxhal.hal.run_control import RUN_OPTIONS as _RUN_OPTIONS
from onnxhal.hal.run_control import TERMINATED_MSG as _TERMINATED_MSG
from onnxhal.hal.run_control import Terminated
from onnxhal.runtime.fp_errors import ignore_fp_errors, restore_fp_errors
from onnxhal.runtime.memory_context import MemoryContext
from onnxhal.runtime.shape_memo import ShapeMemo, memo_steps

logger = logging.getLogger("onnxhal.executor")

StepFn = Callable[[list], list]


@dataclass
class Step:
    fn: StepFn
    ins: tuple[int, ...]
    outs: tuple[int, ...]
    frees: tuple[int, ...]
    node: Node | None  # None for copy steps
    label: str
    ep_name: str
    inline_fn: Callable | None = None  # Kernel.inline_fn: called with positional inputs


class SubgraphRunner:
    """Runs a subgraph (If/Loop/Scan body): ``run(feeds) -> outputs`` in ``graph.outputs`` order."""

    def __init__(self, plan: ExecutionPlan) -> None:
        self.plan = plan
        self.graph = plan.graph

    def run(self, feeds: dict[str, Any]) -> list:
        run_options = _RUN_OPTIONS.get()
        if run_options is not None and run_options.terminate:  # checked at each iteration, even of an empty body
            raise Terminated(_TERMINATED_MSG)
        return self.plan.run(feeds, run_options)

    @property
    def feed_names(self) -> list[str]:
        """The names ``run_values`` takes its values for, in order."""
        return self.plan.feed_names

    def run_values(self, values: Sequence[Any]) -> list:
        """``run`` with the feeds as values in ``feed_names`` order (None: not fed): a Loop or
        Scan body runs once per iteration, and a dict per iteration costs more than the body's
        small nodes."""
        run_options = _RUN_OPTIONS.get()
        if run_options is not None and run_options.terminate:
            raise Terminated(_TERMINATED_MSG)
        return self.plan.run_values(values, run_options)


class _CreateContext(KernelCreateContext):
    def __init__(self, builder: ExecutionPlanBuilder, graph: Graph) -> None:
        self._builder = builder
        self._graph = graph

    def is_constant_initializer(self, name: str) -> bool:
        return bool(name) and self._graph.is_constant_initializer(name)

    def create_subgraph_runner(self, graph: Graph) -> SubgraphRunner:
        return SubgraphRunner(self._builder.build(graph, feed_names=graph.input_names + graph.outer_scope_reads()))


class ExecutionPlanBuilder:
    """Creates kernels and plans for a partitioned graph and its subgraphs."""

    def __init__(self, eps: dict[str, Any], compute_infos: dict[int, tuple[Any, Any]], memory: MemoryContext) -> None:
        self.eps = eps  # ep name -> Ep
        self.compute_infos = compute_infos  # id(fused node) -> (NodeComputeInfo, state)
        self.memory = memory
        self.kernels: list[Any] = []
        self.inline: dict[int, Callable | None] = {}  # id(node) -> Kernel.inline_fn
        #: id(node) -> inputs the kernel reads only the shape of (Kernel.metadata_inputs): a value in
        #: device memory reaches it as it is, with no copy to the host (Shape, Size).
        self.metadata_inputs: dict[int, frozenset[int]] = {}

    def build(self, graph: Graph, feed_names: Sequence[str] | None = None) -> ExecutionPlan:
        return ExecutionPlan(self, graph, list(feed_names if feed_names is not None else graph.input_names))

    def step_for(self, node: Node, graph: Graph) -> tuple[StepFn, frozenset[int], frozenset[int]]:
        """(callable, host input indices, host output indices) for a node of ``graph``."""
        info = self.compute_infos.get(id(node))
        if info is not None:
            cinfo, state = info
            nout = len(node.outputs)
            stream = self.memory.stream_for_ep(node.ep_name)

            def fused(inputs: list, _c=cinfo, _s=state, _n=nout, _st=stream, _ro=_RUN_OPTIONS) -> list:
                # The run's RunOptions reach the EP (KernelContext.run_options): its terminate flag
                # is read between launches and by a partition's own plan.
                ctx = KernelContext(inputs, _n, _st, _ro.get())
                out = _c.compute(_s, ctx)
                return ctx.outputs if out is None else out

            return fused, frozenset(getattr(cinfo, "host_inputs", ())), frozenset()
        ep = self.eps[node.ep_name]
        try:
            kernel = ep.create_kernel(node, _CreateContext(self, graph))
        except OrtError:
            raise
        except Exception as e:  # a kernel reading a malformed attribute or subgraph (Cast without 'to', ...)
            raise InvalidGraph(f"{node.op_type} node {node.name!r} (domain {node.domain or 'ai.onnx'!r}, opset "
                               f"{node.since_version}): {node.ep_name} cannot create its kernel: "
                               f"{type(e).__name__}: {e}. Check its attributes and subgraphs against the ONNX "
                               "operator spec.") from e
        self.kernels.append(kernel)
        self.inline[id(node)] = getattr(kernel, "inline_fn", None) if len(node.outputs) == 1 else None
        self.metadata_inputs[id(node)] = frozenset(getattr(kernel, "metadata_inputs", ()))
        return kernel.compute, frozenset(getattr(kernel, "host_inputs", ())), frozenset(getattr(kernel, "host_outputs", ()))


class ExecutionPlan:
    def __init__(self, builder: ExecutionPlanBuilder, graph: Graph, feed_names: list[str]) -> None:
        self.graph = graph
        memory = builder.memory
        self.memory = memory
        slots: dict[tuple[str, OrtMemoryDevice], int] = {}
        template: list[Any] = [None]  # slot 0 is always None: an omitted optional input
        home: dict[str, OrtMemoryDevice] = {}  # where each value is produced
        steps: list[Step] = []
        self.feed_names = feed_names

        def slot(name: str, dev: OrtMemoryDevice) -> int:
            key = (name, dev)
            if key not in slots:
                slots[key] = len(template)
                template.append(None)
            return slots[key]

        for name in feed_names:
            home[name] = HOST_MEMORY_DEVICE
            slot(name, HOST_MEMORY_DEVICE)
        for name, arr in graph.initializers.items():
            if name not in home:
                home[name] = HOST_MEMORY_DEVICE
                template[slot(name, HOST_MEMORY_DEVICE)] = arr
        # Feeds may be needed on other devices too: they are copied there at feed time.
        self._feed_targets: dict[str, list[tuple[OrtMemoryDevice, int]]] = {n: [] for n in feed_names}

        def need(name: str, dev: OrtMemoryDevice) -> int:
            """Slot of ``name`` on ``dev``, adding a copy if it is produced elsewhere."""
            if not name:
                return 0
            src = home.get(name)
            if src is None:
                raise Fail(f"graph {graph.name!r}: value {name!r} is read before it is produced")
            if src == dev or (name, dev) in slots:
                return slot(name, dev)
            s = slot(name, dev)
            if name in self._feed_targets:
                self._feed_targets[name].append((dev, s))
            elif name in graph.initializers:
                # Initializers are placed on their device once, at session creation.
                template[s] = memory.transfer(template[slots[(name, src)]], dev, None)
            else:
                copy = memory.copy_step(src, dev)
                steps.append(Step(copy, (slots[(name, src)],), (s,), (), None, f"copy {name} {src}->{dev}", ""))
            return s

        for node in graph.nodes:
            fn, host_in, host_out = builder.step_for(node, graph)
            ep_dev = memory.device_of_ep(node.ep_name)
            all_inputs = (*node.inputs, *node.implicit_inputs)
            meta_in = builder.metadata_inputs.get(id(node), frozenset())
            ins = tuple(need(i, home.get(i, ep_dev) if k in meta_in else HOST_MEMORY_DEVICE if k in host_in else ep_dev)
                        for k, i in enumerate(all_inputs))
            outs = []
            for k, o in enumerate(node.outputs):
                if not o:
                    outs.append(len(template))  # unnamed output: a scratch slot
                    template.append(None)
                    continue
                dev = HOST_MEMORY_DEVICE if k in host_out else ep_dev
                home[o] = dev
                outs.append(slot(o, dev))
            steps.append(Step(fn, ins, tuple(outs), (), node, node.name or node.op_type, node.ep_name,
                              builder.inline.get(id(node))))

        # Outputs stay where they are produced; ``run`` moves them to where the caller wants them.
        self.output_names = graph.output_names
        self.output_slots: list[int] = []
        for o in graph.outputs:
            src = home.get(o.name)
            if src is None:
                raise Fail(f"graph {graph.name!r}: output {o.name!r} is never produced")
            self.output_slots.append(slot(o.name, src))
        self.output_homes = [home[o.name] for o in graph.outputs]
        self.device_outputs = any(not d.is_host for d in self.output_homes)
        self.feed_slots = [slots[(n, HOST_MEMORY_DEVICE)] for n in feed_names]
        self._host_feeds_only = not any(self._feed_targets.values())
        # run_host's feeds: name -> slot of the inputs read on the host only (all of them for a CPU plan)
        self._host_feed_slots = {n: self.feed_slots[i] for i, n in enumerate(feed_names)
                                 if not self._feed_targets[n]}
        self.feed_index = {n: i for i, n in enumerate(feed_names)}
        self._template = template
        keep = set(self.output_slots) | set(self.feed_slots)
        self.steps = _add_frees(steps, keep, template)
        self._read_slots = {i for s in self.steps for i in s.ins}
        self._output_slot_set = set(self.output_slots)
        # The generated run functions compute shape values once per input shape (runtime/shape_memo.py);
        # the profiled run (``_run_checked``) runs every step.
        memo = memo_steps(self.steps, template, self.output_slots, _CPU_EP, _memo_step)
        fast_steps = self.steps if memo is None else _add_frees(memo, keep, template)
        self._fast, self._fast_fns, self._line_to_step = _compile_straight_line(fast_steps, self.output_slots, False)
        # The variant that checks RunOptions.terminate between steps is compiled at the first run
        # given run options (compiling costs about as much as a small model's whole creation).
        self._fast_steps = fast_steps
        self._checked: tuple[Callable, dict[int, Step]] | None = None

    # -- running ----------------------------------------------------------------------------
    def run(self, feeds: dict[str, Any], run_options: Any = None, profiler: Any = None,
            fetch: Sequence[int] | None = None, output_devices: Sequence[OrtMemoryDevice] | None = None) -> list:
        """Outputs (all, or the ``fetch`` indices) on the host, or on ``output_devices[i]``."""
        slots = self._template.copy()
        for name, value in feeds.items():
            i = self.feed_index.get(name)
            if i is None:
                continue
            targets = self._feed_targets.get(name)
            if not targets and not isinstance(value, DeviceTensor):
                slots[self.feed_slots[i]] = value  # the common case: a host value read on the host
                continue
            # A feed goes to every memory device that reads it, copied only where it is not already.
            host_slot = self.feed_slots[i]
            try:
                if host_slot in self._read_slots or host_slot in self._output_slot_set:
                    slots[host_slot] = self.memory.transfer(value, HOST_MEMORY_DEVICE, None)
                for dev, s in targets or ():
                    slots[s] = self.memory.transfer(value, dev, None)
            except OrtError:
                raise
            except Exception as e:
                raise _transfer_error(e, f"copying input {name!r} to the memory of the EPs that read it") from e
        token = _RUN_OPTIONS.set(run_options) if run_options is not None else None
        try:
            self._execute(slots, run_options, profiler)
        finally:
            if token is not None:
                _RUN_OPTIONS.reset(token)
        return self._outputs(slots, fetch, output_devices)

    def run_host(self, feeds: dict[str, Any]) -> list:
        """``run(feeds)`` for the common case, host arrays in and every output on the host, with
        none of ``run``'s branches: a session's run without options (a tiny model's run is a few
        microseconds, and each layer of calls costs a tenth of one). Anything else goes to ``run``."""
        if self.device_outputs:
            return self.run(feeds)
        host = self._host_feed_slots
        slots = self._template.copy()
        for name, value in feeds.items():
            i = host.get(name)
            if i is None or value.__class__ is not np.ndarray:
                return self.run(feeds)
            slots[i] = value
        token = ignore_fp_errors()
        try:
            return list(self._execute_fast(slots, None))
        finally:
            restore_fp_errors(token)

    def run_values(self, values: Sequence[Any], run_options: Any = None) -> list:
        """``run`` with the feeds given as values in ``feed_names`` order (None: not fed), all
        outputs on the host. For subgraphs, called by a kernel during a run: under that run's
        numpy error state."""
        if not self._host_feeds_only:
            return self.run({n: v for n, v in zip(self.feed_names, values) if v is not None}, run_options)
        slots = self._template.copy()
        for i, v in zip(self.feed_slots, values):
            if v.__class__ is not np.ndarray and isinstance(v, DeviceTensor):
                return self.run({n: v for n, v in zip(self.feed_names, values) if v is not None}, run_options)
            slots[i] = v
        token = _RUN_OPTIONS.set(run_options) if run_options is not None else None
        try:
            results = self._execute_fast(slots, run_options)
        finally:
            if token is not None:
                _RUN_OPTIONS.reset(token)
        if not self.device_outputs:
            return list(results)
        for i, v in zip(self.output_slots, results):
            slots[i] = v
        return self._outputs(slots, None, None)

    def _execute(self, slots: list, run_options: Any, profiler: Any) -> None:
        token = ignore_fp_errors()  # NaN and inf are results, not warnings (runtime/fp_errors.py)
        try:
            if profiler is not None:
                self._run_checked(slots, run_options, profiler)
            else:
                for i, v in zip(self.output_slots, self._execute_fast(slots, run_options)):
                    slots[i] = v
        finally:
            restore_fp_errors(token)

    def _execute_fast(self, slots: list, run_options: Any) -> tuple:
        """The generated run function on ``slots``, under the caller's numpy error state: the
        graph outputs, in ``output_slots`` order."""
        fast = self._fast if run_options is None else self._checked_run()[0]
        try:
            results = fast(slots, self._fast_fns, run_options)
        except Terminated:
            raise
        except Exception as e:
            step, values = self._failed_step(e, fast)
            raise self._wrap(e, slots, step, values) from e
        finally:
            if self.memory.any_streams:
                self.memory.end_of_run()
        return results

    def _outputs(self, slots: list, fetch: Sequence[int] | None,
                 output_devices: Sequence[OrtMemoryDevice] | None) -> list:
        idx = range(len(self.output_slots)) if fetch is None else fetch
        if not self.device_outputs and output_devices is None:
            return [slots[self.output_slots[i]] for i in idx]
        transfer = self.memory.transfer
        try:
            results = [transfer(slots[self.output_slots[i]],
                                output_devices[i] if output_devices is not None else HOST_MEMORY_DEVICE, None)
                       for i in idx]
            if any(isinstance(r, DeviceTensor) for r in results):
                # As ORT's Run: the outputs are complete when run() returns, also those left on a device
                # (copies to the host already waited; device-resident ones need the streams drained).
                self.memory.synchronize()
        except OrtError:
            raise
        except Exception as e:
            raise _transfer_error(e, "copying the outputs to the memory they are returned in") from e
        return results

    def _run_checked(self, slots: list, run_options: Any, profiler: Any) -> None:
        for step in self.steps:
            if run_options is not None and run_options.terminate:
                raise Terminated("Exiting due to terminate flag being set to true: RunOptions.terminate was set "
                                 "during or before this run. Clear it (run_options.terminate = False) to run again.")
            t0 = time.perf_counter_ns() if profiler is not None else 0
            try:
                res = step.fn([slots[i] for i in step.ins])
            except Exception as e:
                raise self._wrap(e, slots, step, [slots[i] for i in step.ins]) from e
            for j, v in zip(step.outs, res):
                slots[j] = v
            if profiler is not None:
                profiler.record_step(step, t0, time.perf_counter_ns(), [slots[i] for i in step.ins],
                                     [slots[j] for j in step.outs])
            for f in step.frees:
                slots[f] = None
        self.memory.end_of_run()

    def _checked_run(self) -> tuple[Callable, dict[int, Step]]:
        """The generated run function that honours RunOptions.terminate, and its line map."""
        checked = self._checked
        if checked is None:  # two threads may both compile it: equal functions, either is kept
            fn, _, lines = _compile_straight_line(self._fast_steps, self.output_slots, True)
            checked = self._checked = (fn, lines)
        return checked

    def _failed_step(self, e: BaseException, fast: Callable) -> tuple[Step | None, list | None]:
        """The step whose line of the generated run function raised, and the values it was given
        (the run function's locals: intermediate values live there, not in ``slots``)."""
        failed = getattr(e, "onnxhal_failed_step", None)  # raised inside a shape memo
        if failed is not None:
            return failed
        lines = self._line_to_step if fast is self._fast else self._checked_run()[1]
        tb = e.__traceback__
        step = values = None
        while tb is not None:
            if tb.tb_frame.f_code is fast.__code__:
                step = lines.get(tb.tb_lineno)
                if step is not None:
                    local = tb.tb_frame.f_locals
                    values = [local.get(f"s{i}") for i in step.ins]
            tb = tb.tb_next
        return step, values

    def _wrap(self, e: Exception, slots: list, step: Step | None = None, values: list | None = None) -> Exception:
        if isinstance(e, Terminated):
            return e
        if step is None:  # find the failing step: the first whose outputs are still unset
            step = next((s for s in self.steps if any(slots[j] is None for j in s.outs)), None)
        # A partition's own plan (a simulated device's host backend) has no EP names on its nodes.
        where = (f"{step.node.op_type} node {step.node.name!r}" + (f" on {step.ep_name}" if step.ep_name else "")
                 if step and step.node else (step.label if step else "a step"))
        msg = f"Non-zero status code returned while running {where}: {type(e).__name__}: {e}"
        if step is not None and step.node is not None and values is not None and not isinstance(e, OrtError):
            # What the node was given, so that the message is about the model, not only our code.
            names = (*step.node.inputs, *step.node.implicit_inputs)
            msg += ". Its inputs were " + ", ".join(f"{n or '(omitted)'!r}: {_describe(v)}" for n, v in zip(names, values))
        if isinstance(e, OrtError):
            try:
                err = type(e)(msg)
            except Exception:
                err = Fail(msg)
        elif isinstance(e, MemoryError):  # numpy could not allocate: OutOfMemory is also a MemoryError
            err = OutOfMemory(f"{msg}. Reduce the input shapes or the batch size, or free memory.")
        else:
            err = EPFail(msg) if step and step.ep_name and step.ep_name != "CPUExecutionProvider" else Fail(msg)
        # Which EP failed: the session's failover reads it. An error from inside a subgraph keeps
        # the EP that raised it, not the EP of the If/Loop/Scan node around it.
        err.ep_name = getattr(e, "ep_name", "") or (step.ep_name if step else "")
        return err


def _describe(value: Any) -> str:
    if value is None:
        return "absent"
    dtype, shape = getattr(value, "dtype", None), getattr(value, "shape", None)
    if dtype is not None and shape is not None:
        return f"{dtype}[{','.join(str(d) for d in shape)}]"
    return type(value).__name__ + (f" of {len(value)}" if isinstance(value, (list, tuple)) else "")


def _memo_step(memo: Callable, ins: tuple[int, ...], out: int) -> Step:
    return Step(memo, ins, (out,), (), None, "shape values", _CPU_EP, memo)


_CPU_EP = "CPUExecutionProvider"
#: Distinct plan sources whose code objects a process keeps (``compiled_plan``).
PLAN_CODE_CACHE_SIZE = 128


@functools.lru_cache(maxsize=PLAN_CODE_CACHE_SIZE)
def compiled_plan(source: str) -> CodeType:
    """The code object of a generated plan function, kept per process by its source: compiling
    is a large part of building a plan, and every session of one model (several per process in
    tests, one per worker, a failover's rebuild) generates the very same source. The source
    names only slots and step indices; what they hold is bound per plan at ``exec``."""
    return compile(source, "<onnxhal plan>", "exec")


def _compile_straight_line(steps: list[Step], output_slots: list[int],
                           check_terminate: bool) -> tuple[Callable, tuple, dict[int, Step]]:
    """Generate the plan as one Python function: a line per step, values in local variables.

    This removes the interpreter overhead of a generic loop (indexing a list of steps, building
    argument lists from index tuples, looping over outputs and frees), which dominates small
    kernels: a chain of tiny elementwise nodes costs about half as much per node. The function
    takes the initial slot list (feeds, constants) and returns the graph outputs.
    """
    read_first: set[int] = set()
    written: set[int] = set()
    for st in steps:
        read_first.update(i for i in st.ins if i not in written)
        written.update(st.outs)
    read_first.update(i for i in output_slots if i not in written)
    lines = ["def _run(slots, fns, ro):"]
    pre = sorted(read_first)
    for k in range(0, len(pre), 64):  # load feeds and constants into locals
        chunk = pre[k:k + 64]
        lines.append("    " + ", ".join(f"s{i}" for i in chunk) + ", = " + ", ".join(f"slots[{i}]" for i in chunk) + ",")
    lines.append("    " + ", ".join(f"f{k}" for k in range(len(steps))) + ", = fns" if steps else "    pass")
    line_to_step: dict[int, Step] = {}
    memos: dict[str, dict] = {}
    for k, st in enumerate(steps):
        args = "[" + ", ".join(f"s{i}" for i in st.ins) + "]"
        if check_terminate:  # as ORT: the flag is honoured between nodes
            lines.append("    if ro.terminate: raise Terminated(MSG)")
        line_to_step[len(lines) + 1] = st
        if isinstance(st.inline_fn, ShapeMemo) and st.ins:
            # The memo's cache read in line (a shape value costs a dict lookup, not a call);
            # anything but an ndarray source goes through the memo, which says what is wrong.
            o = st.outs[0]
            memos[f"m{k}"] = st.inline_fn.cache
            arrays = " and ".join(f"s{i}.__class__ is ndarray" for i in st.ins)
            key = f"s{st.ins[0]}.shape" if len(st.ins) == 1 else "(" + "".join(f"s{i}.shape, " for i in st.ins) + ")"
            lines.append(f"    s{o} = m{k}.get({key}) if {arrays} else None")
            lines.append(f"    if s{o} is None:")
            lines.append(f"        s{o} = f{k}({', '.join(f's{i}' for i in st.ins)})")
            lines.append(f"        if s{o}.__class__ is not ndarray: s{o} = asarray(s{o})")
        elif st.inline_fn is not None:
            o = st.outs[0]
            lines.append(f"    s{o} = f{k}({', '.join(f's{i}' for i in st.ins)})")
            lines.append(f"    if s{o}.__class__ is not ndarray: s{o} = asarray(s{o})")
        elif len(st.outs) == 1:
            lines.append(f"    s{st.outs[0]} = f{k}({args})[0]")
        else:
            lines.append(f"    _r = f{k}({args})")
            for j, o in enumerate(st.outs):
                lines.append(f"    s{o} = _r[{j}] if len(_r) > {j} else None")
        if st.frees:
            lines.append("    " + ", ".join(f"s{f}" for f in st.frees) + " = " + ", ".join("None" for _ in st.frees))
    lines.append("    return (" + "".join(f"s{i}, " for i in output_slots) + ")")
    namespace: dict = {"Terminated": Terminated, "MSG": _TERMINATED_MSG, "ndarray": np.ndarray,
                       "asarray": np.asarray, **memos}
    exec(compiled_plan("\n".join(lines)), namespace)  # noqa: S102 - generated from the plan
    return namespace["_run"], tuple(st.inline_fn or st.fn for st in steps), line_to_step


def _add_frees(steps: list[Step], keep: set[int], template: list) -> list[Step]:
    """Release each slot after its last reader. Constant slots (initializers) and kept slots stay."""
    constant = {i for i, v in enumerate(template) if v is not None}
    last: dict[int, int] = {}
    for k, s in enumerate(steps):
        for i in s.ins:
            last[i] = k
        for o in s.outs:
            last.setdefault(o, k)  # an output nobody reads dies right away
    frees: list[list[int]] = [[] for _ in steps]
    for slot_i, k in last.items():
        if slot_i != 0 and slot_i not in keep and slot_i not in constant:
            frees[k].append(slot_i)
    return [Step(s.fn, s.ins, s.outs, tuple(sorted(set(f))), s.node, s.label, s.ep_name, s.inline_fn)
            for s, f in zip(steps, frees)]


def _transfer_error(e: Exception, what: str) -> Exception:
    """A failed copy between memories as a typed error (a kernel's errors are wrapped by ``_wrap``)."""
    msg = f"{what} failed: {type(e).__name__}: {e}"
    if isinstance(e, MemoryError):
        return OutOfMemory(f"{msg}. Reduce the input shapes or the batch size, or free memory.")
    return Fail(msg)
