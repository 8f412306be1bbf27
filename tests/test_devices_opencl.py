"""OpenCL discovery: the real PoCL CPU device, vendor-id rules, device types, and broken ICDs."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys

import pytest

from onnxhal.devices import discover_hardware_devices, opencl_devices_of
from onnxhal.devices.opencl import (
    OpenCLDeviceRecord,
    discover_opencl_devices,
    enumerate_opencl_devices,
    format_pci_bus_id,
    hardware_device_from_record,
    parse_opencl_devices,
    read_pci_bus_id,
)
from onnxhal.devices.opencl_probe import ProbeVerdict
from onnxhal.devices.vendors import opencl_vendor_id
from onnxhal.hal.enums import OrtHardwareDeviceType
from onnxhal.hal.errors import Fail, InvalidArgument
from onnxhal.hal.hardware_device import OrtHardwareDevice

cl = pytest.importorskip("pyopencl", reason="pyopencl is not installed")

CPU, GPU, NPU = OrtHardwareDeviceType.CPU, OrtHardwareDeviceType.GPU, OrtHardwareDeviceType.NPU


def _real_cpu_pairs() -> list[str]:
    """"p:d" of every OpenCL CPU device, straight from pyopencl."""
    try:
        platforms = cl.get_platforms()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"no OpenCL platform on this machine: {exc}")
    return [f"{p}:{d}" for p, platform in enumerate(platforms)
            for d, device in enumerate(platform.get_devices()) if device.type & cl.device_type.CPU]


def test_pocl_cpu_device_lands_on_cpu_metadata(tmp_path) -> None:
    pairs = _real_cpu_pairs()
    if not pairs:
        pytest.skip("no OpenCL CPU device (PoCL) on this machine")
    records = {f"{r.platform_index}:{r.device_index}": r for r in enumerate_opencl_devices()}
    usable = [p for p in pairs if records[p].probe.usable]
    unusable = [p for p in pairs if not records[p].probe.usable]
    devices = discover_hardware_devices(sysfs_root=str(tmp_path))
    assert [d.type for d in devices] == [CPU]  # no extra hardware device for PoCL
    cpu = devices[0]
    # Usable devices and those that failed the probe are listed apart; the rest of the OpenCL
    # metadata describes the first usable one (the one the OpenCL EP and the simulators use).
    assert cpu.metadata.get("opencl_devices", "") == ",".join(usable)
    assert cpu.metadata.get("opencl_unusable", "") == ",".join(unusable)
    first = (usable or unusable)[0]
    platform_index, device_index = map(int, first.split(":"))
    platform = cl.get_platforms()[platform_index]
    device = platform.get_devices()[device_index]
    assert cpu.metadata["opencl_platform"] == platform.name
    assert cpu.metadata["opencl_device"] == device.name.strip()
    assert cpu.metadata["opencl_driver_version"] == device.driver_version.strip()
    assert cpu.metadata["opencl_version"] == device.version.strip()
    assert cpu.metadata["opencl_probe"] == records[first].probe.state
    assert "compute_units" not in cpu.metadata  # PoCL's sizes are not recorded on the CPU device
    assert len(opencl_devices_of(cpu)) == len(usable)
    if usable:
        assert opencl_devices_of(cpu)[0] == device


def test_pocl_vendor_id_is_not_trusted() -> None:
    records = [r for r in enumerate_opencl_devices() if r.hardware_type == CPU]
    if not records:
        pytest.skip("no OpenCL CPU device (PoCL) on this machine")
    for record in records:
        cpu_entry = hardware_device_from_record(record)
        assert cpu_entry.vendor_id == opencl_vendor_id(record.reported_vendor_id, record.vendor, CPU)
        if record.vendor == "AuthenticAMD":  # PoCL reports Intel's 0x8086 on AMD CPUs
            assert (record.reported_vendor_id, cpu_entry.vendor_id) == (0x8086, 0x1022)


def test_pocl_has_no_pci_bus_id() -> None:
    pocl = [p for p in cl.get_platforms() if "Portable Computing Language" in p.name]
    if not pocl:
        pytest.skip("no PoCL platform on this machine")
    try:
        devices = pocl[0].get_devices()
    except cl.Error:  # CL_DEVICE_NOT_FOUND: PoCL lists none (POCL_DEVICES=none)
        devices = []
    if not devices:
        pytest.skip("the PoCL platform lists no device here (POCL_DEVICES selects none)")
    device = devices[0]
    # Even when asked for cl_khr_pci_bus_info, PoCL answers INVALID_VALUE: no bus id, no exception.
    assert read_pci_bus_id(device, "cl_khr_pci_bus_info") == ""
    assert read_pci_bus_id(device, device.extensions) == ""


def test_two_pocl_devices_in_a_subprocess() -> None:
    # POCL_DEVICES is read once per process: another topology needs another process.
    script = ("import json, pyopencl as cl; from onnxhal.devices import discover_hardware_devices, opencl_devices_of;"
              "d = discover_hardware_devices(sysfs_root='/nonexistent');"
              "pocl = [i for i, p in enumerate(cl.get_platforms()) if 'Portable Computing Language' in p.name];"
              "print(json.dumps([[x.type.name, dict(x.metadata)] for x in d] + [pocl, len(opencl_devices_of(d[0]))]))")
    env = dict(os.environ, POCL_DEVICES="basic basic")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    *devices, pocl, resolved = json.loads(out.stdout.strip().splitlines()[-1])
    # One physical CPU, however many drivers show it (a GPU driver may add its own device).
    cpus = [metadata for t, metadata in devices if t == "CPU"]
    assert len(cpus) == 1 and devices[0][0] == "CPU"
    metadata = cpus[0]
    usable = [p for p in metadata.get("opencl_devices", "").split(",") if p]
    unusable = [p for p in metadata.get("opencl_unusable", "").split(",") if p]
    # Each PoCL platform (Debian's, the bundled one) shows two devices; every one is either usable
    # or recorded as failing its probe, never lost, and the index pairs are real (platform order is
    # the ICD loader's, per process: Intel's runtime, if present, adds its own CPU device).
    pocl_pairs = {f"{p}:{d}" for p in pocl for d in (0, 1)}
    assert pocl_pairs <= set(usable + unusable)
    assert len(set(usable + unusable) - pocl_pairs) <= 1
    assert resolved == len(usable)


def test_broken_get_platforms_gives_no_opencl_devices(monkeypatch, caplog, tmp_path) -> None:
    def broken():
        raise cl.LogicError("clGetPlatformIDs failed: PLATFORM_NOT_FOUND_KHR")

    monkeypatch.setattr(cl, "get_platforms", broken)
    with caplog.at_level(logging.WARNING, logger="onnxhal.devices"):
        devices = discover_hardware_devices(sysfs_root=str(tmp_path))
    assert [d.type for d in devices] == [CPU]
    assert "opencl_devices" not in devices[0].metadata
    assert any("get_platforms() failed" in r.getMessage() and r.name == "onnxhal.devices" for r in caplog.records)


def test_missing_pyopencl_gives_no_opencl_devices(monkeypatch, caplog) -> None:
    monkeypatch.setitem(sys.modules, "pyopencl", None)  # makes "import pyopencl" raise ImportError
    with caplog.at_level(logging.WARNING, logger="onnxhal.devices"):
        assert discover_opencl_devices() == []
    assert any("cannot import pyopencl" in r.getMessage() for r in caplog.records)


class _PlatformWithBrokenDevice:
    """Wraps a real platform; its first device fails every query, as a crashing driver would."""

    class _BrokenDevice:
        def __getattr__(self, name: str):
            raise cl.RuntimeError(f"clGetDeviceInfo({name}) failed: OUT_OF_RESOURCES")

    def __init__(self, real) -> None:
        self.name = real.name
        self._real = real

    def get_devices(self):
        return [self._BrokenDevice(), *self._real.get_devices()]


class _EmptyPlatform:
    name = "empty"

    def get_devices(self):
        raise cl.RuntimeError("clGetDeviceIDs failed: DEVICE_NOT_FOUND")


def test_broken_device_query_is_skipped_and_others_kept(monkeypatch, caplog) -> None:
    real = cl.get_platforms()
    monkeypatch.setattr(cl, "get_platforms", lambda: [_EmptyPlatform(), _PlatformWithBrokenDevice(real[0])])
    with caplog.at_level(logging.WARNING, logger="onnxhal.devices"):
        records = enumerate_opencl_devices()
    assert [(r.platform_index, r.device_index) for r in records] == [(1, i + 1) for i in range(len(real[0].get_devices()))]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "OpenCL device 1:0 skipped" in warnings[0] and "OUT_OF_RESOURCES" in warnings[0]  # the empty platform is not a fault


def _record(device_type: int, vendor: str = "NVIDIA Corporation", vendor_id: int = 0x10DE,
            pci_bus_id: str = "0000:01:00.0") -> OpenCLDeviceRecord:
    return OpenCLDeviceRecord(platform_index=1, device_index=2, platform_name="NVIDIA CUDA",
                              device_name="NVIDIA GeForce RTX 4090", vendor=vendor, reported_vendor_id=vendor_id,
                              device_type=device_type, driver_version="550.54", version="OpenCL 3.0 CUDA",
                              global_mem_size=25_386_352_640, max_compute_units=128, pci_bus_id=pci_bus_id)


def test_gpu_record_becomes_gpu_hardware_device() -> None:
    hw = hardware_device_from_record(_record(int(cl.device_type.GPU)))
    assert (hw.type, hw.vendor, hw.vendor_id, hw.device_id) == (GPU, "NVIDIA", 0x10DE, 0)
    assert dict(hw.metadata) == {
        "opencl_devices": "1:2", "opencl_platform": "NVIDIA CUDA", "opencl_device": "NVIDIA GeForce RTX 4090",
        "opencl_driver_version": "550.54", "opencl_version": "OpenCL 3.0 CUDA",
        "memory_bytes": "25386352640", "compute_units": "128", "pci_bus_id": "0000:01:00.0",
        "opencl_probe": "usable",
    }


def test_record_that_failed_its_probe_is_listed_apart() -> None:
    """A device the driver lists but cannot compile for stays visible (discovery, ``onnxhal devices``)
    with the probe's reason, and is not in ``opencl_devices``, which every OpenCL user reads."""
    record = dataclasses.replace(_record(int(cl.device_type.GPU)),
                                 probe=ProbeVerdict(False, "error: unknown target CPU 'generic'"))
    hw = hardware_device_from_record(record)
    assert "opencl_devices" not in hw.metadata
    assert hw.metadata["opencl_unusable"] == "1:2"
    assert hw.metadata["opencl_probe"] == "failed probe: error: unknown target CPU 'generic'"
    assert opencl_devices_of(hw) == []


