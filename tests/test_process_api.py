"""The module-level API side by side with onnxruntime: build info, telemetry switches, the logger
callback, global thread pools, the capi module paths, check_and_normalize_provider_args, and an
inventory: every public name of onnxruntime's module is onnxhal's too, or declined with a reason."""

from __future__ import annotations

import logging
import subprocess
import sys
import warnings

import pytest

import onnxhal
from onnxhal.runtime.env import process_settings

ort = pytest.importorskip("onnxruntime")

# onnxruntime names onnxhal does not offer, and why (docs/api-parity.md has the full table).
DECLINED = {
    "ModelPackage": "model packages: an onnxruntime 1.32 preview format",
    "ModelPackageComponentContext": "model packages",
    "ModelPackageContext": "model packages",
    "ModelPackageOptions": "model packages",
    "ModelPackageWriteMode": "model packages",
    "SessionIOBinding": "onnxruntime's C binding object behind IOBinding; onnxhal's IOBinding has no C layer",
    "contextlib": "a module onnxruntime imports, not API",
    "cuda_version": "package metadata of onnxruntime's CUDA builds",
    "import_capi_exception": "onnxruntime's import bookkeeping",
    "onnxruntime_validation": "onnxruntime's install checks",
    "package_name": "package metadata",
    "preload_dlls": "loads CUDA/cuDNN DLLs; there are none",
    "print_debug_info": "prints onnxruntime's CUDA DLL search",
    "version": "package metadata (onnxhal.__version__)",
}


def test_every_onnxruntime_name_is_offered_or_declined():
    # read in a fresh interpreter: onnxruntime's subpackages (quantization, transformers) show in
    # dir() here once any test in this process imported them
    out = subprocess.run([sys.executable, "-c", "import onnxruntime; print(' '.join(dir(onnxruntime)))"],
                         capture_output=True, text=True, timeout=120, check=True)
    names = {n for n in out.stdout.split() if not n.startswith("_")}
    missing = sorted(n for n in names if not hasattr(onnxhal, n) and n not in DECLINED)
    assert missing == []
    assert not [n for n in DECLINED if hasattr(onnxhal, n)]  # a declined name that exists is no longer declined


DECLINED_MEMBERS = {
    "SessionOptions.register_custom_ops_library": "loads compiled custom-op libraries, which Python cannot run",
}


def _public(obj) -> set[str]:
    return {n for n in dir(obj) if not n.startswith("_") or n in ("__array__", "__dlpack__", "__dlpack_device__")}


def test_every_member_of_the_shared_classes_is_offered_or_declined():
    """Members of each class both packages have, looked up on the class or on an instance (for
    attributes set in __init__); enum members carry name and value."""
    import enum
    import inspect

    import numpy as np
    from onnxruntime.capi import _pybind_state as C

    from tests.models import add_mul_model

    so = onnxhal.SessionOptions()
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    sess = onnxhal.InferenceSession(add_mul_model(), so)
    sub = sess.get_provider_graph_assignment_info()[0]
    samples = {"SessionOptions": so, "RunOptions": onnxhal.RunOptions(), "NodeArg": sess.get_inputs()[0],
               "ModelMetadata": sess.get_modelmeta(), "OrtEpAssignedSubgraph": sub,
               "OrtEpAssignedNode": sub.get_nodes()[0], "InferenceSession": sess,
               "OrtValue": onnxhal.OrtValue.ortvalue_from_numpy(np.zeros(2, np.float32)), "IOBinding": sess.io_binding()}
    missing = []
    for name in sorted(_public(ort)):
        theirs, ours = getattr(ort, name, None) or getattr(C, name, None), getattr(onnxhal, name, None)
        if not inspect.isclass(theirs) or not inspect.isclass(ours):
            continue
        instance = samples.get(name) or (next(iter(ours)) if issubclass(ours, enum.Enum) else None)
        for member in sorted(_public(theirs) - {"_pybind11_conduit_v1_"}):
            if not (hasattr(ours, member) or (instance is not None and hasattr(instance, member))):
                missing.append(f"{name}.{member}")
    assert sorted(set(missing) - set(DECLINED_MEMBERS)) == []
    assert sorted(set(DECLINED_MEMBERS) - set(missing)) == []  # a declined member that exists is no longer declined


