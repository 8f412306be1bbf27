"""The OpenCL EP's optional native replay (``_replay``, built from ``_replay.c`` by pyproject.toml's
ext-modules with ``optional = true``): a partition's recorded launches and copies enqueued by one C
call instead of one pyopencl call per launch and per changed argument.

The extension links no OpenCL library: ``replay_module`` hands it the path of the OpenCL library
this process already loaded for pyopencl (pyopencl's wheel bundles an ICD loader), found in
``/proc/self/maps``, else in pyopencl's package, else by the system's library search. Every
pyopencl handle is an ICD object that carries its driver's dispatch table, so the entry points of
any ICD loader reach the driver that made it.

Two paths, registered in the kernel path tables (``kernel_paths``): ``python_replay``
(``partition_plan._replay_step``, the canonical one) and ``native_replay``; the tests hold the
second to the first and both to onnxruntime."""

from __future__ import annotations

import ctypes.util
import glob
import os
import threading
from pathlib import Path
from types import ModuleType

from onnxhal.runtime.providers.extensions import stale_build
from onnxhal.runtime.providers.path_tables import path_table

try:
    from onnxhal.runtime.providers.opencl import _replay
except ImportError:  # no compiler at install: partitions replay from Python
    _replay = None

#: set to 0, partition states created from then on replay from Python
NATIVE_SWITCH = "ONNXHAL_NATIVE_REPLAY"

REPLAY_PATHS = path_table("opencl.partition_plan.replay",
                          "partition_plan._replay_step: one pyopencl set_arg per changed argument and one "
                          "enqueue per launch or copy")
PYTHON_REPLAY = REPLAY_PATHS.add("python_replay", "the extension _replay not built or stale, its OpenCL library "
                                 "not found, or ONNXHAL_NATIVE_REPLAY=0 when the partition state is created")
NATIVE_REPLAY = REPLAY_PATHS.add("native_replay", "the extension _replay built and current, the OpenCL library "
                                 "pyopencl loaded found, and ONNXHAL_NATIVE_REPLAY not 0 when the partition state "
                                 "is created: _replay.Recording.replay, one call per run (per IN_FLIGHT launches "
                                 "when the run has RunOptions)")

_SOURCE = Path(__file__).resolve().parent / "_replay.c"
#: why the native replay is off although it may be built ("" while it is on or not yet tried)
unavailable = ""
if _replay is None:
    unavailable = "the extension _replay is not built (no C compiler at install)"
elif unavailable := stale_build(_replay, _SOURCE, "the native replay is"):
    _replay = None

_lock = threading.Lock()
_loaded = False


def opencl_library() -> str | None:
    """The OpenCL library (ICD loader) pyopencl loaded in this process, else the one it bundles, else
    the system's; None if there is none."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rstrip("\n").split(maxsplit=5)[-1]
                if os.path.basename(path).startswith("libOpenCL") and os.path.isfile(path):
                    return path
    except OSError:  # no /proc (not Linux)
        pass
    try:
        import pyopencl
    except ImportError:
        return None
    libs = os.path.join(os.path.dirname(pyopencl.__file__), ".libs")
    bundled = sorted(glob.glob(os.path.join(libs, "libOpenCL*")))
    if bundled:
        return bundled[0]
    return ctypes.util.find_library("OpenCL")


def replay_module() -> ModuleType | None:
    """``_replay`` with its OpenCL entry points loaded, where it was built, the library was found
    and ``NATIVE_SWITCH`` is not 0; else None (``unavailable`` says why, for the first two)."""
    global _loaded, unavailable
    if _replay is None or os.environ.get(NATIVE_SWITCH, "1") == "0":
        return None
    if _loaded:
        return _replay
    with _lock:
        if not _loaded and not unavailable:
            path = opencl_library()
            if path is None:
                unavailable = "no OpenCL library found in this process, pyopencl's package or the system's"
            else:
                try:
                    _replay.load(path)
                    _loaded = True
                except OSError as exc:
                    unavailable = str(exc)
    return _replay if _loaded else None


def raise_cl_error(code: int, routine: str) -> None:
    """Raise what pyopencl raises for ``routine`` failing with ``code`` (its error classes: MemoryError
    for MEM_OBJECT_ALLOCATION_FAILURE, LogicError for INVALID_* codes, RuntimeError for the others),
    so a failed native replay reads as a failed Python one."""
    import pyopencl as cl

    try:
        name = cl.status_code.to_string(code)
    except ValueError:
        name = str(code)
    # pyopencl's errors carry ``code`` and ``routine`` in this record, which pyopencl does not export
    # (its message, empty as pyopencl leaves it, is appended to "routine failed: CODE"); where it is
    # gone the error is still of the same class, with the same text.
    record_type = getattr(getattr(cl, "_cl", None), "_ErrorRecord", None)
    record = f"{routine} failed: {name}" if record_type is None else record_type(msg="", code=code, routine=routine)
    if code == cl.status_code.MEM_OBJECT_ALLOCATION_FAILURE:
        raise cl.MemoryError(record)
    if code <= cl.status_code.INVALID_VALUE:
        raise cl.LogicError(record)
    raise cl.RuntimeError(record)
