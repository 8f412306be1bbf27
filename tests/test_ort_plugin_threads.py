"""Many threads on one onnxruntime session whose nodes run on a simulated device through onnxhal's
plugin library (tests/ort_bridge_hostile.py, threads_agree_with_one_thread): every run, on its own
input, gives bit for bit what one thread gets for that input, on both profiles and both backends
(OpenCL where a driver passes its probe, and the host backend)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")
import onnxruntime  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NPU, GPU = "VirtualNpuExecutionProvider", "VirtualGpuExecutionProvider"
ORT_VERSION = tuple(int(x) for x in onnxruntime.__version__.split(".")[:2])


def run_check(name: str, env: dict | None = None, timeout: float = 300) -> dict:
    done = subprocess.run([sys.executable, "-m", "tests.ort_bridge_hostile", name], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})
    assert done.returncode == 0, f"check {name} exited with {done.returncode}:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(ORT_VERSION < (1, 24), reason="virtual hardware devices need onnxruntime 1.24")
@pytest.mark.parametrize("opencl", ["default", "off"])
def test_threads_on_one_session_agree_with_one_thread(opencl):
    r = run_check("threads_agree_with_one_thread", {} if opencl == "default" else {"ONNXHAL_OPENCL": "off"})
    for ep in (NPU, GPU):
        got = r[ep]
        assert list(got["assignment"]) == [ep], got["assignment"]  # every node on the simulated device
        assert got["failures"] == []
        assert got["distinct_results"] == 200  # 8 threads x 25 runs, each on its own input
        assert got["differing_runs"] == 0
        assert got["beyond_tolerance"] == 0, got["max_err_vs_cpu"]  # the profile's, against onnxruntime's CPU EP
