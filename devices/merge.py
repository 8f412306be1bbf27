"""One hardware device per physical device, in a stable order.

Discovery sources (the CPU probe, sysfs, OpenCL) may each see the same device. ``merge_hardware_devices``
takes their lists, earliest source first, and folds every device into the one it is the same as:

1. every CPU entry is the one CPU (there is one CPU hardware device, as in ORT);
2. otherwise, equal ``pci_bus_id`` means the same device; two different bus ids mean two devices,
   even with equal vendor and device ids (two cards of the same model);
3. otherwise (one side has no bus id): the same type and ``vendor_id``, and equal non-zero
   ``device_id``;
4. otherwise, when one side's ``device_id`` is 0 (unknown, as for OpenCL devices): the only device
   of the same type and ``vendor_id``, if there is exactly one.

Rules 3 and 4 match a device with at most one device of each other source, and never with a
device of its own source. In a merged device the earlier source's type, vendor, ids and metadata
win; ``opencl_devices`` lists are joined; a non-zero id or non-empty vendor fills an unknown one.

Order: CPU first, then GPUs, then NPUs; within a type, devices with a bus id by bus id, then the
rest in discovery order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from onnxhal.hal.enums import OrtHardwareDeviceType
from onnxhal.hal.hardware_device import OrtHardwareDevice

_JOINED_KEYS = ("opencl_devices", "opencl_unusable")  # comma-separated lists: a merged device lists every entry
_TYPE_ORDER = {OrtHardwareDeviceType.CPU: 0, OrtHardwareDeviceType.GPU: 1, OrtHardwareDeviceType.NPU: 2}


@dataclass
class _Merged:
    device: OrtHardwareDevice
    sources: set[int] = field(default_factory=set)


def _bus_id(device: OrtHardwareDevice) -> str:
    return device.metadata.get("pci_bus_id", "").lower()


def _join_lists(first: str, second: str) -> str:
    items = [item for item in first.split(",") if item]
    items += [item for item in second.split(",") if item and item not in items]
    return ",".join(items)


def combine_devices(first: OrtHardwareDevice, second: OrtHardwareDevice) -> OrtHardwareDevice:
    """``first`` with what ``second`` adds: its metadata keys that ``first`` lacks, its ids and
    vendor where ``first``'s are unknown, and its ``opencl_devices`` entries appended."""
    metadata = dict(first.metadata)
    for key, value in second.metadata.items():
        metadata.setdefault(key, value)
    for key in _JOINED_KEYS:
        if key in first.metadata and key in second.metadata:
            metadata[key] = _join_lists(first.metadata[key], second.metadata[key])
    return OrtHardwareDevice(
        first.type,
        first.vendor or second.vendor,
        first.vendor_id or second.vendor_id,
        first.device_id or second.device_id,
        metadata,
    )


def _find_same(merged: list[_Merged], device: OrtHardwareDevice, source: int) -> _Merged | None:
    if device.type == OrtHardwareDeviceType.CPU:
        return next((m for m in merged if m.device.type == OrtHardwareDeviceType.CPU), None)
    bus_id = _bus_id(device)
    if bus_id:
        same_bus = next((m for m in merged if _bus_id(m.device) == bus_id), None)
        if same_bus is not None:
            return same_bus
    # Id rules: another source's device of the same kind that could be this one.
    candidates = [
        m for m in merged
        if source not in m.sources
        and m.device.type == device.type
        and device.vendor_id != 0
        and m.device.vendor_id == device.vendor_id
        and not (bus_id and _bus_id(m.device))  # two different bus ids: two devices
    ]
    if device.device_id:
        exact = next((m for m in candidates if m.device.device_id == device.device_id), None)
        if exact is not None:
            return exact
    unknown_id = [m for m in candidates if not device.device_id or not m.device.device_id]
    if len(unknown_id) == 1:
        return unknown_id[0]
    return None


def hardware_device_order_key(device: OrtHardwareDevice) -> tuple[int, int, str]:
    """Sort key: CPU, GPU, NPU; then devices with a bus id, by bus id (sorting is stable, so
    devices without one keep discovery order)."""
    bus_id = _bus_id(device)
    return (_TYPE_ORDER.get(device.type, len(_TYPE_ORDER)), 0 if bus_id else 1, bus_id)


def merge_hardware_devices(*sources: Sequence[OrtHardwareDevice]) -> list[OrtHardwareDevice]:
    """One device per physical device, ordered, from the lists of several discovery sources
    (earliest source wins conflicts). See the module docstring for the rules."""
    merged: list[_Merged] = []
    for source, devices in enumerate(sources):
        for device in devices:
            same = _find_same(merged, device, source)
            if same is None:
                merged.append(_Merged(device, {source}))
            else:
                same.device = combine_devices(same.device, device)
                same.sources.add(source)
    return sorted((m.device for m in merged), key=hardware_device_order_key)
