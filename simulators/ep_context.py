"""EPContext models: compiled partitions saved in the model, so a later session skips compiling.

ORT's idea (``ModelCompiler``, EPContext nodes; ``runtime/session/model_compiler.py``):
``ModelCompiler(sess_options, model).compile_to_file(path)`` creates a session with those options,
then writes its graph with every partition an EP can export replaced by an
``com.microsoft.EPContext`` node whose ``ep_cache_context`` attribute holds (or names) the compiled
partition, and the EP's compatibility string in the model metadata (``ep_compatibility_info.<EP>``).
A session on that file hands each EPContext node to the EP named in its ``source`` attribute,
which rebuilds the partition from the blob instead of planning it again, after checking the
compatibility string against its own device. This module holds the simulated EPs' blob format.

An EP takes part through the hal contract: ``Ep.compile`` fills ``ep_context_nodes`` when the
session generates a compiled model, and its ``get_capability``/``compile`` claim and rebuild
EPContext nodes later; the simulated EPs do (their blob is the OpenCL partition plan: kernel
sources, launches, shapes, constants, and the partition's cost). The blob is a zip of JSON and
``.npy`` arrays: loading it runs no pickle and no code.
"""

from __future__ import annotations

import dataclasses
import io
import json
import zipfile
from typing import Any

import numpy as np

from onnxhal.hal.enums import OrtCompileApiFlags
from onnxhal.hal.errors import InvalidGraph
from onnxhal.runtime.env.compatibility import COMPAT_KEY_PREFIX
from onnxhal.runtime.session.ep_context_model import EP_CONTEXT_DOMAIN, EP_CONTEXT_OP, context_blob, is_ep_context
from onnxhal.runtime.session.model_compiler import ModelCompiler

# ModelCompiler and the EPContext node helpers are the runtime's and hal's (onnxruntime's, not the
# simulators'); importable from here too for EP libraries and tests written against this module.
__all__ = ["BLOB_FORMAT", "COMPAT_KEY_PREFIX", "EP_CONTEXT_DOMAIN", "EP_CONTEXT_OP", "ModelCompiler",
           "OrtCompileApiFlags", "context_blob", "core_model_proto", "decode_partition", "encode_partition",
           "is_ep_context"]

BLOB_FORMAT = "onnxhal-opencl-plan/1"


# -- partition plan <-> bytes --------------------------------------------------------------------
def _plan_classes() -> dict[str, type]:
    """The dataclasses a blob may hold: the OpenCL partition plan's (static, or a partition with
    symbolic dimensions), the host backend's and the cost model's."""
    from onnxhal.runtime.providers.opencl import partition_plan
    from onnxhal.simulators import cost

    classes = {name: obj for name, obj in vars(partition_plan).items()
               if isinstance(obj, type) and dataclasses.is_dataclass(obj)}
    from onnxhal.runtime.providers.opencl.dynamic_partition import DynamicPartitionPlan
    from onnxhal.simulators.host_backend import HostPartitionPlan

    classes.update({"PartitionCost": cost.PartitionCost, "KernelCost": cost.KernelCost,
                    "HostPartitionPlan": HostPartitionPlan, "DynamicPartitionPlan": DynamicPartitionPlan})
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
    if isinstance(value, (set, frozenset)):  # sorted, so one plan always makes the same blob
        return {"$set": [_encode(v, arrays) for v in sorted(value, key=repr)]}
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
    if "$set" in value:
        return {_decode(v, arrays, classes) for v in value["$set"]}
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


def core_model_proto(sess: Any) -> Any:
    """The ModelProto the session loaded (for opsets, IR version and metadata)."""
    return sess.model_proto
