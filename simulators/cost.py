"""The cost model of simulated devices: simulated device time and energy per kernel and transfer.

Per node of a compiled partition: ``time = max(work / peak[dtype], bytes / memory_bandwidth) +
kernel_launch``, where ``work`` counts multiply-adds as two operations and ``bytes`` is every tensor
the node reads and writes at the compute dtype's size (float32 models on an fp16 device move half
the bytes). Views (Reshape, Flatten, Squeeze, Unsqueeze, Identity) are free, and so are the nodes that
compute only shape values (rule ``shape_values``): the partition is specialised per signature and
has their results as constants, so no kernel runs for them. A transfer between host
and device costs ``host_link_latency + bytes / host_link_bandwidth``. Energy is ``active power x
simulated busy time``. The slowdown fault multiplies device time.

``Meter`` accumulates these per EP instance (session); ``step_figures`` gives per-step figures for
the session's profiling trace (via ``VirtualEp.profiling_step_args``); ``explain_rows`` summarises a session for ``onnxhal run
--explain`` and ``onnxhal matrix``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from onnxhal.hal.graph import Graph, Node
from onnxhal.simulators.profiles import Profile

FREE_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})
MOVE_OPS = frozenset({"Transpose", "Concat", "Slice", "Gather", "Expand"})
TRANSCENDENTAL_OPS = frozenset({"Exp", "Log", "Erf", "Gelu", "Tanh", "Sigmoid", "Softplus", "Pow", "Sqrt",
                                "Elu", "Selu", "Reciprocal", "Div"})
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1, "uint8": 1, "int16": 2, "int32": 4}


@dataclass(frozen=True)
class KernelCost:
    op_type: str
    work: float  # operations
    nbytes: float
    seconds: float


@dataclass(frozen=True)
class PartitionCost:
    """Simulated cost of one run of one compiled partition."""

    kernels: tuple[KernelCost, ...]
    dtype: str

    @property
    def seconds(self) -> float:
        return sum(k.seconds for k in self.kernels)

    @property
    def work(self) -> float:
        return sum(k.work for k in self.kernels)


def _numel(shape: Any) -> int:
    return int(np.prod(shape, dtype=np.int64)) if shape is not None else 0


def node_work(node: Node, shape_of) -> float:
    """Operations of one node (a multiply-add is two)."""
    op = node.op_type
    outs = [shape_of(o) for o in node.outputs if o]
    out_n = sum(_numel(s) for s in outs)
    x = shape_of(node.inputs[0]) if node.inputs and node.inputs[0] else None
    if op in ("Conv", "FusedConv"):
        w = shape_of(node.inputs[1])
        per_out = _numel(w[1:]) if w is not None else 1  # Cin/group x kernel
        return 2.0 * out_n * per_out + (out_n if op == "FusedConv" else 0)
    if op in ("MatMul", "FusedMatMul", "Gemm", "FusedGemm"):
        k = (x[0] if op in ("Gemm", "FusedGemm") and node.attr("transA", 0) else x[-1]) if x else 1
        return 2.0 * out_n * k + (out_n if op.startswith("Fused") or op == "Gemm" else 0)
    if op in ("MaxPool", "AveragePool"):
        return float(out_n * _numel(node.attr("kernel_shape", [1])))
    if op in ("GlobalAveragePool", "GlobalMaxPool") or op.startswith("Reduce"):
        return float(_numel(x))
    if op in ("Softmax", "LogSoftmax", "LayerNormalization"):
        return 8.0 * out_n
    if op == "BatchNormalization":
        return 2.0 * out_n
    if op in FREE_OPS or op in MOVE_OPS:
        return 0.0
    return (8.0 if op in TRANSCENDENTAL_OPS else 1.0) * out_n


def node_bytes(node: Node, shape_of, itemsize: int) -> float:
    if node.op_type in FREE_OPS:
        return 0.0
    names = [n for n in (*node.inputs, *node.outputs) if n]
    return float(sum(_numel(shape_of(n)) for n in names) * itemsize)


def partition_cost(graph: Graph, profile: Profile, shape_of, shape_values: frozenset[str] = frozenset()) -> PartitionCost:
    """Cost of one run of the partition ``graph`` on ``profile``'s device; the nodes whose outputs
    are all in ``shape_values`` are computed on the host at specialisation and cost nothing."""
    dtype = profile.compute_dtype if profile.compute_dtype != "none" else "float32"
    itemsize = DTYPE_BYTES[dtype]
    peak = profile.peak_ops_per_s(dtype)
    bw = profile.memory_bandwidth_gbps * 1e9
    launch = profile.kernel_launch_us * 1e-6
    kernels = []
    for n in graph.nodes:
        work = node_work(n, shape_of)
        nbytes = node_bytes(n, shape_of, itemsize)
        folded = bool(shape_values) and any(n.outputs) and all(o in shape_values for o in n.outputs if o)
        secs = 0.0 if n.op_type in FREE_OPS or folded else max(work / peak, nbytes / bw) + launch
        kernels.append(KernelCost(n.op_type, work, nbytes, secs))
    # NHWC devices: the runtime's layout transformer puts explicit Transpose nodes at the edges of
    # NHWC regions; they are nodes of the partition and are costed above like any data movement.
    return PartitionCost(tuple(kernels), dtype)


def transfer_seconds(profile: Profile, nbytes: int) -> float:
    return profile.host_link_latency_us * 1e-6 + nbytes / (profile.host_link_bandwidth_gbps * 1e9)


@dataclass
class MeterTotals:
    runs: int = 0
    kernel_seconds: float = 0.0
    kernels: int = 0
    transfer_seconds: float = 0.0
    transfers: int = 0
    transfer_bytes: int = 0
    energy_joules: float = 0.0

    @property
    def device_seconds(self) -> float:
        return self.kernel_seconds + self.transfer_seconds

    def as_dict(self) -> dict[str, float]:
        return {"runs": self.runs, "device_ms": self.device_seconds * 1e3, "kernel_ms": self.kernel_seconds * 1e3,
                "kernels": self.kernels, "transfer_ms": self.transfer_seconds * 1e3, "transfers": self.transfers,
                "transfer_bytes": self.transfer_bytes, "energy_mj": self.energy_joules * 1e3}


@dataclass
class Meter:
    """Simulated time and energy of one EP instance: ``total`` over its life, ``last_run`` for the
    most recent run (runs of one session from several threads at once share ``current``)."""

    profile: Profile
    slowdown: float = 1.0
    total: MeterTotals = field(default_factory=MeterTotals)
    last_run: MeterTotals = field(default_factory=MeterTotals)
    current: MeterTotals = field(default_factory=MeterTotals)
    wall_busy_seconds: float = 0.0
    wall_slept_seconds: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def begin_run(self) -> None:
        with self._lock:
            self.current = MeterTotals(runs=1)

    def end_run(self) -> None:
        with self._lock:
            self.last_run = self.current
            self.total.runs += 1

    def _add(self, kernel_s: float, kernels: int, transfer_s: float, transfers: int, nbytes: int) -> None:
        energy = (kernel_s + transfer_s) * self.profile.active_w
        with self._lock:
            for t in (self.total, self.current):
                t.kernel_seconds += kernel_s
                t.kernels += kernels
                t.transfer_seconds += transfer_s
                t.transfers += transfers
                t.transfer_bytes += nbytes
                t.energy_joules += energy

    def add_partition(self, cost: PartitionCost) -> None:
        self._add(cost.seconds * self.slowdown, sum(1 for k in cost.kernels if k.seconds), 0.0, 0, 0)

    def add_wall(self, busy: float, slept: float) -> None:
        """Wall-clock seconds a slowed-down compute spent working and sleeping (fault_slowdown)."""
        with self._lock:
            self.wall_busy_seconds += busy
            self.wall_slept_seconds += slept

    def add_transfer(self, nbytes: int) -> float:
        secs = transfer_seconds(self.profile, nbytes) * self.slowdown
        self._add(0.0, 0, secs, 1, int(nbytes))
        return secs


# -- sessions: profiling trace and explain ------------------------------------------------------
def virtual_eps(session: Any) -> dict[str, Any]:
    """The session's simulated EPs by name (empty when it uses none)."""
    from onnxhal.simulators.ep import VirtualEp

    return {name: ep for name, ep in session.eps.items() if isinstance(ep, VirtualEp)}


