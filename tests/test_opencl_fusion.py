"""The OpenCL EP's fusion rules (runtime/providers/opencl/fusion_rules.py): each one turned off by the
provider option ``disable_fusions`` gives the unfused plan, with more launches and the same outputs;
onnxruntime's CPU EP judges both on random inputs."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("pyopencl")

import onnxhal  # noqa: E402
from onnxhal.hal.errors import InvalidArgument  # noqa: E402
from tests.opencl_support import require_opencl  # noqa: E402

OPENCL_INDEX = require_opencl(module_level=True)
RNG = np.random.default_rng(47)


def _model(nodes, inputs, outputs, weights) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
                              [numpy_helper.from_array(w, n) for n, w in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def _weight(*shape: int) -> np.ndarray:
    return (RNG.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)


def _compare(model: onnx.ModelProto, feeds: dict, rule: str, rtol: float = 1e-5, atol: float = 1e-5
             ) -> tuple[int, int]:
    """Launches per run with every rule and with ``rule`` off; both runs' outputs against onnxruntime."""
    data = model.SerializeToString()
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    launches = []
    for disabled in ("", rule):
        sess = onnxhal.InferenceSession(data, providers=[("OpenCLExecutionProvider", {"disable_fusions": disabled}),
                                                         "CPUExecutionProvider"])
        assert set(sess.partition_summary) == {"OpenCLExecutionProvider"}, sess.partition_summary
        for got, ref in zip(sess.run(None, feeds), want):
            np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol, err_msg=f"disable_fusions={disabled!r}")
        launches.append(sum(p.launches_per_run for p in sess.eps["OpenCLExecutionProvider"].compiled_plans))
    return launches[0], launches[1]


def test_a_residual_add_after_a_matmul_is_its_epilogue(opencl):
    # x -> MatMul -> (+ bias) -> + x: the bias and the residual in the GEMM's epilogue, one launch;
    # then LayerNorm-free FFN tail: Relu(h @ w2 + b2) + y, whose Add comes after an activation and stays.
    n, k = 24, 40
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Add", ["x", "hb"], ["y"]),
             helper.make_node("MatMul", ["y", "w2"], ["g"]), helper.make_node("Add", ["g", "y"], ["z"]),
             helper.make_node("MatMul", ["z", "w3"], ["u"]), helper.make_node("Relu", ["u"], ["r"]),
             helper.make_node("Add", ["r", "z"], ["out"])]
    weights = {"w1": _weight(k, k), "b1": _weight(k), "w2": _weight(k, k), "w3": _weight(k, k)}
    model = _model(nodes, [("x", [2, n, k])], ["out", "y"], weights)
    feeds = {"x": RNG.standard_normal((2, n, k)).astype(np.float32)}
    fused, unfused = _compare(model, feeds, "gemm_residual")
    assert (fused, unfused) == (4, 6)


def test_a_residual_add_behind_a_reshape_is_the_gemm_epilogue(opencl):
    # GPT-2's export: rows flattened for a Gemm (with C), its result reshaped back, then the residual Add
    b, n, k = 2, 6, 24
    c = lambda name, v: numpy_helper.from_array(np.asarray(v), name)  # noqa: E731
    nodes = [helper.make_node("Reshape", ["x", "flat"], ["x2"]), helper.make_node("Gemm", ["x2", "w", "bias"], ["g"]),
             helper.make_node("Reshape", ["g", "back"], ["g3"]), helper.make_node("Add", ["g3", "x"], ["y"])]
    model = _model(nodes, [("x", [b, n, k])], ["y"], {"w": _weight(k, k), "bias": _weight(k)})
    model.graph.initializer.extend([c("flat", np.array([b * n, k], np.int64)), c("back", np.array([b, n, k], np.int64))])
    feeds = {"x": RNG.standard_normal((b, n, k)).astype(np.float32)}
    assert _compare(model, feeds, "gemm_residual") == (1, 2)


