"""Why an EP left nodes to the next one, one line per kind of reason, with its node count and the
remedy (``onnxhal partition``, ``run`` and ``matrix``).

An EP's ``declined`` maps each node it did not take to a reason that names values and shapes
("generic-npu runs static shapes only; 'x' has shape ('batch', 8)"). Counted as written, every
value makes a reason of its own; here the reasons are grouped by what they say:

- dynamic shapes (a static-only profile): the remedy is ``onnxhal fix-shapes`` with the model's
  symbolic input dimensions;
- operators the profile lacks, data types it does not compute, ranks above its limit: the
  operators and types, with counts (the next EP, usually the CPU EP, runs those nodes);
- anything else (a profile's per-op rule, ...): the reason with value names and shapes taken out,
  and the id of the rule's source.

A sourced profile's reasons end in `` (source ID: URL ...)``; the grouping reads them without it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

_STATIC = re.compile(r"^(?P<device>.+?) runs static shapes only; '.*' has shape (?P<shape>.*)$")
_NO_OP = re.compile(r"^(?P<device>.+?) has no (?P<op>[\w.]+)(?: \(fused into (?P<fused>[\w.]+)\))?$")
_DTYPE = re.compile(r"^(?P<device>.+?) does not compute (?P<dtype>\w+) \('.*'\)$")
_RANK = re.compile(r"^(?P<device>.+?) handles rank <= (?P<max>\d+); '.*' has rank \d+$")
_QUOTED = re.compile(r"'[^']*'")
_SHAPE = re.compile(r"\s*(\([^()]*\)|\[[^\]]*\])")
_DIM_NAME = re.compile(r"'([^']+)'")
_RULE = re.compile(r"^(?P<rule>.+? rule for [\w.]+): (?P<what>attribute \w+|(?:input|output) \d+)")
_SOURCE = re.compile(r" \(source ([^:\s]+)[:)]")  # a profile's citation, always the reason's last part


@dataclass
class DeclineKind:
    """One kind of reason: what it is, how many nodes gave it, what it is made of, the remedy."""

    kind: str
    nodes: int = 0
    parts: dict[str, int] = field(default_factory=dict)  # op or dtype -> nodes
    dims: list[str] = field(default_factory=list)  # symbolic dimensions named (dynamic shapes)
    remedy: str = ""

    def line(self, model: str = "MODEL", input_dims: Sequence[str] = (),
             unnamed: Sequence[tuple[str, Sequence[int | str | None]]] = ()) -> str:
        """The kind as one line; a dynamic-shapes remedy names ``input_dims`` (the model's symbolic
        input dimensions: fix-shapes fixes those, and shape inference the values derived from them)
        and gives the whole shape of each input of ``unnamed`` (inputs with a dimension that has no
        name, as (name, shape)). Without either, the dimensions the reasons name (which inference
        may have made up) stand in."""
        detail = ", ".join(f"{p}×{n}" for p, n in sorted(self.parts.items(), key=lambda kv: -kv[1]))
        text = f"{self.kind}: {self.nodes} node(s)" + (f" ({detail})" if detail else "")
        if self.kind == "dynamic shapes":
            options = [f"--dim {d}=N" for d in (input_dims or ([] if unnamed else self.dims))]
            options += [f"--shape {name}=" + ",".join(str(d) if isinstance(d, int) else "N" for d in shape)
                        for name, shape in unnamed]
            text += f"; fix them with `onnxhal fix-shapes {model} {' '.join(options) or '--dim NAME=N'} -o fixed.onnx`"
        elif self.remedy:
            text += f"; {self.remedy}"
        return text


def decline_kinds(reasons: Iterable[str]) -> list[DeclineKind]:
    """The reasons grouped by kind, the kind with the most nodes first."""
    kinds: dict[str, DeclineKind] = {}

    def get(key: str, remedy: str = "") -> DeclineKind:
        return kinds.setdefault(key, DeclineKind(key, remedy=remedy))

    for cited in reasons:
        r, _, _ = cited.partition(" (source ")
        source = _SOURCE.search(cited)
        if m := _STATIC.match(r):
            k = get("dynamic shapes")
            for d in _DIM_NAME.findall(m["shape"]):
                if d not in k.dims:
                    k.dims.append(d)
        elif m := _NO_OP.match(r):
            k = get(f"operators {m['device']} lacks", "the next EP runs them")
            op = m["op"] + (f" (in {m['fused']})" if m["fused"] else "")
            k.parts[op] = k.parts.get(op, 0) + 1
        elif m := _DTYPE.match(r):
            k = get(f"data types {m['device']} does not compute", "the next EP runs them")
            k.parts[m["dtype"]] = k.parts.get(m["dtype"], 0) + 1
        elif m := _RANK.match(r):
            k = get(f"tensors above rank {m['max']} on {m['device']}", "the next EP runs them")
        else:  # a per-op rule keeps the id of its source (``onnxhal profiles show`` prints it)
            cite = f" (source {source[1]})" if source else ""
            if m := _RULE.match(r):
                k = get(f"{m['rule']}: {m['what']}{cite}", "the next EP runs them")
            else:
                k = get(_SHAPE.sub("", _QUOTED.sub("a value", r)).strip() + cite)
        k.nodes += 1
    return sorted(kinds.values(), key=lambda k: -k.nodes)


def decline_lines(reasons: Iterable[str], model: str = "MODEL", input_dims: Sequence[str] = (),
                  unnamed: Sequence[tuple[str, Sequence[int | str | None]]] = ()) -> list[str]:
    """One line per kind of reason (``DeclineKind.line``)."""
    return [k.line(model, input_dims, unnamed) for k in decline_kinds(reasons)]
