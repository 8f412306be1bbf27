"""Element-wise computations over 8-bit quantized values as one table lookup.

A value on an 8-bit grid (``qdq_pairs.grid_of``: a DequantizeLinear's or a QuantizeDequantize's
output, or a selection of one) holds at most 256 distinct values. The element-wise ops computing
one value from it alone (``TABULATED`` ops whose inputs are the grid value, values computed from
it, and one-element constants; their intermediate values read by nothing else) give each of those
256 values one result, so ``tabulate_grid_chains`` computes them once at load on the grid's
values, with the CPU EP's own kernels (``cleanup.evaluate_node``), and replaces them with
``com.onnxhal`` GridTable, which indexes that table by each element's code. The results are the
kernels' own, element for element: the kernels listed compute each element alone, with no path
chosen by the array's size (tests/test_qdq_tables.py checks each, bit for bit).

QDQ transformers put such computations between their pairs: GELU's x / sqrt(2) -> Erf (BERT, ViT),
x + 0.044715 x ** 3 ... Tanh (GPT-2), 20-50 array passes on each activation, where the table
takes four. Cheap ops alone (fewer than ``MIN_CHEAP`` of Add, Mul, Relu ...) are left: the lookup
costs as much.
"""

from __future__ import annotations

import numpy as np

from onnxhal.hal.graph import Graph, Node
from onnxhal.runtime.optimizer.cleanup import evaluate_node
from onnxhal.runtime.optimizer.qdq_pairs import grid_of
from onnxhal.runtime.optimizer.rewrite import (
    FUSED_DOMAIN,
    add_initializer,
    constant,
    graph_output_names,
    live_nodes,
    make_node,
    replace_nodes,
)

#: Ops the table takes, each computed element by element by its CPU kernel, True where one costs
#: more array passes than the lookup's four.
TABULATED: dict[str, bool] = {
    **dict.fromkeys(("Erf", "Tanh", "Sigmoid", "Exp", "Log", "Sqrt", "Pow", "Softplus", "Softsign", "Elu", "Selu",
                     "HardSigmoid", "HardSwish", "Gelu", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh",
                     "Cosh", "Asinh", "Acosh", "Atanh"), True),
    **dict.fromkeys(("Add", "Sub", "Mul", "Div", "Neg", "Abs", "Relu", "LeakyRelu", "Reciprocal", "Floor", "Ceil",
                     "Round", "Sign"), False),
}
#: The ops whose outputs ``grid_of`` finds a grid for (a selecting op's only through one of these
#: before it): a graph without them has no chain to tabulate.
GRID_MAKERS = ("DequantizeLinear", "QuantizeDequantize")
#: Chains of cheap ops only are tabulated from this many ops on.
MIN_CHEAP = 3


def _link(graph: Graph, node: Node, values: set[str], rank: int | None) -> bool:
    """Whether ``node`` is an op of the table whose inputs are ``values`` (functions of the grid
    value, of its shape) and one-element constants no wider than the grid value (so its output
    has that shape too), at least one of them a value."""
    if node.domain != "" or node.op_type not in TABULATED or len(node.outputs) != 1 or node.subgraphs:
        return False
    reads = False
    for i in node.inputs:
        if i in values:
            reads = True
            continue
        c = constant(graph, i) if i else None
        if c is None or c.size != 1 or (c.ndim > 0 and (rank is None or c.ndim > rank)):
            return False
    return reads


def _region(graph: Graph, value: str, position: dict[int, int]) -> list[Node]:
    """The element-wise nodes computing one value from ``value`` alone (and constants), in graph
    order: the nodes reachable from ``value`` through ``_link`` ops, cut to the ancestors of the
    latest one whose intermediate values no node outside reads; [] if none."""
    shape = graph.value_info(value).shape
    rank = None if shape is None else len(shape)
    values: set[str]
    values, nodes = {value}, []
    candidates = {id(n): n for n in graph.consumers(value)}
    grown = True
    while grown:  # in graph order: a reader of two values waits until both are in
        grown = False
        for node in sorted(candidates.values(), key=lambda n: position.get(id(n), -1)):
            if _link(graph, node, values, rank):
                del candidates[id(node)]
                nodes.append(node)
                values.add(node.outputs[0])
                candidates.update((id(c), c) for c in graph.consumers(node.outputs[0]))
                grown = True
                break
    outputs = graph_output_names(graph)
    for last in sorted(nodes, key=lambda n: position.get(id(n), -1), reverse=True):
        # the ancestors of ``last`` within the region, if their other values are read by them alone
        keep, needed = [], {last.outputs[0]}
        for node in reversed(nodes):
            if node.outputs[0] in needed:
                keep.append(node)
                needed.update(node.inputs)
        keep.reverse()
        inside = {id(n) for n in keep}
        if not any(n.outputs[0] in outputs or any(id(c) not in inside or n.outputs[0] in c.implicit_inputs
                                                  for c in graph.consumers(n.outputs[0])) for n in keep[:-1]):
            return keep
    return []


def _grid_values(grid: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(scale, zero point, every code's value in code order) of a grid: the values as
    DequantizeLinear computes them."""
    scale_bytes, zero_bytes, zero_type = grid
    scale = np.frombuffer(scale_bytes, np.float32).reshape(())
    zero = np.frombuffer(zero_bytes, np.dtype(zero_type)).reshape(())
    info = np.iinfo(zero.dtype)
    codes = np.arange(info.min, info.max + 1).astype(zero.dtype)
    return scale.copy(), zero.copy(), np.multiply(np.subtract(codes, zero, dtype=np.int32), scale, dtype=np.float32)


def _table(graph: Graph, region: list[Node], value: str, grid_values: np.ndarray) -> np.ndarray | None:
    """The region's result on the grid's values, by the CPU kernels; None where one cannot run."""
    computed = {value: grid_values}
    for node in region:
        inputs = [computed[i] if i in computed else constant(graph, i) if i else None for i in node.inputs]
        try:
            computed[node.outputs[0]] = evaluate_node(graph, node, inputs)[0]
        except Exception:  # (a kernel that refuses the grid's values: the region runs as it is)
            return None
    table = computed[region[-1].outputs[0]]
    return table if table.shape == grid_values.shape else None


def tabulate_grid_chains(graph: Graph) -> bool:
    """Each element-wise chain over an 8-bit grid -> ``com.onnxhal`` GridTable (module docstring)."""
    changed = False
    memo: dict = {}
    position = {id(n): k for k, n in enumerate(graph.nodes)}
    done: set[str] = set()
    for node in live_nodes(graph, *TABULATED):
        for value in node.inputs:
            if not value or value in done or constant(graph, value) is not None:
                continue
            done.add(value)
            grid = grid_of(graph, value, memo)
            if grid is None or np.dtype(grid[2]).itemsize != 1:
                continue
            region = _region(graph, value, position)
            if not region or (not any(TABULATED[n.op_type] for n in region) and len(region) < MIN_CHEAP):
                continue
            scale, zero, grid_values = _grid_values(grid)
            table = _table(graph, region, value, grid_values)
            if table is None:
                continue
            out = region[-1].outputs[0]
            base = region[-1].name or out
            inputs = [value, add_initializer(graph, f"{base}_grid_scale", scale),
                      add_initializer(graph, f"{base}_grid_zero_point", zero),
                      add_initializer(graph, f"{base}_table", table)]
            lookup = make_node(graph, "GridTable", inputs, [out], name=f"{base}_table", domain=FUSED_DOMAIN)
            replace_nodes(graph, region, [lookup])
            changed = True
    return changed
