"""CPU EP native NN kernels (Conv, ConvTranspose, pooling, normalization, Softmax, Gemm) against
onnx.reference on random inputs, over the attribute forms the backend node cases leave out
(grouped/depthwise/dilated/strided/N-d conv, auto_pad, count_include_pad...)."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from onnxhal.hal import Node
from onnxhal.runtime.providers.cpu.kernel_factory import ReferenceKernel, create_cpu_kernel

RNG = np.random.default_rng(1234)


def make_node(op: str, n_inputs: int, opset: int, n_outputs: int = 1, domain: str = "", **attrs) -> Node:
    """A hal.Node for ``op`` with inputs i0.., outputs y0.., its since_version resolved at ``opset``."""
    proto = helper.make_node(op, [f"i{k}" for k in range(n_inputs)],
                             [f"y{k}" for k in range(n_outputs)], domain=domain, **attrs)
    node = Node.from_proto(proto)
    node.since_version = onnx.defs.get_schema(op, opset, domain).since_version
    return node


def run_native(op: str, inputs: list, opset: int, n_outputs: int = 1, **attrs) -> list:
    node = make_node(op, len(inputs), opset, n_outputs, **attrs)
    kernel = create_cpu_kernel(node, None)
    assert not isinstance(kernel, ReferenceKernel), f"{op} at opset {opset} has no native kernel"
    return kernel.compute(list(inputs))


def single_node_model(op: str, inputs: list, opset: int, n_outputs: int, ir_version: int | None = None,
                      **attrs) -> tuple[onnx.ModelProto, dict]:
    """A model of one ``op`` node over inputs i0.. (None: an omitted input) and its feeds."""
    names = [f"i{k}" if v is not None else "" for k, v in enumerate(inputs)]
    node = helper.make_node(op, names, [f"y{k}" for k in range(n_outputs)], **attrs)
    feeds = {n: v for n, v in zip(names, inputs) if n}
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for n, v in feeds.items()],
        [helper.make_empty_tensor_value_info(f"y{k}") for k in range(n_outputs)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    if ir_version is not None:
        model.ir_version = ir_version
    return model, feeds


def run_reference(op: str, inputs: list, opset: int, n_outputs: int = 1, **attrs) -> list:
    model, feeds = single_node_model(op, inputs, opset, n_outputs, **attrs)
    return ReferenceEvaluator(model).run(None, feeds)


def run_onnxruntime(op: str, inputs: list, opset: int, n_outputs: int = 1, **attrs) -> list:
    ort = pytest.importorskip("onnxruntime")
    model, feeds = single_node_model(op, inputs, opset, n_outputs, ir_version=9, **attrs)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def check(op: str, inputs: list, opset: int, n_outputs: int = 1, rtol: float = 1e-5, atol: float = 1e-5,
          **attrs) -> list:
    """Native result == onnx.reference result, same dtype and shape; returns the native outputs."""
    got = run_native(op, inputs, opset, n_outputs, **attrs)
    want = run_reference(op, inputs, opset, n_outputs, **attrs)
    for g, w in zip(got, want):
        assert isinstance(g, np.ndarray)
        assert g.dtype == w.dtype, f"{op}: dtype {g.dtype} != {w.dtype}"
        assert g.shape == w.shape, f"{op}: shape {g.shape} != {w.shape}"
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return got


def randn(*shape, dtype=np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("x_shape,w_shape,attrs", [
    ((2, 3, 9, 9), (4, 3, 3, 3), {}),
    ((1, 4, 10, 8), (6, 4, 3, 2), {"pads": [1, 0, 2, 1], "strides": [2, 1]}),
    ((1, 4, 11, 11), (4, 2, 3, 3), {"group": 2, "dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    ((2, 6, 8, 8), (6, 1, 3, 3), {"group": 6, "pads": [1, 1, 1, 1]}),  # depthwise
    # depthwise through the phase-grouped tap copy: strides, dilations, odd sizes, non-square kernels
    ((1, 5, 11, 9), (5, 1, 3, 3), {"group": 5, "pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((2, 4, 12, 13), (4, 1, 5, 3), {"group": 4, "pads": [2, 1, 2, 1], "strides": [3, 2], "dilations": [2, 1]}),
    ((1, 3, 10, 10), (3, 1, 3, 3), {"group": 3, "dilations": [2, 3], "strides": [2, 2], "pads": [0, 1, 2, 3]}),
    ((1, 3, 6, 7), (3, 1, 1, 1), {"group": 3, "strides": [2, 2]}),
    # unit-stride depthwise as wide as its input: whole planes between zero rows, row-end taps zeroed
    ((2, 4, 7, 6), (4, 1, 3, 3), {"group": 4, "pads": [2, 2, 0, 0]}),
    ((1, 3, 8, 9), (3, 1, 3, 3), {"group": 3, "dilations": [2, 2], "pads": [1, 3, 3, 1]}),
    ((1, 2, 6, 5), (2, 1, 5, 5), {"group": 2, "pads": [2, 2, 2, 2]}),
    ((1, 3, 5, 7), (3, 1, 4, 4), {"group": 3, "auto_pad": "SAME_UPPER"}),
    ((1, 2, 4, 1), (2, 1, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}),  # one column: both row ends
    ((1, 4, 8, 8), (8, 1, 3, 3), {"group": 4, "strides": [2, 2]}),  # channel multiplier 2
    ((1, 3, 7, 9), (5, 3, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 3, 7, 9), (5, 3, 4, 4), {"auto_pad": "SAME_LOWER"}),
    ((1, 3, 7, 9), (5, 3, 3, 3), {"auto_pad": "VALID", "strides": [1, 2]}),
    ((2, 3, 15), (4, 3, 5), {"pads": [2, 1], "strides": [3]}),  # 1-D
    ((1, 2, 5, 6, 7), (3, 2, 2, 3, 3), {"pads": [1, 0, 1, 0, 1, 1]}),  # 3-D
])
def test_conv_matches_reference(x_shape, w_shape, attrs):
    x, w, b = randn(*x_shape), randn(*w_shape), randn(w_shape[0])
    check("Conv", [x, w], 11, **attrs)
    (y,) = check("Conv", [x, w, b], 11, **attrs)
    assert y.dtype == np.float32


def test_conv_float16_accumulates_in_float32():
    x, w = randn(1, 8, 6, 6), randn(4, 8, 3, 3)
    (y16,) = run_native("Conv", [x.astype(np.float16), w.astype(np.float16)], 11)
    (y32,) = run_native("Conv", [x.astype(np.float16).astype(np.float32), w.astype(np.float16).astype(np.float32)], 11)
    assert y16.dtype == np.float16
    np.testing.assert_allclose(y16.astype(np.float32), y32, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("x_shape,w_shape,attrs", [
    ((1, 3, 4, 4), (3, 2, 3, 3), {}),
    ((2, 4, 3, 5), (4, 3, 3, 2), {"strides": [2, 3], "pads": [1, 0, 0, 1]}),
    ((1, 2, 4, 4), (2, 2, 2, 2), {"dilations": [2, 2]}),
    ((1, 2, 5), (2, 3, 3), {"strides": [2]}),
    ((1, 2, 3, 3), (2, 2, 3, 3), {"output_shape": [7, 7], "strides": [2, 2]}),
    ((1, 1, 3, 3), (1, 2, 3, 3), {"output_shape": [10, 8], "strides": [3, 2]}),  # zero-extended
    ((1, 2, 3, 4), (2, 2, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 2, 3, 4), (2, 2, 4, 3), {"auto_pad": "SAME_LOWER", "strides": [2, 3]}),
])
def test_conv_transpose_matches_reference(x_shape, w_shape, attrs):
    x, w = randn(*x_shape), randn(*w_shape)
    b = randn(w_shape[1] * attrs.get("group", 1))
    check("ConvTranspose", [x, w, b], 11, **attrs)


@pytest.mark.parametrize("op,attrs", [
    ("MaxPool", {"kernel_shape": [3, 3]}),
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("MaxPool", {"kernel_shape": [2, 2], "dilations": [2, 2]}),
    ("MaxPool", {"kernel_shape": [3, 2], "auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ("MaxPool", {"kernel_shape": [3, 3], "ceil_mode": 1, "strides": [2, 2]}),
    ("AveragePool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    ("AveragePool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    ("AveragePool", {"kernel_shape": [2, 3], "strides": [2, 1], "auto_pad": "SAME_LOWER"}),
    ("AveragePool", {"kernel_shape": [2, 2], "dilations": [2, 1]}),
    ("LpPool", {"kernel_shape": [3, 2], "pads": [1, 0, 1, 1], "strides": [2, 1], "p": 3}),
    ("LpPool", {"kernel_shape": [2, 2], "auto_pad": "SAME_UPPER"}),
    ("MaxPool", {"kernel_shape": [9, 8]}),  # one window over the whole input: a global pool
    ("AveragePool", {"kernel_shape": [9, 8], "strides": [3, 3]}),
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [3, 2], "dilations": [2, 1], "pads": [2, 1, 0, 1]}),
])
def test_pooling_matches_reference(op, attrs):
    check(op, [randn(2, 3, 9, 8)], 19, **attrs)


@pytest.mark.parametrize("op,shape,attrs", [
    ("MaxPool", (2, 3, 11), {"kernel_shape": [4], "strides": [3], "pads": [2, 3]}),
    ("AveragePool", (1, 2, 5, 6, 7), {"kernel_shape": [3, 2, 3], "strides": [2, 1, 2], "pads": [1, 0, 1, 1, 1, 2]}),
    ("MaxPool", (1, 2, 5, 6, 7), {"kernel_shape": [2, 3, 2], "dilations": [2, 1, 2], "ceil_mode": 1, "strides": [2, 2, 2]}),
    ("AveragePool", (1, 2, 4, 4), {"kernel_shape": [3, 3], "pads": [2, 2, 2, 2], "count_include_pad": 1}),
    ("MaxPool", (1, 2, 2, 3), {"kernel_shape": [3, 3], "pads": [2, 2, 2, 2]}),
])
def test_pooling_nd_and_wide_pads_match_reference(op, shape, attrs):
    # Pools reduce one axis at a time and skip taps that land in padding: 1-D and 3-D inputs,
    # pads as wide as the input, windows mostly outside it.
    check(op, [randn(*shape)], 19, **attrs)


@pytest.mark.parametrize("op,shape,attrs", [
    ("MaxPool", (2, 3, 9, 8), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    ("MaxPool", (1, 2, 6, 7), {"kernel_shape": [3, 2], "dilations": [2, 3], "pads": [2, 0, 1, 1]}),
    ("AveragePool", (1, 3, 7, 7), {"kernel_shape": [5, 5], "pads": [2, 2, 2, 2]}),
    ("AveragePool", (1, 3, 7, 7), {"kernel_shape": [3, 1], "pads": [1, 0, 1, 0], "count_include_pad": 1}),
    ("AveragePool", (2, 2, 5, 6), {"kernel_shape": [1, 1]}),
    ("LpPool", (1, 2, 6, 5), {"kernel_shape": [2, 3], "pads": [0, 1, 1, 1], "p": 2}),
    ("MaxPool", (2, 3, 13), {"kernel_shape": [4], "pads": [2, 1]}),
    ("AveragePool", (1, 2, 4, 5, 6), {"kernel_shape": [2, 3, 3], "pads": [1, 1, 0, 0, 1, 2]}),
    ("MaxPool", (1, 2, 5, 5), {"kernel_shape": [3, 3], "ceil_mode": 1, "pads": [0, 0, 1, 1]}),
])
def test_unit_stride_pools_match_onnxruntime(op, shape, attrs):
    # Unit-stride pools take whole-array passes over the flattened padded input, whose windows
    # run across row and plane ends where no output is sampled. (onnx.reference fails on the
    # 1-D end pads and shifts ceil_mode windows: ORT is the oracle.)
    _assert_pool_matches_onnxruntime(op, randn(*shape), attrs)


def _assert_pool_matches_onnxruntime(op, x, attrs):
    before = x.copy()
    (want,) = run_onnxruntime(op, [x], 19, **attrs)
    (y,) = run_native(op, [x], 19, **attrs)
    assert y.shape == want.shape and y.dtype == want.dtype
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(x, before)  # a pool's view of x (the 1x1 pool's is x itself) is copied
    y += 1  # and the result is the caller's to write


@pytest.mark.parametrize("shape,attrs", [
    ((1, 2, 2, 2), {"kernel_shape": [2, 2], "pads": [1, 1, 1, 1], "dilations": [3, 3]}),
    ((2, 3, 4, 3), {"kernel_shape": [2, 2], "pads": [1, 1, 1, 1], "dilations": [1, 4]}),
    ((1, 2, 3), {"kernel_shape": [2], "pads": [1, 1], "dilations": [4]}),
])
def test_maxpool_window_of_padding_alone_gives_lowest_finite_like_onnxruntime(shape, attrs):
    """A dilated window can hold padding alone (with onnxruntime's pads below the kernel, then
    every window of the output does); onnxruntime gives it -FLT_MAX, where its running max
    starts. The CPU EP gave -inf."""
    x = randn(*shape)
    _assert_pool_matches_onnxruntime("MaxPool", x, attrs)
    (y,) = run_native("MaxPool", [x], 19, **attrs)
    assert y.size and (y == np.finfo(np.float32).min).all()
    (y16,) = run_native("MaxPool", [x.astype(np.float16)], 19, **attrs)
    assert (y16 == np.finfo(np.float16).min).all()


def test_maxpool_pads_wider_than_the_kernel_mix_padding_windows_and_input_windows():
    """Pads at least the kernel's size (onnxruntime refuses them; the spec does not): windows of
    padding alone give -FLT_MAX, the others their max, a real -inf included."""
    x = np.array([[[1.0, -np.inf, 3.0]]], np.float32)
    (y,) = run_native("MaxPool", [x], 19, kernel_shape=[2], pads=[3, 3])
    low = np.finfo(np.float32).min
    np.testing.assert_array_equal(y.ravel(), [low, low, 1.0, 1.0, 3.0, 3.0, low, low])
    (y,) = run_native("MaxPool", [np.full((1, 1, 3), -np.inf, np.float32)], 19, kernel_shape=[2], pads=[3, 3])
    np.testing.assert_array_equal(y.ravel(), [low, low] + [-np.inf] * 4 + [low, low])


@pytest.mark.parametrize("op,shape,attrs", [
    ("MaxPool", (2, 3, 11, 11), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ("MaxPool", (1, 4, 9, 10), {"kernel_shape": [3, 3], "strides": [2, 2]}),
    ("AveragePool", (2, 2, 9, 9), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 1, 0, 1]}),
    ("MaxPool", (1, 2, 13, 8), {"kernel_shape": [3, 2], "strides": [2, 2], "dilations": [2, 1]}),
    ("LpPool", (1, 2, 7, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "p": 2}),
    ("MaxPool", (1, 2, 7, 6, 5), {"kernel_shape": [3, 2, 2], "strides": [2, 2, 1]}),
    ("MaxPool", (1, 2, 10, 10), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),  # ceil pads rows
    ("AveragePool", (1, 2, 8, 9), {"kernel_shape": [2, 3], "strides": [3, 2], "ceil_mode": 1}),
])
def test_strided_pools_with_unpadded_rows_match_onnxruntime(op, shape, attrs):
    # Strided pools whose windows stay inside the rows reduce the rows with flat passes over the
    # whole input (rows near a plane's end mix two planes and must never be sampled).
    _assert_pool_matches_onnxruntime(op, randn(*shape), attrs)
    if op == "MaxPool" and len(shape) == 4:
        _assert_pool_matches_onnxruntime(op, RNG.integers(-128, 127, shape).astype(np.int8), attrs)


@pytest.mark.parametrize("shape,attrs,path", [
    ((1, 6, 14, 14), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, "whole"),  # ShuffleNet
    ((2, 3, 28, 28), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, "two products"),
    ((1, 2, 27, 30), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 1], "ceil_mode": 1,
                      "count_include_pad": 1}, "two products"),
    ((1, 2, 25, 25), {"kernel_shape": [3, 2], "strides": [2, 3], "pads": [2, 1, 1, 0], "dilations": [2, 2]},
     "two products"),
    ((1, 3, 9, 9), {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}, "whole"),
    ((1, 2, 30, 30), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, "separable"),  # unit stride, large
    ((1, 2, 28, 28), {"kernel_shape": [2, 2], "strides": [2, 2]}, "separable"),  # unpadded
])
def test_average_pool_as_matrix_products(shape, attrs, path):
    # Per axis a matrix of 1 / count at each window's inputs: one product with the whole plane's
    # matrix, or the columns' product for all rows and then the rows' per plane.
    x = randn(*shape)
    _assert_pool_matches_onnxruntime("AveragePool", x, attrs)
    node = make_node("AveragePool", 1, 19, **attrs)
    kernel = create_cpu_kernel(node, None)
    kernel.compute([x])
    products = next(iter(kernel._products.values()))
    geometry = kernel.geometry(x.shape[2:])
    padded = any(geometry[3]) or any(geometry[4])
    taken = ("separable" if kernel._average_products(x, *geometry, padded) is None
             else "whole" if products.whole is not None else "two products")
    assert taken == path
    np.testing.assert_allclose(kernel.compute([x.astype(np.float64)])[0], run_reference("AveragePool", [x], 19, **attrs)[0],
                               rtol=1e-5, atol=1e-6)


def test_average_pool_window_of_padding_alone_keeps_the_separable_result():
    # A window over explicit padding only has no counted input (onnxruntime rejects such pads):
    # the products are not built for it, and its average is NaN, as onnx.reference's.
    attrs = {"kernel_shape": [2, 2], "pads": [2, 2, 0, 0], "strides": [2, 2]}
    x = randn(1, 2, 6, 6)
    node = make_node("AveragePool", 1, 19, **attrs)
    kernel = create_cpu_kernel(node, None)
    with np.errstate(invalid="ignore"):
        (y,) = kernel.compute([x])
    assert not next(iter(kernel._products.values())).ok
    with warnings.catch_warnings():  # onnx.reference's mean of the empty window
        warnings.simplefilter("ignore", RuntimeWarning)
        (want,) = run_reference("AveragePool", [x], 19, **attrs)
    assert np.isnan(y[0, 0, 0, 0])
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("op,shape,attrs", [
    ("MaxPool", (2, 3, 12, 11), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("MaxPool", (1, 2, 13, 10), {"kernel_shape": [3, 2], "strides": [3, 2], "pads": [2, 0, 1, 1], "dilations": [2, 1]}),
    ("MaxPool", (1, 2, 9, 9), {"kernel_shape": [1, 1], "strides": [2, 3]}),
    ("MaxPool", (1, 2, 10, 7), {"kernel_shape": [4, 3], "strides": [2, 2], "pads": [2, 1, 2, 1], "ceil_mode": 1}),
    ("MaxPool", (1, 4, 5, 6), {"kernel_shape": [3, 3], "strides": [4, 1], "pads": [1, 1, 1, 1]}),
    ("AveragePool", (1, 2, 40, 40), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ("AveragePool", (2, 2, 33, 35), {"kernel_shape": [3, 2], "strides": [2, 3], "dilations": [2, 2]}),
    ("LpPool", (1, 2, 11, 12), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 0, 1]}),
])
def test_strided_pools_with_partial_windows_match_onnxruntime(op, shape, attrs):
    # Windows over the padding (either side, ceil_mode's end), dilated, wider strides than the
    # kernel; a NaN in a plane's last element reaches only the windows that cover it.
    x = randn(*shape)
    if op == "LpPool":
        np.testing.assert_allclose(run_native(op, [x], 18, **attrs)[0], run_reference(op, [x], 18, **attrs)[0],
                                   rtol=1e-5, atol=1e-6)
        return
    _assert_pool_matches_onnxruntime(op, x, attrs)
    if op == "MaxPool":
        _assert_pool_matches_onnxruntime(op, RNG.integers(-128, 127, shape).astype(np.int8), attrs)
        r, c = shape[2] - 1, shape[3] - 1  # plane 0's last element: only its own windows see it
        x[0, 0, r, c] = np.nan
        (y,) = run_native(op, [x], 19, **attrs)
        pool = create_cpu_kernel(make_node(op, 1, 19, **attrs), None)
        kernel, strides, dil, pb, _, out, _ = pool.geometry(shape[2:])
        covers = [[any(i * strides[a] - pb[a] + t * dil[a] == (r, c)[a] for t in range(kernel[a])) for i in range(out[a])]
                  for a in range(2)]
        want = np.zeros(y.shape, bool)
        want[0, 0] = np.outer(covers[0], covers[1])
        np.testing.assert_array_equal(np.isnan(y), want)


def test_maxpool_unit_stride_integer_and_nan():
    x = RNG.integers(-128, 127, (1, 2, 6, 6)).astype(np.int8)
    (y,) = run_native("MaxPool", [x], 12, kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    (want,) = run_reference("MaxPool", [x.astype(np.float32)], 12, kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    np.testing.assert_array_equal(y, want.astype(np.int8))
    f = randn(1, 1, 5, 5)
    f[0, 0, 2, 2] = np.nan
    (y,) = run_native("MaxPool", [f], 12, kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    assert np.isnan(y[0, 0, 1:4, 1:4]).all() and not np.isnan(y[0, 0, 0]).any()  # NaN spreads over its windows only


@pytest.mark.parametrize("auto_pad", ["NOTSET", "SAME_UPPER", "SAME_LOWER"])
def test_conv_transpose_output_shape_smaller_than_computed_crops_as_onnxruntime(auto_pad):
    # onnxruntime (conv_transpose_attributes.h) splits the total padding max(0, full - output_shape)
    # with its ceiling half at the start, the floor half for SAME_UPPER, and reads no explicit pads;
    # onnx.reference keeps the start (9 x 7 -> 6 x 5: rows 2-7 and columns 1-5 against 0-5 and 0-4)
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    x, w = randn(1, 2, 4, 3), randn(2, 3, 3, 3)
    attrs = {"strides": [2, 2], "output_shape": [6, 5], "auto_pad": auto_pad}
    (full,) = run_native("ConvTranspose", [x, w], 11, strides=[2, 2])
    (y,) = run_native("ConvTranspose", [x, w], 11, **attrs)
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, x.shape)],
                              [helper.make_tensor_value_info("y", 1, None)], [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    rows, cols = (slice(1, 7), slice(1, 6)) if auto_pad == "SAME_UPPER" else (slice(2, 8), slice(1, 6))
    np.testing.assert_allclose(y, full[:, :, rows, cols], rtol=1e-5, atol=1e-6)


def test_conv_transpose_grouped_equals_per_group():
    # onnx.reference cannot reshape grouped weights here: compare with one call per group.
    x, w = randn(1, 4, 3, 3), randn(4, 1, 3, 3)
    attrs = {"strides": [2, 2], "output_padding": [1, 1]}
    (y,) = run_native("ConvTranspose", [x, w], 11, group=2, **attrs)
    parts = [run_reference("ConvTranspose", [x[:, 2 * g:2 * g + 2], w[2 * g:2 * g + 2]], 11, **attrs)[0]
             for g in range(2)]
    np.testing.assert_allclose(y, np.concatenate(parts, axis=1), rtol=1e-5, atol=1e-5)


def test_maxpool_integer_pads_with_dtype_minimum():
    # onnx.reference pads integers with NaN and fails: compare with the float computation.
    x = RNG.integers(-100, -50, (1, 1, 4, 4)).astype(np.int8)
    (y,) = run_native("MaxPool", [x], 12, kernel_shape=[2, 2], pads=[1, 1, 1, 1])
    (want,) = run_reference("MaxPool", [x.astype(np.float32)], 12, kernel_shape=[2, 2], pads=[1, 1, 1, 1])
    assert y.dtype == np.int8
    np.testing.assert_array_equal(y, want.astype(np.int8))


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"])
def test_global_pools(op):
    (y,) = run_native(op, [randn(2, 3, 4, 5)], 11)
    assert y.shape == (2, 3, 1, 1) and y.dtype == np.float32
    if op != "GlobalLpPool":
        check(op, [randn(2, 3, 4, 5)], 11)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("shape", [(2, 3, 7, 7), (1, 4, 56, 56), (2, 2, 3, 4, 5), (1, 3, 1, 1), (0, 3, 2, 2)])
def test_global_average_pool_planes(shape, dtype):
    # Means as numpy's float64 mean, NaN kept. (A float32 BLAS sum was tried: 4x faster, but its
    # rounding differs from the pairwise sum, which the light SqueezeNet case's softmax amplifies.)
    x = (RNG.standard_normal(shape) * 3 + 1).astype(dtype)
    if x.size:
        x.flat[x.size // 2] = np.nan
    for op, extra in (("GlobalAveragePool", {}), ("AveragePool", {"kernel_shape": list(shape[2:])})):
        (y,) = run_native(op, [x], 11, **extra)
        want = x.astype(np.float64).mean(axis=tuple(range(2, x.ndim)), keepdims=True)
        assert y.shape == want.shape and y.dtype == dtype
        tol = 1e-3 if dtype == np.float16 else 1e-6
        np.testing.assert_allclose(y.astype(np.float64), want, rtol=tol, atol=tol)


def test_batchnorm_inference_and_training_fallback():
    x, s, b, m, v = randn(2, 3, 4, 4), randn(3), randn(3), randn(3), np.abs(randn(3)) + 0.1
    (y,) = check("BatchNormalization", [x, s, b, m, v], 15, epsilon=1e-3)
    assert y.dtype == np.float32
    # onnx.reference's opset-9 kernel recomputes batch statistics; the spec (and ORT) use the
    # running mean/var in inference, as opset 15 does.
    (y9,) = run_native("BatchNormalization", [x, s, b, m, v], 9, epsilon=1e-3)
    np.testing.assert_allclose(y9, y, rtol=1e-6)
    check("BatchNormalization", [x, s, b, m, v], 15, n_outputs=3, training_mode=1, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5), (2, 3, 4, 5), (16, 8, 3, 3)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_batchnorm_training_mode_runs_natively_and_matches_onnxruntime(shape, dtype):
    """Training-mode BatchNormalization (batch statistics; running ones blended by momentum) ran on
    onnx.reference: NFNet's weight standardisation as timm exports it (tm_nfnet, one per conv)."""
    c = shape[1]
    x = (RNG.standard_normal(shape) * 3 + 1).astype(dtype)
    params = [RNG.uniform(0.5, 2, c).astype(dtype), RNG.standard_normal(c).astype(dtype),
              RNG.standard_normal(c).astype(dtype), RNG.uniform(0.5, 2, c).astype(dtype)]
    attrs = {"epsilon": 1e-4, "momentum": 0.7, "training_mode": 1}
    assert create_cpu_kernel(make_node("BatchNormalization", 5, 15, 3, **attrs), None).ref is None
    got = run_native("BatchNormalization", [x, *params], 15, 3, **attrs)
    want = run_onnxruntime("BatchNormalization", [x, *params], 15, 3, **attrs)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)


