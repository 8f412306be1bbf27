"""Reading a model's external data from the files beside it.

onnx's ``load_external_data_for_model`` refuses every symbolic link, even one to a file in the
model's own folder (onnxruntime follows it), and lets a location that is not valid UTF-8 through as
bytes, to fail in C++ with a TypeError. Here a location is followed as the operating system
follows it and accepted where onnxruntime 1.32's ``ValidateExternalDataPathFromDir`` accepts it
(measured): an absolute location never; else the file it reaches must lie inside the model's
folder or, where the model file is itself a symbolic link, inside the folder of the file it links
to. The second is the Hugging Face cache: ``snapshots/<rev>/model.onnx`` and
``snapshots/<rev>/model.onnx_data`` both link into ``blobs/``. Offsets and lengths are checked
against the file before anything is read, so a length of 2**40 reads nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import onnx

from onnxhal.hal.errors import Fail, InvalidArgument, InvalidProtobuf, NoSuchFile

_A = onnx.AttributeProto
#: Attribute types that hold no tensor and no graph.
_PLAIN = frozenset({_A.FLOAT, _A.INT, _A.STRING, _A.FLOATS, _A.INTS, _A.STRINGS})


def tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every TensorProto a graph holds: initializers, sparse initializers and the tensors of
    attributes typed TENSOR or TENSORS, in subgraphs too (typed GRAPH or GRAPHS). An attribute
    holding a tensor or graph its type does not say is refused by the node checks
    (``check_attribute_encoding``), so what it holds is never read."""
    yield from graph.initializer
    for st in graph.sparse_initializer:
        yield st.values
        yield st.indices
    for node in graph.node:
        for a in node.attribute:
            kind = a.type  # one read, not four: a model has an attribute or more per node
            if kind in _PLAIN:
                continue
            if kind == _A.TENSOR:
                yield a.t
            elif kind == _A.TENSORS:
                yield from a.tensors
            elif kind == _A.GRAPH:
                yield from tensors(a.g)
            elif kind == _A.GRAPHS:
                for g in a.graphs:
                    yield from tensors(g)


def _number(info: dict[str, str], key: str, tensor: str, what: str) -> int | None:
    if key not in info:
        return None
    try:
        value = int(info[key])
    except ValueError:
        value = -1
    if value < 0:
        raise InvalidProtobuf(f"{what}: tensor {tensor!r} gives external data {key} {info[key]!r}; it must be an "
                              "integer >= 0.")
    return value


def _inside(path: str, folder: str) -> bool:
    return os.path.commonpath([path, folder]) == folder


def load_external_data(proto: onnx.ModelProto, folder: str, what: str, model_path: str | None = None) -> None:
    """Read each external tensor's bytes into it (it stops being external). ``folder`` is the
    model file's folder, ``model_path`` the model file (where it is a link, the folder of its
    target is allowed too)."""
    base, allowed = "", []  # resolved at the first external tensor: most models have none
    for t in tensors(proto.graph):
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        if not allowed:
            base = os.path.realpath(folder)
            allowed = [base]
            if model_path is not None and os.path.islink(model_path):
                allowed.append(os.path.dirname(os.path.realpath(model_path)))
        info = {e.key: e.value for e in t.external_data}
        location = info.get("location", "")
        if not location or "\0" in location:
            raise InvalidProtobuf(f"{what}: tensor {t.name!r} keeps its data externally at location {location!r}, "
                                  "which is not a file name.")
        failed = f"{what}: External data path validation failed for initializer: {t.name}. Error:"
        if os.path.isabs(location):
            raise Fail(f"{failed} Absolute path not allowed for external data location ({location!r}). Give the "
                       "location relative to the model's folder.")
        path = os.path.join(base, location)
        resolved = os.path.realpath(path)
        if not any(_inside(resolved, a) for a in allowed):
            raise Fail(f"{failed} External data path escapes model directory. External data path: {location!r} "
                       f"resolved path: {resolved!r} allowed directory: {allowed[-1]!r}. Keep the data files in "
                       "the model's folder (or in the folder its model file links to).")
        if not os.path.isfile(path):  # as the OS resolves it: 'missing/../w.bin' is not found
            raise NoSuchFile(f"{what}: external data not found: tensor {t.name!r} reads {location!r}, which is not a "
                             f"file in {base!r}. Keep the data files next to the model, under the names its "
                             "initializers give.")
        offset = _number(info, "offset", t.name, what) or 0
        length = _number(info, "length", t.name, what)
        size = os.path.getsize(path)
        if length is None:
            length = max(size - offset, 0)
        if offset + length > size:
            raise InvalidArgument(f"{what}: tensor {t.name!r} reads bytes [{offset}, {offset + length}) of "
                                  f"{location!r}, which has {size}; the data file does not match the model.")
        with open(path, "rb") as f:
            f.seek(offset)
            t.raw_data = f.read(length)
        del t.external_data[:]
        t.data_location = onnx.TensorProto.DEFAULT
