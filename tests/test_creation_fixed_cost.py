"""Session creation's fixed cost: work a model cannot need is not done (the optimizer's passes are
skipped where the graph has none of the op types they start from), and skipping it changes
nothing: the optimized graphs are those of the passes all called, and results match onnxruntime."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxhal
from onnxhal.hal import GraphOptimizationLevel
from onnxhal.hal.graph import Graph, Node, ValueInfo
from onnxhal.runtime.loader.model_loader import load_model
from onnxhal.runtime.optimizer import passes

CORPUS = os.path.join(os.path.dirname(__file__), "real_models")


def _model(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(inits)),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10  # onnx 1.23 writes IR 14, which onnxruntime refuses
    return model


def conv_bn_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
             *(numpy_helper.from_array(v.astype(np.float32), n) for n, v in
               (("s", rng.random(4) + 0.5), ("b", rng.standard_normal(4)), ("m", rng.standard_normal(4)),
                ("v", rng.random(4) + 0.5)))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)


def transpose_model() -> onnx.ModelProto:
    return _model([helper.make_node("Transpose", ["x"], ["y"])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])


@pytest.fixture
def pass_calls(monkeypatch) -> list:
    """The names of the passes the optimizer calls during the test; the real passes run."""
    calls: list[str] = []

    def counted(name, fn):
        def call(graph):
            calls.append(name)
            return fn(graph)
        return call

    monkeypatch.setattr(passes, "PASSES", [(name, level, counted(name, fn), recurse, cpu_only)
                                           for name, level, fn, recurse, cpu_only in passes.PASSES])
    return calls


def test_passes_without_their_op_types_are_not_called(pass_calls):
    graph = load_model(transpose_model()).graph
    passes.optimize(graph, GraphOptimizationLevel.ORT_ENABLE_ALL)
    skipped = set(passes.TRIGGERS) & set(pass_calls)
    assert not skipped, f"passes called on a graph of one Transpose: {sorted(skipped)}"
    assert "fold_constants" in pass_calls  # a pass with no trigger list still runs


def test_a_pass_is_called_once_its_op_type_exists(pass_calls):
    model = conv_bn_model()
    graph = load_model(model).graph
    passes.optimize(graph, GraphOptimizationLevel.ORT_ENABLE_ALL)
    assert "fold_conv_batchnorm" in pass_calls and "adopt_fused_kernels" in pass_calls
    assert "fuse_conv_activation" not in pass_calls  # after the fold, no Add or activation follows a Conv
    assert [n.op_type for n in graph.nodes] == ["FusedConv"]  # folded, then adopted
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_a_grid_chain_pass_needs_a_grid_to_start_from(pass_calls):
    """Erf, Tanh and Mul are ops a grid chain is made of, but no value is on an 8-bit grid without a
    DequantizeLinear (or a collapsed pair): the table pass is not called; with one, it is."""
    nodes = [helper.make_node("Erf", ["x"], ["e"]), helper.make_node("Tanh", ["e"], ["t"]),
             helper.make_node("Mul", ["t", "t"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    passes.optimize(load_model(_model(nodes, inputs, outputs)).graph, GraphOptimizationLevel.ORT_ENABLE_ALL)
    assert "tabulate_grid_chains" not in pass_calls
    dq = helper.make_node("DequantizeLinear", ["q", "s", "z"], ["x"])
    inits = [numpy_helper.from_array(np.float32(0.05), "s"), numpy_helper.from_array(np.uint8(128), "z")]
    model = _model([dq, *nodes], [helper.make_tensor_value_info("q", TensorProto.UINT8, [4])], outputs, inits)
    graph = load_model(model).graph
    passes.optimize(graph, GraphOptimizationLevel.ORT_ENABLE_ALL)
    assert "tabulate_grid_chains" in pass_calls
    assert [n.op_type for n in graph.nodes] == ["DequantizeLinear", "GridTable"]


def test_the_last_dead_node_pass_runs_only_after_a_change(pass_calls, monkeypatch):
    """The optimizer's closing dead-node pass (the module function, called after the rounds, where
    the rounds call it through PASSES) is skipped where the one in the rounds found nothing and
    nothing changed after it; after a rewrite it runs."""
    closing: list[int] = []
    real = passes.opt_cleanup.remove_dead_nodes
    monkeypatch.setattr(passes.opt_cleanup, "remove_dead_nodes", lambda g: closing.append(1) or real(g))
    passes.optimize(load_model(transpose_model()).graph, GraphOptimizationLevel.ORT_ENABLE_ALL)
    assert pass_calls.count("remove_dead_nodes") == 1 and closing == []
    graph = load_model(conv_bn_model()).graph
    passes.optimize(graph, GraphOptimizationLevel.ORT_ENABLE_ALL)
    assert closing == [1]  # the adoption into FusedConv came after the rounds' dead-node pass
    assert [n.op_type for n in graph.nodes] == ["FusedConv"]


@pytest.mark.parametrize("name", ["resnet_ts_qdq_pt", "bert_eager_ts_ortopt_qdyn", "sk_kbins", "vad_if_loop_ts"])
def test_skipping_the_last_dead_node_pass_keeps_the_optimized_graph(name, monkeypatch):
    path = os.path.join(CORPUS, f"{name}.onnx")
    skipped = load_model(path).graph
    passes.optimize(skipped, GraphOptimizationLevel.ORT_ENABLE_ALL)
    real = passes._run_to_fixed_point
    monkeypatch.setattr(passes, "_run_to_fixed_point", lambda graph, ps, dead: real(graph, ps, dead) or True)
    forced = load_model(path).graph
    passes.optimize(forced, GraphOptimizationLevel.ORT_ENABLE_ALL)
    assert _signature(skipped) == _signature(forced)


@pytest.mark.parametrize("name", ["tv_shufflenet", "hf_distilbert"])
def test_a_pass_that_found_nothing_waits_for_a_change(name, monkeypatch):
    """Within a level's rounds, a pass that returned False is called again only after another pass
    changed the graph; with the skip off, the same passes change the graph in the same order."""
    def recorded(skip: bool) -> list[tuple[str, bool]]:
        calls: list[tuple[str, bool]] = []

        def counted(name, fn):
            return lambda graph: calls.append((name, fn(graph))) or calls[-1][1]

        monkeypatch.setattr(passes, "SKIP_CLEAN_PASSES", skip)
        monkeypatch.setattr(passes, "PASSES", [(n, lv, counted(n, fn), r, c) for n, lv, fn, r, c in real])
        passes.optimize(load_model(os.path.join(CORPUS, f"{name}.onnx")).graph, GraphOptimizationLevel.ORT_ENABLE_ALL)
        return calls

    real = passes.PASSES
    skipping, every = recorded(True), recorded(False)
    assert [c for c in skipping if c[1]] == [c for c in every if c[1]]
    assert len(skipping) < len(every)
    found_nothing: set[str] = set()
    for pass_name, changed in skipping:
        assert pass_name not in found_nothing, f"{pass_name} called again with no change since it found nothing"
        if changed:
            found_nothing.clear()
        else:
            found_nothing.add(pass_name)


def _index(graph) -> dict:
    names = {v for n in graph.nodes for v in (*n.inputs, *n.outputs, *n.implicit_inputs) if v}
    return {v: (id(graph.producer(v)), [id(c) for c in graph.consumers(v)]) for v in sorted(names)}


def _holder_model() -> onnx.ModelProto:
    """Identity and same-type Cast nodes around an If whose branches read an outer value: one
    Identity's output is that value (it stays), the others are bypassed, one of them into a graph
    output."""
    def branch(name: str, factor: float) -> onnx.GraphProto:
        k = numpy_helper.from_array(np.array(factor, np.float32), f"{name}_k")
        return helper.make_graph([helper.make_node("Mul", ["seen", f"{name}_k"], [f"{name}_y"])], name, [],
                                 [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [4])], [k])

    nodes = [helper.make_node("Identity", ["x"], ["a"]),
             helper.make_node("Cast", ["a"], ["b"], to=TensorProto.FLOAT),
             helper.make_node("Identity", ["b"], ["seen"]),  # read inside the branches: kept
             helper.make_node("If", ["c"], ["z"], then_branch=branch("then", 2.0), else_branch=branch("else", 3.0)),
             helper.make_node("Relu", ["seen"], ["r"]),
             helper.make_node("Identity", ["r"], ["y"])]  # into a graph output: the Relu writes y
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
                          helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                  [helper.make_tensor_value_info("z", TensorProto.FLOAT, None),
                   helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])


def test_no_op_removal_keeps_the_index_of_a_graph_holding_subgraphs():
    """Bypassing no-op nodes in a graph with an If updates the producer/consumer maps node by node,
    not by a rebuild per node: the maps equal a full reindex's, the value the branches read stays,
    and the session's values are onnxruntime's."""
    from onnxhal.runtime.optimizer.cleanup import eliminate_no_ops

    model = _holder_model()
    graph = load_model(model).graph
    assert eliminate_no_ops(graph)
    assert [n.op_type for n in graph.nodes] == ["Identity", "If", "Relu"]
    assert graph.nodes[0].outputs == ("seen",) and graph.nodes[0].inputs == ("x",) and graph.nodes[2].outputs == ("y",)
    incremental = _index(graph)
    graph.reindex()
    assert incremental == _index(graph)
    feeds = {"x": np.array([-1.0, 0.5, 2.0, -3.0], np.float32), "c": np.array(True)}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_no_op_removal_in_ssdlite_keeps_the_index():
    """SSDlite: 100 no-op candidates among 1,067 nodes, one of them a Loop."""
    from onnxhal.runtime.optimizer.cleanup import eliminate_no_ops

    graph = load_model(os.path.join(CORPUS, "tv_ssdlite.onnx")).graph
    assert any(n.subgraphs for n in graph.nodes)
    assert eliminate_no_ops(graph)
    incremental = _index(graph)
    graph.reindex()
    assert incremental == _index(graph)


def test_every_trigger_list_names_a_pass():
    assert set(passes.TRIGGERS) <= {p[0] for p in passes.PASSES}
    assert set(passes.PARTNERS) <= {p[0] for p in passes.PASSES}


def test_a_pass_is_skipped_without_the_partner_its_match_needs(pass_calls):
    """A Conv then a Relu: the Conv passes that fold a BatchNormalization, a Mul or Add, or a channel
    shuffle are not called (the graph holds no op they need after the Conv); the activation fusion
    is, and the graph and its values are onnxruntime's."""
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    graph = load_model(model).graph
    passes.optimize(graph, GraphOptimizationLevel.ORT_ENABLE_ALL)
    assert not {"fold_conv_batchnorm", "fold_conv_mul_add", "fuse_channel_shuffle", "fuse_conv_gated_activation"} \
        & set(pass_calls)
    assert "fuse_conv_activation" in pass_calls
    assert [(n.op_type, n.attr("activation")) for n in graph.nodes] == [("FusedConv", "Relu")]
    feeds = {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_every_activation_a_fusion_takes_is_in_the_partner_set():
    """``activation_of`` answers None for any op type outside ``ACTIVATION_OPS`` (which the
    activation fusions' partner sets are made of), and names one for each inside it."""
    from onnxhal.runtime.optimizer.fusions import ACTIVATION_OPS, activation_of

    for op in sorted(ACTIVATION_OPS | {"Abs", "Elu", "Softplus", "HardSwish", "Mul"}):
        node = Node(op, ["x"], ["y"])
        graph = Graph("g", [node], [ValueInfo.tensor("x", TensorProto.FLOAT, [2, 3])], [ValueInfo("y")])
        found = activation_of(graph, node)
        assert (found is not None) == (op in ACTIVATION_OPS), op


def test_the_element_type_census_finds_outer_and_initializer_values():
    """``Graph.holds_elem_type``: False proves no value of the type; a float16 initializer, or a
    float16 value of the outer graph a subgraph reads, is found."""
    f32 = load_model(transpose_model()).graph
    assert not f32.holds_elem_type(TensorProto.FLOAT16) and f32.holds_elem_type(TensorProto.FLOAT)
    half = numpy_helper.from_array(np.ones(3, np.float16), "h")
    graph = load_model(_model([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)],
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [half])).graph
    assert graph.holds_elem_type(TensorProto.FLOAT16)  # the unread initializer alone
    body = Graph("body", [Node("Relu", ["o"], ["p"])], [], [ValueInfo.tensor("p", TensorProto.FLOAT, [3])], parent=f32)
    assert not body.holds_elem_type(TensorProto.FLOAT16)
    body.parent = graph
    graph.set_value_info(ValueInfo.tensor("q", TensorProto.FLOAT16, [3]))
    assert not body.holds_elem_type(TensorProto.FLOAT16)  # an outer float16 value the body does not read
    graph.set_value_info(ValueInfo.tensor("o", TensorProto.FLOAT16, [3]))
    assert body.holds_elem_type(TensorProto.FLOAT16)  # the one it reads


