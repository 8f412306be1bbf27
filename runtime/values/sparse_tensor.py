"""SparseTensor: onnxruntime's sparse tensor container (COO and CSR formats) in host memory.

As onnxruntime's: made from numpy arrays without a copy (``sparse_coo_from_numpy``,
``sparse_csr_from_numpy``), read through format views (``as_coo_view().indices()``,
``as_csrc_view().inner()/.outer()``), wrapped in an OrtValue (``OrtValue.ort_value_from_sparse_tensor``).
The index checks are onnxruntime's (counts and shapes; like onnxruntime, index values are not
range-checked). A model's sparse initializers are made dense at load; a sparse input reaches the
kernels that take one (com.microsoft SparseToDenseMatMul) as this object, and ``to_dense()``
(onnxhal's) gives the dense array.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx

from onnxhal.hal import OrtSparseFormat
from onnxhal.hal.errors import Fail
from onnxhal.hal.graph import elem_type_name
from onnxhal.hal.ort_device import OrtDevice


class SparseCooView:
    def __init__(self, indices: np.ndarray) -> None:
        self._indices = indices

    def indices(self) -> np.ndarray:
        """Flat indices ([nnz]) or coordinates ([nnz, rank]) of the values in the dense tensor."""
        return self._indices


class SparseCsrView:
    def __init__(self, inner: np.ndarray, outer: np.ndarray) -> None:
        self._inner, self._outer = inner, outer

    def inner(self) -> np.ndarray:
        """The column of each value."""
        return self._inner

    def outer(self) -> np.ndarray:
        """Where each row starts in the values (rows + 1 entries)."""
        return self._outer


def _host(ort_device: OrtDevice, what: str) -> None:
    if not isinstance(ort_device, OrtDevice) or not ort_device.memory_device.is_host:
        raise Fail(f"{what}: Unsupported OrtDevice type: {ort_device!r}. Sparse tensors live in host memory here: "
                   "pass OrtDevice.make('cpu', 0)")


def _values(values: Any, what: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.dtype.kind in "OUSV":
        raise Fail(f"{what}: Unsupported values data type: {arr.dtype}; sparse values must be numeric or bool")
    return np.ascontiguousarray(arr).reshape(-1) if arr.ndim != 1 else np.ascontiguousarray(arr)


def _indices(indices: Any) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(indices), dtype=np.int64)


class SparseTensor:
    """A sparse tensor in host memory; ``format()`` says which view applies."""

    def __init__(self, fmt: OrtSparseFormat, dense_shape: Sequence[int], values: np.ndarray,
                 views: tuple[np.ndarray, ...]) -> None:
        self._format = OrtSparseFormat(fmt)
        self._dense_shape = [int(d) for d in dense_shape]
        self._values = values
        self._views = views

    @classmethod
    def sparse_coo_from_numpy(cls, dense_shape: Sequence[int], values: np.ndarray, coo_indices: np.ndarray,
                              ort_device: OrtDevice) -> SparseTensor:
        """COO: ``coo_indices`` holds a flat index per value ([nnz]) or its coordinates ([nnz, rank])."""
        what = "sparse_coo_from_numpy"
        _host(ort_device, what)
        vals, idx = _values(values, what), _indices(coo_indices)
        nnz, rank = vals.size, len(dense_shape)
        if not (idx.size == nnz or (idx.size == 2 * nnz and idx.ndim == 2 and idx.shape == (nnz, rank))):
            raise Fail(f"{what}: Index size: {idx.size} must be equal to or twice the values size: {nnz} (flat indices "
                       f"[nnz], or coordinates [nnz, {rank}] for a 2-D dense shape)")
        return cls(OrtSparseFormat.ORT_SPARSE_COO, dense_shape, vals, (idx,))

    @classmethod
    def sparse_csr_from_numpy(cls, dense_shape: Sequence[int], values: np.ndarray, inner_indices: np.ndarray,
                              outer_indices: np.ndarray, ort_device: OrtDevice) -> SparseTensor:
        """CSR of a 2-D tensor: the column of each value (``inner_indices``), and where each row starts
        (``outer_indices``, rows + 1 entries)."""
        what = "sparse_csr_from_numpy"
        _host(ort_device, what)
        vals, inner, outer = _values(values, what), _indices(inner_indices), _indices(outer_indices)
        if len(dense_shape) != 2:
            raise Fail(f"{what}: dense shape must 2-D. Got: {len(dense_shape)}")
        if inner.size != vals.size:
            raise Fail(f"{what}: Expecting inner index size: {inner.size} the same as values size: {vals.size}")
        rows = int(dense_shape[0])
        if outer.size not in (0, rows + 1):
            raise Fail(f"{what}: Outer index count must be rows + 1 or zero. Got: {outer.size} rows: {rows}")
        return cls(OrtSparseFormat.ORT_SPARSE_CSRC, dense_shape, vals, (inner, outer))

    def values(self) -> np.ndarray:
        return self._values

    def as_coo_view(self) -> SparseCooView:
        if self._format != OrtSparseFormat.ORT_SPARSE_COO:
            raise Fail(f"This sparse tensor does not contain COO format: it is {self._format}; use the view of its "
                       "format()")
        return SparseCooView(self._views[0])

    def as_csrc_view(self) -> SparseCsrView:
        if self._format != OrtSparseFormat.ORT_SPARSE_CSRC:
            raise Fail(f"This sparse tensor does not contain CSR(C) format: it is {self._format}; use the view of its "
                       "format()")
        return SparseCsrView(*self._views)

    # The names of the object onnxruntime's run returns for a sparse output (its C-level tensor).
    def get_coo_data(self) -> SparseCooView:
        return self.as_coo_view()

    def get_csrc_data(self) -> SparseCsrView:
        return self.as_csrc_view()

    def get_blocksparse_data(self) -> SparseCooView:
        return self.as_blocksparse_view()

    def as_blocksparse_view(self) -> SparseCooView:
        raise Fail(f"This sparse tensor does not contain BlockSparse format: it is {self._format} (onnxhal makes no "
                   "block-sparse tensors)")

    def format(self) -> OrtSparseFormat:
        return self._format

    def dense_shape(self) -> list[int]:
        return list(self._dense_shape)

    def data_type(self) -> str:
        return f"sparse_tensor({elem_type_name(onnx.helper.np_dtype_to_tensor_dtype(self._values.dtype))})"

    def element_type(self) -> int:
        return onnx.helper.np_dtype_to_tensor_dtype(self._values.dtype)

    def device_name(self) -> str:
        return "cpu"

    def to_cuda(self, ort_device: OrtDevice) -> SparseTensor:
        raise Fail(f"SparseTensor.to_cuda({ort_device!r}): there is no CUDA here, and sparse tensors stay in host "
                   "memory")

    def to_dense(self) -> np.ndarray:
        """The dense array (onnxhal's addition)."""
        dense = np.zeros(self._dense_shape, dtype=self._values.dtype)
        if self._format == OrtSparseFormat.ORT_SPARSE_COO:
            idx = self._views[0]
            if idx.ndim == 2:
                dense[tuple(idx.T)] = self._values
            else:
                dense.reshape(-1)[idx] = self._values
        else:
            inner, outer = self._views
            for row in range(len(outer) - 1):
                dense[row, inner[outer[row]:outer[row + 1]]] = self._values[outer[row]:outer[row + 1]]
        return dense

    def _get_c_tensor(self) -> SparseTensor:
        return self

    def __repr__(self) -> str:
        return f"SparseTensor({self._format.name}, dense_shape={self._dense_shape}, nnz={self._values.size})"


def as_sparse(value: Any) -> Any:
    """A dense array as a COO SparseTensor of its nonzero entries (flat indices), for a graph output
    the model declares sparse; a SparseTensor as it is."""
    if isinstance(value, SparseTensor):
        return value
    dense = np.asarray(value)
    flat = np.flatnonzero(dense)
    return SparseTensor(OrtSparseFormat.ORT_SPARSE_COO, dense.shape, np.ascontiguousarray(dense.reshape(-1)[flat]),
                        (flat.astype(np.int64),))
