"""Automatic EP selection: ORT's device sort, policy selectors, delegate and fold.

Exactly as onnxruntime/core/session/provider_policy_context.cc (see docs/sessions.md), with one
difference: an out-of-range policy raises InvalidArgument where ORT dereferences a null selector.
"""

from __future__ import annotations

import functools
import traceback
from collections.abc import Callable, Mapping, Sequence

from onnxhal.hal import OrtEpDevice, OrtExecutionProviderDevicePolicy, OrtHardwareDeviceType
from onnxhal.hal.errors import Fail, InvalidArgument
from onnxhal.runtime.env.environment import is_default_cpu_ep

MAX_DELEGATE_SELECTIONS = 8
_NPU, _GPU, _CPU = OrtHardwareDeviceType.NPU, OrtHardwareDeviceType.GPU, OrtHardwareDeviceType.CPU


def _matches_ep_vendor(d: OrtEpDevice) -> bool:
    vid = int(getattr(d.factory, "vendor_id", 0) or 0)
    if vid != 0 and d.device.vendor_id == vid:
        return True
    return d.device.vendor == d.ep_vendor


def _is_discrete(d: OrtEpDevice) -> bool:
    return d.device.type == _GPU and d.device.metadata.get("Discrete") == "1"


def _compare(a: OrtEpDevice, b: OrtEpDevice) -> int:
    ta, tb = a.device.type, b.device.type
    if ta != tb:
        for t in (_NPU, _GPU):
            if ta == t:
                return -1
            if tb == t:
                return 1
    if ta == _GPU:
        da, db = _is_discrete(a), _is_discrete(b)
        if da != db:
            return -1 if da else 1
    va, vb = _matches_ep_vendor(a), _matches_ep_vendor(b)
    if va != vb:
        return -1 if va else 1
    ca, cb = is_default_cpu_ep(a), is_default_cpu_ep(b)
    if not ca and not cb:
        return (a.ep_name > b.ep_name) - (a.ep_name < b.ep_name)
    if ca == cb:
        return 0
    return 1 if ca else -1


def order_devices(devices: Sequence[OrtEpDevice]) -> list[OrtEpDevice]:
    """NPU, GPU, CPU; discrete GPUs first; vendor-matching devices first; default CPU EP last;
    otherwise by EP name. Stable."""
    return sorted(devices, key=functools.cmp_to_key(_compare))


def _prefer_cpu(sorted_devices: list[OrtEpDevice], selected: list[OrtEpDevice]) -> None:
    first_cpu = next((d for d in sorted_devices if d.device.type == _CPU), None)
    if first_cpu is None:
        raise Fail("No CPU based execution providers were found.")
    selected.append(first_cpu)
    # The default CPU EP goes last, for maximum operator coverage.
    if not is_default_cpu_ep(first_cpu) and is_default_cpu_ep(sorted_devices[-1]):
        selected.append(sorted_devices[-1])


def _prefer_gpu(sorted_devices: list[OrtEpDevice], selected: list[OrtEpDevice]) -> None:
    first_gpu = next((d for d in sorted_devices if d.device.type == _GPU), None)
    if first_gpu is not None:
        selected.append(first_gpu)
    _prefer_cpu(sorted_devices, selected)


def _prefer_npu(sorted_devices: list[OrtEpDevice], selected: list[OrtEpDevice]) -> None:
    if sorted_devices and sorted_devices[0].device.type == _NPU:
        selected.append(sorted_devices[0])
    _prefer_cpu(sorted_devices, selected)


_P = OrtExecutionProviderDevicePolicy
SELECTORS: dict[OrtExecutionProviderDevicePolicy, Callable] = {
    _P.DEFAULT: _prefer_cpu, _P.PREFER_CPU: _prefer_cpu,
    _P.PREFER_NPU: _prefer_npu, _P.MAX_EFFICIENCY: _prefer_npu, _P.MIN_OVERALL_POWER: _prefer_npu,
    _P.PREFER_GPU: _prefer_gpu, _P.MAX_PERFORMANCE: _prefer_gpu,
}


def select_devices(devices: Sequence[OrtEpDevice], policy: OrtExecutionProviderDevicePolicy | None,
                   delegate: Callable | None, model_metadata: Mapping[str, str]) -> list[OrtEpDevice]:
    """The devices a policy or delegate picks, in priority order (before CPU-fallback removal)."""
    sorted_devices = order_devices(devices)
    selected: list[OrtEpDevice] = []
    if delegate is not None:
        try:
            result = delegate(list(sorted_devices), dict(model_metadata), {}, MAX_DELEGATE_SELECTIONS)
        except Exception as e:
            raise Fail(f"EP selection delegate failed: {type(e).__name__}: {e}\n{traceback.format_exc()}") from e
        if result is None:
            result = []
        if isinstance(result, OrtEpDevice) or not isinstance(result, (list, tuple)):
            raise Fail(f"EP selection delegate failed: Unable to cast the delegate's return value "
                       f"({type(result).__name__}) to a list of OrtEpDevice")
        given = {id(d) for d in sorted_devices}
        for d in result:
            if not isinstance(d, OrtEpDevice):
                raise Fail(f"EP selection delegate failed: Unable to cast {type(d).__name__} to OrtEpDevice")
            if id(d) not in given:  # a device built or copied by the delegate has no factory-made EP behind it
                raise Fail(f"EP selection delegate failed: it returned {d!r}, which is not one of the ep_devices it "
                           "was given. Return devices from that list (the first argument).")
        if not result:
            raise Fail("EP selection delegate did not select anything.")
        if len(result) > MAX_DELEGATE_SELECTIONS:
            raise Fail(f"EP selection delegate selected too many EP devices ({len(result)}). "
                       f"The limit is {MAX_DELEGATE_SELECTIONS} EP devices.")
        selected = list(result)
    else:
        if policy is None:
            policy = _P.DEFAULT
        selector = SELECTORS.get(policy) if policy.name in _P.__members__ else None
        if selector is None:
            raise InvalidArgument(
                f"EP selection policy {policy!r} is not a valid OrtExecutionProviderDevicePolicy (valid: "
                f"{', '.join(f'{p.name}={p.value}' for p in _P)}). ORT crashes here; onnxhal refuses.")
        if sorted_devices:
            selector(sorted_devices, selected)
    if not selected:
        raise Fail("No execution providers selected. Please check the device policy and available devices.")
    return selected


def remove_default_cpu(selected: list[OrtEpDevice]) -> list[OrtEpDevice]:
    """``session.disable_cpu_ep_fallback=1``: drop a trailing default CPU EP."""
    if selected and is_default_cpu_ep(selected[-1]):
        return selected[:-1]
    return selected


def fold_devices(selected: Sequence[OrtEpDevice]) -> list[list[OrtEpDevice]]:
    """Group devices per EP name, in order of first appearance; duplicates are kept."""
    groups: dict[str, list[OrtEpDevice]] = {}
    for d in selected:
        groups.setdefault(d.ep_name, []).append(d)
    return list(groups.values())