def step_figures(ep: Any, node: Node | None, inputs: list, outputs: list) -> dict:
    """Simulated figures for one profiling event: a node of ``ep``, or a copy into or out of its
    memory (``node`` None). What ``VirtualEp.profiling_step_args`` returns."""
    if node is not None:
        cost = ep.partition_costs.get(node.name)
        if cost is None:
            return {}
        secs = cost.seconds * ep.meter.slowdown
        return {"sim_device": ep.profile.name, "sim_device_us": round(secs * 1e6, 3),
                "sim_energy_uj": round(secs * ep.profile.active_w * 1e6, 3), "sim_dtype": cost.dtype}
    mine = ep.memory_info.memory_device
    for v in (*outputs, *inputs):
        if getattr(getattr(v, "memory_info", None), "memory_device", None) == mine:
            secs = transfer_seconds(ep.profile, int(getattr(v, "nbytes", 0))) * ep.meter.slowdown
            return {"sim_device": ep.profile.name, "sim_device_us": round(secs * 1e6, 3),
                    "sim_energy_uj": round(secs * ep.profile.active_w * 1e6, 3)}
    return {}


def attach_to_session(session: Any) -> bool:
    """Whether ``session``'s profiling trace carries simulated figures. The runtime asks every EP
    for them (``hal.Ep.profiling_step_args``), so nothing needs attaching any more; kept so that
    callers can check."""
    return getattr(session, "_profiler", None) is not None and bool(virtual_eps(session))


def explain_rows(session: Any) -> list[dict[str, Any]]:
    """One row per simulated EP of ``session``: device, nodes, last run's simulated figures."""
    rows = []
    summary = session.partition_summary
    for name, ep in virtual_eps(session).items():
        row = {"ep": name, "device": ep.profile.name, "nodes_on_device": summary.get(name, 0),
               "nodes_total": sum(summary.values()), "partitions": len(ep.partition_costs)}
        row.update(ep.meter.last_run.as_dict())
        rows.append(row)
    return rows
