"""The CPU EP library (``CPUExecutionProvider``), registered implicitly by the environment."""

from __future__ import annotations

import logging
from typing import Any

from onnxhal.runtime.providers.cpu.ep import CpuEp, CpuEpFactory


def create_ep_factories(registration_name: str, api: Any, logger: logging.Logger) -> list[CpuEpFactory]:
    return [CpuEpFactory(api)]


def release_ep_factory(factory: CpuEpFactory) -> None:
    pass


__all__ = ["CpuEp", "CpuEpFactory", "create_ep_factories", "release_ep_factory"]
