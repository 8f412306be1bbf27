"""Rule ``shape_values`` (runtime/providers/opencl/shape_values.py): small integer computations on
tensor shapes (Shape, Size, Gather, Unsqueeze, Concat, arithmetic...) are claimed with the OpenCL
partition they steer and computed on the host at its specialisation, so the partition is not cut
there and a Reshape's target is a constant of the plan. Each model runs with the rule on and off
(provider option ``disable_fusions``), onnxruntime's CPU EP judging both, on several shapes."""

from __future__ import annotations

import os

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

pytest.importorskip("pyopencl")

import onnxhal  # noqa: E402
from tests.models import inferred_bytes, int64_vi, vi  # noqa: E402
from tests.opencl_support import require_opencl  # noqa: E402

OPENCL_INDEX = require_opencl(module_level=True)
RNG = np.random.default_rng(4747)
EP = "OpenCLExecutionProvider"
CORPUS = os.path.join(os.path.dirname(__file__), "real_models")


_model, _f, _i = inferred_bytes, vi, int64_vi  # tests/models.py's


def _sessions(data: bytes) -> dict[str, onnxhal.InferenceSession]:
    # Rule shape_values alone: rule shape_tensors (tests/test_opencl_shape_tensors.py) would also
    # take the larger values these graphs compute from shapes (Range) into the partition.
    so = onnxhal.SessionOptions()
    so.graph_optimization_level = onnxhal.GraphOptimizationLevel.ORT_DISABLE_ALL  # the nodes as written
    return {rule: onnxhal.InferenceSession(data, so, providers=[(EP, {"disable_fusions": off}), "CPUExecutionProvider"])
            for rule, off in (("on", "shape_tensors"), ("off", "shape_values"))}


def _check(data: bytes, feeds_list: list[dict]) -> dict[str, onnxhal.InferenceSession]:
    """Both sessions' outputs against onnxruntime's (values, dtypes and shapes) on every feed."""
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    sessions = _sessions(data)
    for feeds in feeds_list:
        want = ref.run(None, feeds)
        for rule, sess in sessions.items():
            for got, w in zip(sess.run(None, feeds), want):
                got = np.asarray(got)
                assert got.dtype == w.dtype and got.shape == w.shape, (rule, got.dtype, got.shape, w.dtype, w.shape)
                np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-5, err_msg=f"rule shape_values {rule}")
    return sessions


def _partitions(sess) -> list:
    return list(sess.eps[EP].dynamic_partitions.values())


def _ops(sess, ep: str) -> set[str]:
    return {n.op_type for n in sess.assigned_nodes() if n.ep_name == ep}


def _heads(extra_outputs=()) -> bytes:
    # q = x @ w; Reshape(q, [dim0(q), dim1(q), 4, 8]) -> Transpose -> Relu: the Reshape's target from
    # the Shape of a value the partition makes, as TorchScript exports write a head split.
    nodes = [helper.make_node("MatMul", ["x", "w"], ["q"]),
             helper.make_node("Shape", ["q"], ["s"]),
             helper.make_node("Gather", ["s", "i0"], ["b"], axis=0),
             helper.make_node("Gather", ["s", "i1"], ["t"], axis=0),
             helper.make_node("Concat", ["b", "t", "hd"], ["shape4"], axis=0),
             helper.make_node("Reshape", ["q", "shape4"], ["q4"]),
             helper.make_node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
             helper.make_node("Relu", ["qt"], ["y"])]
    consts = {"w": RNG.standard_normal((32, 32)).astype(np.float32) * 0.2, "i0": np.array([0], np.int64),
              "i1": np.array([1], np.int64), "hd": np.array([4, 8], np.int64)}
    return _model(nodes, [_f("x", ["batch", "seq", 32])],
                  [_f("y", ["batch", 4, "seq", 8]), *(_i(o, None) for o in extra_outputs)], consts)


