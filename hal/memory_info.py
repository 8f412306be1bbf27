"""OrtMemoryInfo and the memory-device identity that decides when a copy is needed.

Two values need a copy between them exactly when their ``OrtMemoryDevice``s differ: the identity is
(device type, device memory type, vendor id, device id), as ORT's ``OrtMemoryDevice`` and
``MemoryDevice_AreEqual``. The memory info's *name* and allocator type do not take part.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from onnxhal.hal.enums import (
    OrtAllocatorType,
    OrtDeviceMemoryType,
    OrtMemoryInfoDeviceType,
    OrtMemType,
)
from onnxhal.hal.errors import InvalidArgument


@dataclass(frozen=True, slots=True)
class OrtMemoryDevice:
    """Opaque key of one memory space. Vendor id 0 is the generic CPU."""

    device_type: OrtMemoryInfoDeviceType
    memory_type: OrtDeviceMemoryType
    vendor_id: int
    device_id: int
    #: the hash of the four fields, computed once: a session's plan looks up every value's slot by
    #: (name, device), and the generated hash built a tuple and hashed two enums (in Python) each time
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.device_type, self.memory_type, self.vendor_id, self.device_id)))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:  # (devices are mostly the one host device, compared with itself)
            return True
        if other.__class__ is not OrtMemoryDevice:
            return NotImplemented
        return (self.device_type, self.memory_type, self.vendor_id, self.device_id) == \
            (other.device_type, other.memory_type, other.vendor_id, other.device_id)

    @property
    def is_host(self) -> bool:
        """Plain host memory: numpy arrays live here."""
        return (self.device_type == OrtMemoryInfoDeviceType.CPU
                and self.memory_type == OrtDeviceMemoryType.DEFAULT and self.vendor_id == 0)

    def __str__(self) -> str:
        return (f"{self.device_type.name}:{self.device_id}"
                f"{'' if self.memory_type == OrtDeviceMemoryType.DEFAULT else ':host_accessible'}"
                f"(vendor 0x{self.vendor_id:x})")


_DEFAULT, _HOST_ACCESSIBLE = OrtDeviceMemoryType.DEFAULT, OrtDeviceMemoryType.HOST_ACCESSIBLE
# Names ORT's OrtMemoryInfo(name, ...) constructor accepts, with the device they describe. Pinned
# memory is the GPU's HOST_ACCESSIBLE memory (onnxruntime 1.23 on: OrtDevice(GPU, HOST_ACCESSIBLE,
# NVIDIA)), so a copy between it and the CUDA device is a device-to-device one. onnxruntime 1.32
# refuses "CpuPinned", "Dml" and "OpenVINO_CPU"; earlier versions took them, and so does onnxhal.
_LEGACY_NAMES = {
    "Cpu": (OrtMemoryInfoDeviceType.CPU, 0, _DEFAULT),
    "CpuPinned": (OrtMemoryInfoDeviceType.CPU, 0, _DEFAULT),
    "Cuda": (OrtMemoryInfoDeviceType.GPU, 0x10DE, _DEFAULT),
    "CudaPinned": (OrtMemoryInfoDeviceType.GPU, 0x10DE, _HOST_ACCESSIBLE),
    "Dml": (OrtMemoryInfoDeviceType.GPU, 0x1414, _DEFAULT),
    "OpenVINO_CPU": (OrtMemoryInfoDeviceType.CPU, 0x8086, _DEFAULT),
    "OpenVINO_GPU": (OrtMemoryInfoDeviceType.GPU, 0x8086, _DEFAULT),
    "WebGPU_Buffer": (OrtMemoryInfoDeviceType.GPU, 0, _DEFAULT),
}


class OrtMemoryInfo:
    """Describes where an allocator's memory lives. Mirrors ORT's Python ``OrtMemoryInfo``.

    ``OrtMemoryInfo(name, alloc_type, id, mem_type)`` is ORT's legacy constructor (a fixed set of
    names); ``create_v2`` describes any device. There is no value equality (as in ORT): compare
    ``memory_device`` instead.
    """

    __slots__ = ("name", "device_id", "mem_type", "allocator_type", "device_type",
                 "device_mem_type", "device_vendor_id", "alignment", "memory_device")

    def __init__(self, name: str, alloc_type: OrtAllocatorType, id: int, mem_type: OrtMemType) -> None:
        if name not in _LEGACY_NAMES:
            raise InvalidArgument(
                f"OrtMemoryInfo name {name!r}: Specified device is not supported. "
                f"Try CreateMemoryInfo_V2 (OrtMemoryInfo.create_v2); known names: {sorted(_LEGACY_NAMES)}")
        dev_type, vendor, device_mem_type = _LEGACY_NAMES[name]
        self._init(name, dev_type, vendor, id, device_mem_type, 0,
                   OrtAllocatorType(alloc_type), OrtMemType(mem_type))

    def _init(self, name, dev_type, vendor_id, device_id, device_mem_type, alignment, alloc_type,
              mem_type) -> None:
        # onnxruntime keeps a memory device's id as a 16-bit ordinal (OrtDevice::DeviceId is int16_t):
        # a wider value is its "narrowing_error", also inside onnxruntime through the plugin bridge.
        if not -32768 <= int(device_id) <= 32767:
            raise InvalidArgument(f"OrtMemoryInfo {name!r}: device_id {int(device_id)} does not fit onnxruntime's "
                                  "16-bit device ordinal (narrowing_error); pass the device's index (0 for the first "
                                  "device of its kind), not a PCI device id")
        self.name = str(name)
        self.device_type = OrtMemoryInfoDeviceType(dev_type)
        self.device_vendor_id = int(vendor_id)
        self.device_id = int(device_id)
        self.device_mem_type = OrtDeviceMemoryType(device_mem_type)
        self.alignment = int(alignment)
        self.allocator_type = OrtAllocatorType(alloc_type)
        self.mem_type = OrtMemType(mem_type)
        self.memory_device = OrtMemoryDevice(self.device_type, self.device_mem_type,
                                             self.device_vendor_id, self.device_id)

    @staticmethod
    def create_v2(name: str, device_type: OrtMemoryInfoDeviceType, vendor_id: int, device_id: int,
                  device_mem_type: OrtDeviceMemoryType, alignment: int,
                  allocator_type: OrtAllocatorType) -> OrtMemoryInfo:
        """ORT's ``CreateMemoryInfo_V2``. HOST_ACCESSIBLE memory reports ``mem_type`` CPU_OUTPUT."""
        info = OrtMemoryInfo.__new__(OrtMemoryInfo)
        mem_type = (OrtMemType.CPU_OUTPUT if OrtDeviceMemoryType(device_mem_type)
                    == OrtDeviceMemoryType.HOST_ACCESSIBLE else OrtMemType.DEFAULT)
        info._init(name, device_type, vendor_id, device_id, device_mem_type, alignment,
                   allocator_type, mem_type)
        return info

    @property
    def is_host(self) -> bool:
        return self.memory_device.is_host

    def __repr__(self) -> str:
        return (f"OrtMemoryInfo(name={self.name!r}, device={self.memory_device}, "
                f"allocator_type={self.allocator_type.name})")


#: Plain host memory: where numpy arrays, and every value of the CPU EP, live.
CPU_MEMORY_INFO = OrtMemoryInfo.create_v2("Cpu", OrtMemoryInfoDeviceType.CPU, 0, 0,
                                          OrtDeviceMemoryType.DEFAULT, 0,
                                          OrtAllocatorType.ORT_DEVICE_ALLOCATOR)
HOST_MEMORY_DEVICE = CPU_MEMORY_INFO.memory_device
