"""Power-aware device selection from profile figures: an opt-in delegate, beyond ORT.

ORT's ``MAX_EFFICIENCY`` and ``MIN_OVERALL_POWER`` policies look at device order only: both pick
the first NPU, as ``PREFER_NPU`` does (runtime/env/selection.py keeps that behaviour exactly). Simulated
devices carry power and throughput figures in their hardware metadata, so a delegate can do what
the policy names promise:

- ``MIN_OVERALL_POWER``: the device with the lowest active power (``active_power_w``);
- ``MAX_EFFICIENCY``: the device with the most operations per joule (``peak_tops_<dtype>`` for the
  dtype the device computes float32 models in, over ``active_power_w``).

Devices without figures (real ones) are not candidates; the CPU EP is always appended last, as
ORT's policies do. Use: ``so.set_provider_selection_policy_delegate(power_aware_delegate(
OrtExecutionProviderDevicePolicy.MIN_OVERALL_POWER))``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from onnxhal.hal import OrtEpDevice, OrtExecutionProviderDevicePolicy, OrtHardwareDeviceType
from onnxhal.hal.errors import InvalidArgument

_P = OrtExecutionProviderDevicePolicy


def _float(md: Mapping[str, str], key: str) -> float | None:
    try:
        return float(md[key])
    except (KeyError, ValueError):
        return None


def efficiency_tops_per_watt(d: OrtEpDevice) -> float | None:
    """Peak TOPS per active watt of a simulated device, for the dtype float32 models run in."""
    md = d.device.metadata
    power = _float(md, "active_power_w")
    dtypes = md.get("compute_dtypes", "").split(",")
    peaks = [p for t in ("float32", "float16") if t in dtypes and (p := _float(md, f"peak_tops_{t}")) is not None]
    if not power or not peaks:
        return None
    return peaks[0] / power


def active_power_w(d: OrtEpDevice) -> float | None:
    return _float(d.device.metadata, "active_power_w")


def power_aware_delegate(policy: OrtExecutionProviderDevicePolicy) -> Callable:
    """A selection delegate for ``MAX_EFFICIENCY`` or ``MIN_OVERALL_POWER`` using profile figures."""
    if policy == _P.MIN_OVERALL_POWER:
        def score(d: OrtEpDevice) -> float | None:
            p = active_power_w(d)
            return -p if p is not None else None
    elif policy == _P.MAX_EFFICIENCY:
        score = efficiency_tops_per_watt
    else:
        raise InvalidArgument(f"power_aware_delegate: policy {policy!r} is not MAX_EFFICIENCY or MIN_OVERALL_POWER")

    def delegate(devices: Sequence[OrtEpDevice], model_metadata: Mapping[str, str],
                 runtime_metadata: Mapping[str, str], max_selections: int) -> list[OrtEpDevice]:
        scored = [(s, k, d) for k, d in enumerate(devices)
                  if d.device.type != OrtHardwareDeviceType.CPU and (s := score(d)) is not None]
        selected = [max(scored, key=lambda t: (t[0], -t[1]))[2]] if scored else []
        cpu = [d for d in devices if d.device.type == OrtHardwareDeviceType.CPU and d.ep_name == "CPUExecutionProvider"]
        return (selected + cpu[:1])[:max_selections]

    return delegate
