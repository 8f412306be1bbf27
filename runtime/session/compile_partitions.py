"""The compile stage: ``Ep.compile`` on the fused groups, their states, the fused nodes in place.

``compile_graphs`` is used by the session's stage (``compile_groups``) and by the onnxruntime bridge
(``onnxhal/ort_plugin``), so both read an EP's answer in one way: as many compute infos as graphs, and, when the session generates an
EPContext model, one EPContext node or None per graph (``hal.ep.Ep.compile``).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from onnxhal.hal import Ep, Graph, Node, NodeComputeInfo
from onnxhal.hal.ep_context import is_ep_context
from onnxhal.hal.errors import Fail
from onnxhal.runtime.env.environment import CPU_EP_NAME
from onnxhal.runtime.session.partitioner import (
    FusedGroup,
    PartitionResult,
    model_hash,
    name_fused_group,
    replace_with_fused,
)
from onnxhal.runtime.session.recovery import RecoveryPolicy

logger = logging.getLogger("onnxhal.session")


def takes_context_nodes(ep: Ep) -> bool:
    """Whether ``ep.compile`` has the ``ep_context_nodes`` parameter (a minimal EP may leave it out)."""
    try:
        params = inspect.signature(ep.compile).parameters
    except (TypeError, ValueError):
        return False
    return "ep_context_nodes" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def compile_graphs(ep: Ep, graphs: Sequence[Graph], fused_nodes: Sequence[Node], generate_context: bool = False
                   ) -> tuple[list[NodeComputeInfo], list[Node | None]]:
    """``ep.compile`` on ``graphs``: (compute infos, EPContext nodes), one each per graph; the nodes
    are all None unless ``generate_context`` and the EP made them. Raises ``Fail`` when the EP
    answers with the wrong number of either, or with a context node that is not an EPContext node."""
    context: list[Node | None] = [None] * len(graphs)
    if generate_context and takes_context_nodes(ep):
        infos = ep.compile(list(graphs), list(fused_nodes), ep_context_nodes=context)
    else:
        infos = ep.compile(list(graphs), list(fused_nodes))
    infos = list(infos)
    if len(infos) != len(graphs):
        raise Fail(f"{ep.name}: compile returned {len(infos)} NodeComputeInfos for {len(graphs)} fused nodes")
    if len(context) != len(graphs):
        raise Fail(f"{ep.name}: compile left {len(context)} ep_context_nodes for {len(graphs)} fused nodes; set "
                   "entries of the list it is given, do not add or remove any")
    for node in context:
        if node is not None and not (isinstance(node, Node) and is_ep_context(node)):
            raise Fail(f"{ep.name}: compile put {node!r} in ep_context_nodes; use "
                       "onnxhal.hal.ep_context.ep_context_node(fused_node, blob, source) or leave the entry None")
    return infos, context


def compile_groups(eps: Mapping[str, Ep], partition: PartitionResult, graph: Graph, recovery: RecoveryPolicy,
                   generate_context: bool = False) -> dict[Node, tuple[NodeComputeInfo, Any]]:
    """The session's compile stage: each EP compiles its fused groups at once, each compute info
    makes its state, and each group's nodes are replaced by its fused node. {fused node: (compute
    info, state)}. A failed compile is the recovery policy's: the groups go to the CPU EP."""
    compiled: dict[Node, tuple[NodeComputeInfo, Any]] = {}
    if not partition.groups:  # nothing fused (a CPU-only session): no names to make
        return compiled
    mh = model_hash(graph)
    by_ep: dict[str, list[FusedGroup]] = {}
    for k, g in enumerate(partition.groups):
        name_fused_group(g, k, mh)
        by_ep.setdefault(g.ep_name, []).append(g)
    try:
        for ep_name, gs in by_ep.items():
            _compile_ep(eps, ep_name, gs, partition, recovery, generate_context, compiled)
    except BaseException:
        for info, state in compiled.values():  # a later EP's failure ends the session: give these back
            try:
                info.release_state(state)
            except Exception:
                logger.exception("release_state failed")
        raise
    return compiled


def _compile_ep(eps: Mapping[str, Ep], ep_name: str, gs: list[FusedGroup], partition: PartitionResult,
                recovery: RecoveryPolicy, generate_context: bool, compiled: dict) -> None:
    """One EP's groups: compiled and in place in ``compiled``, or (recovery) handed to the CPU EP."""
    try:
        infos, contexts = compile_graphs(eps[ep_name], [g.filtered for g in gs], [g.fused_node for g in gs],
                                         generate_context)
        states = _create_states(ep_name, infos, gs)
    except Exception as e:
        recovery.compile_failed(ep_name, e, len(gs), list(eps))
        for g in gs:
            for n in g.nodes:
                n.ep_name = CPU_EP_NAME
            for a in partition.assigned:
                if a.nodes == g.nodes:
                    a.ep_name = CPU_EP_NAME
        return
    for g, info, state, context in zip(gs, infos, states, contexts):
        g.context_node = context
        replace_with_fused(g)
        compiled[g.fused_node] = (info, state)


def _create_states(ep_name: str, infos: list[NodeComputeInfo], groups: list[FusedGroup]) -> list:
    states: list = []
    try:
        for info, g in zip(infos, groups):
            states.append(info.create_state(g.fused_node))
    except Exception:
        for info, state in zip(infos, states):  # give back what was created before the failure
            try:
                info.release_state(state)
            except Exception:
                logger.exception("%s: release_state failed", ep_name)
        raise
    return states
