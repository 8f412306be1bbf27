"""The pytest plugin, as a downstream project uses it: a test with the ``ep_device`` fixture runs once
per EP device under ``--onnxhal-simulate``, and the marker selects device types."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("pyopencl")

DOWNSTREAM = textwrap.dedent('''
    import numpy as np
    import pytest
    from onnx import TensorProto, helper

    import onnxhal


    def model() -> bytes:
        graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


    def test_model_on_every_device(ep_device, ep_session_options):
        sess = onnxhal.InferenceSession(model(), ep_session_options)
        assert sess.get_providers()[0] == ep_device.ep_name
        x = np.array([[-1, 0, 2], [3, -4, 5]], np.float32)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], np.maximum(x, 0), rtol=1e-3)


    @pytest.mark.onnxhal_devices("npu")
    def test_npu_only(ep_device):
        assert ep_device.device.type.name == "NPU" and ep_device.device.is_virtual
''')


OWN_FIXTURE = textwrap.dedent('''
    import pytest


    @pytest.fixture
    def ep_device():
        return "mine"


    def test_a_project_fixture_of_the_same_name_wins(ep_device):
        assert ep_device == "mine"
''')


def run_pytest(tmp_path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_downstream.py").write_text(DOWNSTREAM)
    (tmp_path / "test_own_fixture.py").write_text(OWN_FIXTURE)
    env = {k: v for k, v in os.environ.items() if k != "ONNXHAL_SIMULATE"}
    return subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "test_downstream.py",
                           "test_own_fixture.py", *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_downstream_tests_run_once_per_device(tmp_path):
    out = run_pytest(tmp_path, "--onnxhal-simulate=generic-npu,generic-gpu")
    assert out.returncode == 0, out.stdout + out.stderr
    for test_id in ("test_model_on_every_device[cpu-CPUExecutionProvider] PASSED",
                    "test_model_on_every_device[npu-generic-npu] PASSED",
                    "test_model_on_every_device[gpu-generic-gpu] PASSED",
                    "test_npu_only[npu-generic-npu] PASSED"):
        assert test_id in out.stdout, out.stdout
    assert "test_a_project_fixture_of_the_same_name_wins PASSED" in out.stdout  # not parametrized
    assert "5 passed" in out.stdout
    # The header says where the simulated devices run, as the probe decided.
    from tests.opencl_support import opencl_verdict

    index, reason = opencl_verdict()
    where = "on OpenCL (" if index is not None else f"on the host backend ({reason.split(':')[0]}"
    assert f"onnxhal: VirtualNpuExecutionProvider (generic-npu) {where}" in out.stdout, out.stdout


def test_without_the_option_only_the_cpu_is_there(tmp_path):
    out = run_pytest(tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "test_model_on_every_device[cpu-CPUExecutionProvider] PASSED" in out.stdout
    assert "2 passed, 1 skipped" in out.stdout  # no NPU: the marker leaves an empty parameter set
