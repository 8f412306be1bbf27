"""ScatterElements and ScatterND write through flat indices (one 1-D ``ufunc.at``; float32 in one C
loop, path ``native``, held to the canonical ``flat`` one bit for bit), GatherND takes
its ``take`` path where the indices address the first axis alone and its ``ravel`` path where they
address several: all against onnxruntime on
random operands (duplicates, negative indices, indices shorter than the data on the other axes),
and the ``take`` and ``ravel`` paths against the canonical ``fancy`` one."""

from __future__ import annotations

import numpy as np
import pytest

from onnxhal.runtime.providers.cpu.kernels import gather_nd
from tests.test_cpu_kernels_nn import run_native, run_onnxruntime

REDUCTIONS = ["none", "add", "mul", "max", "min"]


def _indices(rng: np.random.Generator, n: int, shape: tuple) -> np.ndarray:
    """Indices in [-n, n) with duplicates; for ``none`` duplicates are dropped by the caller."""
    return rng.integers(-n, n, shape).astype(np.int64)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape,axis", [((7,), 0), ((5, 4), 0), ((5, 4), 1), ((3, 4, 5), 1), ((3, 4, 5), 2),
                                        ((3, 4, 5), 0)])
def test_scatter_elements_flat_indices_as_onnxruntime(shape, axis, reduction):
    rng = np.random.default_rng(len(shape) * 10 + axis)
    data = rng.standard_normal(shape).astype(np.float32)
    ishape = tuple(max(1, d - 1) if k != axis else 2 * d for k, d in enumerate(shape))  # shorter elsewhere
    idx = _indices(rng, shape[axis], ishape)
    if reduction == "none":  # duplicates' order is unspecified without a reduction: distinct along the axis
        perm_shape = tuple(shape[axis] if k == axis else d for k, d in enumerate(ishape))
        idx = np.argsort(rng.random(perm_shape), axis=axis)  # a permutation of the axis per position
        idx = idx - shape[axis] * (rng.random(idx.shape) < 0.5)  # some counted from the end
    upd = rng.standard_normal(idx.shape).astype(np.float32)
    (got,) = run_native("ScatterElements", [data, idx, upd], 18, axis=axis, reduction=reduction)
    (want,) = run_onnxruntime("ScatterElements", [data, idx, upd], 18, axis=axis, reduction=reduction)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape,k", [((9,), 1), ((6, 4), 1), ((6, 4), 2), ((3, 4, 5), 2), ((3, 4, 5), 1)])
def test_scatter_nd_flat_indices_as_onnxruntime(shape, k, reduction):
    rng = np.random.default_rng(len(shape) * 10 + k)
    data = rng.standard_normal(shape).astype(np.float32)
    rows = 5 if reduction == "none" else 12
    idx = np.stack([_indices(rng, d, rows) for d in shape[:k]], axis=-1)
    if reduction == "none":  # distinct slices: the last write of duplicates is onnxruntime's choice
        _, first = np.unique(np.where(idx < 0, idx + np.array(shape[:k]), idx), axis=0, return_index=True)
        idx = idx[np.sort(first)]
    upd = rng.standard_normal(idx.shape[:-1] + shape[k:]).astype(np.float32)
    (got,) = run_native("ScatterND", [data, idx, upd], 18, reduction=reduction)
    (want,) = run_onnxruntime("ScatterND", [data, idx, upd], 18, reduction=reduction)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)


def test_scatter_into_a_non_contiguous_data_keeps_it():
    data = np.arange(12, dtype=np.float32).reshape(3, 4).T  # Fortran order
    idx = np.array([[0, 1, 2], [3, 3, 0]], np.int64)
    upd = np.ones((2, 3), np.float32)
    (got,) = run_native("ScatterElements", [data, idx, upd], 18, axis=0, reduction="add")
    want = data.copy()
    np.add.at(want, (idx, np.arange(3)[None]), upd)
    np.testing.assert_array_equal(got, want)
    assert data[0, 0] == 0.0  # the input untouched


@pytest.mark.parametrize("shape,ishape", [((24,), (96, 1)), ((24, 16), (96, 1)), ((5, 3, 2), (2, 4, 1))])
def test_gather_nd_take_path_equals_fancy(shape, ishape, monkeypatch):
    rng = np.random.default_rng(0)
    data = rng.standard_normal(shape).astype(np.float32)
    idx = rng.integers(0, shape[0], ishape).astype(np.int64)
    kernel_path = gather_nd.GatherND.path
    taken = []
    monkeypatch.setattr(gather_nd.GatherND, "path", lambda self, d, i: taken.append(kernel_path(self, d, i))
                        or taken[-1])
    (got,) = run_native("GatherND", [data, idx], 13)
    assert taken == ["take"]
    monkeypatch.setattr(gather_nd.GatherND, "path", lambda self, d, i: "fancy")
    (want,) = run_native("GatherND", [data, idx], 13)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, run_onnxruntime("GatherND", [data, idx], 13)[0])