def test_an_activation_chain_after_a_gemm_is_its_epilogue(opencl):
    # GPT-2's tanh-Gelu as its export writes it, behind a Reshape, then x * Sigmoid(x) (SiLU)
    b, n, k, h = 2, 5, 16, 24
    c = lambda name, v: numpy_helper.from_array(np.asarray(v, np.float32), name)  # noqa: E731
    nodes = [helper.make_node("Reshape", ["x", "flat"], ["x2"]), helper.make_node("Gemm", ["x2", "w1", "b1"], ["g"]),
             helper.make_node("Reshape", ["g", "back"], ["u"]),
             helper.make_node("Mul", ["u", "half"], ["t0"]), helper.make_node("Pow", ["u", "three"], ["t1"]),
             helper.make_node("Mul", ["t1", "coef"], ["t2"]), helper.make_node("Add", ["u", "t2"], ["t3"]),
             helper.make_node("Mul", ["t3", "root"], ["t4"]), helper.make_node("Tanh", ["t4"], ["t5"]),
             helper.make_node("Add", ["t5", "one"], ["t6"]), helper.make_node("Mul", ["t0", "t6"], ["gelu"]),
             helper.make_node("MatMul", ["gelu", "w2"], ["m"]), helper.make_node("Sigmoid", ["m"], ["sg"]),
             helper.make_node("Mul", ["m", "sg"], ["y"])]
    model = _model(nodes, [("x", [b, n, k])], ["y"], {"w1": _weight(k, h), "b1": _weight(h), "w2": _weight(h, k)})
    model.graph.initializer.extend([
        numpy_helper.from_array(np.array([b * n, k], np.int64), "flat"),
        numpy_helper.from_array(np.array([b, n, h], np.int64), "back"), c("half", 0.5), c("three", 3.0),
        c("coef", 0.044715), c("root", np.sqrt(2 / np.pi)), c("one", 1.0)])
    feeds = {"x": (2 * RNG.standard_normal((b, n, k))).astype(np.float32)}
    assert _compare(model, feeds, "gemm_elementwise") == (2, 4)


def test_an_elementwise_tree_read_by_a_layernorm_is_computed_in_its_kernel(opencl):
    # an embedding sum as BERT's: token + position (broadcast over the batch) + type, then LayerNorm
    b, n, e = 2, 7, 24
    nodes = [helper.make_node("Add", ["tok", "pos"], ["s0"]), helper.make_node("Add", ["s0", "typ"], ["s1"]),
             helper.make_node("LayerNormalization", ["s1", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-5)]
    weights = {"pos": _weight(1, n, e), "gamma": _weight(e) + 1, "beta": _weight(e)}
    model = _model(nodes, [("tok", [b, n, e]), ("typ", [b, n, e])], ["y"], weights)
    feeds = {"tok": RNG.standard_normal((b, n, e)).astype(np.float32),
             "typ": RNG.standard_normal((b, n, e)).astype(np.float32)}
    assert _compare(model, feeds, "layernorm_prologue") == (1, 2)


def test_a_tree_between_a_gemm_and_a_layernorm_is_computed_once(opencl):
    # both the GEMM's epilogue and the LayerNorm's prologue could take x * 0.5 + 1: the LayerNorm does
    n, k = 6, 20
    c = lambda name, v: numpy_helper.from_array(np.asarray(v, np.float32), name)  # noqa: E731
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Mul", ["m", "half"], ["t"]),
             helper.make_node("Add", ["t", "one"], ["u"]),
             helper.make_node("LayerNormalization", ["u", "gamma", "beta"], ["y"], axis=-1)]
    model = _model(nodes, [("x", [n, k])], ["y"], {"w": _weight(k, k), "gamma": _weight(k) + 1, "beta": _weight(k)})
    model.graph.initializer.extend([c("half", 0.5), c("one", 1.0)])
    feeds = {"x": RNG.standard_normal((n, k)).astype(np.float32)}
    # off: the GEMM's epilogue takes it, and rule gemm_norm then folds the LayerNorm into the GEMM
    assert _compare(model, feeds, "layernorm_prologue") == (2, 1)


def test_a_prologue_also_read_after_the_layernorm_is_stored_by_it(opencl):
    # pre-norm embeddings: s = x + pos is LayerNorm'd and is the first block's residual, read by a
    # GEMM of the LayerNorm's output: the LayerNorm's kernel computes s, stores it and normalises it
    n, k = 12, 32
    nodes = [helper.make_node("Add", ["x", "pos"], ["s"]),
             helper.make_node("LayerNormalization", ["s", "gamma", "beta"], ["h"], axis=-1),
             helper.make_node("MatMul", ["h", "w"], ["m"]), helper.make_node("Add", ["m", "s"], ["y"])]
    model = _model(nodes, [("x", [n, k])], ["y"], {"pos": _weight(n, k), "w": _weight(k, k),
                                                   "gamma": _weight(k) + 1, "beta": _weight(k)})
    feeds = {"x": RNG.standard_normal((n, k)).astype(np.float32)}
    assert _compare(model, feeds, "layernorm_prologue_stored") == (2, 3)


