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
from onnxhal.hal.run_control import Terminated
from onnxhal.runtime.session.shape_memo import ShapeMemo
from tests.models import make, vi
from tests.threads import run_threads


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

    run_threads(work, 6)
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


def _outputs_model() -> onnx.ModelProto:
    """Outputs that a run must not hand over as computed: the feed itself, the same array twice,
    a view of the feed, a model constant; and one fresh array."""
    c = onnx.numpy_helper.from_array(np.array([1.0, 2.0, 3.0, 4.0], np.float32), "c")
    shape = onnx.numpy_helper.from_array(np.array([-1], np.int64), "flat")
    nodes = [helper.make_node("Identity", ["x"], ["same"], name="same"),
             helper.make_node("Add", ["x", "c"], ["sum"], name="add"),
             helper.make_node("Identity", ["sum"], ["sum_again"], name="again"),
             helper.make_node("Reshape", ["x", "flat"], ["flat_x"], name="view"),
             helper.make_node("Identity", ["c"], ["const"], name="const")]
    return make(nodes, [vi("x", [None, 4])], [vi("same", [None, 4]), vi("sum", [None, 4]), vi("sum_again", [None, 4]),
                                               vi("flat_x", [None]), vi("const", [4])], [c, shape])


@pytest.mark.parametrize("names", [None, ["same"], ["sum", "sum_again"], ["sum", "sum"], ["flat_x"], ["const"],
                                   ["sum", "const", "flat_x", "same"]])
def test_outputs_of_a_plain_run_are_the_callers_own_and_match_onnxruntime(names):
    """Each output that must be copied, alone (the run's quick test of the outputs must catch
    each) and among others."""
    ort = pytest.importorskip("onnxruntime")
    model = _outputs_model().SerializeToString()
    s = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"])
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    x = np.ones((2, 4), np.float32)  # owns its memory, as most callers' arrays
    x[1] = 2
    for _ in range(3):  # the first run takes the general run, the second prepares and takes the prepared one
        got = s.run(names, {"x": x})
        for g, w in zip(got, ref.run(names, {"x": x}), strict=True):
            np.testing.assert_array_equal(g, w)
        for i, g in enumerate(got):
            assert g.flags.writeable and not np.shares_memory(g, x)
            assert not any(np.shares_memory(g, h) for h in got[i + 1:])
            g[...] = -1  # changes nothing the session or the next run reads
    np.testing.assert_array_equal(s.run(["const"], {"x": x})[0], [1, 2, 3, 4])


