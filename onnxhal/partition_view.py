"""A session's partition as a user reads it: nodes per EP, partitions (connected runs of nodes on one
EP), and the transfers between them with their bytes.

Shared by the partition table (``run``, ``partition``, ``demo``) and the partition picture, so the
numbers in the table and on the picture are the same numbers. Computed from the partitioned graph
(after the optimizer, before fusion) and its value shapes, not from a run: a transfer is a value
read by a node on another EP's memory than where it was produced (graph inputs and outputs live on
the host), counted once per value and destination, as the executor's copy planner counts them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from onnxhal.hal import Graph, Node
from onnxhal.hal.errors import InvalidGraph
from onnxhal.runtime.env.environment import CPU_EP_NAME

if TYPE_CHECKING:
    from onnxhal.runtime.session.inference_session import InferenceSession

#: The host side of a graph input or output (the caller's memory).
HOST = "host"

# Nodes whose value follows from constants and shapes only: folded into their consumers in the picture.
_SHAPE_OPS = frozenset({"Shape", "Size", "Constant", "ConstantOfShape", "EyeLike", "Range"})


@dataclass
class Partition:
    """A maximal connected set of nodes assigned to one EP."""

    index: int
    ep_name: str
    nodes: list[Node] = field(default_factory=list)


@dataclass
class Transfer:
    """The values copied from one partition (or the host) to another, with their total bytes."""

    src: int | str  # a partition index, or HOST
    dst: int | str
    values: list[str] = field(default_factory=list)
    nbytes: int = 0
    unknown_sizes: int = 0  # values whose shape is not static (their bytes are not in nbytes)


@dataclass
class PartitionView:
    graph: Graph
    nodes: list[Node]  # every node, in topological order
    partitions: list[Partition]
    partition_of: dict[int, int]  # id(node) -> partition index
    transfers: list[Transfer]

    def nodes_per_ep(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.partitions:
            out[p.ep_name] = out.get(p.ep_name, 0) + len(p.nodes)
        return out

    def partitions_per_ep(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.partitions:
            out[p.ep_name] = out.get(p.ep_name, 0) + 1
        return out

    def transfer_totals(self) -> tuple[int, int]:
        """(values copied, bytes) over all transfers; bytes of values of unknown shape not included."""
        return sum(len(t.values) for t in self.transfers), sum(t.nbytes for t in self.transfers)

    def unknown_sizes(self) -> int:
        """Transferred values whose shape is not static (a dynamic axis): their bytes are not counted."""
        return sum(t.unknown_sizes for t in self.transfers)

    def ep_of(self, end: int | str) -> str:
        return HOST if end == HOST else self.partitions[int(end)].ep_name


def value_bytes(graph: Graph, name: str) -> int | None:
    """Bytes of value ``name`` when its shape and type are static, else None."""
    arr = graph.initializer(name)
    if arr is not None:
        return int(arr.nbytes)
    vi = graph.value_infos.get(name)
    if vi is None or vi.dtype is None or vi.shape is None or not all(isinstance(d, int) and d >= 0 for d in vi.shape):
        return None
    return int(np.prod(vi.shape, dtype=np.int64)) * np.dtype(vi.dtype).itemsize


def _same_memory(a: str, b: str) -> bool:
    # The CPU EP and the host share memory: no copy between them.
    return a == b or {a, b} <= {CPU_EP_NAME, HOST}


def build_view(graph: Graph, groups: Sequence[Sequence[Node]], fused: Sequence[bool] | None = None) -> PartitionView:
    """The view of ``groups`` (what each EP claimed as one unit: a fused subgraph, or the single
    nodes it took; each node with ``ep_name`` set) in ``graph`` (for shapes). ``fused[k]``: group k
    is a fused subgraph (default: none is). A partition is a fused subgraph's connected part, or a
    connected run of one EP's single nodes that no path through another EP's nodes leaves and
    re-enters (so partitions never depend on each other in a cycle)."""
    from onnxhal.runtime.loader.model_loader import toposort

    group_of = {id(n): k for k, g in enumerate(groups) for n in g}
    is_fused = list(fused) if fused is not None else [False] * len(groups)
    everything = [n for g in groups for n in g]
    try:
        nodes = toposort(everything)
    except InvalidGraph:  # subgraph bodies (If branches) may reuse names: keep the partitioner's order
        nodes = everything
    producer: dict[str, Node] = {o: n for n in nodes for o in n.outputs if o}
    parent: dict[int, int] = {id(n): id(n) for n in nodes}
    # Level: how many changes of group the longest path to a node crosses. Single nodes join only
    # at equal level, which keeps CPU -> NPU -> CPU apart as two CPU partitions.
    level: dict[int, int] = {}
    for n in nodes:
        level[id(n)] = max((level[id(p)] + (group_of[id(p)] != group_of[id(n)])
                            for p in (producer.get(i) for i in n.inputs if i) if p is not None), default=0)

    def find(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    for n in nodes:
        for i in n.inputs:
            p = producer.get(i) if i else None
            if p is not None and group_of[id(p)] == group_of[id(n)] and (
                    is_fused[group_of[id(n)]] or level[id(p)] == level[id(n)]):
                parent[find(id(p))] = find(id(n))
    partitions: list[Partition] = []
    index_of_root: dict[int, int] = {}
    partition_of: dict[int, int] = {}
    for n in nodes:  # nodes come in topological order, so partitions are numbered in order too
        root = find(id(n))
        if root not in index_of_root:
            index_of_root[root] = len(partitions)
            partitions.append(Partition(len(partitions), n.ep_name))
        k = index_of_root[root]
        partitions[k].nodes.append(n)
        partition_of[id(n)] = k
    transfers: dict[tuple, Transfer] = {}
    copied: set[tuple[str, str]] = set()  # (value, destination EP): one copy serves every reader there

    def add(value: str, src: int | str, dst: int | str, src_ep: str, dst_ep: str) -> None:
        if _same_memory(src_ep, dst_ep) or (value, dst_ep) in copied:
            return
        copied.add((value, dst_ep))
        t = transfers.setdefault((src, dst), Transfer(src, dst))
        t.values.append(value)
        size = value_bytes(graph, value)
        if size is None:
            t.unknown_sizes += 1
        else:
            t.nbytes += size

    for n in nodes:
        dst = partition_of[id(n)]
        for i in n.inputs:
            if not i:
                continue
            p = producer.get(i)
            if p is not None:
                add(i, partition_of[id(p)], dst, p.ep_name, n.ep_name)
            elif graph.initializer(i) is None:  # a graph input: the caller's memory, copied every run
                add(i, HOST, dst, HOST, n.ep_name)
            # (initializers are placed on their device once, at session creation, not per run)
    for o in graph.output_names:
        p = producer.get(o)
        if p is not None:
            add(o, partition_of[id(p)], HOST, p.ep_name, HOST)
    return PartitionView(graph, nodes, partitions, partition_of, list(transfers.values()))


def session_view(sess: InferenceSession) -> PartitionView:
    """The view of an ``InferenceSession``'s partition (``sess.partition`` on ``sess.graph``)."""
    fused_sets = [{id(n) for n in g.nodes} for g in sess.partition.groups]
    assigned = sess.partition.assigned
    return build_view(sess.graph, [a.nodes for a in assigned],
                      [{id(n) for n in a.nodes} in fused_sets for a in assigned])


def is_shape_only(node: Node, constant: set[str]) -> bool:
    """Whether ``node`` computes from constants and shapes alone (``constant``: names known constant)."""
    if node.op_type in _SHAPE_OPS:
        return True
    ins = [i for i in node.inputs if i]
    return bool(ins) and all(i in constant for i in ins)


def format_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"
