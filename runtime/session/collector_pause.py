"""Python's cyclic garbage collector paused while a session is built.

Building a session allocates tens of thousands of short-lived objects (protobuf wrappers, node and
value records, numpy arrays, kernels). Every 700 allocations start a collection of the youngest
objects, and every tenth of those one of the older generation, which also walks what survived
from before: on the larger corpus models the collections were 5-13 % of session creation, none
of it needed, as reference counting frees what the build discards. The collector waits until
the build ends; a cycle the build left is found by the next ordinary collection.

The collector is process-wide: builds on several threads pause it once, the last to finish
resumes it, and a collector the application had disabled stays disabled.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_builds = 0  # builds now running with the collector paused
_resume = False  # whether the collector was enabled when the first of them started


@contextmanager
def collector_paused() -> Iterator[None]:
    """The body runs with ``gc`` disabled; the collector is enabled again after it (raising or not)
    if it was enabled before and no other build still runs."""
    global _builds, _resume
    with _lock:
        if _builds == 0:
            _resume = gc.isenabled()
            gc.disable()
        _builds += 1
    try:
        yield
    finally:
        with _lock:
            _builds -= 1
            if _builds == 0 and _resume:
                gc.enable()
