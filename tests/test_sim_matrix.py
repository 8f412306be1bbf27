"""``onnxhal matrix`` (every EP device against the CPU EP) and ``onnxhal run --explain``."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxhal.cli import main
from onnxhal.cli_matrix import matrix
from onnxhal.simulators import simulated_library_names
from onnxhal.simulators.profiles import PROFILE_DIR
from onnxhal.simulators.testing import _unregister, simulated_devices

pytest.importorskip("pyopencl")


@pytest.fixture
def model_path(tmp_path):
    rng = np.random.default_rng(4)
    w = rng.standard_normal((24, 12)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"), helper.make_node("Erf", ["h"], ["e"], name="erf"),
         helper.make_node("Relu", ["e"], ["y"], name="relu")],
        "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 24])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 12])], [numpy_helper.from_array(w, "w")])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path)


@pytest.fixture
def isolated():
    """Whatever the matrix registers is dropped afterwards; earlier simulated devices come back."""
    with simulated_devices("generic-npu"):
        try:
            yield
        finally:
            for name in simulated_library_names():
                _unregister(name)


def test_matrix_table_and_exit_code(model_path, isolated, capsys):
    assert main(["matrix", model_path, "--profiles", "generic-npu,generic-gpu", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "generic-npu" in out and "generic-gpu" in out and "FAIL" not in out
    rows = {r.device: r for r in matrix(model_path, {"x": np.ones((4, 24), np.float32)}, show_progress=False)}
    npu, gpu = rows["generic-npu"], rows["generic-gpu"]
    assert (npu.nodes_on_device, npu.nodes_on_cpu) == (2, 1)  # generic-npu has no Erf: the CPU runs it
    assert (gpu.nodes_on_device, gpu.nodes_on_cpu) == (3, 0)
    assert npu.transfers == 4 and gpu.transfers == 2  # the NPU's partition is split around the Erf
    assert 0 < npu.max_error < 2e-2 and gpu.max_error < 1e-4 and npu.ok and gpu.ok
    assert npu.sim_ms > 0 and gpu.sim_mj > npu.sim_mj


def test_matrix_fails_beyond_the_profile_tolerance(model_path, isolated, tmp_path, capsys):
    strict = tmp_path / "strict-npu.toml"
    text = (PROFILE_DIR / "generic-npu.toml").read_text()
    strict.write_text(text.replace('name = "generic-npu"', 'name = "strict-npu"')
                      .replace("rtol = 2e-2", "rtol = 0.0").replace("atol = 2e-2", "atol = 1e-7"))
    assert main(["matrix", model_path, "--profiles", str(strict), "--no-progress"]) == 1
    assert "FAIL beyond tolerance" in capsys.readouterr().out


def test_run_explain_shows_simulated_cost(model_path, capsys):
    with simulated_devices("generic-gpu"):
        assert main(["run", model_path, "--ep", "VirtualGpuExecutionProvider", "--repeat", "1", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "Simulated device cost" in out and "generic-gpu" in out and "3/3" in out
    assert main(["run", model_path, "--repeat", "0", "--explain"]) == 0
    assert "uses no simulated device" in capsys.readouterr().out


def _one_node_model(tmp_path, node: onnx.NodeProto, inits: list | None = None) -> str:
    graph = helper.make_graph([node], "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 24])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 24])], inits or [])
    path = tmp_path / f"{node.op_type}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path)


def test_matrix_says_declined_for_a_device_that_ran_nothing(tmp_path, isolated, capsys):
    path = _one_node_model(tmp_path, helper.make_node("Erf", ["x"], ["y"], name="erf"))
    assert main(["matrix", path, "--profiles", "generic-npu,generic-gpu", "--no-progress"]) == 0
    out = capsys.readouterr().out
    rows = {r.device: r for r in matrix(path, {"x": np.ones((4, 24), np.float32)}, show_progress=False)}
    npu = rows["generic-npu"]
    assert npu.nodes_on_device == 0 and npu.declined == "1 x generic-npu has no Erf"
    assert "declined (0 nodes): 1 x generic-npu has no Erf" in out
    assert "1 device(s) ran no node of this model" in out
    assert rows["generic-gpu"].nodes_on_device == 1 and not rows["generic-gpu"].declined


def test_fp16_overflow_is_flagged_with_its_likely_cause(tmp_path, isolated, capsys):
    scale = numpy_helper.from_array(np.array(1e5, np.float32), "s")
    path = _one_node_model(tmp_path, helper.make_node("Mul", ["x", "s"], ["y"], name="mul"), [scale])
    np.savez(tmp_path / "in.npz", x=np.ones((4, 24), np.float32))
    assert main(["matrix", path, "--profiles", "generic-npu", "--inputs", str(tmp_path / "in.npz"),
                 "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert "96 NaN/inf value(s) where the CPU EP's are finite" in out
    assert "values beyond 65504 overflow float16 on generic-npu" in out
    with simulated_devices("generic-npu"):
        assert main(["run", path, "--policy", "PREFER_NPU", "--inputs", str(tmp_path / "in.npz"),
                     "--repeat", "0"]) == 0
    out = capsys.readouterr().out
    assert "output 'y' holds 0 NaN and 96 inf value(s) of 96" in out and "overflow float16 on generic-npu" in out


def test_declined_reasons_are_counted_by_kind_not_by_value(isolated):
    import os

    from onnxhal.cli_matrix import ensure_simulators

    bert = os.path.join(os.path.dirname(__file__), "real_models", "bert_ts.onnx")
    ensure_simulators("generic-npu")
    feeds = {"input_ids": np.ones((1, 8), np.int64), "attention_mask": np.ones((1, 8), np.int64)}
    (row,) = [r for r in matrix(bert, feeds, show_progress=False) if r.device == "generic-npu"]
    # A dynamic export on a static-only NPU: the reason that matters comes first, counted once for
    # all the values it names.
    assert row.nodes_on_device == 0
    assert row.declined.split("; ")[0].endswith("x generic-npu runs static shapes only") or \
        "x generic-npu runs static shapes only; a value has shape" in row.declined, row.declined
    first_count = int(row.declined.split(" x ")[0])
    assert first_count > 40, row.declined
