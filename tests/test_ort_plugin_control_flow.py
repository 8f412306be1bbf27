"""Control flow, unshaped values and constants inside real onnxruntime through onnxhal's plugin
library (``tests/ort_bridge_control_flow.py``; each check in a subprocess, as test_ort_plugin.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.interrupts import sigint_default

pytest.importorskip("onnxruntime")
import onnxruntime  # noqa: E402

ORT_VERSION = tuple(int(x) for x in onnxruntime.__version__.split(".")[:2])
# The policies pick a simulated device only where onnxruntime has virtual devices.
needs_virtual = pytest.mark.skipif(ORT_VERSION < (1, 24), reason="virtual hardware devices need onnxruntime 1.24")

ROOT = Path(__file__).resolve().parent.parent
PROFILE = {"PREFER_GPU": "generic-gpu", "PREFER_NPU": "generic-npu"}


def run_check(name: str, timeout: float = 300, env: dict | None = None) -> dict:
    done = subprocess.run([sys.executable, "-m", "tests.ort_bridge_control_flow", name], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})},
                          preexec_fn=sigint_default)
    assert done.returncode == 0, f"check {name} exited with {done.returncode}:\n{done.stderr[-4000:]}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["stderr"] = done.stderr
    return result


def assert_matches(r: dict, case: str, device_nodes: set[str]) -> None:
    """Every policy ran ``case`` within its profile's tolerance of onnxruntime's CPU EP, with at least
    ``device_nodes`` on the simulated device."""
    for policy, cell in r[case].items():
        assert cell["error"] is None, f"{case} under {policy}: {cell['error']}\n{cell.get('trace', '')}"
        rtol, atol = r["tolerance"][PROFILE[policy]]
        assert cell["err"] <= atol + rtol * cell["scale"], (case, policy, cell)
        assert device_nodes <= set(cell["device_nodes"]), (case, policy, cell["device_nodes"])


@pytest.fixture(scope="module")
def control_flow() -> dict:
    return run_check("control_flow")


@needs_virtual
def test_if_branches_read_initializers_of_the_enclosing_graph(control_flow):
    # onnxruntime neither lists 'w' among a branch's initializers nor feeds it to the fused node.
    assert_matches(control_flow, "outer_initializer", {"then_add", "then_mul", "else_sub", "else_mul"})


@needs_virtual
def test_if_bodies_on_the_host_backend():
    # With no usable OpenCL driver the simulated devices run partitions with the CPU EP's kernels,
    # planned at Compile: there the missing outer initializer was issue 42's "OrtEp::Compile: Fail:
    # graph '...': value '...' is read before it is produced".
    r = run_check("control_flow", env={"ONNXHAL_OPENCL": "off"})
    assert_matches(r, "outer_initializer", {"then_add", "then_mul", "else_sub", "else_mul"})
    assert_matches(r, "nested_constants", {"inner_then_mul", "inner_else_sub", "inner_else_mul"})


@needs_virtual
def test_nested_if_reads_constants_of_the_enclosing_branch(control_flow):
    assert_matches(control_flow, "nested_constants", {"inner_then_mul", "inner_else_sub", "inner_else_mul"})


@needs_virtual
def test_a_value_declared_without_shape_is_unknown_not_a_scalar(control_flow):
    # Its readers stay on the CPU EP (both profiles need known shapes); the shaped branch-free Relu
    # still runs on the device.
    assert_matches(control_flow, "unshaped_values", {"shaped_relu"})
    for cell in control_flow["unshaped_values"].values():
        assert not {"neg", "add", "then_relu", "else_sum"} & set(cell["device_nodes"])


@needs_virtual
def test_string_constants_leave_the_rest_of_the_graph_to_the_device(control_flow):
    # A string initializer, Constant nodes (main graph and If branches): read, never offered to a
    # partition, and no GetCapability error; the float nodes beside them run on the device.
    assert_matches(control_flow, "string_constants", {"add", "relu"})
    assert "GetCapability" not in control_flow["stderr"], control_flow["stderr"][-2000:]


@needs_virtual
def test_unshaped_values_never_reach_a_lowering_as_scalars(control_flow):
    # A Transpose read a value of no declared shape as rank 0: "declines 10 node(s) (Add, Div, ...,
    # Transpose): list index out of range" as written, ZeroDivisionError failing GetCapability once
    # onnxruntime fused the LayerNormalization.
    for case in ("unshaped_layer_norm", "unshaped_layer_norm_as_written"):
        assert_matches(control_flow, case, set())
    assert not [line for line in control_flow["log"] if "out of range" in line or "internal error" in line], \
        control_flow["log"]
    assert "GetCapability" not in control_flow["stderr"], control_flow["stderr"][-2000:]


@needs_virtual
def test_groups_that_would_fuse_into_a_cycle_are_checked_together():
    # Each group alone is convex; together they would make onnxruntime's graph cyclic ("the graph is
    # not acyclic" failed the session). The later group is left to the CPU EP, as in onnxhal.
    r = run_check("cyclic_claims")
    assert r["bridge"]["error"] is None, r["bridge"]["error"]
    assert r["bridge"]["err"] == 0.0 and r["onnxhal"]["err"] == 0.0
    assert r["bridge"]["groups"] == r["onnxhal"]["groups"] == [["a1", "a2"]]
    assert any("not claiming 'b1', 'b2'" in line for line in r["log"]), r["log"]


def test_claims_in_the_main_graph_and_in_subgraphs_of_one_session():
    # onnxruntime 1.23 numbers fused groups per graph, so claims in two graphs got one kernel name
    # and session creation failed ("Failed to add kernel ... Conflicting with a registered kernel").
    r = run_check("explicit_devices")
    cells = {k: v for k, v in r.items() if "/" in k}
    for key, cell in cells.items():
        assert cell["error"] is None, f"{key}: {cell['error']}"
        rtol, atol = r["tolerance"][key.split("/")[1]]
        assert cell["err"] <= atol + rtol * cell["scale"], (key, cell)
    one_graph = [line for line in r["log"] if "one kernel name" in line]
    assert bool(one_graph) == (ORT_VERSION < (1, 24)), one_graph


@needs_virtual
def test_the_devices_decline_conv_nodes_onnxruntime_refuses():
    # Channels that do not match the weight and group, a kernel_shape that is not the weight's, a bias
    # of the wrong length: the simulated devices computed an answer where onnxruntime fails.
    r = run_check("invalid_convs")
    r.pop("stderr")
    assert len(r) == 5
    refused = 0
    for name, cells in r.items():
        refused += bool(cells["CPU"]["raised"])
        for policy in ("PREFER_GPU", "PREFER_NPU"):
            # the node stays with onnxruntime's CPU EP, which then answers as it answers alone
            assert cells[policy]["eps"] == ["CPUExecutionProvider"], (name, policy, cells[policy])
            assert bool(cells[policy]["raised"]) == bool(cells["CPU"]["raised"]), (name, policy)
    # onnxruntime before 1.30 runs a Conv whose bias has the wrong length; it refuses the other four
    assert refused >= (5 if ORT_VERSION >= (1, 30) else 4), r


@needs_virtual
def test_ctrl_c_during_a_run_is_a_keyboard_interrupt_where_run_returns():
    # It was onnxruntime's Fail: the KeyboardInterrupt aborted a Compute callback.
    import signal
    import time

    child = subprocess.Popen([sys.executable, "-m", "tests.ort_bridge_control_flow", "interrupted_runs"], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=sigint_default)
    try:
        assert child.stdout.readline().strip() == "READY"
        time.sleep(1.0)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=120)
    finally:
        child.kill()
    assert child.returncode == 0, err[-3000:]
    r = json.loads(out.strip().splitlines()[-1])
    assert r["raised"] == "KeyboardInterrupt" and r["handler_restored"], r


@needs_virtual
def test_a_failed_run_leaves_the_sigint_handler_as_it_was():
    r = run_check("handler_after_failed_run")
    assert r["failed"] and r["handler_restored"], r
