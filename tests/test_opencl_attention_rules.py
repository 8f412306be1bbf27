"""Attention rules of the OpenCL EP (runtime/providers/opencl/attention_lowering.py).

Rule ``attention_view_chain`` reads an operand through Reshapes and Transposes as strides
(``reshape_axes``: checked here against numpy's reshape; the models in test_opencl_fusion.py).

Rule ``attention_select_mask``: a per-layer
``Where(mask, 0, min)`` read only as attention's additive mask is folded into the attention kernel,
which reads the bool condition (through the Expand before it, if any) and selects the constant per
score: one launch fewer a layer, and the Expand runs only where something else reads it.

The mask is data: new masks at one shape reuse the plan and must give onnxruntime's outputs (a mask
kept from an earlier run would be silently wrong)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxhal

RNG = np.random.default_rng(4752)
RULE = "attention_select_mask"
EP = "OpenCLExecutionProvider"
MIN = float(np.finfo(np.float32).min)


@pytest.fixture
def opencl(register):
    pytest.importorskip("pyopencl")
    from tests.opencl_support import require_opencl

    require_opencl()
    register("onnxhal.runtime.providers.opencl", "opencl")


def _model(expand_read_elsewhere: bool = False, gathered: bool = False, cast_read_elsewhere: bool = False) -> bytes:
    """Two attention layers over ``x`` [B, S, 8] (2 heads of 4) sharing one bool mask, cast from
    ``mask``'s values and expanded to the scores' shape, each layer turning it into an additive bias
    with its own ``Where(keep, 0, min)`` (as TorchScript BERT and GPT-2 exports do).
    ``expand_read_elsewhere``: the expanded mask is also cast to float and returned. ``gathered``:
    the mask is gathered by position ids (reversed, from the shape alone) and And-ed with a causal
    mask instead of expanded (TorchScript's chain, where the Gather is a ``take_flat``);
    ``cast_read_elsewhere``: the cast mask is also returned (as float)."""
    f = TensorProto.FLOAT
    c = {"ax12": np.array([1, 2], np.int64), "heads": np.array([0, 0, 2, 4], np.int64),
         "merge": np.array([0, 0, 8], np.int64), "scale": np.array(0.5, np.float32),
         "one": np.array(1, np.int64), "mone": np.array(-1, np.int64), "ax01": np.array([0, 1], np.int64),
         "ax013": np.array([0, 1, 3], np.int64)}
    nodes = [helper.make_node("Cast", ["mask"], ["mb"], to=TensorProto.BOOL)]
    if gathered:
        nodes += [helper.make_node("Shape", ["mask"], ["mshape"]),
                  helper.make_node("Gather", ["mshape", "one"], ["seq"], axis=0),
                  helper.make_node("Sub", ["seq", "one"], ["last"]),
                  helper.make_node("Range", ["last", "mone", "mone"], ["rpos"]),
                  helper.make_node("Flatten", ["mb"], ["mflat"], axis=1),
                  helper.make_node("Gather", ["mflat", "rpos"], ["mg"], axis=1),
                  helper.make_node("Unsqueeze", ["mg", "ax12"], ["m4"]),
                  helper.make_node("Unsqueeze", ["rpos", "ax01"], ["row"]),
                  helper.make_node("Unsqueeze", ["rpos", "ax013"], ["col"]),
                  helper.make_node("LessOrEqual", ["row", "col"], ["causal"]),
                  helper.make_node("And", ["m4", "causal"], ["keep"])]
    else:
        nodes.append(helper.make_node("Unsqueeze", ["mb", "ax12"], ["m4"]))
    x = "x"
    for layer in range(2):
        for p in "qkv":
            c[f"w{p}{layer}"] = RNG.standard_normal((8, 8)).astype(np.float32)
            nodes += [helper.make_node("MatMul", [x, f"w{p}{layer}"], [f"{p}{layer}"]),
                      helper.make_node("Reshape", [f"{p}{layer}", "heads"], [f"{p}h{layer}"]),
                      helper.make_node("Transpose", [f"{p}h{layer}"], [f"{p}t{layer}"],
                                       perm=[0, 2, 3, 1] if p == "k" else [0, 2, 1, 3])]
        c[f"zero{layer}"], c[f"min{layer}"] = np.array([0.0], np.float32), np.array([MIN], np.float32)
        nodes += [helper.make_node("MatMul", [f"qt{layer}", f"kt{layer}"], [f"qk{layer}"]),
                  helper.make_node("Mul", [f"qk{layer}", "scale"], [f"s{layer}"])]
        if layer == 0 and not gathered:
            nodes += [helper.make_node("Shape", ["s0"], ["sshape"]),
                      helper.make_node("Expand", ["m4", "sshape"], ["keep"])]
        nodes += [helper.make_node("Where", ["keep", f"zero{layer}", f"min{layer}"], [f"bias{layer}"]),
                  helper.make_node("Add", [f"s{layer}", f"bias{layer}"], [f"a{layer}"]),
                  helper.make_node("Softmax", [f"a{layer}"], [f"p{layer}"], axis=-1),
                  helper.make_node("MatMul", [f"p{layer}", f"vt{layer}"], [f"o{layer}"]),
                  helper.make_node("Transpose", [f"o{layer}"], [f"ot{layer}"], perm=[0, 2, 1, 3]),
                  helper.make_node("Reshape", [f"ot{layer}", "merge"], [f"y{layer}"])]
        x = f"y{layer}"
    outputs = ["y1"]
    if cast_read_elsewhere:
        nodes.append(helper.make_node("Cast", ["mb"], ["mbf"], to=f))
        outputs.append("mbf")
    if expand_read_elsewhere:
        nodes.append(helper.make_node("Cast", ["keep"], ["keepf"], to=f))
        outputs.append("keepf")
    graph = helper.make_graph(nodes, "masked_attention",
                              [helper.make_tensor_value_info("x", f, ["B", "S", 8]),
                               helper.make_tensor_value_info("mask", TensorProto.INT64, ["B", "S"])],
                              [helper.make_tensor_value_info(n, f, None) for n in outputs],
                              [numpy_helper.from_array(v, k) for k, v in c.items()])
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    model.ir_version = 10
    return model.SerializeToString()


def _feeds(b: int, s: int) -> dict:
    mask = RNG.integers(0, 2, (b, s)).astype(np.int64)
    mask[:, 0] = 1
    return {"x": RNG.standard_normal((b, s, 8)).astype(np.float32), "mask": mask}


def _sessions(data: bytes, rule: str) -> dict:
    sessions = {off: onnxhal.InferenceSession(data, providers=[(EP, {"disable_fusions": off}), "CPUExecutionProvider"])
                for off in ("", rule)}
    for s in sessions.values():
        s.disable_fallback()  # a plan that fails at run must fail here, not show the CPU EP's result
    return sessions


def _launches(sess) -> int:
    (info,) = sess.eps[EP].dynamic_partitions.values()
    (plan,) = info.cached_plans
    return plan.launches_per_run


@pytest.mark.parametrize("expand_read_elsewhere", [False, True])
def test_a_where_mask_folds_into_attention_as_onnxruntime(opencl, expand_read_elsewhere):
    """One launch fewer per layer with the rule (an Expand read elsewhere too is read through by both); on new
    masks at one shape (a fully masked row among them) the outputs are onnxruntime's with the rule on
    and off, and the plan is reused."""
    data = _model(expand_read_elsewhere)
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    sessions = _sessions(data, RULE)
    masks = [_feeds(2, 5) for _ in range(3)]
    masks[2]["mask"][1] = 0  # every key masked: the softmax of equal scores
    for feeds in masks:
        want = ref.run(None, feeds)
        for off, s in sessions.items():
            for w, g in zip(want, s.run(None, feeds)):
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=off)
    launches = {off: _launches(s) for off, s in sessions.items()}
    assert launches[""] == launches[RULE] - 2, launches
    for s in sessions.values():
        (info,) = s.eps[EP].dynamic_partitions.values()
        assert info.stats.misses == 1 and info.stats.host_runs == 0, info.stats


@pytest.mark.parametrize("cast_read_elsewhere", [False, True])
def test_a_gathered_mask_is_read_through_its_table_as_onnxruntime(opencl, cast_read_elsewhere):
    """Rule take_elementwise: the Gather of the bool mask by position ids gets no launch, the And
    with the causal mask reading the cast mask through the Gather's table, and computing the Cast
    there too where nothing else reads it; new masks at one shape give onnxruntime's outputs with
    the rule on and off, from one plan."""
    data = _model(gathered=True, cast_read_elsewhere=cast_read_elsewhere)
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    sessions = _sessions(data, "take_elementwise")
    for _ in range(3):
        feeds = _feeds(2, 5)
        want = ref.run(None, feeds)
        for off, s in sessions.items():
            for w, g in zip(want, s.run(None, feeds)):
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=off)
    launches = {off: _launches(s) for off, s in sessions.items()}
    # the Gather, and the Cast where only the Gather reads it
    assert launches[""] == launches["take_elementwise"] - (1 if cast_read_elsewhere else 2), launches
    for s in sessions.values():
        (info,) = s.eps[EP].dynamic_partitions.values()
        assert info.stats.misses == 1 and info.stats.host_runs == 0, info.stats
        assert s.partition_summary.get("CPUExecutionProvider", 0) == 0, s.partition_summary


def test_view_strides_follow_numpy():
    """``reshape_strides`` gives numpy's strides wherever numpy reshapes a transposed array without a
    copy, and None elsewhere; a merge of non-contiguous axes split again by the next Reshape (the
    dynamo K chain) reads the same elements as numpy's copies."""
    pytest.importorskip("pyopencl")
    from onnxhal.runtime.providers.opencl.attention_lowering import (
        axes_strides,
        reshape_axes,
        reshape_strides,
        strided_axes,
    )

    rng = np.random.default_rng(11)
    for _ in range(300):
        shape = tuple(int(x) for x in rng.integers(1, 4, int(rng.integers(1, 5))))
        v = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape).transpose(rng.permutation(len(shape)))
        new, left = [], v.size
        while left > 1:
            f = int(rng.choice([k for k in range(2, left + 1) if left % k == 0]))
            new.append(f)
            left //= f
        new.insert(int(rng.integers(0, len(new) + 1)), 1)
        got = reshape_strides(v.shape, [st // 4 for st in v.strides], tuple(new))
        try:
            view = v.view()
            view.shape = tuple(new)
        except AttributeError:
            view = None
        assert (got is None) == (view is None), (v.shape, v.strides, new, got)
        if got is not None:
            assert got == [st // 4 if n != 1 else got[k] for k, (st, n) in enumerate(zip(view.strides, new))]
    base = np.arange(2 * 6 * 36, dtype=np.float32).reshape(2, 6, 36)[:, :, 12:24]  # K's part of a QKV row
    axes = strided_axes(base.shape, [216, 36, 1])
    axes = reshape_axes(axes, (2, 6, 3, 4))
    axes = [axes[p] for p in (0, 2, 1, 3)]
    axes = reshape_axes(axes, (6, 6, 4))
    assert axes_strides(axes) is None  # [b * heads] is no strided view of that memory
    axes = reshape_axes([axes[p] for p in (0, 2, 1)], (2, 3, 4, 6))
    strides = axes_strides(axes)
    want = base.reshape(2, 6, 3, 4).transpose(0, 2, 1, 3).reshape(6, 6, 4).transpose(0, 2, 1).reshape(2, 3, 4, 6)
    got = np.lib.stride_tricks.as_strided(np.arange(2 * 6 * 36, dtype=np.float32)[12:], (2, 3, 4, 6),
                                          [4 * st for st in strides])
    np.testing.assert_array_equal(got, want)


def _embedding_model() -> bytes:
    """Token embeddings gathered by ``ids`` [B, S] (indices read at run time), plus position
    embeddings, into a LayerNorm (its prologue tree); a second table gathered by the same ids,
    through a Reshape, into a plain tree (Relu of a scaled value)."""
    f = TensorProto.FLOAT
    c = {"tok": RNG.standard_normal((11, 8)).astype(np.float32), "pos": RNG.standard_normal((1, 5, 8)).astype(np.float32),
         "tok2": RNG.standard_normal((11, 8)).astype(np.float32), "gamma": RNG.random(8).astype(np.float32) + 0.5,
         "beta": RNG.standard_normal(8).astype(np.float32), "two": np.array(2.0, np.float32),
         "flat": np.array([0, 40], np.int64)}
    nodes = [helper.make_node("Gather", ["tok", "ids"], ["t"], axis=0),
             helper.make_node("Add", ["t", "pos"], ["e"]),
             helper.make_node("LayerNormalization", ["e", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-5),
             helper.make_node("Gather", ["tok2", "ids"], ["t2"], axis=0),
             helper.make_node("Reshape", ["t2", "flat"], ["t2f"]),
             helper.make_node("Mul", ["t2f", "two"], ["m"]),
             helper.make_node("Relu", ["m"], ["y2"])]
    graph = helper.make_graph(nodes, "embeddings", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 5])],
                              [helper.make_tensor_value_info(n, f, None) for n in ("y", "y2")],
                              [numpy_helper.from_array(v, k) for k, v in c.items()])
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    model.ir_version = 10
    return model.SerializeToString()


def test_gathered_embeddings_are_read_by_their_trees_as_onnxruntime(opencl):
    """Rule gather_elementwise: both Gathers get no launch (the LayerNorm's prologue and the Relu
    tree read their rows by the ids); new ids at one shape, negative ones among them, give
    onnxruntime's outputs with the rule on and off, and ids out of range are refused."""
    data = _embedding_model()
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    sessions = {off: onnxhal.InferenceSession(data, providers=[(EP, {"disable_fusions": off})])
                for off in ("", "gather_elementwise")}
    for s in sessions.values():
        s.disable_fallback()
    for ids in (RNG.integers(0, 11, (2, 5)), RNG.integers(-11, 11, (2, 5))):
        feeds = {"ids": ids.astype(np.int64)}
        want = ref.run(None, feeds)
        for off, s in sessions.items():
            for w, g in zip(want, s.run(None, feeds)):
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=off)
    launches = {off: sum(p.launches_per_run for p in s.eps[EP].compiled_plans) for off, s in sessions.items()}
    assert launches[""] == launches["gather_elementwise"] - 2, launches
    bad = {"ids": np.full((2, 5), 11, np.int64)}
    for s in sessions.values():
        with pytest.raises(onnxhal.errors.OrtError, match="out of range|indices"):
            s.run(None, bad)
