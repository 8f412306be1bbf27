"""Pass ``redirect_shape_reads`` (runtime/optimizer/shape_sources.py): a Shape of a computed value
reads a graph input's dims instead where they are proven the same, never from the dim names.

Feeds that broadcast (size 1 where the declared name says N) and new ids at one shape check that
a redirect never changes a result; onnxruntime's CPU EP judges, with the pass on and off."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

import onnxhal
from onnxhal.hal.errors import OrtError
from onnxhal.hal.graph import Graph
from onnxhal.runtime.optimizer import passes
from onnxhal.runtime.optimizer.shape_sources import redirect_shape_reads, shape_sources
from tests.models import inferred_bytes, int64_vi, vi

RNG = np.random.default_rng(4748)
CORPUS = os.path.join(os.path.dirname(__file__), "real_models")
PASS = "redirect_shape_reads"


_model, _f, _i = inferred_bytes, vi, int64_vi  # tests/models.py's


def _graph(data: bytes) -> Graph:
    m = onnx.load_from_string(data)
    return Graph.from_proto(m.graph, {o.domain: o.version for o in m.opset_import})


def _shape_reads(data: bytes) -> dict[str, str]:
    """Shape node name -> the value it reads after the pass."""
    g = _graph(data)
    redirect_shape_reads(g)
    return {n.name: n.inputs[0] for n in g.nodes if n.op_type == "Shape"}


def _dim_readout(x: str, axis: int, tag: str) -> tuple[list, str]:
    """Nodes making ``tag`` = ones of shape [Shape(x)[axis], 1]: a value whose shape is the dim read."""
    return [
        helper.make_node("Shape", [x], [f"{tag}_shape"], name=f"{tag}_Shape"),
        helper.make_node("Gather", [f"{tag}_shape", f"{tag}_axis"], [f"{tag}_dim"], axis=0),
        helper.make_node("Unsqueeze", [f"{tag}_dim", "zero_axis"], [f"{tag}_dim1"]),
        helper.make_node("Concat", [f"{tag}_dim1", "one"], [f"{tag}_target"], axis=0),
        helper.make_node("Expand", ["onef", f"{tag}_target"], [tag]),
    ], f"{tag}_axis"


def _consts(**axes: int) -> dict:
    out = {"W": RNG.standard_normal((10, 4)).astype(np.float32), "zero_axis": np.array([0], np.int64),
           "one": np.array([1], np.int64), "onef": np.array([1.0], np.float32)}
    out.update({k: np.array(v, np.int64) for k, v in axes.items()})
    return out


def _two_inputs_added() -> bytes:
    """z = Gather(W, a) + Gather(W, b), both declared [batch, seq]: Shape(z)'s dims are the larger of
    a's and b's, which the names cannot tell."""
    nodes = [helper.make_node("Gather", ["W", "a"], ["ea"]), helper.make_node("Gather", ["W", "b"], ["eb"]),
             helper.make_node("Add", ["ea", "eb"], ["z"])]
    r0, k0 = _dim_readout("z", 0, "d0")
    r1, k1 = _dim_readout("z", 1, "d1")
    return _model(nodes + r0 + r1, [_i("a", ["batch", "seq"]), _i("b", ["batch", "seq"])],
                  [_f("z", None), _f("d0", None), _f("d1", None)], _consts(**{k0: 0, k1: 1}))


def _embeddings() -> bytes:
    """BERT's embeddings as TorchScript exports them: word embeddings of ``a`` plus position
    embeddings of ``buffer[:, :seq]`` (a Slice by a's dim of a 16-position buffer), and the dims read
    back through a Transpose (the sequence at position 2, the batch at 1)."""
    nodes = [
        helper.make_node("Gather", ["W", "a"], ["ea"]),
        helper.make_node("Shape", ["a"], ["a_shape"], name="a_shape"),
        helper.make_node("Gather", ["a_shape", "one"], ["a_seq"], axis=0),
        helper.make_node("Slice", ["positions", "zero_axis", "a_seq", "one"], ["pos_ids"]),
        helper.make_node("Gather", ["W", "pos_ids"], ["ep"]),
        helper.make_node("Add", ["ea", "ep"], ["z"]),
        helper.make_node("Transpose", ["z"], ["zt"], perm=[2, 0, 1]),
    ]
    r0, k0 = _dim_readout("zt", 1, "d0")
    r1, k1 = _dim_readout("zt", 2, "d1")
    consts = _consts(**{k0: 1, k1: 2})
    consts["positions"] = np.arange(16, dtype=np.int64).reshape(1, 16) % 10
    return _model(nodes + r0 + r1, [_i("a", ["batch", "seq"])], [_f("z", None), _f("d0", None), _f("d1", None)],
                  consts)


def _sessions(data: bytes, monkeypatch: pytest.MonkeyPatch, providers: list) -> dict[str, onnxhal.InferenceSession]:
    every = list(passes.PASSES)
    out = {"on": onnxhal.InferenceSession(data, providers=providers)}
    monkeypatch.setattr(passes, "PASSES", [p for p in every if p[0] != PASS])
    out["off"] = onnxhal.InferenceSession(data, providers=providers)
    monkeypatch.setattr(passes, "PASSES", every)
    return out


def _check(data: bytes, feeds_list: list[dict], monkeypatch: pytest.MonkeyPatch, providers: list) -> None:
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    sessions = _sessions(data, monkeypatch, providers)
    for feeds in feeds_list:
        want = ref.run(None, feeds)
        for rule, s in sessions.items():
            got = s.run(None, feeds)
            for w, g in zip(want, got):
                assert g.shape == w.shape, (rule, {k: v.shape for k, v in feeds.items()})
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=rule)


def test_operands_named_alike_are_not_proven_equal(monkeypatch):
    """a and b share the names [batch, seq], but a feed may broadcast one against the other: the
    Shape of their sum keeps reading the sum, and onnxruntime's shapes come out."""
    data = _two_inputs_added()
    assert shape_sources(_graph(data)) == {}
    assert set(_shape_reads(data).values()) == {"z"}
    ids = lambda *s: RNG.integers(0, 10, s).astype(np.int64)  # noqa: E731
    _check(data, [{"a": ids(2, 3), "b": ids(2, 3)}, {"a": ids(1, 3), "b": ids(2, 3)},
                  {"a": ids(2, 1), "b": ids(2, 3)}, {"a": ids(2, 3), "b": ids(1, 1)}],
           monkeypatch, ["CPUExecutionProvider"])


def test_embeddings_shape_reads_the_ids(monkeypatch):
    """Word plus position embeddings: the batch and sequence dims of the sum are proven to be a's
    (the Slice [0:seq] of the buffer broadcasts only where it equals seq or is 1), so both Shapes
    read a, the Transpose's positions 1 and 2 taken as a's axes 0 and 1."""
    data = _embeddings()
    reads = _shape_reads(data)
    assert reads == {"a_shape": "a", "d0_Shape": "a", "d1_Shape": "a"}
    g = _graph(data)
    redirect_shape_reads(g)
    axes = {n.inputs[0]: int(np.asarray(g.initializers[n.inputs[1]])) for n in g.nodes
            if n.op_type == "Gather" and n.inputs[0] in ("d0_shape", "d1_shape")}
    assert axes == {"d0_shape": 0, "d1_shape": 1}
    ids = lambda *s: RNG.integers(0, 10, s).astype(np.int64)  # noqa: E731
    _check(data, [{"a": ids(2, 5)}, {"a": ids(2, 5)}, {"a": ids(1, 5)}, {"a": ids(3, 1)}, {"a": ids(2, 16)}],
           monkeypatch, ["CPUExecutionProvider"])


def test_a_slice_past_the_buffer_is_not_taken_for_the_sequence(monkeypatch):
    """Sequence 20 over a 16-position buffer: the sum fails to broadcast in onnxruntime and here
    alike, with the pass on and off."""
    data = _embeddings()
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    feeds = {"a": RNG.integers(0, 10, (2, 20)).astype(np.int64)}
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.Fail, match="broadcast"):
        ref.run(None, feeds)
    for s in _sessions(data, monkeypatch, ["CPUExecutionProvider"]).values():
        with pytest.raises(OrtError, match="broadcast"):
            s.run(None, feeds)


