"""A hal EP's streams as onnxruntime's: OrtSyncStreamImpl and OrtSyncNotificationImpl.

A factory that says ``is_stream_aware()`` (the simulated devices on OpenCL: one in-order command
queue per stream) is stream aware to onnxruntime too, for the device memory the bridge declares
(device_memory.py). onnxruntime then asks for a stream per session device
(``OrtEp::CreateSyncStreamForDevice``, else the factory's), queues its copies on it
(``OrtDataTransferImpl::CopyTensors`` gets the streams), hands it to each partition run (the
kernel context's compute stream becomes ``hal.KernelContext.stream``) and orders work between
streams, and between a stream and the host, with notifications (``Activate`` on the producer,
``WaitOnDevice`` / ``WaitOnHost`` for the consumer). Nothing in the bridge waits for the device:
copies and kernels are enqueued and onnxruntime's notifications do the waiting.

The structs and their members arrived with onnxruntime 1.23 (API 23, ``onnxruntime_ep_c_api.h``),
the first version the bridge runs on, so every supported onnxruntime gets them. The stream's native
handle (``GetHandle``) is the adapter's own address: onnxruntime passes it back as the kernel
context's compute stream and as a consumer stream's handle (``OrtApi::SyncStream_GetHandle``),
which is how the bridge finds the hal stream again.

A session's stream (``OrtEp::CreateSyncStreamForDevice``) is made in bridge.c without Python,
because onnxruntime asks for it holding a mutex that a thread holding the GIL may wait for (see
bridge.c, "Session streams"); its hal stream is made here at the first call that needs it
(``lazy_session_stream``).
"""

from __future__ import annotations

import ctypes
import threading
from ctypes import c_int64, c_uint32, c_void_p
from typing import TYPE_CHECKING, Any

from onnxhal.hal.enums import OrtDeviceMemoryType, OrtMemoryInfoDeviceType
from onnxhal.hal.errors import InvalidArgument
from onnxhal.hal.memory_info import OrtMemoryDevice
from onnxhal.hal.sync_stream import SyncNotification, SyncStream
from onnxhal.ort_plugin import device_memory
from onnxhal.ort_plugin import dispatch as d
from onnxhal.ort_plugin.structs import write_out

if TYPE_CHECKING:
    from onnxhal.ort_plugin.adapter import EpAdapter, FactoryAdapter
    from onnxhal.ort_plugin.ort_api import OrtApi

#: API version of OrtSyncStreamImpl / OrtSyncNotificationImpl (both complete since 1.23).
STREAM_VERSION = 23

StreamStruct = type("OrtSyncStreamImpl", (ctypes.Structure,), {"_fields_": [
    ("ort_version_supported", c_uint32), ("Release", c_void_p), ("GetHandle", c_void_p),
    ("CreateNotification", c_void_p), ("Flush", c_void_p), ("OnSessionRunEnd", c_void_p)]})
NotificationStruct = type("OrtSyncNotificationImpl", (ctypes.Structure,), {"_fields_": [
    ("ort_version_supported", c_uint32), ("Release", c_void_p), ("Activate", c_void_p),
    ("WaitOnDevice", c_void_p), ("WaitOnHost", c_void_p)]})


