"""CPU EP shape and reduction kernels across the opsets where attributes became inputs (Split,
Squeeze/Unsqueeze, Reduce*, Pad, Slice, Clip...), against onnx.reference."""

from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import numpy_helper

from tests.test_cpu_kernels_nn import RNG, check, randn, run_native, run_reference

I64 = np.int64


def ints(*v) -> np.ndarray:
    return np.array(v, dtype=I64)


def test_split_forms_by_opset():
    x = randn(7, 4)
    a, b = run_native("Split", [x], 11, n_outputs=2, axis=0, split=[3, 4])
    assert a.shape == (3, 4) and b.shape == (4, 4)
    check("Split", [x, ints(2, 5)], 13, n_outputs=2, axis=0)
    parts = check("Split", [x], 18, n_outputs=3, axis=0, num_outputs=3)  # uneven: 3, 3, 1
    assert [p.shape[0] for p in parts] == [3, 3, 1]
    check("Split", [randn(2, 6)], 13, n_outputs=3, axis=1)


def test_squeeze_unsqueeze_by_opset():
    x = randn(1, 3, 1, 2)
    check("Squeeze", [x], 11, axes=[0, -2])
    check("Squeeze", [x, ints(0, -2)], 13)
    check("Squeeze", [x], 13)
    check("Unsqueeze", [randn(3, 2)], 11, axes=[0, -1])
    check("Unsqueeze", [randn(3, 2), ints(0, 3)], 13)
    (y,) = run_native("Unsqueeze", [randn(3), np.array(1, dtype=I64)], 13)  # 0-d axes tensor
    assert y.shape == (3, 1)


REDUCE_OPS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
              "ReduceLogSumExp", "ReduceSumSquare"]


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reductions_axes_attribute_and_input(op):
    x = np.abs(randn(3, 4, 5)) + 0.1
    check(op, [x], 11, axes=[1], keepdims=0, rtol=1e-5)
    check(op, [x], 11, rtol=1e-5)
    input_opset = 13 if op == "ReduceSum" else 18
    (y,) = check(op, [x, ints(0, -1)], input_opset, rtol=1e-5)
    assert y.shape == (1, 4, 1) and y.dtype == np.float32
    (all_axes,) = check(op, [x], input_opset, keepdims=0, rtol=1e-5)
    assert type(all_axes) is np.ndarray and all_axes.shape == ()
    # No axes with noop_with_empty_axes: nothing is reduced, but the elementwise part stays (onnxruntime
    # and onnx.reference give x * x for ReduceSumSquare, |x| for ReduceL1)
    (same,) = run_native(op, [x, np.zeros(0, dtype=I64)], input_opset, noop_with_empty_axes=1)
    np.testing.assert_allclose(same, x * x if op == "ReduceSumSquare" else x, rtol=1e-6)


def test_reduce_log_sum_and_empty_set():
    check("ReduceLogSum", [np.abs(randn(3, 4)) + 0.1, ints(1)], 18)
    empty = np.zeros((2, 0, 3), dtype=np.float32)
    (mx,) = check("ReduceMax", [empty, ints(1)], 18)
    assert mx.shape == (2, 1, 3)
    check("ReduceSum", [empty, ints(1)], 13, keepdims=0)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg_reductions(op):
    x = RNG.integers(0, 3, (4, 5)).astype(np.float32)  # ties: first or last index
    check(op, [x], 13, axis=1)
    check(op, [x], 13, axis=0, keepdims=0, select_last_index=1)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad_modes_and_opsets(mode):
    x = randn(3, 4)
    if mode != "wrap":
        check("Pad", [x], 2, pads=[1, 2, 0, 1], mode=mode, value=1.5 if mode == "constant" else 0.0)
    check("Pad", [x, ints(1, 2, 2, 1)], 19, mode=mode)
    check("Pad", [x, ints(2, 1), None, ints(-1)], 19, mode=mode)


