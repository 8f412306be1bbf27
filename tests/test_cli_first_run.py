"""What a new user meets in the first commands: a policy that finds no device of its kind says so,
``devices`` says how to use the OpenCL EP it lists, one run is "1 run"."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import onnx
import pytest

from onnxhal.demo_models import demo_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _onnxhal(*args: str, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("ONNXHAL_SIMULATE", "COLUMNS")}
    full.update(env)
    return subprocess.run([sys.executable, "-m", "onnxhal", *args], capture_output=True, text=True, env=full,
                          cwd=ROOT, timeout=300)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("first_run") / "model.onnx"
    onnx.save(demo_model(), path)
    return str(path)


def test_a_policy_without_its_device_kind_says_so_on_stderr(model):
    part = _onnxhal("partition", model, "--policy", "PREFER_NPU")
    assert part.returncode == 0, part.stderr
    assert "PREFER_NPU found no NPU EP device here" in part.stderr and "ONNXHAL_SIMULATE=generic-npu" in part.stderr
    run = _onnxhal("run", model, "--policy", "prefer_gpu", "--repeat", "1", "--json")
    assert run.returncode == 0, run.stderr
    assert "PREFER_GPU found no GPU EP device here" in run.stderr
    json.loads(run.stdout)  # stdout stays one JSON object
    simulated = _onnxhal("partition", model, "--policy", "PREFER_NPU", ONNXHAL_SIMULATE="generic-npu")
    assert simulated.returncode == 0 and "found no" not in simulated.stderr, simulated.stderr


def test_one_run_is_one_run(model):
    out = _onnxhal("run", model, "--repeat", "1")
    assert out.returncode == 0, out.stderr
    assert "latency over 1 run: median" in out.stdout


def test_devices_says_how_to_use_the_opencl_ep_it_lists():
    from tests.opencl_support import opencl_verdict

    index, reason = opencl_verdict()
    out = _onnxhal("devices")
    assert out.returncode == 0, out.stderr
    if index is None:  # no usable OpenCL device: nothing to point at
        assert "--ep OpenCLExecutionProvider" not in out.stdout, reason
        return
    assert "onnxhal run MODEL --ep OpenCLExecutionProvider" in out.stdout
    assert "ONNXHAL_SIMULATE=generic-npu,generic-gpu adds simulated devices" in out.stdout
    simulated = _onnxhal("devices", ONNXHAL_SIMULATE="generic-npu")
    assert "adds simulated devices" not in simulated.stdout
