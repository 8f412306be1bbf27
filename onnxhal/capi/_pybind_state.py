"""onnxruntime's C-level module (``onnxruntime.capi._pybind_state``): the names its applications
import from there (``OrtValueVector``, ``OrtDevice``, ``get_model_compatibility_for_ep_devices``,
the enums, ...) are onnxhal's, looked up on first use."""

from __future__ import annotations

from typing import Any

import onnxhal


def __getattr__(name: str) -> Any:
    try:
        return getattr(onnxhal, name)
    except AttributeError:
        raise AttributeError(f"module 'onnxhal.capi._pybind_state' has no attribute {name!r}: onnxhal does not "
                             "offer this onnxruntime name (see docs/api-parity.md)") from None


def __dir__() -> list[str]:
    return dir(onnxhal)
