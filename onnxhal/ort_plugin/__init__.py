"""onnxhal's devices inside real onnxruntime: a plugin EP library that onnxruntime itself loads.

```python
import onnxruntime as ort
import onnxhal.ort_plugin as plugin

plugin.configure(profiles=["generic-npu", "generic-gpu"])      # or $ONNXHAL_SIMULATE
ort.register_execution_provider_library("onnxhal.virtual", plugin.library_path())
so = ort.SessionOptions()
so.set_provider_selection_policy(ort.OrtExecutionProviderDevicePolicy.PREFER_NPU)
sess = ort.InferenceSession("model.onnx", so)                  # runs on the simulated NPU
```

The library is a small C file (``bridge.c``) that forwards every onnxruntime call to Python in the
same process; ``adapter.py`` presents an onnxhal EP library (the simulated devices by default, or
any library written against ``onnxhal.hal``: ``configure(library=...)``) as onnxruntime's
OrtEpFactory / OrtEp. See docs/onnxruntime-plugin.md.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from onnxhal.hal.errors import InvalidArgument

#: The registration name the docs use; a name ending in ".virtual" lets onnxruntime take virtual devices.
REGISTRATION_NAME = "onnxhal.virtual"


def library_path() -> str:
    """Path of the shared library to pass to ``onnxruntime.register_execution_provider_library``.

    Loads it into this process first, with onnxhal's Python side attached, so that onnxruntime's calls
    find it; builds it (once) if the install did not."""
    from onnxhal.ort_plugin import library  # noqa: F401 - installs the call handlers
    from onnxhal.ort_plugin.build import bridge_library
    from onnxhal.ort_plugin.dispatch import attach

    path = bridge_library()
    attach(path)
    return os.fspath(path)


def configure(profiles: Sequence[str] | str | None = None, library: str | os.PathLike | None = None,
              device_memory: bool = True) -> None:
    """Choose what the next ``register_execution_provider_library`` call presents to onnxruntime.

    ``profiles``: simulated devices (shipped profile names or .toml paths; default $ONNXHAL_SIMULATE,
    else generic-npu,generic-gpu). ``library``: another onnxhal EP library instead of the simulators
    (a dotted module name or a .py path, as ``onnxhal.register_execution_provider_library`` takes).
    ``device_memory``: declare the EPs' own memory to onnxruntime (allocator, data transfer), so it
    keeps their values there; False makes onnxruntime see host memory only and the bridge copy each
    partition's inputs in and outputs out (see docs/onnxruntime-plugin.md)."""
    from onnxhal.ort_plugin.library import SIMULATORS, config

    if isinstance(profiles, str):
        profiles = [p for p in profiles.split(",") if p.strip()]
    if profiles is not None:
        from onnxhal.simulators.profiles import parse_profile_list

        parse_profile_list(",".join(profiles))  # a bad profile fails here, typed, naming the file and key
    if library is not None and not os.fspath(library):
        raise InvalidArgument("configure(library=...): give a dotted module name or a .py path, got ''")
    config.profiles = [p.strip() for p in (profiles or [])]
    config.library = os.fspath(library) if library is not None else SIMULATORS
    config.device_memory = bool(device_memory)


def simulated_costs() -> list[dict]:
    """The cost model's figures of every live onnxruntime session EP on a simulated device, oldest
    first: ``ep``, ``profile``, ``last_run`` and ``total`` (runs, simulated device/kernel/transfer
    milliseconds, kernels, transfers, bytes, millijoules: docs/simulators.md). onnxruntime's profiler
    does not carry them; this does."""
    from onnxhal.ort_plugin.adapter import EpAdapter
    from onnxhal.ort_plugin.dispatch import objects

    out = []
    for adapter in list(objects.values()):
        meter = getattr(adapter.ep, "meter", None) if isinstance(adapter, EpAdapter) else None
        if meter is not None:
            out.append({"ep": adapter.ep.name, "profile": meter.profile.name,
                        "last_run": meter.last_run.as_dict(), "total": meter.total.as_dict()})
    return out


__all__ = ["REGISTRATION_NAME", "configure", "library_path", "simulated_costs"]
