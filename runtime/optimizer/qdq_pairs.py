"""QuantizeLinear -> DequantizeLinear pairs on one scale and zero point, which QDQ models put on
every activation the integer fusions (``qdq_fusions.py``) leave: exact rewrites, no value changes.

- ``drop_requantize``: a pair whose input is already on the pair's grid, the output of a node
  that only selects or moves elements (Transpose, Reshape, MaxPool, Gather, Concat, ...) of
  values a DequantizeLinear with the same scale and zero point wrote, gives back its input (each
  value's code comes back exactly; see ``_exact_scale``): the pair is taken out. onnxruntime
  drops these pairs too (its ``DropQDQNodesRules``).
- ``collapse_qdq_pairs``: every other pair -> ``com.onnxhal`` QuantizeDequantize, one kernel
  with the pair's values (``kernels/quantize.py``).

A pair qualifies when the QuantizeLinear's codes are read by that DequantizeLinear alone (and are
no graph output), both have the same scale and zero point (the same names, or equal constants),
the same axis, and neither has ``block_size`` or ``output_dtype``. These run after
``fuse_qdq_groups``, which decides from the pairs which groups onnxruntime fuses.
"""

from __future__ import annotations

import numpy as np

from onnxhal.hal.graph import Graph, Node
from onnxhal.runtime.optimizer.rewrite import (
    FUSED_DOMAIN,
    constant,
    graph_output_names,
    live_nodes,
    make_node,
    remove_nodes,
    replace_nodes,
    sole_consumer,
    unlink_node,
)

_CODES = frozenset(np.dtype(t) for t in (np.uint8, np.int8, np.uint16, np.int16))
_F32 = np.dtype(np.float32)
#: Ops each of whose outputs holds only copies of elements of their data inputs (positions).
#: MaxPool qualifies under ``_pool_selects``: every window then holds an input element.
_SELECTING = {"Identity": (0,), "Transpose": (0,), "Reshape": (0,), "Flatten": (0,), "Squeeze": (0,),
              "Unsqueeze": (0,), "Slice": (0,), "Gather": (0,), "GatherElements": (0,), "GatherND": (0,),
              "Expand": (0,), "Tile": (0,), "DepthToSpace": (0,), "SpaceToDepth": (0,), "Split": (0,),
              "MaxPool": (0,), "Concat": None}
_MAX_FLOAT32 = float(np.finfo(np.float32).max)


def _plain(node: Node) -> bool:
    return node.domain == "" and len(node.inputs) >= 2 and not node.attr("block_size", 0) \
        and not node.attr("output_dtype", 0)


def _same(graph: Graph, a: str, b: str) -> bool:
    """Whether two optional inputs hold the same value: one name, or equal constants (type too)."""
    if a == b:
        return True
    x, y = constant(graph, a), constant(graph, b)
    return x is not None and y is not None and x.dtype == y.dtype and x.shape == y.shape and \
        x.tobytes() == y.tobytes()


def _same_params(graph: Graph, q: Node, dq: Node) -> bool:
    zq = q.inputs[2] if len(q.inputs) > 2 else ""
    zd = dq.inputs[2] if len(dq.inputs) > 2 else ""
    return _same(graph, q.inputs[1], dq.inputs[1]) and _same(graph, zq, zd) and \
        int(q.attr("axis", 1)) == int(dq.attr("axis", 1))


def _pair(graph: Graph, q: Node) -> Node | None:
    """The DequantizeLinear that forms a pair with QuantizeLinear ``q`` (module docstring), or None."""
    if q.op_type != "QuantizeLinear" or not _plain(q) or q.attr("saturate", 1) != 1:
        return None
    dq = sole_consumer(graph, q.outputs[0])
    if dq is None or dq.op_type != "DequantizeLinear" or not _plain(dq) or dq.inputs[0] != q.outputs[0]:
        return None
    return dq if _same_params(graph, q, dq) else None


def _exact_scale(graph: Graph, node: Node) -> tuple[bytes, bytes, str] | None:
    """The grid of a per-tensor QuantizeLinear/DequantizeLinear (scale and zero point bytes, code
    type) when its codes survive a round trip through float32 exactly: one finite normal scale
    with scale * 65535 finite (so (code - zp) * scale is normal or zero, and dividing it by the
    scale is within a few ulps of the integer, which rint restores) and an 8- or 16-bit zero
    point; else None."""
    if len(node.inputs) < 3 or not node.inputs[2]:
        return None  # (a DequantizeLinear without a zero point may read int32 codes)
    scale, zero = constant(graph, node.inputs[1]), constant(graph, node.inputs[2])
    if scale is None or zero is None or scale.size != 1 or zero.size != 1 or scale.dtype != _F32 \
            or zero.dtype not in _CODES:
        return None
    s = abs(float(scale.reshape(-1)[0]))
    if not (np.finfo(np.float32).tiny <= s and s * 65535.0 < _MAX_FLOAT32):
        return None
    return scale.tobytes(), zero.tobytes(), zero.dtype.str


