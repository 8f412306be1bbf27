"""Built-in EP libraries are usable by EP name, as onnxruntime's built-in EPs are: the OpenCL EP is
registered on first use of ``providers=["OpenCLExecutionProvider"]`` or ``onnxhal run --ep
OpenCLExecutionProvider``; where it has no device, one line names the probe's verdict and the remedy."""

from __future__ import annotations

import gc
import glob
import os
import subprocess
import sys

import onnx
import pytest

import onnxhal
from onnxhal.runtime.env.environment import BUILTIN_EP_LIBRARIES, get_environment
from tests.models import add_mul_model, assert_add_mul_runs
from tests.opencl_support import require_opencl

OPENCL = "OpenCLExecutionProvider"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def on_first_use():
    """Drops the library that first use registers, whatever the test did."""
    yield
    gc.collect()
    env = get_environment()
    for lib in env.libraries():
        if lib.on_first_use:
            env.force_unregister(lib.name)


def _cli(args: list[str], env_update: dict[str, str]) -> subprocess.CompletedProcess:
    # POCL_DEVICES too: the child chooses its drivers, and a PoCL told to list no device has no verdict to give
    env = {k: v for k, v in os.environ.items()
           if k not in ("ONNXHAL_SIMULATE", "ONNXHAL_OPENCL", "OCL_ICD_VENDORS", "POCL_DEVICES")}
    env.update(env_update)
    return subprocess.run([sys.executable, "-m", "onnxhal", *args], capture_output=True, text=True, timeout=240,
                          env=env, cwd=ROOT)


def test_opencl_ep_by_name_in_providers(on_first_use):
    require_opencl()
    assert not any(d.ep_name == OPENCL for d in onnxhal.get_ep_devices())  # nothing registered it before
    sess = onnxhal.InferenceSession(add_mul_model(), providers=[OPENCL])
    assert sess.get_providers() == [OPENCL, "CPUExecutionProvider"]
    assert sess.partition_summary.get(OPENCL, 0) == 3
    assert_add_mul_runs(sess)
    assert OPENCL in onnxhal.get_available_providers()


def test_explicit_registration_takes_over_from_first_use(on_first_use):
    require_opencl()
    del_me = onnxhal.InferenceSession(add_mul_model(), providers=[OPENCL])
    del del_me
    gc.collect()
    onnxhal.register_execution_provider_library("my_opencl", "onnxhal.runtime.providers.opencl")
    try:
        owners = {d.library_name for d in onnxhal.get_ep_devices() if d.ep_name == OPENCL}
        assert owners == {"my_opencl"}
    finally:
        onnxhal.unregister_execution_provider_library("my_opencl")


def test_all_providers_lists_the_builtin_eps_before_first_use():
    assert set(BUILTIN_EP_LIBRARIES) <= set(onnxhal.get_all_providers())
    assert onnxhal.get_all_providers()[-1] == "CPUExecutionProvider"


def test_cli_run_with_the_opencl_ep_by_name(tmp_path, capsys, on_first_use):
    require_opencl()
    from onnxhal.cli import main

    path = tmp_path / "m.onnx"
    onnx.save(add_mul_model(), path)
    assert main(["run", str(path), "--ep", OPENCL, "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert f"Partition ({OPENCL}, CPUExecutionProvider)" in out and "host -> OpenCLExecutionProvider" in out


def test_cli_names_the_switch_when_opencl_is_off(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(add_mul_model(), path)
    out = _cli(["run", str(path), "--ep", OPENCL], {"ONNXHAL_OPENCL": "off"})
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines() == [
        f"onnxhal: RuntimeInvalidArgument: Unknown Provider Type: {OPENCL}: execution provider {OPENCL!r} has no "
        "EP device on this machine: OpenCL is switched off (ONNXHAL_OPENCL=off); unset ONNXHAL_OPENCL to use OpenCL "
        "devices"]


def test_no_device_passing_the_probe_is_named_with_its_verdict_and_the_remedy(tmp_path):
    """Only pip's bundled PoCL visible: where it cannot compile (a CPU newer than its LLVM, as here),
    the error names each device's probe verdict and the remedy in one line."""
    import pyopencl

    libs = glob.glob(os.path.join(os.path.dirname(pyopencl.__file__), ".libs", "libpocl*.so*"))
    if not libs:
        pytest.skip("pyopencl ships no bundled PoCL here")
    vendors = tmp_path / "vendors"
    vendors.mkdir()
    (vendors / "bundled.icd").write_text(libs[0] + "\n")
    path = tmp_path / "m.onnx"
    onnx.save(add_mul_model(), path)
    out = _cli(["run", str(path), "--ep", OPENCL, "--repeat", "1"], {"OCL_ICD_VENDORS": str(vendors)})
    if out.returncode == 0:
        pytest.skip("the bundled PoCL passes its probe on this CPU: there is no failing verdict to report")
    errors = [line for line in out.stderr.splitlines() if line.startswith("onnxhal:")]
    assert out.returncode == 2 and len(errors) == 1 and "Traceback" not in out.stderr
    assert "has no EP device on this machine: no OpenCL device passed the probe (" in errors[0]
    assert "pthread" in errors[0] and "For a working OpenCL CPU driver" in errors[0]


def test_an_unknown_name_lists_the_builtin_eps_and_how_to_get_the_simulated_ones():
    with pytest.raises(onnxhal.errors.InvalidArgument) as info:
        onnxhal.InferenceSession(add_mul_model(), providers=["OpenClExecutionProvider"])  # a typo
    text = str(info.value)
    assert "'OpenClExecutionProvider' is unknown" in text and "usable by name: ['OpenCLExecutionProvider']" in text
    assert "ONNXHAL_SIMULATE" in text
