"""``onnxhal demo``: the devices, a small model under PREFER_NPU, checked against the CPU EP.

Unless the user already set ``ONNXHAL_SIMULATE`` (or registered simulated devices), the demo
simulates a generic NPU and GPU itself, so it shows what onnxhal is for on any machine, and says
which backend ran them (OpenCL, or the host when no OpenCL device passed the probe)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

import onnxhal
from onnxhal.cli_tables import console, print_devices, print_partition


def demo_model() -> onnx.ModelProto:
    """Conv -> Relu -> GlobalAveragePool -> Flatten -> Gemm -> Softmax, seeded weights."""
    rng = np.random.default_rng(0)
    inits = [
        onnx.numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.2, "conv_w"),
        onnx.numpy_helper.from_array(np.zeros(8, np.float32), "conv_b"),
        onnx.numpy_helper.from_array(rng.standard_normal((8, 10)).astype(np.float32) * 0.3, "fc_w"),
        onnx.numpy_helper.from_array(np.zeros(10, np.float32), "fc_b"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "conv_w", "conv_b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("GlobalAveragePool", ["r"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["logits"], name="fc"),
        helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=1),
    ]
    graph = helper.make_graph(nodes, "demo", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10,
                             producer_name="onnxhal-demo")


def run_demo() -> int:
    from onnxhal.simulators import ENV_VAR, register_simulators, simulated_library_names

    onnxhal.get_ep_devices()  # registers ONNXHAL_SIMULATE's devices, if set
    if not simulated_library_names():
        register_simulators("generic-npu,generic-gpu")
        console.print(f"simulating generic-npu and generic-gpu ({ENV_VAR} is not set; set it to choose profiles)")
    print_devices(onnxhal.get_hardware_devices(), onnxhal.get_ep_devices())
    model = demo_model()
    x = np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32)
    so = onnxhal.SessionOptions()
    so.set_provider_selection_policy(onnxhal.OrtExecutionProviderDevicePolicy.PREFER_NPU)
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    sess = onnxhal.InferenceSession(model, so)
    console.print(f"PREFER_NPU selected providers: {sess.get_providers()}")
    print_partition(sess)  # with the backend that ran each simulated device
    (probs,) = sess.run(None, {"x": x})
    (ref,) = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    err = float(np.max(np.abs(probs - ref)))
    # A simulated device may compute in fp16 (about 1e-3 relative); float32 devices must agree closely.
    simulated = any(d.device.is_virtual for d in onnxhal.get_ep_devices() if d.ep_name in sess.get_providers())
    tol = 2e-3 if simulated else 1e-4
    ok = err <= tol and abs(float(probs.sum()) - 1.0) < tol
    console.print(f"top class {int(probs.argmax())}, max |difference| vs CPU EP = {err:.2e} (tolerance {tol:g}): "
                  f"{'[green]OK[/green]' if ok else '[red]MISMATCH[/red]'}")
    return 0 if ok else 1
