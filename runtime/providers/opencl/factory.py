"""``OpenCLEpFactory``: one EP device per OpenCL device found by discovery.

A hardware device carries its usable OpenCL devices (those that passed discovery's probe) in
metadata ``opencl_devices``: comma-separated ``"<platform_index>:<device_index>"`` pairs into
``pyopencl.get_platforms()`` / ``platform.get_devices()``. The first becomes an EP device whose DEFAULT memory is that OpenCL device's
memory (see ``memory.opencl_memory_info``). Contexts are created on first use.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import pyopencl as cl

from onnxhal.hal.ep import Ep, EpFactory
from onnxhal.hal.ep_api import EpApi
from onnxhal.hal.ep_device import OrtEpDevice
from onnxhal.hal.errors import InvalidArgument
from onnxhal.hal.hardware_device import OrtHardwareDevice
from onnxhal.hal.memory_info import OrtMemoryDevice, OrtMemoryInfo
from onnxhal.runtime.providers.opencl.cost_rule import COST_DIM_OPTION, COST_RULE_OPTION, DEFAULT_COST_DIM
from onnxhal.runtime.providers.opencl.device_context import OpenCLDeviceContext, device_context
from onnxhal.runtime.providers.opencl.ep import EP_NAME, OpenCLEp
from onnxhal.runtime.providers.opencl.fusion_rules import DISABLE_FUSIONS_OPTION, parse_disabled
from onnxhal.runtime.providers.opencl.memory import (
    OpenCLAllocator,
    OpenCLDataTransfer,
    OpenCLSyncStream,
    opencl_memory_info,
)

MAX_EP_DEVICES = 8
#: The environment variable giving ``cost_rule``'s value where the provider options do not (the
#: test suite sets it "off": its tiny graphs are there to run the kernels).
COST_RULE_ENV = "ONNXHAL_OPENCL_COST_RULE"


def opencl_pairs(hardware_device: OrtHardwareDevice) -> list[tuple[int, int]]:
    """The (platform index, device index) pairs in a hardware device's ``opencl_devices`` metadata."""
    text = hardware_device.metadata.get("opencl_devices", "")
    pairs = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        try:
            p, d = (int(v) for v in item.split(":"))
        except ValueError as exc:
            raise InvalidArgument(f"hardware device metadata opencl_devices={text!r}: item {item!r} is not "
                                  "'<platform_index>:<device_index>'") from exc
        pairs.append((p, d))
    return pairs


def _cost_rule(session_options: Any) -> bool:
    """The provider option ``cost_rule`` ("on" or "off"; default $ONNXHAL_OPENCL_COST_RULE, else
    "on"): see cost_rule.py."""
    options = session_options.provider_options_for(EP_NAME) if hasattr(session_options, "provider_options_for") else {}
    value = str(options.get(COST_RULE_OPTION, os.environ.get(COST_RULE_ENV) or "on")).lower()
    if value not in ("on", "off"):
        raise InvalidArgument(f"{EP_NAME} provider option {COST_RULE_OPTION}={value!r} (or ${COST_RULE_ENV}): "
                              "expected 'on' (keep partitions smaller than their launches and copies on the "
                              "host) or 'off'")
    return value == "on"


def _cost_dim(session_options: Any) -> int:
    """The provider option ``cost_rule_dim``: the size the cost rule weighs symbolic dims at."""
    options = session_options.provider_options_for(EP_NAME) if hasattr(session_options, "provider_options_for") else {}
    text = str(options.get(COST_DIM_OPTION, DEFAULT_COST_DIM))
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise InvalidArgument(f"{EP_NAME} provider option {COST_DIM_OPTION}={text!r}: expected a positive integer "
                              f"(the size each symbolic dim is weighed at; default {DEFAULT_COST_DIM})")
    return value


def _disabled_fusions(session_options: Any) -> frozenset[str]:
    """The provider option ``disable_fusions``: fusion rules (fusion_rules.py) not applied."""
    options = session_options.provider_options_for(EP_NAME) if hasattr(session_options, "provider_options_for") else {}
    return parse_disabled(options.get(DISABLE_FUSIONS_OPTION))


def _ordinal(platform_index: int, device_index: int) -> int:
    """Position of an OpenCL device in (platform, device) order: its memory device id."""
    platforms = cl.get_platforms()
    return sum(len(pl.get_devices()) for pl in platforms[:platform_index]) + device_index


