"""The OpenCL EP library (``OpenCLExecutionProvider``).

Register with ``register_execution_provider_library("opencl", "onnxhal.runtime.providers.opencl")``;
the registry calls ``create_ep_factories`` and, at unregistration, ``release_ep_factory``. The
implementation lives in ``factory``, ``ep``, ``memory``, ``program_cache``, ``plan_builder`` and
the kernel modules; they are imported on first use so importing onnxhal costs nothing.
"""

from __future__ import annotations

import logging
from typing import Any


def create_ep_factories(registration_name: str, api: Any, logger: logging.Logger | None = None) -> list:
    """The library's factories: one ``OpenCLEpFactory``."""
    from onnxhal.runtime.providers.opencl.factory import OpenCLEpFactory

    return [OpenCLEpFactory(api, logger)]


def release_ep_factory(factory: Any) -> None:
    """Nothing to release: contexts and program caches live for the process."""