def test_build_info_telemetry_and_collective_ops():
    assert ort.get_build_info().startswith("ORT Build Info:")
    assert onnxhal.get_build_info().startswith("onnxhal Build Info: version=")
    for lib in (onnxhal, ort):
        assert lib.has_collective_ops() is False
        assert lib.enable_telemetry_events() is None and lib.disable_telemetry_events() is None
    onnxhal.enable_telemetry_events()
    assert process_settings.telemetry_events_enabled()
    onnxhal.disable_telemetry_events()
    assert not process_settings.telemetry_events_enabled()
    onnxhal.set_default_logger_verbosity(3)
    assert process_settings.default_logger_verbosity() == 3
    onnxhal.set_default_logger_verbosity(0)


def test_logger_callback_gets_onnxruntimes_arguments():
    got = []
    try:
        onnxhal.set_default_logger_callback(lambda *a: got.append(a), 1)
        logging.getLogger("onnxhal.session").warning("careful: %s", "x")
        logging.getLogger("onnxhal.session").info("fyi")
        logging.getLogger("onnxhal.session").debug("hidden at severity 1")
    finally:
        onnxhal.set_default_logger_callback(None)
        onnxhal.set_default_logger_severity(2)
    assert [(a[0], a[1], a[4]) for a in got] == [(2, "onnxhal.session", "careful: x"), (1, "onnxhal.session", "fyi")]
    assert all(isinstance(a[0], int) and all(isinstance(x, str) for x in a[1:]) for a in got)
    assert "test_process_api.py:" in got[0][3]
    assert logging.getLogger("onnxhal").propagate  # the application's handlers are back


def test_a_raising_callback_does_not_break_logging(monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda args: seen.append(args.exc_value))
    try:
        onnxhal.set_default_logger_callback(lambda *a: 1 / 0)
        logging.getLogger("onnxhal.session").warning("boom")
    finally:
        onnxhal.set_default_logger_callback(None)
    assert len(seen) == 1 and isinstance(seen[0], ZeroDivisionError)


@pytest.mark.parametrize("args, message", [((lambda *a: None, 5), "severity >= 0 && severity <= 4 was false"),
                                           ((lambda *a: None, -1), "severity >= 0 && severity <= 4 was false"),
                                           ((3,), "PyCallable_Check")])
def test_logger_callback_errors_as_onnxruntime(args, message):
    for lib in (onnxhal, ort):
        with pytest.raises(RuntimeError, match=message):
            lib.set_default_logger_callback(*args)


def test_global_thread_pools_are_set_once_as_onnxruntime():
    # in a fresh process each: onnxruntime's pools last for the process
    script = """
import sys
import {lib} as m
m.set_global_thread_pool_sizes(2, 3)
try:
    m.set_global_thread_pool_sizes(1, 1)
except Exception as e:  # onnxruntime's Fail is not a RuntimeError
    print(type(e).__name__, str(e).split('FAIL : ')[-1].split(' them')[0])
"""
    out = {lib: subprocess.run([sys.executable, "-c", script.format(lib=lib)], capture_output=True, text=True,
                               timeout=120).stdout.strip() for lib in ("onnxhal", "onnxruntime")}
    assert out["onnxhal"] == out["onnxruntime"] == \
        "Fail Global thread pools have already been created, cannot replace"


def test_a_session_with_per_session_threads_after_global_pools_is_refused_as_onnxruntime():
    # in a fresh process each: the global pools last for the process
    script = """
import numpy as np
from onnx import TensorProto, helper
import {lib} as m
g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
data = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10).SerializeToString()
m.set_global_thread_pool_sizes(2, 1)
for per_session in (None, True, False):
    so = m.SessionOptions()
    if per_session is not None:
        so.use_per_session_threads = per_session
    try:
        s = m.InferenceSession(data, so, providers=["CPUExecutionProvider"])
        print("result", per_session, "runs", s.run(None, {{"x": np.ones(2, np.float32)}})[0].tolist())
    except Exception as e:
        print("result", per_session, isinstance(e, RuntimeError), "use_per_session_threads must be false when using a global "
              "thread pool" in str(e))
"""
    out = {lib: [line for line in subprocess.run([sys.executable, "-c", script.format(lib=lib)], capture_output=True,
                                                 text=True, timeout=120).stdout.splitlines()
                 if line.startswith("result ")]  # (onnxruntime's Python layer prints its own retry notice)
           for lib in ("onnxhal", "onnxruntime")}
    assert out["onnxhal"] == out["onnxruntime"] == ["result None True True", "result True True True",
                                                    "result False runs [1.0, 1.0]"]


