"""The CPU EP's optional C kernels (``_native``, built from ``_native.c`` by pyproject.toml's
ext-modules with ``optional = true``): the module where the install had a C compiler, else None,
and the switch that keeps every kernel on its numpy form (the canonical one, which the tests
compare the C routes with)."""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

from onnxhal.runtime.providers.extensions import stale_build

try:
    from onnxhal.runtime.providers.cpu.kernels import _native
except ImportError:  # no compiler at install: the kernels run their numpy forms
    _native = None

#: why the C routes are off although the module exists ("" when they are on or it was never built)
STALE = ""
if _native is not None:
    # the kernels keep to numpy until a stale extension is rebuilt
    STALE = stale_build(_native, Path(__file__).resolve().parent / "_native.c", "the CPU EP's C kernels are")
    if STALE:
        _native = None

#: set to 0, kernels built from then on take no C route
NATIVE_SWITCH = "ONNXHAL_NATIVE_KERNELS"


def native_module() -> ModuleType | None:
    """``_native`` where it was built and ``NATIVE_SWITCH`` is not 0, else None (read when a kernel
    is built)."""
    if _native is None or os.environ.get(NATIVE_SWITCH, "1") == "0":
        return None
    return _native
