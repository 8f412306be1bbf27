"""The EP author contract: ``EpFactory`` makes ``Ep``s; an ``Ep`` claims nodes and runs them.

Mirrors ORT's OrtEpFactory / OrtEp (onnxruntime_ep_c_api.h) in snake_case. Every optional member
has a working default, so a minimal EP is a factory with ``get_supported_devices`` and
``create_ep``, and an Ep with ``get_capability`` plus ``compile`` or ``create_kernel``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from onnxhal.hal.enums import OrtCompiledModelCompatibility, OrtEpDataLayout, OrtGraphCaptureNodeAssignmentPolicy
from onnxhal.hal.ep_profiler import EpProfiler
from onnxhal.hal.errors import InvalidArgument
from onnxhal.hal.fused_groups import convex_groups, filtered_graph, group_key
from onnxhal.hal.graph import Graph, Node

if TYPE_CHECKING:
    from onnxhal.hal.allocator import Allocator
    from onnxhal.hal.custom_op import CustomOpDomain
    from onnxhal.hal.data_transfer import DataTransfer
    from onnxhal.hal.ep_device import OrtEpDevice
    from onnxhal.hal.hardware_device import OrtHardwareDevice
    from onnxhal.hal.memory_info import OrtMemoryDevice, OrtMemoryInfo
    from onnxhal.hal.sync_stream import SyncStream


@dataclass
class NodeFusionOptions:
    """Options for ``add_nodes_to_fuse``. With ``drop_constant_initializers`` the EP keeps its own
    copies of constant weights (taken in ``compile``) and the runtime does not feed them."""

    drop_constant_initializers: bool = False


class EpGraphSupportInfo:
    """Filled by ``Ep.get_capability``: which nodes the EP takes, one by one or fused in groups.

    It also offers the runtime's fusion rules (``hal/fused_groups.py``): ``convex_groups`` splits
    the nodes an EP supports into groups the runtime will accept, and ``filtered_graph`` is the
    graph ``Ep.compile`` will receive for a group, the same object, so an EP may plan a group while
    claiming it and keep that plan for ``compile``."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.single_nodes: list[Node] = []
        self.fused_groups: list[tuple[list[Node], NodeFusionOptions]] = []
        self._filtered: dict[tuple, Graph] = {}

    def convex_groups(self, nodes: Sequence[Node]) -> list[list[Node]]:
        """``nodes`` (of this graph) merged along producer->consumer edges into the largest groups
        ``add_nodes_to_fuse`` accepts: no node outside a group lies on a path between two members."""
        return convex_groups(self.graph, nodes)

    def filtered_graph(self, nodes: Sequence[Node], fusion_options: NodeFusionOptions | None = None) -> Graph:
        """The graph ``Ep.compile`` receives if ``nodes`` are claimed with ``fusion_options``: the
        values the group reads from outside as inputs, those read outside it as outputs. Asked
        twice, the same object."""
        key = group_key(nodes, fusion_options)
        graph = self._filtered.get(key)
        if graph is None:
            graph = self._filtered[key] = filtered_graph(self.graph, list(nodes), key[1])
        return graph

    def add_single_node(self, node: Node) -> None:
        """Claim one node; it will run through ``Ep.create_kernel``."""
        if not isinstance(node, Node):
            raise InvalidArgument(f"add_single_node expects a Node, got {type(node).__name__}")
        self.single_nodes.append(node)

    def add_nodes_to_fuse(self, nodes: Sequence[Node], fusion_options: NodeFusionOptions | None = None) -> None:
        """Claim a group compiled as one fused node by ``Ep.compile``. The group must form one
        partition with no node outside it on a path between two of its members; otherwise the
        runtime rejects the whole group (logging why) and the EP gets none of it."""
        nodes = list(nodes)
        if not nodes or not all(isinstance(n, Node) for n in nodes):
            raise InvalidArgument("add_nodes_to_fuse expects a non-empty list of Nodes")
        self.fused_groups.append((nodes, fusion_options or NodeFusionOptions()))


