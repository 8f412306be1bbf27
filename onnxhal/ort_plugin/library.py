"""What onnxruntime's calls into the bridge do: CreateEpFactories / ReleaseEpFactory, and the table
from each call id to the adapter method that serves it."""

from __future__ import annotations

import ctypes
import importlib
import logging
import threading
from ctypes import POINTER, c_int, c_size_t, c_void_p
from dataclasses import dataclass, field
from typing import Any

from onnxhal.hal.enums import OrtEpDataLayout
from onnxhal.hal.errors import InvalidArgument
from onnxhal.ort_plugin import dispatch as d
from onnxhal.ort_plugin import graph_capture, interrupts, profiling, streams  # noqa: F401 - they register handlers
from onnxhal.ort_plugin.adapter import BridgeEpApi, EpAdapter, FactoryAdapter
from onnxhal.ort_plugin.env_config import ALLOW_VIRTUAL_DEVICES, VIRTUAL_SUFFIX, virtual_devices_allowed
from onnxhal.ort_plugin.ort_api import OrtApi
from onnxhal.ort_plugin.structs import write_out

logger = logging.getLogger("onnxhal.ort_plugin")

SIMULATORS = "onnxhal.simulators"


@dataclass
class BridgeConfig:
    """What the next registration presents: an onnxhal EP library (module name or .py path) and,
    for the simulators, the profiles."""

    library: str = SIMULATORS
    profiles: list[str] = field(default_factory=list)
    device_memory: bool = True  # declare the EPs' device memory to onnxruntime (device_memory.py)


config = BridgeConfig()
_api: list[OrtApi] = []
_api_lock = threading.Lock()


def bound_api(api_base: int) -> OrtApi:
    """The OrtApi of this process's onnxruntime, bound and verified once."""
    with _api_lock:
        if not _api:
            api = OrtApi(api_base)
            _api.append(api)
            d.status_maker[:] = [api.status_for]
        return _api[0]


def _hal_factories(registration_name: str, api: OrtApi) -> tuple[Any, list]:
    # The runtime's own loader, so a library behaves the same in onnxhal and in onnxruntime.
    from onnxhal.runtime.env.environment import create_library_factories, load_library_module

    env = api.env_config()
    if config.library == SIMULATORS:
        if api.has_virtual_devices and not virtual_devices_allowed(registration_name, env):
            raise InvalidArgument(
                f"EP library {registration_name!r}: onnxhal's simulated NPUs and GPUs are virtual hardware devices, "
                f"which onnxruntime allows only for a registration name ending in '{VIRTUAL_SUFFIX}' or with the "
                f"environment config entry '{ALLOW_VIRTUAL_DEVICES}' = '1'; register it as "
                f"'{registration_name}{VIRTUAL_SUFFIX}'")
        from onnxhal.simulators import create_factories_for_profiles

        module: Any = importlib.import_module(SIMULATORS)
        return module, create_factories_for_profiles(",".join(config.profiles) or None, BridgeEpApi(env),
                                                     logging.getLogger(f"onnxhal.ep.{registration_name}"))
    module, _, _ = load_library_module(registration_name, config.library)
    return module, create_library_factories(registration_name, module, BridgeEpApi(env))


def create_ep_factories(_: Any, args: Any) -> None:
    name = ctypes.string_at(args[0]).decode()
    api = bound_api(args[1])
    max_factories, out, num_out = args[4], ctypes.cast(args[3], POINTER(c_void_p)), args[5]
    module, factories = _hal_factories(name, api)
    if len(factories) > max_factories:
        raise InvalidArgument(f"EP library {name!r} makes {len(factories)} factories; onnxruntime takes at most "
                              f"{max_factories}")
    from onnxhal.devices import discover_hardware_devices

    discovered = discover_hardware_devices()
    for i, f in enumerate(factories):
        out[i] = FactoryAdapter(api, f, module, discovered, config.device_memory).address
    write_out(num_out, len(factories), c_size_t)


def release_ep_factory(factory: FactoryAdapter | None, _: Any) -> None:
    if factory is not None:
        factory.release()


def release_allocator(address: int) -> None:
    adapter = d.objects.get(address)
    if adapter is not None:
        adapter.release()


def release_ep(args: Any) -> None:
    adapter = d.objects.pop(args[0], None)
    if adapter is not None:
        adapter.release()