def _real(name: str) -> tuple[bytes, dict]:
    path = os.path.join(CORPUS, f"{name}.onnx")
    if not os.path.exists(path):
        pytest.skip(f"{name} not in the corpus")
    with open(path, "rb") as f:
        data = f.read()
    stored = np.load(os.path.join(CORPUS, f"{name}.npz"))
    feeds = {k[2:]: stored[k] for k in stored.files if k.startswith("a.") and not k.startswith("a.__")}
    return data, feeds


def _variants(feeds: dict) -> list[dict]:
    """The stored feeds, new ids and masks at their shape, and ids broadcast against the mask."""
    ids, mask = feeds["input_ids"], feeds["attention_mask"]
    out = [feeds]
    for _ in range(2):
        m = np.ones_like(mask)
        m[:, RNG.integers(1, mask.shape[1]):] = 0
        out.append({"input_ids": RNG.integers(0, 50, ids.shape).astype(ids.dtype), "attention_mask": m})
    out.append({"input_ids": ids[:1], "attention_mask": mask})
    return out


@pytest.mark.parametrize("name", ["bert_ts", "t5_encoder_ts"])
def test_real_exports_cpu(name, monkeypatch):
    data, feeds = _real(name)
    g = _graph(data)
    passes.optimize(g, onnxhal.GraphOptimizationLevel.ORT_ENABLE_BASIC, cpu_ep_only=False)
    assert any(n.op_type == "Shape" and n.inputs[0] == "input_ids" for n in g.nodes)
    _check(data, _variants(feeds), monkeypatch, ["CPUExecutionProvider"])


