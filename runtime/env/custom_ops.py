"""Which EP libraries' custom operators a session gets (``EpFactory.get_custom_op_domains``).

As onnxruntime: the factories of the EPs the session was given (``providers=[...]``, explicit
devices), or every registered factory when EPs are selected by a policy or delegate. The first
factory to bring an operator (domain, op type) wins; a second one is logged.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from onnxhal.hal import CustomOp, CustomOpDomain, EpFactory
from onnxhal.hal.errors import Fail
from onnxhal.runtime.env.environment import Environment

logger = logging.getLogger("onnxhal.session")


def session_factories(env: Environment, chosen: Sequence[EpFactory], auto_selected: bool) -> list[EpFactory]:
    if auto_selected:
        return [f for lib in env.libraries() for f in lib.factories]
    return list(chosen)


def custom_ops(factories: Sequence[EpFactory]) -> dict[tuple[str, str], CustomOp]:
    """(domain, op type) -> the CustomOp, from the factories in order."""
    out: dict[tuple[str, str], CustomOp] = {}
    for factory in factories:
        try:
            domains = list(factory.get_custom_op_domains())
        except Exception as e:
            raise Fail(f"{factory.name}: get_custom_op_domains failed: {type(e).__name__}: {e}") from e
        for domain in domains:
            if not isinstance(domain, CustomOpDomain):
                raise Fail(f"{factory.name}: get_custom_op_domains returned {domain!r}, not a hal.CustomOpDomain")
            for op in domain.ops:
                key = ("" if domain.domain == "ai.onnx" else domain.domain, op.op_type)
                if key in out:
                    logger.warning("%s: custom op %s.%s is already brought by another library; the first one is used",
                                   factory.name, *key)
                    continue
                out[key] = op
    return out
