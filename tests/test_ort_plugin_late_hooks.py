"""OrtEpFactory / OrtEp members of onnxruntime 1.24 and later that reach a hal library's hooks inside
real onnxruntime: the factory's custom-op domains (``EpFactory.get_custom_op_domains``, 1.24) and the
EP's free device memory (``Ep.get_available_resource``, onnxruntime's ``GetAvailableResource``,
1.26). Each check in its own process (tests/ort_bridge_late_hooks.py)."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")
import onnxruntime  # noqa: E402

from onnxhal.ort_plugin.adapter import RESOURCE_TOTAL_BYTES, ResourceCount  # noqa: E402
from onnxhal.ort_plugin.custom_ops import CustomOpStruct  # noqa: E402
from onnxhal.ort_plugin.ep_struct_table import ORT_EP, ORT_EP_FACTORY  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
API = int(onnxruntime.__version__.split(".")[1])


def run_check(name: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "tests.ort_bridge_late_hooks", name], cwd=ROOT, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, f"check {name} exited with {done.returncode}:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_struct_layouts_match_onnxruntimes_header():
    # onnxruntime_c_api.h: OrtCustomOp is a uint32 version and 25 function pointers; onnxruntime_ep_c_api.h
    # asserts sizeof(OrtResourceCount) == 56.
    assert ctypes.sizeof(CustomOpStruct) == 8 + 25 * 8
    assert ctypes.sizeof(ResourceCount) == 56 and ResourceCount.total_bytes.offset == 8 and RESOURCE_TOTAL_BYTES == 1
    assert dict(ORT_EP)["GetAvailableResource"] == 26
    assert dict(ORT_EP_FACTORY)["GetNumCustomOpDomains"] == dict(ORT_EP_FACTORY)["GetCustomOpDomains"] == 24


def test_a_factorys_custom_ops_run_inside_onnxruntime():
    r = run_check("custom_ops")
    not_registered = "com.example:Triple(-1) is not a registered function/op"
    assert not_registered in r["cpu_only"]  # without the library's EP, onnxruntime knows no such op
    if API < 24:  # OrtEpFactory has no GetCustomOpDomains before 1.24: the ops cannot reach onnxruntime
        assert not_registered in r["explicit"]["error"]
        return
    explicit = r["explicit"]
    assert explicit["error"] is None
    # onnxruntime's CPU EP runs the ops with the hal kernels, agreeing with the same computation in
    # standard ops on onnxruntime's CPU EP
    assert explicit["max_abs_err"] <= 1e-6
    if API >= 25:  # get_provider_graph_assignment_info: onnxruntime 1.25 on
        assert explicit["assignment"] == {"CPUExecutionProvider": ["relu", "scale_shift", "triple"]}
    # the node create_kernel gets: onnxruntime's names and the attributes read by name
    assert explicit["created"] == [
        ["triple", "com.example", ["x"], ["t"], {}],
        ["scale_shift", "com.example", ["r"], ["y"],
         {"alpha": 0.5, "beta": 1.25, "tag": "hi", "axes": [1, 2], "missing_in": False}]]
    # an op that names the library's EP: the EP claims it (get_capability) and runs it; the other
    # custom op on onnxruntime's CPU EP
    on_ep = r["on_ep"]
    assert on_ep["error"] is None and on_ep["max_abs_err"] == 0.0
    assert sorted(on_ep["created"]) == ["ep_triple", "triple"]
    if API >= 25:
        assert on_ep["assignment"] == {"CustomOpsExecutionProvider": ["ep_triple"], "CPUExecutionProvider": ["triple"]}
    # typed errors are onnxruntime's errors, with onnxhal's message: the kernel's own, an attribute
    # first read after create_kernel (onnxruntime's kernel info is gone), an output of another type
    compute = "onnxhal OrtCustomOp::KernelComputeV2: InvalidArgument: "
    assert compute + "Fails: this kernel refuses every input; use Triple" in r["Fails"]
    assert (compute + "custom op 'LateAttribute' (node 'lateattribute'): attribute 'alpha' was first read after "
            "create_kernel returned") in r["LateAttribute"]
    assert (compute + "custom op 'AsDouble' (node 'asdouble'): output 0 ('y') is float64 but onnxruntime typed it "
            "float32") in r["AsDouble"]
    # with a selection policy onnxruntime does not ask the factories for their domains (observed on
    # 1.24-1.32: no GetNumCustomOpDomains call), where onnxhal's own session gives them
    assert not_registered in r["policy"]["error"]


def test_onnxruntime_budgets_partitioning_with_the_eps_available_resource():
    r = run_check("available_resource")
    budgets = r["budgets"]
    if API < 26:  # no GetAvailableResource member: never asked, no budget from the device
        assert all(b["asked"] == [] for b in budgets.values()), budgets
        return
    everything = {"CUDAExecutionProvider": ["add0", "add1", "add2", "add3"]}
    assert budgets["None"]["asked"] == [None] and budgets["None"]["assignment"] == everything
    # onnxruntime estimates each Add at 3,072 bytes (1 KiB of weight, 1 KiB of output, and half of
    # that again for workspace) and assigns nodes in order while the sum fits the EP's answer
    expect = {"0": 0, "3072": 1, "6144": 2, "9216": 3, "12288": 4, "1000000000": 4}
    for budget, taken in expect.items():
        b = budgets[budget]
        assert b["error"] is None and b["asked"] == [int(budget)], b
        on_ep = b["assignment"].get("CUDAExecutionProvider", [])
        assert on_ep == [f"add{i}" for i in range(taken)], (budget, b)
        assert b["max_abs_err"] == 0.0
    # an answer that is no byte count: onnxhal's typed error, which onnxruntime logs; no budget then
    assert r["negative"]["asked"] == [-5] and r["negative"]["error"] is None
    assert r["negative"]["assignment"] == everything
