"""Kernel creation for the CPU EP: a native numpy kernel when the registry has one, otherwise an
``onnx.reference`` fallback kernel.

Opset resolution (``node_opset``): a node's ``since_version`` (the schema version the runtime
resolved) when it is set (> 0); otherwise the ``opset`` argument, i.e. the graph's opset import
for the node's domain. The registry picks the registration with the highest ``since`` not above
that number, so both a schema version and a model opset select the same kernel.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx import helper

from onnxhal.hal import Kernel, KernelCreateContext, Node, errors
from onnxhal.hal.graph import dtype_to_elem_type
from onnxhal.runtime.providers.cpu.kernels.registry import lookup

# Domains onnx.reference implements, with the loader for each.
_REFERENCE_DOMAINS = ("", "ai.onnx.ml", "ai.onnx.preview.training", "ai.onnx.preview", "experimental")


def node_opset(node: Node, opset: int | Mapping[str, int] | None = None) -> int:
    """Opset used to pick the kernel: ``node.since_version`` if set, else ``opset`` (an int or a
    graph's opset-import dict, read for the node's domain). 0 when none is known."""
    if node.since_version and node.since_version > 0:
        return node.since_version
    if isinstance(opset, Mapping):
        return int(opset.get(node.domain, opset.get("ai.onnx", 0) if node.domain == "" else 0))
    return int(opset or 0)


@functools.cache
def _load_reference_op(domain: str, op_type: str, version: int) -> Any:
    """onnx.reference implementation class (or function-body factory) for an op, or raise. Loaded
    once per process (a function-bodied op builds a ReferenceEvaluator): ``supports_node`` in
    ``get_capability`` and ``ReferenceKernel`` in ``create_kernel`` share it."""
    from onnx.reference import ReferenceEvaluator

    if domain == "":
        from onnx.reference.ops import load_op
    elif domain == "ai.onnx.ml":
        from onnx.reference.ops.aionnxml import load_op
    elif domain == "ai.onnx.preview.training":
        from onnx.reference.ops.aionnx_preview_training import load_op
    elif domain == "ai.onnx.preview":
        from onnx.reference.ops.aionnx_preview import load_op
    elif domain == "experimental":
        from onnx.reference.ops.experimental import load_op
    else:
        raise NotImplementedError(domain)
    try:
        if domain == "":
            return load_op(domain, op_type, version, evaluator_cls=ReferenceEvaluator)
        return load_op(domain, op_type, version)
    except RuntimeError as exc:
        # onnx.reference implements some ops only from a later version (DequantizeLinear 19,
        # Dropout 7, RNN 7); the later signature accepts the older forms: use the oldest one.
        found = re.search(r"and version \d+, found ([\d, ]+)", str(exc))
        if not found:
            raise
        oldest = min(int(v) for v in found.group(1).split(",") if v.strip())
        if domain == "":
            return load_op(domain, op_type, oldest, evaluator_cls=ReferenceEvaluator)
        return load_op(domain, op_type, oldest)


@functools.cache
def _reference_available(domain: str, op_type: str, version: int) -> bool:
    if domain not in _REFERENCE_DOMAINS:
        return False
    try:
        _load_reference_op(domain, op_type, version)
        return True
    except Exception as exc:  # noqa: BLE001 - onnx raises several unrelated types here
        # A context-dependent function body is built from the input types at the first run.
        return type(exc).__name__ == "RuntimeContextError"


def _to_value(v: Any) -> Any:
    """onnx.reference output -> the host value representation (ndarrays, lists, None)."""
    if isinstance(v, np.ndarray):
        # String tensors are object arrays of str here; onnx.reference may return '<U' arrays.
        return v.astype(object) if v.dtype.kind == "U" else v
    if v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_to_value(x) for x in v]
    if isinstance(v, dict):  # ai.onnx.ml maps
        return v
    return np.asarray(v)


def _type_proto_of(value: Any) -> onnx.TypeProto:
    if isinstance(value, list):
        elem = _type_proto_of(value[0]) if value else helper.make_tensor_type_proto(onnx.TensorProto.FLOAT, None)
        return helper.make_sequence_type_proto(elem)
    arr = np.asarray(value)
    return helper.make_tensor_type_proto(dtype_to_elem_type(arr.dtype), arr.shape)


class ReferenceKernel(Kernel):
    """Runs one node through its ``onnx.reference`` implementation, built once from the node proto.

    Operators whose reference is a context-dependent function (the function body depends on the
    input types) are built on first use for each input type signature and cached.
    """

    def __init__(self, node: Node, ctx: KernelCreateContext, version: int,
                 opsets: Mapping[str, int] | None = None) -> None:
        self.node_proto = node.to_proto()
        self.domain, self.op_type, self.version = node.domain, node.op_type, version
        self.n_explicit = len(node.inputs)
        self.n_outputs = len(node.outputs)
        self._run_params = {
            "log": lambda pattern, *args: None,
            "opsets": _opsets_for(node, version, opsets),
            "verbose": 0,
            "new_ops": {},
            "existing_functions": {},
            "evaluator_cls": _evaluator_cls(),
        }
        self._by_types: dict[tuple, Any] = {}
        self._lock = threading.Lock()
        try:
            cls = _load_reference_op(node.domain, node.op_type, version)
        except Exception as exc:  # noqa: BLE001
            if type(exc).__name__ != "RuntimeContextError":
                raise errors.NotImplemented(
                    f"CPU EP has no kernel for op {node.op_type!r} (domain {node.domain or 'ai.onnx'!r}, "
                    f"opset {version}) and onnx.reference cannot load it: {exc}") from exc
            self.op = None
        else:
            self.op = cls(self.node_proto, self._run_params)

    def _op_for(self, inputs: list) -> Any:
        key = tuple((type(x).__name__, getattr(x, "dtype", None), getattr(x, "ndim", None)) for x in inputs)
        op = self._by_types.get(key)
        if op is None:
            from onnx.reference.ops import load_op

            types = [_type_proto_of(x) if x is not None else onnx.TypeProto() for x in inputs]
            cls = load_op(self.domain, self.op_type, self.version, node=self.node_proto, input_types=types,
                          evaluator_cls=_evaluator_cls())
            op = cls(self.node_proto, self._run_params)
            with self._lock:
                self._by_types[key] = op
        return op

    def compute(self, inputs: list) -> list:
        explicit = inputs[: self.n_explicit]
        op = self.op if self.op is not None else self._op_for(explicit)
        try:
            res = op.run(*explicit)
        except np.exceptions.AxisError as e:  # an attribute's axis beyond the input's rank (the model
            # passed shape inference, which does not check every op's axes against the rank)
            shapes = [list(a.shape) if isinstance(a, np.ndarray) else type(a).__name__ for a in explicit]
            raise errors.InvalidArgument(f"{self.op_type} node {self.node_proto.name!r} on inputs of shapes {shapes}: "
                                         f"{e}. Set the node's axes within the input's rank.") from e
        if not isinstance(res, (tuple, list)):
            res = (res,)
        return [_to_value(v) for v in res][: self.n_outputs]


def _opsets_for(node: Node, version: int, opsets: Mapping[str, int] | None) -> dict[str, int]:
    """Opsets a reference op sees (ops with subgraphs evaluate them with these)."""
    out = dict(opsets) if isinstance(opsets, Mapping) else {}
    out[node.domain] = version
    out.setdefault("", onnx.defs.onnx_opset_version())
    return out


def _evaluator_cls() -> type:
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator


def create_cpu_kernel(node: Node, ctx: KernelCreateContext, opset: int | Mapping[str, int] | None = None) -> Kernel:
    """Kernel for ``node``: the native registration for its opset (see ``node_opset``), else the
    onnx.reference fallback; raises ``NotImplemented`` naming op, domain and opset if neither exists."""
    version = node_opset(node, opset)
    if version <= 0:
        version = onnx.defs.onnx_opset_version()
    if not node.since_version:
        # Record the schema version (the runtime's job; done here when it was left unset) so that
        # kernels delegating edge cases to onnx.reference load the same version.
        try:
            node.since_version = onnx.defs.get_schema(node.op_type, version, node.domain).since_version
        except onnx.defs.SchemaError:
            pass
    cls = lookup(node.domain, node.op_type, version)
    if cls is not None:
        return cls(node, ctx)
    if node.domain not in _REFERENCE_DOMAINS:
        raise errors.NotImplemented(
            f"CPU EP has no kernel for op {node.op_type!r} of domain {node.domain!r} (opset {version}); "
            "register a custom op library or an EP that supports it")
    return ReferenceKernel(node, ctx, version, opset if isinstance(opset, Mapping) else None)


def supports_node(node: Node, opset: int | Mapping[str, int] | None = None) -> bool:
    """True when ``create_cpu_kernel`` can build a kernel for ``node`` at this opset."""
    version = node_opset(node, opset) or onnx.defs.onnx_opset_version()
    if lookup(node.domain, node.op_type, version) is not None:
        return True
    return _reference_available(node.domain, node.op_type, version)
