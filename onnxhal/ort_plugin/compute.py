"""Compute: a compiled partition (``hal.NodeComputeInfo``) run from onnxruntime's kernel context.

``ComputeAdapter`` is the OrtNodeComputeInfo onnxruntime calls. Inputs arrive as onnxruntime
tensors: in the EP's memory (declared to onnxruntime, device_memory.py) they become hal
``DeviceTensor``s over the same buffer, in host memory numpy views of onnxruntime's buffer, copied
into the EP's memory first when the EP has memory onnxruntime does not know (``DeviceMemory``).
Each output goes straight into the tensor ``KernelContext_GetOutput`` gives: an output in device
memory becomes that tensor itself when onnxruntime allocates it then (``offer_for_output``), else it
is copied once, on the device or down into onnxruntime's host buffer.
"""

from __future__ import annotations

import ctypes
import itertools
import sys
import threading
from ctypes import c_size_t, c_void_p
from typing import TYPE_CHECKING, Any

import numpy as np

from onnxhal.hal.enums import OrtDeviceMemoryType
from onnxhal.hal.ep import Ep, EpFactory, Kernel, KernelContext, KernelCreateContext, NodeComputeInfo
from onnxhal.hal.ep_device import OrtEpDevice
from onnxhal.hal.errors import EPFail, InvalidArgument
from onnxhal.hal.graph import Graph, Node
from onnxhal.hal.tensor import DeviceTensor
from onnxhal.ort_plugin import dispatch as d
from onnxhal.ort_plugin import graph_capture
from onnxhal.ort_plugin.device_memory import host_or_device, offer_for_output, withdraw_offer
from onnxhal.ort_plugin.streams import stream_of_handle
from onnxhal.ort_plugin.structs import ComputeStruct, fill, write_out

if TYPE_CHECKING:
    from onnxhal.ort_plugin.adapter import EpAdapter


class GraphKernelCreateContext(KernelCreateContext):
    """What ``Ep.create_kernel`` may ask about the partition graph of a single claimed node."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    def is_constant_initializer(self, name: str) -> bool:
        return bool(name) and self.graph.is_constant_initializer(name)


class KernelComputeInfo(NodeComputeInfo):
    """A single node's kernel as a partition of one: onnxruntime feeds the fused node's inputs
    (each value once, in first-use order); the kernel wants the node's own input list."""

    def __init__(self, kernel: Kernel, node: Node, graph: Graph) -> None:
        self.kernel = kernel
        self.feed_names = graph.input_names
        self.constants = dict(graph.initializers)
        self.node_inputs = list(node.inputs)
        self.host_inputs = frozenset(i for i, n in enumerate(self.feed_names)
                                     if any(node.inputs[k] == n for k in kernel.host_inputs if k < len(node.inputs)))

    def compute(self, state: Any, context: KernelContext) -> list:
        env = dict(self.constants)
        env.update(zip(self.feed_names, context.inputs))
        return list(self.kernel.compute([env[n] if n else None for n in self.node_inputs]))


class DeviceMemory:
    """Where a hal EP keeps its values, and how to copy them there and back (None: host memory)."""

    def __init__(self, allocator: Any, transfer: Any) -> None:
        self.allocator = allocator
        self.transfer = transfer

    @classmethod
    def of(cls, factory: EpFactory, ep: Ep, ep_devices: list[OrtEpDevice]) -> DeviceMemory | None:
        info = next((e.memory_info(OrtDeviceMemoryType.DEFAULT) for e in ep_devices
                     if e.memory_info(OrtDeviceMemoryType.DEFAULT) is not None), None)
        if info is None or info.is_host:
            return None
        transfer = ep.create_data_transfer()  # the EP's own (it may meter the session's copies), else the factory's
        if transfer is None:
            transfer = factory.create_data_transfer()
        allocator = ep.create_allocator(info) or factory.create_allocator(info)
        if transfer is None or allocator is None:
            raise InvalidArgument(f"{factory.name} declares device memory {info.name!r} but provides no "
                                  f"{'data transfer' if transfer is None else 'allocator'} for it")
        return cls(allocator, transfer)

    def upload(self, arr: np.ndarray) -> DeviceTensor:
        t = DeviceTensor.allocate(arr.shape, arr.dtype, self.allocator)
        self.transfer.copy_tensors([arr], [t])
        return t

    def download(self, t: DeviceTensor) -> np.ndarray:
        host = np.empty(t.shape, t.dtype)
        self.transfer.copy_tensors([t], [host])
        return host


def sole_reference(out: Any) -> bool:
    """Whether nothing but this run holds ``out``'s buffer: the tensor owning it is referenced only by
    the run's output list and the loop's ``out`` (or, for a view, only by that view). A tensor the EP
    also keeps (a constant, a buffer reused across runs) or another output shares must stay the EP's:
    onnxruntime may write into the buffers of its values."""
    if not isinstance(out, DeviceTensor):
        return False
    own, base = _reference_counts(out)  # the same calls as _calibrate's
    return own <= _SOLE_OWN and (out.base is None or base <= _SOLE_BASE)


def _reference_counts(out: Any) -> tuple[int, int]:
    return sys.getrefcount(out), (sys.getrefcount(out.base) if out.base is not None else 0)


class _Probe:
    def __init__(self, base: Any = None) -> None:
        self.base = base


def _calibrate() -> tuple[int, int]:
    """The reference counts of a tensor held only as ``run`` holds its outputs (a list, the loop's
    variable) and of a view's base held only by the view, read through the same calls as
    ``sole_reference``: interpreters differ in what they count (CPython 3.11: 4 and 2; later ones
    may skip borrowed references), so the limits are measured here, not assumed."""
    owner = _Probe()
    outputs = [_Probe(), _Probe(owner)]
    del owner
    counts = []
    for i in range(len(outputs)):
        out = outputs[i]
        counts.append(_held_counts(out))
    return counts[0][0], counts[1][1]


