"""pytest plugin (entry point ``pytest11``): run a downstream project's tests on simulated devices.

- ``--onnxhal-simulate=generic-npu,generic-gpu`` registers those simulated devices for the run
  (names or TOML paths; replaces devices registered through ``ONNXHAL_SIMULATE``).
- The ``ep_device`` fixture parametrizes a test over every EP device: the CPU EP's and each
  simulated (or otherwise registered) device, with ids such as ``npu-generic-npu``.
- ``@pytest.mark.onnxhal_devices("npu", "gpu")`` keeps only devices of those types.
- ``ep_session_options`` is a ``SessionOptions`` with ``ep_device`` added.

Nothing is imported from onnxhal's runtime, and nothing registered, unless the option is given or
a test asks for ``ep_device``.
"""

from __future__ import annotations

from typing import Any

import pytest

MARKER = "onnxhal_devices"
DEVICE_TYPES = ("cpu", "gpu", "npu")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("onnxhal", "onnxhal simulated devices")
    group.addoption("--onnxhal-simulate", action="store", default=None, metavar="PROFILES",
                    help="simulate these devices: comma-separated profile names or TOML paths "
                         "(e.g. generic-npu,generic-gpu)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}(*types): run an ep_device test only on EP devices of these "
                                       f"hardware types ({', '.join(DEVICE_TYPES)})")
    import os

    from onnxhal.simulators import ENV_VAR

    profiles = config.getoption("onnxhal_simulate", default=None)
    if profiles:
        from onnxhal.hal.errors import OrtError
        from onnxhal.simulators import register_simulators, simulated_library_names
        from onnxhal.simulators.testing import unregister_quietly

        for name in simulated_library_names():
            unregister_quietly(name)
        try:
            register_simulators(profiles)
        except OrtError as e:  # a typo in the option: pytest's one-line usage error, not a traceback
            raise pytest.UsageError(f"--onnxhal-simulate={profiles}: {e}") from None
    elif os.environ.get(ENV_VAR, "").strip():
        from onnxhal.simulators.profiles import ProfileError, parse_profile_list

        try:  # read the profiles now, so a typo stops the run here rather than inside the first test
            parse_profile_list(os.environ[ENV_VAR])
        except ProfileError as e:
            raise pytest.UsageError(f"{ENV_VAR}={os.environ[ENV_VAR]!r}: {e}") from None


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Where the simulated devices run (OpenCL or the host backend, and why), when there are any."""
    import os

    from onnxhal.simulators import ENV_VAR

    if not (config.getoption("onnxhal_simulate", default=None) or os.environ.get(ENV_VAR)):
        return []
    from onnxhal.runtime.env.environment import get_ep_devices
    from onnxhal.simulators import describe_backend

    return [f"onnxhal: {line}" for line in map(describe_backend, get_ep_devices()) if line]


def device_id(d: Any) -> str:
    """Test id of an EP device: ``<type>-<profile or EP name>``."""
    return f"{d.device.type.name.lower()}-{d.device.metadata.get('simulator_profile') or d.ep_name}"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "ep_device" not in metafunc.fixturenames:
        return
    # A project's own fixture named ep_device (closer to the test) wins: leave that test alone.
    defs = getattr(metafunc, "_arg2fixturedefs", {}).get("ep_device")
    if defs and getattr(defs[-1].func, "__module__", "") != __name__:
        return
    from onnxhal.runtime.env.environment import get_ep_devices

    devices = get_ep_devices()
    marker = metafunc.definition.get_closest_marker(MARKER)
    if marker is not None:
        wanted = {str(t).lower() for t in marker.args}
        unknown = wanted - set(DEVICE_TYPES)
        if unknown:
            raise pytest.UsageError(f"@pytest.mark.{MARKER}: unknown device type(s) {sorted(unknown)}; "
                                    f"use {', '.join(DEVICE_TYPES)}")
        devices = [d for d in devices if d.device.type.name.lower() in wanted]
    metafunc.parametrize("ep_device", devices, ids=[device_id(d) for d in devices], indirect=True)


@pytest.fixture
def ep_device(request: pytest.FixtureRequest) -> Any:
    """One EP device (``onnxhal.OrtEpDevice``); the test runs once per device."""
    return request.param


@pytest.fixture
def ep_session_options(ep_device: Any) -> Any:
    """``onnxhal.SessionOptions`` that put the session on ``ep_device`` (with the CPU EP as fallback)."""
    from onnxhal.runtime.session.options import SessionOptions

    so = SessionOptions()
    so.add_provider_for_devices([ep_device])
    return so
