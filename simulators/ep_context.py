"""EPContext models: compiled partitions saved in the model, so a later session skips compiling.

ORT's idea (``ModelCompiler``, EPContext nodes): ``ModelCompiler(sess_options, model)
.compile_to_file(path)`` creates a session with those options, then writes its graph with every
partition an EP can export replaced by an ``com.microsoft.EPContext`` node whose
``ep_cache_context`` attribute holds the compiled partition, and the EP's compatibility string in
the model metadata (``ep_compatibility_info.<EP>``). A session on that file hands each EPContext
node to the EP named in its ``source`` attribute, which rebuilds the partition from the blob
instead of planning it again, after checking the compatibility string against its own device.

An EP takes part by having ``export_context(fused_node_name) -> bytes | None`` and by claiming and
compiling EPContext nodes; the simulated EPs do (their blob is the OpenCL partition plan: kernel
sources, launches, shapes, constants, and the partition's cost). The blob is a zip of JSON and
``.npy`` arrays: loading it runs no pickle and no code.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import zipfile
from typing import Any

import numpy as np

from onnxhal.hal.enums import OrtCompileApiFlags
from onnxhal.hal.errors import Fail, InvalidGraph

EP_CONTEXT_OP = "EPContext"
EP_CONTEXT_DOMAIN = "com.microsoft"
COMPAT_KEY_PREFIX = "ep_compatibility_info."
BLOB_FORMAT = "onnxhal-opencl-plan/1"


# -- partition plan <-> bytes --------------------------------------------------------------------
def _plan_classes() -> dict[str, type]:
    """The dataclasses a blob may hold: the OpenCL partition plan's and the cost model's."""
    from onnxhal.runtime.providers.opencl import partition_plan
    from onnxhal.simulators import cost

    classes = {name: obj for name, obj in vars(partition_plan).items()
               if isinstance(obj, type) and dataclasses.is_dataclass(obj)}
    classes.update({"PartitionCost": cost.PartitionCost, "KernelCost": cost.KernelCost})
    return classes


def _encode(value: Any, arrays: dict[str, np.ndarray]) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, np.ndarray):
        key = f"a{len(arrays)}"
        arrays[key] = value
        return {"$array": key}
    if isinstance(value, np.generic):
        return {"$scalar": value.dtype.str, "v": value.item()}
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, np.dtype):
        return {"$dtype": value.str}
    if isinstance(value, tuple):
        return {"$tuple": [_encode(v, arrays) for v in value]}
    if isinstance(value, list):
        return [_encode(v, arrays) for v in value]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError("only str-keyed dicts can be saved")
        return {"$dict": {k: _encode(v, arrays) for k, v in value.items()}}
    if dataclasses.is_dataclass(value) and _plan_classes().get(type(value).__name__) is type(value):
        return {"$class": type(value).__name__,
                "fields": {f.name: _encode(getattr(value, f.name), arrays) for f in dataclasses.fields(value)}}
    raise TypeError(f"cannot save a {type(value).__name__} in an EPContext blob")


def _decode(value: Any, arrays: dict[str, np.ndarray], classes: dict[str, type]) -> Any:
    if isinstance(value, list):
        return [_decode(v, arrays, classes) for v in value]
    if not isinstance(value, dict):
        return value
    if "$array" in value:
        return arrays[value["$array"]]
    if "$scalar" in value:
        return np.array(value["v"], dtype=np.dtype(value["$scalar"]))[()]
    if "$dtype" in value:
        return np.dtype(value["$dtype"])
    if "$tuple" in value:
        return tuple(_decode(v, arrays, classes) for v in value["$tuple"])
    if "$dict" in value:
        return {k: _decode(v, arrays, classes) for k, v in value["$dict"].items()}
    if "$class" in value:
        cls = classes.get(value["$class"])
        if cls is None:
            raise InvalidGraph(f"EPContext blob names an unknown plan class {value['$class']!r}: it was made by "
                               "another onnxhal version; compile the model again")
        return cls(**{k: _decode(v, arrays, classes) for k, v in value["fields"].items()})
    raise InvalidGraph(f"EPContext blob: unreadable value {str(value)[:80]}")


def encode_partition(plan: Any, cost: Any, compatibility: str) -> bytes:
    """The blob of one compiled partition: its plan, its cost and the compatibility string."""
    arrays: dict[str, np.ndarray] = {}
    manifest = {"format": BLOB_FORMAT, "compatibility": compatibility, "plan": _encode(plan, arrays),
                "cost": _encode(cost, arrays)}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("manifest.json", json.dumps(manifest))
        for key, arr in arrays.items():
            npy = io.BytesIO()
            np.save(npy, arr, allow_pickle=False)
            z.writestr(f"{key}.npy", npy.getvalue())
    return buf.getvalue()


def decode_partition(blob: bytes) -> tuple[Any, Any, str]:
    """(plan, cost, compatibility string) from ``encode_partition``'s bytes."""
    from onnxhal.simulators import cost as cost_module

    try:
        with zipfile.ZipFile(io.BytesIO(blob)) as z:
            manifest = json.loads(z.read("manifest.json"))
            arrays = {n[:-4]: np.load(io.BytesIO(z.read(n)), allow_pickle=False)
                      for n in z.namelist() if n.endswith(".npy")}
    except (zipfile.BadZipFile, KeyError, ValueError) as exc:
        raise InvalidGraph(f"EPContext ep_cache_context is not an onnxhal partition blob: {exc}") from exc
    if manifest.get("format") != BLOB_FORMAT:
        raise InvalidGraph(f"EPContext blob format {manifest.get('format')!r}, expected {BLOB_FORMAT!r}")
    classes = _plan_classes()
    plan = _decode(manifest["plan"], arrays, classes)
    cost = _decode(manifest["cost"], arrays, classes)
    if isinstance(cost, cost_module.PartitionCost):
        cost = dataclasses.replace(cost, kernels=tuple(cost.kernels))
    return plan, cost, manifest.get("compatibility", "")


