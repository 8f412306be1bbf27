"""The prepared run of a plan with device memory (runtime/session/run_codegen.py,
``ExecutionPlan.host_entry(copies=True)``): an OpenCL session's plain run uploads its feeds and
downloads its outputs through functions found once, without the general run path. Against that
path (session config ``session.onnxhal.prepared_copies`` = "0") bit for bit, and against the CPU EP;
and the pieces it stands on: ``MemoryContext.uploader`` / ``downloader``,
``OpenCLDeviceContext.in_context``, and the partition state's slot sources (``_slot_sources``),
which must bind the buffers the Python replay binds."""

from __future__ import annotations

import os

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("pyopencl")
import pyopencl as cl  # noqa: E402

import onnxhal  # noqa: E402
from onnxhal.hal.errors import InvalidArgument  # noqa: E402
from onnxhal.runtime.providers.opencl.memory import OpenCLDataTransfer  # noqa: E402
from onnxhal.runtime.session.executor import ExecutionPlan  # noqa: E402
from onnxhal.runtime.session.input_checks import FeedChecker  # noqa: E402
from onnxhal.runtime.session.memory_context import PAIR_COPIERS  # noqa: E402
from onnxhal.runtime.session.run_codegen import ONE_CALL_RUN, PREPARED_COPIES  # noqa: E402
from onnxhal.stored_outputs import read_signatures  # noqa: E402
from tests.opencl_support import close_sessions, keyed_sessions, require_opencl  # noqa: E402
from tests.threads import run_threads

OPENCL_INDEX = require_opencl(module_level=True)

OPENCL = [("OpenCLExecutionProvider", {"cost_rule": "off"}), "CPUExecutionProvider"]
CORPUS = os.path.join(os.path.dirname(__file__), "real_models")


def gather_model() -> bytes:
    """Token ids (Gather indices, fed in host memory) and a float feed uploaded: both kinds of feed."""
    rng = np.random.default_rng(3)
    table = rng.standard_normal((10, 8)).astype(np.float32)
    w = rng.standard_normal((8, 8)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"]),
             helper.make_node("Add", ["e", "bias"], ["s"]),
             helper.make_node("MatMul", ["s", "w"], ["m"]),
             helper.make_node("Relu", ["m"], ["y"])]
    graph = helper.make_graph(nodes, "prepared", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 3]),
                                                  helper.make_tensor_value_info("bias", TensorProto.FLOAT, [2, 3, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 8])],
                              [numpy_helper.from_array(table, "table"), numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def gather_feeds(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"ids": rng.integers(0, 10, (2, 3)).astype(np.int64),
            "bias": rng.standard_normal((2, 3, 8)).astype(np.float32)}


def sessions_of(model) -> dict[str, onnxhal.InferenceSession]:
    """Prepared copies on ("1") and off ("0"), the one-call run off in both (it would take the runs
    these tests hold to the general path), and the CPU EP ("cpu")."""
    return keyed_sessions(model, PREPARED_COPIES, OPENCL, {ONE_CALL_RUN: "0"})


@pytest.fixture
def sessions(register):
    register("onnxhal.runtime.providers.opencl", "opencl")
    made = sessions_of(gather_model())
    yield made
    close_sessions(made)


def test_prepared_runs_take_neither_the_general_check_nor_the_plans_general_run(sessions, monkeypatch):
    f = gather_feeds(1)
    for prepared in ("1", "0"):
        sessions[prepared].run(None, f)  # the first run takes the general path and prepares
    calls = []
    real_check, real_run = FeedChecker.check, ExecutionPlan.run
    monkeypatch.setattr(FeedChecker, "check", lambda self, feed: calls.append("check") or real_check(self, feed))
    monkeypatch.setattr(ExecutionPlan, "run", lambda *a, **k: calls.append("plan") or real_run(*a, **k))
    for options in (None, onnxhal.RunOptions()):
        sessions["1"].run(None, f, options)
    assert calls == []
    sessions["0"].run(None, f)
    assert calls == ["check", "plan"]


@pytest.mark.parametrize("model", ["bert_ts", "resnet_ts"])
def test_prepared_and_general_runs_agree_bit_for_bit_and_with_the_cpu_ep(register, model):
    register("onnxhal.runtime.providers.opencl", "opencl")
    path = os.path.join(CORPUS, f"{model}.onnx")
    made = sessions_of(path)
    for feeds, _ in read_signatures(path).values():
        ref = made["cpu"].run(None, feeds)
        for _ in range(3):
            prepared, general = made["1"].run(None, feeds), made["0"].run(None, feeds)
            with_options = made["1"].run(None, feeds, onnxhal.RunOptions())
            for p, g, o, r in zip(prepared, general, with_options, ref):
                assert p.dtype == g.dtype and p.shape == g.shape and p.flags.writeable
                np.testing.assert_array_equal(p, g)
                np.testing.assert_array_equal(o, g)
                np.testing.assert_allclose(p, r, rtol=1e-4, atol=1e-5)


def test_fetch_names_and_feeds_changed_after_the_run(sessions):
    f = gather_feeds(2)
    s = sessions["1"]
    s.run(None, f)
    first = s.run(["y"], f)[0]
    expected = sessions["cpu"].run(None, f)[0]
    f["bias"][:] = 5.0  # the run waited for its held upload before returning
    np.testing.assert_allclose(first, expected, rtol=1e-5, atol=1e-6)
    f["bias"] = np.asfortranarray(np.ones((2, 3, 8), np.float32))  # not C-contiguous: a contiguous copy goes up
    np.testing.assert_allclose(s.run(["y", "y"], f)[1], sessions["cpu"].run(None, f)[0], rtol=1e-5, atol=1e-6)


def test_bad_feeds_and_failed_runs_leave_the_prepared_session_usable(sessions):
    s = sessions["1"]
    good = gather_feeds(3)
    s.run(None, good)
    with pytest.raises(InvalidArgument, match="bias"):
        s.run(None, {"ids": good["ids"], "bias": good["bias"].astype(np.float64)})
    with pytest.raises(InvalidArgument, match="ids"):  # token 11 of a 10-row table: the Gather's typed error
        s.run(None, {"ids": np.full((2, 3), 11, np.int64), "bias": good["bias"]})
    np.testing.assert_allclose(s.run(None, good)[0], sessions["cpu"].run(None, good)[0], rtol=1e-5, atol=1e-6)


def test_threads_share_a_prepared_session(sessions):
    s, cpu = sessions["1"], sessions["cpu"]
    s.run(None, gather_feeds(0))
    errors: list = []

    def worker(seed: int) -> None:
        try:
            for k in range(15):
                f = gather_feeds(seed * 100 + k)
                np.testing.assert_allclose(s.run(None, f)[0], cpu.run(None, f)[0], rtol=1e-5, atol=1e-6)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)
    run_threads(worker, 4)
    assert errors == []


