"""An EP library that records which of ``hal.Ep`` / ``hal.EpFactory``'s hooks onnxruntime calls.

One EP, ``HooksExecutionProvider``, on the CPU hardware device. It fuses every Add / Mul into one
partition computed in numpy, after a short sleep during which it counts the computes in flight
(``IN_FLIGHT_MAX``); while the session profiles, its ``EpProfiler`` records each compute. Provider options: ``concurrent`` ("0": the EP says it cannot take concurrent
runs), ``memory_device`` ("host" or "undeclared": what ``get_default_memory_device`` names). The factory reports the CPU incompatible (a driver problem) when ``INCOMPATIBLE`` is set.
``LOG`` records (hook, details) in call order.
"""

import threading
import time

import numpy as np

from onnxhal import hal

LOG: list = []
STATE = {"in_flight": 0, "in_flight_max": 0}
INCOMPATIBLE = {"reasons": 0, "notes": "", "code": 0}
_lock = threading.Lock()
_OPS = {"Add": np.add, "Mul": np.multiply}


class HooksProfiler(hal.EpProfiler):
    """Records one event per compute while the session profiles."""

    def __init__(self):
        self.t0 = None
        self.events = []

    def start_profiling(self, start_time_ns):
        self.t0 = start_time_ns

    def compute_done(self, start_ns, end_ns):
        if self.t0 is not None:
            self.events.append({"name": "hooks_compute", "cat": "Kernel", "ts": (start_ns - self.t0) / 1000,
                                "dur": (end_ns - start_ns) / 1000, "args": {"run": len(self.events)}})

    def end_profiling(self):
        events, self.events, self.t0 = self.events, [], None
        return events


class HooksCompute(hal.NodeComputeInfo):
    def __init__(self, graph, ep):
        self.ep = ep
        self.nodes = [(n.op_type, list(n.inputs), list(n.outputs)) for n in graph.nodes]
        self.inputs, self.outputs = graph.input_names, graph.output_names
        self.consts = dict(graph.initializers)

    def compute(self, state, ctx):
        start = time.perf_counter_ns()
        with _lock:
            STATE["in_flight"] += 1
            STATE["in_flight_max"] = max(STATE["in_flight_max"], STATE["in_flight"])
        try:
            time.sleep(0.05)  # long enough for concurrent runs to overlap here
            env = dict(self.consts)
            env.update(zip(self.inputs, ctx.inputs))
            for op, ins, outs in self.nodes:
                env[outs[0]] = _OPS[op](*[env[i] for i in ins]).astype(np.float32)
            for k, name in enumerate(self.outputs):
                ctx.set_output(k, env[name])
        finally:
            with _lock:
                STATE["in_flight"] -= 1
            if self.ep.profiler is not None:
                self.ep.profiler.compute_done(start, time.perf_counter_ns())


class HooksEp(hal.Ep):
    name = "HooksExecutionProvider"

    def __init__(self, concurrent: bool, memory_device: str = ""):
        self.concurrent = concurrent
        self.memory_device = memory_device
        self.profiler = None

    def get_capability(self, graph, support_info):
        mine = [n for n in graph.nodes if n.op_type in _OPS]
        if mine:
            support_info.add_nodes_to_fuse(mine)

    def compile(self, graphs, fused_nodes):
        LOG.append(("compile", len(graphs)))
        return [HooksCompute(g, self) for g in graphs]

    def get_default_memory_device(self):
        LOG.append(("get_default_memory_device", self.memory_device))
        if self.memory_device == "host":
            return hal.OrtMemoryDevice(device_type=hal.OrtMemoryInfoDeviceType.CPU,
                                       memory_type=hal.OrtDeviceMemoryType.DEFAULT, vendor_id=0, device_id=0)
        if self.memory_device == "undeclared":  # memory its EP device does not declare
            return hal.OrtMemoryDevice(device_type=hal.OrtMemoryInfoDeviceType.GPU,
                                       memory_type=hal.OrtDeviceMemoryType.DEFAULT, vendor_id=0x1234, device_id=1)
        return None

    def create_profiler(self):
        LOG.append(("create_profiler", None))
        self.profiler = HooksProfiler()
        return self.profiler

    def is_concurrent_run_supported(self):
        LOG.append(("is_concurrent_run_supported", self.concurrent))
        return self.concurrent

    def sync(self):
        LOG.append(("sync", None))

    def on_session_initialization_end(self):
        LOG.append(("on_session_initialization_end", None))

    def on_run_start(self, run_options):
        LOG.append(("on_run_start", None))

    def on_run_end(self, run_options, sync_stream):
        LOG.append(("on_run_end", sync_stream))


class HooksFactory(hal.EpFactory):
    name = "HooksExecutionProvider"
    vendor = "Example"
    version = "1.0.0"

    def __init__(self, api):
        self.api = api

    def get_supported_devices(self, hardware_devices):
        return [self.api.create_ep_device(self, d) for d in hardware_devices if d.type == hal.OrtHardwareDeviceType.CPU]

    def create_ep(self, devices, ep_metadata, session_options, logger):
        options = session_options.provider_options_for(self.name)
        return HooksEp(concurrent=options.get("concurrent", "1") != "0", memory_device=options.get("memory_device", ""))

    def get_hardware_device_incompatibility_details(self, device):
        LOG.append(("get_hardware_device_incompatibility_details", device.type.name))
        return INCOMPATIBLE["reasons"], INCOMPATIBLE["notes"], INCOMPATIBLE["code"]


def create_ep_factories(registration_name, api, logger):
    return [HooksFactory(api)]


def release_ep_factory(factory):
    pass
