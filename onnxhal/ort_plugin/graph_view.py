"""onnxruntime's OrtGraph walked into onnxhal's graph view (``onnxhal.hal.Graph``).

An EP written against ``onnxhal.hal`` reads graphs, nodes, attributes, types and shapes and constant
initializers from ``hal.Graph``; here the same objects are built from onnxruntime's graph API
(OrtApi ``Graph_*``, ``Node_*``, ``ValueInfo_*``, ``OpAttr_*``), so the EP's ``get_capability`` and
``compile`` run unchanged. Each hal ``Node`` is paired with the ``OrtNode*`` it came from, which is
what onnxruntime wants back in ``EpGraphSupportInfo_AddNodesToFuse``.

Not carried: the subgraph attributes of control-flow nodes (If/Loop/Scan attributes of type GRAPH:
onnxruntime asks the EP about each subgraph separately, so the nodes inside them are offered, but an
EP cannot claim the control-flow node itself), sparse initializers. String constants are read (as
object arrays); string values never cross into a partition (tensors.dtype_of refuses them).

A subgraph's hal graph holds, among its initializers, those of enclosing graphs that its nodes read.
"""

from __future__ import annotations

import ctypes
from ctypes import c_bool, c_char_p, c_int, c_int64, c_size_t, c_void_p
from typing import Any

import numpy as np
from onnx import AttributeProto, helper, numpy_helper

from onnxhal.hal.errors import InvalidGraph
from onnxhal.hal.graph import Graph, Node, ValueInfo
from onnxhal.ort_plugin import tensors
from onnxhal.ort_plugin.ep_context import BLOB_ATTRIBUTE, decode_blob_attribute
from onnxhal.ort_plugin.ort_api import OrtApi

ONNX_TYPE_TENSOR = 1
# OrtOpAttrType
ATTR_INT, ATTR_INTS, ATTR_FLOAT, ATTR_FLOATS, ATTR_STRING, ATTR_STRINGS, ATTR_GRAPH, ATTR_TENSOR = range(1, 9)


