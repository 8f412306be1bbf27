"""Graph capture through the bridge: onnxruntime's ``OrtEp`` graph-capture members (API 26 on) to the
hal Ep's hooks, and the output destinations of a capture run.

onnxruntime (``InferenceSession::Run``, 1.26 on: microsoft/onnxruntime#27958) asks the session's EPs
``IsGraphCaptureEnabled`` once the session is built; a run of a graph (run config entry
``gpu_graph_id``, 0 unless set, -1 opts out) the EP has captured (``IsGraphCaptured``) is
``ReplayGraph`` alone: no ``OnRunStart``, no ``Compute``, no ``OnRunEnd``, no copies, so the fetches
keep the buffers of the run that captured. The bridge therefore gives each ``Compute`` of a capture
run its outputs' destinations (``hal.KernelContext.destinations``): onnxruntime's output tensors,
asked for before the EP computes (with the fused node's static output shapes), which the EP writes
and keeps for its replays. Bound with IOBinding, they are the application's buffers.
"""

from __future__ import annotations

import ctypes
import threading
from ctypes import c_void_p
from typing import TYPE_CHECKING, Any

from onnxhal.hal.ep import Ep
from onnxhal.hal.errors import InvalidArgument
from onnxhal.hal.tensor import DeviceTensor
from onnxhal.ort_plugin import dispatch as d
from onnxhal.ort_plugin import tensors
from onnxhal.ort_plugin.device_memory import address_space, host_or_device
from onnxhal.runtime.session.graph_capture import GRAPH_ID_KEY, SKIP, captures_graphs, graph_annotation_id

if TYPE_CHECKING:
    from onnxhal.ort_plugin.adapter import EpAdapter
    from onnxhal.ort_plugin.compute import ComputeAdapter
    from onnxhal.ort_plugin.ort_api import OrtApi

#: OrtEp members of graph capture and their bridge.c trampolines.
TRAMPOLINES = {
    "IsGraphCaptureEnabled": "e_is_graph_capture_enabled", "IsGraphCaptured": "e_is_graph_captured",
    "ReplayGraph": "e_replay_graph", "GetGraphCaptureNodeAssignmentPolicy": "e_get_graph_capture_policy",
    "ReleaseCapturedGraph": "e_release_captured_graph",
}


def captures(ep: Ep) -> bool:
    """Whether the hal Ep overrides ``is_graph_capture_enabled``; the bridge leaves the members NULL
    for one that does not (onnxruntime's "does not capture")."""
    return captures_graphs(ep)


class RunOptionsView:
    """onnxruntime's ``OrtRunOptions`` during ``OnRunStart`` / ``OnRunEnd``, as the hal hooks read run
    options: ``config(key, default)`` and ``get_run_config_entry(key)`` (``OrtApi::GetRunConfigEntry``).
    onnxruntime's pointer is valid only during the call: after it the entries read as unset."""

    __slots__ = ("_api", "_address")

    def __init__(self, api: OrtApi, address: int) -> None:
        self._api = api
        self._address = address or None

    def config(self, key: str, default: str = "") -> str:
        if self._address is None or "GetRunConfigEntry" not in self._api.ort:
            return default
        value = self._api.ort["GetRunConfigEntry"](self._address, key.encode())
        return default if value is None else value.decode()

    def get_run_config_entry(self, key: str) -> str:
        value = self.config(key, "\0")
        if value == "\0":
            raise InvalidArgument(f"RunOptions does not have configuration with key: {key}")
        return value

    def end(self) -> None:
        self._address = None


class RunCapture(threading.local):
    """Whether the run on this thread captures, its graph id and the device buffers it read and wrote
    so far. onnxruntime calls a run's ``OnRunStart``, computes and ``OnRunEnd`` on the thread that
    runs it, and runs on other threads of the same session at the same time: this state is the
    run's, the captured graphs (``EpAdapter.capture_buffers``, the hal EP's) are the EP's."""

    def __init__(self) -> None:
        self.capturing = False
        self.gid = 0
        self.pending: list = []  # (what, address, buffer) of the device values of the capture run


