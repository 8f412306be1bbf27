"""ConvTranspose's paths (``conv.TRANSPOSE_PATHS``): ``col2im_gather`` (col2im as one take of the
product's columns and one sum, ``col2im.col2im_plan``) against the canonical ``col2im_adds`` (one
strided add per kernel tap) and onnxruntime, over 1-D, 2-D and 3-D geometries: strides below,
equal to and above the kernel, dilations, groups, pads, output_padding, SAME padding, output_shape
both cropping and zero-extending, with and without bias, odd shapes, float32/float64/float16."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from onnxhal.hal import KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels import col2im, conv

CASES = [
    # (x shape, w shape, attributes)
    ((2, 16, 13), (16, 8, 4), {"strides": [2], "pads": [1, 1]}),  # pt_codec's decoder
    ((2, 6, 5, 7), (6, 4, 4, 4), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),  # pt_unet's upsampler
    ((1, 4, 3, 5), (4, 3, 4, 4), {"strides": [4, 4]}),  # kernel = stride: hf_dpt's, one term a cell
    ((1, 4, 5, 4), (4, 2, 3, 3), {"strides": [2, 2], "pads": [1, 0, 1, 2], "output_padding": [1, 1]}),
    ((2, 4, 4, 5), (4, 3, 3, 2), {"strides": [3, 2], "dilations": [2, 3], "pads": [2, 1, 0, 1]}),
    ((1, 6, 4, 3), (6, 2, 3, 3), {"group": 3, "strides": [2, 1], "pads": [1, 1, 1, 1]}),
    ((1, 4, 5, 5), (4, 4, 3, 3), {"pads": [1, 1, 1, 1]}),  # stride 1: 9 terms a cell
    ((1, 3, 2, 3, 4), (3, 2, 2, 3, 2), {"strides": [2, 2, 3], "pads": [0, 1, 1, 1, 0, 0]}),  # 3-D
    ((1, 2, 3, 3, 3), (2, 2, 3, 3, 3), {"pads": [1, 1, 1, 1, 1, 1]}),  # 3-D, stride 1: 27 terms
    ((1, 3, 1, 1), (3, 2, 1, 1), {"strides": [3, 2], "output_padding": [2, 1]}),  # cells no tap reaches
    ((1, 2, 6), (2, 3, 5), {"strides": [3], "dilations": [2], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 4, 5), (2, 3, 3, 2), {"strides": [2, 3], "auto_pad": "SAME_LOWER"}),
    ((1, 2, 4, 5), (2, 3, 3, 3), {"strides": [2, 2], "output_shape": [7, 8]}),  # cropped
    ((1, 2, 3, 2), (2, 1, 2, 2), {"strides": [2, 2], "output_shape": [9, 6]}),  # zero-extended
]
#: The cases onnxruntime runs: all but an output_shape past the full output, which it refuses and
#: the kernel zero-extends.
ORT_AGREES = [c for c in CASES if c[2].get("output_shape") != [9, 6]]


def _kernel(attrs: dict) -> conv.ConvTranspose:
    node = Node("ConvTranspose", ["x", "w", "b"], ["y"],
                attribute_protos=[helper.make_attribute(k, v) for k, v in attrs.items()])
    node.since_version = 11
    return conv.ConvTranspose(node, KernelCreateContext())


def _inputs(case, dtype, bias=True) -> list:
    xs, ws, attrs = case
    rng = np.random.default_rng(sum(xs) + sum(ws))
    x, w = rng.standard_normal(xs).astype(dtype), rng.standard_normal(ws).astype(dtype)
    return [x, w, rng.standard_normal(ws[1] * attrs.get("group", 1)).astype(dtype)] if bias else [x, w]


def _plain(monkeypatch, attrs: dict, inputs: list) -> np.ndarray:
    monkeypatch.setattr(col2im, "GATHER_MAX", 0)
    kernel = _kernel(attrs)
    y = kernel.compute(inputs)[0]
    assert kernel.last_path == conv.COL2IM_ADDS
    return y


def _onnxruntime(inputs: list, attrs: dict) -> np.ndarray:
    elem = onnx.TensorProto.FLOAT
    names = ["x", "w", "b"][:len(inputs)]
    graph = helper.make_graph([helper.make_node("ConvTranspose", names, ["y"], **attrs)], "convt",
                              [helper.make_tensor_value_info("x", elem, inputs[0].shape)],
                              [helper.make_tensor_value_info("y", elem, None)],
                              [numpy_helper.from_array(a, n) for n, a in zip(names[1:], inputs[1:])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": inputs[0]})[0]


def _id(case) -> str:
    return "x".join(map(str, case[0])) + "-" + "-".join(f"{k}{v}" for k, v in case[2].items())


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_col2im_gather_matches_col2im_adds(monkeypatch, case, dtype, bias):
    inputs = _inputs(case, dtype, bias)
    kernel = _kernel(case[2])
    got = kernel.compute(inputs)[0]
    assert kernel.last_path == conv.COL2IM_GATHER
    again = kernel.compute([inputs[0] * 2] + inputs[1:])[0]  # the cached plan, on new values
    want = _plain(monkeypatch, case[2], inputs)
    want2 = _plain(monkeypatch, case[2], [inputs[0] * 2] + inputs[1:])
    assert got.shape == want.shape and got.dtype == want.dtype and got.flags.c_contiguous
    tol = {np.float64: 1e-12, np.float32: 1e-5, np.float16: 2e-2}[dtype]
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    np.testing.assert_allclose(again, want2, rtol=tol, atol=tol)


@pytest.mark.parametrize("case", ORT_AGREES, ids=_id)
def test_col2im_gather_matches_onnxruntime(case):
    inputs = _inputs(case, np.float32)
    kernel = _kernel(case[2])
    got = kernel.compute(inputs)[0]
    assert kernel.last_path == conv.COL2IM_GATHER
    np.testing.assert_allclose(got, _onnxruntime(inputs, case[2]), rtol=1e-4, atol=1e-4)


def test_col2im_adds_past_the_limits(monkeypatch):
    """Past MAX_TERMS columns a cell, or GATHER_MAX gathered elements, the plain adds run."""
    case = CASES[1]
    inputs = _inputs(case, np.float32)
    monkeypatch.setattr(col2im, "MAX_TERMS", 3)  # the 4x4 stride-2 kernel sums 2 x 2 a cell
    kernel = _kernel(case[2])
    kernel.compute(inputs)
    assert kernel.last_path == conv.COL2IM_ADDS
    monkeypatch.undo()
    plan = col2im.col2im_plan((5, 7), (4, 4), (2, 2), (1, 1), (1, 1), (10, 14))
    assert plan.shape == (4, 140) and not plan.flags.writeable
    monkeypatch.setattr(col2im, "GATHER_MAX", 2 * 4 * plan.size - 1)  # N M terms cells, less one
    kernel.compute(inputs)
    assert kernel.last_path == conv.COL2IM_ADDS


def test_col2im_plan_sums_what_each_cell_receives():
    """1-D, kernel 3, stride 2, pads 1 each side, input 3: output o reads i * 2 + t == o + 1."""
    plan = col2im.col2im_plan((3,), (3,), (2,), (1,), (1,), (5,))
    zero = 3  # the zero appended after the input's 3 cells, read by tap 0's row
    want = {0: {(1, 0)}, 1: {(0, 1), (2, 0)}, 2: {(1, 1)}, 3: {(0, 2), (2, 1)}, 4: {(1, 2)}}
    for o in range(5):
        got = {divmod(int(f), 4) for f in plan[:, o] if f != zero}
        assert got == want[o], o


def test_output_below_one_cell_is_refused_on_both_paths(monkeypatch):
    inputs = [np.ones((1, 1, 2), np.float32), np.ones((1, 1, 2), np.float32)]
    with pytest.raises(InvalidArgument, match="every output dimension must be 1 or more"):
        _kernel({"pads": [2, 2]}).compute(inputs)
    monkeypatch.setattr(col2im, "GATHER_MAX", 0)
    with pytest.raises(InvalidArgument, match="every output dimension must be 1 or more"):
        _kernel({"pads": [2, 2]}).compute(inputs)


def test_placement_matches_onnxruntime_over_pads_same_and_output_shape():
    """Where the output starts and how long it is, against onnxruntime over auto_pad x output_shape
    (none, cropping 3, the full length) x explicit pads x strides x kernels, 1-D and 2-D: onnxruntime
    splits max(0, full - output) with its ceiling half at the start (floor half for SAME_UPPER) and
    reads no pads then; a SAME output longer than the full one is the full one (kernel 2, stride 3)."""
    import itertools

    checked = 0
    for nd, k, s, pad_mode, out, pads in itertools.product(
            (1, 2), (2, 3), (1, 2, 3), ("NOTSET", "SAME_UPPER", "SAME_LOWER"), (None, 3, 0), (False, True)):
        ins = (5, 4)[:nd]
        full = [(i - 1) * s + k for i in ins]
        attrs = {"strides": [s] * nd, "auto_pad": pad_mode}
        if pads and pad_mode == "NOTSET":
            attrs["pads"] = [1] * nd + [0] * nd
        if out is not None:
            attrs["output_shape"] = [f - out for f in full]
        rng = np.random.default_rng(checked)
        x = rng.standard_normal((1, 2) + ins).astype(np.float32)
        w = rng.standard_normal((2, 3) + (k,) * nd).astype(np.float32)
        got = _kernel(attrs).compute([x, w])[0]
        np.testing.assert_allclose(got, _onnxruntime([x, w], attrs), rtol=1e-5, atol=1e-5, err_msg=str(attrs))
        checked += 1
    assert checked == 216
