"""Session options that change the model before it is optimized: fixed sizes for symbolic input
dimensions (``add_free_dimension_override_by_name`` / ``_by_denotation``) and initializers the
application supplies (``add_initializer``). Semantics as onnxruntime's, except where it crashes
(an initializer of another dtype or shape) or takes a negative size: those are InvalidArgument.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np
import onnx

from onnxhal.hal import Graph
from onnxhal.hal.errors import InvalidArgument

logger = logging.getLogger("onnxhal.session")


def override_free_dimensions(proto: onnx.ModelProto, by_name: Mapping[str, int],
                             by_denotation: Mapping[str, int]) -> onnx.ModelProto:
    """``proto`` with the free dimensions of its main graph's inputs fixed: a dimension whose
    ``dim_param`` is in ``by_name`` or whose denotation (lower-cased) is in ``by_denotation``. A copy
    when anything changes; the caller's model is never modified. Shape inference, which runs after,
    carries the sizes to the outputs."""
    if not by_name and not by_denotation:
        return proto
    initializers = {t.name for t in proto.graph.initializer}
    out: onnx.ModelProto | None = None
    for i, vi in enumerate(proto.graph.input):
        if vi.name in initializers or not vi.type.tensor_type.HasField("shape"):
            continue  # an overridable initializer's shape is its tensor's
        for k, dim in enumerate(vi.type.tensor_type.shape.dim):
            if dim.HasField("dim_value"):
                continue
            named = by_name.get(dim.dim_param) if dim.dim_param else None
            denoted = by_denotation.get(dim.denotation.lower()) if dim.denotation else None
            if named is not None and denoted is not None and named != denoted:
                raise InvalidArgument(
                    f"Conflicting free dimension overrides for input {vi.name!r}, dimension {k}: its name "
                    f"{dim.dim_param!r} is overridden to {named} and its denotation {dim.denotation!r} to {denoted}. "
                    "Override it once, or give both the same value.")
            value = named if named is not None else denoted
            if value is None:
                continue
            if out is None:
                out = onnx.ModelProto()
                out.CopyFrom(proto)
            out.graph.input[i].type.tensor_type.shape.dim[k].dim_value = value  # clears dim_param (a oneof)
    return out if out is not None else proto


def override_initializers(graph: Graph, overrides: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Put the application's arrays in place of ``graph``'s initializers of the same names; the
    ones applied are returned."""
    applied: dict[str, np.ndarray] = {}
    for name, arr in overrides.items():
        old = graph.initializers.get(name)
        if old is None:
            known = sorted(graph.initializers)
            logger.warning("add_initializer(%r): the model has no initializer of that name, so it is ignored "
                           "(the model's initializers: %s%s)", name, known[:10], " ..." if len(known) > 10 else "")
            continue
        if arr.dtype != old.dtype or arr.shape != old.shape:
            raise InvalidArgument(
                f"add_initializer({name!r}): the model's initializer is {old.dtype} {list(old.shape)} but the "
                f"OrtValue is {arr.dtype} {list(arr.shape)}. Give one of the same dtype and shape.")
        graph.initializers[name] = applied[name] = arr
    return applied
