"""onnxruntime's environment config read by onnxhal's factories inside onnxruntime
(onnxhal/ort_plugin/env_config.py), through onnxruntime's C API (tests/ort_bridge_env.py: the Python
module gives no way to set it). Each case in its own process: onnxruntime allows one environment per
process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")
import onnxruntime  # noqa: E402

from onnxhal.ort_plugin.env_config import factory_options, virtual_devices_allowed, with_factory_defaults  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NPU, GPU = "VirtualNpuExecutionProvider", "VirtualGpuExecutionProvider"
ORT_VERSION = tuple(int(x) for x in onnxruntime.__version__.split(".")[:2])
needs_env_options = pytest.mark.skipif(ORT_VERSION < (1, 24),
                                       reason="CreateEnvWithOptions and GetEnvConfigEntries arrived in onnxruntime 1.24")


def run_case(name: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "tests.ort_bridge_env", "case", name], cwd=ROOT, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, f"case {name} exited with {done.returncode}:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_env_options
def test_allow_virtual_devices_lets_any_registration_name_offer_the_simulated_devices():
    refused = run_case("plain_name_no_config")
    assert "InvalidArgument" in refused["register"] and "'allow_virtual_devices' = '1'" in refused["register"]
    allowed = run_case("plain_name_allow_virtual")
    assert allowed["register"] is None
    assert {NPU, GPU} <= set(allowed["ep_devices"])
    assert allowed["sessions"] == {NPU: None, GPU: None}
    assert allowed["env_config_seen"] == {"allow_virtual_devices": "1"}


@needs_env_options
def test_ep_factory_entries_are_default_provider_options_of_that_ep():
    r = run_case("factory_option")
    assert r["env_config_seen"]["ep_factory.VirtualGpuExecutionProvider.fault_no_such_thing"] == "1"
    assert r["sessions"][NPU] is None  # another EP's factory: untouched
    assert "InvalidArgument: unknown provider option 'fault_no_such_thing'" in r["sessions"][GPU]
    r = run_case("factory_default")
    assert "fault_compile_fail" in r["sessions"][GPU] and r["sessions"][NPU] is None
    assert r["session_overrides"] is None  # the session's own fault_compile_fail=0 wins


def test_env_config_helpers():
    env = {"allow_virtual_devices": "1", "ep_factory.VirtualGpuExecutionProvider.fault_seed": "3",
           "ep_factory.VirtualGpuExecutionProviderX.other": "1", "ep_factory.VirtualGpuExecutionProvider.": "x"}
    assert virtual_devices_allowed("onnxhal", env) and virtual_devices_allowed("x.virtual", {})
    assert not virtual_devices_allowed("onnxhal", {"allow_virtual_devices": "0"})
    assert factory_options(env, GPU) == {"fault_seed": "3"}
    session = {"ep.virtualgpuexecutionprovider.fault_seed": "9", "session.x": "1"}
    assert with_factory_defaults(session, env, GPU) == session
    assert with_factory_defaults({}, env, GPU) == {"ep.virtualgpuexecutionprovider.fault_seed": "3"}
