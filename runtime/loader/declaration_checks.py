"""Checks of what a model declares about its values (graph inputs, outputs, value_info,
the IR version), as onnxruntime makes them when it loads a model.

A model onnxruntime refuses for these must not run here either: an input declared twice
("Duplicate definition-site for (x)"), an element type ONNX does not define ("Invalid tensor data
type 40"), a model without an IR version or with one newer than the onnx package knows.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto

from onnxhal.hal.errors import Fail, InvalidArgument, InvalidGraph
from onnxhal.runtime.loader.node_checks import walk_graphs

_ELEM_TYPES = frozenset(TensorProto.DataType.values()) - {TensorProto.UNDEFINED}


def _elem_types(tp: onnx.TypeProto):
    """The tensor element types a type declares (through sequences, optionals and maps)."""
    kind = tp.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        yield getattr(tp, kind).elem_type
    elif kind in ("sequence_type", "optional_type"):
        yield from _elem_types(getattr(tp, kind).elem_type)
    elif kind == "map_type":
        yield tp.map_type.key_type
        yield from _elem_types(tp.map_type.value_type)


def check_ir_version(proto: onnx.ModelProto) -> None:
    if not proto.HasField("ir_version"):
        raise Fail("the model has no IR version (ModelProto.ir_version is not set); onnxruntime refuses it too. "
                   "Set it, e.g. model.ir_version = 10.")
    if proto.ir_version > onnx.IR_VERSION:
        raise Fail(f"the model's IR version {proto.ir_version} is newer than the {onnx.IR_VERSION} this onnx package "
                   f"({onnx.__version__}) knows; export at IR version <= {onnx.IR_VERSION} or upgrade onnx.")


def check_declarations(proto: onnx.ModelProto) -> None:
    """Graph inputs declared once each, and every declared element type one ONNX defines."""
    for g, where in walk_graphs(proto.graph):
        seen: set[str] = set()
        for v in g.input:
            if v.name in seen:
                raise InvalidGraph(f"graph {g.name!r}{where} declares input {v.name!r} twice; declare it once.")
            seen.add(v.name)
        for v in (*g.input, *g.output, *g.value_info):
            if not v.HasField("type"):
                continue
            tp = v.type
            if tp.HasField("tensor_type") and tp.tensor_type.elem_type in _ELEM_TYPES:
                continue  # the common case, without the generator
            for t in _elem_types(tp):
                if t not in _ELEM_TYPES and not (t == TensorProto.UNDEFINED and v in g.value_info):
                    raise InvalidArgument(f"graph {g.name!r}{where}: value {v.name!r} declares element type {t}, "
                                          "which is not an ONNX tensor element type (onnx.TensorProto.DataType).")
