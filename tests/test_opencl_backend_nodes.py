"""ONNX's backend node test cases with providers [OpenCL, CPU] must give the CPU EP's results.

Only cases containing an op the OpenCL EP has a kernel for are run (the rest never reach it). A
case the CPU EP itself cannot run is skipped with that reason. Marked ``slow`` (about 780 cases,
~40 s with a warm program cache on 2 cores): a quick run excludes it with ``-m "not slow"``.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("pyopencl")
import pyopencl as cl  # noqa: E402
from onnx.backend.test.case.node import collect_testcases  # noqa: E402

import onnxhal  # noqa: E402
from onnxhal.runtime.providers.opencl.op_support import SUPPORTED_OPS  # noqa: E402

pytestmark = pytest.mark.slow

if not cl.get_platforms():
    pytest.skip("no OpenCL platform on this machine", allow_module_level=True)

CASES = [c for c in collect_testcases() if any(n.op_type in SUPPORTED_OPS for n in c.model.graph.node)]


@pytest.fixture(scope="module")
def opencl_library():
    onnxhal.register_execution_provider_library("opencl_backend_nodes", "onnxhal.runtime.providers.opencl")
    yield
    onnxhal.unregister_execution_provider_library("opencl_backend_nodes")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_backend_node_case_matches_cpu(opencl_library, case):
    model = case.model.SerializeToString()
    inputs, _ = case.data_sets[0]
    feeds = dict(zip([i.name for i in case.model.graph.input][:len(inputs)], inputs))
    try:
        expected = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    except Exception as exc:  # noqa: BLE001 - any CPU failure means there is nothing to compare with
        pytest.skip(f"the CPU EP cannot run this case: {type(exc).__name__}")
    got = onnxhal.InferenceSession(model, providers=["OpenCLExecutionProvider", "CPUExecutionProvider"]).run(
        None, feeds)
    for g, e in zip(got, expected):
        g, e = np.asarray(g), np.asarray(e)
        assert g.shape == e.shape and g.dtype == e.dtype
        if e.dtype.kind == "f":
            np.testing.assert_allclose(g, e, rtol=1e-3, atol=1e-4, equal_nan=True)
        else:
            np.testing.assert_array_equal(g, e)
