"""Dedup and order of hardware devices seen by several sources (CPU probe, sysfs, OpenCL)."""

from __future__ import annotations

import os

from onnxhal.devices import discover_hardware_devices, merge_hardware_devices
from onnxhal.devices.opencl import OpenCLDeviceRecord, hardware_device_from_record
from onnxhal.hal.enums import OrtHardwareDeviceType
from onnxhal.hal.hardware_device import OrtHardwareDevice

CPU, GPU, NPU = OrtHardwareDeviceType.CPU, OrtHardwareDeviceType.GPU, OrtHardwareDeviceType.NPU
_CL_GPU, _CL_ACCELERATOR, _CL_CPU = 1 << 2, 1 << 3, 1 << 1


def sysfs_gpu(bus_id: str, vendor_id: int = 0x10DE, device_id: int = 0x2684, card: int = 0) -> OrtHardwareDevice:
    """A GPU as ``devices.sysfs`` reports it."""
    md = {"card_idx": str(card), "pci_bus_id": bus_id}
    if vendor_id == 0x10DE:
        md["Discrete"] = "1"
    return OrtHardwareDevice(GPU, "NVIDIA" if vendor_id == 0x10DE else "Intel", vendor_id, device_id, md)


def opencl_device(platform: int, device: int, bus_id: str = "", type_bits: int = _CL_GPU,
                  vendor: str = "NVIDIA Corporation", vendor_id: int = 0x10DE) -> OrtHardwareDevice:
    """A device as ``devices.opencl`` produces it from what a driver reports."""
    record = OpenCLDeviceRecord(platform_index=platform, device_index=device, platform_name=f"platform {platform}",
                                device_name=f"device {device}", vendor=vendor, reported_vendor_id=vendor_id,
                                device_type=type_bits, driver_version="1.0", version="OpenCL 3.0",
                                global_mem_size=8 << 30, max_compute_units=46, pci_bus_id=bus_id)
    hw = hardware_device_from_record(record)
    assert hw is not None
    return hw


CPU_DEVICE = OrtHardwareDevice(CPU, "AMD", 0x1022, 0, {"logical_cores": "2", "memory_bytes": "1000"})


def test_sysfs_gpu_and_opencl_gpu_with_same_bus_id_are_one_device() -> None:
    merged = merge_hardware_devices([CPU_DEVICE], [sysfs_gpu("0000:01:00.0")],
                                    [opencl_device(0, 0, bus_id="0000:01:00.0")])
    assert [d.type for d in merged] == [CPU, GPU]
    gpu = merged[1]
    assert (gpu.vendor, gpu.vendor_id, gpu.device_id) == ("NVIDIA", 0x10DE, 0x2684)  # sysfs ids kept
    assert gpu.metadata["card_idx"] == "0" and gpu.metadata["Discrete"] == "1"
    assert gpu.metadata["opencl_devices"] == "0:0"
    assert gpu.metadata["memory_bytes"] == str(8 << 30) and gpu.metadata["compute_units"] == "46"


def test_opencl_gpu_without_bus_id_joins_the_only_candidate() -> None:
    merged = merge_hardware_devices([CPU_DEVICE], [sysfs_gpu("0000:01:00.0"), sysfs_gpu("0000:00:02.0", 0x8086, 0x46A6)],
                                    [opencl_device(0, 0)])
    assert [d.metadata.get("pci_bus_id") for d in merged] == [None, "0000:00:02.0", "0000:01:00.0"]
    assert merged[2].metadata["opencl_devices"] == "0:0"
    assert "opencl_devices" not in merged[1].metadata


def test_two_identical_cards_stay_two_and_pair_by_bus_id() -> None:
    sysfs = [sysfs_gpu("0000:41:00.0", card=1), sysfs_gpu("0000:01:00.0", card=0)]
    opencl = [opencl_device(0, 0, bus_id="0000:01:00.0"), opencl_device(0, 1, bus_id="0000:41:00.0")]
    merged = merge_hardware_devices([CPU_DEVICE], sysfs, opencl)
    gpus = [(d.metadata["pci_bus_id"], d.metadata["card_idx"], d.metadata["opencl_devices"]) for d in merged[1:]]
    assert gpus == [("0000:01:00.0", "0", "0:0"), ("0000:41:00.0", "1", "0:1")]


