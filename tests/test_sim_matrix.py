"""``onnxhal matrix`` (every EP device against the CPU EP) and ``onnxhal run --explain``."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxhal
from onnxhal.cli import main
from onnxhal.cli_matrix import matrix
from onnxhal.simulators import simulated_library_names
from onnxhal.simulators.profiles import PROFILE_DIR
from onnxhal.simulators.testing import simulated_devices, unregister_quietly

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
                unregister_quietly(name)


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
    assert npu.nodes_on_device == 0 and npu.declined == "operators generic-npu lacks: 1 node(s) (Erf×1); the next EP runs them"
    assert "declined (0 nodes): operators generic-npu lacks: 1 node(s) (Erf×1)" in out
    assert "1 device(s) ran no node of this model" in out
    assert rows["generic-gpu"].nodes_on_device == 1 and not rows["generic-gpu"].declined


def test_fp16_overflow_is_flagged_with_its_likely_cause(tmp_path, isolated, capsys):
    # overflowing at run time: 3e4 * 4 leaves the device as 1.2e5 (a weight beyond the range would
    # be clamped to it, as device compilers store weights)
    scale = numpy_helper.from_array(np.array(4.0, np.float32), "s")
    path = _one_node_model(tmp_path, helper.make_node("Mul", ["x", "s"], ["y"], name="mul"), [scale])
    np.savez(tmp_path / "in.npz", x=np.full((4, 24), 3e4, np.float32))
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
    # A dynamic export on a static-only NPU: one line per kind of reason, the value names and shapes
    # counted together, the dynamic shapes with their remedy.
    assert row.nodes_on_device == 0
    lines = row.declined.splitlines()
    assert len(lines) == 3 and "other reason" not in row.declined, row.declined
    dynamic = next(x for x in lines if x.startswith("dynamic shapes: "))
    assert int(dynamic.split()[2]) > 40, row.declined
    assert dynamic.endswith(f"fix them with `onnxhal fix-shapes {bert} --dim batch=N --dim sequence=N -o fixed.onnx`")
    assert any(x.startswith("operators generic-npu lacks: ") and "Gather×19" in x for x in lines)
    # The counts are the nodes the EP declined, each once.
    sess_count = sum(int(x.split(": ", 1)[1].split()[0]) for x in lines)
    assert sess_count == 170


def test_partition_prints_one_line_per_kind_of_reason_with_the_remedy(capsys):
    """The summary counted the static-shape reason once per value name ("102 other reason(s)") and
    never pointed to fix-shapes."""
    import os

    bert = os.path.join(os.path.dirname(__file__), "real_models", "bert_ts.onnx")
    with simulated_devices("generic-npu"):
        assert main(["partition", bert, "--policy", "PREFER_NPU"]) == 0
    out = capsys.readouterr().out
    assert "other reason" not in out
    block = out[out.index("VirtualNpuExecutionProvider declined 170 node(s):"):].splitlines()[1:4]
    assert [x.split(":")[0].strip() for x in block] == ["dynamic shapes", "operators generic-npu lacks",
                                                       "data types generic-npu does not compute"]
    assert f"fix them with `onnxhal fix-shapes {bert} --dim batch=N --dim sequence=N -o fixed.onnx`" in block[0]


def _faulty_gpu(tmp_path, fault: str) -> str:
    """generic-gpu with one fault from its first session on (a device that claims, then fails)."""
    path = tmp_path / "faulty-gpu.toml"
    text = (PROFILE_DIR / "generic-gpu.toml").read_text().replace('name = "generic-gpu"', 'name = "faulty-gpu"')
    path.write_text(f"{text}\n[faults]\n{fault}\n")
    return str(path)


@pytest.mark.parametrize("fault", ["device_lost_after_runs = 0", "compile_fail = true"])
def test_run_on_a_device_that_fails_says_so_and_exits_3(model_path, tmp_path, capsys, fault):
    """The session falls back to the CPU EP and answers; ``run`` used to print the fallback warning,
    exit 0 and have --explain say the session uses no simulated device."""
    from onnxhal.cli import DEVICE_FAILED

    with simulated_devices(_faulty_gpu(tmp_path, fault)):
        code = main(["run", model_path, "--ep", "VirtualGpuExecutionProvider", "--repeat", "1", "--explain"])
    out, err = capsys.readouterr()
    assert code == DEVICE_FAILED == 3
    (line,) = [x for x in err.splitlines() if x.startswith("onnxhal: device failed:")]
    stage = "compile" if "compile" in fault else "run time"
    assert "VirtualGpuExecutionProvider did not run what it claimed" in line and stage in line
    assert "CPUExecutionProvider ran its nodes instead" in line
    assert "uses no simulated device" not in out and "requested device did not run" in out
    with simulated_devices(_faulty_gpu(tmp_path, fault)):  # --policy: the device the policy chose
        assert main(["run", model_path, "--policy", "PREFER_GPU", "--repeat", "0"]) == DEVICE_FAILED


@pytest.mark.parametrize("fault", ["device_lost_after_runs = 0", "compile_fail = true"])
def test_matrix_on_a_device_that_fails_exits_3(model_path, isolated, tmp_path, capsys, fault):
    assert main(["matrix", model_path, "--profiles", f"generic-npu,{_faulty_gpu(tmp_path, fault)}",
                 "--no-progress"]) == 3
    out = capsys.readouterr().out
    assert "VirtualGpuExecutionProvider on faulty-gpu: FAIL device failed" in out.replace("\n", " ")
    assert "VirtualNpuExecutionProvider on generic-npu: ok" in out


def _zipmap_model(tmp_path, scale: float) -> str:
    """Mul (a device runs it) -> ZipMap (the CPU EP): a sequence of maps, as skl2onnx's classifiers end."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "s"], ["p"], name="mul"),
         helper.make_node("ZipMap", ["p"], ["probs"], name="zipmap", domain="ai.onnx.ml",
                          classlabels_int64s=[0, 1, 2, 3])],
        "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 4])],
        [helper.make_value_info("probs", helper.make_sequence_type_proto(
            helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, []))))],
        [numpy_helper.from_array(np.array(scale, np.float32), "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)],
                              ir_version=10)
    path = tmp_path / "zipmap.onnx"
    onnx.save(model, path)
    return str(path)


def test_matrix_compares_sequences_of_maps(tmp_path, isolated, capsys):
    """skl2onnx classifiers end in ZipMap: the matrix took float() of a dict and printed a traceback."""
    import os

    import onnxruntime

    path = _zipmap_model(tmp_path, 0.5)
    assert main(["matrix", path, "--profiles", "generic-gpu", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "Traceback" not in out and "VirtualGpuExecutionProvider on generic-gpu: ok: max|diff|" in out
    x = np.random.default_rng(0).random((5, 4)).astype(np.float32)
    (row,) = matrix(path, {"x": x}, show_progress=False)
    assert row.ok and row.nodes_on_device == 1 and row.checks[0].name == "probs" and row.max_error < 1e-6
    # The reference the maps are held to is onnxruntime's too.
    ort = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert [sorted(m) for m in ort] == [[0, 1, 2, 3]] * 5
    np.testing.assert_allclose([[m[k] for k in range(4)] for m in ort], x * 0.5, rtol=1e-6)
    # A device whose maps differ fails on the maps' values, named, without a traceback.
    from onnxhal.output_compare import compare_output

    bad = [dict(m) for m in ort]
    bad[2][3] += 0.25
    check = compare_output("probs", bad, ort, 1e-3, 1e-3)
    assert not check.ok and "output 'probs' max|diff| 0.25" in check.problem
    assert not compare_output("probs", [{0: 1.0}] * 5, ort, 1e-3, 1e-3).ok  # keys differ
    # Every skl2onnx ZipMap classifier of the corpus goes through the matrix.
    corpus = os.path.join(os.path.dirname(__file__), "real_models")
    for name in ("sk_logreg_zipmap", "sk_tree_zipmap"):
        assert main(["matrix", os.path.join(corpus, f"{name}.onnx"), "--profiles", "generic-gpu", "--no-progress"]) == 0


def _big_logits_model(tmp_path) -> tuple[str, np.ndarray]:
    """A MatMul whose outputs reach several hundred, some near zero: fp16 storage of its inputs
    leaves an absolute error of a few tenths everywhere, near-zero elements included."""
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((24, 16)) * 10).astype(np.float32)
    x = (rng.standard_normal((4, 24)) * 10).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "m",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 24])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])],
                              [numpy_helper.from_array(w, "w")])
    path = tmp_path / "logits.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)
    np.savez(tmp_path / "in.npz", x=x)
    return str(path), x


