"""OrtValue and IOBinding: values that may live in device memory, and binding them to a session.

A host OrtValue wraps a numpy array. A device OrtValue wraps a ``hal.DeviceTensor`` allocated from
the environment's shared allocator for that memory (ORT's shared allocators, created on first use
from the factory that declared the memory); copies go through the registered data transfers.
"""

from __future__ import annotations

import ctypes
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx

from onnxhal.hal import DeviceTensor, OrtMemoryInfo, SyncStream
from onnxhal.hal.errors import Fail, InvalidArgument, RuntimeInvalidArgument
from onnxhal.hal.graph import elem_type_name
from onnxhal.runtime.env.shared_memory import copy_value, copy_values, device_memory_info, shared_allocator
from onnxhal.runtime.values.dlpack import dlpack_device, from_dlpack, to_dlpack
from onnxhal.runtime.values.sparse_tensor import SparseTensor


def _elem_type_of(dtype: np.dtype) -> int:
    if dtype == np.dtype(object) or dtype.kind == "U":
        return onnx.TensorProto.STRING
    return onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _is_host(device_type: str, vendor_id: int) -> bool:
    """"cpu" with no vendor (-1) or the generic one (0) is host memory; "cpu" with a vendor id is a
    device memory on the CPU (e.g. the OpenCL EP on PoCL), as ORT's OrtDevice distinguishes them."""
    return device_type.lower() == "cpu" and vendor_id in (-1, 0, None)


