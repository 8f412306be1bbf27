"""RunOptions.terminate stops a run inside Loop, Scan and If bodies, as onnxruntime's "Exiting due to
terminate flag": a flag read only between the main graph's nodes would leave an endless Loop
running for ever. The runs are made in a child process, so that a regression fails the test (by its
timeout) instead of spinning for ever in the test run."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.hostile_models import ROOT
from tests.models import make, vi


def endless_loop() -> onnx.ModelProto:
    """Loop with no trip count and a condition the body keeps true: y = x + 1 + 1 + ..."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"]), helper.make_node("Add", ["v_in", "one"], ["v_out"])],
        "body", [vi("i", [], TensorProto.INT64), vi("c_in", [], TensorProto.BOOL), vi("v_in", [2])],
        [vi("c_out", [], TensorProto.BOOL), vi("v_out", [2])],
        [onnx.numpy_helper.from_array(np.ones(2, np.float32), "one")])
    loop = helper.make_node("Loop", ["", "go", "x"], ["y"], name="forever", body=body)
    return make([loop], [vi("go", [], TensorProto.BOOL), vi("x", [2])], [vi("y", None)])


def long_scan() -> onnx.ModelProto:
    """Scan over the 2**22 rows of its input, summing them into its state."""
    body = helper.make_graph([helper.make_node("Add", ["s", "r"], ["s2"])], "body", [vi("s", [2]), vi("r", [2])],
                             [vi("s2", [2])])
    scan = helper.make_node("Scan", ["s0", "xs"], ["sf"], name="long", body=body, num_scan_inputs=1)
    return make([scan], [vi("s0", [2]), vi("xs", [None, 2])], [vi("sf", None)])


def if_around_endless_loop() -> onnx.ModelProto:
    inner = endless_loop().graph
    then = helper.make_graph(list(inner.node), "then", [], [vi("y", None)])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["z"])], "else", [], [vi("z", None)])
    node = helper.make_node("If", ["go"], ["out"], name="branch", then_branch=then, else_branch=other)
    return make([node], [vi("go", [], TensorProto.BOOL), vi("x", [2])], [vi("out", None)])


_CHILD = """
import json, sys, threading, time
import numpy as np
sys.path.insert(0, {root!r})
import onnxhal
from tests import test_terminate_in_subgraphs as t
model = getattr(t, {name!r})()
sess = onnxhal.InferenceSession(model)
feeds = {{"go": np.array(True), "x": np.zeros(2, np.float32), "s0": np.zeros(2, np.float32),
          "xs": np.ones((2**22, 2), np.float32)}}
feeds = {{k: v for k, v in feeds.items() if k in [i.name for i in sess.get_inputs()]}}
ro = onnxhal.RunOptions()
threading.Timer(0.3, lambda: setattr(ro, "terminate", True)).start()
t0 = time.perf_counter()
try:
    sess.run(None, feeds, ro)
    outcome, message = "completed", ""
except Exception as e:
    outcome, message = type(e).__name__, str(e)
ro.terminate = False
ok = sess.run(None, {{k: v[:3] if k == "xs" else v for k, v in feeds.items() if k != "go"}} | ({{"go": np.array(False)}} if "go" in feeds else {{}}))
print(json.dumps([outcome, message, time.perf_counter() - t0, np.asarray(ok[0]).tolist()]))
"""


@pytest.mark.parametrize("name", ["endless_loop", "long_scan", "if_around_endless_loop"])
def test_terminate_stops_a_run_inside_a_subgraph(name):
    code = _CHILD.format(root=ROOT, name=name)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    outcome, message, seconds, after = json.loads(proc.stdout.strip().splitlines()[-1])
    assert outcome == "Terminated" and message.startswith("Exiting due to terminate flag"), (outcome, message)
    assert seconds < 10
    # The session stays usable: the next run, with the flag cleared, completes.
    assert after == ([3.0, 3.0] if name == "long_scan" else [0.0, 0.0])

