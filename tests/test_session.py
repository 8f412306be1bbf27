"""InferenceSession behaviour: metadata, bad input (typed errors, session still usable), threads,
profiling, IOBinding on the host, RunOptions.terminate."""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxhal
from onnxhal import errors
from tests.models import ADD_MUL_X, add_mul_model, add_mul_reference, assert_add_mul_runs, make, vi
from tests.threads import run_threads

X = ADD_MUL_X


def test_inputs_outputs_and_metadata():
    model = add_mul_model()
    model.producer_name = "p"
    model.graph.doc_string = "gd"
    onnx.helper.set_model_props(model, {"author": "me"})
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    s = onnxhal.InferenceSession(model.SerializeToString())
    (i,) = s.get_inputs()
    assert (i.name, i.type, i.shape) == ("x", "tensor(float)", ["batch", 3])
    assert [o.name for o in s.get_outputs()] == ["y"]
    md = s.get_modelmeta()
    assert (md.producer_name, md.graph_name, md.graph_description, md.custom_metadata_map) == ("p", "g", "gd", {"author": "me"})
    assert s.get_providers() == ["CPUExecutionProvider"]
    assert s.get_provider_options() == {"CPUExecutionProvider": {}}
    np.testing.assert_allclose(s.run(["y"], {"x": np.ones((5, 3), np.float32)})[0], add_mul_reference(np.ones((5, 3))))


def test_model_from_a_path(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(add_mul_model(), path)
    assert_add_mul_runs(onnxhal.InferenceSession(str(path)))


@pytest.mark.parametrize("model, error, words", [
    (b"definitely not a model", errors.InvalidProtobuf, "not a valid ONNX"),
    (b"", errors.InvalidProtobuf, "no graph"),
    ("/no/such/model.onnx", errors.NoSuchFile, "does not exist"),
    (42, errors.InvalidArgument, "path, bytes or onnx.ModelProto"),
])
def test_unloadable_models(model, error, words):
    with pytest.raises(error, match=words):
        onnxhal.InferenceSession(model)


def test_invalid_graphs():
    cycle = make([helper.make_node("Add", ["x", "b"], ["a"], name="n1"), helper.make_node("Relu", ["a"], ["b"], name="n2")],
                 [vi("x", [2])], [vi("a", [2])])
    with pytest.raises(errors.InvalidGraph, match="cycle"):
        onnxhal.InferenceSession(cycle)
    undefined = make([helper.make_node("Add", ["x", "ghost"], ["y"], name="adder")], [vi("x", [2])], [vi("y", [2])])
    with pytest.raises(errors.InvalidGraph, match="'ghost'"):
        onnxhal.InferenceSession(undefined)
    twice = make([helper.make_node("Relu", ["x"], ["y"], name="a"), helper.make_node("Relu", ["x"], ["y"], name="b")],
                 [vi("x", [2])], [vi("y", [2])])
    with pytest.raises(errors.InvalidGraph, match="produced by two nodes"):
        onnxhal.InferenceSession(twice)


def test_unsupported_operator_and_opset():
    unknown = make([helper.make_node("FancyOp", ["x"], ["y"], name="fancy", domain="com.example")], [vi("x", [2])],
                   [vi("y", [2])])
    unknown.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(errors.NotImplemented, match="FancyOp"):
        onnxhal.InferenceSession(unknown)
    future = add_mul_model()
    future.opset_import[0].version = 999
    with pytest.raises(errors.NotImplemented, match="opset 999"):
        onnxhal.InferenceSession(future)


@pytest.mark.parametrize("feed, words", [
    ({}, r"Required inputs \(\['x'\]\) are missing from input feed \(\[\]\)\. Add them to input_feed: 'x' \(float32 \[2,3\]\)"),
    ({"x": X, "z": X}, "Invalid input name: 'z'"),
    ({"x": X.astype(np.float64)}, r"input 'x' expects float32 \[2,3\], got float64 \[2,3\]"),
    ({"x": X.reshape(6)}, "rank 1 where the model wants rank 2"),
    ({"x": np.zeros((2, 4), np.float32)}, "dimension 1 must be 3"),
    ({"x": [[1.0, 2.0, 3.0]] * 3}, "dimension 0 must be 2"),
    ({"x": [[1.0, 2.0, 3.0], [1.0]]}, "Could not create tensor from given input list for input 'x'"),
    ({"x": 3.0}, "expects a numpy array"),
])
def test_bad_feeds_are_typed_errors_and_the_session_stays_usable(add_mul_session, feed, words):
    with pytest.raises(errors.InvalidArgument, match=words):
        add_mul_session.run(None, feed)
    assert_add_mul_runs(add_mul_session)


def test_unknown_output_name(add_mul_session):
    with pytest.raises(errors.InvalidArgument, match="Invalid output name: 'nope'"):
        add_mul_session.run(["nope"], {"x": X})
    assert_add_mul_runs(add_mul_session)


def test_terminate(add_mul_session):
    ro = onnxhal.RunOptions()
    ro.terminate = True
    with pytest.raises(errors.RuntimeException, match="terminate"):
        add_mul_session.run(None, {"x": X}, ro)
    ro.terminate = False
    np.testing.assert_allclose(add_mul_session.run(None, {"x": X}, ro)[0], add_mul_reference(X))


def test_a_kernel_failure_is_a_typed_error_naming_the_node_and_the_session_survives():
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshaper")]
    m = make(nodes, [vi("x", ["n"]), vi("shape", [1], TensorProto.INT64)], [vi("y", None)])
    s = onnxhal.InferenceSession(m)
    with pytest.raises(errors.OrtError, match="reshaper"):
        s.run(None, {"x": np.ones(4, np.float32), "shape": np.array([3], np.int64)})
    np.testing.assert_allclose(s.run(None, {"x": np.ones(4, np.float32), "shape": np.array([4], np.int64)})[0],
                               np.ones(4))


def test_many_threads_share_one_session():
    model = make([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["r"]),
                  helper.make_node("Add", ["r", "x"], ["y"])],
                 [vi("x", ["n", 32])], [vi("y", ["n", 32])],
                 [onnx.numpy_helper.from_array(np.random.default_rng(0).standard_normal((32, 32)).astype(np.float32), "w")])
    s = onnxhal.InferenceSession(model)
    w = onnx.numpy_helper.to_array(model.graph.initializer[0])
    errors_seen: list = []

    def worker(seed):
        rng = np.random.default_rng(seed)
        for _ in range(50):
            x = rng.standard_normal((int(rng.integers(1, 9)), 32)).astype(np.float32)
            got = s.run(None, {"x": x})[0]
            ref = np.maximum(x @ w, 0) + x
            if not np.allclose(got, ref, rtol=1e-4, atol=1e-4):
                errors_seen.append(seed)

    run_threads(worker, 8)
    assert errors_seen == []


