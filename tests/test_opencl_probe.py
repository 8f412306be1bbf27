"""Probing OpenCL devices, the switch that turns OpenCL off, the Intel runtime's vendors folder and
the remedy text: what makes onnxhal work on a CPU its bundled driver cannot compile for."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from onnxhal.devices import opencl_env, opencl_probe
from onnxhal.devices.opencl import enumerate_opencl_devices
from onnxhal.devices.opencl_remedy import opencl_remedy
from tests.opencl_support import opencl_verdict

OFF = {"ONNXHAL_OPENCL": "off"}


def _python(code: str, env: dict | None = None, timeout: int = 240) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("ONNXHAL_SIMULATE", "ONNXHAL_OPENCL", "OCL_ICD_VENDORS")}
    full.update(env or {})
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=timeout)


def test_every_listed_device_carries_a_verdict_and_failures_say_why() -> None:
    records = enumerate_opencl_devices()
    if not records:
        pytest.skip(f"no OpenCL device listed: {opencl_verdict()[1]}")
    for r in records:
        assert r.probe.usable or r.probe.reason, r
        assert r.probe.state == ("usable" if r.probe.usable else f"failed probe: {r.probe.reason}")
        # The bundled PoCL (LLVM 14) names its target "generic" on CPUs newer than its LLVM: every
        # build fails there, and the probe must say so rather than offer the device.
        if r.version.endswith("-generic"):
            assert not r.probe.usable and "unknown target CPU 'generic'" in r.probe.reason


def test_verdict_is_kept_on_disk_keyed_by_driver(tmp_path, monkeypatch) -> None:
    import pyopencl as cl

    devices = [d for p in cl.get_platforms() for d in p.get_devices()]
    if not devices:
        pytest.skip("no OpenCL device listed")
    monkeypatch.setenv("ONNXHAL_CACHE_DIR", str(tmp_path))
    opencl_probe.forget_verdicts()
    try:
        first = opencl_probe.probe_device(devices[0])
        files = list((tmp_path / "probe").glob("*.json"))
        assert len(files) == 1
        saved = json.loads(files[0].read_text())
        assert saved["key"] == opencl_probe.device_key(devices[0]) and saved["usable"] == first.usable
        assert devices[0].driver_version.strip() in saved["key"]
        # A later process reads the file: no second probe.
        opencl_probe.forget_verdicts()
        monkeypatch.setattr(opencl_probe, "_run_probe", lambda device: pytest.fail("probed again"))
        assert opencl_probe.probe_device(devices[0]) == first
    finally:
        opencl_probe.forget_verdicts()


def test_first_log_line_finds_the_error() -> None:
    log = "Build on <pyopencl.Device 'pthread-AMD EPYC'>:\n\nerror: unknown target CPU 'generic'\nDevice x f\n"
    assert opencl_probe.first_log_line(log) == "error: unknown target CPU 'generic'"
    assert opencl_probe.first_log_line("") == "no build log"


def test_switch_off_runs_simulated_devices_on_the_host() -> None:
    """ONNXHAL_OPENCL=off: no OpenCL device is listed, the simulated NPU still appears (backend host),
    takes the same nodes, computes in fp16 and matches the CPU EP within its profile's tolerance; one
    warning says why."""
    code = r"""
