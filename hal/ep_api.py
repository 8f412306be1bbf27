"""The ``api`` object handed to an EP library's ``create_ep_factories`` (ORT's OrtEpApi)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from onnxhal.hal.enums import (
    OrtAllocatorType,
    OrtDeviceMemoryType,
    OrtHardwareDeviceType,
    OrtMemoryInfoDeviceType,
)
from onnxhal.hal.ep_device import OrtEpDevice
from onnxhal.hal.hardware_device import OrtHardwareDevice
from onnxhal.hal.memory_info import OrtMemoryInfo

if TYPE_CHECKING:
    from onnxhal.hal.ep import EpFactory


class EpApi:
    """What a factory may ask of the runtime. One instance per registered library."""

    def __init__(self, env_config: Mapping[str, str] | None = None) -> None:
        self._env_config = dict(env_config or {})

    def create_ep_device(self, factory: EpFactory, hardware_device: OrtHardwareDevice,
                         ep_metadata: Mapping[str, str] | None = None,
                         ep_options: Mapping[str, str] | None = None) -> OrtEpDevice:
        """ORT's ``CreateEpDevice``: both maps are copied."""
        return OrtEpDevice(factory, hardware_device, ep_metadata, ep_options)

    def ep_device_add_allocator_info(self, ep_device: OrtEpDevice, memory_info: OrtMemoryInfo) -> None:
        """ORT's ``EpDevice_AddAllocatorInfo``: declares the device's DEFAULT, HOST_ACCESSIBLE or
        read-only memory. Adding again replaces the slot."""
        ep_device.add_allocator_info(memory_info)

    def create_hardware_device(self, type: OrtHardwareDeviceType, vendor_id: int, device_id: int,
                               vendor: str, metadata: Mapping[str, str] | None = None) -> OrtHardwareDevice:
        """ORT's ``CreateHardwareDevice``: a virtual device, marked ``is_virtual`` = "1"."""
        md = dict(metadata or {})
        md["is_virtual"] = "1"
        return OrtHardwareDevice(type, vendor, vendor_id, device_id, md)

    @staticmethod
    def create_memory_info(name: str, device_type: OrtMemoryInfoDeviceType, vendor_id: int,
                           device_id: int, device_mem_type: OrtDeviceMemoryType = OrtDeviceMemoryType.DEFAULT,
                           alignment: int = 0,
                           allocator_type: OrtAllocatorType = OrtAllocatorType.ORT_DEVICE_ALLOCATOR) -> OrtMemoryInfo:
        return OrtMemoryInfo.create_v2(name, device_type, vendor_id, device_id, device_mem_type,
                                       alignment, allocator_type)

    def get_env_config_entries(self) -> Mapping[str, str]:
        return MappingProxyType(dict(self._env_config))
