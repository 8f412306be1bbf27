"""What OpenCL sessions leave behind once dropped: nothing that grows with their number.

Issue 47 asked whether a late session's slow creation came from OpenCL objects the earlier ones
left (queues never finished, buffers, kernels, PoCL worker threads kept busy). They leave none:
these tests keep it so. (The cause was protobuf's periodic ``malloc_trim``: docs/opencl.md,
"Dynamic shapes", what a later session pays.)
"""

from __future__ import annotations

import gc
import os

import pytest

pytest.importorskip("pyopencl")
import pyopencl as cl  # noqa: E402

import onnxhal  # noqa: E402
from tests.opencl_support import require_opencl  # noqa: E402

require_opencl(module_level=True)

CORPUS = os.path.join(os.path.dirname(__file__), "real_models")
#: The OpenCL objects a session makes per stream, value or partition; a leak of any grows with
#: sessions. (Not events: pyopencl's are not tracked by the garbage collector, so never counted here.)
KINDS = (cl.CommandQueue, cl.Buffer, cl.Kernel)


def _live() -> dict[str, int]:
    gc.collect()
    counts = {k.__name__: 0 for k in KINDS}
    for o in gc.get_objects():
        for k in KINDS:
            if isinstance(o, k):
                counts[k.__name__] += 1
    counts["threads"] = len(os.listdir("/proc/self/task"))
    return counts


def _session_round(data: bytes, feeds: dict, cost_rule: str) -> None:
    so = onnxhal.SessionOptions()
    so.intra_op_num_threads = 1
    sess = onnxhal.InferenceSession(data, so, providers=[
        ("OpenCLExecutionProvider", {"cost_rule": cost_rule}), "CPUExecutionProvider"])
    assert sess.partition_summary.get("OpenCLExecutionProvider", 0) > 0
    sess.run(None, feeds)


@pytest.mark.parametrize("cost_rule", ["on", "off"])
def test_dropped_sessions_leave_no_opencl_objects_or_threads(cost_rule):
    from onnxhal.stored_outputs import read_signatures

    path = os.path.join(CORPUS, "resnet_ts.onnx")
    feeds, _ = read_signatures(path)["a"]
    with open(path, "rb") as f:
        data = f.read()
    for _ in range(2):  # the process's own: device context, its queue, idle kernels, PoCL's threads
        _session_round(data, feeds, cost_rule)
    before = _live()
    for _ in range(4):
        _session_round(data, feeds, cost_rule)
    after = _live()
    assert after == before, f"after 4 more sessions dropped: {after}, before: {before}"
