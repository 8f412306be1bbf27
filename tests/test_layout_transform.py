"""Layout transformation for NHWC EPs: the runtime converts the layout-sensitive nodes an NHWC EP
takes into com.ms.internal.nhwc ops with Transposes at the edges of NHWC regions, as ORT does."""

from __future__ import annotations

import collections

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import onnxhal
from benchmarks.models import cnn, feeds
from onnxhal.runtime.optimizer.layout_transform import NHWC_DOMAIN
from onnxhal.simulators.testing import simulated_devices
from tests.models import make, vi


def _ops(sess) -> dict[str, collections.Counter]:
    out: dict[str, collections.Counter] = {}
    for sub in sess.get_provider_graph_assignment_info():
        for n in sub.get_nodes():
            out.setdefault(sub.ep_name, collections.Counter())[(n.domain, n.op_type)] += 1
    return out


def test_a_cnn_on_an_nhwc_npu_runs_in_nhwc_with_transposes_only_at_the_edges():
    model = cnn()
    f = feeds(model)
    ref = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, f)[0]
    with simulated_devices("mobile-npu,discrete-gpu") as devices:
        by_type = {d.device.type: d for d in devices}
        for device, nhwc in ((by_type[onnxhal.OrtHardwareDeviceType.NPU], True),
                             (by_type[onnxhal.OrtHardwareDeviceType.GPU], False)):
            so = onnxhal.SessionOptions()
            so.add_provider_for_devices([device], {})
            so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
            sess = onnxhal.InferenceSession(model, so)
            ops = _ops(sess)[device.ep_name]
            converted = sum(c for (domain, _), c in ops.items() if domain == NHWC_DOMAIN)
            if nhwc:
                assert converted >= 20 and ops[(NHWC_DOMAIN, "MaxPool")] == 1
                assert ops[("", "Transpose")] == 2  # into NHWC at the input, out before the classifier
            else:
                assert converted == 0 and ops[("", "Transpose")] == 0
            out = sess.run(None, f)[0]
            tol = 0.02 * float(np.abs(ref).max()) if nhwc else 1e-4 * float(np.abs(ref).max())  # fp16 NPU
            assert float(np.abs(out - ref).max()) <= tol


def test_the_cpu_ep_runs_nhwc_ops_it_is_left_with():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 3, 6, 6)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    nchw = make([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], [vi("x", [1, 3, 6, 6])],
                [vi("y", [1, 4, 6, 6])], [numpy_helper.from_array(w, "w")])
    nhwc = make([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], domain=NHWC_DOMAIN)],
                [vi("x", [1, 6, 6, 3])], [vi("y", [1, 6, 6, 4])], [numpy_helper.from_array(w, "w")])
    nhwc.opset_import.append(helper.make_opsetid(NHWC_DOMAIN, 1))
    want = onnxhal.InferenceSession(nchw).run(None, {"x": x})[0]
    got = onnxhal.InferenceSession(nhwc).run(None, {"x": np.ascontiguousarray(x.transpose(0, 2, 3, 1))})[0]
    np.testing.assert_allclose(got, want.transpose(0, 2, 3, 1), rtol=1e-5, atol=1e-5)


