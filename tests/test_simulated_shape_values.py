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


def _mask_model() -> bytes:
    # The mask (made on the host by an int64 Abs, which the OpenCL kernels leave to the CPU EP) is
    # read only for its shape (the Reshape's row count): a partition input the partition needs no
    # data of.
    nodes = [helper.make_node("Abs", ["mask_in"], ["mask"]),
             helper.make_node("Shape", ["mask"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
             helper.make_node("Unsqueeze", ["b", "axes"], ["bu"]),
             helper.make_node("Concat", ["bu", "minus1"], ["target"], axis=0),
             helper.make_node("MatMul", ["x", "w"], ["q"]),
             helper.make_node("Relu", ["q"], ["r"]),
             helper.make_node("Reshape", ["r", "target"], ["y"])]
    consts = {"zero": np.array(0, np.int64), "axes": np.array([0], np.int64), "minus1": np.array([-1], np.int64),
              "w": RNG.standard_normal((32, 32)).astype(np.float32) * 0.2}
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 32]),
                                           helper.make_tensor_value_info("mask_in", TensorProto.INT64, ["batch", "seq"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in consts.items()])
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    model.ir_version = 10
    return model.SerializeToString()


def _feeds(data: bytes) -> dict[str, np.ndarray]:
    feeds = {"x": RNG.standard_normal((2, 5, 32)).astype(np.float32)}
    if b"mask_in" in data:
        feeds["mask_in"] = np.ones((2, 5), np.int64)
    return feeds


def _edges_and_transfers(data: bytes, profile: str, host: bool) -> tuple[str, list, tuple]:
    """The backend, each partition's (host_inputs, metadata_inputs, host_outputs), and the meter's
    transfers of one run on ``profile``'s simulated device."""
    import onnxhal.simulators.factory as factory
    from onnxhal.simulators.testing import simulated_devices

    with pytest.MonkeyPatch.context() as mp:
        if host:
            mp.setattr(factory, "find_opencl_device", lambda hardware_devices: None)
        with simulated_devices(profile) as devices:
            (device,) = devices
            so = onnxhal.SessionOptions()
            so.graph_optimization_level = onnxhal.GraphOptimizationLevel.ORT_DISABLE_ALL
            so.add_provider_for_devices([device])
            sess = onnxhal.InferenceSession(data, so)
            feeds = _feeds(data)
            want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
            for got, w in zip(sess.run(None, feeds), want):
                assert (got.dtype, got.shape) == (w.dtype, w.shape)
                np.testing.assert_allclose(got, w, rtol=2e-2, atol=2e-2 if got.dtype.kind == "f" else 0)
            ep = sess.eps[device.ep_name]
            edges = [(sorted(i.host_inputs), sorted(i.metadata_inputs), sorted(i.host_outputs))
                     for i in ep.partition_infos.values()]
            run = ep.meter.last_run
            return device.ep_metadata.get("backend"), edges, (run.transfers, run.transfer_bytes)


@pytest.mark.parametrize("model", ["scalar_chain", "mask"])
@pytest.mark.parametrize("profile", [PROFILE, "generic-gpu"])  # shape values claimed / left to the CPU EP
def test_both_backends_hand_over_the_same_values_in_host_memory(profile, model):
    # The host backend's partitions take and give in host memory what the OpenCL backend's do
    # (parameters, Gather indices, shape values) and leave an input read only for its shape where it
    # is, so the runtime copies, and the simulated device charges, the same transfers without a driver.
    pytest.importorskip("pyopencl")
    data = _scalar_chain_model() if model == "scalar_chain" else _mask_model()
    backend, opencl_edges, opencl_transfers = _edges_and_transfers(data, profile, host=False)
    if backend != "opencl":
        pytest.skip("no OpenCL device: nothing to compare the host backend with")
    host_backend, host_edges, host_transfers = _edges_and_transfers(data, profile, host=True)
    assert host_backend == "host"
    assert host_edges == opencl_edges and any(any(e) for e in opencl_edges), (host_edges, opencl_edges)
    assert host_transfers == opencl_transfers


def test_the_host_backend_reads_only_the_shape_of_a_metadata_input(monkeypatch):
    # The runtime hands a partition input read only for its shape over wherever it lives, even in a
    # memory the host backend cannot read (here a tensor with no buffer): its shape is enough.
    import onnxhal.simulators.factory as factory
    from onnxhal.hal.ep import KernelContext
    from onnxhal.hal.tensor import DeviceTensor
    from onnxhal.simulators.testing import simulated_devices

    monkeypatch.setattr(factory, "find_opencl_device", lambda hardware_devices: None)
    data = _mask_model()
    with simulated_devices(PROFILE) as (device,):
        so = onnxhal.SessionOptions()
        so.graph_optimization_level = onnxhal.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.add_provider_for_devices([device])
        sess = onnxhal.InferenceSession(data, so)
        ep = sess.eps[device.ep_name]
        (info,) = ep.partition_infos.values()
        inner = info.inner
        (k,) = inner.metadata_inputs
        x = RNG.standard_normal((3, 2, 32)).astype(np.float32)
        inputs = [np.asarray(x) if i != k else DeviceTensor((3, 2), np.dtype(np.int64), ep.memory_info, None)
                  for i in range(len(inner.graph.input_names))]
        (y,) = inner.compute(None, KernelContext(inputs, 1))
        want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(
            None, {"x": x, "mask_in": np.ones((3, 2), np.int64)})[0]
        np.testing.assert_allclose(_host(y), want, rtol=2e-2, atol=2e-2)


