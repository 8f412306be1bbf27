"""ONNX's backend node cases of ai.onnx Attention (opset 23 on) with the OpenCL EP's cost rule off,
so that its Attention kernel (runtime/providers/opencl/onnx_attention_lowering.py) computes every
form it claims against the cases' expected outputs; the forms it declines (softcap, the scores
output, nonpad_kv_seqlen, windows, float16/bfloat16) fall back to the CPU EP with their reason."""

from __future__ import annotations

import warnings

import pytest

pytest.importorskip("pyopencl")

import onnxhal  # noqa: E402
from tests.opencl_support import require_opencl  # noqa: E402
from tests.test_node_conformance import CASES, EXPECTED_FAILURES, _to_value, assert_similar  # noqa: E402

OPENCL_INDEX = require_opencl(module_level=True)
PROVIDERS = [("OpenCLExecutionProvider", {"cost_rule": "off"}), "CPUExecutionProvider"]
ATTENTION_CASES = [c for c in CASES if c.name.startswith("test_attention") and "expanded" not in c.name
                   and c.name not in EXPECTED_FAILURES]
#: what the EP may decline an Attention node for (anything else is a regression)
DECLINED = ("qk_matmul_output", "nonpad_kv_seqlen", "softcap", "window", "float16", "bfloat16")


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in ATTENTION_CASES])
def test_attention_case_on_opencl(case) -> None:
    sess = onnxhal.InferenceSession(case.model.SerializeToString(), providers=PROVIDERS)
    names = [i.name for i in case.model.graph.input]
    for inputs, outputs in case.data_sets:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            got = sess.run(None, dict(zip(names, (_to_value(x) for x in inputs))))
        for want, o in zip([_to_value(x) for x in outputs], got, strict=True):
            assert_similar(want, o, case.rtol, case.atol)
    ep = sess.eps["OpenCLExecutionProvider"]
    if sess.partition_summary.get("OpenCLExecutionProvider"):
        for info in ep.dynamic_partitions.values():  # computed on the device, not on the host
            assert not info.stats.host_runs, info.stats.host_reasons
    else:
        (reason,) = ep.declined.values()
        assert any(word in reason for word in DECLINED), reason


def test_the_attention_cases_were_found() -> None:
    assert len(ATTENTION_CASES) >= 40  # the onnx package's cases were found
