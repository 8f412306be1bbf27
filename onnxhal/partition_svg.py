"""Draws a session's partition as an SVG that reads at a glance (``onnxhal partition --svg``).

- Constant and shape-only nodes (ConstantOfShape, Shape, Constant, and anything computed from them
  and initializers alone) are folded into the node that first reads them: that node shows "+k const".
- One box per partition (a connected set of nodes one EP runs together), in its EP's colour, headed
  by the EP and its node count; a small partition lists its nodes, a large one its op types.
- Arrows between boxes: red where the value crosses memories (a transfer, labelled with the count
  of values and their bytes per run), grey where it stays in one memory. Transfers from and to the
  caller's memory, and constants copied in, are noted inside the box.
- Boxes stand in dependency layers, top to bottom; a long chain of layers wraps into columns, so a
  ResNet-50 is a page, not a scroll. A legend names the EPs, their node and partition counts, and
  the total transferred per run.

``svg_to_png`` converts with rsvg-convert or ImageMagick where one is installed.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from html import escape

from onnxhal.hal import Node
from onnxhal.partition_view import HOST, PartitionView, format_bytes, is_shape_only

_PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#e15759"]
_CPU_COLOUR = "#8c8c8c"
_TRANSFER = "#d62728"
_SAME_MEMORY = "#9a9a9a"
_BOX_W, _LINE_H, _HEAD_H, _GAP_X, _GAP_Y = 200, 14, 20, 50, 42
_MAX_LISTED = 8  # a partition of up to this many nodes lists them; a larger one lists its op types
_ASPECT = 1.5  # wrap layers into columns aiming at about this width : height ...
_MAX_HEIGHT = 1400  # ... once one column would be taller than this


@dataclass
class _Cluster:
    index: int  # the partition's index
    ep_name: str
    nodes: list[Node]
    folded: dict[int, int] = field(default_factory=dict)  # id(node) -> constant nodes folded into it
    notes: list[str] = field(default_factory=list)
    x: float = 0.0
    y: float = 0.0
    layer: int = 0
    column: int = 0

    @property
    def lines(self) -> list[str]:
        if len(self.nodes) <= _MAX_LISTED:
            body = [n.op_type + (f"  +{self.folded[id(n)]} const" if self.folded.get(id(n)) else "")
                    for n in self.nodes]
        else:
            counts: dict[str, int] = {}
            for n in self.nodes:
                counts[n.op_type] = counts.get(n.op_type, 0) + 1
            top = sorted(counts.items(), key=lambda kv: -kv[1])
            body = [f"{op} x{c}" for op, c in top[:5]] + ([f"{_count(len(top) - 5, 'more op type')}"] if len(top) > 5 else [])
            const = sum(self.folded.values())
            if const:
                body.append(f"+{const} const folded in")
        return body + self.notes

    @property
    def height(self) -> float:
        return _HEAD_H + _LINE_H * len(self.lines) + 8


def _count(n: int, one: str, many: str = "") -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


def ep_colours(ep_names: list[str]) -> dict[str, str]:
    others = sorted(e for e in set(ep_names) if e != "CPUExecutionProvider")
    colours = {e: _PALETTE[k % len(_PALETTE)] for k, e in enumerate(others)}
    colours["CPUExecutionProvider"] = _CPU_COLOUR
    return colours


def short_ep(name: str) -> str:
    return name[: -len("ExecutionProvider")] if name.endswith("ExecutionProvider") else name


def fold_constants(view: PartitionView) -> tuple[set[int], dict[int, Node]]:
    """(ids of folded nodes, id(folded node) -> the unfolded node it is drawn in)."""
    constant = set(view.graph.initializers)
    folded: set[int] = set()
    for n in view.nodes:
        if is_shape_only(n, constant):
            folded.add(id(n))
            constant.update(o for o in n.outputs if o)
    readers: dict[str, list[Node]] = {}
    for n in view.nodes:
        for i in n.inputs:
            if i:
                readers.setdefault(i, []).append(n)
    host: dict[int, Node] = {}
    for n in reversed(view.nodes):  # readers come later in topological order: resolved first
        if id(n) not in folded:
            continue
        for r in (r for o in n.outputs for r in readers.get(o, [])):
            target = r if id(r) not in folded else host.get(id(r))
            if target is not None:
                host[id(n)] = target
                break
    # A constant nobody unfolded reads (a graph output, say) stays drawn.
    return {k for k in folded if k in host}, host


def _clusters(view: PartitionView) -> tuple[list[_Cluster], dict[int, int]]:
    """Drawn clusters and partition index -> index of the cluster drawing it (folded-only partitions
    map to nothing)."""
    folded, host = fold_constants(view)
    position = {id(n): k for k, n in enumerate(view.nodes)}
    kept = [(p, [n for n in p.nodes if id(n) not in folded]) for p in view.partitions]
    # Numbered by the first node drawn, so that the numbering is a topological order of the boxes
    # (by their first node overall, a box would come as early as the constants folded into it).
    kept = sorted(((p, nodes) for p, nodes in kept if nodes), key=lambda pn: position[id(pn[1][0])])
    clusters: list[_Cluster] = []
    drawn: dict[int, int] = {}
    for p, nodes in kept:
        drawn[p.index] = len(clusters)
        clusters.append(_Cluster(p.index, p.ep_name, nodes))
    for k, target in host.items():
        if k in folded:
            c = clusters[drawn[view.partition_of[id(target)]]]
            c.folded[id(target)] = c.folded.get(id(target), 0) + 1
    return clusters, drawn


def _layout(clusters: list[_Cluster], edges: set[tuple[int, int]]) -> tuple[float, float]:
    """Place clusters in dependency layers, wrapped into columns; returns (width, height)."""
    # Layers by longest path over a topological order of the boxes (Kahn); should a cycle remain,
    # its boxes follow in their numbering and the edges closing it are drawn upwards.
    incoming: dict[int, list[int]] = {}
    outgoing: dict[int, list[int]] = {}
    for a, b in edges:
        incoming.setdefault(b, []).append(a)
        outgoing.setdefault(a, []).append(b)
    pending = {k: len(incoming.get(k, [])) for k in range(len(clusters))}
    order: list[int] = []
    ready = sorted(k for k, v in pending.items() if v == 0)
    while len(order) < len(clusters):
        if not ready:
            ready = [min(k for k in pending if k not in set(order))]
        k = ready.pop(0)
        if k in order:
            continue
        order.append(k)
        for b in outgoing.get(k, []):
            pending[b] -= 1
            if pending[b] == 0:
                ready.append(b)
        ready.sort()
    depth = [0] * len(clusters)
    placed: set[int] = set()
    for b in order:
        depth[b] = max((depth[a] + 1 for a in incoming.get(b, []) if a in placed), default=0)
        placed.add(b)
    layers: list[list[int]] = [[] for _ in range(max(depth, default=0) + 1)]
    for k, d in enumerate(depth):
        layers[d].append(k)
    # Fewer crossings: each layer ordered by the mean slot of what feeds it (the barycentre rule).
    slot = {k: float(j) for j, k in enumerate(layers[0])}
    for layer in layers[1:]:
        mean = {b: sum(slot[a] for a in incoming.get(b, []) if a in slot) / max(1, len(incoming.get(b, [])))
                for b in layer}
        layer.sort(key=lambda b: mean[b])
        slot.update({k: float(j) for j, k in enumerate(layer)})
    heights = [max(clusters[k].height for k in layer) + _GAP_Y for layer in layers]
    widths = [len(layer) * (_BOX_W + _GAP_X) for layer in layers]

    def shape(rows: int) -> tuple[float, float]:
        cols = [range(s, min(s + rows, len(layers))) for s in range(0, len(layers), rows)]
        return sum(max(widths[i] for i in c) for c in cols), max(sum(heights[i] for i in c) for c in cols)

    rows = len(layers)
    if shape(rows)[1] > _MAX_HEIGHT:  # too tall for a page: wrap into columns, about _ASPECT wide
        rows = min(range(1, len(layers) + 1),
                   key=lambda r: abs(math.log(max(1.0, shape(r)[0]) / max(1.0, shape(r)[1]) / _ASPECT)))
    x0 = 20.0
    for start in range(0, len(layers), rows):
        col = range(start, min(start + rows, len(layers)))
        col_w = max(widths[i] for i in col)
        y = 0.0
        for i in col:
            layer = layers[i]
            lx = x0 + (col_w - widths[i]) / 2 + _GAP_X / 2
            for j, k in enumerate(layer):
                clusters[k].x, clusters[k].y = lx + j * (_BOX_W + _GAP_X), y
                clusters[k].layer, clusters[k].column = i, start // rows
            y += heights[i]
        x0 += col_w
    w, h = shape(rows)
    return w + 40, h


def partition_svg(view: PartitionView, title: str = "") -> str:
    """The SVG text of ``view`` (``onnxhal.partition_view.session_view(session)``)."""
    clusters, drawn = _clusters(view)
    colours = ep_colours([p.ep_name for p in view.partitions])
    transfers: dict[tuple[int, int], tuple[int, int]] = {}
    for t in view.transfers:
        count, nbytes = len(t.values), t.nbytes
        src = drawn.get(t.src) if t.src != HOST else None
        dst = drawn.get(t.dst) if t.dst != HOST else None
        if t.src == HOST and dst is not None:
            clusters[dst].notes.append(f"in from host: {count}, {format_bytes(nbytes)}")
        elif t.dst == HOST and src is not None:
            clusters[src].notes.append(f"out to host: {count}, {format_bytes(nbytes)}")
        elif src is None and dst is not None:  # computed by constant nodes on another EP
            clusters[dst].notes.append(f"constants in: {count}, {format_bytes(nbytes)}")
        elif src is not None and dst is not None:
            c, b = transfers.get((src, dst), (0, 0))
            transfers[(src, dst)] = (c + count, b + nbytes)
    cluster_of_node = {id(n): k for k, c in enumerate(clusters) for n in c.nodes}
    producer = {o: n for n in view.nodes for o in n.outputs if o}
    edges: set[tuple[int, int]] = set(transfers)
    for k, c in enumerate(clusters):
        for n in c.nodes:
            for i in n.inputs:
                p = producer.get(i) if i else None
                src = cluster_of_node.get(id(p)) if p is not None else None
                if src is not None and src != k:
                    edges.add((src, k))
    top = 60 + 17 * (len(view.partitions_per_ep()) + 3)
    width, height = _layout(clusters, edges)
    width = max(width, 40 + 7.0 * max(len(title), 90))  # room for the title and the legend
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height + top + 20:.0f}" '
             'font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="11">',
             '<rect width="100%" height="100%" fill="white"/>',
             '<defs>' + "".join(
                 f'<marker id="{name}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
                 f'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{colour}"/></marker>'
                 for name, colour in (("t", _TRANSFER), ("s", _SAME_MEMORY))) + '</defs>',
             f'<text x="20" y="24" font-size="15" font-weight="bold">{escape(title)}</text>']
    parts.extend(_legend(view, colours, clusters, transfers))
    parts.append(f'<g transform="translate(0,{top})">')
    drawn_edges = [_edge(clusters[a], clusters[b], transfers.get((a, b))) for a, b in sorted(edges)]
    parts.extend(arrow for arrow, _ in drawn_edges)
    for c in clusters:
        parts.append(_box(c, colours.get(c.ep_name, "#cccccc")))
    parts.extend(label for _, label in drawn_edges if label)
    parts.append("</g></svg>")
    return "\n".join(parts)


def _legend(view: PartitionView, colours: dict[str, str], clusters: list[_Cluster],
            transfers: dict[tuple[int, int], tuple[int, int]]) -> list[str]:
    nodes, parts = view.nodes_per_ep(), view.partitions_per_ep()
    drawn: dict[str, int] = {}
    for c in clusters:
        drawn[c.ep_name] = drawn.get(c.ep_name, 0) + 1
    values, nbytes = view.transfer_totals()
    folded = sum(sum(c.folded.values()) for c in clusters)
    items = [(colours[e], f"{e}: {_count(nodes.get(e, 0), 'node')}, {_count(drawn.get(e, 0), 'box', 'boxes')}")
             for e in sorted(parts, key=lambda e: (e == "CPUExecutionProvider", e))]
    items += [(_TRANSFER, f"transfer between memories (values, bytes per run); all: {values}, "
                          f"{format_bytes(nbytes)}"),
              (_SAME_MEMORY, "dependency within one memory (no copy)"),
              ("#ffffff", f"+k const: {folded} constant/shape-only nodes folded into their reader")]
    out = []
    for k, (colour, text) in enumerate(items):
        x, y = 20, 40 + k * 17
        out.append(f'<rect x="{x}" y="{y}" width="14" height="11" fill="{colour}" stroke="#555" stroke-width="0.5"/>'
                   f'<text x="{x + 20}" y="{y + 10}">{escape(text)}</text>')
    return out


def _box(c: _Cluster, colour: str) -> str:
    h = c.height
    out = [f'<g><title>{escape(c.ep_name)}: partition {c.index}, {len(c.nodes)} nodes: '
           f'{escape(", ".join(n.name or n.op_type for n in c.nodes[:40]))}</title>',
           f'<rect x="{c.x:.0f}" y="{c.y:.0f}" width="{_BOX_W}" height="{h:.0f}" rx="6" fill="{_tint(colour)}" '
           f'stroke="{colour}" stroke-width="2"/>',
           f'<rect x="{c.x:.0f}" y="{c.y:.0f}" width="{_BOX_W}" height="{_HEAD_H}" rx="6" fill="{colour}"/>',
           f'<text x="{c.x + 8:.0f}" y="{c.y + 14:.0f}" fill="white" font-weight="bold">'
           f'{escape(short_ep(c.ep_name))} · {_count(len(c.nodes), "node")}</text>']
    for k, line in enumerate(c.lines):
        style = ' fill="#444" font-style="italic"' if k >= len(c.lines) - len(c.notes) else ""
        out.append(f'<text x="{c.x + 10:.0f}" y="{c.y + _HEAD_H + 12 + k * _LINE_H:.0f}"{style}>{escape(line)}</text>')
    out.append("</g>")
    return "".join(out)


def _tint(colour: str, keep: float = 0.14) -> str:
    """``colour`` mixed with white: an opaque box body, so that arrows behind it do not show through."""
    rgb = [int(colour[k:k + 2], 16) for k in (1, 3, 5)]
    return "#" + "".join(f"{round(255 - (255 - v) * keep):02x}" for v in rgb)


def _edge(a: _Cluster, b: _Cluster, transfer: tuple[int, int] | None) -> tuple[str, str]:
    """(the arrow, its label or ""): labels are drawn after the boxes, so that none hides one."""
    x1, y1 = a.x + _BOX_W / 2, a.y + a.height
    x2, y2 = b.x + _BOX_W / 2, b.y
    reach = _GAP_X * 0.45
    side = ""  # "right"/"left": the arrow runs beside the boxes; its label goes outwards of it
    if b.column != a.column:  # b is in a later column: leave a's side, enter b's side
        x1, y1 = a.x + _BOX_W, a.y + a.height / 2
        x2, y2 = b.x, b.y + b.height / 2
        c1, c2 = (x1 + 80, y1), (x2 - 80, y2)
    elif b.layer <= a.layer:
        # Upwards (a cycle the layering could not avoid): beside the boxes, on the left.
        x1, y1 = a.x, a.y + a.height / 2
        x2, y2 = b.x, b.y + min(b.height / 2, 14)
        left = min(x1, x2) - reach
        c1, c2, side = (left, y1), (left, y2), "left"
    elif b.layer - a.layer > 1 and abs(a.x - b.x) < _BOX_W:
        # Skipping layers in one column (a residual connection): around the boxes in between, on the
        # right, rather than through them.
        x1, y1 = a.x + _BOX_W, a.y + a.height * 0.7
        x2, y2 = b.x + _BOX_W, b.y + min(b.height / 2, 14)
        right = max(x1, x2) + reach
        c1, c2, side = (right, y1 + 10), (right, y2 - 10), "right"
    else:
        bend = max(20.0, (y2 - y1) / 2)
        c1, c2 = (x1, y1 + bend), (x2, y2 - bend)
    colour, marker = (_TRANSFER, "t") if transfer else (_SAME_MEMORY, "s")
    width = 2 if transfer else 1.2
    arrow = (f'<path d="M{x1:.0f},{y1:.0f} C{c1[0]:.0f},{c1[1]:.0f} {c2[0]:.0f},{c2[1]:.0f} {x2:.0f},{y2:.0f}" '
             f'fill="none" stroke="{colour}" stroke-width="{width}" marker-end="url(#{marker})"/>')
    if not transfer:
        return arrow, ""
    # On the curve's midpoint (beside it for an arrow running along the boxes), on a white patch so
    # that crossing lines stay legible.
    mx = (x1 + 3 * c1[0] + 3 * c2[0] + x2) / 8
    my = (y1 + 3 * c1[1] + 3 * c2[1] + y2) / 8
    label = f"{transfer[0]} · {format_bytes(transfer[1])}"
    w = 6.2 * len(label) + 8
    left_x = {"right": mx + 2, "left": mx - 2 - w}.get(side, mx - w / 2)
    return arrow, (f'<rect x="{left_x:.0f}" y="{my - 8:.0f}" width="{w:.0f}" height="14" rx="3" fill="white" '
                   f'fill-opacity="0.9"/><text x="{left_x + w / 2:.0f}" y="{my + 3:.0f}" text-anchor="middle" '
                   f'fill="{_TRANSFER}" font-size="10">{escape(label)}</text>')


def svg_converter() -> list[str] | None:
    """The command that turns an SVG into a PNG here (rsvg-convert, else ImageMagick), or None."""
    if shutil.which("rsvg-convert"):
        return ["rsvg-convert", "--format", "png", "--output"]
    for name in ("magick", "convert"):
        path = shutil.which(name)
        if path and os.path.realpath(path) != os.path.realpath(shutil.which("gm") or "/nonexistent"):
            return [path]
    return None


def svg_to_png(svg_path: str, png_path: str) -> str:
    """Write ``png_path`` from ``svg_path``; returns "" on success, else why no PNG was written."""
    cmd = svg_converter()
    if cmd is None:
        return "no SVG converter found (install librsvg2-bin for rsvg-convert, or ImageMagick)"
    args = [*cmd, png_path, svg_path] if cmd[0] == "rsvg-convert" else [*cmd, "-density", "96", svg_path, png_path]
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{cmd[0]} failed: {e}"
    if out.returncode != 0 or not os.path.isfile(png_path):
        return f"{os.path.basename(cmd[0])} failed: {(out.stderr or out.stdout).strip()[:200]}"
    return ""