@pytest.mark.parametrize("type_bits, expected", [
    (int(cl.device_type.ACCELERATOR), NPU),
    (int(cl.device_type.CUSTOM), NPU),
    (int(cl.device_type.GPU | cl.device_type.DEFAULT), GPU),
    (int(cl.device_type.CPU | cl.device_type.DEFAULT), CPU),
    (int(cl.device_type.DEFAULT), None),
])
def test_device_types(type_bits: int, expected) -> None:
    hw = hardware_device_from_record(_record(type_bits, pci_bus_id=""))
    assert (hw.type if hw else None) == expected
    if hw is not None and expected != CPU:
        assert "pci_bus_id" not in hw.metadata  # no bus id known: none invented


@pytest.mark.parametrize("vendor, reported, device_type, expected", [
    ("NVIDIA Corporation", 0x10DE, GPU, 0x10DE),
    ("NVIDIA Corporation", 0x10006, GPU, 0x10DE),  # a Khronos id, not PCI: derived from the name
    ("Advanced Micro Devices, Inc.", 0x1002, GPU, 0x1002),
    ("Advanced Micro Devices, Inc.", 0x1022, CPU, 0x1022),
    ("AuthenticAMD", 0x8086, CPU, 0x1022),  # PoCL on an AMD CPU
    ("AMD", 0x8086, GPU, 0x1002),
    ("Intel(R) Corporation", 0x8086, GPU, 0x8086),
    ("GenuineIntel", 0x8086, CPU, 0x8086),
    ("Intel(R) Corporation", 0x10DE, NPU, 0x8086),  # disagrees with the name: name wins
    ("QUALCOMM", 0x5143, GPU, 0x5143),
    ("Qualcomm Technologies, Inc", 0x17CB, NPU, 0x17CB),
    ("ARM", 0x13B5, GPU, 0x13B5),
    ("Apple", 0x1027F00, GPU, 0x106B),
    ("The pocl project", 0x10006, CPU, 0),  # unknown name: 0, whatever the driver says
    ("Mesa", 0x1002, GPU, 0),
    ("Pharmacy Devices", 0x13B5, GPU, 0),  # "arm" inside a word is not ARM
])
def test_vendor_id_rules(vendor: str, reported: int, device_type, expected: int) -> None:
    assert opencl_vendor_id(reported, vendor, device_type) == expected


def test_format_pci_bus_id() -> None:
    assert format_pci_bus_id(0, 1, 0, 0) == "0000:01:00.0"
    assert format_pci_bus_id(0x10, 0xAB, 0x1F, 7) == "0010:ab:1f.7"


def test_opencl_devices_of_errors() -> None:
    plain = OrtHardwareDevice(GPU, "NVIDIA", 0x10DE, 0x2684, {"pci_bus_id": "0000:01:00.0"})
    assert opencl_devices_of(plain) == []
    with pytest.raises(InvalidArgument, match="opencl_devices"):
        opencl_devices_of(OrtHardwareDevice(GPU, "x", 0, 0, {"opencl_devices": "0-0"}))
    with pytest.raises(Fail, match="platform 99"):
        opencl_devices_of(OrtHardwareDevice(GPU, "x", 0, 0, {"opencl_devices": "99:0"}))
    with pytest.raises(Fail, match="0:99"):
        opencl_devices_of(OrtHardwareDevice(GPU, "x", 0, 0, {"opencl_devices": "0:99"}))
    assert parse_opencl_devices("0:0, 1:12") == [(0, 0), (1, 12)]
