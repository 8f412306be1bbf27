"""Every ONNX backend node case that passes on the CPU EP also passes with providers
["OpenCLExecutionProvider", "CPUExecutionProvider"]: what the OpenCL EP claims must compute what
the CPU EP computes (the oracle), and what it declines must fall back cleanly."""

from __future__ import annotations

import warnings

import pytest

import onnxhal
from tests.test_node_conformance import CASES, EXPECTED_FAILURES, _to_value, assert_similar

PROVIDERS = ["OpenCLExecutionProvider", "CPUExecutionProvider"]
_ON_OPENCL: dict[str, int] = {}


def run_case_on_opencl(case) -> int:
    """Run the case with the OpenCL EP first; returns how many nodes the OpenCL EP took."""
    so = onnxhal.SessionOptions()
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    sess = onnxhal.InferenceSession(case.model.SerializeToString(), so, providers=PROVIDERS)
    names = [i.name for i in case.model.graph.input]
    for inputs, outputs in case.data_sets:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            got = sess.run(None, dict(zip(names, (_to_value(x) for x in inputs))))
        expected = [_to_value(x) for x in outputs]
        assert len(got) == len(expected)
        for r, o in zip(expected, got):
            assert_similar(r, o, case.rtol, case.atol)
    return sess.partition_summary.get("OpenCLExecutionProvider", 0)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in CASES if c.name not in EXPECTED_FAILURES])
def test_node_case_with_opencl(case, opencl_devices) -> None:
    _ON_OPENCL[case.name] = run_case_on_opencl(case)


def test_opencl_took_part(opencl_devices) -> None:
    """The sweep above is only meaningful if the OpenCL EP actually ran a good share of the cases."""
    if len(_ON_OPENCL) < len(CASES) // 2:
        pytest.skip("run together with test_node_case_with_opencl to count the cases on OpenCL")
    claimed = sum(1 for n in _ON_OPENCL.values() if n > 0)
    print(f"\nOpenCL EP ran nodes in {claimed} of {len(_ON_OPENCL)} node cases; all matched the CPU EP")
    assert claimed >= 150
