"""Real exported models (tests/real_models: torch.onnx.export of Hugging Face architectures by both
exporters, dynamic batch and sequence axes, onnxruntime's outputs stored beside them) on every EP:
the CPU EP matches onnxruntime on two input signatures; the OpenCL EP takes as many nodes of the
dynamic model as of the same model with its dims fixed, and matches too; every shipped profile
either matches within its tolerance or names why it declined."""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest

import onnxhal
from tests.opencl_support import opencl_verdict

CORPUS = os.path.join(os.path.dirname(__file__), "real_models")
MODELS = sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(CORPUS, "*.onnx")))
PROFILES = ["generic-npu", "generic-gpu", "mobile-npu", "integrated-gpu", "discrete-gpu"]


def load(name: str) -> tuple[str, dict[str, tuple[dict[str, np.ndarray], np.ndarray]]]:
    path = os.path.join(CORPUS, f"{name}.onnx")
    data = np.load(path[:-5] + ".npz")
    sigs: dict[str, dict[str, np.ndarray]] = {}
    for key in data.files:
        sig, arg = key.split(".", 1)
        sigs.setdefault(sig, {})[arg] = data[key]
    return path, {s: ({k: v for k, v in d.items() if k != "__output"}, d["__output"]) for s, d in sigs.items()}


def fixed_options(feeds: dict[str, np.ndarray]) -> onnxhal.SessionOptions:
    so = onnxhal.SessionOptions()
    first = next(iter(feeds.values()))
    so.add_free_dimension_override_by_name("batch", first.shape[0])
    if first.ndim == 2:
        so.add_free_dimension_override_by_name("sequence", first.shape[1])
    return so


def test_the_corpus_is_there():
    assert len(MODELS) >= 9, MODELS  # 5 architectures x 2 exporters, less the one the dynamo exporter fails


@pytest.mark.parametrize("name", MODELS)
def test_cpu_ep_matches_onnxruntime_on_two_signatures(name):
    path, sigs = load(name)
    sess = onnxhal.InferenceSession(path, providers=["CPUExecutionProvider"])
    for feeds, want in sigs.values():
        np.testing.assert_allclose(sess.run(None, feeds)[0], want, rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def opencl():
    index, reason = opencl_verdict()
    if index is None:
        pytest.skip(f"needs a working OpenCL device: {reason}")
    onnxhal.register_execution_provider_library("opencl_real_models", "onnxhal.runtime.providers.opencl")
    yield
    import gc

    gc.collect()
    onnxhal.unregister_execution_provider_library("opencl_real_models")


@pytest.mark.parametrize("name", MODELS)
def test_opencl_takes_the_dynamic_model_as_the_fixed_one_and_matches(name, opencl):
    path, sigs = load(name)
    providers = ["OpenCLExecutionProvider", "CPUExecutionProvider"]
    sess = onnxhal.InferenceSession(path, providers=providers)
    fixed = onnxhal.InferenceSession(path, fixed_options(sigs["a"][0]), providers=providers)
    on_dynamic = sess.partition_summary.get("OpenCLExecutionProvider", 0)
    on_fixed = fixed.partition_summary.get("OpenCLExecutionProvider", 0)
    # Lone views (a Reshape between two CPU nodes) are never claimed; allow one or two of them.
    assert on_dynamic >= on_fixed - 2 and on_dynamic > 0, (on_dynamic, on_fixed)
    for feeds, want in sigs.values():
        np.testing.assert_allclose(sess.run(None, feeds)[0], want, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_matches_or_names_its_reasons(profile):
    from tests.conftest import simulated_or_skip

    with simulated_or_skip(profile, by="profile") as sims:
        device = sims[profile]
        for name in MODELS:
            path, sigs = load(name)
            feeds, want = sigs["a"]
            for so in (onnxhal.SessionOptions(), fixed_options(feeds)):  # dynamic, then dims fixed
                so.add_provider_for_devices([device])
                sess = onnxhal.InferenceSession(path, so)
                ep = sess._core.eps[device.ep_name]
                taken = sess.partition_summary.get(device.ep_name, 0)
                if not taken:
                    assert ep.declined, f"{profile} took no node of {name} and named no reason"
                    continue
                got = sess.run(None, feeds)[0]
                scale = float(np.max(np.abs(want)))
                err = float(np.max(np.abs(got - want)))
                assert err <= ep.profile.atol * max(1.0, scale) + ep.profile.rtol * scale, (name, profile, err)
