"""SequenceAt, SequenceErase and SequenceInsert with the spec's position rules and typed errors."""

from __future__ import annotations

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels.registry import register


def _position(op: str, position, length: int, allow_end: bool) -> int:
    """A position in [-n, n - 1] (or [-n, n] when inserting) as an index from the start."""
    p = int(position.reshape(-1)[0])
    hi = length if allow_end else length - 1
    if not -length <= p <= hi:
        raise InvalidArgument(f"{op}: position {p} is outside [{-length}, {hi}] for a sequence of {length} tensors.")
    return p + length if p < 0 else p


class _SequenceKernel(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        pass


@register("SequenceAt", since=11)
class SequenceAt(_SequenceKernel):
    def compute(self, inputs: list) -> list:
        seq = inputs[0]
        return [seq[_position("SequenceAt", inputs[1], len(seq), False)]]


@register("SequenceErase", since=11)
class SequenceErase(_SequenceKernel):
    def compute(self, inputs: list) -> list:
        seq = list(inputs[0])
        pos = inputs[1] if len(inputs) > 1 else None
        if pos is None:
            if not seq:
                raise InvalidArgument("SequenceErase: the sequence is empty; there is no last tensor to erase.")
            return [seq[:-1]]
        del seq[_position("SequenceErase", pos, len(seq), False)]
        return [seq]


@register("SequenceInsert", since=11)
class SequenceInsert(_SequenceKernel):
    """Inserts at ``position`` (n appends; onnx.reference wrapped n around to 0)."""

    def compute(self, inputs: list) -> list:
        seq = list(inputs[0])
        tensor = inputs[1]
        if seq and tensor.dtype != seq[0].dtype:
            raise InvalidArgument(f"SequenceInsert: a {tensor.dtype} tensor into a sequence of {seq[0].dtype}.")
        pos = inputs[2] if len(inputs) > 2 else None
        seq.insert(len(seq) if pos is None else _position("SequenceInsert", pos, len(seq), True), tensor)
        return [seq]
