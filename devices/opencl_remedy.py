"""What to tell a user whose machine has no usable OpenCL device: the remedy for this system."""

from __future__ import annotations

import platform

from onnxhal.devices.opencl_env import OPENCL_SWITCH_ENV, opencl_disabled

DEBIAN_PACKAGE = "pocl-opencl-icd"
INTEL_EXTRA = "onnxhal[intel-opencl]"


def os_release(path: str = "/etc/os-release") -> dict[str, str]:
    """``/etc/os-release`` as a dict ({} where it is missing)."""
    fields: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                key, sep, value = line.strip().partition("=")
                if sep:
                    fields[key] = value.strip().strip('"')
    except OSError:
        pass
    return fields


def is_debian_like(release: dict[str, str] | None = None) -> bool:
    release = os_release() if release is None else release
    ids = {release.get("ID", ""), *release.get("ID_LIKE", "").split()}
    return bool(ids & {"debian", "ubuntu"})


def opencl_remedy(release: dict[str, str] | None = None, machine: str | None = None) -> str:
    """One paragraph: how to get a working OpenCL CPU driver here, and that nothing requires one."""
    if opencl_disabled():
        return f"OpenCL is switched off ({OPENCL_SWITCH_ENV}=off); unset it to use OpenCL devices."
    steps = []
    if is_debian_like(release):
        steps.append(f"'sudo apt-get install --no-install-recommends {DEBIAN_PACKAGE}' (PoCL built for this "
                     "distribution; it appears next to the bundled one with no setup)")
    if (machine or platform.machine()) in ("x86_64", "AMD64"):
        # onnxhal is installed from a clone (it is not on the package index): the extra is named there.
        steps.append(f"'pip install -e \".[intel-opencl]\"' in the onnxhal clone (the {INTEL_EXTRA} extra: Intel's "
                     "CPU OpenCL runtime, about 835 MB, Intel's licence)")
    if not steps:
        steps.append("install an OpenCL driver for this device (an ICD under /etc/OpenCL/vendors)")
    return ("For a working OpenCL CPU driver: " + "; or ".join(steps) + ". Optional: without one, the simulated "
            "devices run on the host backend and the OpenCL EP offers no device.")