def _signature(graph) -> tuple:
    nodes = [(n.op_type, n.domain, n.name, n.inputs, n.outputs,
              sorted((k, repr(v)) for k, v in n.attributes.items() if k not in n.subgraphs),
              [_signature(s) for s in n.subgraph_list()]) for n in graph.nodes]
    inits = sorted((k, v.dtype.str, v.shape, v.tobytes() if v.dtype != object else repr(v))
                   for k, v in graph.initializers.items())
    return nodes, inits


@pytest.mark.parametrize("name", ["resnet_ts_qdq_pt", "crnn_ts_qdyn", "bert_eager_ts_ortopt_qdyn", "paddle_lcnet",
                                  "sk_logreg_zipmap", "vad_if_loop_ts", "tf2onnx_keras_cnn", "tv_shufflenet",
                                  "mobilenet_dynamo", "bert_ts_fp16", "hf_gptj", "tv_ssdlite"])
@pytest.mark.parametrize("cpu_ops", [True, False])
def test_skipping_passes_keeps_the_optimized_graph(name, cpu_ops, monkeypatch):
    """The op-type tests (``TRIGGERS``, ``PARTNERS``) and the float16 census skip only passes that
    would change nothing: with all of them off, every pass runs and the graph comes out the same."""
    path = os.path.join(CORPUS, f"{name}.onnx")
    kwargs = {"fuse_cpu_ops": cpu_ops, "cpu_ep_only": cpu_ops}
    with_triggers = load_model(path).graph
    passes.optimize(with_triggers, GraphOptimizationLevel.ORT_ENABLE_ALL, **kwargs)
    monkeypatch.setattr(passes, "TRIGGERS", {})
    monkeypatch.setattr(passes, "PARTNERS", {})
    monkeypatch.setattr(passes, "SKIP_CLEAN_PASSES", False)
    monkeypatch.setattr(Graph, "holds_elem_type", lambda self, elem_type: True)
    every_pass = load_model(path).graph
    passes.optimize(every_pass, GraphOptimizationLevel.ORT_ENABLE_ALL, **kwargs)
    assert _signature(with_triggers) == _signature(every_pass)


