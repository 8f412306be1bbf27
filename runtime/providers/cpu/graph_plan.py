"""A graph run by the CPU EP's kernels alone, outside any session: what another EP uses to run a
partition on the host (the simulators' host backend, the OpenCL EP's shape specialisation)."""

from __future__ import annotations

import logging
import os
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
    governor = _load_aware_blas()
    return built if governor is None else GovernedHostPlan(built, governor)


def _load_aware_blas() -> Any:
    """A ``LoadAwareBlasThreads`` for BLAS's start-up count, as ``CpuEpFactory.create_ep`` makes one
    for a session with the default threads (None where there is nothing to govern, or
    ONNXHAL_LOAD_AWARE_THREADS=0). Not the present count: a session's governor may have lowered it
    for a moment of load, and a plan made then would never be governed."""
    from onnxhal.runtime.providers.cpu.kernels.blas_threads import LoadAwareBlasThreads, startup_blas_threads

    threads = startup_blas_threads()
    if os.environ.get("ONNXHAL_LOAD_AWARE_THREADS", "1") == "0" or not threads or threads < 2:
        return None
    return LoadAwareBlasThreads(threads)


class GovernedHostPlan:
    """A host plan whose runs set BLAS's threads for the machine's load first, as a session's CPU EP
    does at each run (``LoadAwareBlasThreads``). A host plan may run outside any session run (the
    OpenCL EP's claim-time trial, at session creation), where OpenBLAS keeps its start-up count: on
    2 cores loaded by other processes tv_resnext's partition then took 230-280 ms a run against
    2.4 ms with the count the load allows (each product waits a scheduler slice for a thread)."""

    def __init__(self, plan: Any, governor: Any) -> None:
        self.plan = plan
        self.governor = governor

    @property
    def graph(self) -> Graph:
        return self.plan.graph

    def run(self, feeds: dict[str, Any], run_options: Any = None) -> list:
        self.governor.apply()
        return self.plan.run(feeds, run_options)
