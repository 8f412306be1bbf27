"""Hardware discovery: the CPU (psutil + /proc/cpuinfo), GPUs and NPUs from Linux sysfs and OpenCL.

``discover_hardware_devices()`` returns ``OrtHardwareDevice``s, one per physical device, CPU first.
It is pure: every call looks again (the runtime caches the result). See ``docs/devices.md``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from onnxhal.hal.hardware_device import OrtHardwareDevice

# Imported on first use (PEP 562): ``import onnxhal`` runs devices/opencl_env.py before anything else,
# and that must not pull in onnx, numpy and the probes (the CLI and the pytest plugin start on it).
_LAZY = {"discover_cpu_device": "onnxhal.devices.cpu", "merge_hardware_devices": "onnxhal.devices.merge",
         "OPENCL_DEVICES_KEY": "onnxhal.devices.opencl", "discover_opencl_devices": "onnxhal.devices.opencl",
         "opencl_devices_of": "onnxhal.devices.opencl", "discover_sysfs_devices": "onnxhal.devices.sysfs"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = globals()[name] = getattr(importlib.import_module(_LAZY[name]), name)
        return value
    raise AttributeError(f"module 'onnxhal.devices' has no attribute {name!r}")


def discover_hardware_devices(sysfs_root: str | None = None, cpuinfo_path: str | None = None,
                              use_opencl: bool = True) -> list[OrtHardwareDevice]:
    """Every hardware device of this machine: exactly one CPU, then GPUs, then NPUs.

    Sources, in priority order: the CPU probe (``cpuinfo_path``), sysfs under ``sysfs_root``
    (DRM cards, PCI display controllers, ``accel`` NPUs) and, with ``use_opencl``, OpenCL.
    None means this machine's (``/sys``, ``/proc/cpuinfo``). A device seen by several sources
    appears once with their metadata merged. Never raises
    for a missing or broken source: it is skipped and logged on the ``onnxhal.devices`` logger."""
    from onnxhal.devices.cpu import DEFAULT_CPUINFO_PATH, discover_cpu_device
    from onnxhal.devices.merge import merge_hardware_devices
    from onnxhal.devices.opencl import discover_opencl_devices
    from onnxhal.devices.sysfs import DEFAULT_SYSFS_ROOT, discover_sysfs_devices

    cpu = discover_cpu_device(cpuinfo_path or DEFAULT_CPUINFO_PATH)
    sysfs_devices = discover_sysfs_devices(sysfs_root or DEFAULT_SYSFS_ROOT)
    opencl_devices = discover_opencl_devices() if use_opencl else []
    return merge_hardware_devices([cpu], sysfs_devices, opencl_devices)


__all__ = [
    "OPENCL_DEVICES_KEY", "discover_hardware_devices", "discover_cpu_device", "discover_sysfs_devices",
    "discover_opencl_devices", "merge_hardware_devices", "opencl_devices_of",
]
