"""An axis attribute or input checked against a rank, with the error that says the valid range."""

from __future__ import annotations

from onnxhal.hal.errors import InvalidArgument


def axis_index(axis: int, rank: int, op: str) -> int:
    if not -rank <= axis < rank:
        raise InvalidArgument(f"{op}: axis {axis} is out of range for an input of rank {rank}; use [-{rank}, {rank}).")
    return axis + rank if axis < 0 else axis
