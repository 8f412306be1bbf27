"""Hardware discovery: the CPU (psutil + /proc/cpuinfo), GPUs and NPUs from Linux sysfs and OpenCL.

``discover_hardware_devices()`` returns ``OrtHardwareDevice``s, one per physical device, CPU first.
It is pure: every call looks again (the runtime caches the result). See ``docs/devices.md``.
"""

from __future__ import annotations

from onnxhal.devices.cpu import DEFAULT_CPUINFO_PATH, discover_cpu_device
from onnxhal.devices.merge import merge_hardware_devices
from onnxhal.devices.opencl import OPENCL_DEVICES_KEY, discover_opencl_devices, opencl_devices_of
from onnxhal.devices.sysfs import DEFAULT_SYSFS_ROOT, discover_sysfs_devices
from onnxhal.hal.hardware_device import OrtHardwareDevice


def discover_hardware_devices(sysfs_root: str = DEFAULT_SYSFS_ROOT, cpuinfo_path: str = DEFAULT_CPUINFO_PATH,
                              use_opencl: bool = True) -> list[OrtHardwareDevice]:
    """Every hardware device of this machine: exactly one CPU, then GPUs, then NPUs.

    Sources, in priority order: the CPU probe (``cpuinfo_path``), sysfs under ``sysfs_root``
    (DRM cards, PCI display controllers, ``accel`` NPUs) and, with ``use_opencl``, OpenCL.
    A device seen by several sources appears once with their metadata merged. Never raises
    for a missing or broken source: it is skipped and logged on the ``onnxhal.devices`` logger."""
    cpu = discover_cpu_device(cpuinfo_path)
    sysfs_devices = discover_sysfs_devices(sysfs_root)
    opencl_devices = discover_opencl_devices() if use_opencl else []
    return merge_hardware_devices([cpu], sysfs_devices, opencl_devices)


__all__ = [
    "OPENCL_DEVICES_KEY", "discover_hardware_devices", "discover_cpu_device", "discover_sysfs_devices",
    "discover_opencl_devices", "merge_hardware_devices", "opencl_devices_of",
]
