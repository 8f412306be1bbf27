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