def test_ambiguous_opencl_gpu_is_not_guessed() -> None:
    # Two cards of one model and an OpenCL GPU with neither bus id nor device id: which one is it?
    merged = merge_hardware_devices([CPU_DEVICE], [sysfs_gpu("0000:01:00.0"), sysfs_gpu("0000:41:00.0")],
                                    [opencl_device(0, 0)])
    assert [d.type for d in merged] == [CPU, GPU, GPU, GPU]
    assert merged[3].metadata["opencl_devices"] == "0:0" and "pci_bus_id" not in merged[3].metadata


def test_different_bus_ids_never_merge_even_with_equal_ids() -> None:
    merged = merge_hardware_devices([CPU_DEVICE], [sysfs_gpu("0000:01:00.0")],
                                    [opencl_device(0, 0, bus_id="0000:02:00.0")])
    assert [d.metadata.get("pci_bus_id") for d in merged] == [None, "0000:01:00.0", "0000:02:00.0"]


def test_other_vendor_or_type_does_not_merge() -> None:
    amd = opencl_device(0, 0, vendor="Advanced Micro Devices, Inc.", vendor_id=0x1002)
    npu = opencl_device(0, 1, type_bits=_CL_ACCELERATOR)
    merged = merge_hardware_devices([CPU_DEVICE], [sysfs_gpu("0000:01:00.0")], [amd, npu])
    assert [(d.type, d.vendor_id) for d in merged] == [(CPU, 0x1022), (GPU, 0x10DE), (GPU, 0x1002), (NPU, 0x10DE)]


def test_same_gpu_on_two_opencl_platforms_is_one_device() -> None:
    merged = merge_hardware_devices([CPU_DEVICE], [], [opencl_device(0, 0, bus_id="0000:01:00.0"),
                                                       opencl_device(2, 0, bus_id="0000:01:00.0")])
    assert len(merged) == 2
    assert merged[1].metadata["opencl_devices"] == "0:0,2:0"
    assert merged[1].metadata["opencl_platform"] == "platform 0"  # earlier entry wins


def test_opencl_cpu_devices_fold_into_the_one_cpu() -> None:
    pocl = opencl_device(0, 0, type_bits=_CL_CPU, vendor="AuthenticAMD", vendor_id=0x8086)
    intel_cpu_runtime = opencl_device(1, 0, type_bits=_CL_CPU, vendor="Intel(R) Corporation", vendor_id=0x8086)
    merged = merge_hardware_devices([CPU_DEVICE], [], [pocl, intel_cpu_runtime])
    assert len(merged) == 1
    cpu = merged[0]
    assert (cpu.vendor, cpu.vendor_id, cpu.device_id) == ("AMD", 0x1022, 0)
    assert cpu.metadata["opencl_devices"] == "0:0,1:0"
    assert cpu.metadata["memory_bytes"] == "1000"  # the CPU probe's value, not OpenCL's


def test_order_cpu_gpu_npu_then_bus_id_stable() -> None:
    no_bus_a = OrtHardwareDevice(GPU, "A", 0x1, 0x1, {"tag": "a"})
    no_bus_b = OrtHardwareDevice(GPU, "B", 0x2, 0x2, {"tag": "b"})
    npu = OrtHardwareDevice(NPU, "Intel", 0x8086, 0x7D1D, {"pci_bus_id": "0000:00:0b.0"})
    gpu3 = sysfs_gpu("0000:03:00.0")
    gpu1 = sysfs_gpu("0000:01:00.0", 0x8086, 0x1234)
    merged = merge_hardware_devices([npu, no_bus_a, gpu3, CPU_DEVICE, no_bus_b, gpu1])
    assert [(d.type, d.metadata.get("pci_bus_id") or d.metadata.get("tag")) for d in merged] == [
        (CPU, None), (GPU, "0000:01:00.0"), (GPU, "0000:03:00.0"), (GPU, "a"), (GPU, "b"), (NPU, "0000:00:0b.0"),
    ]


def test_real_opencl_with_fake_sysfs_gpu(tmp_path) -> None:
    # The real PoCL CPU device joins the CPU; the sysfs GPU stays; nothing else appears.
    device_dir = tmp_path / "devices" / "pci0000:00" / "0000:01:00.0"
    device_dir.mkdir(parents=True)
    (device_dir / "vendor").write_text("0x10de\n")
    (device_dir / "device").write_text("0x2684\n")
    card = tmp_path / "class" / "drm" / "card0"
    card.mkdir(parents=True)
    os.symlink(device_dir, card / "device")
    devices = discover_hardware_devices(sysfs_root=str(tmp_path))
    assert [d.type for d in devices] == [CPU, GPU]
    assert devices[1].metadata["pci_bus_id"] == "0000:01:00.0"
    assert "opencl_devices" not in devices[1].metadata  # PoCL is not this GPU
