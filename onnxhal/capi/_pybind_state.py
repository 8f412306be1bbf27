"""onnxruntime's C-level module (``onnxruntime.capi._pybind_state``): the names its applications
import from there (``OrtValueVector``, ``OrtDevice``, ``get_model_compatibility_for_ep_devices``,
the enums, ...) are onnxhal's, looked up on first use."""

from __future__ import annotations

import enum
from typing import Any

import onnxhal


def _extra(name: str) -> Any:
    """Names that live in this module in onnxruntime but not at onnxhal's top level: the error
    classes (``from onnxruntime.capi.onnxruntime_pybind11_state import Fail``), the sparse views,
    the arena strategy enum and ``get_default_session_options``."""
    from onnxhal import errors
    from onnxhal.runtime.values import sparse_tensor

    if name in errors.__all__:
        return getattr(errors, name)
    if name in ("SparseCooView", "SparseCsrView"):
        return getattr(sparse_tensor, name)
    if name in ("ArenaExtendStrategy", "kNextPowerOfTwo", "kSameAsRequested"):
        strategy = enum.IntEnum("ArenaExtendStrategy", {"kNextPowerOfTwo": 0, "kSameAsRequested": 1})
        globals().update(ArenaExtendStrategy=strategy, kNextPowerOfTwo=strategy.kNextPowerOfTwo,
                         kSameAsRequested=strategy.kSameAsRequested)
        return globals()[name]
    if name == "get_default_session_options":
        return onnxhal.SessionOptions
    raise AttributeError(name)


_EXTRA = ("ArenaExtendStrategy", "SparseCooView", "SparseCsrView", "get_default_session_options", "kNextPowerOfTwo",
          "kSameAsRequested")


def __getattr__(name: str) -> Any:
    try:
        return _extra(name)
    except AttributeError:
        pass
    try:
        return getattr(onnxhal, name)
    except AttributeError:
        raise AttributeError(f"module 'onnxhal.capi._pybind_state' has no attribute {name!r}: onnxhal does not "
                             "offer this onnxruntime name (see docs/api-parity.md)") from None


def __dir__() -> list[str]:
    from onnxhal import errors

    return sorted({*dir(onnxhal), *errors.__all__, *_EXTRA})
