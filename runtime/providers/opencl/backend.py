"""``OpenCLBackend``: what an EP running on OpenCL holds: which nodes the kernels take, one plan per
partition at compile, and the partitions with symbolic dimensions.

The OpenCL EP (``ep.py``) and the simulated devices (``onnxhal.simulators``) each hold one: a
simulated device is this backend under its profile's limits (its own ``node_reason`` and ``split``
given to ``claim``), not a subclass of the OpenCL EP.

``claim`` answers from rules (``op_support``, the loop and pool-shape checks, fused groups made
convex by the runtime); it builds nothing, so the runtime may ask twice (before and after the NHWC
layout pass) for the price of the rules. ``compile`` plans each partition once and builds its
programs; a partition whose plan or programs fail to build runs on the host inside the EP (the
symbolic-dimension partition's host path), its reason in ``declined`` and the log. Only the cost
rule (``cost_rule=on``) plans while claiming, since a partition's launches are what it weighs; its
plans are kept for compile, by the filtered graph compile receives.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import pyopencl as cl

from onnxhal.hal.ep import EpGraphSupportInfo, KernelContext, NodeComputeInfo, NodeFusionOptions
from onnxhal.hal.errors import OrtError
from onnxhal.hal.graph import Graph, Node
from onnxhal.runtime.providers.op_geometry import pool_geometry
from onnxhal.runtime.providers.opencl.claim_trial import ClaimTrial, host_crossings
from onnxhal.runtime.providers.opencl.cost_rule import (
    DEFAULT_COST_DIM,
    SizedShapes,
    claim_trial_reason,
    claim_trial_text,
    copy_seconds,
    crossing_values,
    host_island,
    host_rates,
    host_reason,
    host_seconds,
    least_launches,
    weighable,
    worth_a_trial,
)
from onnxhal.runtime.providers.opencl.device_context import OpenCLDeviceContext
from onnxhal.runtime.providers.opencl.dynamic_partition import (
    DynamicNodeComputeInfo,
    is_dynamic,
    specialised,
)
from onnxhal.runtime.providers.opencl.memory import OpenCLAllocator
from onnxhal.runtime.providers.opencl.op_support import (
    INSPECTION_ERRORS,
    VIEW_OPS,
    GraphLookup,
    decline_reason,
    unsupported_reason,
)
from onnxhal.runtime.providers.opencl.partition_plan import Launch, PartitionPlan, PartitionState
from onnxhal.runtime.providers.opencl.plan_builder import build_plan, shape_only_outputs
from onnxhal.runtime.providers.opencl.shape_values import shape_derived, shape_values, unclaim_unshared

#: The EP keeps its own copies of constant weights (uploaded once per partition state).
FUSION_OPTIONS = NodeFusionOptions(drop_constant_initializers=True)

#: ``claim``'s per-node hook: None if the node is taken, else why not ("" declines it silently).
NodeReason = Callable[[Node, Graph, GraphLookup], "str | None"]
#: ``claim``'s per-partition hook: the partitions a convex group is claimed as.
Split = Callable[[Graph, list[Node]], list[list[Node]]]


def loop_owner(graph: Graph) -> Node | None:
    """The Loop or Scan node whose body ``graph`` is, or lies within (an If inside a Loop's body
    runs at every iteration too), else None."""
    g: Graph | None = graph
    while g is not None:
        owner = g.parent_node
        if owner is not None and owner.op_type in ("Loop", "Scan"):
            return owner
        g = g.parent
    return None


class OpenCLNodeComputeInfo(NodeComputeInfo):
    """Runs one compiled partition. ``compute`` enqueues on the context's stream and returns without
    waiting; with no stream it waits, since the caller then expects finished data."""

    def __init__(self, plan: PartitionPlan, device: OpenCLDeviceContext, allocator: OpenCLAllocator) -> None:
        self.plan = plan
        self.device = device
        self.allocator = allocator
        self.host_inputs = frozenset(i for i, n in enumerate(plan.input_names) if n in plan.host_indices)

    def create_state(self, fused_node: Node) -> PartitionState:
        return PartitionState(self.plan, self.device, self.allocator)

    def compute(self, state: PartitionState, context: KernelContext) -> list:
        stream = context.stream
        queue = stream.handle() if stream is not None else None
        own_queue = not self.device.in_context(queue)
        if own_queue:
            queue = self.device.queue
        outputs = state.run(list(context.inputs), queue)
        if own_queue:
            queue.finish()
        for i, t in enumerate(outputs):
            context.set_output(i, t)
        return outputs

    def host_runner(self, state: PartitionState) -> Callable[[Sequence[Any]], list | None] | None:
        """A whole run from host arrays to host arrays (``PartitionState.run_host``, one native call) for
        the session's prepared run (``HostEntry.one_call``); None where the state replays from Python."""
        return state.run_host if state.recording is not None else None

    def release_state(self, state: PartitionState) -> None:
        state.release()