def _weighted_model() -> onnx.ModelProto:
    """A MatMul by a 16 x 8 weight (stripped from the copy inference reads), then a Relu: values
    for inference to find."""
    w = numpy_helper.from_array(np.random.default_rng(2).standard_normal((16, 8)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])


@pytest.fixture
def whole_model_inferences(monkeypatch) -> list:
    """Calls of ``onnx.shape_inference.infer_shapes`` (which parses the whole inferred model back)."""
    calls, real = [], onnx.shape_inference.infer_shapes

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", counted)
    return calls


def test_the_strict_pass_reads_back_only_the_inferred_values(whole_model_inferences):
    model = _weighted_model()
    given = model.SerializeToString(deterministic=True)
    loaded = load_model(model)
    assert not whole_model_inferences  # one graph, weights stripped at most: values merged, no second parse
    assert model.SerializeToString(deterministic=True) == given  # the caller's proto is not changed
    want = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    assert loaded.proto.graph.value_info == want.graph.value_info
    assert loaded.proto.graph.output == want.graph.output
    assert loaded.proto.graph.initializer == model.graph.initializer  # the weights kept
    assert loaded.graph.value_info("m").shape == ("N", 8)
    feeds = {"x": np.random.default_rng(3).standard_normal((5, 16)).astype(np.float32)}
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["lgbm_clf", "vad_if_loop_ts", "resnet_ts", "sk_knn", "bert_eager_ts_ortopt"])
def test_loaded_values_are_those_inference_gives(name):
    """Models of one graph take the merged values, models with subgraphs (the Loop and If of
    ``vad_if_loop_ts``, the Scan of ``sk_knn``) the whole inferred model: both as onnx infers them."""
    path = os.path.join(CORPUS, f"{name}.onnx")
    loaded = load_model(path)
    original = onnx.load(path)
    want = onnx.shape_inference.infer_shapes(original, check_type=True, strict_mode=True, data_prop=True)
    wanted = {v.name: v for v in want.graph.value_info}
    got = {v.name: v for v in loaded.proto.graph.value_info}
    # the loader makes Constant nodes initializers first: their outputs have no value_info then
    constants = {o for n in original.graph.node if n.op_type == "Constant" for o in n.output}
    assert set(got) == set(wanted) - constants and all(got[k] == wanted[k] for k in got)
    assert list(loaded.proto.graph.output) == list(want.graph.output)


