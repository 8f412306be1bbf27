"""``VirtualEp``: a simulated device's EP: the OpenCL backend it holds, obeying a hardware profile,
with faults and a cost model.

``get_capability`` claims a node only when the OpenCL kernels can run it *and* the profile allows
it (op type, dtypes, rank, static shapes); everything else falls to the next EP, so a real model
gets the partial partition real hardware of that class would give it. ``compile`` has the backend
plan each partition once (``OpenCLBackend``), rounds weights to fp16 on fp16 devices, and prices
every partition with the cost model; compute runs through ``VirtualNodeComputeInfo`` (faults, fp16
storage, metering). ``HostVirtualEp`` claims through the same backend and computes on the host.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyopencl as cl

from onnxhal.hal.allocator import Allocator
from onnxhal.hal.data_transfer import DataTransfer
from onnxhal.hal.enums import OrtEpDataLayout
from onnxhal.hal.ep import Ep, EpGraphSupportInfo, KernelContext, NodeComputeInfo, NodeFusionOptions
from onnxhal.hal.ep_context import FusedOrder, ep_context_node, fused_order
from onnxhal.hal.errors import InvalidArgument, InvalidGraph, OrtError, OutOfMemory
from onnxhal.hal.graph import Graph, Node, ValueInfo
from onnxhal.hal.memory_info import OrtMemoryDevice, OrtMemoryInfo
from onnxhal.hal.run_control import sleep_unless_terminated
from onnxhal.hal.tensor import DeviceTensor
from onnxhal.runtime.optimizer.layout_transform import (
    LAYOUT_SENSITIVE,
    NHWC_DOMAIN,
    cancel_transposes,
    nchw_twin,
    original_domain,
)
from onnxhal.runtime.providers.opencl.backend import OpenCLBackend
from onnxhal.runtime.providers.opencl.device_context import OpenCLDeviceContext
from onnxhal.runtime.providers.opencl.dynamic_partition import (
    DynamicNodeComputeInfo,
    DynamicPartitionPlan,
    partition_shape_values,
    shape_value_rules,
)
from onnxhal.runtime.providers.opencl.op_support import GraphLookup, unsupported_reason
from onnxhal.runtime.session.graph_capture import CaptureRecorder
from onnxhal.simulators.cost import Meter, PartitionCost, partition_cost
from onnxhal.simulators.ep_context import BLOB_FORMAT, context_blob, decode_partition, encode_partition, is_ep_context
from onnxhal.simulators.faults import FaultState
from onnxhal.simulators.fp16 import (
    FP32_PRODUCERS,
    STORAGE_DTYPES,
    HalfRounder,
    beyond_range_values,
    decision_reason,
    picked_values,
    round_constants,
)
from onnxhal.simulators.profile_rules import rule_reason
from onnxhal.simulators.profiles import Profile
from onnxhal.simulators.quantized import QuantizedValues, integer_reason

# Inputs of these ops that are parameters (shapes, axes, indices), not data the device computes on.
_PARAM_INPUTS = {"Reshape": {1}, "Split": {1}, "Unsqueeze": {1}, "Squeeze": {1}, "Expand": {1}, "Slice": {1, 2, 3, 4},
                 "Gather": {1}, "Clip": {1, 2}, "ReduceSum": {1}, "ReduceMean": {1}, "ReduceMax": {1},
                 "ReduceMin": {1}, "ReduceProd": {1}, "ReduceSumSquare": {1}, "ReduceL1": {1}, "ReduceL2": {1},
                 "ReduceLogSum": {1}, "ReduceLogSumExp": {1}}
_F32, _F16 = np.dtype(np.float32), np.dtype(np.float16)
EP_VERSION = "0.1.0"
#: Provider option that turns graph capture on (VirtualEp.configure_graph_capture).
GRAPH_CAPTURE_OPTION = "enable_graph_capture"


def profile_reason(profile: Profile, node: Node, graph: Graph, quantized: QuantizedValues | None = None) -> str | None:
    """None if ``profile``'s device may run ``node``, else why not (beyond what OpenCL can run):
    its op list, its per-op rules (``profile_rules.py``), static shapes, rank and compute dtypes."""
    op = node.op_type
    if not profile.supports_op(op):
        return f"{profile.name} has no {op}" + profile.cite("ops")
    extra = []
    if op.startswith("Fused") and node.attr("activation", ""):
        extra.append(node.attr("activation"))
    if op == "FusedConv" and len(node.inputs) > 3 and node.inputs[3]:
        extra.append("Add")  # the residual
    for part in extra:
        if part not in profile.ops:
            return f"{profile.name} has no {part} (fused into {op})" + profile.cite("ops")
    rules = profile.rules_for(op)
    for rule in rules:
        reason = rule_reason(profile.name, rule, node, graph)
        if reason is not None:
            return reason
    # An op rule may allow dynamic shapes on a static-shape device (or the reverse, checked above).
    static_only = profile.static_shapes_only and not any(r.static_shapes is False for r in rules)
    params = _PARAM_INPUTS.get(op, set())
    qdq_only = profile.int8_qdq_only and quantized is not None and quantized.in_qdq_group(node, graph)
    for k, name in enumerate((*node.inputs, *node.outputs)):
        if not name or (k < len(node.inputs) and k in params):
            continue
        if graph.is_constant_initializer(name):
            dtype = np.asarray(graph.initializer(name)).dtype
            shape: Any = np.asarray(graph.initializer(name)).shape
        else:
            vi = graph.value_info(name)
            dtype = np.dtype(vi.dtype) if vi.dtype is not None else None
            shape = tuple(vi.shape) if vi.shape is not None else None
            if static_only and not vi.has_static_shape:
                return f"{profile.name} runs static shapes only; {name!r} has shape {shape}" + profile.cite("compute")
        if shape is not None and len(shape) > profile.max_rank:
            return (f"{profile.name} handles rank <= {profile.max_rank}; {name!r} has rank {len(shape)}"
                    + profile.cite("compute"))
        if dtype == _F32:
            if profile.float32_as == "none" and not qdq_only:
                what = ("computes float only inside int8 QDQ groups (DequantizeLinear -> op -> QuantizeLinear); "
                        if profile.int8_qdq_only else "does not compute float32; ")
                return f"{profile.name} {what}{node.op_type} computes on {name!r} in float32" + profile.cite("compute")
        elif dtype == _F16:
            if "float16" not in profile.dtypes:
                return f"{profile.name} does not compute float16 ({name!r})" + profile.cite("compute")
        elif dtype is not None and np.issubdtype(dtype, np.integer):
            want = {1: "int8", 2: "int16"}.get(dtype.itemsize, "int32")
            if want not in profile.dtypes and not (np.issubdtype(dtype, np.unsignedinteger) and "uint8" in profile.dtypes):
                return f"{profile.name} does not compute {dtype} ({name!r})" + profile.cite("compute")
    return None


def compatibility_string(ep_name: str, profile: Profile, opencl_device_key: str) -> str:
    """What a saved partition needs of a device: EP, blob format, profile, device ids, fp16 storage,
    and the OpenCL device it was built on."""
    opencl = hashlib.sha256(opencl_device_key.encode()).hexdigest()[:12]
    return (f"{ep_name};version={EP_VERSION};format={BLOB_FORMAT};profile={profile.name};"
            f"device={profile.vendor_id:x}:{profile.device_id:x};fp16={int(profile.compute_dtype == 'float16')};"
            + ("bf16=1;" if profile.compute_dtype == "bfloat16" else "") +
            f"opencl={opencl}")


@dataclass(frozen=True)
class Fp16Edges:
    """A partition's float32 inputs and outputs with their names, and which stay float32 on an fp16
    device (reduction results: statistics a real NPU compiler keeps in float32)."""

    input_names: tuple[str, ...] = ()
    output_names: tuple[str, ...] = ()
    keep_inputs: frozenset[int] = frozenset()
    keep_outputs: frozenset[int] = frozenset()

    @classmethod
    def of(cls, graph: Graph, fp32_values: set[str], int8: bool = False) -> Fp16Edges:
        """``int8``: an int8 QDQ group (simulators/quantized.py), whose edges all stay float32."""
        if int8:
            return cls(tuple(graph.input_names), tuple(graph.output_names),
                       frozenset(range(len(graph.input_names))), frozenset(range(len(graph.output_names))))
        return cls(tuple(graph.input_names), tuple(graph.output_names),
                   frozenset(i for i, n in enumerate(graph.input_names) if n in fp32_values),
                   frozenset(i for i, n in enumerate(graph.output_names) if n in fp32_values))

    def name(self, names: tuple[str, ...], i: int) -> str:
        return names[i] if i < len(names) else f"#{i}"


def _saved_names(info: Any) -> tuple[list[str], list[str]]:
    """The input and output names a partition loaded from an EPContext blob takes and returns, in order."""
    plan = getattr(info, "plan", None)
    if hasattr(plan, "output_names"):  # an OpenCL plan
        return list(plan.input_names), list(plan.output_names)
    return list(info.graph.input_names), list(info.graph.output_names)  # host backend, symbolic dims


class _State:
    """The OpenCL partition's state and the device-memory charge of its weights."""

    __slots__ = ("inner", "charge")

    def __init__(self, inner: Any, charge: object | None) -> None:
        self.inner = inner
        self.charge = charge


