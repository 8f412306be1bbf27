"""Simulated hardware: the EP library of virtual NPUs and GPUs (``onnxhal.simulators``).

Each hardware profile (``simulators/profiles/*.toml`` or a TOML path) becomes a virtual hardware
device and an EP device of ``VirtualNpuExecutionProvider`` or ``VirtualGpuExecutionProvider``, run
by the OpenCL EP machinery over PoCL (see docs/simulators.md).

Switching it on:

- ``ONNXHAL_SIMULATE=generic-npu,generic-gpu`` in the environment: the runtime registers this
  library (as ``"simulators"``) at first use, right after the CPU EP;
- ``onnxhal.simulators.register_simulators("generic-npu,mobile-npu")``;
- ``register_execution_provider_library(name, "onnxhal.simulators")``: the profiles then come from
  ``ONNXHAL_SIMULATE``, else ``generic-npu,generic-gpu``.

The implementation modules are imported on first use, so importing this package costs nothing.
"""

from __future__ import annotations

import logging
import os
from typing import Any

LIBRARY_MODULE = "onnxhal.simulators"
LIBRARY_NAME = "simulators"
ENV_VAR = "ONNXHAL_SIMULATE"
DEFAULT_PROFILES = "generic-npu,generic-gpu"
NPU_EP_NAME = "VirtualNpuExecutionProvider"
GPU_EP_NAME = "VirtualGpuExecutionProvider"
EP_NAMES = (NPU_EP_NAME, GPU_EP_NAME)

# Profiles asked for by register_simulators, by registration name.
_requested: dict[str, str] = {}


def requested_profiles(registration_name: str) -> str:
    """The profile list a registration uses: register_simulators' argument, else $ONNXHAL_SIMULATE,
    else the two generic profiles."""
    return _requested.get(registration_name) or os.environ.get(ENV_VAR, "").strip() or DEFAULT_PROFILES


def create_ep_factories(registration_name: str, api: Any, logger: logging.Logger | None = None) -> list:
    """Two factories (NPU, GPU) sharing one table of simulated devices."""
    return create_factories_for_profiles(requested_profiles(registration_name), api, logger)


def create_factories_for_profiles(profiles_text: str | None, api: Any, logger: logging.Logger | None = None) -> list:
    """The two factories for ``profiles_text`` (comma-separated names or TOML paths; None: as
    ``requested_profiles``), for hosts other than onnxhal's runtime (the onnxruntime bridge)."""
    from onnxhal.hal.enums import OrtHardwareDeviceType
    from onnxhal.simulators.factory import DeviceTable, VirtualEpFactory
    from onnxhal.simulators.profiles import parse_profile_list

    profiles = parse_profile_list(profiles_text or os.environ.get(ENV_VAR, "").strip() or DEFAULT_PROFILES)
    table = DeviceTable()
    return [VirtualEpFactory(api, logger, OrtHardwareDeviceType.NPU, profiles, table),
            VirtualEpFactory(api, logger, OrtHardwareDeviceType.GPU, profiles, table)]


def release_ep_factory(factory: Any) -> None:
    """Nothing to release: OpenCL contexts and program caches live for the process."""


def register_simulators(profiles: str | list[str] | None = None, name: str = LIBRARY_NAME) -> str:
    """Register the simulated devices of ``profiles`` (names or TOML paths; a list or a comma-separated
    string; default: $ONNXHAL_SIMULATE, else generic-npu,generic-gpu) as EP library ``name``.
    Returns ``name``. Unregister with ``onnxhal.unregister_execution_provider_library(name)``."""
    from onnxhal.runtime.env.environment import register_execution_provider_library
    from onnxhal.simulators.profiles import parse_profile_list

    text = ",".join(profiles) if isinstance(profiles, (list, tuple)) else (profiles or "")
    parse_profile_list(text or requested_profiles(name))  # a bad profile raises ProfileError here, typed
    if text:
        _requested[name] = text
    try:
        register_execution_provider_library(name, LIBRARY_MODULE)
    finally:
        _requested.pop(name, None)
    return name


def simulated_library_names() -> list[str]:
    """Registration names of the libraries currently providing the virtual EPs."""
    from onnxhal.runtime.env.environment import get_environment

    return [lib.name for lib in get_environment().libraries() if any(f.name in EP_NAMES for f in lib.factories)]


def describe_backend(device: Any) -> str:
    """``"<EP> (<profile>) on OpenCL (<device>)"`` or ``"... on the host backend (<why>)"`` for a
    simulated EP device; "" for any other device."""
    md = device.ep_metadata
    if device.ep_name not in EP_NAMES or "backend" not in md:
        return ""
    where = (f"OpenCL ({md.get('opencl_device', '?')})" if md["backend"] == "opencl"
             else f"the host backend ({md.get('backend_reason', '')})")
    return f"{device.ep_name} ({md.get('simulator_profile', '')}) on {where}"


__all__ = ["describe_backend", "create_ep_factories", "create_factories_for_profiles", "release_ep_factory", "register_simulators", "simulated_library_names",
           "requested_profiles", "NPU_EP_NAME", "GPU_EP_NAME", "EP_NAMES", "ENV_VAR"]