def _with_bad_utf8(model: onnx.ModelProto, placeholder: str) -> bytes:
    """The model's bytes with the string ``placeholder`` (which occurs once) made invalid UTF-8."""
    data = model.SerializeToString()
    assert data.count(placeholder.encode()) == 1
    return data.replace(placeholder.encode(), b"\xff" * len(placeholder))


def _strings_model() -> onnx.ModelProto:
    """A model with a string in each kind of place the walk checks: names, dims, docs, metadata,
    an If's subgraph, an initializer's external-data entry, a model-local function."""
    branch = helper.make_graph([helper.make_node("Relu", ["x"], ["t_subnode"], name="subnodename")], "then_branch",
                               [], [helper.make_tensor_value_info("t_subnode", TensorProto.FLOAT, ["N", 2])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e_out"])], "else_branch", [],
                              [helper.make_tensor_value_info("e_out", TensorProto.FLOAT, ["N", 2])])
    nodes = [helper.make_node("If", ["c"], ["y"], name="ifnode", then_branch=branch, else_branch=other,
                              doc_string="nodedocstring")]
    w = numpy_helper.from_array(np.ones(2, np.float32), "w_init")
    w.external_data.add(key="extkey", value="extvalue")
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["dimparam", 2]),
                                           helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    fn = helper.make_function("localdomain", "localfn", ["a"], ["b"], [helper.make_node("Relu", ["a"], ["b"])],
                              [helper.make_opsetid("", 17)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("localdomain", 1)],
                              functions=[fn], producer_name="producername")
    helper.set_model_props(model, {"metakey": "metavalue"})
    return model


