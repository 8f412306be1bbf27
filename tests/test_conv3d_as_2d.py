"""The 3-D FusedConvs that run as 2-D ones (``conv3d.AS_2D_PATHS``): ``frames_in_rows`` (k x 1 x 1
kernels over the (N, C, T, H*W) view), ``frames_as_batch`` (1 x kh x kw kernels over the frames
as images) and ``pointwise_strided`` (strided 1 x 1 x 1 kernels over the positions they read)
against the canonical N-d Conv then epilogue, and onnxruntime's Conv, Add and Relu; with biases
or none, residuals, groups, strides, dilations, uneven pads, several images, float64, a second
run on new values (the kept per-shape run), and the layouts none takes."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from onnxhal.hal import KernelCreateContext, Node
from onnxhal.runtime.providers.cpu.kernels import conv3d
from onnxhal.runtime.providers.cpu.kernels.fused import DOMAIN
from onnxhal.runtime.providers.cpu.kernels.fused_conv import FusedConv


class _Initializers(KernelCreateContext):
    """Weights and bias are constant initializers: the 2-D twin keeps a run per shape."""

    def is_constant_initializer(self, name: str) -> bool:
        return name in ("w", "b")


CASES = [  # (path, x shape, w shape, Conv attributes, bias, residual, activation)
    ("frames_in_rows", (1, 8, 8, 6, 5), (8, 8, 7, 1, 1), {"strides": [2, 1, 1], "pads": [3, 0, 0, 3, 0, 0]},
     True, False, "Relu"),
    ("frames_in_rows", (2, 6, 5, 3, 4), (6, 6, 3, 1, 1), {"pads": [1, 0, 0, 2, 0, 0], "dilations": [2, 3, 1]},
     False, True, "Relu"),
    ("frames_in_rows", (1, 24, 4, 2, 2), (10, 24, 1, 1, 1), {}, True, False, ""),
    ("frames_in_rows", (1, 6, 4, 3, 3), (6, 2, 3, 1, 1), {"pads": [1, 0, 0, 1, 0, 0], "group": 3},
     True, True, "Relu"),
    ("frames_as_batch", (1, 3, 4, 12, 11), (8, 3, 1, 7, 7), {"strides": [1, 2, 2], "pads": [0, 3, 3, 0, 3, 3]},
     True, False, "Relu"),
    ("frames_as_batch", (2, 4, 3, 5, 5), (6, 4, 1, 3, 3), {"pads": [0, 1, 0, 0, 2, 1], "dilations": [3, 1, 2]},
     True, True, "Relu"),
    ("frames_as_batch", (1, 6, 2, 4, 4), (6, 1, 1, 3, 3), {"pads": [0, 1, 1, 0, 1, 1], "group": 6},
     False, False, "Relu"),
    ("pointwise_strided", (1, 8, 5, 7, 6), (12, 8, 1, 1, 1), {"strides": [2, 2, 2]}, True, True, "Relu"),
    ("pointwise_strided", (2, 6, 4, 5, 5), (4, 6, 1, 1, 1), {"strides": [1, 2, 3]}, False, False, ""),
    ("pointwise_strided", (1, 6, 5, 3, 3), (6, 3, 1, 1, 1), {"strides": [3, 1, 1], "group": 2}, True, True, "Relu"),
]


def _fused(w_shape: tuple, attrs: dict, bias: bool, residual: bool, act: str) -> FusedConv:
    protos = [helper.make_attribute(k, v) for k, v in {"kernel_shape": list(w_shape[2:]), **attrs}.items()]
    if act:
        protos.append(helper.make_attribute("activation", act))
    node = Node("FusedConv", ["x", "w", "b" if bias else "", "z" if residual else ""], ["y"], domain=DOMAIN,
                attribute_protos=protos)
    node.since_version = 1
    return FusedConv(node, _Initializers())


def _onnxruntime(x, w, b, z, attrs: dict, act: str) -> np.ndarray:
    elem = onnx.TensorProto.FLOAT
    inits = [numpy_helper.from_array(w, "w")] + ([numpy_helper.from_array(b, "b")] if b is not None else [])
    nodes = [helper.make_node("Conv", ["x", "w"] + (["b"] if b is not None else []), ["c"], **attrs)]
    ins = [helper.make_tensor_value_info("x", elem, x.shape)]
    last = "c"
    if z is not None:
        nodes.append(helper.make_node("Add", ["c", "z"], ["s"]))
        ins.append(helper.make_tensor_value_info("z", elem, z.shape))
        last = "s"
    if act:
        nodes.append(helper.make_node(act, [last], ["a"]))
        last = "a"
    graph = helper.make_graph(nodes, "conv3d", ins, [helper.make_tensor_value_info(last, elem, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x, **({"z": z} if z is not None else {})})[0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0] + "-" + "x".join(map(str, c[2])))
def test_conv3d_as_2d_matches_nd_conv_and_onnxruntime(monkeypatch, case, dtype):
    path, xs, ws, attrs, bias, residual, act = case
    rng = np.random.default_rng(sum(xs) + sum(ws))
    w = rng.standard_normal(ws).astype(dtype)
    b = rng.standard_normal(ws[0]).astype(dtype) if bias else None
    kernel = _fused(ws, attrs, bias, residual, act)
    assert kernel.frames_as_2d is not None and kernel.frames_as_2d.path == path
    monkeypatch.setattr(conv3d, "ENABLED", False)
    plain = _fused(ws, attrs, bias, residual, act)
    assert plain.frames_as_2d is None
    tol = 1e-12 if dtype == np.float64 else 1e-4
    for _ in range(2):  # the second run on new values takes the twin's kept run
        x = rng.standard_normal(xs).astype(dtype)
        want = plain.compute([x, w, b, None])[0]
        z = rng.standard_normal(want.shape).astype(dtype) if residual else None
        want = plain.compute([x, w, b, z])[0]
        got = kernel.compute([x, w, b, z])[0]
        assert got.shape == want.shape and got.dtype == want.dtype and got.flags.c_contiguous
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
        if dtype == np.float32:
            np.testing.assert_allclose(got, _onnxruntime(x, w, b, z, attrs, act), rtol=tol, atol=tol)


@pytest.mark.parametrize("ws, attrs", [
    ((4, 4, 3, 1, 1), {"pads": [1, 1, 0, 1, 1, 0]}),  # row padding
    ((4, 4, 3, 1, 1), {"strides": [1, 2, 1]}),  # row stride
    ((4, 4, 1, 3, 3), {"pads": [1, 1, 1, 0, 1, 1]}),  # frame padding
    ((4, 4, 1, 3, 3), {"strides": [2, 1, 1]}),  # frame stride
    ((4, 4, 3, 3, 3), {}),
    ((4, 4, 1, 1, 1), {"auto_pad": "SAME_UPPER"}),
    ((4, 4, 1, 1, 1), {"strides": [2, 2, 2], "pads": [0, 1, 0, 0, 1, 0]}),  # a strided pointwise one, padded
])
def test_conv3d_as_2d_condition(ws, attrs):
    """Layouts where the frames mix with rows or columns keep the N-d Conv, and its results."""
    kernel = _fused(ws, attrs, True, False, "")
    assert kernel.frames_as_2d is None
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 4, 5, 6, 6)).astype(np.float32)
    w, b = rng.standard_normal(ws).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    got = kernel.compute([x, w, b, None])[0]
    onnx_attrs = {k: v for k, v in attrs.items()}
    np.testing.assert_allclose(got, _onnxruntime(x, w, b, None, onnx_attrs, ""), rtol=1e-4, atol=1e-4)
