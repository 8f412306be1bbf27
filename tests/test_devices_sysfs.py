"""GPUs and NPUs from fake Linux sysfs trees (real directories and symlinks, laid out as the kernel does)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from onnxhal.devices import discover_hardware_devices
from onnxhal.devices.sysfs import discover_accel_npus, discover_drm_gpus, discover_sysfs_devices, discover_sysfs_gpus
from onnxhal.hal.enums import OrtHardwareDeviceType


class FakeSysfs:
    """Builds a sysfs tree: devices under ``devices/pci0000:00``, classes linking to them."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def pci_device(self, bus_id: str, vendor: str | None, device: str | None, pci_class: str = "0x030000",
                   driver: str | None = None) -> Path:
        path = self.root / "devices" / "pci0000:00" / bus_id
        path.mkdir(parents=True)
        for name, text in (("vendor", vendor), ("device", device), ("class", pci_class)):
            if text is not None:
                (path / name).write_text(text + "\n")
        if driver:
            driver_dir = self.root / "bus" / "pci" / "drivers" / driver
            driver_dir.mkdir(parents=True, exist_ok=True)
            self._link(path / "driver", driver_dir)
        self._link(self.root / "bus" / "pci" / "devices" / bus_id, path)
        return path

    def platform_device(self, name: str, files: dict[str, str] | None = None) -> Path:
        path = self.root / "devices" / "platform" / name
        path.mkdir(parents=True)
        for file_name, text in (files or {}).items():
            (path / file_name).write_text(text + "\n")
        return path

    def class_entry(self, cls: str, name: str, device: Path | None) -> Path:
        entry = self.root / "class" / cls / name
        entry.mkdir(parents=True)
        if device is not None:
            self._link(entry / "device", device)
        return entry

    @staticmethod
    def _link(link: Path, target: Path) -> None:
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(target, link.parent), link)  # relative, as the kernel's links are


@pytest.fixture
def sysfs(tmp_path) -> FakeSysfs:
    return FakeSysfs(tmp_path / "sys")


def _by_bus(devices):
    return {d.metadata["pci_bus_id"]: d for d in devices}


def test_discrete_nvidia_and_integrated_intel(sysfs) -> None:
    nvidia = sysfs.pci_device("0000:01:00.0", "0x10de", "0x2684", driver="nvidia")
    intel = sysfs.pci_device("0000:00:02.0", "0x8086", "0x46a6", driver="i915")
    sysfs.class_entry("drm", "card0", nvidia)
    sysfs.class_entry("drm", "card1", intel)
    gpus = discover_drm_gpus(str(sysfs.root))
    assert [d.metadata["card_idx"] for d in gpus] == ["0", "1"]
    by_bus = _by_bus(gpus)
    nv, igpu = by_bus["0000:01:00.0"], by_bus["0000:00:02.0"]
    assert (nv.type, nv.vendor, nv.vendor_id, nv.device_id) == (OrtHardwareDeviceType.GPU, "NVIDIA", 0x10DE, 0x2684)
    assert dict(nv.metadata) == {"card_idx": "0", "pci_bus_id": "0000:01:00.0", "driver": "nvidia", "Discrete": "1"}
    assert (igpu.vendor, igpu.vendor_id, igpu.device_id) == ("Intel", 0x8086, 0x46A6)
    assert dict(igpu.metadata) == {"card_idx": "1", "pci_bus_id": "0000:00:02.0", "driver": "i915"}


def test_amd_discrete_rule(sysfs) -> None:
    dgpu = sysfs.pci_device("0000:03:00.0", "0x1002", "0x744c", driver="amdgpu")
    (dgpu / "mem_info_vram_vendor").write_text("samsung\n")
    apu = sysfs.pci_device("0000:c1:00.0", "0x1002", "0x15bf", driver="amdgpu")
    sysfs.class_entry("drm", "card0", dgpu)
    sysfs.class_entry("drm", "card1", apu)
    by_bus = _by_bus(discover_drm_gpus(str(sysfs.root)))
    assert by_bus["0000:03:00.0"].metadata.get("Discrete") == "1"
    assert "Discrete" not in by_bus["0000:c1:00.0"].metadata
    assert by_bus["0000:c1:00.0"].vendor == "AMD"


def test_connectors_and_render_nodes_are_not_cards(sysfs) -> None:
    gpu = sysfs.pci_device("0000:01:00.0", "0x10de", "0x2684")
    sysfs.class_entry("drm", "card0", gpu)
    for name in ("card0-HDMI-A-1", "card0-DP-1", "renderD128", "cardX"):
        sysfs.class_entry("drm", name, gpu)
    (sysfs.root / "class" / "drm" / "version").write_text("drm 1.1.0 20060810\n")
    gpus = discover_drm_gpus(str(sysfs.root))
    assert [(d.vendor_id, d.metadata["card_idx"]) for d in gpus] == [(0x10DE, "0")]