def _conv_relu_pool_model():
    rng = np.random.default_rng(7)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("MaxPool", ["r"], ["y"], name="pool", kernel_shape=[2, 2], strides=[2, 2])]
    graph = helper.make_graph(nodes, "crp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 4, 4])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_nchw_twins_of_consecutive_nhwc_nodes_cancel_their_inner_transposes():
    """Conv -> Relu -> MaxPool on an NHWC device: each NHWC node's NCHW twin is Transpose, op,
    Transpose; between two twins, T(to NHWC) -> Relu -> T(to NCHW) undo each other. Cancelled, the
    partition runs Conv, Relu and MaxPool between one Transpose in and one out (9 launches -> 5)."""
    from onnxhal.hal import Node
    from onnxhal.runtime.optimizer.layout_transform import cancel_transposes

    def t(src, dst, perm):
        return Node("Transpose", [src], [dst], name=f"t_{dst}", attribute_protos=[helper.make_attribute("perm", perm)])

    nodes = [t("x", "x_nchw", [0, 3, 1, 2]), Node("Conv", ["x_nchw", "w"], ["c_nchw"], name="conv"),
             t("c_nchw", "c", [0, 2, 3, 1]), Node("Relu", ["c"], ["r"], name="relu"),
             t("r", "r_nchw", [0, 3, 1, 2]), Node("MaxPool", ["r_nchw"], ["p_nchw"], name="pool"),
             t("p_nchw", "y", [0, 2, 3, 1])]
    out = cancel_transposes(nodes, {"y"})
    assert [n.op_type for n in out] == ["Transpose", "Conv", "Relu", "MaxPool", "Transpose"]
    assert out[2].inputs[0] == "c_nchw" and out[3].inputs[0] == out[2].outputs[0]
    # a value read elsewhere, or a partition output, keeps its Transposes
    assert len(cancel_transposes(nodes, {"y", "r"})) == len(nodes)
    assert len(cancel_transposes(nodes + [Node("Neg", ["c"], ["n"], name="other")], {"y", "n"})) == len(nodes) + 1
    # perms that do not undo each other stay
    odd = [t("a", "b", [0, 2, 3, 1]), Node("Relu", ["b"], ["c"]), t("c", "d", [0, 2, 3, 1])]
    assert len(cancel_transposes(odd, {"d"})) == 3


def test_the_layout_passs_edge_transposes_cancel_with_the_twins():
    """The layout pass's Transposes at a partition's edges (claimed with it) meet the twins' own:
    at the input the pair reads the partition input directly; at the output, whose name stays, the
    producer writes the output itself. Nothing but the Conv is left (one launch)."""
    from onnxhal.hal import Node
    from onnxhal.runtime.optimizer.layout_transform import cancel_transposes

    def t(src, dst, perm):
        return Node("Transpose", [src], [dst], name=f"t_{dst}", attribute_protos=[helper.make_attribute("perm", perm)])

    nodes = [t("x", "x_nhwc", [0, 2, 3, 1]), t("x_nhwc", "x_nchw", [0, 3, 1, 2]),
             Node("Conv", ["x_nchw", "w"], ["c_nchw"], name="conv"),
             t("c_nchw", "c_nhwc", [0, 2, 3, 1]), t("c_nhwc", "y", [0, 3, 1, 2])]
    out = cancel_transposes(nodes, {"y"})
    assert [(n.op_type, list(n.inputs), list(n.outputs)) for n in out] == [("Conv", ["x", "w"], ["y"])]
    # a producer whose value is also read elsewhere keeps the pair at the output
    kept = cancel_transposes(nodes + [Node("Neg", ["c_nchw"], ["n"], name="other")], {"y", "n"})
    assert [n.op_type for n in kept] == ["Conv", "Transpose", "Transpose", "Neg"]


def test_a_reader_of_a_cancelled_pair_keeps_its_schema_version():
    """A node that reads a cancelled Transpose pair's output is remade to read the pair's input; it
    lost its schema version, so the host backend built the newest kernel: ReduceMean 18, which
    takes its axes from an input, reduced every axis of an opset-17 ReduceMean (torchvision's
    ShuffleNetV2 head on generic-npu without an OpenCL driver)."""
    from onnxhal.hal import Node
    from onnxhal.runtime.optimizer.layout_transform import cancel_transposes

    def t(src, dst, perm):
        return Node("Transpose", [src], [dst], name=f"t_{dst}", attribute_protos=[helper.make_attribute("perm", perm)])

    mean = Node("ReduceMean", ["b"], ["y"], name="mean", attribute_protos=[helper.make_attribute("axes", [2, 3])])
    mean.since_version = 13
    out = cancel_transposes([t("x", "a", [0, 2, 3, 1]), t("a", "b", [0, 3, 1, 2]), mean], {"y"})
    assert [(n.op_type, list(n.inputs), n.since_version) for n in out] == [("ReduceMean", ["x"], 13)]


def test_an_nhwc_npu_runs_conv_relu_pool_as_the_cpu_ep_does(monkeypatch):
    """... in 2 launches on OpenCL (the Conv with its Relu reading its padding in place, and the
    MaxPool: every Transpose cancelled, inner pairs and the layout pass's at the edges). The host
    backend runs the same graph without launches."""
    from onnxhal.runtime.providers.opencl import partition_plan
    from tests.conftest import simulated_or_skip

    launches: list[int] = []
    build = partition_plan.PartitionState.__init__

    def counting(self, *args, **kwargs):
        build(self, *args, **kwargs)
        launches.append(self.plan.launches_per_run)

    monkeypatch.setattr(partition_plan.PartitionState, "__init__", counting)
    model = _conv_relu_pool_model().SerializeToString()
    x = np.random.default_rng(8).standard_normal((1, 3, 8, 8)).astype(np.float32)
    want = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    with simulated_or_skip("generic-npu") as sims:
        so = onnxhal.SessionOptions()
        so.add_provider_for_devices([sims["VirtualNpuExecutionProvider"]], {})
        sess = onnxhal.InferenceSession(model, so)
        assert sess.partition_summary.get("VirtualNpuExecutionProvider", 0) >= 3
        sess.disable_fallback()
        got = sess.run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)
    assert launches in ([], [2]), launches


def test_an_nhwc_device_plans_each_partition_once(monkeypatch):
    """The runtime partitions again after the layout pass; get_capability answers from rules, so
    each partition's plan is built once, at compile (on the host backend, which computes with the
    CPU EP's kernels, none). The results are onnxruntime's."""
    import onnxruntime

    from onnxhal.runtime.providers.opencl import plan_builder
    from tests.conftest import simulated_or_skip

    plans: list[str] = []
    build = plan_builder.PartitionPlanBuilder.build

    def counting(self):
        plans.append(self.graph.name)
        return build(self)

    monkeypatch.setattr(plan_builder.PartitionPlanBuilder, "build", counting)
    model = cnn()
    f = feeds(model)
    model.ir_version = 10
    want = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, f)
    with simulated_or_skip("generic-npu") as sims:
        device = sims["VirtualNpuExecutionProvider"]
        so = onnxhal.SessionOptions()
        so.add_provider_for_devices([device], {})
        so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
        sess = onnxhal.InferenceSession(model, so)
        fused = [n for n in sess.plan.graph.nodes if n.ep_name == device.ep_name]
        assert fused and any(domain == NHWC_DOMAIN for domain, _ in _ops(sess)[device.ep_name])
        assert len(plans) == (len(fused) if device.ep_metadata["backend"] == "opencl" else 0), plans
        sess.disable_fallback()
        got = sess.run(None, f)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-2, atol=2e-2)
