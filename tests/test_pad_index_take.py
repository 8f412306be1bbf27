"""Pad's path ``index_take`` (``pad_indices.PAD_PATHS``): edge, reflect and wrap padding as one
gather per padded axis with source positions made once per shape. Held to the canonical
``np_pad`` (``shape_ops._pad``: np.pad) bit for bit, and to onnxruntime; pads the canonical form
refuses or crops (negative pads) stay on it and keep its errors."""

from __future__ import annotations

import numpy as np
import pytest

from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernel_factory import create_cpu_kernel
from onnxhal.runtime.providers.cpu.kernels import pad_indices
from tests.test_cpu_kernels_nn import make_node, run_onnxruntime

RNG = np.random.default_rng(4406)
CASES = [((1, 2, 464), [0, 0, 128, 0, 0, 128], None), ((2, 3, 5, 7), [0, 0, 1, 2, 0, 0, 3, 4], None),
         ((3, 4), [2, 0, 1, 3], None), ((6,), [5, 5], None), ((2, 1, 4), [0, 3], [1]), ((2, 3, 4), [1, 2, 0, 1], [-1, 0]),
         ((4, 5), [0, 0, 0, 0], None), ((1, 3), [0, 2, 0, 0], None)]


def both_paths(kernel, inputs: list) -> tuple[np.ndarray, str, np.ndarray, str]:
    try:
        pad_indices.INDEX_PAD_ENABLED = False
        (plain,) = kernel.compute(list(inputs))
        plain_path = kernel.last_path
        pad_indices.INDEX_PAD_ENABLED = True
        (fast,) = kernel.compute(list(inputs))
    finally:
        pad_indices.INDEX_PAD_ENABLED = True
    return plain, plain_path, fast, kernel.last_path


def feeds(shape: tuple, pads: list, axes: list | None, dtype=np.float32) -> list:
    x = (RNG.standard_normal(shape) * 10).astype(dtype)
    inputs = [x, np.array(pads, np.int64), None]
    return inputs + ([np.array(axes, np.int64)] if axes is not None else [])


@pytest.mark.parametrize("mode", ["edge", "reflect", "wrap"])
def test_index_take_equals_np_pad_bit_for_bit_and_matches_onnxruntime(mode):
    for shape, pads, axes in CASES:
        if mode == "reflect" and any(p >= shape[a] for p, a in zip(pads, list(axes or range(len(shape))) * 2)):
            continue
        inputs = feeds(shape, pads, axes)
        kernel = create_cpu_kernel(make_node("Pad", len(inputs), 19, mode=mode), None)
        for _ in range(2):  # the second run reads the kept positions
            plain, plain_path, fast, fast_path = both_paths(kernel, inputs)
            assert (plain_path, fast_path) == (pad_indices.NP_PAD, pad_indices.INDEX_TAKE), (shape, pads)
            np.testing.assert_array_equal(fast, plain, err_msg=f"{shape} {pads} {axes}")
            assert fast.dtype == plain.dtype and fast.flags.c_contiguous and not np.shares_memory(fast, inputs[0])
        ort_inputs = inputs[:2] + [np.array(0, np.float32)] + inputs[3:]
        (want,) = run_onnxruntime("Pad", ort_inputs, 19, mode=mode)
        np.testing.assert_array_equal(fast, want, err_msg=f"{shape} {pads} {axes}")


def test_index_take_keeps_integer_and_bool_values():
    for dtype in (np.int64, np.uint8, np.bool_):
        inputs = feeds((3, 4), [1, 2, 2, 1], None, dtype)
        kernel = create_cpu_kernel(make_node("Pad", 2, 19, mode="reflect"), None)
        plain, _, fast, path = both_paths(kernel, inputs[:2])
        assert path == pad_indices.INDEX_TAKE
        np.testing.assert_array_equal(fast, plain)


@pytest.mark.parametrize("mode", ["edge", "reflect", "wrap"])
def test_index_take_leaves_negative_and_refused_pads_to_np_pad(mode):
    kernel = create_cpu_kernel(make_node("Pad", 2, 19, mode=mode), None)
    x = RNG.standard_normal((3, 5)).astype(np.float32)
    plain, _, fast, path = both_paths(kernel, [x, np.array([0, -1, 1, 2], np.int64)])  # crop, then extend
    assert path == pad_indices.NP_PAD
    np.testing.assert_array_equal(fast, plain)
    if mode == "reflect":
        with pytest.raises(InvalidArgument, match="each must be less than the length"):
            kernel.compute([x, np.array([0, 5, 0, 0], np.int64)])
        assert kernel.last_path == pad_indices.NP_PAD
    with pytest.raises(InvalidArgument, match="nothing to"):
        kernel.compute([np.zeros((0, 3), np.float32), np.array([1, 0, 0, 0], np.int64)])


def test_reflect_positions_mirror_without_the_edge():
    np.testing.assert_array_equal(pad_indices.source_positions("reflect", 4, 3, 3), [3, 2, 1, 0, 1, 2, 3, 2, 1, 0])
    np.testing.assert_array_equal(pad_indices.source_positions("wrap", 3, 4, 4), [2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0])
    np.testing.assert_array_equal(pad_indices.source_positions("edge", 2, 2, 1), [0, 0, 0, 1, 1])
    np.testing.assert_array_equal(pad_indices.source_positions("reflect", 1, 0, 0), [0])
