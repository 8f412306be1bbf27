"""Any onnxhal EP library presented to onnxruntime as OrtEpFactory / OrtEp / OrtNodeComputeInfo.

One ``FactoryAdapter`` per ``hal.EpFactory``, one ``EpAdapter`` per ``hal.Ep`` (one per session),
one ``ComputeAdapter`` per compiled partition (compute.py). Each owns the ctypes struct onnxruntime
holds (structs.py: its function slots point at bridge.c's trampolines; ``dispatch.objects`` maps the
struct's address back to the adapter) and every string it returns, so all stay alive until
onnxruntime's Release call.

Memory: an EP's own memory of a GPU/NPU/FPGA type is declared to onnxruntime (device_memory.py),
which then hands ``Compute`` device tensors and copies values itself. Otherwise (CPU-type device
memory, or ``configure(device_memory=False)``) onnxruntime sees host memory and compute.py copies
a partition's values into the EP's memory and back.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from ctypes import POINTER, c_size_t, c_void_p
from typing import Any

import numpy as np

from onnxhal.hal.enums import OrtDeviceMemoryType, OrtEpDataLayout, OrtHardwareDeviceType, OrtMemoryInfoDeviceType
from onnxhal.hal.ep import (
    Ep,
    EpFactory,
    EpGraphSupportInfo,
    NodeComputeInfo,
)
from onnxhal.hal.ep_api import EpApi
from onnxhal.hal.ep_device import OrtEpDevice
from onnxhal.hal.errors import InvalidArgument
from onnxhal.hal.fused_groups import outside_nodes_between
from onnxhal.hal.graph import Graph, Node, ValueInfo
from onnxhal.hal.hardware_device import OrtHardwareDevice
from onnxhal.hal.memory_info import OrtMemoryInfo
from onnxhal.ort_plugin import dispatch as d
from onnxhal.ort_plugin import graph_capture, kept_handles
from onnxhal.ort_plugin.claim_checks import graph_refusal, holds_subgraphs
from onnxhal.ort_plugin.compute import ComputeAdapter, DeviceMemory, GraphKernelCreateContext, KernelComputeInfo
from onnxhal.ort_plugin.custom_ops import domains_for, write_domains
from onnxhal.ort_plugin.device_memory import (
    AllocatorAdapter,
    DataTransferAdapter,
    memory_device_of,
)
from onnxhal.ort_plugin.env_config import with_factory_defaults
from onnxhal.ort_plugin.ep_context import context_enabled, context_node
from onnxhal.ort_plugin.graph_view import GraphWalk, fused_node_signature
from onnxhal.ort_plugin.missing_hooks import MissingHooks
from onnxhal.ort_plugin.ml_value_types import BRIDGE_ML_SHAPES_KEY, apply_types, inferred_types
from onnxhal.ort_plugin.ort_api import API_VERSION, OrtApi
from onnxhal.ort_plugin.streams import is_stream_aware, register_session_streams, unregister_session_streams
from onnxhal.ort_plugin.structs import (
    EpStruct,
    FactoryStruct,
    FusionOptions,
    Strings,
    fill,
    negotiated_version,
    words,
    write_out,
)
from onnxhal.runtime.optimizer.layout_transform import LAYOUT_SENSITIVE
from onnxhal.runtime.session.compile_partitions import compile_graphs

logger = logging.getLogger("onnxhal.ort_plugin")

class ResourceCount(ctypes.Structure):
    """onnxruntime's OrtResourceCount (56 bytes): the kind, a reserved word, and a union of which
    the bridge writes the first member (``total_bytes``)."""

    _fields_ = [("kind", ctypes.c_uint32), ("reserved", ctypes.c_uint32), ("total_bytes", ctypes.c_uint64),
                ("reserved_words", ctypes.c_uint64 * 5)]


RESOURCE_TOTAL_BYTES = 1  # OrtResourceCountKind_TotalBytes

#: onnxruntime's metadata key for a virtual hardware device (onnxhal's own is "is_virtual").
ORT_VIRTUAL_KEY = "IsVirtual"
ORT_OWNED_EP_METADATA = frozenset({"version", "library_path"})


class BridgeEpApi(EpApi):
    """The ``api`` an onnxhal EP library gets inside onnxruntime: as onnxhal's (its environment
    config is onnxruntime's: env_config.py), and virtual devices also carry ``IsVirtual``, the name
    an earlier revision of onnxruntime's onnxruntime_ep_device_ep_metadata_keys.h gave its
    ``is_virtual`` key."""

    def create_hardware_device(self, type: OrtHardwareDeviceType, vendor_id: int, device_id: int, vendor: str,
                               metadata: Any = None) -> OrtHardwareDevice:
        return super().create_hardware_device(type, vendor_id, device_id, vendor,
                                              {**dict(metadata or {}), ORT_VIRTUAL_KEY: "1"})


class SessionOptionsView:
    """What a hal factory's ``create_ep`` reads of the session options: onnxruntime's config entries
    (provider options arrive as ``ep.<lowercase ep name>.<key>``)."""

    def __init__(self, entries: dict[str, str]) -> None:
        self._entries = dict(entries)

    def config_entries(self) -> dict[str, str]:
        return dict(self._entries)

    def get_session_config_entry(self, key: str) -> str:
        return self._entries.get(key, "")

    def config(self, key: str, default: str = "") -> str:
        return self._entries.get(key, default)

    def provider_options_for(self, ep_name: str) -> dict[str, str]:
        prefix = f"ep.{ep_name.lower()}."
        return {k[len(prefix):]: v for k, v in self._entries.items() if k.startswith(prefix)}


class FactoryAdapter:
    """A ``hal.EpFactory`` as an OrtEpFactory."""

    def __init__(self, api: OrtApi, factory: EpFactory, module: Any, discovered: list[OrtHardwareDevice],
                 declare_memory: bool = True) -> None:
        self.api = api
        self.factory = factory
        self.module = module
        self.discovered = discovered
        self.strings = Strings()
        self.struct = fill(FactoryStruct(), negotiated_version(api.api_version))
        self.address = ctypes.addressof(self.struct)
        # OrtHardwareDevice* -> the hal EP devices on it (several only where virtual devices fall back
        # onto onnxruntime's CPU device, before onnxruntime 1.24)
        self.hal_by_ort_hw: dict[int, list[OrtEpDevice]] = {}
        # Device memory declared to onnxruntime: hal memory device -> (hal memory info, OrtMemoryInfo*)
        self.memory_infos: dict[Any, tuple[OrtMemoryInfo, int]] = {}
        self.declare_memory = declare_memory
        self._just_created = threading.local()  # the EpAdapter create_ep made on this thread
        self.custom_op_domains: list[int] | None = None  # OrtCustomOpDomain*s, made at onnxruntime's first ask
        d.objects[self.address] = self

    # -- devices ----------------------------------------------------------------------------
    def _ort_device_for(self, hw: OrtHardwareDevice, ort_devices: list[int]) -> int | None:
        if hw.metadata.get("is_virtual") == "1":
            if not self.api.has_virtual_devices:
                # onnxruntime < 1.24 has no virtual devices: offer the EP on its CPU device instead.
                return next((p for p in ort_devices if self.api.ort["HardwareDevice_Type"](p) == 0), None)
            return kept_handles.hardware_device(self.api, hw)
        for p in ort_devices:  # a real device: onnxruntime's own record of the same hardware
            if self.api.ort["HardwareDevice_Type"](p) != int(hw.type):
                continue
            if hw.type == OrtHardwareDeviceType.CPU or (
                    self.api.ort["HardwareDevice_VendorId"](p) == hw.vendor_id
                    and self.api.ort["HardwareDevice_DeviceId"](p) == hw.device_id):
                return p
        return None

    def get_supported_devices(self, args: Any) -> None:
        ort_devices, out, max_out, num_out = words(args[0], args[1]), args[2], args[3], args[4]
        self.hal_by_ort_hw.clear()
        ep_devices = self.factory.get_supported_devices(list(self.discovered))
        made = 0
        for dev in ep_devices:
            if made >= max_out:
                logger.warning("%s offers more than %d EP devices; onnxruntime takes %d", self.factory.name,
                               max_out, max_out)
                break
            ort_hw = self._ort_device_for(dev.device, ort_devices)
            if ort_hw is None:
                logger.info("%s: hardware device %s %s is not one onnxruntime knows; not offered",
                            self.factory.name, dev.device.type.name, dev.device.vendor)
                continue
            # onnxruntime adds "version" (from GetVersion) and "library_path" itself, and refuses them here.
            md = self.api.make_pairs({k: v for k, v in dev.ep_metadata.items() if k not in ORT_OWNED_EP_METADATA})
            opts = self.api.make_pairs(dev.ep_options)
            ep_dev = c_void_p()
            try:
                self.api.ep_call("CreateEpDevice", self.address, ort_hw, md, opts, ctypes.byref(ep_dev))
            finally:
                self.api.release_pairs(md)
                self.api.release_pairs(opts)
            ctypes.cast(out, POINTER(c_void_p))[made] = ep_dev.value
            self.hal_by_ort_hw.setdefault(ort_hw, []).append(dev)
            info = dev.memory_info(OrtDeviceMemoryType.DEFAULT)
            # Only memory onnxruntime treats as a device's: it reads CPU-type memory itself (the OpenCL
            # EP on PoCL declares such), which the bridge's device addresses cannot serve.
            if (self.declare_memory and info is not None and not info.is_host
                    and info.device_type != OrtMemoryInfoDeviceType.CPU):
                self.api.ep_call("EpDevice_AddAllocatorInfo", ep_dev.value, self._ort_memory_info(info))
            made += 1
        write_out(num_out, made, c_size_t)

    def _ort_memory_info(self, info: OrtMemoryInfo) -> int:
        known = self.memory_infos.get(info.memory_device)
        if known is None:
            known = self.memory_infos[info.memory_device] = (info, kept_handles.memory_info(self.api, info))
        return known[1]

    def create_allocator(self, args: Any) -> None:
        """CreateAllocator for one of the memory infos declared above (NULL: host memory)."""
        if not args[0]:
            return
        device = memory_device_of(self.api, self.api.ep["MemoryInfo_GetMemoryDevice"](args[0]))
        known = self.memory_infos.get(device)
        if known is None:
            return
        allocator = self.factory.create_allocator(known[0], self.api.read_pairs(args[1]) if args[1] else None)
        if allocator is not None:
            write_out(args[2], AllocatorAdapter(allocator, known[1]).address)

    def create_data_transfer(self, args: Any) -> None:
        if not self.memory_infos:
            return  # no device memory declared: onnxruntime copies nothing for this EP
        # Asked right after CreateEp, on its thread, onnxruntime wants the session's transfer: the EP's
        # own (which charges the session's cost meter); otherwise (at registration) the factory's.
        ep = getattr(self._just_created, "ep", None)
        self._just_created.ep = None
        transfer = ep.memory.transfer if ep is not None and ep.memory is not None else self.factory.create_data_transfer()
        if transfer is not None:
            write_out(args[0], DataTransferAdapter(self.api, transfer).address)

    def validate_compatibility(self, args: Any) -> None:
        """ValidateCompiledModelCompatibilityInfo: the hal factory's verdict for a compiled model."""
        devices = [d.device for p in words(args[0], args[1]) for d in self.hal_by_ort_hw.get(p, [])]
        verdict = self.factory.validate_compiled_model_compatibility_info(devices, ctypes.string_at(args[2]).decode())
        write_out(args[3], int(verdict), ctypes.c_int)

    def incompatibility_details(self, args: Any) -> None:
        """GetHardwareDeviceIncompatibilityDetails: the hal factory's (reasons bitmask, notes[, error
        code]) for one of onnxruntime's hardware devices, written into onnxruntime's details object."""
        answer = tuple(self.factory.get_hardware_device_incompatibility_details(self._hal_device(args[0])))
        if len(answer) not in (2, 3):
            raise InvalidArgument(f"{self.factory.name}.get_hardware_device_incompatibility_details returned "
                                  f"{answer!r}; return (reasons bitmask, notes) or (reasons bitmask, notes, error code)")
        reasons, notes = int(answer[0]), str(answer[1] or "")
        code = int(answer[2]) if len(answer) == 3 else 0
        if reasons or notes or code:
            self.api.ep_call("DeviceEpIncompatibilityDetails_SetDetails", args[1], reasons, code,
                             notes.encode() if notes else None)

    def ort_custom_op_domains(self) -> list[int]:
        """The hal factory's ``get_custom_op_domains()`` as onnxruntime's domains, made once
        (custom_ops.py) and handed out again at every later ask."""
        if self.custom_op_domains is None:
            self.custom_op_domains = domains_for(self.api, self.factory.name, list(self.factory.get_custom_op_domains()))
        return self.custom_op_domains

    def num_custom_op_domains(self, args: Any) -> None:
        """GetNumCustomOpDomains (API 24)."""
        write_out(args[0], len(self.ort_custom_op_domains()), c_size_t)

    def write_custom_op_domains(self, args: Any) -> None:
        """GetCustomOpDomains: onnxruntime's array has the count GetNumCustomOpDomains gave."""
        write_domains(self.ort_custom_op_domains(), args[0], args[1])

    def _hal_device(self, ort_hw: int) -> OrtHardwareDevice:
        """onnxruntime's OrtHardwareDevice as hal's: the device onnxhal discovered for the same
        hardware if there is one (it carries onnxhal's metadata), else onnxruntime's record of it."""
        ort = self.api.ort
        hw_type, vendor_id, device_id = ort["HardwareDevice_Type"](ort_hw), ort["HardwareDevice_VendorId"](ort_hw), \
            ort["HardwareDevice_DeviceId"](ort_hw)
        for dev in self.discovered:
            if int(dev.type) == hw_type and (dev.type == OrtHardwareDeviceType.CPU
                                             or (dev.vendor_id, dev.device_id) == (vendor_id, device_id)):
                return dev
        return OrtHardwareDevice(OrtHardwareDeviceType(hw_type), (ort["HardwareDevice_Vendor"](ort_hw) or b"").decode(),
                                 vendor_id, device_id, self.api.read_pairs(ort["HardwareDevice_Metadata"](ort_hw)))

    def create_ep(self, args: Any) -> None:
        n = args[2]
        ort_devices, md_ptrs = words(args[0], n), words(args[1], n)
        entries = c_void_p()
        self.api.call("GetSessionOptionsConfigEntries", args[3], ctypes.byref(entries))
        try:
            config = self.api.read_pairs(entries.value)
        finally:
            self.api.release_pairs(entries.value)
        config = with_factory_defaults(config, self.api.env_config(), self.factory.name)
        metadata = [self.api.read_pairs(p) for p in md_ptrs]
        ep_devices = [self._ep_device(p, md) for p, md in zip(ort_devices, metadata)]
        ep = self.factory.create_ep([e.device for e in ep_devices], metadata, SessionOptionsView(config),
                                    logging.getLogger(f"onnxhal.ep.{self.factory.name}"))
        adapter = EpAdapter(self, ep, ep_devices, context_enabled(config),
                            ml_shapes=config.get(BRIDGE_ML_SHAPES_KEY, "1") != "0")
        self._just_created.ep = adapter
        write_out(args[5], adapter.address)

    def _ep_device(self, ort_hw: int, metadata: dict[str, str]) -> OrtEpDevice:
        """The hal EP device onnxruntime chose: on that hardware device, with that EP metadata."""
        for dev in self.hal_by_ort_hw.get(ort_hw, []):
            if all(metadata.get(k) == v for k, v in dev.ep_metadata.items() if k not in ORT_OWNED_EP_METADATA):
                return dev
        raise InvalidArgument(f"{self.factory.name}: onnxruntime asked for an EP on a device this factory did not "
                              f"offer (ep_metadata {metadata})")

    def release(self) -> None:
        """ReleaseEpFactory. A session that outlives an unregister still ends through this factory
        (ReleaseEp, then ReleaseAllocator for its allocators; onnxruntime 1.28 crashed calling a freed
        factory there), so the struct is retired, not destroyed: one small object per registration."""
        d.objects.pop(self.address, None)
        d.retired[self.address] = self
        release = getattr(self.module, "release_ep_factory", None)
        try:
            if callable(release):
                release(self.factory)
        finally:
            # The OrtMemoryInfos and virtual OrtHardwareDevices stay: onnxruntime's Python objects may
            # still point at them (kept_handles.py).
            self.memory_infos.clear()