# -- ModelCompiler -------------------------------------------------------------------------------
class ModelCompiler:
    """ORT's ``ModelCompiler``: compile ``model`` for the EPs ``sess_options`` selects and write an
    EPContext model. Only ``embed_compiled_data_into_model=True`` is supported (the blob is an
    attribute of the node)."""

    def __init__(self, sess_options: Any, model: str | bytes | os.PathLike | Any,
                 embed_compiled_data_into_model: bool = True, flags: int = OrtCompileApiFlags.NONE,
                 graph_optimization_level: Any = None) -> None:
        from onnxhal.hal import GraphOptimizationLevel

        if not embed_compiled_data_into_model:
            raise Fail("ModelCompiler: only embed_compiled_data_into_model=True is supported: the compiled "
                       "partitions are stored in the EPContext nodes")
        self.sess_options = sess_options
        self.model = os.fspath(model) if isinstance(model, os.PathLike) else model
        self.flags = OrtCompileApiFlags(int(flags))
        self.graph_optimization_level = (GraphOptimizationLevel.ORT_DISABLE_ALL if graph_optimization_level is None
                                         else graph_optimization_level)

    def compile_to_bytes(self) -> bytes:
        return self._compile().SerializeToString()

    def compile_to_file(self, path: str | os.PathLike) -> None:
        path = os.fspath(path)
        if self.flags & OrtCompileApiFlags.ERROR_IF_OUTPUT_FILE_EXISTS and os.path.exists(path):
            raise Fail(f"ModelCompiler: output file {path!r} already exists (ERROR_IF_OUTPUT_FILE_EXISTS)")
        data = self.compile_to_bytes()
        with open(path, "wb") as f:
            f.write(data)

    def _compile(self) -> Any:
        import onnx
        from onnx import helper

        from onnxhal.hal.graph import Node
        from onnxhal.runtime.partitioner import restore_group
        from onnxhal.runtime.session import InferenceSession

        so = self.sess_options._copy() if self.sess_options is not None else None
        if so is None:
            from onnxhal.runtime.session_options import SessionOptions

            so = SessionOptions()
        so.graph_optimization_level = self.graph_optimization_level
        sess = InferenceSession(self.model, so)
        core = sess._core
        graph = core.graph
        compat: dict[str, str] = {}
        compiled = 0
        for k, group in enumerate(core.partition.groups):
            if group.owner is not graph or group.fused_node not in graph.nodes:
                continue  # subgraph partitions, or groups whose compile failed
            ep = core.eps[group.ep_name]
            export = getattr(ep, "export_context", None)
            blob = export(group.fused_node.name) if export is not None else None
            if blob is None:
                restore_group(group)
                continue
            fused = group.fused_node
            attrs = {"main_context": 1, "embed_mode": 1, "ep_cache_context": blob, "source": group.ep_name,
                     "partition_name": fused.name,
                     "hardware_architecture": getattr(getattr(ep, "profile", None), "name", ""),
                     "notes": ep.get_compiled_model_compatibility_info(graph)}
            node = Node(EP_CONTEXT_OP, list(fused.inputs), list(fused.outputs), name=f"EPContext_{k}_{group.ep_name}",
                        domain=EP_CONTEXT_DOMAIN, attribute_protos=[helper.make_attribute(a, v) for a, v in attrs.items()])
            graph.nodes = [node if n is fused else n for n in graph.nodes]
            compat[group.ep_name] = ep.get_compiled_model_compatibility_info(graph)
            compiled += 1
        if compiled == 0 and self.flags & OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED:
            raise Fail("ModelCompiler: Unable to compile any nodes (ERROR_IF_NO_NODES_COMPILED): no selected EP "
                       "exported a compiled partition")
        graph._index()
        used = {i for n in graph.nodes for i in (*n.inputs, *n.implicit_inputs) if i}
        graph.initializers = {k: v for k, v in graph.initializers.items() if k in used}
        proto = core_model_proto(sess)
        gp = graph.to_proto()
        opsets = {o.domain: o.version for o in proto.opset_import}
        opsets.setdefault(EP_CONTEXT_DOMAIN, 1)
        for n in graph.nodes:
            opsets.setdefault(n.domain, 1)
        model = helper.make_model(gp, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()],
                                  ir_version=proto.ir_version, producer_name="onnxhal.ModelCompiler")
        meta = {e.key: e.value for e in proto.metadata_props}
        meta.update({COMPAT_KEY_PREFIX + name: info for name, info in compat.items()})
        onnx.helper.set_model_props(model, meta)
        sess.close()
        return model


def context_blob(node: Any) -> bytes:
    """The raw ``ep_cache_context`` bytes of an EPContext node."""
    proto = node.attribute_protos.get("ep_cache_context")
    if proto is None:
        raise InvalidGraph(f"EPContext node {node.name!r} has no ep_cache_context attribute")
    return bytes(proto.s)


def is_ep_context(node: Any) -> bool:
    return node.op_type == EP_CONTEXT_OP and node.domain == EP_CONTEXT_DOMAIN


def core_model_proto(sess: Any) -> Any:
    """The ModelProto the session loaded (for opsets, IR version and metadata)."""
    return sess._loaded.proto