def test_profiling_writes_a_chrome_trace(tmp_path):
    so = onnxhal.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "prof")
    # the model's Add and Mul stay two nodes (fused, they are one ElementwiseChain event a run)
    so.add_session_config_entry("optimization.disable_passes", "fuse_elementwise_chains")
    s = onnxhal.InferenceSession(add_mul_model(), so, providers=["CPUExecutionProvider"])
    for _ in range(3):
        s.run(None, {"x": X})
    path = s.end_profiling()
    assert os.path.dirname(path) == str(tmp_path)
    events = json.load(open(path))
    nodes = [e for e in events if e["cat"] == "Node"]
    assert len(nodes) == 3 * 3
    assert {e["args"]["op_name"] for e in nodes} == {"Add", "Mul"}
    assert all(e["args"]["provider"] == "CPUExecutionProvider" and e["ph"] == "X" and e["dur"] >= 0 for e in nodes)
    assert nodes[0]["args"]["output_type_shape"] == [{"float32": [2, 3]}]
    assert sum(e["name"] == "model_run" for e in events) == 3


def test_iobinding_on_the_host(add_mul_session):
    b = add_mul_session.io_binding()
    b.bind_cpu_input("x", X)
    b.bind_output("y")
    add_mul_session.run_with_iobinding(b)
    np.testing.assert_allclose(b.copy_outputs_to_cpu()[0], add_mul_reference(X))
    out = onnxhal.OrtValue.ortvalue_from_shape_and_type([2, 3], np.float32)
    b.bind_ortvalue_output("y", out)
    b.bind_ortvalue_input("x", onnxhal.OrtValue.ortvalue_from_numpy(X))
    add_mul_session.run_with_iobinding(b)
    np.testing.assert_allclose(out.numpy(), add_mul_reference(X))
    assert out.device_name() == "cpu" and out.data_type() == "tensor(float)" and out.shape() == [2, 3]


def test_ortvalue_feed(add_mul_session):
    v = onnxhal.OrtValue.ortvalue_from_numpy(X)
    np.testing.assert_allclose(add_mul_session.run(None, {"x": v})[0], add_mul_reference(X))


