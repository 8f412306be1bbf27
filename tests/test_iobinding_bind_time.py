"""An input bound through IOBinding in other memory than the device that reads it is copied there
when it is bound, as onnxruntime's ``IOBinding::BindInput`` does (io_binding.cc, through
``utils::CopyOneInputAcrossDevices``): writing into the bound host buffer afterwards is not seen by
the run. Read on the host (a CPU-only session), the buffer is read at run time. onnxhal's own
session is held against onnxruntime with the plugin library, which shows onnxruntime's behaviour,
in a child process (``python -m tests.test_iobinding_bind_time PROFILE`` prints a JSON line)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxhal
from onnxhal.simulators.testing import simulated_devices

ROOT = Path(__file__).resolve().parent.parent
SHAPE = [2, 4]
W = (np.arange(16, dtype=np.float32).reshape(4, 4) - 7.5) / 8
AT_BIND = np.full(SHAPE, 0.5, np.float32)  # the buffer's values when it is bound
AT_RUN = (np.arange(8, dtype=np.float32).reshape(SHAPE) - 3) / 2  # written into it before the run


def _model() -> bytes:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("MatMul", ["r", "w"], ["m"]),
         helper.make_node("Add", ["m", "x"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)], [numpy_helper.from_array(W, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10).SerializeToString()


def _expected(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0) @ W + x


def _bind_write_run(ort, sess) -> np.ndarray:
    """Bind a host OrtValue, write new values into its buffer, run; the output as the run left it."""
    x_buf, y_buf = AT_BIND.copy(), np.zeros(SHAPE, np.float32)
    x_val, y_val = ort.OrtValue.ortvalue_from_numpy(x_buf), ort.OrtValue.ortvalue_from_numpy(y_buf)
    binding = sess.io_binding()
    binding.bind_ortvalue_input("x", x_val)
    binding.bind_ortvalue_output("y", y_val)
    x_val.update_inplace(AT_RUN)
    sess.run_with_iobinding(binding)
    first = y_val.numpy().copy()
    binding.bind_ortvalue_input("x", x_val)  # bound again: the values written are taken now
    sess.run_with_iobinding(binding)
    return np.stack([first, y_val.numpy()])


def onnxruntime_with_plugin(profile: str) -> dict:
    import onnxruntime as ort

    import onnxhal.ort_plugin as plugin

    plugin.configure(profiles=[profile])
    ort.register_execution_provider_library(plugin.REGISTRATION_NAME, plugin.library_path())
    dev = next(d for d in ort.get_ep_devices() if d.ep_vendor == "onnxhal")
    so = ort.SessionOptions()
    so.add_provider_for_devices([dev], {})
    device = _bind_write_run(ort, ort.InferenceSession(_model(), so))
    cpu = _bind_write_run(ort, ort.InferenceSession(_model(), providers=["CPUExecutionProvider"]))
    return {"device": device.tolist(), "cpu": cpu.tolist()}


@pytest.mark.parametrize("profile", ["generic-gpu", "generic-npu"])
def test_an_input_bound_for_a_device_is_copied_when_bound_as_onnxruntime_copies_it(profile):
    with simulated_devices(profile) as devices:
        so = onnxhal.SessionOptions()
        so.add_provider_for_devices([devices[0]], {})
        ours = _bind_write_run(onnxhal, onnxhal.InferenceSession(_model(), so))
    np.testing.assert_allclose(ours[0], _expected(AT_BIND), rtol=1e-3, atol=1e-3)  # the values bound
    np.testing.assert_allclose(ours[1], _expected(AT_RUN), rtol=1e-3, atol=1e-3)  # bound again
    cpu_only = _bind_write_run(onnxhal, onnxhal.InferenceSession(_model(), providers=["CPUExecutionProvider"]))
    np.testing.assert_array_equal(cpu_only[0], _expected(AT_RUN))  # read on the host: read at run time

    pytest.importorskip("onnxruntime")
    done = subprocess.run([sys.executable, "-m", "tests.test_iobinding_bind_time", profile], cwd=ROOT,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(ours, np.array(theirs["device"], np.float32), rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(cpu_only, np.array(theirs["cpu"], np.float32), rtol=1e-6, atol=1e-6)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    print(json.dumps(onnxruntime_with_plugin(sys.argv[1])))
