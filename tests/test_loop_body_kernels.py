"""Loop bodies as exporters write them: Slices whose starts and ends are Unsqueezes of the iteration
number or of outer-scope scalars (new arrays every iteration), Unsqueezes of values whose shape
changes from one iteration to the next, Gathers at the iteration number. The CPU kernels keep what
they derive per input shape and parameter values; these check, against onnxruntime, that what is
kept is taken only where it applies, with and without RunOptions (which give a subgraph the run
function that checks the terminate flag)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument

import onnxhal
from onnxhal import errors
from tests.models import make, vi

INT = TensorProto.INT64


def _const(name: str, value) -> helper.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value), name + "_v"))


def sliding_window_loop() -> helper.ModelProto:
    """Per iteration i: x[:, i:i+w] (starts, ends: Unsqueezes of i and of i + w, w an outer-scope
    scalar), its row sums as a scan output; a carried value that grows by one column per iteration,
    unsqueezed and summed; Gather of x's row at i mod 2."""
    nodes = [
        _const("axes0", np.array([0], np.int64)), _const("axis1", np.array([1], np.int64)),
        _const("two", np.array(2, np.int64)),
        helper.make_node("Unsqueeze", ["i", "axes0"], ["start"], name="u_start"),
        helper.make_node("Add", ["i", "w"], ["i_end"]),
        helper.make_node("Unsqueeze", ["i_end", "axes0"], ["end"], name="u_end"),
        helper.make_node("Slice", ["x", "start", "end", "axis1"], ["window"], name="window"),
        helper.make_node("ReduceSum", ["window", "axis1"], ["wsum"], keepdims=0),
        helper.make_node("Concat", ["grow_in", "wsum"], ["grow_out"], axis=0),
        helper.make_node("Unsqueeze", ["grow_out", "axes0"], ["grow_2d"], name="u_grow"),
        helper.make_node("ReduceSum", ["grow_2d"], ["grow_total"], keepdims=0),
        helper.make_node("Mod", ["i", "two"], ["row"]),
        helper.make_node("Gather", ["x", "row"], ["picked"], axis=0, name="pick"),
        helper.make_node("Identity", ["c_in"], ["c_out"]),
    ]
    body = helper.make_graph(
        nodes, "body", [vi("i", [], INT), vi("c_in", [], TensorProto.BOOL), vi("grow_in", [None])],
        [vi("c_out", [], TensorProto.BOOL), vi("grow_out", [None]), vi("wsum", [None]), vi("grow_total", []),
         vi("picked", [None])])
    loop = helper.make_node("Loop", ["trips", "", "g0"], ["grown", "sums", "totals", "rows"], name="slide", body=body)
    return make([loop], [vi("trips", [], INT), vi("x", [2, 12]), vi("w", [], INT), vi("g0", [None])],
                [vi("grown", None), vi("sums", None), vi("totals", None), vi("rows", None)])


@pytest.mark.parametrize("with_options", [False, True])
def test_a_loop_slicing_a_sliding_window_matches_onnxruntime(with_options):
    m = sliding_window_loop()
    feeds = {"trips": np.array(9, np.int64), "x": np.arange(24, dtype=np.float32).reshape(2, 12),
             "w": np.array(3, np.int64), "g0": np.zeros(0, np.float32)}
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    sess = onnxhal.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    options = onnxhal.RunOptions() if with_options else None
    for w in (3, 2, 3):  # the same body shapes with other slice bounds, then the first again
        feeds["w"] = np.array(w, np.int64)
        expected = ref.run(None, feeds)
        for _ in range(2):
            got = sess.run(None, feeds, options)
            for e, g in zip(expected, got):
                assert g.shape == e.shape
                np.testing.assert_allclose(g, e, rtol=1e-6)


def test_an_error_in_a_loop_body_names_its_node_under_run_options():
    """The Gather at row i goes out of range at iteration 2: the error names the Gather node, as
    without RunOptions."""
    m = sliding_window_loop()
    m.graph.node[0].attribute[0].g.node[11].CopyFrom(helper.make_node("Identity", ["i"], ["row"]))
    feeds = {"trips": np.array(4, np.int64), "x": np.ones((2, 12), np.float32), "w": np.array(3, np.int64),
             "g0": np.zeros(0, np.float32)}
    sess = onnxhal.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for options in (None, onnxhal.RunOptions()):
        with pytest.raises(errors.OrtError, match=r"Gather node 'pick'.*index 2 is out of range"):
            sess.run(None, feeds, options)
    with pytest.raises(InvalidArgument, match="Gather node. Name:'pick'"):
        ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)

