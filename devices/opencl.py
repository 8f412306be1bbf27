"""Hardware devices seen through OpenCL (pyopencl), and the way back from a hardware device to them.

OpenCL GPU devices become GPU hardware devices; ACCELERATOR and CUSTOM devices become NPUs; CPU
devices (PoCL here) are not new hardware: they become a CPU entry that the merge folds into the
one CPU hardware device, so the OpenCL EP finds them in its metadata.

Every device this module reports carries ``opencl_devices`` = comma-separated
``"<platform_index>:<device_index>"`` pairs (indices into ``pyopencl.get_platforms()`` and
``platform.get_devices()``); ``opencl_devices_of`` turns that back into ``pyopencl.Device`` objects.

pyopencl is imported on first use, so importing ``onnxhal.devices`` costs nothing when OpenCL is
not wanted. A missing or broken OpenCL installation gives no devices and a warning, never an error.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from onnxhal.devices.opencl_env import OPENCL_SWITCH_ENV, opencl_disabled
from onnxhal.devices.opencl_probe import ProbeVerdict, probe_device
from onnxhal.devices.vendors import opencl_vendor_id, pci_vendor_name
from onnxhal.hal.enums import OrtHardwareDeviceType
from onnxhal.hal.errors import Fail, InvalidArgument
from onnxhal.hal.hardware_device import OrtHardwareDevice

if TYPE_CHECKING:
    import pyopencl

logger = logging.getLogger("onnxhal.devices")

OPENCL_DEVICES_KEY = "opencl_devices"
#: Devices OpenCL lists but that failed the probe (devices/opencl_probe.py): same "p:d" form.
OPENCL_UNUSABLE_KEY = "opencl_unusable"
#: "usable" or "failed probe: <first line of the build log>", for the first OpenCL device of an entry.
OPENCL_PROBE_KEY = "opencl_probe"

# OpenCL constants (CL/cl.h, CL/cl_ext.h) that pyopencl does not name.
_CL_DEVICE_TYPE_CPU = 1 << 1
_CL_DEVICE_TYPE_GPU = 1 << 2
_CL_DEVICE_TYPE_ACCELERATOR = 1 << 3
_CL_DEVICE_TYPE_CUSTOM = 1 << 4
_CL_DEVICE_PCI_BUS_INFO_KHR = 0x410F  # struct { cl_uint domain, bus, device, function; }
_CL_SUCCESS = 0


@dataclass(frozen=True)
class OpenCLDeviceRecord:
    """What discovery reads from one OpenCL device."""

    platform_index: int
    device_index: int
    platform_name: str
    device_name: str
    vendor: str  # CL_DEVICE_VENDOR, e.g. "NVIDIA Corporation", "AuthenticAMD"
    reported_vendor_id: int  # CL_DEVICE_VENDOR_ID, not always a PCI id
    device_type: int  # CL_DEVICE_TYPE bit field
    driver_version: str
    version: str
    global_mem_size: int
    max_compute_units: int
    pci_bus_id: str  # "dddd:bb:dd.f", or "" when the driver does not say
    probe: ProbeVerdict = ProbeVerdict(True)  # can it build and run a kernel (opencl_probe.py)

    @property
    def hardware_type(self) -> OrtHardwareDeviceType | None:
        """GPU, NPU (ACCELERATOR or CUSTOM) or CPU; None for a device of no known type."""
        if self.device_type & _CL_DEVICE_TYPE_GPU:
            return OrtHardwareDeviceType.GPU
        if self.device_type & (_CL_DEVICE_TYPE_ACCELERATOR | _CL_DEVICE_TYPE_CUSTOM):
            return OrtHardwareDeviceType.NPU
        if self.device_type & _CL_DEVICE_TYPE_CPU:
            return OrtHardwareDeviceType.CPU
        return None


def format_pci_bus_id(domain: int, bus: int, device: int, function: int) -> str:
    """The canonical Linux form ``dddd:bb:dd.f`` (lower-case hex), as sysfs names PCI devices."""
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function:x}"


def _opencl_library() -> ctypes.CDLL | None:
    """The OpenCL ICD loader pyopencl uses: the one its wheel ships, else the system's."""
    import pyopencl

    shipped = sorted(glob.glob(os.path.join(os.path.dirname(pyopencl.__file__), ".libs", "libOpenCL*.so*")))
    path = shipped[0] if shipped else ctypes.util.find_library("OpenCL")
    if not path:
        return None
    try:
        return ctypes.CDLL(path)
    except OSError:
        return None