class OrtValue:
    __slots__ = ("_value",)

    def __init__(self, value: Any) -> None:
        self._value = value

    @property
    def contents(self) -> Any:
        """What the value holds: a host ndarray, a ``DeviceTensor``, a sequence or map, a sparse
        tensor, or None."""
        return self._value

    # -- construction ------------------------------------------------------------------------
    @staticmethod
    def ortvalue_from_numpy(numpy_obj: np.ndarray, device_type: str = "cpu", device_id: int = 0,
                            vendor_id: int = -1) -> OrtValue:
        arr = np.asarray(numpy_obj)
        if _is_host(device_type, vendor_id):
            return OrtValue(arr)
        info = device_memory_info(device_type, device_id, vendor_id)
        value = OrtValue.ortvalue_from_shape_and_type(arr.shape, arr.dtype, memory_info=info)
        value.update_inplace(arr)
        return value

    @staticmethod
    def ortvalue_from_shape_and_type(shape: Sequence[int], element_type: Any = np.float32, device_type: str = "cpu",
                                     device_id: int = 0, vendor_id: int = -1,
                                     memory_info: OrtMemoryInfo | None = None) -> OrtValue:
        dtype = np.dtype(element_type) if not isinstance(element_type, int) else \
            np.dtype(onnx.helper.tensor_dtype_to_np_dtype(element_type))
        shape = tuple(int(d) for d in shape)
        if memory_info is not None and (device_type != "cpu" or device_id != 0 or vendor_id != -1):
            warnings.warn("device_type, device_id, and vendor_id are ignored when memory_info is provided.",
                          stacklevel=2)
        if memory_info is None and not _is_host(device_type, vendor_id):
            memory_info = device_memory_info(device_type, device_id, vendor_id)
        if memory_info is None or memory_info.is_host:
            return OrtValue(np.zeros(shape, dtype=dtype))
        alloc = shared_allocator(memory_info)
        return OrtValue(DeviceTensor.allocate(shape, dtype, alloc))

    @staticmethod
    def ortvalue_from_numpy_with_onnx_type(data: np.ndarray, onnx_element_type: int) -> OrtValue:
        return OrtValue(np.asarray(data, dtype=onnx.helper.tensor_dtype_to_np_dtype(onnx_element_type)))

    # -- reading -----------------------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        v = self._value
        if isinstance(v, DeviceTensor):
            out = np.empty(v.shape, dtype=v.dtype)
            copy_values([v], [out], None)
            return out
        if isinstance(v, np.ndarray):
            return v
        # a RuntimeError too, as onnxruntime's ("Only OrtValues that are Tensors are currently supported")
        raise RuntimeInvalidArgument(f"numpy() is for tensors; this OrtValue holds a {type(v).__name__}"
                                     + (": use as_sparse_tensor()" if isinstance(v, SparseTensor) else ""))

    def shape(self) -> list[int]:
        v = self._value
        return v.dense_shape() if isinstance(v, SparseTensor) else list(v.shape)

    def data_type(self) -> str:
        if isinstance(self._value, SparseTensor):
            return self._value.data_type()
        return f"tensor({elem_type_name(self.element_type())})" if self.is_tensor() else "seq"

    def element_type(self) -> int:
        if isinstance(self._value, SparseTensor):
            return self._value.element_type()
        return _elem_type_of(self._value.dtype)

    # -- sparse tensors -------------------------------------------------------------------------
    @classmethod
    def ort_value_from_sparse_tensor(cls, sparse_tensor: SparseTensor) -> OrtValue:
        if not isinstance(sparse_tensor, SparseTensor):
            raise TypeError(f"ort_value_from_sparse_tensor expects a SparseTensor, got {type(sparse_tensor).__name__}")
        return cls(sparse_tensor)

    def is_sparse_tensor(self) -> bool:
        return isinstance(self._value, SparseTensor)

    def as_sparse_tensor(self) -> SparseTensor:
        if not isinstance(self._value, SparseTensor):
            raise RuntimeInvalidArgument(f"This OrtValue does not contain SparseTensor: it holds "
                                         f"{self.data_type()}; make one with OrtValue.ort_value_from_sparse_tensor")
        return self._value

    def device_name(self) -> str:
        v = self._value
        if isinstance(v, DeviceTensor):
            return v.memory_info.name.lower()
        return "cpu"

    def memory_info(self) -> OrtMemoryInfo | None:
        v = self._value
        return v.memory_info if isinstance(v, DeviceTensor) else None

    def is_tensor(self) -> bool:
        return isinstance(self._value, (np.ndarray, DeviceTensor))

    def is_tensor_sequence(self) -> bool:
        return isinstance(self._value, list)

    def tensor_size_in_bytes(self) -> int:
        v = self._value
        if not isinstance(v, (np.ndarray, DeviceTensor)):
            raise InvalidArgument(f"tensor_size_in_bytes is for tensors; this OrtValue holds a {type(v).__name__}")
        return int(v.nbytes)

    def data_ptr(self) -> int:
        """The address of a host tensor's first element. Device memory here is an EP's buffer
        object, not an address: read it with ``numpy()`` or copy it with ``copy_tensors``."""
        v = self._value
        if isinstance(v, np.ndarray):
            return int(v.ctypes.data)
        raise InvalidArgument(f"data_ptr is for tensors in host memory; this OrtValue holds {self!r}. Use numpy() "
                              "to read a device tensor.")

    def has_value(self) -> bool:
        return self._value is not None

    def update_inplace(self, data: np.ndarray | OrtValue) -> None:
        """Copy ``data`` (a numpy array, or another OrtValue: device to device where a data transfer
        can) into this tensor's memory, which keeps its address. The shape and dtype must match
        (onnxruntime checks only the byte count: it takes another shape of the same size, and
        reinterprets the bytes of another dtype)."""
        v = self._value
        if isinstance(data, OrtValue):
            src = data._value
        elif isinstance(data, np.ndarray):
            src = np.asarray(data, order="C")  # not ascontiguousarray, which makes a 0-d array 1-d
        else:
            raise TypeError(f"data must be a numpy.ndarray or an OrtValue, got {type(data).__name__}")
        if not isinstance(v, (np.ndarray, DeviceTensor)) or not isinstance(src, (np.ndarray, DeviceTensor)):
            raise InvalidArgument(f"update_inplace is for tensors; this OrtValue holds {type(v).__name__}, the data "
                                  f"{type(src).__name__}")
        if tuple(src.shape) != tuple(v.shape):
            # a RuntimeError as onnxruntime's; onnxruntime checks only the element count
            raise RuntimeInvalidArgument(
                f"update_inplace: The input size of numpy arrays does not match the size of the OrtValue: the value "
                f"is {v.dtype} {list(v.shape)}, the data {src.dtype} {list(src.shape)}; reshape the data first")
        if np.dtype(src.dtype) != np.dtype(v.dtype):
            raise InvalidArgument(f"update_inplace: the value is {v.dtype} {list(v.shape)}, the data {src.dtype}: "
                                  f"convert it first (.astype(np.{v.dtype}))")
        copy_value(src, v)

    # -- numpy and DLPack interchange (host tensors share memory, no copy) ----------------------
    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        """``numpy.asarray(ortvalue)``: the host array itself (a device tensor is copied out), as
        onnxruntime's ``__array__``: cast only for another ``dtype``, copied when ``copy`` is True."""
        arr = self.numpy()
        if copy is not None:
            return np.array(arr, dtype=dtype, copy=copy)
        return arr if dtype is None else np.asarray(arr, dtype=dtype)

    def __dlpack__(self, *, stream: Any = None, **kwargs: Any) -> Any:
        """A DLPack capsule sharing this host tensor's memory (``numpy.from_dlpack(v)``,
        ``torch.from_dlpack(v)``); the OrtValue must outlive the consumer's tensor."""
        return to_dlpack(self._value, stream=stream, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return dlpack_device(self._value)

    def to_dlpack(self) -> Any:
        """The capsule of ``__dlpack__`` (onnxruntime's C ``OrtValue.to_dlpack``)."""
        return to_dlpack(self._value)

    @classmethod
    def from_dlpack(cls, data: Any, /) -> OrtValue:
        """An OrtValue sharing the memory of a host tensor that implements DLPack (a numpy array, a
        CPU torch tensor) or of a DLPack capsule. No copy: changes show on both sides."""
        return cls(from_dlpack(data))

    # -- onnxruntime's wrapper keeps its C object in ``_ortvalue``; code that reaches for it
    # (OrtValueVector.push_back(v._ortvalue)) gets the one object there is here.
    @property
    def _ortvalue(self) -> OrtValue:
        return self

    def _get_c_value(self) -> OrtValue:
        return self

    def __repr__(self) -> str:
        return f"OrtValue({self._value!r})"


def session_ortvalue(memory: Any, shape: Sequence[int], element_type: Any, device_type: str, device_id: int = 0,
                     vendor_id: int = -1) -> OrtValue:
    """``InferenceSession.create_ortvalue_from_shape_and_type``: a tensor allocated by the allocator
    ``memory`` (a session's MemoryContext) has for that device; host memory for "cpu"."""
    from onnxhal.hal.ort_device import OrtDevice

    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(element_type) if isinstance(element_type, int)
                     else element_type)
    if dtype.kind in "OUSV":
        raise Fail(f"Creation of OrtValues is currently only supported for numeric tensor types, got {dtype}")
    dims = tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise Fail(f"create_ortvalue_from_shape_and_type: shape {list(dims)}: Tensor shape.Size() must be >= 0")
    try:
        dev = OrtDevice.make(device_type, device_id, vendor_id).memory_device
    except InvalidArgument as unsupported:
        # onnxhal also takes a declared memory's name ("opencl"), as ortvalue_from_numpy does
        try:
            dev = device_memory_info(device_type, device_id, vendor_id).memory_device
        except InvalidArgument as e:
            raise InvalidArgument(f"{unsupported}; nor is it a declared memory: {e}") from None
    if dev.is_host:
        return OrtValue(np.zeros(dims, dtype=dtype))
    alloc = memory.allocator(dev)
    if alloc is None:
        raise Fail(f"No session allocator found for {dev} (device_type={device_type!r}, device_id={device_id}, "
                   f"vendor_id={vendor_id}): no EP of this session uses that memory. Use a device of "
                   "get_input_memory_infos(), or OrtValue.ortvalue_from_shape_and_type for a shared allocator.")
    return OrtValue(DeviceTensor.allocate(dims, dtype, alloc))


