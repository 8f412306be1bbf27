"""OrtHardwareDevice: one physical (or virtual) device, as discovery or a factory describes it."""

from __future__ import annotations

from collections.abc import Mapping

from onnxhal.hal.enums import OrtHardwareDeviceType
from onnxhal.hal.key_values import ReadOnlyKeyValues


class OrtHardwareDevice:
    """Immutable description of a device: ``type``, ``vendor``, ``vendor_id``, ``device_id`` and a
    read-only ``metadata`` mapping of str to str. ``device_id`` is unique only together with
    ``vendor_id`` (as in ORT)."""

    __slots__ = ("_type", "_vendor", "_vendor_id", "_device_id", "_metadata")

    def __init__(self, type: OrtHardwareDeviceType, vendor: str, vendor_id: int, device_id: int,
                 metadata: Mapping[str, str] | None = None) -> None:
        object.__setattr__(self, "_type", OrtHardwareDeviceType(type))
        object.__setattr__(self, "_vendor", str(vendor))
        object.__setattr__(self, "_vendor_id", int(vendor_id))
        object.__setattr__(self, "_device_id", int(device_id))
        object.__setattr__(self, "_metadata", ReadOnlyKeyValues(metadata))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("OrtHardwareDevice is immutable")

    @property
    def type(self) -> OrtHardwareDeviceType:
        return self._type

    @property
    def vendor(self) -> str:
        return self._vendor

    @property
    def vendor_id(self) -> int:
        return self._vendor_id

    @property
    def device_id(self) -> int:
        return self._device_id

    @property
    def metadata(self) -> Mapping[str, str]:
        return self._metadata

    @property
    def is_virtual(self) -> bool:
        return self._metadata.get("is_virtual") == "1"

    def with_metadata(self, extra: Mapping[str, str]) -> OrtHardwareDevice:
        """A copy with ``extra`` merged into the metadata (existing keys win)."""
        md = dict(extra)
        md.update(self._metadata)
        return OrtHardwareDevice(self._type, self._vendor, self._vendor_id, self._device_id, md)

    def to_dict(self) -> dict:
        return {"type": self._type.name, "vendor": self._vendor, "vendor_id": self._vendor_id,
                "device_id": self._device_id, "metadata": dict(self._metadata)}

    def __repr__(self) -> str:
        return (f"OrtHardwareDevice(type={self._type.name}, vendor={self._vendor!r}, "
                f"vendor_id=0x{self._vendor_id:04x}, device_id=0x{self._device_id:04x})")
