"""Graph capture and replay, as onnxruntime drives an EP that captures (CUDA graphs, WebGPU).

The EP does the capturing (typically in ``on_run_start``/``on_run_end``); the session decides when
to ask. At creation: the capturing EP is the one whose ``is_graph_capture_enabled()`` is True, if
the partition suits its ``get_graph_capture_node_assignment_policy()`` (every node on it, or CPU
nodes only for shapes); otherwise capture is off, with a warning, as onnxruntime. Each run names a
graph with the run config entry ``gpu_graph_id`` (0 by default; -1 runs without capture). A run of
a graph that is not captured yet is repeated until the EP says it is (onnxruntime's "another run
for necessary memory allocation or graph capture"); a run of a captured graph is
``replay_graph(id)``, which writes the outputs bound when it was captured, so replay goes through
``run_with_iobinding`` (``run`` refuses it, as onnxruntime's Python API does).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from onnxhal.hal import Ep, OrtGraphCaptureNodeAssignmentPolicy
from onnxhal.hal.errors import InvalidArgument

GRAPH_ID_KEY = "gpu_graph_id"
SKIP = -1
MAX_CAPTURE_RUNS = 16  # a bound onnxruntime lacks: an EP that never captures does not loop forever
logger = logging.getLogger("onnxhal.session")


def graph_annotation_id(run_options: Any) -> int:
    """The run's ``gpu_graph_id`` (0 when unset)."""
    if run_options is None:
        return 0
    entry = run_options.config(GRAPH_ID_KEY)
    if not entry:
        return 0
    try:
        return int(entry)
    except ValueError:
        raise InvalidArgument(f"Run option '{GRAPH_ID_KEY}' must be an integer, got {entry!r}.") from None


def capturing_ep(eps: dict[str, Ep], assigned: list, cpu_ep_name: str, graph: Any) -> Ep | None:
    """The session's graph-capturing EP, or None (capture off) with the reason logged."""
    enabled = [ep for ep in eps.values() if ep.is_graph_capture_enabled()]
    if not enabled:
        return None
    if len(enabled) > 1:
        logger.warning("graph capture is off: %d EPs want to capture (%s); only one may",
                       len(enabled), [ep.name for ep in enabled])
        return None
    ep = enabled[0]
    policy = ep.get_graph_capture_node_assignment_policy()
    for sub in assigned:
        if sub.ep_name == ep.name:
            continue
        for node in sub.nodes:
            shape_only = sub.ep_name == cpu_ep_name and _computes_shapes(node, graph)
            if policy != OrtGraphCaptureNodeAssignmentPolicy.ALLOW_CPU_FOR_SHAPES or not shape_only:
                logger.warning("%s: graph capture is off: node %r (%s) runs on %s, and the EP's policy is %s",
                               ep.name, node.name, node.op_type, sub.ep_name, policy.name)
                return None
    return ep


def _computes_shapes(node: Any, graph: Any) -> bool:
    """A node that only computes shapes: every output is an int64 tensor (Shape, Gather on a shape,
    Concat of dims, ...)."""
    if node.op_type in ("Shape", "Size"):
        return True
    infos = [graph.value_infos.get(o) for o in node.outputs if o]
    return bool(infos) and all(i is not None and i.dtype == np.dtype(np.int64) for i in infos)


def run_until_captured(ep: Ep | None, run_options: Any, run_once: Callable[[], list]) -> list:
    """``run_once()``, repeated while ``ep`` (the session's capturing EP) has not captured the run's
    graph: onnxruntime's "another run for necessary memory allocation or graph capture"."""
    outputs = run_once()
    gid = graph_annotation_id(run_options) if ep is not None else SKIP
    runs = 1
    while gid != SKIP and not ep.is_graph_captured(gid):
        if runs == MAX_CAPTURE_RUNS:
            logger.warning("%s: graph %d not captured after %d runs; running without capture", ep.name, gid, runs)
            break
        logger.info("Start another run for necessary memory allocation or graph capture.")
        outputs = run_once()
        runs += 1
    return outputs


def replay_if_captured(ep: Ep | None, run_options: Any) -> bool:
    """Replay the run's graph if ``ep`` captured it; False when the run must execute."""
    if ep is None:
        return False
    gid = graph_annotation_id(run_options)
    if gid == SKIP or not ep.is_graph_captured(gid):
        return False
    logger.info("Replaying the captured %s graph %d", ep.name, gid)
    ep.replay_graph(gid)
    return True


def check_run_api(ep: Ep | None, run_options: Any) -> None:
    """``run`` (not ``run_with_iobinding``) with a capturing EP: refused unless the run opts out, as
    onnxruntime's Python API refuses it."""
    if ep is not None and graph_annotation_id(run_options) != SKIP:
        raise InvalidArgument(
            f"{ep.name} captures the graph: graph capture requires fixed device OrtValues and run_with_iobinding. Set "
            f"the '{GRAPH_ID_KEY}' run option to {SKIP} to opt a single run out of capture.")