@pytest.mark.parametrize("placeholder", ["subnodename", "ifnode", "nodedocstring", "w_init", "extkey", "extvalue",
                                         "dimparam", "localfn", "producername", "metakey", "metavalue"])
def test_the_utf8_mirror_finds_each_bad_string_the_walk_finds(placeholder):
    """The mirror parse validates every string field: where it passes the walk would pass, so a bad
    string anywhere the walk looks makes it fail (the walk then names the field)."""
    from onnxhal.hal.errors import InvalidProtobuf
    from onnxhal.runtime.loader.proto_strings import check_strings, valid_utf8

    model = _strings_model()
    assert valid_utf8(model)
    bad = onnx.ModelProto.FromString(_with_bad_utf8(model, placeholder))
    assert not valid_utf8(bad)
    with pytest.raises(InvalidProtobuf, match="is not valid UTF-8"):
        check_strings(bad, "the model")


@pytest.mark.parametrize("name", ["mobilenet_ts", "vad_if_loop_ts", "lgbm_clf", "sk_knn", "gpt2_past_dynamo"])
def test_the_utf8_mirror_passes_valid_models(name):
    from onnxhal.runtime.loader.proto_strings import valid_utf8

    assert valid_utf8(onnx.load(os.path.join(CORPUS, f"{name}.onnx")))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int8, np.uint8, np.int16, np.uint16,
                                   np.int32, np.uint32, np.int64, np.uint64, np.bool_])
@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 3, 4)])
def test_raw_initializers_decode_as_numpy_helper_decodes_them(dtype, shape):
    from onnxhal.hal.graph import tensor_to_array

    values = np.random.default_rng(4).standard_normal(shape) * 50
    t = numpy_helper.from_array(values.astype(dtype), "t")
    assert t.HasField("raw_data")
    got, want = tensor_to_array(t, "initializer"), numpy_helper.to_array(t)
    assert got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()


def test_raw_data_that_does_not_fill_its_dims_is_an_invalid_graph():
    from onnxhal.hal.errors import InvalidGraph
    from onnxhal.hal.graph import tensor_to_array

    t = numpy_helper.from_array(np.ones((2, 3), np.float32), "short")
    t.raw_data = t.raw_data[:-4]
    with pytest.raises(InvalidGraph, match="tensor 'short'.*cannot be decoded"):
        tensor_to_array(t, "initializer")
    t.raw_data = t.raw_data[:-1]  # not a whole number of elements
    with pytest.raises(InvalidGraph, match="tensor 'short'.*cannot be decoded"):
        tensor_to_array(t, "initializer")


def test_every_corpus_initializer_decodes_as_numpy_helper_decodes_it():
    import glob

    from onnxhal.hal.graph import tensor_to_array

    for path in sorted(glob.glob(os.path.join(CORPUS, "*.onnx"))):
        for t in onnx.load(path).graph.initializer:
            got, want = tensor_to_array(t, "initializer"), numpy_helper.to_array(t)
            assert got.dtype == want.dtype and got.shape == want.shape, (path, t.name)
            assert got.tobytes() == want.tobytes(), (path, t.name)


def _external_constant_model(tmp_path, attribute_type: int) -> str:
    """y = x + Constant whose value (6 floats) is in weights.bin beside the model; the value attribute
    says ``attribute_type``."""
    (tmp_path / "weights.bin").write_bytes(np.arange(6, dtype=np.float32).tobytes())
    t = TensorProto(name="c_value", data_type=TensorProto.FLOAT, dims=[6], data_location=TensorProto.EXTERNAL)
    t.external_data.add(key="location", value="weights.bin")
    const = helper.make_node("Constant", [], ["c"], name="const")
    a = const.attribute.add(name="value", type=attribute_type)
    a.t.CopyFrom(t)
    m = _model([const, helper.make_node("Add", ["x", "c"], ["y"])],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6])])
    path = tmp_path / "model.onnx"
    path.write_bytes(m.SerializeToString())
    return str(path)


def test_an_attribute_tensor_keeps_its_external_data(tmp_path):
    path = _external_constant_model(tmp_path, onnx.AttributeProto.TENSOR)
    x = np.ones(6, np.float32)
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = onnxhal.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, np.arange(6) + 1)


def test_a_tensor_in_an_attribute_typed_otherwise_is_refused(tmp_path):
    """The external-data walk reads attributes by their type; a tensor an INT attribute holds is
    not read, and the node checks refuse the attribute, as onnxruntime refuses the model."""
    from onnxhal.hal.errors import InvalidGraph

    path = _external_constant_model(tmp_path, onnx.AttributeProto.INT)
    with pytest.raises(Exception):  # noqa: B017 - onnxruntime's own error type
        ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    with pytest.raises(InvalidGraph, match="attribute 'value' is declared INT but holds a value in field"):
        onnxhal.InferenceSession(path, providers=["CPUExecutionProvider"])


