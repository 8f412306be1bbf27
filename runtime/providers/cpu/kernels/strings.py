"""StringNormalizer: stopword removal and case change over a 1-D or [1, C] string tensor."""

from __future__ import annotations

from operator import methodcaller

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels.registry import register

_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_ASCII_UPPER = str.maketrans("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")


# The one character whose full lowercase mapping is two characters (SpecialCasing.txt) has this
# simple mapping (UnicodeData.txt); the characters with multi-character uppercase mappings stay.
_SIMPLE_LOWER = {"\u0130": "i"}


def _unicode_lower(w: str) -> str:
    full = w.lower()
    if len(full) == len(w):  # Python's mappings never shrink: equal length is one-to-one
        return full
    return "".join(m if len(m := c.lower()) == 1 else _SIMPLE_LOWER.get(c, c) for c in w)


def _unicode_upper(w: str) -> str:
    full = w.upper()
    if len(full) == len(w):
        return full
    return "".join(m if len(m := c.upper()) == 1 else c for c in w)


@register("StringNormalizer", since=10)
class StringNormalizer(Kernel):
    """As onnxruntime: empty strings are values like any other and stay (onnx.reference marks
    removed stopwords as "" and then drops every empty string); stopwords are matched ignoring
    case unless ``is_case_sensitive``; when every string is removed the output is one "" (shape [1]
    or [1, 1]). Case changes map one character to one character, as onnxruntime's towlower and
    towupper through the node's locale (checked against onnxruntime 1.32): under ``locale`` "C" or
    "POSIX" only ASCII letters change; under any other locale every letter with a one-character
    mapping does ("İ" lowers to "i", "ß" stays). Stopwords are compared through the same lowering.
    onnxruntime refuses a node whose locale the machine lacks (its default, en_US.UTF-8, where that
    is not installed); onnxhal runs it."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.action = node.attr("case_change_action", "NONE")
        if self.action not in ("NONE", "LOWER", "UPPER"):
            raise InvalidArgument(f"StringNormalizer node {node.name!r}: case_change_action {self.action!r}; use "
                                  "NONE, LOWER or UPPER.")
        self.case_sensitive = bool(node.attr("is_case_sensitive", 0))
        ascii_only = node.attr("locale", "") in ("C", "POSIX")
        # methodcaller maps str.translate over a batch without a Python frame per string
        self.lower = methodcaller("translate", _ASCII_LOWER) if ascii_only else _unicode_lower
        self.upper = methodcaller("translate", _ASCII_UPPER) if ascii_only else _unicode_upper
        stops = [s.decode() if isinstance(s, bytes) else s for s in node.attr("stopwords", []) or []]
        self.stops = set(stops) if self.case_sensitive else {self.lower(s) for s in stops}

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        if x.ndim not in (1, 2) or (x.ndim == 2 and x.shape[0] != 1):
            raise InvalidArgument(f"StringNormalizer: input shape {list(x.shape)}; it takes [C] or [1, C].")
        words = x.reshape(-1).tolist()
        if set(map(type, words)) != {str}:
            words = [w.decode() if isinstance(w, bytes) else str(w) for w in words]
        if self.stops:
            words = [w for w in words if (w if self.case_sensitive else self.lower(w)) not in self.stops]
        if self.action == "LOWER":
            words = list(map(self.lower, words))
        elif self.action == "UPPER":
            words = list(map(self.upper, words))
        if not words:
            words = [""]
        y = np.array(words, dtype=object)
        return [y.reshape(1, -1) if x.ndim == 2 else y]
