"""Many threads on one onnxruntime session through the bridge, inputs and outputs bound in a
simulated GPU's memory: every thread's result equals the single-thread run's, and nothing hangs.

onnxruntime asks the EP for its session streams holding the session's stream-pool mutex, also
inside ``IOBinding.bind_ortvalue_input``, which its Python binding calls holding the GIL; the
bridge answers that call in C (bridge.c, "Session streams"), since Python there deadlocked with a
second thread binding. Each check runs in its own process with a timeout (a hang is a failure,
with every thread's Python stack on stderr): ``python -m tests.test_ort_plugin_binding_threads NAME``
prints a JSON line last."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
import onnxruntime as ort  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
API = int(ort.__version__.split(".")[1])
#: Seconds the child may take before it dumps its threads' stacks and exits (a hang).
HANG_AFTER = 90
SHAPE = [2, 4]


def _model() -> bytes:
    # y = relu(x) @ w + x, every node on the simulated device, static shapes
    w = (np.arange(16, dtype=np.float32).reshape(4, 4) - 7.5) / 8
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("MatMul", ["r", "w"], ["m"], name="mm"),
         helper.make_node("Add", ["m", "x"], ["y"], name="add")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)], [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10).SerializeToString()


def _inputs(k: int) -> np.ndarray:
    return np.random.default_rng(k).standard_normal(SHAPE).astype(np.float32)


def run_check(name: str, *args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "tests.test_ort_plugin_binding_threads", name, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=HANG_AFTER + 60)
    assert done.returncode == 0, f"check {name} exited with {done.returncode} (a hang dumps stacks):\n" \
                                 f"{done.stderr[-6000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- the check, in a child process ----------------------------------------------------------------------
def bind_and_run(profile: str, threads: str = "4", sessions: str = "8") -> dict:
    """``sessions`` sessions one after another; on each, ``threads`` threads released together bind a
    device input and output (a new session has no streams yet, so binding makes them) and run twice.
    Per session and thread: whether every run equals the session's single-thread run bit for bit."""
    import faulthandler

    faulthandler.dump_traceback_later(HANG_AFTER, exit=True)
    import onnxhal.ort_plugin as plugin

    plugin.configure(profiles=[profile])
    ort.register_execution_provider_library(plugin.REGISTRATION_NAME, plugin.library_path())
    dev = next(d for d in ort.get_ep_devices() if d.ep_vendor == "onnxhal")
    info = dev.memory_info(ort.OrtDeviceMemoryType.DEFAULT)
    count, model = int(threads), _model()
    equal: list[list[bool]] = []
    for _ in range(int(sessions)):
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.add_provider_for_devices([dev], {})
        sess = ort.InferenceSession(model, so)
        expected = [sess.run(None, {"x": _inputs(k)})[0] for k in range(count)]
        # a new session again, so that the threads' bindings are its first device streams
        sess = ort.InferenceSession(model, so)
        equal.append(_threads_on(sess, expected, info, count))
    return {"equal": equal}


def _threads_on(sess: ort.InferenceSession, expected: list, info: ort.OrtMemoryInfo, count: int) -> list[bool]:
    """``count`` threads, released together, each binding and running twice on ``sess``."""
    import threading

    start = threading.Barrier(count, timeout=HANG_AFTER)
    results = [False] * count

    def worker(k: int) -> None:
        x_dev = ort.OrtValue.ortvalue_from_shape_and_type(SHAPE, np.float32, memory_info=info)
        y_dev = ort.OrtValue.ortvalue_from_shape_and_type(SHAPE, np.float32, memory_info=info)
        ort.copy_tensors([ort.OrtValue.ortvalue_from_numpy(_inputs(k))], [x_dev], None)
        start.wait()
        binding = sess.io_binding()
        binding.bind_ortvalue_input("x", x_dev)
        binding.bind_ortvalue_output("y", y_dev)
        same = True
        for _ in range(2):
            sess.run_with_iobinding(binding)
            host = ort.OrtValue.ortvalue_from_shape_and_type(SHAPE, np.float32)
            ort.copy_tensors([y_dev], [host], None)
            same = same and bool(np.array_equal(host.numpy(), expected[k]))
        results[k] = same

    pool = [threading.Thread(target=worker, args=(k,)) for k in range(count)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return results


# -- the tests ------------------------------------------------------------------------------------------
@pytest.mark.skipif(API < 28, reason="onnxruntime's Python API makes OrtValues in a plugin EP's memory from 1.28")
def test_threads_binding_device_memory_on_one_session_agree_with_one_thread_and_never_hang():
    pytest.importorskip("pyopencl")
    r = run_check("bind_and_run", "generic-gpu")
    assert r["equal"] == [[True] * 4] * 8, r


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    result = globals()[sys.argv[1]](*sys.argv[2:])
    print(json.dumps(result))
