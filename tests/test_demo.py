"""``onnxhal demo`` as a new user meets it, and the partition figures it prints (transfers counted
from the partitioned graph must be the transfers the simulated device's meter sees in a run)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import onnxhal
from onnxhal.demo import ci_lines
from onnxhal.demo_models import demo_cnn, demo_transformer_block
from onnxhal.partition_view import HOST, session_view
from onnxhal.simulators.cost import virtual_eps
from onnxhal.simulators.testing import simulated_devices


def _demo(env_update: dict[str, str | None]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in env_update}
    env.update({k: v for k, v in env_update.items() if v is not None})
    return subprocess.run([sys.executable, "-m", "onnxhal", "demo"], capture_output=True, text=True, timeout=120,
                          env=env)


def test_demo_simulates_an_npu_shows_the_fallback_and_ends_with_the_ci_lines():
    out = _demo({"ONNXHAL_SIMULATE": None})
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "ONNXHAL_SIMULATE is not set: the demo simulates generic-npu and generic-gpu itself" in text
    assert "a small CNN" in text and "a transformer block" in text
    assert text.count("PREFER_NPU selected providers: ['VirtualNpuExecutionProvider', 'CPUExecutionProvider']") == 2
    # The transformer block's Gelu is not on the generic NPU: it falls back, and the transfers show it.
    assert "VirtualNpuExecutionProvider -> CPUExecutionProvider: 1 value(s)" in text
    assert "VirtualNpuExecutionProvider declined 1 node(s):\n  operators generic-npu lacks: 1 node(s) (Gelu " in text
    assert text.count("(profile generic-npu): OK") == 2 and "MISMATCH" not in text
    assert text.rstrip().splitlines()[-4:-1] == ci_lines("generic-npu,generic-gpu")
    tables = [line for line in text.splitlines() if line[:1] in "┏┃┡│└─" and line]
    assert len(tables) > 20 and all(len(line) <= 100 for line in tables)  # piped: tables fit 100 columns


def test_demo_uses_the_profiles_the_user_set():
    out = _demo({"ONNXHAL_SIMULATE": "mobile-npu"})
    assert out.returncode == 0, out.stderr
    assert "demo simulates" not in out.stdout
    assert "operators mobile-npu lacks: 3 node(s) (LayerNormalization×2" in out.stdout and "(profile mobile-npu): OK" in out.stdout
    assert "export ONNXHAL_SIMULATE=mobile-npu " in out.stdout


def test_demo_says_why_prefer_npu_took_the_cpu_when_there_is_no_npu():
    out = _demo({"ONNXHAL_SIMULATE": "generic-gpu"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("no NPU among the EP devices: PREFER_NPU takes the CPU EP") == 2
    assert "export ONNXHAL_SIMULATE=generic-gpu " in out.stdout


def test_ci_lines_name_the_variable_the_option_and_the_fixture():
    env, option, fixture = ci_lines("a,b")
    assert env.startswith("export ONNXHAL_SIMULATE=a,b ") and option.startswith("pytest --onnxhal-simulate=a,b ")
    assert "ep_device" in fixture
    assert len({line.index("#") for line in (env, option, fixture)}) == 1  # comments aligned


@pytest.mark.parametrize("make", [demo_cnn, demo_transformer_block])
def test_transfers_in_the_view_are_the_transfers_a_run_makes(make):
    model = make()
    with simulated_devices("generic-npu"):
        so = onnxhal.SessionOptions()
        so.set_provider_selection_policy(onnxhal.OrtExecutionProviderDevicePolicy.PREFER_NPU)
        sess = onnxhal.InferenceSession(model, so)
        view = session_view(sess)
        shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
        sess.run(None, {model.graph.input[0].name: np.ones(shape, np.float32)})
        (ep,) = virtual_eps(sess).values()
        assert view.transfer_totals() == (ep.meter.last_run.transfers, ep.meter.last_run.transfer_bytes)
    assert sum(view.nodes_per_ep().values()) == sum(sess.partition_summary.values())
    assert view.nodes_per_ep() == sess.partition_summary
    assert any(t.src == HOST for t in view.transfers)


def test_the_transformer_block_splits_into_two_npu_partitions_around_the_cpu_gelu():
    with simulated_devices("generic-npu"):
        so = onnxhal.SessionOptions()
        so.set_provider_selection_policy(onnxhal.OrtExecutionProviderDevicePolicy.PREFER_NPU)
        view = session_view(onnxhal.InferenceSession(demo_transformer_block(), so))
    assert view.partitions_per_ep() == {"VirtualNpuExecutionProvider": 2, "CPUExecutionProvider": 1}
    cpu = next(p for p in view.partitions if p.ep_name == "CPUExecutionProvider")
    into_cpu = [t for t in view.transfers if t.dst == cpu.index]
    out_of_cpu = [t for t in view.transfers if t.src == cpu.index]
    assert len(into_cpu) == 1 and len(out_of_cpu) == 1 and into_cpu[0].src != out_of_cpu[0].dst
    assert out_of_cpu[0].nbytes == 1 * 16 * 256 * 4  # the FFN's hidden activation, float32


def test_a_transfer_of_dynamic_shape_is_counted_and_its_size_said_unknown():
    """Two EPs split the demo model whose batch axis is symbolic: every copy is counted, the bytes of
    those with a symbolic shape are left out and counted apart."""
    import onnx

    from onnxhal.demo_models import demo_model
    from onnxhal.hal import Graph
    from onnxhal.partition_view import build_view

    model = demo_model()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    model = onnx.shape_inference.infer_shapes(model)
    graph = Graph.from_proto(model.graph, {"": 17})
    first, rest = graph.nodes[:1], graph.nodes[1:]
    for n in first:
        n.ep_name = "NpuExecutionProvider"
    for n in rest:
        n.ep_name = "GpuExecutionProvider"
    view = build_view(graph, [first, rest])
    # x host -> NPU and c NPU -> GPU are [batch, ...]; probs GPU -> host is declared [1, 10] float32.
    assert view.transfer_totals() == (3, 40) and view.unknown_sizes() == 2