def _host(t) -> np.ndarray:
    from onnxhal.simulators.host_backend import host_view

    return np.array(host_view(t))


def _heads(chain: bool) -> bytes:
    # MatMul -> Reshape to [batch, seq, 4, 8] -> Transpose -> Relu; the Reshape's target computed from
    # Shape (chain) or the constant [0, 0, 4, 8] (0 copies the input's dimension).
    shape_nodes = [helper.make_node("Shape", ["q"], ["s"]),
                   helper.make_node("Gather", ["s", "i01"], ["bt"], axis=0),
                   helper.make_node("Concat", ["bt", "hd"], ["target"], axis=0)] if chain else []
    nodes = [helper.make_node("MatMul", ["x", "w"], ["q"]), *shape_nodes,
             helper.make_node("Reshape", ["q", "target"], ["q4"]),
             helper.make_node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
             helper.make_node("Relu", ["qt"], ["y"])]
    consts = {"w": RNG.standard_normal((32, 32)).astype(np.float32) * 0.2}
    consts.update({"i01": np.array([0, 1], np.int64), "hd": np.array([4, 8], np.int64)} if chain else
                  {"target": np.array([0, 0, 4, 8], np.int64)})
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, "seq", 8])],
                              [numpy_helper.from_array(v, k) for k, v in consts.items()])
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    model.ir_version = 10
    return model.SerializeToString()


def test_a_shape_chain_in_a_partition_costs_the_simulated_device_nothing():
    # Its values are constants of each specialisation: the simulated cost is that of the same
    # partition with a constant Reshape target (no launch for Shape, Gather, Concat).
    from onnxhal.simulators.testing import simulated_devices

    costs = {}
    with simulated_devices(PROFILE) as (device,):
        for chain in (True, False):
            so = onnxhal.SessionOptions()
            so.graph_optimization_level = onnxhal.GraphOptimizationLevel.ORT_DISABLE_ALL
            so.add_provider_for_devices([device])
            sess = onnxhal.InferenceSession(_heads(chain), so)
            ep = sess.eps[device.ep_name]
            assert sum(n.ep_name == device.ep_name for n in sess.assigned_nodes()) == (7 if chain else 4)
            (cost,) = ep.partition_costs.values()
            sess.run(None, {"x": RNG.standard_normal((2, 5, 32)).astype(np.float32)})
            costs[chain] = (cost.seconds, ep.meter.last_run.kernels)
    assert costs[True] == costs[False] and costs[False][1] == 3, costs  # MatMul, Transpose, Relu


BRIDGE_CHECK = """
import json
import numpy as np
import onnxruntime as ort
import onnxhal.ort_plugin as plugin
from tests.test_simulated_shape_values import PROFILE, _feeds, _mask_model, _scalar_chain_model

plugin.configure(profiles=[PROFILE])
ort.register_execution_provider_library(plugin.REGISTRATION_NAME, plugin.library_path())
dev = next(d for d in ort.get_ep_devices() if d.ep_name == "VirtualGpuExecutionProvider")
out = {"backend": dev.ep_metadata.get("backend"), "outputs": []}
for data in (_scalar_chain_model(), _mask_model()):
    so = ort.SessionOptions()
    so.add_provider_for_devices([dev], {})
    sess = ort.InferenceSession(data, so)
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for _ in range(2):
        feeds = _feeds(data)
        for a, b in zip(sess.run(None, feeds), ref.run(None, feeds)):
            out["outputs"].append([str(a.dtype), list(a.shape), str(b.dtype), list(b.shape),
                                   float(np.abs(a.astype(np.float64) - b).max())])
print(json.dumps(out))
"""


@pytest.mark.parametrize("backend", ["opencl", "host"])
def test_scalar_shape_values_reach_onnxruntime_through_the_bridge(backend):
    # Inside onnxruntime (the plugin EP library), on OpenCL and on the host backend (ONNXHAL_OPENCL=off
    # in the child process): the scalar shape value leaves as a scalar, the mask is read for its shape.
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "ONNXHAL_OPENCL": "off"} if backend == "host" else None
    done = subprocess.run([sys.executable, "-c", BRIDGE_CHECK], cwd=root, capture_output=True, text=True, timeout=300,
                          env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(done.stdout.strip().splitlines()[-1])
    if r["backend"] != backend:
        pytest.skip(f"simulated devices run on {r['backend']!r} here, not {backend!r}")
    assert len(r["outputs"]) == 6
    for got_dtype, got_shape, want_dtype, want_shape, err in r["outputs"]:
        assert (got_dtype, got_shape) == (want_dtype, want_shape)
        assert err <= (2e-2 if got_dtype == "float32" else 0)