def group_signature(graph: Graph) -> tuple:
    """What makes two readings of one onnxruntime graph's fused group interchangeable for
    ``Ep.compile``: each node's name, op, inputs and outputs in order (value names are unique in a
    graph, so they pin the nodes down), the inputs and outputs in order with their types and
    shapes, and the constant initializers' names."""
    nodes = tuple((n.name, n.domain, n.op_type, n.inputs, n.outputs) for n in graph.nodes)
    edges = tuple((v.name, v.elem_type, v.shape) for v in (*graph.inputs, *graph.outputs))
    return nodes, len(graph.inputs), edges, tuple(sorted(graph.initializers))


def acyclic_claims(graph: Graph, groups: list[tuple[list, Any]], ep_name: str) -> list[tuple[list, Any]]:
    """``groups`` (nodes, fusion options) that onnxruntime can fuse together: each fused group
    becomes one node, so two groups that each pass alone but feed each other would make onnxruntime's
    graph cyclic and fail the session ("the graph is not acyclic"). As onnxhal's partitioner
    (``hal/fused_groups.py``), each group is checked against those accepted before it and a group
    that closes a cycle is left to the other EPs, with a warning."""
    accepted: list[tuple[list, Any]] = []
    fused: list[set[int]] = []
    for nodes, options in groups:
        ids = {id(n) for n in nodes}
        between = outside_nodes_between(graph, ids, fused)
        if between:
            logger.warning("%s: not claiming %s: node(s) %s outside the group (or in a group claimed before "
                           "it) lie on a path between its members", ep_name,
                           ", ".join(repr(n.name or n.op_type) for n in nodes[:5]),
                           ", ".join(repr(n.name or n.op_type) for n in between[:5]))
            continue
        accepted.append((nodes, options))
        fused.append(ids)
    return accepted


