"""Graph capture and replay, as onnxruntime drives an EP that captures (CUDA graphs, WebGPU).

The EP does the capturing (typically in ``on_run_start``/``on_run_end``); the session decides when
to ask. At creation: the capturing EP is the one whose ``is_graph_capture_enabled()`` is True; a
model that does not suit it (control flow, nodes elsewhere against its
``get_graph_capture_node_assignment_policy()``) fails the session, as onnxruntime's
(``capturing_ep``). Each run names a graph with the run config entry ``gpu_graph_id`` (0 by
default; -1 runs without capture). A run of a graph that is not captured yet is repeated until the
EP says it is (onnxruntime's "another run for necessary memory allocation or graph capture"); a run
of a captured graph is ``replay_graph(id)``, which writes the outputs bound when it was captured,
so replay goes through ``run_with_iobinding`` (``run`` refuses a capturing session's run:
``check_run_api``).

``CaptureRecorder`` is what an EP needs to capture and replay: in a capture run the runtime gives
each fused node's outputs their destinations (``KernelContext.destinations``), the recorder writes
the outputs there and keeps the partition run with its input buffers; ``replay`` runs them again
into the same destinations.

In onnxhal's own session the destinations are the outputs an IOBinding run binds to OrtValues in
device memory (``BOUND_OUTPUTS``, set by the session for the run; ``CAPTURE_DESTINATIONS`` while a
run captures, read by the plan's fused steps), and ``CaptureBindings`` keeps, per graph, the bound
values its capture run read and wrote: a replay touches only those, so one whose binding holds
other values is refused, as the bridge refuses a replay through buffers onnxruntime freed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

import numpy as np

from onnxhal.hal import Ep, KernelContext, OrtGraphCaptureNodeAssignmentPolicy
from onnxhal.hal.errors import Fail, InvalidArgument

GRAPH_ID_KEY = "gpu_graph_id"
SKIP = -1
MAX_CAPTURE_RUNS = 16  # a bound onnxruntime lacks: an EP that never captures does not loop forever
logger = logging.getLogger("onnxhal.session")

#: The outputs the current capture run leaves in bound OrtValues in the capturing EP's memory,
#: {output name: the tensor}; None outside one. Context-local: each thread's run has its own.
BOUND_OUTPUTS: ContextVar[Mapping[str, Any] | None] = ContextVar("onnxhal_bound_outputs", default=None)
#: While a run captures: (the capturing EP's name, {value name: destination}); None otherwise.
CAPTURE_DESTINATIONS: ContextVar[tuple[str, Mapping[str, Any]] | None] = ContextVar(
    "onnxhal_capture_destinations", default=None)


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


_CANNOT = "This session cannot use the graph capture feature as requested by the user as "


def capturing_ep(eps: dict[str, Ep], assigned: list, cpu_ep_name: str, graph: Any, copies: bool) -> Ep | None:
    """The session's graph-capturing EP, or None when no EP captures. As onnxruntime's session
    initialization (inference_session.cc; the messages checked on onnxruntime 1.32 through the
    bridge), a capturing EP the model does not suit fails the session (``Fail``): a control-flow
    node in the main graph; with ``ALL_NODES_ON_EP`` a node on another EP; with
    ``ALLOW_CPU_FOR_SHAPES`` a node on an EP other than the CPU EP, or CPU nodes with values copied
    between memories (``copies``: the plan has copy steps, onnxruntime's Memcpy nodes)."""
    enabled = [ep for ep in eps.values() if ep.is_graph_capture_enabled()]
    if not enabled:
        return None
    if len(enabled) > 1:
        logger.warning("graph capture is off: %d EPs want to capture (%s); only one may",
                       len(enabled), [ep.name for ep in enabled])
        return None
    ep = enabled[0]
    remedy = f"; turn graph capture off in {ep.name}'s provider options"
    for node in graph.nodes:
        if node.subgraph_list():
            raise Fail(f"{_CANNOT}the model has control flow nodes which can't be supported by {ep.name}: node "
                       f"{node.name!r} ({node.op_type}){remedy}")
    elsewhere = [(sub.ep_name, node) for sub in assigned if sub.ep_name != ep.name for node in sub.nodes]
    if not elsewhere:
        return ep
    where, node = elsewhere[0]
    if ep.get_graph_capture_node_assignment_policy() != OrtGraphCaptureNodeAssignmentPolicy.ALLOW_CPU_FOR_SHAPES:
        raise Fail(f"{_CANNOT}all the graph nodes have not been assigned to {ep.name}: node {node.name!r} "
                   f"({node.op_type}) runs on {where}{remedy}")
    other = next(((w, n) for w, n in elsewhere if w != cpu_ep_name), None)
    if other is not None or copies:
        where, node = other or (where, node)
        raise Fail(f"{_CANNOT}all compute graph nodes have not been partitioned to the {ep.name}: node "
                   f"{node.name!r} ({node.op_type}) runs on {where}"
                   f"{'' if other else ', and values are copied between memories'}{remedy}")
    if any(n.op_type == "Shape" for _, n in elsewhere):
        logger.warning("%s: this model has shape massaging nodes that will execute on CPU. Use the graph capture "
                       "feature with caution: it is safe as long as the shapes stay those of the capture run", ep.name)
    return ep


def captures_graphs(ep: Ep | None) -> bool:
    """Whether ``ep`` overrides ``is_graph_capture_enabled`` (the bridge fills the capture members of
    such an EP only; the plan gives capture destinations to such an EP's fused steps when it says
    it captures)."""
    return ep is not None and type(ep).is_graph_capture_enabled is not Ep.is_graph_capture_enabled


def destinations_for(ep_name: str, outputs: Sequence[str]) -> list | None:
    """``KernelContext.destinations`` for a fused node of ``ep_name`` with ``outputs``: in a capture
    run of that EP, per output its bound buffer (None where the run binds none); else None."""
    capture = CAPTURE_DESTINATIONS.get()
    if capture is None or capture[0] != ep_name:
        return None
    bound = capture[1]
    return [bound.get(name) for name in outputs]


def _run_capturing(ep: Ep | None, gid: int, run_once: Callable[[], list]) -> list:
    """``run_once()``, with the run's bound outputs as destinations when it is a capture run (the EP
    captures, the graph is not captured yet): onnxruntime gives a capture run's fused nodes its
    output tensors in the same way (the bridge, ``ort_plugin/graph_capture.py``)."""
    bound = BOUND_OUTPUTS.get()
    if ep is None or gid == SKIP or bound is None or ep.is_graph_captured(gid) or not ep.is_graph_capture_enabled():
        return run_once()
    token = CAPTURE_DESTINATIONS.set((ep.name, bound))
    try:
        return run_once()
    finally:
        CAPTURE_DESTINATIONS.reset(token)


def run_until_captured(ep: Ep | None, run_options: Any, run_once: Callable[[], list]) -> list:
    """``run_once()``, repeated while ``ep`` (the session's capturing EP) has not captured the run's
    graph: onnxruntime's "another run for necessary memory allocation or graph capture"."""
    gid = graph_annotation_id(run_options) if ep is not None else SKIP
    outputs = _run_capturing(ep, gid, run_once)
    runs = 1
    # an EP may turn capture off after a run (CaptureRecorder.unsupported): no more runs then
    while gid != SKIP and not ep.is_graph_captured(gid) and ep.is_graph_capture_enabled():
        if runs == MAX_CAPTURE_RUNS:
            logger.warning("%s: graph %d not captured after %d runs; running without capture", ep.name, gid, runs)
            break
        logger.info("Start another run for necessary memory allocation or graph capture.")
        outputs = _run_capturing(ep, gid, run_once)
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
    """``run`` (not ``run_with_iobinding``) with a capturing EP: refused unless the run opts out.
    onnxruntime (1.32, through the bridge) runs it and captures it, and its next ``run`` is the
    replay, through the buffers of the first run, which it freed: the bridge refuses that replay
    (``ort_plugin/graph_capture.replay``). onnxhal refuses at the first run, naming the remedy."""
    if ep is not None and graph_annotation_id(run_options) != SKIP:
        raise InvalidArgument(
            f"{ep.name} captures the graph: graph capture requires fixed device OrtValues and run_with_iobinding. Set "
            f"the '{GRAPH_ID_KEY}' run option to {SKIP} to opt a single run out of capture.")


_REMEDY = ("bind every input the device reads and every output with IOBinding to OrtValues in the device's memory "
           "(OrtValue.ortvalue_from_shape_and_type(..., memory_info=ep_device.memory_info(OrtDeviceMemoryType."
           "DEFAULT))), keep them bound and write new input values into them (copy_tensors, update_inplace); or "
           f"set the run option '{GRAPH_ID_KEY}' to '{SKIP}', or release the graph (release_captured_graph)")


class CaptureBindings:
    """The bound values each captured graph read and wrote in its capture run, by graph id (onnxhal's
    own session). A replay reads the input buffers and writes the destinations of its capture run,
    whatever the run binds now, so ``check`` refuses a replay whose binding holds other values:
    its outputs would silently keep old values (onnxruntime's CUDA EP reads freed memory then; the
    bridge refuses, ``ort_plugin/graph_capture.replay``)."""

    def __init__(self) -> None:
        self._graphs: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self._capturing: dict[int, threading.Lock] = {}

    def capture_lock(self, graph_annotation_id: int) -> threading.Lock:
        """Held by a capture run of ``graph_annotation_id``: one at a time per graph, so that the graph
        the EP keeps and the values recorded here are the same run's (runs of other graphs go on)."""
        with self._lock:
            return self._capturing.setdefault(graph_annotation_id, threading.Lock())

    def record(self, graph_annotation_id: int, reads: Mapping[str, Any], writes: Mapping[str, Any]) -> None:
        """``reads``: the bound inputs, by name; ``writes``: the destinations the capture run wrote
        (the outputs bound in the capturing EP's memory), by output name."""
        with self._lock:
            self._graphs[graph_annotation_id] = (dict(reads), dict(writes))

    def release(self, graph_annotation_id: int) -> None:
        with self._lock:
            self._graphs.pop(graph_annotation_id, None)

    def check(self, ep_name: str, graph_annotation_id: int, inputs: Mapping[str, Any],
              outputs: Mapping[str, Any]) -> None:
        """Raise ``InvalidArgument`` unless ``inputs`` (name -> bound value) and ``outputs`` (name ->
        the bound value's contents, None where not bound to a value) are the capture run's."""
        with self._lock:
            captured = self._graphs.get(graph_annotation_id)
        if captured is None:  # captured by a run that did not go through IOBinding
            raise InvalidArgument(f"{ep_name}: cannot replay graph {graph_annotation_id}: it was captured by a run "
                                  f"without IOBinding, whose buffers lived for that run only; {_REMEDY}")
        reads, writes = captured
        for name, value in reads.items():
            if inputs.get(name) is not value:
                raise InvalidArgument(f"{ep_name}: cannot replay graph {graph_annotation_id}: input {name!r} is bound "
                                      f"to another value than at capture, and a replay reads the capture's; {_REMEDY}")
        for name, value in outputs.items():
            if value is None or value is not writes.get(name):
                why = ("is not bound to an OrtValue" if value is None else "was not bound to an OrtValue in the "
                       "EP's memory at capture" if writes.get(name) is None else "is bound to another value than at "
                       "capture")
                raise InvalidArgument(f"{ep_name}: cannot replay graph {graph_annotation_id}: output {name!r} {why}, "
                                      f"and a replay writes only the capture's; {_REMEDY}")


#: A partition run of a capture run: the EP's compute, the input buffers it read, its destinations.
_Step = tuple[Callable[[KernelContext], Any], list, list]


class CaptureRecorder:
    """The captured graphs of one graph-capturing EP, by graph annotation id.

    The EP calls ``start_run(run_options)`` in ``on_run_start``, ``capture(...)`` in each
    ``compute`` that gets ``KernelContext.destinations`` and ``end_run()`` in ``on_run_end``; its
    ``is_graph_captured``, ``replay_graph`` and ``release_captured_graph`` are ``is_captured``,
    ``replay`` and ``release``. ``copy(src, dst, streams)`` copies values into already allocated
    ones after the work queued on ``streams`` (the EP's data transfer). A capture run records every
    partition run of the EP, in order; a replay reads the same input buffers, so the session must
    keep them (inputs bound with IOBinding in the EP's memory, as onnxruntime requires for CUDA
    graphs too).

    Runs of one session may come from several threads at once. The captured graphs are the EP's, by
    graph id, seen by every thread: onnxruntime's session asks the EP ``IsGraphCaptured(id)`` and
    replays whatever thread runs (its CUDA EP keeps graphs per thread instead, and its documentation
    rules out concurrent runs with CUDA graphs). A run's recording is its own (per thread: a run's
    hooks and computes come on the thread that runs it), so concurrent capture runs do not mix; of
    two capture runs of one graph id the first to end keeps it. Replays of one graph write the same
    destinations, so they take turns, as launches of one CUDA graph do."""

    def __init__(self, ep_name: str, copy: Callable[[Sequence[Any], Sequence[Any], Sequence[Any]], None]) -> None:
        self.ep_name = ep_name
        self.copy = copy
        self.graphs: dict[int, list[_Step]] = {}
        #: Set when a capture run got no destinations: the runtime cannot replay this EP's runs.
        self.unsupported = False
        self._run = threading.local()  # .recording: (graph id, steps) of the capture run on this thread
        self._lock = threading.Lock()
        self._replaying: dict[int, threading.Lock] = {}

    def start_run(self, run_options: Any) -> None:
        gid = graph_annotation_id(run_options)
        with self._lock:
            self._run.recording = None if gid == SKIP or gid in self.graphs or self.unsupported else (gid, [])

    def capture(self, compute: Callable[[KernelContext], Any], context: KernelContext, outputs: Sequence[Any]) -> list:
        """In a capture run: ``outputs`` written into ``context.destinations`` and the partition run
        (``compute`` of a context over the same inputs) recorded; returns the destinations."""
        destinations = list(context.destinations or ())
        # on the run's stream: the partition's kernels may still be queued there
        written = self._write(outputs, destinations, context.stream)
        recording = getattr(self._run, "recording", None)
        if recording is not None:
            recording[1].append((compute, list(context.inputs), destinations))
        return written

    def end_run(self) -> None:
        recording = getattr(self._run, "recording", None)
        self._run.recording = None
        if recording is None:
            return
        gid, steps = recording
        if steps:
            with self._lock:
                self.graphs.setdefault(gid, steps)
                self._replaying.setdefault(gid, threading.Lock())
            return
        # no compute of this run had destinations: this runtime cannot have the EP's outputs replayed
        self.unsupported = True
        logger.warning("%s: graph capture is off: the runtime gave no output destinations "
                       "(KernelContext.destinations) in the capture run of graph %d", self.ep_name, gid)

    def is_captured(self, graph_annotation_id: int) -> bool:
        return graph_annotation_id in self.graphs

    def replay(self, graph_annotation_id: int) -> None:
        steps = self.graphs.get(graph_annotation_id)
        if steps is None:
            raise InvalidArgument(f"{self.ep_name}: graph {graph_annotation_id} is not captured (captured: "
                                  f"{sorted(self.graphs)}); run it with run option '{GRAPH_ID_KEY}' = "
                                  f"'{graph_annotation_id}' first")
        with self._replaying[graph_annotation_id]:
            for compute, inputs, destinations in steps:
                context = KernelContext(inputs, len(destinations))
                outputs = compute(context)
                self._write(context.outputs if outputs is None else outputs, destinations, None)

    def release(self, graph_annotation_id: int) -> None:
        with self._lock:
            self.graphs.pop(graph_annotation_id, None)

    def _write(self, outputs: Sequence[Any], destinations: list, stream: Any) -> list:
        if len(outputs) != len(destinations):
            raise InvalidArgument(f"{self.ep_name}: a capture run gave {len(destinations)} output destinations for "
                                  f"{len(outputs)} outputs")
        written = []
        for i, (out, dst) in enumerate(zip(outputs, destinations)):
            if dst is None or out is dst:
                written.append(out)
                continue
            if tuple(out.shape) != tuple(dst.shape) or np.dtype(out.dtype) != np.dtype(dst.dtype):
                raise InvalidArgument(
                    f"{self.ep_name}: output {i} is {np.dtype(out.dtype)}{list(out.shape)} but its capture destination "
                    f"is {np.dtype(dst.dtype)}{list(dst.shape)}; graph capture needs static output shapes")
            self.copy([out], [dst], [stream])
            written.append(dst)
        return written
