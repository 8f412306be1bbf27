"""Einsum keeps numpy's contraction path per operand shapes: its results are np.einsum's with
optimize=True to the bit (the same path, so the same order of products), for every shape a
dynamic model brings, and onnxruntime's within float32 rounding."""

from __future__ import annotations

import numpy as np
import pytest

from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels import einsum
from tests.test_cpu_kernels_nn import run_native, run_onnxruntime

CASES = [
    ("bhts,bsh,bshp->bthp", [(2, 4, 12, 12), (2, 12, 4), (2, 12, 4, 8)], [(1, 4, 19, 19), (1, 19, 4), (1, 19, 4, 8)]),
    ("ij,jk,kl->il", [(3, 5), (5, 7), (7, 2)], [(8, 5), (5, 1), (1, 4)]),
    ("bi,bj,bk->bijk", [(2, 3), (2, 4), (2, 5)], [(6, 3), (6, 4), (6, 5)]),
    ("abc,cd,de,ea->b", [(2, 3, 4), (4, 5), (5, 6), (6, 2)], [(3, 1, 4), (4, 2), (2, 2), (2, 3)]),
]


@pytest.mark.parametrize("equation,first,second", CASES)
def test_kept_paths_give_numpy_optimized_einsum_bits(equation, first, second):
    rng = np.random.default_rng(0)
    node = einsum.Einsum.__new__(einsum.Einsum)
    node.equation, node.paths = equation, {}
    for shapes in (first, second, first):  # a new shape, then the first one's kept path again
        inputs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        (got,) = node.compute(inputs)
        np.testing.assert_array_equal(got, np.einsum(equation, *inputs, optimize=True))
        (want,) = run_onnxruntime("Einsum", inputs, 12, equation=equation)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert set(node.paths) == {tuple(first), tuple(second)}


def test_paths_kept_are_bounded():
    node = einsum.Einsum.__new__(einsum.Einsum)
    node.equation, node.paths = "ij,jk,kl->il", {}
    for n in range(1, einsum.PATHS_KEPT + 5):
        node.compute([np.ones((n, 2), np.float32), np.ones((2, 3), np.float32), np.ones((3, 1), np.float32)])
    assert 1 <= len(node.paths) <= einsum.PATHS_KEPT


def test_two_operands_keep_numpy_direct_loop_and_mismatches_stay_typed():
    x, y = np.ones((2, 3), np.float32), np.ones((3, 4), np.float32)
    (got,) = run_native("Einsum", [x, y], 12, equation="ij,jk->ik")
    np.testing.assert_array_equal(got, np.full((2, 4), 3.0, np.float32))
    with pytest.raises(InvalidArgument, match="does not fit inputs"):
        run_native("Einsum", [x, y, np.ones((5, 2), np.float32)], 12, equation="ij,jk,kl->il")