@pytest.mark.parametrize("axis", [-1, 1, 0])
def test_layernorm(axis):
    x = randn(2, 3, 5)
    scale = randn(*x.shape[axis:])
    bias = randn(*scale.shape)
    check("LayerNormalization", [x, scale, bias], 17, n_outputs=3, axis=axis, rtol=1e-4, atol=1e-5)
    check("LayerNormalization", [x.astype(np.float64), scale.astype(np.float64)], 17, axis=axis)


def _layer_norm64(x: np.ndarray, scale: np.ndarray, bias: np.ndarray, axis: int, eps: float = 1e-5):
    """LayerNormalization over axes [axis, rank) in float64: (y, mean, inv_std)."""
    x64 = x.astype(np.float64)
    axes = tuple(range(axis % x.ndim, x.ndim))
    mean = x64.mean(axis=axes, keepdims=True)
    d = x64 - mean
    inv_std = 1.0 / np.sqrt((d * d).mean(axis=axes, keepdims=True) + eps)
    return d * inv_std * scale.astype(np.float64) + bias.astype(np.float64), mean, inv_std


@pytest.mark.parametrize("shape", [(2, 64, 96), (2, 12, 32)])
@pytest.mark.parametrize("axis", [-1, 1])
@pytest.mark.parametrize("offset", [0.0, 100.0, 1e4])
def test_layer_normalization_of_large_contiguous_inputs(offset, axis, shape):
    """The path whose means are BLAS row sums (contiguous float32 of >= 4096 elements, the
    normalized axes as rows: the last one, or the last two), with its mean and inverse deviation
    outputs, against float64. Rows whose mean outweighs their spread get the mean corrected: over
    20 seeds, 2.2e-6 at 100 and 5e-6 at 1e4 (onnxruntime 1.5e-5 and 2e-3); uncorrected, 2e-4 at 100.
    Below 4096 elements (a tiny model's 24 rows of 32) the small path is held to the same bounds."""
    x = randn(*shape) + np.float32(offset)
    scale, bias = randn(*x.shape[axis:]), randn(*x.shape[axis:])
    y, mean, inv_std = run_native("LayerNormalization", [x, scale, bias], 17, n_outputs=3, axis=axis)
    want_y, want_mean, want_inv = _layer_norm64(x, scale, bias, axis)
    assert mean.shape == inv_std.shape == want_mean.shape
    np.testing.assert_allclose(mean, want_mean, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(inv_std, want_inv, rtol=1e-4)
    np.testing.assert_allclose(y, want_y, rtol=0, atol=1e-5 if offset else 4e-6)
    assert y.dtype == mean.dtype == inv_std.dtype == np.float32


def test_layer_normalization_rows_longer_than_the_cached_ones_vector():
    """Normalized axes of more than 2**22 elements (the longest cached constant array) still
    normalize: their row sums do not come from the cached vector of ones."""
    x = randn(2, 2, (1 << 21) + 8)
    scale, bias = randn(*x.shape[1:]), randn(*x.shape[1:])
    y, mean, inv_std = run_native("LayerNormalization", [x, scale, bias], 17, n_outputs=3, axis=1)
    want_y, want_mean, want_inv = _layer_norm64(x, scale, bias, 1)
    np.testing.assert_allclose(mean, want_mean, rtol=0, atol=1e-5)
    np.testing.assert_allclose(inv_std, want_inv, rtol=1e-4)
    np.testing.assert_allclose(y, want_y, rtol=0, atol=1e-4)


def _onnxhal_layer_norm(inputs: list, **attrs) -> list:
    """The com.onnxhal LayerNormalization kernel (the optimizer's fusion below opset 17)."""
    proto = helper.make_node("LayerNormalization", [f"i{k}" for k in range(len(inputs))], ["y", "mean", "inv"],
                             domain="com.onnxhal", **attrs)
    node = Node.from_proto(proto)
    node.since_version = 1
    return create_cpu_kernel(node, None).compute(list(inputs))


@pytest.mark.parametrize("shape,axis", [((2, 64, 96), -1), ((2, 64, 96), 1), ((2, 3, 5), -1)])
@pytest.mark.parametrize("dtype,stash,tol", [(np.float32, onnx.TensorProto.FLOAT, 2e-6),
                                             (np.float16, onnx.TensorProto.FLOAT, 2e-3),  # two float16 roundings
                                             (np.float32, onnx.TensorProto.DOUBLE, 1e-6)])
def test_onnxhal_layer_normalization_computes_in_its_stash_type(shape, axis, dtype, stash, tol):
    """The fused op of models older than opset 17 takes any float input and computes in
    ``stash_type``: Y in the input's type, Mean and InvStdDev in the stash type."""
    x = randn(*shape).astype(dtype)
    scale, bias = randn(*shape[axis:]).astype(dtype), randn(*shape[axis:]).astype(dtype)
    y, mean, inv_std = _onnxhal_layer_norm([x, scale, bias], axis=axis, stash_type=stash)
    want_y, want_mean, want_inv = _layer_norm64(x, scale, bias, axis)
    assert y.dtype == dtype and mean.dtype == inv_std.dtype == helper.tensor_dtype_to_np_dtype(stash)
    np.testing.assert_allclose(mean, want_mean, rtol=0, atol=1e-6)
    np.testing.assert_allclose(inv_std, want_inv, rtol=1e-5)
    np.testing.assert_allclose(y, want_y, rtol=tol, atol=tol)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis", [1, -1, 0])
def test_softmax_opset13_along_axis(op, axis):
    (y,) = check(op, [randn(2, 3, 4)], 13, axis=axis)
    assert y.dtype == np.float32


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis", [1, 2, 0, -1])
def test_softmax_before_opset13_coerces_to_2d(op, axis):
    # onnx.reference ignores the opset < 13 rule (flatten to 2-D at ``axis``, normalize rows).
    x = randn(2, 3, 4)
    (y,) = run_native(op, [x], 11, axis=axis)
    a = axis % 3
    flat = x.reshape(int(np.prod(x.shape[:a])), -1)
    (want,) = run_reference(op, [flat], 13, axis=1)
    np.testing.assert_allclose(y, want.reshape(x.shape), rtol=1e-5, atol=1e-6)


def test_softmax_large_values_are_stable():
    (y,) = run_native("Softmax", [np.array([[1000.0, 1000.0, -1000.0]], dtype=np.float32)], 13)
    np.testing.assert_allclose(y, [[0.5, 0.5, 0.0]], atol=1e-7)


def _softmax64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("shape", [(2, 4, 32, 64), (2, 4, 12, 12)])
@pytest.mark.parametrize("case", ["attention scores", "masked", "rows far below zero", "a row of -inf",
                                  "a value of 60 or more", "a NaN"])
def test_softmax_over_the_last_axis_of_large_inputs(case, shape):
    """The max-free path (float32, last axis of 8 or more, any size: a tiny model's 96 rows of 12
    too): every row as the float64 softmax, including rows it must redo with their own maxima and
    inputs it must leave to the usual form."""
    x = (randn(*shape) * 4).astype(np.float32)
    if case == "masked":
        x[..., 40:] = -10000.0  # BERT's additive mask
    elif case == "rows far below zero":
        x[0, 1, 3] -= 500.0  # exp flushes the whole row: redone with its max
        x[1, 2, 7] -= 80.0   # partly flushed
    elif case == "a row of -inf":
        x[1, 0, 5] = -np.inf
    elif case == "a value of 60 or more":
        x[0, 0, 0, 0] = 1000.0
    elif case == "a NaN":
        x[1, 3, 2, 9] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the -inf row's inf - inf, as numpy's own softmax
        (y,) = run_native("Softmax", [x], 13)
    want = _softmax64(x)
    assert y.dtype == np.float32 and y.shape == x.shape
    np.testing.assert_array_equal(np.isnan(y), np.isnan(want))
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-7)
    if case == "attention scores":
        (ref,) = run_onnxruntime("Softmax", [x], 13)
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("attrs", [{}, {"transA": 1}, {"transB": 1, "alpha": 0.5, "beta": 2.0}])
def test_gemm(attrs):
    a = randn(4, 3) if not attrs.get("transA") else randn(3, 4)
    b = randn(3, 5) if not attrs.get("transB") else randn(5, 3)
    (y,) = check("Gemm", [a, b, randn(5)], 13, **attrs)
    assert y.dtype == np.float32
    check("Gemm", [a, b], 13, **attrs)