def run_started(ep: EpAdapter, run_options: RunOptionsView) -> None:
    """At ``OnRunStart``: whether this run captures (the EP captures, the run's graph id is not -1 and
    not captured yet), so that its computes get destinations."""
    run = ep.run_capture
    run.capturing = False
    run.pending = []
    if ep.captures_graphs and ep.ep.is_graph_capture_enabled():
        gid = graph_annotation_id(run_options)
        run.capturing = gid != SKIP and not ep.ep.is_graph_captured(gid)
        run.gid = gid


def keep(ep: EpAdapter, what: str, ort_value: int, buffer: Any) -> None:
    """Note a device buffer a capture run reads or writes (by onnxruntime's data address), to check
    at each replay that onnxruntime still holds it."""
    ep.run_capture.pending.append((what, tensors.describe(ep.api, ort_value)[2], buffer))


def run_ended(ep: EpAdapter) -> None:
    """At ``OnRunEnd``: the buffers of a run the EP has now captured are kept for its replays (the
    first run to capture a graph id keeps it, as the EP keeps that run's capture)."""
    run = ep.run_capture
    if run.capturing and ep.ep.is_graph_captured(run.gid):
        ep.capture_buffers.setdefault(run.gid, run.pending)
    run.capturing, run.pending = False, []


def replay(ep: EpAdapter, graph_annotation_id: int) -> None:
    """``ReplayGraph``: the hal Ep's replay, once every device buffer of the capture run is still
    onnxruntime's: a value onnxruntime made for that run alone (an input or output not bound with
    IOBinding in the device's memory) is freed after it, and a replay would use a released buffer."""
    for what, address, buffer in ep.capture_buffers.get(graph_annotation_id, ()):
        found = address_space().find(address)
        if found is None or found[0] is not buffer:
            raise InvalidArgument(
                f"{ep.ep.name}: cannot replay graph {graph_annotation_id}: onnxruntime freed the device buffer of "
                f"{what} after the run that captured it; bind every input and output with IOBinding to OrtValues "
                "in the device's memory (ortvalue_from_shape_and_type(..., memory_info=ep_device.memory_info("
                f"DEFAULT))) before the capture run, or set the run option '{GRAPH_ID_KEY}' to '{SKIP}'")
    ep.ep.replay_graph(graph_annotation_id)


def release(ep: EpAdapter, graph_annotation_id: int) -> None:
    ep.capture_buffers.pop(graph_annotation_id, None)
    ep.ep.release_captured_graph(graph_annotation_id)


def destinations(compute: ComputeAdapter, kernel_context: int) -> list:
    """The output tensors of a capture run's fused node, asked of onnxruntime before the EP computes,
    with the fused node's output shapes, which must be static."""
    out: list = []
    value = c_void_p()
    for i, shape in enumerate(compute.output_shapes):
        if shape is None:
            name = compute.fused_node.outputs[i] if i < len(compute.fused_node.outputs) else f"#{i}"
            raise InvalidArgument(
                f"{compute.ep.ep.name}: graph capture needs static output shapes, and output {i} ({name!r}) of "
                f"{compute.fused_node.name!r} has none; fix the model's input shapes or set the run option "
                f"'{GRAPH_ID_KEY}' to '{SKIP}'")
        dims = (ctypes.c_int64 * len(shape))(*shape)
        compute.api.check(compute.get_output(kernel_context, i, dims, len(shape), ctypes.byref(value)),
                          "KernelContext_GetOutput")
        target = host_or_device(value.value, compute.api, f"output {i} of {compute.fused_node.name!r}")
        if isinstance(target, DeviceTensor):
            keep(compute.ep, compute.value_name("output", i), value.value, target.buffer)
        out.append(target)
    return out


def _graph_id(word: int) -> int:
    return ctypes.c_int64(word).value  # an int widened to a machine word in bridge.c


d.HANDLERS.update({
    d.G_IS_GRAPH_CAPTURE_ENABLED: lambda e, a: bool(e.ep.is_graph_capture_enabled()),
    d.G_IS_GRAPH_CAPTURED: lambda e, a: bool(e.ep.is_graph_captured(_graph_id(a[0]))),
    d.G_REPLAY_GRAPH: lambda e, a: replay(e, _graph_id(a[0])),
    d.G_GET_POLICY: lambda e, a: int(e.ep.get_graph_capture_node_assignment_policy()),
    d.G_RELEASE_CAPTURED_GRAPH: lambda e, a: release(e, _graph_id(a[0])),
})