def device_int64(device: cl.Device) -> bool:
    """Whether an OpenCL device computes ``long`` (64-bit integers): a full-profile device always
    (OpenCL C 1.2, section 6.1.1), an embedded-profile one with the ``cles_khr_int64`` extension."""
    return device.profile == "FULL_PROFILE" or "cles_khr_int64" in device.extensions.split()


class OpenCLBackend:
    """The OpenCL side of one session's EP. ``device`` None: a backend that only claims (a simulated
    device whose partitions another backend computes); ``compile`` needs a device."""

    def __init__(self, name: str, device: OpenCLDeviceContext | None, allocator: OpenCLAllocator | None,
                 logger: logging.Logger, disabled_fusions: frozenset[str] = frozenset(),
                 cost_rule: bool = False, host_islands: bool = False, cost_dim: int = DEFAULT_COST_DIM) -> None:
        self.name = name  # the EP's, in log lines
        self.device = device
        self.allocator = allocator
        self.logger = logger
        #: Fusion rules (fusion_rules.py) the plans leave out.
        self.disabled_fusions = disabled_fusions
        #: Keep partitions smaller than their launches and copies on the host (cost_rule.py).
        self.cost_rule = cost_rule
        #: The size the cost rule weighs each symbolic dim at (cost_rule.DEFAULT_COST_DIM).
        self.cost_dim = cost_dim
        #: Rule host_islands (cost_rule.host_island) applies: the OpenCL EP's own partitions, whose
        #: copies are real; a simulated device's claims follow its profile alone.
        self.host_islands = host_islands and self.rule_on("host_islands")
        self.declined: dict[str, str] = {}  # node name/op -> reason (for logs and tests)
        #: The plans of the compiled partitions of static shape (tests count their launches).
        self.compiled_plans: list[PartitionPlan] = []
        self._dynamic: dict[str, DynamicNodeComputeInfo] = {}  # fused node name -> per-shape partition
        # Shapes, dtypes and constants resolved so far, shared by every graph's lookup.
        self._shapes: dict = {}
        self._dtypes: dict = {}
        self._constants: dict = {}
        # Plans the cost rule made while claiming, by the filtered graph compile will receive.
        self._planned: weakref.WeakKeyDictionary[Graph, PartitionPlan] = weakref.WeakKeyDictionary()
        # Outputs read outside only for their shape, by the filtered graph (plan_builder.shape_only_outputs).
        self._shape_only: weakref.WeakKeyDictionary[Graph, frozenset[str]] = weakref.WeakKeyDictionary()
        # Inputs computed from shapes and constants alone, by the filtered graph (shape_values.shape_derived).
        self._shape_derived: weakref.WeakKeyDictionary[Graph, frozenset[str]] = weakref.WeakKeyDictionary()
        # Inputs computed from the feeds, by the filtered graph (rule typed_values: never signature keys).
        self._data_inputs: weakref.WeakKeyDictionary[Graph, frozenset[str]] = weakref.WeakKeyDictionary()
        # Rule claim_trial's results, by the piece's node names and crossings: (reason or None, figures).
        self._trials: dict[tuple, tuple[str | None, str]] = {}
        # Its figures, by the filtered graph compile will receive.
        self._trial_texts: weakref.WeakKeyDictionary[Graph, str] = weakref.WeakKeyDictionary()
        #: Rule claim_trial's figures for the compiled partitions it timed and kept, by fused node name.
        self.cost_trials: dict[str, str] = {}

    def lookup(self, graph: Graph, allow_dynamic: bool = False) -> GraphLookup:
        """Shapes, dtypes and constants of ``graph``'s values (symbolic dims allowed or refused)."""
        return GraphLookup(graph, self._shapes, self._dtypes, self._constants, allow_dynamic,
                           typed=self.typed_values, rules_off=self.disabled_fusions)

    @property
    def typed_values(self) -> bool:
        """Rule ``typed_values`` applies: on, and the device computes 64-bit integers (OpenCL's
        ``long``: every full-profile device; an embedded-profile one only with ``cles_khr_int64``).
        Without a device (a backend that only claims for a simulated device, whose partitions the
        host backend computes) the rule follows its option alone, so both backends claim the same."""
        if not self.rule_on("typed_values"):
            return False
        return self.device is None or device_int64(self.device.device)

    def rule_on(self, name: str) -> bool:
        """Whether fusion rule ``name`` (fusion_rules.py) is on for this backend."""
        return name not in self.disabled_fusions

    def decline(self, nodes: Sequence[Node], reason: str) -> None:
        """Record why ``nodes`` are left to the next EP (``declined``)."""
        for n in nodes:
            self.declined[n.name or n.op_type] = reason

    # -- claiming ------------------------------------------------------------------------------
    def claim(self, graph: Graph, support_info: EpGraphSupportInfo, node_reason: NodeReason | None = None,
              split: Split | None = None) -> None:
        """Claim the nodes the OpenCL kernels run and ``node_reason`` allows (default: the kernels'
        rules, ``op_support.unsupported_reason``), fused into convex groups, each claimed as the
        partitions ``split`` makes of it (default: whole). Symbolic dimensions are claimable: such
        partitions are specialised per shape at run time."""
        reason_of = node_reason or (lambda n, g, lk: unsupported_reason(n, lk))
        loop = loop_owner(graph)
        if loop is not None:
            # This EP never takes Loop or Scan (nodes with subgraphs), so the loop runs on the host
            # and would copy a body partition's inputs to the device and its outputs back at every
            # iteration (skl2onnx's k-NN Scan over its samples runs hundreds of times faster with
            # the body on the CPU EP, on PoCL and on a GPU alike).
            self.decline(graph.nodes, f"in the body of {loop.op_type} node {loop.name!r}, which runs on the host: "
                         "every iteration would copy this partition's inputs to the device and its outputs back")
            return
        lookup = self.lookup(graph, allow_dynamic=True)
        tensors = self.rule_on("shape_tensors")
        if self.rule_on("shape_values"):  # rules shape_values and shape_tensors (shape_values.py)
            lookup.shape_values = shape_values(graph, lookup, tensors=tensors)
        untrusted = untrusted_shapes(graph, lookup)
        gone: set[str] = set()
        while True:
            claimed, declined = self._claimable(graph, lookup, reason_of, untrusted)
            if not lookup.shape_values:
                break
            kept = unclaim_unshared(graph, claimed, lookup.shape_values)
            still = {id(n) for n in kept}
            dropped = {o for n in claimed if id(n) not in still for o in n.outputs if o}
            if not dropped - gone:
                claimed = kept
                break
            # A shape value left to the host is an input to the partitions that read it: the values
            # are found again as each partition will find them (a small integer one joins its
            # signature, anything else is data there), and their readers judged again (rule
            # shape_tensors: a position Gather by indices the host computes is a device node).
            gone |= dropped
            lookup.shape_values = shape_values(graph, lookup, tensors=tensors, gone=frozenset(gone))
        for n, reason in declined:
            self.declined[n.name or n.op_type] = reason
            self.logger.debug("%s declines %s (%s): %s", self.name, n.name, n.op_type, reason)
        taken = {id(n) for n in claimed}
        values = lookup.shape_values
        derived = shape_derived(graph, lookup)

        def shape_value(n: Node) -> bool:
            return bool(values) and all(o in values for o in n.outputs if o)

        for group in support_info.convex_groups(claimed):
            if all(shape_value(n) for n in group):
                continue  # shape computations alone: nothing for the device to do
            if all(n.op_type in VIEW_OPS or shape_value(n) for n in group) and not _between_claimed(graph, group, taken):
                continue  # a lone view computes nothing: not worth two copies
            for piece in (split(graph, group) if split is not None else [group]):
                part = support_info.filtered_graph(piece, FUSION_OPTIONS)
                self._shape_only[part] = shape_only_outputs(graph, part)
                self._shape_derived[part] = frozenset(i for i in part.input_names if i in derived)
                if lookup.typed:
                    self._data_inputs[part] = frozenset(i for i in part.input_names if lookup.data_rooted(i))
                reason = self._cost_reason(graph, piece, part, lookup, taken) if self.cost_rule else None
                if reason is None and self.host_islands and host_island(graph, piece, taken):
                    reason = ("a piece of a host chain (rule host_islands): every input comes from the host and only "
                              "the host reads its outputs, and none of its nodes is compute-bound, so the device "
                              "would only add a copy in and out and a wait")
                if reason:
                    self.decline(piece, reason)
                    self.logger.debug("%s declines %d node(s): %s", self.name, len(piece), reason)
                    # its values now cross from the host: the pieces weighed after it count them
                    taken.difference_update(id(n) for n in piece)
                    continue
                support_info.add_nodes_to_fuse(piece, FUSION_OPTIONS)

    def _claimable(self, graph: Graph, lookup: GraphLookup, reason_of: NodeReason,
                   untrusted: set[str]) -> tuple[list[Node], list[tuple[Node, str]]]:
        """The nodes of ``graph`` the device takes by ``reason_of``, and the others with the reason."""
        claimed: list[Node] = []
        declined: list[tuple[Node, str]] = []
        for n in graph.nodes:
            try:
                reason = reason_of(n, graph, lookup)
                if reason is None and any(v in untrusted for v in (*n.inputs, *n.outputs) if v):
                    reason = "inferred shape disagrees with onnxruntime's pool output size (ceil_mode)"
            except INSPECTION_ERRORS as exc:
                reason = f"cannot inspect node: {decline_reason(exc, self.logger, f'inspecting {n.op_type} {n.name!r}')}"
            if reason is None:
                claimed.append(n)
            elif reason:  # "" means "not mine, say nothing" (e.g. a node the holder takes itself)
                declined.append((n, reason))
        return claimed, declined

    def _cost_reason(self, graph: Graph, piece: list[Node], part: Graph, lookup: GraphLookup,
                     taken: set[int]) -> str | None:
        """The cost rule's reason to leave ``piece`` (as the filtered graph ``part``) to the host, or
        None. A static piece is planned (compile takes that plan) for its launches; one with
        symbolic dimensions is weighed with each at ``cost_dim`` and the launches it needs at least
        (``least_launches``: its plans are made per shape at run time). A piece with a value of
        unknown rank has no work to weigh and is claimed."""
        if self.device is None:
            return None
        dynamic = is_dynamic(part)
        dim = self.cost_dim if dynamic else None
        sizes = SizedShapes(lookup, dim) if dim is not None else lookup
        if dynamic and not weighable(piece, sizes):
            return None
        plan = None
        if dynamic:
            launches = least_launches(piece, lookup.shape_values)
        else:
            try:
                plan = self._planned[part] = self.plan(part)
            except INSPECTION_ERRORS:
                return None  # compile meets the same failure and says why
            launches = plan.launches_per_run
        costs = self.device.launch_costs()
        rates = host_rates()
        moving = crossing_values(graph, piece, taken)
        work_s, moved_s = host_seconds(piece, sizes, rates), copy_seconds(moving, sizes, rates)
        reason = host_reason(work_s, launches, len(moving), costs.launch_s, costs.copy_s, moved_s, dim)
        if (reason is None and plan is not None and self.rule_on("claim_trial")
                and worth_a_trial(work_s, launches, len(moving), costs.launch_s, costs.copy_s, moved_s)):
            reason = self._trial_reason(graph, piece, part, lookup, taken, plan, moving)
        return reason

    def _trial_reason(self, graph: Graph, piece: list[Node], part: Graph, lookup: GraphLookup, taken: set[int],
                      plan: PartitionPlan, moving: list[str]) -> str | None:
        """Rule ``claim_trial``: time static ``piece`` on both sides (``claim_trial.ClaimTrial``) and
        say why it stays on the host, or None; its figures go to ``cost_trials`` either way. The
        same piece claimed again at the same shapes (before and after the layout pass) keeps its
        first result."""
        shapes = {n: lookup.shape(n) for n in part.input_names}
        key = (tuple(n.name or n.op_type for n in piece), tuple(moving), tuple(shapes.items()))
        if key not in self._trials:
            try:
                trial = ClaimTrial(part, plan, self.device, self.allocator, self.logger, shapes,
                                   {n: lookup.dtype(n) for n in part.input_names}, moving,
                                   host_crossings(graph, piece, taken, part.input_names, part.output_names)).run()
            except (*INSPECTION_ERRORS, cl.Error) as exc:
                # the formula's claim stands: the session computes the same either way
                text = f"claimed untimed: its trial failed: {decline_reason(exc, self.logger, 'timing a partition')}"
                self._trials[key] = (None, text)
            else:
                host_s, device_s = min(trial.host), min(trial.device)
                self._trials[key] = (claim_trial_reason(host_s, device_s, plan.launches_per_run, len(moving)),
                                     claim_trial_text(host_s, device_s, plan.launches_per_run, len(moving)))
        reason, text = self._trials[key]
        self._trial_texts[part] = text
        return reason

    # -- compiling -----------------------------------------------------------------------------
    def plan(self, graph: Graph) -> PartitionPlan:
        """``graph``'s plan, its programs built on the device (so that a build failure shows here,
        not at the first run). Raises what lowering or the build raises (``INSPECTION_ERRORS``)."""
        plan = build_plan(graph, self.lookup(graph), self.disabled_fusions, self._shape_only.get(graph, frozenset()))
        for step in (*plan.init_steps, *plan.steps):
            if isinstance(step, Launch):
                self.device.program(step.source, kernel=step.kernel_name)
        return plan

    def compile(self, graphs: Sequence[Graph], fused_nodes: Sequence[Node]) -> list[NodeComputeInfo]:
        """One compute info per graph, each planned once: static partitions as one plan, those with
        symbolic dimensions specialised per shape at run time; a partition that fails to build
        runs on the host (a shape-specialised partition whose every signature runs there)."""
        infos: list[NodeComputeInfo] = []
        for graph, node in zip(graphs, fused_nodes):
            info: NodeComputeInfo
            if specialised(graph, self.disabled_fusions, self.data_inputs(graph)):
                info = self.dynamic_info(graph)  # (shape values are computed per concrete signature)
            else:
                try:
                    plan = self._planned.pop(graph, None)
                    if plan is None:
                        plan = self.plan(graph)
                except INSPECTION_ERRORS as exc:
                    info = self._on_host(graph, exc)
                else:
                    self.compiled_plans.append(plan)
                    info = OpenCLNodeComputeInfo(plan, self.device, self.allocator)
            if isinstance(info, DynamicNodeComputeInfo) and node is not None:
                self._dynamic[node.name] = info
            if node is not None and graph in self._trial_texts:
                self.cost_trials[node.name] = self._trial_texts[graph]
            infos.append(info)
        return infos

    def _on_host(self, graph: Graph, exc: BaseException) -> DynamicNodeComputeInfo:
        ops = ", ".join(sorted({n.op_type for n in graph.nodes}))
        reason = decline_reason(exc, self.logger, f"lowering {len(graph.nodes)} node(s) ({ops})")
        self.decline(graph.nodes, reason)
        self.logger.warning("%s runs %d node(s) (%s) on the host: %s", self.name, len(graph.nodes), ops, reason)
        return self.dynamic_info(graph)

    def data_inputs(self, graph: Graph) -> frozenset[str]:
        """The inputs of claimed partition ``graph`` computed from the feeds (rule ``typed_values``):
        small ones (a fixed-shape ``attention_mask``) are data, never keys of a signature."""
        return self._data_inputs.get(graph, frozenset())

    def dynamic_info(self, graph: Graph) -> DynamicNodeComputeInfo:
        """A partition specialised per input signature at run time (host runs where that fails)."""
        return DynamicNodeComputeInfo(graph, self.device, self.allocator, self.logger,
                                      disabled_fusions=self.disabled_fusions,
                                      shape_only=self._shape_only.get(graph, frozenset()),
                                      shape_derived=self._shape_derived.get(graph, frozenset()),
                                      data_inputs=self.data_inputs(graph),
                                      cost_rule=self.cost_rule and self.device is not None)

    def compute_info(self, plan: PartitionPlan) -> OpenCLNodeComputeInfo:
        """A compiled partition from a plan made elsewhere (an EPContext blob's)."""
        return OpenCLNodeComputeInfo(plan, self.device, self.allocator)

    def add_dynamic(self, fused_node_name: str, info: DynamicNodeComputeInfo) -> None:
        """Report ``info`` (made from a saved partition) with the compiled ones."""
        self._dynamic[fused_node_name] = info

    @property
    def dynamic_partitions(self) -> dict[str, DynamicNodeComputeInfo]:
        """The partitions specialised per shape, by fused node name: each one's shape cache and its
        hit/miss/host-run figures (``stats``), as the profiling trace reports them."""
        return dict(self._dynamic)

    def profiling_step_args(self, node: Node | None) -> dict:
        """For a partition specialised per shape: its shape-specialisation cache figures; for a static
        one rule ``claim_trial`` timed and kept: its figures (``cost_trial``)."""
        info = self._dynamic.get(node.name) if node is not None else None
        if info is None:
            trial = self.cost_trials.get(node.name) if node is not None else None
            return {} if trial is None else {"cost_trial": trial}
        return info.stats.as_args(info.cached_signatures)