def test_optimization_levels_agree():
    x = np.random.default_rng(3).standard_normal((2, 3)).astype(np.float32)
    outs = []
    for level in onnxhal.GraphOptimizationLevel:
        so = onnxhal.SessionOptions()
        so.graph_optimization_level = level
        outs.append(onnxhal.InferenceSession(add_mul_model(), so).run(None, {"x": x})[0])
    for o in outs[1:]:
        np.testing.assert_allclose(o, outs[0], rtol=1e-6)


def test_terminate_set_during_a_run_stops_between_nodes():
    class FlipsAfter(onnxhal.RunOptions):
        """Stands in for another thread setting terminate mid-run (a timing we cannot force)."""

        def __init__(self, reads: int) -> None:
            super().__init__()
            self._reads = reads

        @property
        def terminate(self) -> bool:
            self._reads -= 1
            return self._reads < 0

        @terminate.setter
        def terminate(self, value: bool) -> None:
            pass

    chain = make([helper.make_node("Relu", [f"t{i}"], [f"t{i + 1}"], name=f"relu{i}") for i in range(50)],
                 [vi("t0", [4])], [vi("t50", [4])])
    so = onnxhal.SessionOptions()  # 50 nodes to stop between, not one fused ElementwiseChain
    so.add_session_config_entry("optimization.disable_passes", "fuse_elementwise_chains")
    s = onnxhal.InferenceSession(chain, so)
    with pytest.raises(errors.RuntimeException, match="terminate"):
        s.run(None, {"t0": np.ones(4, np.float32)}, FlipsAfter(reads=10))
    np.testing.assert_array_equal(s.run(None, {"t0": np.ones(4, np.float32)}, onnxhal.RunOptions())[0], np.ones(4))


def test_log_severity_level(caplog):
    """A session's log_severity_level applies to that session's records only, as onnxruntime's
    per-session logger: a session created at 4 (fatal) must not silence the warnings of sessions
    created after it (as setting the level of the whole onnxhal logger would), and 0 (verbose) lets a
    session's INFO records through without letting other sessions' through."""
    import logging

    so = onnxhal.SessionOptions()
    so.log_severity_level = 7
    with pytest.raises(errors.InvalidArgument, match="log_severity_level 7"):
        onnxhal.InferenceSession(add_mul_model(), so)

    # one + two folds at ORT_ENABLE_ALL: the optimizer logs that pass at DEBUG
    folding = make([helper.make_node("Add", ["one", "two"], ["c"]), helper.make_node("Mul", ["x", "c"], ["y"])],
                   [vi("x", [3])], [vi("y", [3])],
                   [onnx.numpy_helper.from_array(np.ones(3, np.float32), n) for n in ("one", "two")])

    def options(severity: int) -> onnxhal.SessionOptions:
        o = onnxhal.SessionOptions()
        o.log_severity_level = severity
        # an initializer the model lacks: the session logs a warning while it is created
        o.add_initializer("absent", onnxhal.OrtValue.ortvalue_from_numpy(np.zeros(1, np.float32)))
        return o

    root = logging.getLogger("onnxhal")
    before = root.level
    try:
        with caplog.at_level(logging.WARNING, logger="onnxhal"):  # the application's level: WARNING
            caplog.handler.setLevel(logging.NOTSET)  # the capture itself keeps whatever reaches it
            onnxhal.InferenceSession(add_mul_model(), options(4))
            assert "absent" not in caplog.text
            onnxhal.InferenceSession(add_mul_model(), options(2))
            assert "add_initializer('absent')" in caplog.text
            caplog.clear()
            onnxhal.InferenceSession(folding, options(2))
            assert not [r for r in caplog.records if r.levelno < logging.WARNING]
            onnxhal.InferenceSession(folding, options(0))
            assert "absent" in caplog.text
            assert any(r.levelno == logging.DEBUG and "pass" in r.getMessage() for r in caplog.records)
            caplog.clear()
            onnxhal.InferenceSession(folding, options(2))
            logging.getLogger("onnxhal.session").info("outside any session")
            assert not [r for r in caplog.records if r.levelno < logging.WARNING], \
                "a verbose session let other records below WARNING through"
    finally:
        root.setLevel(before)


