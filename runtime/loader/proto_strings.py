"""Every string of a model is valid UTF-8, checked before anything reads one.

protobuf's Python API hands a proto2 ``string`` field that is not valid UTF-8 over as ``bytes``, not
``str``, so a flipped byte in an op type, a value name or an external-data location reached our code
and onnx's as bytes and failed there with a bare TypeError ("startswith first arg must be bytes",
"_open_external_data(): incompatible function arguments"). onnxruntime's Python API fails on them
with a UnicodeDecodeError. Here they are refused, typed, naming the field.

The common case, every string valid, is checked in C: the model's bytes parsed as a mirror of
onnx's messages in proto3 syntax, whose parser validates UTF-8 (``_utf8_mirror``: only the string and
message fields; weights and number lists are skipped). It validates every
string field, those below too, so where it passes they pass; where it fails the walk below decides,
in bulk (``"".join`` of a message's strings raises TypeError at the first bytes, in C), and only a
message that fails is walked field by field, to name it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator

import onnx
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from onnxhal.hal.errors import InvalidProtobuf
from onnxhal.runtime.loader.proto_mirror import mirror_model


def _all_str(strings: Iterable) -> bool:
    try:
        "".join(strings)
    except TypeError:
        return False
    return True


def _value_infos_ok(values: Iterable[onnx.ValueInfoProto]) -> bool:
    return _all_str(s for v in values for s in (v.name, v.doc_string, v.type.denotation,
                                                 *(d.dim_param for d in v.type.tensor_type.shape.dim)))


def _graph_ok(g: onnx.GraphProto) -> bool:
    if not _all_str([g.name, g.doc_string]):
        return False
    if not (_value_infos_ok(g.input) and _value_infos_ok(g.output) and _value_infos_ok(g.value_info)):
        return False
    for t in g.initializer:
        if not _all_str([t.name, t.doc_string, *(e.key for e in t.external_data), *(e.value for e in t.external_data)]):
            return False
    return _nodes_ok(g.node) and all(_all_str([st.values.name, st.indices.name]) for st in g.sparse_initializer)


def _nodes_ok(nodes: Iterable[onnx.NodeProto]) -> bool:
    if not _all_str(s for n in nodes for s in (n.op_type, n.domain, n.name, n.doc_string, *n.input, *n.output)):
        return False
    for n in nodes:
        for a in n.attribute:
            if not _all_str([a.name, a.ref_attr_name, a.doc_string]):
                return False
            if (a.HasField("g") and not _graph_ok(a.g)) or not all(_graph_ok(g) for g in a.graphs):
                return False
            if a.HasField("t") and not _all_str([a.t.name]):
                return False
    return True


def _model_ok(m: onnx.ModelProto) -> bool:
    if not _all_str([m.producer_name, m.producer_version, m.domain, m.doc_string,
                     *(o.domain for o in m.opset_import), *(p.key for p in m.metadata_props),
                     *(p.value for p in m.metadata_props)]):
        return False
    for f in m.functions:
        if not _all_str([f.name, f.domain, f.doc_string, *f.input, *f.output, *f.attribute,
                         *(o.domain for o in f.opset_import)]) or not _nodes_ok(f.node):
            return False
    return _graph_ok(m.graph)


def _first_bad(message: Message, path: str) -> Iterator[tuple[str, bytes]]:
    """Every string field of ``message`` that is bytes, with its path (the slow, naming walk)."""
    for field, value in message.ListFields():
        if field.type not in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_MESSAGE):
            continue
        where = f"{path}.{field.name}"
        repeated = not isinstance(value, (str, bytes, Message))  # a repeated field is a container
        items = list(enumerate(value)) if repeated else [(None, value)]
        for k, v in items:
            at = where if k is None else f"{where}[{k}]"
            if field.type == FieldDescriptor.TYPE_STRING and isinstance(v, bytes):
                yield at, v
            elif field.type == FieldDescriptor.TYPE_MESSAGE:
                yield from _first_bad(v, at)


@functools.cache
def _utf8_mirror() -> type | None:
    """A proto3 copy of onnx's messages with only their string and message fields
    (``proto_mirror``), and TensorProto's ``data_location`` (``mirror_may_keep_external_data``):
    parsing a model as one validates every string as UTF-8, in C, and skips every other field
    (weights, number lists: measured faster skipped than parsed)."""
    return mirror_model("onnxhal_utf8", lambda message, f: f.type == f.TYPE_STRING or
                        (message == "TensorProto" and f.name == "data_location"))


#: ``data_location`` EXTERNAL (1) as serialized: TensorProto field 14 as a varint (tag 0x70), then 1
_EXTERNAL_LOCATION = bytes([14 << 3, onnx.TensorProto.EXTERNAL])


def utf8_mirror_of(serialized: bytes) -> Message | None:
    """The model's bytes parsed as the mirror, its unknown fields (every field it does not keep)
    dropped; None where a string is not valid UTF-8, or where the mirror cannot tell (the walk then
    decides)."""
    mirror = _utf8_mirror()
    if mirror is None:
        return None
    try:
        parsed = mirror.FromString(serialized)
    except Exception:  # noqa: BLE001 - bad UTF-8 (DecodeError), or anything else the walk then judges
        return None
    parsed.DiscardUnknownFields()
    return parsed


def mirror_may_keep_external_data(mirror: Message) -> bool:
    """Whether a tensor of the model ``mirror`` was parsed from may keep its data in a file: False
    only where none does, so that the walk over every tensor (``external_data.load_external_data``)
    can be skipped. The mirror serialized holds message tags and lengths, strings and the
    ``data_location`` fields alone; a tensor whose data is external writes the bytes
    ``_EXTERNAL_LOCATION``, which no tag or length can (0x01 is no valid tag); a string that holds
    them only makes this say True."""
    return has_external_location(mirror.SerializeToString())


def has_external_location(serialized: bytes) -> bool:
    """Whether ``serialized`` holds the bytes ``_EXTERNAL_LOCATION`` (``in``'s answer). Found from
    the rare second byte, 0x01, by ``bytes.find``'s memchr, then the byte before it checked: the
    first byte, 0x70, is the letter 'p', which a mirror's strings (a dynamo export's per-node
    metadata, 60-70% of its bytes) hold so often that ``in`` on the pair stops at every one
    (bert_dynamo's 269 kB mirror: 0.43 -> 0.06 ms; the corpus's 170 mirrors 8.2 -> 3.3 ms)."""
    lead, mark = _EXTERNAL_LOCATION
    find = serialized.find
    i = find(mark, 1)
    while i >= 0:
        if serialized[i - 1] == lead:
            return True
        i = find(mark, i + 1)
    return False


def valid_utf8(proto: onnx.ModelProto, serialized: bytes | None = None) -> bool:
    """Whether every string field of ``proto`` is valid UTF-8, as the mirror parses it (False also
    where the mirror cannot tell: the walk then decides). ``serialized``: ``proto``'s bytes, where
    the caller has them (a model read from a file)."""
    return utf8_mirror_of(proto.SerializeToString() if serialized is None else serialized) is not None


def check_strings(proto: onnx.ModelProto, what: str, mirror: Message | None = None) -> None:
    """Raise InvalidProtobuf naming the first string field of ``proto`` that is not valid UTF-8.
    ``mirror``: ``utf8_mirror_of`` the model's bytes, where the caller parsed it (its strings are
    then valid)."""
    if mirror is not None or valid_utf8(proto) or _model_ok(proto):
        return
    where, raw = next(_first_bad(proto, "model"), ("a string field", b""))
    raise InvalidProtobuf(f"{what}: field {where} is not valid UTF-8 ({raw[:60]!r}); ONNX strings are UTF-8. "
                          "The file is damaged or was not written by an ONNX exporter.")
