"""Ctrl-C during a run inside onnxruntime: a KeyboardInterrupt after the run, as with onnxruntime alone.

Python runs a SIGINT handler in the main thread at the next bytecode, which during a run is inside
one of the bridge's callbacks (a partition's ``Compute``): the KeyboardInterrupt would abort that
callback, onnxruntime would get an error status and raise its ``Fail``, and the application would
never see the KeyboardInterrupt (onnxruntime's own kernels, in C++, finish the run and Python raises
it when ``run`` returns). So while a run is under way on the main thread with Python's default
handler installed, SIGINT is only recorded; when the run ends (``OrtEp::OnRunEnd``, which
onnxruntime calls whether the run failed or not) the default handler is back and, if Ctrl-C was
pressed, bridge.c raises the interrupt again through ``PyErr_SetInterrupt`` once that last callback
has returned, so the KeyboardInterrupt reaches the application where ``run`` returns.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

_lock = threading.Lock()
_runs = 0  # runs (one per EP of a session) under way on the main thread with SIGINT deferred
_pressed = False


def _record(signum: int, frame: Any) -> None:
    global _pressed
    _pressed = True


def run_started() -> None:
    """At OnRunStart: defer SIGINT if this is the main thread and Python's default handler is set
    (an application's own handler is left alone)."""
    global _runs
    if threading.current_thread() is not threading.main_thread():
        return
    with _lock:
        if _runs == 0:
            if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
                return
            signal.signal(signal.SIGINT, _record)
        _runs += 1


def run_ended() -> bool:
    """At OnRunEnd: restore the default handler after the last deferred run; True if Ctrl-C was
    pressed meanwhile (the caller raises it again once back outside Python code)."""
    global _runs, _pressed
    if threading.current_thread() is not threading.main_thread():
        return False
    with _lock:
        if _runs == 0:
            return False
        _runs -= 1
        if _runs:
            return False
        signal.signal(signal.SIGINT, signal.default_int_handler)
        pressed, _pressed = _pressed, False
        return pressed
