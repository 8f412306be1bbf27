"""Partitions with symbolic dimensions: specialised per concrete input signature at run time.

The OpenCL lowering sizes every buffer and launch from static shapes. A partition whose values have
symbolic dimensions (``batch``, ``sequence``, as exporters write them) is therefore compiled into a
``DynamicNodeComputeInfo``: on a run whose signature (input shapes and dtypes, and the values of
parameters fed at run time, such as a Reshape shape computed by the CPU EP) it has not seen, it

1. runs the partition once on the host with the CPU EP's kernels, which gives every intermediate
   value's concrete shape (no shape inference to trust) and the parameters' values,
2. writes a static copy of the partition (parameters as constants), checks every node again on
   the concrete shapes (``op_support``), and builds its plan and programs (programs are cached by
   source, so a new shape mostly reuses built kernels),
3. keeps it in a bounded LRU cache (``MAX_SIGNATURES``), as onnxruntime's GPU EPs keep per-shape
   state; a signature whose plan cannot be built (a check that fails only for those shapes) runs on
   the host for as long as it stays cached, with the reason recorded,
4. with the cost rule on (the OpenCL EP's own partitions), weighs the concrete signature: where
   the host run of step 1 took less than a few times the plan's launches at the measured launch
   cost (``cost_rule.host_worth_trying``), the signature's first runs alternate between the host
   and the device, timed (``cost_rule.SignatureTrial``), and it then stays where it ran faster
   (counted apart from build failures). Both paths compute the same results, so a trial changes
   only where the time goes; it settles once per signature and holds while the signature is
   cached, so a signature near the line does not flap.

   A signature whose host runs at specialisation all missed the line by less than
   ``SECOND_LOOK_FACTOR`` runs on the device untried, but not for good: those runs are the host
   plan's first, which pay its ramp and, on a loaded machine, its descheduling (resnet_ts at load
   6: its fastest of four 1133 us against the 780 us line and 105-150 steady, in one start of
   five). After ``SECOND_LOOK_RUNS`` device runs one run goes to the host, timed; under the line
   the signature's trial starts there, else it waits for the next look (``_second_look``).

   Each side is timed as the session would run it settled there (``whole_session_settles``): the
   session's only partition settled on the host has its feeds run on the session's CPU-only plan
   (runtime/session/host_settled.py), with no copy, so its host side is its host plan alone and its
   device side its run with the session's copies (the uploads of its inputs, the downloads of its
   outputs; resnet_ts: host 267 us with the copies against 256 on the device, 150 without them). A
   partition among others may settle on the host while they stay on the device, its copies kept
   around it by the session's plan: there its host side is timed with those copies, the device side
   without the session's, which the two sides then share.

Hits, misses, evictions, host runs (build failures and the cost rule's apart) and build seconds are
in ``stats`` and in the profiling trace.
An EP that saves compiled partitions (EPContext) saves such a partition as a ``DynamicPartitionPlan``:
its graph, from which the specialisations are made again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import pyopencl as cl

from onnxhal.hal.ep import KernelContext, NodeComputeInfo
from onnxhal.hal.graph import Graph, Node, ValueInfo
from onnxhal.hal.host_execution import host_plan
from onnxhal.hal.run_control import RUN_OPTIONS  # the host plan reads the terminate flag between nodes
from onnxhal.hal.settled_host import note as note_settled
from onnxhal.hal.settled_host import whole_session_settles
from onnxhal.hal.tensor import DeviceTensor
from onnxhal.runtime.providers.opencl.cost_rule import HOST_TIMING_FACTOR, SignatureTrial, host_worth_trying
from onnxhal.runtime.providers.opencl.native_replay import replay_module
from onnxhal.runtime.providers.opencl.op_support import (
    INSPECTION_ERRORS,
    PARAM_INPUTS,
    GraphLookup,
    decline_reason,
    unsupported_reason,
)
from onnxhal.runtime.providers.opencl.partition_plan import PartitionState
from onnxhal.runtime.providers.opencl.plan_builder import build_plan
from onnxhal.runtime.providers.opencl.shape_values import (
    metadata_inputs,
    shape_value_nodes,
    shape_values,
    small_int,
    value_inputs,
)

MAX_SIGNATURES = 8
#: Warm host runs a new signature's trial may time after its first (``_trial``): the first follows a
#: first run within ``COLD_RUN_FACTOR`` of the line (it costs about what that first run cost), the
#: others a run within 10x; once per signature.
WARM_HOST_RUNS = 3
COLD_RUN_FACTOR = 100.0
#: An untried signature whose fastest host run missed the line by less than this gets second looks.
SECOND_LOOK_FACTOR = 10.0
#: Device runs of an untried signature before each second look at its host side (one host run each).
SECOND_LOOK_RUNS = (8, 64)


def is_dynamic(graph: Graph) -> bool:
    """Whether any value of the partition lacks a static shape."""
    names = {*graph.input_names, *graph.output_names, *(o for n in graph.nodes for o in n.outputs if o)}
    return any(not graph.value_info(name).has_static_shape for name in names)


def partition_shape_values(graph: Graph, tensors: bool = False, data: frozenset[str] = frozenset()) -> frozenset[str]:
    """The shape values (rule ``shape_values``) partition ``graph`` computes: from shapes, constants
    and its small integer inputs (shape values computed outside, which join the signature);
    ``tensors``: with the larger values computed from them (rule ``shape_tensors``). ``data``: inputs
    the claim found computed from the feeds (rule ``typed_values``: an ``attention_mask`` of fixed
    shape [2, 12] is as small as a shape value), never keys of a signature."""
    lookup = GraphLookup(graph, {}, {}, {}, allow_dynamic=True)
    inputs = set(graph.input_names) - data
    return shape_values(graph, lookup, lambda name: name in inputs and small_int(lookup, name), tensors)


def specialised(graph: Graph, disabled_fusions: frozenset[str], data: frozenset[str] = frozenset()) -> bool:
    """Whether partition ``graph`` is specialised per input signature (``DynamicNodeComputeInfo``):
    it has symbolic dimensions, or shape values to compute when rule ``shape_values`` is on
    (``data``: as ``partition_shape_values``)."""
    if is_dynamic(graph):
        return True
    rules = shape_value_rules(disabled_fusions)
    return rules[0] and bool(partition_shape_values(graph, rules[1], data))


def shape_value_rules(disabled_fusions: frozenset[str]) -> tuple[bool, bool]:
    """Whether rules ``shape_values`` and ``shape_tensors`` (which extends it) are on."""
    values = "shape_values" not in disabled_fusions
    return values, values and "shape_tensors" not in disabled_fusions


def host_edges(graph: Graph, values: frozenset[str]) -> tuple[frozenset[int], frozenset[int], frozenset[int]]:
    """For a partition specialised per signature whose shape values are ``values``: the indices of
    its inputs handed over in host memory (parameters, ``runtime_params``, and the index inputs of
    its Gathers, ``gather_index_inputs``), of its inputs read only for their shape
    (``metadata_inputs``), and of its outputs that are shape values."""
    nodes = shape_value_nodes(graph, values)
    host = {*runtime_params(graph, value_inputs(graph, nodes)), *gather_index_inputs(graph)}
    metadata = metadata_inputs(graph, nodes)
    return (frozenset(host), frozenset(i for i, name in enumerate(graph.input_names) if name in metadata),
            frozenset(i for i, name in enumerate(graph.output_names) if name in values))


def runtime_params(graph: Graph, read_by_shape_values: frozenset[str] = frozenset(),
                   shape_derived: frozenset[str] = frozenset()) -> list[int]:
    """Indices of the partition's inputs that are parameters (shapes, axes, bounds), read by its
    shape values (``read_by_shape_values``), or Gather indices computed from shapes and constants
    alone (``shape_derived``, ``shape_values.shape_derived`` of the whole graph): they come in host
    memory and their values are part of the signature, since each specialisation has them as
    constants.

    Other Gather indices are data: a token-id input such as ``input_ids`` [2, 12] is small enough
    to look like a parameter, but keying on it would specialise the partition again for every new
    token sequence (a host run and a plan build per run, the LRU evicting the shapes it holds).
    The plan uploads those at each run instead (``plan_builder``'s ``host_indices``)."""
    params: set[str] = set(read_by_shape_values)
    for n in graph.nodes:
        for k in PARAM_INPUTS.get(n.op_type, ()):
            if k < len(n.inputs) and n.inputs[k] and (
                    n.op_type != "Gather" or n.domain or n.inputs[k] in shape_derived):
                params.add(n.inputs[k])
    return [i for i, name in enumerate(graph.input_names) if name in params]


def gather_index_inputs(graph: Graph) -> list[int]:
    """Indices of the partition's inputs that its Gathers read as indices: handed over in host
    memory, where the plan reads them to check their range before uploading them."""
    indices = {n.inputs[1] for n in graph.nodes if n.op_type == "Gather" and not n.domain and len(n.inputs) > 1}
    return [i for i, name in enumerate(graph.input_names) if name in indices]


@dataclass
class SpecializationStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    host_runs: int = 0  # runs of signatures whose plan could not be built
    cost_host_runs: int = 0  # runs of signatures the cost rule sent to the host
    build_seconds: float = 0.0
    host_reasons: dict[str, str] = field(default_factory=dict)  # signature text -> why it runs on the host
    #: signature text -> where the cost rule's trial settled it and its figures, either side (cached ones)
    trials: dict[str, str] = field(default_factory=dict)

    def as_args(self, cached: int) -> dict:
        return {"shape_cache_hits": self.hits, "shape_cache_misses": self.misses,
                "shape_cache_evictions": self.evictions, "shape_signatures_cached": cached,
                "shape_host_runs": self.host_runs, "shape_cost_host_runs": self.cost_host_runs,
                "shape_build_ms": round(self.build_seconds * 1e3, 3)}


@dataclass
class _Entry:
    state: PartitionState | None  # None: this signature runs on the host
    feeds: list[int]  # which of the partition's inputs the plan takes, in its order
    reason: str = ""
    by_cost: bool = False  # on the host by the cost rule (else: its plan could not be built)
    tried: bool = False  # its cost rule trial settled it, on either side
    untried: str = ""  # why the cost rule did not try it (its host run's figures), where it did not
    #: device runs left before its next second look (0: none due); ``looks``: second looks taken
    second_look_in: int = 0
    looks: int = 0
    #: its first runs, timed on both sides, while the cost rule tries it (None: settled or untried)
    trial: SignatureTrial | None = None
    #: its plan's state after its trial sent it to the host: released with the entry, when no run uses it
    retired: PartitionState | None = None
    signature: str = ""  # as stats.host_reasons names it
    #: output index -> its value, for the outputs that are shape values (handed over in host memory)
    host_values: dict[int, np.ndarray] = field(default_factory=dict)
    #: while its trial runs: its inputs in host memory at specialisation, which a device run timed as the
    #: session's only partition uploads again, as the session's copies (their values do not matter)
    trial_inputs: list = field(default_factory=list)

    def release(self) -> None:
        for state in (self.state, self.retired):
            if state is not None:
                state.release()


@dataclass
class DynamicPartitionPlan:
    """What a saved (EPContext) partition with symbolic dimensions holds: its graph as ONNX (weights
    as compiled), its opsets and the signature cache's size. Loading it gives a
    ``DynamicNodeComputeInfo`` that specialises each signature again, as the first compile did."""

    graph: np.ndarray  # serialized onnx.GraphProto as uint8
    opset: dict
    max_signatures: int
    #: its inputs computed from shapes and constants alone (``DynamicNodeComputeInfo.shape_derived``),
    #: which the whole graph the blob no longer holds told; a blob without them uploads every index
    shape_derived: list = field(default_factory=list)

    @classmethod
    def of(cls, info: DynamicNodeComputeInfo) -> DynamicPartitionPlan:
        data = info.graph.to_proto().SerializeToString()
        return cls(np.frombuffer(data, dtype=np.uint8).copy(), dict(info.graph.opset), info.max_signatures,
                   sorted(info.shape_derived))

    def compute_info(self, device: Any, allocator: Any, logger: logging.Logger) -> DynamicNodeComputeInfo:
        graph = Graph.from_proto(onnx.GraphProto.FromString(self.graph.tobytes()), self.opset)
        return DynamicNodeComputeInfo(graph, device, allocator, logger, int(self.max_signatures),
                                      shape_derived=frozenset(self.shape_derived))


class DynamicNodeComputeInfo(NodeComputeInfo):
    """A partition with symbolic dimensions on one OpenCL device (see the module docstring)."""

    def __init__(self, graph: Graph, device: Any, allocator: Any, logger: logging.Logger,
                 max_signatures: int = MAX_SIGNATURES, disabled_fusions: frozenset[str] = frozenset(),
                 shape_only: frozenset[str] = frozenset(), shape_derived: frozenset[str] = frozenset(),
                 data_inputs: frozenset[str] = frozenset(), cost_rule: bool = False) -> None:
        self.graph = graph
        #: Try small signatures on the host and the device (cost_rule.SignatureTrial); off for the
        #: simulated devices, whose profiles decide, and for cost_rule=off.
        self.cost_rule = cost_rule
        #: each run tells the session whether it ran on the host settled there (hal/settled_host.py):
        #: with the cost rule only, the one way a signature settles on the host
        self.settles_on_host = cost_rule
        self.disabled_fusions = disabled_fusions
        #: outputs read outside only for their shape (plan_builder.shape_only_outputs)
        self.shape_only = shape_only
        self.device = device
        self.allocator = allocator
        self.logger = logger
        self.max_signatures = max_signatures
        #: values computed on the host at each specialisation, constants of its plan (rule shape_values)
        values_rule, tensors_rule = shape_value_rules(disabled_fusions)
        self.shape_values = partition_shape_values(graph, tensors_rule, data_inputs) if values_rule else frozenset()
        self._shape_nodes = shape_value_nodes(graph, self.shape_values)
        #: inputs computed from shapes and constants alone: Gather indices among them key the signature
        self.shape_derived = shape_derived
        self.params = runtime_params(graph, value_inputs(graph, self._shape_nodes), shape_derived)
        # Parameters come in host memory; inputs only a Shape or Size reads are handed over wherever
        # they live, uncopied; outputs that are shape values (constants of each specialisation) leave
        # in host memory.
        self.host_inputs, self.metadata_inputs, self.host_outputs = host_edges(graph, self.shape_values)
        self.stats = SpecializationStats()
        #: Called on each shape's plan before its state is made (a simulated fp16 device rounds weights).
        self.prepare_plan: Callable[[Any], None] | None = None
        self._cache: OrderedDict[tuple, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        # One host plan returning every value: its shapes specialise a signature, and its outputs
        # are the partition's when a signature runs on the host.
        every = list(dict.fromkeys(o for n in graph.nodes for o in n.outputs if o))
        self._host_plan = host_plan(graph, every, logger)
        self._output_at = [every.index(o) for o in graph.output_names]

    @property
    def cached_signatures(self) -> int:
        """How many shape signatures have a specialised plan in the cache now."""
        return len(self._cache)

    @property
    def cached_plans(self) -> list:
        """The specialised plans (``PartitionPlan``) in the cache now, least recently used first."""
        with self._lock:
            return [e.state.plan for e in self._cache.values() if e.state is not None]

    @property
    def weight_bytes(self) -> int:
        """The partition's constant weights (what a simulated device charges against its capacity)."""
        return sum(int(np.asarray(a).nbytes) for a in self.graph.initializers.values())

    # -- NodeComputeInfo -------------------------------------------------------------------------
    def create_state(self, fused_node: Node) -> DynamicNodeComputeInfo:
        return self

    def host_runner(self, state: Any) -> Callable[[Sequence[Any]], list | None] | None:
        """``run_host`` for the session's prepared run (``HostEntry.one_call``), where the native replay
        is on (each specialisation's ``PartitionState.run_host`` needs it); else None."""
        return self.run_host if replay_module() is not None else None

    def run_host(self, inputs: Sequence[Any]) -> list | None:
        """A run from host arrays to host arrays by the cached specialisation's one native call
        (``PartitionState.run_host``); None, before anything is enqueued, where ``compute`` must take
        it: a signature not cached (new shapes, or a parameter whose value changed), one on the host
        or under its cost rule trial, or inputs its state declines. Outputs that are shape values
        are copies of the specialisation's, so no caller shares them."""
        sig = self.signature(inputs)
        with self._lock:
            entry = self._cache.get(sig)
            if entry is None or entry.state is None or entry.trial is not None or entry.second_look_in == 1:
                return None  # (a second look due: ``compute`` takes it)
            self._cache.move_to_end(sig)
        outputs = entry.state.run_host([inputs[i] for i in entry.feeds])
        if outputs is None:
            return None  # (``compute`` takes it and counts it toward a second look)
        with self._lock:
            self.stats.hits += 1
            if entry.second_look_in > 1:  # a device run done: one fewer before the second look
                entry.second_look_in -= 1
        for i in sorted(entry.host_values):
            outputs.insert(i, entry.host_values[i].copy())
        if self.settles_on_host:
            note_settled(False, entry.tried)
        return outputs

    def release_state(self, state: Any) -> None:
        with self._lock:
            entries = list(self._cache.values())
            self._cache.clear()
        for e in entries:
            e.release()

    def compute(self, state: Any, context: KernelContext) -> list:
        stream = context.stream
        queue = stream.handle() if stream is not None else None
        own_queue = not self.device.in_context(queue)
        if own_queue:
            queue = self.device.queue
        inputs = list(context.inputs)
        entry = self._entry(inputs, queue)
        if entry.second_look_in and self._look_due(entry):
            outputs = self._second_look(entry, inputs, queue)
            for i, t in enumerate(outputs):
                context.set_output(i, t)
            return outputs
        side = None
        if entry.trial is not None:
            with self._lock:
                side = entry.trial.next_side() if entry.trial is not None else None
        # a trial run times what the session would run settled on that side (the module's docstring)
        alone = side is not None and whole_session_settles()
        start = time.perf_counter()
        state = entry.state
        held: Sequence = ()  # a trial's uploads, alive until the queue finished them
        if state is None or side == "host":
            with self._lock:
                if entry.by_cost or side == "host":
                    self.stats.cost_host_runs += 1
                else:
                    self.stats.host_runs += 1
            outputs, copies_s = self._run_on_host(inputs, queue, alone)
            start += copies_s  # the copies a settled run would not make, not timed
            if self.settles_on_host:
                note_settled(entry.by_cost and side is None, entry.tried)
        else:
            if self.settles_on_host:
                note_settled(False, entry.tried and side is None)
            held = self._session_uploads(entry, inputs, queue) if alone else ()
            outputs = state.run([inputs[i] for i in entry.feeds], queue)
            if entry.host_values:
                for i in sorted(entry.host_values):
                    outputs.insert(i, entry.host_values[i])
            if alone:
                self._session_downloads(outputs, queue)
        if own_queue or side == "device":  # a trial times the device run to its end
            queue.finish()
        del held
        if side is not None:
            self._try(entry, side, time.perf_counter() - start, alone)
        for i, t in enumerate(outputs):
            context.set_output(i, t)
        return outputs

    def _look_due(self, entry: _Entry) -> bool:
        """Counts one device run of an untried signature; whether its second look is due now."""
        with self._lock:
            if entry.second_look_in == 0 or entry.state is None or entry.trial is not None:
                return False
            entry.second_look_in -= 1
            return entry.second_look_in == 0

    def _second_look(self, entry: _Entry, inputs: list, queue: cl.CommandQueue) -> list:
        """One run of an untried signature on the host plan, timed without its copies (as at
        specialisation): under the line (``host_worth_trying``) its trial starts with the next run,
        else it stays untried until its next look (``SECOND_LOOK_RUNS``). Returns the run's outputs."""
        start = time.perf_counter()
        host = [_to_host(t, queue) for t in inputs]
        copies_s = time.perf_counter() - start
        outputs, out_copies_s = self._run_on_host(host, queue, alone=True)
        host_s = time.perf_counter() - start - copies_s - out_copies_s
        if self.settles_on_host:
            note_settled(False, entry.tried)  # a run of a signature not settled on the host
        launches, launch_s = entry.state.plan.launches_per_run, self.device.launch_costs().launch_s
        with self._lock:
            self.stats.cost_host_runs += 1
            entry.looks += 1
            if entry.trial is not None or entry.state is None:
                return outputs
            if host_worth_trying(host_s, launches, launch_s):
                entry.trial, entry.trial_inputs, entry.untried = SignatureTrial(), host, ""
                self.stats.trials.pop(entry.signature, None)  # (its trial's figures come when it settles)
            else:
                entry.untried = _untried_text(host_s, launches, launch_s, entry.looks)
                self.stats.trials[entry.signature] = entry.untried
                entry.second_look_in = (SECOND_LOOK_RUNS[entry.looks] if entry.looks < len(SECOND_LOOK_RUNS) else 0)
        return outputs

    def _session_uploads(self, entry: _Entry, inputs: list, queue: cl.CommandQueue) -> list:
        """A trial's device run as the session's only partition: the session's uploads of the inputs
        it hands over in device memory, made again into scratch buffers on the run's queue (the
        session made them before this run, untimed; a settled host run makes none). Returns what
        must stay alive until the queue has run them."""
        held = []
        for i in entry.feeds:
            if isinstance(inputs[i], DeviceTensor) and i < len(entry.trial_inputs):
                a = np.ascontiguousarray(entry.trial_inputs[i])
                if a.nbytes:
                    t = DeviceTensor.allocate(a.shape, a.dtype, self.allocator)
                    cl.enqueue_copy(queue, t.buffer, a, is_blocking=False)
                    held.append((t, a))
        return held

    def _session_downloads(self, outputs: list, queue: cl.CommandQueue) -> None:
        """A trial's device run as the session's only partition: the session's downloads of its
        outputs read as data (not those read only for their shape, ``shape_only``), made here too."""
        for name, t in zip(self.graph.output_names, outputs):
            if name not in self.shape_only:
                _to_host(t, queue)

    def _try(self, entry: _Entry, side: str, seconds: float, alone: bool) -> None:
        """Record one trial run of ``entry``'s signature; once its trial settles, the signature stays
        on the device or goes to the host (its state kept until the entry goes: a run on another
        thread may be using it). ``alone``: timed as the session's only partition."""
        with self._lock:
            trial = entry.trial
            if trial is None or entry.state is None:
                return
            trial.record(side, seconds, alone)
            if not trial.settled:
                return
            entry.trial, entry.tried = None, True
            entry.trial_inputs = []
            reason = trial.reason(entry.state.plan.launches_per_run)
            self.stats.trials[entry.signature] = trial.figures(entry.state.plan.launches_per_run)
            if reason is None:
                return
            entry.retired, entry.state = entry.state, None
            entry.reason, entry.by_cost = reason, True
            self.stats.host_reasons[entry.signature] = reason
        self.logger.info("OpenCL partition %s runs a shape signature on the host: %s", self.graph.name, reason)

    # -- signatures ------------------------------------------------------------------------------
    def signature(self, inputs: Sequence[Any], queue: cl.CommandQueue | None = None) -> tuple:
        """Input shapes and dtypes, and the parameters' values: read from device memory when they are
        there, since a device tensor object says nothing of its contents (a bound input updated in
        place, or a new tensor at a recycled address, is the same object or the same id)."""
        # np.dtype objects hash and compare as their names do, so no str() per input is needed
        sig: list = [(tuple(getattr(t, "shape", ())), getattr(t, "dtype", None)) for t in inputs]
        for i in self.params:
            value = np.ascontiguousarray(_to_host(inputs[i], queue if queue is not None else self.device.queue))
            if value.dtype == object:
                raise TypeError(f"partition {self.graph.name!r}: parameter input {self.graph.input_names[i]!r} is a "
                                f"{type(inputs[i]).__name__}, not a tensor")
            sig.append(value.dtype.str.encode() + b":" + value.tobytes())
        return tuple(sig)

    def _entry(self, inputs: list, queue: cl.CommandQueue) -> _Entry:
        sig = self.signature(inputs, queue)
        with self._lock:
            entry = self._cache.get(sig)
            if entry is not None:
                self._cache.move_to_end(sig)
                self.stats.hits += 1
                return entry
            self.stats.misses += 1
        start = time.perf_counter()
        entry = self._specialize(inputs, queue)
        entry.signature = _describe(sig)
        evicted = []
        with self._lock:
            self.stats.build_seconds += time.perf_counter() - start
            first = self._cache.get(sig)
            if first is not None:
                # another thread specialised the signature meanwhile: its entry stays, so that the
                # signature has one trial and one decision (a second entry replacing it split the
                # trial's runs and left the first's reason on an uncached entry)
                self._cache.move_to_end(sig)
                evicted.append(entry)
                entry = first
            else:
                if entry.reason:
                    self.stats.host_reasons[_describe(sig)] = entry.reason
                if entry.untried:
                    self.stats.trials[entry.signature] = entry.untried
                self._cache[sig] = entry
            while len(self._cache) > self.max_signatures:
                evicted.append(self._cache.popitem(last=False)[1])
                self.stats.trials.pop(evicted[-1].signature, None)  # (figures of the cached signatures only)
                self.stats.evictions += 1
        for e in evicted:
            e.release()
        return entry

    def _specialize(self, inputs: list, queue: cl.CommandQueue) -> _Entry:
        host = [_to_host(t, queue) for t in inputs]
        start = time.perf_counter()
        values = self._host_plan.run(dict(zip(self.graph.input_names, host)), RUN_OPTIONS.get())
        host_s = time.perf_counter() - start
        every = self._host_plan.graph.output_names
        concrete = self._static_copy(host, dict(zip(every, values)))
        # (the claim judged which typed nodes read the feeds; here their shape values are constants)
        lookup = GraphLookup(concrete, {}, {}, {}, typed="typed_values" not in self.disabled_fusions,
                             typed_roots=False)
        for n in concrete.nodes:
            try:
                reason = unsupported_reason(n, lookup)
            except INSPECTION_ERRORS as exc:
                reason = f"cannot inspect {n.op_type}: {decline_reason(exc, self.logger, f'inspecting {n.op_type} {n.name!r}')}"
            if reason:
                return self._on_host(f"{n.op_type} {n.name!r}: {reason}")
        try:
            plan = build_plan(concrete, lookup, self.disabled_fusions, self.shape_only)
            if self.prepare_plan is not None:
                self.prepare_plan(plan)
            state = PartitionState(plan, self.device, self.allocator)
        except INSPECTION_ERRORS as exc:
            return self._on_host(decline_reason(exc, self.logger, f"lowering partition {self.graph.name!r}"))
        order = {name: i for i, name in enumerate(self.graph.input_names)}
        names = self.graph.output_names
        host_values = {i: np.asarray(concrete.initializers[names[i]]) for i in self.host_outputs}
        trial = self._trial(host, host_s, plan.launches_per_run) if self.cost_rule else None
        if isinstance(trial, tuple):
            untried, look = trial
            return _Entry(state, [order[name] for name in plan.input_names], host_values=host_values, untried=untried,
                          second_look_in=SECOND_LOOK_RUNS[0] if look else 0)
        return _Entry(state, [order[name] for name in plan.input_names], host_values=host_values, trial=trial,
                      trial_inputs=host if trial is not None else [])

    def _trial(self, host: list, host_s: float, launches: int) -> SignatureTrial | tuple[str, bool]:
        """A trial for a signature whose first host run took ``host_s``, if the host may win it, else
        why not (its figures, for ``stats.trials``) and whether it gets second looks (its fastest
        host run missed the line by less than ``SECOND_LOOK_FACTOR``). The
        first runs pay one-time costs (the CPU EP packs weights, the new shapes' buffers, a loaded
        machine deschedules it) and ramp down over several runs (resnet_ts at 2 images: 1000-1640,
        then 600-1600, against 115-170 us steady; at load 8, the first over 10x the line), so a first
        run that missed by less than ``COLD_RUN_FACTOR`` is followed by a warm one, and that by others
        while the last missed by less than 10x, up to ``WARM_HOST_RUNS`` in all, until one is worth a
        trial. An untried signature's figures go to ``stats.trials`` too."""
        launch_s = self.device.launch_costs().launch_s
        last, factor = host_s, COLD_RUN_FACTOR
        for _ in range(WARM_HOST_RUNS):
            if host_worth_trying(host_s, launches, launch_s) or not host_worth_trying(last / factor, launches, launch_s):
                break
            start = time.perf_counter()
            self._host_plan.run(dict(zip(self.graph.input_names, host)), RUN_OPTIONS.get())
            last, factor = time.perf_counter() - start, 10.0
            host_s = min(host_s, last)
        if host_worth_trying(host_s, launches, launch_s):
            return SignatureTrial()
        return (_untried_text(host_s, launches, launch_s, 0),
                host_worth_trying(host_s / SECOND_LOOK_FACTOR, launches, launch_s))

    def _on_host(self, reason: str) -> _Entry:
        self.logger.info("OpenCL partition %s runs a shape signature on the host: %s", self.graph.name, reason)
        return _Entry(None, [], reason)

    def _static_copy(self, host_inputs: list, values: dict[str, Any]) -> Graph:
        """The partition with every value's concrete shape, the run-time parameters and the shape
        values (their nodes dropped) as constants; inputs nothing reads any more are dropped."""
        g = self.graph
        params = {g.input_names[i]: np.asarray(host_inputs[i]) for i in self.params}
        params.update((name, np.asarray(values[name])) for name in self.shape_values)
        known = {name: np.asarray(v) for name, v in zip(g.input_names, host_inputs)}
        known.update((k, np.asarray(v)) for k, v in values.items())

        # Types kept parsed, no TypeProto made (one is built only if something asks for it): each
        # protobuf message freed counts towards protobuf's periodic malloc_trim (docs/opencl.md,
        # "Dynamic shapes"), and gpt2_ts made 70-90 at its first run.
        infos = {name: ValueInfo.of_array(name, a) for name, a in known.items()}
        folded = {id(n) for n in self._shape_nodes}
        nodes = [n for n in g.nodes if id(n) not in folded]
        read = {i for n in nodes for i in (*n.inputs, *n.implicit_inputs) if i} | set(g.output_names)
        inputs = [infos[n] for n in g.input_names if n not in params and n in read]
        outputs = [infos[n] for n in g.output_names if n not in self.shape_values]
        out = Graph(g.name, nodes, inputs, outputs,
                    {**g.initializers, **params}, infos, g.opset, parent=g.parent)
        return out

    def _run_on_host(self, inputs: list, queue: cl.CommandQueue, alone: bool = False) -> tuple[list, float]:
        """The outputs of a run on the host plan, and the seconds its copies took where ``alone``
        (the session's only partition, whose feeds would run settled on the CPU-only plan without
        them; else 0)."""
        start = time.perf_counter()
        host = [_to_host(t, queue) for t in inputs]
        copies_s = time.perf_counter() - start if alone else 0.0
        values = self._host_plan.run(dict(zip(self.graph.input_names, host)), RUN_OPTIONS.get())
        start = time.perf_counter()
        results = [values[k] for k in self._output_at]
        outputs = []
        for i, r in enumerate(results):
            a = np.asarray(r, order="C")  # not ascontiguousarray, which makes a 0-d result 1-d
            if i in self.host_outputs:
                outputs.append(a)
                continue
            t = DeviceTensor.allocate(a.shape, a.dtype, self.allocator)
            if a.nbytes:
                cl.enqueue_copy(queue, t.buffer, a, is_blocking=True)
            outputs.append(t)
        if alone:
            copies_s += time.perf_counter() - start
        return outputs, copies_s


def _untried_text(host_s: float, launches: int, launch_s: float, looks: int) -> str:
    again = f" (at its second look {looks})" if looks else ""
    return (f"untried, on the device: its fastest host run took {host_s * 1e6:.0f} us{again}, over "
            f"{HOST_TIMING_FACTOR:g}x its {launches} launch(es) at {launch_s * 1e6:.3g} us each")


def _describe(sig: tuple) -> str:
    return ", ".join(f"{list(s[0])}" for s in sig if isinstance(s, tuple))


def _to_host(t: Any, queue: cl.CommandQueue) -> np.ndarray:
    if not isinstance(t, DeviceTensor):
        return np.asarray(t)
    out = np.empty(t.shape, t.dtype)
    if out.nbytes:
        cl.enqueue_copy(queue, out, t.buffer, src_offset=t.offset, is_blocking=True)
    return out
