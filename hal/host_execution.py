"""Running a graph on the host: a service the engine provides to EPs.

An EP sometimes computes part of its work with the host's kernels: a simulated device without a
usable OpenCL driver runs its partitions on them, and the OpenCL EP runs a partition on the host
to learn the shapes of a new input signature. Such an EP asks here, not the CPU EP's modules,
so that EPs depend on ``hal`` alone. The engine (``onnxhal.runtime``) registers the provider when
it is imported; onnxruntime's plugin EPs have no such service, which is why it lives on our side
of the contract.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from onnxhal.hal.errors import Fail
from onnxhal.hal.graph import Graph


class HostPlan(Protocol):
    """A graph ready to run on the host: ``run(feeds) -> outputs``; holds no per-run state, so
    many threads may run one at once."""

    def run(self, feeds: dict[str, Any]) -> list: ...


#: (graph, outputs or None for the graph's, logger or None) -> HostPlan
HostPlanner = Callable[[Graph, Sequence[str] | None, logging.Logger | None], HostPlan]

_planner: HostPlanner | None = None


def provide_host_plans(planner: HostPlanner) -> None:
    """Register the engine's host planner (``onnxhal.runtime`` does, at import)."""
    global _planner
    _planner = planner


def host_plan(graph: Graph, outputs: Sequence[str] | None = None, logger: logging.Logger | None = None) -> HostPlan:
    """``graph`` planned on the host's kernels, returning ``outputs`` (default: the graph's
    outputs). Every node and its subgraphs run on the host, whatever EP it was assigned to."""
    if _planner is None:
        raise Fail("no host execution is registered: import onnxhal.runtime (any session does) before an EP "
                   "runs a graph on the host")
    return _planner(graph, outputs, logger)
