"""EPContext nodes for onnxruntime's compiled models, made from an onnxhal EP's exported partitions.

When onnxruntime compiles a model (``ModelCompiler``, or the session option ``ep.context_enable``),
``OrtEp::Compile`` may return one EPContext node per partition; onnxruntime writes them into the
compiled model in place of the partition's nodes. The hal contract exports a partition with the
EP's ``export_context(fused_node_name)`` (today ``simulators/ep.py``'s ``VirtualEp``; issue 32 moves
it into ``hal.Ep``): this module is the only place the bridge calls it.

The node carries the attributes onnxhal's own ModelCompiler writes (``main_context``, ``embed_mode``,
``ep_cache_context``, ``source``, ``partition_name``, ``hardware_architecture``, ``notes``), with one
difference: onnxruntime's ``CreateOpAttr`` takes a string attribute as a NUL-terminated C string,
so the binary blob travels as text, ``onnxhal-base64:`` + base64. ``decode_blob_attribute`` turns it
back into bytes when the bridge reads such a node (graph_view.py), so the EP sees its own blob.
"""

from __future__ import annotations

import base64
import ctypes
from ctypes import c_char_p, c_int64, c_void_p
from typing import Any

from onnxhal.hal.graph import Graph, Node
from onnxhal.ort_plugin.ort_api import OrtApi

EP_CONTEXT_OP = "EPContext"
EP_CONTEXT_DOMAIN = "com.microsoft"
BLOB_ATTRIBUTE = "ep_cache_context"
BLOB_PREFIX = b"onnxhal-base64:"
_INT, _STRING = 1, 5  # OrtOpAttrType


def decode_blob_attribute(value: bytes) -> bytes:
    """The EP's blob from an ``ep_cache_context`` value the bridge wrote (other values unchanged)."""
    if value.startswith(BLOB_PREFIX):
        return base64.b64decode(value[len(BLOB_PREFIX):])
    return value


def context_enabled(config: dict[str, str]) -> bool:
    """Whether the session compiles a model: onnxruntime's session option ``ep.context_enable``."""
    return config.get("ep.context_enable", "0") == "1"


def context_node(api: OrtApi, ep: Any, fused_node: Node, graph: Graph) -> int | None:
    """An OrtNode* EPContext node for ``fused_node``, named as it (onnxruntime matches the two by name and
    takes ownership), or None when the
    EP exports no blob for it (onnxruntime then keeps the partition's original nodes)."""
    export = getattr(ep, "export_context", None)
    blob = export(fused_node.name) if export is not None else None
    if blob is None or "CreateNode" not in api.editor:
        return None
    profile = getattr(ep, "profile", None)
    attrs: list[tuple[str, int | bytes]] = [
        ("main_context", 1), ("embed_mode", 1), (BLOB_ATTRIBUTE, BLOB_PREFIX + base64.b64encode(blob)),
        ("source", ep.name.encode()), ("partition_name", fused_node.name.encode()),
        ("hardware_architecture", getattr(profile, "name", "").encode()),
        ("notes", ep.get_compiled_model_compatibility_info(graph).encode())]
    made: list[int] = []
    attr_array: Any = None
    try:
        for name, value in attrs:
            out = c_void_p()
            if isinstance(value, int):
                data = c_int64(value)
                api.call("CreateOpAttr", name.encode(), ctypes.byref(data), 1, _INT, ctypes.byref(out))
            else:
                text = ctypes.create_string_buffer(value)
                api.call("CreateOpAttr", name.encode(), text, len(value), _STRING, ctypes.byref(out))
            made.append(out.value)
        ins = (c_char_p * len(fused_node.inputs))(*[n.encode() for n in fused_node.inputs])
        outs = (c_char_p * len(fused_node.outputs))(*[n.encode() for n in fused_node.outputs])
        attr_array = (c_void_p * len(made))(*made)
        node = c_void_p()
        api.check(api.editor["CreateNode"](EP_CONTEXT_OP.encode(), EP_CONTEXT_DOMAIN.encode(),
                                           fused_node.name.encode(), ins, len(ins), outs, len(outs),
                                           attr_array, len(made), ctypes.byref(node)), "CreateNode")
        return node.value
    finally:
        # CreateNode takes the attributes over (and NULLs their slots); release only what it did not take.
        left = [a for a in attr_array if a] if attr_array is not None else made
        for attr in left:
            api.ort["ReleaseOpAttr"](attr)
