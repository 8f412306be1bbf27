"""Process-wide settings of onnxruntime's module: build info, telemetry, the logger callback, the
global thread pools, and the flags a CPU-only onnxruntime package answers.

There is no telemetry in onnxhal: ``enable/disable_telemetry_events`` record the setting (so code
that calls them runs unchanged) and ``telemetry_events_enabled`` reports it. The logger callback
receives the records of the ``onnxhal`` loggers with onnxruntime's arguments.
"""

from __future__ import annotations

import logging
import platform
import sys
import threading
import types
from collections.abc import Callable

from onnxhal.hal.errors import Fail, InvalidArgument, RuntimeInvalidArgument
from onnxhal.runtime.session.log_scope import LEVELS, set_process_level

_lock = threading.Lock()
_telemetry = False
_verbosity = 0
_thread_pools: tuple[int, int] | None = None


def get_build_info() -> str:
    """A line like onnxruntime's ("ORT Build Info: ..."), naming what onnxhal runs on."""
    import numpy
    import onnx

    from onnxhal.runtime.env.environment import get_version_string

    return (f"onnxhal Build Info: version={get_version_string()}, python={platform.python_version()}, "
            f"numpy={numpy.__version__}, onnx={onnx.__version__}, build type=Release")


def enable_telemetry_events() -> None:
    global _telemetry
    _telemetry = True


def disable_telemetry_events() -> None:
    global _telemetry
    _telemetry = False


def telemetry_events_enabled() -> bool:
    """What the application last asked for (onnxhal sends nothing either way)."""
    return _telemetry


def has_collective_ops() -> bool:
    """False, as onnxruntime's packages built without MPI/NCCL collective operators."""
    return False


def set_default_logger_verbosity(level: int) -> None:
    """onnxruntime's VLOG level for verbose records; recorded (onnxhal's verbose records are the
    ``onnxhal`` loggers' DEBUG records, shown by severity 0)."""
    global _verbosity
    _verbosity = int(level)


def default_logger_verbosity() -> int:
    return _verbosity


def set_global_thread_pool_sizes(intra_op_num_threads: int = 0, inter_op_num_threads: int = 0) -> None:
    """Record the sizes of the process's global thread pools, once, as onnxruntime creates them
    once: a second call fails with onnxruntime's words. Sessions whose
    ``use_per_session_threads`` is False take ``intra_op_num_threads`` when they set none."""
    global _thread_pools
    for name, value in (("intra_op_num_threads", intra_op_num_threads), ("inter_op_num_threads",
                                                                        inter_op_num_threads)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidArgument(f"set_global_thread_pool_sizes: {name} must be an int >= 0 (0: one per core), got "
                                  f"{value!r}")
    with _lock:
        if _thread_pools is not None:
            raise Fail("Global thread pools have already been created, cannot replace them "
                       f"(sizes {_thread_pools}); call set_global_thread_pool_sizes once, before any session.")
        _thread_pools = (intra_op_num_threads, inter_op_num_threads)


def global_thread_pool_sizes() -> tuple[int, int] | None:
    return _thread_pools


# -- the logger callback --------------------------------------------------------------------------
_SEVERITY_OF_LEVEL = [(logging.CRITICAL, 4), (logging.ERROR, 3), (logging.WARNING, 2), (logging.INFO, 1)]


def severity_of(levelno: int) -> int:
    """onnxruntime's severity (0 verbose ... 4 fatal) of a Python logging level."""
    return next((sev for level, sev in _SEVERITY_OF_LEVEL if levelno >= level), 0)


class _CallbackHandler(logging.Handler):
    """Hands each ``onnxhal`` record to ``callback(severity, category, logid, code_location,
    message)``. A record the callback logs itself, or whose callback raises, goes to the handlers
    that were there before, as onnxruntime falls back to its platform sink."""

    def __init__(self, callback: Callable[..., object], previous_propagate: bool) -> None:
        super().__init__(logging.DEBUG)
        self.callback = callback
        self.previous_propagate = previous_propagate
        self._inside = threading.local()

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(self._inside, "active", False):
            return
        self._inside.active = True
        try:
            self.callback(severity_of(record.levelno), record.name, getattr(record, "logid", ""),
                          f"{record.filename}:{record.lineno} {record.funcName}", record.getMessage())
        except Exception as e:
            sys.unraisablehook(types.SimpleNamespace(
                exc_type=type(e), exc_value=e, exc_traceback=e.__traceback__, object=self.callback,
                err_msg="Exception ignored in the onnxhal logger callback"))
        finally:
            self._inside.active = False


_handler: _CallbackHandler | None = None


def set_default_logger_callback(callback: Callable[..., object] | None, severity: int = 2) -> None:
    """Send the records of the ``onnxhal`` loggers to ``callback(severity, category, logid,
    code_location, message)`` instead of the application's logging handlers, at ``severity`` (0-4)
    and above; None restores the handlers and leaves the severity as it is."""
    global _handler
    if isinstance(severity, bool) or severity not in LEVELS:
        raise RuntimeInvalidArgument(f"set_default_logger_callback: severity >= 0 && severity <= 4 was false: got "
                                     f"{severity!r} (0 verbose, 1 info, 2 warning, 3 error, 4 fatal)")
    if callback is not None and not callable(callback):
        raise RuntimeInvalidArgument(f"set_default_logger_callback: PyCallable_Check(callback) was false: "
                                     f"{callback!r} is not callable; pass a function or None")
    logger = logging.getLogger("onnxhal")
    with _lock:
        if _handler is not None:
            logger.removeHandler(_handler)
            logger.propagate = _handler.previous_propagate
            _handler = None
        if callback is None:
            return
        _handler = _CallbackHandler(callback, logger.propagate)
        logger.addHandler(_handler)
        logger.propagate = False  # the callback replaces the platform sink, as in onnxruntime
    set_process_level(severity)
