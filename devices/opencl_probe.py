"""Does an OpenCL device really build and run a kernel? Asked once per driver, remembered on disk.

A driver can list a device it cannot compile for: the PoCL that pip installs (LLVM 14) fails every
build on CPUs newer than its LLVM with ``unknown target CPU 'generic'`` (docs/opencl.md). So every
device discovery finds is probed with one tiny kernel: build, launch, read back, compare. A failure
costs about 10 ms, a cold success up to a second; the verdict is kept in memory for the process and
on disk under ``<cache>/probe/`` keyed by platform name and version, device name, driver and device
version, and the host CPU (a PoCL's verdict depends on it), so later processes only read a file.

A device whose probe fails is never offered by the OpenCL EP nor used by a simulated device.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
import warnings
from dataclasses import dataclass
from typing import Any

from onnxhal.devices.opencl_env import cache_root

logger = logging.getLogger("onnxhal.devices")

PROBE_VERSION = 1  # bump when the probe kernel or the check changes: old verdicts are then ignored
_N = 64
PROBE_SOURCE = r"""
__kernel void onnxhal_probe(__global const float* x, __global float* y) {
    int i = get_global_id(0);
    y[i] = exp(x[i]) * 0.5f + (float)i;
}
"""


@dataclass(frozen=True)
class ProbeVerdict:
    """``usable`` and, when not, ``reason``: the first meaningful line of the build log or error."""

    usable: bool
    reason: str = ""

    @property
    def state(self) -> str:
        return "usable" if self.usable else f"failed probe: {self.reason}"


_verdicts: dict[str, ProbeVerdict] = {}
_lock = threading.Lock()


def _host_cpu() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            fields = {}
            for line in f:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        return ""
    return "/".join(fields.get(k, "") for k in ("vendor_id", "cpu family", "model", "model name"))


def device_key(device: Any) -> str:
    """What a verdict depends on: platform, device, driver versions and the host CPU."""
    platform = device.platform
    return "|".join((platform.name, platform.version, device.name.strip(), device.driver_version.strip(),
                     device.version.strip(), _host_cpu()))


def first_log_line(text: str) -> str:
    """The line of a build log that says what went wrong (PoCL puts ``error: ...`` after a header)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        if "error" in line.lower() and not line.lower().startswith("build on"):
            return line[:300]
    return (lines[-1] if lines else "no build log")[:300]


def _run_probe(device: Any) -> ProbeVerdict:
    import numpy as np
    import pyopencl as cl

    try:
        context = cl.Context([device])
        queue = cl.CommandQueue(context, device)
        program = cl.Program(context, PROBE_SOURCE)
        try:
            with warnings.catch_warnings():  # a driver's informational build log is no failure
                warnings.simplefilter("ignore")
                program.build()
        except cl.Error as exc:
            try:
                log = program.get_build_info(device, cl.program_build_info.LOG)
            except cl.Error:
                log = ""
            return ProbeVerdict(False, first_log_line(log or str(exc)))
        x = np.linspace(-2.0, 2.0, _N, dtype=np.float32)
        y = np.empty_like(x)
        mf = cl.mem_flags
        bx = cl.Buffer(context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=x)
        by = cl.Buffer(context, mf.WRITE_ONLY, y.nbytes)
        program.onnxhal_probe(queue, (_N,), None, bx, by)
        cl.enqueue_copy(queue, y, by, is_blocking=True)
    except cl.Error as exc:
        return ProbeVerdict(False, first_log_line(str(exc)))
    want = np.exp(x.astype(np.float64)) * 0.5 + np.arange(_N)
    if not np.allclose(y, want, rtol=1e-4, atol=1e-5):
        worst = int(np.argmax(np.abs(y - want)))
        return ProbeVerdict(False, f"probe kernel computed {y[worst]!r} at {worst}, expected {want[worst]:.6g}")
    return ProbeVerdict(True)


def _disk_path(key: str):
    digest = hashlib.sha256(f"{PROBE_VERSION}|{key}".encode()).hexdigest()[:24]
    return cache_root() / "probe" / f"{digest}.json"


def _read_disk(key: str) -> ProbeVerdict | None:
    try:
        data = json.loads(_disk_path(key).read_text())
        if data.get("key") != key or data.get("version") != PROBE_VERSION:
            return None
        return ProbeVerdict(bool(data["usable"]), str(data.get("reason", "")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_disk(key: str, verdict: ProbeVerdict) -> None:
    path = _disk_path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"version": PROBE_VERSION, "key": key, "usable": verdict.usable, "reason": verdict.reason}, f)
        os.replace(tmp, path)
    except OSError:
        pass  # an unwritable cache only costs a probe in the next process


def probe_device(device: Any) -> ProbeVerdict:
    """The verdict for a ``pyopencl.Device``: from this process, from disk, or probed now."""
    try:
        key = device_key(device)
    except Exception as exc:  # noqa: BLE001 - a driver whose info queries fail is not usable
        return ProbeVerdict(False, f"querying the device failed: {exc}")
    with _lock:
        verdict = _verdicts.get(key)
        if verdict is None:
            verdict = _read_disk(key)
            if verdict is None:
                try:
                    verdict = _run_probe(device)
                except Exception as exc:  # noqa: BLE001 - a probe reports, it never raises
                    verdict = ProbeVerdict(False, f"{type(exc).__name__}: {first_log_line(str(exc))}")
                _write_disk(key, verdict)
                logger.debug("OpenCL probe of %r: %s", key, verdict.state)
            _verdicts[key] = verdict
        return verdict


def forget_verdicts() -> None:
    """Drop the verdicts kept in this process (tests; the disk cache stays)."""
    with _lock:
        _verdicts.clear()
