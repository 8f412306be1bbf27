"""``VirtualEpFactory``: one simulated device per profile, run by the OpenCL EP on PoCL, or on the
host backend (the CPU EP's kernels) when no OpenCL device passed discovery's probe.

Each profile becomes a virtual hardware device made with ``api.create_hardware_device`` (so it is
marked ``is_virtual`` = "1"; its metadata carries the profile's figures) and one EP device on it.
The EP device's DEFAULT memory is ``OrtMemoryInfo.create_v2(<"VirtualNpu(name)">, NPU|GPU,
<profile vendor_id>, <ordinal among the profiles of that type and vendor>, DEFAULT, ...)``: distinct per profile and from host
memory, so the runtime really copies values in and out (the bytes live in PoCL buffers). The device
allocator enforces the profile's memory capacity. The NPU and GPU factories share one table of
simulated devices, so their data transfers can also copy between a simulated NPU and GPU.

The backend is chosen per registration, in ``get_supported_devices``: the first usable OpenCL
device discovery recorded (``opencl_devices`` holds only devices that passed the probe), else the
host (``simulators/host_backend.py``), with one warning per process saying why. Hardware and EP
device metadata ``backend`` say which.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyopencl as cl

from onnxhal.hal.data_transfer import DataTransfer
from onnxhal.hal.enums import (
    OrtAllocatorType,
    OrtCompiledModelCompatibility,
    OrtDeviceMemoryType,
    OrtHardwareDeviceType,
    OrtMemoryInfoDeviceType,
)
from onnxhal.hal.ep import Ep, EpFactory
from onnxhal.hal.ep_api import EpApi
from onnxhal.hal.ep_device import OrtEpDevice
from onnxhal.hal.errors import InvalidArgument
from onnxhal.hal.hardware_device import OrtHardwareDevice
from onnxhal.hal.memory_info import OrtMemoryDevice, OrtMemoryInfo
from onnxhal.hal.sync_stream import SyncStream
from onnxhal.runtime.providers.opencl.device_context import OpenCLDeviceContext, device_context
from onnxhal.runtime.providers.opencl.factory import opencl_pairs
from onnxhal.runtime.providers.opencl.memory import (
    OpenCLAllocator,
    OpenCLDataTransfer,
    OpenCLHeldCopies,
    OpenCLSyncStream,
    pair_copier,
)
from onnxhal.simulators import GPU_EP_NAME, NPU_EP_NAME
from onnxhal.simulators.cost import Meter
from onnxhal.simulators.device_memory import ChargingMixin, carried_elsewhere, meter_transfers
from onnxhal.simulators.ep import HostVirtualEp, VirtualEp, compatibility_string
from onnxhal.simulators.faults import FaultInjectingAllocator, FaultState, faults_with_options
from onnxhal.simulators.host_backend import (
    BACKEND_HOST,
    BACKEND_OPENCL,
    HOST_COMPAT_KEY,
    HostDataTransfer,
    HostDeviceAllocator,
)
from onnxhal.simulators.profiles import Profile

logger = logging.getLogger("onnxhal.simulators")

EP_NAMES = {OrtHardwareDeviceType.NPU: NPU_EP_NAME, OrtHardwareDeviceType.GPU: GPU_EP_NAME}
_MEMORY_TYPES = {OrtHardwareDeviceType.NPU: OrtMemoryInfoDeviceType.NPU,
                 OrtHardwareDeviceType.GPU: OrtMemoryInfoDeviceType.GPU}


@dataclass
class SimulatedDevice:
    profile: Profile
    cl_device: cl.Device | None  # None on the host backend
    info: OrtMemoryInfo
    meter: Meter  # transfers nobody else claims (a data transfer used outside a session)


class SimulatedDeviceAllocator(ChargingMixin, OpenCLAllocator):
    """A simulated device's memory on the OpenCL backend: ``cl.Buffer``s, capped at the profile's
    capacity; ``charge`` counts a partition's uploaded weights against the same cap."""


class DeviceTable:
    """Simulated devices of one library registration, by memory device (shared by its factories),
    and the backend they run on (``"opencl"`` or ``"host"``, set by the first ``get_supported_devices``)."""

    def __init__(self) -> None:
        self.devices: dict[OrtMemoryDevice, SimulatedDevice] = {}
        self.backend = ""
        self.backend_reason = ""  # why the host backend, when it is


_host_warned = False
_host_warned_lock = threading.Lock()