def test_a_prologue_read_before_the_layernorm_is_not_stored_by_it(opencl):
    # s's other reader does not descend from the LayerNorm: it may be lowered first, so s keeps its launch
    n, k = 12, 32
    nodes = [helper.make_node("Add", ["x", "pos"], ["s"]),
             helper.make_node("LayerNormalization", ["s", "gamma", "beta"], ["h"], axis=-1),
             helper.make_node("MatMul", ["s", "w"], ["m"]), helper.make_node("Add", ["m", "h"], ["y"])]
    model = _model(nodes, [("x", [n, k])], ["y"], {"pos": _weight(n, k), "w": _weight(k, k),
                                                   "gamma": _weight(k) + 1, "beta": _weight(k)})
    feeds = {"x": RNG.standard_normal((n, k)).astype(np.float32)}
    assert _compare(model, feeds, "layernorm_prologue_stored") == (3, 3)


def test_an_unknown_rule_is_an_error_naming_the_rules(opencl):
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [("x", [4])], ["y"], {})
    with pytest.raises(InvalidArgument, match=r"disable_fusions='tiling'.*unknown rule.*'attention'"):
        onnxhal.InferenceSession(model.SerializeToString(),
                                 providers=[("OpenCLExecutionProvider", {"disable_fusions": "tiling"})])


