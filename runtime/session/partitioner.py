"""Graph partitioning: each EP, in priority order, claims nodes through ``get_capability``.

ORT's rules (onnxruntime/core/framework/graph_partitioner.cc): EPs are visited in order and each
sees every graph, nested subgraphs first; ``add_single_node`` claims one unassigned node;
``add_nodes_to_fuse`` must form one partition with no outside node on a path between two members,
else the group is rejected (logged) and the EP gets none of it; a group touching a node another EP
already owns is skipped, so the first EP wins. What is left goes to the CPU EP if it is in the list.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field

from onnxhal.hal import Ep, EpGraphSupportInfo, Graph, Node, NodeFusionOptions
from onnxhal.hal.errors import Fail
from onnxhal.hal.errors import NotImplemented as OrtNotImplemented
from onnxhal.hal.fused_groups import outside_nodes_between
from onnxhal.runtime.loader.model_loader import toposort

logger = logging.getLogger("onnxhal.partitioner")


@dataclass
class FusedGroup:
    ep_name: str
    owner: Graph
    nodes: list[Node]
    options: NodeFusionOptions
    filtered: Graph | None = None
    fused_node: Node | None = None
    context_node: Node | None = None  # the EP's EPContext node, when the session generates a compiled model


@dataclass
class AssignedSubgraph:
    """One unit of assignment info: a fused group, or an EP's single nodes in one graph."""

    ep_name: str
    nodes: list[Node]


@dataclass
class PartitionResult:
    groups: list[FusedGroup] = field(default_factory=list)
    assigned: list[AssignedSubgraph] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)  # reasons, for `onnxhal partition` and logs


#: Ops whose CPU kernels run their subgraphs through the runtime (``create_subgraph_runner``), so
#: the subgraphs' nodes may go to any EP. Other ops with subgraphs (SequenceMap, FlexAttention, ...)
#: hand theirs to onnx.reference as plain ONNX: a fused node in there could not run.
RUNTIME_SUBGRAPH_OPS = frozenset({("", "If"), ("", "Loop"), ("", "Scan")})


def _runs_subgraphs(node: Node) -> bool:
    return (node.domain if node.domain != "ai.onnx" else "", node.op_type) in RUNTIME_SUBGRAPH_OPS


def graphs_postorder(graph: Graph) -> list[Graph]:
    """Nested subgraphs the runtime runs (of If, Loop, Scan) before the graph that holds them."""
    out: list[Graph] = []
    for n in graph.nodes:
        if _runs_subgraphs(n):
            for sub in n.subgraph_list():
                out.extend(graphs_postorder(sub))
    out.append(graph)
    return out


def _cpu_only_subgraph_nodes(graphs: list[Graph]) -> list[Node]:
    """Nodes of subgraphs the CPU EP's kernels hand to onnx.reference whole (every level)."""
    out: list[Node] = []
    # a stack, not a recursive closure: a closure that calls itself is a reference cycle, left to the
    # collector at each session's creation
    for g in graphs:
        for n in g.nodes:
            if not _runs_subgraphs(n):
                pending = n.subgraph_list()[::-1]
                while pending:
                    sub = pending.pop()
                    for m in sub.nodes:
                        out.append(m)
                        pending.extend(m.subgraph_list()[::-1])
    return out