@pytest.mark.parametrize("shape,ishape", [((1, 12), (1, 1, 1, 12, 2)), ((4, 5, 3), (6, 2)), ((4, 5, 3), (2, 3, 3)),
                                           ((3, 4, 2, 2), (5, 3))])
@pytest.mark.parametrize("kind", ["float32", "bool"])
def test_gather_nd_ravel_path_equals_fancy(shape, ishape, kind, monkeypatch):
    """Indices of several columns (a transformers mask's x[rows, cols]) through one flat index per
    row: bit for bit the fancy path, and onnxruntime; bool data as Gemma 3's mask."""
    rng = np.random.default_rng(1)
    data = rng.standard_normal(shape).astype(np.float32) if kind == "float32" else rng.random(shape) > 0.5
    idx = np.stack([rng.integers(0, shape[k], ishape[:-1]) for k in range(ishape[-1])], axis=-1).astype(np.int64)
    kernel_path = gather_nd.GatherND.path
    taken = []
    monkeypatch.setattr(gather_nd.GatherND, "path", lambda self, d, i: taken.append(kernel_path(self, d, i))
                        or taken[-1])
    (got,) = run_native("GatherND", [data, idx], 13)
    assert taken == ["ravel"]
    monkeypatch.setattr(gather_nd.GatherND, "path", lambda self, d, i: "fancy")
    (want,) = run_native("GatherND", [data, idx], 13)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, run_onnxruntime("GatherND", [data, idx], 13)[0])


def test_gather_nd_ravel_path_declines_negative_indices_to_fancy():
    data = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    idx = np.array([[-1, 2], [0, -3], [1, 1]], np.int64)  # counted from the end: fancy wraps them
    (got,) = run_native("GatherND", [data, idx], 13)
    np.testing.assert_array_equal(got, run_onnxruntime("GatherND", [data, idx], 13)[0])


def test_gather_nd_ravel_path_out_of_range_index_is_still_refused():
    from onnxhal.hal.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="index 4 is out of range for axis 1 of length 3"):
        run_native("GatherND", [np.zeros((2, 3), np.float32), np.array([[1, 4]], np.int64)], 13)


@pytest.mark.parametrize("idx,batch_dims", [(np.array([[-1], [0]], np.int64), 0),  # negative: wraps
                                            (np.array([[1], [0]], np.int64), 1),  # batch axes
                                            (np.zeros((0, 1), np.int64), 0)])  # no indices
def test_gather_nd_other_operands_take_the_fancy_path(idx, batch_dims):
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    kernel = gather_nd.GatherND.__new__(gather_nd.GatherND)
    kernel.b = batch_dims
    assert kernel.path(data, idx) == "fancy"
    (got,) = run_native("GatherND", [data, idx], 13, batch_dims=batch_dims)
    np.testing.assert_array_equal(got, run_onnxruntime("GatherND", [data, idx], 13, batch_dims=batch_dims)[0])


def test_gather_nd_out_of_range_index_is_still_refused():
    from onnxhal.hal.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="index 3 is out of range for axis 0 of length 3"):
        run_native("GatherND", [np.zeros((3, 2), np.float32), np.array([[3]], np.int64)], 13)


