"""Copies of onnx's messages that keep some fields: parsing a model's bytes as one reads, in C,
only what a check needs and skips the rest as unknown fields (no Python object per node).

``proto_strings`` parses a model as a proto3 copy with only its string and message fields (proto3
validates UTF-8 as it parses).
"""

from __future__ import annotations

from collections.abc import Callable

import onnx
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_FIELD = descriptor_pb2.FieldDescriptorProto


def mirror_model(package: str, keep: Callable[[str, descriptor_pb2.FieldDescriptorProto], bool]) -> type | None:
    """The ModelProto class of a proto3 copy of onnx's proto file (in a descriptor pool of its own,
    messages in ``package``) with the fields ``keep(message name, field)`` keeps; message fields
    are always kept, enums become int32 (a varint alike). None where the copy cannot be built (an
    onnx whose file this cannot mirror): the callers then check as they would without it."""
    source = descriptor_pb2.FileDescriptorProto()
    onnx.ModelProto.DESCRIPTOR.file.CopyToProto(source)
    mirror = descriptor_pb2.FileDescriptorProto(name=f"{package}.proto", package=package, syntax="proto3")

    def copy(src: descriptor_pb2.DescriptorProto, dst: descriptor_pb2.DescriptorProto) -> None:
        dst.name = src.name
        for f in src.field:
            if f.type != _FIELD.TYPE_MESSAGE and not keep(src.name, f):
                continue  # skipped as an unknown field
            g = dst.field.add()
            g.CopyFrom(f)
            g.ClearField("default_value")
            g.label = _FIELD.LABEL_REPEATED if f.label == _FIELD.LABEL_REPEATED else _FIELD.LABEL_OPTIONAL
            if f.type == _FIELD.TYPE_MESSAGE:
                g.type_name = f".{package}." + f.type_name.removeprefix(f".{source.package}.")
            elif f.type == _FIELD.TYPE_ENUM:
                g.type = _FIELD.TYPE_INT32
                g.ClearField("type_name")
        used = sorted({g.oneof_index for g in dst.field if g.HasField("oneof_index")})
        renumber = {old: new for new, old in enumerate(used)}  # a oneof left with no field is dropped
        for g in dst.field:
            if g.HasField("oneof_index"):
                g.oneof_index = renumber[g.oneof_index]
        dst.oneof_decl.extend(src.oneof_decl[k] for k in used)
        for nested in src.nested_type:
            copy(nested, dst.nested_type.add())

    try:
        for m in source.message_type:
            copy(m, mirror.message_type.add())
        pool = descriptor_pool.DescriptorPool()
        pool.Add(mirror)
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.ModelProto"))
    except Exception:  # noqa: BLE001 - a proto file this copy cannot mirror
        return None
