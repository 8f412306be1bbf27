"""The per-run path: shape values computed once per input shape (runtime/session/shape_memo.py), feed
checks from tuples built once (runtime/input_checks.FeedChecker), under threads and bad input."""

from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxhal
from onnxhal import errors
from onnxhal.runtime.session.shape_memo import ShapeMemo
from tests.models import make, vi


def _flatten_model() -> onnx.ModelProto:
    """y = Reshape(Relu(x), [shape(x)[0], -1]); n = shape(x)[1] * 10 (a shape value as an output)."""
    inits = [onnx.numpy_helper.from_array(np.array(0, np.int64), "i"),
             onnx.numpy_helper.from_array(np.array([0], np.int64), "axes"),
             onnx.numpy_helper.from_array(np.array([-1], np.int64), "rest"),
             onnx.numpy_helper.from_array(np.array(1, np.int64), "one"),
             onnx.numpy_helper.from_array(np.array(10, np.int64), "ten")]
    nodes = [helper.make_node("Relu", ["x"], ["h"], name="relu"),
             helper.make_node("Shape", ["h"], ["s"], name="shape"),
             helper.make_node("Gather", ["s", "i"], ["b"], name="pick", axis=0),
             helper.make_node("Unsqueeze", ["b", "axes"], ["b1"], name="unsq"),
             helper.make_node("Concat", ["b1", "rest"], ["target"], name="cat", axis=0),
             helper.make_node("Reshape", ["h", "target"], ["y"], name="reshape"),
             helper.make_node("Gather", ["s", "one"], ["seq"], name="pick_seq", axis=0),
             helper.make_node("Mul", ["seq", "ten"], ["n"], name="times_ten")]
    return make(nodes, [vi("x", ["batch", "seq", 4])],
                [vi("y", ["batch", None]), vi("n", [], TensorProto.INT64)], inits)


def _memos(session: onnxhal.InferenceSession) -> list[ShapeMemo]:
    return [f for f in session.plan.generated.fns if isinstance(f, ShapeMemo)]


