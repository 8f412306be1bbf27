"""Checks of hostile input and many threads through onnxhal's plugin library inside onnxruntime, one
per subprocess (``python -m tests.ort_bridge_hostile NAME`` prints a JSON line last), as
tests/ort_bridge_checks.py."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import onnxruntime as ort  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

from tests.ort_bridge_checks import GPU, NPU, assignment, device, register, session  # noqa: E402


def _error(sess_or_model, feeds: dict) -> str | None:
    """The error of a run (a model: loaded and run by onnxruntime's CPU EP alone), else None."""
    try:
        sess = sess_or_model if isinstance(sess_or_model, ort.InferenceSession) else ort.InferenceSession(
            sess_or_model.SerializeToString(), providers=["CPUExecutionProvider"])
        sess.run(None, feeds)
        return None
    except Exception as e:  # the point: onnxruntime's error, compared with onnxruntime alone's
        return f"{type(e).__name__}: {e}"


def refused_nodes_left_to_onnxruntime() -> dict:
    """Nodes onnxhal's loader refuses (an axis beyond the rank, a Conv kernel_shape other than its
    weight's) are not claimed: onnxruntime's own kernel refuses them, as without onnxhal."""
    register()
    vi = helper.make_tensor_value_info
    w = helper.make_tensor("w", TensorProto.FLOAT, [2, 1, 3, 3], np.ones(18, np.float32))
    models = {
        "concat_axis": helper.make_model(helper.make_graph(
            [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Concat", ["r", "r"], ["y"], name="cat", axis=-2**62)],
            "g", [vi("x", TensorProto.FLOAT, [2, 3])], [vi("y", TensorProto.FLOAT, None)]),
            opset_imports=[helper.make_opsetid("", 17)], ir_version=10),
        "conv_kernel_shape": helper.make_model(helper.make_graph(
            [helper.make_node("Conv", ["x", "w"], ["y"], name="conv", kernel_shape=[2, 2])],
            "g", [vi("x", TensorProto.FLOAT, [1, 1, 4, 4])], [vi("y", TensorProto.FLOAT, None)], [w]),
            opset_imports=[helper.make_opsetid("", 17)], ir_version=10),
        # fuzz mutant 1514 of seed 35: Conv's inputs swapped, a weight of rank 1 (an IndexError in the
        # OpenCL EP's lowering, logged, where onnxruntime's kernel refuses the shapes).
        "conv_weight_rank": helper.make_model(helper.make_graph(
            [helper.make_node("Conv", ["x", "b", "w"], ["y"], name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1])],
            "g", [vi("x", TensorProto.FLOAT, [1, 2, 4, 4])], [vi("y", TensorProto.FLOAT, None)],
            [helper.make_tensor("b", TensorProto.FLOAT, [3], np.ones(3, np.float32)),
             helper.make_tensor("w", TensorProto.FLOAT, [3, 2, 3, 3], np.ones(54, np.float32))]),
            opset_imports=[helper.make_opsetid("", 17)], ir_version=10),
    }
    out: dict = {}
    for name, model in models.items():
        shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
        feeds = {"x": np.linspace(-1, 1, int(np.prod(shape)), dtype=np.float32).reshape(shape)}
        out[name] = {"alone": _error(model, feeds)}
        for ep in (NPU, GPU):
            sess = session(model, devices=[device(ep)])
            out[name][ep] = {"assignment": assignment(sess), "error": _error(sess, feeds)}
    return out


def reshape_sizes() -> dict:
    """A Reshape from [7, 3] to [3, 2] (fuzz mutant 1627 of seed 35: the input's declared dims
    changed): the simulated devices' plans made it a view of the first 6 values and ran, onnxhal's
    own session as well as inside onnxruntime, where onnxruntime refuses it."""
    import os

    os.environ["ONNXHAL_SIMULATE"] = "generic-npu,generic-gpu"
    import onnxhal

    register()
    vi = helper.make_tensor_value_info
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
         helper.make_node("Relu", ["r"], ["y"], name="relu")],
        "g", [vi("x", TensorProto.FLOAT, [7, 3])], [vi("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("shape", TensorProto.INT64, [2], np.array([3, 2], np.int64))]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    feeds = {"x": np.linspace(-1, 1, 21, dtype=np.float32).reshape(7, 3)}
    out: dict = {"alone": _error(model, feeds)}
    for ep in (NPU, GPU):
        sess = session(model, devices=[device(ep)])
        out[ep] = {"assignment": assignment(sess), "error": _error(sess, feeds)}
    so = onnxhal.SessionOptions()
    so.set_provider_selection_policy(onnxhal.OrtExecutionProviderDevicePolicy.PREFER_GPU)
    own = onnxhal.InferenceSession(model.SerializeToString(), so)
    try:
        own.run(None, feeds)
        out["onnxhal"] = None
    except Exception as e:
        out["onnxhal"] = f"{type(e).__name__}: {e}"
    return out


def host_backend_error() -> dict:
    """A Gemm whose runtime input does not fit its weight, on the simulated GPU (run with
    ONNXHAL_OPENCL=off: the host backend)."""
    register()
    vi = helper.make_tensor_value_info
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Gemm", ["x", "w"], ["y"], name="gemm", transB=1)], "g",
        [vi("x", TensorProto.FLOAT, ["n", "k"])], [vi("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("w", TensorProto.FLOAT, [3, 4], np.ones(12, np.float32))]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    sess = session(model, devices=[device(GPU)], optimize=False)
    return {"assignment": assignment(sess), "error": _error(sess, {"x": np.ones((2, 2), np.float32)})}


def empty_tensors() -> dict:
    """A batch of 0 rows on the simulated GPU (device memory declared): onnxruntime gives an empty
    tensor no buffer, so both sides of its copy to the device read as host memory. As in onnxruntime
    alone, the run gives an empty output; and an If whose branches run on the device (fuzz mutant
    369 of seed 35) as well."""
    register()
    vi = helper.make_tensor_value_info
    plain = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Add", ["r", "x"], ["y"], name="add")],
        "g", [vi("x", TensorProto.FLOAT, ["n", 3])], [vi("y", TensorProto.FLOAT, ["n", 3])]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    branch = helper.make_model(helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], name="if",
                          then_branch=helper.make_graph([helper.make_node("Relu", ["x"], ["t"], name="then_relu")],
                                                        "then", [], [vi("t", TensorProto.FLOAT, None)]),
                          else_branch=helper.make_graph([helper.make_node("Neg", ["x"], ["e"], name="else_neg")],
                                                        "else", [], [vi("e", TensorProto.FLOAT, None)]))],
        "g", [vi("c", TensorProto.BOOL, []), vi("x", TensorProto.FLOAT, ["n"])], [vi("y", TensorProto.FLOAT, None)]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    out: dict = {}
    for name, model, feeds in (("plain", plain, {"x": np.ones((0, 3), np.float32)}),
                               ("if", branch, {"c": np.array(True), "x": np.ones(0, np.float32)})):
        sess = session(model, devices=[device(GPU)])
        cpu = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        try:
            got = [list(a.shape) for a in sess.run(None, feeds)]
        except Exception as e:
            got = f"{type(e).__name__}: {e}"
        out[name] = {"assignment": assignment(sess), "got": got,
                     "alone": [list(a.shape) for a in cpu.run(None, feeds)]}
    return out


def _threads_model():
    """Conv -> Relu -> MatMul -> Softmax -> Add: kernels with real arithmetic, on either profile."""
    rng = np.random.default_rng(5)
    inits = [helper.make_tensor("w", TensorProto.FLOAT, [4, 3, 3, 3], rng.standard_normal(108).astype(np.float32) * 0.3),
             helper.make_tensor("m", TensorProto.FLOAT, [8, 8], rng.standard_normal(64).astype(np.float32) * 0.3),
             helper.make_tensor("shape", TensorProto.INT64, [2], np.array([4, 64], np.int64))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "m"], ["mm"], name="matmul"),
             helper.make_node("Softmax", ["mm"], ["s"], name="softmax", axis=-1),
             helper.make_node("Add", ["s", "r"], ["y"], name="add")]
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "threads", [vi("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [vi("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


THREADS, RUNS = 8, 25


def _run_threads(sess, inputs: list) -> tuple[list, list[str]]:
    """Run ``inputs`` on ``sess`` from THREADS threads started together, input k on thread k % THREADS."""
    got: list = [None] * len(inputs)
    failures: list[str] = []
    start = threading.Barrier(THREADS)

    def work(t: int) -> None:
        start.wait()
        try:
            for k in range(t, len(inputs), THREADS):
                got[k] = sess.run(None, {"x": inputs[k]})[0]
        except Exception as e:
            failures.append(f"{type(e).__name__}: {e}")

    workers = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return got, failures


def threads_agree_with_one_thread() -> dict:
    """THREADS threads x RUNS runs on one onnxruntime session on a simulated device, each run on its
    own input: every result equals, bit for bit, what one thread gets for that input."""
    register()
    model = _threads_model()
    rng = np.random.default_rng(11)
    inputs = [rng.standard_normal((1, 3, 8, 8)).astype(np.float32) for _ in range(THREADS * RUNS)]
    out: dict = {}
    from onnxhal.simulators.profiles import load_profile

    for ep, profile in ((NPU, "generic-npu"), (GPU, "generic-gpu")):
        tol = load_profile(profile)
        sess = session(model, devices=[device(ep)])
        alone = [sess.run(None, {"x": x})[0] for x in inputs]
        got, failures = _run_threads(sess, inputs)
        cpu = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        reference = [cpu.run(None, {"x": x})[0] for x in inputs]
        out[ep] = {"assignment": assignment(sess), "failures": failures,
                   "differing_runs": sum(g is None or not np.array_equal(g, a) for g, a in zip(got, alone)),
                   "distinct_results": len({a.tobytes() for a in alone}),
                   "max_err_vs_cpu": float(max(np.abs(a - r).max() for a, r in zip(alone, reference))),
                   "beyond_tolerance": sum(int((~np.isclose(a, r, rtol=tol.rtol, atol=tol.atol)).sum())
                                           for a, r in zip(alone, reference))}
    return out


if __name__ == "__main__":
    result = globals()[sys.argv[1]]()
    print(json.dumps(result))
    sys.stdout.flush()
