"""The host backend of the simulated devices: their partitions run on the CPU EP's kernels.

Used when no OpenCL device passes discovery's probe (a CPU newer than the driver's LLVM, no driver,
or ``ONNXHAL_OPENCL=off``): a simulated device must not depend on a driver. Everything a user can
observe of the device stays as on the OpenCL backend:

- placement: the same ``get_capability`` (profile limits and the OpenCL EP's kernel coverage), only
  no program is built, so the same nodes land on the device;
- memory: a memory device of its own (``VirtualNpu(<profile>)``), buffers counted against the
  profile's capacity, weights charged too; values are really copied in and out (numpy copies);
- fp16: float32 values entering and leaving a partition and its weights are rounded through
  numpy's float16, as the OpenCL backend stores them with ``vstore_half_rte``; inside a partition
  float32, as an NPU's wide accumulators;
- faults, failover, the cost model and EPContext (the blob then holds the partition's ONNX graph,
  and its compatibility string says ``backend=host``, so it never loads on the OpenCL backend);
- graph capture (provider option ``enable_graph_capture``): a capture run records each partition
  run with its input buffers and output destinations, a replay runs them again (``VirtualEp``).

No streams: the host runs each partition to completion before ``compute`` returns.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from onnxhal.hal.allocator import Allocator
from onnxhal.hal.data_transfer import DataTransfer
from onnxhal.hal.ep import KernelContext, NodeComputeInfo
from onnxhal.hal.errors import EPFail, InvalidArgument
from onnxhal.hal.graph import Graph, Node
from onnxhal.hal.host_execution import host_plan
from onnxhal.hal.memory_info import OrtMemoryDevice
from onnxhal.hal.sync_stream import SyncStream
from onnxhal.hal.tensor import DeviceTensor
from onnxhal.simulators.device_memory import ChargingMixin, carried_elsewhere, meter_transfers
from onnxhal.simulators.fp16 import overflows, stored, stored_weight

BACKEND_HOST = "host"
BACKEND_OPENCL = "opencl"
#: Stands for the OpenCL device key in the compatibility string of a host-backend partition.
HOST_COMPAT_KEY = "backend=host"
_F32 = np.dtype(np.float32)


class HostDeviceAllocator(ChargingMixin, Allocator):
    """A simulated device's memory on the host backend: numpy byte buffers, capped at the profile's
    capacity, labelled with the device's memory info (so the runtime copies values in and out)."""

    def _alloc(self, size: int) -> object:
        return np.empty(max(int(size), 1), dtype=np.uint8)

    def tensor(self, shape: Sequence[int], dtype: np.dtype) -> DeviceTensor:
        return DeviceTensor.allocate(tuple(shape), np.dtype(dtype), self)


def host_view(t: Any) -> np.ndarray:
    """A numpy view of a host-backend device tensor (no copy); host arrays pass through."""
    if not isinstance(t, DeviceTensor):
        return np.asarray(t)
    if not isinstance(t.buffer, np.ndarray):
        raise InvalidArgument(f"{t!r} is not in a host-backend simulated device's memory")
    if t.dtype == object:
        raise InvalidArgument(f"{t!r}: a simulated device holds numeric tensors only")
    raw = t.buffer[t.offset:t.offset + t.nbytes]
    return raw.view(t.dtype).reshape(t.shape)


def _copy_bytes(target: np.ndarray, source: np.ndarray) -> None:
    """``source``'s bytes into the C-contiguous ``target`` of the same size (any dtype)."""
    target.reshape(-1).view(np.uint8)[:] = np.ascontiguousarray(source).reshape(-1).view(np.uint8)


def _round_half(a: np.ndarray, dtype: str = "float16") -> np.ndarray:
    """float32 rounded through fp16 (or bf16) storage, round to nearest even as the OpenCL
    backend's store kernels; other dtypes as they are."""
    return stored(a, dtype) if a.dtype == _F32 else a


