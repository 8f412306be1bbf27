"""Hostile models through onnxhal's plugin library inside real onnxruntime (tests/fuzz_bridge.py):
mutants of tests/fuzz_models.py loaded and run by onnxruntime with a simulated device preferred, in
child processes with a time limit. No crash, no hang, every error onnxruntime's own refusal or an
onnxruntime error carrying onnxhal's typed message, every run within the profile's tolerance of
onnxruntime's CPU EP. ``benchmarks/fuzz_campaign.py --bridge`` runs the long campaigns.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")

import onnxruntime  # noqa: E402

from tests import fuzz_bridge as fb  # noqa: E402
from tests import fuzz_models as fm  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NPU, GPU = "VirtualNpuExecutionProvider", "VirtualGpuExecutionProvider"
ORT_VERSION = tuple(int(x) for x in onnxruntime.__version__.split(".")[:2])
#: The checks read onnxruntime's graph assignment (its Python API has it from 1.24) and pick the
#: simulated devices by their own hardware devices (virtual devices: 1.24 on).
needs_1_24 = pytest.mark.skipif(ORT_VERSION < (1, 24), reason="graph assignment info and virtual devices arrived "
                                "in onnxruntime 1.24")


def run_check(name: str, env: dict | None = None, timeout: float = 240) -> dict:
    done = subprocess.run([sys.executable, "-m", "tests.ort_bridge_hostile", name], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})
    assert done.returncode == 0, f"check {name} exited with {done.returncode}:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_fuzzed_models_through_the_bridge():
    # Seed 34's first 400 mutants: none crashes or hangs onnxruntime alone (each such costs the hang
    # limit); mutant 144 is the Concat axis of the test below.
    results = fb.campaign(seed=34, count=400, hang_seconds=60)
    results += fb.campaign(seed=0, count=len(fm.EXTERNAL_LOCATIONS), hang_seconds=60, external=True)
    assert len(results) == 400 + len(fm.EXTERNAL_LOCATIONS)
    bad = fb.findings(results)
    assert not bad, "crash, hang, untyped error, refusal or wrong or unwarranted run through the bridge:\n" + \
        "\n".join(f"  mutant {r.index} ({r.seed_model}, {r.mutation}): {r.onnxhal} / {r.onnxruntime}" for r in bad[:10])
    figures = fb.summary(results)
    # The slice reaches the bridge: mutants run on the simulated devices, and some fail inside them.
    assert figures["ran, agreeing with onnxruntime's CPU EP"] >= 50
    assert figures["refused with onnxhal's message (an onnxhal error)"] >= 1


@needs_1_24
def test_nodes_onnxhals_loader_refuses_are_left_to_onnxruntime():
    """A Concat axis of -2**62 (fuzz mutant 144 of seed 34) ran on the simulated devices as axis 0;
    a Conv kernel_shape other than its weight's ran with the weight's; a Conv weight of rank 1 (mutant
    1514 of seed 35) failed inside the OpenCL EP's lowering. onnxruntime refuses each in its kernels:
    the simulated EPs leave them to it, so the error is onnxruntime's own."""
    r = run_check("refused_nodes_left_to_onnxruntime")
    for model in ("concat_axis", "conv_kernel_shape", "conv_weight_rank"):
        alone = r[model]["alone"]
        assert alone is not None
        for ep in (NPU, GPU):
            assert list(r[model][ep]["assignment"]) == ["CPUExecutionProvider"], (model, ep, r[model][ep])
            assert r[model][ep]["error"] == alone, (model, ep)


@needs_1_24
@pytest.mark.parametrize("opencl", ["default", "off"])
def test_a_reshape_to_another_size_is_refused_not_viewed(opencl):
    r = run_check("reshape_sizes", {} if opencl == "default" else {"ONNXHAL_OPENCL": "off"})
    assert "cannot be reshaped" in r["alone"]
    for ep in (NPU, GPU):
        assert r[ep]["error"] == r["alone"], r[ep]  # the node is left to onnxruntime's kernel
    assert r["onnxhal"] is not None and r["onnxhal"].startswith("InvalidArgument") and "21 elements" in r["onnxhal"]


@needs_1_24
def test_empty_tensors_cross_into_device_memory():
    """onnxruntime gives a tensor of 0 elements no buffer: its copy to the simulated device was
    refused ("neither side is in onnxhal device memory") where onnxruntime alone runs the model."""
    r = run_check("empty_tensors")
    for model in ("plain", "if"):
        assert GPU in r[model]["assignment"], r[model]["assignment"]
        assert r[model]["got"] == r[model]["alone"], r[model]


