"""Which EPs a session gets, in priority order, and with which devices and options.

Order of precedence, as ORT: a legacy ``providers=[...]`` list, else explicit devices
(``add_provider_for_devices``), else a selection policy or delegate, else the CPU EP alone. The CPU
EP is appended implicitly unless ``session.disable_cpu_ep_fallback`` is "1".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from onnxhal.hal import EpFactory, OrtEpDevice
from onnxhal.hal.errors import Fail, InvalidArgument, RuntimeInvalidArgument
from onnxhal.runtime.env.environment import BUILTIN_EP_LIBRARIES, CPU_EP_NAME, Environment, EpLibrary, is_default_cpu_ep
from onnxhal.runtime.env.selection import fold_devices, remove_default_cpu, select_devices
from onnxhal.runtime.session.options import (
    DISABLE_CPU_EP_FALLBACK,
    SessionOptions,
    provider_options_dict,
)

logger = logging.getLogger("onnxhal.session")


@dataclass
class ProviderChoice:
    ep_name: str
    factory: EpFactory
    library: EpLibrary
    devices: list[OrtEpDevice]
    explicit_options: dict[str, str] = field(default_factory=dict)


def _normalize_legacy(providers: Sequence[Any], provider_options: Sequence[Mapping] | None) -> list[tuple[str, dict]]:
    if isinstance(providers, str):
        raise InvalidArgument(f"providers must be a list of provider names, got the string {providers!r}; "
                              f"use providers=[{providers!r}]")
    out: list[tuple[str, dict]] = []
    opts = list(provider_options) if provider_options is not None else None
    if opts is not None and len(opts) != len(providers):
        raise InvalidArgument(f"provider_options has {len(opts)} entries but providers has {len(providers)}; "
                              "give one options dict per provider")
    for k, p in enumerate(providers):
        if isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], Mapping):
            name, o = p[0], dict(p[1])
        elif isinstance(p, str):
            name, o = p, {}
        else:
            raise InvalidArgument(f"providers[{k}] = {p!r}: expected a provider name or a (name, options dict) tuple")
        if opts is not None:
            o.update(provider_options_dict(opts[k], f"provider_options[{k}] (for {name})"))
        out.append((name, {str(a): str(b) for a, b in o.items()}))
    return out


def resolve_providers(env: Environment, so: SessionOptions, providers: Sequence[Any] | None,
                      provider_options: Sequence[Mapping] | None,
                      model_metadata: Callable[[], Mapping[str, str]]) -> list[ProviderChoice]:
    """The session's EPs and devices. ``model_metadata`` gives the model's metadata, read only
    where a selection policy or delegate decides."""
    devices = env.ep_devices()
    fallback_disabled = so.config(DISABLE_CPU_EP_FALLBACK) == "1"
    choices: list[ProviderChoice] = []

    def add(ep_name: str, devs: list[OrtEpDevice], options: dict[str, str]) -> None:
        if any(c.ep_name == ep_name for c in choices):
            raise Fail(f"Provider {ep_name} has already been registered. Add each EP once.")
        found = env.factory_for(ep_name)
        if found is None:
            raise InvalidArgument(f"unknown execution provider {ep_name!r}. Available: {available(devices)}")
        factory, lib = found
        choices.append(ProviderChoice(ep_name, factory, lib, devs, options))

    if providers is not None:
        if so.has_providers():
            logger.warning("providers= was passed together with SessionOptions that already select EPs; "
                           "providers= wins (as in onnxruntime)")
        for name, opts in _normalize_legacy(providers, provider_options):
            if not isinstance(name, str) or not name:
                raise InvalidArgument(f"provider name must be a non-empty string, got {name!r}")
            if env.register_builtin(name):  # a built-in EP is usable by name, as in onnxruntime
                devices = env.ep_devices()
            devs = [d for d in devices if d.ep_name == name]
            if not devs:
                known = env.factory_for(name) is not None
                reason = env.no_device_reason(name) if known else ""
                if reason:
                    # a RuntimeError in onnxruntime's set_providers ("Unknown Provider Type: ..."); ours is both
                    raise RuntimeInvalidArgument(f"Unknown Provider Type: {name}: execution provider {name!r} has no "
                                                 f"EP device on this machine: {reason}")
                raise RuntimeInvalidArgument(
                    f"Unknown Provider Type: {name}: execution provider {name!r} "
                    + ("has no EP device on this machine" if known else "is unknown")
                    + f". Available providers: {available(devices)}; built in, usable by name: "
                    f"{sorted(BUILTIN_EP_LIBRARIES)}. Register a plugin EP's library with "
                    "onnxhal.register_execution_provider_library() (the simulated NPU and GPU: ONNXHAL_SIMULATE), "
                    "or check the spelling.")
            for k, v in opts.items():
                so.set_provider_option(name, k, v)
            add(name, [device_by_id(name, devs, opts)], opts)
    elif so.explicit_providers:
        for ex in so.explicit_providers:
            if fallback_disabled and any(is_default_cpu_ep(d) for d in ex.devices):
                raise InvalidArgument(
                    "Conflicting session configuration: the CPU EP was added explicitly while "
                    f"{DISABLE_CPU_EP_FALLBACK}=1 disables it. Remove one of the two.")
            add(ex.devices[0].ep_name, list(ex.devices), ex.options)
    elif so.selection_policy is not None or so.selection_delegate is not None:
        selected = select_devices(devices, so.selection_policy, so.selection_delegate, model_metadata())
        if fallback_disabled:
            selected = remove_default_cpu(selected)
        if not selected:
            raise Fail("No execution providers selected. Please check the device policy and available devices.")
        for group in fold_devices(selected):
            add(group[0].ep_name, group, {})
    # The device's ep_options are defaults: a key the user set wins.
    for c in choices:
        for d in c.devices:
            for k, v in d.ep_options.items():
                so.set_provider_option(c.ep_name, k, v, keep_existing=True)
    if not fallback_disabled and not any(c.ep_name == CPU_EP_NAME for c in choices):
        cpu = [d for d in devices if is_default_cpu_ep(d)]
        found = env.factory_for(CPU_EP_NAME)
        if found is not None:
            choices.append(ProviderChoice(CPU_EP_NAME, found[0], found[1], cpu[:1], {}))
    if not choices:
        raise Fail("No execution providers selected: CPU fallback is disabled and no other EP was given.")
    return choices


def device_by_id(ep_name: str, devices: Sequence[OrtEpDevice], options: Mapping[str, str]) -> OrtEpDevice:
    """Which of an EP's devices a session given the EP by name uses: the ``device_id`` provider
    option's (the ordinal among that EP's devices, as CUDA's device_id counts GPUs; onnxruntime 1.26
    on), else the first."""
    value = options.get("device_id")
    if value is None:
        return devices[0]
    try:
        index = int(value)
    except (TypeError, ValueError):
        raise InvalidArgument(f"{ep_name}: provider option device_id must be an integer, got {value!r}") from None
    if not 0 <= index < len(devices):
        raise InvalidArgument(f"{ep_name}: provider option device_id={index}, but the EP has {len(devices)} device(s) "
                              f"here (0..{len(devices) - 1}): {[d.device for d in devices]}")
    return devices[index]


def cpu_choice(env: Environment) -> ProviderChoice:
    """The default CPU EP alone (fallback and failover target)."""
    found = env.factory_for(CPU_EP_NAME)
    if found is None:  # the environment registers it first, always
        raise Fail("the default CPU EP is not registered")
    devices = [d for d in env.ep_devices() if is_default_cpu_ep(d)]
    return ProviderChoice(CPU_EP_NAME, found[0], found[1], devices[:1], {})


def available(devices: Sequence[OrtEpDevice]) -> list[str]:
    names: list[str] = []
    for d in devices:
        if d.ep_name not in names:
            names.append(d.ep_name)
    return names
