"""DataTransfer: copies values between memory devices (ORT's OrtDataTransferImpl)."""

from __future__ import annotations

from collections.abc import Sequence

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