class GraphWalk:
    """One OrtGraph read into a hal ``Graph`` (``graph``) with ``ort_nodes``: id(hal node) -> OrtNode*."""

    def __init__(self, api: OrtApi, ort_graph: int, input_order: list[str] | None = None,
                 output_order: list[str] | None = None) -> None:
        self.api = api
        self._infos: dict[str, ValueInfo] = {}
        self._handles: dict[str, int] = {}  # value name -> its OrtValueInfo*
        self.ort_nodes: dict[int, int] = {}
        self.graph = self._walk(ort_graph, input_order, output_order)

    # -- small readers ----------------------------------------------------------------------
    def _string(self, fn: str, handle: int) -> str:
        out = c_char_p()
        self.api.call(fn, handle, ctypes.byref(out))
        return (out.value or b"").decode()

    def _array(self, count_fn: str, get_fn: str, handle: int) -> list[int]:
        n = c_size_t()
        self.api.call(count_fn, handle, ctypes.byref(n))
        items = (c_void_p * n.value)()
        if n.value:
            self.api.call(get_fn, handle, items, n.value)
        return [p or 0 for p in items]

    def value_info(self, vi: int) -> ValueInfo:
        """The hal ValueInfo of an OrtValueInfo (type and shape, symbolic dims by name)."""
        name = self._string("GetValueInfoName", vi)
        known = self._infos.get(name)
        if known is not None:
            return known
        self._handles[name] = vi
        type_info = c_void_p()
        self.api.call("GetValueInfoTypeInfo", vi, ctypes.byref(type_info))
        tp = None
        if type_info.value:
            kind = c_int()
            self.api.call("GetOnnxTypeFromTypeInfo", type_info, ctypes.byref(kind))
            if kind.value == ONNX_TYPE_TENSOR:
                tensor_info = c_void_p()
                self.api.call("CastTypeInfoToTensorInfo", type_info, ctypes.byref(tensor_info))
                if tensor_info.value:
                    elem, dims, names = tensors.type_and_shape(self.api, tensor_info.value)
                    # A value declared without a shape reads as rank 0: it is unknown, not a scalar.
                    shape = ([d if d >= 0 else (s or None) for d, s in zip(dims, names)]
                             if tensors.has_shape(self.api, tensor_info.value, len(dims)) else None)
                    tp = helper.make_tensor_type_proto(elem, shape)
        info = ValueInfo(name, tp)
        self._infos[name] = info
        return info

    def _attribute(self, attr: int) -> AttributeProto | None:
        name = self._string("OpAttr_GetName", attr)
        kind = c_int()
        self.api.call("OpAttr_GetType", attr, ctypes.byref(kind))
        t = kind.value
        if t == ATTR_GRAPH:
            return None  # subgraphs are not carried (see the module docstring)
        if t == ATTR_TENSOR:
            value = c_void_p()
            self.api.call("OpAttr_GetTensorAttributeAsOrtValue", attr, ctypes.byref(value))
            try:
                arr = tensors.copy_of(self.api, value.value)
            finally:
                self.api.ort["ReleaseValue"](value)
            return helper.make_attribute(name, numpy_helper.from_array(arr))
        size = c_size_t()
        # A first read with no buffer reports the size needed (and a status we drop).
        status = self.api.ort["ReadOpAttr"](attr, t, None, 0, ctypes.byref(size))
        if status:
            self.api.ort["ReleaseStatus"](status)
        buf = ctypes.create_string_buffer(max(size.value, 1))
        self.api.call("ReadOpAttr", attr, t, buf, size.value, ctypes.byref(size))
        raw = buf.raw[:size.value]
        if t == ATTR_INT:
            value: Any = int(np.frombuffer(raw, np.int64)[0])
        elif t == ATTR_FLOAT:
            value = float(np.frombuffer(raw, np.float32)[0])
        elif t == ATTR_INTS:
            return helper.make_attribute(name, [int(x) for x in np.frombuffer(raw, np.int64)],
                                         attr_type=AttributeProto.INTS)
        elif t == ATTR_FLOATS:
            return helper.make_attribute(name, [float(x) for x in np.frombuffer(raw, np.float32)],
                                         attr_type=AttributeProto.FLOATS)
        elif t == ATTR_STRING:
            # Some onnxruntime versions count a terminating NUL in the size, others do not.
            value = raw[:-1] if raw.endswith(b"\0") else raw
            if name == BLOB_ATTRIBUTE:
                value = decode_blob_attribute(value)
        elif t == ATTR_STRINGS:
            parts = raw.split(b"\0")
            return helper.make_attribute(name, parts[:-1] if parts and parts[-1] == b"" else parts,
                                         attr_type=AttributeProto.STRINGS)
        else:
            raise InvalidGraph(f"attribute {name!r} has OrtOpAttrType {t}, which onnxhal's bridge does not read")
        return helper.make_attribute(name, value)

    def _node(self, ort_node: int) -> Node:
        inputs = [self.value_info(v).name if v else "" for v in
                  self._array("Node_GetNumInputs", "Node_GetInputs", ort_node)]
        outputs = [self.value_info(v).name if v else "" for v in
                   self._array("Node_GetNumOutputs", "Node_GetOutputs", ort_node)]
        attrs = [a for a in (self._attribute(p) for p in
                             self._array("Node_GetNumAttributes", "Node_GetAttributes", ort_node)) if a is not None]
        node = Node(self._string("Node_GetOperatorType", ort_node), inputs, outputs,
                    self._string("Node_GetName", ort_node), self._string("Node_GetDomain", ort_node), attrs)
        since = c_int()
        self.api.call("Node_GetSinceVersion", ort_node, ctypes.byref(since))
        node.since_version = since.value
        self.ort_nodes[id(node)] = ort_node
        return node

    def _opsets(self, ort_graph: int) -> dict[str, int]:
        n = c_size_t()
        self.api.call("Graph_GetNumOperatorSets", ort_graph, ctypes.byref(n))
        domains, versions = (c_char_p * n.value)(), (c_int64 * n.value)()
        if n.value:
            self.api.call("Graph_GetOperatorSets", ort_graph, domains, versions, n.value)
        return {("" if d in (b"", b"ai.onnx") else d.decode()): int(v) for d, v in zip(domains, versions)}

    def _read_initializer(self, vi: int, initializers: dict[str, np.ndarray], overridable: list[ValueInfo]) -> None:
        """Add the value of OrtValueInfo ``vi`` to ``initializers`` if it is an initializer (of this
        graph or an enclosing one); one a graph input may override also goes to ``overridable``."""
        info = self.value_info(vi)
        value = c_void_p()
        self.api.call("ValueInfo_GetInitializerValue", vi, ctypes.byref(value))
        if not value.value:
            return  # not an initializer, or one in external data onnxruntime has not loaded: the EP asks
        const = c_bool()
        self.api.call("ValueInfo_IsConstantInitializer", vi, ctypes.byref(const))
        initializers[info.name] = tensors.copy_of(self.api, value.value)
        if not const.value:
            overridable.append(info)

    def _walk(self, ort_graph: int, input_order: list[str] | None, output_order: list[str] | None) -> Graph:
        initializers: dict[str, np.ndarray] = {}
        overridable: list[ValueInfo] = []
        for vi in self._array("Graph_GetNumInitializers", "Graph_GetInitializers", ort_graph):
            self._read_initializer(vi, initializers, overridable)
        inputs = [self.value_info(v) for v in self._array("Graph_GetNumInputs", "Graph_GetInputs", ort_graph)]
        inputs = [v for v in inputs if v.name not in initializers]
        outputs = [self.value_info(v) for v in self._array("Graph_GetNumOutputs", "Graph_GetOutputs", ort_graph)]
        # A fused node's inputs and outputs: onnxruntime's kernel context follows their order.
        if input_order is not None:
            inputs = [self._infos.get(n) or ValueInfo(n) for n in input_order]
            for n in input_order:
                initializers.pop(n, None)  # fed by onnxruntime, not kept by the EP
        if output_order is not None:
            outputs = [self._infos.get(n) or ValueInfo(n) for n in output_order]
        nodes = [self._node(p) for p in self._array("Graph_GetNumNodes", "Graph_GetNodes", ort_graph)]
        # A subgraph's nodes may read initializers of an enclosing graph: onnxruntime lists them
        # neither as the graph's initializers nor as a fused node's inputs (they are constant), but
        # gives their values through the reading node's OrtValueInfo (ep_api_types.cc, EpGraph::Create).
        defined = {v.name for v in inputs} | set(initializers) | {o for n in nodes for o in n.outputs if o}
        for name in dict.fromkeys(i for n in nodes for i in n.inputs if i and i not in defined):
            self._read_initializer(self._handles[name], initializers, overridable)
        graph = Graph(self._string("Graph_GetName", ort_graph), nodes, inputs, outputs, initializers,
                      dict(self._infos), self._opsets(ort_graph))
        graph.overridable = overridable
        return graph


def fused_node_signature(api: OrtApi, ort_node: int) -> Node:
    """The fused node onnxruntime made for a group: its name and input/output names, in order."""
    walk = GraphWalk.__new__(GraphWalk)
    walk.api, walk._infos, walk._handles, walk.ort_nodes = api, {}, {}, {}
    return walk._node(ort_node)
