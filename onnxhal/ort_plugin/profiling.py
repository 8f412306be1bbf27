"""onnxhal's events in onnxruntime's profile: an OrtEpProfilerImpl for each session EP that profiles.

From onnxruntime 1.25 (``OrtEp::CreateProfiler``, API 25) a session with profiling on asks each EP
for a profiler once, calls its ``StartProfiling`` with the nanoseconds elapsed since onnxruntime's
own profiling start, and its ``EndProfiling`` at ``end_profiling()`` with a container into which the
EP adds its events (``OrtEpApi::CreateProfilingEvent`` / ``ProfilingEventsContainer_AddEvents``,
timestamps in microseconds since onnxruntime's profiling start); onnxruntime writes them into its
JSON next to its own (facts from onnxruntime's ``onnxruntime_ep_c_api.h``). ``StartEvent`` /
``StopEvent`` stay NULL: onnxruntime skips them then.

The events the bridge adds:

- one per partition run (``Compute``), named ``<fused node>_onnxhal_compute``, category Kernel,
  its ``args`` the EP's ``profiling_step_args`` (a simulated device's ``sim_device_us`` and
  ``sim_energy_uj``: the device time its cost model gives the partition);
- those of the hal Ep's own ``EpProfiler`` (``Ep.create_profiler()``), if it makes one.

Before 1.25 onnxruntime has no such member and its profile holds only its own events.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from ctypes import POINTER, c_char_p, c_int64, c_uint32, c_void_p
from typing import TYPE_CHECKING, Any

from onnxhal.hal import Node
from onnxhal.hal.errors import Fail
from onnxhal.ort_plugin import dispatch as d

if TYPE_CHECKING:
    from onnxhal.ort_plugin.adapter import EpAdapter

ProfilerStruct = type("OrtEpProfilerImpl", (ctypes.Structure,), {"_fields_": [
    ("ort_version_supported", c_uint32), ("Release", c_void_p), ("StartProfiling", c_void_p),
    ("StartEvent", c_void_p), ("StopEvent", c_void_p), ("EndProfiling", c_void_p)]})
#: OrtEpProfilerImpl arrived with API 25.
PROFILER_VERSION = 25
#: onnxruntime's OrtProfilingEventCategory, by the ``cat`` names its JSON uses.
CATEGORIES = {"Session": 0, "Node": 1, "Kernel": 2, "Api": 3}


class ProfilerAdapter:
    """The profiler of one session EP (``EpAdapter``); ``record`` is called by each partition run."""

    def __init__(self, ep: EpAdapter) -> None:
        self.ep = ep
        self.api = ep.api
        self.hal_profiler = ep.ep.create_profiler()
        self.struct = ProfilerStruct(PROFILER_VERSION, d.trampoline("p_release"), d.trampoline("p_start_profiling"),
                                     None, None, d.trampoline("p_end_profiling"))
        self.address = ctypes.addressof(self.struct)
        # onnxruntime's profiling start on bridge.c's clock (d.clock_ns); None: not profiling
        self._t0: int | None = None
        self._events: list[dict] = []
        self._lock = threading.Lock()
        d.objects[self.address] = self

    @property
    def active(self) -> bool:
        return self._t0 is not None

    def start(self, start_ns: int) -> None:
        """``start_ns``: onnxruntime's profiling start, which bridge.c read on its clock (``d.clock_ns``)."""
        t0 = ctypes.c_int64(start_ns).value  # the word carries an int64
        with self._lock:
            self._events.clear()
            self._t0 = t0
        if self.hal_profiler is not None:
            # hal profilers count from perf_counter_ns: the same instant on that clock, both read now
            self.hal_profiler.start_profiling(time.perf_counter_ns() - (d.clock_ns() - t0))

    def record(self, fused_node: Node, start_ns: int, end_ns: int, inputs: list, outputs: list) -> None:
        """One partition run, ``start_ns`` and ``end_ns`` on bridge.c's clock (``d.clock_ns``)."""
        t0 = self._t0
        if t0 is None:
            return
        hal_ep = self.ep.ep
        args = {"op_name": fused_node.op_type, "provider": hal_ep.name, "fused_node": fused_node.name}
        args.update(hal_ep.profiling_step_args(fused_node, hal_ep.name, inputs, outputs))
        event = {"name": f"{fused_node.name}_onnxhal_compute", "cat": "Kernel", "ts": (start_ns - t0) / 1000.0,
                 "dur": (end_ns - start_ns) / 1000.0, "tid": threading.get_native_id(), "args": args}
        with self._lock:
            self._events.append(event)

    def end(self, container: int) -> None:
        with self._lock:
            events, self._events, self._t0 = self._events, [], None
        if self.hal_profiler is not None:
            for e in self.hal_profiler.end_profiling():
                if not isinstance(e, dict) or not {"name", "ts", "dur"} <= set(e):
                    raise Fail(f"{self.ep.ep.name}: its EpProfiler.end_profiling() returned {e!r}; each event must "
                               "be a dict with name, ts and dur (microseconds since start_profiling)")
                events.append(e)
        if events:
            self._add(container, events)

    def _add(self, container: int, events: list[dict]) -> None:
        ep_api, pid = self.api.ep, os.getpid()
        made: list[int] = []
        try:
            for e in events:
                args = {str(k): str(v) for k, v in (e.get("args") or {}).items()}
                keys = (c_char_p * len(args))(*[k.encode() for k in args])
                values = (c_char_p * len(args))(*[v.encode() for v in args.values()])
                out = c_void_p()
                self.api.check(ep_api["CreateProfilingEvent"](
                    CATEGORIES.get(e.get("cat", "Kernel"), CATEGORIES["Kernel"]), pid, int(e.get("tid", 0)) & 0x7FFFFFFF,
                    str(e["name"]).encode(), c_int64(int(e["ts"])), c_int64(int(e["dur"])),
                    keys, values, len(args), ctypes.byref(out)), "CreateProfilingEvent")
                made.append(out.value)
            array = (c_void_p * len(made))(*made)
            self.api.check(ep_api["ProfilingEventsContainer_AddEvents"](
                container, ctypes.cast(array, POINTER(c_void_p)), len(made)), "ProfilingEventsContainer_AddEvents")
        finally:  # the container keeps copies
            for p in made:
                ep_api["ReleaseProfilingEvent"](p)

    def release(self) -> None:
        d.objects.pop(self.address, None)
        if self.ep.profiler is self:
            self.ep.profiler = None


def create_profiler(ep: EpAdapter, args: Any) -> None:
    """OrtEp::CreateProfiler: a profiler for ``ep``'s session (called only when it profiles)."""
    profiler = ProfilerAdapter(ep)
    ep.profiler = profiler
    ctypes.cast(args[0], POINTER(c_void_p))[0] = profiler.address


d.HANDLERS.update({
    d.E_CREATE_PROFILER: create_profiler,
    d.P_RELEASE: lambda p, a: p.release() if p is not None else None,
    d.P_START_PROFILING: lambda p, a: p.start(a[0]),
    d.P_END_PROFILING: lambda p, a: p.end(a[0]),
})
