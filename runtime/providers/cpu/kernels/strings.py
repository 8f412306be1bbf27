"""StringNormalizer: stopword removal and case change over a 1-D or [1, C] string tensor."""

from __future__ import annotations

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels.registry import register


@register("StringNormalizer", since=10)
class StringNormalizer(Kernel):
    """As onnxruntime: empty strings are values like any other and stay (onnx.reference marks
    removed stopwords as "" and then drops every empty string); stopwords are matched ignoring
    case unless ``is_case_sensitive``; when every string is removed the output is one "" (shape [1]
    or [1, 1]). The locale is not consulted: Python's str.lower/upper are Unicode-aware."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.action = node.attr("case_change_action", "NONE")
        if self.action not in ("NONE", "LOWER", "UPPER"):
            raise InvalidArgument(f"StringNormalizer node {node.name!r}: case_change_action {self.action!r}; use "
                                  "NONE, LOWER or UPPER.")
        self.case_sensitive = bool(node.attr("is_case_sensitive", 0))
        stops = [s.decode() if isinstance(s, bytes) else s for s in node.attr("stopwords", []) or []]
        self.stops = set(stops) if self.case_sensitive else {s.lower() for s in stops}

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        if x.ndim not in (1, 2) or (x.ndim == 2 and x.shape[0] != 1):
            raise InvalidArgument(f"StringNormalizer: input shape {list(x.shape)}; it takes [C] or [1, C].")
        words = [w.decode() if isinstance(w, bytes) else str(w) for w in x.reshape(-1)]
        if self.stops:
            words = [w for w in words if (w if self.case_sensitive else w.lower()) not in self.stops]
        if self.action == "LOWER":
            words = [w.lower() for w in words]
        elif self.action == "UPPER":
            words = [w.upper() for w in words]
        if not words:
            words = [""]
        y = np.array(words, dtype=object)
        return [y.reshape(1, -1) if x.ndim == 2 else y]