@pytest.mark.parametrize("name", ["bert_ts", "gpt2_ts", "t5_encoder_ts"])
def test_real_exports_opencl_one_partition(name, monkeypatch, register):
    """On OpenCL the TorchScript exports' mask chains no longer wait on the embeddings: one
    partition, where each was cut in two or three; outputs as onnxruntime's on every feed. The
    OpenCL rule typed_values also joins the chains to the partition (it runs them on the device),
    so the pass's own effect shows with that rule off."""
    pytest.importorskip("pyopencl")
    from tests.opencl_support import require_opencl

    require_opencl()
    register("onnxhal.runtime.providers.opencl", "opencl")
    data, feeds = _real(name)
    providers = ["OpenCLExecutionProvider", "CPUExecutionProvider"]
    sessions = _sessions(data, monkeypatch, providers)
    assert len(sessions["on"].fused_groups) == len(sessions["off"].fused_groups) == 1
    host_chains = _sessions(data, monkeypatch, [("OpenCLExecutionProvider", {"disable_fusions": "typed_values"}),
                                                "CPUExecutionProvider"])
    assert len(host_chains["on"].fused_groups) == 1
    assert len(host_chains["off"].fused_groups) > 1
    variants = _variants(feeds) if name != "gpt2_ts" else _variants(feeds)[:3]  # GPT-2's Add rejects batch 1 ids
    _check(data, variants, monkeypatch, providers)
    # The mask now reaches the partition as an input: new masks and ids at one shape must reuse its
    # specialisation (a small int64 input keys one only where a shape depends on its values).
    sessions["on"].run(None, feeds)
    (info,) = sessions["on"].eps["OpenCLExecutionProvider"].dynamic_partitions.values()
    misses = info.stats.misses
    for f in _variants(feeds)[1:3] * 2:
        sessions["on"].run(None, f)
    assert info.stats.misses == misses and info.stats.host_runs == 0, info.stats