def test_matrix_verdict_is_relative_to_the_output_scale_and_names_fp16(tmp_path, isolated, capsys):
    import onnxruntime

    path, x = _big_logits_model(tmp_path)
    (row,) = [r for r in ensure_and_matrix(path, x, "generic-npu") if r.device == "generic-npu"]
    ort = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    (npu,) = [d for d in onnxhal.get_ep_devices() if d.device.metadata.get("simulator_profile") == "generic-npu"]
    so = onnxhal.SessionOptions()
    so.add_provider_for_devices([npu])
    dev = onnxhal.InferenceSession(path, so).run(None, {"x": x})[0]
    c = row.checks[0]
    assert row.nodes_on_device == 1 and c.scale == pytest.approx(np.abs(ort).max(), rel=1e-5) and c.scale > 300
    assert 0.05 < c.max_error < 2  # fp16 inputs: off by tenths on outputs of hundreds
    # An element-wise rule fails this output: elements near zero are off by more than atol + rtol |y| ...
    assert not np.all(np.abs(dev - ort) <= 2e-2 + 2e-2 * np.abs(ort))
    # ... the scale rule passes it, and says so.
    assert row.ok, row.error
    assert main(["matrix", path, "--profiles", "generic-npu", "--inputs", str(tmp_path / "in.npz"),
                 "--no-progress"]) == 0
    out = capsys.readouterr().out.replace("\n", " ")
    assert "relative to the output's scale" in out and "generic-npu stores float32 as fp16" in out
    # Beyond a tolerance fp16 cannot meet, the FAIL names the rule and fp16 as the likely cause.
    strict = tmp_path / "strict-npu.toml"
    strict.write_text((PROFILE_DIR / "generic-npu.toml").read_text().replace('name = "generic-npu"', 'name = "strict-npu"')
                      .replace("rtol = 2e-2", "rtol = 1e-5").replace("atol = 2e-2", "atol = 1e-5"))
    assert main(["matrix", path, "--profiles", str(strict), "--inputs", str(tmp_path / "in.npz"),
                 "--no-progress"]) == 1
    out = capsys.readouterr().out.replace("\n", " ")
    assert "FAIL beyond tolerance relative to the output's scale: output 'y' max|diff|" in out
    assert "likely cause: fp16 precision (strict-npu stores float32 as fp16" in out


def ensure_and_matrix(path: str, x: np.ndarray, profiles: str) -> list:
    from onnxhal.cli_matrix import ensure_simulators

    ensure_simulators(profiles)
    return matrix(path, {"x": x}, show_progress=False)


def test_matrix_feeds_respect_tables_and_dims(tmp_path, isolated, capsys):
    from tests.test_cli import _embedding_model

    path = _embedding_model(tmp_path)
    assert main(["matrix", path, "--profiles", "generic-npu", "--dim", "batch=2", "--dim", "sequence=3",
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "Inputs (random, seed 0)" in out and "[2, 3]" in out and "indexes 'token_type_embeddings' (2 rows)" in out
    assert "VirtualNpuExecutionProvider on generic-npu: ok" in out