class StreamAdapter:
    """One hal ``SyncStream`` as an OrtSyncStreamImpl."""

    def __init__(self, api: OrtApi, stream: SyncStream, ep: EpAdapter | None = None, address: int = 0) -> None:
        """``address``: the struct bridge.c made for a session stream (none made here then)."""
        self.api = api
        self.stream = stream
        self.ep = ep  # the session EP whose runs use it (None: a factory stream outside sessions)
        if ep is not None:
            ep.session_streams.add(self)
        self.struct = None if address else StreamStruct(
            STREAM_VERSION, d.trampoline("s_release"), d.trampoline("s_get_handle"),
            d.trampoline("s_create_notification"), d.trampoline("s_flush"), d.trampoline("s_on_session_run_end"))
        self.address = address or ctypes.addressof(self.struct)
        d.objects[self.address] = self

    def drain(self) -> None:
        """Submit the stream's work and wait until it is done (a notification of the bridge's own)."""
        self.stream.flush()
        done = self.stream.create_notification()
        done.activate()
        done.wait_on_host()

    def flush(self) -> None:
        """OrtSyncStreamImpl::Flush, which onnxruntime's header defines as "ensuring that all
        operations submitted to the stream are completed" (its CUDA stream synchronizes there): hal's
        ``flush`` only submits, so the bridge also waits."""
        self.drain()
        if self.ep is not None and self.ep.interrupt_at_flush:
            # onnxruntime flushes the session's stream after OnRunEnd: Ctrl-C pressed during the run
            # is raised again once this, the run's last callback, is back in C (interrupts.py)
            self.ep.interrupt_at_flush = False
            d.interrupt_after_call()

    def create_notification(self, args: Any) -> None:
        write_out(args[0], NotificationAdapter(self.api, self.stream.create_notification()).address)

    def release(self) -> None:
        if d.objects.pop(self.address, None) is not None and self.ep is not None:
            self.ep.session_streams.discard(self)


def drain_session_streams(ep: EpAdapter) -> None:
    """At OnRunEnd, before the hal Ep's ``on_run_end``: the run's queued work is done, as it is
    when onnxhal's own session calls that hook (the simulators read their fp16 overflow flags
    there, on another queue). onnxruntime flushes the stream right after anyway."""
    for stream in list(ep.session_streams):
        stream.drain()


def interrupt_after_run(ep: EpAdapter) -> None:
    """Ctrl-C was pressed during a run of ``ep``'s session (OnRunEnd): raise it again after the run's
    last callback, which is the stream's Flush where onnxruntime gave the session a stream of this
    bridge (it calls that after OnRunEnd), else OnRunEnd itself."""
    if ep.session_streams:
        ep.interrupt_at_flush = True
    else:
        d.interrupt_after_call()


class NotificationAdapter:
    """One hal ``SyncNotification`` as an OrtSyncNotificationImpl."""

    def __init__(self, api: OrtApi, notification: SyncNotification) -> None:
        self.api = api
        self.notification = notification
        self.struct = NotificationStruct(STREAM_VERSION, d.trampoline("n_release"), d.trampoline("n_activate"),
                                         d.trampoline("n_wait_on_device"), d.trampoline("n_wait_on_host"))
        self.address = ctypes.addressof(self.struct)
        d.objects[self.address] = self

    def wait_on_device(self, args: Any) -> None:
        # a consumer that is no stream of this bridge (onnxruntime's CPU stream, ...): the hal
        # notification waits on the host for it
        self.notification.wait_on_device(hal_stream(self.api, args[0]))

    def release(self) -> None:
        d.objects.pop(self.address, None)


def stream_of_handle(handle: int | None) -> SyncStream | None:
    """The hal stream behind a native handle onnxruntime got from ``GetHandle`` (None: not ours)."""
    adapter = (d.objects.get(handle) or lazy_session_stream(handle)) if handle else None
    return adapter.stream if isinstance(adapter, StreamAdapter) else None


def hal_stream(api: OrtApi, ort_sync_stream: int | None) -> SyncStream | None:
    """The hal stream of one of onnxruntime's ``OrtSyncStream*`` (None: a null or foreign stream)."""
    if not ort_sync_stream:
        return None
    return stream_of_handle(api.ort["SyncStream_GetHandle"](ort_sync_stream))


def is_stream_aware(factory: FactoryAdapter) -> bool:
    """OrtEpFactory::IsStreamAware: the hal factory's answer, where onnxruntime sees its memory (with
    host memory only the bridge copies inside each run and a stream would order nothing)."""
    return factory.declare_memory and bool(factory.factory.is_stream_aware())


def _declared_device(factory: FactoryAdapter, ort_memory_device: int) -> Any:
    device = device_memory.memory_device_of(factory.api, ort_memory_device)
    return device if device in factory.memory_infos else None


