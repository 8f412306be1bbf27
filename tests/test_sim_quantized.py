"""Quantized models on the fp16 NPU profiles, dims fixed, against onnxruntime's CPU EP side by side
(simulators/quantized.py): int8 QDQ groups computed as integer kernels compute them, to float32
rounding; float nodes that read an int32 accumulator (dynamic quantization) declined with the
reason; a device without int8 declines QDQ groups. Never silently wrong."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import onnxhal
from onnxhal.simulators.testing import simulated_devices
from tests.conftest import simulated_or_skip
from tests.test_real_models import fixed_options, load

FP16_PROFILES = ["generic-npu", "mobile-npu", "qualcomm-htp", "intel-npu"]


def onnxruntime_outputs(path: str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    proto = onnx.load(path)
    proto.ir_version = min(proto.ir_version, 10)  # onnx 1.23 writes IR 14, which onnxruntime refuses
    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def run_on(device, path: str, feeds: dict[str, np.ndarray]) -> tuple[onnxhal.InferenceSession, list[np.ndarray]]:
    so = fixed_options(feeds)
    so.add_provider_for_devices([device])
    sess = onnxhal.InferenceSession(path, so)
    sess.disable_fallback()
    return sess, sess.run(None, feeds)


@pytest.fixture(scope="module")
def resnet_qdyn(tmp_path_factory) -> str:
    """ResNet quantized by onnxruntime's quantize_dynamic, Conv included: DynamicQuantizeLinear +
    ConvInteger + Cast + Mul, as its quantizer writes them."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    path, _ = load("resnet_ts")
    out = str(tmp_path_factory.mktemp("qdyn") / "resnet_qdyn.onnx")
    quantize_dynamic(path, out, op_types_to_quantize=["Conv", "MatMul", "Gemm"], weight_type=QuantType.QUInt8)
    assert any(n.op_type == "ConvInteger" for n in onnx.load(out).graph.node)
    return out


@pytest.mark.parametrize("profile", FP16_PROFILES)
def test_a_dynamically_quantized_conv_net_declines_its_accumulators_and_matches(profile, resnet_qdyn):
    _, sigs = load("resnet_ts")
    feeds = sigs["a"][0]
    want = onnxruntime_outputs(resnet_qdyn, feeds)[0]
    with simulated_or_skip(profile, by="profile") as sims:
        device = sims[profile]
        sess, got = run_on(device, resnet_qdyn, feeds)
        ep = sess.eps[device.ep_name]
        assert sess.partition_summary.get(device.ep_name, 0) > 0
        reasons = [r for r in ep.declined.values() if r.startswith("integer op on an fp16 device")]
        assert reasons and "ConvInteger" in reasons[0] and "int32 accumulator" in reasons[0], ep.declined
        assert not ep.fp16_overflows
        scale = float(np.max(np.abs(want)))
        err = float(np.max(np.abs(got[0] - want)))
        assert err <= ep.profile.atol * max(1.0, scale) + ep.profile.rtol * scale, (err, scale)


@pytest.mark.parametrize("profile", FP16_PROFILES)
@pytest.mark.parametrize("name", ["resnet_ts_qdq", "resnet_ts_qstatic", "cnn_ts_qstatic"])
def test_a_statically_quantized_model_computes_its_int8_groups_as_integer_kernels(profile, name):
    """QDQ and QOperator variants: what the device takes of them is int8 QDQ groups, computed to
    float32 rounding (not through fp16 storage, which moved requantized activations by a step and
    the logits by 1.7% of their scale)."""
    path, sigs = load(name)
    feeds = sigs["a"][0]
    want = onnxruntime_outputs(path, feeds)[0]
    with simulated_or_skip(profile, by="profile") as sims:
        device = sims[profile]
        sess, got = run_on(device, path, feeds)
        ep = sess.eps[device.ep_name]
        if not sess.partition_summary.get(device.ep_name, 0):
            assert ep.declined
            return
        scale = float(np.max(np.abs(want)))
        np.testing.assert_allclose(got[0], want, rtol=0, atol=1e-4 * scale)


def test_a_quantize_static_bert_on_an_fp16_npu_computes_like_the_cpu_ep():
    # quantize_static's QDQ form of bert_ts (per tensor, calibrated on its signatures), from the corpus
    qdq, sigs = load("bert_ts_qdq_pt")
    feeds = sigs["a"][0]
    # The CPU EP's own departure from onnxruntime on QDQ BERT is its item (docs/cpu-ep.md): the
    # device is held to the CPU EP it stands beside.
    cpu = onnxhal.InferenceSession(qdq, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    with simulated_or_skip("generic-npu", by="profile") as sims:
        device = sims["generic-npu"]
        sess, got = run_on(device, qdq, feeds)
        assert sess.partition_summary.get(device.ep_name, 0) > 0
        np.testing.assert_allclose(got[0], cpu, rtol=0, atol=1e-4 * float(np.max(np.abs(cpu))))


def test_an_fp16_device_without_int8_declines_qdq_groups(tmp_path):
    with simulated_or_skip("generic-npu", by="profile") as sims:
        text = Path(sims["generic-npu"].device.metadata["simulator_profile_path"]).read_text()
    text = (text.replace('name = "generic-npu"', 'name = "fp16-npu"').replace("device_id = 0x4E01", "device_id = 0x4E99")
            .replace('dtypes = ["int8", "float16"]', 'dtypes = ["float16"]'))
    profile = tmp_path / "fp16-npu.toml"
    profile.write_text(text)
    path, sigs = load("resnet_ts_qdq")
    feeds = sigs["a"][0]
    want = onnxruntime_outputs(path, feeds)[0]
    with simulated_devices(str(profile)) as (device,):
        sess, got = run_on(device, path, feeds)
        ep = sess.eps[device.ep_name]
        assert sess.partition_summary.get(device.ep_name, 0) == 0
        assert any(r.startswith("int8 QDQ group on an fp16 device without int8") for r in ep.declined.values())
        np.testing.assert_allclose(got[0], want, rtol=0, atol=1e-5)


def test_the_neural_engine_profile_declines_qdq_groups_it_would_compute_in_fp16():
    """apple-ane computes in fp16 and lists no int8: onnxruntime's QDQ ResNet stays on the CPU EP,
    each float node between DequantizeLinear and QuantizeLinear declined with that reason."""
    path, sigs = load("resnet_ts_qdq")
    feeds = sigs["a"][0]
    want = onnxruntime_outputs(path, feeds)[0]
    with simulated_or_skip("apple-ane", by="profile") as sims:
        device = sims["apple-ane"]
        sess, got = run_on(device, path, feeds)
        ep = sess.eps[device.ep_name]
        assert sess.partition_summary.get(device.ep_name, 0) == 0
        reasons = [r for r in ep.declined.values() if r.startswith("int8 QDQ group on an fp16 device without int8")]
        assert len(reasons) >= 5 and "apple-ane would compute it in fp16" in reasons[0], ep.declined
        np.testing.assert_allclose(got[0], want, rtol=0, atol=1e-5)