class VirtualNodeComputeInfo(NodeComputeInfo):
    """One compiled partition on a simulated device: the OpenCL partition, plus injected faults,
    fp16 storage and the cost meter."""

    def __init__(self, inner: Any, ep: VirtualEp, cost: PartitionCost, fp16: Fp16Edges | None = None,
                 order: FusedOrder | None = None) -> None:
        self.inner = inner
        self.ep = ep
        self.cost = cost
        self.fp16 = fp16 or Fp16Edges()
        #: A partition loaded from an EPContext node whose fused node orders the values otherwise.
        self.order = order
        self.host_outputs, self.metadata_inputs = (frozenset(getattr(inner, k, ())) for k in ("host_outputs",
                                                                                             "metadata_inputs"))

    def create_state(self, fused_node: Node) -> Any:
        # The partition's weights live on the device too: they count against its capacity.
        charge = self.ep.device_memory.charge(self.weight_bytes) if self.weight_bytes else None
        try:
            return _State(self.inner.create_state(fused_node), charge)
        except BaseException:
            if charge is not None:
                self.ep.device_memory.free(charge)
            raise

    def release_state(self, state: Any) -> None:
        try:
            self.inner.release_state(state.inner)
        finally:
            if state.charge is not None:
                self.ep.device_memory.free(state.charge)
                state.charge = None

    @property
    def host_inputs(self) -> frozenset[int]:  # type: ignore[override]
        # The OpenCL partition's Gather indices and shape parameters: the runtime must hand them
        # over in host memory, as it does to the OpenCL EP itself.
        return frozenset(getattr(self.inner, "host_inputs", ()))

    @property
    def weight_bytes(self) -> int:
        own = getattr(self.inner, "weight_bytes", None)  # the host backend's partitions count their own
        if own is not None:
            return int(own)
        plan = getattr(self.inner, "plan", None)
        if plan is None:
            return 0
        return (sum(int(np.asarray(a).nbytes) for a in plan.constants.values())
                + sum(int(n) for n in plan.prepacked.values()))

    def compute(self, state: Any, context: KernelContext) -> list:
        ep = self.ep
        ep.faults.before_compute()
        start = time.perf_counter()
        if self.order is None:
            outputs = ep.compute_partition(self.inner, state.inner, context, self.fp16)
        else:
            inner = KernelContext(self.order.feeds(context.inputs), self.order.saved_outputs, context.stream,
                                  context.run_options)
            outputs = self.order.results(ep.compute_partition(self.inner, state.inner, inner, self.fp16))
        if context.destinations is not None and ep.captures is not None:  # a graph capture run
            outputs = ep.captures.capture(lambda ctx, _s=state: self.compute(_s, ctx), context, outputs)
        for i, t in enumerate(outputs):
            context.set_output(i, t)
        ep.meter.add_partition(self.cost)
        slowdown = ep.meter.slowdown
        if slowdown > 1.0:  # the device really is that much slower: wait for it, then idle
            ep.finish(context)
            busy = time.perf_counter() - start
            sleep_unless_terminated((slowdown - 1.0) * busy)  # a terminate request cuts the wait short
            ep.meter.add_wall(busy, time.perf_counter() - start - busy)
        return outputs



