"""OrtDevice and OrtDeviceVendorId: onnxruntime's Python names for a memory device.

``OrtDevice.make("cuda", 0)`` is how onnxruntime's Python API names the device an OrtValue or a
bound output lives on (``OrtValue.ortvalue_from_shape_and_type``, ``run_with_ortvaluevector``'s
``fetch_devices``). Here it is a thin view of ``OrtMemoryDevice``, the key that decides copies, so
both spellings describe the same thing. Device type numbers are ``OrtDevice::DeviceType``'s
(CPU 0, GPU 1, FPGA 2, NPU 3, DML 4), memory types ``OrtDevice::MemType``'s (DEFAULT 0,
HOST_ACCESSIBLE 5).
"""

from __future__ import annotations

from enum import IntEnum

from onnxhal.hal.enums import OrtDeviceMemoryType, OrtMemoryInfoDeviceType
from onnxhal.hal.errors import InvalidArgument
from onnxhal.hal.memory_info import OrtMemoryDevice


class OrtDeviceVendorId(IntEnum):
    """PCI vendor ids, as onnxruntime's ``OrtDeviceVendorId`` (``OrtDevice::VendorIds``)."""

    NONE = 0x0000
    AMD = 0x1002
    NVIDIA = 0x10DE
    ARM = 0x13B5
    MICROSOFT = 0x1414
    HUAWEI = 0x19E5
    QUALCOMM = 0x5143
    INTEL = 0x8086


# onnxruntime's device-type numbers (OrtDevice::GPU etc.); "cuda", "webgpu" are GPUs, "cann" an NPU.
_TYPE_OF_NAME = {"cpu": 0, "gpu": 1, "cuda": 1, "webgpu": 1, "fpga": 2, "npu": 3, "cann": 3, "dml": 4}
# The vendor an alias implies when the caller gives none (get_vendor_id_for_device_type).
_ALIAS_VENDOR = {"cuda": OrtDeviceVendorId.NVIDIA, "dml": OrtDeviceVendorId.MICROSOFT,
                 "cann": OrtDeviceVendorId.HUAWEI, "webgpu": OrtDeviceVendorId.NONE}
_MEMORY_DEVICE_TYPE = {0: OrtMemoryInfoDeviceType.CPU, 1: OrtMemoryInfoDeviceType.GPU,
                       2: OrtMemoryInfoDeviceType.FPGA, 3: OrtMemoryInfoDeviceType.NPU, 4: OrtMemoryInfoDeviceType.GPU}


class OrtDevice:
    """A memory device: type, memory type, vendor id and device id (onnxruntime's ``OrtDevice``).

    ``OrtDevice(device_type, mem_type, vendor_id, device_id)`` takes onnxruntime's numbers (the C
    class's constructor); ``OrtDevice.make(name, device_id, vendor_id=-1)`` its names.
    """

    __slots__ = ("_type", "_mem_type", "_vendor_id", "_device_id")

    def __init__(self, device_type: int, mem_type: int = 0, vendor_id: int = 0, device_id: int = 0) -> None:
        if int(device_type) not in _MEMORY_DEVICE_TYPE:
            raise InvalidArgument(f"OrtDevice: device type {device_type!r} is not one of onnxruntime's "
                                  "(0 CPU, 1 GPU, 2 FPGA, 3 NPU, 4 DML); use OrtDevice.make('gpu', 0) to name one")
        if int(mem_type) not in (0, 5):
            raise InvalidArgument(f"OrtDevice: memory type {mem_type!r} is not 0 (DEFAULT) or 5 (HOST_ACCESSIBLE)")
        # onnxruntime keeps a DML device as a GPU: OrtDevice(dml(), ...).device_type() is 1.
        self._type, self._mem_type = (1 if int(device_type) == 4 else int(device_type)), int(mem_type)
        self._vendor_id, self._device_id = int(vendor_id), int(device_id)

    @staticmethod
    def make(ort_device_name: str, device_id: int, vendor_id: int | OrtDeviceVendorId = -1) -> OrtDevice:
        """``"cpu"``, ``"gpu"``, ``"npu"``, or an alias (``"cuda"``, ``"dml"``, ``"cann"``, ``"webgpu"``)
        with ``device_id``; ``vendor_id`` -1 means the alias's vendor, or 0."""
        kind = _TYPE_OF_NAME.get(ort_device_name)
        if kind is None:
            # onnxruntime raises a bare Exception("Unsupported device type: ...") here.
            raise InvalidArgument(f"Unsupported device type: {ort_device_name!r}; use one of "
                                  f"{sorted(_TYPE_OF_NAME)} (lower case), with a vendor_id for 'gpu' or 'npu'")
        if vendor_id < 0:
            vendor_id = _ALIAS_VENDOR.get(ort_device_name, 0)
        return OrtDevice(kind, 0, int(vendor_id), device_id)

    @staticmethod
    def from_memory_device(dev: OrtMemoryDevice) -> OrtDevice:
        return OrtDevice(int(dev.device_type), int(dev.memory_type), dev.vendor_id, dev.device_id)

    # onnxruntime's C class names the type numbers with static methods.
    cpu = staticmethod(lambda: 0)
    gpu = staticmethod(lambda: 1)
    fpga = staticmethod(lambda: 2)
    npu = staticmethod(lambda: 3)
    cuda = staticmethod(lambda: 1)
    webgpu = staticmethod(lambda: 1)
    cann = staticmethod(lambda: 3)
    dml = staticmethod(lambda: 4)
    default_memory = staticmethod(lambda: 0)

    def device_type(self) -> int:
        return self._type

    def device_id(self) -> int:
        return self._device_id

    def device_vendor_id(self) -> int:
        return self._vendor_id

    vendor_id = device_vendor_id  # the C class's name

    def device_mem_type(self) -> int:
        return self._mem_type

    mem_type = device_mem_type  # the C class's name

    @property
    def memory_device(self) -> OrtMemoryDevice:
        """The key that decides copies. A "cpu" device with vendor 0 is plain host memory."""
        return OrtMemoryDevice(_MEMORY_DEVICE_TYPE[self._type], OrtDeviceMemoryType(self._mem_type),
                               self._vendor_id, self._device_id)

    def _get_c_device(self) -> OrtDevice:
        return self  # onnxruntime's wrapper hands its C object on; there is only one object here

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OrtDevice) and (self._type, self._mem_type, self._vendor_id, self._device_id) == (
            other._type, other._mem_type, other._vendor_id, other._device_id)

    def __hash__(self) -> int:
        return hash((self._type, self._mem_type, self._vendor_id, self._device_id))

    def __repr__(self) -> str:
        return (f"OrtDevice(device_type={self._type}, mem_type={self._mem_type}, "
                f"vendor_id=0x{self._vendor_id:x}, device_id={self._device_id})")
