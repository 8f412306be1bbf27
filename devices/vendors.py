"""Vendor names and ids: PCI vendor ids for GPUs and NPUs, ONNX Runtime's ids for CPUs.

Two tables, because ONNX Runtime itself uses two conventions:

- hardware on a bus (GPUs, NPUs) is named by its PCI-SIG vendor id (NVIDIA 0x10DE, AMD GPU 0x1002, ...);
- the CPU is named by ORT's own CPU vendor table (``onnxruntime/core/common/cpuid_info_vendor.cc``),
  which has PCI ids for most vendors but the four bytes "QCOM" for Qualcomm and "Nvidia" spelled so.

Also here: matching an OpenCL vendor string ("NVIDIA Corporation", "Advanced Micro Devices, Inc.",
"AuthenticAMD", "Intel(R) Corporation", ...) to a PCI vendor id.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnxhal.hal.enums import OrtHardwareDeviceType

# --- PCI vendor ids (PCI-SIG), for devices on a bus -----------------------------------------------------

PCI_VENDOR_NVIDIA = 0x10DE
PCI_VENDOR_AMD_GPU = 0x1002  # ATI's id, kept by AMD for Radeon/Instinct GPUs
PCI_VENDOR_AMD = 0x1022  # AMD's own id: CPUs, chipsets and the Ryzen AI (XDNA) NPU
PCI_VENDOR_INTEL = 0x8086
PCI_VENDOR_ARM = 0x13B5
PCI_VENDOR_QUALCOMM_ORT = 0x5143  # "QC": what ORT and Adreno's OpenCL driver use
PCI_VENDOR_QUALCOMM_PCI = 0x17CB  # what PCI-SIG assigned to Qualcomm
PCI_VENDOR_APPLE = 0x106B

_PCI_VENDOR_NAMES: dict[int, str] = {
    PCI_VENDOR_NVIDIA: "NVIDIA",
    PCI_VENDOR_AMD_GPU: "AMD",
    PCI_VENDOR_AMD: "AMD",
    PCI_VENDOR_INTEL: "Intel",
    PCI_VENDOR_ARM: "ARM",
    PCI_VENDOR_QUALCOMM_ORT: "Qualcomm",
    PCI_VENDOR_QUALCOMM_PCI: "Qualcomm",
    PCI_VENDOR_APPLE: "Apple",
    0x1414: "Microsoft",
    0x19E5: "Huawei",
    0x1010: "Imagination Technologies",
    0x1A03: "ASPEED",  # server BMC graphics: a DRM card on many servers
    0x102B: "Matrox",
    0x1AF4: "Red Hat (virtio)",
    0x15AD: "VMware",
    0x1234: "QEMU",
    0x1D17: "Zhaoxin",
    0x1E60: "Hailo",
    0x1E52: "Tenstorrent",
    0x1AE0: "Google",
}


def pci_vendor_name(vendor_id: int) -> str:
    """Display name of a PCI vendor id, or "" when the id is not in our table."""
    return _PCI_VENDOR_NAMES.get(vendor_id, "")


def is_pci_vendor_id(value: int) -> bool:
    """A PCI vendor id is 16 bits and neither 0 nor 0xFFFF (OpenCL's Khronos ids start at 0x10000)."""
    return 0 < value < 0xFFFF


@dataclass(frozen=True)
class _NamedVendor:
    """One vendor as OpenCL drivers spell it: lower-case substrings to look for, the PCI ids that
    are really this vendor's, and the id to use per device type when the driver's id is wrong."""

    patterns: tuple[str, ...]
    pci_ids: frozenset[int]
    gpu_id: int
    other_id: int  # CPU and NPU


# Order matters: the first entry whose pattern occurs in the vendor string wins.
_OPENCL_VENDORS: tuple[_NamedVendor, ...] = (
    _NamedVendor(("nvidia",), frozenset({PCI_VENDOR_NVIDIA}), PCI_VENDOR_NVIDIA, PCI_VENDOR_NVIDIA),
    _NamedVendor(("advanced micro devices", "authenticamd", "amd"),
                 frozenset({PCI_VENDOR_AMD_GPU, PCI_VENDOR_AMD}), PCI_VENDOR_AMD_GPU, PCI_VENDOR_AMD),
    _NamedVendor(("intel", "genuineintel"), frozenset({PCI_VENDOR_INTEL}), PCI_VENDOR_INTEL, PCI_VENDOR_INTEL),
    _NamedVendor(("qualcomm",), frozenset({PCI_VENDOR_QUALCOMM_ORT, PCI_VENDOR_QUALCOMM_PCI}),
                 PCI_VENDOR_QUALCOMM_ORT, PCI_VENDOR_QUALCOMM_ORT),
    _NamedVendor(("apple",), frozenset({PCI_VENDOR_APPLE}), PCI_VENDOR_APPLE, PCI_VENDOR_APPLE),
    _NamedVendor(("arm",), frozenset({PCI_VENDOR_ARM}), PCI_VENDOR_ARM, PCI_VENDOR_ARM),
    _NamedVendor(("imagination",), frozenset({0x1010}), 0x1010, 0x1010),
)


def _find_named_vendor(vendor_name: str) -> _NamedVendor | None:
    lowered = vendor_name.lower()
    for vendor in _OPENCL_VENDORS:
        if any(_contains_word(lowered, p) for p in vendor.patterns):
            return vendor
    return None


def _contains_word(text: str, word: str) -> bool:
    """``word`` occurs in ``text`` not glued to other letters ("arm" must not match "pharmacy";
    "amd" must match "AMD" and "amd-gpu" but not "amdahl")."""
    start = text.find(word)
    while start >= 0:
        end = start + len(word)
        before = text[start - 1] if start > 0 else " "
        after = text[end] if end < len(text) else " "
        if not before.isalpha() and not after.isalpha():
            return True
        start = text.find(word, start + 1)
    return False


def pci_vendor_id_for_name(vendor_name: str, device_type: OrtHardwareDeviceType) -> int:
    """PCI vendor id for an OpenCL vendor string; 0 when the name is not one we know.

    AMD has two ids: 0x1002 for GPUs, 0x1022 for CPUs and NPUs."""
    vendor = _find_named_vendor(vendor_name)
    if vendor is None:
        return 0
    return vendor.gpu_id if device_type == OrtHardwareDeviceType.GPU else vendor.other_id


def opencl_vendor_id(reported_id: int, vendor_name: str, device_type: OrtHardwareDeviceType) -> int:
    """The vendor id to trust for an OpenCL device.

    ``CL_DEVICE_VENDOR_ID`` is used only when it is a PCI id that belongs to the vendor the
    driver names (PoCL on an AMD CPU reports 0x8086); otherwise the id is derived from the name;
    a name we do not know gives 0."""
    vendor = _find_named_vendor(vendor_name)
    if vendor is None:
        return 0
    if is_pci_vendor_id(reported_id) and reported_id in vendor.pci_ids:
        return reported_id
    return vendor.gpu_id if device_type == OrtHardwareDeviceType.GPU else vendor.other_id


# --- CPU vendors, as ONNX Runtime names them --------------------------------------------------------------

@dataclass(frozen=True)
class CpuVendor:
    """ORT's name and id for a CPU vendor."""

    name: str
    vendor_id: int


CPU_VENDOR_UNKNOWN = CpuVendor("unknown", 0)
CPU_VENDOR_AMD = CpuVendor("AMD", 0x1022)
CPU_VENDOR_INTEL = CpuVendor("Intel", 0x8086)
CPU_VENDOR_ARM = CpuVendor("ARM", 0x13B5)
# ORT: 'Q' | 'C' << 8 | 'O' << 16 | 'M' << 24, i.e. 0x4D4F4351
CPU_VENDOR_QUALCOMM = CpuVendor("Qualcomm", int.from_bytes(b"QCOM", "little"))
CPU_VENDOR_NVIDIA = CpuVendor("Nvidia", 0x10DE)
CPU_VENDOR_APPLE = CpuVendor("Apple", 0x106B)

# x86 CPUID vendor strings (the ``vendor_id`` line of /proc/cpuinfo). ORT maps only these two;
# Hygon, VIA, Zhaoxin and the rest are known to cpuinfo but not to ORT's table: "unknown".
X86_CPU_VENDORS: dict[str, CpuVendor] = {
    "AuthenticAMD": CPU_VENDOR_AMD,
    "GenuineIntel": CPU_VENDOR_INTEL,
}

# ARM ``CPU implementer`` codes (MIDR bits 31:24). The implementers that pytorch/cpuinfo knows but
# ORT's table does not (Broadcom 0x42, Cavium 0x43, HiSilicon 0x48, Samsung 0x53, ...) are "unknown".
ARM_CPU_IMPLEMENTERS: dict[int, CpuVendor] = {
    0x41: CPU_VENDOR_ARM,
    0x4E: CPU_VENDOR_NVIDIA,
    0x51: CPU_VENDOR_QUALCOMM,
    0x61: CPU_VENDOR_APPLE,
    0x69: CPU_VENDOR_INTEL,  # XScale
}

# Qualcomm "Kryo" cores that are Arm Cortex designs: pytorch/cpuinfo (which ORT uses) reports
# their vendor as ARM, not Qualcomm. Keyed by ``CPU part``.
QUALCOMM_PARTS_DESIGNED_BY_ARM = frozenset({
    0x800,  # Kryo 260/280 Gold: Cortex-A73
    0x801,  # Kryo 260/280 Silver: Cortex-A53
    0x802,  # Kryo 385 Gold: Cortex-A75
    0x803,  # Kryo 385 Silver: Cortex-A55
    0x804,  # Kryo 485 Gold: Cortex-A76
    0x805,  # Kryo 485 Silver: Cortex-A55
})


def arm_cpu_vendor(implementer: int, part: int | None) -> CpuVendor:
    """ORT's vendor for an ARM core from its MIDR implementer and part numbers."""
    if implementer == 0x51 and part in QUALCOMM_PARTS_DESIGNED_BY_ARM:
        return CPU_VENDOR_ARM
    return ARM_CPU_IMPLEMENTERS.get(implementer, CPU_VENDOR_UNKNOWN)
