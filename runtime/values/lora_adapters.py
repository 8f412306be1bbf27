"""LoRA adapters: onnxruntime's adapter file (``.onnx_adapter``), ``AdapterFormat`` and ``LoraAdapter``.

The file is a FlatBuffer of onnxruntime's schema (onnxruntime/lora/adapter_format/adapter_schema.fbs,
file identifier "TORT", format version 1 in adapter_format_version.h): an ``Adapter`` table
(format_version, adapter_version, model_version: int32; parameters: [Parameter]) whose
``Parameter`` tables hold a name, int64 dims, an ONNX element type (TensorProto's numbering) and
the raw little-endian bytes (aligned to 8). The reader and the writer here know this one schema
only, so no FlatBuffers library is needed.

At run time an active adapter's parameters are added to the feeds (``RunOptions.add_active_adapter``),
so they replace the model inputs or overridable initializers of those names for that run, as
onnxruntime's Run does; a name the model cannot take as an input is refused.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import onnx

from onnxhal.hal.errors import Fail, InvalidArgument, NoSuchFile

_IDENTIFIER = b"TORT"
FORMAT_VERSION = 1
# The element types onnxruntime 1.32 reads back (measured: it refuses bool, string, complex and the
# 4-bit and later types, and parameters without dims, when it reads the file).
_SUPPORTED_TYPES = frozenset((*range(1, 8), *range(10, 14), *range(16, 21)))


# -- reading ------------------------------------------------------------------------------------
class _Reader:
    """Bounds-checked access to one FlatBuffer held in ``data``."""

    def __init__(self, data: bytes, source: str) -> None:
        self.data = data
        self.source = source

    def bad(self, what: str) -> Fail:
        return Fail(f"The buffer fails lora adapter format verification: {what} in {self.source}. Write the file "
                    "with onnxruntime's or onnxhal's AdapterFormat.export_adapter.")

    def unpack(self, fmt: str, pos: int) -> Any:
        size = struct.calcsize(fmt)
        if pos < 0 or pos + size > len(self.data):
            raise self.bad(f"offset {pos} past the end ({len(self.data)} bytes)")
        return struct.unpack_from(fmt, self.data, pos)[0]

    def field(self, table: int, index: int) -> int:
        """Position of field ``index`` of the table at ``table``, or 0 when the field is absent."""
        vtable = table - self.unpack("<i", table)
        vt_size = self.unpack("<H", vtable)
        slot = 4 + 2 * index
        if slot + 2 > vt_size:
            return 0
        off = self.unpack("<H", vtable + slot)
        return table + off if off else 0

    def int32(self, table: int, index: int) -> int:
        pos = self.field(table, index)
        return self.unpack("<i", pos) if pos else 0

    def target(self, table: int, index: int) -> int:
        """Position a reference field points to (a string, vector or table), 0 when absent."""
        pos = self.field(table, index)
        return pos + self.unpack("<I", pos) if pos else 0

    def vector(self, pos: int, item_size: int) -> tuple[int, int]:
        """(position of the first item, item count) of the vector at ``pos``."""
        n = self.unpack("<I", pos)
        if pos + 4 + n * item_size > len(self.data):
            raise self.bad(f"a vector of {n} items at {pos} runs past the end")
        return pos + 4, n


def _parse(data: bytes, source: str) -> tuple[tuple[int, int, int], dict[str, np.ndarray]]:
    """((format, adapter, model) versions, {name: array viewing ``data``}) of an adapter file."""
    r = _Reader(data, source)
    if len(data) <= 8 or data[4:8] != _IDENTIFIER:
        raise Fail(f"The buffer does not appear to be a valid lora parameter format: {source} does not start with "
                   "the adapter file identifier 'TORT'. Give a file written by AdapterFormat.export_adapter.")
    root = r.unpack("<I", 0)
    versions = (r.int32(root, 0), r.int32(root, 1), r.int32(root, 2))
    if versions[0] != FORMAT_VERSION:
        raise Fail(f"Unsupported lora format version {versions[0]} in {source}: this reader knows version "
                   f"{FORMAT_VERSION}. Re-export the adapter with this version of the tools.")
    params: dict[str, np.ndarray] = {}
    vec = r.target(root, 3)
    if not vec:
        return versions, params
    first, count = r.vector(vec, 4)
    for i in range(count):
        slot = first + 4 * i
        table = slot + r.unpack("<I", slot)
        name_pos = r.target(table, 0)
        name = ""
        if name_pos:
            start, n = r.vector(name_pos, 1)
            name = data[start:start + n].decode("utf-8")
        dims: tuple[int, ...] = ()
        dims_pos = r.target(table, 1)
        if dims_pos:
            start, n = r.vector(dims_pos, 8)
            dims = struct.unpack_from(f"<{n}q", data, start)
        elem = r.int32(table, 2)
        if elem not in _SUPPORTED_TYPES:
            raise r.bad(f"parameter {name!r} has element type {elem}, which is not a supported LoRA parameter type")
        if not dims:
            raise r.bad(f"parameter {name!r} has no dims")
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem))
        raw_pos = r.target(table, 3)
        start, nbytes = r.vector(raw_pos, 1) if raw_pos else (0, 0)
        expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
        if nbytes != expected or any(d < 0 for d in dims):
            raise r.bad(f"parameter {name!r} of shape {list(dims)} and type {dtype} holds {nbytes} bytes, "
                        f"expected {expected}")
        arr = np.frombuffer(data, dtype=dtype.newbyteorder("<"), count=expected // dtype.itemsize, offset=start)
        params[name] = arr.reshape(dims)
    return versions, params


def _read_file(file_path: os.PathLike | str) -> tuple[tuple[int, int, int], dict[str, np.ndarray]]:
    path = os.fspath(file_path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise NoSuchFile(f"LoRA adapter file {path!r} does not exist. Give the path of a .onnx_adapter file.") \
            from None
    except OSError as e:
        raise Fail(f"LoRA adapter file {path!r} cannot be read: {e.strerror}") from None
    return _parse(data, repr(path))


# -- writing ------------------------------------------------------------------------------------
class _Writer:
    """Lays the buffer out front to back: every reference points forward, as FlatBuffers' unsigned
    offsets require; a table's vtable is written just before it (a positive soffset)."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def align(self, to: int, extra: int = 0) -> None:
        """Pad so that ``extra`` bytes from now the position is a multiple of ``to``."""
        self.buf.extend(b"\0" * (-(len(self.buf) + extra) % to))

    def table(self, n: int) -> tuple[int, list[int]]:
        """A table of ``n`` 4-byte fields (int32s and references, filled in later):
        (table position, field positions)."""
        self.align(4)
        vtable = len(self.buf)
        self.buf += struct.pack(f"<HH{n}H", 4 + 2 * n, 4 + 4 * n, *(4 + 4 * i for i in range(n)))
        self.align(4)
        table = len(self.buf)
        self.buf += struct.pack("<i", table - vtable) + b"\0" * (4 * n)
        return table, [table + 4 + 4 * i for i in range(n)]

    def set_int(self, pos: int, value: int) -> None:
        struct.pack_into("<i", self.buf, pos, value)

    def point(self, pos: int) -> None:
        """Make the reference field at ``pos`` point to what is written next (the current end)."""
        struct.pack_into("<I", self.buf, pos, len(self.buf) - pos)

    def vector(self, ref: int, payload: bytes, count: int, align: int = 4, terminator: bytes = b"") -> None:
        self.align(align, 4)
        self.point(ref)
        self.buf += struct.pack("<I", count) + payload + terminator


