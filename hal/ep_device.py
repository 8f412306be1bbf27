"""OrtEpDevice: the pairing of an EP factory with a hardware device it can run on."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from onnxhal.hal.enums import OrtAllocatorType, OrtDeviceMemoryType
from onnxhal.hal.errors import Fail, InvalidArgument
from onnxhal.hal.hardware_device import OrtHardwareDevice
from onnxhal.hal.memory_info import OrtMemoryInfo

if TYPE_CHECKING:
    from onnxhal.hal.ep import EpFactory
    from onnxhal.hal.sync_stream import SyncStream


class OrtEpDevice:
    """Created by a factory through ``api.create_ep_device``; owned by the runtime.

    Equality and hashing are by identity, as in ORT. ``ep_metadata`` and ``ep_options`` return
    copies, so callers cannot change what the runtime holds.
    """

    def __init__(self, factory: EpFactory, device: OrtHardwareDevice,
                 ep_metadata: Mapping[str, str] | None = None,
                 ep_options: Mapping[str, str] | None = None) -> None:
        if not isinstance(device, OrtHardwareDevice):
            raise InvalidArgument(f"create_ep_device: device must be an OrtHardwareDevice, got {type(device).__name__}")
        self._factory = factory
        self._device = device
        self._ep_metadata = {str(k): str(v) for k, v in (ep_metadata or {}).items()}
        self._ep_options = {str(k): str(v) for k, v in (ep_options or {}).items()}
        # Slots as EpDevice_AddAllocatorInfo: (allocator type, device memory type) -> info.
        self._memory_infos: dict[tuple[OrtAllocatorType, OrtDeviceMemoryType], OrtMemoryInfo] = {}
        self.library_name = ""  # registration name of the library that made it, set by the registry

    @property
    def ep_name(self) -> str:
        return self._factory.name

    @property
    def ep_vendor(self) -> str:
        return self._factory.vendor

    @property
    def ep_metadata(self) -> dict[str, str]:
        return dict(self._ep_metadata)

    def add_ep_metadata(self, entries: Mapping[str, str]) -> None:
        """Add or replace metadata entries. The EP library registry adds ``version`` and
        ``library_path`` to every EP device it registers, as onnxruntime does."""
        self._ep_metadata.update({str(k): str(v) for k, v in entries.items()})

    @property
    def ep_options(self) -> dict[str, str]:
        return dict(self._ep_options)

    @property
    def device(self) -> OrtHardwareDevice:
        return self._device

    @property
    def factory(self) -> EpFactory:
        return self._factory

    def memory_info(self, memory_type: OrtDeviceMemoryType) -> OrtMemoryInfo | None:
        """The memory info declared for ``memory_type``; None means the EP uses CPU memory."""
        key = (OrtAllocatorType.ORT_DEVICE_ALLOCATOR, OrtDeviceMemoryType(memory_type))
        return self._memory_infos.get(key)

    def read_only_memory_info(self) -> OrtMemoryInfo | None:
        return self._memory_infos.get((OrtAllocatorType.ORT_READ_ONLY_ALLOCATOR, OrtDeviceMemoryType.DEFAULT))

    def memory_infos(self) -> list[OrtMemoryInfo]:
        return list(self._memory_infos.values())

    def add_allocator_info(self, info: OrtMemoryInfo) -> None:
        """Declare a memory this EP device allocates (``EpApi.ep_device_add_allocator_info``)."""
        alloc_type = info.allocator_type
        if alloc_type == OrtAllocatorType.ORT_ARENA_ALLOCATOR:
            alloc_type = OrtAllocatorType.ORT_DEVICE_ALLOCATOR
        if alloc_type == OrtAllocatorType.ORT_READ_ONLY_ALLOCATOR and info.device_mem_type != OrtDeviceMemoryType.DEFAULT:
            raise InvalidArgument("a read-only allocator info must describe DEFAULT device memory")
        self._memory_infos[(alloc_type, info.device_mem_type)] = info

    def create_sync_stream(self) -> SyncStream:
        """A stream on this device (ORT's ``CreateSyncStreamForEpDevice``)."""
        info = self.memory_info(OrtDeviceMemoryType.DEFAULT)
        if info is None or info.is_host:
            raise Fail(f"EP device {self.ep_name} on {self._device.type.name}: ep_device does not use "
                       "DEFAULT memory of a non-CPU device.")
        if not self._factory.is_stream_aware():
            raise Fail(f"{self.ep_name} is not stream aware: it creates no sync streams")
        stream = self._factory.create_sync_stream_for_device(info.memory_device, None)
        if stream is None:
            raise Fail(f"{self.ep_name}.create_sync_stream_for_device returned None")
        return stream

    def to_dict(self) -> dict:
        return {"ep_name": self.ep_name, "ep_vendor": self.ep_vendor,
                "ep_metadata": self.ep_metadata, "ep_options": self.ep_options,
                "device": self._device.to_dict(),
                "memory_infos": [
                    {"name": m.name, "device_type": m.device_type.name,
                     "device_mem_type": m.device_mem_type.name, "vendor_id": m.device_vendor_id,
                     "device_id": m.device_id, "allocator_type": m.allocator_type.name}
                    for m in self._memory_infos.values()]}

    def __repr__(self) -> str:
        return f"OrtEpDevice(ep_name={self.ep_name!r}, ep_vendor={self.ep_vendor!r}, device={self._device!r})"
