"""The rest of onnxruntime's session API, side by side with onnxruntime where it answers: free
dimension overrides, add_initializer, set_providers, run_with_ort_values, run_async, where inputs
and outputs live, the profiling start time, and OrtValue's size and pointer."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

import onnxhal
from onnxhal import errors
from tests.models import ADD_MUL_X, add_mul_model, add_mul_reference, assert_add_mul_runs

ort = pytest.importorskip("onnxruntime")


def batch_model(denotation: str = "") -> onnx.ModelProto:
    """add_mul with a symbolic first dimension 'batch' on the input and the output."""
    model = add_mul_model()
    for v in (model.graph.input[0], model.graph.output[0]):
        dim = v.type.tensor_type.shape.dim[0]
        dim.dim_param = "batch"
        if denotation:
            dim.denotation = denotation
    return model


def both(model: onnx.ModelProto, configure) -> tuple:
    """An onnxhal and an onnxruntime session of ``model``, each with ``configure(options)`` applied."""
    so, oso = onnxhal.SessionOptions(), ort.SessionOptions()
    configure(so)
    configure(oso)
    data = model.SerializeToString()
    return (onnxhal.InferenceSession(data, so),
            ort.InferenceSession(data, oso, providers=["CPUExecutionProvider"]))


# -- free dimension overrides ------------------------------------------------------------------
@pytest.mark.parametrize("configure", [
    lambda so: so.add_free_dimension_override_by_name("batch", 4),
    lambda so: so.add_free_dimension_override_by_denotation("data_batch", 4),  # denotations ignore case
    lambda so: so.add_free_dimension_override_by_denotation("DATA_BATCH", 4),
    lambda so: (so.add_free_dimension_override_by_name("batch", 4),
                so.add_free_dimension_override_by_name("batch", 7)),  # the first one wins, as in onnxruntime
], ids=["name", "denotation-lower", "denotation-upper", "first-wins"])
def test_free_dimension_override_fixes_the_input_and_output_shapes_as_onnxruntime(configure):
    model = batch_model("DATA_BATCH")
    hal, ref = both(model, configure)
    assert hal.get_inputs()[0].shape == ref.get_inputs()[0].shape == [4, 3]
    assert hal.get_outputs()[0].shape == ref.get_outputs()[0].shape == [4, 3]
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_allclose(hal.run(None, {"x": x})[0], ref.run(None, {"x": x})[0])
    with pytest.raises(errors.InvalidArgument, match="dimension 0 must be 4"):
        hal.run(None, {"x": np.ones((5, 3), np.float32)})
    np.testing.assert_allclose(hal.run(None, {"x": x})[0], add_mul_reference(x))
    # The caller's model is left as it was.
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"


def test_free_dimension_names_are_case_sensitive_as_in_onnxruntime():
    hal, ref = both(batch_model(), lambda so: so.add_free_dimension_override_by_name("BATCH", 4))
    assert hal.get_inputs()[0].shape == ref.get_inputs()[0].shape == ["batch", 3]


def test_conflicting_free_dimension_overrides_are_refused():
    so = onnxhal.SessionOptions()
    so.add_free_dimension_override_by_name("batch", 4)
    so.add_free_dimension_override_by_denotation("DATA_BATCH", 6)
    with pytest.raises(errors.InvalidArgument, match=r"Conflicting free dimension overrides for input 'x'.*4.*6"):
        onnxhal.InferenceSession(batch_model("DATA_BATCH").SerializeToString(), so)


@pytest.mark.parametrize("value", [-1, 2.5, "4", True])
def test_a_free_dimension_override_must_be_a_size(value):
    # onnxruntime takes -1 and reports the input's dimension as -1; a size is refused at once here.
    with pytest.raises(errors.InvalidArgument, match="must be an int >= 0"):
        onnxhal.SessionOptions().add_free_dimension_override_by_name("batch", value)


# -- add_initializer ---------------------------------------------------------------------------
def test_add_initializer_replaces_the_weight_as_onnxruntime():
    threes = np.full(3, 3, np.float32)
    hal, ref = both(add_mul_model(), lambda so: so.add_initializer("two", so_value(so, threes)))
    expected = (ADD_MUL_X + 1) * 3 + ADD_MUL_X
    np.testing.assert_allclose(ref.run(None, {"x": ADD_MUL_X})[0], expected)
    np.testing.assert_allclose(hal.run(None, {"x": ADD_MUL_X})[0], expected)
    # A rebuilt session (set_providers reloads the model) keeps the application's weight.
    hal.set_providers(["CPUExecutionProvider"])
    np.testing.assert_allclose(hal.run(None, {"x": ADD_MUL_X})[0], expected)


_KEPT: list = []


def so_value(so, arr: np.ndarray):
    """An OrtValue of the library ``so`` belongs to, kept alive for the whole test run: onnxruntime's
    add_initializer keeps only a pointer, and crashes if the OrtValue is collected first (onnxhal's
    session options hold a reference)."""
    lib = onnxhal if isinstance(so, onnxhal.SessionOptions) else ort
    value = lib.OrtValue.ortvalue_from_numpy(arr)
    _KEPT.append(value)
    return value


@pytest.mark.parametrize("value, words", [
    (np.ones(2, np.float32), r"float32 \[3\] but the OrtValue is float32 \[2\]"),
    (np.ones(3, np.float64), r"float32 \[3\] but the OrtValue is float64 \[3\]"),
])
def test_add_initializer_of_another_shape_or_dtype_is_refused(value, words):
    # onnxruntime 1.32 dies with a segmentation fault on both (measured), so it is not run here.
    so = onnxhal.SessionOptions()
    so.add_initializer("two", onnxhal.OrtValue.ortvalue_from_numpy(value))
    with pytest.raises(errors.InvalidArgument, match=words):
        onnxhal.InferenceSession(add_mul_model().SerializeToString(), so)


def test_add_initializer_of_an_unknown_name_is_ignored_with_a_warning(caplog):
    hal, ref = both(add_mul_model(), lambda so: so.add_initializer("nope", so_value(so, np.ones(3, np.float32))))
    np.testing.assert_allclose(hal.run(None, {"x": ADD_MUL_X})[0], ref.run(None, {"x": ADD_MUL_X})[0])
    with caplog.at_level(logging.WARNING, logger="onnxhal"):
        so = onnxhal.SessionOptions()
        so.add_initializer("nope", onnxhal.OrtValue.ortvalue_from_numpy(np.ones(3, np.float32)))
        onnxhal.InferenceSession(add_mul_model().SerializeToString(), so)
    assert "add_initializer('nope'): the model has no initializer of that name" in caplog.text


def test_add_initializer_takes_a_host_ortvalue():
    so = onnxhal.SessionOptions()
    with pytest.raises(TypeError, match="ortvalue_from_numpy"):
        so.add_initializer("two", np.ones(3, np.float32))
    with pytest.raises(errors.InvalidArgument, match="non-empty string"):
        so.add_initializer("", onnxhal.OrtValue.ortvalue_from_numpy(np.ones(3, np.float32)))


def test_options_changed_after_creation_do_not_reach_the_session():
    so = onnxhal.SessionOptions()
    s = onnxhal.InferenceSession(add_mul_model().SerializeToString(), so)
    so.add_initializer("two", onnxhal.OrtValue.ortvalue_from_numpy(np.full(3, 9, np.float32)))
    s.set_providers(["CPUExecutionProvider"])
    assert_add_mul_runs(s)


# -- set_providers -----------------------------------------------------------------------------
def test_set_providers_with_an_unknown_name_keeps_the_session(add_mul_session):
    with pytest.raises(errors.InvalidArgument, match="'FooExecutionProvider' is unknown"):
        add_mul_session.set_providers(["FooExecutionProvider"])
    # onnxruntime's session has no providers left at this point (get_providers() is None).
    assert add_mul_session.get_providers() == ["CPUExecutionProvider"]
    assert_add_mul_runs(add_mul_session)


def test_set_providers_moves_the_session_to_other_eps(opencl_devices):
    from tests.test_opencl_session import small_cnn

    s = onnxhal.InferenceSession(small_cnn())
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    before = s.run(None, {"x": x})
    s.set_providers(["OpenCLExecutionProvider", "CPUExecutionProvider"])
    assert s.get_providers() == ["OpenCLExecutionProvider", "CPUExecutionProvider"]
    assert s.partition_summary.get("OpenCLExecutionProvider", 0) > 0
    for a, b in zip(s.run(None, {"x": x}), before):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    s.set_providers(None)  # as onnxruntime: the session options' providers, here none: the CPU EP
    assert s.get_providers() == ["CPUExecutionProvider"]


# -- run_with_ort_values -----------------------------------------------------------------------
def test_run_with_ort_values_returns_ortvalues(add_mul_session):
    out = add_mul_session.run_with_ort_values(None, {"x": onnxhal.OrtValue.ortvalue_from_numpy(ADD_MUL_X)})
    assert len(out) == 1 and isinstance(out[0], onnxhal.OrtValue)
    assert (out[0].shape(), out[0].data_type(), out[0].device_name()) == ([2, 3], "tensor(float)", "cpu")
    np.testing.assert_allclose(out[0].numpy(), add_mul_reference(ADD_MUL_X))
    with pytest.raises(errors.InvalidArgument, match="input 'x' is a ndarray, not an OrtValue"):
        add_mul_session.run_with_ort_values(None, {"x": ADD_MUL_X})
    with pytest.raises(errors.InvalidArgument, match="Invalid output name"):
        add_mul_session.run_with_ort_values(["z"], {"x": onnxhal.OrtValue.ortvalue_from_numpy(ADD_MUL_X)})
    assert_add_mul_runs(add_mul_session)


# -- run_async ---------------------------------------------------------------------------------
class Calls:
    """Collects run_async callbacks: (results, user_data, err, thread name)."""

    def __init__(self, expected: int) -> None:
        self.got: list[tuple] = []
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._expected = expected

    def __call__(self, results, user_data, err) -> None:
        with self._lock:
            self.got.append((results, user_data, err, threading.current_thread().name))
            if len(self.got) == self._expected:
                self._done.set()

    def wait(self) -> list[tuple]:
        assert self._done.wait(60), f"{len(self.got)} of {self._expected} callbacks came"
        return self.got


def test_run_async_calls_back_from_a_worker_thread(add_mul_session):
    calls = Calls(1)
    assert add_mul_session.run_async(None, {"x": ADD_MUL_X}, calls, {"tag": 1}) is None
    ((results, user_data, err, thread),) = calls.wait()
    assert err == "" and user_data == {"tag": 1} and thread != threading.current_thread().name
    np.testing.assert_allclose(results[0], add_mul_reference(ADD_MUL_X))


def test_run_async_many_at_once_each_gets_its_own_answer(add_mul_session):
    n = 24
    calls = Calls(n)
    xs = [np.full((2, 3), i, np.float32) for i in range(n)]
    for i, x in enumerate(xs):
        add_mul_session.run_async(["y"], {"x": x}, calls, i)
    got = calls.wait()
    assert sorted(ud for _, ud, _, _ in got) == list(range(n))
    for results, i, err, _ in got:
        assert err == ""
        np.testing.assert_allclose(results[0], add_mul_reference(xs[i]))


def test_run_async_errors():
    s = onnxhal.InferenceSession(add_mul_model().SerializeToString())
    calls = Calls(1)
    # Feeds and output names are checked at the call (onnxruntime checks the names there too).
    with pytest.raises(errors.InvalidArgument, match="Required input"):
        s.run_async(None, {}, calls, None)
    with pytest.raises(errors.InvalidArgument, match="Invalid output name"):
        s.run_async(["z"], {"x": ADD_MUL_X}, calls, None)
    with pytest.raises(TypeError, match="callback must be callable"):
        s.run_async(None, {"x": ADD_MUL_X}, None, None)
    # What the run itself meets reaches the callback: results [] and the message.
    ro = onnxhal.RunOptions()
    ro.terminate = True
    s.run_async(None, {"x": ADD_MUL_X}, calls, "t", ro)
    ((results, user_data, err, _),) = calls.wait()
    assert results == [] and user_data == "t" and "terminate" in err
    s.close()


def test_a_raising_callback_is_logged_and_the_session_goes_on(add_mul_session, caplog):
    done = threading.Event()

    def bad(results, user_data, err):
        done.set()
        raise ValueError("boom")

    with caplog.at_level(logging.ERROR, logger="onnxhal"):
        add_mul_session.run_async(None, {"x": ADD_MUL_X}, bad, None)
        assert done.wait(60)
        calls = Calls(1)
        add_mul_session.run_async(None, {"x": ADD_MUL_X}, calls, None)
        assert calls.wait()[0][2] == ""
        deadline = time.monotonic() + 60  # the log line follows the raise, on the other worker maybe
        while "boom" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.01)
    assert "run_async: the callback raised" in caplog.text and "ValueError: boom" in caplog.text


def test_a_callback_may_close_its_session():
    s = onnxhal.InferenceSession(add_mul_model().SerializeToString())
    closed = threading.Event()

    def close_it(results, user_data, err):
        s.close()  # joining its own worker thread would raise RuntimeError
        closed.set()

    s.run_async(None, {"x": ADD_MUL_X}, close_it, None)
    assert closed.wait(60)


# -- where inputs and outputs live -------------------------------------------------------------
def test_memory_infos_and_ep_devices_of_a_cpu_session_as_onnxruntime(add_mul_session):
    ref = ort.InferenceSession(add_mul_model().SerializeToString(), providers=["CPUExecutionProvider"])
    for mine, theirs in ((add_mul_session.get_input_memory_infos(), ref.get_input_memory_infos()),
                         (add_mul_session.get_output_memory_infos(), ref.get_output_memory_infos())):
        assert [(m.name, m.device_id, m.mem_type.name) for m in mine] == \
            [(t.name, t.device_id, t.mem_type.name) for t in theirs] == [("Cpu", 0, "DEFAULT")]
    (dev,) = add_mul_session.get_input_epdevices()
    assert dev.ep_name == ref.get_input_epdevices()[0].ep_name == "CPUExecutionProvider"


def test_memory_infos_name_the_device_memory_an_ep_reads(opencl_devices):
    from tests.test_opencl_session import small_cnn

    s = onnxhal.InferenceSession(small_cnn(), providers=["OpenCLExecutionProvider", "CPUExecutionProvider"])
    (info,) = s.get_input_memory_infos()
    assert not info.is_host and info.memory_device == opencl_devices[0].memory_info(
        onnxhal.OrtDeviceMemoryType.DEFAULT).memory_device
    assert [d.ep_name for d in s.get_input_epdevices()] == ["OpenCLExecutionProvider"]
    # y comes from the OpenCL Softmax, top from the CPU EP's TopK.
    assert [m.is_host for m in s.get_output_memory_infos()] == [False, True]
    # A feed made in that memory is read where it is.
    x = np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)
    v = onnxhal.OrtValue.ortvalue_from_shape_and_type(x.shape, np.float32, memory_info=info)
    v.update_inplace(x)
    (y,) = s.run_with_ort_values(["y"], {"x": v})
    np.testing.assert_allclose(y.numpy(), s.run(["y"], {"x": x})[0], rtol=1e-6)


# -- profiling start, OrtValue sizes -----------------------------------------------------------
def test_profiling_start_time_is_since_the_epoch(tmp_path):
    assert onnxhal.InferenceSession(add_mul_model().SerializeToString()).get_profiling_start_time_ns() == 0
    so = onnxhal.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "p")
    before = time.time_ns()
    s = onnxhal.InferenceSession(add_mul_model().SerializeToString(), so)
    start = s.get_profiling_start_time_ns()
    assert before <= start <= time.time_ns()
    s.end_profiling()
    assert s.get_profiling_start_time_ns() == start


def test_ortvalue_size_pointer_and_kind():
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    mine, theirs = onnxhal.OrtValue.ortvalue_from_numpy(arr), ort.OrtValue.ortvalue_from_numpy(arr)
    assert mine.tensor_size_in_bytes() == theirs.tensor_size_in_bytes() == 24
    assert mine.data_ptr() == arr.ctypes.data  # no copy, as onnxruntime's for a contiguous array
    assert not mine.is_tensor_sequence()
    assert onnxhal.OrtValue([arr]).is_tensor_sequence()
    with pytest.raises(errors.InvalidArgument, match="for tensors"):
        onnxhal.OrtValue([arr]).tensor_size_in_bytes()


def test_session_options_attributes_of_onnxruntime_are_there():
    so, oso = onnxhal.SessionOptions(), ort.SessionOptions()
    for name in ("use_deterministic_compute", "enable_mem_reuse", "use_per_session_threads", "logid"):
        assert getattr(so, name) == getattr(oso, name), name
    assert int(so.execution_order) == int(oso.execution_order) == 0
    assert onnxhal.RunOptions().logid == ort.RunOptions().logid == ""
    so.execution_order = 5
    with pytest.raises(errors.InvalidArgument, match="execution_order 5 is not one of DEFAULT"):
        onnxhal.InferenceSession(add_mul_model().SerializeToString(), so)


# -- add_provider and the module functions -----------------------------------------------------
def test_add_provider_by_name_as_onnxruntime():
    so, oso = onnxhal.SessionOptions(), ort.SessionOptions()
    for o in (so, oso):
        o.add_provider("CPUExecutionProvider", {"a": "1"})
        assert o.has_providers()
        assert o.get_session_config_entry("ep.cpuexecutionprovider.a") == "1"
    s = onnxhal.InferenceSession(add_mul_model().SerializeToString(), so)
    assert s.get_providers() == ["CPUExecutionProvider"]
    assert_add_mul_runs(s)
    with pytest.raises(errors.InvalidArgument, match="'FooExecutionProvider' is unknown.*Available providers"):
        onnxhal.SessionOptions().add_provider("FooExecutionProvider", {})


def test_add_provider_takes_a_registered_ep_library(opencl_devices):
    from tests.test_opencl_session import small_cnn

    so = onnxhal.SessionOptions()
    so.add_provider("OpenCLExecutionProvider", {})
    s = onnxhal.InferenceSession(small_cnn(), so)
    assert s.get_providers() == ["OpenCLExecutionProvider", "CPUExecutionProvider"]


def test_module_functions_of_onnxruntime():
    assert onnxhal.get_device() == ort.get_device() == "CPU"
    assert onnxhal.get_version_string() == onnxhal.__version__
    logger = logging.getLogger("onnxhal")
    before = logger.level
    try:
        onnxhal.set_default_logger_severity(3)
        assert logger.level == logging.ERROR
        with pytest.raises(errors.InvalidArgument, match="use 0 \\(verbose\\)"):
            onnxhal.set_default_logger_severity(7)
    finally:
        logger.setLevel(before)


# -- IOBinding with host pointers --------------------------------------------------------------
@pytest.mark.parametrize("lib", [onnxhal, ort], ids=["onnxhal", "onnxruntime"])
def test_iobinding_reads_and_writes_host_memory_by_address(lib):
    s = lib.InferenceSession(add_mul_model().SerializeToString(), providers=["CPUExecutionProvider"])
    x, y = ADD_MUL_X.copy(), np.zeros((2, 3), np.float32)
    b = s.io_binding()
    b.bind_input("x", "cpu", 0, np.float32, [2, 3], x.ctypes.data)
    b.bind_output("y", "cpu", 0, np.float32, [2, 3], y.ctypes.data)
    s.run_with_iobinding(b)
    np.testing.assert_allclose(y, add_mul_reference(ADD_MUL_X))  # written in the caller's memory
    assert b.get_outputs()[0].numpy().ctypes.data == y.ctypes.data
    x += 1  # read in place: the next run sees the change
    s.run_with_iobinding(b)
    np.testing.assert_allclose(y, add_mul_reference(ADD_MUL_X + 1))


def test_iobinding_pointer_errors(add_mul_session):
    b = add_mul_session.io_binding()
    x = ADD_MUL_X.copy()
    with pytest.raises(errors.InvalidArgument, match="needs element_type and shape"):
        b.bind_input("x", "cpu", 0, None, None, x.ctypes.data)
    with pytest.raises(errors.InvalidArgument, match="device memory here is an EP's buffer object"):
        b.bind_output("y", "gpu", 0, np.float32, [2, 3], x.ctypes.data)
    with pytest.raises(errors.InvalidArgument, match="give buffer_ptr"):
        b.bind_input("x", "cpu", 0, np.float32, [2, 3])
    with pytest.raises(errors.InvalidArgument, match="an address"):
        b.bind_input("x", "cpu", 0, np.float32, [2, 3], "0x1234")


@pytest.mark.parametrize("elem", [onnx.TensorProto.FLOAT, onnx.TensorProto.INT64, onnx.TensorProto.DOUBLE])
@pytest.mark.parametrize("value", [[1, 2], [[1.7, 2.0], [3.0, -4.5]], [True, False], []],
                         ids=["ints", "floats", "bools", "empty"])
def test_list_feeds_become_arrays_of_the_inputs_type_as_onnxruntime(elem, value):
    node = onnx.helper.make_node("Identity", ["x"], ["y"])
    graph = onnx.helper.make_graph([node], "identity", [onnx.helper.make_tensor_value_info("x", elem, None)],
                                   [onnx.helper.make_tensor_value_info("y", elem, None)])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    model.ir_version = 10
    data = model.SerializeToString()
    want = ort.InferenceSession(data).run(None, {"x": value})[0]
    got = onnxhal.InferenceSession(data).run(None, {"x": value})[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_ragged_lists_and_missing_inputs_are_refused_in_onnxruntimes_words():
    data = add_mul_model().SerializeToString()
    ref, sess = ort.InferenceSession(data), onnxhal.InferenceSession(data)
    with pytest.raises(Exception) as ref_error:
        ref.run(None, {"x": [[1.0, 2.0], [3.0]]})
    with pytest.raises(errors.InvalidArgument) as error:
        sess.run(None, {"x": [[1.0, 2.0], [3.0]]})
    assert str(ref_error.value).split(": ")[-1].rstrip(".") in str(error.value)  # "Could not create tensor from given input list"
    with pytest.raises(ValueError) as ref_error:
        ref.run(None, {})
    with pytest.raises(errors.InvalidArgument) as error:
        sess.run(None, {})
    assert str(error.value).startswith(str(ref_error.value))


def test_help_shows_the_session_and_run_docstrings():
    assert "model loaded for running" in onnxhal.InferenceSession.__doc__
    assert "output_names" in onnxhal.InferenceSession.run.__doc__


def _node_args(sess) -> tuple[list, list]:
    return ([(a.name, a.type, a.shape) for a in sess.get_inputs()],
            [(a.name, a.type, a.shape) for a in sess.get_outputs()])


def test_node_arg_shape_is_an_empty_list_where_none_is_known_as_onnxruntime():
    """A map input (skl2onnx's DictVectorizer), a sequence output and tensors of unknown rank:
    onnxruntime's NodeArg.shape is [] for each, not None."""
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("SequenceConstruct", ["x"], ["s"])],
                          "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                           helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, None)])
    data = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10).SerializeToString()
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    assert _node_args(onnxhal.InferenceSession(data)) == _node_args(theirs)
    path = str(Path(__file__).parent / "real_models" / "sk_dictvec.onnx")
    ours, theirs = onnxhal.InferenceSession(path), ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    assert _node_args(ours)[0] == _node_args(theirs)[0] == [("X", "map(string,tensor(float))", [])]
    assert [a.shape for a in ours.get_outputs()][1:] == [a.shape for a in theirs.get_outputs()][1:] == [[]]
