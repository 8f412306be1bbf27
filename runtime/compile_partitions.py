"""Calling ``Ep.compile``: the compute infos of fused groups and, when asked, their EPContext nodes.

Used by the session's compile stage and by the onnxruntime bridge (``onnxhal/ort_plugin``), so both
read an EP's answer in one way: as many compute infos as graphs, and, when the session generates an
EPContext model, one EPContext node or None per graph (``hal.ep.Ep.compile``).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

from onnxhal.hal import Ep, Graph, Node, NodeComputeInfo
from onnxhal.hal.ep_context import is_ep_context
from onnxhal.hal.errors import Fail


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