def test_matmul_shapes_and_zero_d_result():
    check("MatMul", [randn(2, 3, 4), randn(4, 5)], 13)
    check("MatMul", [randn(4), randn(2, 4, 3)], 13)
    (y,) = run_native("MatMul", [randn(4), randn(4)], 13)
    assert isinstance(y, np.ndarray) and y.shape == () and y.dtype == np.float32


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("coord", ["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel",
                                   "tf_half_pixel_for_nn", "half_pixel_symmetric"])
def test_resize_native_modes_match_reference(mode, coord):
    x = randn(1, 2, 5, 7)
    if coord == "tf_half_pixel_for_nn":  # onnx.reference lacks it: x_original = (x + 0.5) / scale
        (y,) = run_native("Resize", [x, None, np.array([1, 1, 1.6, 0.6], np.float32)], 19, mode=mode,
                          coordinate_transformation_mode=coord)
        rows = np.clip((np.arange(8) + 0.5) / 1.6, 0, 4)
        cols = np.clip((np.arange(4) + 0.5) / 0.6, 0, 6)
        if mode == "nearest":  # round_prefer_floor
            r = np.where(rows % 1 <= 0.5, np.floor(rows), np.floor(rows) + 1).clip(0, 4).astype(int)
            c = np.where(cols % 1 <= 0.5, np.floor(cols), np.floor(cols) + 1).clip(0, 6).astype(int)
            np.testing.assert_array_equal(y, x[:, :, r][:, :, :, c])
        else:
            assert y.shape == (1, 2, 8, 4)
        return
    if (mode, coord) == ("nearest", "half_pixel_symmetric"):
        # column 0 samples 0.5000001: onnxruntime's tie tolerance picks 0, onnx.reference 1
        inputs = [x, None, np.array([1, 1, 1.6, 0.6], np.float32)]
        (want,) = run_onnxruntime("Resize", inputs, 19, mode=mode, coordinate_transformation_mode=coord)
        np.testing.assert_array_equal(run_native("Resize", inputs, 19, mode=mode, coordinate_transformation_mode=coord)[0],
                                      want)
    elif coord != "align_corners":  # 0.6 * 7 is fractional: onnxruntime's reading, tested below
        check("Resize", [x, None, np.array([1, 1, 1.6, 0.6], np.float32)], 19, mode=mode,
              coordinate_transformation_mode=coord)
    check("Resize", [x, None, None, np.array([1, 2, 9, 3], np.int64)], 19, mode=mode,
          coordinate_transformation_mode=coord)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("scales", [(1, 1, 1.6, 0.6), (1, 1, 0.6, 0.6), (1, 1, 0.8, 1.3), (1, 1, 2.5, 1.7)])