def test_proven_broadcast_dims_hold_for_every_size():
    """Soundness of the broadcast rule: for dims drawn from static sizes, two inputs' axes and
    Slice minima, whatever sizes the axes take (0, 1 and larger), a proven output dim is the one
    numpy's broadcast gives wherever that broadcast succeeds."""
    import itertools

    from onnxhal.runtime.optimizer import shape_sources as ss

    e, f = ss.Axis("a", 0), ss.Axis("b", 0)
    pool = [1, 3, 4, e, f, ss.AxisMin(e, 4), ss.AxisMin(e, 1), ss.AxisMin(f, 4)]

    def value(d, sizes):
        if isinstance(d, int):
            return d
        if isinstance(d, ss.Axis):
            return sizes[d.name]
        return min(sizes[d.atom.name], d.bound)

    proven = 0
    for n in (2, 3):
        for dims in itertools.product(pool, repeat=n):
            got = ss.broadcast_dim(dims)
            if got is None:
                continue
            proven += 1
            for sa, sb in itertools.product((0, 1, 2, 4, 7), repeat=2):
                sizes = {"a": sa, "b": sb}
                try:
                    want = np.broadcast_shapes(*((value(d, sizes),) for d in dims))[0]
                except ValueError:
                    continue
                assert value(got, sizes) == want, (dims, sizes, got)
    assert proven > 50  # the rule proves the common cases, not nothing


def test_inferred_reshape_dim_holds_for_every_size():
    """A Reshape's -1 as ``inferred_dim`` proves it equals onnxruntime's on every size for which
    onnxruntime's Reshape succeeds (allowzero 0: the other dims' product is not 0)."""
    import itertools

    from onnxhal.runtime.optimizer import shape_sources as ss

    e, f = ss.Axis("a", 0), ss.Axis("a", 1)
    cases = [((e, f, 32), (e, f, 8)), ((e, f, 32), (e, 4)), ((e, 12), (4,)), ((e, f), (f,)), ((e, f), (e, f)),
             ((e, f, 6), (f, 3)), ((e, 6), (e, 5))]
    for dims, others in cases:
        got = ss.inferred_dim(dims, others)
        for sa, sb in itertools.product((0, 1, 2, 3, 5), repeat=2):
            sizes = {e: sa, f: sb}
            conc = [sizes.get(d, d) for d in dims]
            rest = [sizes.get(d, d) for d in others]
            total, known = int(np.prod(conc)), int(np.prod(rest))
            if known == 0 or total % known:
                continue  # onnxruntime's Reshape fails
            if got is not None:
                assert sizes.get(got, got) == total // known, (dims, others, sa, sb, got)


def test_the_walk_stops_at_the_last_shape_it_may_redirect(monkeypatch):
    """The dims a Shape reads are computed before it: the nodes after the last Shape of a computed
    value are not visited, and a graph whose Shapes all read graph inputs is not walked at all. The
    redirects found are the same."""
    from onnxhal.runtime.optimizer import shape_sources as ss

    visited: list[int] = []
    real = ss._Shapes._visit

    def counted(self, node):
        visited.append(id(node))
        return real(self, node)

    monkeypatch.setattr(ss._Shapes, "_visit", counted)
    g = _graph(_embeddings())
    last = max(k for k, n in enumerate(g.nodes) if n.op_type == "Shape")
    tail = {id(n) for n in g.nodes[last + 1:]}
    assert tail  # the readout's Gather, Unsqueeze, Concat and Expand come after the last Shape
    assert redirect_shape_reads(g)
    assert {n.name: n.inputs[0] for n in g.nodes if n.op_type == "Shape"} == \
        {"a_shape": "a", "d0_Shape": "a", "d1_Shape": "a"}
    assert visited and not set(visited) & tail

    visited.clear()  # only Shapes of a graph input now: nothing to prove, no walk
    assert shape_sources(g) == {} and visited == []