class KernelContext:
    """What ``NodeComputeInfo.compute`` receives for one run of a fused node: ``inputs`` (values in
    the EP's memory, in the order of the filtered graph's inputs), ``stream`` (the EP's stream or
    None) and ``outputs``, to fill in order (or return them as a list).

    ``destinations`` is None except in a run the session's graph-capturing EP captures
    (``Ep.is_graph_capture_enabled()``, the run's graph not captured yet): then, per output, the
    value the runtime holds that output in (a ``DeviceTensor`` in the EP's memory or a host array, of
    the output's shape and dtype; None where the runtime has none). They are the buffers the
    runtime reads after a replay, which writes no output through a ``KernelContext``: the capturing
    EP writes each output into its destination, returns the destinations, and keeps them with what
    it records, so that ``replay_graph`` writes there again."""

    __slots__ = ("inputs", "outputs", "stream", "run_options", "destinations")

    def __init__(self, inputs: list, num_outputs: int, stream: SyncStream | None = None, run_options: Any = None,
                 destinations: list | None = None):
        self.inputs = inputs
        self.outputs: list = [None] * num_outputs
        self.stream = stream
        self.run_options = run_options
        self.destinations = destinations

    @property
    def num_inputs(self) -> int:
        return len(self.inputs)

    @property
    def num_outputs(self) -> int:
        return len(self.outputs)

    def get_input(self, index: int) -> Any:
        return self.inputs[index]

    def set_output(self, index: int, value: Any) -> None:
        self.outputs[index] = value


class NodeComputeInfo:
    """Returned by ``Ep.compile`` for one fused node. ``create_state`` runs once when the session is
    created, ``compute`` on every run (possibly from many threads at once, so it must not mutate
    the state), ``release_state`` when the session ends.

    ``host_inputs`` names fused-node input indices the runtime hands over in host memory (ORT's
    OrtMemTypeCPUInput), e.g. indices the EP must check before it uploads them."""

    host_inputs: frozenset[int] = frozenset()

    def create_state(self, fused_node: Node) -> Any:
        return None

    def compute(self, state: Any, context: KernelContext) -> list | None:
        raise NotImplementedError

    def release_state(self, state: Any) -> None:
        pass


class Kernel:
    """A single-node kernel (the Python counterpart of ORT's kernel registry).

    ``__init__`` parses attributes once; ``compute(inputs)`` gets the explicit inputs (None for
    omitted optional ones) followed by the node's implicit inputs, and returns the outputs as a
    list. It may be called from many threads at once: keep no per-run state on ``self``.

    ``host_inputs``/``host_outputs`` name input/output indices that live in host memory even on a
    device EP (ORT's OrtMemTypeCPUInput/CPUOutput), e.g. a Reshape's shape.
    """

    host_inputs: frozenset[int] = frozenset()
    host_outputs: frozenset[int] = frozenset()
    #: Inputs the kernel reads only the ``shape`` (or ``size``) of: the runtime hands a value over
    #: wherever it lives, a device tensor included, without copying it (Shape, Size).
    metadata_inputs: frozenset[int] = frozenset()
    #: Optional fast path for a kernel whose ``compute(inputs)`` is exactly ``[fn(*inputs)]`` with a
    #: single array output (a numpy ufunc, typically): the executor then calls ``fn`` directly,
    #: saving a Python call and two lists per node (numpy scalars are turned back into 0-d arrays).
    inline_fn = None

    def compute(self, inputs: list) -> list:
        raise NotImplementedError


#: ``inline_fn = INLINE_APPLY`` in a kernel class whose ``apply(*inputs)`` is its inline function:
#: read, it is the bound ``apply``, made at each read. A bound method stored on the instance
#: (``self.inline_fn = self.apply``) is a reference cycle (kernel -> method -> kernel), which only
#: the garbage collector frees, with all the kernel holds, during some later allocation.
INLINE_APPLY = property(lambda self: self.apply, doc="The kernel's bound ``apply`` (``Kernel.inline_fn``).")


class KernelCreateContext:
    """Passed to ``Ep.create_kernel``: lets control-flow kernels run subgraphs."""

    def create_subgraph_runner(self, graph: Graph) -> Any:  # -> runtime SubgraphRunner
        raise NotImplementedError

    def is_constant_initializer(self, name: str) -> bool:
        """Whether input ``name`` is a constant initializer of the node's graph: the same array,
        never changed, on every run, so a kernel may keep what it derives from it. False when
        unknown (a value fed by the caller may be changed in place between runs)."""
        return False