def _attention_model(b: int, s: int, heads: int, d: int, masked: bool, scale_scores: bool,
                     identity_view: bool = False, fused_qkv: bool = False, dynamo_k: bool = False) -> onnx.ModelProto:
    """x [b, s, e] -> Q, K, V projections, heads split by Reshape + Transpose (K transposed for Q @ K^T),
    scaled (Q and K by sqrt(sqrt(d)) as PyTorch's export, or the scores by sqrt(d)), masked, Softmax
    (NaN of a fully masked row replaced by 0, as PyTorch's SDPA export does), @ V, heads merged.
    ``dynamo_k``: K's head split transposed, reshaped to [b * heads, s, d], transposed to 3-D K^T and
    reshaped back to [b, heads, d, s], as the dynamo exporter writes it."""
    e = heads * d
    c = lambda name, v: numpy_helper.from_array(np.asarray(v), name)  # noqa: E731
    nodes, weights = [], {f"w{t}": _weight(e, e) for t in "qkv"}
    if fused_qkv:  # GPT-2's export: one projection, split in three
        weights = {"wqkv": _weight(e, 3 * e)}
        nodes += [helper.make_node("MatMul", ["x", "wqkv"], ["qkv"]),
                  helper.make_node("Split", ["qkv", "thirds"], ["q0", "k0", "v0"], axis=-1)]
    for t, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        if not fused_qkv:
            nodes.append(helper.make_node("MatMul", ["x", f"w{t}"], [f"{t}0"]))
        if t == "k" and dynamo_k:
            nodes += [helper.make_node("Reshape", ["k0", "split"], ["k1"]),
                      helper.make_node("Transpose", ["k1"], ["k1t"], perm=[0, 2, 1, 3]),
                      helper.make_node("Reshape", ["k1t", "bh"], ["k1r"]),
                      helper.make_node("Transpose", ["k1r"], ["k1rt"], perm=[0, 2, 1]),
                      helper.make_node("Reshape", ["k1rt", "kt4"], ["k2"])]
            continue
        nodes += [helper.make_node("Reshape", [f"{t}0", "split"], [f"{t}1"]),
                  helper.make_node("Transpose", [f"{t}1"], [f"{t}2"], perm=perm)]
    if scale_scores:
        nodes += [helper.make_node("MatMul", ["q2", "k2"], ["s0"]), helper.make_node("Div", ["s0", "sqrt_d"], ["s1"])]
    else:
        nodes += [helper.make_node("Mul", ["q2", "root"], ["q3"]), helper.make_node("Mul", ["root", "k2"], ["k3"]),
                  helper.make_node("MatMul", ["q3", "k3"], ["s1"])]
    scores = "s1"
    if masked:
        nodes.append(helper.make_node("Add", ["s1", "mask"], ["s2"]))
        scores = "s2"
    nodes += [helper.make_node("Softmax", [scores], ["p0"], axis=-1),
              helper.make_node("IsNaN", ["p0"], ["nan"]), helper.make_node("Where", ["nan", "zero", "p0"], ["p1"]),
              helper.make_node("MatMul", ["p1", "v2"], ["o"])]
    nodes += ([helper.make_node("Reshape", ["o", "heads"], ["o0"])] if identity_view
              else [helper.make_node("Identity", ["o"], ["o0"])])
    nodes += [helper.make_node("Transpose", ["o0"], ["o1"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["o1", "merge"], ["y"])]
    mask = np.zeros((b, 1, 1, s), np.float32)
    mask[0, 0, 0, s // 2:] = -np.inf  # padding of the first sequence
    inits = [c("split", np.array([b, s, heads, d], np.int64)), c("heads", np.array([b, heads, s, d], np.int64)),
             c("thirds", np.array([e, e, e], np.int64)), c("merge", np.array([b, s, e], np.int64)),
             c("bh", np.array([b * heads, s, d], np.int64)), c("kt4", np.array([b, heads, d, s], np.int64)),
             c("sqrt_d", np.float32(np.sqrt(d))), c("root", np.float32(d ** -0.25)), c("zero", np.float32(0)),
             c("mask", mask)]
    graph = helper.make_graph(nodes, "attn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [b, s, e])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [b, s, e])],
                              [numpy_helper.from_array(w, n) for n, w in weights.items()] + inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("b, s, heads, d, masked, scale_scores, view", [
    (2, 12, 4, 8, True, False, True),  # BERT's export: Q and K scaled, additive mask, batch 2
    (1, 50, 3, 16, False, True, False),  # ViT's: scores divided by sqrt(d), no mask
    (3, 7, 2, 5, True, True, False),  # odd sizes
])
def test_attention_is_one_launch(opencl, b, s, heads, d, masked, scale_scores, view):
    model = _attention_model(b, s, heads, d, masked, scale_scores, view)
    feeds = {"x": RNG.standard_normal((b, s, heads * d)).astype(np.float32)}
    fused, unfused = _compare(model, feeds, "attention,qkv_projection")
    # the projections (one GEMM) + one attention launch, against 3 + 2 GEMMs, packing, softmax and copies
    assert fused == 2 and unfused >= fused + 6, (fused, unfused)


def test_the_q_k_v_projections_of_one_input_are_one_gemm(opencl):
    model = _attention_model(2, 12, 4, 8, True, False, True)
    feeds = {"x": RNG.standard_normal((2, 12, 32)).astype(np.float32)}
    assert _compare(model, feeds, "qkv_projection") == (2, 4)


def test_the_parts_of_a_split_projection_are_read_in_place(opencl):
    model = _attention_model(2, 10, 2, 16, True, False, True, fused_qkv=True)
    feeds = {"x": RNG.standard_normal((2, 10, 32)).astype(np.float32)}
    fused, unfused = _compare(model, feeds, "attention")
    # one GEMM for Q, K and V, then attention: no copy of the Split's parts or of the Transposes
    assert fused == 2 and unfused >= fused + 8, (fused, unfused)


def test_a_split_run_for_one_part_copies_only_that_part(opencl):
    # V's part is also an output (as a dynamo export's present value): the Split runs for it, while
    # attention still reads Q's and K's parts in place, which get no copy
    model = _attention_model(2, 10, 2, 16, True, False, True, fused_qkv=True)
    model.graph.output.append(helper.make_tensor_value_info("v0", TensorProto.FLOAT, None))
    feeds = {"x": RNG.standard_normal((2, 10, 32)).astype(np.float32)}
    data = model.SerializeToString()
    sess = onnxhal.InferenceSession(data, providers=["OpenCLExecutionProvider"])
    kernels = [s.kernel_name for p in sess.eps["OpenCLExecutionProvider"].compiled_plans for s in p.steps]
    assert kernels.count("strided_copy") == 1 and kernels.count("attention_rows") == 1, kernels
    fused, unfused = _compare(model, feeds, "attention")
    assert fused == 3 and unfused >= fused + 8, (fused, unfused)


def test_a_transpose_of_a_head_split_of_a_split_part_reads_the_part_in_place(opencl):
    # a fused QKV projection split in three, each part's heads split and transposed (a dynamo export's
    # present key and value): each Transpose reads its part inside the projection's result
    b, s, heads, d = 2, 6, 3, 4
    e = heads * d
    c = lambda name, v: numpy_helper.from_array(np.asarray(v), name)  # noqa: E731
    nodes = [helper.make_node("MatMul", ["x", "wqkv"], ["qkv"]),
             helper.make_node("Split", ["qkv", "thirds"], ["q0", "k0", "v0"], axis=-1)]
    for t, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        nodes += [helper.make_node("Reshape", [f"{t}0", "split"], [f"{t}1"]),
                  helper.make_node("Transpose", [f"{t}1"], [f"{t}2"], perm=perm)]
    nodes.append(helper.make_node("Neg", ["k2"], ["nk"]))  # a reader that is not a MatMul
    model = _model(nodes, [("x", [b, s, e])], ["q2", "nk", "v2"], {"wqkv": _weight(e, 3 * e)})
    model.graph.initializer.extend([c("thirds", np.array([e, e, e], np.int64)),
                                    c("split", np.array([b, s, heads, d], np.int64))])
    feeds = {"x": RNG.standard_normal((b, s, e)).astype(np.float32)}
    # the GEMM, three Transposes and the Neg; off: the Split's three copies as well, with K's Transpose
    # read by the Neg through strides (rule transpose_elementwise)
    assert _compare(model, feeds, "head_split_in_place") == (5, 7)


@pytest.mark.parametrize("fused_qkv", [False, True])
def test_a_dynamo_k_view_chain_is_read_by_attention_in_place(opencl, fused_qkv):
    # rule attention_view_chain: K's Transpose, 3-D Reshape, Transpose and 4-D Reshape become
    # attention's strides into the merged projection (or the Split's input); the 3-D Reshape alone
    # could not be a view (batch and heads are not contiguous there), which the next Reshape undoes
    model = _attention_model(2, 6, 3, 4, True, False, True, fused_qkv=fused_qkv, dynamo_k=True)
    feeds = {"x": RNG.standard_normal((2, 6, 12)).astype(np.float32)}
    fused, unfused = _compare(model, feeds, "attention_view_chain")
    assert fused == 2 and unfused == fused + 2, (fused, unfused)  # off: K's two Transposes copied


def test_projections_whose_head_splits_attention_does_not_take_stay_apart(opencl):
    # with attention off nothing reads the parts in place: merged, each part would need a copy out
    model = _attention_model(1, 6, 2, 4, True, False)
    feeds = {"x": RNG.standard_normal((1, 6, 8)).astype(np.float32)}
    assert _compare(model, feeds, "attention,qkv_projection")[0] == 2
    data = model.SerializeToString()
    sess = onnxhal.InferenceSession(data, providers=[("OpenCLExecutionProvider", {"disable_fusions": "attention"})])
    kernels = [s.kernel_name for p in sess.eps["OpenCLExecutionProvider"].compiled_plans for s in p.steps]
    assert kernels.count("gemm_rowmajor_a") == 3 + 2, kernels  # no merged GEMM
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(sess.run(None, feeds)[0], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mask_shape", [None, (7, 9), (3, 1, 9), (3, 7, 9)])
def test_attention_of_rank_3_with_masks_of_any_broadcast(opencl, mask_shape):
    # [batch * heads, seq, dim] operands as some exports write them; K given untransposed
    q, k, v = (RNG.standard_normal(shape).astype(np.float32) for shape in ((3, 7, 16), (3, 9, 16), (3, 9, 8)))
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]), helper.make_node("MatMul", ["q", "kt"], ["s0"]),
             helper.make_node("Mul", ["s0", "scale"], ["s1"])]
    scores, weights = "s1", {"scale": np.array(0.25, np.float32)}
    if mask_shape:
        mask = RNG.standard_normal(mask_shape).astype(np.float32)
        mask[..., -2:] = -np.inf
        nodes.append(helper.make_node("Add", ["mask", "s1"], ["s2"]))
        scores, weights["mask"] = "s2", mask
    nodes += [helper.make_node("Softmax", [scores], ["p"], axis=2), helper.make_node("MatMul", ["p", "v"], ["y"])]
    model = _model(nodes, [("q", [3, 7, 16]), ("k", [3, 9, 16]), ("v", [3, 9, 8])], ["y"], weights)
    fused, unfused = _compare(model, {"q": q, "k": k, "v": v}, "attention")
    assert fused == 1 and unfused >= 4, (fused, unfused)


def test_a_fully_masked_row_gives_the_replaced_value(opencl):
    model = _attention_model(1, 6, 2, 4, True, False)
    # every key of batch 0 masked: softmax gives NaN and the Where(IsNaN) makes the row 0
    for init in model.graph.initializer:
        if init.name == "mask":
            init.CopyFrom(numpy_helper.from_array(np.full((1, 1, 1, 6), -np.inf, np.float32), "mask"))
    feeds = {"x": RNG.standard_normal((1, 6, 8)).astype(np.float32)}
    fused, unfused = _compare(model, feeds, "attention")
    assert fused < unfused


def _shape_reader_model(t_is_output: bool) -> onnx.ModelProto:
    # t = Transpose(x @ w) read by a batched MatMul here and by a Shape on the host: the
    # TorchScript exports' head split, which a Shape reads to size the head merge.
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"]), helper.make_node("Transpose", ["a"], ["t"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["t", "b"], ["y"]), helper.make_node("Shape", ["t"], ["s"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
               helper.make_tensor_value_info("s", TensorProto.INT64, None)]
    if t_is_output:
        outputs.append(helper.make_tensor_value_info("t", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 6, 8]),
                                           helper.make_tensor_value_info("b", TensorProto.FLOAT, ["n", 6, 5])],
                              outputs, [numpy_helper.from_array(_weight(8, 8), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("t_is_output", [False, True])
def test_an_output_read_only_by_a_shape_gets_no_copy(opencl, t_is_output):
    data = _shape_reader_model(t_is_output).SerializeToString()
    feeds = {"x": RNG.standard_normal((3, 6, 8)).astype(np.float32),
             "b": RNG.standard_normal((3, 6, 5)).astype(np.float32)}
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    kernels = {}
    # (rule shape_values off: it would take the Shape into the partition, which then reads t itself)
    for disabled in ("shape_values", "shape_values,shape_only_outputs"):
        sess = onnxhal.InferenceSession(data, providers=[("OpenCLExecutionProvider", {"disable_fusions": disabled}),
                                                         "CPUExecutionProvider"])
        got = sess.run(None, feeds)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=f"disable_fusions={disabled!r}")
        (info,) = sess.eps["OpenCLExecutionProvider"].dynamic_partitions.values()
        (plan,) = info.cached_plans
        kernels[disabled] = [getattr(s, "kernel_name", "copy") for s in plan.steps]
    # With the rule the Transpose is the batched MatMul's operand strides (packed), and its output
    # gets no data; a Transpose output whose data is read (a graph output) stays a copy.
    copied = ["gemm_rowmajor_a", "strided_copy", "pack_b", "gemm_rowmajor_a"]
    assert kernels["shape_values,shape_only_outputs"] == copied
    assert kernels["shape_values"] == (copied if t_is_output else ["gemm_rowmajor_a", "pack_a", "pack_b", "gemm_packed"])


def test_a_view_read_by_a_shape_outside_still_feeds_its_readers_inside(opencl):
    """GPT-2's head split: r = Reshape(x @ w) is read by a Shape on the host and by a Transpose in
    the partition. The view's output got no data (rule shape_only_outputs), and the Transpose read
    that empty buffer instead of the Reshape's input: wrong values, inside onnxruntime too."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"]),
             helper.make_node("Reshape", ["a", "shape"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3]),
             helper.make_node("Relu", ["t"], ["y"]), helper.make_node("Shape", ["r"], ["s"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 6, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("s", TensorProto.INT64, None)],
                              [numpy_helper.from_array(_weight(8, 8), "w"),
                               numpy_helper.from_array(np.array([0, 6, 2, 4], np.int64), "shape")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    data = model.SerializeToString()
    feeds = {"x": RNG.standard_normal((3, 6, 8)).astype(np.float32)}
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    for disabled in ("", "shape_only_outputs"):
        sess = onnxhal.InferenceSession(data, providers=[("OpenCLExecutionProvider", {"disable_fusions": disabled}),
                                                         "CPUExecutionProvider"])
        assert sess.partition_summary.get("OpenCLExecutionProvider", 0) >= 3
        for _ in range(3):  # a later run too: the empty buffer's contents differ by run
            for g, w in zip(sess.run(None, feeds), want):
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=f"disable_fusions={disabled!r}")


def test_torchscript_bert_head_splits_read_by_shapes_fold_into_attention(opencl):
    # The committed TorchScript BERT with symbolic batch and sequence: each layer's Q and V head
    # splits are read by a Shape on the host; with the rule attention reads them in place.
    import os

    from onnxhal.stored_outputs import read_signatures

    path = os.path.join(os.path.dirname(__file__), "real_models", "bert_ts.onnx")
    feeds, _ = read_signatures(path)["a"]
    with open(path, "rb") as f:
        data = f.read()
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    copies = {}
    for disabled in ("shape_values", "shape_values,shape_only_outputs"):  # (shape chains on the host)
        sess = onnxhal.InferenceSession(data, providers=[("OpenCLExecutionProvider", {"disable_fusions": disabled}),
                                                         "CPUExecutionProvider"])
        for got, ref in zip(sess.run(None, feeds), want):
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4, err_msg=f"disable_fusions={disabled!r}")
        plans = [p for info in sess.eps["OpenCLExecutionProvider"].dynamic_partitions.values()
                 for p in info.cached_plans]
        copies[disabled] = sum(getattr(s, "kernel_name", "") == "strided_copy" for p in plans for s in p.steps)
    # (Shapes of two head splits read input_ids instead, pass redirect_shape_reads: 5 copies, not 6)
    assert copies == {"shape_values": 2, "shape_values,shape_only_outputs": 5}, copies


def _rms_norm_model(form: str, weight: str, axes_input: bool) -> tuple[onnx.ModelProto, dict]:
    """T5's LayerNorm as its exports write it: ``x * (1 / sqrt(mean(x^2) + eps))`` (``form``
    "div_one"; "reciprocal" with Reciprocal; "divide": ``x / sqrt(...)``; "mul_square": the square
    as Mul(x, x)), then ``weight`` "first"/"last" (which operand of the Mul) or "none"; a residual
    Add reads x as well, as in an encoder."""
    b, n, d = 2, 5, 24
    c = lambda name, v: numpy_helper.from_array(np.asarray(v, np.float32), name)  # noqa: E731
    square = (helper.make_node("Mul", ["x", "x"], ["sq"]) if form == "mul_square"
              else helper.make_node("Pow", ["x", "two"], ["sq"]))
    mean = (helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1) if axes_input
            else helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1], keepdims=1))
    nodes = [helper.make_node("Add", ["a", "r"], ["x"]), square, mean,
             helper.make_node("Add", ["ms", "eps"], ["v"]), helper.make_node("Sqrt", ["v"], ["s"])]
    if form == "divide":
        nodes.append(helper.make_node("Div", ["x", "s"], ["y"]))
    else:
        nodes.append(helper.make_node("Reciprocal", ["s"], ["inv"]) if form == "reciprocal"
                     else helper.make_node("Div", ["one", "s"], ["inv"]))
        nodes.append(helper.make_node("Mul", ["x", "inv"], ["y"]))
    if weight != "none":
        nodes.append(helper.make_node("Mul", ["w", "y"] if weight == "first" else ["y", "w"], ["z"]))
    nodes.append(helper.make_node("Add", ["z" if weight != "none" else "y", "x"], ["out"]))
    model = _model(nodes, [("a", [b, n, d]), ("r", [b, n, d])], ["out"], {"w": _weight(d) + 1})
    model.graph.initializer.extend([c("two", 2.0), c("eps", 1e-6), c("one", 1.0)])
    if axes_input:
        model.graph.initializer.append(numpy_helper.from_array(np.array([-1], np.int64), "axes"))
        model.opset_import[0].version = 18
    feeds = {"a": RNG.standard_normal((b, n, d)).astype(np.float32),
             "r": RNG.standard_normal((b, n, d)).astype(np.float32)}
    feeds["a"][0, 1] = 0.0  # a row of zeros: mean 0, the eps alone under the root
    feeds["r"][0, 1] = 0.0
    feeds["a"][1, 2] *= 1e4  # large values
    return model, feeds


@pytest.mark.parametrize("form,weight,axes_input", [
    ("div_one", "first", False), ("div_one", "last", True), ("reciprocal", "none", False),
    ("divide", "first", False), ("mul_square", "last", False)])
def test_t5_layernorm_is_one_row_kernel(opencl, form, weight, axes_input):
    model, feeds = _rms_norm_model(form, weight, axes_input)
    # x's Add, one row kernel, the residual Add; off: the square, the reduction, a tree on the reduced
    # shape, a tree on x's shape in place of the row kernel
    assert _compare(model, feeds, "rms_norm") == (3, 5)


def test_a_t5_layernorm_with_a_step_read_elsewhere_is_not_one_kernel(opencl):
    # the mean square is also a graph output: the steps after it still fuse among themselves only
    model, feeds = _rms_norm_model("div_one", "first", False)
    model.graph.output.append(helper.make_tensor_value_info("ms", TensorProto.FLOAT, None))
    fused, unfused = _compare(model, feeds, "rms_norm")
    assert fused == unfused == 5


def test_a_mean_over_another_axis_is_not_a_t5_layernorm(opencl):
    model, feeds = _rms_norm_model("div_one", "first", False)
    mean = next(n for n in model.graph.node if n.op_type == "ReduceMean")
    mean.attribute[0].ints[:] = [1]
    fused, unfused = _compare(model, feeds, "rms_norm")
    assert fused == unfused == 5


def _cls_concat_model(transpose_read_elsewhere: bool) -> tuple[onnx.ModelProto, dict]:
    """ViT's embeddings: patches [b, d, n] transposed to [b, n, d], the class token [1, 1, d] (an
    input, so that no optimizer folds its Expand) expanded over the batch and put first (Concat on axis 1), then a position embedding added."""
    b, d, n = 2, 8, 5
    nodes = [helper.make_node("Transpose", ["p"], ["pt"], perm=[0, 2, 1]),
             helper.make_node("Expand", ["cls", "shape"], ["ce"]),
             helper.make_node("Concat", ["ce", "pt"], ["cat"], axis=1),
             helper.make_node("Add", ["cat", "pos"], ["y"])]
    outputs = ["y"]
    if transpose_read_elsewhere:
        nodes.append(helper.make_node("Neg", ["pt"], ["npt"]))
        outputs.append("npt")
    model = _model(nodes, [("p", [b, d, n]), ("cls", [1, 1, d])], outputs, {"pos": _weight(1, n + 1, d)})
    model.graph.initializer.append(numpy_helper.from_array(np.array([b, 1, d], np.int64), "shape"))
    return model, {"p": RNG.standard_normal((b, d, n)).astype(np.float32),
                   "cls": RNG.standard_normal((1, 1, d)).astype(np.float32)}


def test_copies_read_only_by_a_concat_write_their_slot_of_it(opencl):
    model, feeds = _cls_concat_model(False)
    # the Transpose and the Expand into the Concat's output, then the Add; off: the Concat's two copies
    assert _compare(model, feeds, "concat_in_place") == (3, 5)


def test_a_copy_read_elsewhere_as_well_keeps_its_own_output(opencl):
    model, feeds = _cls_concat_model(True)
    # the Expand alone writes into the Concat; the Transpose's result is also read by the Neg
    assert _compare(model, feeds, "concat_in_place") == (5, 6)


@pytest.mark.parametrize("perm, broadcast_other", [([0, 2, 1, 3], False), ([0, 2, 3, 1], True), ([2, 0, 1], False)])
def test_a_transpose_read_only_by_an_elementwise_tree_is_read_through_strides(opencl, perm, broadcast_other):
    # T5's head split transposed and scaled by a constant (its attention in a partition of its own),
    # then added to a second input (of the same shape, or a row broadcast)
    shape = [2, 5, 3, 4][:len(perm)]
    out_shape = [shape[p] for p in perm]
    c = lambda name, v: numpy_helper.from_array(np.asarray(v, np.float32), name)  # noqa: E731
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=perm), helper.make_node("Mul", ["t", "k"], ["m"]),
             helper.make_node("Add", ["m", "z"], ["y"])]
    z_shape = [1] * (len(perm) - 1) + [out_shape[-1]] if broadcast_other else out_shape
    model = _model(nodes, [("x", shape), ("z", z_shape)], ["y"], {})
    model.graph.initializer.append(c("k", 0.125))
    feeds = {"x": RNG.standard_normal(shape).astype(np.float32), "z": RNG.standard_normal(z_shape).astype(np.float32)}
    assert _compare(model, feeds, "transpose_elementwise") == (1, 2)


def test_a_transpose_read_elsewhere_as_well_is_copied(opencl):
    c = lambda name, v: numpy_helper.from_array(np.asarray(v, np.float32), name)  # noqa: E731
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]), helper.make_node("Mul", ["t", "k"], ["y"]),
             helper.make_node("MatMul", ["t", "w"], ["u"])]
    model = _model(nodes, [("x", [6, 4])], ["y", "u"], {"w": _weight(6, 3)})
    model.graph.initializer.append(c("k", 3.0))
    feeds = {"x": RNG.standard_normal((6, 4)).astype(np.float32)}
    fused, unfused = _compare(model, feeds, "transpose_elementwise")
    assert fused == unfused == 3  # the Transpose, the Mul, the GEMM
