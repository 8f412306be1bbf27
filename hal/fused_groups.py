"""Fused groups: the rule a group of nodes must obey to be fused, and the graph ``compile`` gets.

One mechanism for the runtime's partitioner and every EP: an EP that fuses asks
``EpGraphSupportInfo.convex_groups`` for groups it may claim and ``EpGraphSupportInfo.filtered_graph``
for the graph it will compile (the very object the runtime later hands to ``Ep.compile``, so a plan
built while claiming can be kept), instead of re-deriving either.

The rule (onnxruntime's ``graph_partitioner.cc``): a group becomes one node, so no node outside it may
lie on a path between two of its members, or the fused node would be part of a cycle.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from onnxhal.hal.graph import Graph, Node, ValueInfo

if TYPE_CHECKING:
    from onnxhal.hal.ep import NodeFusionOptions


def outside_nodes_between(graph: Graph, members: set[int], fused: Iterable[set[int]] = ()) -> list[Node]:
    """Nodes outside ``members`` (node ids) that lie on a path between two members. ``fused`` are
    groups of ``graph`` already accepted: each becomes one node, so reaching one of its members
    reaches them all (two groups that each pass alone, one feeding the other and that one feeding
    back, would otherwise both be fused into a cycle)."""
    by_id = {id(n): n for n in graph.nodes}
    group_of = {nid: grp for grp in fused for nid in grp}

    def reach(step) -> set[int]:
        seen: set[int] = set()
        stack = [id(n) for n in graph.nodes if id(n) in members]
        while stack:
            for nxt in step(by_id[stack.pop()]):
                for nid in group_of.get(id(nxt), (id(nxt),)):
                    if nid not in seen:
                        seen.add(nid)
                        stack.append(nid)
        return seen

    def consumers(n: Node):
        return (c for o in n.outputs if o for c in graph.consumers(o))

    def producers(n: Node):
        return (p for i in (*n.inputs, *n.implicit_inputs) if i and (p := graph.producer(i)) is not None)

    return [by_id[i] for i in (reach(consumers) & reach(producers)) - members if i in by_id]


def convex_groups(graph: Graph, claimed: Sequence[Node]) -> list[list[Node]]:
    """``claimed`` nodes of ``graph`` merged along producer->consumer edges into connected groups, a
    merge made only while no node outside the merged group lies on a path between two of its
    members; each group in graph order, groups ordered by their first node."""
    nodes = graph.nodes
    index = {id(n): i for i, n in enumerate(nodes)}
    preds: list[list[int]] = [[] for _ in nodes]
    for i, n in enumerate(nodes):
        for name in (*n.inputs, *n.implicit_inputs):
            p = graph.producer(name) if name else None
            if p is not None and id(p) in index:
                preds[i].append(index[id(p)])
    # Ancestor and descendant sets as bit masks: a merge is checked in a few integer operations.
    anc = [0] * len(nodes)
    for i in range(len(nodes)):
        for p in preds[i]:
            anc[i] |= anc[p] | (1 << p)
    desc = [0] * len(nodes)
    for i in range(len(nodes) - 1, -1, -1):
        for p in preds[i]:
            desc[p] |= desc[i] | (1 << i)
    is_claimed = {index[id(n)] for n in claimed}
    group_of = {i: i for i in is_claimed}
    groups = {i: [1 << i, anc[i], desc[i], [i]] for i in is_claimed}

    def find(i: int) -> int:
        while group_of[i] != i:
            group_of[i] = group_of[group_of[i]]
            i = group_of[i]
        return i

    for c in sorted(is_claimed):
        for p in preds[c]:
            if p not in is_claimed:
                continue
            gp, gc = find(p), find(c)
            if gp == gc:
                continue
            mp, ap, dp, lp = groups[gp]
            mc, ac, dc, lc = groups[gc]
            mask, a, d = mp | mc, ap | ac, dp | dc
            if (a & d) & ~mask:
                continue  # some outside node is both after and before the merged group
            group_of[gc] = gp
            groups[gp] = [mask, a, d, lp + lc]
            del groups[gc]
    return [[nodes[i] for i in sorted(g[3])] for g in sorted(groups.values(), key=lambda g: min(g[3]))]


def filtered_graph(graph: Graph, nodes: Sequence[Node], drop_constant_initializers: bool = False,
                   name: str = "") -> Graph:
    """The graph of one fused group of ``graph`` as ``Ep.compile`` receives it: its inputs are the
    values the group reads from outside, its outputs the values it produces that a node outside or
    the graph's outputs read. Constant initializers the group reads are its initializers; without
    ``drop_constant_initializers`` they also stay inputs (the runtime feeds them from device memory,
    placed once), listed in ``overridable``."""
    ids = {id(n) for n in nodes}
    produced = {o for n in nodes for o in n.outputs if o}
    inputs: list[str] = []
    consts: dict = {}
    for n in nodes:
        for i in (*n.inputs, *n.implicit_inputs):
            if not i or i in produced or i in inputs or i in consts:
                continue
            if drop_constant_initializers and graph.is_constant_initializer(i):
                consts[i] = graph.initializers[i]
            else:
                inputs.append(i)
    graph_outputs = set(graph.output_names)
    outputs = [o for n in nodes for o in n.outputs
               if o and (o in graph_outputs or any(id(c) not in ids for c in graph.consumers(o)))]
    ordered = [n for n in graph.nodes if id(n) in ids]
    vis = {v: graph.value_info(v) for n in ordered for v in (*n.inputs, *n.outputs) if v}
    const_inputs = {i: graph.initializers[i] for i in inputs if graph.is_constant_initializer(i)}
    out = Graph(name or f"{graph.name}_fused", ordered, [vis.get(i) or graph.value_info(i) for i in inputs],
                [vis.get(o) or ValueInfo(o) for o in outputs], {**consts, **const_inputs}, vis, graph.opset,
                parent=graph)
    out.overridable = [vis.get(i) or graph.value_info(i) for i in const_inputs]
    return out


def group_key(nodes: Iterable[Node], options: NodeFusionOptions | None) -> tuple:
    """What identifies a claimed group: its nodes (as a set) and whether constants are dropped."""
    return frozenset(id(n) for n in nodes), bool(options and options.drop_constant_initializers)