def _nodes(*edges):
    from onnxhal.hal import Node

    return [Node("Relu", ins, outs, name=name) for name, ins, outs in edges]


def test_toposort_keeps_a_sorted_list_and_sorts_the_rest_as_kahn():
    from onnxhal.hal.errors import InvalidGraph
    from onnxhal.runtime.loader.model_loader import toposort

    ordered = _nodes(("a", ["x"], ["p"]), ("b", ["p", "w"], ["q"]), ("c", ["q", "", "p"], ["y"]))
    assert toposort(ordered) is ordered  # in order: the list itself, no sort
    shuffled = [ordered[2], ordered[0], ordered[1]]
    assert [n.name for n in toposort(shuffled)] == ["a", "b", "c"]
    with pytest.raises(InvalidGraph, match="reads its own output"):
        toposort(_nodes(("a", ["x"], ["p"]), ("self", ["p", "s"], ["s"])))
    with pytest.raises(InvalidGraph, match="cycle"):
        toposort(_nodes(("a", ["r"], ["p"]), ("b", ["p"], ["r"])))


def test_a_model_with_nodes_out_of_order_loads_sorted_and_runs_as_onnxruntime():
    nodes = [helper.make_node("Neg", ["r"], ["y"], name="neg"), helper.make_node("Relu", ["x"], ["r"], name="relu")]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    loaded = load_model(model)
    assert [n.name for n in loaded.graph.nodes] == ["relu", "neg"]
    assert loaded.graph.producer("r").name == "relu" and [n.name for n in loaded.graph.consumers("r")] == ["neg"]
    x = np.random.default_rng(5).standard_normal((2, 3)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(onnxhal.InferenceSession(model).run(None, {"x": x})[0], want)


@pytest.mark.parametrize("name", ["lgbm_clf", "resnet_ts", "bert_eager_ts_ortopt"])
def test_without_the_values_reader_the_whole_inferred_model_gives_the_same_values(name, monkeypatch):
    """Where the message class of a graph's values cannot be built (another protobuf or onnx), the
    loader parses the whole inferred model, as before, to the same result."""
    from onnxhal.runtime.loader import guarded_inference

    path = os.path.join(CORPUS, f"{name}.onnx")
    with_reader = load_model(path).proto.SerializeToString(deterministic=True)
    monkeypatch.setattr(guarded_inference, "_graph_values", lambda: None)
    assert load_model(path).proto.SerializeToString(deterministic=True) == with_reader


def test_external_location_scan_answers_as_in():
    """``has_external_location`` (the marker found from its rare second byte) answers as ``in`` on
    every short string of the bytes that matter (the marker's two, a zero, a letter), the marker at
    either end, alone, repeated or split."""
    import itertools

    from onnxhal.runtime.loader.proto_strings import _EXTERNAL_LOCATION, has_external_location

    for n in range(7):
        for chars in itertools.product(b"\x70\x01\x00A", repeat=n):
            data = bytes(chars)
            assert has_external_location(data) == (_EXTERNAL_LOCATION in data), data
    assert has_external_location(_EXTERNAL_LOCATION) and not has_external_location(b"\x01\x70")


def test_a_model_file_without_external_tensors_skips_the_external_data_walk(tmp_path, monkeypatch):
    """The file's own bytes, parsed as the UTF-8 mirror, say whether any tensor may keep its data in
    a file (``mirror_may_keep_external_data``): the loader walks the tensors only then. The mirror
    says so for a tensor with external data wherever it is (initializer, attribute), and, where a
    string holds the marker's bytes, says so too (the walk then finds none): it never misses one."""
    from onnxhal.runtime.loader import model_loader
    from onnxhal.runtime.loader.proto_strings import mirror_may_keep_external_data, utf8_mirror_of

    walks: list[str] = []
    real = model_loader.load_external_data
    monkeypatch.setattr(model_loader, "load_external_data",
                        lambda proto, *args: walks.append(args[-1]) or real(proto, *args))
    plain = os.path.join(CORPUS, "resnet_ts.onnx")
    load_model(plain)
    assert walks == []
    with open(plain, "rb") as f:
        assert not mirror_may_keep_external_data(utf8_mirror_of(f.read()))
    external = _external_constant_model(tmp_path, onnx.AttributeProto.TENSOR)
    with open(external, "rb") as f:
        assert mirror_may_keep_external_data(utf8_mirror_of(f.read()))
    x = np.ones(6, np.float32)
    got = onnxhal.InferenceSession(external, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, np.arange(6) + 1)
    assert walks == [external]
    marked = transpose_model()
    marked.graph.node[0].name = "p\x01"  # the bytes of data_location EXTERNAL, in a string
    path = tmp_path / "marked.onnx"
    path.write_bytes(marked.SerializeToString())
    assert mirror_may_keep_external_data(utf8_mirror_of(marked.SerializeToString()))
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(
        onnxhal.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0], x.T)
    assert walks[-1] == str(path)