def test_a_verbose_session_leaves_the_applications_logging_as_it_was(caplog):
    """A session at severity 0 lowers the onnxhal logger only while it is created or run: afterwards
    the logger's own level is the application's again, and an application that asks a child logger
    for INFO gets those records (a lowered bar left behind used to drop them for the whole process)."""
    import logging

    root = logging.getLogger("onnxhal")
    before = root.level
    try:
        root.setLevel(logging.WARNING)
        so = onnxhal.SessionOptions()
        so.log_severity_level = 0
        sess = onnxhal.InferenceSession(add_mul_model(), so)
        sess.run(None, {"x": ADD_MUL_X})
        assert root.level == logging.WARNING
        with caplog.at_level(logging.INFO, logger="onnxhal.partitioner"):
            logging.getLogger("onnxhal.partitioner").info("asked for by the application")
        assert "asked for by the application" in caplog.text
    finally:
        root.setLevel(before)


@pytest.mark.parametrize("profiling", [False, True])
def test_ieee_specials_are_results_not_warnings(tmp_path, profiling):
    """Sqrt and Log of negatives, 0/0 and overflow give NaN and inf as onnxruntime does, with no
    numpy RuntimeWarning escaping the run (a caller running with warnings as errors must not fail)."""
    nodes = [helper.make_node("Sqrt", ["x"], ["s"]), helper.make_node("Log", ["x"], ["l"]),
             helper.make_node("Div", ["x", "x"], ["d"]), helper.make_node("Exp", ["x"], ["e"])]
    model = make(nodes, [vi("x", [3])], [vi("s", [3]), vi("l", [3]), vi("d", [3]), vi("e", [3])])
    opts = onnxhal.SessionOptions()
    opts.enable_profiling = profiling
    opts.profile_file_prefix = str(tmp_path / "p")
    s = onnxhal.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    x = np.array([-1.0, 0.0, 100.0], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sq, lg, dv, ex = s.run(None, {"x": x})
    assert np.isnan(sq[0]) and np.isnan(lg[0]) and lg[1] == -np.inf and np.isnan(dv[1])
    assert ex[2] == np.inf and dv[2] == 1.0
    assert np.seterr()["invalid"] == "warn"  # the caller's own numpy settings are untouched
    with np.errstate(all="raise"):  # a caller whose numpy raises: the run still gives the specials,
        sq, lg, dv, ex = s.run(None, {"x": x})
        assert np.isnan(sq[0]) and lg[1] == -np.inf
        assert np.geterr() == {"divide": "raise", "over": "raise", "under": "raise", "invalid": "raise"}
        with pytest.raises(FloatingPointError):  # and its own arithmetic raises again after it
            np.sqrt(np.float32(-1.0))


def test_sessions_of_one_model_share_the_compiled_plan_code():
    # The generated plan function is compiled once per process per source: a second session of
    # the same model (another Relu chain length: a source of its own) compiles nothing, and each
    # runs as onnxruntime does.
    import onnxruntime as ort

    from onnxhal.runtime.session.plan_codegen import compiled_plan

    def chain(n: int) -> bytes:
        nodes = [helper.make_node("Relu" if k % 2 else "Neg", [f"v{k}"], [f"v{k + 1}"]) for k in range(n)]
        model = make(nodes, [vi("v0", [2, 3])], [vi(f"v{n}", [2, 3])])
        return model.SerializeToString()

    x = np.array([[-1.5, 0.0, 2.0], [3.0, -4.0, 0.5]], np.float32)
    model = chain(7)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"v0": x})[0]
    so = onnxhal.SessionOptions()
    so.graph_optimization_level = onnxhal.GraphOptimizationLevel.ORT_DISABLE_ALL
    # The code is generated at a plan's second run (its first runs the steps in a loop): a
    # session created, or run once, compiles nothing.
    first = onnxhal.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    start = compiled_plan.cache_info()
    np.testing.assert_array_equal(first.run(None, {"v0": x})[0], want)
    assert compiled_plan.cache_info() == start
    np.testing.assert_array_equal(first.run(None, {"v0": x})[0], want)  # generated now
    before = compiled_plan.cache_info()
    second = onnxhal.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    for _ in range(2):
        np.testing.assert_array_equal(second.run(None, {"v0": x})[0], want)
    after = compiled_plan.cache_info()
    assert (after.hits - before.hits, after.misses - before.misses) == (1, 0)
    third = onnxhal.InferenceSession(chain(9), so, providers=["CPUExecutionProvider"])
    third.plan.generated  # noqa: B018 - made at this first read
    assert compiled_plan.cache_info().misses == after.misses + 1
    for s in (first, second):
        np.testing.assert_array_equal(s.run(None, {"v0": x})[0], want)