def test_pad_negative_crops_and_constant_value():
    # onnx.reference rejects negative pads; the spec says they remove elements.
    x = randn(4, 5)
    (y,) = run_native("Pad", [x, ints(-1, 2, 0, -2), np.array(3.0, np.float32)], 13)
    want = np.pad(x[1:, :3], [(0, 0), (2, 0)], constant_values=3.0)
    np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("starts,ends,axes,steps", [
    ([1, 0], [3, 10], [0, 1], [1, 2]),
    ([-1], [-100], [1], [-1]),  # reverse to the very start
    ([10], [-10], [0], [-2]),
    ([0], [2**62], [-1], None),
    ([2, -3], [0, -1], None, [-1, 1]),
])
def test_slice_clamping_and_negative_steps(starts, ends, axes, steps):
    x = randn(5, 6)
    inputs = [x, ints(*starts), ints(*ends)]
    if axes is not None or steps is not None:
        inputs.append(ints(*(axes if axes is not None else range(len(starts)))))
    if steps is not None:
        inputs.append(ints(*steps))
    check("Slice", inputs, 13)


def test_slice_attribute_form():
    check("Slice", [randn(5, 6)], 9, starts=[1, -4], ends=[4, 100], axes=[0, 1])


def test_gather_negative_indices_and_elements():
    x = randn(5, 3)
    check("Gather", [x, ints(-1, 0, -5)], 13, axis=0)
    check("Gather", [x, np.array(-1, dtype=I64)], 13, axis=1)
    check("GatherElements", [x, np.array([[0, -1, 2], [-5, 1, 0]], dtype=I64)], 13, axis=0)


def test_gather_of_one_element_is_an_array():
    # a scalar index into a 1-D input takes one element: numpy's take gives a scalar, the kernel an array
    (y,) = run_native("Gather", [np.arange(4, dtype=np.float32), np.array(2, dtype=I64)], 13, axis=0)
    assert type(y) is np.ndarray and y.shape == () and y == 2


def test_reshape_zero_and_allowzero():
    x = randn(2, 3, 4)
    check("Reshape", [x, ints(0, -1)], 13)
    check("Reshape", [x, ints(4, 0, 2)], 14)
    (y,) = run_native("Reshape", [np.zeros((0, 3), np.float32), ints(3, 0)], 14, allowzero=1)
    assert y.shape == (3, 0)
    (legacy,) = run_native("Reshape", [x], 4, shape=[0, -1])  # opset < 5: shape attribute
    assert legacy.shape == (2, 12)


def test_misc_shape_ops():
    x = randn(2, 3, 4)
    check("Flatten", [x], 13, axis=-1)
    check("Flatten", [x], 13, axis=0)
    check("Transpose", [x], 13, perm=[2, 0, 1])
    check("Transpose", [x], 13)
    check("Concat", [x, x], 13, axis=-2)
    check("Expand", [randn(3, 1), ints(2, 1, 4)], 13)
    check("Tile", [x, ints(1, 2, 3)], 13)
    (shape,) = check("Shape", [x], 15, start=1, end=-1)
    np.testing.assert_array_equal(shape, [3])
    (size,) = check("Size", [x], 13)
    assert size.shape == () and size.dtype == I64
    check("Range", [np.array(1.0, np.float32), np.array(2.0, np.float32), np.array(0.3, np.float32)], 13)
    check("Range", [np.array(10, np.int32), np.array(2, np.int32), np.array(-3, np.int32)], 13)
    check("ConstantOfShape", [ints(2, 3)], 20)
    (filled,) = run_native("ConstantOfShape", [ints(2)], 20, value=numpy_helper.from_array(np.array([7], np.int32)))
    assert filled.dtype == np.int32 and filled.tolist() == [7, 7]


def test_constant_forms():
    (a,) = run_native("Constant", [], 13, value_floats=[1.0, 2.0])
    assert a.dtype == np.float32
    (b,) = run_native("Constant", [], 13, value_int=3)
    assert b.dtype == I64 and b.shape == ()
    (c,) = run_native("Constant", [], 13, value_strings=["a", "b"])
    assert c.tolist() == ["a", "b"]