def test_walks_of_a_model_without_subgraphs_read_no_node_and_others_still_find_every_subgraph():
    """While the loader loads a model none of whose nodes holds a graph (``flat_model_walks``), a
    walk yields the graph without reading its nodes; a model with an If (or a node of another
    domain holding a graph) is walked into, and a bad node in a branch is still refused."""
    from onnxhal.hal.errors import InvalidGraph
    from onnxhal.runtime.loader.node_checks import flat_model_walks, walk_graphs

    flat = transpose_model()
    flat.graph.node.append(helper.make_node("Gelu", ["y"], ["z"], domain="com.microsoft"))  # no graph attribute
    with flat_model_walks(flat):
        assert [g for g, _ in walk_graphs(flat.graph)] == [flat.graph]
    branch = helper.make_graph([helper.make_node("Relu", ["x"], ["r"])], "b", [],
                               [helper.make_tensor_value_info("r", TensorProto.FLOAT, None)])
    cond = helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)
    nested = _model([cond], [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                             helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                    [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    with flat_model_walks(nested):
        assert len(list(walk_graphs(nested.graph))) == 3
    with flat_model_walks(flat):  # the walks trust the loaded model's flatness: no node is read
        assert len(list(walk_graphs(nested.graph))) == 1
    assert len(list(walk_graphs(flat.graph))) == 1  # outside a load: the full walk, which finds none
    bad = onnx.ModelProto()
    bad.CopyFrom(nested)
    bad.graph.node[0].attribute[0].g.node[0].attribute.add(name="alpha", type=onnx.AttributeProto.FLOAT, f=1.0)
    with pytest.raises(InvalidGraph, match="alpha"):
        load_model(bad)
    x = np.array([-1.0, 2.0], np.float32)
    feeds = {"c": np.array(True), "x": x}
    np.testing.assert_array_equal(
        onnxhal.InferenceSession(nested.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0],
        ort.InferenceSession(nested.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0])


@pytest.mark.parametrize("elem_type, shape", [(TensorProto.FLOAT, (2, 3)), (TensorProto.INT64, ()),
                                              (TensorProto.STRING, (4,)), (TensorProto.BFLOAT16, (1, 0, 5))])
def test_a_value_info_made_from_dims_reads_as_the_one_made_from_its_type_proto(elem_type, shape):
    from onnxhal.hal.graph import ValueInfo
    tp = helper.make_tensor_type_proto(elem_type, shape)
    lazy, parsed = ValueInfo.tensor("v", elem_type, shape), ValueInfo("v", tp)
    for vi in (lazy, parsed):
        assert (vi.is_tensor, vi.elem_type, vi.shape, vi.dtype, vi.has_static_shape) == \
            (True, elem_type, shape, parsed.dtype, True)
    assert lazy.type_proto == tp and lazy.type_string == parsed.type_string


def test_a_value_info_given_a_new_type_proto_reads_the_new_one():
    from onnxhal.hal.graph import ValueInfo
    vi = ValueInfo("v", helper.make_tensor_type_proto(TensorProto.FLOAT, ("n", 3)))
    assert vi.shape == ("n", 3) and not vi.has_static_shape
    vi.type_proto = helper.make_tensor_type_proto(TensorProto.INT32, (2, -1, None))
    assert (vi.elem_type, vi.shape, vi.dtype) == (TensorProto.INT32, (2, None, None), np.dtype(np.int32))
    vi.type_proto = helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, None))
    assert (vi.is_tensor, vi.elem_type, vi.shape, vi.dtype) == (False, 0, None, None)


def _two_node_model(first: onnx.NodeProto, second: onnx.NodeProto) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([first, second], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("second, match", [
    # the attribute bytes of the node before, on an op whose schema has no such attribute
    (helper.make_node("Relu", ["t"], ["y"], alpha=0.1), "attribute 'alpha' is not an attribute of Relu"),
    # the node before's op and attributes, with an input too many: the counts are each node's own
    (helper.make_node("LeakyRelu", ["t", "x"], ["y"], alpha=0.1), "has 2 input"),
    # and with its input's name empty
    (helper.make_node("LeakyRelu", [""], ["y"], alpha=0.1), "is required but its name is empty"),
])
def test_a_node_repeating_checked_attributes_is_still_checked_as_itself(second, match):
    from onnxhal.errors import InvalidGraph
    first = helper.make_node("LeakyRelu", ["x"], ["t"], alpha=0.1)
    with pytest.raises(InvalidGraph, match=match):
        load_model(_two_node_model(first, second))
    with pytest.raises(Exception):  # noqa: B017 - onnxruntime refuses it too (its own error types)
        ort.InferenceSession(_two_node_model(first, second).SerializeToString(), providers=["CPUExecutionProvider"])


def test_nodes_sharing_attributes_load_and_run_as_onnxruntime():
    first = helper.make_node("LeakyRelu", ["x"], ["t"], alpha=0.1)
    second = helper.make_node("LeakyRelu", ["t"], ["y"], alpha=0.1)
    model = _two_node_model(first, second)
    x = np.array([[-2.0, -1.0, 0.5, 3.0]], dtype=np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)


def test_value_infos_of_types_that_differ_in_one_dim_read_their_own_dims():
    from onnxhal.hal.graph import ValueInfo
    shapes = [(1, "n", 3), (1, "m", 3), (1, 2, 3), (1, None, 3), (1, 2, 3, 4), ()]
    for elem in (TensorProto.FLOAT, TensorProto.INT64):
        for shape in shapes:
            vi = ValueInfo("v", helper.make_tensor_type_proto(elem, shape))
            assert (vi.elem_type, vi.shape) == (elem, shape)
    assert ValueInfo("v", helper.make_tensor_type_proto(TensorProto.FLOAT, None)).shape is None
    seq = helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, (1, 2, 3)))
    assert (ValueInfo("s", seq).is_tensor, ValueInfo("s", seq).shape) == (False, None)


