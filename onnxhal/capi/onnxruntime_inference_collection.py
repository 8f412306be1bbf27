"""onnxruntime's ``onnxruntime.capi.onnxruntime_inference_collection``: the Python classes
(``InferenceSession``, ``OrtValue``, ``IOBinding``, ``ModelCompiler``, ``OrtDevice``, ...) are
onnxhal's, and ``check_and_normalize_provider_args`` normalizes providers as onnxruntime does."""

from __future__ import annotations

import collections.abc
import warnings
from collections.abc import Sequence
from typing import Any

from onnxhal.capi._pybind_state import __getattr__  # noqa: F401 - the classes, on first use


def check_and_normalize_provider_args(providers: Sequence[str | tuple[str, dict[Any, Any]]] | None,
                                      provider_options: Sequence[dict[Any, Any]] | None,
                                      available_provider_names: Sequence[str]) -> tuple[list[str], list[dict]]:
    """(provider names, one options dict of str to str each) from ``providers`` (names or
    (name, options) tuples) and ``provider_options``, as onnxruntime's: a name not available or
    given twice is a warning (the duplicate is dropped), malformed arguments a ValueError."""
    if providers is None:
        return [], []
    normalized: dict[str, dict[str, str]] = {}

    def add(name: str, options: dict) -> None:
        if name not in available_provider_names:
            warnings.warn(f"Specified provider '{name}' is not in available provider names.Available providers: "
                          f"'{', '.join(available_provider_names)}'", stacklevel=3)
        if name in normalized:
            warnings.warn(f"Duplicate provider '{name}' encountered, ignoring.", stacklevel=3)
            return
        normalized[name] = {str(k): str(v) for k, v in options.items()}

    if not isinstance(providers, collections.abc.Sequence):
        raise ValueError("'providers' should be a sequence.")
    if provider_options is not None:
        if not isinstance(provider_options, collections.abc.Sequence):
            raise ValueError("'provider_options' should be a sequence.")
        if len(providers) != len(provider_options):
            raise ValueError("'providers' and 'provider_options' should be the same length if both are given.")
        if not all(isinstance(p, str) for p in providers):
            raise ValueError("Only string values for 'providers' are supported if 'provider_options' is given.")
        if not all(isinstance(o, dict) for o in provider_options):
            raise ValueError("'provider_options' values must be dicts.")
        for name, options in zip(providers, provider_options):
            add(name, options)
    else:
        for p in providers:
            if isinstance(p, str):
                add(p, {})
            elif isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], dict):
                add(p[0], p[1])
            else:
                raise ValueError("'providers' values must be either strings or (string, dict) tuples.")
    return list(normalized), list(normalized.values())
