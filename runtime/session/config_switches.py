"""Session config switches: a key whose value is "1" (the default path) or "0" (the previous one,
kept for A/B and as a way out), read and checked in one place."""

from __future__ import annotations

from collections.abc import Callable

from onnxhal.hal.errors import InvalidArgument


def switch(config: Callable[[str, str], str], key: str, on: str, off: str) -> bool:
    """Session config ``key`` read by ``config(key, default)`` with default "1": True for "1", False
    for "0"; any other value an ``InvalidArgument`` naming the key, what each value does (``on``,
    ``off``) and the value given."""
    value = config(key, "1")
    if value not in ("0", "1"):
        raise InvalidArgument(f"session config {key} must be '1' ({on}: the default) or '0' ({off}), got {value!r}")
    return value == "1"
