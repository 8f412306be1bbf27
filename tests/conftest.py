"""Shared fixtures: registering test EP libraries and always unregistering them."""

from __future__ import annotations

import contextlib
import gc
import itertools
import os
import textwrap

import pytest

# Results must not depend on how loaded the machine is: with the CPU EP's load-aware BLAS threads
# (kernels/blas_threads.LoadAwareBlasThreads) a busy CI runner gives OpenBLAS one thread, another
# partition of each product and another rounding. The light zoo's squeezenet ties 1,000 logits of
# 9.5e9 (one float32 step is 1,024): one partition keeps the tie, the other makes a softmax of 0.25.
# tests/test_blas_load.py turns it back on where it tests it.
os.environ.setdefault("ONNXHAL_LOAD_AWARE_THREADS", "0")
# The OpenCL EP's cost rule (on by default) would send the suite's tiny graphs, there to run the
# kernels, to the CPU EP: off unless a test asks for it (tests/test_opencl_cost_rule.py does).
os.environ.setdefault("ONNXHAL_OPENCL_COST_RULE", "off")
# The CLI's tables take $COLUMNS as their width where stdout is no terminal (onnxhal/cli_tables.py),
# and pytest-xdist's workers inherit COLUMNS=80 from the controller (some shells export it too): the
# tests that print tables at a width set it themselves, the rest see the piped width.
os.environ.pop("COLUMNS", None)

import onnxhal  # noqa: E402
from onnxhal.runtime.env.environment import get_environment

PLUGINS = os.path.join(os.path.dirname(__file__), "plugins")
#: Workers for ``pytest -n logical`` / ``-n auto``: one a CPU, at most this many, because one worker
#: peaks near 5 GB (the light zoo's VGG-19 weights and their copies on the device paths).
MAX_WORKERS = 4


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: unknown (and fine) where xdist is not installed
def pytest_xdist_auto_num_workers(config) -> int:
    return max(1, min(os.cpu_count() or 1, MAX_WORKERS))
_counter = itertools.count()


def unregister_after_scope(name: str, failed_in_scope: bool) -> None:
    """Unregister the library ``name`` at a fixture's teardown. A failed test's traceback (kept by
    pytest for its report) holds the test's sessions, so ``gc.collect`` cannot release them: after
    a failure the library is dropped anyway, so that the failure does not add a teardown ERROR and
    leave the library registered for every later test of the process (its EP name then taken).
    With no failure a session still alive is a leak (a cycle, a thread, a cache): the Fail stands,
    raised after the library is dropped, so that it is this scope's error alone."""
    gc.collect()
    try:
        onnxhal.unregister_execution_provider_library(name)
    except onnxhal.errors.Fail:
        get_environment().force_unregister(name)
        if not failed_in_scope:
            raise


@pytest.fixture
def register(request):
    """``register(library, name=None) -> name``; unregistered after the test (sessions first)."""
    failed_before = request.session.testsfailed
    names: list[str] = []

    def _register(library: str, name: str | None = None) -> str:
        name = name or f"test_lib_{next(_counter)}"
        onnxhal.register_execution_provider_library(name, library)
        names.append(name)
        return name

    yield _register
    failed = request.session.testsfailed > failed_before
    for n in reversed(names):
        with contextlib.suppress(onnxhal.errors.InvalidArgument):  # the test unregistered it itself
            unregister_after_scope(n, failed)


@pytest.fixture
def opencl(register):
    """The OpenCL EP library registered as "opencl" for the test (its tests' common setup)."""
    register("onnxhal.runtime.providers.opencl", "opencl")


@contextlib.contextmanager
def simulated_or_skip(profiles: str, by: str = "ep_name"):
    """The simulated devices of ``profiles`` for a block, keyed by EP name or (``by="profile"``) by
    profile name. They run on OpenCL or, with no usable OpenCL device, on the host backend."""
    from onnxhal.simulators.testing import simulated_devices

    with simulated_devices(profiles) as devices:
        assert devices, f"simulated devices of {profiles!r} did not appear (they need no OpenCL device)"
        yield {(d.device.metadata["simulator_profile"] if by == "profile" else d.ep_name): d for d in devices}


def library_module(name: str):
    """The module the registry loaded for the library registered as ``name``."""
    return next(lib.module for lib in get_environment().libraries() if lib.name == name)


@pytest.fixture
def plugin_file(tmp_path):
    """Write an EP library source to a .py file and return its path."""

    def _write(source: str, name: str = "plugin") -> str:
        path = tmp_path / f"{name}_{next(_counter)}.py"
        path.write_text(textwrap.dedent(source))
        return str(path)

    return _write


@pytest.fixture(scope="module")
def opencl_devices(request):
    """The OpenCL EP's devices (PoCL here), registered for one test module and unregistered after
    it, so other modules see only the EPs they register (policies depend on what is registered).
    Programs stay cached in the process, so registering again is cheap."""
    from tests.opencl_support import opencl_verdict

    index, reason = opencl_verdict()
    if index is None:  # before registering: a skip here must leave nothing registered behind
        pytest.skip(f"needs a working OpenCL device: {reason}")
    env = get_environment()
    failed_before = request.session.testsfailed
    registered = False
    if not any(d.ep_name == "OpenCLExecutionProvider" for d in env.ep_devices()):
        onnxhal.register_execution_provider_library("opencl_tests", "onnxhal.runtime.providers.opencl")
        registered = True
    devices = [d for d in onnxhal.get_ep_devices() if d.ep_name == "OpenCLExecutionProvider"]
    assert devices, f"OpenCL device {index} passed the probe but the OpenCL EP offers no EP device for it"
    yield devices
    if registered:
        unregister_after_scope("opencl_tests", request.session.testsfailed > failed_before)


@pytest.fixture(scope="module")
def add_mul_session():
    """One session of ``tests.models.add_mul_model`` per test module."""
    from tests.models import add_mul_model

    return onnxhal.InferenceSession(add_mul_model())
