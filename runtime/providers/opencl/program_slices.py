"""The part of an OpenCL program source that one kernel needs.

The GEMM family is one source of some forty kernels (about 300K characters), and a fused epilogue
makes a new copy of it. Building a whole copy for the one or two kernels a plan launches costs the
compiler the whole text, every time (docs/opencl-internals.md has the figures): ``kernel_slice``
keeps the kernel, the functions it calls (transitively), every preprocessor line and every
declaration that names no function (typedefs), in their order, and drops the rest.

The cut is made on the source's top-level items, found by brace depth with comments and
preprocessor lines skipped, and its call graph by identifiers: a function is kept when any kept
item (or a macro a kept item names) mentions its name. That over-approximates (a name in an
unrelated context keeps a function it did not need), never under: a slice builds wherever the whole
source builds. A source whose kernel is not found as a top-level item, or one below
``SLICE_MIN_CHARS``, is built whole.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

#: Below this many characters a source is built whole: a program's fixed cost (about 0.25 s on PoCL)
#: outweighs what a slice of a small source saves, and one program serves all its kernels.
SLICE_MIN_CHARS = 32768

# Preprocessor lines (with continuations), comments, and the characters that end a top-level item.
_TOKENS = re.compile(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*|//[^\n]*|/\*.*?\*/|[{};]", re.S | re.M)
_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_IDENT = re.compile(r"[A-Za-z_]\w*")
_DEFINE = re.compile(r"[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)")


@dataclass(frozen=True)
class _Item:
    """One top-level item: ``name`` is the function (or macro) it defines or declares, if any."""

    text: str
    name: str | None
    preprocessor: bool
    mentions: frozenset[str]


def _named(text: str) -> str | None:
    """The function a declaration or definition names: the identifier before its first ``(``
    (None for typedefs and other declarations without a parameter list)."""
    head = _COMMENTS.sub(" ", text).split("{", 1)[0]
    if "(" not in head or "typedef" in head:
        return None
    names = _IDENT.findall(head.split("(", 1)[0])
    return names[-1] if names else None


@lru_cache(maxsize=16)
def _items(source: str) -> tuple[_Item, ...]:
    """``source`` as top-level items, in order (their texts concatenated are ``source``)."""
    spans: list[tuple[str, bool]] = []
    depth = start = 0
    for m in _TOKENS.finditer(source):
        token = m.group()
        if token[0] in " \t#":
            if depth == 0:  # a directive ends the item before it and is an item of its own
                if start < m.start():
                    spans.append((source[start:m.start()], False))
                spans.append((source[m.start():m.end()], True))
                start = m.end()
        elif token == "{":
            depth += 1
        elif token == "}":
            depth -= 1
            if depth == 0:
                spans.append((source[start:m.end()], False))
                start = m.end()
        elif token == ";" and depth == 0:
            spans.append((source[start:m.end()], False))
            start = m.end()
    if start < len(source):
        spans.append((source[start:], False))
    items = []
    for text, directive in spans:
        define = _DEFINE.match(text) if directive else None
        name = define.group(1) if define else (None if directive else _named(text))
        items.append(_Item(text, name, directive, frozenset(_IDENT.findall(_COMMENTS.sub(" ", text)))))
    return tuple(items)


@lru_cache(maxsize=256)
def kernel_slice(source: str, kernel: str) -> str:
    """The text of ``source`` that kernel ``kernel`` needs (see the module docstring); ``source``
    itself when it is small or the kernel is not a top-level item of it."""
    if len(source) < SLICE_MIN_CHARS:
        return source
    items = _items(source)
    by_name: dict[str, list[int]] = {}
    for i, item in enumerate(items):
        if item.name is not None:
            by_name.setdefault(item.name, []).append(i)
    roots = [i for i in by_name.get(kernel, ()) if not items[i].preprocessor]
    if not roots:
        return source
    kept = set(roots)
    todo = list(roots)
    while todo:
        for name in items[todo.pop()].mentions:
            for j in by_name.get(name, ()):
                if j not in kept:
                    kept.add(j)
                    todo.append(j)
    return "".join(item.text for i, item in enumerate(items) if i in kept or item.name is None or item.preprocessor)
