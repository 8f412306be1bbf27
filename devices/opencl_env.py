"""The process environment OpenCL drivers read, set before the first OpenCL call.

Two things must be in place before an ICD loader or a driver first looks at the environment (the
loader reads ``OCL_ICD_VENDORS`` when it first lists platforms; PoCL reads ``POCL_CACHE_DIR`` when its
platform is first opened), so ``onnxhal/__init__`` calls ``prepare_opencl_environment`` before any
onnxhal module imports pyopencl:

- ``POCL_CACHE_DIR`` under onnxhal's cache (PoCL keeps a compiled object per kernel and local size);
- Intel's CPU OpenCL runtime from the package index (``pip install -e ".[intel-opencl]"`` in the clone: packages
  ``intel-opencl-rt`` and ``intel-cmplr-lib-rt``) becomes visible. Its wheel ships an ``.icd`` file
  naming a placeholder path, so the loader never finds it; we write one naming
  ``<sys.prefix>/lib/libintelocl.so`` in a vendors folder of our own, link the system's ``.icd``
  files beside it (``OCL_ICD_VENDORS`` replaces ``/etc/OpenCL/vendors``, and Debian's PoCL must stay
  visible), and point ``OCL_ICD_VENDORS`` at that folder. Only when the user has not set
  ``OCL_ICD_VENDORS`` themselves: their setting always wins.

Every user setting wins; nothing here imports pyopencl. Both steps are cheap (a few ``stat`` calls).
"""

from __future__ import annotations

import glob
import os
import sys
from pathlib import Path

CACHE_ENV = "ONNXHAL_CACHE_DIR"
#: ``off`` disables OpenCL in onnxhal: no platform is listed, no driver is loaded, the simulated
#: devices run on the host backend. Anything else (or unset) means "use every device that probes".
OPENCL_SWITCH_ENV = "ONNXHAL_OPENCL"
SYSTEM_VENDORS_DIR = "/etc/OpenCL/vendors"
INTEL_LIBRARY = "libintelocl.so"
INTEL_ICD_NAME = "onnxhal-intel-cpu.icd"

_prepared = False


def cache_root() -> Path:
    """Root of onnxhal's OpenCL caches: ``$ONNXHAL_CACHE_DIR`` or ``~/.cache/onnxhal/opencl``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "onnxhal" / "opencl"


def opencl_disabled() -> bool:
    """True when ``ONNXHAL_OPENCL=off`` (also ``0``, ``false``, ``no``)."""
    return os.environ.get(OPENCL_SWITCH_ENV, "").strip().lower() in ("off", "0", "false", "no")


def intel_runtime_library(prefix: str | None = None) -> Path | None:
    """Intel's CPU OpenCL runtime installed in this environment by pip, if any."""
    path = Path(prefix or sys.prefix) / "lib" / INTEL_LIBRARY
    return path if path.is_file() else None


def write_intel_vendors_dir(library: Path, root: Path, system_dir: str = SYSTEM_VENDORS_DIR) -> Path:
    """A vendors folder holding an ``.icd`` naming ``library`` and links to the system's ``.icd``
    files; returns the folder. Rewritten only when it differs, so concurrent processes agree."""
    folder = root / "icd-vendors"
    folder.mkdir(parents=True, exist_ok=True)
    icd = folder / INTEL_ICD_NAME
    text = f"{library}\n"
    if not icd.is_file() or icd.read_text() != text:
        tmp = folder / f".{INTEL_ICD_NAME}.{os.getpid()}"
        tmp.write_text(text)
        os.replace(tmp, icd)
    for system_icd in sorted(glob.glob(os.path.join(system_dir, "*.icd"))):
        link = folder / f"system-{os.path.basename(system_icd)}"
        if not link.exists():
            try:
                link.symlink_to(system_icd)
            except FileExistsError:
                pass  # another process made it first
    return folder


def prepare_opencl_environment() -> None:
    """Set ``POCL_CACHE_DIR`` and, for a pip-installed Intel runtime, ``OCL_ICD_VENDORS``, unless the
    user set them. Idempotent; never raises (an unwritable cache only loses the Intel runtime)."""
    global _prepared
    if _prepared:
        return
    _prepared = True
    os.environ.setdefault("POCL_CACHE_DIR", str(cache_root() / "pocl"))
    if opencl_disabled() or "OCL_ICD_VENDORS" in os.environ:
        return
    library = intel_runtime_library()
    if library is None:
        return
    try:
        os.environ["OCL_ICD_VENDORS"] = str(write_intel_vendors_dir(library, cache_root()))
    except OSError:
        pass  # read-only home: Intel's runtime stays invisible, the other drivers are unaffected
