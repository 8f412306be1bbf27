"""EPContext nodes: the part of onnxruntime's EPContext format every EP shares.

A compiled model (``ModelCompiler``) replaces each partition an EP can export by a
``com.microsoft.EPContext`` node whose ``ep_cache_context`` attribute holds the EP's compiled data
(``embed_mode`` 1), or names where it was put (``embed_mode`` 0): a file next to the model, or a
name the application's write callback received. A session resolves the second kind when it loads
the model, from the file or through ``SessionOptions.set_ep_context_data_read_func``, so an EP always
finds the bytes in ``ep_cache_context``. What the bytes mean is the EP's business.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import onnx
from onnx import helper

from onnxhal.hal.ep_context import EP_CONTEXT_DOMAIN, EP_CONTEXT_OP, context_blob, is_ep_context
from onnxhal.hal.errors import Fail, InvalidArgument, InvalidGraph, NoSuchFile

__all__ = ["EP_CONTEXT_DOMAIN", "EP_CONTEXT_OP", "OrtEpContextData", "OrtEpContextDataBuffer", "context_blob",
           "is_ep_context", "resolve_external_contexts"]

class OrtEpContextData:
    """A read-only view of one EP's context data, handed to a ``ModelCompiler`` write callback
    (onnxruntime's ``OrtEpContextData``); valid only during the callback."""

    __slots__ = ("_data",)

    def __init__(self, data: bytes) -> None:
        self._data = memoryview(data)

    @property
    def size(self) -> int:
        return len(self._data)

    def read(self, offset: int = 0, length: int | None = None) -> bytes:
        """``length`` bytes from ``offset`` (to the end when None)."""
        if self._data is None:
            raise Fail("OrtEpContextData: the view is valid only during the write callback; copy what you need "
                       "with read() there")
        if offset < 0 or offset > len(self._data) or (length is not None and (length < 0 or
                                                                             offset + length > len(self._data))):
            raise InvalidArgument(f"OrtEpContextData.read({offset}, {length}): out of range for {len(self._data)} "
                                  "bytes")
        return bytes(self._data[offset:None if length is None else offset + length])

    def release(self) -> None:
        """Drop the data: the view is valid only during the write callback that received it."""
        self._data = None


class OrtEpContextDataBuffer:
    """Where a ``SessionOptions`` read callback puts one EP context's data (onnxruntime's
    ``OrtEpContextDataBuffer``): ``allocate(size)`` once, at most ``max_size``, then ``write``."""

    __slots__ = ("_max_size", "_buffer")

    def __init__(self, max_size: int) -> None:
        self._max_size = int(max_size)
        self._buffer: bytearray | None = None

    @property
    def max_size(self) -> int:
        return self._max_size

    @property
    def size(self) -> int:
        return 0 if self._buffer is None else len(self._buffer)

    @property
    def is_allocated(self) -> bool:
        return self._buffer is not None

    def allocate(self, size: int) -> None:
        if self._buffer is not None:
            raise Fail("OrtEpContextDataBuffer.allocate: already allocated; call it exactly once per callback")
        if size < 0 or size > self._max_size:
            raise InvalidArgument(f"OrtEpContextDataBuffer.allocate({size}): more than max_data_size "
                                  f"{self._max_size} given to set_ep_context_data_read_func; raise it")
        self._buffer = bytearray(size)

    def write(self, data: Any, offset: int = 0) -> None:
        if self._buffer is None:
            raise Fail("OrtEpContextDataBuffer.write before allocate(size)")
        chunk = memoryview(data).cast("B")
        if offset < 0 or offset + len(chunk) > len(self._buffer):
            raise InvalidArgument(f"OrtEpContextDataBuffer.write: {len(chunk)} bytes at offset {offset} do not fit "
                                  f"the {len(self._buffer)} bytes allocated")
        self._buffer[offset:offset + len(chunk)] = chunk

    def _take(self, name: str) -> bytes:
        if self._buffer is None:
            raise Fail(f"the EPContext read callback did not allocate() a buffer for {name!r}")
        return bytes(self._buffer)


ReadFunc = Callable[[str, OrtEpContextDataBuffer], None]


def resolve_external_contexts(proto: onnx.ModelProto, model_path: str | None,
                              read: tuple[ReadFunc, int] | None) -> onnx.ModelProto:
    """``proto`` with every main-graph EPContext node of ``embed_mode`` 0 given its data inline:
    through ``read`` = (callback, max size) if set, else from the file it names, relative to the
    model's folder. The caller's proto is not changed (a copy is returned when anything changes)."""
    # An EPContext node is in com.microsoft: a model that does not import the domain holds none
    # that loads (the loader's node checks refuse a node of a domain not imported), and its nodes
    # need no walk here.
    if all(o.domain != EP_CONTEXT_DOMAIN for o in proto.opset_import):
        return proto
    external = [n for n in proto.graph.node if is_ep_context(n) and
                any(a.name == "embed_mode" and a.i == 0 for a in n.attribute)]
    if not external:
        return proto
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    for node in copy.graph.node:
        if not (is_ep_context(node) and any(a.name == "embed_mode" and a.i == 0 for a in node.attribute)):
            continue
        attrs = {a.name: a for a in node.attribute}
        if "ep_cache_context" not in attrs:
            raise InvalidGraph(f"EPContext node {node.name!r} has no ep_cache_context attribute")
        name = attrs["ep_cache_context"].s.decode()
        data = _read_external(name, node.name, model_path, read)
        del node.attribute[:]
        for key, attr in attrs.items():
            if key == "ep_cache_context":
                node.attribute.append(helper.make_attribute("ep_cache_context", data))
            elif key == "embed_mode":
                node.attribute.append(helper.make_attribute("embed_mode", 1))
            else:
                node.attribute.append(attr)
    return copy


def _read_external(name: str, node_name: str, model_path: str | None, read: tuple[ReadFunc, int] | None) -> bytes:
    if read is not None:
        func, max_size = read
        buffer = OrtEpContextDataBuffer(max_size)
        try:
            func(name, buffer)
        except Exception as e:
            raise Fail(f"EPContext node {node_name!r}: the read callback failed for {name!r}: "
                       f"{type(e).__name__}: {e}") from e
        return buffer._take(name)
    if model_path is None:
        raise InvalidArgument(f"EPContext node {node_name!r} keeps its data in {name!r} (embed_mode 0), which is found "
                              "next to the model file, but the model was given as bytes. Load it from its path, or "
                              "give the data with SessionOptions.set_ep_context_data_read_func.")
    folder = os.path.dirname(model_path)
    path = os.path.normpath(os.path.join(folder, name))
    if os.path.isabs(name) or os.path.commonpath([folder, path]) != folder:
        raise InvalidArgument(f"EPContext node {node_name!r}: data file {name!r} is outside the model's folder "
                              f"{folder!r}, which is refused; keep it beside the model")
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise NoSuchFile(f"EPContext node {node_name!r}: data file {path!r} (embed_mode 0) does not exist; copy it "
                         "beside the model, or compile with embed_compiled_data_into_model=True") from None
