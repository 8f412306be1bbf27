"""What every simulated device's memory shares, whichever backend holds the bytes: the capacity cap
that also counts a partition's weights, and transfers that charge the simulated host link."""

from __future__ import annotations

import threading
from typing import Any

from onnxhal.hal.memory_info import OrtMemoryDevice


class _Charge:
    """Stands for bytes that live outside the allocator's own buffers (a partition's weights)."""

    __slots__ = ()


class ChargingMixin:
    """For an ``Allocator`` subclass: ``charge(nbytes)`` counts bytes held elsewhere against the same
    limit (``OutOfMemory`` past the capacity); give the returned token to ``free``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._charging = threading.local()

    def charge(self, nbytes: int) -> object:
        self._charging.on = True
        try:
            return self.reserve(nbytes)
        finally:
            self._charging.on = False

    def free_bytes(self) -> int:
        s = self.stats()
        return s["Limit"] - s["InUse"] if s["Limit"] else 2**63

    def _alloc(self, size: int) -> object:
        if getattr(self._charging, "on", False):
            return _Charge()
        return super()._alloc(size)

    def _free(self, buffer: object) -> None:
        if not isinstance(buffer, _Charge):
            super()._free(buffer)


def carried_elsewhere(own: OrtMemoryDevice | None, src: OrtMemoryDevice, dst: OrtMemoryDevice) -> bool:
    """Whether a session EP's transfer for device ``own`` should leave the pair to another EP's
    transfer (which carries that device's copies, and charges their costs to its own meter)."""
    return own is not None and own not in (src, dst)


def meter_transfers(table: Any, own: OrtMemoryDevice | None, own_meter: Any, src: list, dst: list) -> None:
    """Charge each copied tensor's bytes to the simulated link of every simulated device it touches:
    to the session EP's meter for its own device (``own``), else to the device's own meter."""
    for s, d in zip(src, dst):
        nbytes = int(getattr(s, "nbytes", 0))
        for t in (s, d):
            dev = getattr(getattr(t, "memory_info", None), "memory_device", None)
            sim = table.devices.get(dev)
            if sim is not None:
                (own_meter if dev == own and own_meter else sim.meter).add_transfer(nbytes)
