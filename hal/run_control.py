"""Stopping a run in bounded time: ``RunOptions.terminate``, readable from anywhere a run goes.

The executor publishes the run's RunOptions in a context variable for the length of the run (kernels
are called with their inputs only). Code that loops for long inside one node or partition (a
recurrent kernel's time steps, an EP's kernel launches, a simulated device's wait) calls
``check_terminate()`` once per outer iteration: one context-variable read and one attribute read,
about 60 ns, so never per element. A set flag raises ``Terminated`` with onnxruntime's message.
"""

from __future__ import annotations

import time
from contextvars import ContextVar
from typing import Any

from onnxhal.hal.errors import RuntimeException

#: The RunOptions of the run in progress in this thread (or async context); None outside a run or
#: for a run given no RunOptions (nothing can set its flag).
RUN_OPTIONS: ContextVar[Any] = ContextVar("onnxhal_run_options", default=None)

TERMINATED_MSG = ("Exiting due to terminate flag being set to true: RunOptions.terminate was set during this "
                  "run. Clear it (run_options.terminate = False) to run again.")


class Terminated(RuntimeException):
    """A run stopped because its ``RunOptions.terminate`` was set."""


def check_terminate() -> None:
    """Raise ``Terminated`` if the run in progress was asked to stop; call once per outer iteration."""
    ro = RUN_OPTIONS.get()
    if ro is not None and ro.terminate:
        raise Terminated(TERMINATED_MSG)


def sleep_unless_terminated(seconds: float, slice_s: float = 0.02) -> None:
    """``time.sleep(seconds)`` in slices of ``slice_s``, raising ``Terminated`` as soon as the flag is
    seen (a simulated device's modelled slowness must not outlast a terminate request)."""
    end = time.perf_counter() + seconds
    while True:
        check_terminate()
        left = end - time.perf_counter()
        if left <= 0:
            return
        time.sleep(min(left, slice_s))