class Ep:
    """One EP instance per session. Must set ``name`` (the factory's EP name)."""

    name: str = ""
    #: True if ``get_capability`` can claim the fused ops onnxhal's optimizer creates in the
    #: ``com.onnxhal`` domain (FusedConv, FusedGemm, FusedMatMul, FusedBatchNormalization, Gelu,
    #: LayerNormalization, FusedLinearClassifier). A session creates them only when every EP in it says so; otherwise this
    #: EP sees the plain ONNX ops (as ORT applies such fusions only for EPs that implement them).
    runs_onnxhal_fused_ops: bool = False

    def get_capability(self, graph: Graph, support_info: EpGraphSupportInfo) -> None:
        """Claim nodes of ``graph`` (called for the main graph and every subgraph, nested first)."""

    def compile(self, graphs: Sequence[Graph], fused_nodes: Sequence[Node],
                ep_context_nodes: list[Node | None] | None = None) -> list[NodeComputeInfo]:
        """Turn each filtered graph (one per fused group) into a NodeComputeInfo.

        ``ep_context_nodes`` (onnxruntime's ``OrtEp::Compile`` output array of the same name) is None
        unless the session generates an EPContext model (``ModelCompiler``; session config
        ``ep.context_enable`` = "1"): then a list of ``len(graphs)`` Nones, where the EP may put, per
        partition it can save, an EPContext node (``hal.ep_context.ep_context_node``); a partition
        left None keeps its nodes in the compiled model. An EP that never saves partitions may leave
        the parameter out of its signature: the runtime then passes it nothing."""
        if graphs:
            raise NotImplementedError(f"{self.name} claimed fused groups but does not implement compile()")
        return []

    def create_kernel(self, node: Node, context: KernelCreateContext) -> Kernel:
        """Kernel for a node claimed with ``add_single_node``."""
        raise NotImplementedError(f"{self.name} claimed single nodes but does not implement create_kernel()")

    def get_preferred_data_layout(self) -> OrtEpDataLayout:
        return OrtEpDataLayout.NCHW

    def should_convert_data_layout_for_op(self, domain: str, op_type: str, target_layout: OrtEpDataLayout) -> int:
        """>0 convert, 0 keep, <0 let the runtime decide."""
        return -1

    def set_dynamic_options(self, options: Mapping[str, str]) -> None:
        pass

    def on_run_start(self, run_options: Any) -> None:
        pass

    def on_run_end(self, run_options: Any, sync_stream: bool) -> None:
        pass

    def create_allocator(self, memory_info: OrtMemoryInfo, options: Mapping[str, str] | None = None) -> Allocator | None:
        """None: use the factory's allocator (or CPU memory)."""
        return None

    def create_sync_stream_for_device(self, memory_device: OrtMemoryDevice) -> SyncStream | None:
        """None: use the factory's stream (if stream aware), else run inline."""
        return None

    def create_data_transfer(self) -> DataTransfer | None:
        """The session's copies into and out of this EP's memory, when they need the EP (e.g. to
        charge a session's meter); None: the factory's ``create_data_transfer``."""
        return None

    def get_compiled_model_compatibility_info(self, graph: Graph) -> str:
        return ""

    def profiling_step_args(self, node: Node | None, ep_name: str, inputs: list, outputs: list) -> dict:
        """Extra ``args`` for a step's event in the profiling trace (e.g. simulated device time).
        Called, only when profiling is on, for the EP's own nodes and for every copy step
        (``node`` None, ``ep_name`` ""); return {} for steps that are not yours."""
        return {}

    # -- members onnxruntime added in 1.24 and later; each default is what onnxruntime assumes
    # when an EP leaves the member NULL ------------------------------------------------------------
    def is_concurrent_run_supported(self) -> bool:
        """False makes the session run one ``run`` at a time (onnxruntime then takes a session lock)."""
        return True

    def sync(self) -> None:
        """Wait until the EP's queued device work is done. Called at the end of every run (unless
        the run config entry ``disable_synchronize_execution_providers`` is "1") and by
        ``IOBinding.synchronize_inputs/outputs``."""

    def create_profiler(self) -> EpProfiler | None:
        """An ``EpProfiler`` whose events go into the session's trace; called once per session that
        profiles. None: the EP adds none (``profiling_step_args`` still applies)."""
        return None

    def on_session_initialization_end(self) -> None:
        """Called once the session is built (partitioned, compiled, memory planned), before any run."""

    def get_default_memory_device(self) -> OrtMemoryDevice | None:
        """The memory device the EP's values live in, one of those its EP devices declared; None:
        the DEFAULT memory of its EP devices (host memory if they declared none)."""
        return None

    def get_available_resource(self) -> int | None:
        """Bytes of device memory still free for this session's partitions (onnxruntime's
        ``GetAvailableResource``, for resource-aware partitioning); None: not known."""
        return None

    # Graph capture (CUDA graphs, WebGPU): the EP records the run and replays it. A capture run
    # gives each fused node's outputs their destinations (``KernelContext.destinations``).
    def is_graph_capture_enabled(self) -> bool:
        """Whether this EP captures the session's runs (asked once the session is partitioned and
        compiled); the session then runs ``run_with_iobinding`` with inputs and outputs bound."""
        return False

    def is_graph_captured(self, graph_annotation_id: int) -> bool:
        """Whether the runs annotated ``graph_annotation_id`` (run config ``gpu_graph_id``) are
        captured; the session replays instead of running then."""
        return False

    def replay_graph(self, graph_annotation_id: int) -> None:
        """Run the captured graph again: on the input buffers of its capture run (their current
        values), each output written into the destination its capture run gave it
        (``KernelContext.destinations``); no ``on_run_start``, ``compute`` or ``on_run_end`` comes
        with a replay."""
        raise NotImplementedError(f"{self.name} says its graph {graph_annotation_id} is captured but does not "
                                  "implement replay_graph()")

    def get_graph_capture_node_assignment_policy(self) -> OrtGraphCaptureNodeAssignmentPolicy:
        return OrtGraphCaptureNodeAssignmentPolicy.ALL_NODES_ON_EP

    def release_captured_graph(self, graph_annotation_id: int) -> None:
        """Forget the capture of ``graph_annotation_id`` (``InferenceSession.release_captured_graph``)."""

    def release(self) -> None:
        """Called when the session ends, after every NodeComputeInfo was released."""