def copy_tensors(src: Sequence[OrtValue], dst: Sequence[OrtValue], stream: SyncStream | None = None) -> None:
    """ORT's ``CopyTensors``: copy each ``src[i]`` into ``dst[i]`` with the registered data transfers."""
    if not isinstance(src, (list, tuple)) or not isinstance(dst, (list, tuple)) or not src or len(src) != len(dst):
        raise Fail("Invalid arguments provided to CopyTensors: give two non-empty lists of OrtValue of equal length.")
    if stream is not None and not isinstance(stream, SyncStream):
        raise TypeError(f"copy_tensors: stream must be an OrtSyncStream, got {type(stream).__name__}")
    for s, d in zip(src, dst):
        if not isinstance(s, OrtValue) or not isinstance(d, OrtValue):
            raise Fail("Invalid arguments provided to CopyTensors: every element must be an OrtValue.")
        if s.shape() != d.shape():
            raise InvalidArgument(f"copy_tensors: source shape {s.shape()} differs from destination {d.shape()}")
    copy_values([s._value for s in src], [d._value for d in dst], stream)


def _host_buffer(method: str, name: str, device_type: str, element_type: Any, shape: Sequence[int] | None,
                 buffer_ptr: Any) -> np.ndarray:
    """The host memory at ``buffer_ptr`` as a writable array of ``shape`` and ``element_type`` (a
    numpy dtype or an ONNX element type), no copy."""
    if buffer_ptr is None:
        raise InvalidArgument(f"{method}({name!r}): give buffer_ptr (the address of the data), or use "
                              "bind_cpu_input / bind_ortvalue_input")
    if not _is_host(device_type, -1):
        raise InvalidArgument(f"{method}({name!r}): buffer_ptr on device {device_type!r}: device memory here is an "
                              "EP's buffer object, not an address. Allocate an OrtValue with "
                              "OrtValue.ortvalue_from_shape_and_type(..., device_type) and bind it with "
                              f"{method.replace('bind_', 'bind_ortvalue_')}")
    if element_type is None or shape is None:
        raise InvalidArgument(f"{method}({name!r}): a buffer_ptr needs element_type and shape")
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(element_type) if isinstance(element_type, int)
                     else element_type)
    if dtype.kind in "OUS":
        raise InvalidArgument(f"{method}({name!r}): a buffer_ptr needs a numeric element type, got {dtype}")
    dims = tuple(int(d) for d in shape)
    if any(d < 0 for d in dims) or isinstance(buffer_ptr, bool) or not isinstance(buffer_ptr, (int, np.integer)) \
            or buffer_ptr <= 0:
        raise InvalidArgument(f"{method}({name!r}): shape {list(dims)} and buffer_ptr {buffer_ptr!r} must be "
                              "sizes >= 0 and an address (an int, e.g. array.ctypes.data)")
    count = int(np.prod(dims, dtype=np.int64))
    raw = (ctypes.c_char * (count * dtype.itemsize)).from_address(int(buffer_ptr))
    return np.frombuffer(raw, dtype=dtype, count=count).reshape(dims)