def test_shape_values_follow_the_input_shape_and_are_computed_once_per_shape():
    s = onnxhal.InferenceSession(_flatten_model().SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for shape in [(2, 3, 4), (5, 1, 4), (2, 3, 4), (1, 7, 4)] * 2:
        x = rng.normal(size=shape).astype(np.float32)
        y, n = s.run(None, {"x": x})
        np.testing.assert_array_equal(y, np.maximum(x, 0).reshape(shape[0], -1))
        assert n == shape[1] * 10
    memos = _memos(s)
    assert memos, "the Shape -> Gather -> Unsqueeze -> Concat chain is not in a shape memo"
    # one entry per distinct input shape: the region's kernels ran three times, not eight
    assert {len(m.cache) for m in memos} == {3}


def test_a_shape_value_returned_as_an_output_is_the_callers_to_change():
    s = onnxhal.InferenceSession(_flatten_model().SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.ones((2, 3, 4), np.float32)
    n = s.run(["n"], {"x": x})[0]
    n[...] = 99  # an output is the caller's array, not the memo's cached value
    assert s.run(["n"], {"x": x})[0] == 30


def test_a_failing_shape_node_is_named_in_the_error_at_every_run():
    """r = Range(0, 3, shape(x)[0] - 4): a zero step for a batch of 4, known only at run."""
    inits = [onnx.numpy_helper.from_array(np.array(v, np.int64), n)
             for n, v in (("zero", 0), ("first", 0), ("three", 3), ("four", 4))]
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Gather", ["s", "first"], ["b"], name="pick", axis=0),
             helper.make_node("Sub", ["b", "four"], ["delta"], name="minus_four"),
             helper.make_node("Range", ["zero", "three", "delta"], ["r"], name="steps")]
    model = make(nodes, [vi("x", ["batch"])], [vi("r", [None], TensorProto.INT64)], inits)
    s = onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for _ in range(2):
        np.testing.assert_array_equal(s.run(None, {"x": np.ones(5, np.float32)})[0], [0, 1, 2])
        with pytest.raises(errors.OrtError, match="Range node 'steps'"):
            s.run(None, {"x": np.ones(4, np.float32)})


def test_threads_with_different_shapes_agree():
    s = onnxhal.InferenceSession(_flatten_model().SerializeToString(), providers=["CPUExecutionProvider"])
    failures: list[str] = []

    def work(t: int) -> None:
        rng = np.random.default_rng(t)
        for k in range(40):
            shape = (1 + (t + k) % 4, 1 + k % 5, 4)
            x = rng.normal(size=shape).astype(np.float32)
            y, n = s.run(None, {"x": x})
            if not (np.array_equal(y, np.maximum(x, 0).reshape(shape[0], -1)) and n == shape[1] * 10):
                failures.append(f"thread {t} shape {shape}")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not failures


@pytest.mark.parametrize("feed, words", [
    ({"x": np.ones((2, 3, 4), np.float64)}, "wrong element type"),
    ({"x": np.ones((2, 3), np.float32)}, "rank 2 where the model wants rank 3"),
    ({"x": np.ones((2, 3, 5), np.float32)}, "dimension 2 must be 4"),
    ({"x": np.ones((2, 3, 4), np.float32), "z": np.ones(1, np.float32)}, "Invalid input name: 'z'"),
    ({}, r"Required inputs \(\['x'\]\) are missing from input feed \(\[\]\)"),
    ({"x": [[1.0] * 4]}, "rank 2 where the model wants rank 3"),
    ({"x": (1.0, 2.0)}, "expects a numpy array"),
])
def test_bad_feeds_after_good_runs_are_refused_typed(feed, words):
    s = onnxhal.InferenceSession(_flatten_model().SerializeToString(), providers=["CPUExecutionProvider"])
    s.run(None, {"x": np.ones((2, 3, 4), np.float32)})
    with pytest.raises(errors.InvalidArgument, match=words):
        s.run(None, feed)
    assert s.run(["n"], {"x": np.ones((2, 3, 4), np.float32)})[0] == 30  # still usable


def test_output_names_are_checked_at_every_run():
    s = onnxhal.InferenceSession(_flatten_model().SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.ones((2, 3, 4), np.float32)
    assert s.run(["n", "y"], {"x": x})[0] == 30
    with pytest.raises(errors.InvalidArgument, match="Invalid output name: 'q'"):
        s.run(["n", "q"], {"x": x})


def test_every_way_to_call_run_gives_the_same_outputs(tmp_path):
    """A session's plain run(None, feeds) skips what only options, output names, profiling or a
    verbose log need; each of those routes, before and after profiling ends, gives the same
    outputs, owned by the caller."""
    opts = onnxhal.SessionOptions()
    opts.enable_profiling = True
    opts.profile_file_prefix = str(tmp_path / "p")
    s = onnxhal.InferenceSession(_flatten_model().SerializeToString(), opts, providers=["CPUExecutionProvider"])
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 10
    want = [np.maximum(x, 0).reshape(2, -1), np.array(30, np.int64)]
    ro = onnxhal.RunOptions()
    for stage in ("profiling", "after"):
        results = [s.run(None, {"x": x}), s.run(None, {"x": x}), s.run(["y", "n"], {"x": x}),
                   s.run(None, {"x": x}, ro), s.run([], {"x": x})]
        for got in results:
            assert [g.tolist() for g in got] == [w.tolist() for w in want], stage
            assert all(g.flags.writeable and not np.shares_memory(g, x) for g in got)
        if stage == "profiling":
            assert s.end_profiling()
    verbose = onnxhal.SessionOptions()
    verbose.log_severity_level = 0
    v = onnxhal.InferenceSession(_flatten_model().SerializeToString(), verbose, providers=["CPUExecutionProvider"])
    for _ in range(2):
        assert [g.tolist() for g in v.run(None, {"x": x})] == [w.tolist() for w in want]