def no_opencl_reason(hardware_devices: Sequence[OrtHardwareDevice]) -> str:
    """Why no OpenCL device can run simulated devices, from discovery's metadata."""
    from onnxhal.devices.opencl_env import OPENCL_SWITCH_ENV, opencl_disabled

    if opencl_disabled():
        return f"{OPENCL_SWITCH_ENV}=off"
    failed = [f"{hw.metadata.get('opencl_device', '?')} ({hw.metadata.get('opencl_platform', '?')}): "
              f"{hw.metadata.get('opencl_probe', 'failed probe')}"
              for hw in hardware_devices if hw.metadata.get("opencl_unusable")]
    if failed:
        return "no OpenCL device passed the probe: " + "; ".join(failed)
    return "no OpenCL device found (no driver installed)"


def _warn_host_backend(reason: str) -> None:
    global _host_warned
    with _host_warned_lock:
        if _host_warned:
            return
        _host_warned = True
    logger.warning("simulated devices run on the host backend (the CPU EP's kernels, fp16 emulated with numpy): "
                   "%s. Placement, memory, fp16, faults and costs follow the profiles as on OpenCL. For a "
                   "working OpenCL CPU driver see docs/opencl.md ('apt-get install pocl-opencl-icd' on "
                   "Debian/Ubuntu, or pip install -e '.[intel-opencl]' in the onnxhal clone).", reason)

#: (type, vendor id, PCI device id) -> the device's ordinal among the simulated devices of its type and
#: vendor, given once per process so a device keeps its memory identity across registrations.
_ORDINALS: dict[tuple[OrtHardwareDeviceType, int, int], int] = {}
_ordinals_lock = threading.Lock()


def memory_ordinal(profile: Profile) -> int:
    with _ordinals_lock:
        key = (profile.type, profile.vendor_id, profile.device_id)
        if key not in _ORDINALS:
            _ORDINALS[key] = sum(1 for t, v, _ in _ORDINALS if (t, v) == key[:2])
        return _ORDINALS[key]


def memory_info_for(profile: Profile) -> OrtMemoryInfo:
    """The profile's device memory. Its device id is the device's ordinal among the simulated
    devices of its type and vendor, as onnxruntime numbers devices (a 16-bit index): the profile's
    PCI device id (0x9A49 for integrated-gpu) does not fit, and onnxruntime refuses it."""
    ordinal = memory_ordinal(profile)
    prefix = "VirtualNpu" if profile.type == OrtHardwareDeviceType.NPU else "VirtualGpu"
    return OrtMemoryInfo.create_v2(f"{prefix}({profile.name})", _MEMORY_TYPES[profile.type], profile.vendor_id,
                                   ordinal, OrtDeviceMemoryType.DEFAULT, 0, OrtAllocatorType.ORT_DEVICE_ALLOCATOR)


def find_opencl_device(hardware_devices: Sequence[OrtHardwareDevice]) -> tuple[cl.Device, str] | None:
    """The OpenCL device simulated devices run on: the first one discovery recorded on a
    hardware device (PoCL's CPU device here), with its "p:d" index."""
    for hw in hardware_devices:
        try:
            pairs = opencl_pairs(hw)
        except InvalidArgument:
            continue
        for p, d in pairs:
            try:
                return cl.get_platforms()[p].get_devices()[d], f"{p}:{d}"
            except (IndexError, cl.Error):
                continue
    return None


class VirtualDataTransfer(OpenCLDataTransfer):
    """OpenCL copies that also charge the simulated host-link time to a meter: the session's EP
    meter for its own device, else the device's own meter."""

    def __init__(self, table: DeviceTable, own: OrtMemoryDevice | None, own_meter: Meter | None) -> None:
        super().__init__({m: device_context(s.cl_device) for m, s in table.devices.items()})
        self.table = table
        self.own = own
        self.own_meter = own_meter

    def can_copy(self, src_memory_device: OrtMemoryDevice, dst_memory_device: OrtMemoryDevice) -> bool:
        if carried_elsewhere(self.own, src_memory_device, dst_memory_device):
            return False
        return super().can_copy(src_memory_device, dst_memory_device)

    def copy_tensors(self, src: Sequence[object], dst: Sequence[object],
                     streams: Sequence[SyncStream | None] | None = None) -> None:
        super().copy_tensors(src, dst, streams)
        meter_transfers(self.table, self.own, self.own_meter, list(src), list(dst))

    def copy_tensors_held(self, src: Sequence[object], dst: Sequence[object],
                          streams: Sequence[SyncStream | None]) -> OpenCLHeldCopies:
        held = super().copy_tensors_held(src, dst, streams)
        meter_transfers(self.table, self.own, self.own_meter, list(src), list(dst))
        return held

    def held_copier(self, src_memory_device: OrtMemoryDevice, dst_memory_device: OrtMemoryDevice,
                    stream: SyncStream) -> Callable[[object, object], OpenCLHeldCopies] | None:
        copier = pair_copier(self.devices, src_memory_device, dst_memory_device, stream)
        if copier is None:
            return None
        table, own, meter = self.table, self.own, self.own_meter

        def metered(s: object, d: object) -> OpenCLHeldCopies:  # as copy_tensors_held: copied, then metered
            held = copier(s, d)
            meter_transfers(table, own, meter, [s], [d])
            return held
        return metered