class IOBinding:
    """Binds inputs and outputs (host or device) to a session for ``run_with_iobinding``."""

    def __init__(self, session: Any) -> None:
        self._session = session
        self._inputs: dict[str, Any] = {}
        self._outputs: dict[str, Any] = {}  # name -> OrtValue (pre-bound) or memory info or None (host)
        self._results: list[OrtValue] = []

    def bind_cpu_input(self, name: str, arr_on_cpu: np.ndarray) -> None:
        self._inputs[name] = self._session.bound_input(name, np.asarray(arr_on_cpu))

    def bind_input(self, name: str, device_type: str = "cpu", device_id: int = 0, element_type: Any = None,
                   shape: Sequence[int] | None = None, buffer_ptr: Any = None) -> None:
        """Bind host memory at ``buffer_ptr`` (e.g. ``array.ctypes.data``) holding ``shape`` values of
        ``element_type``, read in place; the memory must stay valid until the run, as in ORT."""
        self._inputs[name] = self._session.bound_input(
            name, _host_buffer("bind_input", name, device_type, element_type, shape, buffer_ptr))

    def bind_ortvalue_input(self, name: str, ortvalue: OrtValue) -> None:
        self._inputs[name] = self._session.bound_input(name, ortvalue._value)

    def bind_output(self, name: str, device_type: str = "cpu", device_id: int = 0, element_type: Any = None,
                    shape: Sequence[int] | None = None, buffer_ptr: Any = None, vendor_id: int = -1) -> None:
        """Leave output ``name`` on a device: ``device_type`` is "cpu" (host), "gpu", "npu", or the
        name of a declared memory ("opencl"); ``vendor_id`` picks among devices of one type. With a
        ``buffer_ptr`` (host memory only) the output is written there, as into a bound OrtValue."""
        if buffer_ptr is not None:
            self._outputs[name] = OrtValue(_host_buffer("bind_output", name, device_type, element_type, shape,
                                                        buffer_ptr))
        elif _is_host(device_type, vendor_id):
            self._outputs[name] = None
        else:
            self._outputs[name] = device_memory_info(device_type, device_id, vendor_id)

    def bind_ortvalue_output(self, name: str, ortvalue: OrtValue) -> None:
        self._outputs[name] = ortvalue

    def clear_binding_inputs(self) -> None:
        self._inputs.clear()

    def clear_binding_outputs(self) -> None:
        self._outputs.clear()
        self._results = []

    def synchronize_inputs(self) -> None:
        # copies of bound inputs complete before run_with_iobinding's kernels read them; the EPs'
        # own queued work is waited for as onnxruntime does here (Ep.sync)
        for ep in self._session.eps.values():
            ep.sync()

    def synchronize_outputs(self) -> None:
        self._session.memory.synchronize()
        for ep in self._session.eps.values():
            ep.sync()

    def get_outputs(self) -> list[OrtValue]:
        return list(self._results)

    def get_outputs_as_ortvaluevector(self) -> list[OrtValue]:
        """onnxruntime returns its C++ vector of OrtValues here; a list serves the same uses."""
        return list(self._results)

    def copy_outputs_to_cpu(self) -> list:
        """Copies, as onnxruntime's: changing them leaves the bound outputs as they are."""
        return [(r.numpy().copy() if isinstance(r._value, np.ndarray) else r.numpy()) if r.is_tensor() else r._value
                for r in self._results]

    def run_with(self, run: Callable[[dict, dict, Any], list], replay: Callable[[Any, dict, dict], bool],
                 run_options: Any) -> None:
        """The session's ``run_with_iobinding``: ``run(feeds, bound outputs, run_options)`` returns
        every output, each left where it is bound; ``replay(run_options, feeds, bound outputs)``
        replays a captured graph instead when the session's graph-capturing EP has one."""
        session = self._session
        names = [o.name for o in session.get_outputs()]
        wanted = list(self._outputs) or names
        for n in wanted:
            if n not in names:
                raise InvalidArgument(f"Invalid output name: {n!r}. The model's outputs are {names}.")
        if replay(run_options, self._inputs, self._outputs):
            # the EP replayed its captured graph into the buffers bound when it captured
            unbound = [n for n in wanted if not isinstance(self._outputs.get(n), OrtValue)]
            if unbound:
                raise InvalidArgument(f"graph replay writes the outputs bound at capture, but {unbound} are not bound "
                                      "to OrtValues: bind them with bind_ortvalue_output before capturing")
            self._results = [self._outputs[n] for n in wanted]
            return
        results = run(self._inputs, self._outputs, run_options)
        by_name = dict(zip(names, results))
        out: list[OrtValue] = []
        for n in wanted:
            value = by_name[n]
            bound = self._outputs.get(n)
            if isinstance(bound, OrtValue):
                if value is bound._value:  # written in place (a graph capture run's destination)
                    pass
                elif isinstance(bound._value, DeviceTensor) or isinstance(value, DeviceTensor):
                    copy_values([value], [bound._value], None)
                else:
                    np.copyto(bound._value, value)
                out.append(bound)
            else:
                out.append(OrtValue(value))
        self._results = out
