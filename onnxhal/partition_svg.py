"""Draws a session's partition as an SVG: nodes in topological layers, coloured by EP."""

from __future__ import annotations

from html import escape

from onnxhal.hal import Graph

_PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f"]
_CPU_COLOUR = "#bab0ac"


def partition_svg(graph: Graph, ep_of_node: dict[int, str], title: str = "") -> str:
    """``ep_of_node`` maps id(node) -> EP name for the (unfused) graph's nodes."""
    depth: dict[int, int] = {}
    for n in graph.nodes:
        d = 0
        for i in n.inputs:
            p = graph.producer(i) if i else None
            if p is not None:
                d = max(d, depth.get(id(p), 0) + 1)
        depth[id(n)] = d
    layers: dict[int, list] = {}
    for n in graph.nodes:
        layers.setdefault(depth[id(n)], []).append(n)
    eps = sorted(set(ep_of_node.values()), key=lambda e: (e == "CPUExecutionProvider", e))
    colour = {e: (_CPU_COLOUR if e == "CPUExecutionProvider" else _PALETTE[k % len(_PALETTE)]) for k, e in enumerate(eps)}
    box_w, box_h, gap_x, gap_y = 130, 28, 16, 26
    width = max(len(v) for v in layers.values()) * (box_w + gap_x) + 40 if layers else 200
    legend_w = 40 + sum(24 + 7 * len(e) for e in eps)
    width = max(width, 40 + 8 * len(title), legend_w)  # room for the title and the legend
    height = len(layers) * (box_h + gap_y) + 90
    pos: dict[int, tuple[float, float]] = {}
    for d, nodes in layers.items():
        row_w = len(nodes) * (box_w + gap_x) - gap_x
        x0 = (width - row_w) / 2
        for k, n in enumerate(nodes):
            pos[id(n)] = (x0 + k * (box_w + gap_x), 60 + d * (box_h + gap_y))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
             'font-family="sans-serif" font-size="11">',
             f'<text x="20" y="20" font-size="14" font-weight="bold">{escape(title)}</text>']
    lx = 20
    for e in eps:
        parts.append(f'<rect x="{lx}" y="30" width="12" height="12" fill="{colour[e]}"/>'
                     f'<text x="{lx + 16}" y="40">{escape(e)}</text>')
        lx += 24 + 7 * len(e)
    for n in graph.nodes:
        x2, y2 = pos[id(n)]
        for i in n.inputs:
            p = graph.producer(i) if i else None
            if p is not None:
                x1, y1 = pos[id(p)]
                # Edges that cross EPs are where transfers happen: drawn red and dashed.
                cross = ep_of_node.get(id(p)) != ep_of_node.get(id(n))
                style = 'stroke="#d62728" stroke-width="2" stroke-dasharray="4 2"' if cross else 'stroke="#999"'
                parts.append(f'<line x1="{x1 + box_w / 2:.0f}" y1="{y1 + box_h:.0f}" x2="{x2 + box_w / 2:.0f}" '
                             f'y2="{y2:.0f}" {style}/>')
    for n in graph.nodes:
        x, y = pos[id(n)]
        ep = ep_of_node.get(id(n), "?")
        label = escape(n.op_type if len(n.op_type) < 18 else n.op_type[:16] + "..")
        parts.append(f'<g><title>{escape(n.name)} ({escape(n.op_type)}) on {escape(ep)}</title>'
                     f'<rect x="{x:.0f}" y="{y:.0f}" width="{box_w}" height="{box_h}" rx="5" fill="{colour.get(ep, "#ddd")}"/>'
                     f'<text x="{x + box_w / 2:.0f}" y="{y + 18:.0f}" text-anchor="middle" fill="white">{label}</text></g>')
    parts.append("</svg>")
    return "\n".join(parts)
