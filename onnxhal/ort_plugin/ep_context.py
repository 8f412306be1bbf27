"""EPContext nodes for onnxruntime's compiled models, made from an onnxhal EP's own.

When onnxruntime compiles a model (``ModelCompiler``, or the session option ``ep.context_enable``),
``OrtEp::Compile`` may return one EPContext node per partition; onnxruntime writes them into the
compiled model in place of the partition's nodes. An onnxhal EP returns them as hal Nodes through
``hal.Ep.compile``'s ``ep_context_nodes`` (``hal/ep_context.py``); this module turns each into an
OrtNode with the model editor API.

The node keeps the EP's attributes (``main_context``, ``embed_mode``, ``ep_cache_context``, ``source``,
``partition_name``, ``hardware_architecture``, ``notes``), with one difference: onnxruntime's
``CreateOpAttr`` takes a string attribute as a NUL-terminated C string, so the binary blob travels
as text, ``onnxhal-base64:`` + base64. ``decode_blob_attribute`` turns it back into bytes when the
bridge reads such a node (graph_view.py), so the EP sees its own blob.
"""

from __future__ import annotations

import base64
import ctypes
from ctypes import c_char_p, c_int64, c_void_p
from typing import Any

import onnx

from onnxhal.hal.ep_context import EP_CONTEXT_DOMAIN, EP_CONTEXT_ENABLE, EP_CONTEXT_OP
from onnxhal.hal.graph import Node
from onnxhal.ort_plugin.ort_api import OrtApi

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
    return config.get(EP_CONTEXT_ENABLE, "0") == "1"


def context_node(api: OrtApi, node: Node) -> int | None:
    """An OrtNode* for the EP's EPContext ``node`` (named as its fused node: onnxruntime matches the
    two by name and takes ownership); None when onnxruntime's model editor API cannot create nodes."""
    if "CreateNode" not in api.editor:
        return None
    attrs: list[tuple[str, int | bytes]] = []
    for name, proto in node.attribute_protos.items():
        if proto.type == onnx.AttributeProto.INT:
            attrs.append((name, int(proto.i)))
        elif name == BLOB_ATTRIBUTE:
            attrs.append((name, BLOB_PREFIX + base64.b64encode(proto.s)))
        else:
            attrs.append((name, bytes(proto.s)))
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
        ins = (c_char_p * len(node.inputs))(*[n.encode() for n in node.inputs])
        outs = (c_char_p * len(node.outputs))(*[n.encode() for n in node.outputs])
        attr_array = (c_void_p * len(made))(*made)
        made_node = c_void_p()
        api.check(api.editor["CreateNode"](EP_CONTEXT_OP.encode(), EP_CONTEXT_DOMAIN.encode(),
                                           node.name.encode(), ins, len(ins), outs, len(outs),
                                           attr_array, len(made), ctypes.byref(made_node)), "CreateNode")
        return made_node.value
    finally:
        # CreateNode takes the attributes over (and NULLs their slots); release only what it did not take.
        left = [a for a in attr_array if a] if attr_array is not None else made
        for attr in left:
            api.ort["ReleaseOpAttr"](attr)
