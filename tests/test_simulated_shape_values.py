"""Rule ``shape_values`` on a simulated device, on both of its backends: OpenCL (a driver) and the
host backend (none, ``simulators/host_backend.py``). A scalar shape value (Shape -> Gather with a
scalar index) leaves one partition and feeds another, and is a graph output, as the window-size
chains of a Swin transformer are; onnxruntime's CPU EP judges values, dtypes and shapes."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxhal

RNG = np.random.default_rng(4646)
PROFILE = "intel-gpu"  # computes int32 and takes symbolic dims: it claims shape values


def _scalar_chain_model() -> bytes:
    # Partition 1: q = x @ w, Reshape(q, [dim0, dim1, 4, 8]) from Shape -> Gather(scalar index), with
    # the scalar dim0 ("b") a graph output. CumSum, which the device does not take, ends it.
    # Partition 2: Reshape(c, [b, -1]) from the scalar b that partition 1 computed.
    nodes = [helper.make_node("MatMul", ["x", "w"], ["q"]),
             helper.make_node("Shape", ["q"], ["s"]),
             helper.make_node("Gather", ["s", "i0"], ["b"], axis=0),
             helper.make_node("Gather", ["s", "i1"], ["t"], axis=0),
             helper.make_node("Unsqueeze", ["b", "ax0"], ["bu"]),
             helper.make_node("Unsqueeze", ["t", "ax0"], ["tu"]),
             helper.make_node("Concat", ["bu", "tu", "hd"], ["shape4"], axis=0),
             helper.make_node("Reshape", ["q", "shape4"], ["q4"]),
             helper.make_node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
             helper.make_node("Relu", ["qt"], ["r"]),
             helper.make_node("CumSum", ["r", "ax3"], ["c"]),
             helper.make_node("Unsqueeze", ["b", "ax0"], ["bu2"]),
             helper.make_node("Concat", ["bu2", "minus1"], ["shape2"], axis=0),
             helper.make_node("Reshape", ["c", "shape2"], ["c2"]),
             helper.make_node("Mul", ["c2", "two"], ["m"]),
             helper.make_node("Relu", ["m"], ["y"])]
    consts = {"w": RNG.standard_normal((32, 32)).astype(np.float32) * 0.2, "i0": np.array(0, np.int64),
              "i1": np.array(1, np.int64), "ax0": np.array([0], np.int64), "hd": np.array([4, 8], np.int64),
              "ax3": np.array(3, np.int64), "minus1": np.array([-1], np.int64), "two": np.array(2.0, np.float32)}
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", None]),
                               helper.make_tensor_value_info("b", TensorProto.INT64, [])],
                              [numpy_helper.from_array(v, k) for k, v in consts.items()])
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    model.ir_version = 10
    return model.SerializeToString()


@pytest.fixture(params=["opencl", "host"])
def backend(request, monkeypatch):
    """The simulated devices' backend: OpenCL where a driver passed the probe, or the host backend
    (no driver: the factory finds no OpenCL device)."""
    import onnxhal.simulators.factory as factory

    if request.param == "host":
        monkeypatch.setattr(factory, "find_opencl_device", lambda hardware_devices: None)
    return request.param


def test_a_scalar_shape_value_crosses_partitions_on_both_backends(backend):
    from onnxhal.simulators.testing import simulated_devices

    data = _scalar_chain_model()
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    with simulated_devices(PROFILE) as devices:
        (device,) = devices
        if device.ep_metadata.get("backend") != backend:
            pytest.skip(f"simulated devices run on {device.ep_metadata.get('backend')!r} here, not {backend!r}")
        so = onnxhal.SessionOptions()
        so.graph_optimization_level = onnxhal.GraphOptimizationLevel.ORT_DISABLE_ALL  # the nodes as written
        so.add_provider_for_devices([device])
        sess = onnxhal.InferenceSession(data, so)
        name = device.ep_name
        on_device = sorted(n.op_type for n in sess.assigned_nodes() if n.ep_name == name)
        # the shape chains go with their partitions (the rule is on for this backend too)
        assert on_device.count("Gather") == 2 and "Shape" in on_device, (on_device, sess.eps[name].opencl.declined)
        assert len(sess.eps[name].partition_infos) == 2
        for shape in ((2, 5, 32), (1, 7, 32), (2, 5, 32)):
            feeds = {"x": RNG.standard_normal(shape).astype(np.float32)}
            for got, want in zip(sess.run(None, feeds), ref.run(None, feeds)):
                got = np.asarray(got)
                assert (got.dtype, got.shape) == (want.dtype, want.shape), (backend, shape, got.shape, want.shape)
                # intel-gpu stores float32 as float16; the shape values are exact
                np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 if got.dtype.kind == "f" else 0)
        assert name in sess.get_providers()  # no failover to the CPU EP


def test_a_signature_run_on_the_host_keeps_its_scalar_shape_values(monkeypatch):
    # On OpenCL, a shape signature whose plan cannot be built runs on the host (dynamic_partition):
    # its scalar outputs must leave as scalars there too.
    pytest.importorskip("pyopencl")
    from onnxhal.hal.errors import NotImplemented as OrtNotImplemented
    from onnxhal.runtime.providers.opencl import dynamic_partition
    from onnxhal.simulators.testing import simulated_devices

    def refuse(graph, lookup, *rest):  # a test double: a lowering limit for every shape
        raise OrtNotImplemented("no plan for this shape")

    monkeypatch.setattr(dynamic_partition, "build_plan", refuse)
    data = _scalar_chain_model()
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    with simulated_devices(PROFILE) as devices:
        (device,) = devices
        if device.ep_metadata.get("backend") != "opencl":
            pytest.skip("no OpenCL device: the simulated devices run on the host backend")
        so = onnxhal.SessionOptions()
        so.graph_optimization_level = onnxhal.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.add_provider_for_devices([device])
        sess = onnxhal.InferenceSession(data, so)
        feeds = {"x": RNG.standard_normal((2, 5, 32)).astype(np.float32)}
        for got, want in zip(sess.run(None, feeds), ref.run(None, feeds)):
            got = np.asarray(got)
            assert (got.dtype, got.shape) == (want.dtype, want.shape)
            np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 if got.dtype.kind == "f" else 0)
        assert device.ep_name in sess.get_providers()  # no failover to the CPU EP
        infos = [getattr(i, "inner", i) for i in sess.eps[device.ep_name].partition_infos.values()]
        assert [i.stats.host_runs for i in infos] == [1, 1]
