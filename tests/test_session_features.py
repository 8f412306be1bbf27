"""Session features side by side with onnxruntime: optimized_model_filepath (with external
initializers), the model's ort_config (ORT_LOAD_CONFIG_FROM_MODEL), set_ep_dynamic_options, graph
assignment info per node, errors catchable as onnxruntime's RuntimeError, the device_id provider
option, string feeds as lists and bytes, and the profile's one-event-per-line layout."""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxhal
from onnxhal import errors
from tests.conftest import PLUGINS, library_module
from tests.models import make, vi

ort = pytest.importorskip("onnxruntime")

W = np.arange(600, dtype=np.float32).reshape(20, 30) / 100
W2 = np.ones((30, 5), np.float32)
B = np.ones(5, np.float32)
X = np.linspace(-1, 1, 40, dtype=np.float32).reshape(2, 20)


def mlp() -> onnx.ModelProto:
    """MatMul -> Relu -> Identity -> MatMul -> Add; weights of 2,400, 600 and 20 bytes."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"), helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Identity", ["r"], ["i"], name="id"), helper.make_node("MatMul", ["i", "w2"], ["h2"], name="mm2"),
             helper.make_node("Add", ["h2", "b"], ["y"], name="add")]
    inits = [numpy_helper.from_array(W, "w"), numpy_helper.from_array(W2, "w2"), numpy_helper.from_array(B, "b")]
    return make(nodes, [vi("x", [2, 20])], [vi("y", [2, 5])], inits)


def expected() -> np.ndarray:
    return np.maximum(X @ W, 0) @ W2 + B


def session(lib, model, so=None, **kw):
    if lib is ort:
        kw.setdefault("providers", ["CPUExecutionProvider"])
    return lib.InferenceSession(model, so, **kw)


LIBS = [pytest.param(onnxhal, id="onnxhal"), pytest.param(ort, id="onnxruntime")]


# -- optimized_model_filepath ----------------------------------------------------------------------
@pytest.mark.parametrize("lib", LIBS)
def test_the_optimized_model_is_written_and_runs(lib, tmp_path):
    out = tmp_path / "opt.onnx"
    so = lib.SessionOptions()
    so.optimized_model_filepath = str(out)
    so.graph_optimization_level = lib.GraphOptimizationLevel.ORT_ENABLE_BASIC
    session(lib, mlp().SerializeToString(), so)
    saved = onnx.load(out)
    assert "Identity" not in [n.op_type for n in saved.graph.node]  # both drop it at the basic level
    np.testing.assert_allclose(session(lib, str(out)).run(None, {"x": X})[0], expected(), rtol=1e-5)


@pytest.mark.parametrize("threshold", ["20", "600", None])
def test_optimized_model_external_initializers_as_onnxruntime(tmp_path, threshold):
    layouts = {}
    for lib in (onnxhal, ort):
        folder = tmp_path / lib.__name__
        folder.mkdir()
        so = lib.SessionOptions()
        so.optimized_model_filepath = str(folder / "opt.onnx")
        so.graph_optimization_level = lib.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name", "opt.bin")
        if threshold is not None:
            so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", threshold)
        session(lib, mlp().SerializeToString(), so)
        saved = onnx.load(str(folder / "opt.onnx"), load_external_data=False)
        layouts[lib.__name__] = ([(t.name, t.data_location, {e.key: e.value for e in t.external_data})
                                  for t in saved.graph.initializer], (folder / "opt.bin").read_bytes())
        np.testing.assert_allclose(session(lib, str(folder / "opt.onnx")).run(None, {"x": X})[0], expected(),
                                   rtol=1e-5)
    assert layouts["onnxhal"] == layouts["onnxruntime"]


def test_optimized_model_path_errors(tmp_path, caplog):
    for lib in (onnxhal, ort):
        so = lib.SessionOptions()
        so.optimized_model_filepath = str(tmp_path / "no" / "such" / "opt.onnx")
        with pytest.raises(Exception) as e:
            session(lib, mlp().SerializeToString(), so)
        assert type(e.value).__name__ == "InvalidArgument"
    so = onnxhal.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "opt.ort")  # onnxruntime's own format
    session(onnxhal, mlp().SerializeToString(), so).run(None, {"x": X})
    assert not (tmp_path / "opt.ort").exists() and "ORT format" in caplog.text


def test_a_session_with_compiled_partitions_cannot_be_saved(register, tmp_path):
    library_module(register(os.path.join(PLUGINS, "toy_fusing_ep.py"), "toy_fusing"))
    so = onnxhal.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    with pytest.raises(errors.Fail, match="Unable to serialize model as it contains compiled nodes"):
        onnxhal.InferenceSession(mlp().SerializeToString(), so, providers=[("ToyA", {"ops": "MatMul,Relu"})])


# -- ort_config in the model ------------------------------------------------------------------------
def with_config(text: str) -> bytes:
    model = mlp()
    helper.set_model_props(model, {"ort_config": text})
    return model.SerializeToString()


@pytest.mark.parametrize("lib", LIBS)
def test_ort_config_applies_only_with_the_environment_variable(lib, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    data = with_config('{"session_options": {"enable_profiling": 1, "intra_op_num_threads": 2, "foo": 1}}')
    plain = session(lib, data)
    plain.run(None, {"x": X})
    assert plain.end_profiling() == "" and plain.get_session_options().intra_op_num_threads == 0
    monkeypatch.setenv("ORT_LOAD_CONFIG_FROM_MODEL", "1")
    configured = session(lib, data)
    configured.run(None, {"x": X})
    assert configured.get_session_options().intra_op_num_threads == 2
    assert configured.end_profiling() != ""


@pytest.mark.parametrize("text, message", [
    ("not json", "Json stored in the `ort_config` key cannot be parsed"),
    ('{"session_options": {"intra_op_num_threads": "x"}}', "intra_op_num_threads option in the model file must be an integer"),
    ('{"session_options": {"enable_profiling": true}}', "enable_profiling option in the model file must be an integer"),
    ('{"session_options": {"graph_optimization_level": 7}}', "Unsupported graph_optimization_level value in ORT config: 7"),
])
def test_ort_config_errors_as_onnxruntime(monkeypatch, text, message):
    monkeypatch.setenv("ORT_LOAD_CONFIG_FROM_MODEL", "1")
    for lib in (onnxhal, ort):
        with pytest.raises(RuntimeError, match=message):
            session(lib, with_config(text))


# -- set_ep_dynamic_options -------------------------------------------------------------------------
def test_set_ep_dynamic_options_as_onnxruntime(register):
    for lib in (onnxhal, ort):
        s = session(lib, mlp().SerializeToString())
        s.set_ep_dynamic_options({"ep.dynamic.workload_type": "Efficient"})
        s.set_ep_dynamic_options({"foo": "bar"})
        with pytest.raises(RuntimeError, match="No options were provided"):
            s.set_ep_dynamic_options({})
    toy = library_module(register(os.path.join(PLUGINS, "toy_fusing_ep.py"), "toy_fusing"))
    seen = []
    sess = onnxhal.InferenceSession(mlp().SerializeToString(), providers=[("ToyA", {"ops": "Relu"})])
    ep = sess.eps["ToyA"]
    ep.set_dynamic_options = seen.append  # the EP receives the options, as strings
    sess.set_ep_dynamic_options({"ep.dynamic.workload_type": "Efficient", "n": 3})
    assert seen == [{"ep.dynamic.workload_type": "Efficient", "n": "3"}] and toy is not None


# -- graph assignment info -----------------------------------------------------------------------
def test_assignment_info_has_one_subgraph_per_cpu_node_as_onnxruntime():
    infos = {}
    for lib in (onnxhal, ort):
        so = lib.SessionOptions()
        so.graph_optimization_level = lib.GraphOptimizationLevel.ORT_DISABLE_ALL
        with pytest.raises(Exception, match="Session configuration entry 'session.record_ep_graph_assignment_info' "
                                            "must be set to \"1\" to retrieve EP graph assignment information.") as e:
            session(lib, mlp().SerializeToString(), so).get_provider_graph_assignment_info()
        assert type(e.value).__name__ == "Fail"
        so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
        subgraphs = session(lib, mlp().SerializeToString(), so).get_provider_graph_assignment_info()
        infos[lib.__name__] = [(s.ep_name, [(n.name, n.op_type, n.domain) for n in s.get_nodes()]) for s in subgraphs]
    assert infos["onnxhal"] == infos["onnxruntime"]
    assert len(infos["onnxhal"]) == 5


# -- errors onnxruntime raises as RuntimeError -------------------------------------------------------
def test_unknown_config_keys_are_runtime_errors_as_onnxruntime():
    for lib in (onnxhal, ort):
        with pytest.raises(RuntimeError, match="SessionOptions does not have configuration with key: nope"):
            lib.SessionOptions().get_session_config_entry("nope")
        with pytest.raises(RuntimeError, match="RunOptions does not have configuration with key: nope"):
            lib.RunOptions().get_run_config_entry("nope")
    with pytest.raises(ValueError):  # and still an InvalidArgument, as before
        onnxhal.SessionOptions().get_session_config_entry("nope")


def test_set_providers_with_an_unknown_provider_is_a_runtime_error_as_onnxruntime(recwarn):
    sessions = {lib.__name__: session(lib, mlp().SerializeToString()) for lib in (onnxhal, ort)}
    for s in sessions.values():
        with pytest.raises(RuntimeError, match="Unknown Provider Type: FooExecutionProvider"):
            s.set_providers(["FooExecutionProvider"])
    assert sessions["onnxruntime"].get_providers() is None  # onnxruntime is left without a session
    assert sessions["onnxhal"].get_providers() == ["CPUExecutionProvider"]  # onnxhal keeps its providers


# -- device_id picks the EP's device ---------------------------------------------------------------
@pytest.mark.parametrize("how", ["providers", "add_provider"])
def test_device_id_picks_the_eps_device(register, how):
    toy = library_module(register(os.path.join(PLUGINS, "toy_fusing_ep.py"), "toy_fusing"))
    toy.LOG.clear()
    for device_id in ("1", "0"):
        options = {"ops": "Relu", "device_id": device_id}
        if how == "providers":
            sess = onnxhal.InferenceSession(mlp().SerializeToString(), providers=[("ToyA", options)])
        else:
            so = onnxhal.SessionOptions()
            so.add_provider("ToyA", options)
            sess = onnxhal.InferenceSession(mlp().SerializeToString(), so)
        toy_devices = [sess.ep_devices["ToyA"]]
        assert [d.device.device_id for d in toy_devices[0]] == [int(device_id)]
    assert [e[2] for e in toy.LOG if e[0] == "create_ep"] == [1, 0]
    with pytest.raises(errors.InvalidArgument, match="device_id=5, but the EP has 2 device"):
        onnxhal.InferenceSession(mlp().SerializeToString(), providers=[("ToyA", {"device_id": "5"})])


def test_input_ep_devices_for_a_cpu_session_as_onnxruntime():
    for lib in (onnxhal, ort):
        for kw in ({}, {"providers": ["CPUExecutionProvider"]}):
            devices = lib.InferenceSession(mlp().SerializeToString(), **kw).get_input_epdevices()
            assert len(devices) == 1 and devices[0].ep_name == "CPUExecutionProvider"


# -- string feeds --------------------------------------------------------------------------------
def string_identity() -> bytes:
    return make([helper.make_node("Identity", ["x"], ["y"], name="id")], [vi("x", [2], TensorProto.STRING)],
                [vi("y", [2], TensorProto.STRING)]).SerializeToString()


@pytest.mark.parametrize("feed", [["a", "bc"], np.array(["a", "bc"]), np.array(["a", "bc"], dtype=object),
                                  np.array([b"a\x00", b"bc"], dtype="V2")],
                         ids=["list", "unicode-array", "object-array", "void-array"])
def test_string_feeds_as_onnxruntime(feed):
    ours = session(onnxhal, string_identity()).run(None, {"x": feed})[0]
    theirs = session(ort, string_identity()).run(None, {"x": feed})[0]
    assert ours.dtype == theirs.dtype == object and ours.tolist() == theirs.tolist()


def test_bytes_feeds_are_decoded_as_utf8():
    # onnxruntime gives "b'a'" for a list of bytes and reads an S array's short elements past their end
    s = session(onnxhal, string_identity())
    assert s.run(None, {"x": [b"a", "\u00e9".encode()]})[0].tolist() == ["a", "\u00e9"]
    assert s.run(None, {"x": np.array([b"a", b"bc"])})[0].tolist() == ["a", "bc"]
    with pytest.raises(errors.InvalidArgument, match="not UTF-8"):
        s.run(None, {"x": [b"\xff", b"a"]})
    for lib in (onnxhal, ort):  # a tuple is refused by both
        with pytest.raises((RuntimeError, ValueError)):
            session(lib, string_identity()).run(None, {"x": ("a", "b")})


# -- the profile -----------------------------------------------------------------------------------
@pytest.mark.parametrize("lib", LIBS)
def test_profile_has_one_event_per_line_as_onnxruntime(lib, tmp_path):
    so = lib.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "prof")
    s = session(lib, mlp().SerializeToString(), so)
    s.run(None, {"x": X})
    path = s.end_profiling()
    lines = open(path).read().splitlines()
    assert lines[0] == "[" and lines[-1] == "]"
    events = [json.loads(line.rstrip(",")) for line in lines[1:-1]]
    assert events == json.load(open(path)) and {"name", "ph", "ts", "dur", "cat"} <= set(events[0])
    stem = os.path.basename(path)
    assert stem.startswith("prof_") and stem.count("_") == 3  # prefix_date_time_milliseconds.json


# -- tuning results (onnxruntime's TunableOp) --------------------------------------------------------
def test_tuning_results_as_onnxruntime(caplog):
    for lib in (onnxhal, ort):
        s = session(lib, mlp().SerializeToString())
        assert s.get_tuning_results() == []
        s.set_tuning_results([])
        entry = [{"ep": "CPUExecutionProvider", "results": {}, "validators": {}}]
        s.set_tuning_results(entry)  # a warning
        with pytest.raises(RuntimeError, match=r"Invalid TuningResults \(index=0\). CPUExecutionProvider does not "
                                               "support TunableOp"):
            s.set_tuning_results(entry, error_on_invalid=True)
        with pytest.raises(KeyError, match="results"):
            s.set_tuning_results([{"ep": "X"}])
        with pytest.raises(TypeError):
            s.set_tuning_results("bad")
    assert "does not support TunableOp" in caplog.text


# -- outputs are the caller's own arrays -------------------------------------------------------------
def passthrough(kind: str) -> bytes:
    if kind == "constant":  # y = Identity(w): a model constant passed through
        nodes, inits = [helper.make_node("Identity", ["w"], ["y"])], [numpy_helper.from_array(np.ones(3, np.float32), "w")]
    elif kind == "input":
        nodes, inits = [helper.make_node("Identity", ["x"], ["y"])], []
    else:  # a view of the input
        nodes = [helper.make_node("Reshape", ["x", "s"], ["y"])]
        inits = [numpy_helper.from_array(np.array([3, 1], np.int64), "s")]
    return make(nodes, [vi("x", [3])], [vi("y", None)], inits).SerializeToString()


@pytest.mark.parametrize("kind", ["constant", "input", "reshape"])
@pytest.mark.parametrize("lib", LIBS)
def test_outputs_are_writable_and_never_alias_the_feeds_as_onnxruntime(lib, kind):
    s = session(lib, passthrough(kind))
    x = np.array([1.0, 2.0, 3.0], np.float32)
    y = s.run(None, {"x": x})[0]
    assert y.flags.writeable and not np.shares_memory(y, x)
    y[...] = 7
    again = s.run(None, {"x": x})[0]
    assert (again == 7).sum() == 0 and (x == 7).sum() == 0  # neither the model nor the feed changed
    binding = s.io_binding()
    binding.bind_cpu_input("x", x)
    binding.bind_output("y")
    s.run_with_iobinding(binding)
    out = binding.get_outputs()[0]
    assert not np.shares_memory(out.numpy(), x)
    copied = binding.copy_outputs_to_cpu()[0]
    copied[...] = 9
    assert not (out.numpy() == 9).any()  # copy_outputs_to_cpu hands over copies


def aliased_outputs() -> bytes:
    """Outputs r = Relu(x), Identity(r), Reshape(r) (a view of r) and Reshape(Neg(x)) (a view of a value
    that is no output)."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Identity", ["r"], ["same"]),
             helper.make_node("Reshape", ["r", "s"], ["view"]), helper.make_node("Neg", ["x"], ["n"]),
             helper.make_node("Reshape", ["n", "s"], ["n_view"])]
    inits = [numpy_helper.from_array(np.array([3, 1], np.int64), "s")]
    return make(nodes, [vi("x", [3])], [vi("r", None), vi("same", None), vi("view", None), vi("n_view", None)],
                inits).SerializeToString()


