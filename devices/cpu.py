"""The CPU hardware device: vendor from /proc/cpuinfo (as ONNX Runtime names it), sizes from psutil."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import psutil

from onnxhal.devices.vendors import (
    CPU_VENDOR_UNKNOWN,
    X86_CPU_VENDORS,
    CpuVendor,
    arm_cpu_vendor,
)
from onnxhal.hal.enums import OrtHardwareDeviceType
from onnxhal.hal.hardware_device import OrtHardwareDevice

logger = logging.getLogger("onnxhal.devices")

DEFAULT_CPUINFO_PATH = "/proc/cpuinfo"


def parse_first_core(cpuinfo_text: str) -> dict[str, str]:
    """The ``key: value`` fields of the first processor block of /proc/cpuinfo text.

    x86 kernels print one block per logical CPU; ARM kernels do too, and some (32-bit) append a
    machine-wide block (``Hardware``, ``Model``) after the last core: fields from that block are
    kept when the first core does not have them."""
    first: dict[str, str] = {}
    trailing: dict[str, str] = {}
    block: dict[str, str] = {}
    blocks_seen = 0
    for line in cpuinfo_text.splitlines() + [""]:
        if not line.strip():
            if block:
                if blocks_seen == 0:
                    first = block
                elif "processor" not in block:
                    trailing.update(block)
                blocks_seen += 1
                block = {}
            continue
        key, sep, value = line.partition(":")
        if sep:
            block.setdefault(key.strip(), value.strip())
    for key, value in trailing.items():
        first.setdefault(key, value)
    return first


def _parse_int(text: str | None) -> int | None:
    """An integer field of cpuinfo: ``0x41`` (hex) or ``65``; None when absent or malformed."""
    if not text:
        return None
    try:
        return int(text, 0)
    except ValueError:
        return None


def cpu_vendor_from_fields(fields: Mapping[str, str]) -> CpuVendor:
    """ORT's vendor for the core described by ``fields`` (x86 ``vendor_id`` or ARM ``CPU implementer``)."""
    x86_vendor = fields.get("vendor_id")
    if x86_vendor:
        return X86_CPU_VENDORS.get(x86_vendor, CPU_VENDOR_UNKNOWN)
    implementer = _parse_int(fields.get("CPU implementer"))
    if implementer is not None:
        return arm_cpu_vendor(implementer, _parse_int(fields.get("CPU part")))
    return CPU_VENDOR_UNKNOWN


def cpu_vendor_from_cpuinfo(cpuinfo_text: str) -> CpuVendor:
    """ORT's vendor for the first core of /proc/cpuinfo text."""
    return cpu_vendor_from_fields(parse_first_core(cpuinfo_text))


def _model_name(fields: Mapping[str, str]) -> str:
    # x86: "model name"; ARM boards with a device tree: "Model" (machine) or "Hardware" (SoC).
    for key in ("model name", "Model", "Hardware", "cpu model"):
        if fields.get(key):
            return fields[key]
    return ""


def _frequency_mhz() -> int | None:
    """Maximum frequency in MHz; in VMs without cpufreq the kernel gives no maximum (psutil says
    0.0), so the current frequency stands in."""
    try:
        freq = psutil.cpu_freq()
    except (OSError, RuntimeError, NotImplementedError) as exc:
        logger.debug("psutil.cpu_freq() failed: %s", exc)
        return None
    if freq is None:
        return None
    mhz = freq.max or freq.current
    return round(mhz) if mhz else None


def cpu_metadata(fields: Mapping[str, str]) -> dict[str, str]:
    """The CPU device's metadata: ``physical_cores``, ``logical_cores``, ``frequency_mhz``,
    ``memory_bytes``, ``model_name``. A key whose value the OS does not give is left out."""
    metadata: dict[str, str] = {}
    physical = psutil.cpu_count(logical=False)
    logical = psutil.cpu_count(logical=True)
    if physical:
        metadata["physical_cores"] = str(physical)
    if logical:
        metadata["logical_cores"] = str(logical)
    mhz = _frequency_mhz()
    if mhz:
        metadata["frequency_mhz"] = str(mhz)
    metadata["memory_bytes"] = str(psutil.virtual_memory().total)
    model = _model_name(fields)
    if model:
        metadata["model_name"] = model
    return metadata


def _read_cpuinfo(cpuinfo_path: str) -> str:
    try:
        with open(cpuinfo_path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError as exc:
        # Not fatal: ORT too falls back to "unknown" when it cannot identify the CPU.
        logger.warning("cannot read CPU information from %r (%s); CPU vendor reported as 'unknown'",
                       cpuinfo_path, exc)
        return ""


def discover_cpu_device(cpuinfo_path: str = DEFAULT_CPUINFO_PATH) -> OrtHardwareDevice:
    """The one CPU hardware device: ``type`` CPU, ORT's vendor name and id, ``device_id`` 0."""
    fields = parse_first_core(_read_cpuinfo(cpuinfo_path))
    vendor = cpu_vendor_from_fields(fields)
    return OrtHardwareDevice(OrtHardwareDeviceType.CPU, vendor.name, vendor.vendor_id, 0, cpu_metadata(fields))