import json, logging, numpy as np
logging.basicConfig(level=logging.WARNING)
import onnxhal
from onnxhal.demo import demo_model
hw = onnxhal.get_hardware_devices()
eps = onnxhal.get_ep_devices()
so = onnxhal.SessionOptions()
so.set_provider_selection_policy(onnxhal.OrtExecutionProviderDevicePolicy.PREFER_NPU)
sess = onnxhal.InferenceSession(demo_model(), so)
again = onnxhal.InferenceSession(demo_model(), so)
x = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32)
(y,) = sess.run(None, {"x": x})
(ref,) = onnxhal.InferenceSession(demo_model(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
print(json.dumps({"cpu_md": dict(hw[0].metadata), "eps": [[d.ep_name, dict(d.ep_metadata)] for d in eps],
                  "providers": sess.get_providers(), "summary": sess.partition_summary,
                  "err": float(np.abs(y - ref).max())}))
"""
    out = _python(code, dict(OFF, ONNXHAL_SIMULATE="generic-npu,generic-gpu"))
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout.strip().splitlines()[-1])
    assert not any(k.startswith("opencl") for k in data["cpu_md"])
    eps = dict(data["eps"])
    assert "OpenCLExecutionProvider" not in eps
    npu = eps["VirtualNpuExecutionProvider"]
    assert npu["backend"] == "host" and npu["backend_reason"] == "ONNXHAL_OPENCL=off"
    assert data["providers"][0] == "VirtualNpuExecutionProvider"
    assert data["summary"]["VirtualNpuExecutionProvider"] == 7  # as on OpenCL: Conv..Softmax and 2 Transposes
    assert 0 < data["err"] < 2e-3  # fp16 storage shows, within generic-npu's tolerance
    assert out.stderr.count("simulated devices run on the host backend") == 1


@pytest.mark.skipif(opencl_env.opencl_disabled(), reason="ONNXHAL_OPENCL=off already: this suite ran them so")
def test_simulator_suites_pass_with_opencl_switched_off() -> None:
    """The simulated devices' own test modules, again, on the host backend: placement, capacity,
    faults and failover, the cost model, EPContext, the pytest plugin."""
    modules = ["tests/test_sim_devices.py", "tests/test_sim_faults.py", "tests/test_sim_cost.py",
               "tests/test_sim_ep_context.py", "tests/test_sim_matrix.py", "tests/test_sim_pytest_plugin.py",
               "tests/test_hal_conformance.py", "tests/test_sim_profile_rules.py"]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k != "ONNXHAL_SIMULATE"}
    env.update(OFF)
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *modules], cwd=root,
                         env=env, capture_output=True, text=True, timeout=600)
    tail = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-2000:]
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert " passed" in tail and "failed" not in tail


def test_intel_vendors_folder_names_the_library_and_keeps_the_system_drivers(tmp_path) -> None:
    system = tmp_path / "etc-vendors"
    system.mkdir()
    (system / "pocl.icd").write_text("libpocl.so.2.11.0\n")
    library = tmp_path / "prefix" / "lib" / opencl_env.INTEL_LIBRARY
    folder = opencl_env.write_intel_vendors_dir(library, tmp_path / "cache", str(system))
    assert (folder / opencl_env.INTEL_ICD_NAME).read_text() == f"{library}\n"
    assert (folder / "system-pocl.icd").resolve() == (system / "pocl.icd").resolve()
    # Written again by another process: the same folder, unchanged.
    assert opencl_env.write_intel_vendors_dir(library, tmp_path / "cache", str(system)) == folder


def test_intel_runtime_is_made_visible_only_when_the_user_set_nothing(tmp_path) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / opencl_env.INTEL_LIBRARY).write_bytes(b"")
    code = f"""
import os, sys
from onnxhal.devices import opencl_env
opencl_env.intel_runtime_library = lambda prefix=None: opencl_env.Path({str(lib / opencl_env.INTEL_LIBRARY)!r})
opencl_env._prepared = False
opencl_env.prepare_opencl_environment()
print(os.environ.get("OCL_ICD_VENDORS", "-"))
"""
    cache = {"ONNXHAL_CACHE_DIR": str(tmp_path / "cache")}
    out = _python(code, cache)
    assert out.returncode == 0, out.stderr
    folder = out.stdout.strip().splitlines()[-1]
    assert folder.startswith(str(tmp_path / "cache")) and os.path.isfile(os.path.join(folder, opencl_env.INTEL_ICD_NAME))
    mine = _python(code, dict(cache, OCL_ICD_VENDORS="/my/vendors"))
    assert mine.stdout.strip().splitlines()[-1] == "/my/vendors"


def test_remedy_names_the_debian_package_where_it_exists() -> None:
    debian = opencl_remedy({"ID": "debian"}, "x86_64")
    assert "apt-get install --no-install-recommends pocl-opencl-icd" in debian and "onnxhal[intel-opencl]" in debian
    ubuntu = opencl_remedy({"ID": "ubuntu", "ID_LIKE": "debian"}, "aarch64")
    assert "pocl-opencl-icd" in ubuntu and "intel" not in ubuntu
    fedora = opencl_remedy({"ID": "fedora"}, "aarch64")
    assert "apt-get" not in fedora and "ICD" in fedora
    assert "Optional" in fedora
