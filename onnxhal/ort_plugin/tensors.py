"""onnxruntime tensors (OrtValue) as numpy arrays, without copying where that is safe."""

from __future__ import annotations

import ctypes
from ctypes import c_int, c_int64, c_size_t, c_void_p

import numpy as np
from onnx import TensorProto, helper

from onnxhal.hal.errors import InvalidArgument, OutOfMemory
from onnxhal.ort_plugin.ort_api import OrtApi


def dtype_of(elem_type: int) -> np.dtype:
    """numpy dtype of an ONNX / onnxruntime tensor element type (they share the numbering)."""
    if elem_type == TensorProto.STRING:
        raise InvalidArgument("string tensors cannot cross onnxhal's onnxruntime bridge; keep string ops on the "
                              "CPU EP")
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except Exception:
        raise InvalidArgument(f"tensor element type {elem_type} has no numpy dtype in onnxhal's bridge") from None


def type_and_shape(api: OrtApi, info: int, symbolic: bool = True) -> tuple[int, list[int], list[str]]:
    """(element type, dims with -1 for unknown, symbolic names or '') of an OrtTensorTypeAndShapeInfo
    (a tensor's own shape has no symbolic names: ``symbolic=False`` skips reading them)."""
    elem, n = c_int(), c_size_t()
    api.call("GetTensorElementType", info, ctypes.byref(elem))
    api.call("GetDimensionsCount", info, ctypes.byref(n))
    dims = (c_int64 * n.value)()
    names = (ctypes.c_char_p * n.value)()
    if n.value:
        api.call("GetDimensions", info, dims, n.value)
        if symbolic:
            api.call("GetSymbolicDimensions", info, names, n.value)
    return elem.value, list(dims), [(s or b"").decode() for s in names]


def has_shape(api: OrtApi, info: int, rank: int) -> bool:
    """Whether an OrtTensorTypeAndShapeInfo carries a shape: onnxruntime reads a type declared with
    no shape as rank 0 (onnxruntime_typeinfo.cc). ``TensorTypeAndShape_HasShape`` tells them apart
    from onnxruntime 1.24; before it a rank of 0 is taken as unknown, never as a scalar."""
    query = api.ort.get("TensorTypeAndShape_HasShape")
    if query is not None:
        return bool(query(info))
    return rank > 0


def _element_and_dims(api: OrtApi, value: int) -> tuple[int, list[int]]:
    """ONNX element type and dims of an OrtValue tensor."""
    info = c_void_p()
    api.call("GetTensorTypeAndShape", value, ctypes.byref(info))
    try:
        elem, dims, _ = type_and_shape(api, info.value, symbolic=False)
    finally:
        api.ort["ReleaseTensorTypeAndShapeInfo"](info)
    return elem, dims


def dtype_and_shape(api: OrtApi, value: int) -> tuple[np.dtype, tuple[int, ...]]:
    """numpy dtype and shape of an OrtValue tensor."""
    elem, dims = _element_and_dims(api, value)
    return dtype_of(elem), tuple(dims)


def copy_of(api: OrtApi, value: int) -> np.ndarray:
    """A host copy of an OrtValue tensor; string tensors (constants the graph view carries, never a
    partition's input) as numpy object arrays of bytes, as ``onnx.numpy_helper`` reads them."""
    elem, dims = _element_and_dims(api, value)
    if elem != TensorProto.STRING:
        return view_of(api, value, dtype_of(elem), tuple(dims)).copy()
    count = int(np.prod(dims, dtype=np.int64))
    total = c_size_t()
    api.call("GetStringTensorDataLength", value, ctypes.byref(total))
    data = ctypes.create_string_buffer(max(total.value, 1))
    offsets = (c_size_t * max(count, 1))()
    if count:
        api.call("GetStringTensorContent", value, data, total.value, offsets, count)
    raw = data.raw[:total.value]
    ends = [*list(offsets)[1:count], total.value]
    return np.array([raw[offsets[i]:ends[i]] for i in range(count)], dtype=object).reshape(dims)


def describe(api: OrtApi, value: int) -> tuple[np.dtype, tuple[int, ...], int]:
    """(dtype, shape, data address) of an OrtValue tensor."""
    dtype, shape = dtype_and_shape(api, value)
    data = c_void_p()
    api.call("GetTensorMutableData", value, ctypes.byref(data))
    return dtype, shape, data.value or 0


def view(api: OrtApi, value: int) -> np.ndarray:
    """A numpy view of an OrtValue tensor in host memory (valid while onnxruntime keeps the value)."""
    dtype, shape = dtype_and_shape(api, value)
    return view_of(api, value, dtype, shape)


def view_of(api: OrtApi, value: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    data = c_void_p()
    api.call("GetTensorMutableData", value, ctypes.byref(data))
    return view_at(data.value or 0, dtype, shape)


def view_at(address: int, dtype: np.dtype, shape: tuple[int, ...], what: str = "a tensor") -> np.ndarray:
    """A numpy view of host memory at ``address`` holding a ``dtype`` tensor of ``shape``."""
    count = 1
    for d in shape:
        count *= d
    nbytes = count * dtype.itemsize
    if nbytes == 0:
        return np.empty(shape, dtype)
    if not address:
        raise null_data(what, dtype, shape, nbytes)
    buf = (ctypes.c_char * nbytes).from_address(address)
    return np.frombuffer(buf, dtype=dtype).reshape(shape)


def null_data(what: str, dtype: np.dtype, shape: tuple[int, ...], nbytes: int) -> OutOfMemory:
    """The error for a non-empty tensor with no data: onnxruntime creates a value whose allocation
    failed (its device memory is full) with a NULL data pointer instead of failing."""
    return OutOfMemory(f"{what} ({dtype} {list(shape)}, {nbytes} bytes) has no memory behind it: onnxruntime could "
                       "not allocate it (device memory full). Free device tensors or end sessions on that device, "
                       "lower the batch size, or use a device (profile capacity_mib) with more memory")
