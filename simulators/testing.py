"""Helpers for tests that need simulated devices (used by onnxhal's own tests and the pytest plugin).

``simulated_devices("generic-npu,generic-gpu")`` registers the simulators library with those
profiles for the duration of a ``with`` block and yields the simulated EP devices. A library that
already provided the virtual EPs (e.g. from ``ONNXHAL_SIMULATE``) is set aside and registered again
afterwards, so tests can use their own profiles in any environment.
"""

from __future__ import annotations

import gc
import itertools
from collections.abc import Iterator
from contextlib import contextmanager

from onnxhal.hal.ep_device import OrtEpDevice
from onnxhal.hal.errors import Fail, InvalidArgument
from onnxhal.simulators import EP_NAMES, register_simulators, simulated_library_names

_counter = itertools.count()


def simulated_ep_devices() -> list[OrtEpDevice]:
    """The EP devices of the virtual NPU and GPU EPs currently registered."""
    from onnxhal.runtime.env.environment import get_ep_devices

    return [d for d in get_ep_devices() if d.ep_name in EP_NAMES]


def unregister_quietly(name: str) -> None:
    """Unregister the EP library ``name`` if it is registered, and drop it even when a session
    that only garbage (or a failed test's traceback) holds still references it."""
    from onnxhal.runtime.env.environment import get_environment, unregister_execution_provider_library

    gc.collect()  # sessions that are only garbage still hold library references
    try:
        unregister_execution_provider_library(name)
    except InvalidArgument:
        pass  # already gone
    except Fail:
        # A failed test's traceback can keep sessions alive: drop the library anyway so the failure
        # does not cascade into later tests.
        get_environment().force_unregister(name)


@contextmanager
def simulated_devices(profiles: str | list[str]) -> Iterator[list[OrtEpDevice]]:
    """Register the simulated devices of ``profiles`` for the block; yields their EP devices."""
    from onnxhal.runtime.env.environment import get_environment

    previous = []
    for name in simulated_library_names():
        lib = next(lib for lib in get_environment().libraries() if lib.name == name)
        paths = [p.path for f in lib.factories for p in getattr(f, "profiles", [])]
        previous.append((name, ",".join(paths)))
        unregister_quietly(name)
    name = f"simulators_{next(_counter)}"
    register_simulators(profiles, name)
    try:
        yield simulated_ep_devices()
    finally:
        unregister_quietly(name)
        for prev_name, paths in previous:
            register_simulators(paths or None, prev_name)
