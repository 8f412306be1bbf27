"""The OpenCL EP library (``OpenCLExecutionProvider``).

Register with ``register_execution_provider_library("opencl", "onnxhal.runtime.providers.opencl")``;
the registry calls ``create_ep_factories`` and, at unregistration, ``release_ep_factory``. The
implementation lives in ``factory``, ``ep``, ``backend``, ``memory``, ``device_context``,
``plan_builder`` and the kernel modules; they are imported on first use so importing onnxhal costs
nothing.

For other EPs that run on these kernels (the simulated devices), the surface is
``backend.OpenCLBackend`` (claim by rules with the holder's node rule and split, one plan per
partition at compile, partitions with symbolic dimensions), with ``device_context``, ``memory``
(allocator, data transfer, stream) and ``dynamic_partition.DynamicPartitionPlan`` (a saved
partition): they hold these, and subclass neither ``ep.OpenCLEp`` nor ``factory.OpenCLEpFactory``.
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


def no_device_reason() -> str:
    """Why the OpenCL EP offers no device: the switch, no driver, or each device's probe verdict,
    then the remedy; one line (the session's error when ``providers=["OpenCLExecutionProvider"]``)."""
    from onnxhal.devices.opencl import enumerate_opencl_devices
    from onnxhal.devices.opencl_env import OPENCL_SWITCH_ENV, opencl_disabled
    from onnxhal.devices.opencl_remedy import opencl_remedy

    if opencl_disabled():
        return f"OpenCL is switched off ({OPENCL_SWITCH_ENV}=off); unset {OPENCL_SWITCH_ENV} to use OpenCL devices"
    records = enumerate_opencl_devices()
    if not records:
        verdict = "no OpenCL device was found (no OpenCL driver is installed)"
    else:
        verdict = "no OpenCL device passed the probe (" + "; ".join(
            f"{r.platform_index}:{r.device_index} {r.device_name}, {r.platform_name} {r.driver_version}: "
            f"{r.probe.reason or 'usable'}" for r in records) + ")"
    return f"{verdict}. {opencl_remedy()} 'onnxhal devices' shows each device's probe."
