"""Per-session memory context: where each EP's values live and how values move between them.

ORT's rules: an EP's values live in the DEFAULT memory of its EP devices (host memory when it
declared none); a value read on another memory device is copied through a data transfer that
``can_copy`` that pair. Copies from the host are queued on the destination's stream, copies to the
host on the source's stream followed by a host wait (the only place the host waits besides the end
of a run), device-to-device copies on the source stream with a notification the destination
stream waits on.

Held uploads: inside a session's run (``run_begin`` / ``run_end``), a feed's copy from the host
(the caller's array; not a subgraph run's feeds, which are values of the run) is not waited for
where the data transfer can hold it (``DataTransfer.copy_tensors_held``): the run keeps the copy's
handle, which keeps the host array alive, and the run never writes its feeds, so the in-order
stream orders the copy before the kernels that read it. The next copy to the host on that stream
waits for it too (same queue, in order), and the end of the run waits for any still held, so a
caller may change its feed arrays once ``run`` returns. Only the session's own runs hold copies;
``DataTransfer.copy_tensors`` (onnxruntime's callers, the plugin bridge) still waits for each.
Session config ``session.onnxhal.held_copies`` = "0" waits for every copy (the previous path).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from onnxhal.hal import (
    NEXT_POWER_OF_TWO,
    Allocator,
    ArenaAllocator,
    DataTransfer,
    DeviceTensor,
    Ep,
    EpFactory,
    OrtAllocatorType,
    OrtEpDevice,
    SyncStream,
)
from onnxhal.hal.data_transfer import HeldCopies
from onnxhal.hal.enums import OrtDeviceMemoryType
from onnxhal.hal.errors import Fail, InvalidArgument
from onnxhal.hal.memory_info import CPU_MEMORY_INFO, HOST_MEMORY_DEVICE, OrtMemoryDevice, OrtMemoryInfo
from onnxhal.runtime.env.shared_memory import registered_allocator


def _maybe_arena(ep_name: str, alloc: Allocator, info: OrtMemoryInfo, options: dict[str, str]) -> Allocator:
    strategy = options.get("arena_extend_strategy")
    if strategy is None:
        if info.allocator_type != OrtAllocatorType.ORT_ARENA_ALLOCATOR:
            return alloc
        strategy = NEXT_POWER_OF_TWO
    if strategy.lower() == "none":
        return alloc
    try:
        limit = int(options.get("arena_memory_limit", "0"))
    except ValueError:
        raise InvalidArgument(f"{ep_name}: provider option arena_memory_limit must be a byte count, got "
                              f"{options['arena_memory_limit']!r}") from None
    return ArenaAllocator(alloc, strategy, limit)


def memory_device_of(value: Any) -> OrtMemoryDevice:
    if isinstance(value, DeviceTensor):
        return value.memory_info.memory_device
    return HOST_MEMORY_DEVICE


HELD_COPIES = "session.onnxhal.held_copies"
#: Session config: "1" (default) has a prepared run's held uploads and downloads made by the data
#: transfer's ``held_copier`` for their pair of devices, found once; "0" by ``copy_tensors_held``
#: at each copy (the previous path, for A/B).
PAIR_COPIERS = "session.onnxhal.pair_copiers"


class _RunCopies(threading.local):
    """This thread's run: its nesting depth (a subgraph's run inside it) and the copies it holds."""

    def __init__(self) -> None:
        self.depth = 0
        self.held: list[tuple[SyncStream, HeldCopies]] = []


class MemoryContext:
    """``use_env_allocators``: take the allocator the application registered with
    ``create_and_register_allocator(_v2)`` for a device, where there is one, instead of the EP's
    (onnxruntime's ``session.use_env_allocators``). ``held_copies``: a run's copies from the host
    are not waited for one by one (the module's docstring). ``pair_copiers``: the uploads and
    downloads of ``uploader`` and ``downloader`` through the data transfer's ``held_copier``."""

    def __init__(self, use_env_allocators: bool = False, held_copies: bool = True, pair_copiers: bool = True) -> None:
        self._use_env_allocators = use_env_allocators
        self._held_copies = held_copies
        self._pair_copiers = pair_copiers
        self._run = _RunCopies()
        self._ep_device: dict[str, OrtMemoryDevice] = {}
        self._ep_info: dict[str, OrtMemoryInfo] = {}
        self._infos: dict[OrtMemoryDevice, OrtMemoryInfo] = {}
        self._allocators: dict[OrtMemoryDevice, Allocator] = {}
        self._transfers: list[DataTransfer] = []
        self._transfer_cache: dict[tuple[OrtMemoryDevice, OrtMemoryDevice], DataTransfer] = {}
        self._streams: dict[OrtMemoryDevice, SyncStream] = {}
        self._lock = threading.Lock()
        self.any_streams = False

    def add_ep(self, ep_name: str, ep: Ep, factory: EpFactory, devices: list[OrtEpDevice],
               options: dict[str, str] | None = None) -> None:
        """Record an EP's memory device, allocator, data transfer and stream. ``options`` are the
        EP's provider options: ``arena_extend_strategy`` (kNextPowerOfTwo, kSameAsRequested or
        none) and ``arena_memory_limit`` (bytes) put an arena over the device allocator."""
        options = options or {}
        chosen = ep.get_default_memory_device()
        if chosen is not None:  # the EP names its memory (onnxruntime's OrtEp::GetDefaultMemoryDevice)
            info = next((m for d in devices for m in d.memory_infos() if m.memory_device == chosen), None)
            if info is None and not chosen.is_host:
                declared = sorted({str(m.memory_device) for d in devices for m in d.memory_infos()})
                raise Fail(f"{ep_name}.get_default_memory_device() returned {chosen}, which its EP devices do not "
                           f"declare (they declare {declared or 'none'}); add it with ep_device_add_allocator_info")
        else:
            info = devices[0].memory_info(OrtDeviceMemoryType.DEFAULT) if devices else None
        if info is None or info.is_host:
            self._ep_device[ep_name] = HOST_MEMORY_DEVICE
        else:
            for d in devices[1:] if chosen is None else ():
                other = d.memory_info(OrtDeviceMemoryType.DEFAULT)
                if other is None or other.memory_device != info.memory_device:
                    raise Fail(f"{ep_name}: the selected EP devices declare different DEFAULT memory "
                               f"({info.memory_device} vs {other.memory_device if other else 'host'}); "
                               "select devices that share memory, or one device")
            dev = info.memory_device
            self._ep_device[ep_name] = dev
            self._ep_info[ep_name] = info
            self._infos[dev] = info
            env_alloc = registered_allocator(dev) if self._use_env_allocators else None
            if env_alloc is not None:
                self._allocators[dev] = env_alloc
            if dev not in self._allocators:
                alloc = ep.create_allocator(info) or factory.create_allocator(info)
                if alloc is None:
                    raise Fail(f"{ep_name} declares device memory {info.name!r} but neither the EP nor its factory "
                               "creates an allocator for it")
                self._allocators[dev] = _maybe_arena(ep_name, alloc, info, options)
            if dev not in self._streams:
                stream = ep.create_sync_stream_for_device(dev)
                if stream is None and factory.is_stream_aware():
                    stream = factory.create_sync_stream_for_device(dev, None)
                if stream is not None:
                    self._streams[dev] = stream
                    self.any_streams = True
        transfer = ep.create_data_transfer()
        if transfer is None:
            transfer = factory.create_data_transfer()
        if transfer is not None:
            self._transfers.append(transfer)

    def device_of_ep(self, ep_name: str) -> OrtMemoryDevice:
        return self._ep_device.get(ep_name, HOST_MEMORY_DEVICE)

    def memory_info_of_ep(self, ep_name: str) -> OrtMemoryInfo | None:
        return self._ep_info.get(ep_name)

    def memory_info_of_device(self, dev: OrtMemoryDevice) -> OrtMemoryInfo:
        return CPU_MEMORY_INFO if dev.is_host else self._infos[dev]

    def stream_for_ep(self, ep_name: str) -> SyncStream | None:
        return self._streams.get(self.device_of_ep(ep_name))

    def allocator(self, dev: OrtMemoryDevice) -> Allocator | None:
        return self._allocators.get(dev)

    def allocators(self) -> dict[OrtMemoryDevice, Allocator]:
        return dict(self._allocators)

    def _transfer_for(self, src: OrtMemoryDevice, dst: OrtMemoryDevice) -> DataTransfer:
        key = (src, dst)
        t = self._transfer_cache.get(key)
        if t is None:
            t = next((t for t in self._transfers if t.can_copy(src, dst)), None)
            if t is None:
                raise Fail(f"Data transfer implementation between {src} and {dst} not found: no EP of this session "
                           "registered a DataTransfer that can copy between them.")
            self._transfer_cache[key] = t
        return t

    def empty_like_on(self, value: Any, dst: OrtMemoryDevice) -> Any:
        if dst.is_host:
            return np.empty(value.shape, dtype=value.dtype)
        alloc = self._allocators.get(dst)
        if alloc is None:
            raise Fail(f"no allocator for memory device {dst} in this session")
        return DeviceTensor.allocate(value.shape, value.dtype, alloc)

    def transfer(self, value: Any, dst: OrtMemoryDevice, _stream: SyncStream | None, hold: bool = False) -> Any:
        """Copy ``value`` to ``dst`` (synchronously visible to the consumer's stream or the host).
        ``hold``: a copy from the host inside a run may be held (the caller's array, which nothing
        in the run writes: a feed; values computed during the run are copied and waited for)."""
        src = memory_device_of(value)
        if src == dst or value is None:
            return value
        if isinstance(value, np.generic):  # a numpy scalar from a kernel: a 0-d tensor
            value = np.asarray(value)
        if not isinstance(value, (np.ndarray, DeviceTensor)):
            raise Fail(f"cannot copy a {type(value).__name__} value to {dst}: only tensors move between devices")
        if isinstance(value, np.ndarray) and not value.flags.c_contiguous:
            value = np.ascontiguousarray(value)
        out = self.empty_like_on(value, dst)
        transfer = self._transfer_for(src, dst)
        if src.is_host:  # host -> device: on the destination stream, ordered before its kernels
            stream = self._streams.get(dst)
            run = self._run
            if hold and stream is not None and run.depth and self._held_copies:
                held = transfer.copy_tensors_held([value], [out], [stream])
                if held is not None:
                    run.held.append((stream, held))
            else:
                transfer.copy_tensors([value], [out], [stream])
        elif dst.is_host:  # device -> host: on the source stream, then the host must wait
            stream = self._streams.get(src)
            held = (transfer.copy_tensors_held([value], [out], [stream])
                    if stream is not None and self._held_copies else None)
            if held is not None:  # wait for the copy itself: no marker to queue and wait on
                held.wait()
                run = self._run
                if run.held:  # the in-order stream ran the copies held before this one too
                    run.held = [h for h in run.held if h[0] is not stream]
                return out
            transfer.copy_tensors([value], [out], [stream])
            if stream is not None:
                note = stream.create_notification()
                note.activate()
                note.wait_on_host()
        else:
            s_src, s_dst = self._streams.get(src), self._streams.get(dst)
            transfer.copy_tensors([value], [out], [s_src])
            if s_src is not None and s_dst is not None and s_src is not s_dst:
                note = s_src.create_notification()
                note.activate()
                note.wait_on_device(s_dst)
            elif s_src is not None and s_dst is None:
                note = s_src.create_notification()
                note.activate()
                note.wait_on_host()
        return out

    def uploader(self, dst: OrtMemoryDevice) -> Callable[[np.ndarray, bool], DeviceTensor]:
        """``transfer(value, dst, None, hold)`` for a host array ``value``, with what ``transfer``
        looks up at each call (the data transfer, ``dst``'s stream and allocator) found once: the
        feed uploads of a prepared run (runtime/session/run_codegen.py)."""
        transfer = self._transfer_for(HOST_MEMORY_DEVICE, dst)
        alloc = self._allocators.get(dst)
        if alloc is None:
            raise Fail(f"no allocator for memory device {dst} in this session")
        stream = self._streams.get(dst)
        streams = [stream]
        holds = stream is not None and self._held_copies
        run = self._run
        copier = transfer.held_copier(HOST_MEMORY_DEVICE, dst, stream) if holds and self._pair_copiers else None

        def upload(value: np.ndarray, hold: bool) -> DeviceTensor:
            if not value.flags.c_contiguous:
                value = np.ascontiguousarray(value)
            out = DeviceTensor.allocate(value.shape, value.dtype, alloc)
            if hold and holds and run.depth:
                held = copier(value, out) if copier is not None else transfer.copy_tensors_held([value], [out], streams)
                if held is not None:
                    run.held.append((stream, held))
            else:
                transfer.copy_tensors([value], [out], streams)
            return out
        return upload

    def downloader(self, src: OrtMemoryDevice) -> Callable[[Any], Any]:
        """``transfer(value, host, None)`` for a value produced on ``src``, its look-ups done once:
        the output downloads of a prepared run. A value not on ``src`` takes ``transfer``."""
        transfer = self._transfer_for(src, HOST_MEMORY_DEVICE)
        stream = self._streams.get(src)
        if stream is None or not self._held_copies:
            return functools.partial(self.transfer, dst=HOST_MEMORY_DEVICE, _stream=None)
        streams = [stream]
        run = self._run
        slow = self.transfer
        copier = transfer.held_copier(src, HOST_MEMORY_DEVICE, stream) if self._pair_copiers else None

        def download(value: Any) -> Any:
            if value.__class__ is not DeviceTensor or value.memory_info.memory_device != src:
                return slow(value, HOST_MEMORY_DEVICE, None)
            out = np.empty(value.shape, value.dtype)
            held = copier(value, out) if copier is not None else transfer.copy_tensors_held([value], [out], streams)
            if held is None:  # the transfer holds nothing: as ``transfer``, a marker waited for
                note = stream.create_notification()
                note.activate()
                note.wait_on_host()
                return out
            held.wait()
            if run.held:  # the in-order stream ran the copies held before this one too
                run.held = [h for h in run.held if h[0] is not stream]
            return out
        return download

    def copy_step(self, src: OrtMemoryDevice, dst: OrtMemoryDevice) -> Callable[[list], list]:
        self._transfer_for(src, dst)  # fail at session creation, not at run time

        def copy(inputs: list, _dst=dst) -> list:
            return [self.transfer(inputs[0], _dst, None)]

        return copy

    def run_begin(self) -> bool:
        """A run starts on this thread: copies from the host may be held until ``run_end``. True
        for the outermost run (not a subgraph's run inside another)."""
        run = self._run
        run.depth += 1
        return run.depth == 1

    def run_end(self) -> None:
        """The run that ``run_begin`` started ends (also on an error): the outermost run waits for
        the copies it still holds, so the caller may change its arrays afterwards."""
        run = self._run
        run.depth -= 1
        if run.depth == 0 and run.held:
            held, run.held = run.held, []
            for _, h in held:
                h.wait()

    def end_of_run(self) -> None:
        for s in self._streams.values():
            s.on_session_run_end()

    def synchronize(self) -> None:
        for s in self._streams.values():
            note = s.create_notification()
            note.activate()
            note.wait_on_host()
