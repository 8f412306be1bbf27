"""A graph run by the CPU EP's kernels alone, outside any session: what another EP uses to run a
partition on the host (the simulators' host backend, the OpenCL EP's shape specialisation)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from onnxhal.hal.graph import Graph


def cpu_graph_plan(graph: Graph, outputs: Sequence[str] | None = None, logger: logging.Logger | None = None) -> Any:
    """An execution plan (``run(feeds) -> outputs``) of ``graph`` on the CPU EP's kernels, returning
    ``outputs`` (default: the graph's outputs). Every node, whichever EP it was assigned to, and its
    subgraphs run on the CPU EP; every value lives in host memory. Plans hold no per-run state, so
    many threads may run one at once."""
    from onnxhal.runtime.providers.cpu.ep import CpuEp
    from onnxhal.runtime.session.executor import ExecutionPlanBuilder
    from onnxhal.runtime.session.memory_context import MemoryContext

    if outputs is not None:
        graph = Graph(graph.name, list(graph.nodes), list(graph.inputs), [graph.value_info(o) for o in outputs],
                      dict(graph.initializers), dict(graph.value_infos), graph.opset, parent=graph.parent)
    cpu = CpuEp(logger or logging.getLogger("onnxhal.cpu"))
    eps = {n.ep_name: cpu for n in graph.nodes}
    eps.update({"CPUExecutionProvider": cpu, "": cpu})
    # No EP is registered in this MemoryContext: every EP name maps to host memory.
    builder = ExecutionPlanBuilder(eps, {}, MemoryContext())
    built = builder.build(graph)
    builder.take_kernels()  # no reference cycle through the kernels' creation contexts
    return built