class HostDataTransfer(DataTransfer):
    """Copies between host memory and the host-backend simulated devices of ``table`` (and between
    two of them), charging the simulated host link like the OpenCL backend's transfer."""

    def __init__(self, table: Any, own: OrtMemoryDevice | None, own_meter: Any) -> None:
        self.table = table
        self.own = own
        self.own_meter = own_meter

    def can_copy(self, src_memory_device: OrtMemoryDevice, dst_memory_device: OrtMemoryDevice) -> bool:
        if carried_elsewhere(self.own, src_memory_device, dst_memory_device):
            return False
        src_ok = src_memory_device.is_host or src_memory_device in self.table.devices
        dst_ok = dst_memory_device.is_host or dst_memory_device in self.table.devices
        return src_ok and dst_ok and not (src_memory_device.is_host and dst_memory_device.is_host)

    def copy_tensors(self, src: Sequence[object], dst: Sequence[object],
                     streams: Sequence[SyncStream | None] | None = None) -> None:
        if len(src) != len(dst):
            raise InvalidArgument(f"copy_tensors: {len(src)} sources but {len(dst)} destinations")
        for i, (s, d) in enumerate(zip(src, dst)):
            s_arr = host_view(s) if isinstance(s, DeviceTensor) else np.asarray(s)
            if s_arr.nbytes != d.nbytes:
                raise InvalidArgument(f"copy_tensors: pair {i}: source {s_arr.dtype}{list(s_arr.shape)} has "
                                      f"{s_arr.nbytes} bytes, destination {d.dtype}{list(d.shape)} has {d.nbytes}")
            if isinstance(d, DeviceTensor):
                target = host_view(d)
            else:
                if not (d.flags.c_contiguous and d.flags.writeable):
                    raise InvalidArgument(f"copy_tensors: pair {i}: host destination must be a writable "
                                          "C-contiguous array; allocate it with numpy.empty")
                target = d
            if s_arr.nbytes:
                _copy_bytes(target, s_arr)
        meter_transfers(self.table, self.own, self.own_meter, list(src), list(dst))


@dataclass
class HostPartitionPlan:
    """What an EPContext blob holds for a host-backend partition: its ONNX graph (weights already
    rounded where the profile stores fp16) and the opsets it was written for."""

    graph: np.ndarray  # serialized onnx.GraphProto as uint8
    opset: dict
    input_names: list

    @classmethod
    def of(cls, graph: Graph) -> HostPartitionPlan:
        data = graph.to_proto().SerializeToString()
        return cls(np.frombuffer(data, dtype=np.uint8).copy(), dict(graph.opset), list(graph.input_names))

    def to_graph(self) -> Graph:
        return Graph.from_proto(onnx.GraphProto.FromString(self.graph.tobytes()), self.opset)


def rounded_weights(graph: Graph, on_overflow: Callable[[str], None] | None = None, dtype: str = "float16") -> Graph:
    """``graph`` with its float32 constant initializers rounded through fp16 (or bf16, ``dtype``)
    storage (a new Graph), clamped to its range as ``fp16.stored_weight`` says; names of weights
    beyond the range go to ``on_overflow``."""
    if not any(np.asarray(a).dtype == _F32 for a in graph.initializers.values()):
        return graph
    for name, a in graph.initializers.items():
        if on_overflow is not None and overflows(np.asarray(a), dtype):
            on_overflow(name)
    out = Graph(graph.name, list(graph.nodes), list(graph.inputs), list(graph.outputs),
                {k: stored_weight(np.asarray(v), dtype) for k, v in graph.initializers.items()},
                dict(graph.value_infos), graph.opset, parent=graph.parent)
    out.overridable = list(graph.overridable)
    return out


