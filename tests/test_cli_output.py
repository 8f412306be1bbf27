"""What the CLI prints for people and for programs: ``--json`` on ``run`` and ``matrix``, progress
and Ctrl-C in ``run``, one exit status for a closed pipe on every command, tables that never cut a
figure or a name."""

from __future__ import annotations

import os
import subprocess
import sys

import onnx
import pytest

from onnxhal.demo_models import demo_model
from tests.interrupts import sigint_default

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env(**update: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ONNXHAL_SIMULATE", "COLUMNS")}
    env.update(update)
    return env


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("cli_output") / "model.onnx"
    onnx.save(demo_model(), path)
    return str(path)


@pytest.mark.parametrize("command", [["run", "{model}", "--repeat", "1"], ["matrix", "{model}", "--no-progress"],
                                     ["partition", "{model}"], ["devices"], ["profiles", "list"],
                                     ["sweep", "{model}", "--profiles", "generic-npu", "--runtimes", "onnxhal",
                                      "--shapes", "exported"]],
                         ids=lambda c: c[0])
def test_a_closed_pipe_exits_141_on_every_command(command, model):
    # The reader is gone before onnxhal starts, so its first write surely meets EPIPE (as `| head -1`
    # does once head has read its line).
    read, write = os.pipe()
    os.close(read)
    try:
        p = subprocess.run([sys.executable, "-m", "onnxhal", *(a.format(model=model) for a in command)],
                           stdout=write, stderr=subprocess.PIPE, text=True, env=_env(), cwd=ROOT, timeout=240)
    finally:
        os.close(write)
    assert p.returncode == 141, p.stderr
    assert "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr


def _onnxhal(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "onnxhal", *args], capture_output=True, text=True, timeout=240,
                          env=_env(**env), cwd=ROOT)


