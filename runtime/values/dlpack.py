"""DLPack for host tensors: hand an OrtValue's memory to another framework, or wrap theirs, no copy.

numpy implements both sides of the protocol (``ndarray.__dlpack__``, ``numpy.from_dlpack``), and a
host OrtValue is a numpy array, so these functions mostly check what onnxruntime checks and turn
numpy's errors into ones that name the value and the remedy. Device memory here is an EP's buffer
object (an OpenCL ``cl.Buffer``), not an address a DLPack consumer could read, so it is refused.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxhal.hal import DeviceTensor
from onnxhal.hal.errors import Fail, InvalidArgument

KDL_CPU = 1  # DLDeviceType kDLCPU


def _host_array(value: Any, what: str) -> np.ndarray:
    if isinstance(value, DeviceTensor):
        raise InvalidArgument(f"{what}: the OrtValue is in {value.memory_info.name} device memory, which is an EP's "
                              "buffer object here, not an address DLPack can share. Copy it to the host first: "
                              "OrtValue.ortvalue_from_numpy(value.numpy())")
    if not isinstance(value, np.ndarray):
        raise InvalidArgument(f"{what}: only tensors can be shared through DLPack; this OrtValue holds a "
                              f"{type(value).__name__}")
    if value.dtype.kind in "OUS":
        raise InvalidArgument(f"{what}: DLPack has no string type; the OrtValue holds {value.dtype} "
                              f"{list(value.shape)}. Read it with numpy() instead.")
    return value


def to_dlpack(value: Any, **kwargs: Any) -> Any:
    """A DLPack capsule sharing ``value``'s memory (``__dlpack__``; the keywords are the protocol's:
    ``stream``, ``max_version``, ``dl_device``, ``copy``)."""
    arr = _host_array(value, "__dlpack__")
    if kwargs.get("stream") is not None:
        raise InvalidArgument(f"__dlpack__: stream={kwargs['stream']!r}: a host tensor has no stream; pass None")
    kwargs.pop("stream", None)
    try:
        return arr.__dlpack__(**kwargs)
    except BufferError as e:
        # A read-only array (an output that is a model constant) needs a versioned capsule.
        raise InvalidArgument(f"__dlpack__: {e} The OrtValue holds a read-only {arr.dtype} {list(arr.shape)} "
                              "array; call __dlpack__(max_version=(1, 0)) or let numpy.from_dlpack / "
                              "torch.from_dlpack ask for the version") from e


def dlpack_device(value: Any) -> tuple[int, int]:
    """``__dlpack_device__``: (kDLCPU, 0) for a host tensor."""
    _host_array(value, "__dlpack_device__")
    return (KDL_CPU, 0)


class _Capsule:
    """Presents a bare capsule (the legacy form of ``from_dlpack``'s argument) to ``numpy.from_dlpack``,
    which reads the device from the capsule itself and refuses one that is not host memory."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, **_: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (KDL_CPU, 0)


def _is_capsule(data: Any) -> bool:
    return type(data).__name__ == "PyCapsule"


def from_dlpack(data: Any) -> np.ndarray:
    """The host array that an object with ``__dlpack__``, or a DLPack capsule, shares (no copy)."""
    if hasattr(data, "__dlpack__"):
        source: Any = data
    elif _is_capsule(data):
        source = _Capsule(data)
    else:
        raise TypeError(f"from_dlpack expected a valid DLPack capsule named 'dltensor', or an object with "
                        f"__dlpack__ (a numpy array, a torch tensor on the CPU), got {type(data).__name__}")
    try:
        arr = np.from_dlpack(source)
    except (BufferError, RuntimeError, ValueError) as e:
        raise InvalidArgument(f"from_dlpack: cannot take {type(data).__name__}: {e}. onnxhal shares host (kDLCPU) "
                              "tensors of numeric and bool types; copy device tensors to the host first, and "
                              "pass a capsule only once (a consumed capsule is 'used_dltensor')") from e
    if not arr.flags.c_contiguous:
        # onnxruntime's OrtValue is always dense in row-major order, and so are the arrays its
        # users get back from numpy(): a strided view would break code that passes data_ptr() on.
        raise Fail(f"from_dlpack: the tensor ({arr.dtype} {list(arr.shape)}, strides {list(arr.strides)}) is not "
                   "contiguous; ORT only supports contiguous tensor for now. Make it contiguous first "
                   "(x.contiguous() in torch, numpy.ascontiguousarray).")
    return arr