class VirtualEp(Ep):
    """One session's EP on a simulated device (``name`` is the factory's EP name), on the OpenCL
    backend it holds (``opencl``); ``HostVirtualEp`` below is the same device on the host backend."""

    backend = "opencl"
    runs_onnxhal_fused_ops = True  # the OpenCL kernels run onnxhal's fused ops

    def __init__(self, name: str, device: OpenCLDeviceContext | None, allocator: Allocator, memory_info: OrtMemoryInfo,
                 profile: Profile, faults: FaultState, logger: logging.Logger, device_memory: Any = None) -> None:
        self.device = device
        self.allocator = allocator
        self.logger = logger
        #: Claims by the OpenCL kernels' rules; plans and runs the partitions (device None: claims only).
        self.opencl = OpenCLBackend(name, device, allocator, logger)
        # The device's own allocator (``allocator`` may be a per-session fault-injecting wrapper).
        self.device_memory = device_memory if device_memory is not None else allocator
        self.name = name
        self.memory_info = memory_info
        self.profile = profile
        self.faults = faults
        self.meter = Meter(profile, faults.faults.slowdown)
        self.rounder = (HalfRounder(device, profile.compute_dtype)
                        if device is not None and profile.compute_dtype in STORAGE_DTYPES else None)
        self.partition_costs: dict[str, PartitionCost] = {}  # fused node name -> cost
        self.partition_infos: dict[str, VirtualNodeComputeInfo] = {}  # fused node name -> compiled partition
        self.contexts_loaded = 0  # partitions taken from EPContext nodes instead of planned
        self.data_transfer: DataTransfer | None = None  # set by the factory: copies charged to this EP's meter
        self._fp32_values: set[str] = set()  # reduction results: kept float32 on an fp16 device
        self.quantized_values = QuantizedValues()  # int8 QDQ groups and integer accumulators
        self.fp16_overflows: set[str] = set()  # values reported as overflowing fp16 storage
        self.fp16_clamped: set[str] = set()  # weights clamped to the storage range
        # per graph shown to get_capability (by id): values that may exceed the storage range
        self._beyond_range: dict[int, dict[str, str]] = {}
        # per graph shown to get_capability (by id): float values an ArgMax/ArgMin picks from
        self._picked: dict[int, dict[str, str]] = {}
        self._overflow_lock = threading.Lock()

    # -- capability ------------------------------------------------------------------------
    def get_capability(self, graph: Graph, support_info: EpGraphSupportInfo) -> None:
        # Partitions compiled earlier (ModelCompiler's EPContext nodes) are taken whole, if ours;
        # everything else goes through the OpenCL backend's claim with the profile's limits added.
        self._fp32_values.update(o for n in graph.nodes if not n.domain and n.op_type in FP32_PRODUCERS
                                 for o in n.outputs if o)
        self.quantized_values.add_graph(graph)
        if self.profile.compute_dtype in STORAGE_DTYPES:
            self._beyond_range[id(graph)] = beyond_range_values(graph, self.profile.compute_dtype)
            self._picked[id(graph)] = picked_values(graph)
        for n in graph.nodes:
            if is_ep_context(n):
                reason = self._context_reason(n)
                if reason is None:
                    support_info.add_nodes_to_fuse([n], NodeFusionOptions(drop_constant_initializers=True))
                else:
                    self.declined[n.name or n.op_type] = reason
        self.opencl.claim(graph, support_info, self.node_reason, self.split_partition)

    @property
    def declined(self) -> dict[str, str]:
        """Node name (or op) -> why this device left it to the next EP."""
        return self.opencl.declined

    @property
    def compiled_plans(self) -> list:
        """The OpenCL plans of the compiled partitions of static shape (tests count their launches)."""
        return self.opencl.compiled_plans

    @property
    def dynamic_partitions(self) -> dict[str, DynamicNodeComputeInfo]:
        """The partitions specialised per shape, by fused node name (``OpenCLBackend.dynamic_partitions``)."""
        return self.opencl.dynamic_partitions

    def node_reason(self, node: Node, graph: Graph, lookup: GraphLookup) -> str | None:
        if is_ep_context(node):
            return ""  # handled in get_capability
        return profile_reason(self.profile, node, graph, self.quantized_values) or integer_reason(
            self.profile, node, self.quantized_values) or decision_reason(
            self.profile.compute_dtype, self.profile.name, node, graph) or (
            self._nhwc_reason(node, graph) if node.domain == NHWC_DOMAIN else unsupported_reason(node, lookup)) or (
            self._range_reason(node, graph, lookup)) or self._pick_reason(node, graph)

    def _pick_reason(self, node: Node, graph: Graph) -> str | None:
        """Why the device declines ``node``: an ArgMax/ArgMin picks from one of its float outputs
        or from what is computed from them (``picked_values``), and the device's storage rounding
        can swap the pick between near values."""
        picked = self._picked.get(id(graph))
        name = next((o for o in node.outputs if picked and o in picked), None)
        if name is None:
            return None
        storage = "fp16" if self.profile.compute_dtype == "float16" else "bf16"
        # no possessive apostrophes: decline_summary reads quotes as value names
        return (f"a pick on an {storage} device: {picked[name]!r} picks an index from {name!r} or what is computed "
                f"from it, and {storage} rounding swaps near values; {self.profile.name} cannot compute it in its "
                "precision")

    def _range_reason(self, node: Node, graph: Graph, lookup: GraphLookup) -> str | None:
        """Why the device declines ``node``: an input computed off the device may hold values beyond
        the storage range (it carries a constant that does), and storing it at the partition's edge
        makes them inf (a fully masked attention row then gives NaN). Computed on the device, from
        the weight clamped as device compilers clamp it, the same value stays finite."""
        beyond = self._beyond_range.get(id(graph))
        if not beyond:
            return None
        for name in node.inputs:
            source = beyond.get(name)
            if source is None or name in graph.initializers:
                continue  # a weight: clamped when the device stores it
            producer = graph.producer(name)
            if producer is not None and self.node_reason(producer, graph, lookup) is None:
                continue  # made on the device too, from the clamped weight
            storage = self.profile.compute_dtype
            # no possessive apostrophes: decline_summary reads quotes as value names
            return (f"{name!r} may hold values beyond the {storage} range (it carries constant {source!r}) and "
                    f"reaches {self.profile.name} from another EP, where {storage} storage would make them inf; "
                    "computed on the host in float32")
        return None

    def split_partition(self, graph: Graph, part: list[Node]) -> list[list[Node]]:
        """``part`` as the profile's ``[partitions]`` limits allow: declined when smaller than
        ``min_nodes`` (unless it is the whole graph), else in pieces of at most ``max_nodes``:
        consecutive runs of its nodes in graph (topological) order, each convex since the group is."""
        low, high = self.profile.min_partition_nodes, self.profile.max_partition_nodes
        if low and len(part) < low and len(part) < len(graph.nodes):
            reason = (f"{self.profile.name} takes no partition of fewer than {low} nodes; this one has {len(part)}"
                      + self.profile.cite("partitions"))
            self.opencl.decline(part, reason)
            return []
        if not high or len(part) <= high:
            return [part]
        order = {id(n): i for i, n in enumerate(graph.nodes)}
        nodes = sorted(part, key=lambda n: order.get(id(n), 0))
        return [nodes[i:i + high] for i in range(0, len(nodes), high)]

    # -- backend hooks -----------------------------------------------------------------------
    def compute_partition(self, inner: Any, state: Any, context: KernelContext, edges: Fp16Edges) -> list:
        """Run one compiled partition: on the device's queue, with fp16 storage where the profile
        computes in fp16 (inputs rounded into copies, outputs rounded in place; reduction results
        kept float32, ``edges``)."""
        ctx = context
        queue = self._queue(context)
        if self.rounder is not None:
            # (an input or output in host memory, a numpy array, is not stored in device fp16: the
            # partition's host inputs, and values computed at specialisation, rule shape_tensors)
            inputs = [self.rounder.rounded_copy(t, self.allocator, queue, edges.name(edges.input_names, i))
                      if isinstance(t, DeviceTensor) and t.dtype == _F32 and i not in edges.keep_inputs
                      and i not in getattr(inner, "host_inputs", ()) else t
                      for i, t in enumerate(context.inputs)]
            ctx = KernelContext(inputs, context.num_outputs, context.stream, context.run_options)
        outputs = inner.compute(state, ctx)
        outputs = ctx.outputs if outputs is None else outputs
        if self.rounder is not None:
            for i, t in enumerate(outputs):
                if (isinstance(t, DeviceTensor) and t.dtype == _F32 and i not in edges.keep_outputs
                        and i not in getattr(inner, "host_outputs", ())):
                    self.rounder.round_in_place(t, self.allocator, queue, edges.name(edges.output_names, i))
            if queue is self.device.queue:
                queue.finish()
        return outputs

    def report_fp16_overflow(self, name: str) -> None:
        """Log once per value that fp16 storage turned finite values into inf."""
        self._report_once(self.fp16_overflows, name, "%s: %r exceeds %s's range (%s) on %s, which stores float32 "
                          "values as %s: it became inf and the results are wrong. Keep the node that makes it on "
                          "the CPU EP, or use a profile with float32_as = \"float32\".")

    def report_clamped_weight(self, name: str) -> None:
        """Log once per weight that its finite values beyond the storage range were clamped."""
        self._report_once(self.fp16_clamped, name, "%s: weight %r holds values beyond %s's range (%s) on %s, which "
                          "stores float32 values as %s: they were clamped to it, as device compilers do (OpenVINO, "
                          "TensorRT). Use a profile with float32_as = \"float32\" for the model's own values.")

    def _report_once(self, seen: set[str], name: str, message: str) -> None:
        """``message`` (EP, value, storage, limit, profile, storage) logged the first time ``name`` is seen."""
        with self._overflow_lock:
            if name in seen:
                return
            seen.add(name)
        storage = self.profile.compute_dtype
        limit = "65504" if storage == "float16" else "about 3.39e38"
        self.logger.warning(message, self.name, name, storage, limit, self.profile.name, storage)

    def finish(self, context: KernelContext) -> None:
        """Wait until the partition's queued work is done."""
        self._queue(context).finish()

    def _queue(self, context: KernelContext) -> cl.CommandQueue:
        stream = context.stream
        queue = stream.handle() if stream is not None else None
        return queue if self.device.in_context(queue) else self.device.queue

    def plan_partitions(self, graphs: list[Graph], fused_nodes: list[Node]) -> list[NodeComputeInfo]:
        """The backend's compiled partitions (weights rounded to fp16 where the profile says)."""
        infos = self.opencl.compile(graphs, fused_nodes)
        if self.rounder is not None:
            for graph, info in zip(graphs, infos):
                if self.quantized_values.int8_partition(graph):
                    continue  # computed in int8: its dequantized weights are not fp16 values
                if hasattr(info, "plan"):
                    self._round_weights(info.plan)
                else:  # a partition with symbolic dims: each shape's plan, when it is made
                    info.prepare_plan = self._round_weights
        return infos

    def _round_weights(self, plan: Any) -> None:
        for name in round_constants(plan.constants, self.profile.compute_dtype):
            self.report_clamped_weight(name)

    def partition_from_context(self, plan: Any) -> NodeComputeInfo:
        """A compiled partition from an EPContext blob's plan."""
        if isinstance(plan, DynamicPartitionPlan):  # specialised per signature again, weights rounded then
            info = plan.compute_info(self.device, self.allocator, self.logger)
            if self.rounder is not None:
                info.prepare_plan = self._round_weights
            return info
        return self.opencl.compute_info(plan)

    @property
    def backend_key(self) -> str:
        """What a saved partition must match besides the profile: the OpenCL device it was built on."""
        return self.device.device_key

    # -- layout ----------------------------------------------------------------------------
    def get_preferred_data_layout(self) -> OrtEpDataLayout:
        """The profile's layout: the runtime converts this EP's Conv/pooling nodes to NHWC ops
        (``com.ms.internal.nhwc``) with Transposes at the edges of NHWC regions."""
        return OrtEpDataLayout.NHWC if self.profile.preferred_layout == "NHWC" else OrtEpDataLayout.NCHW

    def _nhwc_reason(self, node: Node, graph: Graph) -> str | None:
        """An NHWC node is claimable when its NCHW twin is (the PoCL kernels compute NCHW)."""
        if (original_domain(node), node.op_type) not in LAYOUT_SENSITIVE:
            return f"no NHWC form of {node.op_type}"
        nodes, infos = nchw_twin(node, graph)
        twin = _with_nodes(graph, nodes, infos)
        lookup = self.opencl.lookup(twin)
        for n in nodes:
            reason = unsupported_reason(n, lookup)
            if reason is not None:
                return reason
        return None

    @staticmethod
    def kernel_graph(graph: Graph) -> Graph:
        """The partition with each NHWC node replaced by its NCHW twin: the device exchanges NHWC
        tensors (what crosses the partition and flows between NHWC ops), and converts around each
        layout-sensitive kernel on the device, since the PoCL kernels are NCHW."""
        if not any(n.domain == NHWC_DOMAIN for n in graph.nodes):
            return graph
        nodes: list[Node] = []
        infos: dict[str, ValueInfo] = {}
        for n in graph.nodes:
            if n.domain == NHWC_DOMAIN:
                twin, extra = nchw_twin(n, graph)
                nodes.extend(twin)
                infos.update(extra)
            else:
                nodes.append(n)
        # Consecutive NHWC nodes leave Transpose pairs that undo each other between their twins.
        nodes = cancel_transposes(nodes, set(graph.output_names))
        return _with_nodes(graph, nodes, infos)

    # -- compile ---------------------------------------------------------------------------
    def compile(self, graphs: Sequence[Graph], fused_nodes: Sequence[Node],
                ep_context_nodes: list[Node | None] | None = None) -> list[NodeComputeInfo]:
        self.faults.check_compile()
        # Costs are those of the NHWC graph (what NHWC hardware runs); the PoCL kernels get the
        # NCHW twins.
        as_given = list(graphs)
        graphs = [self.kernel_graph(g) for g in graphs]
        fresh = [k for k, g in enumerate(graphs) if not (len(g.nodes) == 1 and is_ep_context(g.nodes[0]))]
        planned = dict(zip(fresh, self.plan_partitions([graphs[k] for k in fresh], [fused_nodes[k] for k in fresh])))
        out: list[VirtualNodeComputeInfo] = []
        for k, (graph, node) in enumerate(zip(graphs, fused_nodes)):
            if k in planned:
                info = planned[k]
                lookup = self.opencl.lookup(graph)
                values_rule, tensors_rule = shape_value_rules(self.opencl.disabled_fusions)
                folded = (partition_shape_values(as_given[k], tensors_rule, self.opencl.data_inputs(as_given[k]))
                          if values_rule else frozenset())
                cost = partition_cost(as_given[k], self.profile, lambda name, _lk=lookup: _safe_shape(_lk, name),
                                      folded)
            else:  # an EPContext node: the saved plan, no planning (its weights were rounded when saved)
                plan, cost, _ = decode_partition(context_blob(graph.nodes[0]))
                info = self.partition_from_context(plan)
                order = fused_order(*_saved_names(info), node)
                if isinstance(info, DynamicNodeComputeInfo):
                    self.opencl.add_dynamic(node.name, info)  # its specialisation figures in profiling traces
                self.contexts_loaded += 1
            self.partition_costs[node.name] = cost
            edges = (Fp16Edges.of(as_given[k], self._fp32_values, self.quantized_values.int8_partition(as_given[k]))
                     if k in planned else Fp16Edges())
            if hasattr(info, "fp16_edges"):
                info.fp16_edges = edges
            vinfo = VirtualNodeComputeInfo(info, self, cost, edges, None if k in planned else order)
            self.partition_infos[node.name] = vinfo
            out.append(vinfo)
        # All or nothing: weights that do not fit fail the compile, so the runtime gives every
        # partition of this EP to the CPU EP before any state holds device memory.
        weights = sum(i.weight_bytes for i in out)
        free = self.device_memory.free_bytes() if hasattr(self.device_memory, "free_bytes") else weights
        if weights > free:
            raise OutOfMemory(f"{self.name}: the model's weights on {self.profile.name} need {weights} bytes but only "
                              f"{free} of its {self.profile.capacity_bytes}-byte memory are free; its nodes go to the "
                              "next EP")
        if ep_context_nodes is not None:
            for k, node in enumerate(fused_nodes):
                blob = self._context_data(node.name)
                if blob is not None:
                    ep_context_nodes[k] = ep_context_node(node, blob, self.name, self.profile.name,
                                                          self.compatibility_info())
        return out

    # -- EPContext ---------------------------------------------------------------------------
    def compatibility_info(self) -> str:
        return compatibility_string(self.name, self.profile, self.backend_key)

    def get_compiled_model_compatibility_info(self, graph: Graph) -> str:
        return self.compatibility_info()

    def _context_data(self, fused_node_name: str) -> bytes | None:
        """The EPContext blob of a partition this EP compiled (None if it has none)."""
        info = self.partition_infos.get(fused_node_name)
        if info is None:
            return None
        plan = getattr(info.inner, "plan", None)
        if plan is None and isinstance(info.inner, DynamicNodeComputeInfo):  # symbolic dims: its graph
            plan = DynamicPartitionPlan.of(info.inner)
        if plan is None:
            return None
        try:
            return encode_partition(plan, info.cost, self.compatibility_info())
        except TypeError as exc:  # a plan value the blob cannot hold: keep the nodes instead
            self.logger.warning("%s: partition %s cannot be saved as EPContext: %s", self.name, fused_node_name, exc)
            return None

    def _context_reason(self, node: Node) -> str | None:
        source = node.attr("source", "")
        if source != self.name:
            return f"EPContext node for {source!r}, not {self.name}"
        saved, mine = node.attr("notes", ""), self.compatibility_info()
        if saved != mine:
            return (f"EPContext node {node.name!r} was compiled for [{saved}], this device is [{mine}]: compile the "
                    "model again for this device")
        return None

    # -- runs, memory ----------------------------------------------------------------------
    def profiling_step_args(self, node: Node | None, ep_name: str, inputs: list, outputs: list) -> dict:
        from onnxhal.simulators.cost import step_figures

        return {**self.opencl.profiling_step_args(node), **step_figures(self, node, inputs, outputs)}

    def on_run_start(self, run_options: Any) -> None:
        self.faults.on_run_start()
        self.meter.begin_run()
        if self.captures is not None:
            self.captures.start_run(run_options)

    def on_run_end(self, run_options: Any, sync_stream: bool) -> None:
        self.meter.end_run()
        if self.captures is not None:
            self.captures.end_run()
        if self.rounder is not None:
            name = self.rounder.overflowed(self.device.queue)
            if name is not None:
                self.report_fp16_overflow(name)

    def create_data_transfer(self) -> DataTransfer | None:
        return self.data_transfer

    # -- graph capture (provider option enable_graph_capture = "1"; runtime/session/graph_capture.py) --
    captures: CaptureRecorder | None = None

    def configure_graph_capture(self, options: Any) -> None:
        """Capture runs when the session's provider option ``enable_graph_capture`` is "1" (as
        CUDA's ``enable_cuda_graph``): each partition run is recorded with its input buffers and
        replayed into the output destinations of its capture run."""
        value = str(options.get(GRAPH_CAPTURE_OPTION, "0"))
        if value not in ("0", "1"):
            raise InvalidArgument(f"{self.name}: provider option {GRAPH_CAPTURE_OPTION}={value!r}; use '1' or '0'")
        if value == "1":
            self.captures = CaptureRecorder(self.name, lambda *copy: self.data_transfer.copy_tensors(*copy))

    def is_graph_capture_enabled(self) -> bool:
        if self.captures is None or self.captures.unsupported:
            return False
        # A replay reads and writes only the buffers of its capture run: values passed between two of
        # this EP's partitions live in the runtime's memory, which it frees after the run.
        if len(self.partition_infos) != 1:
            self.logger.warning("%s: graph capture is off: it needs the model in one partition on %s, which "
                                "runs %d", self.name, self.profile.name, len(self.partition_infos))
            self.captures = None
            return False
        return True

    def is_graph_captured(self, graph_annotation_id: int) -> bool:
        return self.captures is not None and self.captures.is_captured(graph_annotation_id)

    def replay_graph(self, graph_annotation_id: int) -> None:
        if self.captures is None:
            raise InvalidArgument(f"{self.name}: graph capture is off (provider option {GRAPH_CAPTURE_OPTION})")
        self.captures.replay(graph_annotation_id)

    def release_captured_graph(self, graph_annotation_id: int) -> None:
        if self.captures is not None:
            self.captures.release(graph_annotation_id)

    def get_default_memory_device(self) -> OrtMemoryDevice | None:
        """The device's own memory (what its EP device declares as DEFAULT); None where it works in
        host memory."""
        return None if self.memory_info.is_host else self.memory_info.memory_device

    def create_allocator(self, memory_info: OrtMemoryInfo, options: Any = None) -> Allocator | None:
        if memory_info.memory_device == self.memory_info.memory_device:
            return self.allocator
        return None


