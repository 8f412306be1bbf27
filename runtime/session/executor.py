"""The execution plan: built once per graph at session creation; ``run`` only indexes and calls.

Every value gets an integer slot per memory device it is needed on. A step is a callable taking
the list of its input values and returning its outputs; copy steps move a value to another memory
device through the registered data transfers. Slots are released right after their last use.
Nothing mutable lives in the plan, so many threads can run one plan at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxhal.hal import DeviceTensor, Graph, KernelContext, KernelCreateContext, Node
from onnxhal.hal.errors import EPFail, Fail, InvalidGraph, OrtError, OutOfMemory
from onnxhal.hal.memory_info import HOST_MEMORY_DEVICE, OrtMemoryDevice
from onnxhal.hal.run_control import RUN_OPTIONS as _RUN_OPTIONS
from onnxhal.hal.run_control import TERMINATED_MSG as _TERMINATED_MSG
from onnxhal.hal.run_control import Terminated
from onnxhal.runtime.session.fp_errors import ignore_fp_errors, restore_fp_errors
from onnxhal.runtime.session.graph_capture import captures_graphs, destinations_for
from onnxhal.runtime.session.memory_context import MemoryContext
from onnxhal.runtime.session.plan_codegen import GeneratedRun, generate, plan_source
from onnxhal.runtime.session.shape_memo import memo_steps

logger = logging.getLogger("onnxhal.executor")

StepFn = Callable[[list], list]

#: A plan's first plain run runs its steps in a loop and its run function is generated at the
#: second (``ExecutionPlan._first_run``); False generates it when the plan is built (read then).
FIRST_RUN_LOOP = True


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


@dataclass(frozen=True)
class HostEntry:
    """``ExecutionPlan.host_entry``'s answer: a run copies ``template``, puts feed ``k`` into slot
    ``feed_slots[k]``, and calls ``generated.fn(slots, generated.fns, run_options)`` (None, or the
    RunOptions, for the function that checks them); what that raises is raised as
    ``run_error(e, slots)`` (``Terminated`` as it is). ``template`` is shared: copied, never
    changed."""

    template: list
    feed_slots: tuple[int, ...]
    generated: GeneratedRun
    run_error: Callable[[Exception, list], Exception]
    #: per feed: (slot, upload) for each other memory device that reads it, ``upload(array, hold)``
    #: its copy there (``MemoryContext.uploader``); empty tuples for a host-only plan
    uploads: tuple[tuple[tuple[int, Callable], ...], ...] = ()
    #: per graph output: None for one produced on the host, else ``download(value)``, its copy to
    #: the host (``MemoryContext.downloader``)
    downloads: tuple[Callable | None, ...] = ()
    #: the plan's memory context where a run has copies or streams (its ``run_begin``, ``run_end``,
    #: ``end_of_run`` frame the run as ``ExecutionPlan.run`` does), else None
    memory: MemoryContext | None = None
    #: ``_transfer_error`` of a failed feed upload (``feed_error(e, name)``) or download (name "")
    copy_error: Callable[[Exception, str], Exception] | None = None
    #: a plan that is one fused node reading only feeds and producing every graph output, whose EP
    #: runs it from host arrays to host arrays itself (``NodeComputeInfo.host_runner``): that runner
    #: (its inputs -> its outputs, or None where it declines the arrays), the index into the feeds of
    #: each of its inputs, and the index into its outputs of each graph output; else None
    one_call: Callable[[Sequence[Any]], list | None] | None = None
    one_call_feeds: tuple[int, ...] = ()
    one_call_outputs: tuple[int, ...] = ()


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

    def bind_values(self, values: Sequence[Any], varying: Sequence[tuple[int, int]]) -> Callable[[Sequence[Any]], list]:
        """``run_values`` for many runs that differ only in some feeds (``ExecutionPlan.bind_values``),
        with ``RunOptions.terminate`` checked at each run."""
        run_options = _RUN_OPTIONS.get()
        run = self.plan.bind_values(values, varying, run_options)
        if run_options is None:
            return run

        def checked(args: Sequence[Any]) -> list:
            if run_options.terminate:
                raise Terminated(_TERMINATED_MSG)
            return run(args)
        return checked


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

    def take_kernels(self) -> list[Any]:
        """The kernels made so far, handed over: the builder keeps no reference to them or their
        inline functions after this. A kernel may keep its creation context (a lazy fallback builds
        from it), which reaches the builder: were the builder to keep the kernel too, the two would
        be a reference cycle, and a dropped session would wait for the garbage collector (which
        then walks and frees it during some later session's creation) instead of being freed at once."""
        kernels, self.kernels = self.kernels, []
        self.inline = {}
        return kernels

    def step_for(self, node: Node, graph: Graph) -> tuple[StepFn, frozenset[int], frozenset[int]]:
        """(callable, host input indices, host output indices) for a node of ``graph``."""
        info = self.compute_infos.get(id(node))
        if info is not None:
            cinfo, state = info
            nout = len(node.outputs)
            stream = self.memory.stream_for_ep(node.ep_name)

            ep = self.eps.get(node.ep_name)
            if not (captures_graphs(ep) and ep.is_graph_capture_enabled()):
                def fused(inputs: list, _c=cinfo, _s=state, _n=nout, _st=stream, _ro=_RUN_OPTIONS) -> list:
                    # The run's RunOptions reach the EP (KernelContext.run_options): its terminate flag
                    # is read between launches and by a partition's own plan.
                    ctx = KernelContext(inputs, _n, _st, _ro.get())
                    out = _c.compute(_s, ctx)
                    return ctx.outputs if out is None else out
            else:
                # a capturing EP gets its outputs' destinations in a capture run (graph_capture.py)
                def fused(inputs: list, _c=cinfo, _s=state, _n=nout, _st=stream, _ro=_RUN_OPTIONS,
                          _ep=node.ep_name, _outs=tuple(node.outputs)) -> list:
                    ctx = KernelContext(inputs, _n, _st, _ro.get(), destinations_for(_ep, _outs))
                    out = _c.compute(_s, ctx)
                    return ctx.outputs if out is None else out

            self.metadata_inputs[id(node)] = frozenset(getattr(cinfo, "metadata_inputs", ()))  # as a kernel's
            return fused, frozenset(getattr(cinfo, "host_inputs", ())), frozenset(getattr(cinfo, "host_outputs", ()))
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
        self._compute_infos = builder.compute_infos  # for ``host_entry``'s one-call runner
        slots: dict[tuple[str, OrtMemoryDevice], int] = {}
        template: list[Any] = [None]  # slot 0 is always None: an omitted optional input
        home: dict[str, OrtMemoryDevice] = {}  # where each value is produced
        steps: list[Step] = []
        self.feed_names = feed_names

        def slot(name: str, dev: OrtMemoryDevice) -> int:
            key = (name, dev)
            s = slots.get(key)  # (one lookup: a plan asks for every value's slot once per reader)
            if s is None:
                s = slots[key] = len(template)
                template.append(None)
            return s

        for name in feed_names:
            home[name] = HOST_MEMORY_DEVICE
            slot(name, HOST_MEMORY_DEVICE)
        for name, arr in graph.initializers.items():
            if name not in home:
                home[name] = HOST_MEMORY_DEVICE
            # a fed initializer (an overridable one) holds its default until a feed replaces it
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
            s = slots.get((name, dev))
            if s is not None:  # produced there, or copied there for an earlier reader
                return s
            s = slot(name, dev)
            if src == dev:
                return s
            if name in self._feed_targets:
                self._feed_targets[name].append((dev, s))
                if name in graph.initializers:  # an overridable initializer's default, there too
                    template[s] = memory.transfer(template[slots[(name, src)]], dev, None)
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
        #: slot -> the value it holds (and its memory device when that is not the host): for ``explain``
        self.slot_names = {i: (name if dev.is_host else f"{name}@{dev}") for (name, dev), i in slots.items()}
        keep = set(self.output_slots) | set(self.feed_slots)
        self.steps = _add_frees(steps, keep, template)
        self._read_slots = {i for s in self.steps for i in s.ins}
        self._output_slot_set = set(self.output_slots)
        # The generated run function computes shape values once per input shape (runtime/session/shape_memo.py);
        # the interpreted run (under a profiler) runs every step.
        fed = set(self.feed_slots)  # an overridable initializer's default is not a constant
        memo = memo_steps(self.steps, [None if i in fed else v for i, v in enumerate(template)],
                          self.output_slots, _CPU_EP, _memo_step)
        #: the steps the generated function runs (shape values memoised per input shape)
        self.generated_steps = self.steps if memo is None else _add_frees(memo, keep, template)
        # The generated function is made at the second plain run (``generated``): the first runs
        # these steps in a loop (``_first_run``), so a plan run once never writes its source
        # (17 us for 2 steps to 1.8 ms for 800, and compiling a source new to the process as much
        # again or more), where the loop costs about a microsecond a step more than the function.
        self._generated: GeneratedRun | None = None
        self._ran = False
        if not FIRST_RUN_LOOP:
            self._generated = generate(self.generated_steps, self.output_slots, False)
        # The variant that checks RunOptions.terminate between steps is generated at the first run
        # given run options (generating costs about as much as a small model's whole creation).
        self._checked: GeneratedRun | None = None

    @property
    def generated(self) -> GeneratedRun:
        """The plan's run function (``plan_codegen.generate``), made at the first call; two threads
        may both make it: equal functions, either is kept."""
        gen = self._generated
        if gen is None:
            gen = self._generated = generate(self.generated_steps, self.output_slots, False)
        return gen

    @generated.setter
    def generated(self, value: GeneratedRun) -> None:
        self._generated = value

    # -- running ----------------------------------------------------------------------------
    def run(self, feeds: dict[str, Any], run_options: Any = None, profiler: Any = None,
            fetch: Sequence[int] | None = None, output_devices: Sequence[OrtMemoryDevice] | None = None) -> list:
        """Outputs (all, or the ``fetch`` indices) on the host, or on ``output_devices[i]``.

        The one way a plan runs from feeds by name: feeds go into their slots (copied to each
        memory device that reads them), ``_execute`` runs the steps, outputs go where the caller
        wants them. Host arrays read only on the host, with every output on the host, take none
        of the copying branches (a tiny model's whole run is a few microseconds)."""
        memory = self.memory
        if not memory.any_streams:
            return self._run(feeds, run_options, profiler, fetch, output_devices, False)
        # The outermost run's feeds are the caller's: their uploads are held until the outputs'
        # download or the run's end. A run inside it (SubgraphRunner.run) is fed values of the run.
        outermost = memory.run_begin()
        try:
            return self._run(feeds, run_options, profiler, fetch, output_devices, outermost)
        finally:
            memory.run_end()

    def _run(self, feeds: dict[str, Any], run_options: Any, profiler: Any, fetch: Sequence[int] | None,
             output_devices: Sequence[OrtMemoryDevice] | None, hold: bool) -> list:
        slots = self._template.copy()
        host = self._host_feed_slots
        for name, value in feeds.items():
            i = host.get(name)
            if i is not None and value.__class__ is np.ndarray:
                slots[i] = value  # the common case: a host array read on the host
            else:
                self._place_feed(slots, name, value, hold)
        token = ignore_fp_errors()  # NaN and inf are results, not warnings (runtime/session/fp_errors.py)
        try:
            results = self._execute(slots, run_options, profiler)
        finally:
            restore_fp_errors(token)
        if fetch is None and output_devices is None and not self.device_outputs:
            return list(results)
        return self._outputs(results, fetch, output_devices)

    def host_entry(self, names: Sequence[str], check_terminate: bool = False, copies: bool = False,
                   one_call: bool = False) -> HostEntry | None:
        """What a run of the feeds ``names`` (host arrays, in that order) needs to call the generated
        run function itself, every output returned on the host, with no profiler:
        ``InferenceSession``'s prepared run (runtime/session/run_codegen.py). Everything ``run`` and
        ``_execute`` decide per call (the slot of each feed, whether it needs copying, which run
        function, streams to end) is decided here, once. ``copies``: a plan with device memory
        too (feeds read there, outputs produced there, streams to end after each run): the entry
        then lists each feed's uploads and each output's download, found once, and the memory
        context whose run it is. Without it (or when a feed is not a graph input) such a plan gets
        None. ``check_terminate``: the run function that checks ``RunOptions.terminate`` between
        steps (a run given run options)."""
        streams = self.device_outputs or self.memory.any_streams
        host = self._host_feed_slots
        if not copies and (streams or any(n not in host for n in names)):
            return None
        if any(n not in self.feed_index for n in names):
            return None
        gen = self._checked_run() if check_terminate else self.generated

        def run_error(e: Exception, slots: list) -> Exception:
            """``_execute``'s error for ``e``, raised by ``gen`` run on ``slots``: naming the failing
            node and what it was given."""
            step, values = self._failed_step(e, gen)
            return self._wrap(e, slots, step, values)
        feed_slots = tuple(self.feed_slots[self.feed_index[n]] for n in names)
        if not streams and all(n in host for n in names):
            return HostEntry(self._template, feed_slots, gen, run_error)
        memory = self.memory
        uploads = tuple(tuple((s, memory.uploader(dev)) for dev, s in self._feed_targets[n]) for n in names)
        downloads = tuple(None if home.is_host else memory.downloader(home) for home in self.output_homes)

        def copy_error(e: Exception, name: str) -> Exception:
            """``_place_feed``'s or ``_outputs``' error for a failed upload of feed ``name`` or download
            (name ""); an ``OrtError`` is raised as it is."""
            return _transfer_error(e, f"copying input {name!r} to the memory of the EPs that read it" if name else
                                   "copying the outputs to the memory they are returned in")
        found = self._one_call(names) if one_call and not check_terminate else None
        if found is None:
            return HostEntry(self._template, feed_slots, gen, run_error, uploads, downloads, memory, copy_error)
        return HostEntry(self._template, feed_slots, gen, run_error, uploads, downloads, memory, copy_error, *found)

    def _one_call(self, names: Sequence[str]) -> tuple[Callable, tuple[int, ...], tuple[int, ...]] | None:
        """``HostEntry.one_call`` and its two index maps for feeds ``names``, or None: the plan must be
        one fused node (no copy step, no other node) whose inputs are all among the feeds and whose
        outputs are every graph output, and its compute info's ``host_runner(state)`` a runner."""
        if len(self.steps) != 1 or self.steps[0].node is None:
            return None
        node = self.steps[0].node
        found = self._compute_infos.get(id(node))
        host_runner = getattr(found[0], "host_runner", None) if found is not None else None
        if host_runner is None or node.implicit_inputs or any(i not in names for i in node.inputs) \
                or any(o not in node.outputs for o in self.output_names):
            return None
        runner = host_runner(found[1])
        if runner is None:
            return None
        return (runner, tuple(names.index(i) for i in node.inputs),
                tuple(node.outputs.index(o) for o in self.output_names))

    def run_values(self, values: Sequence[Any], run_options: Any = None) -> list:
        """``run`` with the feeds as values in ``feed_names`` order (None: not fed), every output
        on the host: a subgraph's run, called by a kernel during a run (so under that run's numpy
        error state); a Loop body runs once per iteration, and a dict per iteration costs more
        than its small nodes."""
        slots = self._template.copy()
        host_only = self._host_feeds_only
        for name, i, v in zip(self.feed_names, self.feed_slots, values):
            if v is None:
                continue
            if host_only and (v.__class__ is np.ndarray or not isinstance(v, DeviceTensor)):
                slots[i] = v
            else:
                self._place_feed(slots, name, v)
        # Under a run, RUN_OPTIONS already holds these options: not set and reset again per iteration.
        results = self._execute(slots, run_options, None, run_options is not None and _RUN_OPTIONS.get() is run_options)
        return list(results) if not self.device_outputs else self._outputs(results, None, None)

    def bind_values(self, values: Sequence[Any], varying: Sequence[tuple[int, int]],
                    run_options: Any = None) -> Callable[[Sequence[Any]], list]:
        """``run_values`` for many runs that differ only in some feeds: ``values`` (``feed_names``
        order; None where it varies) are placed once, and each call of the returned function puts
        ``args[k]`` into feed ``p`` for each ``(p, k)`` of ``varying`` (none past the end of
        ``args``, none for None) and runs. A Loop or Scan body's outer-scope values are the same at
        every iteration: placing them per iteration cost about a fifth of a small body's run."""
        def unbound(args: Sequence[Any]) -> list:
            vals = list(values)
            for p, k in varying:
                vals[p] = args[k] if k < len(args) else None
            return self.run_values(vals, run_options)

        if not self._host_feeds_only or self.device_outputs or any(
                v is not None and v.__class__ is not np.ndarray and isinstance(v, DeviceTensor) for v in values):
            return unbound
        base = self._template.copy()
        for i, v in zip(self.feed_slots, values):
            if v is not None:
                base[i] = v
        targets = [(self.feed_slots[p], k) for p, k in varying]
        options_set = run_options is not None and _RUN_OPTIONS.get() is run_options
        execute = self._execute
        ndarray = np.ndarray

        def run(args: Sequence[Any]) -> list:
            slots = base.copy()
            n = len(args)
            for i, k in targets:
                if k < n:
                    v = args[k]
                    if v is not None:
                        if v.__class__ is not ndarray and isinstance(v, DeviceTensor):
                            return unbound(args)
                        slots[i] = v
            return list(execute(slots, run_options, None, options_set))
        return run

    def feed_device(self, name: str) -> OrtMemoryDevice | None:
        """The memory other than the host's where feed ``name`` is read (the first such, when EPs on
        several devices read it); None when only the host reads it."""
        targets = self._feed_targets.get(name)
        return targets[0][0] if targets else None

    def explain(self) -> str:
        """The generated run function, each step's node, op and EP beside its line."""
        return plan_source(self.generated_steps, self.output_slots, False, names=self.slot_names)[0]

    def _place_feed(self, slots: list, name: str, value: Any, hold: bool = False) -> None:
        """A feed into its host slot and onto every other memory device that reads it, copied only
        where it is not already. ``hold``: the caller's own feed in a session run, whose uploads
        the run may hold (memory_context.py); a subgraph's feeds are values of the run (a Loop's
        carried state), which a kernel may reuse, so their uploads wait."""
        i = self.feed_index.get(name)
        if i is None:
            return
        host_slot = self.feed_slots[i]
        targets = self._feed_targets.get(name)
        if not targets and not isinstance(value, DeviceTensor):
            slots[host_slot] = value
            return
        try:
            if host_slot in self._read_slots or host_slot in self._output_slot_set:
                slots[host_slot] = self.memory.transfer(value, HOST_MEMORY_DEVICE, None)
            for dev, s in targets or ():
                slots[s] = self.memory.transfer(value, dev, None, hold)
        except OrtError:
            raise
        except Exception as e:
            raise _transfer_error(e, f"copying input {name!r} to the memory of the EPs that read it") from e

    def _execute(self, slots: list, run_options: Any, profiler: Any, options_set: bool = False) -> tuple:
        """Run the steps on ``slots``, under the caller's numpy error state; the graph outputs in
        ``output_slots`` order. The generated function runs; the interpreted loop runs under a
        profiler (it times each step). Errors name the failing node. ``options_set``: RUN_OPTIONS
        already holds ``run_options`` (a subgraph's run inside the run that set them)."""
        token = _RUN_OPTIONS.set(run_options) if run_options is not None and not options_set else None
        try:
            if profiler is not None:
                return self._interpret(slots, run_options, profiler)
            if run_options is None:
                gen = self._generated
                if gen is None:
                    if not self._ran:  # the plan's first plain run: the steps in a loop
                        self._ran = True
                        return self._first_run(slots)
                    gen = self.generated
            else:
                gen = self._checked_run()
            try:
                return gen.fn(slots, gen.fns, run_options)
            except Terminated:
                raise
            except Exception as e:
                step, values = self._failed_step(e, gen)
                raise self._wrap(e, slots, step, values) from e
        finally:
            if token is not None:
                _RUN_OPTIONS.reset(token)
            if self.memory.any_streams:
                self.memory.end_of_run()

    def _outputs(self, results: Sequence[Any], fetch: Sequence[int] | None,
                 output_devices: Sequence[OrtMemoryDevice] | None) -> list:
        idx = range(len(self.output_slots)) if fetch is None else fetch
        if not self.device_outputs and output_devices is None:
            return [results[i] for i in idx]
        transfer = self.memory.transfer
        try:
            moved = [transfer(results[i], output_devices[i] if output_devices is not None else HOST_MEMORY_DEVICE, None)
                     for i in idx]
            if any(isinstance(r, DeviceTensor) for r in moved):
                # As ORT's Run: the outputs are complete when run() returns, also those left on a device
                # (copies to the host already waited; device-resident ones need the streams drained).
                self.memory.synchronize()
        except OrtError:
            raise
        except Exception as e:
            raise _transfer_error(e, "copying the outputs to the memory they are returned in") from e
        return moved

    def _interpret(self, slots: list, run_options: Any, profiler: Any) -> tuple:
        """The steps one by one, each timed: the reference the generated function is checked
        against (tests/test_plan_codegen.py)."""
        for step in self.steps:
            if run_options is not None and run_options.terminate:
                raise Terminated("Exiting due to terminate flag being set to true: RunOptions.terminate was set "
                                 "during or before this run. Clear it (run_options.terminate = False) to run again.")
            t0 = time.perf_counter_ns()
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
        return tuple(slots[i] for i in self.output_slots)

    def _first_run(self, slots: list) -> tuple:
        """The generated function's steps (``generated_steps``, shape values through their memos)
        run one by one, as the generated function runs them: a kernel's ``inline_fn`` with its
        inputs as arguments (a non-array result made an array), else its ``compute`` with the
        input list; slots released after their last reader. Errors name the failing step as
        ``_execute``'s do."""
        ndarray, asarray = np.ndarray, np.asarray
        for st in self.generated_steps:
            args = [slots[i] for i in st.ins]
            inline = st.inline_fn
            try:
                if inline is not None:
                    r = inline(*args)
                    slots[st.outs[0]] = r if r.__class__ is ndarray else asarray(r)
                else:
                    res = st.fn(args)
                    outs = st.outs
                    if len(outs) == 1:
                        slots[outs[0]] = res[0]
                    else:
                        for j, o in enumerate(outs):
                            slots[o] = res[j] if len(res) > j else None
            except Terminated:
                raise
            except Exception as e:
                failed = getattr(e, "onnxhal_failed_step", None)  # raised inside a shape memo
                step, values = failed if failed is not None else (st, args)
                raise self._wrap(e, slots, step, values) from e
            for f in st.frees:
                slots[f] = None
        return tuple(slots[i] for i in self.output_slots)

    def _checked_run(self) -> GeneratedRun:
        """The generated run function that honours RunOptions.terminate between steps."""
        checked = self._checked
        if checked is None:  # two threads may both generate it: equal functions, either is kept
            checked = self._checked = generate(self.generated_steps, self.output_slots, True)
        return checked

    def _failed_step(self, e: BaseException, gen: GeneratedRun) -> tuple[Step | None, list | None]:
        """The step whose line of the generated run function raised, and the values it was given
        (the run function's locals: intermediate values live there, not in ``slots``)."""
        failed = getattr(e, "onnxhal_failed_step", None)  # raised inside a shape memo
        if failed is not None:
            return failed
        tb = e.__traceback__
        step = values = None
        while tb is not None:
            if tb.tb_frame.f_code is gen.fn.__code__:
                step = gen.line_to_step.get(tb.tb_lineno)
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