def test_a_bad_prepared_copies_value_is_an_error_naming_it(register):
    register("onnxhal.runtime.providers.opencl", "opencl")
    so = onnxhal.SessionOptions()
    so.add_session_config_entry(PREPARED_COPIES, "yes")
    with pytest.raises(InvalidArgument, match=r"session\.onnxhal\.prepared_copies.*'yes'"):
        onnxhal.InferenceSession(gather_model(), so, providers=OPENCL)


def test_uploader_and_downloader_copy_as_transfer_does(sessions):
    memory = sessions["1"].memory
    dev = memory.device_of_ep("OpenCLExecutionProvider")
    up, down = memory.uploader(dev), memory.downloader(dev)
    host = np.arange(24, dtype=np.float32).reshape(2, 3, 4)[:, :, ::2]  # a strided view
    for hold in (False, True):
        outer = memory.run_begin()
        try:
            t = up(host, hold and outer)
            assert t.shape == (2, 3, 2) and t.dtype == np.float32
            back = down(t)
        finally:
            memory.run_end()
        np.testing.assert_array_equal(back, host)
    assert down(host) is host  # a value already in host memory comes back as it is


def test_in_context_accepts_this_contexts_queues_only():
    from onnxhal.runtime.providers.opencl.device_context import OpenCLDeviceContext

    platform, index = map(int, OPENCL_INDEX.split(":"))
    device = cl.get_platforms()[platform].get_devices()[index]
    ctx = OpenCLDeviceContext(device)
    other = cl.Context([device])
    assert ctx.in_context(ctx.queue) and ctx.in_context(ctx.queue)  # remembered the second time
    assert ctx.in_context(cl.CommandQueue(ctx.context))
    assert not ctx.in_context(cl.CommandQueue(other))
    assert not ctx.in_context(None) and not ctx.in_context("queue")


def pair_sessions(model) -> dict[str, onnxhal.InferenceSession]:
    """Pair copiers on ("1") and off ("0"), with the one-call run off (it makes no copy to compare)."""
    return keyed_sessions(model, PAIR_COPIERS, OPENCL, {ONE_CALL_RUN: "0"}, cpu=False)


@pytest.mark.parametrize("model", ["gather", "resnet_ts"])
def test_pair_copiers_copy_as_copy_tensors_held_does(register, monkeypatch, model):
    """A prepared run's uploads and downloads by the transfer's ``held_copier`` (session config
    ``session.onnxhal.pair_copiers``, the default) give what ``copy_tensors_held`` gives (it "0"),
    bit for bit, and do not go through ``copy_tensors_held``."""
    register("onnxhal.runtime.providers.opencl", "opencl")
    path = os.path.join(CORPUS, f"{model}.onnx")
    made = pair_sessions(gather_model() if model == "gather" else path)
    signatures = ([gather_feeds(4), gather_feeds(5)] if model == "gather"
                  else [feeds for feeds, _ in read_signatures(path).values()])
    calls: list = []
    real = OpenCLDataTransfer.copy_tensors_held

    def counted(self, *args):
        calls.append(1)
        return real(self, *args)
    for feeds in signatures:
        for s in made.values():
            s.run(None, feeds)  # the first runs take the general path and prepare
        calls.clear()
        monkeypatch.setattr(OpenCLDataTransfer, "copy_tensors_held", counted)
        by_pair = made["1"].run(None, feeds)
        assert calls == []
        by_list = made["0"].run(None, feeds)
        assert len(calls) >= 2  # an upload and a download at least
        monkeypatch.setattr(OpenCLDataTransfer, "copy_tensors_held", real)
        for p, q in zip(by_pair, by_list):
            assert p.dtype == q.dtype and p.shape == q.shape
            np.testing.assert_array_equal(p, q)


def test_a_bad_pair_copiers_value_is_an_error_naming_it(register):
    register("onnxhal.runtime.providers.opencl", "opencl")
    so = onnxhal.SessionOptions()
    so.add_session_config_entry(PAIR_COPIERS, "2")
    with pytest.raises(InvalidArgument, match=r"session\.onnxhal\.pair_copiers.*'2'"):
        onnxhal.InferenceSession(gather_model(), so, providers=OPENCL)