def _serialize(adapter_version: int, model_version: int, params: Mapping[str, np.ndarray]) -> bytes:
    w = _Writer()
    w.buf += b"\0\0\0\0" + _IDENTIFIER
    root, (fmt, adapter, model, plist) = w.table(4)  # format, adapter and model versions, parameters
    struct.pack_into("<I", w.buf, 0, root)
    w.set_int(fmt, FORMAT_VERSION)
    w.set_int(adapter, adapter_version)
    w.set_int(model, model_version)
    w.align(4)
    w.point(plist)
    w.buf += struct.pack("<I", len(params))
    slots = len(w.buf)
    w.buf += b"\0" * (4 * len(params))
    for i, (name, arr) in enumerate(params.items()):
        table, (name_ref, dims_ref, type_ref, data_ref) = w.table(4)  # name, dims, data_type, raw_data
        struct.pack_into("<I", w.buf, slots + 4 * i, table - (slots + 4 * i))
        encoded = name.encode("utf-8")
        w.vector(name_ref, encoded, len(encoded), terminator=b"\0")
        w.vector(dims_ref, struct.pack(f"<{arr.ndim}q", *arr.shape), arr.ndim, align=8)
        w.set_int(type_ref, onnx.helper.np_dtype_to_tensor_dtype(arr.dtype))
        raw = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()
        w.vector(data_ref, raw, len(raw), align=8)
    w.align(8)
    return bytes(w.buf)