def _write_int(address: int, value: int) -> None:
    ctypes.cast(address, POINTER(c_int))[0] = value


def _on_run_start(ep: EpAdapter, args: Any) -> None:
    interrupts.run_started()
    ep.missing.run_start()
    run_options = graph_capture.RunOptionsView(ep.api, args[0])
    try:
        graph_capture.run_started(ep, run_options)
        ep.ep.on_run_start(run_options)
    finally:
        run_options.end()


def _on_run_end(ep: EpAdapter, args: Any) -> None:
    run_options = graph_capture.RunOptionsView(ep.api, args[0])
    try:
        streams.drain_session_streams(ep)
        ep.ep.on_run_end(run_options, bool(args[1]))
        ep.missing.run_end(bool(args[1]))
    finally:
        run_options.end()
        graph_capture.run_ended(ep)
        if interrupts.run_ended():
            streams.interrupt_after_run(ep)


d.HANDLERS.update({
    d.CREATE_EP_FACTORIES: create_ep_factories,
    d.RELEASE_EP_FACTORY: release_ep_factory,
    d.F_GET_NAME: lambda f, a: f.strings(f.factory.name),
    d.F_GET_VENDOR: lambda f, a: f.strings(f.factory.vendor),
    d.F_GET_VENDOR_ID: lambda f, a: int(f.factory.vendor_id),
    d.F_GET_VERSION: lambda f, a: f.strings(str(f.factory.version)),
    d.F_GET_SUPPORTED_DEVICES: FactoryAdapter.get_supported_devices,
    d.F_CREATE_EP: FactoryAdapter.create_ep,
    # After an unregister the factory is gone from dispatch.objects, but its sessions still end here.
    d.F_RELEASE_EP: lambda f, a: release_ep(a),
    d.F_VALIDATE_COMPAT: FactoryAdapter.validate_compatibility,
    d.F_CREATE_ALLOCATOR: FactoryAdapter.create_allocator,
    d.F_RELEASE_ALLOCATOR: lambda f, a: release_allocator(a[0]),
    d.F_CREATE_DATA_TRANSFER: FactoryAdapter.create_data_transfer,
    d.E_GET_NAME: lambda e, a: e.name,
    d.E_GET_CAPABILITY: EpAdapter.get_capability,
    d.E_COMPILE: EpAdapter.compile,
    d.E_RELEASE_COMPUTE_INFOS: EpAdapter.release_compute_infos,
    d.E_SET_DYNAMIC_OPTIONS: EpAdapter.set_dynamic_options,
    # onnxruntime's OrtEpDataLayout and hal's share values (NCHW 0, NHWC 1).
    d.E_GET_LAYOUT: lambda e, a: _write_int(a[0], int(e.ep.get_preferred_data_layout())),
    d.E_SHOULD_CONVERT: lambda e, a: _write_int(a[3], e.layout_decision(
        ctypes.string_at(a[0]).decode(), ctypes.string_at(a[1]).decode(), OrtEpDataLayout(int(a[2])))),
    d.E_GET_COMPAT_INFO: EpAdapter.compatibility_info,
    d.E_ON_RUN_START: _on_run_start,
    d.E_ON_RUN_END: _on_run_end,
    # Members of onnxruntime 1.24 and later (the bridge declares them where onnxruntime has them:
    # structs.negotiated_version).
    d.F_GET_INCOMPATIBILITY_DETAILS: FactoryAdapter.incompatibility_details,
    d.E_SYNC: lambda e, a: e.ep.sync(),
    d.E_ON_SESSION_INITIALIZATION_END: lambda e, a: e.ep.on_session_initialization_end(),
    d.E_GET_DEFAULT_MEMORY_DEVICE: EpAdapter.default_memory_device,
    d.E_GET_AVAILABLE_RESOURCE: EpAdapter.available_resource,
    d.F_GET_NUM_CUSTOM_OP_DOMAINS: FactoryAdapter.num_custom_op_domains,
    d.F_GET_CUSTOM_OP_DOMAINS: FactoryAdapter.write_custom_op_domains,
    d.C_CREATE_STATE: lambda c, a: c.create_state(a),
    d.C_COMPUTE: lambda c, a: c.ep.missing.compute(lambda: c.compute(a)),
    d.C_RELEASE_STATE: lambda c, a: c.release_state(a),
})
