"""Layout transformation for NHWC EPs: the runtime converts the layout-sensitive nodes an NHWC EP
takes into com.ms.internal.nhwc ops with Transposes at the edges of NHWC regions, as ORT does."""

from __future__ import annotations

import collections

import numpy as np
from onnx import helper, numpy_helper

import onnxhal
from benchmarks.models import cnn, feeds
from onnxhal.runtime.layout_transform import NHWC_DOMAIN
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
