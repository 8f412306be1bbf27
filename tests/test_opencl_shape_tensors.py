"""Rule ``shape_tensors`` (runtime/providers/opencl/shape_values.py): values of any size computed
from tensor shapes and constants alone (position ids: Range, Expand, GatherElements of a constant
table) are claimed with the OpenCL partition and computed at its specialisation, where the CPU EP
ran them before the partition at every run.

Each such value is a function of the partition's signature (its input shapes), never of the data
fed: new ids and masks at one shape must reuse the specialisation (no miss) and give
onnxruntime's outputs, with the rule on and off."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxhal

RNG = np.random.default_rng(4747)
CORPUS = os.path.join(os.path.dirname(__file__), "real_models")
RULE = "shape_tensors"


def _opencl(register) -> None:
    pytest.importorskip("pyopencl")
    from tests.opencl_support import require_opencl

    require_opencl()
    register("onnxhal.runtime.providers.opencl", "opencl")


def _sessions(data: bytes, optimize: bool = True) -> dict[str, onnxhal.InferenceSession]:
    so = onnxhal.SessionOptions()
    if not optimize:  # the nodes as written: no constant folding of the Shapes of static inputs
        so.graph_optimization_level = onnxhal.GraphOptimizationLevel.ORT_DISABLE_ALL
    return {rule: onnxhal.InferenceSession(data, so, providers=[
        ("OpenCLExecutionProvider", {"disable_fusions": disabled}), "CPUExecutionProvider"])
        for rule, disabled in (("on", ""), ("off", RULE))}


def _host_nodes(s: onnxhal.InferenceSession) -> int:
    return s.partition_summary.get("CPUExecutionProvider", 0)


def _check(data: bytes, sessions: dict, feeds_list: list[dict]) -> None:
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for feeds in feeds_list:
        want = ref.run(None, feeds)
        for rule, s in sessions.items():
            got = s.run(None, feeds)
            for w, g in zip(want, got):
                assert g.shape == w.shape, (rule, {k: v.shape for k, v in feeds.items()})
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=rule)


def _position_embeddings(dims: tuple = ("B", "S")) -> bytes:
    """Token plus position embeddings, the position ids made from the ids' shape (Range, Unsqueeze,
    Expand to [batch, seq]), and a causal bias from the shape (Range, Less, Where) added to a
    product of the embeddings: [batch, seq, seq]."""
    c = {"zero": np.array(0, np.int64), "one": np.array(1, np.int64), "i0": np.array([0], np.int64),
         "i1": np.array([1], np.int64), "ax0": np.array([0], np.int64), "ax1": np.array([1], np.int64),
         "tok": RNG.standard_normal((50, 8)).astype(np.float32),
         "pos": RNG.standard_normal((32, 8)).astype(np.float32),
         "neg": np.array(-1e4, np.float32), "nil": np.array(0.0, np.float32)}
    nodes = [
        helper.make_node("Shape", ["ids"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["seq"], axis=0),
        helper.make_node("Range", ["zero", "seq", "one"], ["r"]),
        helper.make_node("Unsqueeze", ["r", "ax0"], ["r2"]),
        helper.make_node("Expand", ["r2", "shape"], ["pos_ids"]),
        helper.make_node("Gather", ["tok", "ids"], ["te"], axis=0),
        helper.make_node("Gather", ["pos", "pos_ids"], ["pe"], axis=0),
        helper.make_node("Add", ["te", "pe"], ["emb"]),
        helper.make_node("Transpose", ["emb"], ["embT"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["emb", "embT"], ["scores"]),
        helper.make_node("Unsqueeze", ["r", "ax1"], ["rc"]),
        helper.make_node("Less", ["r2", "rc"], ["future"]),  # [seq, seq]: key after query
        helper.make_node("Where", ["future", "neg", "nil"], ["bias"]),
        helper.make_node("Add", ["scores", "bias"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, list(dims))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in c.items()])
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    model.ir_version = 10
    return model.SerializeToString()


def test_position_ids_and_causal_bias_join_the_partition(register):
    """With the rule, the Range/Expand/Less/Where chains made from the ids' shape run in the
    partition (no host node); new ids at one shape reuse the specialisation; other shapes and
    the rule off give onnxruntime's outputs."""
    _opencl(register)
    data = _position_embeddings()
    sessions = _sessions(data)
    assert _host_nodes(sessions["on"]) == 0, sessions["on"].partition_summary
    assert _host_nodes(sessions["off"]) > 0, sessions["off"].partition_summary
    ids = lambda *s: RNG.integers(0, 50, s).astype(np.int64)  # noqa: E731
    feeds = [{"ids": ids(2, 12)}, {"ids": ids(2, 12)}, {"ids": ids(1, 5)}, {"ids": ids(3, 20)}, {"ids": ids(2, 12)}]
    _check(data, sessions, feeds)
    (info,) = sessions["on"].eps["OpenCLExecutionProvider"].dynamic_partitions.values()
    misses = info.stats.misses
    for _ in range(3):
        sessions["on"].run(None, {"ids": ids(2, 12)})
    assert info.stats.misses == misses and info.stats.host_runs == 0, info.stats
    assert info.cached_signatures == 3


