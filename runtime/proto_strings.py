"""Every string of a model is valid UTF-8, checked before anything reads one.

protobuf's Python API hands a proto2 ``string`` field that is not valid UTF-8 over as ``bytes``, not
``str``, so a flipped byte in an op type, a value name or an external-data location reached our code
and onnx's as bytes and failed there with a bare TypeError ("startswith first arg must be bytes",
"_open_external_data(): incompatible function arguments"). onnxruntime's Python API fails on them
with a UnicodeDecodeError. Here they are refused, typed, naming the field.
"""

from __future__ import annotations

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from onnxhal.hal.errors import InvalidProtobuf

_STRING = FieldDescriptor.TYPE_STRING
_MESSAGE = FieldDescriptor.TYPE_MESSAGE


def _first_bad(message: Message, path: str) -> tuple[str, bytes] | None:
    for field, value in message.ListFields():
        where = f"{path}.{field.name}"
        repeated = not isinstance(value, (str, bytes, Message))  # a repeated field is a container
        if field.type == _STRING:
            for k, v in enumerate(value if repeated else [value]):
                if isinstance(v, bytes):
                    return (f"{where}[{k}]" if repeated else where), v
        elif field.type == _MESSAGE:
            for k, v in enumerate(value if repeated else [value]):
                found = _first_bad(v, f"{where}[{k}]" if repeated else where)
                if found is not None:
                    return found
    return None


def check_strings(proto: Message, what: str) -> None:
    """Raise InvalidProtobuf naming the first string field of ``proto`` that is not valid UTF-8."""
    found = _first_bad(proto, "model")
    if found is not None:
        where, raw = found
        raise InvalidProtobuf(f"{what}: field {where} is not valid UTF-8 ({raw[:60]!r}); ONNX strings are UTF-8. "
                              "The file is damaged or was not written by an ONNX exporter.")