def test_resize_align_corners_at_fractional_lengths_matches_onnxruntime(mode, scales):
    # scale * length is fractional on the resized axes (4.2, 3.0 -> 1.8, 2.4, ...): onnxruntime divides
    # by the integer output length less 1 (its ALIGN_CORNERS mapping, upsamplebase.h, gets the output
    # dim); dividing by scale * length less 1, as onnx.reference does, was up to 2.5 off here.
    x = randn(1, 2, 3, 7)
    inputs = [x, None, np.array(scales, np.float32)]
    (want,) = run_onnxruntime("Resize", inputs, 19, mode=mode, coordinate_transformation_mode="align_corners")
    (got,) = run_native("Resize", inputs, 19, mode=mode, coordinate_transformation_mode="align_corners")
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("coord", ["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel",
                                   "tf_half_pixel_for_nn"])
@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
def test_resize_nearest_picks_onnxruntimes_indices_and_lengths(coord, nearest_mode):
    """Nearest Resize computes its source coordinates and output lengths in float32 steps, as
    onnxruntime (upsamplebase.h): in float64, 88 of 720 scale/length/mode cases picked another row
    or length (half_pixel at 0.6: (1 + 0.5) / 0.6 - 0.5 is 2.0 against float32's 1.9999998, floor 2
    against 1; 10 x 0.7 is 6.9999998, truncated to 6 where onnxruntime's float32 product is 7).
    The round_prefer modes take a coordinate within 1e-6 of a half as a tie, as onnxruntime 1.32:
    tf_half_pixel_for_nn's (4 + 0.5) / 0.6f is 7.4999995 and round_prefer_ceil picks 8; asymmetric
    7 -> 4 by ``sizes`` samples 2 / (4 / 7) = 3.4999998 at row 4 (both differed before)."""
    for n in (5, 7, 10, 13):
        x = np.arange(n * n, dtype=np.float32).reshape(1, 1, n, n)
        attrs = {"mode": "nearest", "coordinate_transformation_mode": coord, "nearest_mode": nearest_mode}
        for sc in (0.3, 0.5, 0.6, 0.7, 1.3, 1.5, 1.7, 2.0, 2.5):
            inputs = [x, None, np.array([1, 1, sc, sc], np.float32)]
            (want,) = run_onnxruntime("Resize", inputs, 19, **attrs)
            (got,) = run_native("Resize", inputs, 19, **attrs)
            assert got.shape == want.shape, (n, sc, got.shape, want.shape)
            np.testing.assert_array_equal(got, want, err_msg=f"length {n}, scale {sc}")
        inputs = [x, None, None, np.array([1, 1, 4, 3 * n // 2], np.int64)]  # sizes: scale out / in in float32
        (want,) = run_onnxruntime("Resize", inputs, 19, **attrs)
        (got,) = run_native("Resize", inputs, 19, **attrs)
        np.testing.assert_array_equal(got, want, err_msg=f"length {n}, sizes")


@pytest.mark.parametrize("coord", ["half_pixel", "asymmetric", "tf_half_pixel_for_nn"])
@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil"])
def test_resize_nearest_ties_within_tolerance_match_onnxruntime(coord, nearest_mode):
    """Every length 2-23 to every other 1-23 by ``sizes`` in one axis (the lengths where float32
    quotients land an ulp or two from a half): onnxruntime's rows, tie tolerance included."""
    for n in range(2, 24):
        x = np.arange(n, dtype=np.float32).reshape(1, 1, 1, n)
        sizes = [m for m in range(1, 24) if m != n]
        model_inputs = [x, None, None, None]
        for m in sizes:
            model_inputs[3] = np.array([1, 1, 1, m], np.int64)
            attrs = {"mode": "nearest", "coordinate_transformation_mode": coord, "nearest_mode": nearest_mode}
            (want,) = run_onnxruntime("Resize", model_inputs, 19, **attrs)
            (got,) = run_native("Resize", model_inputs, 19, **attrs)
            np.testing.assert_array_equal(got, want, err_msg=f"{n} -> {m}")


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("scales", [(1, 1, 1.1, 1.1), (1, 1, 1.1, 2.0)])
def test_resize_to_the_input_shape_copies_as_onnxruntime(mode, scales):
    """A Resize (or Upsample) whose output shape is its input's (5 x 1.1 truncates to 5) returns the
    input, whatever the scales, as onnxruntime: linear half_pixel resampling gave 4.32 where it
    copies 5. Only the whole shape counts: with another axis resized, every axis is resampled."""
    x = randn(1, 2, 5, 5)
    inputs = [x, None, np.array(scales, np.float32)]
    (want,) = run_onnxruntime("Resize", inputs, 19, mode=mode)
    (got,) = run_native("Resize", inputs, 19, mode=mode)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    if scales[3] == 1.1:
        np.testing.assert_array_equal(got, x)
        (up,) = run_native("Upsample", [x, np.array(scales, np.float32)], 9, mode="linear" if mode == "linear" else "nearest")
        np.testing.assert_array_equal(up, x)


@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
def test_resize_nearest_modes_and_axes(nearest_mode):
    x = RNG.integers(0, 255, (2, 6, 4)).astype(np.uint8)
    (y,) = check("Resize", [x, None, np.array([2.5, 0.5], np.float32)], 19, mode="nearest",
                 nearest_mode=nearest_mode, axes=[1, 2])
    assert y.dtype == np.uint8 and y.shape == (2, 15, 2)


def test_resize_delegated_forms():
    x = randn(1, 1, 4, 4)
    check("Resize", [x, None, np.array([1, 1, 2, 2], np.float32)], 19, mode="cubic")
    x8 = RNG.integers(0, 255, (1, 1, 4, 4)).astype(np.uint8)
    check("Resize", [x8, None, np.array([1, 1, 1.5, 1.5], np.float32)], 19, mode="linear")


@pytest.mark.parametrize("op,attrs,n_out", [
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}, 1),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1,
                     "count_include_pad": 1}, 1),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 0], "ceil_mode": 1}, 1),
    ("AveragePool", {"kernel_shape": [2, 2], "strides": [3, 3], "pads": [0, 0, 1, 1], "ceil_mode": 1,
                     "count_include_pad": 1}, 1),
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, 2),
    ("MaxPool", {"kernel_shape": [2, 3], "strides": [2, 1], "ceil_mode": 1, "dilations": [1, 2]}, 2),
])
def test_pooling_ceil_mode_and_indices_match_onnxruntime(op, attrs, n_out):
    """onnx.reference shifts ceil_mode windows and is slow here; ORT is the oracle for these."""
    x = randn(2, 3, 10, 9)
    want = run_onnxruntime(op, [x], 19, n_outputs=n_out, **attrs)
    got = run_native(op, [x], 19, n_outputs=n_out, **attrs)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [0, 1])