def _khr_pci_bus_id(device: pyopencl.Device) -> str:
    """``CL_DEVICE_PCI_BUS_INFO_KHR``, which pyopencl cannot query by number: asked through the
    ICD loader directly (a ``cl_device_id`` dispatches to its own driver whatever loader calls)."""
    library = _opencl_library()
    if library is None:
        return ""
    info = (ctypes.c_uint32 * 4)()
    size = ctypes.c_size_t(0)
    status = library.clGetDeviceInfo(ctypes.c_void_p(device.int_ptr), ctypes.c_uint32(_CL_DEVICE_PCI_BUS_INFO_KHR),
                                     ctypes.c_size_t(ctypes.sizeof(info)), info, ctypes.byref(size))
    if status != _CL_SUCCESS or size.value != ctypes.sizeof(info):
        return ""
    return format_pci_bus_id(*info)


def read_pci_bus_id(device: Any, extensions: str) -> str:
    """The device's PCI bus id from ``cl_khr_pci_bus_info``, else NVIDIA's or AMD's vendor
    queries; "" when the driver offers none of them (PoCL) or the query fails."""
    import pyopencl as cl

    names = set(extensions.split())
    try:
        if "cl_khr_pci_bus_info" in names:
            bus_id = _khr_pci_bus_id(device)
            if bus_id:
                return bus_id
        if "cl_nv_device_attribute_query" in names:
            slot = device.get_info(cl.device_info.PCI_SLOT_ID_NV)  # device << 3 | function
            domain = device.get_info(cl.device_info.PCI_DOMAIN_ID_NV)
            return format_pci_bus_id(domain, device.get_info(cl.device_info.PCI_BUS_ID_NV), slot >> 3, slot & 7)
        if "cl_amd_device_attribute_query" in names:
            topology = device.get_info(cl.device_info.TOPOLOGY_AMD)  # PCIe only, no domain
            return format_pci_bus_id(0, topology.bus, topology.device, topology.function)
    except Exception as exc:  # noqa: BLE001 - a vendor query that fails only loses the bus id
        logger.debug("PCI bus id query failed on OpenCL device %r: %s", getattr(device, "name", device), exc)
    return ""


def _is_device_not_found(exc: Exception) -> bool:
    # pyopencl raises for a platform with no devices; that is an empty platform, not a fault.
    return "DEVICE_NOT_FOUND" in str(exc)


def enumerate_opencl_devices() -> list[OpenCLDeviceRecord]:
    """Every OpenCL device of every platform, in (platform, device) order.

    A missing pyopencl or ICD loader, or ``get_platforms()`` raising, gives [] and a warning; a
    platform or device whose queries raise is left out with a warning, the others are kept. Each
    record carries its probe verdict. ``ONNXHAL_OPENCL=off`` gives [] without loading any driver."""
    if opencl_disabled():
        logger.debug("OpenCL device discovery skipped: %s=off", OPENCL_SWITCH_ENV)
        return []
    try:
        import pyopencl as cl
    except Exception as exc:  # noqa: BLE001 - ImportError, or OSError from a broken libOpenCL
        logger.warning("OpenCL device discovery skipped: cannot import pyopencl (%s)", exc)
        return []
    try:
        platforms = cl.get_platforms()
    except Exception as exc:  # noqa: BLE001 - pyopencl raises its own error types for ICD failures
        logger.warning("OpenCL device discovery found no platform: pyopencl.get_platforms() failed (%s)", exc)
        return []
    records = []
    for platform_index, platform in enumerate(platforms):
        try:
            platform_name = platform.name
            devices = platform.get_devices()
        except Exception as exc:  # noqa: BLE001
            if not _is_device_not_found(exc):
                logger.warning("OpenCL platform %d skipped: listing its devices failed (%s)", platform_index, exc)
            continue
        for device_index, device in enumerate(devices):
            try:
                extensions = device.extensions
                records.append(OpenCLDeviceRecord(
                    platform_index=platform_index, device_index=device_index, platform_name=platform_name,
                    device_name=device.name.strip(), vendor=device.vendor.strip(),
                    reported_vendor_id=int(device.vendor_id), device_type=int(device.type),
                    driver_version=device.driver_version.strip(), version=device.version.strip(),
                    global_mem_size=int(device.global_mem_size), max_compute_units=int(device.max_compute_units),
                    pci_bus_id=read_pci_bus_id(device, extensions), probe=probe_device(device)))
            except Exception as exc:  # noqa: BLE001
                logger.warning("OpenCL device %d:%d skipped: querying it failed (%s)", platform_index, device_index, exc)
    return records