def host_memory_edges(graph: Graph, disabled_fusions: frozenset[str] = frozenset(),
                      data: frozenset[str] = frozenset()) -> tuple[frozenset[int], frozenset[int], frozenset[int]]:
    """The partition's ``host_inputs``, ``metadata_inputs`` and ``host_outputs`` as the OpenCL
    backend gives them, so the runtime copies (and the meter charges) the same values on both
    backends: a partition specialised per signature takes its parameters in host memory, reads
    some inputs only for their shape and hands its shape values over in host memory
    (``dynamic_partition.host_edges``); a static plan takes the index inputs of its Gathers in host
    memory (``plan_builder``'s ``host_indices``). ``data``: the inputs computed from the feeds
    (``OpenCLBackend.data_inputs``), never shape values."""
    from onnxhal.runtime.providers.opencl.dynamic_partition import (
        host_edges,
        partition_shape_values,
        shape_value_rules,
        specialised,
    )

    if specialised(graph, disabled_fusions, data):
        values_rule, tensors_rule = shape_value_rules(disabled_fusions)
        return host_edges(graph, partition_shape_values(graph, tensors_rule, data) if values_rule else frozenset())
    indices = {n.inputs[1] for n in graph.nodes if n.op_type == "Gather" and not n.domain and len(n.inputs) > 1}
    return (frozenset(i for i, name in enumerate(graph.input_names) if name in indices and name not in graph.initializers),
            frozenset(), frozenset())


class HostNodeComputeInfo(NodeComputeInfo):
    """One partition of a simulated device run by the CPU EP's kernels (an execution plan of its
    own, built once: plans hold no per-run state, so many threads may run it at once). Its inputs
    and outputs live where the OpenCL backend's would (``host_memory_edges``)."""

    def __init__(self, graph: Graph, allocator: Allocator, half: bool,
                 logger: logging.Logger, on_overflow: Callable[[str], None] | None = None,
                 storage: str = "float16", disabled_fusions: frozenset[str] = frozenset(),
                 data_inputs: frozenset[str] = frozenset()) -> None:
        self.graph = graph
        self.allocator = allocator
        self.half = half
        self.storage = storage  # what ``half`` stores float32 values as: float16 or bfloat16
        self.on_overflow = on_overflow
        self.fp16_edges: Any = None  # simulators.ep.Fp16Edges: which inputs/outputs stay float32
        self.plan = HostPartitionPlan.of(graph)
        self._exec = host_plan(graph, logger=logger)
        self.host_inputs, self.metadata_inputs, self.host_outputs = host_memory_edges(graph, disabled_fusions,
                                                                                      data_inputs)

    @property
    def weight_bytes(self) -> int:
        return sum(int(np.asarray(a).nbytes) for a in self.graph.initializers.values())

    def create_state(self, fused_node: Node) -> object:
        return self

    def compute(self, state: Any, context: KernelContext) -> list:
        keep_in = self.fp16_edges.keep_inputs if self.fp16_edges is not None else frozenset()
        keep_out = self.fp16_edges.keep_outputs if self.fp16_edges is not None else frozenset()
        feeds = {}
        for i, (name, t) in enumerate(zip(self.graph.input_names, context.inputs)):
            if i in self.metadata_inputs:
                # only Shape or Size reads it, and the runtime hands it over uncopied, possibly in
                # another device's memory: an array of its shape and dtype stands for it
                feeds[name] = np.broadcast_to(np.zeros((), t.dtype), t.shape) if isinstance(t, DeviceTensor) else t
                continue
            a = host_view(t) if isinstance(t, DeviceTensor) else t
            feeds[name] = self._stored(name, a) if self.half and isinstance(a, np.ndarray) and i not in keep_in else a
        results = self._exec.run(feeds, context.run_options)
        outputs = []
        for k, r in enumerate(results):
            a = np.asarray(r, order="C")  # not ascontiguousarray, which makes a 0-d result 1-d
            if a.dtype == object:
                raise EPFail(f"partition output {self.graph.output_names[k]!r} is not a numeric tensor; "
                             "a simulated device holds numeric tensors only")
            if self.half and k not in keep_out:
                a = self._stored(self.graph.output_names[k], a)
            if k in self.host_outputs:
                outputs.append(a)
                continue
            t = DeviceTensor.allocate(a.shape, a.dtype, self.allocator)
            if a.nbytes:
                _copy_bytes(host_view(t), a)
            outputs.append(t)
        return outputs

    def release_state(self, state: Any) -> None:
        pass

    def _stored(self, name: str, a: np.ndarray) -> np.ndarray:
        """``a`` as fp16 (bf16) storage gives it back, reporting a finite value that becomes inf."""
        if self.on_overflow is not None and overflows(a, self.storage):
            self.on_overflow(name)
        return _round_half(a, self.storage)
