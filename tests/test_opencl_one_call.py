"""The one-call run (session config ``session.onnxhal.one_call_run``, ``HostEntry.one_call``): a
prepared run whose plan is one OpenCL fused node reading only feeds and producing every output is
handed to ``PartitionState.run_host``, one native call (feed writes, the replayed launches, output
reads, one finish); a partition specialised per input signature (``DynamicNodeComputeInfo``) hands
it to its cached signature's state. Held to the run that copies and launches one by one (the key at
"0") bit for bit and to the CPU EP; the cases it declines (a non-contiguous feed, Gather indices out
of range, a new signature or a parameter whose value changed, a plan with a node on the host) run
as before; bad feeds keep their typed errors."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("pyopencl")

import onnxhal  # noqa: E402
from onnxhal.hal.errors import InvalidArgument  # noqa: E402
from onnxhal.runtime.providers.opencl import native_replay  # noqa: E402
from onnxhal.runtime.providers.opencl.partition_plan import PartitionState  # noqa: E402
from onnxhal.runtime.session.run_codegen import ONE_CALL_RUN  # noqa: E402
from onnxhal.stored_outputs import read_signatures  # noqa: E402
from tests.opencl_support import close_sessions, keyed_sessions, require_opencl  # noqa: E402
from tests.threads import run_threads

OPENCL_INDEX = require_opencl(module_level=True)
if native_replay.replay_module() is None:
    pytest.skip(f"native replay unavailable: {native_replay.unavailable}", allow_module_level=True)

OPENCL = [("OpenCLExecutionProvider", {"cost_rule": "off"}), "CPUExecutionProvider"]
CORPUS = os.path.join(os.path.dirname(__file__), "real_models")


def mlp(host_tail: bool = False) -> bytes:
    """Two inputs, three outputs in another order than the fused node's (the index maps), fixed
    shapes; ``host_tail``: a string-typed Cast after it, which the OpenCL EP leaves to the CPU."""
    rng = np.random.default_rng(5)
    w1 = rng.standard_normal((16, 32)).astype(np.float32)
    w2 = rng.standard_normal((32, 8)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y"]),
             helper.make_node("Tanh", ["y"], ["t"])]
    outputs = [helper.make_tensor_value_info("t", TensorProto.FLOAT, [4, 8]),
               helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8]),
               helper.make_tensor_value_info("r", TensorProto.FLOAT, [4, 32])]
    if host_tail:
        nodes.append(helper.make_node("Cast", ["t"], ["s"], to=TensorProto.STRING))
        outputs.append(helper.make_tensor_value_info("s", TensorProto.STRING, [4, 8]))
    graph = helper.make_graph(nodes, "one_call", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16]),
                                                  helper.make_tensor_value_info("b", TensorProto.FLOAT, [4, 32])],
                              outputs, [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def feeds(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((4, 16)).astype(np.float32), "b": rng.standard_normal((4, 32)).astype(np.float32)}


def sessions_of(model) -> dict[str, onnxhal.InferenceSession]:
    return keyed_sessions(model, ONE_CALL_RUN, OPENCL)


def one_calls() -> int:
    """``run_host`` calls made so far (the native counters' finishes)."""
    return native_replay.replay_module().counters()[5]


@pytest.fixture
def sessions(register):
    register("onnxhal.runtime.providers.opencl", "opencl")
    made = sessions_of(mlp())
    yield made
    close_sessions(made)


def test_one_call_runs_equal_the_copy_by_copy_runs_bit_for_bit(sessions):
    for value in ("1", "0"):
        sessions[value].run(None, feeds(0))  # the first run prepares
    for seed in range(1, 5):
        f = feeds(seed)
        before = one_calls()
        one = sessions["1"].run(None, f)
        assert one_calls() == before + 1
        plain = sessions["0"].run(None, f)
        assert one_calls() == before + 1  # the key at "0": no one-call run
        ref = sessions["cpu"].run(None, f)
        assert [o.shape for o in one] == [(4, 8), (4, 8), (4, 32)]
        for a, b, r in zip(one, plain, ref):
            assert a.dtype == b.dtype and a.flags.writeable and a.flags.c_contiguous
            np.testing.assert_array_equal(a, b)
            np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-4)
        fetched = sessions["1"].run(["r", "t", "t"], f)
        np.testing.assert_array_equal(fetched[0], one[2])
        np.testing.assert_array_equal(fetched[1], one[0])
        assert fetched[1] is not fetched[2]  # the same output twice: two arrays, as the plain run gives