def hardware_device_from_record(record: OpenCLDeviceRecord) -> OrtHardwareDevice | None:
    """The hardware device an OpenCL device stands for (a CPU entry for a CPU device, to be
    merged into the real CPU device); None for a device of unknown type."""
    hw_type = record.hardware_type
    if hw_type is None:
        logger.debug("OpenCL device %r has type bits 0x%x: not a CPU, GPU or accelerator; ignored",
                     record.device_name, record.device_type)
        return None
    index = f"{record.platform_index}:{record.device_index}"
    metadata = {
        (OPENCL_DEVICES_KEY if record.probe.usable else OPENCL_UNUSABLE_KEY): index,
        OPENCL_PROBE_KEY: record.probe.state,
        "opencl_platform": record.platform_name,
        "opencl_device": record.device_name,
        "opencl_driver_version": record.driver_version,
        "opencl_version": record.version,
    }
    if hw_type != OrtHardwareDeviceType.CPU:
        # PoCL's sizes for the CPU are a guess about host memory, not a property of the hardware.
        metadata["memory_bytes"] = str(record.global_mem_size)
        metadata["compute_units"] = str(record.max_compute_units)
        if record.pci_bus_id:
            metadata["pci_bus_id"] = record.pci_bus_id
    vendor_id = opencl_vendor_id(record.reported_vendor_id, record.vendor, hw_type)
    # The same short names as sysfs ("NVIDIA", not "NVIDIA Corporation") when the vendor is known.
    vendor = pci_vendor_name(vendor_id) or record.vendor
    # OpenCL has no PCI device id; 0 means "unknown" to the merge.
    return OrtHardwareDevice(hw_type, vendor, vendor_id, 0, metadata)


def discover_opencl_devices() -> list[OrtHardwareDevice]:
    """Hardware devices (GPU, NPU, and CPU entries) for every OpenCL device found: those that pass
    the probe first, so that where several drivers show one device (Debian's PoCL and the bundled
    one, both on the CPU) the merged device's OpenCL metadata describes a usable one."""
    devices = []
    records = enumerate_opencl_devices()
    for record in sorted(records, key=lambda r: not r.probe.usable):
        device = hardware_device_from_record(record)
        if device is not None:
            devices.append(device)
    return devices


def parse_opencl_devices(value: str) -> list[tuple[int, int]]:
    """``"0:0,1:2"`` -> ``[(0, 0), (1, 2)]``. Raises ``InvalidArgument`` on malformed text."""
    pairs = []
    for item in value.split(","):
        platform_text, sep, device_text = item.strip().partition(":")
        if not sep or not platform_text.isdigit() or not device_text.isdigit():
            raise InvalidArgument(f"metadata '{OPENCL_DEVICES_KEY}' = {value!r}: item {item!r} is not "
                                  "'<platform_index>:<device_index>'; use the value discovery wrote")
        pairs.append((int(platform_text), int(device_text)))
    return pairs


def opencl_devices_of(hw: OrtHardwareDevice) -> list[pyopencl.Device]:
    """The ``pyopencl.Device`` objects behind a hardware device, in the order of its
    ``opencl_devices`` metadata; [] when it has none (not backed by OpenCL).

    Raises ``InvalidArgument`` for malformed metadata and ``Fail`` when OpenCL no longer shows a
    listed device (indices are valid only in the process that discovered them)."""
    value = hw.metadata.get(OPENCL_DEVICES_KEY, "")
    if not value:
        return []
    pairs = parse_opencl_devices(value)
    try:
        import pyopencl as cl

        platforms = cl.get_platforms()
    except Exception as exc:  # noqa: BLE001
        raise Fail(f"hardware device {hw!r} lists OpenCL devices {value!r} but OpenCL is unavailable "
                   f"({exc}); check the OpenCL installation") from exc
    devices: list[pyopencl.Device] = []
    device_lists: dict[int, list[pyopencl.Device]] = {}
    for platform_index, device_index in pairs:
        if platform_index >= len(platforms):
            raise Fail(f"hardware device {hw!r}: OpenCL platform {platform_index} of {value!r} does not exist "
                       f"({len(platforms)} platforms); rediscover hardware devices in this process")
        if platform_index not in device_lists:
            device_lists[platform_index] = platforms[platform_index].get_devices()
        platform_devices = device_lists[platform_index]
        if device_index >= len(platform_devices):
            raise Fail(f"hardware device {hw!r}: OpenCL device {platform_index}:{device_index} does not exist "
                       f"(platform has {len(platform_devices)} devices); rediscover hardware devices")
        devices.append(platform_devices[device_index])
    return devices


def first_usable_opencl_device() -> tuple[str | None, str]:
    """(``"p:d"`` of the first OpenCL device that passed the probe, or None; why none did, "" when
    one did). What tests skip with and ``.ci/run`` prints."""
    if opencl_disabled():
        return None, f"{OPENCL_SWITCH_ENV}=off: OpenCL is switched off"
    records = enumerate_opencl_devices()
    for r in records:
        if r.probe.usable:
            return f"{r.platform_index}:{r.device_index}", ""
    if not records:
        return None, "no OpenCL device found (no driver installed)"
    failed = "; ".join(f"{r.device_name} ({r.platform_name} {r.driver_version}): {r.probe.reason}" for r in records)
    return None, f"no OpenCL device passed the probe: {failed}"
