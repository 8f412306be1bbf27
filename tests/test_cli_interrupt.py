"""Ctrl-C while the ``onnxhal`` command is still loading numpy and onnx ends as it does later: one
line, exit 130, no traceback. The CLI module and the package import nothing heavy at their top."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.interrupts import sigint_default

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("ONNXHAL_SIMULATE", "COLUMNS")}


def test_the_cli_module_imports_neither_numpy_nor_onnx():
    code = "import sys, onnxhal.cli; print(sorted(m for m in ('numpy', 'onnx', 'onnxhal.hal') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), cwd=ROOT,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def _mapped(pid: int, fragment: str) -> bool:
    try:
        return fragment in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc to see when numpy starts loading")
@pytest.mark.parametrize("command", [["-m", "onnxhal"], ["-c", "import sys; from onnxhal.cli import main; "
                                                              "sys.exit(main())"]], ids=["module", "entry-point"])
def test_ctrl_c_while_numpy_and_onnx_load_prints_one_line_and_exits_130(command):
    """SIGINT as soon as numpy's extension is mapped: onnx and the runtime are still loading (about
    0.7 s of CPU), the moment a traceback used to come out."""
    p = subprocess.Popen([sys.executable, *command, "devices"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=_env(), cwd=ROOT, preexec_fn=sigint_default)
    try:
        deadline = time.monotonic() + 120
        while not _mapped(p.pid, "_multiarray_umath") and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.001)
        assert p.poll() is None, "the command ended before numpy loaded"
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert err.decode().splitlines() == ["onnxhal: interrupted"], err.decode()[-3000:]
    assert p.returncode == 130


def test_ctrl_c_that_an_import_turns_into_its_own_error_still_prints_one_line_and_exits_130(monkeypatch, capsys):
    """A C extension's import that SIGINT interrupts raises its own error (numpy's
    "PyCapsule_Import could not import module datetime"), not KeyboardInterrupt; the command still
    says it was interrupted."""
    from onnxhal import cli

    def interrupted_import():
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)  # the handler raises here
        except KeyboardInterrupt as e:
            raise ImportError('PyCapsule_Import could not import module "datetime"') from e
        raise AssertionError("no SIGINT arrived")

    monkeypatch.setattr(cli, "build_parser", interrupted_import)
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)  # see tests/interrupts.py
    try:
        assert cli.main(["devices"]) == 130
    finally:
        restored = signal.signal(signal.SIGINT, inherited)
    assert capsys.readouterr().err.splitlines() == ["onnxhal: interrupted"]
    assert restored is signal.default_int_handler
