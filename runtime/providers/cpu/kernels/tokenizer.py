"""com.microsoft Tokenizer (opset 1): strings split into tokens, padded to the longest row.

Semantics are onnxruntime's (docs/ContribOperators.md, com.microsoft.Tokenizer, and its CPU kernel
onnxruntime/contrib_ops/cpu/tokenizer.cc, read for behaviour only):

- input ``[C]`` or ``[N, C]`` strings; output ``input shape + [D]``, D the most tokens of any string
  plus 2 when ``mark`` is set (start-of-text "\\x02" first, end-of-text "\\x03" after the tokens,
  ``pad_value`` after that). When no string has a token D is 0 (marks included); an empty input
  gives ``[0]`` or ``[N, 0]``.
- ``separators == [""]`` or ``tokenexp == "."``: one token per character (``mincharnum`` must be 1).
- ``separators``: each is a regular expression; the first splits the string, the second splits each
  piece, and so on; pieces shorter than ``mincharnum`` characters are dropped. A separator that
  matches the empty string consumes the character where it matched.
- ``tokenexp`` (used when ``separators`` is absent): the tokens are the successive matches; a match
  shorter than ``mincharnum`` characters is dropped and the search resumes one character after its
  start.
- Expressions are RE2's with ``longest_match``: the leftmost match, and of the matches there the
  longest (POSIX), where Python's ``re`` takes the first alternative that matches. RE2's Perl
  classes (``\\w \\d \\s \\b``) are ASCII-only, so patterns compile with ``re.ASCII``.
"""

from __future__ import annotations

import re

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels.kernel_paths import path_table
from onnxhal.runtime.providers.cpu.kernels.registry import register

MS = "com.microsoft"
START_TEXT, END_TEXT = "\x02", "\x03"

MATCH_PATHS = path_table("Tokenizer.longest_match", "_LongestMatch.search_longest: the leftmost match, then "
                                                    "the longest match at that position (fullmatch tried from "
                                                    "the end of the string down)")
GREEDY = MATCH_PATHS.add("greedy", "the expression is a sequence of single-character atoms and zero-width "
                                   "assertions with at most one greedy quantifier, followed only by assertions: "
                                   "backtracking then tries the repeat counts from the most down, so the first "
                                   "match re finds is the longest")
GENERAL = MATCH_PATHS.add("general", "any other expression (alternation, groups, lazy quantifiers, several "
                                     "variable-width parts): canonical")
SCAN_PATHS = path_table("Tokenizer.scan", "_split / _match_tokens: one leftmost-longest search per token or "
                                          "separator, resuming where onnxruntime's kernel resumes")
WHOLE = SCAN_PATHS.add("whole_string", "every expression is on the greedy path and its every match is at least one "
                                       "character (no empty match to consume a character): one re.split or "
                                       "re.findall per string; a string where findall gives a token shorter than "
                                       "mincharnum (the scan resumes inside it) goes through the scan")
STEPWISE = SCAN_PATHS.add("stepwise", "any other expression: canonical")

# RE2 accepts POSIX classes inside brackets ([[:alpha:]]); Python's re reads them as characters.
_POSIX_CLASSES = {
    "alnum": "0-9A-Za-z", "alpha": "A-Za-z", "ascii": "\\x00-\\x7f", "blank": "\\t ", "cntrl": "\\x00-\\x1f\\x7f",
    "digit": "0-9", "graph": "!-~", "lower": "a-z", "print": " -~", "punct": "!-/:-@\\[-`{-~",
    "space": "\\t\\n\\v\\f\\r ", "upper": "A-Z", "word": "0-9A-Za-z_", "xdigit": "0-9A-Fa-f",
}
_POSIX_RE = re.compile(r"\[:(\^?)(" + "|".join(_POSIX_CLASSES) + r"):\]")
# One token of an expression, for the greedy test: an assertion, a single-character atom, or a
# quantifier. Anything else (groups, alternation, back-references) makes the expression general.
_ASSERTION = re.compile(r"\\[bBAzZ]|\^|\$")
_ATOM = re.compile(r"\[\^?\]?(?:\\.|[^\]\\])*\]|\\[wWdDsS]|\\[^0-9A-Za-z]|\\[tnrfv]|\.|[^\\\[\](){}|*+?^$.]")
_QUANT = re.compile(r"(?:[*+?]|\{\d+(?:,\d*)?\})(?![?+])")


def re2_unsupported(pattern: str) -> str | None:
    """The first construct of ``pattern`` that RE2 rejects and Python's re reads (lookarounds,
    atomic groups, conditionals, back-references), or None: onnxruntime refuses such an expression."""
    i, in_class = 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            if not in_class and pattern[i + 1:i + 2] in set("123456789"):
                return pattern[i:i + 2]
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            i += 2 if pattern[i + 1:i + 2] == "]" else 3 if pattern[i + 1:i + 3] == "^]" else 1
            continue
        elif c == "(":
            for head in ("(?=", "(?!", "(?<=", "(?<!", "(?>", "(?("):
                if pattern.startswith(head, i):
                    return head
        i += 1
    return None