class EpAdapter:
    """One session's ``hal.Ep`` as an OrtEp."""

    def __init__(self, factory: FactoryAdapter, ep: Ep, ep_devices: list[OrtEpDevice],
                 make_context_nodes: bool = False, ml_shapes: bool = True) -> None:
        self.factory = factory
        # types of values onnxruntime gives no rank (after ai.onnx.ml operators: ml_value_types.py),
        # by name, inferred while claiming: the fused graphs of Compile get them too, so that their
        # signature is the one of the graphs the EP planned
        self.ml_shapes = ml_shapes
        self.inferred_types: dict[str, ValueInfo] = {}
        self.make_context_nodes = make_context_nodes
        self.api = factory.api
        self.ep = ep
        self.name = factory.strings(ep.name or factory.factory.name)
        self.version = negotiated_version(self.api.api_version)
        self.struct = fill(EpStruct(), self.version)
        if type(ep).get_available_resource is Ep.get_available_resource:
            # An EP that cannot say leaves the member NULL, as onnxruntime asks of such an EP: no
            # resource budget from the device then.
            self.struct.GetAvailableResource = None
        self.captures_graphs = graph_capture.captures(ep)
        if not self.captures_graphs:  # onnxruntime's "does not capture" (graph_capture.py)
            for member in graph_capture.TRAMPOLINES:
                setattr(self.struct, member, None)
        self.run_capture = graph_capture.RunCapture()  # the capture state of the run on each thread
        self.capture_buffers: dict[int, list] = {}  # graph id -> the device values of its capture run
        self.missing = MissingHooks(ep, self.version)
        self.address = ctypes.addressof(self.struct)
        self.compute_infos: dict[int, ComputeAdapter] = {}
        self.single_nodes: set[str] = set()  # names of nodes claimed with add_single_node
        self.claiming_graph: tuple | None = None  # before onnxruntime 1.24: the one graph that gets claims
        # The filtered graph of each group get_capability claimed, by group_signature, until compile:
        # onnxruntime hands Compile graphs of its own, and the EP's plan made while claiming is keyed
        # by the filtered graph it planned (EpGraphSupportInfo.filtered_graph).
        self.claimed_graphs: dict[tuple, Graph] = {}
        self.memory = DeviceMemory.of(factory.factory, ep, ep_devices)
        # onnxruntime gives this EP's runs a stream (streams.py): look it up in each Compute
        self.stream_aware = self.memory is not None and is_stream_aware(factory)
        # kept here: onnxruntime asks for the stream at the first run, maybe after an unregister
        # emptied the factory's table, and a stream aware EP must then still give one
        self.stream_devices = frozenset(factory.memory_infos) if self.stream_aware else frozenset()
        self.session_streams: set = set()  # live streams onnxruntime made for this session (streams.py)
        if self.stream_devices:
            register_session_streams(self)
        self.interrupt_at_flush = False
        self.profiler: Any = None  # profiling.ProfilerAdapter while onnxruntime profiles the session (API 25+)
        d.objects[self.address] = self

    def get_capability(self, args: Any) -> None:
        walk = GraphWalk(self.api, args[0])
        if self.ml_shapes:
            types = inferred_types(walk.graph)
            if types and apply_types(walk.graph, types):
                self.inferred_types.update(types)
        refused = graph_refusal(walk.graph)
        if refused is not None:
            logger.warning("%s claims no node of graph %r: %s (onnxhal's loader refuses such a node; onnxruntime's "
                           "own EPs take the graph)", self.ep.name, walk.graph.name, refused)
            return
        support = EpGraphSupportInfo(walk.graph)
        self.ep.get_capability(walk.graph, support)
        self._leave_control_flow(walk.graph, support)
        # A single node runs through the EP's kernel: presented to onnxruntime as a group of one.
        groups = acyclic_claims(walk.graph, [([n], None) for n in support.single_nodes] + list(support.fused_groups),
                                self.ep.name)
        if groups and not self.api.names_fused_groups_across_graphs:
            # Claims in a second graph would reuse the first graph's kernel names
            # (ort_api.DISTINCT_FUSED_NAMES_VERSION): the first graph that gets claims keeps the EP
            # (onnxruntime asks about control-flow bodies before the graph holding them), by name and
            # outputs, which onnxruntime's layout pass leaves as they are when it asks again.
            key = (walk.graph.name, tuple(walk.graph.output_names))
            if self.claiming_graph is None:
                self.claiming_graph = key
            elif key != self.claiming_graph:
                logger.warning("%s: not claiming %d group(s) in graph %r: onnxruntime %s gives fused groups of two "
                               "graphs one kernel name, and graph %r has claims (onnxruntime 1.24 and later takes "
                               "both)", self.ep.name, len(groups), walk.graph.name, self.api.version_string,
                               self.claiming_graph[0])
                return
        self.single_nodes.update(n.name for nodes, options in groups if options is None for n in nodes)
        for nodes, options in groups:
            if options is not None:
                filtered = support.filtered_graph(nodes, options)
                self.claimed_graphs[group_signature(filtered)] = filtered
        for nodes, options in groups:
            ptrs = (c_void_p * len(nodes))(*[walk.ort_nodes[id(n)] for n in nodes])
            fusion = FusionOptions(API_VERSION, bool(options and options.drop_constant_initializers))
            self.api.ep_call("EpGraphSupportInfo_AddNodesToFuse", args[1], ptrs, len(nodes), ctypes.byref(fusion))

    def _leave_control_flow(self, graph: Graph, support: EpGraphSupportInfo) -> None:
        """Take back the EP's claims on nodes holding subgraphs (If, Loop, Scan): graph_view.py does
        not carry their bodies, so their kernels could not be made (onnxruntime offers the bodies'
        nodes to the EP separately; the node itself runs on onnxruntime's CPU EP)."""
        def keep(node: Node) -> bool:
            if not holds_subgraphs(node.op_type):
                return True
            logger.info("%s: %s node %r of graph %r stays with onnxruntime: its subgraphs do not cross the "
                        "bridge (their nodes are offered to the EP on their own)", self.ep.name, node.op_type,
                        node.name, graph.name)
            return False

        support.single_nodes[:] = [n for n in support.single_nodes if keep(n)]
        support.fused_groups[:] = [(kept, options) for nodes, options in support.fused_groups
                                   if (kept := [n for n in nodes if keep(n)])]

    def compile(self, args: Any) -> None:
        count = args[2]
        graphs, fused = words(args[0], count), words(args[1], count)
        fused_nodes = [fused_node_signature(self.api, p) for p in fused]
        hal_graphs = [self._claimed(self._typed(GraphWalk(self.api, g, list(f.inputs), list(f.outputs)).graph))
                      for g, f in zip(graphs, fused_nodes)]
        self.claimed_graphs.clear()
        singles = [self._single_node_compute(g) for g in hal_graphs]
        to_compile = [i for i, s in enumerate(singles) if s is None]
        compiled, contexts = compile_graphs(self.ep, [hal_graphs[i] for i in to_compile],
                                            [fused_nodes[i] for i in to_compile], self.make_context_nodes) \
            if to_compile else ([], [])
        infos: list[NodeComputeInfo] = list(singles)  # type: ignore[arg-type]
        context_nodes: list = [None] * count
        for i, info, context in zip(to_compile, compiled, contexts):
            infos[i], context_nodes[i] = info, context
        out = ctypes.cast(args[3], POINTER(c_void_p))
        for i, (info, node, graph) in enumerate(zip(infos, fused_nodes, hal_graphs)):
            adapter = ComputeAdapter(self, info, node)
            adapter.output_shapes = [tuple(v.shape) if v.has_static_shape else None for v in graph.outputs]
            self.compute_infos[adapter.address] = adapter
            out[i] = adapter.address
        if self.make_context_nodes and args[4]:
            nodes = ctypes.cast(args[4], POINTER(c_void_p))
            for i, context in enumerate(context_nodes):
                nodes[i] = context_node(self.api, context) if context is not None else None

    def _typed(self, graph: Graph) -> Graph:
        """``graph`` with the types get_capability inferred for values onnxruntime gives no rank."""
        if self.inferred_types:
            apply_types(graph, self.inferred_types)
        return graph

    def _claimed(self, graph: Graph) -> Graph:
        """The filtered graph get_capability made for the group onnxruntime compiles as ``graph``, if
        it is the same group with the same inputs, outputs and constants (the EP then keeps the plan
        it made while claiming); else ``graph``."""
        return self.claimed_graphs.get(group_signature(graph), graph)

    def compatibility_info(self, args: Any) -> int:
        """GetCompiledModelCompatibilityInfo: written into a compiled model's metadata."""
        return self.factory.strings(self.ep.get_compiled_model_compatibility_info(GraphWalk(self.api, args[0]).graph))

    def _single_node_compute(self, graph: Graph) -> NodeComputeInfo | None:
        """Groups of one node the EP claimed with ``add_single_node`` run through its kernel."""
        if len(graph.nodes) != 1 or graph.nodes[0].name not in self.single_nodes:
            return None
        node = graph.nodes[0]
        return KernelComputeInfo(self.ep.create_kernel(node, GraphKernelCreateContext(graph)), node, graph)

    def layout_decision(self, domain: str, op_type: str, target: OrtEpDataLayout) -> int:
        """ShouldConvertDataLayoutForOp: the EP's answer, with onnxhal's rule where it leaves the choice
        to the runtime: only the ops onnxhal's own layout pass converts (Conv, pools, LRN) go NHWC, so
        the EP sees inside onnxruntime the NHWC ops it claims in onnxhal. onnxruntime decides MaxPool
        itself (its second output, Indices, stays NCHW)."""
        decision = self.ep.should_convert_data_layout_for_op(domain, op_type, target)
        if decision == 0 or (domain, op_type) not in LAYOUT_SENSITIVE:
            return 0
        if decision > 0:
            return 1
        return -1 if op_type == "MaxPool" else 1

    def release_compute_infos(self, args: Any) -> None:
        for p in words(args[0], args[1]):
            adapter = self.compute_infos.pop(p, None)
            if adapter is not None:
                d.objects.pop(adapter.address, None)

    def default_memory_device(self, args: Any) -> None:
        """OrtEp::GetDefaultMemoryDevice (API 27): the OrtMemoryDevice of the memory the hal Ep names, one
        the bridge declared on its EP devices; NULL where it names none (onnxruntime then uses the EP
        devices' DEFAULT memory) or where the bridge declares no device memory (values stay on the host)."""
        chosen = self.ep.get_default_memory_device()
        if chosen is None:
            return
        known = self.factory.memory_infos.get(chosen)
        if known is None:
            if not self.factory.declare_memory or chosen.device_type == OrtMemoryInfoDeviceType.CPU:
                return
            raise InvalidArgument(
                f"{self.ep.name}.get_default_memory_device() returned {chosen}, which its EP devices do not declare "
                f"(declared: {sorted(map(str, self.factory.memory_infos)) or 'none'}); return one of those or None")
        write_out(args[0], self.api.ep["MemoryInfo_GetMemoryDevice"](known[1]))

    def available_resource(self, args: Any) -> None:
        """OrtEp::GetAvailableResource (API 26): the hal Ep's free device memory, in bytes, as
        onnxruntime's OrtResourceCount (onnxruntime_ep_c_api.h: a uint32 kind, TotalBytes = 1, a
        reserved uint32, then a 48-byte union whose first uint64 is the byte count). None leaves the
        kind None (0): onnxruntime then sets no budget from the device."""
        available = self.ep.get_available_resource()
        if available is None:
            return
        if isinstance(available, bool) or not isinstance(available, (int, np.integer)) or available < 0:
            raise InvalidArgument(f"{self.ep.name}.get_available_resource() returned {available!r}; return the bytes of "
                                  "device memory still free (an int >= 0) or None")
        count = ResourceCount.from_address(args[0])
        count.kind, count.reserved, count.total_bytes = RESOURCE_TOTAL_BYTES, 0, int(available)

    def set_dynamic_options(self, args: Any) -> None:
        n = args[2]
        keys, values = ctypes.cast(args[0], POINTER(ctypes.c_char_p)), ctypes.cast(args[1], POINTER(ctypes.c_char_p))
        self.ep.set_dynamic_options({keys[i].decode(): values[i].decode() for i in range(n)})

    def release(self) -> None:
        if self.stream_devices:
            unregister_session_streams(self)
        for adapter in list(self.compute_infos.values()):
            d.objects.pop(adapter.address, None)
        self.compute_infos.clear()
        self.claimed_graphs.clear()
        self.factory.factory.release_ep(self.ep)