def test_grid_sample_matches_reference(mode, padding_mode, align_corners):
    x = randn(2, 3, 4, 5)
    grid = RNG.uniform(-1.6, 1.6, (2, 3, 6, 2)).astype(np.float32)  # includes out-of-range points
    check("GridSample", [x, grid], 20, mode=mode, padding_mode=padding_mode, align_corners=align_corners)


def test_grid_sample_3d_and_opset16_names():
    x = randn(1, 2, 3, 4, 5)
    grid = RNG.uniform(-1.2, 1.2, (1, 2, 3, 4, 3)).astype(np.float32)
    check("GridSample", [x, grid], 20, mode="linear", padding_mode="border")
    # Opset 16 spells the modes bilinear/bicubic (onnx.reference knows only the opset-20 names).
    x2, grid2 = randn(1, 2, 4, 4), RNG.uniform(-1, 1, (1, 3, 3, 2)).astype(np.float32)
    (y16,) = run_native("GridSample", [x2, grid2], 16, mode="bilinear")
    (want,) = run_reference("GridSample", [x2, grid2], 20, mode="linear")
    np.testing.assert_allclose(y16, want, rtol=1e-5, atol=1e-6)
    (c16,) = create_cpu_kernel(make_node("GridSample", 2, 16, mode="bicubic"), None).compute([x2, grid2])
    (c20,) = run_reference("GridSample", [x2, grid2], 20, mode="cubic")
    np.testing.assert_allclose(c16, c20, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("attrs,with_mask", [
    ({}, False),
    ({"pads": [1, 1, 1, 1], "strides": [2, 1], "dilations": [1, 2]}, True),
    ({"group": 2, "offset_group": 2, "pads": [1, 0, 0, 1]}, True),
])
def test_deform_conv_matches_reference(attrs, with_mask):
    x = randn(1, 4, 5, 5)
    w = randn(4, 4 // attrs.get("group", 1), 3, 3)
    sh, sw = attrs.get("strides", [1, 1])
    dh, dw = attrs.get("dilations", [1, 1])
    p = attrs.get("pads", [0, 0, 0, 0])
    oh = (5 + p[0] + p[2] - (2 * dh + 1)) // sh + 1
    ow = (5 + p[1] + p[3] - (2 * dw + 1)) // sw + 1
    og = attrs.get("offset_group", 1)
    offset = (randn(1, og * 18, oh, ow) * 1.5).astype(np.float32)  # some samples fall outside
    inputs = [x, w, offset, randn(4)]
    if with_mask:
        inputs.append(RNG.random((1, og * 9, oh, ow)).astype(np.float32))
    check("DeformConv", inputs, 19, rtol=1e-4, atol=1e-5, **attrs)


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("opset,coord", [(10, None), (16, "half_pixel"), (16, "output_half_pixel")])
@pytest.mark.parametrize("ratio", [0, 2])
def test_roi_align_matches_reference(mode, opset, coord, ratio):
    x = randn(2, 3, 9, 11)
    rois = np.array([[0.5, 1.0, 6.0, 7.5], [-2.0, -1.0, 3.0, 2.0], [4.0, 4.0, 4.2, 4.1],
                     [2.0, 3.0, 14.0, 12.0]], dtype=np.float32)
    attrs = {"mode": mode, "output_height": 3, "output_width": 2, "sampling_ratio": ratio, "spatial_scale": 0.9}
    inputs = [x, rois, np.array([0, 1, 0, 1], np.int64)]
    if coord:
        attrs["coordinate_transformation_mode"] = coord
        check("RoiAlign", inputs, opset, rtol=1e-5, atol=1e-5, **attrs)
        return
    # Opset 10 has no coordinate_transformation_mode: its behaviour is what opset 16 calls
    # output_half_pixel (onnx.reference wrongly applies the opset-16 default, half_pixel).
    (y,) = run_native("RoiAlign", inputs, 10, **attrs)
    (want,) = run_reference("RoiAlign", inputs, 16, coordinate_transformation_mode="output_half_pixel", **attrs)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape, size", [((2, 7, 3, 3), 5), ((1, 64, 8, 8), 5), ((3, 4, 5), 3), ((1, 6, 2, 2), 2)])
def test_lrn_follows_the_spec(shape, size):
    """LRN sums squares across channels (onnx.reference's version does not, for every shape)."""
    import math

    from onnx import helper

    import onnxhal

    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    node = helper.make_node("LRN", ["x"], ["y"], size=size, alpha=1e-2, beta=0.75, bias=1.0)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, shape)],
                          [helper.make_tensor_value_info("y", 1, shape)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=10)
    got = onnxhal.InferenceSession(m).run(None, {"x": x})[0]
    c = shape[1]
    sq = np.zeros_like(x)
    for ch in range(c):
        lo, hi = max(0, ch - (size - 1) // 2), min(c - 1, ch + math.ceil((size - 1) / 2))
        sq[:, ch] = (x[:, lo:hi + 1] ** 2).sum(axis=1)
    np.testing.assert_allclose(got, x / (1.0 + 1e-2 / size * sq) ** 0.75, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op,shape,attrs", [
    ("MaxPool", (1, 2, 2, 5), {"kernel_shape": [4, 2], "pads": [1, 0, 0, 0], "strides": [3, 1]}),
    ("AveragePool", (1, 2, 2, 5), {"kernel_shape": [4, 2], "pads": [1, 0, 0, 0], "strides": [3, 1]}),
    ("AveragePool", (1, 2, 2, 5), {"kernel_shape": [4, 2], "pads": [1, 0, 0, 0], "strides": [3, 1],
                                   "count_include_pad": 1}),
    ("MaxPool", (1, 1, 1, 4), {"kernel_shape": [4, 1], "pads": [0, 0, 2, 0], "strides": [3, 1]}),
    ("MaxPool", (1, 1, 2, 2), {"kernel_shape": [6, 1], "strides": [3, 1]}),  # no output row
])
def test_pool_window_past_the_padded_input_as_onnx_shape_inference(op, shape, attrs):
    # The output size is (padded - span) / stride + 1 with C's division (toward zero), as ONNX's
    # shape inference and onnxruntime: a window reaching past the padded end by less than a stride
    # still gives one row, over the cells it covers (the excess never counts). numpy's floor
    # division gave no row (and refused the last case), contradicting the model's inferred shape.
    _assert_pool_matches_onnxruntime(op, randn(*shape), attrs)


