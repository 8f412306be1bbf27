"""The optional C extensions' shared check: an editable install whose C source changed after the
build must not let the old binary stand in for the new source (the CPU EP's ``_native``, the
OpenCL EP's ``_replay``)."""

from __future__ import annotations

import logging
from pathlib import Path
from types import ModuleType


def stale_build(module: ModuleType, source: Path, what: str) -> str:
    """Why ``module`` must not be used ("" where it may): it was built before ``source`` last
    changed. ``what`` names what is off meanwhile, as the start of the logged warning's clause."""
    if not source.is_file() or Path(module.__file__).stat().st_mtime >= source.stat().st_mtime:
        return ""
    reason = f"{module.__file__} is older than {source}: {what} off until it is rebuilt (pip install --no-deps -e .)"
    logging.getLogger("onnxhal").warning(reason)
    return reason