class VirtualEpFactory(EpFactory):
    """The factory of ``VirtualNpuExecutionProvider`` or ``VirtualGpuExecutionProvider``."""

    vendor = "onnxhal"
    vendor_id = 0
    version = "0.1.0"

    def __init__(self, api: EpApi, logger: logging.Logger | None, hardware_type: OrtHardwareDeviceType,
                 profiles: Sequence[Profile], table: DeviceTable) -> None:
        self.api = api
        self.logger = logger or logging.getLogger("onnxhal.simulators")
        self.name = EP_NAMES[hardware_type]
        self.hardware_type = hardware_type
        self.profiles = [p for p in profiles if p.type == hardware_type]
        self.table = table
        self._by_profile: dict[str, OrtMemoryDevice] = {}
        self._sim_allocators: dict[OrtMemoryDevice, SimulatedDeviceAllocator | HostDeviceAllocator] = {}
        self._sim_lock = threading.Lock()

    def get_supported_devices(self, hardware_devices: Sequence[OrtHardwareDevice]) -> list[OrtEpDevice]:
        if not self.profiles:
            return []
        found = find_opencl_device(hardware_devices)
        cl_dev, index = found if found is not None else (None, "")
        if not self.table.backend:
            self.table.backend = BACKEND_OPENCL if cl_dev is not None else BACKEND_HOST
            if cl_dev is None:
                self.table.backend_reason = no_opencl_reason(hardware_devices)
        if self.table.backend == BACKEND_HOST:
            cl_dev, index = None, ""
            _warn_host_backend(self.table.backend_reason)
        ep_devices = []
        for profile in self.profiles:
            hw_metadata = {**profile.hardware_metadata(), "backend": self.table.backend}
            hw = self.api.create_hardware_device(profile.type, profile.vendor_id, profile.device_id, profile.vendor,
                                                 hw_metadata)
            info = memory_info_for(profile)
            mem = info.memory_device
            self._by_profile[profile.name] = mem
            self.table.devices[mem] = SimulatedDevice(profile, cl_dev, info, Meter(profile))
            metadata = {"version": self.version, "simulator_profile": profile.name, "backend": self.table.backend}
            if cl_dev is not None:
                metadata.update({"opencl_device": cl_dev.name, "opencl_index": index})
            else:
                metadata["backend_reason"] = self.table.backend_reason
            ep_device = self.api.create_ep_device(self, hw, metadata, {})
            self.api.ep_device_add_allocator_info(ep_device, info)
            ep_devices.append(ep_device)
        return ep_devices

    def _device(self, memory_device: OrtMemoryDevice) -> SimulatedDevice:
        sim = self.table.devices.get(memory_device)
        if sim is None or sim.profile.type != self.hardware_type:
            raise InvalidArgument(f"{self.name}: memory device {memory_device} is not one of this factory's simulated "
                                  "devices; call get_supported_devices first")
        return sim

    @property
    def on_host(self) -> bool:
        return self.table.backend == BACKEND_HOST

    def device_context(self, memory_device: OrtMemoryDevice) -> OpenCLDeviceContext:
        sim = self._device(memory_device)
        if sim.cl_device is None:
            raise InvalidArgument(f"{self.name}: simulated device {sim.profile.name!r} runs on the host backend "
                                  f"({self.table.backend_reason}); it has no OpenCL context")
        return device_context(sim.cl_device)

    def allocator(self, memory_device: OrtMemoryDevice, limit: int = 0
                  ) -> SimulatedDeviceAllocator | HostDeviceAllocator:
        """The device's shared allocator, capped at the profile's memory capacity."""
        with self._sim_lock:
            alloc = self._sim_allocators.get(memory_device)
            if alloc is None:
                sim = self._device(memory_device)
                capacity = sim.profile.capacity_bytes
                limit = min(limit, capacity) if limit else capacity
                if self.on_host:
                    alloc = HostDeviceAllocator(sim.info, limit)
                else:
                    alloc = SimulatedDeviceAllocator(self.device_context(memory_device), sim.info, limit)
                self._sim_allocators[memory_device] = alloc
            return alloc

    def is_stream_aware(self) -> bool:
        return not self.on_host  # the host backend finishes each partition before compute returns

    def create_sync_stream_for_device(self, memory_device: OrtMemoryDevice,
                                      options: Mapping[str, str] | None = None) -> OpenCLSyncStream | None:
        return None if self.on_host else OpenCLSyncStream(self.device_context(memory_device))

    def create_ep(self, devices: Sequence[OrtHardwareDevice], ep_metadata: Sequence[Mapping[str, str]],
                  session_options: Any, logger: logging.Logger) -> Ep:
        mem = next((self._by_profile[md["simulator_profile"]] for md in ep_metadata
                    if md.get("simulator_profile") in self._by_profile), None)
        if mem is None:
            raise InvalidArgument(f"{self.name}.create_ep: no simulated device in ep_metadata {list(ep_metadata)}; "
                                  "create the session from this factory's EP devices")
        sim = self.table.devices[mem]
        options = session_options.provider_options_for(self.name) if session_options is not None else {}
        faults = faults_with_options(sim.profile.faults, options)
        profile = sim.profile.with_options(options)  # e.g. the QNN EP's fp16 switch
        allocator = self.allocator(mem)
        if faults.alloc_fail_after_bytes >= 0:
            allocator = FaultInjectingAllocator(allocator, faults.alloc_fail_after_bytes, sim.profile.name)
        fault_state = FaultState(faults, self.name, sim.profile.name)
        if self.on_host:
            ep: VirtualEp = HostVirtualEp(self.name, allocator, sim.info, profile, fault_state,
                                          logger or self.logger, self.allocator(mem))
        else:
            ep = VirtualEp(self.name, self.device_context(mem), allocator, sim.info, profile, fault_state,
                           logger or self.logger, self.allocator(mem))
        # The session's copies into and out of this device charge this EP's meter.
        ep.data_transfer = self._data_transfer(mem, ep.meter)
        ep.configure_graph_capture(options)
        return ep

    def validate_compiled_model_compatibility_info(self, devices: Sequence[OrtHardwareDevice],
                                                   info: str) -> OrtCompiledModelCompatibility:
        """OPTIMAL when ``info`` (an EPContext model's ``ep_compatibility_info.<EP>``) is what this EP
        writes for one of ``devices``, UNSUPPORTED otherwise (another profile, OpenCL device or version)."""
        for hw in devices:
            mem = self._by_profile.get(hw.metadata.get("simulator_profile", ""))
            if mem is None:
                continue
            sim = self.table.devices[mem]
            key = HOST_COMPAT_KEY if self.on_host else self.device_context(mem).device_key
            if info == compatibility_string(self.name, sim.profile, key):
                return OrtCompiledModelCompatibility.EP_SUPPORTED_OPTIMAL
        return OrtCompiledModelCompatibility.EP_UNSUPPORTED

    def create_data_transfer(self) -> VirtualDataTransfer | HostDataTransfer:
        """Copies between host memory and the simulated devices, charged to each device's own meter
        (a session's EP has its own transfer, ``VirtualEp.create_data_transfer``)."""
        return self._data_transfer(None, None)

    def _data_transfer(self, own: OrtMemoryDevice | None, meter: Meter | None) -> VirtualDataTransfer | HostDataTransfer:
        if self.on_host:
            return HostDataTransfer(self.table, own, meter)
        return VirtualDataTransfer(self.table, own, meter)

    def create_allocator(self, memory_info: OrtMemoryInfo, options: Mapping[str, str] | None = None
                         ) -> OpenCLAllocator | None:
        return self.allocator(memory_info.memory_device)


def data_transfer_for_table(table: DeviceTable) -> DataTransfer:
    """A transfer between host memory and every simulated device of ``table`` (tests, tools)."""
    if table.backend == BACKEND_HOST:
        return HostDataTransfer(table, None, None)
    return VirtualDataTransfer(table, None, None)
