"""An arena on top of a device allocator: buffers are kept after ``free`` and reused.

Device allocations are slow (an OpenCL buffer costs a driver call; a real GPU's costs more), and an
inference run frees and re-requests the same sizes every time. The arena keeps freed buffers in
per-size pools and hands them out again; it extends itself from the device allocator only when no
pooled buffer fits. Two extension strategies, named as ORT's ``arena_extend_strategy``:

- ``kNextPowerOfTwo``: requests are rounded up to a power of two (at least 256 bytes), so buffers
  are reused across nearby sizes at the cost of some slack.
- ``kSameAsRequested``: exact sizes; no slack, reuse only for equal sizes.

Unlike ORT's BFC arena, buffers are never split or coalesced (an OpenCL buffer cannot be split
into sub-allocations portably); this is tinygrad's LRU allocator with ORT's statistics. When the
device allocator runs out, or the arena's own ``limit`` would be exceeded, the pools are released
and the request retried once before ``OutOfMemory``.
"""

from __future__ import annotations

from onnxhal.hal.allocator import Allocator
from onnxhal.hal.errors import Fail, InvalidArgument, OutOfMemory

NEXT_POWER_OF_TWO = "kNextPowerOfTwo"
SAME_AS_REQUESTED = "kSameAsRequested"
_MIN_CHUNK = 256


class ArenaAllocator(Allocator):
    """``limit`` caps the bytes the arena holds (in use plus pooled); 0 means no cap of its own
    (the device allocator's limit still applies)."""

    def __init__(self, device: Allocator, strategy: str = NEXT_POWER_OF_TWO, limit: int = 0) -> None:
        if strategy not in (NEXT_POWER_OF_TWO, SAME_AS_REQUESTED):
            raise InvalidArgument(f"arena_extend_strategy {strategy!r} is not one of "
                                  f"{NEXT_POWER_OF_TWO!r}, {SAME_AS_REQUESTED!r}")
        super().__init__(device.info, 0)
        self.device = device
        self.strategy = strategy
        self.arena_limit = int(limit)
        self._pools: dict[int, list[object]] = {}
        self._chunk: dict[int, int] = {}  # id(buffer) -> chunk size
        self._held = 0  # bytes obtained from the device allocator and not given back
        self._stats["Limit"] = self.arena_limit

    def chunk_size(self, size: int) -> int:
        if self.strategy == SAME_AS_REQUESTED:
            return max(int(size), 1)
        return max(_MIN_CHUNK, 1 << (max(int(size), 1) - 1).bit_length())

    def alloc(self, size: int) -> object:
        return self._take(int(size), reserve=False)

    def reserve(self, size: int) -> object:
        """Bypass the pools (ORT's Reserve): for buffers that live as long as the session."""
        return self._take(int(size), reserve=True)

    def _take(self, size: int, reserve: bool) -> object:
        chunk = size if reserve else self.chunk_size(size)
        with self._lock:
            pool = self._pools.get(chunk)
            buffer = pool.pop() if pool else None
            extended = buffer is None
        if extended:
            buffer = self._extend(chunk, size)
        with self._lock:
            self._chunk[id(buffer)] = chunk
            self._sizes[id(buffer)] = chunk
            s = self._stats
            s["InUse"] += chunk
            s["MaxInUse"] = max(s["MaxInUse"], s["InUse"])
            s["MaxAllocSize"] = max(s["MaxAllocSize"], size)
            s["NumReserves" if reserve else "NumAllocs"] += 1
            if extended:
                s["TotalAllocated"] += chunk
                s["NumArenaExtensions"] += 0 if reserve else 1
        return buffer

    def _extend(self, chunk: int, size: int) -> object:
        for attempt in (0, 1):
            try:
                with self._lock:
                    if self.arena_limit and self._held + chunk > self.arena_limit:
                        raise OutOfMemory(
                            f"{self.info.name} arena: cannot allocate {size} bytes ({chunk}-byte chunk): {self._held} "
                            f"of the {self.arena_limit}-byte arena limit held. Free device tensors, lower the "
                            "batch size, or raise the limit.")
                    self._held += chunk
                try:
                    return self.device.alloc(chunk)
                except BaseException:
                    with self._lock:
                        self._held -= chunk
                    raise
            except OutOfMemory:
                if attempt == 1 or not self.shrink():
                    raise
        raise AssertionError("unreachable")

    def free(self, buffer: object) -> None:
        with self._lock:
            chunk = self._chunk.pop(id(buffer), None)
            if chunk is None:
                raise ValueError(f"{self.info.name} arena: free() of a buffer it did not allocate")
            del self._sizes[id(buffer)]
            self._stats["InUse"] -= chunk
            self._pools.setdefault(chunk, []).append(buffer)

    def release_if_owned(self, buffer: object) -> None:
        with self._lock:
            owned = id(buffer) in self._chunk
        if owned:
            self.free(buffer)

    def shrink(self) -> bool:
        """Give every pooled buffer back to the device allocator; True if anything was freed."""
        with self._lock:
            pools, self._pools = self._pools, {}
        freed = 0
        for chunk, buffers in pools.items():
            for b in buffers:
                self.device.free(b)
                freed += chunk
        with self._lock:
            self._held -= freed
            self._stats["TotalAllocated"] -= freed
        return freed > 0

    def pooled_bytes(self) -> int:
        with self._lock:
            return sum(c * len(b) for c, b in self._pools.items())


