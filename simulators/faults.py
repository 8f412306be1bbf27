"""Fault injection for simulated devices: a lost device, failing allocations and compiles,
transient errors and a slow device.

Faults come from a profile's ``[faults]`` table and, per session, from provider options with a
``fault_`` prefix (``fault_device_lost_after_runs``, ``fault_alloc_fail_after_bytes``,
``fault_compile_fail``, ``fault_transient_error_rate``, ``fault_seed``, ``fault_slowdown``); a
provider option wins over the profile. Every fault is counted per session (per EP instance), so
sessions do not disturb each other and a test is deterministic.

How each one surfaces:

- lost device: after N runs, every compute raises ``EPFail`` (the session's CPU fallback or
  ``session.ep_failover`` can take over); the device stays lost for that session.
- allocation failure: the allocation that takes the bytes allocated since the last injected failure
  past N raises ``OutOfMemory``; the count then restarts, so the session stays usable.
- compile failure: ``compile`` raises ``EPFail``; the runtime gives the nodes to the CPU EP (or
  fails session creation when CPU fallback is disabled).
- transient error: each partition's compute fails with probability p (seeded) with
  ``TransientDeviceError``, a ``RuntimeException``: not an EP failure, so the session does not fall
  back and the next run may succeed.
- slowdown: simulated device time is multiplied by the factor, and compute really takes that much
  longer in wall-clock time (it sleeps).
"""

from __future__ import annotations

import dataclasses
import math
import re
import threading
from collections.abc import Mapping, Sequence

import numpy as np

from onnxhal.hal.allocator import Allocator
from onnxhal.hal.errors import EPFail, InvalidArgument, OutOfMemory, RuntimeException
from onnxhal.hal.tensor import DeviceTensor
from onnxhal.simulators.profiles import FAULT_RANGES, Faults

OPTION_PREFIX = "fault_"
_KINDS = {"device_lost_after_runs": int, "alloc_fail_after_bytes": int, "compile_fail": bool,
          "transient_error_rate": float, "seed": int, "slowdown": float}
_INT = re.compile(r"[+-]?[0-9]+")


class TransientDeviceError(RuntimeException):
    """An injected, retryable device error (``fault_transient_error_rate``)."""


class DeviceLost(EPFail):
    """The simulated device is gone (``fault_device_lost_after_runs``): an ``EPFail``."""


def allowed(field: str) -> str:
    """What option ``fault_<field>`` accepts, in words."""
    kind = _KINDS[field]
    if kind is bool:
        return "1/0 or true/false"
    lo, hi = FAULT_RANGES[field]
    if kind is int:
        return f"an integer in [{lo}, {hi}]" + (" (-1: never)" if lo == -1 else "")
    return f"a finite number in [{lo:g}, {hi:g}]"


def _bad(key: str, text: str, field: str) -> InvalidArgument:
    return InvalidArgument(f"provider option {key}={text!r}: expected {allowed(field)}. Fix or remove the option.")


def _parse(key: str, field: str, text: str) -> bool | int | float:
    kind = _KINDS[field]
    value = text.strip()
    if kind is bool:
        low = value.lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off", ""):
            return False
        raise _bad(key, text, field)
    if kind is int:
        if not _INT.fullmatch(value):
            raise _bad(key, text, field)
        number: int | float = int(value)
    else:
        try:
            number = float(value)
        except ValueError:
            raise _bad(key, text, field) from None
        if not math.isfinite(number):
            raise _bad(key, text, field)
    lo, hi = FAULT_RANGES[field]
    if not lo <= number <= hi:
        raise _bad(key, text, field)
    return number


def faults_with_options(base: Faults, options: Mapping[str, str]) -> Faults:
    """``base`` with every ``fault_*`` provider option applied. An unknown ``fault_`` key, a value of
    the wrong kind or out of its range (``FAULT_RANGES``) raises ``InvalidArgument`` naming the
    option, the value and what is allowed: at session creation, before any run."""
    changes = {}
    for key, text in options.items():
        if not key.startswith(OPTION_PREFIX):
            continue
        field = key[len(OPTION_PREFIX):]
        if field not in _KINDS:
            raise InvalidArgument(f"unknown provider option {key!r}; fault options are "
                                  f"{', '.join(OPTION_PREFIX + k for k in _KINDS)}")
        if not isinstance(text, str):  # options reach EPs as strings; a direct caller may pass anything
            raise InvalidArgument(f"provider option {key}={text!r}: a {type(text).__name__}; provider option "
                                  f"values are strings: give {allowed(field)} as a string")
        changes[field] = _parse(key, field, text)
    return dataclasses.replace(base, **changes)


class FaultState:
    """The faults of one EP instance and their counters."""

    def __init__(self, faults: Faults, ep_name: str, device_name: str) -> None:
        self.faults = faults
        self.ep_name = ep_name
        self.device_name = device_name
        self.runs = 0
        self.lost = False
        self._rng = np.random.default_rng(faults.seed)
        self._lock = threading.Lock()

    def on_run_start(self) -> None:
        with self._lock:
            self.runs += 1
            n = self.faults.device_lost_after_runs
            if n >= 0 and self.runs > n:
                self.lost = True

    def before_compute(self) -> None:
        """Raise the injected error this compute meets, if any."""
        if self.lost:
            raise DeviceLost(f"{self.ep_name}: simulated device {self.device_name!r} was lost after "
                             f"{self.faults.device_lost_after_runs} run(s) (fault_device_lost_after_runs). "
                             "Run on the remaining EPs (session.ep_failover=1) or create a new session.")
        rate = self.faults.transient_error_rate
        if rate > 0.0:
            with self._lock:
                hit = self._rng.random() < rate
            if hit:
                raise TransientDeviceError(
                    f"{self.ep_name}: transient error on simulated device {self.device_name!r} "
                    f"(fault_transient_error_rate={rate}, seed {self.faults.seed}); retry the run")

    def check_compile(self) -> None:
        if self.faults.compile_fail:
            raise EPFail(f"{self.ep_name}: compiling for simulated device {self.device_name!r} failed "
                         "(fault_compile_fail); its nodes go to the next EP")


class FaultInjectingAllocator(Allocator):
    """Wraps a device's shared allocator for one session: forwards every request, but fails the one
    that takes the bytes allocated since the last injected failure past ``after_bytes``."""

    def __init__(self, inner: Allocator, after_bytes: int, device_name: str) -> None:
        super().__init__(inner.info, 0)
        self.inner = inner
        self.after_bytes = int(after_bytes)
        self.device_name = device_name
        self.injected = 0
        self._since = 0
        self._count_lock = threading.Lock()  # the base holds self._lock around _alloc

    @property
    def device(self):  # the OpenCL EP's partitions read allocator.device
        return self.inner.device

    def _alloc(self, size: int) -> object:
        with self._count_lock:
            if self._since + size > self.after_bytes:
                self._since = 0
                self.injected += 1
                raise OutOfMemory(
                    f"{self.info.name} allocator: injected allocation failure for {size} bytes on simulated device "
                    f"{self.device_name!r} (fault_alloc_fail_after_bytes={self.after_bytes}); the next "
                    f"{self.after_bytes} bytes will succeed")
            self._since += size
        return self.inner.alloc(size)

    def _free(self, buffer: object) -> None:
        self.inner.free(buffer)

    def tensor(self, shape: Sequence[int], dtype: np.dtype) -> DeviceTensor:
        return DeviceTensor.allocate(tuple(shape), np.dtype(dtype), self)