class EpFactory:
    """Class attributes ``name`` (EP name), ``vendor``, ``vendor_id`` (PCI id, 0 if none),
    ``version`` (semver, reported as ep_metadata ``version``)."""

    name: str = ""
    vendor: str = ""
    vendor_id: int = 0
    version: str = "0.0.0"

    def get_supported_devices(self, hardware_devices: Sequence[OrtHardwareDevice]) -> list[OrtEpDevice]:
        """EP devices, made with ``api.create_ep_device``, for the hardware devices this EP can use
        (at most 8). The list arrives sorted NPU, GPU, CPU."""
        return []

    def create_ep(self, devices: Sequence[OrtHardwareDevice], ep_metadata: Sequence[Mapping[str, str]],
                  session_options: Any, logger: logging.Logger) -> Ep:
        raise NotImplementedError

    def release_ep(self, ep: Ep) -> None:
        ep.release()

    def create_allocator(self, memory_info: OrtMemoryInfo, options: Mapping[str, str] | None = None) -> Allocator | None:
        """Allocator for one of the memory infos this factory declared; None means CPU memory."""
        return None

    def create_data_transfer(self) -> DataTransfer | None:
        return None

    def is_stream_aware(self) -> bool:
        return False

    def create_sync_stream_for_device(self, memory_device: OrtMemoryDevice,
                                      options: Mapping[str, str] | None) -> SyncStream | None:
        return None

    def validate_compiled_model_compatibility_info(self, devices: Sequence[OrtHardwareDevice],
                                                   info: str) -> OrtCompiledModelCompatibility:
        """What ``info`` (a compiled model's ``ep_compatibility_info.<EP>``, written by
        ``Ep.get_compiled_model_compatibility_info``) means on ``devices``. Called at session creation
        and by ``get_model_compatibility_for_ep_devices``."""
        return OrtCompiledModelCompatibility.EP_NOT_APPLICABLE

    def get_custom_op_domains(self) -> Sequence[CustomOpDomain]:
        """Custom operators this library brings (``hal.CustomOpDomain``); a session that uses this
        factory's EP, or selects EPs by policy, can run them."""
        return []

    def get_hardware_device_incompatibility_details(self, device: OrtHardwareDevice) -> tuple:
        """(reasons bitmask of ``OrtDeviceEpIncompatibilityReason``, notes) or (bitmask, notes,
        error code); (0, "") means compatible. Called by ``get_hardware_device_ep_incompatibility_details``."""
        return 0, ""
