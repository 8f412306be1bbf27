"""Profiling to a Chrome-trace JSON (open it in https://ui.perfetto.dev or chrome://tracing).

Events follow onnxruntime's profile format: one complete event ("ph": "X") per node run with
``op_name``, ``provider`` and input/output shapes in ``args``, plus session and run events.
"""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import datetime
from typing import Any

import numpy as np

from onnxhal.hal.errors import Fail, NoSuchFile


def _type_shape(values: list) -> list[dict]:
    out = []
    for v in values:
        if v is None:
            out.append({})
        elif isinstance(v, list):
            out.append({"sequence": len(v)})
        else:
            dtype = getattr(v, "dtype", None)
            shape = getattr(v, "shape", None)
            out.append({str(np.dtype(dtype)) if dtype is not None else type(v).__name__:
                        list(shape) if shape is not None else []})
    return out


class Profiler:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix or "onnxhal_profile"
        folder = os.path.dirname(self.prefix)
        if folder and not os.path.isdir(folder):  # found now, not after a long profiled run
            raise NoSuchFile(f"SessionOptions.profile_file_prefix {self.prefix!r}: the folder {folder!r} does not "
                             "exist. Create it or choose another prefix.")
        self._events: list[dict] = []
        self._lock = threading.Lock()
        self._t0 = time.perf_counter_ns()
        self.start_time_ns = time.time_ns()  # onnxruntime's get_profiling_start_time_ns: since the epoch
        self._pid = os.getpid()
        self.extra_args: dict[str, Any] = {}
        self.ep_hooks: list = []  # bound Ep.profiling_step_args of the session's EPs that override it
        self._ep_profilers: dict[int, tuple[str, Any]] = {}  # id(ep) -> (EP name, its EpProfiler)

    def attach_ep_profilers(self, eps: Any) -> None:
        """Ask each EP for an ``EpProfiler`` (``Ep.create_profiler``, once per EP) and start it; their
        events join the trace in ``end``."""
        for ep in eps:
            if id(ep) in self._ep_profilers:
                continue
            profiler = ep.create_profiler()
            self._ep_profilers[id(ep)] = (ep.name, profiler)
            if profiler is not None:
                profiler.start_profiling(self._t0)

    def _us(self, ns: int) -> float:
        return (ns - self._t0) / 1000.0

    def event(self, name: str, cat: str, start_ns: int, end_ns: int, args: dict | None = None) -> None:
        ev = {"cat": cat, "pid": self._pid, "tid": threading.get_ident() % 100000, "dur": (end_ns - start_ns) / 1000.0,
              "ts": self._us(start_ns), "ph": "X", "name": name, "args": args or {}}
        with self._lock:
            self._events.append(ev)

    def record_step(self, step: Any, start_ns: int, end_ns: int, inputs: list, outputs: list) -> None:
        node = step.node
        if node is not None:
            args = {"op_name": node.op_type, "provider": step.ep_name,
                    "input_type_shape": _type_shape(inputs), "output_type_shape": _type_shape(outputs)}
            name = f"{node.name or node.op_type}_kernel_time"
        else:
            args = {"op_name": "MemcpyTransfer", "provider": "", "input_type_shape": _type_shape(inputs),
                    "output_type_shape": _type_shape(outputs)}
            name = step.label
        for ep_hook in self.ep_hooks:  # EPs add their own figures (hal.Ep.profiling_step_args)
            if node is None or ep_hook.__self__.name == step.ep_name:
                args.update(ep_hook(node, step.ep_name, inputs, outputs))
        hook = self.extra_args.get("step_hook")
        if hook is not None:
            args.update(hook(step, inputs, outputs))
        self.event(name, "Node", start_ns, end_ns, args)

    def end(self) -> str:
        now = datetime.now()
        path = f"{self.prefix}_{now.strftime('%Y-%m-%d_%H-%M-%S')}_{now.microsecond // 1000:03d}.json"
        with self._lock:
            events = list(self._events)
        for ep_name, profiler in self._ep_profilers.values():
            if profiler is None:
                continue
            for e in profiler.end_profiling():
                if not isinstance(e, dict) or not {"name", "ts", "dur"} <= set(e):
                    raise Fail(f"{ep_name}: its EpProfiler.end_profiling() returned {e!r}; each event must be a "
                               "dict with name, ts and dur (microseconds since start_profiling)")
                events.append({"cat": "Node", "pid": self._pid, "tid": 0, "ph": "X", "args": {}, **e})
        try:
            with open(path, "w") as f:
                # one event per line, as onnxruntime writes its profiles (tools grep them by line)
                f.write("[\n" + ",\n".join(json.dumps(e) for e in events) + "\n]\n")
        except OSError as e:
            raise Fail(f"the profile could not be written to {path!r} (SessionOptions.profile_file_prefix "
                       f"{self.prefix!r}): {e}") from e
        return path