def _with_nodes(graph: Graph, nodes: list[Node], infos: dict[str, ValueInfo]) -> Graph:
    """A copy of ``graph`` (same inputs, outputs, constants) holding ``nodes``."""
    out = Graph(graph.name, nodes, list(graph.inputs), list(graph.outputs), dict(graph.initializers),
                {**graph.value_infos, **infos}, graph.opset, parent=graph.parent)
    out.overridable = list(graph.overridable)
    return out


def _safe_shape(lookup: GraphLookup, name: str) -> tuple[int, ...] | None:
    try:
        return lookup.shape(name)
    except (OrtError, KeyError, ValueError):
        return None


class HostVirtualEp(VirtualEp):
    """A simulated device's EP on the host backend (``simulators/host_backend.py``): the same
    capability, memory, fp16, faults and cost as ``VirtualEp``, its partitions run by the CPU EP's
    kernels because no OpenCL device passed the probe."""

    backend = "host"

    def __init__(self, name: str, allocator: Allocator, memory_info: OrtMemoryInfo, profile: Profile,
                 faults: FaultState, logger: logging.Logger, device_memory: Any = None) -> None:
        super().__init__(name, None, allocator, memory_info, profile, faults, logger, device_memory)

    def compute_partition(self, inner: Any, state: Any, context: KernelContext, edges: Fp16Edges) -> list:
        return inner.compute(state, context)  # fp16 storage is the partition's own (HostNodeComputeInfo)

    def finish(self, context: KernelContext) -> None:
        pass  # host partitions are complete when compute returns

    def plan_partitions(self, graphs: list[Graph], fused_nodes: list[Node]) -> list[NodeComputeInfo]:
        from onnxhal.simulators.host_backend import HostNodeComputeInfo, rounded_weights

        storage = self.profile.compute_dtype
        infos: list[NodeComputeInfo] = []
        for g in graphs:
            # an int8 QDQ group is computed in int8, not in the float storage format
            half = storage in STORAGE_DTYPES and not self.quantized_values.int8_partition(g)
            infos.append(HostNodeComputeInfo(rounded_weights(g, self.report_clamped_weight, storage) if half else g,
                                             self.allocator, half, self.logger, self.report_fp16_overflow, storage,
                                             self.opencl.disabled_fusions, self.opencl.data_inputs(g)))
        return infos

    def partition_from_context(self, plan: Any) -> NodeComputeInfo:
        from onnxhal.simulators.host_backend import HostNodeComputeInfo, HostPartitionPlan

        if not isinstance(plan, HostPartitionPlan):
            raise InvalidGraph(f"{self.name}: EPContext blob holds an OpenCL plan, this device runs on the host "
                               "backend; compile the model again for this device")
        # The saved weights were rounded when they were saved.
        return HostNodeComputeInfo(plan.to_graph(), self.allocator, self.profile.compute_dtype in STORAGE_DTYPES,
                                   self.logger, self.report_fp16_overflow, self.profile.compute_dtype,
                                   self.opencl.disabled_fusions)

    @property
    def backend_key(self) -> str:
        from onnxhal.simulators.host_backend import HOST_COMPAT_KEY

        return HOST_COMPAT_KEY