def _ort_pool_dims(node: Node, xs: tuple) -> tuple:
    """The output shape onnxruntime gives a pool over an input of shape ``xs``: the CPU EP's
    geometry (with ceil_mode, the last window dropped when it would start in the right padding
    or past the input, which onnx 1.23's shape inference keeps; C's truncating division where
    the padded input is shorter than the window)."""
    (_, _, _, _, _, out, _), _ = pool_geometry(node, xs[2:])
    return (*xs[:2], *out)


def _negative_dim(lookup: GraphLookup, name: str) -> bool:
    try:
        shape = lookup.shape(name)
    except (OrtError, ValueError, TypeError, KeyError, IndexError):
        return False
    return shape is not None and any(isinstance(d, int) and d < 0 for d in shape)


def untrusted_shapes(graph: Graph, lookup: GraphLookup) -> set[str]:
    """Values whose inferred static shape is wrong: outputs of pools where onnx shape inference and
    onnxruntime disagree, negative sizes, and everything computed from them. The EP sizes its buffers from
    inferred shapes, so it declines nodes that read or write these."""
    bad: set[str] = set()
    for n in graph.nodes:
        if any(i in bad for i in (*n.inputs, *n.implicit_inputs) if i):
            bad.update(o for o in n.outputs if o)
            continue
        if any(_negative_dim(lookup, o) for o in n.outputs if o):
            # shape inference gave a negative size (a Conv kernel wider than its padded input): no
            # buffer can hold it; the CPU EP runs the node and refuses it with the reason
            bad.update(o for o in n.outputs if o)
            continue
        if n.op_type in ("MaxPool", "AveragePool") and not n.domain:
            try:
                xs, ys = lookup.shape(n.inputs[0]), lookup.shape(n.outputs[0])
                wrong = xs is not None and ys is not None and tuple(ys) != _ort_pool_dims(n, tuple(xs))
            except (OrtError, ValueError, TypeError, KeyError, IndexError):  # unresolvable: do not trust it
                wrong = True
            if wrong:
                bad.update(o for o in n.outputs if o)
    return bad


def _between_claimed(graph: Graph, part: list[Node], taken: set[int]) -> bool:
    """Whether a group of views reads a value this EP produces and feeds one it consumes: then
    taking it costs no copy (on the device a view is free), and leaving it to the CPU EP would copy
    the value to the host and back. A Reshape whose target shape the CPU EP computes at run time
    (an attention head merge in a dynamic export) ends up alone in such a group."""
    inside = {id(n) for n in part}
    sources = [graph.producer(n.inputs[0]) for n in part if n.inputs and n.inputs[0]]
    fed = any(p is not None and id(p) in taken and id(p) not in inside for p in sources)
    feeds = any(id(c) in taken and id(c) not in inside for n in part for o in n.outputs if o
                for c in graph.consumers(o))
    return fed and feeds
