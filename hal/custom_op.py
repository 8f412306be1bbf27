"""Custom operators an EP library brings (onnxruntime's ``OrtCustomOp`` / ``OrtCustomOpDomain``,
handed over by ``OrtEpFactory::GetCustomOpDomains``).

A factory returns ``CustomOpDomain``s from ``EpFactory.get_custom_op_domains()``. A session that
uses the factory's EP (or that selects EPs by policy, which takes every registered factory's
domains, as onnxruntime) can then run models with those operators: an op whose
``execution_provider`` is None (onnxruntime's default) or the CPU EP runs on the CPU EP with the
op's kernel; an op meant for another EP is left for that EP to claim in ``get_capability``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from onnxhal.hal.errors import InvalidArgument

if TYPE_CHECKING:
    from onnxhal.hal.ep import Kernel
    from onnxhal.hal.graph import Node


class CustomOp:
    """One operator: class attribute ``op_type``, ``execution_provider`` (None: the CPU EP), and
    ``create_kernel(node)``, called once per node when the session is built."""

    op_type: str = ""
    execution_provider: str | None = None

    def create_kernel(self, node: Node) -> Kernel:
        raise NotImplementedError(f"custom op {self.op_type!r} does not implement create_kernel(node)")


class CustomOpDomain:
    """The operators of one domain (e.g. "com.example")."""

    def __init__(self, domain: str, ops: Sequence[CustomOp]) -> None:
        if not isinstance(domain, str):
            raise InvalidArgument(f"CustomOpDomain: domain must be a str, got {domain!r}")
        for op in ops:
            if not isinstance(op, CustomOp) or not op.op_type:
                raise InvalidArgument(f"CustomOpDomain({domain!r}): {op!r} is not a CustomOp with an op_type")
        self.domain = domain
        self.ops = list(ops)
