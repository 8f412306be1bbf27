"""Allocator base: public ``alloc/free/reserve/stats`` around small private hooks.

A backend fills in ``_alloc`` and ``_free``; the base keeps ORT's statistics and enforces the
memory limit, so every allocator reports the same keys and fails the same way.
"""

from __future__ import annotations

import threading

import numpy as np

from onnxhal.hal.errors import OutOfMemory
from onnxhal.hal.memory_info import CPU_MEMORY_INFO, OrtMemoryInfo

STATS_KEYS = ("Limit", "InUse", "TotalAllocated", "MaxInUse", "NumAllocs", "NumReserves",
              "NumArenaExtensions", "MaxAllocSize")


class Allocator:
    """``alloc(size)`` returns an opaque buffer handle; ``free(buffer)`` gives it back.

    ``limit`` (bytes, 0 = none) caps the bytes in use; going over raises ``OutOfMemory`` naming the
    request and the limit, and leaves the allocator as it was.
    """

    def __init__(self, info: OrtMemoryInfo, limit: int = 0) -> None:
        self._info = info
        # Re-entrant: a finalizer the garbage collector runs during an allocation (a tensor's, a
        # session's releasing its partitions' buffers) frees on the thread that holds the lock.
        self._lock = threading.RLock()
        self._sizes: dict[int, int] = {}
        self._stats = dict.fromkeys(STATS_KEYS, 0)
        self._stats["Limit"] = int(limit)

    @property
    def info(self) -> OrtMemoryInfo:
        return self._info

    def alloc(self, size: int) -> object:
        return self._alloc_counted(int(size), reserve=False)

    def reserve(self, size: int) -> object:
        """Allocate outside any arena pooling (ORT's Reserve), e.g. for initializers."""
        return self._alloc_counted(int(size), reserve=True)

    def free(self, buffer: object) -> None:
        with self._lock:
            size = self._sizes.pop(id(buffer), None)
            if size is None:
                raise ValueError(f"{self._info.name}: free() of a buffer this allocator did not allocate")
            self._stats["InUse"] -= size
        self._free(buffer)

    def release_if_owned(self, buffer: object) -> None:
        """Free ``buffer`` unless it was freed already: what a tensor's finalizer calls, so an
        explicit ``free`` before the tensor dies is fine too."""
        with self._lock:
            size = self._sizes.pop(id(buffer), None)
            if size is None:
                return
            self._stats["InUse"] -= size
        self._free(buffer)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return dict(self._stats)

    def _alloc_counted(self, size: int, reserve: bool) -> object:
        with self._lock:
            limit = self._stats["Limit"]
            if limit and self._stats["InUse"] + size > limit:
                raise OutOfMemory(
                    f"{self._info.name} allocator: cannot allocate {size} bytes: {self._stats['InUse']} of "
                    f"the {limit}-byte limit in use. Free device tensors, lower batch size, or raise the limit.")
            buffer = self._alloc(size)
            self._sizes[id(buffer)] = size
            s = self._stats
            s["InUse"] += size
            s["TotalAllocated"] += size
            s["MaxInUse"] = max(s["MaxInUse"], s["InUse"])
            s["NumReserves" if reserve else "NumAllocs"] += 1
            s["MaxAllocSize"] = max(s["MaxAllocSize"], size)
            return buffer

    # Hooks for a backend.
    def _alloc(self, size: int) -> object:
        raise NotImplementedError

    def _free(self, buffer: object) -> None:
        pass


class CPUAllocator(Allocator):
    """Host memory as numpy byte arrays."""

    def __init__(self, limit: int = 0) -> None:
        super().__init__(CPU_MEMORY_INFO, limit)

    def _alloc(self, size: int) -> object:
        return np.empty(size, dtype=np.uint8)
