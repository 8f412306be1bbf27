"""A partition state sets its kernels' scalar arguments once; with the native replay module it sets
each numpy scalar's bytes with one clSetKernelArg (``_replay.set_scalar_arg``) instead of pyopencl's
``set_arg``. Both ways give the same results, equal to onnxruntime's; a bad argument is pyopencl's
error."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("pyopencl")

import onnxhal  # noqa: E402
from onnxhal.runtime.providers.opencl import native_replay  # noqa: E402
from tests.opencl_support import require_opencl  # noqa: E402

OPENCL_INDEX = require_opencl(module_level=True)
RNG = np.random.default_rng(4747)
EP = "OpenCLExecutionProvider"


def _model_bytes() -> bytes:
    """Conv 3x3 (padded, scalars: geometry) -> Relu -> Gemm-like MatMul + Add: kernels with many scalars."""
    w = numpy_helper.from_array((RNG.standard_normal((8, 8, 3, 3)) / 8).astype(np.float32), "w")
    m = numpy_helper.from_array((RNG.standard_normal((6, 5)) / 3).astype(np.float32), "m")
    nodes = [helper.make_node("Conv", ["x", "w"], ["h"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "m"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, 6, 5])], [w, m])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model.SerializeToString()


def test_native_scalar_arguments_give_the_plain_results(register, monkeypatch):
    native = native_replay.replay_module()
    if native is None:
        pytest.skip(f"no native replay here: {native_replay.unavailable}")
    register("onnxhal.runtime.providers.opencl", "opencl")
    data = _model_bytes()
    x = RNG.standard_normal((2, 8, 6, 6)).astype(np.float32)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    calls = []
    real = native.set_scalar_arg
    monkeypatch.setattr(native, "set_scalar_arg", lambda *a: calls.append(a) or real(*a))
    fast = onnxhal.InferenceSession(data, providers=[EP, "CPUExecutionProvider"])
    y_fast = fast.run(None, {"x": x})[0]
    assert set(fast.partition_summary) == {EP} and calls  # every node on the device, scalars set natively
    monkeypatch.setenv(native_replay.NATIVE_SWITCH, "0")  # the plain path: pyopencl's set_arg
    count = len(calls)
    plain = onnxhal.InferenceSession(data, providers=[EP, "CPUExecutionProvider"])
    y_plain = plain.run(None, {"x": x})[0]
    assert len(calls) == count
    np.testing.assert_array_equal(y_fast, y_plain)
    np.testing.assert_allclose(y_fast, want, rtol=1e-5, atol=1e-5)


def test_a_bad_scalar_argument_is_pyopencls_error():
    import pyopencl as cl

    native = native_replay.replay_module()
    if native is None:
        pytest.skip(f"no native replay here: {native_replay.unavailable}")
    p, d = (int(i) for i in OPENCL_INDEX.split(":"))
    ctx = cl.Context([cl.get_platforms()[p].get_devices()[d]])
    prg = cl.Program(ctx, "__kernel void f(__global float* a, const int n) { a[0] = n; }").build()
    kernel = cl.Kernel(prg, "f")
    assert native.set_scalar_arg(kernel.int_ptr, 1, np.int32(3)) == 0
    code = native.set_scalar_arg(kernel.int_ptr, 1, np.float64(3))  # 8 bytes for an int: CL_INVALID_ARG_SIZE
    assert code != 0
    with pytest.raises(cl.LogicError, match="clSetKernelArg"):
        native_replay.raise_cl_error(code, "clSetKernelArg")