def test_classify_error_reads_onnxhals_part_of_the_message():
    tagged = "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : ... Status Message: onnxhal OrtNodeComputeInfo::Compute: "
    assert fb.classify_error(tagged + "InvalidArgument: input 'x' expects float32 [3]", True) == "typed"
    assert fb.classify_error(tagged + "InvalidArgument: input 'x' expects float32 [3]", False) == "refused"
    assert fb.classify_error(tagged + "KeyError: 'x'", False) == "untyped"
    assert fb.classify_error(tagged + "Fail: 'NoneType' object is not subscriptable", True) == "untyped"
    assert fb.classify_error("[ONNXRuntimeError] : 1 : FAIL : Load model failed", True) == "typed"
    assert fb.classify_error("[ONNXRuntimeError] : 1 : FAIL : Load model failed", False) == "untyped"


def test_onnxhal_refuses_a_conv_weight_of_another_rank_at_load():
    """Fuzz mutant 1514 of seed 35 (Conv's inputs swapped, a weight of rank 1): onnxhal's CPU EP
    failed at run with numpy's "not enough values to unpack"; onnxruntime's kernel refuses it ("X
    num_dims does not match W num_dims"). onnxhal's loader now refuses it, naming the inputs."""
    import numpy as np
    from onnx import TensorProto, helper

    import onnxhal
    from onnxhal.errors import InvalidGraph

    vi = helper.make_tensor_value_info
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Conv", ["x", "b", "w"], ["y"], name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1])],
        "g", [vi("x", TensorProto.FLOAT, [1, 2, 4, 4])], [vi("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("b", TensorProto.FLOAT, [3], np.ones(3, np.float32)),
         helper.make_tensor("w", TensorProto.FLOAT, [3, 2, 3, 3], np.ones(54, np.float32))]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    with pytest.raises(InvalidGraph, match=r"Conv node 'conv': its input 'x' has rank 4 and its weight 'b' has shape \[3\]"):
        onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("op,keepdims", [("ReduceL2", -1), ("ReduceMax", 2), ("ReduceMean", -1), ("ArgMax", -1),
                                         ("ArgMin", 3)])
def test_keepdims_other_than_1_drops_the_axes_as_onnxruntime(op, keepdims):
    """Fuzz mutant 3429 of seed 37 (ReduceL2 keepdims=-1): onnxhal kept the reduced axes for any
    non-zero keepdims, where onnx's shape inference and onnxruntime keep them only for 1, so the
    simulated GPU's output had another shape than onnxruntime's CPU EP's."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper

    import onnxhal

    attrs = {"keepdims": keepdims, **({"axis": 1} if op.startswith("Arg") else {"axes": [1]})}
    opset = 17
    out_type = TensorProto.INT64 if op.startswith("Arg") else TensorProto.FLOAT
    model = helper.make_model(helper.make_graph(
        [helper.make_node(op, ["x"], ["y"], name="r", **attrs)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", out_type, None)]),
        opset_imports=[helper.make_opsetid("", opset)], ir_version=10).SerializeToString()
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert got.shape == ref.shape == (2, 4)
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("attrs", [{"kernel_shape": [7, 2], "strides": [2, 2]}, {"kernel_shape": [5, 5]},
                                   {"kernel_shape": [6, 2], "pads": [1, 0, 0, 0]}])
def test_max_pool_window_larger_than_its_input_gives_an_empty_output(attrs):
    """Fuzz mutant 7829 of seed 37 (MaxPool kernel_shape [7, 2] on a 4x4 plane): onnxhal's CPU EP,
    and the simulated GPU running its kernels, failed with numpy's "operands could not be broadcast";
    onnxruntime gives an empty output."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper

    import onnxhal

    model = helper.make_model(helper.make_graph(
        [helper.make_node("MaxPool", ["x"], ["y"], name="pool", **attrs)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=10).SerializeToString()
    x = np.ones((1, 3, 4, 4), np.float32)
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert ref.size == 0 and got.shape == ref.shape and got.dtype == ref.dtype



@needs_1_24
def test_a_host_backend_partition_error_names_no_empty_ep():
    """Errors inside a simulated device's host-backend partition read "running Gemm node 'gemm' on :
    ValueError" (fuzz mutant 445 of seed 34; the partition's plan has no EP names): the node is now
    named without an empty EP."""
    r = run_check("host_backend_error", {"ONNXHAL_OPENCL": "off"})
    assert r["assignment"] == {GPU: ["gemm"]}, r
    assert "onnxhal OrtNodeComputeInfo::Compute" in r["error"] and "Gemm node 'gemm'" in r["error"], r["error"]
    assert " on :" not in r["error"], r["error"]