def _scatter_paths(monkeypatch, op: str, inputs: list, **attrs) -> tuple[np.ndarray, np.ndarray, list]:
    """The op on its chosen path and on the canonical ``flat`` one, and the paths it chose."""
    from onnxhal.runtime.providers.cpu.kernels import scatter

    cls = scatter.ScatterElements if op == "ScatterElements" else scatter.ScatterND
    chosen, kernel_path = [], cls.path
    monkeypatch.setattr(cls, "path", lambda self, *a: chosen.append(kernel_path(self, *a)) or chosen[-1])
    (got,) = run_native(op, inputs, 18, **attrs)
    monkeypatch.setattr(cls, "path", lambda self, *a: "flat")
    (want,) = run_native(op, inputs, 18, **attrs)
    return got, want, chosen


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape,axis", [((24,), 0), ((24, 16), 0), ((5, 6), 1), ((3, 4, 5), 1)])
def test_scatter_elements_native_path_equals_flat(shape, axis, reduction, monkeypatch):
    from onnxhal.runtime.providers.cpu.kernels.native_kernels import native_module

    if native_module() is None:
        pytest.skip("the C kernels are not built (or ONNXHAL_NATIVE_KERNELS=0): the flat path runs")
    rng = np.random.default_rng(axis)
    data = rng.standard_normal(shape).astype(np.float32)
    data.reshape(-1)[::7] = np.nan  # NaN already in the data: replaced by max/min, as onnxruntime
    ishape = tuple(3 * d if k == axis else d for k, d in enumerate(shape))
    idx = _indices(rng, shape[axis], ishape)
    upd = rng.standard_normal(ishape).astype(np.float32)
    upd.reshape(-1)[::11] = np.nan  # NaN updates: propagate
    got, want, chosen = _scatter_paths(monkeypatch, "ScatterElements", [data, idx, upd], axis=axis,
                                       reduction=reduction)
    assert chosen == ["native"]
    np.testing.assert_array_equal(got, want)  # the same updates in the same order: the same bits


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape,k", [((24,), 1), ((24, 16), 1), ((6, 4, 3), 2), ((3, 4, 5), 3)])
def test_scatter_nd_native_path_equals_flat(shape, k, reduction, monkeypatch):
    from onnxhal.runtime.providers.cpu.kernels.native_kernels import native_module

    if native_module() is None:
        pytest.skip("the C kernels are not built (or ONNXHAL_NATIVE_KERNELS=0): the flat path runs")
    rng = np.random.default_rng(k)
    data = rng.standard_normal(shape).astype(np.float32)
    data.reshape(-1)[::5] = np.nan
    idx = np.stack([_indices(rng, d, 30) for d in shape[:k]], axis=-1)
    upd = rng.standard_normal((30,) + shape[k:]).astype(np.float32)
    upd.reshape(-1)[::9] = np.nan
    got, want, chosen = _scatter_paths(monkeypatch, "ScatterND", [data, idx, upd], reduction=reduction)
    assert chosen == ["native"]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("op,inputs,match", [
    ("ScatterElements", [np.zeros((4, 2), np.float32), np.array([[0, 1], [4, 0]], np.int64),
                         np.ones((2, 2), np.float32)], r"index 4 at \[1, 0\] is out of range"),
    ("ScatterND", [np.zeros((4, 2), np.float32), np.array([[1], [-5]], np.int64), np.ones((2, 2), np.float32)],
     r"index -5 at \[1, 0\] is out of range"),
])
def test_scatter_native_path_refuses_out_of_range_indices_by_name(op, inputs, match):
    from onnxhal.hal.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match=match):
        run_native(op, inputs, 18, reduction="add")


def test_scatter_other_types_take_the_flat_path():
    from onnxhal.runtime.providers.cpu.kernels import scatter

    kernel = scatter.ScatterElements.__new__(scatter.ScatterElements)
    kernel.axis, kernel.native = 0, object()  # as if built
    ones = np.ones(3, np.float32)
    assert kernel.path(ones, np.zeros(3, np.int64), ones) == "native"
    assert kernel.path(ones.astype(np.float64), np.zeros(3, np.int64), ones.astype(np.float64)) == "flat"
    assert kernel.path(ones, np.zeros(3, np.int32), ones) == "flat"
    assert kernel.path(np.ones((3, 4), np.float32), np.zeros((3, 2), np.int64), np.ones((3, 2), np.float32)) == "flat"
    kernel.native = None
    assert kernel.path(ones, np.zeros(3, np.int64), ones) == "flat"


@pytest.mark.parametrize("op", ["ScatterElements", "ScatterND"])
def test_scatter_native_arguments_kept_per_shape(op):
    """A kernel keeps the C arguments of operand shapes it has checked: a later run of those shapes
    gives the first run's result, an index out of range is still refused by name, other shapes are
    checked anew."""
    from onnxhal.hal.errors import InvalidArgument
    from onnxhal.runtime.providers.cpu.kernel_factory import create_cpu_kernel
    from tests.test_cpu_kernels_nn import make_node

    rng = np.random.default_rng(4)
    kernel = create_cpu_kernel(make_node(op, 3, 18, reduction="add"), None)
    data = rng.standard_normal((24, 16)).astype(np.float32)
    if op == "ScatterElements":
        idx, upd = rng.integers(0, 24, (96, 16)), rng.standard_normal((96, 16)).astype(np.float32)
    else:
        idx, upd = rng.integers(0, 24, (96, 1)), rng.standard_normal((96, 16)).astype(np.float32)
    (first,) = kernel.compute([data, idx, upd])
    assert len(kernel.native_args) == 1
    (again,) = kernel.compute([data, idx, upd])
    np.testing.assert_array_equal(again, first)
    np.testing.assert_array_equal(first, run_onnxruntime(op, [data, idx, upd], 18, reduction="add")[0])
    bad = idx.copy()
    bad[5, 0] = 24
    with pytest.raises(InvalidArgument, match="out of range"):
        kernel.compute([data, bad, upd])
    with pytest.raises(InvalidArgument):  # another shape: checked, refused
        kernel.compute([data, idx, upd[:, :3]])
    assert len(kernel.native_args) == 1
