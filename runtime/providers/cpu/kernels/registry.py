"""Kernel registry of the CPU EP: classes found by (domain, op type), the opset in ``since``.

As in onnx.reference, the kernel picked for a node is the registration with the highest ``since``
not above the node's opset. Modules in this package register on import; ``lookup`` imports them
all once, lazily.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
import threading
from collections.abc import Callable

from onnxhal.hal import Kernel

_REGISTRY: dict[tuple[str, str], list[tuple[int, type[Kernel]]]] = {}
_loaded = False
_logger = logging.getLogger(__name__)
_load_lock = threading.Lock()


def register(op_type: str, since: int = 1, domain: str = "") -> Callable[[type[Kernel]], type[Kernel]]:
    """Class decorator: ``@register("Relu", since=14)``. Register once per version range."""

    def deco(cls: type[Kernel]) -> type[Kernel]:
        entries = _REGISTRY.setdefault((domain, op_type), [])
        entries.append((since, cls))
        entries.sort(key=lambda e: e[0])
        return cls

    return deco


def _load_all() -> None:
    global _loaded
    with _load_lock:
        if _loaded:
            return
        import onnxhal.runtime.providers.cpu.kernels as pkg

        for mod in pkgutil.iter_modules(pkg.__path__):
            if mod.name != "registry":
                try:
                    importlib.import_module(f"{pkg.__name__}.{mod.name}")
                except Exception:  # one broken kernel module must not take down the whole CPU EP
                    _logger.exception("CPU kernel module %r failed to import; its ops fall back to "
                                      "onnx.reference", mod.name)
        _loaded = True


def lookup(domain: str, op_type: str, opset: int) -> type[Kernel] | None:
    """Native kernel class for an op at an opset, or None (the caller may fall back to onnx.reference)."""
    if not _loaded:
        _load_all()
    entries = _REGISTRY.get(("" if domain == "ai.onnx" else domain, op_type))
    if not entries:
        return None
    best = None
    for since, cls in entries:
        if since <= opset:
            best = cls
    return best


def registered_ops() -> list[tuple[str, str]]:
    if not _loaded:
        _load_all()
    return sorted(_REGISTRY)