_ARENA_CFG_KEYS = ("max_mem", "arena_extend_strategy", "initial_chunk_size_bytes", "max_dead_bytes_per_chunk",
                   "initial_growth_chunk_size_bytes", "max_power_of_two_extend_bytes")
# onnxruntime's ArenaExtendStrategy numbers; -1 is "the default" (kNextPowerOfTwo).
_STRATEGY_OF_NUMBER = {-1: NEXT_POWER_OF_TWO, 0: NEXT_POWER_OF_TWO, 1: SAME_AS_REQUESTED}


class OrtArenaCfg:
    """onnxruntime's arena configuration: ``OrtArenaCfg(max_mem, arena_extend_strategy,
    initial_chunk_size_bytes, max_dead_bytes_per_chunk)`` or ``OrtArenaCfg({key: int})`` with any of
    those keys and ``initial_growth_chunk_size_bytes``, ``max_power_of_two_extend_bytes``. -1 means
    "the default"; ``max_mem`` 0 means no limit.

    ``ArenaAllocator`` uses ``max_mem`` (its limit) and ``arena_extend_strategy`` (0
    kNextPowerOfTwo, 1 kSameAsRequested); the chunk sizes tune ORT's BFC arena, which splits chunks,
    and are kept but not used here (this arena never splits a device buffer).
    """

    __slots__ = _ARENA_CFG_KEYS

    def __init__(self, *args: object) -> None:
        values = dict.fromkeys(_ARENA_CFG_KEYS, -1)
        values["max_mem"] = 0
        if len(args) == 1 and isinstance(args[0], dict):
            for key, value in args[0].items():
                if key not in _ARENA_CFG_KEYS:
                    # onnxruntime's words, plus the keys it would take
                    raise Fail(f"Invalid OrtArenaCfg option: {key}. Valid options: {list(_ARENA_CFG_KEYS)}")
                values[key] = value
        elif len(args) == 4:
            values.update(zip(_ARENA_CFG_KEYS[:4], args))
        else:
            raise TypeError("OrtArenaCfg(max_mem, arena_extend_strategy, initial_chunk_size_bytes, "
                            f"max_dead_bytes_per_chunk) or OrtArenaCfg(dict): got {len(args)} arguments")
        for key, value in values.items():
            setattr(self, key, value)

    def __setattr__(self, key: str, value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidArgument(f"OrtArenaCfg.{key} must be an int, got {value!r}")
        if key == "max_mem" and value < 0:
            raise InvalidArgument(f"OrtArenaCfg.max_mem is a byte count (0: no limit), got {value}")
        object.__setattr__(self, key, int(value))

    @property
    def strategy(self) -> str:
        """``arena_extend_strategy`` as ``ArenaAllocator``'s strategy name."""
        name = _STRATEGY_OF_NUMBER.get(self.arena_extend_strategy)
        if name is None:
            raise InvalidArgument(f"OrtArenaCfg.arena_extend_strategy {self.arena_extend_strategy} is not -1 "
                                  "(default), 0 (kNextPowerOfTwo) or 1 (kSameAsRequested)")
        return name

    def __repr__(self) -> str:
        return "OrtArenaCfg(" + ", ".join(f"{k}={getattr(self, k)}" for k in _ARENA_CFG_KEYS) + ")"