def test_scatter_deprecated_op():
    data = np.zeros((3, 3), np.float32)
    idx = np.array([[1, 0, 2], [0, 2, 1]], dtype=I64)
    upd = randn(2, 3)
    (y,) = run_native("Scatter", [data, idx, upd], 9, axis=0)
    (want,) = run_reference("ScatterElements", [data, idx, upd], 11, axis=0)
    np.testing.assert_array_equal(y, want)


def test_pad_negative_pad_reaching_past_a_positive_one():
    # Output length is d + begin + end (the spec's shape inference, onnxruntime): axis 1 below is
    # 1 - 2 + 2 = 1 and holds only the constant; the old crop-then-pad gave 2.
    x = np.arange(1, 9, dtype=np.int64).reshape(2, 1, 4)
    (y,) = run_native("Pad", [x, ints(-1, 0, 2, 1, 0, 1)], 18)
    assert y.shape == (2, 1, 7)
    np.testing.assert_array_equal(y[0, 0, 2:6], x[1, 0])  # output index j holds input j - begin
    assert not y[1].any() and not y[0, 0, :2].any()
    (z,) = run_native("Pad", [x, ints(0, -2, 0, 0, 2, 0)], 18)
    assert z.shape == (2, 1, 4) and not z.any()


@pytest.mark.parametrize("pads,mode,match", [
    (ints(-2, -1), "constant", "negative size"),
    (ints(1, 0, 0, -3), "edge", r"pads \[0, -3\] leaves axis 1 \(length 3\) nothing to extend"),
    (ints(0, 3, 0, 0), "reflect", "each must be less than the length"),
])
def test_pad_refusals_are_typed(pads, mode, match):
    from onnxhal.hal.errors import InvalidArgument

    x = randn(3, 3) if len(pads) == 4 else randn(2)
    with pytest.raises(InvalidArgument, match=match):
        run_native("Pad", [x, pads], 19, mode=mode)


def test_gather_elements_output_has_the_indices_shape():
    # Other axes of the data may be longer than the indices'; numpy's take_along_axis broadcast them.
    x = np.arange(8, dtype=np.int64).reshape(1, 2, 4)
    (y,) = run_native("GatherElements", [x, np.array([[[3]]], np.int32)], 13, axis=2)
    assert y.tolist() == [[[3]]]
    (z,) = run_native("GatherElements", [randn(5, 3), np.array([[4, -5], [0, 1]], I64)], 13, axis=0)
    assert z.shape == (2, 2)


@pytest.mark.parametrize("op,inputs,attrs,match", [
    ("Gather", [randn(5, 3), ints(0, 5)], {"axis": 0}, r"index 5 is out of range for axis 0 of length 5"),
    ("Gather", [randn(5, 3), ints(-4)], {"axis": 1}, r"index -4 is out of range for axis 1 of length 3"),
    ("GatherElements", [randn(2, 2), np.array([[0, 2], [1, 0]], I64)], {"axis": 1}, r"index 2 is out of range"),
    ("ScatterND", [randn(3), np.array([[3]], I64), randn(1)], {}, r"index 3 at \[0, 0\] is out of range"),
    ("ScatterElements", [randn(3), ints(-4), randn(1)], {}, r"index -4 at \[0\] is out of range"),
    ("ScatterElements", [np.array(1.0, np.float32), np.array(0, I64), np.array(2.0, np.float32)], {},
     r"of the data's rank, and the axis must lie in it"),
    ("Reshape", [randn(2, 3), ints(4, -1)], {}, r"cannot reshape \[2, 3\] \(6 elements\) to \[4, -1\]"),
    ("Reshape", [randn(6), ints(2, 0)], {}, r"0 \(copy the input's dimension\) at position 1"),
])
def test_index_and_shape_errors_name_the_value(op, inputs, attrs, match):
    from onnxhal.hal.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match=match):
        run_native(op, inputs, 18 if op.startswith("Scatter") else 13, **attrs)