def test_a_non_contiguous_feed_is_declined_and_runs_as_before(sessions):
    s = sessions["1"]
    s.run(None, feeds(0))
    f = feeds(6)
    ref = sessions["0"].run(None, f)
    f["x"] = np.asfortranarray(f["x"])
    before = one_calls()
    got = s.run(None, f)
    assert one_calls() == before  # declined: the copy-by-copy run took it
    for a, b in zip(got, ref):
        np.testing.assert_array_equal(a, b)
    s.run(None, feeds(7))
    assert one_calls() == before + 1


def test_bad_feeds_keep_their_typed_errors(sessions):
    s = sessions["1"]
    s.run(None, feeds(0))
    bad = feeds(1)
    bad["x"] = bad["x"].astype(np.float64)
    with pytest.raises(InvalidArgument, match="x"):
        s.run(None, bad)
    with pytest.raises(InvalidArgument, match="b"):
        s.run(None, {"x": feeds(1)["x"], "b": np.zeros((4, 31), np.float32)})
    np.testing.assert_array_equal(s.run(None, feeds(2))[0], sessions["0"].run(None, feeds(2))[0])


def test_a_plan_with_a_host_node_is_not_one_call(register):
    register("onnxhal.runtime.providers.opencl", "opencl")
    made = sessions_of(mlp(host_tail=True))
    made["1"].run(None, feeds(0))
    before = one_calls()
    got = made["1"].run(None, feeds(1))
    assert one_calls() == before
    assert len(got) == 4 and got[3].dtype == object
    for a, b in zip(got, made["0"].run(None, feeds(1))):
        assert a.tolist() == b.tolist()
    for a, r in zip(got[:3], made["cpu"].run(None, feeds(1))):
        np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-4)


def test_a_bad_one_call_value_is_an_error_naming_it(register):
    register("onnxhal.runtime.providers.opencl", "opencl")
    so = onnxhal.SessionOptions()
    so.add_session_config_entry(ONE_CALL_RUN, "yes")
    with pytest.raises(InvalidArgument, match=r"session\.onnxhal\.one_call_run.*'yes'"):
        onnxhal.InferenceSession(mlp(), so, providers=OPENCL)


def test_threads_share_a_one_call_session(sessions):
    s, plain = sessions["1"], sessions["0"]
    s.run(None, feeds(0))
    errors: list = []

    def worker(seed: int) -> None:
        try:
            for k in range(10):
                f = feeds(seed * 100 + k)
                for a, b in zip(s.run(None, f), plain.run(None, f)):
                    np.testing.assert_array_equal(a, b)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)
    run_threads(worker, 4)
    assert errors == []


def test_a_failed_one_call_run_is_the_plans_error_naming_the_node(register, monkeypatch, caplog):
    register("onnxhal.runtime.providers.opencl", "opencl")

    def failing(self, inputs):
        raise RuntimeError("clEnqueueWriteBuffer failed: OUT_OF_RESOURCES")
    monkeypatch.setattr(PartitionState, "run_host", failing)
    made = sessions_of(mlp())
    s = made["1"]
    s.run(None, feeds(0))  # the first runs take the general path (the state's run) and prepare
    s.run(None, feeds(0))
    with caplog.at_level("WARNING", logger="onnxhal.session"):
        got = s.run(None, feeds(1))  # the session's recovery policy: the EP error, then the CPU EP
    assert re.search(r"running OpenCLExecutionProvider\S* node .*RuntimeError: clEnqueueWriteBuffer failed: "
                     "OUT_OF_RESOURCES", caplog.text)
    for a, r in zip(got, made["cpu"].run(None, feeds(1))):
        np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-4)
    close_sessions(made)  # pytest keeps the logged error's traceback, and through it the session, past the test


