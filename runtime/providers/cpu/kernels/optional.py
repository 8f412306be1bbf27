"""Optional ops. An empty optional is None; a present optional is the value itself."""

from __future__ import annotations

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.runtime.providers.cpu.kernels.registry import register


class _NoAttr(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        pass


@register("Optional", since=15)
class Optional(_NoAttr):
    def compute(self, inputs: list) -> list:
        return [inputs[0] if inputs else None]


@register("OptionalHasElement", since=15)
class OptionalHasElement(_NoAttr):
    def compute(self, inputs: list) -> list:
        return [np.array(bool(inputs) and inputs[0] is not None)]


@register("OptionalGetElement", since=15)
class OptionalGetElement(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.name = node.inputs[0] if node.inputs else ""

    def compute(self, inputs: list) -> list:
        if inputs[0] is None:
            from onnxhal.hal.errors import InvalidArgument

            raise InvalidArgument(f"OptionalGetElement: optional input {self.name!r} is empty; "
                                  "check it with OptionalHasElement first")
        return [inputs[0]]