def _held_counts(out: Any) -> tuple[int, int]:
    return _reference_counts(out)


_SOLE_OWN, _SOLE_BASE = _calibrate()


class ComputeAdapter:
    """One compiled partition (a ``hal.NodeComputeInfo``) as an OrtNodeComputeInfo."""

    _keys = itertools.count(1)

    def __init__(self, ep: EpAdapter, info: NodeComputeInfo, fused_node: Node) -> None:
        self.ep = ep
        self.api = ep.api
        self.info = info
        self.fused_node = fused_node
        self.host_inputs = frozenset(getattr(info, "host_inputs", ()))
        self.struct = fill(ComputeStruct())
        self.address = ctypes.addressof(self.struct)
        self.states: dict[int, Any] = {}
        #: The fused node's output shapes (None: not static), for a capture run's destinations.
        self.output_shapes: list[tuple[int, ...] | None] = [None] * len(fused_node.outputs)
        self._lock = threading.Lock()
        a = self.api.ort
        self._get_count, self._get_input, self.get_output, self._get_stream = (
            a["KernelContext_GetInputCount"], a["KernelContext_GetInput"], a["KernelContext_GetOutput"],
            a["KernelContext_GetGPUComputeStream"])
        d.objects[self.address] = self

    def create_state(self, args: Any) -> None:
        state = self.info.create_state(self.fused_node)
        key = next(self._keys)
        with self._lock:
            self.states[key] = state
        write_out(args[1], key)

    def release_state(self, args: Any) -> None:
        with self._lock:
            state = self.states.pop(args[0], None)
        self.info.release_state(state)

    def value_name(self, kind: str, i: int) -> str:
        names = self.fused_node.inputs if kind == "input" else self.fused_node.outputs
        return f"{kind} {i} ({names[i]!r}) of {self.fused_node.name!r}" if i < len(names) else f"{kind} {i}"

    def compute(self, args: Any) -> None:
        profiler = self.ep.profiler
        # bridge.c read the start as onnxruntime called; the end is read on the same clock
        start_ns = ctypes.c_int64(args[2]).value if profiler is not None and profiler.active else 0
        state, kctx = self.states[args[0]], args[1]
        api, memory = self.api, self.ep.memory
        n = c_size_t()
        api.check(self._get_count(kctx, ctypes.byref(n)), "KernelContext_GetInputCount")
        inputs: list[Any] = []
        value = c_void_p()
        for i in range(n.value):
            api.check(self._get_input(kctx, i, ctypes.byref(value)), "KernelContext_GetInput")
            if not value.value:
                inputs.append(None)  # an omitted optional input
                continue
            t = host_or_device(value.value, api, self.value_name("input", i))  # in the EP's memory if placed there
            if self.ep.run_capture.capturing and isinstance(t, DeviceTensor):
                graph_capture.keep(self.ep, self.value_name("input", i), value.value, t.buffer)
            if memory is not None:
                if isinstance(t, np.ndarray) and i not in self.host_inputs:
                    t = memory.upload(t)
                elif isinstance(t, DeviceTensor) and i in self.host_inputs:
                    # onnxruntime placed it in the EP's memory, where every input of a compiled node
                    # goes; the partition reads this one on the host (Gather indices it range-checks).
                    t = memory.download(t)
            inputs.append(t)
        stream = None
        if self.ep.stream_aware:  # the run's stream (streams.py): kernels and copies are queued on it
            handle = c_void_p()
            api.check(self._get_stream(kctx, ctypes.byref(handle)), "KernelContext_GetGPUComputeStream")
            stream = stream_of_handle(handle.value)
        # a capture run: onnxruntime's output tensors first, for the EP to write and keep (graph_capture.py)
        targets = graph_capture.destinations(self, kctx) if self.ep.run_capture.capturing else None
        ctx = KernelContext(inputs, len(self.fused_node.outputs), stream, None, targets)
        result = self.info.compute(state, ctx)
        outputs = list(ctx.outputs if result is None else result)
        del result, ctx  # from here ``outputs`` holds the run's outputs (sole_reference counts on it)
        for i in range(len(outputs)):
            out = outputs[i]
            if out is None:
                continue
            shape = tuple(out.shape)
            dims = (ctypes.c_int64 * len(shape))(*shape)
            if sole_reference(out):  # onnxruntime may allocate this output as the EP's own tensor
                offer_for_output(out)
            try:
                api.check(self.get_output(kctx, i, dims, len(shape), ctypes.byref(value)), "KernelContext_GetOutput")
            finally:
                withdraw_offer()
            target = host_or_device(value.value, api, self.value_name("output", i))
            if not isinstance(out, DeviceTensor):
                out = np.asarray(out)
            if target.dtype != out.dtype:
                raise EPFail(f"{self.ep.ep.name}: output {i} ({self.fused_node.outputs[i]!r}) of "
                             f"{self.fused_node.name!r} is {out.dtype}, onnxruntime expects {target.dtype}")
            if out is target or (isinstance(target, DeviceTensor) and isinstance(out, DeviceTensor)
                                 and target.buffer is out.buffer and target.offset == out.offset):
                continue  # onnxruntime took the EP's tensor itself, or the EP wrote its destination
            if not target.nbytes:
                continue
            if isinstance(target, DeviceTensor) or isinstance(out, DeviceTensor):
                # straight into onnxruntime's tensor: on the device, or down into its host buffer
                memory.transfer.copy_tensors([out], [target], [stream])
            else:
                np.copyto(target, out)
        if start_ns:
            profiler.record(self.fused_node, start_ns, d.clock_ns(), inputs, list(outputs))