def partition(graph: Graph, eps: list[Ep], cpu_ep_name: str = "CPUExecutionProvider") -> PartitionResult:
    """Assign every node of ``graph`` and its subgraphs (sets ``node.ep_name``), collecting fused
    groups. Raises Fail when nodes are left and the CPU EP is not in ``eps``, NotImplemented when
    the CPU EP cannot run a node nobody else took."""
    result = PartitionResult()
    graphs = graphs_postorder(graph)
    fused: dict[int, list[set[int]]] = {}  # id(graph) -> the node ids of each group accepted there
    for g in graphs:
        for n in g.nodes:
            n.ep_name = ""
    for n in _cpu_only_subgraph_nodes(graphs):
        n.ep_name = cpu_ep_name
    for ep in eps:
        for g in graphs:
            info = EpGraphSupportInfo(g)
            try:
                ep.get_capability(g, info)
            except Exception as e:  # ORT: an EP whose GetCapability fails gets no nodes
                logger.warning("%s.get_capability failed on graph %r: %s: %s; it gets no nodes there",
                               ep.name, g.name, type(e).__name__, str(e))
                result.rejected.append(f"{ep.name}: get_capability raised {type(e).__name__}: {e}")
                continue
            in_graph = {id(n) for n in g.nodes}
            for nodes, options in info.fused_groups:
                reason = _check_group(g, nodes, in_graph, fused.setdefault(id(g), []))
                if reason:
                    logger.info("%s: fused group of %d node(s) rejected: %s", ep.name, len(nodes), reason)
                    result.rejected.append(f"{ep.name}: group of {len(nodes)} rejected: {reason}")
                    continue
                for n in nodes:
                    n.ep_name = ep.name
                fused[id(g)].append({id(n) for n in nodes})
                # the graph the EP saw when it asked for it (EpGraphSupportInfo.filtered_graph)
                result.groups.append(FusedGroup(ep.name, g, list(nodes), options, info.filtered_graph(nodes, options)))
                result.assigned.append(AssignedSubgraph(ep.name, list(nodes)))
            singles = [n for n in info.single_nodes if id(n) in in_graph and not n.ep_name]
            singles = list({id(n): n for n in singles}.values())  # a node claimed twice is assigned once
            for n in singles:
                n.ep_name = ep.name
                # one subgraph per single node, as onnxruntime reports a kernel-based EP's nodes
                result.assigned.append(AssignedSubgraph(ep.name, [n]))
    left = [(g, n) for g in graphs for n in g.nodes if not n.ep_name]
    if left:
        names = ", ".join(f"{n.op_type} {n.name!r}" for _, n in left[:10])
        if not any(ep.name == cpu_ep_name for ep in eps):
            raise Fail(f"This session contains graph nodes that are assigned to the default CPU EP, but fallback "
                       f"to CPU EP has been explicitly disabled by the user ({len(left)} node(s): {names}). "
                       "Enable fallback or add an EP that supports them.")
        g, n = left[0]
        raise OrtNotImplemented(
            f"Could not find an implementation for {n.op_type}({g.opset_version(n.domain)}) node with name "
            f"{n.name!r} (domain {n.domain or 'ai.onnx'!r}); {len(left)} node(s) unsupported: {names}. "
            "Add an EP whose library implements them (onnxhal.register_execution_provider_library), or export "
            "the model without them.")
    return result


def _check_group(g: Graph, nodes: list[Node], in_graph: set[int], fused: list[set[int]] = ()) -> str:
    ids = {id(n) for n in nodes}
    if len(ids) != len(nodes):
        return "a node appears twice"
    if any(id(n) not in in_graph for n in nodes):
        return f"a node is not in graph {g.name!r}"
    taken = [n for n in nodes if n.ep_name]
    if taken:
        return f"node {taken[0].name!r} already belongs to {taken[0].ep_name}"
    between = outside_nodes_between(g, ids, fused)
    if between:
        return (f"not one partition: node(s) {', '.join(repr(n.name or n.op_type) for n in between[:5])} "
                "outside the group (or in a group fused before it) lie on a path between its members")
    return ""


def name_fused_group(group: FusedGroup, index: int, model_hash: str) -> None:
    """Name the group's filtered graph (built when it was claimed) and make the fused node that
    replaces the group: its inputs and outputs are the filtered graph's."""
    filtered = group.filtered
    filtered.name = f"{group.ep_name}_{model_hash}_{index}"
    fused = Node(filtered.name, filtered.input_names, filtered.output_names,
                 name=f"{group.ep_name}_{filtered.name}_{index}", domain="com.onnxhal.fused")
    fused.ep_name = group.ep_name
    group.fused_node = fused


def replace_with_fused(group: FusedGroup) -> None:
    g = group.owner
    ids = {id(n) for n in group.nodes}
    g.nodes = toposort([n for n in g.nodes if id(n) not in ids] + [group.fused_node], g.name)
    g.reindex()


def restore_group(group: FusedGroup) -> None:
    """Undo ``replace_with_fused`` (the EP's compile failed): the original nodes come back."""
    g = group.owner
    g.nodes = toposort([n for n in g.nodes if n is not group.fused_node] + group.nodes, g.name)
    g.reindex()


def model_hash(graph: Graph) -> str:
    h = hashlib.sha1()
    for n in graph.nodes[:256]:
        h.update(f"{n.op_type}|{','.join(n.inputs)}|{','.join(n.outputs)};".encode())
    return h.hexdigest()[:8]
