"""DataTransfer: copies values between memory devices (ORT's OrtDataTransferImpl)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from onnxhal.hal.memory_info import OrtMemoryDevice
from onnxhal.hal.sync_stream import SyncStream


class DataTransfer:
    """A factory's data transfer. ``copy_tensors`` copies ``src[i]`` into the already allocated
    ``dst[i]`` (both tensors: numpy arrays in host memory, ``DeviceTensor`` elsewhere); when
    ``streams[i]`` is given the copy is queued on it and may still be running on return."""

    def can_copy(self, src_memory_device: OrtMemoryDevice, dst_memory_device: OrtMemoryDevice) -> bool:
        return False

    def copy_tensors(self, src: Sequence[object], dst: Sequence[object],
                     streams: Sequence[SyncStream | None] | None = None) -> None:
        raise NotImplementedError(f"{type(self).__name__} copies nothing")

    def copy_tensors_held(self, src: Sequence[object], dst: Sequence[object],
                          streams: Sequence[SyncStream | None]) -> HeldCopies | None:
        """``copy_tensors`` for a caller that orders its own use of the copies: the host arrays of
        copies queued on a stream may still be read or written by the device on return. Returns
        None when the copies are exactly ``copy_tensors``' (this default), else the copies' handle:
        it keeps their host arrays alive, ``wait()`` blocks until they are complete, and the caller
        must neither change nor read those host arrays until it has waited (onnxhal's own session
        run, runtime/session/memory_context.py; never onnxruntime's callers, which do not order
        their use after the stream)."""
        self.copy_tensors(src, dst, streams)
        return None

    def held_copier(self, src_memory_device: OrtMemoryDevice, dst_memory_device: OrtMemoryDevice,
                    stream: SyncStream) -> Callable[[object, object], HeldCopies] | None:
        """``copy_tensors_held([src], [dst], [stream])`` for one pair between these memory devices,
        with what it looks up per call (the queue of ``stream``, the kind of copy) found once: for a
        caller that makes such a copy at every run (onnxhal's prepared session run: a feed's upload,
        an output's download). The caller hands it a C-contiguous host array or a tensor of
        ``src_memory_device``, and a tensor it has just allocated with the same dtype and shape (a
        numpy array on the host, a ``DeviceTensor`` elsewhere). None (this default): the caller
        calls ``copy_tensors_held``."""
        return None


class HeldCopies(Protocol):
    """Copies queued on streams, their host arrays kept alive until they are complete."""

    def wait(self) -> None:
        """Block until the copies are complete (on an in-order stream: with everything queued before)."""
