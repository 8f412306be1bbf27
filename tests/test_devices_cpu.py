"""The CPU hardware device: ORT's vendor table on cpuinfo texts, metadata, and onnxruntime's own CPU device."""

from __future__ import annotations

import logging

import psutil
import pytest

from onnxhal.devices import discover_cpu_device, discover_hardware_devices
from onnxhal.devices.cpu import cpu_vendor_from_cpuinfo, parse_first_core
from onnxhal.hal.enums import OrtHardwareDeviceType

AMD_EPYC = """\
processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model name\t: AMD EPYC 7763 64-Core Processor
cpu MHz\t\t: 2445.426

processor\t: 1
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7763 64-Core Processor
"""

INTEL_CORE = """\
processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model name\t: 13th Gen Intel(R) Core(TM) i7-1365U

processor\t: 1
vendor_id\t: GenuineIntel
"""

HYGON = "processor\t: 0\nvendor_id\t: HygonGenuine\nmodel name\t: Hygon C86 7185 32-core Processor\n"


def aarch64(implementer: str, part: str) -> str:
    """A two-core aarch64 /proc/cpuinfo; the second core has another implementer, which must not count."""
    return (f"processor\t: 0\nBogoMIPS\t: 48.00\nFeatures\t: fp asimd evtstrm\nCPU implementer\t: {implementer}\n"
            f"CPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: {part}\nCPU revision\t: 1\n\n"
            "processor\t: 1\nCPU implementer\t: 0x53\nCPU part\t: 0x001\n\n")


# Old 32-bit ARM kernels print the implementer once, after the per-core blocks, next to the board.
ARM32_OLD = """\
Processor\t: ARMv7 Processor rev 10 (v7l)
processor\t: 0
BogoMIPS\t: 790.52

processor\t: 1
BogoMIPS\t: 790.52

Features\t: swp half thumb fastmult vfp edsp neon vfpv3 tls
CPU implementer\t: 0x41
CPU architecture: 7
CPU part\t: 0xc09

Hardware\t: Freescale i.MX 6Quad/DualLite (Device Tree)
"""


@pytest.mark.parametrize("text, vendor, vendor_id", [
    (AMD_EPYC, "AMD", 0x1022),
    (INTEL_CORE, "Intel", 0x8086),
    (HYGON, "unknown", 0),  # pytorch/cpuinfo knows Hygon, ORT's table does not
    ("processor\t: 0\nvendor_id\t: CentaurHauls\n", "unknown", 0),
    (aarch64("0x41", "0xd0c"), "ARM", 0x13B5),  # Neoverse N1
    (aarch64("0x51", "0xc00"), "Qualcomm", 0x4D4F4351),  # Falkor: a Qualcomm design
    (aarch64("0x51", "0x801"), "ARM", 0x13B5),  # Kryo 280 Silver is a Cortex-A53: cpuinfo says ARM
    (aarch64("0x4e", "0x004"), "Nvidia", 0x10DE),  # Carmel
    (aarch64("0x61", "0x023"), "Apple", 0x106B),  # M1 under Asahi Linux
    (aarch64("0x48", "0xd01"), "unknown", 0),  # HiSilicon: not in ORT's table
    (aarch64("0xc0", "0xac3"), "unknown", 0),  # Ampere
    (ARM32_OLD, "ARM", 0x13B5),
    ("processor\t: 0\nhart\t\t: 0\nisa\t\t: rv64imafdc\nmmu\t\t: sv39\n", "unknown", 0),  # RISC-V
    ("", "unknown", 0),
])
def test_cpu_vendor_table(text: str, vendor: str, vendor_id: int) -> None:
    found = cpu_vendor_from_cpuinfo(text)
    assert (found.name, found.vendor_id) == (vendor, vendor_id)


def test_qualcomm_cpu_id_is_ort_fourcc() -> None:
    # ORT builds it as 'Q' | 'C' << 8 | 'O' << 16 | 'M' << 24.
    found = cpu_vendor_from_cpuinfo(aarch64("0x51", "0xc01"))
    assert found.vendor_id == ord("Q") | ord("C") << 8 | ord("O") << 16 | ord("M") << 24


def test_first_core_fields_win_over_trailing_block() -> None:
    fields = parse_first_core(ARM32_OLD)
    assert fields["processor"] == "0"
    assert fields["CPU implementer"] == "0x41"
    assert fields["Hardware"].startswith("Freescale")


def test_cpu_device_from_fake_cpuinfo(tmp_path) -> None:
    path = tmp_path / "cpuinfo"
    path.write_text(INTEL_CORE)
    cpu = discover_cpu_device(str(path))
    assert cpu.type == OrtHardwareDeviceType.CPU
    assert (cpu.vendor, cpu.vendor_id, cpu.device_id) == ("Intel", 0x8086, 0)
    assert cpu.metadata["model_name"] == "13th Gen Intel(R) Core(TM) i7-1365U"
    assert all(isinstance(v, str) for v in cpu.metadata.values())


def test_arm_board_model_name(tmp_path) -> None:
    path = tmp_path / "cpuinfo"
    path.write_text(ARM32_OLD)
    assert discover_cpu_device(str(path)).metadata["model_name"] == "Freescale i.MX 6Quad/DualLite (Device Tree)"


def test_cpu_metadata_matches_psutil() -> None:
    md = discover_cpu_device().metadata
    assert md["logical_cores"] == str(psutil.cpu_count(logical=True))
    physical = psutil.cpu_count(logical=False)
    assert md.get("physical_cores") == (str(physical) if physical else None)
    assert md["memory_bytes"] == str(psutil.virtual_memory().total)
    freq = psutil.cpu_freq()
    if freq is not None and (freq.max or freq.current):
        assert md["frequency_mhz"] == str(round(freq.max or freq.current))
    assert set(md) <= {"physical_cores", "logical_cores", "frequency_mhz", "memory_bytes", "model_name"}


def test_unreadable_cpuinfo_gives_unknown_vendor_and_warning(tmp_path, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="onnxhal.devices"):
        cpu = discover_cpu_device(str(tmp_path / "missing"))
    assert (cpu.type, cpu.vendor, cpu.vendor_id, cpu.device_id) == (OrtHardwareDeviceType.CPU, "unknown", 0, 0)
    assert "memory_bytes" in cpu.metadata
    assert any("cannot read CPU information" in r.getMessage() for r in caplog.records)


def test_exactly_one_cpu_device(tmp_path) -> None:
    devices = discover_hardware_devices(sysfs_root=str(tmp_path), use_opencl=False)
    assert [d.type for d in devices] == [OrtHardwareDeviceType.CPU]


def test_cpu_device_equals_onnxruntime() -> None:
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime (test extra) is not installed")
    theirs = next(d.device for d in ort.get_ep_devices() if d.device.type == ort.OrtHardwareDeviceType.CPU)
    ours = discover_hardware_devices(use_opencl=False)[0]
    assert ours.type.name == theirs.type.name
    assert (ours.vendor, ours.vendor_id, ours.device_id) == (theirs.vendor, theirs.vendor_id, theirs.device_id)