@pytest.mark.parametrize("op", ["ScatterND", "ScatterElements"])
def test_scatter_max_min_nan_and_duplicates_as_onnxruntime(op):
    # onnxruntime's std::max(data, update): a NaN update propagates, a NaN in the data is replaced
    # (values measured with onnxruntime 1.32; tests/test_ops_random.py compares more at random).
    nan = np.nan
    x = np.array([nan, 1.0, nan, 2.0], np.float32)
    upd = np.array([5.0, nan, nan, -1.0], np.float32)
    idx = ints(0, 1, 2, 3)
    idx = idx.reshape(4, 1) if op == "ScatterND" else idx
    (mx,) = run_native(op, [x, idx, upd], 18, reduction="max")
    np.testing.assert_array_equal(mx, [5.0, nan, nan, 2.0])
    (mn,) = run_native(op, [x, idx, upd], 18, reduction="min")
    np.testing.assert_array_equal(mn, [5.0, nan, nan, -1.0])
    dup = ints(1, 1, 1)
    dup = dup.reshape(3, 1) if op == "ScatterND" else dup
    three = np.array([1.0, 2.0, 3.0], np.float32)
    (added,) = run_native(op, [np.zeros(3, np.float32), dup, three], 18, reduction="add")
    assert added.tolist() == [0.0, 6.0, 0.0]  # every duplicate reduced in, not the last one only
    (last,) = run_native(op, [np.zeros(3, np.float32), dup, three], 18)
    assert last.tolist() == [0.0, 3.0, 0.0]


def test_unique_flattens_and_keeps_first_occurrence_order():
    x = np.array([[2, 1], [2, 3]], np.int8)  # int8: onnx.reference refused it
    y, first, inverse, counts = run_native("Unique", [x], 11, n_outputs=4, sorted=0)
    assert (y.tolist(), first.tolist(), inverse.tolist(), counts.tolist()) == ([2, 1, 3], [0, 1, 3], [0, 1, 0, 2], [2, 1, 1])
    y, first, inverse, counts = run_native("Unique", [x], 11, n_outputs=4, sorted=1)
    assert (y.tolist(), first.tolist(), inverse.tolist(), counts.tolist()) == ([1, 2, 3], [1, 0, 3], [1, 0, 1, 2], [1, 2, 1])
    (empty, *_) = run_native("Unique", [np.zeros((0, 4), np.float32)], 11, n_outputs=4)
    assert empty.shape == (0,)  # flattened, as onnxruntime
    rows, _, inv, _ = run_native("Unique", [np.array([[1, 2], [0, 5], [1, 2]], np.int64)], 11, n_outputs=4, axis=0)
    assert rows.tolist() == [[0, 5], [1, 2]] and inv.tolist() == [1, 0, 1]


def _kernel(op: str, n_inputs: int, opset: int, n_outputs: int = 1, **attrs):
    from tests.test_cpu_kernels_nn import create_cpu_kernel, make_node

    return create_cpu_kernel(make_node(op, n_inputs, opset, n_outputs, **attrs), None)


def test_kernels_that_memoize_per_shape_follow_a_new_input_shape():
    # Reshape, Expand and GatherElements keep what a shape resolves to; one kernel fed several
    # shapes (a dynamic axis) must give each its own result.
    shape = ints(0, -1)
    shape.flags.writeable = False  # a model constant: the kernel keeps its resolution
    reshape = _kernel("Reshape", 2, 14)
    for dims in [(2, 3, 4), (5, 3, 4), (2, 3, 4), (1, 7)]:
        x = randn(*dims)
        (y,) = reshape.compute([x, shape])
        assert y.shape == (dims[0], int(np.prod(dims[1:]))) and np.array_equal(y.reshape(-1), x.reshape(-1))
    expand = _kernel("Expand", 2, 13)
    for dims, target in [((3, 1), (2, 3, 4)), ((1, 4), (2, 3, 4)), ((3, 1), (3, 5)), ((3, 1), (2, 3, 4))]:
        x = randn(*dims)
        (y,) = expand.compute([x, ints(*target)])
        assert np.array_equal(y, np.broadcast_to(x, np.broadcast_shapes(dims, target)))
    gather = _kernel("GatherElements", 2, 13, axis=1)
    rng = np.random.default_rng(3)
    for dims, idx_dims in [((3, 5), (3, 2)), ((4, 5), (2, 7)), ((3, 5), (3, 2)), ((2, 3), (1, 1))]:
        x = randn(*dims)
        idx = rng.integers(-dims[1], dims[1], idx_dims)
        (y,) = gather.compute([x, idx])
        wrapped = np.where(idx < 0, idx + dims[1], idx)
        assert np.array_equal(y, np.take_along_axis(x[: idx_dims[0]], wrapped, axis=1))
    (strided,) = gather.compute([randn(4, 6)[:, ::2], np.array([[2, 0], [-1, 1]], I64)])  # not contiguous
    assert strided.shape == (2, 2)


