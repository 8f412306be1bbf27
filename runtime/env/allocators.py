"""Allocators an application registers with the environment (``create_and_register_allocator``).

onnxruntime lets an application create one allocator per memory device in the environment, to be
shared by every session whose config has ``session.use_env_allocators`` = "1" and by OrtValues
allocated outside sessions. Here a registered allocator takes the place of the shared allocator of
its memory device (``shared_memory.shared_allocator``) and, for sessions that ask, of the allocator
the EP would create. Host memory needs none (values there are numpy arrays), so a CPU allocator is
recorded and reported but nothing allocates from it.
"""

from __future__ import annotations

from collections.abc import Mapping

from onnxhal.hal import Allocator, CPUAllocator, OrtMemoryInfo
from onnxhal.hal.arena import ArenaAllocator, OrtArenaCfg
from onnxhal.hal.enums import OrtAllocatorType
from onnxhal.hal.errors import Fail
from onnxhal.hal.memory_info import OrtMemoryDevice
from onnxhal.runtime.env.environment import get_environment
from onnxhal.runtime.env.shared_memory import register_shared_allocator

CPU_EP_NAME = "CPUExecutionProvider"
_ONLY_CPU = "Only CPU devices are supported. Please call CreateAndRegisterAllocatorV2() for other device."


def _arena(device: Allocator, info: OrtMemoryInfo, arena_cfg: OrtArenaCfg | None) -> Allocator:
    """An arena over ``device`` when the memory info asks for one (ORT_ARENA_ALLOCATOR), as ORT."""
    if arena_cfg is not None and not isinstance(arena_cfg, OrtArenaCfg):
        raise TypeError(f"arena_cfg must be an OrtArenaCfg or None, got {type(arena_cfg).__name__}")
    if info.allocator_type != OrtAllocatorType.ORT_ARENA_ALLOCATOR:
        return device
    cfg = arena_cfg or OrtArenaCfg(0, -1, -1, -1)
    return ArenaAllocator(device, cfg.strategy, cfg.max_mem)


def _check_memory_info(info: object) -> OrtMemoryInfo:
    if not isinstance(info, OrtMemoryInfo):
        raise TypeError(f"mem_info must be an OrtMemoryInfo, got {type(info).__name__}")
    return info


def create_and_register_allocator(mem_info: OrtMemoryInfo, arena_cfg: OrtArenaCfg | None) -> None:
    """Register a host-memory allocator with the environment (an arena for ORT_ARENA_ALLOCATOR).
    Registering again replaces it, as onnxruntime 1.32 does."""
    info = _check_memory_info(mem_info)
    if not info.is_host:
        raise Fail(f"Error when creating and registering allocator: {_ONLY_CPU} Got {info.name!r} "
                   f"({info.memory_device}); for device memory name its EP: create_and_register_allocator_v2("
                   "'<ep name>', mem_info, {}, arena_cfg)")
    register_shared_allocator(info.memory_device, _arena(CPUAllocator(), info, arena_cfg))


def create_and_register_allocator_v2(provider_type: str, mem_info: OrtMemoryInfo,
                                     provider_options: Mapping[str, str], arena_cfg: OrtArenaCfg | None) -> None:
    """Register an allocator for ``mem_info`` made by the EP ``provider_type``: the CPU EP for host
    memory, or a registered EP library whose EP device declares that memory (onnxruntime takes
    only its built-in EPs here; a plugin EP's factory is what makes the allocator in onnxhal)."""
    info = _check_memory_info(mem_info)
    where = "Error when creating and registering allocator in create_and_register_allocator_v2"
    if not isinstance(provider_options, Mapping):
        raise TypeError(f"provider_options must be a dict of str to str, got {type(provider_options).__name__}")
    if provider_type == CPU_EP_NAME:
        if not info.is_host:
            raise Fail(f"{where}: {_ONLY_CPU} Got {info.name!r} ({info.memory_device}) for {CPU_EP_NAME}.")
        register_shared_allocator(info.memory_device, _arena(CPUAllocator(), info, arena_cfg))
        return
    devices = [d for d in get_environment().ep_devices() if d.ep_name == provider_type]
    if not devices:
        names = sorted({d.ep_name for d in get_environment().ep_devices()})
        raise Fail(f"{where}: {provider_type} is not implemented in CreateAndRegisterAllocatorV2(): no registered "
                   f"EP has that name (registered: {names}). Register its library first.")
    declared = _declared_by(devices, info.memory_device)
    if declared is None:
        raise Fail(
            f"{where}: {provider_type} declares no memory {info.memory_device} ({info.name!r}); its EP devices "
            f"declare {_declared_names(devices)}. Use ep_device.memory_info(OrtDeviceMemoryType.DEFAULT).")
    memory, factory = declared
    device_alloc = factory.create_allocator(memory, dict(provider_options))
    if device_alloc is None:
        raise Fail(f"{where}: {provider_type}'s factory creates no allocator for {memory.name!r}")
    register_shared_allocator(info.memory_device, _arena(device_alloc, info, arena_cfg))


def _declared_by(devices: list, dev: OrtMemoryDevice) -> tuple[OrtMemoryInfo, object] | None:
    for d in devices:
        for info in d.memory_infos():
            if info.memory_device == dev:
                return info, d.factory
    return None


def _declared_names(devices: list) -> list[str]:
    return sorted({f"{i.name} ({i.memory_device})" for d in devices for i in d.memory_infos()}) or ["none"]
