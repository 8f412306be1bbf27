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

from dataclasses import dataclass
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


@dataclass(frozen=True)
class FusedOrder:
    """Where a saved partition's values sit on the fused node it is loaded as: ``inputs[i]`` is the
    fused-node input that is the partition's input i, ``outputs[j]`` the partition output that is
    the fused node's output j; ``saved_outputs`` is how many outputs the partition makes."""

    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    saved_outputs: int

    def feeds(self, fused_inputs: list) -> list:
        """The fused node's inputs in the partition's order."""
        return [fused_inputs[i] for i in self.inputs]

    def results(self, saved: list) -> list:
        """The partition's outputs in the fused node's order."""
        return [saved[k] for k in self.outputs]


def fused_order(saved_inputs: list[str], saved_outputs: list[str], fused_node: Node) -> FusedOrder | None:
    """How a partition saved with ``saved_inputs``/``saved_outputs`` meets the fused node it is loaded
    as (``FusedOrder``), or None when both orders already agree.

    The fused node of a reloaded EPContext node carries the same value names, but its order is the
    runtime's: onnxruntime builds it from the graph it loaded (an EPContext node edited or written by
    another tool, an output no longer read), so a partition must take and return values by name."""
    fused_in, fused_out = list(fused_node.inputs), list(fused_node.outputs)
    missing = [n for n in saved_inputs if n not in fused_in] + [n for n in fused_out if n not in saved_outputs]
    if missing:
        raise InvalidGraph(f"EPContext node {fused_node.name!r}: its compiled partition takes {saved_inputs} and "
                           f"returns {saved_outputs}, the node has inputs {fused_in} and outputs {fused_out} "
                           f"({missing} do not match); compile the model again")
    if fused_in == list(saved_inputs) and fused_out == list(saved_outputs):
        return None
    return FusedOrder(tuple(fused_in.index(n) for n in saved_inputs), tuple(saved_outputs.index(n) for n in fused_out),
                      len(saved_outputs))
