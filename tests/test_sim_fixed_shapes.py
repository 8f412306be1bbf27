"""Transformers with their dims fixed (``onnxhal fix-shapes``, or free-dimension overrides) on the GPU
profiles: their partitions take Gather indices (token ids, positions) as inputs, which the runtime
must hand over in host memory. Each run is compared with onnxruntime's CPU EP side by side, with the
session's fallback to the CPU EP disabled, so that a failing device cannot pass unseen."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import onnxhal
from tests.conftest import simulated_or_skip
from tests.test_real_models import fixed_options, load

GPU_PROFILES = ["generic-gpu", "integrated-gpu", "discrete-gpu"]
TRANSFORMERS = ["bert_ts", "bert_dynamo", "bert_eager_ts", "gpt2_ts", "gpt2_dynamo", "gpt2_past_ts"]


def onnxruntime_outputs(model: str | onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    proto = onnx.load(model) if isinstance(model, str) else model
    proto.ir_version = min(proto.ir_version, 10)  # onnx 1.23 writes IR 14, which onnxruntime refuses
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def device_session(model: str | bytes, so: onnxhal.SessionOptions, device) -> onnxhal.InferenceSession:
    so.add_provider_for_devices([device])
    sess = onnxhal.InferenceSession(model, so)
    sess.disable_fallback()  # an EP failure raises instead of rerunning on the CPU EP
    return sess


def within_tolerance(got: np.ndarray, want: np.ndarray, profile) -> tuple[float, float]:
    """(max abs error, the profile's bound for an output of this scale)."""
    scale = float(np.max(np.abs(want)))
    return float(np.max(np.abs(got - want))), profile.atol * max(1.0, scale) + profile.rtol * scale


@pytest.mark.parametrize("profile", GPU_PROFILES)
@pytest.mark.parametrize("name", TRANSFORMERS)
def test_a_fixed_shape_transformer_runs_on_the_gpu_profiles(name, profile):
    path, sigs = load(name)
    feeds = sigs["a"][0]
    want = onnxruntime_outputs(path, feeds)
    with simulated_or_skip(profile, by="profile") as sims:
        device = sims[profile]
        sess = device_session(path, fixed_options(feeds), device)
        assert sess.partition_summary.get(device.ep_name, 0) > 0, sess.eps[device.ep_name].declined
        got = sess.run(None, feeds)
        profile = sess.eps[device.ep_name].profile
        for i, (g, w) in enumerate(zip(got, want)):
            err, bound = within_tolerance(g, w, profile)
            assert err <= bound, (name, i, err, bound)


def test_a_fixed_shape_model_written_by_fix_shapes_runs_on_the_gpu_profile(tmp_path):
    """The documented workflow: ``onnxhal fix-shapes`` writes the model, a session runs it."""
    path, sigs = load("gpt2_ts")
    feeds = sigs["a"][0]
    batch, seq = next(iter(feeds.values())).shape
    out = tmp_path / "fixed.onnx"
    subprocess.run([sys.executable, "-m", "onnxhal", "fix-shapes", path, "--dim", f"batch={batch}",
                    "--dim", f"sequence={seq}", "-o", str(out)], check=True, capture_output=True, timeout=300)
    assert out.exists()
    fixed = onnx.load(str(out))
    want = onnxruntime_outputs(fixed, feeds)
    with simulated_or_skip("generic-gpu", by="profile") as sims:
        device = sims["generic-gpu"]
        sess = device_session(fixed.SerializeToString(), onnxhal.SessionOptions(), device)
        assert sess.partition_summary.get(device.ep_name, 0) > 0
        err, bound = within_tolerance(sess.run(None, feeds)[0], want[0], sess.eps[device.ep_name].profile)
        assert err <= bound, (err, bound)


def test_a_statically_quantized_bert_with_fixed_dims_runs_on_the_gpu_profile():
    """quantize_static's QDQ BERT: its first partition takes ``input_ids`` (a Gather's indices)."""
    # quantize_static's QDQ form of bert_ts (per tensor, calibrated on its signatures), from the corpus
    qdq, sigs = load("bert_ts_qdq_pt")
    feeds = sigs["a"][0]
    # The CPU EP's departure from onnxruntime on QDQ BERT is its own item (docs/cpu-ep.md); the
    # device must agree with the CPU EP it stands beside.
    cpu = onnxhal.InferenceSession(qdq, providers=["CPUExecutionProvider"]).run(None, feeds)
    with simulated_or_skip("generic-gpu", by="profile") as sims:
        device = sims["generic-gpu"]
        sess = device_session(qdq, fixed_options(feeds), device)
        assert sess.partition_summary.get(device.ep_name, 0) > 0
        err, bound = within_tolerance(sess.run(None, feeds)[0], cpu[0], sess.eps[device.ep_name].profile)
        assert err <= bound, (err, bound)
