"""The onnxhal command line: devices (tables and JSON), run, partition (SVG), demo, --version."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest

import onnxhal
from onnxhal.cli import main
from tests.models import add_mul_model


def test_devices_json_matches_the_api(capsys):
    assert main(["devices", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"hardware_devices", "ep_devices", "opencl"}
    hw = data["hardware_devices"]
    assert hw[0]["type"] == "CPU"
    assert set(hw[0]) == {"type", "vendor", "vendor_id", "device_id", "metadata"}
    api_hw = onnxhal.get_hardware_devices()[0]
    assert (hw[0]["vendor"], hw[0]["vendor_id"], hw[0]["device_id"]) == (api_hw.vendor, api_hw.vendor_id, api_hw.device_id)
    ep = data["ep_devices"][0]
    assert {"ep_name", "ep_vendor", "ep_metadata", "ep_options", "device"} <= set(ep)
    assert ep["ep_name"] == "CPUExecutionProvider" and ep["device"]["type"] == "CPU"
    assert ep["ep_metadata"]["version"] == "0.1.0"


def test_devices_tables(capsys):
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    assert "Hardware devices" in out and "EP devices" in out and "CPUExecutionProvider" in out


def test_devices_show_each_opencl_device_state_and_the_remedy(capsys):
    from onnxhal.devices.opencl import enumerate_opencl_devices

    assert main(["devices", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["opencl"]
    records = enumerate_opencl_devices()
    assert [d["index"] for d in report["devices"]] == [f"{r.platform_index}:{r.device_index}" for r in records]
    for d, r in zip(report["devices"], records):
        assert d["state"] == ("usable" if r.probe.usable else "failed probe") and d["reason"] == r.probe.reason
    assert report["usable"] == any(r.probe.usable for r in records)
    assert bool(report["remedy"]) == (not report["usable"])
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    for r in records:
        assert r.device_name in out and ("usable" if r.probe.usable else r.probe.reason[:30]) in out
    if not report["usable"]:
        assert "Optional: without one, the simulated devices run on the host backend" in out.replace("\n", " ")


def test_run_prints_partition_outputs_and_latency(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(add_mul_model(), path)
    np.savez(tmp_path / "in.npz", x=np.ones((2, 3), np.float32))
    assert main(["run", str(path), "--inputs", str(tmp_path / "in.npz"), "--repeat", "3"]) == 0
    out = capsys.readouterr().out
    assert "CPUExecutionProvider" in out and "latency over 3 runs" in out
    assert "5" in out  # ((1 + 1) * 2) + 1 = 5 everywhere: min = max = mean = 5


def test_partition_svg(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(add_mul_model(), path)
    svg = tmp_path / "p.svg"
    assert main(["partition", str(path), "--policy", "prefer_npu", "--svg", str(svg)]) == 0
    text = svg.read_text()
    assert text.startswith("<svg") and text.count("<rect") >= 3 and "CPUExecutionProvider" in text


def test_errors_are_reported_not_raised(tmp_path, capsys):
    assert main(["run", str(tmp_path / "missing.onnx")]) == 2
    assert "NoSuchFile" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["run", "x.onnx", "--policy", "fastest"])


def test_demo_and_version_as_a_user_runs_them():
    demo = subprocess.run([sys.executable, "-m", "onnxhal", "demo"], capture_output=True, text=True, timeout=120)
    assert demo.returncode == 0, demo.stderr
    assert "PREFER_NPU selected providers" in demo.stdout and "OK" in demo.stdout
    version = subprocess.run([sys.executable, "-m", "onnxhal", "--version"], capture_output=True, text=True)
    assert version.stdout.strip() == f"onnxhal {onnxhal.__version__}"