class OpenCLEpFactory(EpFactory):
    name = EP_NAME
    vendor = "onnxhal"
    vendor_id = 0
    version = "0.1.0"

    def __init__(self, api: EpApi, logger: logging.Logger | None = None) -> None:
        self.api = api
        self.logger = logger or logging.getLogger("onnxhal.opencl")
        self._cl_devices: dict[OrtMemoryDevice, cl.Device] = {}
        self._infos: dict[OrtMemoryDevice, OrtMemoryInfo] = {}
        self._allocators: dict[OrtMemoryDevice, OpenCLAllocator] = {}

    # -- devices ---------------------------------------------------------------------------
    def get_supported_devices(self, hardware_devices: Sequence[OrtHardwareDevice]) -> list[OrtEpDevice]:
        ep_devices: list[OrtEpDevice] = []
        for hw in hardware_devices:
            try:
                pairs = opencl_pairs(hw)
                platforms = cl.get_platforms() if pairs else []
            except (InvalidArgument, cl.Error) as exc:
                self.logger.warning("%s skips %r: %s", EP_NAME, hw, exc)
                continue
            # One EP device per hardware device, on the first OpenCL device that passed the probe
            # (discovery lists only those in opencl_devices): a CPU seen by Debian's PoCL and the
            # bundled one, or a GPU seen by two drivers, is still one device.
            for p, d in pairs[:1]:
                if len(ep_devices) >= MAX_EP_DEVICES:
                    break
                try:
                    dev = platforms[p].get_devices()[d]
                except (IndexError, cl.Error) as exc:
                    self.logger.warning("%s: OpenCL device %d:%d of %r not found: %s", EP_NAME, p, d, hw, exc)
                    continue
                info = opencl_memory_info(hw.type, hw.vendor_id, _ordinal(p, d))
                self._cl_devices[info.memory_device] = dev
                self._infos[info.memory_device] = info
                metadata = {"version": self.version, "opencl_device": dev.name, "opencl_platform": dev.platform.name,
                            "opencl_index": f"{p}:{d}", "opencl_driver": dev.driver_version}
                ep_device = self.api.create_ep_device(self, hw, metadata, {})
                self.api.ep_device_add_allocator_info(ep_device, info)
                ep_devices.append(ep_device)
        return ep_devices

    def device_context(self, memory_device: OrtMemoryDevice) -> OpenCLDeviceContext:
        dev = self._cl_devices.get(memory_device)
        if dev is None:
            raise InvalidArgument(f"{EP_NAME}: memory device {memory_device} is not one of this factory's "
                                  f"({[str(m) for m in self._cl_devices]}); call get_supported_devices first")
        return device_context(dev)

    def allocator(self, memory_device: OrtMemoryDevice, limit: int = 0) -> OpenCLAllocator:
        """The shared allocator of a device: sessions, outputs and device tensors all use it."""
        alloc = self._allocators.get(memory_device)
        if alloc is None:
            alloc = OpenCLAllocator(self.device_context(memory_device), self._infos[memory_device], limit)
            self._allocators[memory_device] = alloc
        return alloc

    # -- EP --------------------------------------------------------------------------------
    def create_ep(self, devices: Sequence[OrtHardwareDevice], ep_metadata: Sequence[Mapping[str, str]],
                  session_options: Any, logger: logging.Logger) -> Ep:
        for md in ep_metadata:
            index = md.get("opencl_index")
            if not index:
                continue
            p, d = (int(v) for v in index.split(":"))
            for mem, dev in self._cl_devices.items():
                if dev.int_ptr == cl.get_platforms()[p].get_devices()[d].int_ptr:
                    return OpenCLEp(self.device_context(mem), self.allocator(mem), logger or self.logger,
                                    cost_rule=_cost_rule(session_options), cost_dim=_cost_dim(session_options),
                                    disabled_fusions=_disabled_fusions(session_options))
        raise InvalidArgument(f"{EP_NAME}.create_ep: no OpenCL device in ep_metadata {list(ep_metadata)}; "
                              "create the session from this factory's EP devices")

    def create_allocator(self, memory_info: OrtMemoryInfo, options: Mapping[str, str] | None = None
                         ) -> OpenCLAllocator | None:
        limit = int((options or {}).get("memory_limit", (options or {}).get("arena.max_mem", 0)) or 0)
        return self.allocator(memory_info.memory_device, limit)

    def create_data_transfer(self) -> OpenCLDataTransfer:
        return OpenCLDataTransfer({mem: device_context(dev) for mem, dev in self._cl_devices.items()})

    def is_stream_aware(self) -> bool:
        return True

    def create_sync_stream_for_device(self, memory_device: OrtMemoryDevice,
                                      options: Mapping[str, str] | None = None) -> OpenCLSyncStream:
        return OpenCLSyncStream(self.device_context(memory_device))