def _real(name: str) -> tuple[bytes, dict]:
    path = os.path.join(CORPUS, f"{name}.onnx")
    if not os.path.exists(path):
        pytest.skip(f"{name} not in the corpus")
    with open(path, "rb") as f:
        data = f.read()
    stored = np.load(os.path.join(CORPUS, f"{name}.npz"))
    return data, {k[2:]: stored[k] for k in stored.files if k.startswith("a.") and not k.startswith("a.__")}


def _variants(feeds: dict) -> list[dict]:
    """The stored feeds, then new ids and masks at their shape."""
    ids, mask = feeds["input_ids"], feeds["attention_mask"]
    out = [feeds]
    for _ in range(3):
        m = np.ones_like(mask)
        m[:, RNG.integers(1, mask.shape[1]):] = 0
        out.append({"input_ids": RNG.integers(0, 50, ids.shape).astype(ids.dtype), "attention_mask": m})
    return out


@pytest.mark.parametrize("name", ["bert_ts", "gpt2_ts", "t5_encoder_ts"])
def test_real_exports_fewer_host_nodes(name, register):
    """BERT's position-id chain joins the one partition: fewer host nodes; for each, the
    same outputs as onnxruntime on new ids and masks, and no new specialisation for them."""
    _opencl(register)
    data, feeds = _real(name)
    sessions = _sessions(data)
    on, off = _host_nodes(sessions["on"]), _host_nodes(sessions["off"])
    # (GPT-2's and T5's remaining host chains are those of the mask, which reads attention_mask's values)
    assert on < off if name == "bert_ts" else on <= off, (on, off)
    variants = _variants(feeds)
    _check(data, sessions, variants)
    (info,) = sessions["on"].eps["OpenCLExecutionProvider"].dynamic_partitions.values()
    misses = info.stats.misses
    for f in variants[1:] * 2:
        sessions["on"].run(None, f)
    assert info.stats.misses == misses and info.stats.host_runs == 0, info.stats


def test_a_chain_the_host_also_reads_stays_data(register):
    """The host reads the Range (an int64 Max with the ids): the Range stays on the host, so what
    the partition computes from it is data there. The Unsqueeze of it must not be taken as a value
    to fold (in the partition it would be an int64 device node and every signature would run on
    the host), and the position Gather reading it is claimed as a device node, as with the rule off."""
    _opencl(register)
    c = {"zero": np.array(0, np.int64), "one": np.array(1, np.int64), "ax0": np.array([0], np.int64),
         "tok": RNG.standard_normal((50, 8)).astype(np.float32),
         "pos": RNG.standard_normal((32, 8)).astype(np.float32)}
    nodes = [
        helper.make_node("Shape", ["ids"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["seq"], axis=0),
        helper.make_node("Range", ["zero", "seq", "one"], ["r"]),
        helper.make_node("Unsqueeze", ["r", "ax0"], ["pos_ids"]),
        helper.make_node("Gather", ["tok", "ids"], ["te"], axis=0),
        helper.make_node("Gather", ["pos", "pos_ids"], ["pe"], axis=0),
        helper.make_node("Add", ["te", "pe"], ["emb"]),
        helper.make_node("Relu", ["emb"], ["y"]),
        # int64 Max has no OpenCL kernel (rule typed_values takes integer Add), so the host reads r
        helper.make_node("Max", ["ids", "r"], ["shifted"]),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["B", "S"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("shifted", TensorProto.INT64, None)],
                              [numpy_helper.from_array(v, k) for k, v in c.items()])
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    model.ir_version = 10
    data = model.SerializeToString()
    sessions = _sessions(data)
    placed = {rule: {n.name or n.op_type + n.outputs[0]: n.ep_name for n in s.assigned_nodes()}
              for rule, s in sessions.items()}
    assert placed["on"] == placed["off"]
    ids = lambda *s: RNG.integers(0, 50, s).astype(np.int64)  # noqa: E731
    _check(data, sessions, [{"ids": ids(2, 12)}, {"ids": ids(2, 12)}, {"ids": ids(3, 5)}])
    for s in sessions.values():
        for info in s.eps["OpenCLExecutionProvider"].dynamic_partitions.values():
            assert info.stats.host_runs == 0, info.stats


def test_small_token_ids_of_fixed_shape_never_key_a_specialisation(register):
    """With fixed dims, ``ids`` [2, 12] is as small as a shape value: in the partition it is still
    data, so what is computed from it (the token embeddings) is never folded into a specialisation
    keyed on its values. New ids reuse the one specialisation and give onnxruntime's outputs."""
    _opencl(register)
    data = _position_embeddings((2, 12))
    sessions = _sessions(data, optimize=False)
    ids = lambda: RNG.integers(0, 50, (2, 12)).astype(np.int64)  # noqa: E731
    _check(data, sessions, [{"ids": ids()} for _ in range(4)])
    (info,) = sessions["on"].eps["OpenCLExecutionProvider"].dynamic_partitions.values()
    assert info.stats.misses == 1 and info.stats.host_runs == 0, info.stats
    assert info.graph.input_names.index("ids") not in info.params