def test_split_sizes_that_do_not_add_up_are_refused():
    from onnxhal.hal.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match=r"sizes \[2, 2\] must be non-negative and add up to the length 5"):
        run_native("Split", [randn(5, 2), ints(2, 2)], 13, n_outputs=2, axis=0)
    with pytest.raises(InvalidArgument, match=r"axis 2 is out of range"):
        run_native("Split", [randn(4, 2)], 13, n_outputs=2, axis=2)
    parts = check("Split", [randn(3, 4)], 13, n_outputs=2, axis=-1)
    assert all(p.base is not None for p in parts)  # views of the input, as before


def test_unsqueeze_by_reshape_matches_expand_dims():
    # Unsqueeze inserts the length-1 axes with one reshape (a view); expand_dims, the plain form,
    # still takes invalid axes, so their errors are its own.
    from onnxhal.runtime.providers.cpu.kernels.shape_ops import _unsqueeze

    rng = np.random.default_rng(0)
    cases = [rng.standard_normal(s) for s in [(), (3,), (2, 3), (2, 3, 4)]] + [rng.standard_normal((3, 4)).T]
    for x in cases:
        for axes in [(0,), (-1,), (0, 2), (1, -1), (-1, 0), (0, 1, 2), (5,), (0, 0), (-9,)]:
            try:
                want = np.expand_dims(x, axes)
            except Exception as exc:  # noqa: BLE001 - the plain form's error, whatever it is
                with pytest.raises(type(exc)):
                    _unsqueeze(x, axes)
                continue
            got = _unsqueeze(x, axes)
            assert got.shape == want.shape and np.shares_memory(got, x) == np.shares_memory(want, x)
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("params", [([1, -3], [100, -1], [0, 2], [1, 1]), ([-1], [-100], [1], [-2]),
                                    ([0, 2], [2, 9], [-1, 0], [2, 1])])
