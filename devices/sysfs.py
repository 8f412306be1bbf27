"""GPUs and NPUs from Linux sysfs: DRM cards, ``accel`` devices, and PCI display controllers.

What ONNX Runtime reads on Linux (``/sys/class/drm/cardN/device/{vendor,device}``), plus NPUs from
``/sys/class/accel/accelN`` (as ORT does since 1.28; before, it found no NPU on Linux), plus ORT's
newer fallback to PCI display controllers when DRM lists no card. Unlike ORT, which gives up on every GPU when one card is
unreadable, a bad entry here is skipped (with a debug log) and the others are kept.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass

from onnxhal.devices.vendors import PCI_VENDOR_AMD_GPU, PCI_VENDOR_NVIDIA, pci_vendor_name
from onnxhal.hal.enums import OrtHardwareDeviceType
from onnxhal.hal.hardware_device import OrtHardwareDevice

logger = logging.getLogger("onnxhal.devices")

DEFAULT_SYSFS_ROOT = "/sys"

PCI_BUS_ID_PATTERN = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_CARD_NAME = re.compile(r"^card(\d+)$")  # not "card0-HDMI-A-1" (a connector) nor "renderD128"
_ACCEL_NAME = re.compile(r"^accel(\d+)$")
_PCI_CLASS_DISPLAY = 0x03  # base class of VGA, XGA, 3D and other display controllers


class SkippedEntry(Exception):
    """A sysfs entry that does not describe a usable PCI device; the message says why."""


@dataclass(frozen=True)
class PciFunction:
    """What sysfs says about one PCI function: ids, canonical bus id, kernel driver."""

    path: str  # resolved directory of the device
    vendor_id: int
    device_id: int
    pci_bus_id: str
    driver: str


def _read_hex(path: str) -> int:
    try:
        with open(path, encoding="ascii") as f:
            text = f.read().strip()
    except FileNotFoundError:
        raise SkippedEntry(f"no {os.path.basename(path)} file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SkippedEntry(f"cannot read {path}: {exc}") from None
    try:
        return int(text, 16)
    except ValueError:
        raise SkippedEntry(f"{path} holds {text!r}, not a hex number") from None


def read_pci_function(device_link: str) -> PciFunction:
    """Describe the PCI function that ``device_link`` (e.g. ``.../drm/card0/device``) points to.

    Raises ``SkippedEntry`` when the link is missing, leads to a non-PCI device (a
    simple-framebuffer, a platform NPU) or has unreadable ``vendor``/``device`` files."""
    if not os.path.exists(device_link):
        raise SkippedEntry("no device link")
    resolved = os.path.realpath(device_link)
    bus_id = os.path.basename(resolved)
    if not PCI_BUS_ID_PATTERN.match(bus_id):
        raise SkippedEntry(f"device {resolved!r} is not a PCI device")
    vendor_id = _read_hex(os.path.join(resolved, "vendor"))
    device_id = _read_hex(os.path.join(resolved, "device"))
    driver_link = os.path.join(resolved, "driver")
    driver = os.path.basename(os.path.realpath(driver_link)) if os.path.islink(driver_link) else ""
    return PciFunction(resolved, vendor_id, device_id, bus_id.lower(), driver)


def is_discrete_gpu(function: PciFunction) -> bool:
    """Our rule for ``Discrete`` = "1": every NVIDIA GPU (ORT's rule), and an AMD GPU whose driver
    shows ``mem_info_vram_vendor``. amdgpu creates that file only when the board firmware names
    the VRAM chips' maker, which a dedicated-memory card has and an APU (sharing system memory)
    does not. Intel and other GPUs are not marked: nothing in sysfs tells them apart reliably."""
    if function.vendor_id == PCI_VENDOR_NVIDIA:
        return True
    if function.vendor_id == PCI_VENDOR_AMD_GPU:
        return os.path.exists(os.path.join(function.path, "mem_info_vram_vendor"))
    return False


def _indexed_entries(class_dir: str, pattern: re.Pattern[str]) -> list[tuple[int, str]]:
    try:
        names = os.listdir(class_dir)
    except OSError:
        return []  # no such class on this kernel: nothing to find, not an error
    entries = []
    for name in names:
        match = pattern.match(name)
        if match:
            entries.append((int(match.group(1)), os.path.join(class_dir, name)))
    return sorted(entries)


def _gpu_device(function: PciFunction, extra: dict[str, str]) -> OrtHardwareDevice:
    metadata = dict(extra)
    metadata["pci_bus_id"] = function.pci_bus_id
    if function.driver:
        metadata["driver"] = function.driver
    if is_discrete_gpu(function):
        metadata["Discrete"] = "1"
    return OrtHardwareDevice(OrtHardwareDeviceType.GPU, pci_vendor_name(function.vendor_id),
                             function.vendor_id, function.device_id, metadata)


def discover_drm_gpus(sysfs_root: str = DEFAULT_SYSFS_ROOT) -> list[OrtHardwareDevice]:
    """GPUs from ``<root>/class/drm/cardN/device``, in card order; metadata ``card_idx``,
    ``pci_bus_id``, ``driver``, ``Discrete``."""
    devices = []
    for card_idx, card_dir in _indexed_entries(os.path.join(sysfs_root, "class", "drm"), _CARD_NAME):
        try:
            function = read_pci_function(os.path.join(card_dir, "device"))
        except SkippedEntry as why:
            logger.debug("skipping DRM card %s: %s", card_dir, why)
            continue
        devices.append(_gpu_device(function, {"card_idx": str(card_idx)}))
    return devices


def discover_pci_display_gpus(sysfs_root: str = DEFAULT_SYSFS_ROOT) -> list[OrtHardwareDevice]:
    """GPUs from ``<root>/bus/pci/devices/*`` whose class is a display controller (0x03xxxx), in
    bus order; for machines where DRM lists no card (no DRM driver bound, some cloud vGPUs)."""
    pci_dir = os.path.join(sysfs_root, "bus", "pci", "devices")
    try:
        names = sorted(os.listdir(pci_dir))
    except OSError:
        return []
    devices = []
    for name in names:
        entry = os.path.join(pci_dir, name)
        try:
            pci_class = _read_hex(os.path.join(entry, "class"))
            if pci_class >> 16 != _PCI_CLASS_DISPLAY:
                continue
            function = read_pci_function(entry)
        except SkippedEntry as why:
            logger.debug("skipping PCI device %s: %s", entry, why)
            continue
        devices.append(_gpu_device(function, {}))
    return devices


def discover_sysfs_gpus(sysfs_root: str = DEFAULT_SYSFS_ROOT) -> list[OrtHardwareDevice]:
    """DRM cards; when there are none, PCI display controllers."""
    gpus = discover_drm_gpus(sysfs_root)
    if not gpus:
        gpus = discover_pci_display_gpus(sysfs_root)
    return gpus


def discover_accel_npus(sysfs_root: str = DEFAULT_SYSFS_ROOT) -> list[OrtHardwareDevice]:
    """NPUs from ``<root>/class/accel/accelN/device`` (the kernel's compute-accelerator class:
    Intel NPU, AMD XDNA, Habana, ...), in index order; metadata ``accel_idx``, ``pci_bus_id``,
    ``driver``."""
    devices = []
    for accel_idx, accel_dir in _indexed_entries(os.path.join(sysfs_root, "class", "accel"), _ACCEL_NAME):
        try:
            function = read_pci_function(os.path.join(accel_dir, "device"))
        except SkippedEntry as why:
            logger.debug("skipping accel device %s: %s", accel_dir, why)
            continue
        metadata = {"accel_idx": str(accel_idx), "pci_bus_id": function.pci_bus_id}
        if function.driver:
            metadata["driver"] = function.driver
        devices.append(OrtHardwareDevice(OrtHardwareDeviceType.NPU, pci_vendor_name(function.vendor_id),
                                         function.vendor_id, function.device_id, metadata))
    return devices


def discover_sysfs_devices(sysfs_root: str = DEFAULT_SYSFS_ROOT) -> list[OrtHardwareDevice]:
    """Every GPU and NPU that sysfs shows under ``sysfs_root``."""
    return discover_sysfs_gpus(sysfs_root) + discover_accel_npus(sysfs_root)