def test_a_plain_run_checks_feeds_and_output_names_once_prepared(monkeypatch):
    """A run with no run options, or plain ones, whose feeds are arrays of the inputs' types passes
    its checks without the general check (FeedChecker.check) and without the plan's general run;
    any other feed still gets the general check and its typed error, and options set to terminate
    theirs."""
    from onnxhal.runtime.session.executor import ExecutionPlan
    from onnxhal.runtime.session.input_checks import FeedChecker

    s = onnxhal.InferenceSession(_flatten_model().SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.ones((2, 3, 4), np.float32)
    s.run(None, {"x": x})
    general = []
    real_check = FeedChecker.check
    monkeypatch.setattr(FeedChecker, "check", lambda self, feed: general.append("check") or real_check(self, feed))
    monkeypatch.setattr(ExecutionPlan, "run", lambda *a, **k: general.append("plan") or pytest.fail("general run"))
    for names in (None, [], ["n"], ["n", "y"]):
        for options in (None, onnxhal.RunOptions(), onnxhal.RunOptions()):
            assert s.run(names, {"x": x}, options)[0 if names != ["n", "y"] else 1].shape in ((2, 12), ())
    assert general == []
    stopped = onnxhal.RunOptions()
    stopped.terminate = True
    with pytest.raises(Terminated, match="RunOptions.terminate is set"):
        s.run(None, {"x": x}, stopped)
    with pytest.raises(errors.InvalidArgument, match="dimension 2 must be 4"):
        s.run(None, {"x": np.ones((2, 3, 5), np.float32)})
    with pytest.raises(errors.InvalidArgument, match="wrong element type"):
        s.run(None, {"x": np.ones((2, 3, 4), np.float32).astype(">f4")})
    with pytest.raises(errors.InvalidArgument, match="Invalid output name: 'q'"):
        s.run(["q"], {"x": x})
    assert general == ["check", "check"]


def test_threads_share_a_session_from_its_first_run():
    """Threads that start at once on a new session each prepare or take its prepared run."""
    model = _flatten_model().SerializeToString()
    for _ in range(3):
        s = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"])
        failures: list[str] = []
        start = threading.Barrier(4)

        def work(t: int, s=s, failures=failures, start=start) -> None:
            x = np.full((1 + t, 2, 4), t - 1.5, np.float32)
            start.wait()
            for _ in range(30):
                y, n = s.run(None, {"x": x})
                if not (np.array_equal(y, np.maximum(x, 0).reshape(1 + t, -1)) and n == 20):
                    failures.append(f"thread {t}")

        run_threads(work, 4)
        assert not failures


FAILING_EP = '''
import numpy as np

from onnxhal import hal
from onnxhal.hal.errors import EPFail

from onnxhal.hal.run_control import RUN_OPTIONS

STATE = {"fail": False, "runs": 0, "stop": False}


class _Relu(hal.Kernel):
    def compute(self, inputs):
        STATE["runs"] += 1
        if STATE["fail"]:
            raise EPFail("the device went away")
        if STATE["stop"]:  # as another thread would, while the run is inside this node
            RUN_OPTIONS.get().terminate = True
        return [np.maximum(inputs[0], 0)]


class FailingEp(hal.Ep):
    name = "FailingExecutionProvider"

    def get_capability(self, graph, support_info):
        for n in graph.nodes:
            if n.op_type == "Relu":
                support_info.add_single_node(n)

    def create_kernel(self, node, context):
        return _Relu()


class FailingFactory(hal.EpFactory):
    name = "FailingExecutionProvider"; vendor = "Test"; version = "1.0.0"

    def __init__(self, api):
        self.api = api

    def get_supported_devices(self, hardware_devices):
        return [self.api.create_ep_device(self, d) for d in hardware_devices if d.type == hal.OrtHardwareDeviceType.CPU]

    def create_ep(self, devices, ep_metadata, session_options, logger):
        return FailingEp()


def create_ep_factories(registration_name, api, logger):
    return [FailingFactory(api)]


def release_ep_factory(factory):
    pass
'''


def test_an_ep_failing_in_a_plain_run_falls_back_to_the_cpu_ep(register, plugin_file):
    """An EP on host memory (a plain run's case) that fails a run: as onnxruntime, the run is
    retried on the CPU EP, which later runs keep; the retry gets the feeds as the checks make
    them (a string input's str array as an object array of str)."""
    from tests.conftest import library_module

    mod = library_module(register(plugin_file(FAILING_EP, "failing_ep")))
    model = make([helper.make_node("Relu", ["x"], ["y"], name="relu"), helper.make_node("Identity", ["s"], ["t"])],
                 [vi("x", [2, 3]), vi("s", [2], TensorProto.STRING)],
                 [vi("y", [2, 3]), vi("t", [2], TensorProto.STRING)]).SerializeToString()
    s = onnxhal.InferenceSession(model, providers=["FailingExecutionProvider", "CPUExecutionProvider"])
    assert s.partition_summary.get("FailingExecutionProvider")
    feeds = {"x": np.arange(6, dtype=np.float32).reshape(2, 3) - 3, "s": np.array(["a", "bc"])}
    for _ in range(2):
        y, t = s.run(None, feeds)
        np.testing.assert_array_equal(y, np.maximum(feeds["x"], 0))
        assert t.dtype == object and t.tolist() == ["a", "bc"]
    assert mod.STATE["runs"] == 2
    mod.STATE["fail"] = True
    for names in (None, ["t", "y"]):
        got = dict(zip(names or ["y", "t"], s.run(names, feeds)))
        np.testing.assert_array_equal(got["y"], np.maximum(feeds["x"], 0))
        assert got["t"].dtype == object and got["t"].tolist() == ["a", "bc"]
    assert mod.STATE["runs"] == 3 and s.get_providers() == ["CPUExecutionProvider"]


@pytest.mark.parametrize("feed", [np.array(["a", "bc"]), np.array(["a", "bc"], dtype=object),
                                  np.array([1, "bc"], dtype=object)], ids=["unicode", "object", "object-int"])
def test_string_feeds_of_a_plain_run_are_made_str_and_outputs_stay_the_callers(feed):
    ort = pytest.importorskip("onnxruntime")
    model = make([helper.make_node("Identity", ["x"], ["y"], name="id")], [vi("x", [2], TensorProto.STRING)],
                 [vi("y", [2], TensorProto.STRING)]).SerializeToString()
    s = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"])
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": feed})[0]
    before = feed.tolist()
    for _ in range(3):  # the general run, then the prepared one
        got = s.run(None, {"x": feed})[0]
        assert got.dtype == object and got.tolist() == want.tolist() and all(type(v) is str for v in got)
        assert got is not feed
        got[0] = "changed"
        assert feed.tolist() == before


@pytest.mark.parametrize("model", ["sk_binarized", "sk_dictvec", "sk_ordinal", "sk_imputer", "sk_logreg_strlabels",
                                   "sk_knn_zipmap", "lstm_ts"])
def test_a_prepared_run_gives_what_the_general_run_gives(model):
    """run(None, feeds) and run(None, feeds, RunOptions()) (prepared: runtime/session/run_codegen.py)
    against a run whose RunOptions have a log severity of their own (the general run), bit for bit,
    on models with string, map, integer and float inputs and list (ZipMap) outputs, for each
    stored signature."""
    import os

    from onnxhal.stored_outputs import read_signatures

    path = os.path.join(os.path.dirname(__file__), "real_models", f"{model}.onnx")
    s = onnxhal.InferenceSession(path, providers=["CPUExecutionProvider"])
    for feeds, _ in read_signatures(path).values():
        general_options = onnxhal.RunOptions()
        general_options.log_severity_level = 3  # a log severity of its own: the general run
        for _ in range(3):
            general = s.run(None, feeds, general_options)
            for prepared in (s.run(None, feeds), s.run(None, feeds, onnxhal.RunOptions())):
                assert len(prepared) == len(general)
                for p, g in zip(prepared, general):
                    assert type(p) is type(g)
                    if isinstance(p, np.ndarray):
                        assert p.dtype == g.dtype and p.shape == g.shape and p.tolist() == g.tolist()
                        assert p.flags.writeable and not any(np.shares_memory(p, f) for f in feeds.values()
                                                             if isinstance(f, np.ndarray))
                    else:
                        assert p == g


def test_terminate_set_during_a_prepared_run_stops_it_between_nodes(register, plugin_file):
    """A run given RunOptions holds them in RUN_OPTIONS for its kernels, and its flag set inside a
    node stops the run before the next node, with onnxruntime's words; cleared, the session runs."""
    from tests.conftest import library_module

    mod = library_module(register(plugin_file(FAILING_EP, "failing_ep")))
    model = make([helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Neg", ["r"], ["y"])],
                 [vi("x", [2, 3])], [vi("y", [2, 3])]).SerializeToString()
    s = onnxhal.InferenceSession(model, providers=["FailingExecutionProvider", "CPUExecutionProvider"])
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 3
    ro = onnxhal.RunOptions()
    for _ in range(3):  # the general run, then the prepared one
        np.testing.assert_array_equal(s.run(None, {"x": x}, ro)[0], -np.maximum(x, 0))
    mod.STATE["stop"] = True
    with pytest.raises(Terminated, match="^Exiting due to terminate flag"):
        s.run(None, {"x": x}, ro)
    mod.STATE["stop"] = False
    ro.terminate = False
    np.testing.assert_array_equal(s.run(None, {"x": x}, ro)[0], -np.maximum(x, 0))
    np.testing.assert_array_equal(s.run(None, {"x": x})[0], -np.maximum(x, 0))


def test_set_providers_leaves_nothing_of_the_old_plan_to_the_prepared_run():
    """The prepared run belongs to one core: after set_providers the old plan (its kernels and
    weights) is freed at once, not at the next run, and runs go on the new plan."""
    import gc
    import weakref

    s = onnxhal.InferenceSession(_flatten_model().SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.ones((2, 3, 4), np.float32)
    for _ in range(3):
        s.run(None, {"x": x})
    old = weakref.ref(s.plan)
    s.set_providers(["CPUExecutionProvider"])
    gc.collect()
    assert old() is None
    for _ in range(3):
        assert s.run(["n"], {"x": x})[0] == 30