# RE2's end-of-text assertion \z is Python's \Z (an escaped backslash before a z is left alone).
_END_OF_TEXT = re.compile(r"(?<!\\)((?:\\\\)*)\\z")

# RE2's Unicode classes (\pL, \p{Lu}, \PN, \p{Greek}): Python's re has none. A class built from
# unicodedata would not be exact: against onnxruntime 1.32 on every code point, \pL, \pN and \pP agree
# on all code points Python 3.11's Unicode 14.0 assigns and differ on those assigned since (4970
# letters, 40 numbers, 23 punctuation marks that RE2 classifies and unicodedata calls unassigned).
_UNICODE_CLASS = re.compile(r"(?<!\\)((?:\\\\)*)\\[pP]")


def _posix_to_python(pattern: str) -> str:
    def repl(m: re.Match) -> str:
        if m.group(1):
            raise ValueError(f"negated POSIX class [:^{m.group(2)}:] is not supported")
        return _POSIX_CLASSES[m.group(2)]
    return _END_OF_TEXT.sub(r"\1\\Z", _POSIX_RE.sub(repl, pattern))


def greedy_is_longest(pattern: str) -> bool:
    """True when Python's backtracking match of ``pattern`` is always the longest match at its start
    (the condition of the ``greedy`` path): single-character atoms and assertions, at most one
    variable quantifier (greedy), nothing but assertions after it."""
    pos, variable = 0, False
    while pos < len(pattern):
        m = _ASSERTION.match(pattern, pos)
        if m:
            pos = m.end()
            continue
        m = _ATOM.match(pattern, pos)
        if m is None or variable:  # not a single-character atom, or an atom after the variable part
            return False
        pos = m.end()
        q = _QUANT.match(pattern, pos)
        if q:
            variable = not re.fullmatch(r"\{(\d+)\}", q.group())
            pos = q.end()
    return True


def greedy_min_length(pattern: str) -> int:
    """The fewest characters a match of ``pattern`` spans; ``pattern`` must satisfy
    ``greedy_is_longest`` (single-character atoms, assertions and greedy quantifiers only)."""
    pos, least = 0, 0
    while pos < len(pattern):
        m = _ASSERTION.match(pattern, pos)
        if m:
            pos = m.end()
            continue
        m = _ATOM.match(pattern, pos)
        if m is None:
            raise ValueError(f"{pattern!r} is not on the greedy path")
        pos = m.end()
        q = _QUANT.match(pattern, pos)
        if q is None:
            least += 1
            continue
        pos = q.end()
        least += int(q.group()[1:].split(",")[0].rstrip("}")) if q.group()[0] == "{" else int(q.group() == "+")
    return least


class LongestMatch:
    """An expression searched RE2-style: leftmost, then longest."""

    def __init__(self, pattern: str, what: str) -> None:
        if _UNICODE_CLASS.search(pattern):
            raise InvalidArgument(f"{what}: {pattern!r} uses an RE2 Unicode class (\\p or \\P), which onnxruntime "
                                  "accepts and onnxhal does not: Python's re has no such classes and its Unicode "
                                  "tables are older than RE2's; spell the characters out in a class")
        try:
            self.source = _posix_to_python(pattern)
            self.rx = re.compile(self.source, re.ASCII)
        except (re.error, ValueError) as exc:
            raise InvalidArgument(f"{what}: cannot compile {pattern!r} ({exc}); give a regular expression "
                                  "in RE2 syntax that Python's re also reads") from None
        unsupported = re2_unsupported(pattern)
        if unsupported:
            raise InvalidArgument(f"{what}: {pattern!r} uses {unsupported!r}, which RE2 (onnxruntime's engine) "
                                  "does not support; rewrite it without lookarounds or back-references")
        self.path = GREEDY if greedy_is_longest(self.source) else GENERAL
        #: whether re.split / re.findall over a whole string take the steps of the scan
        self.whole = self.path == GREEDY and greedy_min_length(self.source) >= 1
        self._ending: dict[int, re.Pattern] = {}

    def _ends_before(self, rest: int) -> re.Pattern:
        """The expression forced to end where ``rest`` characters of the string remain. Unlike
        ``fullmatch`` with an end position, assertions at the end still see the rest of the string."""
        rx = self._ending.get(rest)
        if rx is None:
            rx = self._ending[rest] = re.compile(rf"(?:{self.source})(?=[\s\S]{{{rest}}}\Z)", re.ASCII)
        return rx

    def search_longest(self, s: str, pos: int) -> tuple[int, int] | None:
        """(start, end) of the leftmost-longest match at or after ``pos``, or None (canonical)."""
        m = self.rx.search(s, pos)
        if m is None:
            return None
        start, end = m.span()
        for e in range(len(s), end, -1):
            if self._ends_before(len(s) - e).match(s, start) is not None:
                return start, e
        return start, end

    def search(self, s: str, pos: int) -> tuple[int, int] | None:
        if self.path == GREEDY:
            m = self.rx.search(s, pos)
            return None if m is None else m.span()
        return self.search_longest(s, pos)