def _pool_selects(node: Node) -> bool:
    """A MaxPool whose every window holds at least one input element (a window of padding alone
    gives float32's lowest value, off the grid): no dilation, no ceil mode, each pad below the
    kernel's extent (``SAME`` padding always is), one output."""
    kernel = node.attr("kernel_shape") or []
    pads = node.attr("pads") or [0] * (2 * len(kernel))
    return len(node.outputs) == 1 and not node.attr("ceil_mode", 0) and \
        all(int(d) == 1 for d in node.attr("dilations") or [1]) and len(pads) == 2 * len(kernel) and \
        all(int(p) < int(kernel[i % len(kernel)]) for i, p in enumerate(pads))


def grid_of(graph: Graph, name: str, memo: dict[str, tuple | None]) -> tuple | None:
    """The grid (``_exact_scale``) every value of ``name`` lies on: a DequantizeLinear's output (or
    a collapsed pair's), or an output of a selecting op (``_SELECTING``) whose data inputs all lie on one grid; else None."""
    if name in memo:
        return memo[name]
    memo[name] = None  # (a cycle cannot occur in a sorted graph; this also stops a deep recursion's revisit)
    node = graph.producer(name)
    grid = None
    if node is None:
        pass
    elif node.op_type == "QuantizeDequantize" and node.domain == FUSED_DOMAIN:  # a collapsed pair
        grid = _exact_scale(graph, node)
    elif node.domain != "":
        pass
    elif node.op_type == "DequantizeLinear":
        grid = _exact_scale(graph, node) if _plain(node) else None
    elif node.op_type in _SELECTING and (node.op_type != "MaxPool" or _pool_selects(node)):
        positions = _SELECTING[node.op_type]
        data = [i for k, i in enumerate(node.inputs) if positions is None or k in positions]
        grids = {grid_of(graph, i, memo) if i else None for i in data}
        grid = grids.pop() if len(grids) == 1 else None
    memo[name] = grid
    return grid


def drop_requantize(graph: Graph) -> bool:
    """Each pair whose input already lies on its grid is taken out: its readers read its input
    (an Identity in its place where its output is a graph output or a subgraph reads it)."""
    memo: dict[str, tuple | None] = {}
    outputs = graph_output_names(graph)
    dropped: list[Node] = []
    identities = False
    for q in live_nodes(graph, "QuantizeLinear"):
        dq = _pair(graph, q)
        if dq is None or not q.inputs[0]:
            continue
        grid = _exact_scale(graph, q)
        if grid is None or grid_of(graph, q.inputs[0], memo) != grid:
            continue
        source, result = q.inputs[0], dq.outputs[0]
        readers = graph.consumers(result)
        if result in outputs or any(n.subgraphs for n in readers):
            identity = make_node(graph, "Identity", [source], [result], name=f"{q.name or q.outputs[0]}_dropped")
            replace_nodes(graph, [q, dq], [identity])
            identities = True
            continue
        for n in readers:  # (the maps updated node by node; the pair leaves the list once, below)
            graph.unindex_node(n)
            n.inputs = tuple(source if i == result else i for i in n.inputs)
            graph.index_node(n)
        unlink_node(graph, q)
        unlink_node(graph, dq)
        dropped += [q, dq]
    remove_nodes(graph, dropped, unlinked=True)
    return identities or bool(dropped)


def collapse_qdq_pairs(graph: Graph) -> bool:
    """Each pair -> ``com.onnxhal`` QuantizeDequantize (module docstring)."""
    changed = False
    for q in live_nodes(graph, "QuantizeLinear"):
        dq = _pair(graph, q)
        if dq is None:
            continue
        fused = make_node(graph, "QuantizeDequantize", list(q.inputs[:3]), [dq.outputs[0]],
                          name=f"{q.name or q.outputs[0]}_pair", domain=FUSED_DOMAIN, axis=int(q.attr("axis", 1)))
        replace_nodes(graph, [q, dq], [fused])
        changed = True
    return changed
