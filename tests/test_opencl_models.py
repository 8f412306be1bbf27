"""The benchmark models and the light model zoo on the OpenCL EP: at least 90% of their nodes run
on OpenCL and the outputs match the CPU EP's within 1e-3 relative."""

from __future__ import annotations

import numpy as np
import pytest

import onnxhal
from benchmarks.models import LIGHT_NAMES, cnn, encoder, feeds, light_model, mlp

PROVIDERS = ["OpenCLExecutionProvider", "CPUExecutionProvider"]


def _check(model, inputs) -> None:
    so = onnxhal.SessionOptions()
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    sess = onnxhal.InferenceSession(model, so, providers=PROVIDERS)
    counts = sess.partition_summary
    total = sum(counts.values())
    on_cl = counts.get("OpenCLExecutionProvider", 0)
    assert on_cl >= 0.9 * total, f"only {on_cl} of {total} nodes on OpenCL: {counts}"
    ref = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, inputs)
    for got, want in zip(sess.run(None, inputs), ref):
        scale = max(float(np.abs(want).max()), 1e-6)  # relative to the output's magnitude
        assert float(np.abs(got - want).max()) <= 1e-3 * scale, (float(np.abs(got - want).max()), scale)


@pytest.mark.parametrize("build", [mlp, cnn, encoder], ids=["mlp", "cnn", "encoder"])
def test_benchmark_model_on_opencl(build, opencl_devices):
    model = build()
    _check(model, feeds(model))


@pytest.mark.parametrize("name", LIGHT_NAMES)
def test_light_model_on_opencl(name, opencl_devices):
    """The light zoo stores weights as ConstantOfShape nodes behind overridable inputs; with those
    materialized as seeded random initializers (benchmarks.models.light_model) the model is what
    a deployed one looks like, and a wrong weight index cannot hide behind constant weights."""
    model = light_model(name)
    _check(model, feeds(model))