def _split(text: str, sep: LongestMatch, mincharnum: int) -> list[str]:
    """The pieces of ``text`` between matches of ``sep`` of at least ``mincharnum`` characters."""
    out: list[str] = []
    start, n = 0, len(text)
    while start <= n:
        hit = sep.search(text, start)
        if hit is None:
            break
        mpos, mend = hit
        if mpos - start >= mincharnum:
            out.append(text[start:mpos])
        start = mend if mend > mpos else mpos + 1  # an empty match consumes the character there
    if n - start >= mincharnum:
        out.append(text[start:])
    return out


def _match_tokens(text: str, rx: LongestMatch, mincharnum: int) -> list[str]:
    out: list[str] = []
    start, n = 0, len(text)
    while start <= n:
        hit = rx.search(text, start)
        if hit is None:
            break
        mpos, mend = hit
        if mend - mpos >= mincharnum:
            out.append(text[mpos:mend])
            start = mend
        else:
            start = mpos + 1
    return out


def _as_text(v: object, node: str) -> str:
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidArgument(f"Tokenizer node {node!r}: input string {v!r} is not valid UTF-8; "
                                  "decode or clean the text before the model") from None
    return str(v)


@register("Tokenizer", since=1, domain=MS)
class Tokenizer(Kernel):
    """com.microsoft Tokenizer; see the module docstring for the semantics and their source."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.name = node.name
        what = f"Tokenizer node {node.name!r}"
        self.mark = bool(node.attr("mark", 0))
        pad = node.attr("pad_value")
        if pad is None:
            raise InvalidArgument(f"{what}: attribute pad_value is missing; set the string rows are padded with")
        self.pad = pad
        self.mincharnum = int(node.attr("mincharnum", 0))
        if self.mincharnum < 1:
            raise InvalidArgument(f"{what}: mincharnum {self.mincharnum}; it must be 1 or more")
        separators = node.attr("separators")
        tokenexp = node.attr("tokenexp")
        if separators is None:
            if not tokenexp:
                raise InvalidArgument(f"{what}: neither separators nor a non-empty tokenexp is set; set one")
            self.char_level = tokenexp == "."
        else:
            if not separators:
                raise InvalidArgument(f"{what}: separators is empty; give at least one, or [\"\"] for characters")
            self.char_level = list(separators) == [""]
        if self.char_level and self.mincharnum > 1:
            raise InvalidArgument(f"{what}: mincharnum {self.mincharnum} with character tokens; it must be 1")
        self.separators: list[LongestMatch] = []
        self.tokenexp: LongestMatch | None = None
        if not self.char_level:
            if separators is not None:
                self.separators = [LongestMatch(s, f"{what} separator") for s in separators]
            else:
                self.tokenexp = LongestMatch(tokenexp, f"{what} tokenexp")
        exprs = self.separators or ([self.tokenexp] if self.tokenexp else [])
        self.scan_path = WHOLE if exprs and all(e.whole for e in exprs) else STEPWISE

    def tokens(self, text: str) -> list[str]:
        """The tokens of one string, before marks and padding."""
        if self.char_level:
            return list(text)
        least = self.mincharnum
        if self.scan_path == WHOLE:
            # no match is empty, so after each match both the scan and re resume at its end
            if self.tokenexp is not None:
                found = self.tokenexp.rx.findall(text)  # greedy expressions hold no groups
                if least == 1 or all(len(t) >= least for t in found):
                    return found
            else:
                pieces = [text]
                for sep in self.separators:
                    pieces = [p for piece in pieces for p in sep.rx.split(piece) if len(p) >= least]
                return pieces
        if self.tokenexp is not None:
            return _match_tokens(text, self.tokenexp, least)
        pieces = [text]
        for sep in self.separators:
            pieces = [p for piece in pieces for p in _split(piece, sep, least)]
        return pieces

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        if x.ndim not in (1, 2):
            raise InvalidArgument(f"Tokenizer node {self.name!r}: input shape {list(x.shape)}; it takes [C] or "
                                  "[N, C] strings")
        if x.size == 0:
            return [np.empty(x.shape[:-1] + (0,), dtype=object)]
        texts = x.reshape(-1).tolist()
        if set(map(type, texts)) != {str}:
            texts = [_as_text(v, self.name) for v in texts]
        if self.scan_path == WHOLE and self.tokenexp is not None and self.mincharnum == 1:
            rows = list(map(self.tokenexp.rx.findall, texts))  # tokens() for each, without the calls
        else:
            rows = list(map(self.tokens, texts))
        width = max(len(r) for r in rows)
        if width == 0:
            return [np.empty(x.shape + (0,), dtype=object)]
        if self.mark:
            rows = [[START_TEXT, *r, END_TEXT] for r in rows]
            width += 2
        flat: list = []
        for r in rows:  # one list, padded row by row, copied into the array once
            flat += r
            flat += [self.pad] * (width - len(r))
        y = np.empty(len(rows) * width, dtype=object)
        y[:] = flat
        return [y.reshape(x.shape + (width,))]