def assert_same_runs(made: dict, f: dict, one_call: bool) -> None:
    """A run of ``f`` on the one-call session ("1"): by one native call where ``one_call``, else by
    the copy-by-copy path; equal to the key-"0" session's bit for bit, and to the CPU EP's."""
    before = one_calls()
    one = made["1"].run(None, f)
    assert one_calls() == before + one_call
    plain = made["0"].run(None, f)
    assert one_calls() == before + one_call
    for a, b, r in zip(one, plain, made["cpu"].run(None, f), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and a.flags.writeable
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("model", ["bert_ts", "gpt2_ts", "vit_ts", "resnet_ts"])
def test_dynamic_partitions_run_their_cached_signature_by_one_call(register, model):
    """A partition specialised per signature: each signature's first run specialises it on the
    copy-by-copy path, its later runs take one native call; back to an earlier signature too."""
    register("onnxhal.runtime.providers.opencl", "opencl")
    path = os.path.join(CORPUS, f"{model}.onnx")
    made = sessions_of(path)
    signatures = [feeds for feeds, _ in read_signatures(path).values()]
    assert len({tuple(v.shape for v in f.values()) for f in signatures}) > 1  # several signatures
    for f in signatures:
        made["0"].run(None, f)
        assert_same_runs(made, f, one_call=False)  # a new signature: specialised on the plain path
        for _ in range(2):
            assert_same_runs(made, f, one_call=True)
    assert_same_runs(made, signatures[0], one_call=True)  # still cached


def reshape_model() -> bytes:
    """A partition with a symbolic batch whose Reshape shape is fed at run time (a parameter: its
    value is part of the signature), then Gather indices of a shape-keyed table fed as data."""
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("Mul", ["r", "k"], ["m"]),
             helper.make_node("Relu", ["m"], ["y"])]
    graph = helper.make_graph(nodes, "reshape", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8]),
                                                 helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(rng.standard_normal(1).astype(np.float32), "k")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_a_parameter_whose_value_changed_runs_as_a_new_signature(register):
    register("onnxhal.runtime.providers.opencl", "opencl")
    made = sessions_of(reshape_model())
    x = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
    by_rows = {"x": x, "shape": np.array([4, 8], np.int64)}
    by_cols = {"x": x, "shape": np.array([8, 4], np.int64)}
    made["0"].run(None, by_rows)
    assert_same_runs(made, by_rows, one_call=False)
    assert_same_runs(made, by_rows, one_call=True)
    assert_same_runs(made, by_cols, one_call=False)  # same shapes, another value: specialised again
    assert_same_runs(made, by_cols, one_call=True)
    assert made["1"].run(None, by_cols)[0].shape == (8, 4)
    assert_same_runs(made, by_rows, one_call=True)
    with pytest.raises(InvalidArgument):  # a bad shape value: the CPU EP's typed error, as without the key
        made["1"].run(None, {"x": x, "shape": np.array([5, 8], np.int64)})


def gather_model() -> bytes:
    """Token ids, Gather indices fed in host memory, in a partition of static shapes."""
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"]), helper.make_node("Relu", ["e"], ["y"])]
    graph = helper.make_graph(nodes, "ids", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 8])],
                              [numpy_helper.from_array(rng.standard_normal((10, 8)).astype(np.float32), "table")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_gather_indices_in_range_run_by_one_call_out_of_range_keep_their_error(register):
    register("onnxhal.runtime.providers.opencl", "opencl")
    made = sessions_of(gather_model())
    ids = {"ids": np.array([[0, 9, -1], [3, -10, 4]], np.int64)}  # negative indices count from the end
    made["1"].run(None, ids)
    assert_same_runs(made, ids, one_call=True)
    before = one_calls()
    with pytest.raises(InvalidArgument, match=r"index 10 in 'ids' is out of range"):
        made["1"].run(None, {"ids": np.array([[0, 10, 1], [2, 3, 4]], np.int64)})
    assert one_calls() == before  # declined before anything was enqueued: the plain path's error
    assert_same_runs(made, ids, one_call=True)


def test_a_one_call_run_is_counted_where_the_session_counts_partition_runs(register):
    """A partition that tells the session where it ran (``hal/settled_host.py``) tells it of its
    one-call runs too: on the device, its signature untried (here)."""
    from onnxhal.hal.settled_host import SETTLE_TALLY, SettleTally

    register("onnxhal.runtime.providers.opencl", "opencl")
    path = os.path.join(CORPUS, "resnet_ts.onnx")
    made = sessions_of(path)
    f = next(iter(read_signatures(path).values()))[0]
    made["1"].run(None, f)
    (info,) = made["1"].eps["OpenCLExecutionProvider"].dynamic_partitions.values()
    info.settles_on_host = True
    tally = SettleTally(1)
    token = SETTLE_TALLY.set(tally)
    try:
        out = info.run_host(list(f.values()))
    finally:
        SETTLE_TALLY.reset(token)
    assert out is not None and (tally.runs, tally.host, tally.tried) == (1, 0, 0)
    np.testing.assert_array_equal(out[0], made["0"].run(None, f)[0])


def test_threads_share_a_dynamic_partition_across_signatures(register):
    """Threads running two signatures at once: one-call runs of a cached signature beside runs that
    specialise or look up the other, each equal to the copy-by-copy session's."""
    register("onnxhal.runtime.providers.opencl", "opencl")
    path = os.path.join(CORPUS, "resnet_ts.onnx")
    made = sessions_of(path)
    signatures = [feeds for feeds, _ in read_signatures(path).values()]
    expected = [made["0"].run(None, f)[0] for f in signatures]
    made["1"].run(None, signatures[0])  # one cached, the other specialised by whichever thread comes first
    errors: list = []

    def worker(seed: int) -> None:
        try:
            for k in range(8):
                j = (seed + k) % len(signatures)
                np.testing.assert_array_equal(made["1"].run(None, signatures[j])[0], expected[j])
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)
    run_threads(worker, 4)
    assert errors == []
