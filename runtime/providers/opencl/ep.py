"""``OpenCLEp``: claims the nodes the OpenCL kernels cover, fuses connected runs, compiles them.

``get_capability`` claims supported nodes, asks the runtime to group them into fused partitions
(``EpGraphSupportInfo.convex_groups``) and plans every group's filtered graph right away (the graph
``compile`` will receive: ``EpGraphSupportInfo.filtered_graph``), building its programs: a group whose
programs fail to build is retried node by node, and nodes that still fail are declined (logged) so
another EP runs them. ``compile`` then takes the plan made while claiming; each group is lowered once.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Sequence

import pyopencl as cl

from onnxhal.hal.ep import Ep, EpGraphSupportInfo, KernelContext, NodeComputeInfo, NodeFusionOptions
from onnxhal.hal.errors import OrtError
from onnxhal.hal.graph import Graph, Node
from onnxhal.runtime.providers.op_geometry import pool_geometry
from onnxhal.runtime.providers.opencl.cost_rule import crossings, host_rates, host_reason, host_seconds
from onnxhal.runtime.providers.opencl.device_context import OpenCLDeviceContext
from onnxhal.runtime.providers.opencl.dynamic_partition import DynamicNodeComputeInfo, is_dynamic
from onnxhal.runtime.providers.opencl.memory import OpenCLAllocator
from onnxhal.runtime.providers.opencl.op_support import (
    INSPECTION_ERRORS,
    VIEW_OPS,
    GraphLookup,
    decline_reason,
    unsupported_reason,
)
from onnxhal.runtime.providers.opencl.partition_plan import Launch, PartitionPlan, PartitionState
from onnxhal.runtime.providers.opencl.plan_builder import build_plan

EP_NAME = "OpenCLExecutionProvider"
#: The EP keeps its own copies of constant weights (uploaded once per partition state).
FUSION_OPTIONS = NodeFusionOptions(drop_constant_initializers=True)


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
        own_queue = not (isinstance(queue, cl.CommandQueue) and queue.context == self.device.context)
        if own_queue:
            queue = self.device.queue
        outputs = state.run(list(context.inputs), queue)
        if own_queue:
            queue.finish()
        for i, t in enumerate(outputs):
            context.set_output(i, t)
        return outputs

    def release_state(self, state: PartitionState) -> None:
        state.release()


class OpenCLEp(Ep):
    name = EP_NAME
    runs_onnxhal_fused_ops = True  # op_support.FUSED_DOMAIN_OPS

    def __init__(self, device: OpenCLDeviceContext | None, allocator: OpenCLAllocator, logger: logging.Logger,
                 cost_rule: bool = False, disabled_fusions: frozenset[str] = frozenset()) -> None:
        self.device = device
        self.allocator = allocator
        self.logger = logger
        #: Keep partitions smaller than their launches and copies on the host (cost_rule.py).
        self.cost_rule = cost_rule
        #: Fusion rules (fusion_rules.py) the plans leave out.
        self.disabled_fusions = disabled_fusions
        #: The plans of the compiled partitions of static shape (tests count their launches).
        self.compiled_plans: list[PartitionPlan] = []
        self._launches: dict[tuple[int, ...], int] = {}  # planned group (node ids) -> launches per run
        # Shapes, dtypes and constants seen in get_capability, for compile's filtered graphs.
        self._shapes: dict = {}
        self._dtypes: dict = {}
        self._constants: dict = {}
        self.declined: dict[str, str] = {}  # node name/op -> reason (for logs and tests)
        self._dynamic: dict[str, DynamicNodeComputeInfo] = {}  # fused node name -> per-shape partition
        # Plans made in get_capability, by the filtered graph compile will receive (gone with it).
        self._planned: weakref.WeakKeyDictionary[Graph, PartitionPlan] = weakref.WeakKeyDictionary()

    def _lookup(self, graph: Graph, allow_dynamic: bool = False) -> GraphLookup:
        return GraphLookup(graph, self._shapes, self._dtypes, self._constants, allow_dynamic)

    # -- capability ------------------------------------------------------------------------
    def get_capability(self, graph: Graph, support_info: EpGraphSupportInfo) -> None:
        # Symbolic dimensions are claimable: such partitions are specialised per shape at run time.
        loop = loop_owner(graph)
        if loop is not None:
            # This EP never takes Loop or Scan (nodes with subgraphs), so the loop runs on the host
            # and would copy a body partition's inputs to the device and its outputs back at every
            # iteration: skl2onnx's k-NN Scan over 300 samples took 65 ms a run on PoCL (and 45 ms
            # on an H200) against 0.08 ms with the body on the CPU EP.
            reason = (f"in the body of {loop.op_type} node {loop.name!r}, which runs on the host: every "
                      "iteration would copy this partition's inputs to the device and its outputs back")
            for n in graph.nodes:
                self.declined[n.name or n.op_type] = reason
            return
        lookup = self._lookup(graph, allow_dynamic=True)
        claimed: list[Node] = []
        untrusted = untrusted_shapes(graph, lookup)
        for n in graph.nodes:
            try:
                reason = self.node_reason(n, graph, lookup)
                if reason is None and any(v in untrusted for v in (*n.inputs, *n.outputs) if v):
                    reason = "inferred shape disagrees with onnxruntime's pool output size (ceil_mode)"
            except INSPECTION_ERRORS as exc:
                reason = f"cannot inspect node: {decline_reason(exc, self.logger, f'inspecting {n.op_type} {n.name!r}')}"
            if reason is None:
                claimed.append(n)
            elif reason:  # "" means "not mine, say nothing" (e.g. a node a subclass takes itself)
                self.declined[n.name or n.op_type] = reason
                self.logger.debug("%s declines %s (%s): %s", self.name, n.name, n.op_type, reason)
        taken = {id(n) for n in claimed}
        for group in support_info.convex_groups(claimed):
            for part in self._buildable(support_info, group):
                if all(n.op_type in VIEW_OPS for n in part) and not _between_claimed(graph, part, taken):
                    continue  # a lone view computes nothing: not worth two copies
                for piece in self.split_partition(graph, part):
                    reason = self._cost_reason(graph, piece, lookup, taken) if self.cost_rule else None
                    if reason:
                        for n in piece:
                            self.declined[n.name or n.op_type] = reason
                        self.logger.debug("%s declines %d node(s): %s", self.name, len(piece), reason)
                        continue
                    support_info.add_nodes_to_fuse(piece, FUSION_OPTIONS)

    def _cost_reason(self, graph: Graph, piece: list[Node], lookup: GraphLookup, taken: set[int]) -> str | None:
        """The cost rule's reason to leave ``piece`` to the host, or None. Partitions with symbolic
        dimensions have no size to weigh and are claimed."""
        launches = self._launches.get(tuple(id(n) for n in piece))
        if self.device is None or launches is None:
            return None
        costs = self.device.launch_costs()
        work = host_seconds(piece, lookup, host_rates())
        return host_reason(work, launches, crossings(graph, piece, taken), costs.launch_s, costs.copy_s)

    def node_reason(self, node: Node, graph: Graph, lookup: GraphLookup) -> str | None:
        """None if this EP takes ``node``, else why not: the hook subclasses (the simulated
        devices) extend with their own limits."""
        return unsupported_reason(node, lookup)

    def split_partition(self, graph: Graph, part: list[Node]) -> list[list[Node]]:
        """The partitions ``part`` is claimed as: itself here; the simulated devices split it where
        their profile limits a partition's size."""
        return [part]

    def _buildable(self, support_info: EpGraphSupportInfo, group: list[Node]) -> list[list[Node]]:
        """``group`` if its programs build, else its nodes that build on their own."""
        if self._try_build(support_info, group):
            return [group]
        if len(group) == 1:
            return []
        return [[n] for n in group if self._try_build(support_info, [n])]

    def kernel_graph(self, graph: Graph) -> Graph:
        """The graph this EP's kernels compute for a partition (the simulated NHWC devices: NCHW
        twins of their NHWC nodes). Trial and compile lower the same object, so the plan made in
        get_capability is the one compile uses."""
        return graph

    def _try_build(self, support_info: EpGraphSupportInfo, nodes: list[Node]) -> bool:
        part = support_info.filtered_graph(nodes, FUSION_OPTIONS)
        if is_dynamic(part):
            return True  # planned per concrete shape at run time (host fallback if that fails)
        part = self.kernel_graph(part)
        try:
            plan = build_plan(part, self._lookup(part), self.disabled_fusions)
            # A subclass with no OpenCL device (the simulators' host backend) plans only, so that
            # it takes exactly the nodes it would take with a device.
            if self.device is not None:
                for step in (*plan.init_steps, *plan.steps):
                    if isinstance(step, Launch):
                        self.device.program(step.source)
            self._planned[part] = plan
            self._launches[tuple(id(n) for n in nodes)] = plan.launches_per_run
            return True
        except INSPECTION_ERRORS as exc:
            ops = ", ".join(sorted({n.op_type for n in nodes}))
            reason = decline_reason(exc, self.logger, f"lowering {len(nodes)} node(s) ({ops})")
            for n in nodes:
                self.declined[n.name or n.op_type] = reason
            self.logger.warning("%s declines %d node(s) (%s): %s", self.name, len(nodes), ops, reason)
            return False

    # -- compile ---------------------------------------------------------------------------
    def compile(self, graphs: Sequence[Graph], fused_nodes: Sequence[Node]) -> list[NodeComputeInfo]:
        infos: list[NodeComputeInfo] = []
        for graph in graphs:
            if is_dynamic(graph):
                infos.append(DynamicNodeComputeInfo(graph, self.device, self.allocator, self.logger,
                                                    disabled_fusions=self.disabled_fusions))
                continue
            plan = self._planned.pop(graph, None)
            if plan is None:  # a graph get_capability did not see (a subclass rewrote it)
                plan = build_plan(graph, self._lookup(graph), self.disabled_fusions)
            self.compiled_plans.append(plan)
            infos.append(OpenCLNodeComputeInfo(plan, self.device, self.allocator))
        self._dynamic.update((n.name, i) for n, i in zip(fused_nodes, infos) if isinstance(i, DynamicNodeComputeInfo))
        return infos

    @property
    def dynamic_partitions(self) -> dict[str, DynamicNodeComputeInfo]:
        """The partitions with symbolic dimensions, by fused node name: each one's shape cache and
        its hit/miss/host-run figures (``stats``), as the profiling trace reports them."""
        return dict(self._dynamic)

    def profiling_step_args(self, node: Node | None, ep_name: str, inputs: list, outputs: list) -> dict:
        """For a partition with symbolic dimensions: its shape-specialisation cache figures."""
        info = self._dynamic.get(node.name) if node is not None else None
        if info is None:
            return {}
        return info.stats.as_args(info.cached_signatures)


def _ort_pool_dims(node: Node, xs: tuple) -> tuple:
    """The output shape onnxruntime gives a pool over an input of shape ``xs``: the CPU EP's
    geometry (with ceil_mode, the last window dropped when it would start in the right padding
    or past the input, which onnx 1.23's shape inference keeps; C's truncating division where
    the padded input is shorter than the window)."""
    (_, _, _, _, _, out, _), _ = pool_geometry(node, xs[2:])
    return (*xs[:2], *out)


def _negative_dim(lookup, name: str) -> bool:
    try:
        shape = lookup.shape(name)
    except (OrtError, ValueError, TypeError, KeyError, IndexError):
        return False
    return shape is not None and any(isinstance(d, int) and d < 0 for d in shape)


def untrusted_shapes(graph: Graph, lookup) -> set[str]:
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