def test_conv_kernel_longer_than_the_padded_input_is_refused_like_onnxruntime():
    from onnxhal.hal.errors import InvalidArgument

    x, w = randn(1, 1, 2, 3), randn(1, 1, 4, 1)
    with pytest.raises(InvalidArgument, match=r"the kernel spans 4 cells on spatial axis 0 .* padded input's 3"):
        run_native("Conv", [x, w], 19, pads=[1, 0, 0, 0], strides=[3, 1])
    # the same Conv + Relu fused by the optimizer (FusedConv has its own geometry)
    import onnxhal
    from tests.models import make, vi

    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 0, 0, 0], strides=[3, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    model = make(nodes, [vi("x", [1, 1, 2, 3])], [vi("y", None)], [numpy_helper.from_array(w, "w")])
    sess = onnxhal.InferenceSession(model.SerializeToString())
    assert [n.op_type for n in sess.assigned_nodes()] == ["FusedConv"]
    with pytest.raises(InvalidArgument, match="the kernel spans 4 cells"):
        sess.run(None, {"x": x})


@pytest.mark.parametrize("mode,attrs", [
    ("cubic", {}), ("cubic", {"exclude_outside": 1}), ("cubic", {"cubic_coeff_a": -0.5}),
    ("cubic", {"coordinate_transformation_mode": "align_corners"}),
    ("cubic", {"coordinate_transformation_mode": "asymmetric"}),
    ("linear", {"coordinate_transformation_mode": "pytorch_half_pixel"}),
    ("cubic", {"coordinate_transformation_mode": "pytorch_half_pixel"}),
    ("nearest", {"coordinate_transformation_mode": "pytorch_half_pixel", "nearest_mode": "ceil"}),
])
@pytest.mark.parametrize("sizes", [(1, 2, 7, 3), (1, 2, 1, 9), (1, 2, 2, 1)])
def test_resize_cubic_and_pytorch_half_pixel_match_onnxruntime(mode, attrs, sizes):
    # Cubic is native (four taps per axis, Keys' kernel, edge-clamped or excluded taps). An
    # output length of 1 under pytorch_half_pixel samples 0, by the integer length, as the spec,
    # PyTorch and onnxruntime; onnx.reference takes scale * length and samples -0.5 (other values).
    x = randn(1, 2, 4, 5)
    inputs = [x, None, None, np.array(sizes, np.int64)]
    if mode == "linear" and attrs.get("coordinate_transformation_mode") == "align_corners":
        return
    (want,) = run_onnxruntime("Resize", inputs, 19, mode=mode, **attrs)
    (got,) = run_native("Resize", inputs, 19, mode=mode, **attrs)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("policy", ["not_larger", "not_smaller"])
def test_resize_keep_aspect_ratio_policy_is_native_and_matches_onnxruntime(policy):
    x = randn(1, 1, 4, 6)
    inputs = [x, None, None, np.array([3, 7], np.int64)]
    attrs = {"mode": "linear", "axes": [2, 3], "keep_aspect_ratio_policy": policy}
    (want,) = run_onnxruntime("Resize", inputs, 19, **attrs)
    (got,) = run_native("Resize", inputs, 19, **attrs)
    assert got.shape == want.shape == ((1, 1, 3, 5) if policy == "not_larger" else (1, 1, 5, 7))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_pow_of_negative_infinity_and_negative_zero_as_c_pow():
    # numpy gives NaN for (-inf) ** 0.5 and -0 for (-0) ** 0.5 (its square-root path); C's pow,
    # which onnxruntime calls, gives +inf and +0 (and +0 for a negative non-integer power of -inf).
    x = np.array([-np.inf, -np.inf, -0.0, 4.0, -4.0], np.float32)
    cases = [(0.5, [np.inf, np.inf, 0.0, 2.0, np.nan]), (-0.5, [0.0, 0.0, np.inf, 0.5, np.nan]),
             (3.0, [-np.inf, -np.inf, -0.0, 64.0, -64.0])]
    for e, want in cases:
        want = np.array(want, np.float32)
        with np.errstate(invalid="ignore", divide="ignore"):  # (-4) ** 0.5 is NaN in both
            (y,) = run_native("Pow", [x, np.array(e, np.float32)], 15)
        np.testing.assert_array_equal(y, want)
        num = ~np.isnan(y)
        np.testing.assert_array_equal(np.signbit(y[num]), np.signbit(want[num]))
        (ort_y,) = run_onnxruntime("Pow", [x, np.array(e, np.float32)], 15)
        np.testing.assert_array_equal(y, ort_y)


_RESIZE_IN_FRESH_PROCESS = """
import sys
import numpy as np
import onnx
import onnxhal
model = onnx.load(sys.argv[1])
x = np.load(sys.argv[2])
s = onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
np.save(sys.argv[3], s.run(None, {"x": x})[0])
assert "onnx.reference" not in sys.modules, "the native Resize imported onnx.reference"
"""


@pytest.mark.parametrize("coord", ["half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric"])
def test_native_resize_runs_without_importing_onnx_reference(tmp_path, coord):
    # Importing onnx.reference pulls in every one of its operators: a process's first Resize paid
    # for it in its first run. The native modes map coordinates themselves, as onnxruntime does.
    import subprocess
    import sys

    import onnxruntime as ort

    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear", coordinate_transformation_mode=coord)
    # Scales whose resized lengths are whole: at a fractional one, align_corners divides by the
    # float length (onnx.reference's reading) where onnxruntime divides by the integer one.
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2, 3, 4])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.array([1, 1, 2, 0.5], np.float32), "scales")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 10
    x = np.random.default_rng(0).standard_normal((1, 2, 3, 4)).astype(np.float32)
    onnx.save(model, tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", x)
    done = subprocess.run([sys.executable, "-c", _RESIZE_IN_FRESH_PROCESS, str(tmp_path / "m.onnx"),
                           str(tmp_path / "x.npy"), str(tmp_path / "y.npy")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), want, rtol=1e-5, atol=1e-6)
