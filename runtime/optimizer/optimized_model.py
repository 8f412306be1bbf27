"""``SessionOptions.optimized_model_filepath``: save the graph the session runs, after optimization.

As onnxruntime: the model is written when the session is created, after the graph optimizations
(and the layout transformation an NHWC EP asks for), with the model's metadata. With the session
config entry ``session.optimized_model_external_initializers_file_name`` the initializers of at
least ``session.optimized_model_external_initializers_min_size_in_bytes`` (1024 by default) bytes go
to that file beside the model, one after the other. A session whose EPs compiled fused partitions
cannot be saved (their nodes exist only inside the EP), which onnxruntime refuses too.

The saved model holds onnxhal's fused operators (domain ``com.onnxhal``) where the optimizer made
them, as onnxruntime's holds its ``com.microsoft`` ones: it is for onnxhal, on the same kind of EPs.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import numpy as np
import onnx
from onnx import external_data_helper, helper, numpy_helper

from onnxhal.hal import Graph
from onnxhal.hal.errors import Fail, InvalidArgument

EXTERNAL_FILE_KEY = "session.optimized_model_external_initializers_file_name"
EXTERNAL_MIN_SIZE_KEY = "session.optimized_model_external_initializers_min_size_in_bytes"
logger = logging.getLogger("onnxhal.session")


def save_optimized_model(graph: Graph, source: onnx.ModelProto, path: str, config: Callable[[str, str], str],
                         has_compiled_nodes: bool) -> None:
    """Write ``graph`` (the session's, optimized) as a model at ``path``."""
    if path.lower().endswith(".ort"):
        # onnxruntime's flatbuffers format: a format of its own runtime, which onnxhal does not read.
        logger.warning("optimized_model_filepath %r: the ORT format (.ort) is onnxruntime's own; onnxhal writes "
                       "ONNX only. Nothing was written; use a .onnx path.", path)
        return
    if has_compiled_nodes:
        raise Fail("Unable to serialize model as it contains compiled nodes. Please disable any execution providers "
                   f"which generate compiled nodes (optimized_model_filepath={path!r}).")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise InvalidArgument(f"optimized_model_filepath {path!r}: the folder {folder!r} does not exist. Create it, or "
                              "choose another path.")
    gp = graph.to_proto()
    location = config(EXTERNAL_FILE_KEY, "")
    if location:
        try:
            threshold = int(config(EXTERNAL_MIN_SIZE_KEY, "1024"))
        except ValueError:
            raise InvalidArgument(f"{EXTERNAL_MIN_SIZE_KEY} must be a byte count, got "
                                  f"{config(EXTERNAL_MIN_SIZE_KEY, '')!r}") from None
        write_external_initializers(gp, os.path.join(folder, location), location, lambda n: n >= threshold)
    opsets = {o.domain: o.version for o in source.opset_import}
    for n in graph.nodes:
        opsets.setdefault(n.domain, 1)
    model = helper.make_model(gp, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()],
                              ir_version=source.ir_version, producer_name=source.producer_name,
                              producer_version=source.producer_version, domain=source.domain,
                              doc_string=source.doc_string)
    if source.HasField("model_version"):
        model.model_version = source.model_version
    helper.set_model_props(model, {p.key: p.value for p in source.metadata_props})
    with open(path, "wb") as f:
        f.write(model.SerializeToString())


def write_external_initializers(gp: onnx.GraphProto, file_path: str, location: str,
                                goes_out: Callable[[int], bool]) -> None:
    """Move each initializer whose byte size ``goes_out`` into ``file_path`` (named ``location`` in
    the model), one after the other in graph order, as onnxruntime lays them out. Strings stay."""
    out = None
    offset = 0
    try:
        for tensor in gp.initializer:
            if tensor.data_type == onnx.TensorProto.STRING:
                continue
            data = little_endian_bytes(numpy_helper.to_array(tensor))
            if not goes_out(len(data)):
                continue
            if out is None:
                out = open(file_path, "wb")  # noqa: SIM115 - closed in finally
            out.write(data)
            make_external(tensor, location, offset, len(data))
            offset += len(data)
    finally:
        if out is not None:
            out.close()


def little_endian_bytes(arr: np.ndarray) -> bytes:
    """The raw bytes ONNX external data holds (little-endian, row-major)."""
    return np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()


def make_external(tensor: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    """Point ``tensor`` at ``length`` bytes at ``offset`` of ``location`` and drop its inline data."""
    external_data_helper.set_external_data(tensor, location, offset, length)
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
        tensor.ClearField(field)