def test_capi_module_paths_give_onnxhals_objects():
    from onnxhal.capi import _pybind_state as C
    from onnxhal.capi import onnxruntime_pybind11_state as C11
    from onnxhal.capi.onnxruntime_inference_collection import InferenceSession, OrtValue

    assert C.OrtValueVector is onnxhal.OrtValueVector and C11.get_ep_devices is onnxhal.get_ep_devices
    assert InferenceSession is onnxhal.InferenceSession and OrtValue is onnxhal.OrtValue
    assert C.OrtCompiledModelCompatibility.EP_UNSUPPORTED == 3
    with pytest.raises(AttributeError, match="does not offer"):
        C.quantize_matmul_4bits  # noqa: B018


@pytest.mark.parametrize("providers, options", [
    (None, None), (["A", "B"], None), (["A", ("B", {1: 2})], None), (["A", "B"], [{"x": 1}, {}]),
    (["A", "A"], None), (["Nope"], None), ("A", None), ([3], None), (["A"], [{}, {}]), ((("A", {}),), [{}]),
    (["A"], [[]]),
])
def test_check_and_normalize_provider_args_as_onnxruntime(providers, options):
    from onnxruntime.capi.onnxruntime_inference_collection import check_and_normalize_provider_args as theirs

    from onnxhal.capi.onnxruntime_inference_collection import check_and_normalize_provider_args as ours

    results = []
    for fn in (ours, theirs):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            try:
                results.append(("ok", fn(providers, options, ["A", "B"]), [str(x.message) for x in w]))
            except ValueError as e:
                results.append(("ValueError", str(e), [str(x.message) for x in w]))
    assert results[0] == results[1]


_VERBOSE_SESSION = """
import logging, sys
if sys.argv[1] == "configured":
    logging.basicConfig(level=logging.DEBUG, format="APP %(name)s %(message)s")
import onnxhal
from tests.models import add_mul_model
onnxhal.set_default_logger_severity(0)
onnxhal.InferenceSession(add_mul_model().SerializeToString())
"""


@pytest.mark.parametrize("setup", ["unconfigured", "configured"])
def test_verbose_records_reach_stderr_once_with_or_without_logging_setup(setup):
    """As onnxruntime prints its log to stderr with no setup: severity 0 shows onnxhal's info records
    on stderr where the application configured no logging, and only through the application's
    handlers (once) where it did."""
    import subprocess
    import sys
    from pathlib import Path

    done = subprocess.run([sys.executable, "-c", _VERBOSE_SESSION, setup], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [x for x in done.stderr.splitlines() if "registered EP library 'CPUExecutionProvider'" in x]
    assert len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith("APP onnxhal") if setup == "configured" else "[I:onnxhal]" in lines[0]


def test_capi_module_offers_onnxruntimes_error_classes_and_views():
    """``from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidArgument`` is how
    applications catch onnxruntime's errors: the same import from onnxhal's capi gives onnxhal's."""
    import onnxruntime.capi.onnxruntime_pybind11_state as ort_state

    import onnxhal.capi.onnxruntime_pybind11_state as state
    from onnxhal import errors

    error_names = [n for n in dir(ort_state) if isinstance(getattr(ort_state, n), type)
                   and issubclass(getattr(ort_state, n), Exception)]
    assert len(error_names) >= 15
    for name in error_names:
        assert getattr(state, name) is getattr(errors, name), name
    assert {m: int(v) for m, v in state.ArenaExtendStrategy.__members__.items()} == \
        {m: int(v) for m, v in ort_state.ArenaExtendStrategy.__members__.items()}
    assert isinstance(state.get_default_session_options(), onnxhal.SessionOptions)
    with pytest.raises(state.InvalidProtobuf):
        onnxhal.InferenceSession(b"")