def test_run_json_reports_what_run_prints_and_matches_onnxruntime(model, tmp_path):
    import json

    import numpy as np
    import onnxruntime

    x = np.random.default_rng(3).standard_normal((1, 3, 16, 16)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    out = _onnxhal("run", model, "--inputs", str(tmp_path / "in.npz"), "--repeat", "3", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)  # the whole of stdout is one JSON object: no table around it
    assert report["inputs"]["inputs"] == [{"name": "x", "dtype": "float32", "shape": [1, 3, 16, 16],
                                           "min": pytest.approx(float(x.min()), rel=1e-3),
                                           "max": pytest.approx(float(x.max()), rel=1e-3),
                                           "range_from": report["inputs"]["inputs"][0]["range_from"]}]
    assert report["partition"]["providers"] == ["CPUExecutionProvider"]
    assert sum(ep["nodes"] for ep in report["partition"]["eps"]) >= 1
    assert report["latency_ms"]["runs"] == 3 and len(report["latency_ms"]["all"]) == 3
    assert 0 < report["latency_ms"]["min"] <= report["latency_ms"]["median"]
    proto = onnx.load(model)
    proto.ir_version = 10
    (ref,) = onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    (o,) = report["outputs"]
    assert o["name"] == "probs" and o["dtype"] == "float32" and o["shape"] == list(ref.shape)
    for key, value in (("min", ref.min()), ("max", ref.max()), ("mean", ref.mean())):
        assert o[key] == pytest.approx(float(value), abs=1e-5), key
    assert report["device_failures"] == []


def test_matrix_json_has_a_row_with_its_verdict_per_device(model):
    import json

    out = _onnxhal("matrix", model, "--json", ONNXHAL_SIMULATE="generic-npu,generic-gpu")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["inputs"]["inputs"][0]["name"] == "x" and "rtol" in report["rule"]
    rows = {r["device"]: r for r in report["rows"]}
    assert {"generic-npu", "generic-gpu"} <= set(rows)
    for r in rows.values():
        assert r["result"] == "ok" and r["verdict"].startswith("ok: max|diff|") and not r["failed"]
        assert r["nodes_on_device"] > 0 and r["sim_ms"] > 0
        assert 0 <= r["max_error"] <= r["atol"] + r["rtol"]  # the demo model's output is a softmax: scale <= 1


def test_help_documents_json():
    for command in ("run", "matrix"):
        out = _onnxhal(command, "--help")
        assert "--json" in out.stdout and "JSON object" in " ".join(out.stdout.split()), command


@pytest.fixture(scope="module")
def slow_model(tmp_path_factory) -> str:
    """Eight 512x512 MatMuls: some 15 ms a run, so that 10000 repeats outlast any test."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((512, 512)) / 23).astype(np.float32), f"w{i}")
             for i in range(8)]
    nodes = [helper.make_node("MatMul", ["x" if i == 0 else f"y{i - 1}", f"w{i}"], [f"y{i}"]) for i in range(8)]
    graph = helper.make_graph(nodes, "slow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [512, 512])],
                              [helper.make_tensor_value_info("y7", TensorProto.FLOAT, [512, 512])], inits)
    path = tmp_path_factory.mktemp("slow") / "slow.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path)


def _read_until(fd: int, needle: bytes, timeout: float) -> bytes:
    import select
    import time

    seen, end = b"", time.monotonic() + timeout
    while needle not in seen and time.monotonic() < end:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
    return seen


def test_run_shows_progress_on_a_terminal_and_ctrl_c_exits_130_with_one_line(slow_model):
    import fcntl
    import pty
    import signal
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))
    p = subprocess.Popen([sys.executable, "-m", "onnxhal", "run", slow_model, "--repeat", "10000"], stdout=slave,
                         stderr=subprocess.PIPE, env=_env(), cwd=ROOT,
                         preexec_fn=sigint_default)
    os.close(slave)
    try:
        seen = _read_until(master, b"timed runs", timeout=120)
        assert b"timed runs" in seen, seen[-2000:]  # the repeats show their progress while they run
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
        os.close(master)
    assert p.returncode == 130
    assert err.decode().splitlines() == ["onnxhal: interrupted"]


def test_run_in_a_pipe_prints_no_progress_and_ctrl_c_exits_130(slow_model, model):
    import signal
    import time

    out = _onnxhal("run", model, "--repeat", "3")
    assert out.returncode == 0 and "timed runs" not in out.stdout and "latency over 3 runs" in out.stdout
    # Unbuffered, the table of inputs shows as soon as it is printed: the repeats come next.
    p = subprocess.Popen([sys.executable, "-m", "onnxhal", "run", slow_model, "--repeat", "10000"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(PYTHONUNBUFFERED="1"), cwd=ROOT,
                         preexec_fn=sigint_default)
    try:
        seen = _read_until(p.stdout.fileno(), b"Inputs", timeout=120)
        assert b"Inputs" in seen
        time.sleep(1)
        p.send_signal(signal.SIGINT)
        stdout, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130 and err.decode().splitlines() == ["onnxhal: interrupted"], err
    assert b"timed runs" not in seen + stdout


def test_tables_at_80_columns_cut_no_figure_or_name(model):
    import json

    env = {"COLUMNS": "80", "ONNXHAL_SIMULATE": "generic-npu,generic-gpu"}
    matrix = _onnxhal("matrix", model, "--no-progress", **env)
    run = _onnxhal("run", model, "--repeat", "1", "--explain", "--policy", "PREFER_NPU", **env)
    others = [_onnxhal(*c, **env) for c in (("partition", model, "--policy", "PREFER_NPU"), ("devices",))]
    for out in (matrix, run, *others):
        assert out.returncode == 0, out.stderr
        assert "…" not in out.stdout, out.stdout
    # Every figure of the tables, as --json gives it, shows whole.
    rows = json.loads(_onnxhal("matrix", model, "--json", **env).stdout)["rows"]
    for r in rows:
        for figure in (f"{r['max_error']:.3g}", f"{r['sim_ms']:.3f}", f"{r['sim_mj']:.3f}"):
            assert figure in matrix.stdout, (figure, matrix.stdout)
    (cost,) = json.loads(_onnxhal("run", model, "--repeat", "1", "--explain", "--policy", "PREFER_NPU", "--json",
                                  **env).stdout)["simulated_cost"]
    for figure in (f"{cost['kernel_ms']:.3f}", f"{cost['device_ms']:.3f}", f"{cost['energy_mj']:.3f}",
                   f"{cost['transfer_bytes'] / 1024:.1f}"):
        assert figure in run.stdout, (figure, run.stdout)


def test_long_input_and_output_names_fold_at_80_columns(tmp_path):
    from onnx import TensorProto, helper

    name_in, name_out = "encoder_hidden_states_" + "x" * 60, "logits_of_the_decoder_" + "y" * 60
    graph = helper.make_graph([helper.make_node("Relu", [name_in], [name_out])], "long",
                              [helper.make_tensor_value_info(name_in, TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info(name_out, TensorProto.FLOAT, [2, 3])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "long.onnx")
    out = _onnxhal("run", str(tmp_path / "long.onnx"), "--repeat", "1", COLUMNS="80")
    assert out.returncode == 0, out.stderr
    assert "…" not in out.stdout
    # A folded name reads whole from its column's lines, joined.
    first_column = "".join(line.split("│")[1].strip() for line in out.stdout.splitlines() if line.startswith("│"))
    assert name_in in first_column and name_out in first_column