def test_element_type_attributes_are_checked_on_the_nodes_whose_schema_has_them():
    from onnxhal.errors import InvalidGraph
    from onnxhal.runtime.loader.node_checks import check_after_inference
    eye = helper.make_node("EyeLike", ["x"], ["y"], dtype=999)
    relu = helper.make_node("Relu", ["x"], ["y"], to=999)  # no schema has it: check_nodes refuses it
    for node, checked in ((eye, True), (eye, False), (relu, False)):
        with pytest.raises(InvalidGraph, match="attribute '(dtype|to)' is 999, which is not an ONNX tensor"):
            check_after_inference(_two_node_model(node, helper.make_node("Relu", ["y"], ["z"])), {"": 17},
                                  checked=checked)
    check_after_inference(_two_node_model(relu, helper.make_node("Relu", ["y"], ["z"])), {"": 17}, checked=True)


@pytest.mark.parametrize("array", [np.zeros((2, 3), np.float32), np.zeros((), np.int64), np.array(["a"], object),
                                   np.zeros((0, 4), np.float16), np.zeros(5, np.bool_)])
def test_an_initializers_value_info_is_its_arrays_type_and_shape(array):
    """``ValueInfo.of_array`` (what the graph builds per initializer) says what ``ValueInfo.tensor``
    says of the array's element type and shape: the same type, dtype, shape and TypeProto."""
    from onnxhal.hal.graph import ValueInfo, dtype_to_elem_type
    got, want = ValueInfo.of_array("w", array), ValueInfo.tensor("w", dtype_to_elem_type(array.dtype), array.shape)
    assert (got.name, got.is_tensor, got.elem_type, got.dtype, got.shape, got.has_static_shape) == \
        (want.name, want.is_tensor, want.elem_type, want.dtype, want.shape, want.has_static_shape)
    assert got.type_proto == want.type_proto
    graph = load_model(conv_bn_model()).graph
    assert graph.value_info("w").shape == (4, 3, 3, 3) and graph.value_info("w").elem_type == TensorProto.FLOAT


def test_a_memory_device_hashes_and_compares_by_its_four_fields():
    """``OrtMemoryDevice`` keeps its hash (a plan looks up each value's slot by (name, device)):
    equal devices, made apart, copied, pickled or replaced, hash and compare equal; any field that
    differs makes another device; a device equals nothing else."""
    import copy
    import dataclasses
    import pickle

    from onnxhal.hal.memory_info import CPU_MEMORY_INFO, OrtMemoryDevice

    host = CPU_MEMORY_INFO.memory_device
    twins = [OrtMemoryDevice(host.device_type, host.memory_type, host.vendor_id, host.device_id), copy.copy(host),
             pickle.loads(pickle.dumps(host)), dataclasses.replace(host)]
    for twin in twins:
        assert twin == host and host == twin and hash(twin) == hash(host) and {host: 1}[twin] == 1
    others = [dataclasses.replace(host, device_id=1), dataclasses.replace(host, vendor_id=0x10DE),
              dataclasses.replace(host, device_type=onnxhal.OrtMemoryInfoDeviceType.GPU),
              dataclasses.replace(host, memory_type=onnxhal.OrtDeviceMemoryType.HOST_ACCESSIBLE)]
    for other in others:
        assert other != host and not other == host and other not in {host: 1}
    assert host != (host.device_type, host.memory_type, host.vendor_id, host.device_id) and host != 0
    assert "_hash" not in repr(host)