def _x(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def test_a_reshape_fed_by_a_shape_chain_joins_the_partition(opencl):
    data = _heads()
    sessions = _check(data, [{"x": _x(2, 5, 32)}, {"x": _x(1, 9, 32)}, {"x": _x(2, 5, 32)}])
    on, off = sessions["on"], sessions["off"]
    assert _ops(on, "CPUExecutionProvider") == set()  # the whole model on OpenCL
    assert _ops(off, "CPUExecutionProvider") == {"Shape", "Gather", "Concat"}
    (part,) = _partitions(on)
    assert len(_partitions(off)) == 2  # the chain on the host lies between MatMul and Reshape
    assert (part.stats.misses, part.stats.hits, part.stats.host_runs) == (2, 1, 0)
    # Each specialisation's plan: the GEMM, then Relu reading the head split's Transpose through strides
    # (rule transpose_elementwise); no Shape, Gather or Concat (the Reshape is a view of the GEMM's result)
    for plan in part.cached_plans:
        assert not {"Shape", "Gather", "Concat"} & set(plan.op_types)
        kernels = [getattr(s, "kernel_name", "copy") for s in plan.steps]
        assert kernels == ["gemm_rowmajor_a", "fused_elementwise"], kernels


def test_a_shape_chain_whose_result_is_a_graph_output(opencl):
    data = _heads(extra_outputs=("shape4", "s"))
    sessions = _check(data, [{"x": _x(2, 5, 32)}, {"x": _x(3, 2, 32)}])
    on = sessions["on"]
    assert _ops(on, "CPUExecutionProvider") == set()
    (part,) = _partitions(on)
    # The partition hands its shape values over in host memory: no device copy for them.
    assert {part.graph.output_names[i] for i in part.host_outputs} == {"shape4", "s"}
    outputs = dict(zip(["y", "shape4", "s"], on.run(None, {"x": _x(1, 7, 32)})))
    assert outputs["shape4"].tolist() == [1, 7, 4, 8] and outputs["s"].tolist() == [1, 7, 32]


def test_a_chain_reading_a_value_the_partition_does_not_produce(opencl):
    # k = dim 1 of m, an input the partition never reads, computed on the host (Range reads it too):
    # Reshape(x @ w, [k, -1]). x keeps its shape while m's changes, so the partition's plan depends
    # on k's value, which must be part of its signature.
    nodes = [helper.make_node("Shape", ["m"], ["sm"]),
             helper.make_node("Gather", ["sm", "one"], ["k"], axis=0),
             helper.make_node("Range", ["zero", "k", "step"], ["r"]),
             helper.make_node("Unsqueeze", ["k", "axes"], ["ku"]),
             helper.make_node("Concat", ["ku", "minus1"], ["target"], axis=0),
             helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Reshape", ["h", "target"], ["h2"]),
             helper.make_node("Relu", ["h2"], ["y"])]
    consts = {"one": np.array(1, np.int64), "zero": np.array(0, np.int64), "step": np.array(1, np.int64),
              "axes": np.array([0], np.int64), "minus1": np.array([-1], np.int64),
              "w": RNG.standard_normal((12, 12)).astype(np.float32)}
    data = _model(nodes, [_f("x", ["b", 12]), _f("m", ["b", "k"])], [_f("y", None), _i("r", None)], consts)
    feeds = [{"x": _x(2, 12), "m": _x(2, k)} for k in (3, 4, 6, 4)]
    sessions = _check(data, feeds)
    on = sessions["on"]
    assert _ops(on, "CPUExecutionProvider") == {"Shape", "Gather", "Range"}  # Range is not a shape value
    (part,) = _partitions(on)
    assert {part.graph.input_names[i] for i in part.params} == {"k"}  # its value is in the signature
    assert (part.stats.misses, part.stats.hits) == (3, 1)


def test_size_and_negative_gather_indices(opencl):
    # Reshape(q, [Size(q) / dim(-1) of q, dim(-1) of q]) with Gather(Shape(q), -1): a flatten to rows
    # written with Size and a negative index, as exporters do.
    nodes = [helper.make_node("MatMul", ["x", "w"], ["q"]),
             helper.make_node("Shape", ["q"], ["s"]),
             helper.make_node("Gather", ["s", "last"], ["d"], axis=0),
             helper.make_node("Size", ["q"], ["n"]),
             helper.make_node("Div", ["n", "d"], ["rows"]),
             helper.make_node("Unsqueeze", ["rows", "axes"], ["ru"]),
             helper.make_node("Unsqueeze", ["d", "axes"], ["du"]),
             helper.make_node("Concat", ["ru", "du"], ["target"], axis=0),
             helper.make_node("Reshape", ["q", "target"], ["q2"]),
             helper.make_node("Sigmoid", ["q2"], ["y"])]
    consts = {"last": np.array(-1, np.int64), "axes": np.array([0], np.int64),
              "w": RNG.standard_normal((8, 16)).astype(np.float32)}
    data = _model(nodes, [_f("x", ["a", "b", 8])], [_f("y", None)], consts)
    sessions = _check(data, [{"x": _x(2, 3, 8)}, {"x": _x(1, 1, 8)}, {"x": _x(4, 5, 8)}])
    assert _ops(sessions["on"], "CPUExecutionProvider") == set()
    assert {"Shape", "Size", "Gather", "Div"} <= _ops(sessions["off"], "CPUExecutionProvider")


def test_a_partition_input_read_only_by_a_shape_is_not_copied(opencl):
    # The mask (made on the host) is read only for its shape (the Reshape's row count): it stays
    # where it is.
    # (int16: no kernel, so the host makes it; rule typed_values would cast to int32 on the device)
    nodes = [helper.make_node("Cast", ["mask_in"], ["mask"], to=TensorProto.INT16),
             helper.make_node("Shape", ["mask"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
             helper.make_node("Unsqueeze", ["b", "axes"], ["bu"]),
             helper.make_node("Concat", ["bu", "minus1"], ["target"], axis=0),
             helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Reshape", ["r", "target"], ["y"])]
    consts = {"zero": np.array(0, np.int64), "axes": np.array([0], np.int64), "minus1": np.array([-1], np.int64)}
    data = _model(nodes, [_f("x", ["b", "s", 4]), _i("mask_in", ["b", "s"])], [_f("y", None)], consts)
    sessions = _check(data, [{"x": _x(2, 3, 4), "mask_in": np.ones((2, 3), np.int64)},
                             {"x": _x(3, 1, 4), "mask_in": np.ones((3, 1), np.int64)}])
    on = sessions["on"]
    (part,) = _partitions(on)
    assert [part.graph.input_names[i] for i in part.metadata_inputs] == ["mask"]
    copies = [s.label for s in on.plan.steps if s.node is None]
    assert not any(label.startswith("copy mask ") for label in copies), copies


@pytest.mark.parametrize("name", ["bert_ts", "gpt2_ts"])
def test_torchscript_transformers_are_not_cut_by_their_shape_chains(opencl, name):
    from onnxhal.stored_outputs import read_signatures

    path = os.path.join(CORPUS, f"{name}.onnx")
    signatures = read_signatures(path)
    with open(path, "rb") as f:
        data = f.read()
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    launches, parts = {}, {}
    for off in ("", "shape_values"):
        sess = onnxhal.InferenceSession(data, providers=[(EP, {"disable_fusions": off}), "CPUExecutionProvider"])
        for feeds, _ in signatures.values():
            for got, want in zip(sess.run(None, feeds), ref.run(None, feeds)):
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"{name} disable_fusions={off!r}")
        infos = _partitions(sess)
        assert all(i.stats.host_runs == 0 for i in infos)
        parts[off] = len(infos)
        launches[off] = sum(i.cached_plans[-1].launches_per_run for i in infos)
    # Rule on: each model is one partition (the mask, built on the host from the shape of the ids
    # since pass redirect_shape_reads, waits on no partition), and the head splits and merges copy nothing.
    assert parts[""] == 1 and parts["shape_values"] > 2 * parts[""], parts
    assert launches[""] < launches["shape_values"], launches


def test_a_simulated_device_that_declines_int64_still_declines_shape_chains():
    from tests.conftest import simulated_or_skip

    data = _heads()
    x = _x(2, 5, 32)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    with simulated_or_skip("generic-gpu") as sims:  # float32/float16 only, symbolic dims allowed
        (device,) = sims.values()
        so = onnxhal.SessionOptions()
        so.add_provider_for_devices([device])
        sess = onnxhal.InferenceSession(data, so)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=2e-2, atol=2e-2)
        name = device.ep_name
        assert _ops(sess, "CPUExecutionProvider") == {"Shape", "Gather", "Concat"}
        declined = sess.eps[name].declined
        chain = [n for n in sess.assigned_nodes() if n.op_type in ("Gather", "Concat")]
        assert all("int64" in declined[n.name or n.op_type] for n in chain), declined


BRIDGE_CHECK = """
import json, sys
import numpy as np
import onnxruntime as ort
import onnxhal.ort_plugin as plugin
from tests.test_opencl_shape_values import _heads

plugin.configure(profiles=["intel-gpu"])  # int32 computed, symbolic dims allowed: it takes shape values
ort.register_execution_provider_library(plugin.REGISTRATION_NAME, plugin.library_path())
data = _heads(extra_outputs=("shape4", "s"))
dev = next(d for d in ort.get_ep_devices() if d.ep_name == "VirtualGpuExecutionProvider")
so = ort.SessionOptions()
so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
so.add_provider_for_devices([dev], {})
sess = ort.InferenceSession(data, so)
ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
out = []
for shape in ((2, 5, 32), (1, 7, 32), (2, 5, 32)):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    for a, b in zip(sess.run(None, {"x": x}), ref.run(None, {"x": x})):
        out.append([str(a.dtype), list(a.shape), str(b.dtype), list(b.shape),
                    float(np.abs(a.astype(np.float64) - b).max()), float(np.abs(b).max())])
ops = sorted(n.op_type for s in sess.get_provider_graph_assignment_info() if s.ep_name != "CPUExecutionProvider"
             for n in s.get_nodes())
print(json.dumps({"outputs": out, "device_ops": ops}))
"""


def test_shape_value_outputs_reach_onnxruntime_through_the_bridge():
    # Inside onnxruntime (the plugin EP library) the partition's shape-value outputs are host arrays
    # that the bridge copies into the tensors onnxruntime allocated for them.
    import json
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", BRIDGE_CHECK], cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(done.stdout.strip().splitlines()[-1])
    assert r["device_ops"] == ["Concat", "Gather", "Gather", "MatMul", "Relu", "Reshape", "Shape", "Transpose"]
    for got_dtype, got_shape, want_dtype, want_shape, err, scale in r["outputs"]:
        assert (got_dtype, got_shape) == (want_dtype, want_shape)
        assert err <= 2e-2 + 2e-2 * scale  # intel-gpu stores float32 as float16; the shapes are exact
        if got_dtype == "int64":
            assert err == 0


def _embeddings() -> bytes:
    # Token and position embeddings as exporters write them: Gather(tok, ids) with the ids a graph
    # input, and Gather(pos, Range(0, dim1(ids))) whose indices follow from a shape alone.
    nodes = [helper.make_node("Shape", ["ids"], ["s"]),
             helper.make_node("Gather", ["s", "one"], ["t"], axis=0),
             helper.make_node("Range", ["zero", "t", "step"], ["pos"]),
             helper.make_node("Gather", ["tok", "ids"], ["e"], axis=0),
             helper.make_node("Gather", ["posw", "pos"], ["p"], axis=0),
             helper.make_node("Add", ["e", "p"], ["h"]),
             helper.make_node("MatMul", ["h", "w"], ["y"])]
    consts = {"one": np.array(1, np.int64), "zero": np.array(0, np.int64), "step": np.array(1, np.int64),
              "tok": RNG.standard_normal((50, 16)).astype(np.float32),
              "posw": RNG.standard_normal((20, 16)).astype(np.float32),
              "w": RNG.standard_normal((16, 16)).astype(np.float32)}
    return _model(nodes, [_i("ids", ["batch", "seq"])], [_f("y", ["batch", "seq", 16])], consts)


def test_token_ids_do_not_key_the_specialisation(opencl):
    # A [2, 12] int64 input is as small as a shape value, but it is data: new token ids at the same
    # shape must reuse the specialisation (uploading them), never build one per sequence and
    # evict the shapes the cache holds. The position indices, computed from the shape alone, stay
    # constants of each specialisation.
    data = _embeddings()
    feeds = [{"ids": RNG.integers(0, 50, (2, 12))} for _ in range(5)] + [{"ids": RNG.integers(0, 50, (3, 7))}]
    sessions = _check(data, feeds)
    for rule, sess in sessions.items():
        (part,) = _partitions(sess)
        assert {part.graph.input_names[i] for i in part.params} == {"pos"}, rule
        assert part.graph.input_names.index("ids") in part.host_inputs, rule  # the plan uploads them
        assert (part.stats.misses, part.stats.hits, part.stats.host_runs) == (2, 4, 0), (rule, part.stats)


@pytest.mark.parametrize("name", ["bert_ts", "gpt2_ts", "t5_encoder_ts", "bert_dynamo"])
def test_new_token_ids_and_masks_at_one_shape_reuse_the_specialisation(opencl, name):
    # The corpus transformers fed new token ids and attention masks at the stored shape: every
    # output as onnxruntime's (a specialisation keyed on stale data would be silently wrong), and
    # each partition specialised once (keyed on the data, each run would build a plan).
    from onnxhal.stored_outputs import read_signatures

    path = os.path.join(CORPUS, f"{name}.onnx")
    feeds, _ = read_signatures(path)["a"]
    with open(path, "rb") as f:
        data = f.read()
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    sess = onnxhal.InferenceSession(data, providers=[(EP, {}), "CPUExecutionProvider"])
    ids = np.asarray(feeds["input_ids"])
    runs = 5
    for k in range(runs):
        mask = np.ones_like(ids)
        mask[0, ids.shape[1] - 1 - k:] = 0  # a different padding each run
        new = {**feeds, "input_ids": RNG.integers(0, int(ids.max()) + 1, ids.shape), "attention_mask": mask}
        for got, want in zip(sess.run(None, new), ref.run(None, new)):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"{name} run {k}")
    infos = _partitions(sess)
    assert infos and all((i.stats.misses, i.stats.hits, i.stats.host_runs) == (1, runs - 1, 0) for i in infos), \
        [i.stats for i in infos]
    # what keys a signature follows from shapes and constants alone
    for i in infos:
        assert {i.graph.input_names[k] for k in i.params} <= i.shape_derived, (i.graph.name, i.shape_derived)


def test_a_saved_partition_keeps_which_indices_key_its_signature(opencl):
    # An EPContext blob holds the partition's graph, not the whole graph that told which inputs
    # follow from shapes: the plan carries them, so a loaded partition folds the position ids as
    # the compiled one does and still uploads the token ids.
    from onnxhal.runtime.providers.opencl.dynamic_partition import DynamicPartitionPlan

    sess = _sessions(_embeddings())["on"]
    (part,) = _partitions(sess)
    saved = DynamicPartitionPlan.of(part)
    assert saved.shape_derived == ["pos"]
    loaded = saved.compute_info(part.device, part.allocator, part.logger)
    assert loaded.params == part.params and {loaded.graph.input_names[i] for i in loaded.params} == {"pos"}