def _host_array(name: Any, value: Any) -> np.ndarray:
    from onnxhal.runtime.values.ortvalue import OrtValue

    if not isinstance(name, str):
        raise InvalidArgument(f"LoRA parameter names must be str, got {type(name).__name__} {name!r}")
    if not isinstance(value, OrtValue):
        raise InvalidArgument(f"LoRA parameter {name!r} must be an OrtValue, got {type(value).__name__}; wrap an "
                              "array with OrtValue.ortvalue_from_numpy(array)")
    if not value.is_tensor():
        raise InvalidArgument(f"LoRA parameter {name!r} must be a dense tensor, got {value.data_type()}")
    arr = value.numpy()
    elem = value.element_type()
    if elem not in _SUPPORTED_TYPES:
        raise InvalidArgument(f"LoRA parameter {name!r} is a {value.data_type()}, which adapter files cannot hold "
                              "(onnxruntime reads numeric types other than bool, complex and 4-bit ones); cast it")
    if arr.ndim == 0:
        raise InvalidArgument(f"LoRA parameter {name!r} is a scalar; adapter parameters need at least one dimension "
                              "(onnxruntime refuses empty dims): reshape it to [1]")
    return arr


class AdapterFormat:
    """A LoRA adapter file's contents, to build and export (``set_*``, ``export_adapter``) or read
    (``read_adapter``), as onnxruntime's ``AdapterFormat``."""

    def __init__(self) -> None:
        self._format_version = FORMAT_VERSION
        self._adapter_version = 0
        self._model_version = 0
        self._params: dict[str, np.ndarray] = {}

    @staticmethod
    def read_adapter(file_path: os.PathLike | str) -> AdapterFormat:
        """The adapter in ``file_path``; parameters view the file's bytes without a copy."""
        (fmt, adapter, model), params = _read_file(file_path)
        out = AdapterFormat()
        out._format_version, out._adapter_version, out._model_version, out._params = fmt, adapter, model, params
        return out

    def export_adapter(self, file_path: os.PathLike | str) -> None:
        """Write the adapter to ``file_path`` in onnxruntime's adapter format."""
        data = _serialize(self._adapter_version, self._model_version, self._params)
        with open(os.fspath(file_path), "wb") as f:
            f.write(data)

    def get_format_version(self) -> int:
        return self._format_version

    def set_adapter_version(self, adapter_version: int) -> None:
        self._adapter_version = _int32("adapter_version", adapter_version)

    def get_adapter_version(self) -> int:
        return self._adapter_version

    def set_model_version(self, model_version: int) -> None:
        self._model_version = _int32("model_version", model_version)

    def get_model_version(self) -> int:
        return self._model_version

    def set_parameters(self, params: Mapping[str, Any]) -> None:
        """Set the parameters to export, {name: OrtValue} (host tensors)."""
        if not isinstance(params, Mapping):
            raise InvalidArgument(f"set_parameters expects a dict of name -> OrtValue, got {type(params).__name__}")
        self._params = {name: _host_array(name, v) for name, v in params.items()}

    def get_parameters(self) -> dict[str, Any]:
        """The parameters, {name: OrtValue}; for a read adapter they view the file's bytes."""
        from onnxhal.runtime.values.ortvalue import OrtValue

        return {k: OrtValue(v) for k, v in self._params.items()}


def _int32(what: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not -2**31 <= int(value) < 2**31:
        raise InvalidArgument(f"{what} must be a 32-bit int, got {value!r}")
    return int(value)


class LoraAdapter:
    """A loaded LoRA adapter to activate for a run with ``RunOptions.add_active_adapter``."""

    def __init__(self) -> None:
        self._params: dict[str, np.ndarray] = {}

    def Load(self, file_path: os.PathLike | str) -> None:  # noqa: N802 - onnxruntime's name
        """Read the adapter file at ``file_path`` (its parameters then replace the ones read before)."""
        _, self._params = _read_file(file_path)

    @property
    def parameters(self) -> Mapping[str, np.ndarray]:
        """{name: array} of the loaded adapter (read-only views of the file's bytes)."""
        return self._params


def feeds_with_adapters(input_feed: Mapping[str, Any], adapters: Iterable[LoraAdapter],
                        input_names: Iterable[str]) -> dict[str, Any]:
    """``input_feed`` with the parameters of ``adapters`` added. As in onnxruntime 1.32 (measured),
    where the adapters' values come first among the feeds and the first of a name is used, an
    adapter's value wins over a feed of the same name and an earlier adapter over a later one. A
    parameter name that is not one of ``input_names`` is ``InvalidArgument``."""
    known = set(input_names)
    out = dict(input_feed)
    taken: set[str] = set()
    for adapter in adapters:
        for name, value in adapter.parameters.items():
            if name in taken:
                continue
            taken.add(name)
            if name not in known:
                raise InvalidArgument(f"Invalid input name: {name}: the active LoRA adapter's parameter {name!r} is "
                                      f"not an input or overridable initializer of the model ({sorted(known)}). "
                                      "Use an adapter made for this model, or keep the weight as a graph input.")
            out[name] = value
    return out
