"""EpProfiler: an EP's own events in the session's profiling trace (onnxruntime's ``OrtEpProfilerImpl``).

``Ep.create_profiler()`` returns one when the session profiles. The session calls
``start_profiling(start_time_ns)`` when profiling starts and ``end_profiling()`` when the
application calls ``InferenceSession.end_profiling``; the events returned then are written into the
trace with the session's own. An event is a Chrome-trace dict: ``name``, ``cat`` (e.g. "Node" or
"Kernel"), ``ts`` and ``dur`` in microseconds since ``start_time_ns``, and optional ``args``.
"""

from __future__ import annotations


class EpProfiler:
    def start_profiling(self, start_time_ns: int) -> None:
        """Profiling starts now (``time.perf_counter_ns()``); event times count from here."""

    def end_profiling(self) -> list[dict]:
        """The events recorded since ``start_profiling``."""
        return []
