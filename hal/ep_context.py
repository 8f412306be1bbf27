"""EPContext nodes: how an EP hands a compiled partition back for a compiled model.

onnxruntime's ``OrtEp::Compile`` fills, besides one compute info per fused node, an array of
EPContext nodes when the session generates an EPContext model (session option
``ep.context_enable`` = "1", set by ``ModelCompiler``); the runtime writes them into the model in
place of the partitions' nodes, and keeps a partition's nodes where the EP left its slot empty.
``Ep.compile``'s ``ep_context_nodes`` is that array; ``ep_context_node`` makes one entry.

A later session hands each EPContext node back to the EP named by its ``source`` attribute, whose
``get_capability`` claims it and whose ``compile`` rebuilds the partition from ``context_blob``.
"""

from __future__ import annotations

from typing import Any

from onnx import helper

from onnxhal.hal.errors import InvalidGraph
from onnxhal.hal.graph import Node

EP_CONTEXT_OP = "EPContext"
EP_CONTEXT_DOMAIN = "com.microsoft"
#: The session config entry under which a session generates EPContext nodes (onnxruntime's name).
EP_CONTEXT_ENABLE = "ep.context_enable"


def is_ep_context(node: Any) -> bool:
    """``node`` (a hal Node or a NodeProto) is an EPContext node."""
    return node.op_type == EP_CONTEXT_OP and node.domain == EP_CONTEXT_DOMAIN


def context_blob(node: Node) -> bytes:
    """The raw ``ep_cache_context`` bytes of an EPContext node."""
    proto = node.attribute_protos.get("ep_cache_context")
    if proto is None:
        raise InvalidGraph(f"EPContext node {node.name!r} has no ep_cache_context attribute")
    return bytes(proto.s)


def ep_context_node(fused_node: Node, blob: bytes, source: str, hardware_architecture: str = "",
                    notes: str = "") -> Node:
    """The EPContext node of one compiled partition: named as its fused node (onnxruntime matches the
    two by name), same inputs and outputs, ``blob`` embedded (``embed_mode`` 1; a ``ModelCompiler``
    may move it beside the model), ``source`` the EP's name, ``notes`` its compatibility string."""
    attrs = {"main_context": 1, "embed_mode": 1, "ep_cache_context": bytes(blob), "source": source,
             "partition_name": fused_node.name, "hardware_architecture": hardware_architecture, "notes": notes}
    return Node(EP_CONTEXT_OP, list(fused_node.inputs), list(fused_node.outputs), name=fused_node.name,
                domain=EP_CONTEXT_DOMAIN, attribute_protos=[helper.make_attribute(k, v) for k, v in attrs.items()])
