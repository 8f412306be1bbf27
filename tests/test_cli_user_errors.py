"""A user's mistake in the CLI, the environment or the pytest option is one line naming the value,
the choices and the remedy, exit status 2 (pytest's usage error under pytest), never a traceback;
a closed pipe ends quietly; tables fit 100 columns when piped; ``--help`` lists what may be given."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import pytest

import onnxhal
from onnxhal.cli import main
from onnxhal.simulators.profiles import ProfileError, load_profile, shipped_profiles
from tests.models import add_mul_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env(**update: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ONNXHAL_SIMULATE", "COLUMNS")}
    env.update(update)
    return env


def _onnxhal(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "onnxhal", *args], capture_output=True, text=True, timeout=240,
                          env=_env(**env), cwd=ROOT)


@pytest.mark.parametrize("command", [["devices"], ["demo"]])
def test_unknown_profile_in_the_environment_is_one_line(command):
    out = _onnxhal(*command, ONNXHAL_SIMULATE="generic-npu,quantum-npu")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    # (a machine without OpenCL drivers may log discovery warnings first: they are not the error)
    (line,) = [x for x in out.stderr.splitlines() if x.startswith("onnxhal:")]
    assert line.startswith("onnxhal: InvalidArgument: ONNXHAL_SIMULATE='generic-npu,quantum-npu': ")
    assert "'quantum-npu': no shipped profile of that name" in line and ", ".join(shipped_profiles()) in line
    assert "key '-'" not in line


def test_profile_errors_name_a_key_only_when_one_is_at_fault():
    with pytest.raises(ProfileError) as info:
        load_profile("quantum-npu")
    assert str(info.value).startswith("simulator profile 'quantum-npu': no shipped profile") and "key" not in str(info.value)


def test_unknown_profile_in_the_pytest_option_is_a_usage_error(tmp_path):
    (tmp_path / "test_x.py").write_text("def test_x():\n    pass\n")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--onnxhal-simulate=foo",
                          "test_x.py"], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=_env())
    assert out.returncode == pytest.ExitCode.USAGE_ERROR and "Traceback" not in out.stderr + out.stdout
    assert "ERROR: --onnxhal-simulate=foo: simulator profile 'foo': no shipped profile" in out.stderr


def test_a_closed_pipe_ends_quietly():
    # The reader is gone before onnxhal writes a byte, so the write surely meets EPIPE.
    p = subprocess.Popen([sys.executable, "-m", "onnxhal", "devices", "--json"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=_env(), cwd=ROOT)
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=240) == 141 and "Traceback" not in err and "BrokenPipe" not in err


def test_piped_tables_fit_100_columns():
    out = _onnxhal("devices", ONNXHAL_SIMULATE="generic-npu,generic-gpu")
    assert out.returncode == 0, out.stderr
    tables = [line for line in out.stdout.splitlines() if line[:1] in "┏┃┡│└"]
    assert len(tables) > 10 and max(map(len, tables)) <= 100
    assert "…" not in out.stdout  # long values fold, never cut with an ellipsis


def test_columns_sets_the_width_of_piped_tables():
    out = _onnxhal("devices", COLUMNS="140")
    widths = [len(line) for line in out.stdout.splitlines() if line[:1] in "┏┃┡│└"]
    assert max(widths) <= 140 and max(widths) > 100


@pytest.mark.parametrize("command", ["run", "partition", "matrix"])
def test_help_lists_policies_providers_and_the_environment(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    for p in onnxhal.OrtExecutionProviderDevicePolicy:
        assert p.name in out
    assert "ONNXHAL_SIMULATE=generic-npu,generic-gpu" in out and "ONNXHAL_OPENCL=off" in out
    assert "OpenCLExecutionProvider" in out and "generic-npu" in out


def test_unreadable_inputs_are_one_line(tmp_path, capsys):
    model = tmp_path / "m.onnx"
    onnx.save(add_mul_model(), model)
    np.save(tmp_path / "x.npy", np.ones((2, 3), np.float32))
    np.savez(tmp_path / "objects.npz", x=np.array([{"a": 1}], dtype=object))  # loading it would unpickle
    cases = {str(tmp_path / "missing.npz"): "No such file or directory",
             str(tmp_path / "x.npy"): "holds one array without a name",
             str(model): "is not an .npz archive of arrays",
             str(tmp_path / "objects.npz"): "'x' is an array of Python objects, which onnxhal does not unpickle"}
    for path, words in cases.items():
        assert main(["run", str(model), "--inputs", path]) == 2
        (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("onnxhal:")]
        assert words in line and path in line
        assert "pickled" not in line and "allow_pickle" not in line  # numpy's words, misleading here


def test_device_metadata_prints_as_a_dict():
    md = onnxhal.get_hardware_devices()[0].metadata
    assert repr(md) == repr(dict(md)) and md == dict(md)
    with pytest.raises(TypeError):
        md["x"] = "y"  # type: ignore[index]


def test_text_with_brackets_prints_as_written(capsys):
    """Rich reads [..] as markup: a remedy naming an extra, or an output named like an index, must
    print as it is written, not lose its brackets."""
    from onnxhal.cli_tables import print_opencl, print_outputs
    from onnxhal.devices.opencl_remedy import opencl_remedy

    remedy = opencl_remedy(release={"ID": "debian"}, machine="x86_64")
    assert "[intel-opencl]" in remedy
    print_opencl({"devices": [], "switch": "", "usable": False, "remedy": remedy})
    print_outputs(["logits[0]"], [np.ones(2, np.float32)])
    out = capsys.readouterr().out
    assert "[intel-opencl]" in out.replace("\n", "") and "logits[0]" in out


def test_unknown_profile_in_the_environment_fails_every_call_not_only_the_first():
    """The first get_ep_devices() raised and later ones ran without the simulated devices, silently."""
    code = ("from onnxhal.cli import main\n"
            "import onnxhal\n"
            "print('codes', main(['devices']), main(['run', 'tests/real_models/sk_linreg.onnx']), main(['devices', '--json']))\n"
            "try:\n"
            "    onnxhal.get_ep_devices()\n"
            "except onnxhal.errors.InvalidArgument as e:\n"
            "    print('api raised', type(e).__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240,
                         env=_env(ONNXHAL_SIMULATE="generic-npu,quantum-npu"), cwd=ROOT)
    assert "codes 2 2 2" in out.stdout and "api raised InvalidArgument" in out.stdout, out.stdout + out.stderr
    lines = [x for x in out.stderr.splitlines() if x.startswith("onnxhal:")]
    assert len(lines) == 3
    for line in lines:
        assert "ONNXHAL_SIMULATE='generic-npu,quantum-npu'" in line and "'quantum-npu'" in line
        assert ", ".join(shipped_profiles()) in line and "fix or unset ONNXHAL_SIMULATE" in line