def test_slice_index_kept_per_shape_for_constant_parameters_matches_onnxruntime(params):
    # constant starts/ends/axes/steps: the index is kept per input shape; inputs of two shapes,
    # each run twice, against onnxruntime
    import onnxruntime as ort
    from onnx import TensorProto, helper

    import onnxhal

    names = ("starts", "ends", "axes", "steps")
    inits = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in zip(names, params)]
    graph = helper.make_graph([helper.make_node("Slice", ["x", *names], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, None, None])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    data = model.SerializeToString()
    ours = onnxhal.InferenceSession(data, providers=["CPUExecutionProvider"])
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for shape in [(4, 5, 6), (7, 3, 9), (4, 5, 6), (7, 3, 9)]:
        x = RNG.standard_normal(shape).astype(np.float32)
        np.testing.assert_array_equal(ours.run(None, {"x": x})[0], theirs.run(None, {"x": x})[0])


def test_reduce_log_sum_exp_rows_without_a_finite_maximum():
    """Rows whose maximum is infinite take no shift (as onnxruntime): -inf rows give -inf, +inf
    rows +inf, finite rows beside them their usual value."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    import onnxhal

    x = np.array([[-np.inf, -np.inf, -np.inf], [1.0, 2.0, 3.0], [np.inf, 0.0, 1.0], [-80.0, -90.0, -85.0]],
                 np.float32)
    node = helper.make_node("ReduceLogSumExp", ["X", "A"], ["Y"], keepdims=1)
    graph = helper.make_graph([node], "lse", [helper.make_tensor_value_info("X", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(ints(1), "A")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    data = model.SerializeToString()
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"X": x})[0]
    got = onnxhal.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"X": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space_matches_reference_and_onnxruntime(mode):
    # native since corpus model hf_swin2sr (PixelShuffle exports as CRD) reached onnx.reference
    from tests.test_cpu_kernels_nn import run_onnxruntime

    x = randn(2, 12, 3, 5)
    (y,) = check("DepthToSpace", [x], 13, blocksize=2, mode=mode, rtol=0, atol=0)
    assert y.shape == (2, 3, 6, 10)
    np.testing.assert_array_equal(y, run_onnxruntime("DepthToSpace", [x], 13, blocksize=2, mode=mode)[0])
    ints_in = np.arange(2 * 18 * 2 * 2, dtype=I64).reshape(2, 18, 2, 2)
    check("DepthToSpace", [ints_in], 11, blocksize=3, mode=mode)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_space_to_depth_matches_reference_and_inverts_depth_to_space(mode):
    x = randn(2, 3, 4, 6)
    (y,) = check("SpaceToDepth", [x], 28, blocksize=2, mode=mode, rtol=0, atol=0)
    assert y.shape == (2, 12, 2, 3)
    (back,) = run_native("DepthToSpace", [y], 13, blocksize=2, mode=mode)  # the same mode inverts it
    np.testing.assert_array_equal(back, x)
    if mode == "DCR":  # before opset 28, no mode: DCR's order
        np.testing.assert_array_equal(check("SpaceToDepth", [x], 13, blocksize=2)[0], y)


@pytest.mark.parametrize("op,x,match", [
    ("DepthToSpace", randn(1, 6, 2, 2), r"6 channels do not divide by blocksize\^2 = 4"),
    ("DepthToSpace", randn(4, 2, 2), r"the input is \[4, 2, 2\]; it must be 4-D"),
    ("SpaceToDepth", randn(1, 2, 4, 5), r"height 4 and width 5 must both be multiples of the blocksize 2"),
])
def test_space_depth_refusals_name_the_value(op, x, match):
    from onnxhal.hal.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match=match):
        run_native(op, [x], 13, blocksize=2)


def test_split_parts_kept_per_shape_and_sizes_match_the_plain_path():
    # Split keeps its parts' indices per input shape (and sizes, when they are an input that is not a
    # constant): one kernel fed shapes and sizes that change, repeat and turn bad must give what
    # the plain path (_do_split, checked and indexed per call) gives, error for error.
    from onnxhal.hal.errors import InvalidArgument
    from onnxhal.runtime.providers.cpu.kernels.shape_ops import _do_split

    fed = _kernel("Split", 2, 13, n_outputs=3, axis=-1)
    assert not fed.constant
    cases = [((2, 48), (16, 16, 16)), ((2, 48), (8, 20, 20)), ((3, 48), (16, 16, 16)), ((2, 48), (16, 16, 16)),
             ((2, 12), (4, 4, 4)), ((2, 48), (16, 16, 17)), ((2, 48), (16, 16, 16)), ((4, 0), (0, 0, 0))]
    for dims, sizes in cases:
        x = randn(*dims)
        try:
            want = _do_split(x, -1, list(sizes), 3)
        except InvalidArgument as exc:
            with pytest.raises(InvalidArgument, match=re.escape(str(exc))):
                fed.compute([x, ints(*sizes)])
            continue
        got = fed.compute([x, ints(*sizes)])
        assert [g.shape for g in got] == [w.shape for w in want]
        assert all(np.shares_memory(g, x) or g.size == 0 for g in got)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    assert (2, 48) in {k[0] for k in fed._index} and len(fed._index) == 5  # the refused sizes were not kept
    even = _kernel("Split", 1, 18, n_outputs=3, axis=0, num_outputs=3)  # no sizes: keyed by the shape alone
    assert even.constant
    for dims in [(7, 2), (9, 2), (7, 2), (2, 2)]:
        x = randn(*dims)
        for g, w in zip(even.compute([x]), _do_split(x, 0, None, 3)):
            np.testing.assert_array_equal(g, w)
    assert set(even._index) == {(7, 2), (9, 2), (2, 2)}  # (2, 2): parts of 1, 1 and 0
    with pytest.raises(InvalidArgument, match="axis 0 is out of range"):
        even.compute([np.float32(1.0)])