@pytest.mark.parametrize("run_options", [False, True], ids=["plain", "run-options"])
@pytest.mark.parametrize("lib", LIBS)
def test_outputs_never_alias_each_other_as_onnxruntime(lib, run_options):
    s = session(lib, aliased_outputs())
    x = np.array([-1.0, 2.0, 3.0], np.float32)
    opts = lib.RunOptions() if run_options else None
    for _ in range(2):  # the first run and the fast path of later ones
        r, same, view, n_view = s.run(None, {"x": x}, opts)
        r[...] = 7
        np.testing.assert_array_equal(same, [0, 2, 3])
        np.testing.assert_array_equal(view.ravel(), [0, 2, 3])
        n_view[...] = 7
        np.testing.assert_array_equal(s.run(None, {"x": x}, opts)[3].ravel(), [1, -2, -3])


def test_outputs_are_the_kernels_results_without_a_copy():
    """An output that aliases nothing the caller or the session keeps is handed over as the kernel
    computed it: Reshape's result is a view of Neg's, and stays one (a copy would own its memory)."""
    s = onnxhal.InferenceSession(aliased_outputs())
    x = np.array([-1.0, 2.0, 3.0], np.float32)
    for _ in range(2):
        r, same, view, n_view = s.run(None, {"x": x})
        assert isinstance(n_view.base, np.ndarray) and not n_view.flags.owndata
        assert not np.shares_memory(n_view, r) and not np.shares_memory(same, r) and not np.shares_memory(view, r)


@pytest.mark.parametrize("lib", LIBS)
def test_outputs_computed_once_per_shape_are_safe_to_mutate(lib):
    """Shape values are computed once per input shape and kept (runtime/session/shape_memo.py) and a
    constant is folded at creation: editing such an output leaves the next run's unchanged."""
    nodes = [helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Add", ["shape", "one"], ["grown"]),
             helper.make_node("Add", ["one", "one"], ["two"])]
    inits = [numpy_helper.from_array(np.array([1], np.int64), "one")]
    model = make(nodes, [vi("x", ["n", 3])], [vi("shape", None, TensorProto.INT64), vi("grown", None, TensorProto.INT64),
                                               vi("two", None, TensorProto.INT64)], inits).SerializeToString()
    s = session(lib, model)
    x = np.zeros((2, 3), np.float32)
    for _ in range(3):
        outs = s.run(None, {"x": x})
        assert [o.tolist() for o in outs] == [[2, 3], [3, 4], [2]]
        for o in outs:
            o[...] = -1
