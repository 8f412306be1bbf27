"""Error types, with ONNX Runtime's names.

Unlike onnxruntime's Python bindings, each error also derives from the natural Python exception
(``InvalidArgument`` is a ``ValueError``, ``NotImplemented`` a ``NotImplementedError``, the rest
``RuntimeError``), so generic ``except ValueError`` handlers in user code behave as expected.
The public home of these names is ``onnxhal.errors``; they are defined here, in the lowest layer,
so that every layer can raise them.
"""

from __future__ import annotations


class OrtError(Exception):
    """Base of every onnxhal error. ``code`` is ORT's OrtErrorCode name."""

    code = "FAIL"


class Fail(OrtError, RuntimeError):
    code = "FAIL"


class InvalidArgument(OrtError, ValueError):
    code = "INVALID_ARGUMENT"


class RuntimeInvalidArgument(InvalidArgument, RuntimeError):
    """An invalid argument that onnxruntime reports as a plain ``RuntimeError`` (an unknown config
    key, an unknown provider in ``set_providers``): code that catches either still catches it."""


class NoSuchFile(OrtError, FileNotFoundError):
    code = "NO_SUCHFILE"


class NoModel(OrtError, RuntimeError):
    code = "NO_MODEL"


class InvalidProtobuf(OrtError, ValueError):
    code = "INVALID_PROTOBUF"


class InvalidGraph(OrtError, ValueError):
    code = "INVALID_GRAPH"


class ModelLoaded(OrtError, RuntimeError):
    code = "MODEL_LOADED"


class NotImplemented(OrtError, NotImplementedError):  # noqa: A001 - ORT's name, on purpose
    code = "NOT_IMPLEMENTED"


class EPFail(OrtError, RuntimeError):
    code = "EP_FAIL"


class RuntimeException(OrtError, RuntimeError):
    code = "RUNTIME_EXCEPTION"


class ModelLoadCanceled(OrtError, RuntimeError):
    """Session creation stopped by ``SessionOptions.set_load_cancellation_flag(True)``."""

    code = "MODEL_LOAD_CANCELED"


class EngineError(OrtError, RuntimeError):
    code = "ENGINE_ERROR"


class NotFound(OrtError, LookupError):
    code = "NOT_FOUND"


class ModelRequiresCompilation(OrtError, RuntimeError):
    """A model whose EPContext nodes no EP here can run (onnxruntime's MODEL_REQUIRES_COMPILATION)."""

    code = "MODEL_REQUIRES_COMPILATION"


class DeviceReset(OrtError, RuntimeError):
    code = "DEVICE_RESET"


class OutOfMemory(RuntimeException, MemoryError):
    """A device allocator could not satisfy a request (ORT reports this as RUNTIME_EXCEPTION)."""


__all__ = [
    "OrtError", "Fail", "InvalidArgument", "RuntimeInvalidArgument", "NoSuchFile", "NoModel", "InvalidProtobuf",
    "InvalidGraph", "ModelLoaded", "NotImplemented", "EPFail", "RuntimeException", "OutOfMemory",
    "ModelLoadCanceled", "EngineError", "NotFound", "ModelRequiresCompilation", "DeviceReset",
]