def create_factory_stream(factory: FactoryAdapter, args: Any) -> None:
    """OrtEpFactory::CreateSyncStreamForDevice (memory device, options, out): used outside sessions
    (``ep_device.create_sync_stream()``) and for sessions whose EP makes none of its own."""
    device = _declared_device(factory, args[0])
    if device is None or not is_stream_aware(factory):
        return  # NULL: no stream for memory the bridge did not declare
    options = factory.api.read_pairs(args[1]) if args[1] else None
    stream = factory.factory.create_sync_stream_for_device(device, options)
    if stream is not None:
        write_out(args[2], StreamAdapter(factory.api, stream).address)


_GETTERS = ("MemoryDevice_GetDeviceType", "MemoryDevice_GetMemoryType", "MemoryDevice_GetVendorId",
            "MemoryDevice_GetDeviceId")
_lazy_lock = threading.Lock()


def register_session_streams(ep: EpAdapter) -> None:
    """Tell bridge.c which memory devices ``ep`` gives onnxruntime a stream for (none: unregister)."""
    lib = d.library()
    getters = [ctypes.cast(ep.api.ep[name], c_void_p) for name in _GETTERS]
    lib.onnxhal_bridge_set_memory_device_getters(*getters)
    rows = [(int(m.device_type), int(m.memory_type), int(m.vendor_id), int(m.device_id)) for m in ep.stream_devices]
    words = (c_int64 * (4 * max(len(rows), 1)))(*[w for row in rows for w in row])
    if lib.onnxhal_bridge_set_stream_devices(ep.address, words, len(rows)) != 0:
        raise InvalidArgument(f"onnxhal's bridge cannot keep {len(rows)} stream devices for one EP")


def unregister_session_streams(ep: EpAdapter) -> None:
    d.library().onnxhal_bridge_set_stream_devices(ep.address, None, 0)


def lazy_session_stream(address: int) -> StreamAdapter | None:
    """The adapter of a session stream bridge.c made (OrtEp::CreateSyncStreamForDevice), its hal
    stream made now: the hal Ep's, else the factory's. None: no such stream."""
    ep_address, device_words = c_void_p(), (c_int64 * 4)()
    with _lazy_lock:
        found = d.objects.get(address)
        if found is not None:
            return found
        if not d.library().onnxhal_bridge_lazy_stream(address, ctypes.byref(ep_address), device_words):
            return None
        ep = d.objects.get(ep_address.value)
        if ep is None:
            raise InvalidArgument("onnxhal: a session stream outlived its EP")
        device = OrtMemoryDevice(device_type=OrtMemoryInfoDeviceType(device_words[0]),
                                 memory_type=OrtDeviceMemoryType(device_words[1]),
                                 vendor_id=int(device_words[2]), device_id=int(device_words[3]))
        stream = ep.ep.create_sync_stream_for_device(device)
        if stream is None:
            stream = ep.factory.factory.create_sync_stream_for_device(device, None)
        if stream is None:
            # bridge.c gives streams only for stream_devices, where a stream aware factory makes one
            raise InvalidArgument(f"onnxhal: {ep.ep.name} made no stream for {device}, whose memory it declared "
                                  "stream aware")
        return StreamAdapter(ep.factory.api, stream, ep, address)


d.HANDLERS.update({
    d.F_IS_STREAM_AWARE: lambda f, a: int(is_stream_aware(f)),
    d.F_CREATE_SYNC_STREAM: create_factory_stream,
    d.S_RELEASE: lambda s, a: s.release() if s is not None else None,
    d.S_CREATE_NOTIFICATION: lambda s, a: s.create_notification(a),
    d.S_FLUSH: lambda s, a: s.flush(),
    d.S_ON_SESSION_RUN_END: lambda s, a: s.stream.on_session_run_end(),
    d.N_RELEASE: lambda n, a: n.release() if n is not None else None,
    d.N_ACTIVATE: lambda n, a: n.notification.activate(),
    d.N_WAIT_ON_DEVICE: lambda n, a: n.wait_on_device(a),
    d.N_WAIT_ON_HOST: lambda n, a: n.notification.wait_on_host(),
})

# a session stream's first call that needs its hal stream (Release of one never used needs none)
d.resolvers.update({call: lazy_session_stream for call in (d.S_CREATE_NOTIFICATION, d.S_FLUSH, d.S_ON_SESSION_RUN_END)})