def test_bad_entries_are_skipped_and_the_rest_kept(sysfs, caplog) -> None:
    good = sysfs.pci_device("0000:01:00.0", "0x10de", "0x2684")
    sysfs.class_entry("drm", "card1", good)
    # card0: simple-framebuffer, a platform device with no PCI ids (ORT issue #26763)
    sysfs.class_entry("drm", "card0", sysfs.platform_device("simple-framebuffer.0"))
    # card2: a PCI function without a vendor file
    sysfs.class_entry("drm", "card2", sysfs.pci_device("0000:02:00.0", None, "0x1234"))
    # card3: an unreadable vendor file (a directory where the file should be; root can read any file)
    unreadable = sysfs.pci_device("0000:03:00.0", None, "0x1234")
    (unreadable / "vendor").mkdir()
    sysfs.class_entry("drm", "card3", unreadable)
    # card4: a vendor file that is not hex
    sysfs.class_entry("drm", "card4", sysfs.pci_device("0000:04:00.0", "garbage", "0x1234"))
    # card5: no device link at all; card6: a dangling one
    sysfs.class_entry("drm", "card5", None)
    dangling = sysfs.class_entry("drm", "card6", None)
    os.symlink("../../../devices/pci0000:00/0000:09:00.0", dangling / "device")
    # card7: a non-PCI device that does have vendor/device files (e.g. virtio on another bus)
    sysfs.class_entry("drm", "card7", sysfs.platform_device("virtio0", {"vendor": "0x1af4", "device": "0x0010"}))
    with caplog.at_level(logging.DEBUG, logger="onnxhal.devices"):
        gpus = discover_drm_gpus(str(sysfs.root))
    assert [(d.vendor_id, d.metadata["card_idx"]) for d in gpus] == [(0x10DE, "1")]
    skipped = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipping DRM card")]
    assert len(skipped) == 7
    assert any("card0" in m and "not a PCI device" in m for m in skipped)
    assert any("card2" in m and "no vendor file" in m for m in skipped)
    assert any("card4" in m and "not a hex number" in m for m in skipped)


def test_npus_under_accel(sysfs, caplog) -> None:
    npu = sysfs.pci_device("0000:00:0b.0", "0x8086", "0x7d1d", pci_class="0x120000", driver="intel_vpu")
    xdna = sysfs.pci_device("0000:c6:00.1", "0x1022", "0x17f0", pci_class="0x118000", driver="amdxdna")
    sysfs.class_entry("accel", "accel0", npu)
    sysfs.class_entry("accel", "accel1", xdna)
    # accel2: an NPU on a platform bus (e.g. Rockchip): not PCI, skipped; accel3: no vendor file
    sysfs.class_entry("accel", "accel2", sysfs.platform_device("fdab0000.npu", {"vendor": "0x1234"}))
    sysfs.class_entry("accel", "accel3", sysfs.pci_device("0000:05:00.0", None, "0x0001"))
    with caplog.at_level(logging.DEBUG, logger="onnxhal.devices"):
        npus = discover_accel_npus(str(sysfs.root))
    assert [(d.type, d.vendor, d.vendor_id, d.device_id) for d in npus] == [
        (OrtHardwareDeviceType.NPU, "Intel", 0x8086, 0x7D1D),
        (OrtHardwareDeviceType.NPU, "AMD", 0x1022, 0x17F0),
    ]
    assert dict(npus[0].metadata) == {"accel_idx": "0", "pci_bus_id": "0000:00:0b.0", "driver": "intel_vpu"}
    assert npus[1].metadata["pci_bus_id"] == "0000:c6:00.1"
    assert sum(r.getMessage().startswith("skipping accel device") for r in caplog.records) == 2


def test_pci_display_fallback_when_drm_has_no_card(sysfs) -> None:
    sysfs.pci_device("0000:00:03.0", "0x1af4", "0x1041", pci_class="0x020000")  # network: ignored
    sysfs.pci_device("0000:00:1e.0", "0x10de", "0x1eb8", pci_class="0x030200", driver="nvidia")  # 3D controller
    sysfs.pci_device("0000:00:1f.0", "0x1d0f", "0xefa1", pci_class="0x030000")  # display, vendor not in table
    (sysfs.root / "class" / "drm").mkdir(parents=True)
    gpus = discover_sysfs_gpus(str(sysfs.root))
    assert [(d.vendor_id, d.device_id, d.vendor) for d in gpus] == [(0x10DE, 0x1EB8, "NVIDIA"), (0x1D0F, 0xEFA1, "")]
    assert dict(gpus[0].metadata) == {"pci_bus_id": "0000:00:1e.0", "driver": "nvidia", "Discrete": "1"}


def test_pci_fallback_unused_when_drm_has_cards(sysfs) -> None:
    card = sysfs.pci_device("0000:01:00.0", "0x10de", "0x2684")
    sysfs.pci_device("0000:02:00.0", "0x1a03", "0x2000")  # ASPEED BMC without DRM driver
    sysfs.class_entry("drm", "card0", card)
    assert [d.metadata["pci_bus_id"] for d in discover_sysfs_gpus(str(sysfs.root))] == ["0000:01:00.0"]


def test_missing_root_gives_nothing(tmp_path) -> None:
    assert discover_sysfs_devices(str(tmp_path / "no-such-sys")) == []


def test_whole_discovery_on_fake_tree(sysfs) -> None:
    # Card numbers run opposite to bus order: the result is ordered by bus id.
    sysfs.class_entry("drm", "card0", sysfs.pci_device("0000:01:00.0", "0x10de", "0x2684"))
    sysfs.class_entry("drm", "card1", sysfs.pci_device("0000:00:02.0", "0x8086", "0x46a6"))
    sysfs.class_entry("accel", "accel0", sysfs.pci_device("0000:00:0b.0", "0x8086", "0x7d1d", "0x120000"))
    devices = discover_hardware_devices(sysfs_root=str(sysfs.root), use_opencl=False)
    assert [(d.type, d.metadata.get("pci_bus_id")) for d in devices] == [
        (OrtHardwareDeviceType.CPU, None),
        (OrtHardwareDeviceType.GPU, "0000:00:02.0"),
        (OrtHardwareDeviceType.GPU, "0000:01:00.0"),
        (OrtHardwareDeviceType.NPU, "0000:00:0b.0"),
    ]
    # Pure: a second call looks again and sees a device added since.
    sysfs.class_entry("accel", "accel1", sysfs.pci_device("0000:c6:00.1", "0x1022", "0x17f0", "0x118000"))
    assert len(discover_hardware_devices(sysfs_root=str(sysfs.root), use_opencl=False)) == 5
